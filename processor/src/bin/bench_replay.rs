//! `airlock-bench-replay`: how fast an auditor's replay rebuilds and verifies a journal, and how
//! fast a task restores its state from changelog records, on one thread.
//!
//! The journal and the changelog are made by the reference core deciding real proposals and
//! settling them (as `airlock run` would journal them, with a checkpoint every
//! `--checkpoint-every` events), then encoded with Avro. Phases, in one run:
//! - `decode`: Avro decode of every journal event, nothing else (the baseline);
//! - `replay`: what `airlock replay` does per event after reading it: decode, digest, the
//!   reducer's writes applied to the projection, every checkpoint verified, the invariants;
//! - `restore-decode`: Avro decode of every changelog record (the restore baseline);
//! - `restore`: decode and apply every changelog record to a RocksDB store, committing in
//!   batches, as a task gaining a partition does (the broker read is not included).
//!
//! With `--brokers`, the same records are then produced to a fresh journal and changelog
//! partition on that broker, and measured end to end as the commands read them:
//! - `broker-read`: the fence-filtered scan of the journal partition alone (the baseline);
//! - `broker-replay`: the scan plus the replay of every event, as `airlock replay` runs it;
//! - `broker-restore`: a task gaining the partition from an empty state directory
//!   (`runtime::restore::Claim::take`: barrier, changelog read, RocksDB writes, owner-epoch
//!   claim, fence markers), in changelog records per second.
//!
//! Usage: `airlock-bench-replay [--proposals N] [--checkpoint-every N] [--window N]
//! [--brokers host:port]`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_processor::audit::replay::PartitionReplay;
use airlock_processor::cli::run::load_core;
use airlock_processor::core::{self, Input};
use airlock_processor::runtime::config::Config;
use airlock_processor::runtime::partition::{changelog_table, store_table};
use airlock_processor::runtime::produce::Producer;
use airlock_processor::runtime::restore::Claim;
use airlock_processor::runtime::scan::{Scanned, Scanner};
use airlock_processor::runtime::telemetry::Telemetry;
use airlock_processor::runtime::topics::{self, Names};
use airlock_processor::runtime::wire::{self, Admit, OutRecord};
use airlock_processor::sample;
use airlock_processor::store::rocks::RocksOptions;
use airlock_processor::store::{RocksBackend, StateStore, Store};
use airlock_schemas::codec::Codec;
use airlock_schemas::{ChangelogRecord, JournalEvent, OutcomeKind};
use anyhow::Context;
use hdrhistogram::Histogram;
use rdkafka::consumer::BaseConsumer;

const T0: i64 = 1_790_000_000_000;
/// Records per measured slice: the percentiles are of per-record costs averaged over a slice,
/// not of single records, so the clock's own cost does not dominate.
const SLICE: usize = 100;

struct Phase {
    name: &'static str,
    count: usize,
    elapsed: Duration,
    per_slice: Histogram<u64>,
}

/// Per-record cost, measured over slices of [`SLICE`] records.
struct Slices {
    histogram: Histogram<u64>,
    started: Instant,
    in_slice: usize,
}

impl Slices {
    fn new() -> Self {
        Slices {
            histogram: Histogram::new(3).expect("3 significant digits is a valid histogram"),
            started: Instant::now(),
            in_slice: 0,
        }
    }

    /// One record done.
    fn tick(&mut self) -> anyhow::Result<()> {
        self.in_slice += 1;
        if self.in_slice == SLICE {
            self.histogram
                .record((self.started.elapsed().as_nanos() / SLICE as u128) as u64)?;
            self.in_slice = 0;
            self.started = Instant::now();
        }
        Ok(())
    }
}

impl Phase {
    fn measure(
        name: &'static str,
        n: usize,
        mut step: impl FnMut(usize) -> anyhow::Result<()>,
    ) -> anyhow::Result<Phase> {
        let mut slices = Slices::new();
        let started = Instant::now();
        for i in 0..n {
            step(i)?;
            slices.tick()?;
        }
        Ok(Phase {
            name,
            count: n,
            elapsed: started.elapsed(),
            per_slice: slices.histogram,
        })
    }

    fn rate(&self) -> f64 {
        self.count as f64 / self.elapsed.as_secs_f64()
    }

