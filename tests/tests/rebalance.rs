//! Rebalances and zombies: two `airlock run` instances share the partitions; a third joins and
//! one leaves under load; then one is frozen with SIGSTOP past its session timeout while load
//! flows, and resumed. Afterwards: every proposal decided, verdicts and dispatches (after
//! dedup and the owner-epoch fence) those of an uninterrupted run, and the frozen instance's
//! late writes are on the topics but dropped by the fence.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use airlock_processor::runtime::wire::Admit;
use airlock_schemas::{Decision, DispatchCommand};
use airlock_tests::airlock::Airlock;
use airlock_tests::eventually;
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
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis() as i64;
    let proposals = workload::proposals(n, now, &mut Lcg(0xfeed));
    let distinct: BTreeSet<String> = proposals.iter().map(|p| p.proposal_id.clone()).collect();

    let mut p1 = a.spawn_process("p1", &log)?;
    let mut p2 = a.spawn_process("p2", &log)?;
    let producer = a.producer()?;
    let topic = a.names.proposals();
    let sender = {
        let a = a.clone();
        tokio::spawn(async move {
            for chunk in proposals.chunks(100) {
                a.send_many(&producer, &topic, chunk, |p| p.operation_key.as_str())
                    .await?;
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
            anyhow::Ok(())
        })
    };
    let started = Instant::now();

    // A third instance joins, the first leaves gracefully.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut p3 = a.spawn_process("p3", &log)?;
    tokio::time::sleep(Duration::from_secs(6)).await;
    signal(&p1, "-TERM")?;
    p1.wait()?;
    eprintln!("p3 joined, p1 left at {:.1?}", started.elapsed());

    // p2 freezes past its session timeout (6 s) while p3 takes its partitions over; resumed,
    // whatever it still writes lands behind p3's fence markers.
    let mut fenced = 0;
    for round in 0..3 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        signal(&p2, "-STOP")?;
        tokio::time::sleep(Duration::from_secs(12)).await;
        signal(&p2, "-CONT")?;
        tokio::time::sleep(Duration::from_secs(5)).await;
        fenced = fenced_writes(&a)?;
        eprintln!("freeze round {round}: {fenced} fenced writes so far");
        if fenced > 0 {
            break;
        }
    }
    sender.await??;

    let decided = eventually(
        "a decision for every proposal",
        Duration::from_secs(180),
        async || {
            let d: BTreeMap<String, Decision> = a
                .read_deduplicated::<Decision>(&a.names.decisions())?
                .into_iter()
                .map(|d| (d.in_reply_to.clone(), d))
                .collect();
            Ok(distinct.iter().all(|id| d.contains_key(id)).then_some(d))
        },
    )
    .await;
    for child in [&mut p2, &mut p3] {
        let _ = signal(child, "-TERM");
        let _ = child.wait();
    }
    let decided = match decided {
        Ok(d) => d,
        Err(e) => {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(60).collect();
            panic!("{e}\nprocessor logs (newest first):\n{}", tail.join("\n"));
        }
    };

    let workload::Reference {
        verdicts: expected,
        dispatches: expected_dispatches,
    } = workload::reference(&a)?;
    for (id, verdict) in &expected {
        assert_eq!(decided[id].verdict, *verdict, "proposal {id}");
    }
    let dispatches = a.read_deduplicated::<DispatchCommand>(&a.names.dispatch("ledger"))?;
    let got: BTreeSet<(String, i64)> = dispatches
        .iter()
        .map(|d| (d.operation_key.clone(), d.epoch))
        .collect();
    assert_eq!(
        got.len(),
        dispatches.len(),
        "one dispatch per key and epoch"
    );
    assert_eq!(got, expected_dispatches);
    assert!(
        fenced > 0,
        "the frozen instance wrote nothing after resuming in 3 rounds: the fence was not exercised"
    );
    eprintln!(
        "{n} proposals, {} dispatches, {fenced} fenced zombie writes, {:.1?}",
        dispatches.len(),
        started.elapsed()
    );
    Ok(())
}
