//! A policy bundle deployed while an intent waits for its approval decides that approval.
//!
//! A refund above the automatic tier waits for approval under the reference bundle. The
//! processor is replaced by one whose bundle adds a policy forbidding refunds (an incident
//! freeze), on the same state. The approval arrives: the intent is authorized again under the
//! bundle in force, DENIED with POLICY_DENIED, and both the approver's answer and the proposal's
//! final answer name the new bundle, not the one that asked for the approval. Nothing is
//! dispatched.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use airlock_processor::core::canonical;
use airlock_processor::sample;
use airlock_schemas::{ApprovalVerdict, Decision, Reason, Verdict};
use airlock_tests::airlock::Airlock;
use airlock_tests::eventually;
use airlock_tests::wall_ms;

const WAIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_is_decided_under_the_bundle_in_force_when_it_arrives() -> anyhow::Result<()> {
    let mut a = Airlock::start("bundle", 1).await?;
    let producer = a.producer()?;
    let processor = a.spawn("p1")?;
    let refund = sample::refund("refund:under-a-freeze", 20_000, wall_ms());
    a.send(
        &producer,
        &a.names.proposals(),
        &refund.operation_key,
        &refund,
    )
    .await?;
    let replies = a.await_replies([refund.proposal_id.as_str()], WAIT).await?;
    let pending = &replies[&refund.proposal_id];
    assert_eq!(pending.verdict, Verdict::PendingApproval, "{pending:?}");
    let old_bundle = pending.policy_bundle_hash.clone().expect("a bundle");
    processor.stop()?;

    // The freeze: the reference bundle and one more policy.
    let dir = tempfile::tempdir()?;
    let frozen = dir.path().join("policies.cedar");
    let mut text = std::fs::read_to_string(&a.config.tools.policies)?;
    text.push_str(
        "\n@id(\"incident-freeze-refunds\")\nforbid (\n  principal,\n  action == \
         Airlock::Action::\"invoke\",\n  resource == Airlock::Tool::\"refund\"\n);\n",
    );
    std::fs::write(&frozen, text)?;
    a.config.tools.policies = frozen;
    let processor = a.spawn("p1")?;

    let hash = canonical::canonicalize(&refund.arguments_json)?.hash;
    let approval = sample::approval(&refund, &hash, "alice", ApprovalVerdict::Approve, wall_ms());
    a.send(
        &producer,
        &a.names.approvals(),
        &approval.operation_key,
        &approval,
    )
    .await?;
    let (to_approver, to_proposal) = eventually("the approval's answers", WAIT, async || {
        let decisions: Vec<Decision> = a.read_deduplicated(&a.names.decisions(), "decision")?;
        let to_approver = decisions
            .iter()
            .find(|d| d.in_reply_to == approval.approval_id)
            .cloned();
        let to_proposal = decisions
            .iter()
            .find(|d| d.in_reply_to == refund.proposal_id && d.verdict == Verdict::Denied)
            .cloned();
        Ok(to_approver.zip(to_proposal))
    })
    .await?;
    processor.stop()?;

    assert_eq!(
        (to_proposal.verdict, to_proposal.reason),
        (Verdict::Denied, Reason::PolicyDenied),
        "{to_proposal:?}"
    );
    let new_bundle = to_proposal.policy_bundle_hash.clone().expect("a bundle");
    assert_ne!(new_bundle, old_bundle, "the freeze is another bundle");
    assert!(
        to_proposal.detail.contains(&new_bundle)
            && to_proposal.detail.contains("incident-freeze-refunds"),
        "the denial names the bundle and the policy that denied: {}",
        to_proposal.detail
    );
    assert_eq!(
        to_approver.policy_bundle_hash.as_deref(),
        Some(new_bundle.as_str()),
        "{to_approver:?}"
    );
    assert!(
        a.dispatches()?
            .iter()
            .all(|c| c.operation_key != refund.operation_key),
        "nothing dispatched"
    );
    Ok(())
}
