//! `airlock fleet`: a small demo agent fleet. It publishes the seed workshop's proposals to a
//! running processor (a refund, a producer resend, a blind retry, a changed amount under the same
//! key, a refund that needs approval and is approved, one that policy denies, a stale lease
//! fence, a malformed record), prints each decision as it arrives and ends with a report that
//! compares every scenario with what it should get. Exits non-zero when one differs.
//!
//! With a connector worker running (as `deploy/dev/demo.sh` does), the dispatched effects are
//! executed and their COMMITTED decisions are printed too.

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use airlock_schemas::{ApprovalVerdict, Codec, Decision, Reason, ToolProposal, Verdict};
use anyhow::Context;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer as _, ThreadedProducer};
use rdkafka::{Message, Offset, TopicPartitionList};

use crate::runtime::config::Config;
use crate::runtime::partitioner::{LIBRDKAFKA_PARTITIONER, partition_for};
use crate::runtime::topics::Names;
use crate::sample;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The processor's configuration file (brokers, topic prefix, partitions).
    #[arg(long, short, env = "AIRLOCK_CONFIG")]
    pub config: Option<PathBuf>,
    /// How long to wait for all decisions.
    #[arg(long, default_value_t = 60)]
    pub timeout_seconds: u64,
}

struct Scenario {
    name: &'static str,
    /// The input id the expected decision replies to, or the decision's own id.
    reply_to: String,
    expect: (Verdict, Reason),
    /// An answer as right as `expect` when the timing differs (a connector may have settled
    /// the first attempt before the retry is decided).
    or: Option<(Verdict, Reason)>,
}

struct Fleet {
    names: Names,
    producer: ThreadedProducer<DefaultProducerContext>,
    reader: BaseConsumer,
    codec: Codec,
    /// Every decision read, by decision id.
    decisions: HashMap<String, Decision>,
    /// The first decision replying to each input id.
    seen: HashMap<String, Decision>,
}

impl Fleet {
    fn send(&self, topic: &str, key: &str, payload: &[u8]) -> anyhow::Result<()> {
        self.producer
            .send(BaseRecord::<str, [u8]>::to(topic).key(key).payload(payload))
            .map_err(|(e, _)| anyhow::anyhow!("producing to {topic}: {e}"))?;
        self.producer.flush(Duration::from_secs(10))?;
        Ok(())
    }

    fn propose(&self, p: &ToolProposal) -> anyhow::Result<()> {
        let payload = self.codec.encode_single_object(p)?;
        self.send(&self.names.proposals(), &p.operation_key, &payload)
    }

