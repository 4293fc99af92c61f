//! `airlock replay`: an auditor's check of the journal (DESIGN.md section 8). Reads
//! `airlock.journal` (all partitions or some, up to its end when the replay starts or to an
//! offset), rebuilds each partition's projection, verifies it at every CHECKPOINT, checks the
//! invariants, and checks every dispatch command on the dispatch topics against the journal's
//! dispatch intents. Prints counts and every finding with its offsets; exits non-zero when the
//! journal does not verify.
//!
//! `--policy <bundle>` asks another question: it screens the recorded proposals (the proposals
//! topic) under the bundle in force and under the candidate, and reports which decisions would
//! change.
//!
//! Reads only: it writes nothing and joins no group (offsets are assigned, never committed).
//! Partitions are replayed in parallel (`--threads`, default one per CPU), each by its own
//! reader. Memory: per thread, one partition's projection (a digest per row) plus the rollback
//! window of events.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

use airlock_schemas::{Codec, DispatchCommand, JournalEvent, ToolProposal};
use anyhow::Context;
use rdkafka::consumer::BaseConsumer;

use crate::audit::replay::{Finding, Outcome, PartitionReplay};
use crate::audit::whatif::WhatIf;
use crate::core::{self, Core};
use crate::runtime::config::Config;
use crate::runtime::scan::{Bounds, Scanned, Scanner};
use crate::runtime::schema_registry;
use crate::runtime::topics::Names;
use crate::runtime::wire::{self, Admit};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub partitions: PartitionArgs,
    /// Stop before this journal offset in every partition (default: the end when the replay
    /// starts). The dispatch-topic check is skipped: later dispatches have no intent in range.
    #[arg(long)]
    pub until_offset: Option<i64>,
    /// How many recent events a partition's replay keeps to roll back the orphaned tail of an
    /// owner that died or was fenced (memory: about 2 × this many events).
    #[arg(long, default_value_t = 10_000)]
    pub window: usize,
    /// Skip checking the dispatch topics against the journal's dispatch intents.
    #[arg(long)]
    pub no_dispatch_check: bool,
    /// Partitions replayed at once, each by its own thread and reader (default: the number
    /// of CPUs, at most the number of partitions). Memory grows with it: one projection and
    /// rollback window per thread.
    #[arg(long)]
    pub threads: Option<usize>,
    /// What-if: screen the recorded proposals under this candidate policy bundle (a `.cedar`
    /// file, or a directory holding `policies.cedar` and `entities.json`) instead of replaying.
    #[arg(long)]
    pub policy: Option<PathBuf>,
    /// The candidate's entities when `--policy` names a file (default: the configured ones).
    #[arg(long, requires = "policy")]
    pub entities: Option<PathBuf>,
    #[command(flatten)]
    pub read: ReadArgs,
}

/// How `airlock replay` and `airlock audit` reach and read the topics.
#[derive(Debug, clap::Args)]
pub struct ReadArgs {
    /// The processor's configuration file (brokers, topic prefix, partitions, tools, policy).
    #[arg(long, short, env = "AIRLOCK_CONFIG")]
    pub config: Option<PathBuf>,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
    /// Write nothing: end at each partition's high watermark instead of at a barrier record
    /// written now (see `runtime::compat` on brokers whose watermark lags).
    #[arg(long)]
    pub read_only: bool,
    /// How long to wait for the broker before giving up on a partition.
    #[arg(long, default_value_t = 30)]
    pub stall_timeout_seconds: u64,
}

