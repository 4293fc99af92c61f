//! `airlock-bench-replay`: how fast an auditor's replay rebuilds and verifies a journal, and how
//! fast a task restores its state from changelog records.
//!
//! The journal and the changelog of `--partitions` partitions are made by the reference core
//! deciding real proposals and settling them (as `airlock run` would journal them, with a
//! checkpoint every `--checkpoint-every` events), then encoded with Avro. Phases, in one run:
//! - `decode`: Avro decode of every journal event on one thread, nothing else (the baseline);
//! - `replay`: what `airlock replay` does per event after reading it, on one thread: decode,
//!   digest, the reducer's writes applied to the projection, every checkpoint verified, the
//!   invariants;
//! - `replay-threads`: the same with the partitions spread over `--threads` threads (default:
//!   one per CPU), as `airlock replay` runs them;
//! - `restore-decode`: Avro decode of every changelog record (the restore baseline);
//! - `restore`: decode and apply every changelog record to a RocksDB store, committing in
//!   batches, as a task gaining a partition does (the broker read is not included).
//!
//! With `--brokers`, the same records are then produced to fresh journal and changelog topics
//! on that broker, and measured end to end as the commands read them:
//! - `broker-read`: the fence-filtered scan of every journal partition, one after the other
//!   (the baseline);
//! - `broker-replay`: `airlock replay`'s reading and replay of every partition, threads as
//!   above, each with its own reader;
//! - `broker-restore`: a task gaining partition 0 from an empty state directory
//!   (`runtime::restore::Claim::take`: barrier, changelog read, RocksDB writes, owner-epoch
//!   claim, fence markers), in changelog records per second.
//!
//! Usage: `airlock-bench-replay [--proposals N] [--partitions N] [--threads N]
//! [--checkpoint-every N] [--window N] [--brokers host:port]`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_processor::audit::replay::{Outcome, PartitionReplay};
use airlock_processor::cli::replay::{Parallel, Progress, replay_partitions};
use airlock_processor::cli::run::load_core;
use airlock_processor::core::{self, Input};
use airlock_processor::runtime::clock::wall_ms;
use airlock_processor::runtime::config::Config;
use airlock_processor::runtime::partition::{changelog_table, store_table};
use airlock_processor::runtime::produce::Producer;
use airlock_processor::runtime::restore::Claim;
use airlock_processor::runtime::scan::{Bounds, Scanned, Scanner};
use airlock_processor::runtime::telemetry::Telemetry;
use airlock_processor::runtime::topics::{self, Names};
use airlock_processor::runtime::wire::{self, Admit, OutRecord};
use airlock_processor::sample;
use airlock_processor::store::rocks::RocksOptions;
use airlock_processor::store::{MemoryBackend, RocksBackend, StateStore, Store};
use airlock_processor::task::Task;
use airlock_schemas::codec::Codec;
use airlock_schemas::{ChangelogRecord, JournalEvent, OutcomeKind};
use anyhow::Context;
use hdrhistogram::Histogram;
use rdkafka::consumer::BaseConsumer;

/// The allocator of the `airlock` binary (see `main.rs`), so that the figures are its figures.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
    partitions: usize,
    threads: usize,
    checkpoint_every: usize,
    window: usize,
    brokers: Option<String>,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        proposals: 100_000,
        partitions: 4,
        threads: std::thread::available_parallelism().map_or(1, usize::from),
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
            "--partitions" => args.partitions = value("--partitions")?,
            "--threads" => args.threads = value("--threads")?,
            "--checkpoint-every" => args.checkpoint_every = value("--checkpoint-every")?,
            "--window" => args.window = value("--window")?,
            "--brokers" => args.brokers = Some(it.next().context("--brokers host:port")?),
            "--help" | "-h" => {
                println!(
                    "airlock-bench-replay [--proposals N] [--partitions N] [--threads N] [--checkpoint-every N] [--window N] [--brokers host:port]"
                );
                std::process::exit(0);
            }
            other => anyhow::bail!("unknown argument {other:?}; try --help"),
        }
    }
    anyhow::ensure!(
        args.proposals > 0
            && args.partitions > 0
            && args.threads > 0
            && args.checkpoint_every > 0
            && args.window > 0,
        "counts must be positive"
    );
    Ok(args)
}

/// Encoded records, in order.
type Records = Vec<Vec<u8>>;

/// One partition's journal and changelog.
struct Partition {
    journal: Records,
    changelog: Records,
}

/// The journals and changelogs of `n` refunds proposed, started and committed, spread over
/// `partitions` partitions (proposal `i` on partition `i % partitions`).
fn workload(
    n: usize,
    partitions: usize,
    checkpoint_every: usize,
) -> anyhow::Result<Vec<Partition>> {
    let core = Arc::new(sample::reference_core(core::Config::default())?);
    (0..partitions)
        .map(|p| {
            let ids: Vec<usize> = (p..n).step_by(partitions).collect();
            partition_workload(core.clone(), p as i32, &ids, checkpoint_every)
        })
        .collect()
}

