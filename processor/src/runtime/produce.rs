//! The idempotent producer every task shares, and a blocking "send these records in phase
//! order and wait until the broker acknowledged each" on top of it.
//!
//! Settings that matter for safety: `enable.idempotence=true` (no duplicates or reordering from
//! the client's own retries, `acks=all`), `partitioner=murmur2_random` (Java-compatible), and
//! an explicit partition on every record (the task's own: every topic is co-partitioned).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::future_producer::OwnedDeliveryResult;
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer as _};

use super::partitioner::LIBRDKAFKA_PARTITIONER;
use super::wire::OutRecord;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("creating the producer: {0}")]
    Create(#[source] rdkafka::error::KafkaError),
    #[error("producing to {topic} partition {partition}: {source}")]
    Delivery {
        topic: String,
        partition: i32,
        #[source]
        source: rdkafka::error::KafkaError,
    },
    #[error(
        "the broker took the records produced to {topic} partition {partition} without saying \
         at which offset (a request resent after a lost response); try again"
    )]
    Unplaced { topic: String, partition: i32 },
}

impl Error {
    /// True when the same call may succeed later: a broker error that passes
    /// ([`scan::transient`](super::scan::transient)), or an acknowledgement without offsets.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Delivery { source, .. } => super::scan::transient(source),
            Error::Unplaced { .. } => true,
            Error::Create(_) => false,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Offsets the broker acknowledged, per topic and partition. A call touches a handful of
/// partitions: a list searched in place, so recording a delivery allocates nothing.
#[derive(Clone, Debug, Default)]
pub struct Acked {
    spans: Vec<(String, i32, Span)>,
}

/// The offsets one call's records of one partition landed at.
///
/// An idempotent producer that resends a request whose response was lost (a broker failing
/// over) may get the broker's "already have it" back: librdkafka then reports the records
/// delivered at an unknown offset. They are in the log, somewhere: `unplaced` counts them, and
/// `lowest`, `highest` and `count` describe the others only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub lowest: i64,
    pub highest: i64,
    pub count: i64,
    pub unplaced: i64,
}

impl Span {
    /// True when nothing but this call's records lies between its lowest and highest offset
    /// (no other producer wrote to the partition in between), and every record's offset is
    /// known.
    pub fn is_contiguous(&self) -> bool {
        self.unplaced == 0 && self.highest - self.lowest + 1 == self.count
    }

    fn of(offset: i64) -> Span {
        if offset < 0 {
            return Span {
                lowest: i64::MAX,
                highest: i64::MIN,
                count: 0,
                unplaced: 1,
            };
        }
        Span {
            lowest: offset,
            highest: offset,
            count: 1,
            unplaced: 0,
        }
    }

    fn absorb(&mut self, other: Span) {
        self.lowest = self.lowest.min(other.lowest);
        self.highest = self.highest.max(other.highest);
        self.count += other.count;
        self.unplaced += other.unplaced;
    }
}

impl Acked {
    /// Adds `other`'s offsets to these.
    pub fn merge(&mut self, other: &Acked) {
        for (topic, partition, span) in &other.spans {
            self.add(topic, *partition, *span);
        }
    }

    fn add(&mut self, topic: &str, partition: i32, span: Span) {
        match self
            .spans
            .iter_mut()
            .find(|(t, p, _)| *p == partition && t == topic)
        {
            Some((_, _, s)) => s.absorb(span),
            None => self.spans.push((topic.to_owned(), partition, span)),
        }
    }

    /// The highest acknowledged offset of `topic`'s `partition`; `None` when nothing was
    /// produced there, or when a record's offset is unknown ([`Span`]).
    pub fn offset_of(&self, topic: &str, partition: i32) -> Option<i64> {
        self.span(topic, partition)
            .filter(|s| s.unplaced == 0)
            .map(|s| s.highest)
    }

    /// [`offset_of`](Self::offset_of) for a partition this call produced to: where its last
    /// record landed, or [`Error::Unplaced`] when the acknowledgement did not say.
    pub fn placed(&self, topic: &str, partition: i32) -> Result<i64> {
        self.offset_of(topic, partition)
            .ok_or_else(|| Error::Unplaced {
                topic: topic.to_owned(),
                partition,
            })
    }

    /// The offset after the last acknowledged record of `topic`'s `partition`.
    pub fn next_offset(&self, topic: &str, partition: i32) -> Option<i64> {
        self.offset_of(topic, partition).map(|o| o + 1)
    }

    pub fn span(&self, topic: &str, partition: i32) -> Option<Span> {
        self.spans
            .iter()
            .find(|(t, p, _)| *p == partition && t == topic)
            .map(|(_, _, s)| *s)
    }
}

pub struct Producer {
    inner: FutureProducer,
    runtime: tokio::runtime::Runtime,
}

impl std::fmt::Debug for Producer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer").finish_non_exhaustive()
    }
}