pub fn run(args: &Args, out: &mut impl Write) -> anyhow::Result<()> {
    let config = Config::load(args.read.config.as_deref()).context("loading the configuration")?;
    let names = Names::new(&config.topics.prefix);
    let partitions = args.partitions.select(config.topics.partitions)?;
    let consumer = reader(&config, "replay")?;
    let scanner = Scanner {
        consumer: &consumer,
        stall_timeout: Duration::from_secs(args.read.stall_timeout_seconds),
    };
    if let Some(candidate) = &args.policy {
        return what_if(args, &config, &names, &partitions, &scanner, candidate, out);
    }
    let t = &config.tools;
    let (registry, _) = super::check::load(&t.registry, &t.policies, &t.entities)?;
    let mut dispatch_topics: Vec<String> = registry
        .tools()
        .map(|t| names.dispatch(&t.connector))
        .collect();
    dispatch_topics.sort();
    dispatch_topics.dedup();
    let check_dispatches = !args.no_dispatch_check && args.until_offset.is_none();

    // The dispatch topics' ends first: a dispatch read later has its intent in the journal
    // read after it (both are produced before the batch's changelog).
    // (Cut at the end seen now: a dispatch written after the journal was read would have no
    // intent in what was read.)
    let mut dispatch_bounds = Vec::new();
    if check_dispatches {
        let wanted: Vec<(String, i32)> = partitions
            .iter()
            .flat_map(|&p| dispatch_topics.iter().map(move |t| (t.clone(), p)))
            .collect();
        let ends = ends(&scanner, &config, args.read.read_only, &wanted, None)?;
        for ((topic, p), b) in wanted.into_iter().zip(ends) {
            dispatch_bounds.push((p, topic, Bounds { open: false, ..b }));
        }
    }
    let journal = names.journal();
    let wanted: Vec<(String, i32)> = partitions.iter().map(|&p| (journal.clone(), p)).collect();
    let journal_bounds: Vec<(i32, Bounds)> = partitions
        .iter()
        .copied()
        .zip(ends(
            &scanner,
            &config,
            args.read.read_only,
            &wanted,
            args.until_offset,
        )?)
        .collect();
    let total: i64 = journal_bounds.iter().map(|(_, b)| b.high - b.low).sum();
    let progress = Progress::new("replay", total);
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from));
    let stall_timeout = scanner.stall_timeout;
    let outcomes = replay_partitions(
        &config,
        &journal,
        &journal_bounds,
        Parallel {
            window: args.window,
            threads,
            stall_timeout,
        },
        &progress,
        |scanner, outcome| {
            let p = outcome.partition;
            for (_, topic, bounds) in dispatch_bounds.iter().filter(|(dp, _, _)| *dp == p) {
                check_dispatch_topic(scanner, topic, p, *bounds, outcome)?;
            }
            Ok(())
        },
    )?;
    progress.finish();
    let findings: u64 = outcomes.iter().map(|o| o.counts.findings).sum();
    if args.read.json {
        writeln!(
            out,
            "{}",
            report_json(&journal, &outcomes, check_dispatches)
        )?;
    } else {
        report_text(&journal, &outcomes, check_dispatches, out)?;
    }
    anyhow::ensure!(
        findings == 0,
        "{findings} finding(s): the journal does not verify"
    );
    Ok(())
}

/// How [`replay_partitions`] spreads its work.
#[derive(Clone, Copy, Debug)]
pub struct Parallel {
    /// Each partition's rollback window (events).
    pub window: usize,
    /// Partitions replayed at once (at most the number of partitions).
    pub threads: usize,
    pub stall_timeout: Duration,
}

