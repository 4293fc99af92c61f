//! Crashes under load: `airlock run` is killed with SIGKILL at random moments while proposals
//! (30% duplicates, 5% changed arguments) flow, and restarted each time; after some of the
//! kills (at least two, chosen at random) its state directory is deleted too, so the restart
//! restores every partition from a changelog the kill may have cut mid-batch. Afterwards every
//! proposal has a decision, and after consumer-side dedup the verdicts and the dispatches are
//! those of an uninterrupted run of the same input (the proposals as the broker ordered them,
//! decided by the same core over an in-memory store). Then `airlock replay` rebuilds every
//! partition's projection from the journal: every checkpoint hash matches, no invariant breaks.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_processor::runtime::wire::Admit;
use airlock_tests::airlock::Airlock;
use airlock_tests::workload::{self, Lcg};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_under_load_loses_nothing_and_dispatches_nothing_twice() -> anyhow::Result<()> {
    let n: usize = std::env::var("AIRLOCK_CRASH_PROPOSALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let kills = 5;
    let a = Airlock::start("crash", 3).await?;
    let log = std::env::temp_dir().join(format!("airlock-crash-{}.log", std::process::id()));
    let now = airlock_tests::wall_ms();
    let mut rng = Lcg(0x5eed);
    let proposals = workload::proposals(n, now, &mut rng);
    let distinct: BTreeSet<String> = proposals.iter().map(|p| p.proposal_id.clone()).collect();

    let mut child = a.spawn_process("p1", "group-0", &log)?;
    let producer = a.producer()?;
    let topic = a.names.proposals();
    let a = Arc::new(a);
    let sender = {
        let a = a.clone();
        let proposals = proposals.clone();
        tokio::spawn(async move {
            for chunk in proposals.chunks(200) {
                a.send_many(&producer, &topic, chunk, |p| p.operation_key.as_str())
                    .await?;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            anyhow::Ok(())
        })
    };

    let started = Instant::now();
    let mut disks_lost = 0;
    for i in 0..kills {
        tokio::time::sleep(Duration::from_millis(700 + rng.below(1_500))).await;
        child.kill()?;
        child.wait()?;
        // The disk goes with the process after a random half of the kills, and after the last
        // two if fewer were lost by then.
        let lose_disk = rng.below(2) == 0 || kills - i <= 2 - disks_lost.min(2);
        if lose_disk {
            match std::fs::remove_dir_all(a.state_dir("p1")) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
                _ => {}
            }
            disks_lost += 1;
        }
        eprintln!(
            "kill {} at {:.1?}{}",
            i + 1,
            started.elapsed(),
            if lose_disk { ", disk lost" } else { "" }
        );
        // A group of its own: the replacement takes every partition at once instead of waiting
        // out the killed member's session timeout (kills come every 0.7-2.2 s).
        child = a.spawn_process("p1", &format!("group-{}", i + 1), &log)?;
    }
    sender.await??;

    let decided = a
        .await_replies(
            distinct.iter().map(String::as_str),
            Duration::from_secs(240),
        )
        .await;
    // SIGTERM: a graceful stop, which journals the checkpoint each partition owes; the replay
    // below verifies the projection against them.
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
    let decided = match decided {
        Ok(d) => d,
        Err(e) => panic!("{e}\n{}", workload::explain_missing(&a, &distinct, &log)?),
    };

    // The uninterrupted run: the proposals in broker order, per partition, through the core.
    let dispatches = workload::assert_matches_reference(&a, &decided)?;
    let raw = a.read_topic(&a.names.dispatch("ledger"))?;
    let fenced = raw
        .iter()
        .filter(|r| matches!(r.admit, Admit::Fenced { .. }))
        .count();
    eprintln!(
        "{n} proposals ({} distinct), {} dispatches, {} raw dispatch records, {fenced} fenced, {kills} kills ({disks_lost} with the disk), {:.1?}",
        distinct.len(),
        dispatches,
        raw.len(),
        started.elapsed()
    );

    // The auditor's replay of what the crashes left in the journal.
    let (ok, stdout, stderr) = a.cli(&["replay"])?;
    eprintln!("{stdout}");
    assert!(ok, "airlock replay failed:\n{stdout}\n{stderr}");
    let verified: u64 = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("total: "))
        .filter_map(|l| l.split(", ").nth(1)?.split(' ').next()?.parse::<u64>().ok())
        .sum();
    assert!(verified > 0, "no checkpoint was verified:\n{stdout}");
    Ok(())
}
