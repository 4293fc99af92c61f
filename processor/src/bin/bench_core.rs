//! `airlock-bench-core`: decisions per second through the core over the RocksDB store, on one
//! thread, with the whole per-record path a task runs: Avro decode of the proposal, canonical
//! arguments and hash, JSON Schema validation, tenant binding, invariants, Cedar policy, state
//! reads and staged writes, and Avro encode of every output (dispatch, decision, journal).
//! Batches are committed to RocksDB (one `WriteBatch`, fsync'd) as the runtime would.
//!
//! Phases, all in one run so the ratios compare like with like:
//! - `baseline`: Avro decode of the proposal and encode of one output record, nothing else;
//! - `fresh-mem`: new operation keys over the in-memory store (isolates the core from RocksDB);
//! - `fresh`: new operation keys (every proposal dispatches);
//! - `resend`: the same proposal ids again (producer-side resends, answered from dedup state);
//! - `retry`: new proposal ids for keys already in flight (full validation, IN_PROGRESS);
//! - `task`: the fresh proposals again, on a store of their own, through the partition task of
//!   `airlock run` (input record, decision, every output as an outbox record with its identity
//!   headers, the changelog record of every changed row, one outbox row per batch, the fsync'd
//!   commit, the acknowledgement): all the runtime does per record but the broker's, so its
//!   ratio to `fresh` is what the Kafka shell adds to the core before its producer.
//!
//! Then the cost of each step alone, on the same proposals: canonical arguments, JSON Schema
//! and invariants, Cedar, and the three state reads of a decision (proposal id, run, operation
//! key) over the RocksDB store the phases filled, for a fresh proposal (two misses) and a known
//! one (three rows found and decoded, and how much of that is the JSON decode).
//!
//! Usage: `airlock-bench-core [--proposals N] [--batch N] [--no-sync] [--background-write-mib N
//! [--background-write-auto-tune]]`; the last two set the RocksDB rate limiter of
//! `state.background_write_*`. Both stores report the memtable flushes and write stalls their
//! RocksDB `LOG` recorded (a limit below what its flushes and compactions must write at this
//! rate piles up level 0).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_processor::core::{self, Core};
use airlock_processor::runtime::config::Config as RuntimeConfig;
use airlock_processor::runtime::decide;
use airlock_processor::runtime::partition::{self, InputRecord, PartitionTask, Source};
use airlock_processor::runtime::topics::Names;
use airlock_processor::sample;
use airlock_processor::store::rocks::RocksOptions;
use airlock_processor::store::{RocksBackend, StateStore, Store};
use airlock_processor::task::Task;
use airlock_schemas::ToolProposal;
use airlock_schemas::codec::Codec;
use anyhow::Context;
use hdrhistogram::Histogram;

/// The allocator of the `airlock` binary (see `main.rs`), so that the figures are its figures.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const T0: i64 = 1_790_000_000_000;

struct Phase {
    name: &'static str,
    count: usize,
    elapsed: Duration,
    per_record: Histogram<u64>,
    per_commit: Histogram<u64>,
}

impl Phase {
    fn new(name: &'static str) -> Self {
        Phase {
            name,
            count: 0,
            elapsed: Duration::ZERO,
            per_record: Histogram::new(3).expect("3 significant digits is a valid histogram"),
            per_commit: Histogram::new(3).expect("3 significant digits is a valid histogram"),
        }
    }

    fn rate(&self) -> f64 {
        self.count as f64 / self.elapsed.as_secs_f64()
    }

    fn report(&self, baseline: Option<&Phase>) {
        let ratio = baseline.map_or(String::new(), |b| {
            format!("  ratio to baseline {:.3}", self.rate() / b.rate())
        });
        println!(
            "{:<9} {:>8} records  {:>10.0} /s  p50 {:>6.2} µs  p99 {:>7.2} µs  commit p50 {:>7.2} ms p99 {:>7.2} ms{ratio}",
            self.name,
            self.count,
            self.rate(),
            self.per_record.value_at_quantile(0.50) as f64 / 1000.0,
            self.per_record.value_at_quantile(0.99) as f64 / 1000.0,
            self.per_commit.value_at_quantile(0.50) as f64 / 1e6,
            self.per_commit.value_at_quantile(0.99) as f64 / 1e6,
        );
    }
}