/// Replays the `journal` partitions within their bounds, `how.threads` at a time, each thread
/// with its own reader; `then` runs on the partition's thread after its replay (the dispatch
/// check reads more topics there). Outcomes come back in partition order.
pub fn replay_partitions(
    config: &Config,
    journal: &str,
    partitions: &[(i32, Bounds)],
    how: Parallel,
    progress: &Progress,
    then: impl Fn(&Scanner<'_>, &mut Outcome) -> anyhow::Result<()> + Sync,
) -> anyhow::Result<Vec<Outcome>> {
    let threads = how.threads.clamp(1, partitions.len().max(1));
    let then = &then;
    let codec = &schema_registry::reader_codec(config)?;
    let mut outcomes = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                scope.spawn(move || -> anyhow::Result<Vec<Outcome>> {
                    let consumer = reader(config, "replay")?;
                    let scanner = Scanner {
                        consumer: &consumer,
                        stall_timeout: how.stall_timeout,
                    };
                    let mut outcomes = Vec::new();
                    for &(p, bounds) in partitions.iter().skip(t).step_by(threads) {
                        let cursor = progress.partition(&bounds);
                        let mut outcome = replay_partition(
                            &scanner, codec, journal, p, bounds, how.window, cursor,
                        )?;
                        then(&scanner, &mut outcome)?;
                        outcomes.push(outcome);
                    }
                    Ok(outcomes)
                })
            })
            .collect();
        let mut all = Vec::new();
        for worker in workers {
            all.extend(
                worker
                    .join()
                    .map_err(|_| anyhow::anyhow!("a replay thread panicked"))??,
            );
        }
        anyhow::Ok(all)
    })?;
    outcomes.sort_by_key(|o| o.partition);
    Ok(outcomes)
}

/// Replays partition `p` of the journal within `bounds`.
fn replay_partition(
    scanner: &Scanner<'_>,
    codec: &Codec,
    journal: &str,
    p: i32,
    bounds: Bounds,
    window: usize,
    mut cursor: Cursor<'_>,
) -> anyhow::Result<Outcome> {
    let mut replay = PartitionReplay::new(p, window);
    scanner.scan(journal, p, bounds, |s: Scanned<'_>| -> anyhow::Result<()> {
        cursor.advance(s.offset);
        match s.admit {
            Admit::Marker(_) | Admit::Forged(_) => {}
            Admit::Fenced { .. } => replay.fenced(),
            Admit::Accept => match s.payload.map(|b| (b, codec.decode_as::<JournalEvent>(b))) {
                None => replay.undecodable(s.offset, "no value".to_owned()),
                Some((_, Err(e))) => replay.undecodable(s.offset, e.to_string()),
                Some((_, Ok(e))) if e.partition != p => replay.undecodable(
                    s.offset,
                    format!("the event names partition {}", e.partition),
                ),
                Some((bytes, Ok(e))) => replay.event(s.offset, bytes, e),
            },
        }
        Ok(())
    })?;
    Ok(replay.finish())
}

/// Every admitted dispatch command of `topic`'s partition `p` must have a journaled intent.
fn check_dispatch_topic(
    scanner: &Scanner<'_>,
    topic: &str,
    p: i32,
    bounds: Bounds,
    outcome: &mut Outcome,
) -> anyhow::Result<()> {
    let codec = Codec::new();
    scanner.scan(topic, p, bounds, |s: Scanned<'_>| -> anyhow::Result<()> {
        if s.admit != Admit::Accept || s.kind != Some(b"dispatch".as_slice()) {
            return Ok(());
        }
        outcome.counts.dispatches_checked += 1;
        match s.payload.map(|b| codec.decode_as::<DispatchCommand>(b)) {
            Some(Ok(d)) if outcome.invariants.intended(&d.operation_key, d.epoch) => {}
            Some(Ok(d)) => outcome.add(Finding::UnintendedDispatch {
                topic: topic.to_owned(),
                offset: s.offset,
                operation_key: d.operation_key,
                epoch: d.epoch,
            }),
            _ => outcome.add(Finding::UnintendedDispatch {
                topic: topic.to_owned(),
                offset: s.offset,
                operation_key: "(undecodable)".to_owned(),
                epoch: 0,
            }),
        }
        Ok(())
    })
}

