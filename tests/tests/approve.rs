//! `airlock propose` and `airlock approve` against a real broker: an approval before its
//! proposal is refused; a refund above the auto-approval limit, proposed from the command
//! line, waits for approval; an approval for other arguments is refused (non-zero exit); the
//! approval bound to the hash the processor reported (the same command as the early one) is
//! refused unsigned and signed with another person's key (the entities register alice's key),
//! then recorded signed with alice's key, and dispatches the refund; running either command again shows the earlier answer
//! and publishes nothing; one dispatch; `airlock replay` verifies the journal. And a fence
//! marker forged on the decisions topic does not hide the answer from a reader that holds the
//! processor's verifying key.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use airlock_processor::runtime::partitioner::partition_for;
use airlock_processor::runtime::wire::OutRecord;
use airlock_processor::sample;
use airlock_schemas::{Decision, DispatchCommand, Reason, Verdict};
use airlock_tests::airlock::{Airlock, Options};
use airlock_tests::connector::Keys;
use airlock_tests::eventually;

const WAIT: Duration = Duration::from_secs(60);

/// `airlock propose` of a refund of `arguments` under `key`, by agent-support-1 of tenant acme
/// in run `run`.
fn propose_refund<'a>(key: &'a str, arguments: &'a str, run: &'a str) -> [&'a str; 13] {
    [
        "propose",
        "--tool",
        "refund",
        "--operation-key",
        key,
        "--arguments",
        arguments,
        "--tenant",
        "acme",
        "--principal",
        "agent-support-1",
        "--run-id",
        run,
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_bound_to_the_reported_hash_dispatches_once() -> anyhow::Result<()> {
    let a = Airlock::start_with(
        "approve",
        2,
        Options {
            signing_people: true,
            ..Options::default()
        },
    )
    .await?;
    let processor = a.spawn("p1")?;
    let key = "refund:txn_large";
    let arguments = sample::money_arguments("acme", "acct-42", 20_000, "EUR");
    let propose = || a.cli(&propose_refund(key, &arguments, "run-approve"));
    let approve_signed_by = |hash: &str, signer: Option<&str>| {
        let key_file = signer.map(|s| a.person_key_file(s).display().to_string());
        let mut args = vec![
            "approve",
            key,
            "--arguments-hash",
            hash,
            "--approver",
            "alice",
            "--tenant",
            "acme",
            "--comment",
            "checked the ticket",
            "--timeout-seconds",
            "60",
        ];
        if let Some(file) = &key_file {
            args.extend(["--signing-key", file.as_str()]);
        }
        a.cli(&args)
    };
    let approve = |hash: &str| approve_signed_by(hash, Some("alice"));

    // An approval before the proposal: refused (nothing to approve yet).
    let expected = airlock_processor::core::canonical::canonicalize(&arguments)?.hash;
    let (ok, out, err) = approve(&expected)?;
    assert!(!ok, "nothing waits for approval yet:\n{out}\n{err}");
    assert!(out.contains("NO_PENDING_APPROVAL"), "{out}\n{err}");

    // `airlock propose` publishes as an agent would and prints the answer with the hash the
    // approver is to review.
    let (ok, out, err) = propose()?;
    assert!(
        ok,
        "a refund above the auto limit waits, it is not refused:\n{out}\n{err}"
    );
    assert!(out.contains("PENDING_APPROVAL"), "{out}");
    let hash = out
        .lines()
        .find_map(|l| l.strip_prefix("arguments_hash: "))
        .expect("the answer names the arguments hash")
        .to_owned();
    assert_eq!(
        hash, expected,
        "the reported hash is the canonical arguments' SHA-256"
    );
    let proposal_id = out
        .lines()
        .find_map(|l| l.split(" as ").nth(1))
        .and_then(|rest| rest.split(';').next())
        .expect("the command names the proposal id")
        .to_owned();

    // Other arguments than the ones reported: refused, nothing dispatched.
    let (ok, out, err) = approve(&"0".repeat(64))?;
    assert!(
        !ok,
        "an approval of other arguments must fail:\n{out}\n{err}"
    );
    assert!(out.contains("APPROVAL_HASH_MISMATCH"), "{out}\n{err}");

    // The reported hash, but unsigned, or signed with bob's key: alice's key is registered,
    // so neither counts.
    let (ok, out, err) = approve_signed_by(&hash, None)?;
    assert!(!ok, "an unsigned approval must fail:\n{out}\n{err}");
    assert!(out.contains("not signed by alice"), "{out}\n{err}");
    let (ok, out, err) = approve_signed_by(&hash, Some("bob"))?;
    assert!(
        !ok,
        "an approval signed by bob as alice must fail:\n{out}\n{err}"
    );
    assert!(out.contains("does not verify"), "{out}\n{err}");

    // Signed by alice: the same command as the refused ones above, published again (its
    // earlier answers were refusals) and recorded; the refund is dispatched.
    let (ok, out, err) = approve(&hash)?;
    assert!(ok, "the approval must be recorded:\n{out}\n{err}");
    assert!(out.contains("RECORDED APPROVAL_RECORDED"), "{out}");
    let approved = eventually("the refund's dispatch decision", WAIT, async || {
        let decisions: Vec<Decision> = a.read_deduplicated(&a.names.decisions(), "decision")?;
        Ok(decisions
            .into_iter()
            .find(|d| d.in_reply_to == proposal_id && d.reason == Reason::Approved))
    })
    .await?;
    assert_eq!(approved.verdict, Verdict::Accepted, "{approved:?}");

    // The same proposal again is a resend: the processor stays silent, so the command shows
    // the latest reply to it (the approval's dispatch) and publishes nothing.
    let (ok, out, err) = propose()?;
    assert!(ok, "a resend is answered:\n{out}\n{err}");
    assert!(
        out.contains("answered before; not published again"),
        "{out}"
    );
    assert!(out.contains("ACCEPTED APPROVED"), "{out}");

    // The same approval again: it was counted, so the command shows that answer and publishes
    // nothing; still one dispatch.
    let (ok, out, err) = approve(&hash)?;
    assert!(
        ok,
        "a repeated approval is answered, not refused:\n{out}\n{err}"
    );
    assert!(
        out.contains("answered before; not published again"),
        "{out}"
    );
    assert!(out.contains("RECORDED APPROVAL_RECORDED"), "{out}");
    // Distinct attempts (an outbox resend repeats a command; its copies must be identical).
    let dispatches: Vec<DispatchCommand> = a
        .dispatches()?
        .into_iter()
        .filter(|c| c.operation_key == key)
        .collect();
    assert_eq!(dispatches.len(), 1, "{dispatches:?}");

    // The auditor's replay accepts the dispatch made at the approval quorum: its
    // APPROVAL_DECIDED event is the durable intent the dispatch topic is checked against.
    let (ok, out, err) = a.cli(&["replay", "--stall-timeout-seconds", "60"])?;
    assert!(ok, "the journal verifies:\n{out}\n{err}");
    assert!(out.contains("1 dispatches checked"), "{out}");
    processor.stop()?;
    Ok(())
}

/// A fence marker forged on the decisions partition of a key (owner epoch 999999, unsigned, by
/// whoever can write the topic) hides the processor's answers from a reader that trusts every
/// marker. `airlock propose` given the processor's verifying key
/// (`AIRLOCK_CAPABILITY_VERIFYING_KEY_FILES`) ignores it, says so, and prints the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_fence_marker_does_not_hide_the_answer_from_a_verifying_reader()
-> anyhow::Result<()> {
    let keys = Keys::generate()?;
    let a = Airlock::start_with(
        "forged-marker",
        2,
        Options {
            signing_key_file: Some(keys.signing_file.clone()),
            ..Options::default()
        },
    )
    .await?;
    let processor = a.spawn("p1")?;
    let key = "refund:under-a-forged-marker";
    let partition = partition_for(key.as_bytes(), a.config.topics.partitions);
    a.produce(vec![OutRecord::fence_marker(
        &a.names.decisions(),
        partition,
        999_999,
    )])?;
    let arguments = sample::money_arguments("acme", "acct-42", 100, "EUR");
    let propose = |verifying: Option<&std::path::Path>| -> anyhow::Result<(bool, String, String)> {
        let mut command = a.command(&a.config)?;
        if let Some(file) = verifying {
            command.env("AIRLOCK_CAPABILITY_VERIFYING_KEY_FILES", file);
        }
        let out = command
            .args(propose_refund(key, &arguments, "run-forged-marker"))
            .args(["--timeout-seconds", "20"])
            .stdin(std::process::Stdio::null())
            .output()?;
        Ok((
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ))
    };
    let (ok, out, err) = propose(Some(&keys.verifying_file))?;
    assert!(
        ok,
        "the answer is readable past the forged marker:\n{out}\n{err}"
    );
    assert!(out.contains("ACCEPTED AUTO_APPROVED"), "{out}\n{err}");
    assert!(
        err.contains("not signed by a processor key"),
        "the forged marker is named:\n{err}"
    );
    // A reader without the key takes the marker for a takeover and sees no answer.
    let (ok, out, err) = propose(None)?;
    assert!(
        !ok,
        "a trusting reader is fenced off its answers:\n{out}\n{err}"
    );
    processor.stop()?;
    Ok(())
}
