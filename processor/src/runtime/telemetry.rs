//! What `airlock run` tells operators (DESIGN.md section 9): its Prometheus metrics and the
//! liveness and readiness it reports on the telemetry endpoint (`crate::telemetry::server`).
//!
//! # Metrics
//!
//! | metric | type | labels | meaning |
//! | --- | --- | --- | --- |
//! | `airlock_decisions_total` | counter | `verdict`, `reason` | every decision emitted (replies to proposals, approvals and controls, settlements, timeouts, refusals) |
//! | `airlock_decision_latency_seconds` | histogram | `input` | input record timestamp → its decision acknowledged by the broker |
//! | `airlock_inputs_total` | counter | `input` | input records decided or dead-lettered |
//! | `airlock_dead_letters_total` | counter | `reason` | input records sent to the DLQ |
//! | `airlock_batches_total` | counter | | batches that consumed at least one input |
//! | `airlock_records_produced_total` | counter | | output records acknowledged |
//! | `airlock_outbox_backlog` | gauge | `partition` | outbox records sealed and not yet acknowledged |
//! | `airlock_state_writes_stopped` | gauge | `partition` | 1 while RocksDB stops the partition store's writes (memtables or level-0 files waiting for a flush or compaction): batches cannot commit |
//! | `airlock_state_delayed_write_rate_bytes` | gauge | `partition` | bytes per second RocksDB slows the store's writes to; 0 when it does not |
//! | `airlock_state_level0_files` | gauge | `partition` | SST files in the store's level 0 (RocksDB slows writes at 20, stops them at 36) |
//! | `airlock_dispatches_total` | counter | | dispatch commands: attempts |
//! | `airlock_logical_calls_total` | counter | | first dispatches (epoch 1): logical calls |
//! | `airlock_retry_amplification` | gauge | | attempts / logical calls since start |
//! | `airlock_outstanding_effects` | gauge | `partition`, `state`, `older_than` | effects in UNKNOWN, OPERATOR_REQUIRED or AWAITING_APPROVAL for longer than `older_than` (`0s`, `1m`, `10m`, `1h`, `1d`) |
//! | `airlock_outstanding_oldest_seconds` | gauge | `partition`, `state` | age of the oldest of them |
//! | `airlock_restored_records_total` | counter | | changelog records applied while claiming partitions |
//! | `airlock_restore_torn_rows_total` | counter | | changelog rows of a previous owner's last batch that never reached the changelog whole, dropped while claiming (their inputs are decided again) |
//! | `airlock_partitions_restoring` | gauge | | partitions being claimed right now |
//! | `airlock_partitions_owned` | gauge | | partitions this instance owns |
//! | `airlock_claims_total` | counter | `local_state` | partition claims, `reused` or `rebuilt` state |
//! | `airlock_claims_failed_total` | counter | `transient` | partition claims that failed; `true`: the instance leaves and rejoins its group after a pause (2 s doubling to 30 s), `false`: it stops |
//! | `airlock_consumer_lag` | gauge | `topic`, `partition` | high watermark − next offset to consume, per owned input partition |
//! | `airlock_consumer_errors_total` | counter | `code` | errors the input consumer reported (librdkafka's code: `UnknownTopicOrPartition`, `TopicAuthorizationFailed`, ...) |
//! | `airlock_producer_time_inputs_total` | counter | `input` | input records whose time (`now`) is their producer's timestamp (CreateTime), not the broker's: the topic lacks `message.timestamp.type=LogAppendTime` or the broker ignores it (`compat`); agents then set the clock deadlines and approval expiries are judged by (barrier records included) |
//!
//! Outstanding effects come from a scan of each task's effect table, at most
//! [`SCAN_ROWS_BUSY`] rows per task after a batch of inputs (the next batch's records wait for
//! it) and [`SCAN_ROWS_IDLE`] after a turn of the loop without any, one full pass every
//! [`SCAN_INTERVAL`] at most: exact
//! after every pass whatever happened before (restores, crashes, re-decided inputs), with
//! bounded work per batch. An index maintained from the journal would be fresher but must be
//! rebuilt by a full scan on every claim anyway, and it drifts if one event is missed. Ages are
//! recomputed against the wall clock every batch from the last pass's timestamps.
//!
//! # Probes
//!
//! `/healthz` fails when the batch loop (or a restore it runs) made no progress for
//! `telemetry.stall_after_ms`, or the loop stopped on an error. `/readyz` succeeds only when
//! the instance has joined its group, is not stopping, claims no partition right now, and has
//! claimed every partition it was assigned, and the input consumer reported no error in the
//! last minute (`CONSUMER_ERROR_HOLD`: a deleted or unauthorized input topic, an unreachable
//! coordinator; the loop goes on meanwhile, since librdkafka retries and no restart would
//! help, so `/healthz` stays green).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use airlock_schemas::{Decision, Reason, Verdict};

