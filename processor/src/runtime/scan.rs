//! Reading an output topic's partition from one offset to another, as an auditor does: every
//! record classified by the owner-epoch fence (DESIGN.md section 5, fence 1) before the caller
//! sees it, barriers skipped, every wait bounded.
//!
//! Used by `airlock replay`, `airlock audit` and the what-if evaluation. Where a scan ends:
//! - by default, at a barrier record written now ([`Scanner::barrier_ends`]): its
//!   acknowledged offset is the true end of the partition on any broker (see `compat`).
//!   Barriers carry owner epoch 0 and every consumer skips them.
//! - read-only (no write permission): at the high watermark when the scan starts. On Kafka
//!   that is the end (a closed bound; processors writing meanwhile are not followed); on a
//!   broker whose watermark lags its last batch (`compat`) the scan reads on as long as the
//!   broker delivers records (an open end), stopping at the first quiet poll.

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::message::{BorrowedHeaders, Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

use super::wire::{self, Admit, FenceFilter};

/// Errors of a scan; each names the topic and partition.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{topic}/{partition}: kafka: {source}")]
    Kafka {
        topic: String,
        partition: i32,
        #[source]
        source: rdkafka::error::KafkaError,
    },
    #[error(
        "{topic}/{partition}: no record for {stalled:?} at offset {at} of {until}; is the broker up?"
    )]
    Stalled {
        topic: String,
        partition: i32,
        at: i64,
        until: i64,
        stalled: Duration,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// One record of the scanned partition, with the fence's verdict on it.
pub struct Scanned<'a> {
    pub offset: i64,
    pub admit: Admit,
    /// The `airlock-kind` header, when present.
    pub kind: Option<&'a [u8]>,
    /// All of the record's headers, for a reader that checks them itself.
    pub headers: Option<&'a BorrowedHeaders>,
    pub key: Option<&'a [u8]>,
    pub payload: Option<&'a [u8]>,
}

impl std::fmt::Debug for Scanned<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scanned")
            .field("offset", &self.offset)
            .field("admit", &self.admit)
            .field("kind", &self.kind)
            .field("headers", &self.headers.map_or(0, |h| h.count()))
            .field("key", &self.key)
            .field("payload", &self.payload.map(<[u8]>::len))
            .finish()
    }
}

/// The offsets a scan covers: `[low, high)` of the partition, cut at `until` when given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    pub low: i64,
    pub high: i64,
    /// No `until` cut: records past `high` that the broker delivers are read too.
    pub open: bool,
}

/// A read-only reader of output partitions.
pub struct Scanner<'c> {
    pub consumer: &'c BaseConsumer,
    /// How long a scan waits for the next record before it gives up.
    pub stall_timeout: Duration,
}

/// True for a consumer error librdkafka recovers from by itself (a broker gone, a leader
/// moving, a coordinator loading): a reader logs it and polls on, its stall timeout still
/// bounding the wait (past it, the last error ends the read). librdkafka's fatal errors end a
/// read at once, and so do refusals that waiting does not mend (an ACL or authentication
/// missing, a record over the broker's limit): a claim stops on them with the broker's word
/// instead of rejoining forever.
pub fn transient(e: &KafkaError) -> bool {
    use RDKafkaErrorCode::*;
    !matches!(e, KafkaError::MessageConsumptionFatal(_))
        && !matches!(
            e.rdkafka_error_code(),
            Some(
                Fatal
                    | TopicAuthorizationFailed
                    | GroupAuthorizationFailed
                    | ClusterAuthorizationFailed
                    | SaslAuthenticationFailed
                    | Authentication
                    | MessageSizeTooLarge
            )
        )
}

