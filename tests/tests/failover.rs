//! Broker failure on a three-node Apache Kafka cluster (replication factor 3,
//! `min.insync.replicas=2`), under load, with a processor, a connector worker and the
//! reference ledger: the leader of an input partition is killed with SIGKILL and restarted,
//! then the leader of an output partition. Every proposal gets its decision, every refund
//! settles (COMMITTED, or FAILED with proof after its retries), no operation key gets two
//! different dispatch commands of one epoch, the ledger holds one effect per committed refund
//! and none for a failed one, and the processor goes on without a restart.
//!
//! Only the `kafka` provider starts a cluster; others skip it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_processor::sample;
use airlock_schemas::{Decision, Verdict};
use airlock_tests::airlock::{Airlock, Options};
use airlock_tests::connector::{Keys, Ledger};
use airlock_tests::{Broker, Provider, Settings, eventually};
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

const PARTITIONS: i32 = 3;
const REFUNDS: usize = 600;

/// The node leading partition `partition` of `topic` now.
fn leader(a: &Airlock, topic: &str, partition: i32) -> anyhow::Result<u32> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &a.config.kafka.brokers)
        .create()?;
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let leader = metadata
        .topics()
        .first()
        .and_then(|t| t.partitions().iter().find(|p| p.id() == partition))
        .map(|p| p.leader())
        .ok_or_else(|| anyhow::anyhow!("no metadata for {topic}/{partition}"))?;
    anyhow::ensure!(leader > 0, "{topic}/{partition} has no leader ({leader})");
    Ok(u32::try_from(leader)?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_partition_leaders_under_load_loses_nothing_and_doubles_nothing()
-> anyhow::Result<()> {
    if Provider::from_env()? != Provider::Kafka {
        eprintln!("skipped: only the kafka provider starts a three-node cluster");
        return Ok(());
    }
    let broker = Broker::start_with(Settings {
        nodes: 3,
        ..Settings::default()
    })
    .await?;
    let keys = Keys::generate()?;
    let a = Arc::new(
        Airlock::on(
            broker,
            "failover",
            PARTITIONS,
            Options {
                reference_attempt_timeouts: true,
                signing_key_file: Some(keys.signing_file.clone()),
                replication_factor: Some(3),
                ..Options::default()
            },
        )
        .await?,
    );
    // Logs outlive a failed run: $TMPDIR/airlock-failover-<pid>/.
    let dir = std::env::temp_dir().join(format!("airlock-failover-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let log = dir.join("run.log");
    let worker_log = dir.join("worker.log");
    let ledger = Ledger::start(
        &[("acme", "acct-42", "EUR", 1_000_000_000)],
        &dir.join("ledger.log"),
    )?;
    let mut worker = a.spawn_connector("w1", &ledger, &[&keys.verifying_file], &worker_log)?;
    let mut processor = a.spawn_process("p1", "group", &log)?;

    let now = airlock_tests::wall_ms();
    let refunds: Vec<_> = (0..REFUNDS)
        .map(|i| sample::refund(&format!("refund:failover-{i}"), 100 + i as i64, now))
        .collect();
    let ids: BTreeSet<String> = refunds.iter().map(|p| p.proposal_id.clone()).collect();
    let sender = {
        let a = a.clone();
        tokio::spawn(async move {
            let producer = a.producer()?;
            let topic = a.names.proposals();
            // About 20 a second for 30 s, through both failures.
            for p in &refunds {
                a.send(&producer, &topic, &p.operation_key, p).await?;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            anyhow::Ok(())
        })
    };

    let cluster = a.broker.processes().expect("a cluster this test started");
    let started = Instant::now();
    for topic in [a.names.proposals(), a.names.dispatch("ledger")] {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let node = leader(&a, &topic, 0)?;
        cluster.kill(node).await?;
        eprintln!(
            "killed node {node}, the leader of {topic}/0, at {:.1?}",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_secs(8)).await;
        cluster.restart(node).await?;
        eprintln!("node {node} back at {:.1?}", started.elapsed());
    }
    sender.await??;

    let replies = a
        .await_replies(ids.iter().map(String::as_str), Duration::from_secs(180))
        .await;
    let replies = match replies {
        Ok(r) => r,
        Err(e) => panic!(
            "{e}\n{}",
            airlock_tests::workload::explain_missing(&a, &ids, &log)?
        ),
    };
    assert!(
        replies.values().all(|d| d.verdict == Verdict::Accepted),
        "every fresh refund is dispatched: {:?}",
        replies.values().find(|d| d.verdict != Verdict::Accepted)
    );
    // Settled: COMMITTED, or FAILED with proof and the retry budget (3 attempts) spent. A
    // worker that loses its group session while the coordinator moves refuses the commands
    // that expired meanwhile (never calling downstream), so some attempts fail with proof.
    let settled = eventually(
        "every refund COMMITTED or FAILED for good",
        Duration::from_secs(240),
        async || {
            let decisions = a.read_deduplicated::<Decision>(&a.names.decisions(), "decision")?;
            let settled = airlock_tests::workload::settled(decisions, 3);
            Ok((settled.len() == REFUNDS).then_some(settled))
        },
    )
    .await;
    let settled = match settled {
        Ok(s) => s,
        Err(e) => {
            let _ = processor.kill();
            panic!(
                "{e}; worker alive: {}; logs in {}",
                worker.is_running(),
                dir.display()
            );
        }
    };
    let committed: Vec<&String> = settled
        .iter()
        .filter(|(_, v)| **v == Verdict::Committed)
        .map(|(k, _)| k)
        .collect();
    assert!(
        processor.try_wait()?.is_none(),
        "the processor exited during the broker failures (log: {})",
        log.display()
    );

    // Every copy of a dispatch command (the same key and epoch) is the same command.
    let dispatched = a.dispatches()?;
    assert!(
        dispatched.len() >= REFUNDS,
        "at least one dispatched epoch per refund"
    );
    // One business effect per committed refund, none for a failed one.
    assert_eq!(ledger.effects_total().await?, committed.len() as u64);
    for key in &committed {
        assert_eq!(ledger.effects_for(key).await?, 1, "{key}");
    }
    eprintln!(
        "{REFUNDS} refunds: {} committed, {} failed with proof; {} dispatched epochs",
        committed.len(),
        REFUNDS - committed.len(),
        dispatched.len()
    );

    let _ = std::process::Command::new("kill")
        .args(["-TERM", &processor.id().to_string()])
        .status();
    let _ = processor.wait();
    assert!(worker.stop()?, "the worker stops cleanly on SIGTERM");
    Ok(())
}
