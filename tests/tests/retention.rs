//! What retention leaves, on a broker that compacts. The reference refund tool keeps its
//! intents 3 s here and the closed-intent marker 25 s (instead of 7 and 30 days).
//!
//! Two refunds commit. After their retention each becomes a closed-intent marker: a blind
//! retry of one (a new proposal id, the same arguments) is answered DUPLICATE with its receipt,
//! and nothing is dispatched again. After the marker's own retention both keys are deleted,
//! which the changelog carries as tombstones (records without a value). An instance without
//! the first one's disk restores through those tombstones and takes another intent under the
//! first key as new; the log cleaner then removes every record of the second key: the
//! changelog shrinks.
//!
//! A broker that does not compact (tansu 0.6, `compat::Broker::compacts`) skips it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use airlock_processor::sample;
use airlock_processor::store::keys::Table;
use airlock_schemas::{ChangelogRecord, Codec, OutcomeKind, Reason, ToolProposal, Verdict};
use airlock_tests::airlock::{Airlock, Options};
use airlock_tests::eventually;
use airlock_tests::wall_ms;

const WAIT: Duration = Duration::from_secs(120);
const RETENTION_MS: u64 = 3_000;
const CLOSED_RETENTION_MS: u64 = 25_000;

/// What the changelog holds for an effect's store key, in log order: `None` for a tombstone,
/// else the stored value's text.
fn effect_rows(a: &Airlock, key: &str) -> anyhow::Result<Vec<Option<String>>> {
    let store_key = Table::Effect.key(key.as_bytes());
    let codec = Codec::new();
    let mut rows = Vec::new();
    for r in a.read_topic(&a.names.changelog())? {
        if r.key.as_deref() != Some(store_key.as_slice()) {
            continue;
        }
        rows.push(match &r.value {
            None => None,
            Some(value) => {
                let record: ChangelogRecord = codec.decode_as(value)?;
                Some(String::from_utf8_lossy(&record.value.unwrap_or_default()).into_owned())
            }
        });
    }
    Ok(rows)
}

fn blind_retry(p: &ToolProposal, id: &str) -> ToolProposal {
    let mut retry = sample::refund(&p.operation_key, 100, wall_ms());
    retry.proposal_id = id.to_owned();
    retry
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_intents_answer_retries_then_leave_the_changelog_as_tombstones() -> anyhow::Result<()>
{
    let Some(broker) = Airlock::compacting_broker().await? else {
        return Ok(());
    };
    let mut a = Airlock::on(broker, "retention", 1, Options::default()).await?;
    a.config.processor.closed_intent_retention_ms = CLOSED_RETENTION_MS;
    let tools = std::fs::read_to_string(&a.config.tools.registry)?;
    assert!(tools.contains("retention_ms = 604800000"));
    std::fs::write(
        &a.config.tools.registry,
        tools.replace(
            "retention_ms = 604800000",
            &format!("retention_ms = {RETENTION_MS}"),
        ),
    )?;
    // Compaction as eager as it gets, tombstones removed as soon as their segment is cleaned.
    a.eager_changelog(&[("delete.retention.ms", "0")]).await?;

    let producer = a.producer()?;
    let p1 = a.spawn("p1")?;
    let kept = sample::refund("refund:kept", 100, wall_ms());
    let gone = sample::refund("refund:gone", 100, wall_ms());
    for p in [&kept, &gone] {
        a.send(&producer, &a.names.proposals(), &p.operation_key, p)
            .await?;
    }
    a.await_replies([kept.proposal_id.as_str(), gone.proposal_id.as_str()], WAIT)
        .await?;
    for p in [&kept, &gone] {
        let outcome = sample::outcome(&p.operation_key, 1, OutcomeKind::Committed, "ledger ok");
        a.send(&producer, &a.names.outcomes(), &p.operation_key, &outcome)
            .await?;
    }
    // Retention passes: the bulk goes, a marker stays (in the changelog as the latest row).
    for p in [&kept, &gone] {
        eventually(
            &format!("{} to become a closed-intent marker", p.operation_key),
            WAIT,
            async || {
                let rows = effect_rows(&a, &p.operation_key)?;
                Ok(rows
                    .last()
                    .and_then(Option::as_ref)
                    .filter(|v| v.contains("closed_until"))
                    .map(|_| ()))
            },
        )
        .await?;
    }
    let retry = blind_retry(&kept, "blind-retry-1");
    a.send(
        &producer,
        &a.names.proposals(),
        &retry.operation_key,
        &retry,
    )
    .await?;
    let replies = a.await_replies([retry.proposal_id.as_str()], WAIT).await?;
    let answer = &replies[&retry.proposal_id];
    assert_eq!(
        (answer.verdict, answer.reason),
        (Verdict::Duplicate, Reason::AlreadyCommitted),
        "{answer:?}"
    );
    assert!(answer.receipt.is_some(), "{answer:?}");
    let dispatched = |key: &str| -> anyhow::Result<usize> {
        Ok(a.dispatches()?
            .iter()
            .filter(|d| d.operation_key == key)
            .count())
    };
    assert_eq!(dispatched(&kept.operation_key)?, 1);

    // The marker's own retention passes: each key's last changelog record is a tombstone.
    for p in [&kept, &gone] {
        eventually(
            &format!("a tombstone for {}", p.operation_key),
            WAIT,
            async || {
                let rows = effect_rows(&a, &p.operation_key)?;
                Ok(rows.last().is_some_and(Option::is_none).then_some(()))
            },
        )
        .await?;
    }
    p1.stop()?;

    // A fresh disk restores through the tombstones: the first key is unbound. Another intent
    // under it (a refund that waits for approval, so that nothing dispatches epoch 1 of the
    // key again) is taken as new; had the marker survived, it would be a CONFLICT.
    let p2 = a.spawn("p2")?;
    let mut again = sample::refund(&kept.operation_key, 20_000, wall_ms());
    again.proposal_id = "after-the-marker".to_owned();
    a.send(
        &producer,
        &a.names.proposals(),
        &again.operation_key,
        &again,
    )
    .await?;
    let replies = a.await_replies([again.proposal_id.as_str()], WAIT).await?;
    let answer = &replies[&again.proposal_id];
    assert_eq!(answer.verdict, Verdict::PendingApproval, "{answer:?}");

    // The cleaner drops the second key altogether (its rows and then its tombstone), while the
    // running instance's sweeps keep rolling segments.
    eventually("the cleaner to remove refund:gone", WAIT, async || {
        let rows = effect_rows(&a, &gone.operation_key)?;
        Ok(rows.is_empty().then_some(()))
    })
    .await?;
    p2.stop()?;
    Ok(())
}
