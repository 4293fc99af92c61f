//! The container path: Apache Kafka in a container that testcontainers starts (the local image
//! `airlock/kafka:4.4.0`, `deploy/broker/kafka/build-image.sh`), with a processor, a connector
//! worker and the reference ledger around it: a refund commits once and a blind retry is a
//! duplicate.
//!
//! Ignored by a plain `cargo test`: it needs a Docker engine and the image.
//! `deploy/dev/test.sh` starts the engine (`deploy/dev/docker-engine.sh`), builds the image and
//! runs it with `--ignored`. `AIRLOCK_CONTAINER_IMAGE` names another Kafka image.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use airlock_processor::sample;
use airlock_schemas::{Decision, Verdict};
use airlock_tests::airlock::{Airlock, Options};
use airlock_tests::connector::{Keys, Ledger};
use airlock_tests::{Broker, eventually};

const WAIT: Duration = Duration::from_secs(90);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the airlock/kafka image; deploy/dev/test.sh runs it"]
async fn a_refund_through_a_kafka_container_commits_once() -> anyhow::Result<()> {
    let image =
        std::env::var("AIRLOCK_CONTAINER_IMAGE").unwrap_or_else(|_| "airlock/kafka:4.4.0".into());
    let broker = Broker::start_container(&image).await?;
    let keys = Keys::generate()?;
    let a = Airlock::on(
        broker,
        "container",
        2,
        Options {
            reference_attempt_timeouts: true,
            signing_key_file: Some(keys.signing_file.clone()),
            ..Options::default()
        },
    )
    .await?;
    let logs = std::env::temp_dir().join(format!("airlock-container-{}", std::process::id()));
    std::fs::create_dir_all(&logs)?;
    let ledger = Ledger::start(
        &[("acme", "acct-42", "EUR", 10_000_000)],
        &logs.join("ledger.log"),
    )?;
    let processor = a.spawn("p1")?;
    let worker = a.spawn_connector(
        "w1",
        &ledger,
        &[&keys.verifying_file],
        &logs.join("worker.log"),
    )?;
    let producer = a.producer()?;
    let now = airlock_tests::wall_ms();
    let key = "refund:container-1";
    let first = sample::refund(key, 1_500, now);
    a.send(&producer, &a.names.proposals(), key, &first).await?;
    let decisions = |a: &Airlock| -> anyhow::Result<Vec<Decision>> {
        Ok(
            a.read_deduplicated::<Decision>(&a.names.decisions(), "decision")?
                .into_iter()
                .filter(|d| d.operation_key == key)
                .collect(),
        )
    };
    eventually("the refund COMMITTED", WAIT, async || {
        Ok(decisions(&a)?
            .into_iter()
            .find(|d| d.verdict == Verdict::Committed))
    })
    .await?;

    let retry = sample::resend(&first, 1);
    a.send(&producer, &a.names.proposals(), key, &retry).await?;
    let reply = eventually("the retry's reply", WAIT, async || {
        Ok(a.proposal_replies()?.remove(&retry.proposal_id))
    })
    .await?;
    assert_eq!(reply.verdict, Verdict::Duplicate, "{reply:?}");
    assert_eq!(ledger.effects_for(key).await?, 1);
    assert!(worker.stop()?, "the worker stops cleanly on SIGTERM");
    assert_eq!(processor.stop()?.dead_lettered, 0);
    Ok(())
}