use super::partition::Source;
use crate::core::record::{EffectRecord, State};
use crate::store::{self, Backend, StateStore, keys::Table};
use crate::telemetry::health::Health;
use crate::telemetry::metrics::{Counter, Gauge, Histogram, LATENCY_BUCKETS, Registry};
use crate::telemetry::server::Probes;

/// Effect rows the outstanding-effects scan reads per task after a turn of the batch loop that
/// had no input: nothing waits for it.
pub const SCAN_ROWS_IDLE: usize = 1_000;
/// Effect rows the scan reads per task after a batch of inputs, on the polling thread, before
/// the next batch is read. At 1,000 (the idle figure) a pass over ≈ 30,000 rows per partition
/// held each batch 7–13 ms for ≈ 0.6 s every 5 s at 11,500 proposals/s on the 2-core dev
/// machine (`AIRLOCK_LOG=debug`'s "sent in"; the p99's change was inside the run-to-run
/// spread), and with millions of effects per partition a pass never ends, so that would be a
/// few ms on every batch for good. Under load a pass takes longer: rows per partition / 100
/// batches (a minute for ≈ 30,000 rows in batches of 2,000 per partition); the ages it
/// publishes are minutes apart (1m, 10m, 1h, 24h).
pub const SCAN_ROWS_BUSY: usize = 100;
/// A new pass of the outstanding-effects scan starts at most this often.
pub const SCAN_INTERVAL: Duration = Duration::from_secs(5);
/// How often consumer lag is read (librdkafka's statistics: no request of its own).
pub const LAG_INTERVAL: Duration = Duration::from_secs(1);

/// The `older_than` thresholds of `airlock_outstanding_effects`, in milliseconds.
const AGES: &[(&str, i64)] = &[
    ("0s", 0),
    ("1m", 60_000),
    ("10m", 600_000),
    ("1h", 3_600_000),
    ("1d", 86_400_000),
];
/// The states an effect can wait in without anyone moving it along by themselves.
const OUTSTANDING: &[&str] = &["UNKNOWN", "OPERATOR_REQUIRED", "AWAITING_APPROVAL"];

/// What one task observed in one batch (`PartitionTask::take_observed`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Observed {
    /// Every decision staged, by verdict and reason.
    pub decisions: Vec<(Verdict, Reason)>,
    /// The input and its record timestamp, for each input that yielded a decision.
    pub decided: Vec<(Source, i64)>,
    /// Input records by source (decided or dead-lettered).
    pub inputs: Vec<Source>,
    /// Input records read with their producer's timestamp (CreateTime), barriers included.
    pub producer_time: Vec<Source>,
    /// The reason code of each dead letter (a `Reason`'s name, or `UNSIGNED` / `FORGED`).
    pub dead_letters: Vec<&'static str>,
    /// Dispatch commands staged: attempts.
    pub dispatches: u64,
    /// Of which epoch 1: logical calls.
    pub first_dispatches: u64,
}

impl Observed {
    pub fn decision(&mut self, d: &Decision) {
        self.decisions.push((d.verdict, d.reason));
    }
}

/// The name of an input source in metric labels.
pub fn source_label(s: Source) -> &'static str {
    match s {
        Source::Proposals => "proposal",
        Source::Approvals => "approval",
        Source::Outcomes => "outcome",
        Source::Control => "control",
    }
}

/// Adds `sources` to `counter`, one series update per input topic (not per record: each
/// update builds its label key and takes the family's lock).
fn add_by_source(counter: &Counter, sources: &[Source]) {
    let mut tally: Vec<(Source, u64)> = Vec::new();
    for &source in sources {
        match tally.iter_mut().find(|(s, _)| *s == source) {
            Some((_, n)) => *n += 1,
            None => tally.push((source, 1)),
        }
    }
    for (source, n) in tally {
        counter.add(&[source_label(source)], n);
    }
}

