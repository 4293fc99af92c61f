//! The broker features the runtime relies on, proven against the broker image before anything
//! depends on them: the idempotent producer, the murmur2 partitioner agreeing with ours, and
//! consumer-group rebalancing with a short session timeout.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use airlock_processor::runtime::config::Config;
use airlock_processor::runtime::partitioner::{LIBRDKAFKA_PARTITIONER, partition_for};
use airlock_processor::runtime::topics::{self, TopicSpec};
use airlock_tests::{Broker, eventually, unique_prefix};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

const TIMEOUT: Duration = Duration::from_secs(20);
const PARTITIONS: i32 = 3;

async fn topic(broker: &Broker, test: &str) -> anyhow::Result<String> {
    let prefix = unique_prefix(test);
    let mut config = Config::default();
    config.kafka.brokers = broker.bootstrap.clone();
    config.topics.partitions = PARTITIONS;
    let name = format!("{prefix}data");
    let spec = TopicSpec {
        name: name.clone(),
        configs: Vec::new(),
    };
    topics::create(&config, &[spec], TIMEOUT).await?;
    Ok(name)
}

fn client(broker: &Broker) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &broker.bootstrap);
    c
}

#[tokio::test]
async fn idempotent_producer_places_keys_like_our_partitioner_and_delivers_each_once()
-> anyhow::Result<()> {
    let broker = Broker::start().await?;
    let topic = topic(&broker, "idempotent").await?;
    let producer: FutureProducer = client(&broker)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("partitioner", LIBRDKAFKA_PARTITIONER)
        .create()?;
    const N: usize = 300;
    for i in 0..N {
        let key = format!("refund:txn_{i}");
        let payload = format!("{i}");
        let delivery = producer
            .send(
                FutureRecord::to(&topic).key(&key).payload(&payload),
                TIMEOUT,
            )
            .await
            .map_err(|(e, _)| anyhow::anyhow!("delivery of {key}: {e}"))?;
        assert_eq!(
            delivery.partition,
            partition_for(key.as_bytes(), PARTITIONS),
            "librdkafka's murmur2_random and ours disagree on {key}"
        );
    }

    // Read everything back: each record exactly once.
    let consumer: BaseConsumer = client(&broker)
        .set("group.id", format!("{topic}-reader"))
        .set("enable.auto.commit", "false")
        .create()?;
    let mut assignment = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        assignment.add_partition_offset(&topic, p, Offset::Beginning)?;
    }
    consumer.assign(&assignment)?;
    let mut seen: BTreeMap<String, u32> = BTreeMap::new();
    eventually(
        "every record read back",
        Duration::from_secs(30),
        async || {
            while let Some(message) = consumer.poll(Duration::from_millis(100)) {
                let message = message?;
                let key = String::from_utf8(message.key().unwrap_or_default().to_vec())?;
                *seen.entry(key).or_default() += 1;
            }
            Ok((seen.len() == N).then_some(()))
        },
    )
    .await?;
    assert!(seen.values().all(|n| *n == 1), "duplicates: {seen:?}");
    Ok(())
}

#[tokio::test]
async fn consumer_group_rebalances_when_a_member_leaves() -> anyhow::Result<()> {
    let broker = Broker::start().await?;
    let topic = topic(&broker, "rebalance").await?;
    let group = format!("{topic}-group");
    // The group join waits about half of the session timeout on tansu: keep it short.
    let member = || -> anyhow::Result<BaseConsumer> {
        let consumer: BaseConsumer = client(&broker)
            .set("group.id", &group)
            .set("session.timeout.ms", "6000")
            .set("heartbeat.interval.ms", "500")
            .set("enable.auto.commit", "false")
            .create()?;
        consumer.subscribe(&[&topic])?;
        Ok(consumer)
    };
    let assigned = |c: &BaseConsumer| -> anyhow::Result<BTreeSet<i32>> {
        Ok(c.assignment()?
            .elements()
            .iter()
            .map(|e| e.partition())
            .collect())
    };
    let a = member()?;
    let b = member()?;
    let all: BTreeSet<i32> = (0..PARTITIONS).collect();
    eventually(
        "both members share the partitions",
        Duration::from_secs(60),
        async || {
            for c in [&a, &b] {
                if let Some(Err(e)) = c.poll(Duration::from_millis(100)) {
                    anyhow::bail!("poll: {e}");
                }
            }
            let (pa, pb) = (assigned(&a)?, assigned(&b)?);
            let union: BTreeSet<i32> = pa.union(&pb).copied().collect();
            Ok(
                (pa.is_disjoint(&pb) && !pa.is_empty() && !pb.is_empty() && union == all)
                    .then_some(()),
            )
        },
    )
    .await?;
    // One member leaves the group: the other takes every partition.
    a.unsubscribe();
    drop(a);
    eventually(
        "the survivor holds every partition",
        Duration::from_secs(60),
        async || {
            if let Some(Err(e)) = b.poll(Duration::from_millis(100)) {
                anyhow::bail!("poll: {e}");
            }
            Ok((assigned(&b)? == all).then_some(()))
        },
    )
    .await?;
    Ok(())
}