fn report_text(
    journal: &str,
    outcomes: &[Outcome],
    dispatches: bool,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    writeln!(
        out,
        "replay of {journal}, reducer version {}",
        core::record::REDUCER_VERSION
    )?;
    for o in outcomes {
        let c = &o.counts;
        writeln!(
            out,
            "partition {}: {} events, {} checkpoints verified, {} copies skipped, {} fenced, {} orphans rolled back ({} rewinds){}, next sequence {}, projection {}",
            o.partition,
            c.events,
            c.checkpoints,
            c.duplicates,
            c.fenced,
            c.orphans,
            c.rewinds,
            if dispatches {
                format!(", {} dispatches checked", c.dispatches_checked)
            } else {
                String::new()
            },
            c.next_sequence,
            o.projection
        )?;
        if c.events > 0 && c.checkpoints == 0 {
            writeln!(
                out,
                "  (no checkpoint in range: nothing to verify the projection against)"
            )?;
        }
        for f in &o.findings {
            writeln!(out, "  FINDING partition {}: {f}", o.partition)?;
        }
        if c.findings > o.findings.len() as u64 {
            writeln!(
                out,
                "  … and {} more findings",
                c.findings - o.findings.len() as u64
            )?;
        }
    }
    let sum = |f: fn(&Outcome) -> u64| outcomes.iter().map(f).sum::<u64>();
    writeln!(
        out,
        "total: {} events, {} checkpoints verified, {} findings",
        sum(|o| o.counts.events),
        sum(|o| o.counts.checkpoints),
        sum(|o| o.counts.findings)
    )?;
    Ok(())
}

fn report_json(journal: &str, outcomes: &[Outcome], dispatches: bool) -> serde_json::Value {
    let partitions: Vec<_> = outcomes
        .iter()
        .map(|o| {
            let c = &o.counts;
            serde_json::json!({
                "partition": o.partition,
                "events": c.events,
                "checkpoints_verified": c.checkpoints,
                "copies_skipped": c.duplicates,
                "fenced": c.fenced,
                "orphans": c.orphans,
                "rewinds": c.rewinds,
                "dispatches_checked": dispatches.then_some(c.dispatches_checked),
                "next_sequence": c.next_sequence,
                "projection": o.projection,
                "findings_total": c.findings,
                "findings": o.findings.iter().map(|f| f.to_string()).collect::<Vec<_>>(),
            })
        })
        .collect();
    serde_json::json!({
        "journal": journal,
        "reducer_version": core::record::REDUCER_VERSION,
        "partitions": partitions,
        "findings": outcomes.iter().map(|o| o.counts.findings).sum::<u64>(),
    })
}