/// The processor's metric families, health and readiness.
pub struct Telemetry {
    pub registry: Arc<Registry>,
    pub decisions: Arc<Counter>,
    pub decision_latency: Arc<Histogram>,
    pub inputs: Arc<Counter>,
    pub dead_letters: Arc<Counter>,
    pub batches: Arc<Counter>,
    pub produced: Arc<Counter>,
    pub outbox_backlog: Arc<Gauge>,
    pub state_writes_stopped: Arc<Gauge>,
    pub state_delayed_write_rate: Arc<Gauge>,
    pub state_level0_files: Arc<Gauge>,
    pub dispatches: Arc<Counter>,
    pub logical_calls: Arc<Counter>,
    pub retry_amplification: Arc<Gauge>,
    pub outstanding: Arc<Gauge>,
    pub outstanding_oldest: Arc<Gauge>,
    pub restored_records: Arc<Counter>,
    pub restore_torn_rows: Arc<Counter>,
    pub partitions_restoring: Arc<Gauge>,
    pub partitions_owned: Arc<Gauge>,
    pub claims: Arc<Counter>,
    pub claims_failed: Arc<Counter>,
    pub consumer_lag: Arc<Gauge>,
    pub consumer_errors: Arc<Counter>,
    pub producer_time: Arc<Counter>,
    pub health: Health,
    scans: Mutex<BTreeMap<i32, Scan>>,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry").finish_non_exhaustive()
    }
}

impl Telemetry {
    /// Registers every family; `stall_after` bounds the silence `/healthz` tolerates.
    pub fn new(stall_after: Duration) -> Self {
        let r = Registry::new();
        Telemetry {
            decisions: r.counter(
                "airlock_decisions_total",
                "Decisions emitted, by verdict and reason code.",
                &["verdict", "reason"],
            ),
            decision_latency: r.histogram(
                "airlock_decision_latency_seconds",
                "From an input record's timestamp to its decision acknowledged by the broker.",
                &["input"],
                LATENCY_BUCKETS,
            ),
            inputs: r.counter(
                "airlock_inputs_total",
                "Input records consumed (decided or dead-lettered), by input topic.",
                &["input"],
            ),
            dead_letters: r.counter(
                "airlock_dead_letters_total",
                "Input records sent to the dead-letter topic, by reason code.",
                &["reason"],
            ),
            batches: r.counter(
                "airlock_batches_total",
                "Batches that consumed at least one input record.",
                &[],
            ),
            produced: r.counter(
                "airlock_records_produced_total",
                "Output records acknowledged by the broker.",
                &[],
            ),
            outbox_backlog: r.gauge(
                "airlock_outbox_backlog",
                "Outbox records sealed in the state store and not yet acknowledged.",
                &["partition"],
            ),
            state_writes_stopped: r.gauge(
                "airlock_state_writes_stopped",
                "1 while RocksDB stops the partition store's writes until a flush or compaction \
                 catches up.",
                &["partition"],
            ),
            state_delayed_write_rate: r.gauge(
                "airlock_state_delayed_write_rate_bytes",
                "Bytes per second RocksDB slows the partition store's writes to; 0 when it does \
                 not.",
                &["partition"],
            ),
            state_level0_files: r.gauge(
                "airlock_state_level0_files",
                "SST files in level 0 of the partition store.",
                &["partition"],
            ),
            dispatches: r.counter(
                "airlock_dispatches_total",
                "Dispatch commands issued (attempts, every epoch).",
                &[],
            ),
            logical_calls: r.counter(
                "airlock_logical_calls_total",
                "First dispatches of an operation key (epoch 1): logical calls.",
                &[],
            ),
            retry_amplification: r.gauge(
                "airlock_retry_amplification",
                "Attempts per logical call since this process started (dispatches / first dispatches).",
                &[],
            ),
            outstanding: r.gauge(
                "airlock_outstanding_effects",
                "Effects waiting in UNKNOWN, OPERATOR_REQUIRED or AWAITING_APPROVAL for longer than older_than.",
                &["partition", "state", "older_than"],
            ),
            outstanding_oldest: r.gauge(
                "airlock_outstanding_oldest_seconds",
                "Age of the oldest effect waiting in the state (0 when none).",
                &["partition", "state"],
            ),
            restored_records: r.counter(
                "airlock_restored_records_total",
                "Changelog records applied to local state while claiming partitions.",
                &[],
            ),
            restore_torn_rows: r.counter(
                "airlock_restore_torn_rows_total",
                "Changelog rows of a previous owner's last batch that never reached the \
                 changelog whole, dropped while claiming (their inputs are decided again).",
                &[],
            ),
            partitions_restoring: r.gauge(
                "airlock_partitions_restoring",
                "Partitions being claimed (resend, restore, fence) right now.",
                &[],
            ),
            partitions_owned: r.gauge(
                "airlock_partitions_owned",
                "Partitions this instance owns.",
                &[],
            ),
            claims: r.counter(
                "airlock_claims_total",
                "Partition claims, by whether the local state was reused or rebuilt.",
                &["local_state"],
            ),
            claims_failed: r.counter(
                "airlock_claims_failed_total",
                "Partition claims that failed: transient ones are tried again after the \
                 instance rejoins its group, others stop it.",
                &["transient"],
            ),
            consumer_lag: r.gauge(
                "airlock_consumer_lag",
                "Records between the next offset to consume and the high watermark, per owned input partition.",
                &["topic", "partition"],
            ),
            consumer_errors: r.counter(
                "airlock_consumer_errors_total",
                "Errors the input consumer reported, by librdkafka error code.",
                &["code"],
            ),
            producer_time: r.counter(
                "airlock_producer_time_inputs_total",
                "Input records decided at their producer's timestamp (CreateTime), not the broker's append time, by input topic.",
                &["input"],
            ),
            registry: Arc::new(r),
            health: Health::new(stall_after, "telemetry.stall_after_ms"),
            scans: Mutex::new(BTreeMap::new()),
        }
    }

