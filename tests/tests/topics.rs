//! `airlock topics create` against a real broker: every topic with one partition count, the
//! changelog compacted, and a refusal when existing topics are not co-partitioned.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use airlock_processor::runtime::config::Config;
use airlock_processor::runtime::topics::{self, Names};
use airlock_tests::{Broker, unique_prefix};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;

const TIMEOUT: Duration = Duration::from_secs(20);

fn config(broker: &Broker, prefix: &str, partitions: i32) -> Config {
    let mut c = Config::default();
    c.kafka.brokers = broker.bootstrap.clone();
    c.topics.prefix = prefix.to_owned();
    c.topics.partitions = partitions;
    c
}

/// One topic-level config as the broker reports it (DescribeConfigs).
async fn topic_config(
    admin: &AdminClient<DefaultClientContext>,
    topic: &str,
    name: &str,
) -> anyhow::Result<Option<String>> {
    let described = admin
        .describe_configs(
            &[ResourceSpecifier::Topic(topic)],
            &AdminOptions::new().request_timeout(Some(TIMEOUT)),
        )
        .await?;
    let resource = described
        .into_iter()
        .next()
        .expect("one resource asked, one answered")?;
    Ok(resource.get(name).and_then(|e| e.value.clone()))
}

#[tokio::test]
async fn topics_create_makes_every_topic_with_one_partition_count() -> anyhow::Result<()> {
    let broker = Broker::start().await?;
    let prefix = unique_prefix("create");
    let config = config(&broker, &prefix, 3);
    let specs = Names::new(&prefix).plan(["ledger", "http"]);
    let report = topics::create(&config, &specs, TIMEOUT).await?;
    assert_eq!(report.created.len(), specs.len(), "{report:?}");

    let admin: AdminClient<DefaultClientContext> = config.client_config().create()?;
    let counts = topics::partition_counts(&admin, TIMEOUT)?;
    for spec in &specs {
        assert_eq!(counts.get(&spec.name), Some(&3), "{}", spec.name);
    }
    // Running it again creates nothing and succeeds.
    let again = topics::create(&config, &specs, TIMEOUT).await?;
    assert!(again.created.is_empty() && again.existing.len() == specs.len());

    // The broker features restore and audit rely on: a compacted changelog, a journal kept
    // forever.
    let names = Names::new(&prefix);
    assert_eq!(
        topic_config(&admin, &names.changelog(), "cleanup.policy")
            .await?
            .as_deref(),
        Some("compact")
    );
    // A zombie's changelog row stays out of compaction until the owner's sweep overwrote it.
    // (Whether tansu compacts at all is not verified here: the zombie tests check what the
    // latest record per key is, which is what compaction keeps.)
    assert_eq!(
        topic_config(&admin, &names.changelog(), "min.compaction.lag.ms")
            .await?
            .as_deref(),
        Some("3600000")
    );
    assert_eq!(
        topic_config(&admin, &names.journal(), "retention.ms")
            .await?
            .as_deref(),
        Some("-1")
    );
    // The inputs ask the broker to stamp records on append (tansu 0.6 stores the setting but
    // keeps the producer's time: the processor warns when it reads such records).
    assert_eq!(
        topic_config(&admin, &names.proposals(), "message.timestamp.type")
            .await?
            .as_deref(),
        Some("LogAppendTime")
    );
    Ok(())
}

#[tokio::test]
async fn topics_create_refuses_topics_that_are_not_copartitioned() -> anyhow::Result<()> {
    let broker = Broker::start().await?;
    let prefix = unique_prefix("mismatch");
    let config = config(&broker, &prefix, 3);
    let names = Names::new(&prefix);
    // Someone created the proposals topic by hand with another partition count.
    let admin: AdminClient<DefaultClientContext> = config.client_config().create()?;
    let proposals = names.proposals();
    admin
        .create_topics(
            &[NewTopic::new(&proposals, 2, TopicReplication::Fixed(1))],
            &AdminOptions::new().operation_timeout(Some(TIMEOUT)),
        )
        .await?
        .into_iter()
        .collect::<Result<Vec<_>, _>>()
        .map_err(|(t, e)| anyhow::anyhow!("{t}: {e}"))?;
    let specs = names.plan(["ledger"]);
    let err = topics::create(&config, &specs, TIMEOUT)
        .await
        .expect_err("mismatched partitions must be refused");
    let message = err.to_string();
    assert!(message.contains(&format!("{proposals} has 2")), "{message}");
    // Nothing else was created.
    let counts = topics::partition_counts(&admin, TIMEOUT)?;
    assert!(!counts.contains_key(&names.decisions()), "{counts:?}");
    Ok(())
}
