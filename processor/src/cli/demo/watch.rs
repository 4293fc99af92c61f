//! The demo's agents and its view of Airlock, both over Kafka: it publishes proposals,
//! approvals and a malformed record, and reads back, from where the topics ended when the demo
//! started, the decisions, the journal, the dispatch topic of the ledger connector and the dead
//! letters of the demo's operation keys, with the owner-epoch fence applied (records of a
//! fenced-off owner are dropped, as every consumer must). New decisions are printed as they
//! arrive: that is the demo's progress.
//!
//! Every wait is bounded and says what it waited for when it gives up; Ctrl-C (the flag set by
//! the signal watcher) ends any wait at once.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use airlock_schemas::{
    Approval, Codec, Decision, DispatchCommand, JournalEvent, ReconcileCommand, ToolProposal,
};
use anyhow::Context;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, OwnedMessage};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer as _, ThreadedProducer};
use rdkafka::{Message, Offset, TopicPartitionList};

use crate::runtime::config::Config;
use crate::runtime::partitioner::LIBRDKAFKA_PARTITIONER;
use crate::runtime::scan;
use crate::runtime::topics::Names;
use crate::runtime::wire::{Admit, FenceFilter, header};

/// Everything read about one operation key, in the order of its partition.
#[derive(Clone, Debug, Default)]
pub struct History {
    pub decisions: Vec<Decision>,
    pub journal: Vec<JournalEvent>,
    /// Attempt epochs of the dispatch commands issued: the attempts.
    pub dispatched: BTreeSet<i64>,
    /// Reconciliation rounds requested.
    pub reconcile_rounds: BTreeSet<i32>,
    /// The `airlock-dlq-reason` of each dead letter.
    pub dead_letters: Vec<String>,
}

pub struct Watch {
    pub names: Names,
    pub partitions: i32,
    dispatch: String,
    producer: ThreadedProducer<DefaultProducerContext>,
    reader: BaseConsumer,
    codec: Codec,
    fence: FenceFilter,
    /// The demo's operation keys and the scenario each belongs to (for progress lines).
    labels: HashMap<String, String>,
    /// What each input (proposal or approval id) is, for the report: "blind retry", ...
    inputs: HashMap<String, String>,
    keys: HashMap<String, History>,
    /// Identities (topic, `airlock-id`) already taken: outputs can repeat, never go missing.
    seen: HashSet<(String, String)>,
    /// Decision partitions on which an owner's fence marker was read: claimed by a processor.
    pub claimed: BTreeSet<i32>,
    /// Records dropped because their owner was fenced off.
    pub fenced: u64,
    interrupted: Arc<AtomicBool>,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch")
            .field("keys", &self.keys.len())
            .finish_non_exhaustive()
    }
}