/// Kafka transactions work on this broker: records of an aborted transaction are invisible to a
/// `read_committed` reader, those of a committed one are read once. Airlock does not rely on
/// them (its outbox and the consumers' deduplication make its outputs effectively once on any
/// broker, docs/known-gaps.md); this shows the optional mode would have a broker to run on.
#[tokio::test]
async fn aborted_transactions_are_invisible_to_read_committed_readers() -> anyhow::Result<()> {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let broker = Broker::start().await?;
    if !broker.compatibility.has_transactions() {
        eprintln!("skipped: {} has no transactions", broker.compatibility);
        return Ok(());
    }
    let topic = topic(&broker, "transactions").await?;
    let producer: BaseProducer = client(&broker)
        .set("transactional.id", format!("{topic}-tx"))
        .set("partitioner", LIBRDKAFKA_PARTITIONER)
        .create()?;
    producer.init_transactions(TIMEOUT)?;
    let send = |key: &str| -> anyhow::Result<()> {
        producer
            .send(BaseRecord::to(&topic).key(key).payload(key))
            .map_err(|(e, _)| anyhow::anyhow!("enqueueing {key}: {e}"))
    };
    producer.begin_transaction()?;
    for i in 0..10 {
        send(&format!("aborted-{i}"))?;
    }
    producer.flush(TIMEOUT)?;
    producer.abort_transaction(TIMEOUT)?;
    producer.begin_transaction()?;
    for i in 0..10 {
        send(&format!("committed-{i}"))?;
    }
    producer.commit_transaction(TIMEOUT)?;

    let read = |isolation: &str| -> anyhow::Result<BTreeMap<String, u32>> {
        let consumer: BaseConsumer = client(&broker)
            .set("group.id", format!("{topic}-{isolation}"))
            .set("isolation.level", isolation)
            .set("enable.auto.commit", "false")
            .create()?;
        let mut assignment = TopicPartitionList::new();
        for p in 0..PARTITIONS {
            assignment.add_partition_offset(&topic, p, Offset::Beginning)?;
        }
        consumer.assign(&assignment)?;
        let mut seen = BTreeMap::new();
        // Until the last record of each kind the isolation level lets through has been read,
        // then a quiet second for anything that should not be there.
        let last: &[&str] = if isolation == "read_committed" {
            &["committed-9"]
        } else {
            &["committed-9", "aborted-9"]
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let mut quiet_until = None;
        while quiet_until.is_none_or(|t| std::time::Instant::now() < t) {
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "{isolation}: only {seen:?} within 30 s"
            );
            if let Some(m) = consumer.poll(Duration::from_millis(100)) {
                let key = String::from_utf8(m?.key().unwrap_or_default().to_vec())?;
                *seen.entry(key).or_default() += 1;
            }
            if quiet_until.is_none() && last.iter().all(|k| seen.contains_key(*k)) {
                quiet_until = Some(std::time::Instant::now() + Duration::from_secs(1));
            }
        }
        Ok(seen)
    };
    let committed = read("read_committed")?;
    let expected: BTreeMap<String, u32> = (0..10).map(|i| (format!("committed-{i}"), 1)).collect();
    assert_eq!(committed, expected, "read_committed");
    // The aborted records are in the log: a read_uncommitted reader sees them.
    let uncommitted = read("read_uncommitted")?;
    assert_eq!(
        uncommitted
            .keys()
            .filter(|k| k.starts_with("aborted-"))
            .count(),
        10,
        "{uncommitted:?}"
    );
    Ok(())
}