    /// The loop (or a restore it runs) made progress.
    pub fn beat(&self) {
        self.health.beat();
    }

    /// RocksDB's write stall state of partition `partition`'s store.
    pub fn write_pressure(&self, partition: i32, pressure: &crate::store::WritePressure) {
        let p = partition.to_string();
        let p = [p.as_str()];
        self.state_writes_stopped
            .set(&p, if pressure.stopped { 1.0 } else { 0.0 });
        self.state_delayed_write_rate
            .set(&p, pressure.delayed_write_rate as f64);
        self.state_level0_files
            .set(&p, pressure.level0_files as f64);
    }

    /// The group assigned `partitions` (claims follow); `[]` after a revocation.
    pub fn assigned(&self, partitions: &BTreeSet<i32>) {
        self.health.assigned(partitions);
        self.partitions_owned.set(&[], 0.0);
        let keep = |labels: &[String], i: usize| {
            labels[i]
                .parse::<i32>()
                .is_ok_and(|p| partitions.contains(&p))
        };
        self.consumer_lag.remove_where(|l| !keep(l, 1));
        self.outbox_backlog.remove_where(|l| !keep(l, 0));
        self.state_writes_stopped.remove_where(|l| !keep(l, 0));
        self.state_delayed_write_rate.remove_where(|l| !keep(l, 0));
        self.state_level0_files.remove_where(|l| !keep(l, 0));
        self.outstanding.remove_where(|l| !keep(l, 0));
        self.outstanding_oldest.remove_where(|l| !keep(l, 0));
        lock(&self.scans).retain(|p, _| partitions.contains(p));
    }

