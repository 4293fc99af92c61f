//! Topic names and `airlock topics create`: every topic of DESIGN.md section 1 with one
//! partition count (they are co-partitioned by operation key), the changelog compacted, the
//! journal and the receipts kept forever, and a refusal to go on when existing topics disagree on partitions.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::types::RDKafkaErrorCode;

use super::config::Config;

/// Errors of topic administration; each names the topics involved.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kafka client: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error(
        "existing topics are not co-partitioned with the configured {expected} partitions: {}; \
         Airlock needs the same partition count on every topic (recreate them, or set \
         topics.partitions to match)",
        .mismatched.iter().map(|(t, n)| format!("{t} has {n}")).collect::<Vec<_>>().join(", ")
    )]
    NotCopartitioned {
        expected: i32,
        mismatched: Vec<(String, i32)>,
    },
    #[error(
        "topics accept smaller records than kafka.max_message_bytes ({max_message_bytes}): {}; \
         a record the processor staged could never be written (raise the topics' \
         max.message.bytes, or lower kafka.max_message_bytes)",
        .smaller.iter().map(|(t, n)| format!("{t} takes {n}")).collect::<Vec<_>>().join(", ")
    )]
    MessageLimit {
        max_message_bytes: usize,
        smaller: Vec<(String, usize)>,
    },
    #[error("describing topic {topic}: {problem}")]
    Describe { topic: String, problem: String },
    #[error("creating topic {topic}: {code}")]
    Create {
        topic: String,
        code: RDKafkaErrorCode,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// One topic Airlock needs, with its settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicSpec {
    pub name: String,
    /// Topic-level configs set at creation.
    pub configs: Vec<(&'static str, &'static str)>,
}

/// The names of Airlock's topics under a prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Names {
    prefix: String,
}

impl Names {
    pub fn new(prefix: &str) -> Self {
        Names {
            prefix: prefix.to_owned(),
        }
    }

    pub fn proposals(&self) -> String {
        format!("{}proposals", self.prefix)
    }
    pub fn approvals(&self) -> String {
        format!("{}approvals", self.prefix)
    }
    pub fn outcomes(&self) -> String {
        format!("{}outcomes", self.prefix)
    }
    pub fn control(&self) -> String {
        format!("{}control", self.prefix)
    }
    /// The input topic `source` is read from.
    pub fn input(&self, source: super::partition::Source) -> String {
        use super::partition::Source;
        match source {
            Source::Proposals => self.proposals(),
            Source::Approvals => self.approvals(),
            Source::Outcomes => self.outcomes(),
            Source::Control => self.control(),
        }
    }
    pub fn decisions(&self) -> String {
        format!("{}decisions", self.prefix)
    }
    pub fn journal(&self) -> String {
        format!("{}journal", self.prefix)
    }
    pub fn changelog(&self) -> String {
        format!("{}changelog", self.prefix)
    }
    pub fn dlq(&self) -> String {
        format!("{}dlq", self.prefix)
    }
    pub fn receipts(&self) -> String {
        format!("{}receipts", self.prefix)
    }
    pub fn dispatch(&self, connector: &str) -> String {
        format!("{}dispatch.{connector}", self.prefix)
    }

