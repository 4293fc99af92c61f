//! Fence 2 on the connector side (DESIGN.md section 5): the attempts this connector has
//! started, per operation key, so that a command whose epoch is not above the highest started
//! one is refused (a redelivery, a resend of the processor's outbox, a superseded epoch).
//!
//! The record of truth is the outcomes topic: a worker produces `ATTEMPT_STARTED` and waits
//! for its acknowledgement before calling downstream. A worker that gains a dispatch partition
//! rebuilds the map from the co-partitioned outcomes partition before it reads a command
//! there. The end of that partition is learnt read-your-writes, from the acknowledged offset of
//! a barrier record, which holds on every broker (`airlock_processor::runtime::compat`).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use airlock_processor::runtime::produce::{self, Producer};
use airlock_processor::runtime::scan;
use airlock_processor::runtime::wire::{self, OutRecord};
use airlock_schemas::{Codec, Outcome, OutcomeKind};

use crate::http::classify::NOT_CALLED;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Headers;
use rdkafka::{Message, Offset, TopicPartitionList};

/// Errors of rebuilding; each names the partition.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("outcomes partition {partition}: kafka: {source}")]
    Kafka {
        partition: i32,
        #[source]
        source: rdkafka::error::KafkaError,
    },
    #[error(transparent)]
    Produce(#[from] produce::Error),
    #[error(
        "outcomes partition {partition}: no progress reading at offset {at} (end {end}) for {stalled:?}"
    )]
    Stalled {
        partition: i32,
        at: i64,
        end: i64,
        stalled: Duration,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// True when trying again later may succeed: a broker down, a leader moving, a read that
    /// stalled. Only librdkafka's fatal errors are not.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Kafka { source, .. } => scan::transient(source),
            Error::Produce(e) => e.is_transient(),
            Error::Stalled { .. } => true,
        }
    }
}

/// The highest started attempt epoch per operation key, on one partition, and the attempts
/// this connector failed without calling downstream.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Started {
    epochs: HashMap<String, i64>,
    /// Per key, the latest epoch failed "not called" (started, then failed before any call):
    /// a lookup for it needs no downstream call, the answer is known.
    unsent: HashMap<String, i64>,
}

impl Started {
    /// The highest epoch started for `key`.
    pub fn get(&self, key: &str) -> Option<i64> {
        self.epochs.get(key).copied()
    }

    /// True when `epoch` of `key` may not start: an equal or higher epoch already did.
    pub fn refuses(&self, key: &str, epoch: i64) -> bool {
        self.get(key).is_some_and(|started| epoch <= started)
    }

    /// Records that `epoch` of `key` started. A "not called" record of this epoch or an older
    /// one no longer holds: what started now may call.
    pub fn record(&mut self, key: &str, epoch: i64) {
        let e = self.epochs.entry(key.to_owned()).or_insert(epoch);
        *e = (*e).max(epoch);
        if self.unsent.get(key).is_some_and(|&unsent| unsent <= epoch) {
            self.unsent.remove(key);
        }
    }

    /// Records that `epoch` of `key` was started and then failed without a call. Only the
    /// latest started epoch of the key counts, and only after its start was recorded: a
    /// FAILED "not called" without its ATTEMPT_STARTED before it (planted, or outliving a
    /// purged one) proves nothing.
    pub fn record_unsent(&mut self, key: &str, epoch: i64) {
        if self.get(key) == Some(epoch) {
            self.unsent.insert(key.to_owned(), epoch);
        }
    }

    /// True when this connector failed `epoch` of `key` without calling downstream.
    pub fn failed_unsent(&self, key: &str, epoch: i64) -> bool {
        self.unsent.get(key) == Some(&epoch)
    }

    pub fn len(&self) -> usize {
        self.epochs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.epochs.is_empty()
    }

    /// Takes one outcome read back: `ATTEMPT_STARTED` of `connector`, and its FAILED "not
    /// called" ones.
    pub fn learn(&mut self, connector: &str, outcome: &Outcome) {
        if outcome.connector != connector {
            return;
        }
        match outcome.kind {
            OutcomeKind::AttemptStarted => self.record(&outcome.operation_key, outcome.epoch),
            OutcomeKind::Failed
                if outcome
                    .evidence
                    .as_deref()
                    .is_some_and(|e| e.starts_with(NOT_CALLED)) =>
            {
                self.record_unsent(&outcome.operation_key, outcome.epoch);
            }
            _ => {}
        }
    }
}

/// What a rebuild read, for the log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub from: i64,
    pub end: i64,
    pub outcomes: u64,
    pub unreadable: u64,
}

