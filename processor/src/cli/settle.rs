//! `airlock settle <operation-key> --committed|--failed --evidence TEXT --operator ID`: an
//! operator closes an effect that reconciliation could not prove either way (OPERATOR_REQUIRED,
//! or still UNKNOWN). The settlement is a Control record on the control topic, decided by the
//! partition's owner like any input and journaled with the operator as the principal; the
//! command waits for the owner's answer and exits non-zero unless the effect was settled.
//!
//! The control id is derived from the key, the outcome, the operator and the evidence, so
//! running the same command twice (a lost terminal, a retry) publishes the same settlement,
//! which the processor answers once.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use airlock_schemas::{Codec, Control, ControlKind, Decision, Reason};
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

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The operation key of the effect to settle.
    pub operation_key: String,
    /// The effect happened (proof in --evidence).
    #[arg(long, conflicts_with = "failed", required_unless_present = "failed")]
    pub committed: bool,
    /// The effect did not happen (proof in --evidence); the intent may be retried.
    #[arg(long)]
    pub failed: bool,
    /// What proves it (a statement line, a ticket); kept in the journal.
    #[arg(long)]
    pub evidence: String,
    /// The operator's principal id, recorded as the settlement's principal.
    #[arg(long, env = "AIRLOCK_OPERATOR")]
    pub operator: String,
    /// The processor's configuration file (brokers, topic prefix, partitions).
    #[arg(long, short, env = "AIRLOCK_CONFIG")]
    pub config: Option<PathBuf>,
    /// How long to wait for the processor's answer.
    #[arg(long, default_value_t = 60)]
    pub timeout_seconds: u64,
}

pub fn run(args: &Args, out: &mut impl Write) -> anyhow::Result<()> {
    let config = Config::load(args.config.as_deref()).context("loading the configuration")?;
    let names = Names::new(&config.topics.prefix);
    let kind = if args.committed {
        ControlKind::SettleCommitted
    } else {
        ControlKind::SettleFailed
    };
    let control_id = control_id(&args.operation_key, kind, &args.operator, &args.evidence);
    let partition = partition_for(args.operation_key.as_bytes(), config.topics.partitions);

    // The answer's partition is read from its start: the fence markers there say which
    // owner's answer counts.
    let decisions = names.decisions();
    let reader: BaseConsumer = config
        .client_config()
        .set("group.id", format!("{}settle", config.topics.prefix))
        .set("enable.auto.commit", "false")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&decisions, partition, Offset::Beginning)?;
    reader.assign(&tpl)?;

    let codec = Codec::new();
    let control = Control {
        control_id: control_id.clone(),
        kind,
        operation_key: Some(args.operation_key.clone()),
        run_id: None,
        lease_fence: None,
        operator_id: args.operator.clone(),
        evidence: Some(args.evidence.clone()),
        issued_at: SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis() as i64,
    };
    let producer: ThreadedProducer<DefaultProducerContext> = config
        .client_config()
        .set("partitioner", LIBRDKAFKA_PARTITIONER)
        .set("enable.idempotence", "true")
        .create()?;
    let payload = codec.encode_single_object(&control)?;
    producer
        .send(
            BaseRecord::<str, [u8]>::to(&names.control())
                .key(&args.operation_key)
                .payload(&payload),
        )
        .map_err(|(e, _)| anyhow::anyhow!("producing to {}: {e}", names.control()))?;
    producer
        .flush(Duration::from_secs(30))
        .with_context(|| format!("producing to {} (is the broker up?)", names.control()))?;
    writeln!(
        out,
        "published {} for {} as {control_id}; waiting for the processor",
        kind.as_str(),
        args.operation_key
    )?;

    let deadline = Instant::now() + Duration::from_secs(args.timeout_seconds);
    let mut fence = FenceFilter::default();
    let answer = loop {
        anyhow::ensure!(
            Instant::now() < deadline,
            "no answer to {control_id} on {decisions} partition {partition} within {}s (is \
             `airlock run` up?); running the same command again is safe",
            args.timeout_seconds
        );
        let Some(m) = reader.poll(Duration::from_millis(200)) else {
            continue;
        };
        let m = m?;
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
        if d.in_reply_to == control_id {
            break d;
        }
    };
    writeln!(
        out,
        "{} {} {}: {}",
        answer.operation_key,
        answer.verdict.as_str(),
        answer.reason.as_str(),
        answer.detail
    )?;
    anyhow::ensure!(
        answer.reason == Reason::OperatorSettled,
        "the processor did not settle {}: {}",
        args.operation_key,
        answer.reason.as_str()
    );
    Ok(())
}

/// The settlement's id: the same command gives the same id, so a repeat is one settlement.
fn control_id(key: &str, kind: ControlKind, operator: &str, evidence: &str) -> String {
    let mut h = Sha256::new();
    for part in [key, kind.as_str(), operator, evidence] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    format!("settle/{}", &hex::encode(h.finalize())[..32])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_settlement_has_the_same_id() {
        let a = control_id("refund:1", ControlKind::SettleCommitted, "olga", "stmt 4");
        assert_eq!(
            a,
            control_id("refund:1", ControlKind::SettleCommitted, "olga", "stmt 4")
        );
        assert_ne!(
            a,
            control_id("refund:1", ControlKind::SettleFailed, "olga", "stmt 4")
        );
        // Length-prefixed: moving a boundary changes the id.
        assert_ne!(
            control_id("ab", ControlKind::SettleFailed, "c", "d"),
            control_id("a", ControlKind::SettleFailed, "bc", "d")
        );
    }
}