struct Args {
    proposals: usize,
    batch: usize,
    /// The settings of both stores: fsync and the background write limit.
    rocks: RocksOptions,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        proposals: 50_000,
        batch: 500,
        rocks: RocksOptions::default(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--proposals" => args.proposals = it.next().context("--proposals N")?.parse()?,
            "--batch" => args.batch = it.next().context("--batch N")?.parse()?,
            "--no-sync" => args.rocks.sync = false,
            "--background-write-mib" => {
                args.rocks.background_write_mib_per_s =
                    it.next().context("--background-write-mib N")?.parse()?;
            }
            "--background-write-auto-tune" => args.rocks.background_write_auto_tune = true,
            "--help" | "-h" => {
                println!(
                    "airlock-bench-core [--proposals N] [--batch N] [--no-sync] \
                     [--background-write-mib N [--background-write-auto-tune]]"
                );
                std::process::exit(0);
            }
            other => anyhow::bail!("unknown argument {other:?}; try --help"),
        }
    }
    anyhow::ensure!(
        args.proposals > 0 && args.batch > 0,
        "counts must be positive"
    );
    anyhow::ensure!(
        !args.rocks.background_write_auto_tune || args.rocks.background_write_mib_per_s > 0,
        "--background-write-auto-tune tunes below --background-write-mib N: give both"
    );
    Ok(args)
}

fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let codec = Codec::new();
    let core = Arc::new(sample::reference_core(core::Config::default())?);
    let dir = tempfile::tempdir().context("temporary directory for RocksDB")?;
    let backend = RocksBackend::open(dir.path(), &args.rocks)?;
    let mut task = Task::new(
        core.clone(),
        StateStore::open(backend)?,
        sample::task_context(0),
    )?;
    let mut memory_task = sample::memory_task(core.clone())?;

    let proposals: Vec<ToolProposal> = (0..args.proposals)
        .map(|i| {
            let mut p = sample::fleet_refund(&format!("refund:bench:{i}"), i, T0);
            p.proposal_id = format!("bench-{i}");
            p
        })
        .collect();
    let encode = |ps: &[ToolProposal]| -> anyhow::Result<Vec<Vec<u8>>> {
        ps.iter()
            .map(|p| Ok(codec.encode_single_object(p)?))
            .collect()
    };
    let fresh = encode(&proposals)?;
    let retries = encode(
        &proposals
            .iter()
            .map(|p| sample::resend(p, 1))
            .collect::<Vec<_>>(),
    )?;

    println!(
        "airlock-bench-core: {} proposals, batches of {}, RocksDB fsync {}, background writes {}, \
         one thread",
        args.proposals,
        args.batch,
        if args.rocks.sync { "on" } else { "off" },
        match (
            args.rocks.background_write_mib_per_s,
            args.rocks.background_write_auto_tune
        ) {
            (0, _) => "unlimited".to_owned(),
            (mib, false) => format!("at most {mib} MiB/s"),
            (mib, true) => format!("at most {mib} MiB/s, auto-tuned"),
        }
    );

    // Baseline: decode the proposal, encode one output record of the same size class.
    let mut baseline = Phase::new("baseline");
    let started = Instant::now();
    for bytes in &fresh {
        let t = Instant::now();
        let p: ToolProposal = codec.decode_single_object(bytes)?;
        let out = codec.encode_single_object(&p)?;
        std::hint::black_box(out);
        baseline.per_record.record(t.elapsed().as_nanos() as u64)?;
        baseline.count += 1;
    }
    baseline.elapsed = started.elapsed();

    fn run<S: Store>(
        task: &mut Task<S>,
        codec: &Codec,
        batch: usize,
        name: &'static str,
        payloads: &[Vec<u8>],
    ) -> anyhow::Result<Phase> {
        let mut phase = Phase::new(name);
        let started = Instant::now();
        let mut outputs = 0usize;
        for chunk in payloads.chunks(batch) {
            for bytes in chunk {
                let t = Instant::now();
                outputs += sample::decide_encoded(task, codec, bytes)?;
                phase.per_record.record(t.elapsed().as_nanos() as u64)?;
            }
            let t = Instant::now();
            task.commit()?;
            phase.per_commit.record(t.elapsed().as_nanos() as u64)?;
            phase.count += chunk.len();
        }
        phase.elapsed = started.elapsed();
        std::hint::black_box(outputs);
        Ok(phase)
    }
    let fresh_memory = run(&mut memory_task, &codec, args.batch, "fresh-mem", &fresh)?;
    let fresh_phase = run(&mut task, &codec, args.batch, "fresh", &fresh)?;
    let resend_phase = run(&mut task, &codec, args.batch, "resend", &fresh)?;
    let retry_phase = run(&mut task, &codec, args.batch, "retry", &retries)?;
    let core_log = StoreLog::read(dir.path())?;
    let (task_phase, sealed) = shell(core, &codec, &args, &proposals, &fresh)?;

    baseline.report(None);
    for phase in [
        &fresh_memory,
        &fresh_phase,
        &resend_phase,
        &retry_phase,
        &task_phase,
    ] {
        phase.report(Some(&baseline));
    }
    println!(
        "task: {:.2} output records and {} outbox bytes per proposal; rate ratio to fresh {:.3} \
         (the shell's share of a record's time before the producer: {:.0}%)",
        sealed.outputs as f64 / task_phase.count as f64,
        sealed.outbox_bytes / task_phase.count.max(1),
        task_phase.rate() / fresh_phase.rate(),
        100.0 * (1.0 - task_phase.rate() / fresh_phase.rate()),
    );
    for (phases, log) in [("fresh, resend, retry", &core_log), ("task", &sealed.log)] {
        println!(
            "{phases}: {} memtable flushes, {} write stalls in RocksDB's LOG{}",
            log.flushes,
            log.stalls.len(),
            log.stalls
                .last()
                .map(|line| format!(", the last: {line}"))
                .unwrap_or_default()
        );
    }
    let per = task_phase.count.max(1) as f64;
    for (topic, (records, values, headers)) in &sealed.by_topic {
        println!(
            "  {topic:<18} {:>5.2} records, {:>6.0} value bytes, {:>5.0} header bytes per proposal",
            *records as f64 / per,
            *values as f64 / per,
            *headers as f64 / per,
        );
    }
    components(&mut task, args.batch, &proposals)?;
    println!(
        "targets: fresh >= 50000/s: {}; duplicates (resend) >= 200000/s: {}",
        verdict(fresh_phase.rate() >= 50_000.0),
        verdict(resend_phase.rate() >= 200_000.0)
    );
    Ok(())
}