    /// Every topic, inputs first, with the settings each needs.
    ///
    /// Topics created by an earlier version lack the settings added since; set them by hand
    /// (`kafka-configs --alter`): `message.timestamp.type=LogAppendTime` on the inputs,
    /// `min.compaction.lag.ms` on the changelog.
    pub fn plan<'a>(&self, connectors: impl IntoIterator<Item = &'a str>) -> Vec<TopicSpec> {
        let plain = |name: String| TopicSpec {
            name,
            configs: Vec::new(),
        };
        // The inputs: `now` of a record is its timestamp (DESIGN.md section 6), so the broker
        // stamps it on append and no agent chooses its own clock (a broker that ignores it:
        // see `compat`; the processor warns when it reads such records).
        let input = |name: String| TopicSpec {
            name,
            configs: vec![("message.timestamp.type", "LogAppendTime")],
        };
        let mut specs = vec![
            input(self.proposals()),
            input(self.approvals()),
            TopicSpec {
                name: self.outcomes(),
                // The connectors' evidence, and what a worker that lost its disk learns its
                // started attempts from: kept explicitly, not at the broker's default (7 days).
                configs: vec![
                    ("message.timestamp.type", "LogAppendTime"),
                    ("retention.ms", OUTCOMES_RETENTION_MS),
                ],
            },
            input(self.control()),
            plain(self.decisions()),
            TopicSpec {
                name: self.journal(),
                // The audit trail: never deleted by time or size.
                configs: vec![("retention.ms", "-1"), ("retention.bytes", "-1")],
            },
            TopicSpec {
                name: self.changelog(),
                // Restore reads the latest record per key. A new record stays out of compaction
                // for an hour: a zombie's row (an earlier owner that missed the takeover) must
                // not replace the owner's before the owner's sweep writes its value again
                // (`processor.changelog_sweep_ms`, at most ten minutes).
                configs: vec![
                    ("cleanup.policy", "compact"),
                    ("min.compaction.lag.ms", CHANGELOG_MIN_COMPACTION_LAG_MS),
                ],
            },
            plain(self.dlq()),
            TopicSpec {
                name: self.receipts(),
                // Signed receipts, chained per partition: a gap would read as tampering.
                configs: vec![("retention.ms", "-1"), ("retention.bytes", "-1")],
            },
        ];
        let mut connectors: Vec<&str> = connectors.into_iter().collect();
        connectors.sort_unstable();
        connectors.dedup();
        specs.extend(connectors.into_iter().map(|c| plain(self.dispatch(c))));
        specs
    }
}

/// What `create` found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub created: Vec<String>,
    pub existing: Vec<String>,
}

/// Partition counts of the named topics that exist, from the cluster's metadata.
pub fn partition_counts(
    admin: &AdminClient<DefaultClientContext>,
    timeout: Duration,
) -> Result<BTreeMap<String, i32>> {
    let metadata = admin.inner().fetch_metadata(None, timeout)?;
    Ok(metadata
        .topics()
        .iter()
        .filter(|t| t.error().is_none())
        .map(|t| (t.name().to_owned(), t.partitions().len() as i32))
        .collect())
}

/// Fails unless every topic of `topics` takes records of `max_message_bytes` (its
/// `max.message.bytes`, the broker's default where the topic sets none): otherwise a record
/// the processor made durable in its outbox would be refused by the broker on every resend.
pub fn check_message_limits(
    admin: &AdminClient<DefaultClientContext>,
    topics: &[String],
    max_message_bytes: usize,
    timeout: Duration,
) -> Result<()> {
    let resources: Vec<ResourceSpecifier<'_>> =
        topics.iter().map(|t| ResourceSpecifier::Topic(t)).collect();
    let options = AdminOptions::new().request_timeout(Some(timeout));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread tokio runtime builds without I/O");
    let results = runtime.block_on(admin.describe_configs(&resources, &options))?;
    let mut smaller = Vec::new();
    for (topic, result) in topics.iter().zip(results) {
        let describe = |problem: String| Error::Describe {
            topic: topic.clone(),
            problem,
        };
        let resource = result.map_err(|code| describe(code.to_string()))?;
        let Some(value) = resource
            .get("max.message.bytes")
            .and_then(|e| e.value.as_deref())
        else {
            continue;
        };
        let limit: usize = value
            .parse()
            .map_err(|_| describe(format!("max.message.bytes is {value:?}")))?;
        if limit < max_message_bytes {
            smaller.push((topic.clone(), limit));
        }
    }
    if smaller.is_empty() {
        Ok(())
    } else {
        Err(Error::MessageLimit {
            max_message_bytes,
            smaller,
        })
    }
}