impl Producer {
    /// An idempotent producer over `base` (brokers and pass-through properties). The
    /// properties may choose the compression and the message timeout; the rest of what is
    /// set here they may not (`Kafka::validate` refuses them).
    pub fn new(base: &ClientConfig, linger_ms: u64) -> Result<Self> {
        let inner: FutureProducer = Self::config(base, linger_ms)
            .create()
            .map_err(Error::Create)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a current-thread tokio runtime builds without I/O");
        Ok(Producer { inner, runtime })
    }

    /// The producer's settings: `base` with Airlock's own on top.
    fn config(base: &ClientConfig, linger_ms: u64) -> ClientConfig {
        let mut config = base.clone();
        config
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("partitioner", LIBRDKAFKA_PARTITIONER)
            .set("linger.ms", linger_ms.to_string());
        let unset = |names: &[&str]| names.iter().all(|n| base.get(n).is_none());
        if unset(&["compression.type", "compression.codec"]) {
            config.set("compression.type", "lz4");
        }
        if unset(&["message.timeout.ms", "delivery.timeout.ms"]) {
            // Bounded: a broker that stays away this long fails the batch, and the process
            // exits with the outbox intact (it is resent on restart).
            config.set("message.timeout.ms", "120000");
        }
        config
    }

    /// Sends every record, phase 0 first; phase 1 only after every phase-0 record was
    /// acknowledged. Returns once all are acknowledged; the first failure is the error.
    pub fn send_phased(&self, records: &[OutRecord]) -> Result<Acked> {
        let mut acked = Acked::default();
        for phase in [0u8, 1] {
            let batch: Vec<&OutRecord> = records.iter().filter(|r| r.phase == phase).collect();
            if batch.is_empty() {
                continue;
            }
            let mut flight = self.send(&batch)?;
            flight.wait(self)?;
            acked.merge(&flight.into_acked());
        }
        Ok(acked)
    }

    /// Hands every record to the producer without waiting for the broker; the returned
    /// [`InFlight`] learns their acknowledgements.
    pub fn send(&self, records: &[&OutRecord]) -> Result<InFlight> {
        let mut topics: Vec<String> = Vec::new();
        let mut pending = Vec::with_capacity(records.len());
        for r in records {
            let mut headers = OwnedHeaders::new_with_capacity(r.headers.len());
            for (k, v) in &r.headers {
                headers = headers.insert(Header {
                    key: k,
                    value: Some(v),
                });
            }
            let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&r.topic)
                .partition(r.partition)
                .headers(headers);
            if let Some(k) = &r.key {
                record = record.key(k.as_slice());
            }
            if let Some(v) = &r.value {
                record = record.payload(v.as_slice());
            }
            // `send_result` enqueues without waiting; a full queue is waited out.
            let mut record = record;
            let future = loop {
                match self.inner.send_result(record) {
                    Ok(f) => break f,
                    Err((e, back)) => {
                        if matches!(
                            e,
                            rdkafka::error::KafkaError::MessageProduction(
                                rdkafka::types::RDKafkaErrorCode::QueueFull
                            )
                        ) {
                            self.inner.poll(Duration::from_millis(10));
                            record = back;
                            continue;
                        }
                        return Err(Error::Delivery {
                            topic: r.topic.clone(),
                            partition: r.partition,
                            source: e,
                        });
                    }
                }
            };
            let topic = match topics.iter().position(|t| *t == r.topic) {
                Some(i) => i,
                None => {
                    topics.push(r.topic.clone());
                    topics.len() - 1
                }
            };
            pending.push((topic, r.partition, future));
        }
        Ok(InFlight {
            topics,
            pending,
            next: 0,
            acked: Acked::default(),
        })
    }

    /// Waits for everything in flight (shutdown).
    pub fn flush(&self, timeout: Duration) -> Result<()> {
        self.inner.flush(timeout).map_err(|source| Error::Delivery {
            topic: "*".to_owned(),
            partition: -1,
            source,
        })
    }
}

/// Records handed to the producer, awaiting their acknowledgements. Delivery reports arrive on
/// the producer's own thread; [`poll`](Self::poll) collects those already in without waiting,
/// [`wait`](Self::wait) waits for the rest.
pub struct InFlight {
    /// The topics the records go to, each once.
    topics: Vec<String>,
    /// (index in `topics`, partition, delivery) in send order.
    pending: Vec<(usize, i32, DeliveryFuture)>,
    /// Every delivery before this index is acknowledged and counted in `acked`.
    next: usize,
    acked: Acked,
}

impl std::fmt::Debug for InFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InFlight")
            .field("records", &self.pending.len())
            .field("acknowledged", &self.next)
            .finish()
    }
}

