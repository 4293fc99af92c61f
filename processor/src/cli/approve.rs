//! `airlock approve <operation-key> --arguments-hash H --approver ID --tenant T [--reject]`: a
//! human's decision on a proposal waiting for approval (DESIGN.md section 4). The approval is
//! an Approval record on the approvals topic, bound to the exact arguments the approver saw
//! (their SHA-256, as `airlock audit --key` and the AWAITING_APPROVAL decision show it); the
//! owner decides it like any input and the command waits for its answer.
//!
//! Exit status: zero when the approval was recorded (or was already counted: running the same
//! command twice is one approval, its id derived from its content); non-zero when it was
//! refused (no pending approval, another arguments hash, expired, self-approval, approver not
//! entitled) or no answer came in time.

use std::io::Write;

use airlock_schemas::{Approval, ApprovalVerdict, Verdict};

use super::ask::{self, Request};
use crate::capability::PersonAct;
use crate::runtime::topics::Names;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The operation key of the proposal waiting for approval.
    pub operation_key: String,
    /// Lowercase hex SHA-256 of the canonical arguments the approver reviewed; an approval for
    /// other arguments is refused.
    #[arg(long)]
    pub arguments_hash: String,
    /// The approver's principal id (must be entitled by the policy's `approve` action, and not
    /// the requester).
    #[arg(long, env = "AIRLOCK_APPROVER")]
    pub approver: String,
    /// The approver's tenant; it must be the proposal's.
    #[arg(long)]
    pub tenant: String,
    /// Reject the proposal instead of approving it.
    #[arg(long)]
    pub reject: bool,
    /// How long the approval may be used to dispatch, in seconds from now.
    #[arg(long, default_value_t = 3_600)]
    pub ttl_seconds: u64,
    /// Free text kept with the approval in the journal.
    #[arg(long)]
    pub comment: Option<String>,
    /// The approver's Ed25519 signing key (`airlock keygen`), whose verifying key the policy
    /// entities register for them (`verifying_keys`); without it the record leaves unsigned,
    /// which the processor refuses for anyone with keys registered.
    #[arg(long, env = "AIRLOCK_SIGNING_KEY")]
    pub signing_key: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub common: ask::Common,
}

pub fn run(args: &Args, out: &mut impl Write) -> anyhow::Result<()> {
    let config = args.common.load()?;
    let asker = ask::Asker::new(&config)?;
    // The round of approvals this one is for: after a failed attempt the intent asks again,
    // and the approver's new approval must not look like a repeat of the first.
    let round = ask::latest_pending_approval(
        &asker,
        "approve",
        &args.operation_key,
        args.common.timeout(),
    )?;
    let approval = approval(args, round.as_deref(), crate::runtime::clock::wall_ms())?;
    let names = Names::new(&config.topics.prefix);
    let payload = asker.encode(&approval)?;
    let request = Request {
        headers: ask::person_signature(
            args.signing_key.as_deref(),
            PersonAct::Approval,
            &args.approver,
            &payload,
        )?,
        topic: names.approvals(),
        operation_key: &args.operation_key,
        partition: None,
        payload,
        reply_to: &approval.approval_id,
        done: |d| matches!(d.verdict, Verdict::Recorded | Verdict::Duplicate),
        answer_ids: vec![format!("a/{}", approval.approval_id)],
    };
    let answer =
        ask::publish_and_await(&asker, "approve", &request, args.common.timeout(), || {
            writeln!(
                out,
                "published {} of {} by {} as {}; waiting for the processor",
                approval.verdict.as_str(),
                args.operation_key,
                args.approver,
                approval.approval_id
            )?;
            Ok(())
        })?;
    ask::print_answer(out, &request, &answer)?;
    let answer = answer.decision;
    anyhow::ensure!(
        matches!(answer.verdict, Verdict::Recorded | Verdict::Duplicate),
        "the processor refused the approval of {}: {}",
        args.operation_key,
        answer.reason.as_str()
    );
    Ok(())
}

/// The approval record; its id is derived from what the approver decided and the round of
/// approvals it answers (`round`: the decision id that asked for it), not from the time, so
/// the same command run again in one round is the same approval.
fn approval(args: &Args, round: Option<&str>, now: i64) -> anyhow::Result<Approval> {
    let hash = &args.arguments_hash;
    anyhow::ensure!(
        hash.len() == 64 && hash.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')),
        "--arguments-hash must be 64 lowercase hex characters (the SHA-256 of the canonical \
         arguments, as `airlock hash` prints it), not {hash:?}"
    );
    let verdict = if args.reject {
        ApprovalVerdict::Reject
    } else {
        ApprovalVerdict::Approve
    };
    let ttl_ms = i64::try_from(args.ttl_seconds.saturating_mul(1_000)).unwrap_or(i64::MAX);
    Ok(Approval {
        approval_id: ask::content_id(
            "approve",
            &[
                &args.operation_key,
                hash,
                &args.approver,
                &args.tenant,
                verdict.as_str(),
                round.unwrap_or(""),
            ],
        ),
        operation_key: args.operation_key.clone(),
        arguments_hash: hash.clone(),
        approver_id: args.approver.clone(),
        tenant_id: args.tenant.clone(),
        verdict,
        expires_at: now.saturating_add(ttl_ms),
        decided_at: now,
        comment: args.comment.clone(),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use clap::Parser;

    fn parse(extra: &[&str]) -> Args {
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            args: Args,
        }
        let mut argv = vec![
            "approve",
            "refund:txn_1",
            "--arguments-hash",
            "95fb46b9aa8f4e1b23ce9e2a94b0d8b6f7a1c3e5d7f9b1a3c5e7f9b1d3f5beb4",
            "--approver",
            "user:alice",
            "--tenant",
            "acme",
        ];
        argv.extend_from_slice(extra);
        Cli::parse_from(argv).args
    }

    #[test]
    fn the_same_decision_is_the_same_approval_and_a_reject_is_another() {
        let round = Some("p/prop-1");
        let a = approval(&parse(&[]), round, 1_000).unwrap();
        let again = approval(&parse(&["--comment", "looked twice"]), round, 9_000).unwrap();
        assert_eq!(a.approval_id, again.approval_id);
        assert_eq!(a.verdict, ApprovalVerdict::Approve);
        assert_eq!(a.expires_at, 1_000 + 3_600_000);
        let reject = approval(&parse(&["--reject"]), round, 1_000).unwrap();
        assert_eq!(reject.verdict, ApprovalVerdict::Reject);
        assert_ne!(a.approval_id, reject.approval_id);
        // The retry of a failed attempt asks again: approving it is another approval.
        let retry = approval(&parse(&[]), Some("p/prop-2"), 1_000).unwrap();
        assert_ne!(a.approval_id, retry.approval_id);
    }

    #[test]
    fn an_arguments_hash_that_is_not_a_sha256_is_refused_before_anything_is_sent() {
        let mut args = parse(&[]);
        args.arguments_hash = "95FB46".to_owned();
        let err = approval(&args, None, 0).unwrap_err().to_string();
        assert!(err.contains("64 lowercase hex"), "{err}");
    }
}
