//! Broker compatibility: the one place that knows how a Kafka-protocol broker other than Apache
//! Kafka differs, and what Airlock does about it. Every Airlock process reads
//! `kafka.compatibility` (`AIRLOCK_KAFKA_COMPATIBILITY`): `kafka` (the default: Apache Kafka,
//! Confluent, MSK, Redpanda) or `tansu-0.6`. The Kafka path carries no workaround; a
//! workaround lives here, behind a variant, with the behaviour it answers.
//!
//! tansu 0.6 (memory storage), as observed against librdkafka 2.12 (each behaviour is shown by a
//! behaviour was seen with the suite on tansu, `AIRLOCK_TEST_BROKER=tansu`):
//! - **It holds every fetch for its full `fetch.wait.max.ms`**, even with records waiting, so a
//!   consumer's wait is added to every record's latency: [`Broker::fetch_wait_ms`] keeps it to a
//!   fraction of the batch interval there. Kafka answers a fetch as soon as records arrive; the
//!   wait only bounds how long an idle fetch is parked, and librdkafka's default stands.
//! - **A fetch from an offset inside a produced batch can return the next batch**, silently
//!   skipping records: [`Broker::resume_offset`] starts a resumed partition up to
//!   [`TANSU_REWIND`] records earlier and the task drops what it already consumed.
//! - **Its high watermark can stop inside the last produced batch.** Airlock learns the end of a
//!   partition read-your-writes from the acknowledged offset of a barrier record it writes
//!   (`wire::OutRecord::barrier`; every consumer skips barriers): one small record per claim or
//!   scan, and no reliance on how a broker computes its watermark. Processes that may write
//!   the topic anyway (the processor on its changelog, the auditor's scans unless read-only)
//!   do so on every broker; the clients of the decisions topic (`airlock propose`, `approve`,
//!   `settle`), which must not need write access to it, read its high watermark on Kafka
//!   ([`Broker::high_watermark_is_end`]) and write a barrier only on tansu.
//! - **It never evicts a group member that stops heartbeating** (SIGKILL, SIGSTOP): the group's
//!   next rebalance waits for it forever, so a replacement must join a fresh group
//!   ([`Broker::evicts_silent_members`]).
//! - **It revokes a static member's assignment right after giving it**: Airlock sets no
//!   `group.instance.id` (on any broker, for now).
//! - **It ignores `message.timestamp.type=LogAppendTime`** and keeps the producer's clock; the
//!   processor warns and counts such inputs (`airlock_producer_time_inputs_total`).
//! - **It does not compact** and **has no transactions**.
//! - **Its DescribeConfigs lists only what a topic's creator set**, never `max.message.bytes`:
//!   the start-up check of record limits (`topics::check_message_limits`) finds nothing to
//!   compare there ([`Broker::reports_message_limits`]).

use std::fmt;
use std::str::FromStr;

use rdkafka::Offset;

/// How far before its stored offset a resumed partition is fetched on tansu 0.6.
pub const TANSU_REWIND: i64 = 2_000;

/// The broker Airlock talks to, as far as its behaviour matters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
pub enum Broker {
    /// Apache Kafka and brokers that behave like it.
    #[default]
    #[serde(rename = "kafka")]
    Kafka,
    /// tansu 0.6.
    #[serde(rename = "tansu-0.6")]
    Tansu06,
}

impl Broker {
    /// The consumer's `fetch.wait.max.ms` for a processor that batches over `flush_interval_ms`;
    /// `None`: librdkafka's default.
    pub fn fetch_wait_ms(self, flush_interval_ms: u64) -> Option<u64> {
        match self {
            Broker::Kafka => None,
            // A quarter of the flush interval: with the full interval the decision latency on
            // tansu was a third higher (processor/BENCHMARKS.md, 2026-11).
            Broker::Tansu06 => Some((flush_interval_ms / 4).max(1)),
        }
    }