impl InFlight {
    /// Collects the acknowledgements that arrived, without waiting; true once every record is
    /// acknowledged. The first failed delivery is the error.
    pub fn poll(&mut self) -> Result<bool> {
        let mut cx = Context::from_waker(Waker::noop());
        while let Some((_, _, future)) = self.pending.get_mut(self.next) {
            let Poll::Ready(delivered) = Pin::new(future).poll(&mut cx) else {
                return Ok(false);
            };
            self.delivered(delivered)?;
        }
        Ok(true)
    }

    /// Waits until every record is acknowledged; the first failed delivery is the error.
    pub fn wait(&mut self, producer: &Producer) -> Result<()> {
        producer.runtime.block_on(self.acknowledged())
    }

    /// [`wait`](Self::wait) for async code (any runtime): resolves once every record is
    /// acknowledged; the first failed delivery is the error.
    pub async fn acknowledged(&mut self) -> Result<()> {
        while let Some((_, _, future)) = self.pending.get_mut(self.next) {
            let delivered = future.await;
            self.delivered(delivered)?;
        }
        Ok(())
    }

    /// The acknowledged offsets, once every record is acknowledged.
    pub fn into_acked(self) -> Acked {
        self.acked
    }

    /// Counts the delivery report of record `next`; `Err(_)` is a report the producer dropped
    /// (it was closed).
    fn delivered<E>(
        &mut self,
        delivered: std::result::Result<OwnedDeliveryResult, E>,
    ) -> Result<()> {
        let (topic, partition, _) = self.pending[self.next];
        let topic = &self.topics[topic];
        let source = match delivered {
            Ok(Ok(d)) => {
                self.acked.add(topic, partition, Span::of(d.offset));
                self.next += 1;
                return Ok(());
            }
            Ok(Err((source, _))) => source,
            Err(_) => rdkafka::error::KafkaError::Canceled,
        };
        Err(Error::Delivery {
            topic: topic.clone(),
            partition,
            source,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn properties_choose_the_compression_and_timeout_but_not_the_safety() {
        let mut base = ClientConfig::new();
        base.set("bootstrap.servers", "k1:9092");
        let defaults = Producer::config(&base, 2);
        assert_eq!(defaults.get("compression.type"), Some("lz4"));
        assert_eq!(defaults.get("message.timeout.ms"), Some("120000"));
        assert_eq!(defaults.get("linger.ms"), Some("2"));
        base.set("compression.type", "zstd")
            .set("delivery.timeout.ms", "30000");
        let chosen = Producer::config(&base, 2);
        assert_eq!(chosen.get("compression.type"), Some("zstd"));
        assert_eq!(chosen.get("delivery.timeout.ms"), Some("30000"));
        assert_eq!(chosen.get("message.timeout.ms"), None);
        // Had a property slipped past `Kafka::validate`, Airlock's value still wins.
        base.set("acks", "1");
        assert_eq!(Producer::config(&base, 2).get("acks"), Some("all"));
    }

    /// Every setting the producer imposes is one that `Kafka::validate` refuses to take from
    /// the properties, so the two lists cannot drift apart.
    #[test]
    fn what_the_producer_imposes_the_properties_cannot_set() {
        let imposed = Producer::config(&ClientConfig::new(), 2);
        let defaults = ["compression.type", "message.timeout.ms"];
        let names: Vec<String> = imposed
            .config_map()
            .keys()
            .map(|k| k.to_string())
            .filter(|k| !defaults.contains(&k.as_str()))
            .collect();
        assert!(names.len() >= 4, "{names:?}");
        for name in names {
            let kafka = super::super::config::Kafka {
                properties: [(name.clone(), "x".to_owned())].into(),
                ..Default::default()
            };
            assert!(kafka.validate().is_err(), "{name} is accepted");
        }
    }

    /// A record delivered at an unknown offset (-1001, librdkafka's answer to a resent request
    /// the broker already had) places nothing: the partition's end is unknown, not -1001.
    #[test]
    fn a_delivery_without_an_offset_leaves_the_end_unknown() {
        let mut acked = Acked::default();
        acked.add("t", 0, Span::of(7));
        acked.add("t", 0, Span::of(8));
        acked.add("t", 1, Span::of(3));
        acked.add("t", 1, Span::of(-1_001));
        acked.add("t", 1, Span::of(4));
        assert_eq!(acked.placed("t", 0).unwrap(), 8);
        assert!(acked.span("t", 0).unwrap().is_contiguous());
        let span = acked.span("t", 1).unwrap();
        assert_eq!(
            (span.lowest, span.highest, span.count, span.unplaced),
            (3, 4, 2, 1)
        );
        assert!(!span.is_contiguous());
        assert_eq!(acked.offset_of("t", 1), None);
        let err = acked.placed("t", 1).unwrap_err();
        assert!(err.is_transient(), "{err}");
        assert!(matches!(acked.placed("t", 2), Err(Error::Unplaced { .. })));
    }
}
