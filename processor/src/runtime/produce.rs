//! The idempotent producer every task shares, and a blocking "send these records in phase
//! order and wait until the broker acknowledged each" on top of it.
//!
//! Settings that matter for safety: `enable.idempotence=true` (no duplicates or reordering from
//! the client's own retries, `acks=all`), `partitioner=murmur2_random` (Java-compatible), and
//! an explicit partition on every record (the task's own: every topic is co-partitioned).

use std::collections::HashMap;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer as _};

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
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Offsets the broker acknowledged, per topic and partition.
#[derive(Clone, Debug, Default)]
pub struct Acked {
    spans: HashMap<(String, i32), Span>,
}

/// The offsets one call's records of one partition landed at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub lowest: i64,
    pub highest: i64,
    pub count: i64,
}

impl Span {
    /// True when nothing but this call's records lies between its lowest and highest offset:
    /// no other producer wrote to the partition in between.
    pub fn is_contiguous(&self) -> bool {
        self.highest - self.lowest + 1 == self.count
    }
}

impl Acked {
    /// The highest acknowledged offset of `topic`'s `partition`.
    pub fn offset_of(&self, topic: &str, partition: i32) -> Option<i64> {
        self.span(topic, partition).map(|s| s.highest)
    }

    /// The offset after the last acknowledged record of `topic`'s `partition`.
    pub fn next_offset(&self, topic: &str, partition: i32) -> Option<i64> {
        self.offset_of(topic, partition).map(|o| o + 1)
    }

    pub fn span(&self, topic: &str, partition: i32) -> Option<Span> {
        self.spans.get(&(topic.to_owned(), partition)).copied()
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
    /// An idempotent producer over `base` (brokers and pass-through properties).
    pub fn new(base: &ClientConfig, linger_ms: u64) -> Result<Self> {
        let mut config = base.clone();
        config
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("partitioner", LIBRDKAFKA_PARTITIONER)
            .set("linger.ms", linger_ms.to_string())
            .set("compression.type", "lz4")
            // Bounded: a broker that stays away this long fails the batch, and the process exits
            // with the outbox intact (it is resent on restart).
            .set("message.timeout.ms", "120000");
        let inner: FutureProducer = config.create().map_err(Error::Create)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a current-thread tokio runtime builds without I/O");
        Ok(Producer { inner, runtime })
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
            self.send_all(&batch, &mut acked)?;
        }
        Ok(acked)
    }

    fn send_all(&self, records: &[&OutRecord], acked: &mut Acked) -> Result<()> {
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
            pending.push((r, future));
        }
        self.runtime.block_on(async {
            for (r, future) in pending {
                let delivery = match future.await {
                    Ok(Ok(d)) => d,
                    Ok(Err((source, _))) => {
                        return Err(Error::Delivery {
                            topic: r.topic.clone(),
                            partition: r.partition,
                            source,
                        });
                    }
                    Err(_cancelled) => {
                        return Err(Error::Delivery {
                            topic: r.topic.clone(),
                            partition: r.partition,
                            source: rdkafka::error::KafkaError::Canceled,
                        });
                    }
                };
                let o = delivery.offset;
                acked
                    .spans
                    .entry((r.topic.clone(), delivery.partition))
                    .and_modify(|s| {
                        s.lowest = s.lowest.min(o);
                        s.highest = s.highest.max(o);
                        s.count += 1;
                    })
                    .or_insert(Span {
                        lowest: o,
                        highest: o,
                        count: 1,
                    });
            }
            Ok(())
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