/// `fetch_watermarks` of `topic`'s `partition`, asked again on errors until `within` has
/// passed: while a leader moves or a broker restarts, the request fails for a few seconds.
///
/// Before each new try the topic's metadata is fetched afresh. librdkafka answers a
/// watermark query from its metadata cache, and treats a cached topic that lacks the
/// partition as a permanent "Unknown partition" without asking the cluster again; a broker
/// that restarts can leave such an entry behind, and a client that only queries watermarks
/// (no subscription refreshes the topic) would then fail until the entry ages out, minutes
/// later.
pub fn watermarks<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
    partition: i32,
    within: Duration,
) -> KafkaResult<(i64, i64)> {
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match consumer.fetch_watermarks(topic, partition, left.min(Duration::from_secs(10))) {
            Ok(marks) => return Ok(marks),
            Err(e) if transient(&e) && Instant::now() + RETRY_PAUSE < deadline => {
                log::warn!("{topic}/{partition}: asking the watermarks again: {e}");
                std::thread::sleep(RETRY_PAUSE);
                let left = deadline.saturating_duration_since(Instant::now());
                if let Err(e) = consumer.fetch_metadata(Some(topic), left.min(RETRY_PAUSE * 10)) {
                    log::warn!("{topic}: refreshing the metadata: {e}");
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// The pause between two tries of a request that failed transiently.
const RETRY_PAUSE: Duration = Duration::from_millis(500);

impl std::fmt::Debug for Scanner<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scanner")
            .field("stall_timeout", &self.stall_timeout)
            .finish_non_exhaustive()
    }
}

impl Scanner<'_> {
    /// Where `topic`'s `partition` starts and ends now, the end cut at `until` (exclusive).
    pub fn bounds(&self, topic: &str, partition: i32, until: Option<i64>) -> Result<Bounds> {
        let (low, high) =
            watermarks(self.consumer, topic, partition, self.stall_timeout).map_err(|source| {
                Error::Kafka {
                    topic: topic.to_owned(),
                    partition,
                    source,
                }
            })?;
        Ok(Bounds {
            low,
            high: until.map_or(high, |u| u.min(high)),
            open: until.is_none_or(|u| u >= high),
        })
    }

    /// The true end of each `(topic, partition)`: the offset of a barrier record written there
    /// now (see the module documentation), each cut at `until`.
    pub fn barrier_ends(
        &self,
        client: &rdkafka::ClientConfig,
        partitions: &[(String, i32)],
        until: Option<i64>,
    ) -> std::result::Result<Vec<Bounds>, super::produce::Error> {
        let barriers: Vec<wire::OutRecord> = partitions
            .iter()
            .map(|(t, p)| wire::OutRecord::barrier(t, *p))
            .collect();
        let acked = super::produce::Producer::new(client, 0)?.send_phased(&barriers)?;
        let mut out = Vec::with_capacity(partitions.len());
        for (t, p) in partitions {
            let end = acked.placed(t, *p)?;
            let low =
                watermarks(self.consumer, t, *p, self.stall_timeout).map_or(0, |(low, _)| low);
            out.push(Bounds {
                low,
                high: until.map_or(end, |u| u.min(end)),
                open: false,
            });
        }
        Ok(out)
    }

    /// Reads `bounds` of `topic`'s `partition` in offset order, classifying each record with a
    /// fresh fence filter: `visit` sees every record but barriers, fence markers included.
    pub fn scan<E: From<Error>>(
        &self,
        topic: &str,
        partition: i32,
        bounds: Bounds,
        mut visit: impl FnMut(Scanned<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        if bounds.low >= bounds.high && !bounds.open {
            return Ok(());
        }
        let kafka = |source| Error::Kafka {
            topic: topic.to_owned(),
            partition,
            source,
        };
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, partition, Offset::Offset(bounds.low))
            .map_err(kafka)?;
        self.consumer.assign(&tpl).map_err(kafka)?;
        let mut filter = FenceFilter::default();
        let mut at = bounds.low;
        let mut progress = Instant::now();
        let result = (|| {
            loop {
                let past_end = at >= bounds.high;
                if past_end && !bounds.open {
                    break;
                }
                let Some(message) = self.consumer.poll(Duration::from_millis(200)) else {
                    if past_end {
                        break; // nothing more after the reported end
                    }
                    if progress.elapsed() > self.stall_timeout {
                        return Err(E::from(Error::Stalled {
                            topic: topic.to_owned(),
                            partition,
                            at,
                            until: bounds.high,
                            stalled: progress.elapsed(),
                        }));
                    }
                    continue;
                };
                let message = match message {
                    Ok(m) => m,
                    Err(e) if transient(&e) && progress.elapsed() <= self.stall_timeout => {
                        log::warn!("{topic}/{partition}: reading on after: {e}");
                        continue;
                    }
                    Err(e) => return Err(E::from(kafka(e))),
                };
                progress = Instant::now();
                let offset = message.offset();
                at = offset + 1;
                if offset >= bounds.high && !bounds.open {
                    break;
                }
                let headers = message.headers();
                let pairs = headers
                    .into_iter()
                    .flat_map(|h| h.iter())
                    .map(|h| (h.key, h.value.unwrap_or_default()));
                let kind = headers.and_then(|h| {
                    h.iter()
                        .find(|h| h.key == wire::header::KIND)
                        .and_then(|h| h.value)
                });
                if kind == Some(wire::BARRIER_KIND.as_bytes()) {
                    continue;
                }
                let admit = filter.admit(topic, partition, pairs);
                visit(Scanned {
                    offset,
                    admit,
                    kind,
                    headers,
                    key: message.key(),
                    payload: message.payload(),
                })?;
            }
            Ok(())
        })();
        self.consumer.unassign().map_err(kafka)?;
        result
    }
}
