//! Connector workers against a real broker, a real processor and the reference ledger: the
//! failures Airlock exists for end in exactly one business effect, and commands the processor
//! did not sign never reach the ledger.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::Duration;

use airlock_processor::capability::{self, SigningKey};
use airlock_processor::core::canonical;
use airlock_processor::runtime::partitioner;
use airlock_processor::runtime::wire::{Admit, FENCE_KEY_PREFIX, OutRecord, header};
use airlock_processor::sample;
use airlock_schemas::{
    Codec, Decision, DispatchCommand, Outcome, OutcomeKind, ReconcileCommand, Verdict,
};
use airlock_tests::airlock::{Airlock, Options};
use airlock_tests::connector::{Keys, Ledger};
use airlock_tests::eventually;
use airlock_tests::wall_ms;

const WAIT: Duration = Duration::from_secs(90);
const PARTITIONS: i32 = 2;

fn log_file(test: &str, what: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "airlock-connector-{test}-{what}-{}.log",
        std::process::id()
    ))
}

/// The accounts every scenario moves money on.
const ACCOUNTS: [(&str, &str, &str, i64); 1] = [("acme", "acct-42", "EUR", 10_000_000)];

async fn signed_airlock(test: &str, keys: &Keys) -> anyhow::Result<Airlock> {
    Airlock::start_with(test, PARTITIONS, Options::with_workers(keys)).await
}

fn outcomes_of(a: &Airlock, key: &str) -> anyhow::Result<Vec<Outcome>> {
    Ok(
        a.read_deduplicated::<Outcome>(&a.names.outcomes(), "outcome")?
            .into_iter()
            .filter(|o| o.operation_key == key)
            .collect(),
    )
}

fn decisions_of(a: &Airlock, key: &str) -> anyhow::Result<Vec<Decision>> {
    Ok(
        a.read_deduplicated::<Decision>(&a.names.decisions(), "decision")?
            .into_iter()
            .filter(|d| d.operation_key == key)
            .collect(),
    )
}

fn kinds(outcomes: &[Outcome]) -> Vec<(i64, OutcomeKind)> {
    outcomes.iter().map(|o| (o.epoch, o.kind)).collect()
}

/// Prints the logs of a failed scenario (the assertion message stays short).
fn dump(paths: &[&PathBuf]) {
    for p in paths {
        let text = std::fs::read_to_string(p).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(60).collect();
        eprintln!("--- {} (newest first)\n{}", p.display(), tail.join("\n"));
    }
}