    /// Where to fetch a partition whose next unconsumed offset is `stored` (`None`: nothing
    /// consumed yet). The task skips what it already consumed by its own stored offsets. On
    /// every broker the last consumed record is read again: its fingerprint tells whether the
    /// log is still the one consumed (a topic deleted and created again is caught there, not
    /// decided as if it were the old one; `PartitionTask::check_redelivered`).
    pub fn resume_offset(self, stored: Option<i64>) -> Offset {
        match (self, stored) {
            (Broker::Kafka, Some(o)) if o > 0 => Offset::Offset(o - 1),
            (Broker::Tansu06, Some(o)) if o > TANSU_REWIND => Offset::Offset(o - TANSU_REWIND),
            (_, _) => Offset::Beginning,
        }
    }

    /// True when the group coordinator evicts a member that stops heartbeating for its session
    /// timeout, so that a replacement can join the same group.
    pub fn evicts_silent_members(self) -> bool {
        match self {
            Broker::Kafka => true,
            Broker::Tansu06 => false,
        }
    }

    /// True when the broker compacts `cleanup.policy=compact` topics (the changelog).
    pub fn compacts(self) -> bool {
        match self {
            Broker::Kafka => true,
            Broker::Tansu06 => false,
        }
    }

    /// True when DescribeConfigs reports a topic's effective `max.message.bytes`.
    pub fn reports_message_limits(self) -> bool {
        match self {
            Broker::Kafka => true,
            Broker::Tansu06 => false,
        }
    }

    /// True when a partition's high watermark is the offset after its last readable record, so
    /// that a reader can learn where the partition ends without writing to it.
    pub fn high_watermark_is_end(self) -> bool {
        match self {
            Broker::Kafka => true,
            Broker::Tansu06 => false,
        }
    }

    /// True when the broker supports Kafka transactions (Airlock does not need them).
    pub fn has_transactions(self) -> bool {
        match self {
            Broker::Kafka => true,
            Broker::Tansu06 => false,
        }
    }
}

impl fmt::Display for Broker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Broker::Kafka => "kafka",
            Broker::Tansu06 => "tansu-0.6",
        })
    }
}

impl FromStr for Broker {
    type Err = String;

    fn from_str(s: &str) -> Result<Broker, String> {
        match s {
            "kafka" => Ok(Broker::Kafka),
            "tansu-0.6" => Ok(Broker::Tansu06),
            other => Err(format!("{other:?} is not kafka or tansu-0.6")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kafka_resumes_at_the_last_consumed_record_and_tansu_rewinds() {
        assert_eq!(
            Broker::Kafka.resume_offset(Some(5_000)),
            Offset::Offset(4_999),
            "the last consumed record again, for its fingerprint"
        );
        assert_eq!(Broker::Kafka.resume_offset(Some(0)), Offset::Beginning);
        assert_eq!(Broker::Kafka.resume_offset(None), Offset::Beginning);
        assert_eq!(
            Broker::Tansu06.resume_offset(Some(5_000)),
            Offset::Offset(5_000 - TANSU_REWIND)
        );
        assert_eq!(Broker::Tansu06.resume_offset(Some(10)), Offset::Beginning);
    }

    #[test]
    fn names_round_trip_and_a_wrong_one_names_the_choices() {
        for b in [Broker::Kafka, Broker::Tansu06] {
            assert_eq!(b.to_string().parse::<Broker>(), Ok(b));
        }
        let e = "redpanda".parse::<Broker>().expect_err("not a broker kind");
        assert!(e.contains("kafka or tansu-0.6"), "{e}");
    }

    #[test]
    fn only_tansu_shortens_the_fetch_wait() {
        assert_eq!(Broker::Kafka.fetch_wait_ms(20), None);
        assert_eq!(Broker::Tansu06.fetch_wait_ms(20), Some(5));
        assert_eq!(Broker::Tansu06.fetch_wait_ms(2), Some(1));
    }
}