fn what_if(
    args: &Args,
    config: &Config,
    names: &Names,
    partitions: &[i32],
    scanner: &Scanner<'_>,
    candidate: &Path,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let t = &config.tools;
    let (registry, policy) = super::check::load(&t.registry, &t.policies, &t.entities)?;
    let in_force = Core::new(registry, policy, super::run::core_config(config));
    let (policies, entities) = if candidate.is_dir() {
        (
            candidate.join("policies.cedar"),
            candidate.join("entities.json"),
        )
    } else {
        (
            candidate.to_owned(),
            args.entities.clone().unwrap_or_else(|| t.entities.clone()),
        )
    };
    let (registry, policy) = super::check::load(&t.registry, &policies, &entities)?;
    let candidate = Core::new(registry, policy, super::run::core_config(config));
    let topic = names.proposals();
    let wanted: Vec<(String, i32)> = partitions.iter().map(|&p| (topic.clone(), p)).collect();
    let bounds: Vec<(i32, Bounds)> = partitions
        .iter()
        .copied()
        .zip(ends(
            scanner,
            config,
            args.read.read_only,
            &wanted,
            args.until_offset,
        )?)
        .collect();
    let total: i64 = bounds.iter().map(|(_, b)| b.high - b.low).sum();
    let progress = Progress::new("what-if", total);
    // Proposals in either framing (the clients write Confluent with a registry).
    let codec = schema_registry::reader_codec(config)?;
    let mut whatif = WhatIf::default();
    let mut undecodable = 0u64;
    for (p, b) in bounds {
        let mut cursor = progress.partition(&b);
        scanner.scan(&topic, p, b, |s: Scanned<'_>| -> anyhow::Result<()> {
            cursor.advance(s.offset);
            if s.kind == Some(wire::BARRIER_KIND.as_bytes()) {
                return Ok(());
            }
            match s.payload.map(|b| codec.decode_as::<ToolProposal>(b)) {
                Some(Ok(proposal)) => whatif.observe(&in_force, &candidate, &proposal),
                _ => undecodable += 1,
            }
            Ok(())
        })?;
    }
    progress.finish();
    let bundle = |c: &Core| c.policy().bundle_hash().to_owned();
    if args.read.json {
        let changes: Vec<_> = whatif
            .changes
            .iter()
            .map(|((before, after), (count, examples))| {
                serde_json::json!({
                    "from": format!("{}/{}", before.0.as_str(), before.1.as_str()),
                    "to": format!("{}/{}", after.0.as_str(), after.1.as_str()),
                    "count": count,
                    "examples": examples.iter().map(|e| serde_json::json!({
                        "proposal_id": e.proposal_id,
                        "operation_key": e.operation_key,
                        "principal_id": e.principal_id,
                        "tool": e.tool,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        writeln!(
            out,
            "{}",
            serde_json::json!({
                "in_force": bundle(&in_force),
                "candidate": bundle(&candidate),
                "evaluated": whatif.evaluated,
                "unchanged": whatif.unchanged,
                "changed": whatif.changed(),
                "undecodable": undecodable,
                "changes": changes,
            })
        )?;
        return Ok(());
    }
    writeln!(
        out,
        "what-if over {topic}: bundle in force {}, candidate {}",
        bundle(&in_force),
        bundle(&candidate)
    )?;
    writeln!(
        out,
        "{} proposals screened, {} unchanged, {} would be decided differently ({} records not proposals)",
        whatif.evaluated,
        whatif.unchanged,
        whatif.changed(),
        undecodable
    )?;
    for ((before, after), (count, examples)) in &whatif.changes {
        writeln!(
            out,
            "  {count:>8}  {}/{} -> {}/{}",
            before.0.as_str(),
            before.1.as_str(),
            after.0.as_str(),
            after.1.as_str()
        )?;
        for e in examples {
            writeln!(
                out,
                "            e.g. proposal {} key {} by {} ({})",
                e.proposal_id, e.operation_key, e.principal_id, e.tool
            )?;
        }
    }
    Ok(())
}

/// Where the scans of `wanted` end: at a barrier written now, or read-only at the high
/// watermarks (see [`crate::runtime::scan`]).
///
/// Read-only on Kafka the high watermark read now is the end, a closed bound: the processors
/// keep writing, and a scan left open would follow them for as long as they do. On a broker
/// whose watermark lags the last batch (`kafka.compatibility`) the bound stays open, and the
/// scan reads on until the broker goes quiet.
pub(super) fn ends(
    scanner: &Scanner<'_>,
    config: &Config,
    read_only: bool,
    wanted: &[(String, i32)],
    until: Option<i64>,
) -> anyhow::Result<Vec<Bounds>> {
    if read_only {
        let closed = config.kafka.compatibility.high_watermark_is_end();
        return wanted
            .iter()
            .map(|(t, p)| {
                let b = scanner.bounds(t, *p, until)?;
                Ok(Bounds {
                    open: b.open && !closed,
                    ..b
                })
            })
            .collect();
    }
    scanner
        .barrier_ends(&config.client_config(), wanted, until)
        .context("writing barrier records to learn where the partitions end (--read-only to write nothing)")
}

/// Which partitions a command reads or writes: every one by default.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct PartitionArgs {
    /// Only these partitions (repeatable or comma separated; all by default).
    #[arg(
        long = "partition",
        alias = "partitions",
        value_delimiter = ',',
        value_name = "N"
    )]
    pub partitions: Vec<i32>,
}

impl PartitionArgs {
    /// The partitions asked for, sorted and without repeats, each checked against the `count`
    /// the topics have; every partition when none is asked for.
    pub fn select(&self, count: i32) -> anyhow::Result<Vec<i32>> {
        partitions(&self.partitions, count)
    }

    /// Whether `partition` is one of those asked for (every one is when none is).
    pub fn includes(&self, partition: i32) -> bool {
        self.partitions.is_empty() || self.partitions.contains(&partition)
    }
}

/// The partitions asked for, checked against the topic's count.
fn partitions(asked: &[i32], count: i32) -> anyhow::Result<Vec<i32>> {
    if asked.is_empty() {
        return Ok((0..count).collect());
    }
    for &p in asked {
        anyhow::ensure!(
            (0..count).contains(&p),
            "partition {p} does not exist (the topics have {count} partitions)"
        );
    }
    let mut v = asked.to_vec();
    v.sort_unstable();
    v.dedup();
    Ok(v)
}

/// A consumer that only reads assigned partitions (no group membership, no commits).
pub fn reader(config: &Config, role: &str) -> anyhow::Result<BaseConsumer> {
    config
        .client_config()
        .set("group.id", format!("{}{role}", config.topics.prefix))
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .create()
        .context("creating the Kafka reader")
}

/// Progress on standard error: a line redrawn in place on a terminal, a line every ten
/// seconds otherwise, nothing for short runs. Shared by the threads reading partitions; each
/// reads through a [`Cursor`].
#[derive(Debug)]
pub struct Progress {
    what: &'static str,
    total: i64,
    done: AtomicI64,
    started: Instant,
    shown: Mutex<Instant>,
    tty: bool,
    printed: AtomicBool,
}

/// One partition's read, counted into its [`Progress`]; what it did not reach counts as done
/// when it is dropped (the partition is finished).
#[derive(Debug)]
pub struct Cursor<'p> {
    progress: &'p Progress,
    at: i64,
    high: i64,
}

impl Cursor<'_> {
    /// The record at `offset` was read.
    pub fn advance(&mut self, offset: i64) {
        let to = (offset + 1).min(self.high);
        if to > self.at {
            self.progress.add(to - self.at);
            self.at = to;
        }
    }
}

impl Drop for Cursor<'_> {
    fn drop(&mut self) {
        if self.high > self.at {
            self.progress.add(self.high - self.at);
        }
    }
}