    fn report(&self, baseline: Option<&Phase>) {
        let ratio = baseline.map_or(String::new(), |b| {
            format!("  ratio to {} {:.3}", b.name, self.rate() / b.rate())
        });
        // A phase timed as a whole (a claim) has no per-record figures.
        let percentiles = if self.per_slice.is_empty() {
            "per record p50      -     p99      -   ".to_owned()
        } else {
            format!(
                "per record p50 {:>6.2} µs  p99 {:>6.2} µs",
                self.per_slice.value_at_quantile(0.50) as f64 / 1000.0,
                self.per_slice.value_at_quantile(0.99) as f64 / 1000.0,
            )
        };
        println!(
            "{:<15} {:>8} records  {:>10.0} /s  {percentiles}{ratio}",
            self.name,
            self.count,
            self.rate(),
        );
    }
}

struct Args {
    proposals: usize,
    checkpoint_every: usize,
    window: usize,
    brokers: Option<String>,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        proposals: 100_000,
        checkpoint_every: 1_000,
        window: 10_000,
        brokers: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |flag: &str| -> anyhow::Result<usize> {
            Ok(it.next().with_context(|| format!("{flag} N"))?.parse()?)
        };
        match arg.as_str() {
            "--proposals" => args.proposals = value("--proposals")?,
            "--checkpoint-every" => args.checkpoint_every = value("--checkpoint-every")?,
            "--window" => args.window = value("--window")?,
            "--brokers" => args.brokers = Some(it.next().context("--brokers host:port")?),
            "--help" | "-h" => {
                println!(
                    "airlock-bench-replay [--proposals N] [--checkpoint-every N] [--window N] [--brokers host:port]"
                );
                std::process::exit(0);
            }
            other => anyhow::bail!("unknown argument {other:?}; try --help"),
        }
    }
    anyhow::ensure!(
        args.proposals > 0 && args.checkpoint_every > 0 && args.window > 0,
        "counts must be positive"
    );
    Ok(args)
}

/// Encoded records, in order.
type Records = Vec<Vec<u8>>;

/// The journal and changelog records of `n` refunds proposed, started and committed.
fn workload(n: usize, checkpoint_every: usize) -> anyhow::Result<(Records, Records)> {
    let codec = Codec::new();
    let core = Arc::new(sample::reference_core(core::Config::default())?);
    let mut task = sample::memory_task(core)?;
    let mut journal = Vec::new();
    let mut changelog = Vec::new();
    let mut since_checkpoint = 0;
    for i in 0..n {
        let now = T0 + i as i64;
        let mut p = sample::refund(&format!("refund:bench:{i}"), 100 + (i as i64 % 9_000), now);
        p.proposal_id = format!("bench-{i}");
        p.run_id = format!("run-{}", i % 1_000);
        let key = p.operation_key.clone();
        let mut events: Vec<JournalEvent> = task.handle(&Input::Proposal(p), now)?.journal;
        for kind in [OutcomeKind::AttemptStarted, OutcomeKind::Committed] {
            let o = sample::outcome(&key, 1, kind, "ledger reference");
            events.extend(task.handle(&Input::Outcome(o), now)?.journal);
        }
        since_checkpoint += events.len();
        if since_checkpoint >= checkpoint_every {
            events.push(task.checkpoint(now)?);
            since_checkpoint = 0;
        }
        for e in &events {
            journal.push(codec.encode_single_object(e)?);
        }
        // The changelog rows of this batch, as `PartitionTask::seal` writes them.
        for (full_key, value) in task.store().staged() {
            let Some(table) = changelog_table(full_key) else {
                continue;
            };
            changelog.push(codec.encode_single_object(&ChangelogRecord {
                partition: 0,
                owner_epoch: 1,
                table,
                key: full_key[1..].to_vec(),
                value: value.map(<[u8]>::to_vec),
                input_offsets: Vec::new(),
                written_at: now,
            })?);
        }
        task.commit()?;
    }
    Ok((journal, changelog))
}

fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let codec = Codec::new();
    let made = Instant::now();
    let (journal, changelog) = workload(args.proposals, args.checkpoint_every)?;
    let journal_events = journal.len();
    println!(
        "airlock-bench-replay: {} proposals -> {} journal events ({} MiB), {} changelog records ({} MiB), made in {:.1?}; one thread",
        args.proposals,
        journal.len(),
        journal.iter().map(Vec::len).sum::<usize>() >> 20,
        changelog.len(),
        changelog.iter().map(Vec::len).sum::<usize>() >> 20,
        made.elapsed()
    );

    let decode = Phase::measure("decode", journal.len(), |i| {
        std::hint::black_box(codec.decode_as::<JournalEvent>(&journal[i])?);
        Ok(())
    })?;
    let mut replay = PartitionReplay::new(0, args.window)?;
    let replay_phase = Phase::measure("replay", journal.len(), |i| {
        let e: JournalEvent = codec.decode_as(&journal[i])?;
        replay.event(i as i64, &journal[i], e)?;
        Ok(())
    })?;
    let outcome = replay.finish()?;
    anyhow::ensure!(
        outcome.findings.is_empty() && outcome.counts.checkpoints > 0,
        "the benchmark's journal must verify: {} checkpoints, findings {:?}",
        outcome.counts.checkpoints,
        outcome.findings.first()
    );

    let restore_decode = Phase::measure("restore-decode", changelog.len(), |i| {
        std::hint::black_box(codec.decode_as::<ChangelogRecord>(&changelog[i])?);
        Ok(())
    })?;
    let dir = tempfile::tempdir().context("temporary directory for RocksDB")?;
    let mut store = StateStore::open(RocksBackend::open(
        dir.path(),
        &RocksOptions { sync: true },
    )?)?;
    let restore = Phase::measure("restore", changelog.len(), |i| {
        let r: ChangelogRecord = codec.decode_as(&changelog[i])?;
        let key = store_table(r.table).key(&r.key);
        store.restore_row(&key, r.value)?;
        if i % 1_000 == 999 || i + 1 == changelog.len() {
            store.commit()?;
        }
        Ok(())
    })?;

    decode.report(None);
    replay_phase.report(Some(&decode));
    restore_decode.report(None);
    restore.report(Some(&restore_decode));
    println!(
        "replay verified {} checkpoints over {} events; projection {}",
        outcome.counts.checkpoints, outcome.counts.events, outcome.projection
    );
    let mut rates = vec![("replay", replay_phase.rate())];
    if let Some(brokers) = &args.brokers {
        let (read, replayed, restored) = broker_phases(brokers, &journal, &changelog, args.window)?;
        read.report(None);
        replayed.report(Some(&read));
        restored.report(None);
        rates.push(("broker-replay", replayed.rate()));
    }
    for (name, rate) in rates {
        println!(
            "target: {name} >= 200000 events/s: {} ({rate:.0}/s over {journal_events} events)",
            if rate >= 200_000.0 { "met" } else { "MISSED" }
        );
    }
    Ok(())
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Produces the journal and the changelog to fresh one-partition topics on `brokers`, then
/// times the scan alone, the replay as `airlock replay` runs it, and a claim that restores
/// the partition from the changelog into an empty RocksDB.
fn broker_phases(
    brokers: &str,
    journal: &Records,
    changelog: &Records,
    window: usize,
) -> anyhow::Result<(Phase, Phase, Phase)> {
    let mut config = Config::default();
    let dir = sample::config_dir();
    config.tools.registry = dir.join("tools.toml");
    config.tools.policies = dir.join("policies.cedar");
    config.tools.entities = dir.join("entities.json");
    config.kafka.brokers = brokers.to_owned();
    config.topics.prefix = format!("bench-replay-{:x}.", now_ms());
    config.topics.partitions = 1;
    let names = Names::new(&config.topics.prefix);
    let core = Arc::new(load_core(&config)?);
    let connectors: Vec<String> = core
        .registry()
        .tools()
        .map(|t| t.connector.clone())
        .collect();
    let plan = names.plan(connectors.iter().map(String::as_str));
    tokio::runtime::Runtime::new()?.block_on(topics::create(
        &config,
        &plan,
        Duration::from_secs(30),
    ))?;

    // Owner epoch 1 wrote everything: its fence markers first, as a claim writes them.
    let producer = Arc::new(Producer::new(&config.client_config(), 5)?);
    let produced = Instant::now();
    for (topic, kind, records) in [
        (names.journal(), "journal", journal),
        (names.changelog(), "changelog", changelog),
    ] {
        producer.send_phased(&[OutRecord::fence_marker(&topic, 0, 1)])?;
        for (n, chunk) in records.chunks(5_000).enumerate() {
            let out: Vec<OutRecord> = chunk
                .iter()
                .enumerate()
                .map(|(i, value)| OutRecord {
                    topic: topic.clone(),
                    partition: 0,
                    key: None,
                    value: Some(value.clone()),
                    headers: wire::identity(kind, &format!("{kind}/0/{}", n * 5_000 + i), 0, 1),
                    phase: 0,
                })
                .collect();
            producer.send_phased(&out)?;
        }
    }
    println!(
        "broker {brokers}: produced {} journal events and {} changelog records in {:.1?}",
        journal.len(),
        changelog.len(),
        produced.elapsed()
    );

    let reader: BaseConsumer = config
        .client_config()
        .set("group.id", format!("{}bench", config.topics.prefix))
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .create()?;
    let scanner = Scanner {
        consumer: &reader,
        stall_timeout: Duration::from_secs(30),
    };
    let topic = names.journal();
    let bounds = scanner.barrier_ends(&config.client_config(), &[(topic.clone(), 0)], None)?[0];
    let codec = Codec::new();

    let mut slices = Slices::new();
    let mut seen = 0usize;
    let started = Instant::now();
    scanner.scan(&topic, 0, bounds, |s: Scanned<'_>| -> anyhow::Result<()> {
        if s.admit == Admit::Accept {
            std::hint::black_box(s.payload);
            seen += 1;
            slices.tick()?;
        }
        Ok(())
    })?;
    let read = Phase {
        name: "broker-read",
        count: seen,
        elapsed: started.elapsed(),
        per_slice: slices.histogram,
    };
    anyhow::ensure!(
        seen == journal.len(),
        "the scan read {seen} of {} journal events",
        journal.len()
    );

    let mut replay = PartitionReplay::new(0, window)?;
    let mut slices = Slices::new();
    let started = Instant::now();
    scanner.scan(&topic, 0, bounds, |s: Scanned<'_>| -> anyhow::Result<()> {
        if s.admit == Admit::Accept {
            let payload = s.payload.context("a journal event without a value")?;
            let e: JournalEvent = codec.decode_as(payload)?;
            replay.event(s.offset, payload, e)?;
            slices.tick()?;
        }
        Ok(())
    })?;
    let outcome = replay.finish()?;
    let replayed = Phase {
        name: "broker-replay",
        count: journal.len(),
        elapsed: started.elapsed(),
        per_slice: slices.histogram,
    };
    anyhow::ensure!(
        outcome.findings.is_empty() && outcome.counts.checkpoints > 0,
        "the replay from the broker must verify: {} checkpoints, findings {:?}",
        outcome.counts.checkpoints,
        outcome.findings.first()
    );

    let state = tempfile::tempdir().context("temporary state directory")?;
    let claim = Claim {
        core,
        names: names.clone(),
        codec,
        partitions: 1,
        output_topics: plan.iter().map(|t| t.name.clone()).collect(),
        state_dir: state.path().to_owned(),
        rocks: RocksOptions { sync: true },
        producer,
        reader: config
            .client_config()
            .set("group.id", format!("{}bench-restore", config.topics.prefix))
            .set("enable.auto.commit", "false")
            .set("fetch.wait.max.ms", "20")
            .create()?,
        instance: "bench".to_owned(),
        stall_timeout: Duration::from_secs(30),
        telemetry: Arc::new(Telemetry::new(Duration::from_secs(60))),
    };
    let started = Instant::now();
    let (_task, report) = claim.take(0)?;
    let restored = Phase {
        name: "broker-restore",
        count: changelog.len(),
        elapsed: started.elapsed(),
        per_slice: Slices::new().histogram,
    };
    anyhow::ensure!(
        report.restored_rows == changelog.len() as u64,
        "the claim restored {} of {} changelog records",
        report.restored_rows,
        changelog.len()
    );
    Ok((read, replayed, restored))
}