/// Rebuilds the started attempts of `connector` from partition `partition` of `topic` (the
/// outcomes): from its low watermark to a barrier produced now.
pub fn rebuild(
    reader: &BaseConsumer,
    producer: &Producer,
    topic: &str,
    partition: i32,
    connector: &str,
    stall_timeout: Duration,
) -> Result<(Started, Report)> {
    let kafka = |source| Error::Kafka { partition, source };
    let (low, _) = scan::watermarks(reader, topic, partition, stall_timeout).map_err(kafka)?;
    let acked = producer.send_phased(&[OutRecord::barrier(topic, partition)])?;
    let end = acked.placed(topic, partition)?;
    let mut started = Started::default();
    let mut report = Report {
        from: low,
        end,
        ..Report::default()
    };
    if low >= end {
        return Ok((started, report));
    }
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Offset(low))
        .map_err(kafka)?;
    reader.assign(&tpl).map_err(kafka)?;
    let codec = Codec::new();
    let mut at = low;
    let mut progress = Instant::now();
    let result = (|| {
        while at < end {
            let Some(message) = reader.poll(Duration::from_millis(200)) else {
                if progress.elapsed() > stall_timeout {
                    return Err(Error::Stalled {
                        partition,
                        at,
                        end,
                        stalled: progress.elapsed(),
                    });
                }
                continue;
            };
            let message = match message {
                Ok(m) => m,
                Err(e) if scan::transient(&e) && progress.elapsed() <= stall_timeout => {
                    log::warn!("{topic}/{partition}: rebuilding on after: {e}");
                    continue;
                }
                Err(e) => return Err(kafka(e)),
            };
            progress = Instant::now();
            at = message.offset() + 1;
            if message.offset() >= end {
                break;
            }
            let barrier = message.headers().is_some_and(|hs| {
                hs.iter().any(|h| {
                    h.key == wire::header::KIND && h.value == Some(wire::BARRIER_KIND.as_bytes())
                })
            });
            if barrier {
                continue;
            }
            // Outcomes of other connectors and records that are not outcomes (the processor
            // dead-letters those) say nothing about this connector's attempts.
            match message.payload().map(|p| codec.decode_as::<Outcome>(p)) {
                Some(Ok(outcome)) => {
                    report.outcomes += 1;
                    started.learn(connector, &outcome);
                }
                _ => report.unreadable += 1,
            }
        }
        Ok(())
    })();
    reader.unassign().map_err(kafka)?;
    result.map(|()| (started, report))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(key: &str, epoch: i64, kind: OutcomeKind, connector: &str) -> Outcome {
        let mut o = airlock_processor::sample::outcome(key, epoch, kind, "");
        o.connector = connector.to_owned();
        o
    }

    #[test]
    fn an_epoch_at_or_below_a_started_one_is_refused() {
        let mut s = Started::default();
        s.learn(
            "ledger",
            &outcome("k", 2, OutcomeKind::AttemptStarted, "ledger"),
        );
        s.learn(
            "ledger",
            &outcome("k", 1, OutcomeKind::AttemptStarted, "ledger"),
        );
        assert!(s.refuses("k", 1));
        assert!(s.refuses("k", 2));
        assert!(!s.refuses("k", 3));
        assert!(!s.refuses("other", 1));
    }

    #[test]
    fn only_this_connectors_started_attempts_count() {
        let mut s = Started::default();
        s.learn("ledger", &outcome("k", 4, OutcomeKind::Committed, "ledger"));
        s.learn(
            "ledger",
            &outcome("k", 5, OutcomeKind::AttemptStarted, "http"),
        );
        assert!(s.is_empty());
    }

    #[test]
    fn attempts_failed_without_a_call_are_known_per_epoch() {
        let mut s = Started::default();
        s.learn(
            "ledger",
            &outcome("k", 2, OutcomeKind::AttemptStarted, "ledger"),
        );
        let mut failed = outcome("k", 2, OutcomeKind::Failed, "ledger");
        failed.evidence = Some("not called: expired: read 40 ms after the attempt deadline".into());
        s.learn("ledger", &failed);
        assert!(s.failed_unsent("k", 2));
        assert!(!s.failed_unsent("k", 1));
        // A failure the downstream reported is no such knowledge, nor another connector's.
        let mut declined = outcome("j", 1, OutcomeKind::Failed, "ledger");
        declined.evidence = Some("HTTP 422: declined".into());
        s.learn("ledger", &declined);
        failed.operation_key = "h".into();
        s.learn("http", &failed);
        assert!(!s.failed_unsent("j", 1) && !s.failed_unsent("h", 2));

        // A later start of the key (or the same epoch started again) voids it.
        s.learn(
            "ledger",
            &outcome("k", 3, OutcomeKind::AttemptStarted, "ledger"),
        );
        assert!(!s.failed_unsent("k", 2));
        // A "not called" without its own start before it proves nothing: planted ahead of a
        // future epoch, or outliving a start that retention removed.
        let mut planted = failed.clone();
        planted.operation_key = "k".into();
        planted.epoch = 4;
        s.learn("ledger", &planted);
        assert!(!s.failed_unsent("k", 4));
        planted.operation_key = "fresh".into();
        planted.epoch = 1;
        s.learn("ledger", &planted);
        assert!(!s.failed_unsent("fresh", 1));
    }

    /// A claim that fails on these is tried again after rejoining; only fatal ones stop the
    /// worker.
    #[test]
    fn a_broker_outage_is_transient_and_a_fatal_error_is_not() {
        use rdkafka::error::KafkaError;
        use rdkafka::types::RDKafkaErrorCode;
        let kafka = |source| Error::Kafka {
            partition: 0,
            source,
        };
        assert!(
            kafka(KafkaError::MetadataFetch(
                RDKafkaErrorCode::UnknownPartition
            ))
            .is_transient()
        );
        assert!(
            kafka(KafkaError::MetadataFetch(
                RDKafkaErrorCode::BrokerTransportFailure
            ))
            .is_transient()
        );
        assert!(
            Error::Stalled {
                partition: 0,
                at: 1,
                end: 2,
                stalled: Duration::from_secs(60)
            }
            .is_transient()
        );
        assert!(
            !kafka(KafkaError::MessageConsumptionFatal(RDKafkaErrorCode::Fatal)).is_transient()
        );
        assert!(!kafka(KafkaError::MetadataFetch(RDKafkaErrorCode::Fatal)).is_transient());
        assert!(
            !Error::Produce(produce::Error::Create(KafkaError::ClientCreation(
                "x".into()
            )))
            .is_transient()
        );
    }
}
