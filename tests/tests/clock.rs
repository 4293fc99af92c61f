//! Timers fire by the inputs' time, not by the wall clock of the instance reading them.
//!
//! Two refunds wait for approval, each with a 15 s window. The processor stops; behind 3,000
//! other approvals, one for the first refund is appended while its window is open; the second
//! refund's approval is appended only after its window closed. Both windows have closed by the
//! wall clock when the processor starts again and catches up. The first refund is approved
//! and dispatched: its approval was appended in time, so it is decided before the window's
//! timer, however late it is read. The second's approval is refused as expired, and the
//! second refund then expires by its timer: nothing else is written to the partition's other
//! input topics, so only the processor's ticks can carry the time there.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use airlock_processor::sample;
use airlock_schemas::{Approval, ApprovalVerdict, Decision, Reason, ToolProposal, Verdict};
use airlock_tests::airlock::Airlock;
use airlock_tests::eventually;
use airlock_tests::wall_ms;

const WAIT: Duration = Duration::from_secs(60);
const WINDOW_MS: i64 = 15_000;
const BACKLOG: usize = 3_000;

/// A refund above the automatic tier (it waits for approval) whose deadline, and so its
/// approval window, ends `WINDOW_MS` after `now`.
fn large_refund(key: &str, now: i64) -> ToolProposal {
    let mut p = sample::refund(key, 20_000, now);
    p.deadline_at = now + WINDOW_MS;
    p
}

fn decisions(a: &Airlock) -> anyhow::Result<Vec<Decision>> {
    a.read_deduplicated(&a.names.decisions(), "decision")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_appended_in_time_counts_however_late_it_is_read() -> anyhow::Result<()> {
    let a = Airlock::start("clock", 1).await?;
    let producer = a.producer()?;
    let processor = a.spawn("p1")?;
    // The windows start once the processor answers.
    let warm_up = sample::refund("refund:warm-up", 100, wall_ms());
    a.send(
        &producer,
        &a.names.proposals(),
        &warm_up.operation_key,
        &warm_up,
    )
    .await?;
    a.await_replies([warm_up.proposal_id.as_str()], WAIT)
        .await?;
    let t0 = wall_ms();
    let in_time = large_refund("refund:in-time", t0);
    let too_late = large_refund("refund:too-late", t0);
    for p in [&in_time, &too_late] {
        a.send(&producer, &a.names.proposals(), &p.operation_key, p)
            .await?;
    }
    let replies = a
        .await_replies([&in_time, &too_late].map(|p| p.proposal_id.as_str()), WAIT)
        .await?;
    let hash = |p: &ToolProposal| {
        let d = &replies[&p.proposal_id];
        assert_eq!(d.verdict, Verdict::PendingApproval, "{d:?}");
        d.arguments_hash
            .clone()
            .expect("a pending intent names its hash")
    };
    let (in_time_hash, too_late_hash) = (hash(&in_time), hash(&too_late));
    processor.stop()?;

    // While the processor is away: a backlog, then the in-time approval inside its window.
    let backlog: Vec<Approval> = (0..BACKLOG)
        .map(|i| {
            let mut other = sample::refund(&format!("refund:other-{i}"), 100, t0);
            other.tenant_id = "acme".to_owned();
            sample::approval(&other, "0", "alice", ApprovalVerdict::Approve, wall_ms())
        })
        .collect();
    a.send_many(&producer, &a.names.approvals(), &backlog, |v| {
        v.operation_key.as_str()
    })
    .await?;
    let approve = |p: &ToolProposal, hash: &str| {
        sample::approval(p, hash, "alice", ApprovalVerdict::Approve, wall_ms())
    };
    let in_time_approval = approve(&in_time, &in_time_hash);
    a.send(
        &producer,
        &a.names.approvals(),
        &in_time.operation_key,
        &in_time_approval,
    )
    .await?;
    assert!(
        wall_ms() < t0 + WINDOW_MS - 2_000,
        "the machine was too slow to append the approval well inside its window"
    );
    // Past both windows: the second approval is late.
    tokio::time::sleep(Duration::from_millis(
        (t0 + WINDOW_MS + 500 - wall_ms()).max(0) as u64,
    ))
    .await;
    let late_approval = approve(&too_late, &too_late_hash);
    a.send(
        &producer,
        &a.names.approvals(),
        &too_late.operation_key,
        &late_approval,
    )
    .await?;

    // The processor comes back after both windows closed by the wall clock, and catches up.
    let processor = a.spawn("p1")?;
    let answer = |id: String| {
        let a = &a;
        async move {
            eventually(&format!("the answer to {id}"), WAIT, async || {
                Ok(decisions(a)?.into_iter().find(|d| d.in_reply_to == id))
            })
            .await
        }
    };
    let recorded = answer(in_time_approval.approval_id.clone()).await?;
    assert_eq!(
        (recorded.verdict, recorded.reason),
        (Verdict::Recorded, Reason::ApprovalRecorded),
        "the approval was appended inside the window: {recorded:?}"
    );
    let refused = answer(late_approval.approval_id.clone()).await?;
    assert_eq!(
        refused.verdict,
        Verdict::Rejected,
        "the approval came after the window: {refused:?}"
    );
    assert!(
        matches!(
            refused.reason,
            Reason::ApprovalExpired | Reason::NoPendingApproval
        ),
        "{refused:?}"
    );

    // The first refund is dispatched; the second expires by its timer, which only the ticks
    // on the silent input topics can bring due.
    let outcome = |key: &'static str, verdict: Verdict| {
        let a = &a;
        async move {
            eventually(&format!("{key} {verdict:?}"), WAIT, async || {
                Ok(decisions(a)?
                    .into_iter()
                    .find(|d| d.operation_key == key && d.verdict == verdict))
            })
            .await
        }
    };
    let approved = outcome("refund:in-time", Verdict::Accepted).await?;
    assert_eq!(approved.reason, Reason::Approved, "{approved:?}");
    let expired = outcome("refund:too-late", Verdict::Expired).await?;
    assert_eq!(expired.reason, Reason::DeadlineExpired, "{expired:?}");
    assert!(
        expired.decided_at >= t0 + WINDOW_MS,
        "the expiry is decided at the window's end: {expired:?}"
    );
    let dispatched: Vec<String> = a
        .dispatches()?
        .into_iter()
        .map(|c| c.operation_key)
        .collect();
    assert_eq!(dispatched, ["refund:in-time", "refund:warm-up"]);
    processor.stop()?;
    Ok(())
}