async fn settled(a: &Airlock, key: &str, logs: &[&PathBuf]) -> anyhow::Result<Decision> {
    let result = eventually(&format!("{key} settled COMMITTED"), WAIT, async || {
        Ok(decisions_of(a, key)?
            .into_iter()
            .find(|d| d.verdict == Verdict::Committed))
    })
    .await;
    if result.is_err() {
        eprintln!("outcomes of {key}: {:?}", kinds(&outcomes_of(a, key)?));
        eprintln!(
            "decisions of {key}: {:?}",
            decisions_of(a, key)?
                .iter()
                .map(|d| (d.decision_id.clone(), d.verdict))
                .collect::<Vec<_>>()
        );
        dump(logs);
    }
    result
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_response_is_unknown_then_reconciled_to_one_committed_effect() -> anyhow::Result<()>
{
    let keys = Keys::generate()?;
    let a = signed_airlock("conn-lost", &keys).await?;
    let (ledger_log, worker_log) = (log_file("lost", "ledger"), log_file("lost", "worker"));
    let ledger = Ledger::start(&ACCOUNTS, &ledger_log)?;
    let processor = a.spawn("p1")?;
    let worker = a.spawn_connector("w1", &ledger, &[&keys.verifying_file], &worker_log)?;
    let producer = a.producer()?;
    let key = "refund:lost-1";
    // The connector sends the operation key as the ledger's business reference.
    ledger.arm("drop-response", key).await?;

    let first = sample::refund(key, 2_500, wall_ms());
    a.send(&producer, &a.names.proposals(), key, &first).await?;
    let unknown = eventually("an UNKNOWN outcome", WAIT, async || {
        Ok(outcomes_of(&a, key)?
            .into_iter()
            .find(|o| o.kind == OutcomeKind::Unknown))
    })
    .await;
    if unknown.is_err() {
        dump(&[&worker_log, &ledger_log]);
    }
    let unknown = unknown?;
    assert_eq!(unknown.epoch, 1);
    assert_eq!(unknown.worker_id, "w1");

    // A blind retry (new proposal id, same key) while the attempt is unresolved dispatches
    // nothing.
    let retry = sample::resend(&first, 1);
    a.send(&producer, &a.names.proposals(), key, &retry).await?;
    let reply = eventually("the retry's reply", WAIT, async || {
        Ok(a.proposal_replies()?.remove(&retry.proposal_id))
    })
    .await?;
    assert!(
        matches!(reply.verdict, Verdict::Ambiguous | Verdict::InProgress),
        "{reply:?}"
    );

    let committed = settled(&a, key, &[&worker_log, &ledger_log]).await?;
    assert_eq!(committed.epoch, Some(1), "{committed:?}");
    let outcomes = outcomes_of(&a, key)?;
    let reconciled = outcomes
        .iter()
        .find(|o| o.kind == OutcomeKind::ReconciledCommitted)
        .expect("reconciliation found the effect");
    assert_eq!(reconciled.reconcile_round, Some(1));
    assert!(reconciled.provider_reference.is_some(), "{reconciled:?}");
    assert_eq!(ledger.effects_for(key).await?, 1, "{:?}", kinds(&outcomes));
    let dispatches = a.dispatches()?;
    assert_eq!(
        dispatches.iter().filter(|d| d.operation_key == key).count(),
        1
    );
    assert!(dispatches.iter().all(|d| d.capability.is_some()));

    assert!(worker.stop()?, "the worker stops cleanly on SIGTERM");
    // The worker's barriers on the outcomes (learning their end) are not input to refuse.
    assert_eq!(processor.stop()?.dead_lettered, 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proven_refusal_is_retried_as_a_new_epoch_and_commits_once() -> anyhow::Result<()> {
    let keys = Keys::generate()?;
    let a = signed_airlock("conn-refused", &keys).await?;
    let (ledger_log, worker_log) = (log_file("refused", "ledger"), log_file("refused", "worker"));
    let ledger = Ledger::start(&ACCOUNTS, &ledger_log)?;
    let processor = a.spawn("p1")?;
    let worker = a.spawn_connector("w1", &ledger, &[&keys.verifying_file], &worker_log)?;
    let producer = a.producer()?;
    let key = "refund:refused-1";
    ledger.arm("refuse", key).await?;

    let proposal = sample::refund(key, 1_200, wall_ms());
    a.send(&producer, &a.names.proposals(), key, &proposal)
        .await?;
    let committed = settled(&a, key, &[&worker_log, &ledger_log]).await?;
    assert_eq!(committed.epoch, Some(2), "{committed:?}");

    let outcomes = kinds(&outcomes_of(&a, key)?);
    for expected in [
        (1, OutcomeKind::AttemptStarted),
        (1, OutcomeKind::Failed),
        (2, OutcomeKind::AttemptStarted),
        (2, OutcomeKind::Committed),
    ] {
        assert!(outcomes.contains(&expected), "{expected:?} in {outcomes:?}");
    }
    let attempts: Vec<i64> = a
        .dispatches()?
        .into_iter()
        .filter(|d| d.operation_key == key)
        .map(|d| d.epoch)
        .collect();
    assert_eq!(attempts, [1, 2]);
    assert_eq!(ledger.effects_for(key).await?, 1);

    assert!(worker.stop()?);
    processor.stop()?;
    Ok(())
}

/// The most calls the worker had in flight at once, from its log (a call is in flight from
/// "started; calling" to its outcome line).
fn most_calls_in_flight(worker_log: &PathBuf) -> usize {
    let text = std::fs::read_to_string(worker_log).unwrap_or_default();
    let mut in_flight = std::collections::BTreeSet::new();
    let mut most = 0;
    for line in text.lines() {
        let Some((_, rest)) = line.split_once("airlock_connectors::worker::handle: ") else {
            continue;
        };
        let Some((attempt, what)) = rest.split_once(": ") else {
            continue;
        };
        if what.starts_with("started; calling") {
            in_flight.insert(attempt.to_owned());
            most = most.max(in_flight.len());
        } else if ["COMMITTED", "FAILED", "UNKNOWN"]
            .iter()
            .any(|k| what.starts_with(k))
        {
            in_flight.remove(attempt);
        }
    }
    most
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_calls_a_backlog_at_once_and_each_refund_commits_once() -> anyhow::Result<()> {
    let keys = Keys::generate()?;
    let a = signed_airlock("conn-backlog", &keys).await?;
    let (ledger_log, worker_log) = (log_file("backlog", "ledger"), log_file("backlog", "worker"));
    let ledger = Ledger::start(&ACCOUNTS, &ledger_log)?;
    // A slow downstream: one call at a time, twelve would take six seconds.
    ledger.arm_always("delay=500").await?;
    let processor = a.spawn("p1")?;
    let producer = a.producer()?;
    let refunds: Vec<_> = (0..12)
        .map(|i| sample::refund(&format!("refund:backlog-{i}"), 100 + i, wall_ms()))
        .collect();
    a.send_many(&producer, &a.names.proposals(), &refunds, |p| {
        p.operation_key.as_str()
    })
    .await?;
    // The whole backlog waits in the dispatch topic before the worker starts.
    eventually("twelve dispatch commands", WAIT, async || {
        Ok((a.dispatches()?.len() == refunds.len()).then_some(()))
    })
    .await?;
    let worker = a.spawn_connector("w1", &ledger, &[&keys.verifying_file], &worker_log)?;
    for p in &refunds {
        settled(&a, &p.operation_key, &[&worker_log, &ledger_log]).await?;
        assert_eq!(ledger.effects_for(&p.operation_key).await?, 1);
    }
    assert_eq!(ledger.effects_total().await?, refunds.len() as u64);
    let most = most_calls_in_flight(&worker_log);
    assert!(
        most >= 2,
        "the worker made its calls one at a time ({most} at most in flight)"
    );
    assert!(worker.stop()?);
    processor.stop()?;
    Ok(())
}

/// The line of the worker's log that reports the outcome of `attempt` (`key#epoch`).
fn outcome_line(worker_log: &PathBuf, attempt: &str) -> Option<usize> {
    let needle = format!("worker::handle: {attempt}: ");
    std::fs::read_to_string(worker_log)
        .unwrap_or_default()
        .lines()
        .position(|l| {
            l.split_once(&needle).is_some_and(|(_, what)| {
                ["COMMITTED", "FAILED", "UNKNOWN"]
                    .iter()
                    .any(|k| what.starts_with(k))
            })
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_call_holds_one_slot_and_the_commands_after_it_go_on() -> anyhow::Result<()> {
    let keys = Keys::generate()?;
    // The registry's attempt caps (10 minutes): a loaded machine's delays never expire the
    // slow attempt or the ones after it.
    let a = Airlock::start_with(
        "conn-slow",
        PARTITIONS,
        Options {
            signing_key_file: Some(keys.signing_file.clone()),
            signing_workers: true,
            ..Options::default()
        },
    )
    .await?;
    let (ledger_log, worker_log) = (log_file("slow", "ledger"), log_file("slow", "worker"));
    let ledger = Ledger::start(&ACCOUNTS, &ledger_log)?;
    let slow = "refund:slow-1";
    ledger.arm("delay=10000", slow).await?;
    let processor = a.spawn("p1")?;
    let worker = a.spawn_connector("w1", &ledger, &[&keys.verifying_file], &worker_log)?;
    let producer = a.producer()?;
    let first = sample::refund(slow, 700, wall_ms());
    a.send(&producer, &a.names.proposals(), slow, &first)
        .await?;
    eventually("the slow call under way", WAIT, async || {
        let log = std::fs::read_to_string(&worker_log)?;
        Ok(log
            .contains(&format!("{slow}#1: started; calling"))
            .then_some(()))
    })
    .await?;
    // Read after the slow command, on its partition and the other one.
    let after: Vec<_> = (0..6)
        .map(|i| sample::refund(&format!("refund:after-slow-{i}"), 100 + i, wall_ms()))
        .collect();
    a.send_many(&producer, &a.names.proposals(), &after, |p| {
        p.operation_key.as_str()
    })
    .await?;
    for p in after.iter().chain([&first]) {
        settled(&a, &p.operation_key, &[&worker_log, &ledger_log]).await?;
        assert_eq!(ledger.effects_for(&p.operation_key).await?, 1);
    }
    let slow_line = outcome_line(&worker_log, &format!("{slow}#1"));
    for p in &after {
        let line = outcome_line(&worker_log, &format!("{}#1", p.operation_key));
        assert!(
            line.is_some() && line < slow_line,
            "{} was reported at line {line:?} of the worker's log, the slow call at {slow_line:?}: \
             the commands after a slow call waited for it",
            p.operation_key
        );
    }
    assert!(worker.stop()?);
    processor.stop()?;
    Ok(())
}

/// A dispatch command for `key` as the processor would issue it, signed by `key_by`.
fn command(
    key: &str,
    minor_units: i64,
    now: i64,
    signed_by: Option<&SigningKey>,
) -> DispatchCommand {
    let arguments_json = canonical::canonicalize(&sample::money_arguments(
        "acme",
        "acct-42",
        minor_units,
        "EUR",
    ))
    .unwrap()
    .json;
    let mut cmd = DispatchCommand {
        command_id: format!("{key}#1"),
        operation_key: key.to_owned(),
        epoch: 1,
        proposal_id: format!("prop-{key}"),
        tool: "refund".to_owned(),
        tool_version: "1".to_owned(),
        connector: "ledger".to_owned(),
        tenant_id: "acme".to_owned(),
        principal_id: "agent-support-1".to_owned(),
        arguments_hash: canonical::arguments_hash(&arguments_json),
        arguments_json,
        idempotency_key: canonical::idempotency_key(key),
        deadline_at: now + 3_600_000,
        attempt_deadline_at: now + 60_000,
        attempt_timeout_ms: 10_000,
        policy_bundle_hash: "test".to_owned(),
        owner_partition: partitioner::partition_for(key.as_bytes(), PARTITIONS),
        owner_epoch: 1,
        capability: None,
        issued_at: now,
    };
    if let Some(k) = signed_by {
        cmd.capability = Some(capability::sign(k, &cmd));
    }
    cmd
}

/// A reconcile command for round 1 of `key`'s epoch 1, signed by `signed_by`.
fn reconcile(key: &str, now: i64, signed_by: Option<&SigningKey>) -> ReconcileCommand {
    let mut cmd = sample::reconcile_of(&command(key, 100, now, None), 1, now);
    if let Some(k) = signed_by {
        cmd.capability = Some(capability::sign_reconcile(k, &cmd));
    }
    cmd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_the_processor_did_not_sign_never_reach_the_ledger() -> anyhow::Result<()> {
    let keys = Keys::generate()?;
    let a = signed_airlock("conn-forged", &keys).await?;
    let (ledger_log, worker_log) = (log_file("forged", "ledger"), log_file("forged", "worker"));
    let ledger = Ledger::start(&ACCOUNTS, &ledger_log)?;
    let worker = a.spawn_connector("w1", &ledger, &[&keys.verifying_file], &worker_log)?;
    let producer = a.producer()?;
    let topic = a.names.dispatch("ledger");
    let now = wall_ms();
    let intruder = capability::generate()?;

    let forged = command("refund:forged", 100, now, Some(&intruder));
    let mut altered = command("refund:altered", 100, now, Some(&keys.key));
    altered.arguments_json = altered.arguments_json.replace("100", "990000");
    let unsigned = command("refund:unsigned", 100, now, None);
    let mut expired = command("refund:expired", 100, now - 120_000, None);
    expired.capability = Some(capability::sign(&keys.key, &expired));
    // Expired two hours ago: an old copy, refused (its ATTEMPT_STARTED could be gone).
    let mut stale = command("refund:stale", 100, now - 7_200_000, None);
    stale.capability = Some(capability::sign(&keys.key, &stale));
    let mut raised = command("refund:raised", 100, now, Some(&keys.key));
    raised.epoch = 7; // a signed field changed after signing
    // The control: the same path with a genuine command does reach the ledger.
    let genuine = command("refund:genuine", 100, now, Some(&keys.key));

    // Reconcile commands nobody signed: answered, they would report a "proof" of failure.
    let recon_unsigned = reconcile("refund:recon-unsigned", now, None);
    let recon_forged = reconcile("refund:recon-forged", now, Some(&intruder));

    // Fence markers nobody signed, on the genuine command's partition ahead of it: honoured,
    // they would have the worker ignore that command and every later one there as fenced.
    let partition = genuine.owner_partition;
    let mut forged_marker = OutRecord::fence_marker(&topic, partition, 999_999);
    forged_marker.headers.push((
        header::CAPABILITY.to_owned(),
        capability::sign_fence(&intruder, &topic, partition, 999_999),
    ));
    let unsigned_marker = OutRecord::fence_marker(&topic, partition, 999_998);
    // An unreadable epoch ahead of the real one: readers take the last header of a name.
    let mut doubled_marker = OutRecord::fence_marker(&topic, partition, 999_997);
    doubled_marker
        .headers
        .insert(0, (header::OWNER_EPOCH.to_owned(), b"x".to_vec()));
    a.produce(vec![forged_marker, unsigned_marker, doubled_marker])?;

    let codec = Codec::new();
    let mut payloads = Vec::new();
    for cmd in [
        &forged, &altered, &unsigned, &expired, &stale, &raised, &genuine,
    ] {
        payloads.push((cmd.operation_key.clone(), codec.encode_single_object(cmd)?));
    }
    for cmd in [&recon_unsigned, &recon_forged] {
        payloads.push((cmd.operation_key.clone(), codec.encode_single_object(cmd)?));
    }
    for (key, payload) in &payloads {
        a.send_raw(&producer, &topic, Some(key.as_bytes()), payload)
            .await?;
    }

    let genuine_outcome = eventually("the genuine command committed", WAIT, async || {
        Ok(outcomes_of(&a, "refund:genuine")?
            .into_iter()
            .find(|o| o.kind == OutcomeKind::Committed))
    })
    .await;
    let dead = eventually("ten dead letters from the worker", WAIT, async || {
        let letters: Vec<_> = a
            .read_topic(&a.names.dlq())?
            .into_iter()
            .filter(|r| r.admit == Admit::Accept && r.header("airlock-connector-worker").is_some())
            .collect();
        Ok((letters.len() >= 10).then_some(letters))
    })
    .await;
    if genuine_outcome.is_err() || dead.is_err() {
        dump(&[&worker_log, &ledger_log]);
    }
    genuine_outcome?;
    let dead = dead?;
    let reasons: std::collections::BTreeMap<String, String> = dead
        .iter()
        .map(|r| {
            (
                String::from_utf8_lossy(r.key.as_deref().unwrap_or_default()).into_owned(),
                r.header_str(header::DLQ_REASON).unwrap_or("").to_owned(),
            )
        })
        .collect();
    assert_eq!(reasons["refund:forged"], "FORGED", "{reasons:?}");
    assert_eq!(
        reasons["refund:altered"], "ARGUMENTS_ALTERED",
        "{reasons:?}"
    );
    assert_eq!(reasons["refund:unsigned"], "UNSIGNED", "{reasons:?}");
    assert_eq!(reasons["refund:stale"], "EXPIRED", "{reasons:?}");
    assert_eq!(reasons["refund:raised"], "FORGED", "{reasons:?}");
    assert_eq!(reasons["refund:recon-unsigned"], "UNSIGNED", "{reasons:?}");
    assert_eq!(reasons["refund:recon-forged"], "FORGED", "{reasons:?}");
    assert_eq!(
        reasons[&format!("{FENCE_KEY_PREFIX}999999")],
        "FORGED",
        "{reasons:?}"
    );
    assert_eq!(
        reasons[&format!("{FENCE_KEY_PREFIX}999998")],
        "UNSIGNED",
        "{reasons:?}"
    );
    assert_eq!(
        reasons[&format!("{FENCE_KEY_PREFIX}999997")],
        "UNSIGNED",
        "{reasons:?}"
    );
    for r in &dead {
        assert_eq!(r.header_str(header::SOURCE_TOPIC), Some(topic.as_str()));
        assert!(r.header_str(header::SOURCE_OFFSET).is_some());
        assert!(r.value.is_some(), "the refused bytes are kept");
    }
    for key in reasons.keys().filter(|k| !k.starts_with(FENCE_KEY_PREFIX)) {
        assert!(outcomes_of(&a, key)?.is_empty(), "{key} has outcomes");
        assert_eq!(ledger.effects_for(key).await?, 0, "{key}");
    }
    // An authentic command read after its attempt deadline is no bad input: its attempt is
    // started and failed without a call, so the processor can settle it at once instead of
    // waiting it out as UNKNOWN and looking it up downstream.
    assert!(!reasons.contains_key("refund:expired"), "{reasons:?}");
    let expired = eventually("the expired command failed", WAIT, async || {
        let o = outcomes_of(&a, "refund:expired")?;
        Ok((o.len() >= 2).then_some(o))
    })
    .await?;
    assert_eq!(
        kinds(&expired),
        [(1, OutcomeKind::AttemptStarted), (1, OutcomeKind::Failed)]
    );
    let evidence = expired[1].evidence.as_deref().unwrap_or_default();
    assert!(evidence.starts_with("not called: expired"), "{evidence}");
    // Asked to look it up (the processor timed the attempt out meanwhile), the worker knows
    // the answer without a lookup.
    let lookup = reconcile("refund:expired", now, Some(&keys.key));
    a.send_raw(
        &producer,
        &topic,
        Some(b"refund:expired"),
        &codec.encode_single_object(&lookup)?,
    )
    .await?;
    let answered = eventually("the lookup answered", WAIT, async || {
        Ok(outcomes_of(&a, "refund:expired")?
            .into_iter()
            .find(|o| o.kind == OutcomeKind::ReconciledFailed))
    })
    .await?;
    let evidence = answered.evidence.as_deref().unwrap_or_default();
    assert!(
        evidence.starts_with("not called: this connector failed attempt 1"),
        "{evidence}"
    );
    assert_eq!(ledger.effects_for("refund:expired").await?, 0);
    assert_eq!(ledger.effects_total().await?, 1);
    assert!(worker.stop()?);
    Ok(())
}

/// Produces `outcome` to the outcomes topic as a worker would, with `capability` as its
/// `airlock-capability` header when given.
fn send_outcome(a: &Airlock, outcome: &Outcome, sign: Option<&SigningKey>) -> anyhow::Result<()> {
    let value = Codec::new().encode_single_object(outcome)?;
    let partition = partitioner::partition_for(outcome.operation_key.as_bytes(), PARTITIONS);
    let mut headers = Vec::new();
    if let Some(key) = sign {
        headers.push((
            header::CAPABILITY.to_owned(),
            capability::sign_outcome(key, &outcome.connector, &value),
        ));
    }
    let record = OutRecord {
        topic: a.names.outcomes(),
        partition,
        key: Some(outcome.operation_key.as_bytes().to_vec()),
        value: Some(value),
        headers,
        phase: 0,
    };
    a.produce(vec![record])?;
    Ok(())
}

/// Outcomes settle an effect only when a worker of its connector signed them: an unsigned
/// FAILED (which would have had a second attempt dispatched while the first may still land)
/// and a COMMITTED signed by another key are dead-lettered by the processor and change
/// nothing; the same COMMITTED signed with the workers' key settles it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outcomes_no_worker_of_the_connector_signed_settle_nothing() -> anyhow::Result<()> {
    let keys = Keys::generate()?;
    let a = signed_airlock("conn-outcomes", &keys).await?;
    let worker_key = capability::load_signing_key(
        a.worker_signing_key_file
            .as_deref()
            .expect("signing workers"),
    )?;
    let processor = a.spawn("p1")?;
    let producer = a.producer()?;
    // No ledger worker runs: nobody executes the dispatched refund.
    let key = "refund:nobody-ran";
    let p = sample::refund(key, 700, wall_ms());
    a.send(&producer, &a.names.proposals(), key, &p).await?;
    a.await_replies([p.proposal_id.as_str()], WAIT).await?;

    let intruder = capability::generate()?;
    send_outcome(
        &a,
        &sample::outcome(key, 1, OutcomeKind::Failed, "declined"),
        None,
    )?;
    send_outcome(
        &a,
        &sample::outcome(key, 1, OutcomeKind::Committed, "done"),
        Some(&intruder),
    )?;
    let refused = eventually("two outcomes dead-lettered", WAIT, async || {
        let letters: Vec<String> = a
            .read_topic(&a.names.dlq())?
            .into_iter()
            .filter(|r| r.header_str(header::SOURCE_TOPIC) == Some(&a.names.outcomes()))
            .filter_map(|r| r.header_str(header::DLQ_REASON).map(str::to_owned))
            .collect();
        Ok((letters.len() >= 2).then_some(letters))
    })
    .await?;
    assert_eq!(refused, ["UNSIGNED", "FORGED"]);
    let settled_before: Vec<_> = decisions_of(&a, key)?
        .into_iter()
        .filter(|d| matches!(d.verdict, Verdict::Committed | Verdict::Failed))
        .collect();
    assert!(settled_before.is_empty(), "{settled_before:?}");
    let dispatched = a
        .dispatches()?
        .into_iter()
        .filter(|d| d.operation_key == key)
        .count();
    assert_eq!(dispatched, 1, "a forged failure dispatched another attempt");

    send_outcome(
        &a,
        &sample::outcome(key, 1, OutcomeKind::Committed, "done"),
        Some(&worker_key),
    )?;
    let committed = settled(&a, key, &[]).await?;
    assert_eq!(committed.epoch, Some(1));
    assert_eq!(processor.stop()?.dead_lettered, 2);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_worker_refuses_an_attempt_its_predecessor_started() -> anyhow::Result<()> {
    let keys = Keys::generate()?;
    let a = signed_airlock("conn-restart", &keys).await?;
    let (ledger_log, worker_log) = (log_file("restart", "ledger"), log_file("restart", "worker"));
    let ledger = Ledger::start(&ACCOUNTS, &ledger_log)?;
    let producer = a.producer()?;
    let topic = a.names.dispatch("ledger");
    let codec = Codec::new();
    let now = wall_ms();
    let first = command("refund:restart-1", 300, now, Some(&keys.key));
    // A later command on the same partition: once it is answered, everything before it was.
    let later_key = (0..)
        .map(|i| format!("refund:restart-later-{i}"))
        .find(|k| partitioner::partition_for(k.as_bytes(), PARTITIONS) == first.owner_partition)
        .unwrap();
    let later = command(&later_key, 400, now, Some(&keys.key));

    let worker = a.spawn_connector("w1", &ledger, &[&keys.verifying_file], &worker_log)?;
    a.send_raw(
        &producer,
        &topic,
        Some(first.operation_key.as_bytes()),
        &codec.encode_single_object(&first)?,
    )
    .await?;
    let done = eventually("the first attempt committed", WAIT, async || {
        Ok(outcomes_of(&a, &first.operation_key)?
            .into_iter()
            .find(|o| o.kind == OutcomeKind::Committed))
    })
    .await;
    if done.is_err() {
        dump(&[&worker_log, &ledger_log]);
    }
    done?;
    assert!(worker.stop()?);

    // The processor's outbox resends the same command; a new worker gains the partition.
    let worker = a.spawn_connector("w2", &ledger, &[&keys.verifying_file], &worker_log)?;
    for cmd in [&first, &later] {
        a.send_raw(
            &producer,
            &topic,
            Some(cmd.operation_key.as_bytes()),
            &codec.encode_single_object(cmd)?,
        )
        .await?;
    }
    let done = eventually("the later command committed", WAIT, async || {
        Ok(outcomes_of(&a, &later_key)?
            .into_iter()
            .find(|o| o.kind == OutcomeKind::Committed))
    })
    .await;
    if done.is_err() {
        dump(&[&worker_log, &ledger_log]);
    }
    done?;
    // Raw records, not deduplicated: a second start would repeat the first one's identity.
    let raw: Vec<Outcome> = a
        .read_topic(&a.names.outcomes())?
        .into_iter()
        .filter(|r| r.header_str(header::KIND) == Some("outcome"))
        .map(|r| codec.decode_as::<Outcome>(r.value.as_deref().unwrap_or_default()))
        .collect::<Result<_, _>>()?;
    let first_outcomes: Vec<OutcomeKind> = raw
        .iter()
        .filter(|o| o.operation_key == first.operation_key)
        .map(|o| o.kind)
        .collect();
    assert_eq!(
        first_outcomes,
        [OutcomeKind::AttemptStarted, OutcomeKind::Committed],
        "w2 rebuilt the started attempts and refused the redelivery"
    );
    assert!(
        raw.iter()
            .all(|o| o.operation_key != first.operation_key || o.worker_id == "w1")
    );
    assert_eq!(ledger.effects_total().await?, 2);
    assert!(worker.stop()?);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreconcilable_effect_waits_for_an_operator_and_airlock_settle_closes_it()
-> anyhow::Result<()> {
    use airlock_schemas::{JournalEvent, JournalKind, Reason};
    let keys = Keys::generate()?;
    let a = signed_airlock("conn-settle", &keys).await?;
    let (ledger_log, worker_log) = (log_file("settle", "ledger"), log_file("settle", "worker"));
    let ledger = Ledger::start(&ACCOUNTS, &ledger_log)?;
    let processor = a.spawn("p1")?;
    let worker = a.spawn_connector("w1", &ledger, &[&keys.verifying_file], &worker_log)?;
    let producer = a.producer()?;
    let key = "refund:settle-1";
    ledger.arm("drop-response", key).await?;
    let first = sample::refund(key, 2_500, wall_ms());
    a.send(&producer, &a.names.proposals(), key, &first).await?;
    eventually("an UNKNOWN outcome", WAIT, async || {
        Ok(outcomes_of(&a, key)?
            .into_iter()
            .find(|o| o.kind == OutcomeKind::Unknown))
    })
    .await?;

    // The downstream goes away: every reconciliation round stays UNKNOWN (the lookup cannot
    // connect) and, after the tool's budget, the effect waits for an operator.
    drop(ledger);
    let waiting = eventually("OPERATOR_REQUIRED", WAIT, async || {
        Ok(decisions_of(&a, key)?
            .into_iter()
            .find(|d| d.reason == Reason::OperatorRequired))
    })
    .await;
    if waiting.is_err() {
        eprintln!("outcomes of {key}: {:?}", kinds(&outcomes_of(&a, key)?));
        dump(&[&worker_log, &ledger_log]);
    }
    assert_eq!(waiting?.verdict, Verdict::Unknown);
    let rounds = outcomes_of(&a, key)?
        .iter()
        .filter(|o| o.kind == OutcomeKind::ReconciledUnknown)
        .count();
    assert!(rounds >= 1, "no reconciliation round was answered");

    // The operator checked the statement by hand.
    let settle = || {
        std::process::Command::new(airlock_tests::airlock::airlock_binary()?)
            .args(["settle", key, "--committed", "--operator", "operator-olga"])
            .args(["--evidence", "statement line 4821: refund 25.00 EUR"])
            .args(["--timeout-seconds", "60"])
            .env("AIRLOCK_KAFKA_BROKERS", &a.config.kafka.brokers)
            .env("AIRLOCK_TOPICS_PREFIX", &a.config.topics.prefix)
            .env("AIRLOCK_TOPICS_PARTITIONS", PARTITIONS.to_string())
            .output()
            .map_err(anyhow::Error::from)
    };
    let out = settle()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "airlock settle: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("OPERATOR_SETTLED"), "{stdout}");
    let settled = decisions_of(&a, key)?
        .into_iter()
        .find(|d| d.verdict == Verdict::Committed)
        .expect("the proposal's reply says COMMITTED");
    assert_eq!(settled.reason, Reason::OperatorSettled);

    // The journal names the operator; running the same command again (a lost terminal) is
    // the same settlement: answered the same, journaled once.
    let settlements = || -> anyhow::Result<Vec<JournalEvent>> {
        Ok(
            a.read_deduplicated::<JournalEvent>(&a.names.journal(), "journal")?
                .into_iter()
                .filter(|e| {
                    e.operation_key.as_deref() == Some(key)
                        && e.kind == JournalKind::ControlApplied
                        && e.reason == Some(Reason::OperatorSettled)
                })
                .collect(),
        )
    };
    let first_settlement = settlements()?;
    assert_eq!(first_settlement.len(), 1);
    assert_eq!(
        first_settlement[0].principal_id.as_deref(),
        Some("operator-olga")
    );
    let again = settle()?;
    assert!(
        again.status.success()
            && String::from_utf8_lossy(&again.stdout).contains("OPERATOR_SETTLED"),
        "the same settlement again: {}{}",
        String::from_utf8_lossy(&again.stdout),
        String::from_utf8_lossy(&again.stderr)
    );
    assert_eq!(settlements()?.len(), 1);
    worker.stop()?;
    processor.stop()?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_call_twenty_times_leaves_one_effect_per_key_and_nothing_stuck()
-> anyhow::Result<()> {
    use airlock_tests::workload::Lcg;
    let keys = Keys::generate()?;
    let a = signed_airlock("conn-kill", &keys).await?;
    let (ledger_log, worker_log) = (log_file("kill", "ledger"), log_file("kill", "worker"));
    let ledger = Ledger::start(&ACCOUNTS, &ledger_log)?;
    // Every call takes a while after the commit: kills land mid-call, after the effect and
    // before its answer, as often as before the call.
    ledger.arm_always("delay=400").await?;
    let processor = a.spawn("p1")?;
    let producer = a.producer()?;
    let now = wall_ms();
    let ops: Vec<String> = (0..30).map(|i| format!("refund:kill-{i}")).collect();
    let sender = {
        let producer = producer.clone();
        let topic = a.names.proposals();
        let proposals: Vec<_> = ops
            .iter()
            .enumerate()
            .map(|(i, k)| sample::refund(k, 100 + i as i64, now))
            .collect();
        let a = &a;
        async move {
            for p in &proposals {
                a.send(&producer, &topic, &p.operation_key, p).await?;
                tokio::time::sleep(Duration::from_millis(150)).await;
            }
            anyhow::Ok(())
        }
    };
    let killer = async {
        let mut rng = Lcg(0x6b11);
        for i in 0..20 {
            // A group of its own: the replacement takes every partition at once instead of
            // waiting out the killed worker's session timeout (kills come every 2.5-5 s).
            let group = format!("kill-{i}");
            let worker = a.spawn_connector_in(
                &format!("w{i}"),
                Some(&group),
                &ledger,
                &[&keys.verifying_file],
                &worker_log,
            )?;
            let ms = 2_500 + rng.next_u64() % 2_500;
            tokio::time::sleep(Duration::from_millis(ms)).await;
            worker.kill()?;
        }
        anyhow::Ok(())
    };
    let (sent, killed) = tokio::join!(sender, killer);
    sent?;
    killed?;

    // One worker stays: attempts the kills left UNKNOWN time out, are reconciled and settle.
    let worker = a.spawn_connector_in(
        "w-last",
        Some("kill-last"),
        &ledger,
        &[&keys.verifying_file],
        &worker_log,
    )?;
    // Settled: COMMITTED, or FAILED with the retry budget (3 attempts) spent.
    let outcome = |decisions: &[Decision], k: &str| -> Option<Verdict> {
        let mine: Vec<&Decision> = decisions.iter().filter(|d| d.operation_key == k).collect();
        if mine.iter().any(|d| d.verdict == Verdict::Committed) {
            return Some(Verdict::Committed);
        }
        mine.last()
            .filter(|d| d.verdict == Verdict::Failed && d.epoch >= Some(3))
            .map(|d| d.verdict)
    };
    let settled = eventually(
        "every effect COMMITTED or FAILED for good",
        Duration::from_secs(240),
        async || {
            let decisions = a.read_deduplicated::<Decision>(&a.names.decisions(), "decision")?;
            let done = ops.iter().all(|k| outcome(&decisions, k).is_some());
            Ok(done.then_some(decisions))
        },
    )
    .await;
    let decisions = match settled {
        Ok(d) => d,
        Err(e) => {
            for k in &ops {
                eprintln!("{k}: {:?}", kinds(&outcomes_of(&a, k)?));
            }
            dump(&[&worker_log]);
            return Err(e);
        }
    };
    let mut committed = 0;
    for k in &ops {
        let effects = ledger.effects_for(k).await?;
        let verdict = outcome(&decisions, k);
        assert!(effects <= 1, "{k}: {effects} business effects");
        assert_eq!(
            effects == 1,
            verdict == Some(Verdict::Committed),
            "{k}: {effects} effects but {verdict:?}"
        );
        committed += effects;
    }
    eprintln!(
        "{} keys, {committed} committed once, 20 worker kills",
        ops.len()
    );
    worker.stop()?;
    processor.stop()?;
    Ok(())
}
