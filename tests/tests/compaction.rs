//! Restoring from a changelog the broker has compacted. The changelog is made eager to compact
//! (segments roll every second, any dirty ratio is worth cleaning, no compaction lag) and the
//! broker's log cleaner looks every half second. An instance decides half of a workload (30%
//! duplicates, 5% changed arguments) until the cleaner has removed superseded rows; it stops;
//! a new instance without its disk restores from what compaction left and decides the other
//! half. The verdicts and dispatches are those of an uninterrupted run of the whole input.
//!
//! A broker that does not compact (tansu 0.6, `compat::Broker::compacts`) skips it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::process::{Child, Command};
use std::time::Duration;

use airlock_tests::airlock::{Airlock, Options};
use airlock_tests::eventually;
use airlock_tests::workload::{self, Lcg};
use anyhow::Context;

const N: usize = 3_000;

fn stop(child: &mut Child) -> anyhow::Result<()> {
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()?;
    let status = child.wait()?;
    anyhow::ensure!(status.success(), "airlock run exited with {status}");
    Ok(())
}

/// How far the log cleaner has cleaned each changelog partition, from the broker's own
/// `cleaner-offset-checkpoint` (lines `topic partition offset`): the proof that it ran.
fn cleaned(a: &Airlock) -> anyhow::Result<Vec<(i32, i64)>> {
    let broker = a.broker.processes().context("a broker this test started")?;
    let file = broker.node_dir(1).join("data/cleaner-offset-checkpoint");
    let text = std::fs::read_to_string(&file).unwrap_or_default();
    let topic = a.names.changelog();
    Ok(text
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            (words.next()? == topic).then_some(())?;
            Some((words.next()?.parse().ok()?, words.next()?.parse().ok()?))
        })
        .filter(|(_, offset): &(i32, i64)| *offset > 0)
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_instance_restores_from_a_compacted_changelog_and_decides_the_rest_alike()
-> anyhow::Result<()> {
    let Some(broker) = Airlock::compacting_broker().await? else {
        return Ok(());
    };
    let a = Airlock::on(broker, "compaction", 2, Options::default()).await?;
    a.eager_changelog(&[]).await?;

    let dir = tempfile::tempdir()?;
    let (log, log2) = (dir.path().join("p1.log"), dir.path().join("p2.log"));
    let now = airlock_tests::wall_ms();
    let proposals = workload::proposals(N, now, &mut Lcg(0xc0a1));
    let (first, rest) = proposals.split_at(N / 2);
    let ids = |ps: &[airlock_schemas::ToolProposal]| -> BTreeSet<String> {
        ps.iter().map(|p| p.proposal_id.clone()).collect()
    };
    let producer = a.producer()?;
    let topic = a.names.proposals();

    let mut p1 = a.spawn_process("p1", "group", &log)?;
    a.send_many(&producer, &topic, first, |p| p.operation_key.as_str())
        .await?;
    a.await_replies(
        ids(first).iter().map(String::as_str),
        Duration::from_secs(120),
    )
    .await?;
    // The instance keeps writing (its changelog sweep every second rolls segments): wait for
    // the cleaner to have removed superseded rows.
    let cleaned = eventually(
        "the log cleaner to compact the changelog",
        Duration::from_secs(120),
        async || Ok(Some(cleaned(&a)?).filter(|c| !c.is_empty())),
    )
    .await?;
    stop(&mut p1)?;

    // Another instance, another (empty) state directory: it restores from the compacted log.
    let mut p2 = a.spawn_process("p2", "group", &log2)?;
    a.send_many(&producer, &topic, rest, |p| p.operation_key.as_str())
        .await?;
    let all = ids(&proposals);
    let decided = a
        .await_replies(all.iter().map(String::as_str), Duration::from_secs(120))
        .await;
    stop(&mut p2)?;
    let decided = match decided {
        Ok(d) => d,
        Err(e) => panic!("{e}\n{}", workload::explain_missing(&a, &all, &log2)?),
    };
    let dispatches = workload::assert_matches_reference(&a, &decided)?;
    let text = std::fs::read_to_string(&log2)?;
    let rebuilt = text
        .lines()
        .filter(|l| l.contains("(local state rebuilt") && !l.contains(", 0 rows restored"))
        .count();
    assert!(
        rebuilt > 0,
        "p2 did not restore from the changelog:\n{text}"
    );
    eprintln!(
        "{N} proposals, {dispatches} dispatches; the cleaner had cleaned (partition, up to \
         offset) {cleaned:?} before p2 restored"
    );
    Ok(())
}