    /// A claim of `partition` starts; the guard ends it (claimed when `done` is called).
    pub fn claiming(&self, partition: i32) -> ClaimGuard<'_> {
        self.health.claim_started(partition);
        self.partitions_restoring.add(&[], 1.0);
        ClaimGuard {
            telemetry: self,
            partition,
            claimed: false,
        }
    }

    /// The loop stopped on an error: not live any more.
    pub fn failed(&self, reason: String) {
        self.health.failed(reason);
    }

    /// The input consumer reported `error`: counted, logged, and not ready for a while (see
    /// `Health::consumer_error`).
    pub fn consumer_error(&self, error: &rdkafka::error::KafkaError) {
        let code = self.health.consumer_error(error);
        self.consumer_errors.inc(&[&code]);
    }

    /// A graceful stop began: not ready any more.
    pub fn stopping(&self) {
        self.health.stopping();
    }

    /// Records one batch's observations of partition `partition` (its decisions were
    /// acknowledged at `acked_at`, wall clock ms).
    pub fn record(&self, observed: &Observed, acked_at: i64) {
        for (verdict, reason) in &observed.decisions {
            self.decisions.inc(&[verdict.as_str(), reason.as_str()]);
        }
        for (source, timestamp) in &observed.decided {
            let seconds = (acked_at - timestamp).max(0) as f64 / 1000.0;
            self.decision_latency
                .observe(&[source_label(*source)], seconds);
        }
        add_by_source(&self.inputs, &observed.inputs);
        add_by_source(&self.producer_time, &observed.producer_time);
        for reason in &observed.dead_letters {
            self.dead_letters.inc(&[reason]);
        }
        if observed.dispatches > 0 {
            self.dispatches.add(&[], observed.dispatches);
            self.logical_calls.add(&[], observed.first_dispatches);
            let calls = self.logical_calls.get(&[]);
            if calls > 0 {
                let ratio = self.dispatches.get(&[]) as f64 / calls as f64;
                self.retry_amplification.set(&[], ratio);
            }
        }
    }

    /// Advances the outstanding-effects scan of `partition` by at most [`SCAN_ROWS_BUSY`] rows
    /// of its committed state after a batch that had inputs (`busy`), [`SCAN_ROWS_IDLE`] after
    /// one without, and publishes the ages of the last complete pass at `now`.
    pub fn scan_outstanding<B: Backend>(
        &self,
        partition: i32,
        store: &StateStore<B>,
        now: i64,
        busy: bool,
    ) {
        let rows = if busy { SCAN_ROWS_BUSY } else { SCAN_ROWS_IDLE };
        let mut scans = lock(&self.scans);
        let scan = scans.entry(partition).or_default();
        if let Err(e) = scan.step(store.backend(), rows) {
            // Monitoring must not stop the processor: the state is read again next pass.
            log::warn!("partition {partition}: scanning for outstanding effects: {e}");
            *scan = Scan::default();
        }
        let Some(done) = &scan.done else {
            return;
        };
        let p = partition.to_string();
        for state in OUTSTANDING {
            let ages: Vec<i64> = done
                .iter()
                .filter(|(s, _)| s == state)
                .map(|(_, since)| (now - since).max(0))
                .collect();
            for (label, ms) in AGES {
                let n = ages.iter().filter(|age| **age >= *ms).count();
                self.outstanding.set(&[&p, state, label], n as f64);
            }
            let oldest = ages.iter().copied().max().unwrap_or(0);
            self.outstanding_oldest
                .set(&[&p, state], oldest as f64 / 1000.0);
        }
    }
}

/// Ends a claim's "restoring" mark however the claim ends.
#[derive(Debug)]
pub struct ClaimGuard<'a> {
    telemetry: &'a Telemetry,
    partition: i32,
    claimed: bool,
}

impl ClaimGuard<'_> {
    /// The claim succeeded: the partition is owned.
    pub fn done(mut self, reused_local_state: bool) {
        self.claimed = true;
        let t = self.telemetry;
        t.claims.inc(&[if reused_local_state {
            "reused"
        } else {
            "rebuilt"
        }]);
        t.partitions_owned.add(&[], 1.0);
    }
}

impl Drop for ClaimGuard<'_> {
    fn drop(&mut self) {
        let t = self.telemetry;
        t.health.claim_ended(self.partition, self.claimed);
        t.partitions_restoring.add(&[], -1.0);
    }
}

impl Probes for Telemetry {
    fn live(&self) -> Result<(), String> {
        self.health.live()
    }

    fn ready(&self) -> Result<(), String> {
        self.health.ready()
    }
}