/// Checks co-partitioning of the topics that exist, then creates the missing ones. Nothing is
/// created when an existing topic has another partition count.
pub async fn create(config: &Config, specs: &[TopicSpec], timeout: Duration) -> Result<Report> {
    let admin: AdminClient<DefaultClientContext> = config.client_config().create()?;
    let existing = partition_counts(&admin, timeout)?;
    let expected = config.topics.partitions;
    let mismatched: Vec<(String, i32)> = specs
        .iter()
        .filter_map(|s| existing.get(&s.name).map(|n| (s.name.clone(), *n)))
        .filter(|(_, n)| *n != expected)
        .collect();
    if !mismatched.is_empty() {
        return Err(Error::NotCopartitioned {
            expected,
            mismatched,
        });
    }
    let (present, missing): (Vec<_>, Vec<_>) =
        specs.iter().partition(|s| existing.contains_key(&s.name));
    let mut report = Report {
        existing: present.iter().map(|s| s.name.clone()).collect(),
        created: Vec::new(),
    };
    if missing.is_empty() {
        return Ok(report);
    }
    let new_topics: Vec<NewTopic<'_>> = missing
        .iter()
        .map(|s| {
            s.configs.iter().fold(
                NewTopic::new(
                    &s.name,
                    expected,
                    TopicReplication::Fixed(config.topics.replication_factor),
                ),
                |t, (k, v)| t.set(k, v),
            )
        })
        .collect();
    let options = AdminOptions::new().operation_timeout(Some(timeout));
    for result in admin.create_topics(&new_topics, &options).await? {
        match result {
            Ok(name) => report.created.push(name),
            // Another instance created it between our metadata read and now.
            Err((name, RDKafkaErrorCode::TopicAlreadyExists)) => report.existing.push(name),
            Err((topic, code)) => return Err(Error::Create { topic, code }),
        }
    }
    Ok(report)
}

/// The outcomes' `retention.ms`: 30 days, beyond the reference tools' retention (7 days) and
/// as long as the default closed-intent retention (`processor.closed_intent_retention_ms`).
/// `airlock topics create` warns about tools that keep their intents longer.
pub const OUTCOMES_RETENTION_MS: &str = "2592000000";

/// The changelog's `min.compaction.lag.ms`: one hour, six times the longest sweep interval.
pub const CHANGELOG_MIN_COMPACTION_LAG_MS: &str = "3600000";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_names_every_topic_once_with_its_settings() {
        let specs = Names::new("airlock.").plan(["ledger", "http", "ledger"]);
        let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "airlock.proposals",
                "airlock.approvals",
                "airlock.outcomes",
                "airlock.control",
                "airlock.decisions",
                "airlock.journal",
                "airlock.changelog",
                "airlock.dlq",
                "airlock.receipts",
                "airlock.dispatch.http",
                "airlock.dispatch.ledger",
            ]
        );
        for input in ["proposals", "approvals", "control"] {
            let spec = specs.iter().find(|s| s.name.ends_with(input));
            assert_eq!(
                spec.map(|s| s.configs.clone()),
                Some(vec![("message.timestamp.type", "LogAppendTime")]),
                "{input}"
            );
        }
        let outcomes = specs.iter().find(|s| s.name.ends_with("outcomes"));
        assert_eq!(
            outcomes.map(|s| s.configs.clone()),
            Some(vec![
                ("message.timestamp.type", "LogAppendTime"),
                ("retention.ms", "2592000000")
            ])
        );
        let changelog = specs.iter().find(|s| s.name.ends_with("changelog"));
        assert_eq!(
            changelog.map(|s| s.configs.clone()),
            Some(vec![
                ("cleanup.policy", "compact"),
                ("min.compaction.lag.ms", "3600000")
            ])
        );
        // A receipt deleted by retention would read as a break of the chain.
        let receipts = specs.iter().find(|s| s.name.ends_with("receipts"));
        assert_eq!(
            receipts.map(|s| s.configs.clone()),
            Some(vec![("retention.ms", "-1"), ("retention.bytes", "-1")])
        );
    }
}