fn partition_workload(
    core: Arc<core::Core>,
    partition: i32,
    ids: &[usize],
    checkpoint_every: usize,
) -> anyhow::Result<Partition> {
    let codec = Codec::new();
    let store = StateStore::open(MemoryBackend::default())?;
    let mut task = Task::new(core, store, sample::task_context(partition))?;
    let mut journal = Vec::new();
    let mut changelog = Vec::new();
    let mut since_checkpoint = 0;
    for &i in ids {
        let now = T0 + i as i64;
        let mut p = sample::fleet_refund(&format!("refund:bench:{i}"), i, now);
        p.proposal_id = format!("bench-{i}");
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
                partition,
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
    Ok(Partition { journal, changelog })
}

/// Every partition's replay must verify: checkpoints matched, no finding.
fn verified(outcomes: &[Outcome], what: &str) -> anyhow::Result<u64> {
    let mut checkpoints = 0;
    for o in outcomes {
        anyhow::ensure!(
            o.findings.is_empty() && o.counts.checkpoints > 0,
            "{what}: partition {} must verify: {} checkpoints, findings {:?}",
            o.partition,
            o.counts.checkpoints,
            o.findings.first()
        );
        checkpoints += o.counts.checkpoints;
    }
    Ok(checkpoints)
}

/// Replays each partition's journal from memory.
fn replay_one(p: usize, journal: &Records, window: usize) -> anyhow::Result<Outcome> {
    let codec = Codec::new();
    let mut replay = PartitionReplay::new(p as i32, window);
    for (offset, bytes) in journal.iter().enumerate() {
        let e: JournalEvent = codec.decode_as(bytes)?;
        replay.event(offset as i64, bytes, e);
    }
    Ok(replay.finish())
}

fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let codec = Codec::new();
    let made = Instant::now();
    let parts = workload(args.proposals, args.partitions, args.checkpoint_every)?;
    let journal: Vec<&Vec<u8>> = parts.iter().flat_map(|p| &p.journal).collect();
    let changelog: Vec<&Vec<u8>> = parts.iter().flat_map(|p| &p.changelog).collect();
    let journal_events = journal.len();
    println!(
        "airlock-bench-replay: {} proposals on {} partitions -> {} journal events ({} MiB), {} changelog records ({} MiB), made in {:.1?}; {} threads",
        args.proposals,
        args.partitions,
        journal.len(),
        journal.iter().map(|r| r.len()).sum::<usize>() >> 20,
        changelog.len(),
        changelog.iter().map(|r| r.len()).sum::<usize>() >> 20,
        made.elapsed(),
        args.threads,
    );

    let decode = Phase::measure("decode", journal.len(), |i| {
        std::hint::black_box(codec.decode_as::<JournalEvent>(journal[i])?);
        Ok(())
    })?;
    // One thread, the partitions one after the other.
    let mut replays: Vec<PartitionReplay> = (0..parts.len())
        .map(|p| PartitionReplay::new(p as i32, args.window))
        .collect();
    let place: Vec<(usize, i64)> = parts
        .iter()
        .enumerate()
        .flat_map(|(p, part)| (0..part.journal.len()).map(move |o| (p, o as i64)))
        .collect();
    let replay_phase = Phase::measure("replay", journal.len(), |i| {
        let (p, offset) = place[i];
        let e: JournalEvent = codec.decode_as(journal[i])?;
        replays[p].event(offset, journal[i], e);
        Ok(())
    })?;
    let outcomes: Vec<Outcome> = replays.into_iter().map(PartitionReplay::finish).collect();
    let checkpoints = verified(&outcomes, "replay")?;

    // `--threads` threads, each replaying its share of the partitions.
    let started = Instant::now();
    let threaded: Vec<Outcome> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..args.threads.min(parts.len()))
            .map(|t| {
                let parts = &parts;
                scope.spawn(move || -> anyhow::Result<Vec<Outcome>> {
                    (t..parts.len())
                        .step_by(args.threads)
                        .map(|p| replay_one(p, &parts[p].journal, args.window))
                        .collect()
                })
            })
            .collect();
        let mut all = Vec::new();
        for w in workers {
            all.extend(
                w.join()
                    .map_err(|_| anyhow::anyhow!("a replay thread panicked"))??,
            );
        }
        anyhow::Ok(all)
    })?;
    let threaded_phase = Phase {
        name: "replay-threads",
        count: journal.len(),
        elapsed: started.elapsed(),
        per_slice: Slices::new().histogram,
    };
    verified(&threaded, "replay-threads")?;

    let restore_decode = Phase::measure("restore-decode", changelog.len(), |i| {
        std::hint::black_box(codec.decode_as::<ChangelogRecord>(changelog[i])?);
        Ok(())
    })?;
    let dir = tempfile::tempdir().context("temporary directory for RocksDB")?;
    let mut store = StateStore::open(RocksBackend::open(dir.path(), &RocksOptions::default())?)?;
    let restore = Phase::measure("restore", changelog.len(), |i| {
        let r: ChangelogRecord = codec.decode_as(changelog[i])?;
        let key = store_table(r.table).key(&r.key);
        store.restore_row(&key, r.value)?;
        if i % 1_000 == 999 || i + 1 == changelog.len() {
            store.commit()?;
        }
        Ok(())
    })?;

    decode.report(None);
    replay_phase.report(Some(&decode));
    threaded_phase.report(Some(&replay_phase));
    restore_decode.report(None);
    restore.report(Some(&restore_decode));
    println!(
        "replay verified {checkpoints} checkpoints over {} events; projections {}",
        outcomes.iter().map(|o| o.counts.events).sum::<u64>(),
        outcomes
            .iter()
            .map(|o| &o.projection[..12])
            .collect::<Vec<_>>()
            .join(" ")
    );
    let mut rates = vec![
        ("replay", replay_phase.rate()),
        ("replay-threads", threaded_phase.rate()),
    ];
    if let Some(brokers) = &args.brokers {
        let (read, replayed, restored) = broker_phases(brokers, &parts, &args)?;
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

/// Produces every partition's journal and changelog to fresh topics on `brokers`, then times
/// the scan alone, the replay as `airlock replay` runs it, and a claim that restores partition
/// 0 from the changelog into an empty RocksDB.
fn broker_phases(
    brokers: &str,
    parts: &[Partition],
    args: &Args,
) -> anyhow::Result<(Phase, Phase, Phase)> {
    let mut config = Config::default();
    let dir = sample::config_dir();
    config.tools.registry = dir.join("tools.toml");
    config.tools.policies = dir.join("policies.cedar");
    config.tools.entities = dir.join("entities.json");
    config.kafka.brokers = brokers.to_owned();
    config.topics.prefix = format!("bench-replay-{:x}.", wall_ms());
    config.topics.partitions = i32::try_from(parts.len())?;
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
    let mut events = 0;
    for (p, part) in parts.iter().enumerate() {
        let p = i32::try_from(p)?;
        for (topic, kind, records) in [
            (names.journal(), "journal", &part.journal),
            (names.changelog(), "changelog", &part.changelog),
        ] {
            producer.send_phased(&[OutRecord::fence_marker(&topic, p, 1)])?;
            for (n, chunk) in records.chunks(5_000).enumerate() {
                let out: Vec<OutRecord> = chunk
                    .iter()
                    .enumerate()
                    .map(|(i, value)| OutRecord {
                        topic: topic.clone(),
                        partition: p,
                        key: None,
                        value: Some(value.clone()),
                        headers: wire::identity(
                            kind,
                            &format!("{kind}/{p}/{}", n * 5_000 + i),
                            p,
                            1,
                        ),
                        phase: 0,
                    })
                    .collect();
                producer.send_phased(&out)?;
            }
        }
        events += part.journal.len();
    }
    println!(
        "broker {brokers}: produced {events} journal events and {} changelog records on {} partitions in {:.1?}",
        parts.iter().map(|p| p.changelog.len()).sum::<usize>(),
        parts.len(),
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
    let wanted: Vec<(String, i32)> = (0..config.topics.partitions)
        .map(|p| (topic.clone(), p))
        .collect();
    let bounds: Vec<(i32, Bounds)> = (0..config.topics.partitions)
        .zip(scanner.barrier_ends(&config.client_config(), &wanted, None)?)
        .collect();

    let mut slices = Slices::new();
    let mut seen = 0usize;
    let started = Instant::now();
    for &(p, b) in &bounds {
        scanner.scan(&topic, p, b, |s: Scanned<'_>| -> anyhow::Result<()> {
            if s.admit == Admit::Accept {
                std::hint::black_box(s.payload);
                seen += 1;
                slices.tick()?;
            }
            Ok(())
        })?;
    }
    let read = Phase {
        name: "broker-read",
        count: seen,
        elapsed: started.elapsed(),
        per_slice: slices.histogram,
    };
    anyhow::ensure!(
        seen == events,
        "the scan read {seen} of {events} journal events"
    );

    let progress = Progress::new("broker-replay", events as i64);
    let started = Instant::now();
    let outcomes = replay_partitions(
        &config,
        &topic,
        &bounds,
        Parallel {
            window: args.window,
            threads: args.threads,
            stall_timeout: Duration::from_secs(30),
        },
        &progress,
        |_, _| Ok(()),
    )?;
    progress.finish();
    let replayed = Phase {
        name: "broker-replay",
        count: events,
        elapsed: started.elapsed(),
        per_slice: Slices::new().histogram,
    };
    verified(&outcomes, "broker-replay")?;

    let state = tempfile::tempdir().context("temporary state directory")?;
    let claim = Claim {
        core,
        names: names.clone(),
        codec: Codec::new(),
        output_framing: airlock_schemas::Framing::SingleObject,
        partitions: config.topics.partitions,
        output_topics: plan.iter().map(|t| t.name.clone()).collect(),
        state_dir: state.path().to_owned(),
        rocks: RocksOptions::default(),
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
    let rows = parts[0].changelog.len();
    let restored = Phase {
        name: "broker-restore",
        count: rows,
        elapsed: started.elapsed(),
        per_slice: Slices::new().histogram,
    };
    anyhow::ensure!(
        report.restored_rows == rows as u64,
        "the claim restored {} of {rows} changelog records",
        report.restored_rows,
    );
    Ok((read, replayed, restored))
}
