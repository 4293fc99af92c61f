//! Rebalances and zombies: two `airlock run` instances share the partitions; a third joins and
//! one leaves under load; then one is frozen with SIGSTOP while load flows and a replacement
//! takes every partition over, and the frozen one is resumed. Afterwards: every proposal
//! decided, verdicts and dispatches (after dedup and the owner-epoch fence) those of an
//! uninterrupted run, and the frozen instance's late writes are on the topics but dropped by
//! the fence.
//!
//! The replacement joins another consumer group, as an operator's replacement would after
//! declaring the frozen host dead: the frozen instance keeps its stale assignment when it
//! resumes and goes on writing, the zombie the fence is for. (`eviction.rs` has the zombie a
//! group makes by itself: evicted while frozen, it writes until it learns.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_processor::runtime::wire::Admit;
use airlock_tests::airlock::Airlock;
use airlock_tests::workload::{self, Lcg};

fn signal(child: &Child, sig: &str) -> anyhow::Result<()> {
    let status = Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()?;
    anyhow::ensure!(status.success(), "kill {sig} {} failed", child.id());
    Ok(())
}

fn fenced_writes(a: &Airlock) -> anyhow::Result<usize> {
    let mut n = 0;
    for topic in [
        a.names.decisions(),
        a.names.journal(),
        a.names.changelog(),
        a.names.dispatch("ledger"),
    ] {
        n += a
            .read_topic(&topic)?
            .iter()
            .filter(|r| matches!(r.admit, Admit::Fenced { .. }))
            .count();
    }
    Ok(n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebalances_and_a_frozen_instance_dispatch_nothing_twice() -> anyhow::Result<()> {
    let n: usize = std::env::var("AIRLOCK_REBALANCE_PROPOSALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6_000);
    let a = Arc::new(Airlock::start("rebalance", 4).await?);
    let log = std::env::temp_dir().join(format!("airlock-rebalance-{}.log", std::process::id()));
    let now = airlock_tests::wall_ms();
    let proposals = workload::proposals(n, now, &mut Lcg(0xfeed));
    let distinct: BTreeSet<String> = proposals.iter().map(|p| p.proposal_id.clone()).collect();

    let mut p1 = a.spawn_process("p1", "group-a", &log)?;
    let mut p2 = a.spawn_process("p2", "group-a", &log)?;
    let producer = a.producer()?;
    let topic = a.names.proposals();
    let sender = {
        let a = a.clone();
        tokio::spawn(async move {
            // Load keeps flowing through the freeze and the resume (about 30 s).
            for chunk in proposals.chunks(20) {
                a.send_many(&producer, &topic, chunk, |p| p.operation_key.as_str())
                    .await?;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            anyhow::Ok(())
        })
    };
    let started = Instant::now();

    // A third instance joins, the first leaves gracefully.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut p3 = a.spawn_process("p3", "group-a", &log)?;
    tokio::time::sleep(Duration::from_secs(6)).await;
    signal(&p1, "-TERM")?;
    p1.wait()?;
    eprintln!("p3 joined, p1 left at {:.1?}", started.elapsed());

    // p3 leaves too; p2 freezes mid-stream; p4 replaces it (fresh group) and claims every
    // partition; p2 resumes and finishes what it was doing behind p4's fence markers.
    signal(&p3, "-TERM")?;
    p3.wait()?;
    tokio::time::sleep(Duration::from_secs(4)).await;
    signal(&p2, "-STOP")?;
    let mut p4 = a.spawn_process("p4", "group-b", &log)?;
    tokio::time::sleep(Duration::from_secs(8)).await;
    signal(&p2, "-CONT")?;
    eprintln!(
        "p2 frozen, replaced by p4, resumed at {:.1?}",
        started.elapsed()
    );
    sender.await??;

    let decided = a
        .await_replies(
            distinct.iter().map(String::as_str),
            Duration::from_secs(180),
        )
        .await;
    let fenced = fenced_writes(&a)?;
    for child in [&mut p2, &mut p4] {
        let _ = signal(child, "-TERM");
        let _ = child.wait();
    }
    let decided = match decided {
        Ok(d) => d,
        Err(e) => panic!("{e}\n{}", workload::explain_missing(&a, &distinct, &log)?),
    };

    let dispatches = workload::assert_matches_reference(&a, &decided)?;
    assert!(
        fenced > 0,
        "the frozen instance wrote nothing after resuming: the fence was not exercised"
    );
    eprintln!(
        "{n} proposals, {dispatches} dispatches, {fenced} fenced zombie writes, {:.1?}",
        started.elapsed()
    );
    Ok(())
}
