//! A partition's input topics are decided in the order the broker appended their records, also
//! when an instance reads them long after: an approval appended after the proposal it answers
//! is never decided before that proposal, however the fetches interleave.
//!
//! While no processor runs: thousands of small refunds, then refunds above the automatic tier,
//! then an approval of each of those (appended after it, as a person answering its
//! PENDING_APPROVAL would be). The proposals take several fetches; the few approvals arrive
//! with the first. A processor then starts and catches up: every approval must be counted,
//! none refused for want of an intent.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use airlock_processor::core::canonical;
use airlock_processor::sample;
use airlock_schemas::{Approval, ApprovalVerdict, Decision, Reason, ToolProposal, Verdict};
use airlock_tests::airlock::Airlock;
use airlock_tests::eventually;
use airlock_tests::wall_ms;

/// Small refunds ahead of the large ones: several fetches' worth (librdkafka's default
/// `max.partition.fetch.bytes` is 1 MiB, a proposal ~400 bytes).
const BACKLOG: usize = 20_000;
const LARGE: usize = 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_read_before_its_proposal_waits_for_it() -> anyhow::Result<()> {
    let a = Airlock::start("order", 1).await?;
    if !a.config.kafka.compatibility.high_watermark_is_end() {
        // Catch-up ordering needs each input partition's end at assignment; a broker whose
        // watermark lags (`compat`) gets none, and its catch-up is decided in arrival order.
        eprintln!(
            "skipped: {} reports no usable high watermark",
            a.config.kafka.compatibility
        );
        return Ok(());
    }
    let producer = a.producer()?;
    // A first run leaves stored offsets on both topics, so that the catch-up below resumes
    // each from an offset, as an instance taking over a partition does.
    let processor = a.spawn("p1")?;
    let warm_up = sample::refund("refund:warm-up", 100, wall_ms());
    let stray = sample::approval(&warm_up, "0", "alice", ApprovalVerdict::Approve, wall_ms());
    a.send(
        &producer,
        &a.names.proposals(),
        &warm_up.operation_key,
        &warm_up,
    )
    .await?;
    a.send(
        &producer,
        &a.names.approvals(),
        &stray.operation_key,
        &stray,
    )
    .await?;
    eventually(
        "the warm-up's answers",
        Duration::from_secs(60),
        async || {
            let decisions: Vec<Decision> = a.read_deduplicated(&a.names.decisions(), "decision")?;
            Ok((decisions
                .iter()
                .any(|d| d.in_reply_to == warm_up.proposal_id)
                && decisions.iter().any(|d| d.in_reply_to == stray.approval_id))
            .then_some(()))
        },
    )
    .await?;
    processor.stop()?;

    let now = wall_ms();
    let small: Vec<ToolProposal> = (0..BACKLOG)
        .map(|i| sample::refund(&format!("refund:small-{i}"), 100, now))
        .collect();
    let large: Vec<ToolProposal> = (0..LARGE)
        .map(|i| sample::refund(&format!("refund:large-{i}"), 20_000, now))
        .collect();
    for batch in [&small, &large] {
        a.send_many(&producer, &a.names.proposals(), batch, |p| {
            p.operation_key.as_str()
        })
        .await?;
    }
    let approvals: Vec<Approval> = large
        .iter()
        .map(|p| {
            let hash = canonical::canonicalize(&p.arguments_json)
                .expect("sample arguments are JSON")
                .hash;
            sample::approval(p, &hash, "alice", ApprovalVerdict::Approve, wall_ms())
        })
        .collect();
    a.send_many(&producer, &a.names.approvals(), &approvals, |v| {
        v.operation_key.as_str()
    })
    .await?;

    let processor = a.spawn("p1")?;
    let answers: Vec<Decision> = eventually(
        "an answer to every approval",
        Duration::from_secs(180),
        async || {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let decisions: Vec<Decision> = a.read_deduplicated(&a.names.decisions(), "decision")?;
            let answers: Vec<Decision> = approvals
                .iter()
                .filter_map(|v| decisions.iter().find(|d| d.in_reply_to == v.approval_id))
                .cloned()
                .collect();
            Ok((answers.len() == approvals.len()).then_some(answers))
        },
    )
    .await?;
    processor.stop()?;
    for d in &answers {
        assert_eq!(
            (d.verdict, d.reason),
            (Verdict::Recorded, Reason::ApprovalRecorded),
            "{} was appended after its proposal and must be decided after it: {d:?}",
            d.in_reply_to
        );
    }
    Ok(())
}