/// One task's outstanding-effects scan: a cursor through the effect table.
#[derive(Debug, Default)]
struct Scan {
    /// The next key to read in the current pass; `None` between passes.
    cursor: Option<Vec<u8>>,
    /// (state, since) found so far in the current pass.
    partial: Vec<(&'static str, i64)>,
    /// The last complete pass.
    done: Option<Vec<(&'static str, i64)>>,
    started: Option<Instant>,
}

impl Scan {
    fn step(&mut self, backend: &impl Backend, rows: usize) -> store::Result<()> {
        let (start, end) = Table::Effect.range();
        let from = match self.cursor.take() {
            Some(c) => c,
            None => {
                if self.started.is_some_and(|s| s.elapsed() < SCAN_INTERVAL) {
                    return Ok(());
                }
                self.started = Some(Instant::now());
                self.partial.clear();
                start
            }
        };
        let (mut seen, mut next) = (0, None);
        let partial = &mut self.partial;
        backend.visit(&from, &end, rows, &mut |key, value| {
            if let Some(found) = outstanding(key, value)? {
                partial.push(found);
            }
            seen += 1;
            if seen == rows {
                // A full step: the next one starts just after this key.
                next = Some([key, &[0]].concat());
            }
            Ok(())
        })?;
        match next {
            Some(next) => self.cursor = Some(next),
            None => self.done = Some(std::mem::take(&mut self.partial)),
        }
        Ok(())
    }
}

/// The outstanding state of an effect row and since when it waits, if it waits.
fn outstanding(key: &[u8], value: &[u8]) -> store::Result<Option<(&'static str, i64)>> {
    // Most effects are settled: skip them without decoding (the state is a JSON tag).
    const TAG: &[u8] = b"\"kind\":\"";
    let waits = memchr::memmem::find_iter(value, TAG).any(|at| {
        let kind = &value[at + TAG.len()..];
        OUTSTANDING
            .iter()
            .any(|s| kind.starts_with(s.as_bytes()) && kind.get(s.len()) == Some(&b'"'))
    });
    if !waits {
        return Ok(None);
    }
    let id = String::from_utf8_lossy(key.get(1..).unwrap_or_default());
    let record: EffectRecord = store::codec::decode(Table::Effect, &id, value)?;
    Ok(match record.state {
        State::Unknown { since, .. } => Some(("UNKNOWN", since)),
        State::OperatorRequired { since, .. } => Some(("OPERATOR_REQUIRED", since)),
        // Waiting since the intent was created, or since the failure that asks for approval
        // again before a retry.
        State::AwaitingApproval { .. } if record.epoch == 0 => {
            Some(("AWAITING_APPROVAL", record.created_at))
        }
        State::AwaitingApproval { .. } => Some(("AWAITING_APPROVAL", record.updated_at)),
        _ => None,
    })
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn claims_move_the_restore_gauges_and_readiness() {
        let t = Telemetry::new(Duration::from_secs(60));
        t.beat();
        t.assigned(&BTreeSet::from([0, 1]));
        let claim = t.claiming(0);
        assert_eq!(t.partitions_restoring.get(&[]), Some(1.0));
        assert!(t.ready().unwrap_err().contains("claiming partitions [0]"));
        claim.done(false);
        // A failed claim is not a claim.
        drop(t.claiming(1));
        assert!(
            t.ready()
                .unwrap_err()
                .contains("[1] are assigned but not claimed")
        );
        t.claiming(1).done(true);
        assert_eq!(t.ready(), Ok(()));
        assert_eq!(t.partitions_owned.get(&[]), Some(2.0));
        assert_eq!(t.partitions_restoring.get(&[]), Some(0.0));
        assert_eq!(t.claims.get(&["reused"]), 1);
        assert_eq!(t.claims.get(&["rebuilt"]), 1);
        t.consumer_lag.set(&["airlock.proposals", "1"], 4.0);
        t.assigned(&BTreeSet::from([0]));
        assert_eq!(t.consumer_lag.get(&["airlock.proposals", "1"]), None);
    }

    #[test]
    fn the_scan_finds_the_effects_that_wait_and_publishes_their_ages() {
        use airlock_schemas::OutcomeKind;

        use crate::core::{self, Input};
        use crate::sample;

        let core = Arc::new(sample::reference_core(core::Config::default()).unwrap());
        let mut task = sample::memory_task(core).unwrap();
        let now = 1_700_000_000_000;
        for (key, amount) in [
            ("refund:a", 2_500),
            ("refund:big", 50_000),
            ("refund:c", 100),
        ] {
            let p = sample::refund(key, amount, now);
            task.handle(&Input::Proposal(p), now).unwrap();
        }
        let unknown = sample::outcome("refund:a", 1, OutcomeKind::Unknown, "reset after send");
        task.handle(&Input::Outcome(unknown), now + 1_000).unwrap();
        task.commit().unwrap();

        let t = Telemetry::new(Duration::from_secs(60));
        t.scan_outstanding(3, task.store(), now + 120_000, false);
        let get = |state: &str, age: &str| t.outstanding.get(&["3", state, age]);
        assert_eq!(get("UNKNOWN", "0s"), Some(1.0));
        assert_eq!(get("UNKNOWN", "1m"), Some(1.0));
        assert_eq!(get("UNKNOWN", "10m"), Some(0.0));
        assert_eq!(get("AWAITING_APPROVAL", "1m"), Some(1.0));
        assert_eq!(get("OPERATOR_REQUIRED", "0s"), Some(0.0));
        assert_eq!(
            t.outstanding_oldest.get(&["3", "AWAITING_APPROVAL"]),
            Some(120.0)
        );
        assert_eq!(t.outstanding_oldest.get(&["3", "UNKNOWN"]), Some(119.0));
        // Ages move with the clock between passes.
        t.scan_outstanding(3, task.store(), now + 3_600_000, false);
        assert_eq!(get("AWAITING_APPROVAL", "1h"), Some(1.0));
        // Losing the partition drops its series.
        t.assigned(&BTreeSet::new());
        assert_eq!(get("UNKNOWN", "0s"), None);
    }

    #[test]
    fn a_pass_spans_batches_and_counts_each_row_once() {
        use airlock_schemas::OutcomeKind;

        use crate::core::{self, Input};
        use crate::sample;
        use crate::store::{MemoryBackend, Store};

        let core = Arc::new(sample::reference_core(core::Config::default()).unwrap());
        let mut task = sample::memory_task(core).unwrap();
        let now = 1_700_000_000_000;
        task.handle(&Input::Proposal(sample::refund("refund:a", 100, now)), now)
            .unwrap();
        let unknown = sample::outcome("refund:a", 1, OutcomeKind::Unknown, "reset after send");
        task.handle(&Input::Outcome(unknown), now + 1_000).unwrap();
        task.commit().unwrap();
        let (start, end) = Table::Effect.range();
        let real = task.store().backend().scan(&start, &end, 10).unwrap();
        assert_eq!(real.len(), 1);

        // 2.5 idle steps' worth of settled rows around the one that waits (2,501 rows): a
        // busy step reads 100 of them, an idle one 1,000, and only the step that reaches the
        // end publishes.
        let mut store = StateStore::open(MemoryBackend::default()).unwrap();
        let settled = br#"{"state":{"kind":"COMMITTED"}}"#;
        for i in 0..SCAN_ROWS_IDLE * 5 / 2 {
            let id = format!("refund:{i:05}");
            store.stage_raw(Table::Effect, id.as_bytes(), Some(settled.to_vec()));
        }
        store.stage_raw(Table::Effect, &real[0].0[1..], Some(real[0].1.clone()));
        store.commit().unwrap();

        let t = Telemetry::new(Duration::from_secs(60));
        let get = || t.outstanding.get(&["0", "UNKNOWN", "0s"]);
        let (busy, idle) = (true, false);
        let step = |busy| t.scan_outstanding(0, &store, now + 2_000, busy);
        for batch in [busy, idle, idle, busy] {
            step(batch);
        }
        assert_eq!(
            get(),
            None,
            "2,200 of 2,501 rows read: no pass is complete yet"
        );
        step(busy);
        step(busy);
        assert_eq!(get(), None, "2,400 rows read");
        step(idle);
        assert_eq!(
            get(),
            Some(1.0),
            "the last 101 rows read: the pass is complete"
        );
        // The next pass waits for SCAN_INTERVAL; the published figures stay.
        step(idle);
        assert_eq!(get(), Some(1.0));
    }

    #[test]
    fn retry_amplification_is_attempts_per_logical_call() {
        let t = Telemetry::new(Duration::from_secs(60));
        let observed = Observed {
            decisions: vec![(Verdict::Accepted, Reason::AutoApproved)],
            decided: vec![(Source::Proposals, 1_000)],
            inputs: vec![Source::Proposals],
            producer_time: vec![Source::Proposals, Source::Outcomes, Source::Proposals],
            dispatches: 3,
            first_dispatches: 2,
            ..Observed::default()
        };
        t.record(&observed, 1_250);
        assert_eq!(t.retry_amplification.get(&[]), Some(1.5));
        assert_eq!(t.decisions.get(&["ACCEPTED", "AUTO_APPROVED"]), 1);
        assert_eq!(t.decision_latency.get(&["proposal"]), (1, 0.25));
        assert_eq!(t.producer_time.get(&["proposal"]), 2);
        assert_eq!(t.producer_time.get(&["outcome"]), 1);
        assert_eq!(t.producer_time.get(&["approval"]), 0);
        let text = t.registry.render();
        assert!(
            text.contains(
                "airlock_decision_latency_seconds_bucket{input=\"proposal\",le=\"0.25\"} 1\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "airlock_decision_latency_seconds_bucket{input=\"proposal\",le=\"0.1\"} 0\n"
            ),
            "{text}"
        );
    }
}
