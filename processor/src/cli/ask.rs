//! What `airlock settle`, `airlock approve` and `airlock propose` share: publish one input
//! record keyed by its operation key, then wait for the owner's decision that replies to it.
//!
//! The answer's decisions partition is read from its start, so the fence markers there say
//! which owner's answer counts; the cost grows with that partition's retention. Every wait is
//! bounded, and running the same command again is safe: the record's id is derived from its
//! content, and an earlier answer that settled it is shown instead of publishing again
//! ([`Request::done`]).

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use airlock_schemas::{Codec, Decision, Record};
use anyhow::Context;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Headers;
use rdkafka::{Message, Offset, TopicPartitionList};
use sha2::{Digest, Sha256};

use crate::runtime::config::Config;
use crate::runtime::partitioner::partition_for;
use crate::runtime::produce::Producer;
use crate::runtime::schema_registry;
use crate::runtime::topics::Names;
use crate::runtime::wire::{Admit, FenceFilter, OutRecord};

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

/// Prints the answer: `<key> <VERDICT> <REASON>: <detail>`, after a line saying so when it
/// was an earlier one.
pub fn print_answer(
    out: &mut impl Write,
    request: &Request<'_>,
    answer: &Answer,
) -> std::io::Result<()> {
    if answer.earlier {
        writeln!(
            out,
            "{} was answered before; not published again",
            request.reply_to
        )?;
    }
    let d = &answer.decision;
    writeln!(
        out,
        "{} {} {}: {}",
        d.operation_key,
        d.verdict.as_str(),
        d.reason.as_str(),
        d.detail
    )
}

/// One request to the processor: an encoded input and the id its answer replies to.
#[derive(Debug)]
pub struct Request<'a> {
    /// The input topic (`names.control()`, `names.approvals()`).
    pub topic: String,
    /// The record's key; it names the partition unless `partition` does.
    pub operation_key: &'a str,
    /// The partition to publish to and read the answer from, for a record that names no
    /// operation key (a run's lease fence goes to every partition); `None`: the key's.
    pub partition: Option<i32>,
    pub payload: Vec<u8>,
    /// The id the decision's `in_reply_to` carries.
    pub reply_to: &'a str,
    /// Headers of the published record (a person's signature, [`person_signature`]).
    pub headers: Vec<(String, Vec<u8>)>,
    /// Whether an earlier reply to the same id (the same command run before) already is the
    /// answer, so the request is not published again: a settlement or an approval that was
    /// applied, any answer to a proposal (a resend of it is not answered at all). A command
    /// whose earlier run was refused (the proposal had not arrived, the effect was not
    /// settleable yet) publishes again and waits for the answer after it.
    pub done: fn(&Decision) -> bool,
    /// The decision ids that answer it: `p/<id>` and `r/<id>/<fingerprint>` for a proposal,
    /// `a/<id>` for an approval, `c/<id>` for a control. The dead-letter answer of the record
    /// published (`x/<topic>/<partition>/<offset>`) counts too, and so do the processor's own
    /// later answers about the intent (`e/...`). Another decision replying to the same id
    /// (another proposal reusing it, someone else's record dead-lettered) is not this
    /// request's answer.
    pub answer_ids: Vec<String>,
}

/// One command's exchange with the processor: its configuration and the codec of the answers,
/// resolved once (with a schema registry, resolving ids takes a request per subject), however
/// many records the command publishes and partitions it reads.
#[derive(Debug)]
pub struct Asker<'c> {
    config: &'c Config,
    codec: Codec,
}

impl<'c> Asker<'c> {
    /// # Errors
    ///
    /// The registry named by `schema_registry.url` unreachable or lacking a schema
    /// ([`schema_registry::reader_codec`]).
    pub fn new(config: &'c Config) -> anyhow::Result<Asker<'c>> {
        Ok(Asker {
            config,
            codec: schema_registry::reader_codec(config)?,
        })
    }

    /// `value` as the CLI publishes it: single-object encoded, or in the Confluent wire format
    /// with the registry's id when `schema_registry.framing` is `confluent`.
    ///
    /// # Errors
    ///
    /// The record over the payload limit.
    pub fn encode<T: Record>(&self, value: &T) -> anyhow::Result<Vec<u8>> {
        Ok(self
            .codec
            .encode(self.config.schema_registry.framing.framing(), value)?)
    }
}

/// The header that signs `person`'s record `payload` with the key in `key_file`
/// (`--signing-key`), or none without a key file. The processor checks it against the keys the
/// policy entities register for the person (`verifying_keys`).
pub fn person_signature(
    key_file: Option<&std::path::Path>,
    act: crate::capability::PersonAct,
    person: &str,
    payload: &[u8],
) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
    let Some(file) = key_file else {
        return Ok(Vec::new());
    };
    let key = crate::capability::load_signing_key(file)
        .with_context(|| format!("loading the signing key of {person}"))?;
    Ok(vec![(
        crate::runtime::wire::header::CAPABILITY.to_owned(),
        crate::capability::sign_person(&key, act, person, payload),
    )])
}

