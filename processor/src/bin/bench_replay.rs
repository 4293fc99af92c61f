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
//! Usage: `airlock-bench-replay [--proposals N] [--checkpoint-every N] [--window N]`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_processor::audit::replay::PartitionReplay;
use airlock_processor::core::{self, Input};
use airlock_processor::runtime::partition::{changelog_table, store_table};
use airlock_processor::sample;
use airlock_processor::store::rocks::RocksOptions;
use airlock_processor::store::{RocksBackend, StateStore, Store};
use airlock_schemas::codec::Codec;
use airlock_schemas::{ChangelogRecord, JournalEvent, OutcomeKind};
use anyhow::Context;
use hdrhistogram::Histogram;

const T0: i64 = 1_790_000_000_000;
/// Records per measured slice: the percentiles are of slices, not of single records, so the
/// clock's own cost does not dominate.
const SLICE: usize = 100;

struct Phase {
    name: &'static str,
    count: usize,
    elapsed: Duration,
    per_slice: Histogram<u64>,
}

impl Phase {
    fn measure(
        name: &'static str,
        n: usize,
        mut step: impl FnMut(usize) -> anyhow::Result<()>,
    ) -> anyhow::Result<Phase> {
        let mut per_slice = Histogram::new(3).expect("3 significant digits is a valid histogram");
        let started = Instant::now();
        let mut i = 0;
        while i < n {
            let t = Instant::now();
            let end = (i + SLICE).min(n);
            for j in i..end {
                step(j)?;
            }
            per_slice.record((t.elapsed().as_nanos() / (end - i) as u128) as u64)?;
            i = end;
        }
        Ok(Phase {
            name,
            count: n,
            elapsed: started.elapsed(),
            per_slice,
        })
    }

    fn rate(&self) -> f64 {
        self.count as f64 / self.elapsed.as_secs_f64()
    }

    fn report(&self, baseline: Option<&Phase>) {
        let ratio = baseline.map_or(String::new(), |b| {
            format!("  ratio to {} {:.3}", b.name, self.rate() / b.rate())
        });
        println!(
            "{:<15} {:>8} records  {:>10.0} /s  per record p50 {:>6.2} µs  p99 {:>6.2} µs{ratio}",
            self.name,
            self.count,
            self.rate(),
            self.per_slice.value_at_quantile(0.50) as f64 / 1000.0,
            self.per_slice.value_at_quantile(0.99) as f64 / 1000.0,
        );
    }
}

struct Args {
    proposals: usize,
    checkpoint_every: usize,
    window: usize,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        proposals: 100_000,
        checkpoint_every: 1_000,
        window: 10_000,
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
            "--help" | "-h" => {
                println!(
                    "airlock-bench-replay [--proposals N] [--checkpoint-every N] [--window N]"
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
    println!(
        "targets: replay >= 200000 events/s: {}",
        if replay_phase.rate() >= 200_000.0 {
            "met"
        } else {
            "MISSED"
        }
    );
    Ok(())
}