impl Progress {
    pub fn new(what: &'static str, total: i64) -> Self {
        let now = Instant::now();
        Progress {
            what,
            total: total.max(1),
            done: AtomicI64::new(0),
            started: now,
            shown: Mutex::new(now),
            tty: std::io::stderr().is_terminal(),
            printed: AtomicBool::new(false),
        }
    }

    /// A cursor over one partition's `bounds`.
    pub fn partition(&self, bounds: &Bounds) -> Cursor<'_> {
        Cursor {
            progress: self,
            at: bounds.low,
            high: bounds.high,
        }
    }

    pub fn finish(&self) {
        if self.printed.load(Ordering::Relaxed) && self.tty {
            eprintln!();
        }
    }

    fn add(&self, records: i64) {
        let done = self.done.fetch_add(records, Ordering::Relaxed) + records;
        let every = if self.tty {
            Duration::from_millis(250)
        } else {
            Duration::from_secs(10)
        };
        // Whoever holds the lock prints; the others go on reading.
        let Ok(mut shown) = self.shown.try_lock() else {
            return;
        };
        if shown.elapsed() < every || self.started.elapsed() < Duration::from_secs(1) {
            return;
        }
        *shown = Instant::now();
        let secs = self.started.elapsed().as_secs_f64().max(0.001);
        let line = format!(
            "{}: {done}/{} records ({:.0}%), {:.0} records/s",
            self.what,
            self.total,
            100.0 * done as f64 / self.total as f64,
            done as f64 / secs
        );
        if self.tty {
            eprint!("\r{line}   ");
        } else {
            eprintln!("{line}");
        }
        self.printed.store(true, Ordering::Relaxed);
    }
}