/// The processor's answer to a request.
#[derive(Debug)]
pub struct Answer {
    pub decision: Decision,
    /// Answered before this command ran (see [`Request::done`]); nothing was published.
    pub earlier: bool,
}

/// Publishes `request` and returns the owner's decision replying to it.
///
/// Where the answer partition ends now is its `end` (see `Answers`); the partition is read
/// from its start (the fence markers there say which owner's answers count) to there, then
/// the request is published (`published` runs once it is acknowledged) and the first reply
/// at or after the end is the answer. When the latest reply before the end is
/// [`Request::done`], that is the answer and nothing is published.
pub fn publish_and_await(
    asker: &Asker<'_>,
    role: &str,
    request: &Request<'_>,
    timeout: Duration,
    published: impl FnOnce() -> anyhow::Result<()>,
) -> anyhow::Result<Answer> {
    let deadline = Instant::now() + timeout;
    let partition = request.partition.unwrap_or_else(|| {
        partition_for(
            request.operation_key.as_bytes(),
            asker.config.topics.partitions,
        )
    });
    let answers = Answers::open(asker, role, partition)?;
    // Known once the request is placed.
    let dead_letter_id = std::cell::OnceCell::new();
    let wants = |d: &Decision| {
        d.in_reply_to == request.reply_to
            && (request.answer_ids.contains(&d.decision_id)
                || d.decision_id.starts_with("e/")
                || dead_letter_id.get() == Some(&d.decision_id))
    };
    let mut replies = answers.replies(request.reply_to, &wants);
    let end = answers.end;
    let partition = answers.partition;
    let producer = &answers.producer;
    let mut earlier = None;
    while replies.at < end {
        if let Some((offset, d)) = replies.next(deadline, timeout)?
            && offset < end
            && (request.done)(&d)
        {
            earlier = Some(d);
        }
    }
    if let Some(decision) = earlier {
        return Ok(Answer {
            decision,
            earlier: true,
        });
    }

    let offset = producer
        .send_phased(&[OutRecord {
            topic: request.topic.clone(),
            partition,
            key: Some(request.operation_key.as_bytes().to_vec()),
            value: Some(request.payload.clone()),
            headers: request.headers.clone(),
            phase: 0,
        }])
        .with_context(|| format!("producing to {} (is the broker up?)", request.topic))?
        .placed(&request.topic, partition)?;
    let _ = dead_letter_id.set(format!("x/{}/{partition}/{offset}", request.topic));
    published()?;
    loop {
        if let Some((offset, decision)) = replies.next(deadline, timeout)?
            && offset >= end
        {
            return Ok(Answer {
                decision,
                earlier: false,
            });
        }
    }
}

/// The decisions partition of one operation key, opened for reading from its start, and where
/// it ended when opened.
struct Answers {
    reader: BaseConsumer,
    producer: Producer,
    decisions: String,
    partition: i32,
    /// Where the partition's records started when opened (its log start).
    start: i64,
    /// The offset after its last record when opened: the high watermark on Kafka, which needs
    /// no write access to the topic; on tansu, whose watermark can stop short, one past a
    /// barrier record produced then (`compat::Broker::high_watermark_is_end`).
    end: i64,
    /// Each read starts from this filter: it verifies fence markers under the processors'
    /// keys when the configuration names them (`capability.verifying_key_files`).
    fence: FenceFilter,
    /// Reads decisions in either framing (`schema_registry`).
    codec: Codec,
}

impl Answers {
    /// The decisions partition `partition`.
    fn open(asker: &Asker<'_>, role: &str, partition: i32) -> anyhow::Result<Answers> {
        let config = asker.config;
        let names = Names::new(&config.topics.prefix);
        let decisions = names.decisions();
        let reader: BaseConsumer = config
            .client_config()
            .set("group.id", format!("{}{role}", config.topics.prefix))
            .set("enable.auto.commit", "false")
            .create()?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&decisions, partition, Offset::Beginning)?;
        reader.assign(&tpl)?;
        let producer =
            Producer::new(&config.client_config(), 0).context("creating the Kafka producer")?;
        let within = Duration::from_secs(30);
        let (start, high) =
            crate::runtime::scan::watermarks(&reader, &decisions, partition, within)
                .with_context(|| format!("reading where {decisions} ends (is the broker up?)"))?;
        let end = if config.kafka.compatibility.high_watermark_is_end() {
            high
        } else {
            producer
                .send_phased(&[OutRecord::barrier(&decisions, partition)])
                .with_context(|| format!("marking the end of {decisions} (is the broker up?)"))?
                .placed(&decisions, partition)?
                + 1
        };
        let keys = config
            .capability
            .processor_verifying_keys()
            .context("loading the processors' verifying keys (capability.verifying_key_files)")?;
        Ok(Answers {
            codec: asker.codec.clone(),
            fence: FenceFilter::verifying(keys),
            reader,
            producer,
            decisions,
            partition,
            start,
            end,
        })
    }

    /// A reader of the decisions `wants` accepts, from the partition's start; `what` names
    /// them in errors.
    fn replies<'a>(&'a self, what: &'a str, wants: &'a dyn Fn(&Decision) -> bool) -> Replies<'a> {
        Replies {
            reader: &self.reader,
            decisions: &self.decisions,
            partition: self.partition,
            what,
            wants,
            codec: self.codec.clone(),
            fence: self.fence.clone(),
            at: self.start,
        }
    }
}