/// What the `task` phase's batches sealed into the outbox.
struct Sealed {
    /// Output records (phase 0 and changelog records).
    outputs: usize,
    /// The outbox rows they made, in bytes as stored (`Counters::outbox_bytes`).
    outbox_bytes: usize,
    /// Per output topic (its name without the prefix): records, value bytes, header bytes.
    by_topic: BTreeMap<String, (usize, usize, usize)>,
    /// What the store's RocksDB `LOG` says of its flushes and stalls.
    log: StoreLog,
}

/// What a store's RocksDB `LOG` recorded of the write path.
struct StoreLog {
    /// Memtable flushes started: how often the batches' writes filled a memtable.
    flushes: usize,
    /// The lines that slowed or stopped writes ("Stalling writes ...", "Stopping writes ...":
    /// level 0 or the memtables piled up faster than flushes and compactions cleared them).
    stalls: Vec<String>,
}

impl StoreLog {
    fn read(dir: &std::path::Path) -> anyhow::Result<StoreLog> {
        let path = dir.join("LOG");
        let log = std::fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?;
        Ok(StoreLog {
            flushes: log.matches(r#""event": "flush_started""#).count(),
            stalls: log
                .lines()
                .filter(|line| line.contains("Stalling writes") || line.contains("Stopping writes"))
                .map(str::to_owned)
                .collect(),
        })
    }
}

/// The `task` phase: `payloads` (the encoded `proposals`) as offsets 0.. of partition 0 of the
/// proposals topic, through a [`PartitionTask`] over a RocksDB store of its own, batch by batch
/// as `decide` runs one partition's share of a batch (each record after the timers its time
/// brings due, then `decide::close`: timers, checkpoint, ticks, changelog sweep, the deferred
/// seal) and as the sender then completes it (the fsync, then, once the
/// broker would have acknowledged the outputs, the outbox row marked done, staged into the
/// next batch). Returns the phase and what the batches sealed. Not inlined, so
/// that callgrind can count it alone (`--toggle-collect='airlock_bench_core::shell'`).
#[inline(never)]
fn shell(
    core: Arc<Core>,
    codec: &Codec,
    args: &Args,
    proposals: &[ToolProposal],
    payloads: &[Vec<u8>],
) -> anyhow::Result<(Phase, Sealed)> {
    // As `airlock run` closes a batch, at one fixed time: no attempt's timer falls due. One
    // partition, so one thread.
    let settings = decide::Settings {
        threads: 1,
        ..decide::Settings::of(&RuntimeConfig::default().processor, T0)
    };
    let dir = tempfile::tempdir().context("temporary directory for the task's RocksDB")?;
    let backend = RocksBackend::open(dir.path(), &args.rocks)?;
    let names = Names::new("bench.");
    let topic = names.proposals();
    let mut task = PartitionTask::new(
        core,
        StateStore::open(backend)?,
        sample::task_context(0),
        names,
        codec.clone(),
        1,
    )?;
    let mut phase = Phase::new("task");
    let mut outputs = 0;
    let mut by_topic: BTreeMap<String, (usize, usize, usize)> = BTreeMap::new();
    let mut offset = 0i64;
    let started = Instant::now();
    for (chunk, payloads) in proposals
        .chunks(args.batch)
        .zip(payloads.chunks(args.batch))
    {
        let mut last = None;
        for (p, payload) in chunk.iter().zip(payloads) {
            let t = Instant::now();
            let key = p.operation_key.as_bytes();
            task.advance_clock(
                Source::Proposals,
                p.proposed_at,
                settings.now,
                settings.timers_per_batch,
            )?;
            task.handle_record(&InputRecord {
                source: Source::Proposals,
                topic: &topic,
                offset,
                key: Some(key),
                payload: Some(payload),
                timestamp: p.proposed_at,
                capability: None,
            })?;
            last = Some((offset, p.proposed_at, key, payload));
            offset += 1;
            phase.per_record.record(t.elapsed().as_nanos() as u64)?;
        }
        let t = Instant::now();
        if let Some((offset, at, key, payload)) = last {
            let print = partition::fingerprint(Some(at), Some(key), Some(payload));
            task.note_last_consumed(&topic, offset, print);
        }
        let (sealed, unsynced) = decide::close(&mut task, settings)?;
        if let Some(sync) = unsynced {
            sync.sync()?;
        }
        if !sealed.records.is_empty() {
            outputs += sealed.records.len();
            for r in &sealed.records {
                let topic = r.topic.strip_prefix("bench.").unwrap_or(&r.topic);
                let entry = by_topic.entry(topic.to_owned()).or_default();
                entry.0 += 1;
                entry.1 += r.value.as_ref().map_or(0, Vec::len);
                entry.2 += r
                    .headers
                    .iter()
                    .map(|(k, v)| k.len() + v.len())
                    .sum::<usize>();
            }
            task.acknowledged(sealed.row, None);
        }
        phase.per_commit.record(t.elapsed().as_nanos() as u64)?;
        phase.count += chunk.len();
    }
    phase.elapsed = started.elapsed();
    Ok((
        phase,
        Sealed {
            outputs,
            outbox_bytes: task.counters.outbox_bytes as usize,
            by_topic,
            log: StoreLog::read(dir.path())?,
        },
    ))
}

/// Where a fresh decision's time goes: the pure steps of the validation order, one at a time,
/// on the same proposals, so a regression points at its step; then the state reads a decision
/// makes, over the store the phases left behind.
fn components<S: Store>(
    task: &mut Task<S>,
    batch: usize,
    proposals: &[ToolProposal],
) -> anyhow::Result<()> {
    use airlock_processor::core::canonical;
    use airlock_processor::core::policy::AuthzRequest;

    let core = task.core();
    let tool = core
        .registry()
        .lookup("refund", "1")
        .map_err(|e| anyhow::anyhow!("the reference registry has refund v1: {e:?}"))?;
    let canon: Vec<_> = proposals
        .iter()
        .map(|p| canonical::canonicalize(&p.arguments_json))
        .collect::<Result<_, _>>()?;
    let time = |name: &str, f: &mut dyn FnMut(usize)| {
        let started = Instant::now();
        for i in 0..proposals.len() {
            f(i);
        }
        let per = started.elapsed().as_secs_f64() * 1e6 / proposals.len() as f64;
        println!("  component {name:<28} {per:>7.2} µs");
    };
    println!("per fresh decision, by step:");
    time("canonical JSON + SHA-256", &mut |i| {
        std::hint::black_box(canonical::canonicalize(&proposals[i].arguments_json).ok());
    });
    time("JSON Schema + invariants", &mut |i| {
        std::hint::black_box(tool.validate_arguments(&canon[i].value).is_ok());
        std::hint::black_box(tool.check_invariants(&canon[i].value).is_ok());
    });
    time("Cedar authorize_invoke", &mut |i| {
        let p = &proposals[i];
        std::hint::black_box(core.policy().authorize_invoke(&AuthzRequest {
            principal: &p.principal_id,
            tenant: &p.tenant_id,
            tool: &p.tool,
            tool_version: &p.tool_version,
            resource: "acct-42",
            run_id: &p.run_id,
            arguments: &canon[i].value,
        }));
    });
    println!("per decision, state reads (proposal id, run, operation key):");
    reads(task, batch, proposals, true)?;
    reads(task, batch, proposals, false)?;
    decoding(task, batch, proposals)?;
    Ok(())
}

/// The three reads `handle_proposal` makes before deciding (its proposal id, its run, its
/// operation key), over the store the phases left behind: for proposals never seen (id and key
/// miss, the run is found) or for the proposals of the phases (all three found and decoded). The
/// store caches what it read until its batch ends, so the cache is dropped every `batch`
/// proposals, as a commit drops it.
fn reads<S: Store>(
    task: &mut Task<S>,
    batch: usize,
    proposals: &[ToolProposal],
    fresh: bool,
) -> anyhow::Result<()> {
    let names: Vec<(String, String)> = proposals
        .iter()
        .map(|p| match fresh {
            true => (
                format!("unseen-{}", p.proposal_id),
                format!("unseen:{}", p.operation_key),
            ),
            false => (p.proposal_id.clone(), p.operation_key.clone()),
        })
        .collect();
    // Time spent and rows found, per table read.
    let mut tables = [(Duration::ZERO, 0usize); 3];
    let mut tally = |table: usize, t: Instant, found: bool| {
        tables[table].0 += t.elapsed();
        tables[table].1 += usize::from(found);
    };
    for (chunk, names) in proposals.chunks(batch).zip(names.chunks(batch)) {
        let store = task.store();
        for (p, (id, key)) in chunk.iter().zip(names) {
            let t = Instant::now();
            let found = store.proposal(id)?.is_some();
            tally(0, t, found);
            let t = Instant::now();
            let found = store.run(&p.run_id)?.is_some();
            tally(1, t, found);
            let t = Instant::now();
            let found = store.effect(key)?.is_some();
            tally(2, t, found);
        }
        task.store_mut().discard();
    }
    let per = |d: Duration| d.as_secs_f64() * 1e6 / proposals.len() as f64;
    let total = tables.iter().map(|(d, _)| *d).sum::<Duration>();
    let name = if fresh {
        "of a fresh proposal"
    } else {
        "of a known proposal"
    };
    let detail = ["proposal", "run", "effect"]
        .iter()
        .zip(tables)
        .map(|(table, (d, found))| format!("{table} {:.2} µs, {found} found", per(d)))
        .collect::<Vec<_>>()
        .join("; ");
    println!("  component {name:<28} {:>7.2} µs  ({detail})", per(total));
    Ok(())
}

/// Of the reads of a known proposal, the JSON decode of its three rows alone: the rows are
/// fetched first, untimed, with the store's read cache dropped every `batch` proposals as in
/// [`reads`].
fn decoding<S: Store>(
    task: &mut Task<S>,
    batch: usize,
    proposals: &[ToolProposal],
) -> anyhow::Result<()> {
    use airlock_processor::core::{EffectRecord, ProposalSeen, RunRecord};
    use airlock_processor::store::{codec, keys::Table};

    let mut elapsed = Duration::ZERO;
    for chunk in proposals.chunks(batch) {
        let store = task.store();
        for p in chunk {
            let row = |table: Table, id: &str| -> anyhow::Result<Vec<u8>> {
                store
                    .get_raw(table, id.as_bytes())?
                    .with_context(|| format!("{table:?} row {id} was written by the phases"))
            };
            let proposal = row(Table::Proposal, &p.proposal_id)?;
            let run = row(Table::Run, &p.run_id)?;
            let effect = row(Table::Effect, &p.operation_key)?;
            let t = Instant::now();
            let seen: ProposalSeen = codec::decode(Table::Proposal, &p.proposal_id, &proposal)?;
            let run: RunRecord = codec::decode(Table::Run, &p.run_id, &run)?;
            let effect: EffectRecord = codec::decode(Table::Effect, &p.operation_key, &effect)?;
            std::hint::black_box((seen, run, effect));
            elapsed += t.elapsed();
        }
        task.store_mut().discard();
    }
    println!(
        "  component {:<28} {:>7.2} µs",
        "  of which JSON decode",
        elapsed.as_secs_f64() * 1e6 / proposals.len() as f64
    );
    Ok(())
}

fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "MISSED" }
}