    /// Reads decisions until one satisfies `pred` (or the deadline).
    fn await_where(
        &mut self,
        deadline: Instant,
        out: &mut impl Write,
        pred: impl Fn(&Decision) -> bool,
    ) -> anyhow::Result<Option<Decision>> {
        loop {
            if let Some(d) = self.decisions.values().find(|d| pred(d)) {
                return Ok(Some(d.clone()));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            self.await_reply(
                "\0none",
                (Instant::now() + Duration::from_millis(200)).min(deadline),
                out,
            )?;
        }
    }

    /// Reads decisions until `reply_to` has one (or the deadline), printing each new one.
    fn await_reply(
        &mut self,
        reply_to: &str,
        deadline: Instant,
        out: &mut impl Write,
    ) -> anyhow::Result<Option<Decision>> {
        while !self.seen.contains_key(reply_to) && Instant::now() < deadline {
            let Some(m) = self.reader.poll(Duration::from_millis(100)) else {
                continue;
            };
            let m = m?;
            let Some(payload) = m.payload() else { continue };
            let Ok(d) = self.codec.decode_as::<Decision>(payload) else {
                continue; // a fence marker
            };
            if self.decisions.contains_key(&d.decision_id) {
                continue;
            }
            writeln!(
                out,
                "  decision  {:<44} {:<16} {:<22} {}",
                d.in_reply_to,
                d.verdict.as_str(),
                d.reason.as_str(),
                d.detail
            )?;
            self.seen
                .entry(d.in_reply_to.clone())
                .or_insert_with(|| d.clone());
            self.decisions.insert(d.decision_id.clone(), d);
        }
        Ok(self.seen.get(reply_to).cloned())
    }
}

pub fn run(args: &Args, out: &mut impl Write) -> anyhow::Result<()> {
    let config = Config::load(args.config.as_deref()).context("loading the configuration")?;
    let names = Names::new(&config.topics.prefix);
    let producer: ThreadedProducer<DefaultProducerContext> = config
        .client_config()
        .set("partitioner", LIBRDKAFKA_PARTITIONER)
        .set("enable.idempotence", "true")
        .create()?;
    let reader: BaseConsumer = config
        .client_config()
        .set("group.id", format!("{}fleet", config.topics.prefix))
        .set("enable.auto.commit", "false")
        .create()?;
    // Read decisions from the current end: only this run's replies.
    let mut tpl = TopicPartitionList::new();
    for p in 0..config.topics.partitions {
        let (_, high) = reader
            .fetch_watermarks(&names.decisions(), p, Duration::from_secs(10))
            .with_context(|| format!("reading {} (is the broker up?)", names.decisions()))?;
        tpl.add_partition_offset(&names.decisions(), p, Offset::Offset(high))?;
    }
    reader.assign(&tpl)?;
    let mut fleet = Fleet {
        names,
        producer,
        reader,
        codec: Codec::new(),
        decisions: HashMap::new(),
        seen: HashMap::new(),
    };
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis() as i64;
    let run = format!("demo-{now:x}");
    let key = |s: &str| format!("refund:{run}-{s}");
    let deadline = Instant::now() + Duration::from_secs(args.timeout_seconds);
    let mut scenarios = Vec::new();
    writeln!(out, "fleet run {run}: publishing the seed scenarios")?;

    let refund = sample::refund(&key("txn_4821"), 2_500, now);
    fleet.propose(&refund)?;
    scenarios.push(Scenario {
        name: "refund within policy",
        reply_to: refund.proposal_id.clone(),
        expect: (Verdict::Accepted, Reason::AutoApproved),
        or: None,
    });
    fleet.await_reply(&refund.proposal_id, deadline, out)?;
    // The agent's producer resends the same message: one decision, deduplicated on its id.
    fleet.propose(&refund)?;
    let retry = sample::resend(&refund, 1);
    fleet.propose(&retry)?;
    scenarios.push(Scenario {
        name: "blind retry of the refund",
        reply_to: retry.proposal_id.clone(),
        expect: (Verdict::InProgress, Reason::AttemptInProgress),
        or: Some((Verdict::Duplicate, Reason::AlreadyCommitted)),
    });
    let mut changed = sample::refund(&key("txn_4821"), 9_900, now);
    changed.proposal_id = format!("{}-changed", refund.proposal_id);
    fleet.propose(&changed)?;
    scenarios.push(Scenario {
        name: "changed amount, same key",
        reply_to: changed.proposal_id.clone(),
        expect: (Verdict::Conflict, Reason::HashConflict),
        or: None,
    });
    let denied = sample::refund(&key("txn_big"), 600_000, now);
    fleet.propose(&denied)?;
    scenarios.push(Scenario {
        name: "refund over the policy limit",
        reply_to: denied.proposal_id.clone(),
        expect: (Verdict::Denied, Reason::PolicyDenied),
        or: None,
    });

    // Approval: a large refund waits for a finance approver, who approves the exact hash.
    let mut large = sample::refund(&key("txn_large"), 50_000, now);
    large.run_id = format!("{run}-approvals");
    fleet.propose(&large)?;
    scenarios.push(Scenario {
        name: "large refund needs approval",
        reply_to: large.proposal_id.clone(),
        expect: (Verdict::PendingApproval, Reason::ApprovalRequired),
        or: None,
    });
    if let Some(pending) = fleet.await_reply(&large.proposal_id, deadline, out)?
        && let Some(hash) = pending.arguments_hash
    {
        let approval = sample::approval(&large, &hash, "alice", ApprovalVerdict::Approve, now);
        let payload = fleet.codec.encode_single_object(&approval)?;
        fleet.send(&fleet.names.approvals(), &approval.operation_key, &payload)?;
        scenarios.push(Scenario {
            name: "alice's approval is recorded",
            reply_to: approval.approval_id.clone(),
            expect: (Verdict::Recorded, Reason::ApprovalRecorded),
            or: None,
        });
        // The quorum (1) reached, the intent is authorized again and dispatched.
        if let Some(d) = fleet.await_where(deadline, out, |d| {
            d.operation_key == large.operation_key && d.reason == Reason::Approved
        })? {
            scenarios.push(Scenario {
                name: "large refund dispatched",
                // The proposal's second decision: looked up by its own id.
                reply_to: d.decision_id.clone(),
                expect: (Verdict::Accepted, Reason::Approved),
                or: None,
            });
        }
    }

    // A stale agent worker: fence 5 is accepted, then fence 4 of the same run is refused. The
    // second key is chosen on the same partition: a run's fence is kept per partition.
    let mut fenced = sample::refund(&key("fence-a"), 100, now);
    fenced.run_id = format!("{run}-lease");
    fenced.lease_fence = 5;
    let partition = partition_for(fenced.operation_key.as_bytes(), config.topics.partitions);
    let zombie_key = (0..)
        .map(|i| key(&format!("fence-b{i}")))
        .find(|k| partition_for(k.as_bytes(), config.topics.partitions) == partition)
        .expect("some key lands on every partition");
    let mut zombie = sample::refund(&zombie_key, 100, now);
    zombie.run_id = fenced.run_id.clone();
    zombie.lease_fence = 4;
    fleet.propose(&fenced)?;
    fleet.propose(&zombie)?;
    scenarios.push(Scenario {
        name: "stale worker after takeover",
        reply_to: zombie.proposal_id.clone(),
        expect: (Verdict::Rejected, Reason::StaleFence),
        or: None,
    });

    // A record that is not a proposal at all: dead-lettered, the processor keeps going.
    fleet.send(
        &fleet.names.proposals(),
        &key("junk"),
        b"{\"not\":\"avro\"}",
    )?;

    writeln!(out, "\nreport (run {run}):")?;
    let mut failures = 0;
    for s in &scenarios {
        let got = match fleet.decisions.get(&s.reply_to) {
            Some(d) => Some(d.clone()),
            None => fleet.await_reply(&s.reply_to, deadline, out)?,
        };
        // Report against the alternative when that is what came.
        let (verdict, reason) = match (&got, s.or) {
            (Some(d), Some(alt)) if (d.verdict, d.reason) == alt => alt,
            _ => s.expect,
        };
        let ok = got
            .as_ref()
            .is_some_and(|d| d.verdict == verdict && d.reason == reason);
        failures += usize::from(!ok);
        writeln!(
            out,
            "  {:<4} {:<30} expected {:<16} {:<20} got {}",
            if ok { "ok" } else { "FAIL" },
            s.name,
            verdict.as_str(),
            reason.as_str(),
            got.map_or("nothing".to_owned(), |d| format!(
                "{} {}",
                d.verdict.as_str(),
                d.reason.as_str()
            ))
        )?;
    }
    writeln!(
        out,
        "  the malformed record is in {} with its reason in the airlock-dlq-reason header",
        fleet.names.dlq()
    )?;
    anyhow::ensure!(
        failures == 0,
        "{failures} scenario(s) did not get the expected decision"
    );
    Ok(())
}
