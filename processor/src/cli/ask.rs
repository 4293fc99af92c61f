//! What `airlock settle` and `airlock approve` share: publish one input record keyed by its
//! operation key, then wait for the owner's decision that replies to it.
//!
//! The answer's decisions partition is read from its start, so the fence markers there say
//! which owner's answer counts; the cost grows with that partition's retention. Every wait is
//! bounded, and publishing the same record again is safe (its id is derived from its content,
//! and the processor answers a repeated id from its state).

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use airlock_schemas::{Codec, Decision};
use anyhow::Context;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Headers;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer as _, ThreadedProducer};
use rdkafka::{Message, Offset, TopicPartitionList};
use sha2::{Digest, Sha256};

use crate::runtime::config::Config;
use crate::runtime::partitioner::{LIBRDKAFKA_PARTITIONER, partition_for};
use crate::runtime::topics::Names;
use crate::runtime::wire::{Admit, FenceFilter};

/// The options every publish-and-await command has.
#[derive(Debug, clap::Args)]
pub struct Common {
    /// The processor's configuration file (brokers, topic prefix, partitions).
    #[arg(long, short, env = "AIRLOCK_CONFIG")]
    pub config: Option<PathBuf>,
    /// How long to wait for the processor's answer.
    #[arg(long, default_value_t = 60)]
    pub timeout_seconds: u64,
}

impl Common {
    pub fn load(&self) -> anyhow::Result<Config> {
        Config::load(self.config.as_deref()).context("loading the configuration")
    }

    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_seconds)
    }
}

/// Prints the answer: `<key> <VERDICT> <REASON>: <detail>`.
pub fn print_answer(out: &mut impl Write, answer: &Decision) -> std::io::Result<()> {
    writeln!(
        out,
        "{} {} {}: {}",
        answer.operation_key,
        answer.verdict.as_str(),
        answer.reason.as_str(),
        answer.detail
    )
}

/// One request to the processor: an encoded input and the id its answer replies to.
#[derive(Debug)]
pub struct Request<'a> {
    /// The input topic (`names.control()`, `names.approvals()`).
    pub topic: String,
    pub operation_key: &'a str,
    pub payload: Vec<u8>,
    /// The id the decision's `in_reply_to` carries.
    pub reply_to: &'a str,
}

/// Reads the answer partition, publishes `request`, and returns the decision replying to it.
/// `published` runs once the record is acknowledged (to tell the user what is awaited).
pub fn publish_and_await(
    config: &Config,
    role: &str,
    request: &Request<'_>,
    timeout: Duration,
    published: impl FnOnce() -> anyhow::Result<()>,
) -> anyhow::Result<Decision> {
    let names = Names::new(&config.topics.prefix);
    let partition = partition_for(request.operation_key.as_bytes(), config.topics.partitions);
    let decisions = names.decisions();
    // Assigned before publishing, from the start: nothing the answer could be is missed.
    let reader: BaseConsumer = config
        .client_config()
        .set("group.id", format!("{}{role}", config.topics.prefix))
        .set("enable.auto.commit", "false")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&decisions, partition, Offset::Beginning)?;
    reader.assign(&tpl)?;

    let producer: ThreadedProducer<DefaultProducerContext> = config
        .client_config()
        .set("partitioner", LIBRDKAFKA_PARTITIONER)
        .set("enable.idempotence", "true")
        .create()?;
    producer
        .send(
            BaseRecord::<str, [u8]>::to(&request.topic)
                .key(request.operation_key)
                .payload(&request.payload),
        )
        .map_err(|(e, _)| anyhow::anyhow!("producing to {}: {e}", request.topic))?;
    producer
        .flush(Duration::from_secs(30))
        .with_context(|| format!("producing to {} (is the broker up?)", request.topic))?;
    published()?;

    let codec = Codec::new();
    let deadline = Instant::now() + timeout;
    let mut fence = FenceFilter::default();
    loop {
        anyhow::ensure!(
            Instant::now() < deadline,
            "no answer to {} on {decisions} partition {partition} within {}s (is `airlock run` \
             up?); running the same command again is safe",
            request.reply_to,
            timeout.as_secs()
        );
        let Some(m) = reader.poll(Duration::from_millis(200)) else {
            continue;
        };
        let m = m.with_context(|| format!("reading {decisions}"))?;
        let headers: Vec<(&str, &[u8])> = m
            .headers()
            .map(|h| {
                h.iter()
                    .filter_map(|h| h.value.map(|v| (h.key, v)))
                    .collect()
            })
            .unwrap_or_default();
        if fence.admit(&decisions, partition, headers) != Admit::Accept {
            continue;
        }
        let Some(Ok(d)) = m.payload().map(|p| codec.decode_as::<Decision>(p)) else {
            continue;
        };
        if d.in_reply_to == request.reply_to {
            return Ok(d);
        }
    }
}

/// An id derived from `parts` (length-prefixed, so moving a boundary changes it): the same
/// command gives the same id, so a repeat is the same request.
pub fn content_id(namespace: &str, parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for part in parts {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    format!("{namespace}/{}", &hex::encode(h.finalize())[..32])
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> anyhow::Result<i64> {
    Ok(std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_ids_are_stable_and_length_prefixed() {
        let a = content_id(
            "settle",
            &["refund:1", "SETTLE_COMMITTED", "olga", "stmt 4"],
        );
        assert_eq!(
            a,
            content_id(
                "settle",
                &["refund:1", "SETTLE_COMMITTED", "olga", "stmt 4"]
            )
        );
        assert!(
            a.starts_with("settle/") && a.len() == "settle/".len() + 32,
            "{a}"
        );
        assert_ne!(
            a,
            content_id("settle", &["refund:1", "SETTLE_FAILED", "olga", "stmt 4"])
        );
        assert_ne!(
            content_id("settle", &["ab", "c"]),
            content_id("settle", &["a", "bc"])
        );
        assert_ne!(
            a,
            content_id(
                "approve",
                &["refund:1", "SETTLE_COMMITTED", "olga", "stmt 4"]
            )
        );
    }
}