/// The decision id of the latest PENDING_APPROVAL / APPROVAL_REQUIRED answer about
/// `operation_key` from its owner:
/// what names the round of approvals an approval is for, so that approving a retry (after the
/// first attempt failed with proof) is a new approval, not a repeat of the first one. `None`
/// when the key has no such answer.
pub fn latest_pending_approval(
    asker: &Asker<'_>,
    role: &str,
    operation_key: &str,
    timeout: Duration,
) -> anyhow::Result<Option<String>> {
    let deadline = Instant::now() + timeout;
    let partition = partition_for(operation_key.as_bytes(), asker.config.topics.partitions);
    let answers = Answers::open(asker, role, partition)?;
    // APPROVAL_REQUIRED opens a round; a proposal resent while it is open is answered
    // AWAITING_APPROVAL and opens none.
    let wants = |d: &Decision| {
        d.operation_key == operation_key
            && d.verdict == airlock_schemas::Verdict::PendingApproval
            && d.reason == airlock_schemas::Reason::ApprovalRequired
    };
    let what = format!("the pending approvals of {operation_key}");
    let mut replies = answers.replies(&what, &wants);
    let mut latest = None;
    while replies.at < answers.end {
        if let Some((offset, d)) = replies.next(deadline, timeout)?
            && offset < answers.end
        {
            latest = Some(d.decision_id);
        }
    }
    Ok(latest)
}

/// Reads one answer partition in order, fence-filtered, keeping the decisions it wants.
struct Replies<'a> {
    reader: &'a BaseConsumer,
    decisions: &'a str,
    partition: i32,
    /// What is awaited, for the error when it does not come.
    what: &'a str,
    wants: &'a dyn Fn(&Decision) -> bool,
    codec: Codec,
    fence: FenceFilter,
    /// The next offset to read.
    at: i64,
}

impl Replies<'_> {
    /// Polls once; the record read, if it is an admitted reply to the request.
    fn next(
        &mut self,
        deadline: Instant,
        timeout: Duration,
    ) -> anyhow::Result<Option<(i64, Decision)>> {
        anyhow::ensure!(
            Instant::now() < deadline,
            "no answer to {} on {} partition {} within {}s (is `airlock run` up?); running the \
             same command again is safe",
            self.what,
            self.decisions,
            self.partition,
            timeout.as_secs()
        );
        let Some(m) = self.reader.poll(Duration::from_millis(200)) else {
            return Ok(None);
        };
        let m = m.with_context(|| format!("reading {}", self.decisions))?;
        self.at = m.offset() + 1;
        let headers: Vec<(&str, &[u8])> = m
            .headers()
            .map(|h| {
                h.iter()
                    .filter_map(|h| h.value.map(|v| (h.key, v)))
                    .collect()
            })
            .unwrap_or_default();
        match self.fence.admit(self.decisions, self.partition, headers) {
            Admit::Accept => {}
            Admit::Forged(epoch) => {
                // The command's own diagnostics go to standard error (no logger here).
                eprintln!(
                    "warning: {} partition {} offset {}: a fence marker of owner epoch {epoch} \
                     not signed by a processor key (capability.verifying_key_files); ignored",
                    self.decisions,
                    self.partition,
                    m.offset()
                );
                return Ok(None);
            }
            Admit::Marker(_) | Admit::Fenced { .. } => return Ok(None),
        }
        let Some(Ok(d)) = m.payload().map(|p| self.codec.decode_as::<Decision>(p)) else {
            return Ok(None);
        };
        Ok((self.wants)(&d).then_some((m.offset(), d)))
    }
}

/// The id `airlock propose` and the clients give a proposal that names none, derived from
/// its content so that sending it again is a resend: [`content_id`] `"propose"` over the
/// operation key, tool, tool version, arguments hash, tenant, principal, run id and logical
/// call id, under the tenant's prefix (`acme/propose/…`) when the operation key has it, as
/// `processor.key_scope = "tenant"` asks of every id of a tenant.
pub fn proposal_id(p: &airlock_schemas::ToolProposal) -> String {
    let id = content_id(
        "propose",
        &[
            &p.operation_key,
            &p.tool,
            &p.tool_version,
            p.arguments_hash.as_deref().unwrap_or_default(),
            &p.tenant_id,
            &p.principal_id,
            &p.run_id,
            &p.logical_call_id,
        ],
    );
    let scoped = !p.tenant_id.is_empty()
        && p.operation_key
            .strip_prefix(p.tenant_id.as_str())
            .is_some_and(|rest| rest.starts_with('/'));
    if scoped {
        format!("{}/{id}", p.tenant_id)
    } else {
        id
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