impl Watch {
    /// Connects and positions the reader at the current end of every topic it reads.
    pub fn new(
        config: &Config,
        connector: &str,
        interrupted: Arc<AtomicBool>,
    ) -> anyhow::Result<Watch> {
        let names = Names::new(&config.topics.prefix);
        let dispatch = names.dispatch(connector);
        let producer: ThreadedProducer<DefaultProducerContext> = config
            .client_config()
            .set("partitioner", LIBRDKAFKA_PARTITIONER)
            .set("enable.idempotence", "true")
            .create()?;
        let reader: BaseConsumer = config
            .client_config()
            .set("group.id", format!("{}demo", config.topics.prefix))
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "false")
            .set("fetch.wait.max.ms", "50")
            .create()?;
        let mut tpl = TopicPartitionList::new();
        for topic in [
            names.decisions(),
            names.journal(),
            names.dlq(),
            dispatch.clone(),
        ] {
            for p in 0..config.topics.partitions {
                // Asked again while a just-created topic's leaders are still being elected.
                let (_, high) = scan::watermarks(&reader, &topic, p, Duration::from_secs(30))
                    .with_context(|| format!("reading the end of {topic} (is the broker up?)"))?;
                tpl.add_partition_offset(&topic, p, Offset::Offset(high))?;
            }
        }
        reader.assign(&tpl)?;
        Ok(Watch {
            names,
            partitions: config.topics.partitions,
            dispatch,
            producer,
            reader,
            codec: crate::runtime::schema_registry::reader_codec(config)?,
            fence: FenceFilter::default(),
            labels: HashMap::new(),
            inputs: HashMap::new(),
            keys: HashMap::new(),
            seen: HashSet::new(),
            claimed: BTreeSet::new(),
            fenced: 0,
            interrupted,
        })
    }

    /// Follows `key` from now on, as part of scenario `label`.
    pub fn track(&mut self, key: &str, label: &str) {
        self.labels.insert(key.to_owned(), label.to_owned());
        self.keys.entry(key.to_owned()).or_default();
    }

    /// Names input `id` in progress lines and the report.
    pub fn name_input(&mut self, id: &str, what: &str) {
        self.inputs.insert(id.to_owned(), what.to_owned());
    }

    pub fn input_name(&self, id: &str) -> Option<&str> {
        self.inputs.get(id).map(String::as_str)
    }

    pub fn history(&self, key: &str) -> History {
        self.keys.get(key).cloned().unwrap_or_default()
    }

    /// The first decision replying to input `id`.
    pub fn reply(&self, id: &str) -> Option<Decision> {
        self.keys
            .values()
            .flat_map(|h| &h.decisions)
            .find(|d| d.in_reply_to == id)
            .cloned()
    }

    /// The first decision about `key` that satisfies `pred`.
    pub fn decision(&self, key: &str, pred: impl Fn(&Decision) -> bool) -> Option<Decision> {
        self.keys
            .get(key)
            .and_then(|h| h.decisions.iter().find(|d| pred(d)).cloned())
    }

    pub fn propose(&self, p: &ToolProposal) -> anyhow::Result<()> {
        let payload = self.codec.encode_single_object(p)?;
        self.send(&self.names.proposals(), &p.operation_key, &payload)
    }

    /// Publishes approval `a`, signed by its approver with `key`.
    pub fn approve(&self, a: &Approval, key: &crate::capability::SigningKey) -> anyhow::Result<()> {
        let payload = self.codec.encode_single_object(a)?;
        let signature = crate::capability::sign_person(
            key,
            crate::capability::PersonAct::Approval,
            &a.approver_id,
            &payload,
        );
        let topic = self.names.approvals();
        self.producer
            .send(
                BaseRecord::<str, [u8]>::to(&topic)
                    .key(&a.operation_key)
                    .payload(&payload)
                    .headers(rdkafka::message::OwnedHeaders::new().insert(
                        rdkafka::message::Header {
                            key: header::CAPABILITY,
                            value: Some(&signature),
                        },
                    )),
            )
            .map_err(|(e, _)| anyhow::anyhow!("producing to {topic}: {e}"))?;
        self.producer
            .flush(Duration::from_secs(10))
            .with_context(|| format!("producing to {topic} (is the broker up?)"))?;
        Ok(())
    }

    /// Produces raw bytes (a record that is not Avro at all) and waits for the broker's ack.
    pub fn send(&self, topic: &str, key: &str, payload: &[u8]) -> anyhow::Result<()> {
        self.producer
            .send(BaseRecord::<str, [u8]>::to(topic).key(key).payload(payload))
            .map_err(|(e, _)| anyhow::anyhow!("producing to {topic}: {e}"))?;
        self.producer
            .flush(Duration::from_secs(10))
            .with_context(|| format!("producing to {topic} (is the broker up?)"))?;
        Ok(())
    }

    /// Reads until `found` answers something, printing new decisions; gives up after `within`
    /// with a message naming `what`, or at once on Ctrl-C.
    pub fn wait_for<T>(
        &mut self,
        out: &mut dyn Write,
        what: &str,
        within: Duration,
        mut found: impl FnMut(&Watch) -> anyhow::Result<Option<T>>,
    ) -> anyhow::Result<T> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(t) = found(self)? {
                return Ok(t);
            }
            anyhow::ensure!(
                !self.interrupted.load(Ordering::Relaxed),
                "interrupted while waiting for {what}"
            );
            anyhow::ensure!(
                Instant::now() < deadline,
                "gave up waiting for {what} after {} s",
                within.as_secs()
            );
            self.pump(out, Duration::from_millis(100))?;
        }
    }

    /// Takes what arrives within `period`.
    fn pump(&mut self, out: &mut dyn Write, period: Duration) -> anyhow::Result<()> {
        let until = Instant::now() + period;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            let Some(polled) = self.reader.poll(left) else {
                return Ok(());
            };
            match polled.map(|m| m.detach()) {
                Ok(m) => self.take(&m, out)?,
                Err(e) => log::warn!("reading Airlock's topics: {e}"),
            }
            if left.is_zero() {
                return Ok(());
            }
        }
    }

    fn take(&mut self, m: &OwnedMessage, out: &mut dyn Write) -> anyhow::Result<()> {
        let topic = m.topic().to_owned();
        let headers: Vec<(&str, &[u8])> = m
            .headers()
            .map(|hs| {
                hs.iter()
                    .filter_map(|h| h.value.map(|v| (h.key, v)))
                    .collect()
            })
            .unwrap_or_default();
        let text = |name: &str| {
            headers
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
        };
        let (kind, id, reason) = (
            text(header::KIND),
            text(header::ID),
            text(header::DLQ_REASON),
        );
        match self
            .fence
            .admit(&topic, m.partition(), headers.iter().copied())
        {
            Admit::Marker(_) => {
                if topic == self.names.decisions() {
                    self.claimed.insert(m.partition());
                }
                return Ok(());
            }
            Admit::Fenced { .. } => {
                self.fenced += 1;
                return Ok(());
            }
            // The demo's reader verifies no signatures: never returned.
            Admit::Forged(_) => return Ok(()),
            Admit::Accept => {}
        }
        if let Some(id) = &id
            && !self.seen.insert((topic.clone(), id.clone()))
        {
            return Ok(()); // a resend of an output already taken
        }
        let payload = m.payload().unwrap_or_default();
        if topic == self.names.dlq() {
            let key = m.key().map(String::from_utf8_lossy).unwrap_or_default();
            if let Some(h) = self.keys.get_mut(key.as_ref()) {
                h.dead_letters.push(reason.unwrap_or_default());
            }
        } else if topic == self.names.decisions() {
            let Ok(d) = self.codec.decode_as::<Decision>(payload) else {
                return Ok(());
            };
            if self.keys.contains_key(&d.operation_key) {
                self.progress(&d, out)?;
                self.keys
                    .entry(d.operation_key.clone())
                    .or_default()
                    .decisions
                    .push(d);
            }
        } else if topic == self.names.journal() {
            let Ok(e) = self.codec.decode_as::<JournalEvent>(payload) else {
                return Ok(());
            };
            if let Some(h) = e.operation_key.as_ref().and_then(|k| self.keys.get_mut(k)) {
                h.journal.push(e);
            }
        } else if topic == self.dispatch {
            if kind.as_deref() == Some("reconcile") {
                if let Ok(c) = self.codec.decode_as::<ReconcileCommand>(payload)
                    && let Some(h) = self.keys.get_mut(&c.operation_key)
                {
                    h.reconcile_rounds.insert(c.round);
                }
            } else if let Ok(c) = self.codec.decode_as::<DispatchCommand>(payload)
                && let Some(h) = self.keys.get_mut(&c.operation_key)
            {
                h.dispatched.insert(c.epoch);
            }
        }
        Ok(())
    }

    fn progress(&self, d: &Decision, out: &mut dyn Write) -> anyhow::Result<()> {
        let label = self.labels.get(&d.operation_key).map_or("", String::as_str);
        let input = self
            .inputs
            .get(&d.in_reply_to)
            .map_or(String::new(), |w| format!(" ({w})"));
        let detail: String = d.detail.chars().take(90).collect();
        writeln!(
            out,
            "    {label:<20} {:<16} {:<20}{input}  {detail}",
            d.verdict.as_str(),
            d.reason.as_str(),
        )?;
        Ok(())
    }
}
