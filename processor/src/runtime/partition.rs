//! One partition's task in the running processor: input records in, one RocksDB `WriteBatch`
//! per batch out (state, consumed offsets, outbox), then the outbox records to produce.
//!
//! Call order per batch: [`PartitionTask::advance_clock`] (the timers the record's time brings
//! due) and [`PartitionTask::handle_record`] for each input record (in offset order),
//! [`PartitionTask::fire_due`] and [`PartitionTask::tick_if_due`], [`PartitionTask::seal`]
//! (changelog + commit), produce what `seal` returned, then [`PartitionTask::acknowledged`] for
//! what the broker acknowledged.
//! Nothing is produced before `seal` made it durable (DESIGN.md section 6).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use airlock_schemas::{
    AnyRecord, ChangelogRecord, Codec, Decision, Framing, InputOffset, Reason, StateTable, Verdict,
};
use opentelemetry::trace::TraceContextExt;
use opentelemetry::{Context, KeyValue};

use super::clock::RecordClock;
use super::partitioner;
use super::produce::Span;
use super::telemetry::{Observed, source_label};
use super::topics::Names;
use super::wire::{self, OutRecord, Outbox, header};
use crate::capability;
use crate::core::{Core, Effects, Input, TaskContext, canonical};
use crate::store::{self, RocksStore, Store, WalSync, keys::Table};
use crate::task::{self, Task};
use crate::telemetry::trace;

/// Errors of a partition task: its store or the core broke. Input never causes one.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Task(#[from] task::Error),
    #[error("partition {partition}: {source}")]
    Store {
        partition: i32,
        #[source]
        source: store::Error,
    },
    #[error("partition {partition}: outbox row {row}: {source}")]
    Outbox {
        partition: i32,
        row: u64,
        #[source]
        source: wire::DecodeError,
    },
    #[error("partition {partition}: encoding {what}: {source}")]
    Encode {
        partition: i32,
        what: &'static str,
        #[source]
        source: airlock_schemas::Error,
    },
    #[error(
        "{topic} partition {partition}: the record at offset {offset} is not the one this \
         partition consumed there (fingerprint {found}, stored {stored}): the topic was deleted \
         and created again, or the broker lost records it had acknowledged (an unclean leader \
         election); the state belongs to the old log, so nothing on this one is decided (see \
         docs/known-gaps.md, \"Replaced input logs\")"
    )]
    InputReplaced {
        topic: String,
        partition: i32,
        offset: i64,
        stored: String,
        found: String,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Meta rows that describe this copy of the state rather than the state: never in the changelog.
pub const LOCAL_PREFIX: &[u8] = b"local/";
const META_OUTBOX_NEXT: &[u8] = b"local/outbox_next";
/// Offset after the last changelog record this store knows the broker holds.
pub const META_CHANGELOG_NEXT: &[u8] = b"local/changelog_next";
/// The owner epoch this store last claimed (a changelog row: the next owner reads it).
pub const META_OWNER_EPOCH: &[u8] = b"owner_epoch";
/// The time of the last batch that changed nothing but deletions: written so that such a
/// batch's last changelog record is not a tombstone (see `seal_with`). Nothing reads it.
const META_BATCH_END: &[u8] = b"batch_end";

/// Which input topic a record came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Proposals,
    Approvals,
    Outcomes,
    Control,
}

impl Source {
    /// In the order of the input topics everywhere (`Names::proposals`, `approvals`,
    /// `outcomes`, `control`).
    pub const ALL: [Source; 4] = [
        Source::Proposals,
        Source::Approvals,
        Source::Outcomes,
        Source::Control,
    ];
}

/// An input record told apart by its content: the first 16 bytes of SHA-256 over its
/// timestamp, key and payload. The offset row of each input topic keeps the fingerprint of the
/// last record consumed, so that a task reading its log again can tell whether it is still the
/// log its state was built from (see [`PartitionTask::check_redelivered`]).
pub type Fingerprint = [u8; 16];

/// The [`Fingerprint`] of an input record. Every part is length-prefixed and absence is
/// distinct from emptiness, so no two different records share the hashed bytes. Stored
/// fingerprints are compared with ones computed by later builds: never change what is hashed
/// or how (the golden vectors in the tests pin it).
pub fn fingerprint(
    timestamp: Option<i64>,
    key: Option<&[u8]>,
    payload: Option<&[u8]>,
) -> Fingerprint {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    hasher.update(b"airlock.input.v1");
    match timestamp {
        Some(t) => {
            hasher.update([1]);
            hasher.update(t.to_be_bytes());
        }
        None => hasher.update([0]),
    }
    for part in [key, payload] {
        match part {
            Some(bytes) => {
                hasher.update([1]);
                hasher.update((bytes.len() as u64).to_be_bytes());
                hasher.update(bytes);
            }
            None => hasher.update([0]),
        }
    }
    let digest = hasher.finalize();
    let mut out = [0; 16];
    out.copy_from_slice(&digest[..16]);
    out
}

/// An input topic's offset row: the next offset to consume and the fingerprint of the record
/// before it. On disk 8 bytes (big-endian `next`), then the 16 of `last` when known: rows
/// written by tasks that did not keep fingerprints, and rows staged record by record within a
/// batch, have none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InputTail {
    pub next: i64,
    pub last: Option<Fingerprint>,
}

impl InputTail {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(24);
        out.extend_from_slice(&self.next.to_be_bytes());
        if let Some(last) = &self.last {
            out.extend_from_slice(last);
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Option<InputTail> {
        let next = i64::from_be_bytes(bytes.get(..8)?.try_into().ok()?);
        let last = match bytes.len() {
            8 => None,
            24 => Some(bytes[8..].try_into().ok()?),
            _ => return None,
        };
        Some(InputTail { next, last })
    }
}

/// An input record as the task needs it; `timestamp` is the record's own time, `now` of its
/// decision (never the wall clock at processing time).
#[derive(Clone, Copy, Debug)]
pub struct InputRecord<'a> {
    pub source: Source,
    pub topic: &'a str,
    pub offset: i64,
    pub key: Option<&'a [u8]>,
    pub payload: Option<&'a [u8]>,
    pub timestamp: i64,
    /// The record's `airlock-capability` header: an outcome's signature by its worker.
    pub capability: Option<&'a [u8]>,
}

/// An input record's offset against the task's next offset to consume.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Position {
    /// The record to decide now (or the first of its partition).
    Next,
    /// A redelivery of a record whose effects are already in the state; `last` when it is the
    /// last one consumed (the one whose fingerprint the offset row may keep).
    AlreadyConsumed { last: bool },
    /// Records between `expected` and this one were never delivered.
    Gap { expected: i64 },
}

/// Counts of one task, for logs and metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub inputs: u64,
    pub dead_lettered: u64,
    pub decisions: u64,
    pub dispatches: u64,
    pub timers: u64,
    /// Bytes of the outbox rows this task wrote to its store (compressed, as stored).
    pub outbox_bytes: u64,
}

/// What [`PartitionTask::roll_back_to`] goes back to.
#[derive(Debug)]
pub struct SavePoint {
    store: crate::store::SavePoint,
    clock: RecordClock,
    timers_in_batch: usize,
}

pub struct PartitionTask {
    task: Task<RocksStore>,
    names: Names,
    codec: Codec,
    /// How decisions, journal events and receipts are framed (`schema_registry.framing`); the
    /// changelog and the dispatch topics are single-object always.
    output_framing: Framing,
    partitions: i32,
    /// Outbox sequence of the next entry (persisted with each batch).
    next_outbox: u64,
    /// Outbox entries staged by the current batch, not yet durable.
    staged_outbox: Vec<OutRecord>,
    /// Turns each sealed batch into its outbox row, keeping its buffers between batches.
    row_encoder: wire::RowEncoder,
    /// Input offsets advanced by the current batch (topic → next offset).
    staged_offsets: BTreeMap<String, i64>,
    /// The changelog offset this task's next record lands at if nobody else writes there;
    /// `None` once someone did (see `acknowledged`).
    changelog_next: Option<i64>,
    /// Where this task's own changelog records ended at the last acknowledgement, whoever
    /// wrote in between: the start of the next range in which to look for another writer's
    /// records (see `acknowledged`).
    changelog_cursor: Option<i64>,
    pub counters: Counters,
    /// `counters` as of the last seal: what a discarded batch goes back to.
    sealed_counters: Counters,
    /// What the current batch did, for the metrics (taken by the run loop after each seal).
    observed: Observed,
    /// The trace context (`traceparent`, `tracestate`) of the input being decided: every output
    /// it causes carries it. Empty between inputs.
    trace_headers: Vec<(String, Vec<u8>)>,
    /// When this task last journaled a checkpoint (its first batch counts as one).
    last_checkpoint: Option<i64>,
    /// Something changed since the last checkpoint: one is owed within the interval.
    unchecked: bool,
    /// Input topics whose records carried the producer's time (reported once each).
    producer_clock: BTreeSet<String>,
    /// When this task last sealed a record for its changelog partition (rows or a sweep).
    last_changelog_write: Option<i64>,
    /// The partition's record time, by which its timers fire (see [`clock`](super::clock)).
    clock: RecordClock,
    /// `clock` as of the last seal: what a discarded batch goes back to.
    sealed_clock: RecordClock,
    /// When this task last put ticks on its input partitions (wall clock).
    last_tick: Option<i64>,
    /// Timers fired since the last seal (bounded per batch, see `advance_clock`).
    timers_in_batch: usize,
}

impl std::fmt::Debug for PartitionTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartitionTask")
            .field("ctx", self.task.context())
            .field("next_outbox", &self.next_outbox)
            .finish_non_exhaustive()
    }
}

impl PartitionTask {
    /// Writes decisions, journal events and receipts in `framing` (the codec must hold the
    /// registry's ids of their current schemas for [`Framing::Confluent`]).
    #[must_use]
    pub fn with_output_framing(mut self, framing: Framing) -> Self {
        self.output_framing = framing;
        self
    }

    /// Wraps a store whose owner epoch has been claimed (see `restore`).
    pub fn new(
        core: Arc<Core>,
        store: RocksStore,
        ctx: TaskContext,
        names: Names,
        codec: Codec,
        partitions: i32,
    ) -> Result<Self> {
        let partition = ctx.partition;
        let next_outbox = read_u64(&store, META_OUTBOX_NEXT, partition)?.unwrap_or(0);
        let changelog_next = read_i64(&store, Table::Meta, META_CHANGELOG_NEXT, partition)?;
        Ok(PartitionTask {
            task: Task::new(core, store, ctx)?,
            names,
            codec,
            output_framing: Framing::SingleObject,
            partitions,
            next_outbox,
            staged_outbox: Vec::new(),
            row_encoder: wire::RowEncoder::default(),
            staged_offsets: BTreeMap::new(),
            changelog_next,
            changelog_cursor: changelog_next,
            counters: Counters::default(),
            sealed_counters: Counters::default(),
            observed: Observed::default(),
            trace_headers: Vec::new(),
            last_checkpoint: None,
            unchecked: false,
            producer_clock: BTreeSet::new(),
            last_changelog_write: None,
            clock: RecordClock::default(),
            sealed_clock: RecordClock::default(),
            last_tick: None,
            timers_in_batch: 0,
        })
    }

    pub fn partition(&self) -> i32 {
        self.task.context().partition
    }

    pub fn owner_epoch(&self) -> i64 {
        self.task.context().owner_epoch
    }

    pub fn store(&self) -> &RocksStore {
        self.task.store()
    }

    /// The next offset to consume of `topic` (this partition), as stored with the state.
    pub fn stored_offset(&self, topic: &str) -> Result<Option<i64>> {
        stored_offset(self.task.store(), topic, self.partition())
    }

    /// Where `offset` of `topic` stands against the next offset to consume (one lookup per
    /// record: the batch's staged position, else the stored one).
    pub fn position_of(&self, topic: &str, offset: i64) -> Result<Position> {
        let next = match self.staged_offsets.get(topic) {
            Some(next) => Some(*next),
            None => self.stored_offset(topic)?,
        };
        Ok(match next {
            Some(next) if offset < next => Position::AlreadyConsumed {
                last: offset == next - 1,
            },
            // Input topics are not compacted: a later offset means records were skipped.
            Some(next) if offset > next => Position::Gap { expected: next },
            _ => Position::Next,
        })
    }

    /// True when `offset` of `topic` is below the next offset to consume: a redelivery of a
    /// record whose effects are already in the state (it must not be decided twice).
    pub fn already_consumed(&self, topic: &str, offset: i64) -> Result<bool> {
        Ok(matches!(
            self.position_of(topic, offset)?,
            Position::AlreadyConsumed { .. }
        ))
    }

    /// Keeps, with the offset row of `topic`, the fingerprint of the record at `offset`: the
    /// last one of `topic` the batch consumed ([`handle_record_in`](Self::handle_record_in)
    /// staged its offset).
    pub fn note_last_consumed(&mut self, topic: &str, offset: i64, fingerprint: Fingerprint) {
        debug_assert_eq!(self.staged_offsets.get(topic), Some(&(offset + 1)));
        let tail = InputTail {
            next: offset + 1,
            last: Some(fingerprint),
        };
        self.task
            .store_mut()
            .stage_raw(Table::Offset, topic.as_bytes(), Some(tail.encode()));
    }

    /// Checks a redelivered record of `topic` (below the next offset to consume; the caller
    /// asks only for the last one consumed, `Position::AlreadyConsumed { last: true }`): when
    /// the offset row keeps its fingerprint, `fingerprint` (of the record at hand) must match
    /// it. A mismatch means the log is no longer the one the state
    /// was built from (a topic deleted and created again, records lost and written anew): the
    /// records from here on would be taken for ones already decided, so the task refuses.
    pub fn check_redelivered(
        &self,
        topic: &str,
        offset: i64,
        fingerprint: impl FnOnce() -> Fingerprint,
    ) -> Result<()> {
        let partition = self.partition();
        let Some(InputTail {
            next,
            last: Some(stored),
        }) = input_tail(self.task.store(), topic, partition)?
        else {
            return Ok(());
        };
        if offset != next - 1 {
            return Ok(());
        }
        let found = fingerprint();
        if found == stored {
            return Ok(());
        }
        Err(Error::InputReplaced {
            topic: topic.to_owned(),
            partition,
            offset,
            stored: hex::encode(stored),
            found: hex::encode(found),
        })
    }

    /// The next offset to consume of every input topic that has one (group commits, for lag).
    pub fn positions(&self) -> Result<Vec<(String, i64)>> {
        Ok(self
            .current_offsets()?
            .into_iter()
            .map(|o| (o.topic, o.offset))
            .collect())
    }

    /// Decides one input record, or dead-letters it; stages everything, advances the offset.
    pub fn handle_record(&mut self, rec: &InputRecord<'_>) -> Result<()> {
        self.handle_record_in(rec, &Context::new())
    }

    /// [`handle_record`](Self::handle_record) in a span whose parent is `parent` (the trace
    /// context the record's headers carry); its outputs carry the span's context.
    pub fn handle_record_in(&mut self, rec: &InputRecord<'_>, parent: &Context) -> Result<()> {
        self.staged_offsets
            .insert(rec.topic.to_owned(), rec.offset + 1);
        self.task.store_mut().stage_raw(
            Table::Offset,
            rec.topic.as_bytes(),
            Some((rec.offset + 1).to_be_bytes().to_vec()),
        );
        // A barrier is a reader learning where the partition ends (a connector worker
        // rebuilding its started attempts from the outcomes): consumed, neither decided nor
        // dead-lettered.
        if wire::is_barrier(rec.key, rec.payload) {
            return Ok(());
        }
        self.counters.inputs += 1;
        self.observed.inputs.push(rec.source);
        let cx = trace::consume(
            format_args!("decide {}", source_label(rec.source)),
            rec.topic,
            self.partition(),
            rec.offset,
            Vec::new,
            parent,
        );
        self.trace_headers = trace::inject(&cx);
        let result = match self.accept(rec) {
            Ok(input) => match self.task.handle(&input, rec.timestamp) {
                Ok(effects) => {
                    let span = cx.span();
                    // The key is copied only for a span that keeps it (a provider installed).
                    if let Some(key) = input.operation_key().filter(|_| span.is_recording()) {
                        span.set_attribute(KeyValue::new("airlock.operation_key", key.to_owned()));
                    }
                    if let Some(d) = effects.decisions.first() {
                        self.observed.decided.push((rec.source, rec.timestamp));
                        span.set_attribute(KeyValue::new("airlock.verdict", d.verdict.as_str()));
                        span.set_attribute(KeyValue::new("airlock.reason", d.reason.as_str()));
                    }
                    if let Some(d) = effects.dispatches.first() {
                        span.set_attribute(KeyValue::new("airlock.epoch", d.epoch));
                    }
                    self.stage_effects(effects)
                }
                Err(e) => Err(e.into()),
            },
            Err(refusal) => {
                cx.span().set_attribute(KeyValue::new(
                    "airlock.dead_letter",
                    refusal.reason.as_str(),
                ));
                self.dead_letter(rec, refusal)
            }
        };
        self.trace_headers.clear();
        cx.span().end();
        result
    }

    /// Fires the timers due by `now` through the same path as inputs, at most `limit` of them
    /// (the rest fire at the next call).
    pub fn fire_timers(&mut self, now: i64, limit: usize) -> Result<usize> {
        let (taken, fired) = self.task.fire_timers_counted(now, limit)?;
        let n = fired.len();
        self.counters.timers += n as u64;
        self.timers_in_batch += taken;
        for effects in fired {
            self.stage_effects(effects)?;
        }
        Ok(n)
    }

    /// The partition's record-time clock (see [`clock`](super::clock)).
    pub fn clock(&self) -> &RecordClock {
        &self.clock
    }

    /// Notes the time `at` of a record of `source` about to be decided, in a batch that began
    /// at wall time `wall`, and fires the timers the partition's record time now has due, before
    /// the record: a timer due before a record was read is decided before it. At most
    /// `timers_per_batch` timers fire between two seals; the rest wait for the next batch.
    pub fn advance_clock(
        &mut self,
        source: Source,
        at: i64,
        wall: i64,
        timers_per_batch: usize,
    ) -> Result<()> {
        let before = self.clock.now();
        self.clock.observe(source, at, wall);
        // Nothing new can be due while the time stands still (`close` fires what a batch's
        // own decisions made due).
        if self.clock.now() == before {
            return Ok(());
        }
        self.fire_due(timers_per_batch)
    }

    /// Fires the timers due by the partition's record time, within the batch's share of
    /// `timers_per_batch` (see [`advance_clock`](Self::advance_clock)).
    pub fn fire_due(&mut self, timers_per_batch: usize) -> Result<()> {
        let left = timers_per_batch.saturating_sub(self.timers_in_batch);
        if let Some(now) = self.clock.now()
            && left > 0
        {
            self.fire_timers(now, left)?;
        }
        Ok(())
    }

    /// Puts a tick (a barrier, see [`clock`](super::clock)) on each input partition whose
    /// record time keeps this task waiting, at most once per `every_ms` of wall clock (`wall`):
    /// the partition's time has not reached a timer due by `wall`, or a checkpoint owed since
    /// the last one (`checkpoint_every_ms` of record time after it) is due by `wall`. Call
    /// after `checkpoint_if_due`: a tick is no change a checkpoint owes. Returns how many ticks
    /// it staged.
    pub fn tick_if_due(
        &mut self,
        wall: i64,
        every_ms: i64,
        checkpoint_every_ms: i64,
    ) -> Result<usize> {
        if self.last_tick.is_some_and(|t| wall - t < every_ms) {
            return Ok(0);
        }
        let partition = self.partition();
        let now = self.clock.now();
        let due = self
            .task
            .store()
            .due_timers(wall, 1)
            .map_err(|source| task::Error::Store { partition, source })?
            .first()
            .map(|t| t.due_at)
            .filter(|&due| now.is_none_or(|now| now < due));
        let owed = self
            .unchecked
            .then(|| {
                self.last_checkpoint
                    .map_or(wall, |last| last.saturating_add(checkpoint_every_ms))
            })
            .filter(|&at| at <= wall);
        let Some(until) = due.into_iter().chain(owed).min() else {
            return Ok(0);
        };
        let lagging: Vec<Source> = self.clock.lagging(until).collect();
        for &source in &lagging {
            let barrier = OutRecord::barrier(&self.names.input(source), partition);
            self.staged_outbox.push(barrier);
        }
        if !lagging.is_empty() {
            self.last_tick = Some(wall);
        }
        Ok(lagging.len())
    }

    /// Appends a CHECKPOINT journal event with the projection hash (audit replays verify it);
    /// nothing is owed after it.
    fn checkpoint(&mut self, now: i64) -> Result<()> {
        let event = self.task.checkpoint(now)?;
        let effects = Effects {
            journal: vec![event],
            ..Effects::default()
        };
        self.stage_outputs(&effects)?;
        self.last_checkpoint = Some(now);
        self.unchecked = false;
        Ok(())
    }

    /// Notes that a record of `topic` (input `source`) carried its producer's time (CreateTime),
    /// not the broker's: that producer sets the clock its deadlines and approval expiries are
    /// judged by. Counted for every record (`airlock_producer_time_inputs_total`), warned once
    /// per topic.
    pub fn producer_clock(&mut self, source: Source, topic: &str) {
        self.observed.producer_time.push(source);
        if self.producer_clock.contains(topic) {
            return;
        }
        self.producer_clock.insert(topic.to_owned());
        log::warn!(
            "partition {}: {topic} carries producer timestamps (CreateTime): records are \
             decided at the time their producer chose; set message.timestamp.type=LogAppendTime \
             on the topic (`airlock topics create` does on new topics; some brokers ignore it); \
             airlock_producer_time_inputs_total counts them",
            self.partition()
        );
    }

    /// Journals a checkpoint when something changed since the last one and `every_ms` passed:
    /// a partition that changed gets one within the interval even once it is idle, so a replay
    /// can verify its whole journal. Only outputs and state rows count as changes, not the
    /// bookkeeping alone (consumed offsets, an acknowledged outbox row's deletion): else the
    /// acknowledgement of each checkpoint would owe the next one, once an interval forever.
    pub fn checkpoint_if_due(&mut self, now: i64, every_ms: i64) -> Result<()> {
        let last = *self.last_checkpoint.get_or_insert(now);
        self.note_changes();
        if self.unchecked && now - last >= every_ms {
            self.checkpoint(now)?;
        }
        Ok(())
    }

    /// Notes whether the current batch changed anything a checkpoint is owed for (outputs or
    /// state rows, not bookkeeping): call before every seal, also when no checkpoint can be
    /// journaled yet (no record time known).
    pub fn note_changes(&mut self) {
        self.unchecked |= !self.staged_outbox.is_empty() || self.stages_changelog_rows();
    }

    /// Journals the checkpoint a stopping task owes (something changed since its last one) and
    /// seals it, with whatever else is staged: a task that stops (graceful shutdown,
    /// revocation) leaves its journal verifiable up to its last change instead of up to its
    /// last interval. The checkpoint is recorded at the latest record time read (`wall`, the
    /// wall clock, only when no record was read). Call between batches, after the last one was
    /// sealed. Returns the records to produce (none when no checkpoint was owed).
    pub fn seal_closing_checkpoint(&mut self, wall: i64) -> Result<Outbox> {
        if !self.unchecked {
            return Ok(Outbox::default());
        }
        self.checkpoint(self.clock.latest().unwrap_or(wall))?;
        self.seal(wall)
    }

    /// Puts a barrier on this task's changelog partition when the task wrote nothing there for
    /// `every_ms`. Its acknowledgement shows whether another writer (a zombie of an earlier
    /// owner that has not heard of the takeover) put records there since this task's last
    /// ones; the run loop then has the task write its own values of the keys a fenced owner
    /// wrote again (see `acknowledged`, `rewrite_rows`). Without it an idle owner would find a
    /// zombie's rows only at its next change, and a compaction in between would keep the
    /// zombie's row of each key: the changelog topic's `min.compaction.lag.ms` (one hour as
    /// `airlock topics create` sets it) keeps a new row out of compaction for longer than this
    /// interval. Call after `checkpoint_if_due` and before `seal`: a barrier is no change a
    /// checkpoint owes. Returns whether it staged one.
    pub fn sweep_if_due(&mut self, now: i64, every_ms: i64) -> bool {
        let last = *self.last_changelog_write.get_or_insert(now);
        if self.stages_changelog_rows() {
            self.last_changelog_write = Some(now);
            return false;
        }
        if now - last < every_ms {
            return false;
        }
        let mut barrier = OutRecord::barrier(&self.names.changelog(), self.partition());
        // With the changelog records (phase 1): it must land behind this task's last ones.
        barrier.phase = 1;
        self.staged_outbox.push(barrier);
        self.last_changelog_write = Some(now);
        true
    }

    /// True when the current batch staged a row the changelog carries (state, not bookkeeping).
    fn stages_changelog_rows(&self) -> bool {
        self.task
            .store()
            .staged()
            .any(|(key, _)| changelog_table(key).is_some())
    }

    /// True when the current batch staged anything.
    pub fn is_dirty(&self) -> bool {
        !self.staged_outbox.is_empty() || self.task.store().staged().next().is_some()
    }

    /// Turns the batch's state rows into changelog records, stages the outbox (one row), and
    /// commits the whole batch in one `WriteBatch`, durably. Returns the records to produce, in
    /// outbox order (none when the batch staged nothing).
    pub fn seal(&mut self, now: i64) -> Result<Outbox> {
        let (outbox, deferred) = self.seal_with(now, false)?;
        debug_assert!(deferred.is_none(), "a durable seal owes no fsync");
        Ok(outbox)
    }

    /// [`seal`](Self::seal) with the commit's fsync left to the returned [`WalSync`] (when the
    /// store syncs at all): the records may leave only after it returned. Later batches may be
    /// decided meanwhile; they read this one's state, and a crash before the sync loses them
    /// with it.
    pub fn seal_deferred(&mut self, now: i64) -> Result<(Outbox, Option<WalSync>)> {
        self.seal_with(now, true)
    }

    fn seal_with(&mut self, now: i64, deferred: bool) -> Result<(Outbox, Option<WalSync>)> {
        // A new batch begins, whether or not this one staged anything.
        self.timers_in_batch = 0;
        self.sealed_clock = self.clock;
        if !self.is_dirty() {
            return Ok((Outbox::default(), None));
        }
        let partition = self.partition();
        let owner_epoch = self.owner_epoch();
        let changelog_topic = self.names.changelog();
        // (full store key, table, value) of every changed row that the changelog carries.
        type Row = (Vec<u8>, StateTable, Option<Vec<u8>>);
        let changed = |task: &Task<RocksStore>| -> Vec<Row> {
            task.store()
                .staged()
                .filter_map(|(key, value)| {
                    changelog_table(key).map(|t| (key.to_vec(), t, value.map(<[u8]>::to_vec)))
                })
                .collect()
        };
        let mut rows = changed(&self.task);
        // A deletion leaves as a tombstone (no value), so that compaction drops the key. The
        // batch's last record carries its end and must not be one: the cleaner removes
        // tombstones after `delete.retention.ms`, and a batch without its end would read as
        // torn. Deletions go first; a batch of deletions only ends with a row of its own.
        if !rows.is_empty() && rows.iter().all(|(_, _, value)| value.is_none()) {
            self.task.store_mut().stage_raw(
                Table::Meta,
                META_BATCH_END,
                Some(now.to_be_bytes().to_vec()),
            );
            rows = changed(&self.task);
        }
        rows.sort_by_key(|(_, _, value)| value.is_some());
        let last = rows.len().saturating_sub(1);
        let mut changelog = Vec::with_capacity(rows.len());
        for (i, (full_key, table, value)) in rows.into_iter().enumerate() {
            let id = full_key[1..].to_vec();
            let value = match value {
                // A tombstone: what restore needs (table and key, owner epoch) is in the
                // record key and the identity headers.
                None => None,
                Some(value) => {
                    let input_offsets = if i == last {
                        self.current_offsets()?
                    } else {
                        Vec::new()
                    };
                    let record = ChangelogRecord {
                        partition,
                        owner_epoch,
                        table,
                        key: id,
                        value: Some(value),
                        input_offsets,
                        written_at: now,
                    };
                    Some(self.codec.encode_single_object(&record).map_err(|source| {
                        Error::Encode {
                            partition,
                            what: "changelog record",
                            source,
                        }
                    })?)
                }
            };
            let id = format!("changelog/{partition}/{}", canonical::hex_lower(&full_key));
            let mut headers = wire::identity("changelog", &id, partition, owner_epoch);
            if i == last {
                headers.push((wire::header::BATCH_END.to_owned(), b"1".to_vec()));
            }
            changelog.push(OutRecord {
                topic: changelog_topic.clone(),
                partition,
                key: Some(full_key),
                value,
                headers,
                phase: 1,
            });
        }
        for r in changelog {
            self.push_outbox(r);
        }
        let records = std::mem::take(&mut self.staged_outbox);
        let row = self.next_outbox;
        let store = self.task.store_mut();
        if !records.is_empty() {
            // The whole batch as one row: written, acknowledged and deleted together.
            let bytes = self.row_encoder.encode(&records);
            self.counters.outbox_bytes += bytes.len() as u64;
            store.stage_raw(Table::Outbox, &row.to_be_bytes(), Some(bytes));
            self.next_outbox += 1;
            store.stage_raw(
                Table::Meta,
                META_OUTBOX_NEXT,
                Some(self.next_outbox.to_be_bytes().to_vec()),
            );
        }
        let sync = if deferred {
            self.task.commit_deferred()?
        } else {
            self.task.commit()?;
            None
        };
        self.staged_offsets.clear();
        self.sealed_counters = self.counters.clone();
        Ok((Outbox { row, records }, sync))
    }

    /// Marks a sealed batch's outbox row done after the broker acknowledged its records;
    /// `changelog` is where the batch's changelog records landed. Staged: lands with the next
    /// batch.
    ///
    /// The store's known changelog end (`META_CHANGELOG_NEXT`, where the next claim starts
    /// looking for another owner's records) advances only over offsets this task wrote itself,
    /// back to back. Records of anyone else in between (a new owner's fence marker and rows,
    /// while this task is a zombie that has not yet heard of its revocation) freeze it, so the
    /// next claim reads them, finds the later epoch and rebuilds instead of trusting state the
    /// fence has voided.
    ///
    /// Returns the changelog offsets `[from, until)` where another writer's records sit among
    /// this task's, if any: the run loop reads them and, where they are a fenced owner's rows,
    /// has this task write its own values of those keys again (see `rewrite_rows`).
    pub fn acknowledged(&mut self, row: u64, changelog: Option<Span>) -> Option<(i64, i64)> {
        let partition = self.partition();
        let store = self.task.store_mut();
        store.stage_raw(Table::Outbox, &row.to_be_bytes(), None);
        let span = changelog?;
        if span.unplaced > 0 {
            // Where they landed is unknown (a resent request, see `Span`): neither end moves.
            // The store's known end stays where it was, so the next claim reads these records
            // too, and the next acknowledgement's range check covers them from the cursor.
            if let Some(next) = self.changelog_next.take() {
                log::info!(
                    "partition {partition}: the broker took {} changelog records without saying \
                     where (a request resent after a lost response); the next claim reads the \
                     changelog from offset {next}",
                    span.unplaced
                );
            }
            return None;
        }
        let foreign = match self.changelog_cursor {
            Some(cursor) if span.lowest > cursor || !span.is_contiguous() => {
                Some((cursor, span.highest + 1))
            }
            _ => None,
        };
        self.changelog_cursor = Some(span.highest + 1);
        let Some(next) = self.changelog_next else {
            return foreign;
        };
        if span.lowest == next && span.is_contiguous() {
            self.changelog_next = Some(span.highest + 1);
            store.stage_raw(
                Table::Meta,
                META_CHANGELOG_NEXT,
                Some((span.highest + 1).to_be_bytes().to_vec()),
            );
        } else {
            log::warn!(
                "partition {partition}: another producer wrote to the changelog between offsets \
                 {next} and {} (a newer owner?); this task's outputs from now on may be fenced, \
                 and its next claim rebuilds from the changelog",
                span.highest
            );
            self.changelog_next = None;
        }
        foreign
    }

    /// Stages this task's current value of each full store key in `keys` (a deletion where it
    /// has none) so the next seal writes it to the changelog again, behind a fenced owner's
    /// rows of the same keys. The changelog is compacted to the latest record per key: left
    /// alone, a zombie's row written after this owner's would outlive it, and every later
    /// restore, which drops the zombie's row by the fence, would lose the key. The values are
    /// unchanged, so the projection and the timers are too. Returns how many rows it staged.
    pub fn rewrite_rows(&mut self, keys: &[Vec<u8>]) -> Result<usize> {
        let partition = self.partition();
        let store = self.task.store_mut();
        let mut staged = 0;
        for key in keys {
            if changelog_table(key).is_none() || key[1..] == *META_OWNER_EPOCH {
                continue;
            }
            let Some(table) = Table::from_prefix(key[0]) else {
                continue;
            };
            let id = &key[1..];
            let value = store
                .get_raw(table, id)
                .map_err(|source| Error::Store { partition, source })?;
            store.stage_raw(table, id, value);
            staged += 1;
        }
        Ok(staged)
    }

    /// Commits staged bookkeeping (acknowledgements) without a batch of inputs. Rows staged for
    /// the changelog (keys written again over a fenced owner's rows, see `rewrite_rows`) are
    /// sealed into the outbox instead, unsent: the next claim resends them.
    pub fn commit_bookkeeping(&mut self, now: i64) -> Result<()> {
        if !self.staged_outbox.is_empty() {
            return Ok(());
        }
        if self.stages_changelog_rows() {
            self.seal(now)?;
        } else {
            self.task.commit()?;
        }
        Ok(())
    }

    /// What the batches since the last call decided, dispatched and refused (metrics).
    pub fn take_observed(&mut self) -> Observed {
        std::mem::take(&mut self.observed)
    }

    /// Where a batch starts, to decide it again from there ([`PartitionTask::roll_back_to`]).
    pub fn save_point(&self) -> SavePoint {
        SavePoint {
            store: self.task.store().save_point(),
            clock: self.clock,
            timers_in_batch: self.timers_in_batch,
        }
    }

    /// Forgets what the current batch staged, keeping what was staged before `point` (outbox
    /// acknowledgements and changelog rewrites, made durable with the next seal): the batch is
    /// then decided again.
    pub fn roll_back_to(&mut self, point: &SavePoint) -> Result<()> {
        self.counters = self.sealed_counters.clone();
        self.observed = Observed::default();
        self.staged_outbox.clear();
        self.staged_offsets.clear();
        self.clock = point.clock;
        self.timers_in_batch = point.timers_in_batch;
        self.task.store_mut().roll_back_to(&point.store);
        self.task.reload()?;
        self.next_outbox =
            read_u64(self.task.store(), META_OUTBOX_NEXT, self.partition())?.unwrap_or(0);
        Ok(())
    }

    /// Forgets everything staged since the last commit (the partition was revoked mid-batch).
    pub fn discard(&mut self) -> Result<()> {
        self.counters = self.sealed_counters.clone();
        self.clock = self.sealed_clock;
        self.timers_in_batch = 0;
        self.observed = Observed::default();
        self.staged_outbox.clear();
        self.staged_offsets.clear();
        self.task.discard()?;
        self.next_outbox =
            read_u64(self.task.store(), META_OUTBOX_NEXT, self.partition())?.unwrap_or(0);
        Ok(())
    }

    fn current_offsets(&self) -> Result<Vec<InputOffset>> {
        let partition = self.partition();
        let mut out = Vec::new();
        for topic in Source::ALL.map(|s| self.names.input(s)) {
            if let Some(offset) = self.stored_offset(&topic)? {
                out.push(InputOffset {
                    topic,
                    partition,
                    offset,
                });
            }
        }
        Ok(out)
    }

    /// Decodes and checks an input record: the refusal (reason, detail, the reply's target)
    /// when it cannot be decided.
    fn accept(&self, rec: &InputRecord<'_>) -> Result<Input, Refusal> {
        if rec.timestamp < 0 {
            return Err(Refusal::new(
                Reason::Malformed,
                "the record carries no timestamp, and Airlock decides each record at its own \
                 time (message.timestamp.type=LogAppendTime on the topic stamps every record)",
            ));
        }
        let Some(payload) = rec.payload else {
            return Err(Refusal::new(
                Reason::Malformed,
                "record has no value (a tombstone)",
            ));
        };
        let decoded = self.codec.decode(payload).map_err(|e| {
            let reason = match &e {
                airlock_schemas::Error::PayloadTooLarge { .. } => Reason::Oversized,
                e if e.is_foreign() => Reason::UnknownSchema,
                _ => Reason::Malformed,
            };
            Refusal::new(reason, e.to_string())
        })?;
        let input = match (rec.source, decoded.record) {
            (Source::Proposals, AnyRecord::ToolProposal(p)) => Input::Proposal(p),
            (Source::Approvals, AnyRecord::Approval(a)) => Input::Approval(a),
            (Source::Outcomes, AnyRecord::Outcome(o)) => Input::Outcome(o),
            (Source::Control, AnyRecord::Control(c)) => Input::Control(c),
            (_, other) => {
                return Err(Refusal::new(
                    Reason::UnknownSchema,
                    format!(
                        "a {} record does not belong on topic {}",
                        other.kind(),
                        rec.topic
                    ),
                ));
            }
        };
        // Every identifier is bounded before anything echoes it; the reply goes out only when
        // the fields it repeats are themselves within the bound.
        let max = self.task.core().config().max_identifier_bytes;
        if let Some((field, len)) = input.oversized_identifier(max) {
            return Err(Refusal {
                reason: Reason::Oversized,
                code: None,
                detail: format!("{field} is {len} bytes, the limit is {max}"),
                reply: reply_target(&input).filter(|(id, key, run)| {
                    id.len() <= max
                        && key.len() <= max
                        && run.as_ref().is_none_or(|r| r.len() <= max)
                }),
            });
        }
        // An outcome settles an effect: it counts only signed by a worker of its connector,
        // where that connector's worker keys are configured.
        if let Input::Outcome(o) = &input
            && let Some(keys) = self.task.core().worker_keys(&o.connector)
            && let Err(refused) = capability::verify_outcome_any(
                keys,
                rec.capability,
                &o.connector,
                rec.payload.unwrap_or_default(),
            )
        {
            return Err(Refusal {
                reason: Reason::Malformed,
                code: Some(refused.code()),
                detail: format!(
                    "outcome {} is not signed by a worker of connector {}: {refused}",
                    wire::clip(&o.outcome_id, max),
                    o.connector
                ),
                reply: None,
            });
        }
        if let Some(operation_key) = input.operation_key() {
            let reply_to = reply_target(&input);
            if rec.key != Some(operation_key.as_bytes()) {
                return Err(Refusal {
                    reason: Reason::KeyMismatch,
                    code: None,
                    detail: format!(
                        "the record's Kafka key {:?} is not its operation key {operation_key:?}",
                        rec.key
                            .map(|k| wire::clip(&String::from_utf8_lossy(k), max).into_owned())
                    ),
                    reply: reply_to,
                });
            }
            let owner = partitioner::partition_for(operation_key.as_bytes(), self.partitions);
            if owner != self.partition() {
                return Err(Refusal {
                    reason: Reason::KeyMismatch,
                    code: None,
                    detail: format!(
                        "operation key {operation_key:?} belongs to partition {owner} (murmur2), \
                         the record arrived on partition {}: the producer does not use the \
                         murmur2 partitioner",
                        self.partition()
                    ),
                    reply: reply_to,
                });
            }
        }
        // An approval or a control counts only signed by its person, where that person has
        // keys registered in the policy entities (or everyone must sign).
        if let Some((act, person, id)) = signer(&input)
            && let Some(keys) = self.task.core().person_keys(person)
        {
            let refused = if keys.is_empty() {
                Err((
                    "UNKNOWN_SIGNER",
                    format!(
                        "the policy entities register no verifying key for {} \
                         (capability.require_person_signatures is on)",
                        wire::clip(person, max)
                    ),
                ))
            } else {
                capability::verify_person_any(
                    keys,
                    rec.capability,
                    act,
                    person,
                    rec.payload.unwrap_or_default(),
                )
                .map_err(|refused| {
                    let why = match &refused {
                        capability::Refused::Missing => {
                            "it carries no signature (header airlock-capability)".to_owned()
                        }
                        other => other.to_string(),
                    };
                    (refused.code(), why)
                })
            };
            if let Err((code, why)) = refused {
                return Err(Refusal {
                    reason: Reason::Malformed,
                    code: Some(code),
                    detail: format!(
                        "{} {} is not signed by {}: {why}",
                        act.as_str(),
                        wire::clip(id, max),
                        wire::clip(person, max)
                    ),
                    reply: reply_target(&input),
                });
            }
        }
        Ok(input)
    }

    /// Dead-letters an input whose outputs could not be encoded (over the record limit, see
    /// `kafka.max_message_bytes`). The caller discarded the batch and decides it again with
    /// this record here instead of decided: its state changes are never kept, and a restart
    /// takes the same path (the outputs are the same bytes again).
    pub fn dead_letter_unencodable(
        &mut self,
        rec: &InputRecord<'_>,
        what: &str,
        problem: &str,
    ) -> Result<()> {
        let reply = self.accept(rec).ok().as_ref().and_then(reply_target);
        self.dead_letter(
            rec,
            Refusal {
                reason: Reason::Oversized,
                code: None,
                detail: format!("its {what} cannot be written: {problem}"),
                reply,
            },
        )
    }

    fn dead_letter(&mut self, rec: &InputRecord<'_>, mut refusal: Refusal) -> Result<()> {
        self.counters.dead_lettered += 1;
        let code = refusal.code.unwrap_or(refusal.reason.as_str());
        self.observed.dead_letters.push(code);
        let partition = self.partition();
        let owner_epoch = self.owner_epoch();
        refusal.detail = wire::clip(&refusal.detail, wire::MAX_DETAIL_BYTES).into_owned();
        let id = format!("dlq/{}/{partition}/{}", rec.topic, rec.offset);
        let mut headers = wire::identity("dlq", &id, partition, owner_epoch);
        let id = format!("x/{}", &id[4..]);
        let (key, value) = wire::dead_letter_copy(
            rec.key,
            rec.payload,
            self.codec.max_payload_bytes(),
            &mut headers,
        );
        headers.extend([
            (header::DLQ_REASON.to_owned(), code.as_bytes().to_vec()),
            (
                header::DLQ_DETAIL.to_owned(),
                refusal.detail.clone().into_bytes(),
            ),
            (
                header::SOURCE_TOPIC.to_owned(),
                rec.topic.as_bytes().to_vec(),
            ),
            (
                header::SOURCE_PARTITION.to_owned(),
                partition.to_string().into_bytes(),
            ),
            (
                header::SOURCE_OFFSET.to_owned(),
                rec.offset.to_string().into_bytes(),
            ),
        ]);
        self.push_outbox(OutRecord {
            topic: self.names.dlq(),
            partition,
            key,
            value,
            headers,
            phase: 0,
        });
        if let Some((in_reply_to, operation_key, run_id)) = refusal.reply {
            // Named as `Input::cause_id` names a decided input.
            let cause_id = match rec.source {
                Source::Proposals => format!("proposal:{in_reply_to}"),
                Source::Approvals => format!("approval:{in_reply_to}"),
                Source::Outcomes => format!("outcome:{in_reply_to}"),
                Source::Control => format!("control:{in_reply_to}"),
            };
            let decision = Decision {
                // Not `p/<proposal id>`: the same proposal sent again correctly must get its
                // own decision, not be deduplicated into this refusal.
                decision_id: id,
                in_reply_to,
                operation_key,
                run_id,
                verdict: Verdict::Rejected,
                reason: refusal.reason,
                detail: refusal.detail,
                arguments_hash: None,
                policy_bundle_hash: Some(self.task.core().policy().bundle_hash().to_owned()),
                epoch: None,
                state: None,
                receipt: None,
                owner_partition: partition,
                owner_epoch,
                decided_at: rec.timestamp,
            };
            let receipts = self.task.seal_receipts(
                crate::receipt::draft_of_dead_letter(&decision, cause_id)
                    .into_iter()
                    .collect(),
            )?;
            let effects = Effects {
                decisions: vec![decision],
                receipts,
                ..Effects::default()
            };
            self.observed.decided.push((rec.source, rec.timestamp));
            self.stage_outputs(&effects)?;
        }
        Ok(())
    }

    fn stage_effects(&mut self, effects: Effects) -> Result<()> {
        self.stage_outputs(&effects)
    }

    /// Encodes the outputs of one input into outbox records (phase 0).
    fn stage_outputs(&mut self, effects: &Effects) -> Result<()> {
        let partition = self.partition();
        let owner_epoch = self.owner_epoch();
        let encode =
            |what: &'static str, r: std::result::Result<Vec<u8>, airlock_schemas::Error>| {
                r.map_err(|source| Error::Encode {
                    partition,
                    what,
                    source,
                })
            };
        let mut out = Vec::new();
        for d in &effects.dispatches {
            // The capability signs the stamped command (owner partition and epoch included).
            // Ed25519 is deterministic: a re-decided input yields the same bytes.
            let signed;
            let d = match self.task.core().capability_key() {
                Some(key) => {
                    let mut cmd = d.clone();
                    cmd.capability = Some(capability::sign(key, &cmd));
                    signed = cmd;
                    &signed
                }
                None => d,
            };
            out.push(OutRecord {
                topic: self.names.dispatch(&d.connector),
                partition,
                key: Some(d.operation_key.as_bytes().to_vec()),
                value: Some(encode(
                    "dispatch command",
                    self.codec.encode_single_object(d),
                )?),
                headers: wire::identity("dispatch", &d.command_id, partition, owner_epoch),
                phase: 0,
            });
        }
        for r in &effects.reconciles {
            let signed;
            let r = match self.task.core().capability_key() {
                Some(key) => {
                    let mut cmd = r.clone();
                    cmd.capability = Some(capability::sign_reconcile(key, &cmd));
                    signed = cmd;
                    &signed
                }
                None => r,
            };
            out.push(OutRecord {
                topic: self.names.dispatch(&r.connector),
                partition,
                key: Some(r.operation_key.as_bytes().to_vec()),
                value: Some(encode(
                    "reconcile command",
                    self.codec.encode_single_object(r),
                )?),
                headers: wire::identity("reconcile", &r.command_id, partition, owner_epoch),
                phase: 0,
            });
        }
        for d in &effects.decisions {
            out.push(OutRecord {
                topic: self.names.decisions(),
                partition,
                key: Some(d.operation_key.as_bytes().to_vec()),
                value: Some(encode(
                    "decision",
                    self.codec.encode(self.output_framing, d),
                )?),
                headers: wire::identity("decision", &d.decision_id, partition, owner_epoch),
                phase: 0,
            });
        }
        for j in &effects.journal {
            out.push(OutRecord {
                topic: self.names.journal(),
                partition,
                key: Some(j.operation_key.as_deref().unwrap_or("").as_bytes().to_vec()),
                value: Some(encode(
                    "journal event",
                    self.codec.encode(self.output_framing, j),
                )?),
                headers: wire::identity(
                    "journal",
                    &format!("journal/{partition}/{}", j.sequence),
                    partition,
                    owner_epoch,
                ),
                phase: 0,
            });
        }
        for r in &effects.receipts {
            out.push(OutRecord {
                topic: self.names.receipts(),
                partition,
                key: Some(r.operation_key.as_bytes().to_vec()),
                value: Some(encode(
                    "receipt",
                    self.codec.encode(self.output_framing, r),
                )?),
                headers: wire::identity(
                    "receipt",
                    &format!("receipt/{partition}/{}", r.sequence),
                    partition,
                    owner_epoch,
                ),
                phase: 0,
            });
        }
        self.counters.decisions += effects.decisions.len() as u64;
        self.counters.dispatches += effects.dispatches.len() as u64;
        for d in &effects.decisions {
            self.observed.decision(d);
        }
        self.observed.dispatches += effects.dispatches.len() as u64;
        self.observed.first_dispatches +=
            effects.dispatches.iter().filter(|d| d.epoch == 1).count() as u64;
        for r in out {
            self.push_outbox(r);
        }
        Ok(())
    }

    fn push_outbox(&mut self, mut r: OutRecord) {
        r.headers.extend(self.trace_headers.iter().cloned());
        self.staged_outbox.push(r);
    }
}

/// Why an input record could not be decided, and to whom a reply is owed when that is known
/// (input id, operation key, run id).
#[derive(Debug)]
struct Refusal {
    reason: Reason,
    /// The dead letter's reason code when it is not `reason`'s name: an input refused for
    /// what no decision names (an outcome whose signature does not verify: `UNSIGNED`,
    /// `FORGED`, the codes connector workers use), which gets no reply.
    code: Option<&'static str>,
    detail: String,
    reply: Option<(String, String, Option<String>)>,
}

impl Refusal {
    fn new(reason: Reason, detail: impl Into<String>) -> Self {
        Refusal {
            reason,
            code: None,
            detail: detail.into(),
            reply: None,
        }
    }
}

/// Who must have signed an input, as what, and the input's id: the approver of an approval,
/// the operator of a control.
fn signer(input: &Input) -> Option<(capability::PersonAct, &str, &str)> {
    match input {
        Input::Approval(a) => Some((
            capability::PersonAct::Approval,
            a.approver_id.as_str(),
            a.approval_id.as_str(),
        )),
        Input::Control(c) => Some((
            capability::PersonAct::Control,
            c.operator_id.as_str(),
            c.control_id.as_str(),
        )),
        Input::Proposal(_) | Input::Outcome(_) | Input::Timer(_) => None,
    }
}

fn reply_target(input: &Input) -> Option<(String, String, Option<String>)> {
    match input {
        Input::Proposal(p) => Some((
            p.proposal_id.clone(),
            p.operation_key.clone(),
            Some(p.run_id.clone()),
        )),
        Input::Approval(a) => Some((a.approval_id.clone(), a.operation_key.clone(), None)),
        Input::Control(c) => c
            .operation_key
            .clone()
            .map(|k| (c.control_id.clone(), k, c.run_id.clone())),
        Input::Outcome(_) | Input::Timer(_) => None,
    }
}

/// The changelog table of a store key, or `None` for rows that stay local.
pub fn changelog_table(key: &[u8]) -> Option<StateTable> {
    match Table::from_prefix(*key.first()?)? {
        Table::Effect => Some(StateTable::Effect),
        Table::Proposal => Some(StateTable::Proposal),
        Table::Run => Some(StateTable::Run),
        Table::Offset => Some(StateTable::Offset),
        Table::Meta if !key[1..].starts_with(LOCAL_PREFIX) && &key[1..] != b"projection_hash" => {
            Some(StateTable::Meta)
        }
        Table::Meta | Table::Timer | Table::Outbox => None,
    }
}

/// The store table of a changelog table.
pub fn store_table(t: StateTable) -> Table {
    match t {
        StateTable::Effect => Table::Effect,
        StateTable::Proposal => Table::Proposal,
        StateTable::Run => Table::Run,
        StateTable::Offset => Table::Offset,
        StateTable::Meta => Table::Meta,
    }
}

pub fn stored_offset(store: &impl Store, topic: &str, partition: i32) -> Result<Option<i64>> {
    Ok(input_tail(store, topic, partition)?.map(|t| t.next))
}

/// The offset row of input `topic` (this partition), as stored with the state.
pub fn input_tail(store: &impl Store, topic: &str, partition: i32) -> Result<Option<InputTail>> {
    let Some(bytes) = store
        .get_raw(Table::Offset, topic.as_bytes())
        .map_err(|source| Error::Store { partition, source })?
    else {
        return Ok(None);
    };
    InputTail::decode(&bytes)
        .map(Some)
        .ok_or_else(|| Error::Store {
            partition,
            source: store::Error::Corrupt {
                table: Table::Offset,
                key: topic.to_owned(),
                detail: format!("{} bytes, expected 8 or 24", bytes.len()),
            },
        })
}

pub fn read_u64(store: &impl Store, id: &[u8], partition: i32) -> Result<Option<u64>> {
    Ok(read_i64(store, Table::Meta, id, partition)?.map(|v| v as u64))
}

pub fn read_i64(
    store: &impl Store,
    table: Table,
    id: &[u8],
    partition: i32,
) -> Result<Option<i64>> {
    let Some(bytes) = store
        .get_raw(table, id)
        .map_err(|source| Error::Store { partition, source })?
    else {
        return Ok(None);
    };
    let arr: [u8; 8] = bytes.as_slice().try_into().map_err(|_| Error::Store {
        partition,
        source: store::Error::Corrupt {
            table,
            key: String::from_utf8_lossy(id).into_owned(),
            detail: format!("{} bytes, expected 8", bytes.len()),
        },
    })?;
    Ok(Some(i64::from_be_bytes(arr)))
}

/// Every outbox row not yet acknowledged, in seal order (produced again after a restart).
pub fn pending_outbox(store: &RocksStore, partition: i32) -> Result<Vec<Outbox>> {
    use crate::store::Backend;
    let (start, end) = Table::Outbox.range();
    let rows = store
        .backend()
        .scan(&start, &end, usize::MAX)
        .map_err(|source| Error::Store { partition, source })?;
    rows.into_iter()
        .map(|(k, v)| {
            let row = k
                .get(1..9)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_be_bytes)
                .unwrap_or(0);
            wire::decode_outbox_row(&v)
                .map(|records| Outbox { row, records })
                .map_err(|source| Error::Outbox {
                    partition,
                    row,
                    source,
                })
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::core::StateView;
    use crate::sample;
    use crate::store::{RocksBackend, RocksOptions, StateStore};

    const NOW: i64 = 1_700_000_000_000;

    #[test]
    fn an_offset_row_reads_with_or_without_its_fingerprint() {
        let with = InputTail {
            next: 42,
            last: Some([7; 16]),
        };
        assert_eq!(with.encode().len(), 24);
        assert_eq!(InputTail::decode(&with.encode()), Some(with));
        // The rows of tasks that kept no fingerprint: the offset alone.
        assert_eq!(
            InputTail::decode(&42i64.to_be_bytes()),
            Some(InputTail {
                next: 42,
                last: None
            })
        );
        for len in [0, 7, 9, 23, 25] {
            assert_eq!(InputTail::decode(&vec![0; len]), None, "{len} bytes");
        }
    }

    #[test]
    fn fingerprints_match_their_golden_vectors() {
        // SHA-256("airlock.input.v1" ++ 0x01 ++ i64 BE time ++ 0x01 ++ u64 BE len ++ key
        // ++ 0x00 (no payload)), first 16 bytes; and with no time, a key and a payload.
        assert_eq!(
            hex::encode(fingerprint(
                Some(1_700_000_000_000),
                Some(b"refund:a"),
                None
            )),
            "cf42ac70da04054bf65fb3d1e1ec25eb"
        );
        assert_eq!(
            hex::encode(fingerprint(None, Some(b"abc"), Some(b"{}"))),
            "85c73367c48250841fda7d1c5672dabe"
        );
    }

    #[test]
    fn fingerprints_tell_records_apart_by_time_key_and_payload() {
        let base = fingerprint(Some(1), Some(b"k"), Some(b"v"));
        assert_eq!(base, fingerprint(Some(1), Some(b"k"), Some(b"v")));
        let others = [
            fingerprint(Some(2), Some(b"k"), Some(b"v")),
            fingerprint(None, Some(b"k"), Some(b"v")),
            fingerprint(Some(1), Some(b"k2"), Some(b"v")),
            fingerprint(Some(1), None, Some(b"v")),
            fingerprint(Some(1), Some(b""), Some(b"v")),
            fingerprint(Some(1), Some(b"k"), None),
            // Where the key ends and the payload starts is part of what is hashed.
            fingerprint(Some(1), Some(b"kv"), Some(b"")),
        ];
        for (i, other) in others.iter().enumerate() {
            assert_ne!(*other, base, "variant {i}");
        }
    }

    /// A task of partition 0 of 1 over a fresh RocksDB directory, its codec's payload limit
    /// `max_payload`.
    fn task(max_payload: usize) -> (tempfile::TempDir, PartitionTask, Names) {
        let core = Arc::new(sample::reference_core(crate::core::Config::default()).unwrap());
        task_over(core, max_payload)
    }

    /// [`task`] over `core`.
    fn task_over(core: Arc<Core>, max_payload: usize) -> (tempfile::TempDir, PartitionTask, Names) {
        let dir = tempfile::tempdir().unwrap();
        let backend = RocksBackend::open(
            dir.path(),
            &RocksOptions {
                sync: false,
                ..RocksOptions::default()
            },
        )
        .unwrap();
        let names = Names::new("t.");
        let ctx = TaskContext {
            partition: 0,
            owner_epoch: 1,
            task: "test/0".to_owned(),
        };
        let store = StateStore::open(backend).unwrap();
        let codec = Codec::new().with_max_payload_bytes(max_payload);
        let task = PartitionTask::new(core, store, ctx, names.clone(), codec, 1).unwrap();
        (dir, task, names)
    }

    fn record<'a>(
        source: Source,
        topic: &'a str,
        offset: i64,
        key: &'a [u8],
        payload: &'a [u8],
    ) -> InputRecord<'a> {
        InputRecord {
            source,
            topic,
            offset,
            key: Some(key),
            payload: Some(payload),
            timestamp: NOW,
            capability: None,
        }
    }

    /// The `airlock-dlq-reason` of each dead letter among `records`, in order.
    fn dead_letter_reasons(records: &[OutRecord], names: &Names) -> Vec<String> {
        records
            .iter()
            .filter(|r| r.topic == names.dlq())
            .map(|r| {
                let (_, v) = r
                    .headers
                    .iter()
                    .find(|(k, _)| k == header::DLQ_REASON)
                    .unwrap();
                String::from_utf8(v.clone()).unwrap()
            })
            .collect()
    }

    /// Key, value and headers of a record as the broker counts them, roughly.
    fn size(r: &OutRecord) -> usize {
        r.key.as_ref().map_or(0, Vec::len)
            + r.value.as_ref().map_or(0, Vec::len)
            + r.headers
                .iter()
                .map(|(k, v)| k.len() + v.len())
                .sum::<usize>()
    }

    const LIMIT: usize = 64 * 1_024 - crate::runtime::config::RECORD_RESERVE_BYTES;

    /// Each input kind's bad records, as an outsider can write them to the input topics: each
    /// is dead-lettered with its reason and the partition decides on.
    #[test]
    fn bad_records_of_every_input_kind_are_dead_lettered_with_their_reason() {
        let (_dir, mut task, names) = task(LIMIT);
        let codec = Codec::new();
        let mut outcome =
            sample::outcome("refund:o", 1, airlock_schemas::OutcomeKind::Committed, "x");
        outcome.worker_id = "w".repeat(20_000);
        let mut control = sample::control(
            "c-1",
            airlock_schemas::ControlKind::Cancel,
            Some("refund:c"),
            NOW,
        );
        control.operator_id = "o".repeat(20_000);
        let approval_on_proposals = codec
            .encode_single_object(&sample::approval(
                &sample::refund("refund:d", 100, NOW),
                "00",
                "alice",
                airlock_schemas::ApprovalVerdict::Approve,
                NOW,
            ))
            .unwrap();
        // (input, topic, key, value, the dead-letter reason expected)
        type Case<'a> = (Source, String, &'a [u8], Option<Vec<u8>>, &'a str);
        let cases: [Case<'_>; 4] = [
            (
                Source::Outcomes,
                names.outcomes(),
                b"refund:o",
                Some(codec.encode_single_object(&outcome).unwrap()),
                "OVERSIZED",
            ),
            (
                Source::Control,
                names.control(),
                b"refund:c",
                Some(codec.encode_single_object(&control).unwrap()),
                "OVERSIZED",
            ),
            // A tombstone: no value at all.
            (
                Source::Proposals,
                names.proposals(),
                b"refund:t",
                None,
                "MALFORMED",
            ),
            // A record of another kind than the topic's.
            (
                Source::Proposals,
                names.proposals(),
                b"refund:d",
                Some(approval_on_proposals),
                "UNKNOWN_SCHEMA",
            ),
        ];
        let mut offsets = [0i64; 4];
        for (source, topic, key, value, _) in &cases {
            let at = &mut offsets[Source::ALL.iter().position(|s| s == source).unwrap()];
            task.handle_record(&InputRecord {
                source: *source,
                topic,
                offset: *at,
                key: Some(key),
                payload: value.as_deref(),
                timestamp: NOW,
                capability: None,
            })
            .unwrap();
            *at += 1;
        }
        // A well-formed proposal without a timestamp: no clock stands in for its time.
        let untimed = codec
            .encode_single_object(&sample::refund("refund:untimed", 100, NOW))
            .unwrap();
        task.handle_record(&InputRecord {
            timestamp: crate::runtime::decide::NO_TIMESTAMP,
            ..record(
                Source::Proposals,
                &names.proposals(),
                offsets[0],
                b"refund:untimed",
                &untimed,
            )
        })
        .unwrap();
        // The partition decides on: a fresh refund after them is dispatched.
        let fresh = sample::refund("refund:after", 100, NOW);
        task.handle_record(&record(
            Source::Proposals,
            &names.proposals(),
            offsets[0] + 1,
            b"refund:after",
            &codec.encode_single_object(&fresh).unwrap(),
        ))
        .unwrap();
        let outbox = task.seal(NOW).unwrap();
        let reasons = dead_letter_reasons(&outbox.records, &names);
        let mut expected: Vec<&str> = cases.iter().map(|c| c.4).collect();
        expected.push("MALFORMED");
        assert_eq!(reasons, expected);
        assert!(
            outbox
                .records
                .iter()
                .any(|r| r.topic == names.dispatch("ledger")),
            "the fresh refund after the bad records is dispatched"
        );
    }

    /// An approval or a control counts only signed by its person when the policy entities
    /// register keys for them; with signatures required of everyone, a person without keys is
    /// refused too. Every refusal is dead-lettered with its code and answered to the sender.
    #[test]
    fn approvals_and_controls_count_only_signed_by_their_person() {
        use crate::capability::{PersonAct, SigningKey, sign_person};
        let alice = SigningKey::from_bytes(&[7; 32]);
        let intruder = SigningKey::from_bytes(&[9; 32]);
        let dir = sample::config_dir();
        let mut entities: Vec<serde_json::Value> =
            serde_json::from_str(&std::fs::read_to_string(dir.join("entities.json")).unwrap())
                .unwrap();
        for e in &mut entities {
            if e["uid"]["id"] == "alice" || e["uid"]["id"] == "operator-olga" {
                e["attrs"]["verifying_keys"] =
                    serde_json::json!([hex::encode(alice.verifying_key().to_bytes())]);
            }
        }
        let core = |required: bool| {
            let registry = crate::core::registry::Registry::load(&dir.join("tools.toml")).unwrap();
            let policy = crate::core::policy::Policy::from_sources(
                &std::fs::read_to_string(dir.join("policies.cedar")).unwrap(),
                &serde_json::to_string(&entities).unwrap(),
            )
            .unwrap();
            Arc::new(
                Core::new(registry, policy, crate::core::Config::default())
                    .with_person_signatures_required(required),
            )
        };
        let codec = Codec::new();
        let refund = sample::refund("refund:s", 100, NOW);
        let approval = |approver: &str, id: &str| {
            let mut a = sample::approval(
                &refund,
                "00",
                approver,
                airlock_schemas::ApprovalVerdict::Approve,
                NOW,
            );
            a.approval_id = id.to_owned();
            codec.encode_single_object(&a).unwrap()
        };
        let mut control = sample::control(
            "c-s",
            airlock_schemas::ControlKind::Cancel,
            Some("refund:s"),
            NOW,
        );
        control.operator_id = "operator-olga".to_owned();
        let control = codec.encode_single_object(&control).unwrap();
        let signed = |key: &SigningKey, act, person: &str, value: &[u8]| {
            Some(sign_person(key, act, person, value))
        };
        let approvals = |p: &str, id: &str| (Source::Approvals, approval(p, id));
        // (input, value, capability, the dead-letter code expected, if any)
        type Case = (Source, Vec<u8>, Option<Vec<u8>>, Option<&'static str>);
        let (a1, a2, a3, a4) = (
            approvals("alice", "a-unsigned"),
            approvals("alice", "a-intruder"),
            approvals("alice", "a-signed"),
            approvals("bob", "b-unsigned"),
        );
        let cases = |required: bool| -> Vec<Case> {
            vec![
                (a1.0, a1.1.clone(), None, Some("UNSIGNED")),
                (
                    a2.0,
                    a2.1.clone(),
                    signed(&intruder, PersonAct::Approval, "alice", &a2.1),
                    Some("FORGED"),
                ),
                // Signed as a control: another message, so it does not verify.
                (
                    a3.0,
                    a3.1.clone(),
                    signed(&alice, PersonAct::Control, "alice", &a3.1),
                    Some("FORGED"),
                ),
                (
                    a3.0,
                    a3.1.clone(),
                    signed(&alice, PersonAct::Approval, "alice", &a3.1),
                    None,
                ),
                (
                    a4.0,
                    a4.1.clone(),
                    None,
                    required.then_some("UNKNOWN_SIGNER"),
                ),
                (Source::Control, control.clone(), None, Some("UNSIGNED")),
                (
                    Source::Control,
                    control.clone(),
                    signed(&alice, PersonAct::Control, "operator-olga", &control),
                    None,
                ),
            ]
        };
        for required in [false, true] {
            let (_dir, mut task, names) = task_over(core(required), LIMIT);
            let mut offsets = [0i64; 4];
            let mut expected = Vec::new();
            for (source, value, capability, code) in cases(required) {
                let at = &mut offsets[Source::ALL.iter().position(|s| *s == source).unwrap()];
                let topic = names.input(source);
                task.handle_record(&InputRecord {
                    capability: capability.as_deref(),
                    ..record(source, &topic, *at, b"refund:s", &value)
                })
                .unwrap();
                *at += 1;
                expected.extend(code);
            }
            let outbox = task.seal(NOW).unwrap();
            let codes = dead_letter_reasons(&outbox.records, &names);
            assert_eq!(codes, expected, "required: {required}");
            // Each refusal is answered to whoever sent it, naming why.
            let replies: Vec<airlock_schemas::Decision> = outbox
                .records
                .iter()
                .filter(|r| r.topic == names.decisions())
                .filter_map(|r| codec.decode_as(r.value.as_deref()?).ok())
                .collect();
            let unsigned = replies
                .iter()
                .find(|d| d.in_reply_to == "a-unsigned")
                .expect("the unsigned approval is answered");
            assert!(
                unsigned.detail.contains("not signed by alice"),
                "{unsigned:?}"
            );
        }
    }

    /// Deletions leave as tombstones (null values, so compaction drops their keys), and never
    /// as a batch's last record, which carries the batch's end.
    #[test]
    fn deletions_leave_as_tombstones_and_never_end_a_batch() {
        let (_dir, mut task, names) = task(LIMIT);
        let changelog = |records: &[OutRecord]| -> Vec<(Vec<u8>, bool, bool)> {
            records
                .iter()
                .filter(|r| r.topic == names.changelog())
                .map(|r| {
                    let end = r.headers.iter().any(|(k, _)| k == wire::header::BATCH_END);
                    (r.key.clone().unwrap(), r.value.is_some(), end)
                })
                .collect()
        };
        let store = task.task.store_mut();
        store.stage_raw(Table::Run, b"run-a", Some(b"{}".to_vec()));
        store.stage_raw(Table::Run, b"run-b", Some(b"{}".to_vec()));
        task.seal(NOW).unwrap();

        // A deletion beside a write: the tombstone first, the write ends the batch.
        let store = task.task.store_mut();
        store.stage_raw(Table::Run, b"run-b", None);
        store.stage_raw(Table::Run, b"run-a", Some(b"{\"x\":1}".to_vec()));
        let rows = changelog(&task.seal(NOW).unwrap().records);
        assert_eq!(
            rows,
            vec![
                (Table::Run.key(b"run-b"), false, false),
                (Table::Run.key(b"run-a"), true, true),
            ]
        );
        // Deletions only: a row of the batch's own ends it.
        task.task.store_mut().stage_raw(Table::Run, b"run-a", None);
        let rows = changelog(&task.seal(NOW + 1).unwrap().records);
        assert_eq!(
            rows,
            vec![
                (Table::Run.key(b"run-a"), false, false),
                (Table::Meta.key(META_BATCH_END), true, true),
            ]
        );
    }

    /// A timer fires once every input topic was read past its due time, never by the wall
    /// clock; a task waiting for time ticks the topics that lag, at most once per interval.
    #[test]
    fn timers_fire_by_the_inputs_time_which_ticks_bring_to_silent_topics() {
        let (_dir, mut task, names) = task(LIMIT);
        let codec = Codec::new();
        let mut refund = sample::refund("refund:big", 20_000, NOW);
        refund.deadline_at = NOW + 5_000;
        task.advance_clock(Source::Proposals, NOW, NOW, 100)
            .unwrap();
        task.handle_record(&record(
            Source::Proposals,
            &names.proposals(),
            0,
            b"refund:big",
            &codec.encode_single_object(&refund).unwrap(),
        ))
        .unwrap();
        task.seal(NOW).unwrap();
        let state = |task: &PartitionTask| {
            task.store()
                .effect("refund:big")
                .unwrap()
                .unwrap()
                .effect_state()
        };
        assert_eq!(state(&task), airlock_schemas::EffectState::AwaitingApproval);

        // Long past the deadline by the wall clock: nothing fires, the task asks for ticks on
        // every input topic (three never read, proposals read only up to NOW), once.
        let wall = NOW + 60_000;
        task.fire_due(100).unwrap();
        assert_eq!(task.counters.timers, 0);
        assert_eq!(task.tick_if_due(wall, 1_000, 60_000).unwrap(), 4);
        assert_eq!(task.tick_if_due(wall + 999, 1_000, 60_000).unwrap(), 0);
        let ticks = task.seal(wall).unwrap().records;
        let mut ticked: Vec<&str> = ticks.iter().map(|r| r.topic.as_str()).collect();
        ticked.sort_unstable();
        let mut inputs = Source::ALL.map(|s| names.input(s));
        inputs.sort_unstable();
        assert_eq!(ticked, inputs);
        assert!(
            ticks
                .iter()
                .all(|r| r.key.as_deref() == Some(wire::BARRIER_KEY))
        );

        // The ticks come back stamped by the broker; the timer fires with the last of them.
        let tick_at = NOW + 6_000;
        for (i, source) in [
            Source::Approvals,
            Source::Outcomes,
            Source::Control,
            Source::Proposals,
        ]
        .into_iter()
        .enumerate()
        {
            assert_eq!(task.counters.timers, 0, "{i} of 4 topics ticked");
            let topic = names.input(source);
            let offset = i64::from(source == Source::Proposals);
            task.advance_clock(source, tick_at, wall, 100).unwrap();
            task.handle_record(&InputRecord {
                timestamp: tick_at,
                ..record(source, &topic, offset, wire::BARRIER_KEY, &[])
            })
            .unwrap();
        }
        assert_eq!(task.counters.timers, 1);
        assert_eq!(state(&task), airlock_schemas::EffectState::Expired);
        assert_eq!(task.clock().now(), Some(tick_at));
        // Waiting for nothing now: no ticks.
        task.seal(wall).unwrap();
        assert_eq!(task.tick_if_due(wall + 5_000, 1_000, 60_000).unwrap(), 0);
    }

    /// Before every input topic was read once the partition has no time: a change decided then
    /// still owes a checkpoint, which ticks bring the time for, and which a stopping task
    /// journals at once.
    #[test]
    fn a_change_decided_before_the_partition_has_a_time_still_owes_its_checkpoint() {
        use crate::runtime::{config, decide};
        let (_dir, mut task, names) = task(LIMIT);
        let refund = sample::refund("refund:small", 100, NOW);
        let payload = Codec::new().encode_single_object(&refund).unwrap();
        task.advance_clock(Source::Proposals, NOW, NOW, 100)
            .unwrap();
        task.handle_record(&record(
            Source::Proposals,
            &names.proposals(),
            0,
            b"refund:small",
            &payload,
        ))
        .unwrap();
        assert_eq!(task.clock().now(), None);
        let settings = decide::Settings::of(&config::Processor::default(), NOW);
        let (sealed, _) = decide::close(&mut task, settings).unwrap();
        let on = |records: &[OutRecord], topic: &str| {
            records.iter().filter(|r| r.topic == topic).count()
        };
        assert_eq!(on(&sealed.records, &names.dispatch("ledger")), 1);
        assert_eq!(
            on(&sealed.records, &names.journal()),
            1,
            "the decision only"
        );
        for silent in [names.approvals(), names.outcomes(), names.control()] {
            assert_eq!(on(&sealed.records, &silent), 1, "a tick on {silent}");
        }
        assert_eq!(on(&sealed.records, &names.proposals()), 0, "read at NOW");
        let closing = task.seal_closing_checkpoint(NOW + 1).unwrap();
        assert_eq!(
            on(&closing.records, &names.journal()),
            1,
            "the checkpoint owed"
        );
    }

    #[test]
    fn oversized_identifiers_and_payloads_are_dead_lettered_within_the_record_limit() {
        use sha2::Digest;
        let (_dir, mut task, names) = task(LIMIT);
        let codec = Codec::new();
        let proposals = names.proposals();
        let approvals = names.approvals();

        // A proposal whose id alone is 20 KB: dead-lettered, no reply (it would echo the id).
        let mut long_id = sample::refund("refund:a", 100, NOW);
        long_id.proposal_id = "p".repeat(20_000);
        let bytes = codec.encode_single_object(&long_id).unwrap();
        task.handle_record(&record(
            Source::Proposals,
            &proposals,
            0,
            b"refund:a",
            &bytes,
        ))
        .unwrap();

        // An approval from a 20 KB approver: dead-lettered, the reply names its approval id.
        let mut approval = sample::approval(
            &sample::refund("refund:b", 100, NOW),
            "00",
            &"a".repeat(20_000),
            airlock_schemas::ApprovalVerdict::Approve,
            NOW,
        );
        approval.approval_id = "appr-b".to_owned();
        let approval_id = approval.approval_id.clone();
        let bytes = codec.encode_single_object(&approval).unwrap();
        task.handle_record(&record(
            Source::Approvals,
            &approvals,
            0,
            b"refund:b",
            &bytes,
        ))
        .unwrap();

        // 200 KB of garbage under a 5 KB key: a copy cut to fit, with the original's size and
        // digest.
        let garbage = vec![0xc3; 200_000];
        let key = vec![b'k'; 5_000];
        task.handle_record(&record(Source::Proposals, &proposals, 1, &key, &garbage))
            .unwrap();

        let outbox = task.seal(NOW).unwrap();
        let dlq: Vec<&OutRecord> = outbox
            .records
            .iter()
            .filter(|r| r.topic == names.dlq())
            .collect();
        assert_eq!(dlq.len(), 3, "{dlq:?}");
        let header = |r: &OutRecord, name: &str| {
            r.headers
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| String::from_utf8(v.clone()).unwrap())
        };
        for r in &dlq {
            assert_eq!(header(r, header::DLQ_REASON).as_deref(), Some("OVERSIZED"));
        }
        assert_eq!(
            header(dlq[0], header::DLQ_DETAIL).as_deref(),
            Some("proposal_id is 20000 bytes, the limit is 512")
        );
        assert_eq!(
            header(dlq[1], header::DLQ_DETAIL).as_deref(),
            Some("approver_id is 20000 bytes, the limit is 512")
        );
        assert_eq!(header(dlq[0], header::DLQ_TRUNCATED), None, "it fits whole");
        let cut = dlq[2];
        assert_eq!(
            header(cut, header::DLQ_TRUNCATED).as_deref(),
            Some("key,value")
        );
        assert_eq!(
            header(cut, header::DLQ_VALUE_BYTES).as_deref(),
            Some("200000")
        );
        assert_eq!(header(cut, header::DLQ_KEY_BYTES).as_deref(), Some("5000"));
        assert_eq!(
            header(cut, header::DLQ_VALUE_SHA256),
            Some(canonical::hex_lower(&sha2::Sha256::digest(&garbage)))
        );
        assert_eq!(cut.value.as_ref().map(Vec::len), Some(LIMIT));
        assert_eq!(
            cut.key.as_ref().map(Vec::len),
            Some(wire::MAX_DEAD_LETTER_KEY_BYTES)
        );

        let decisions: Vec<Decision> = outbox
            .records
            .iter()
            .filter(|r| r.topic == names.decisions())
            .map(
                |r| match codec.decode(r.value.as_deref().unwrap()).unwrap().record {
                    AnyRecord::Decision(d) => d,
                    other => panic!("{other:?}"),
                },
            )
            .collect();
        assert_eq!(decisions.len(), 1, "{decisions:?}");
        assert_eq!(decisions[0].in_reply_to, approval_id);
        assert_eq!(decisions[0].reason, Reason::Oversized);
        for r in &outbox.records {
            assert!(size(r) <= LIMIT + 4_096, "{} is {} bytes", r.topic, size(r));
        }
        assert_eq!(task.counters.dead_lettered, 3);
    }

    #[test]
    fn an_input_whose_outputs_cannot_be_encoded_is_dead_lettered_and_changes_nothing() {
        let (_dir, mut task, names) = task(LIMIT);
        let codec = Codec::new();
        let proposals = names.proposals();
        let refund = sample::refund("refund:a", 100, NOW);
        let refund_bytes = codec.encode_single_object(&refund).unwrap();
        // 20,000 quotes: 40 KB of arguments, within every input limit; the effect record that
        // the journal event carries escapes them again, over the limit.
        let mut email = sample::refund("email:a", 100, NOW);
        email.tool = "send_email".to_owned();
        email.arguments_json = serde_json::json!({
            "tenant_id": "acme",
            "to": "ops@example.com",
            "subject": "s",
            "body": "\"".repeat(20_000),
        })
        .to_string();
        let email_bytes = codec.encode_single_object(&email).unwrap();
        assert!(email_bytes.len() < LIMIT);

        let first = record(Source::Proposals, &proposals, 0, b"refund:a", &refund_bytes);
        let second = record(Source::Proposals, &proposals, 1, b"email:a", &email_bytes);
        task.handle_record(&first).unwrap();
        let err = task.handle_record(&second).unwrap_err();
        assert!(matches!(err, Error::Encode { .. }), "{err}");

        // What `decide_partition` does: the batch again, the record dead-lettered.
        task.discard().unwrap();
        task.handle_record(&first).unwrap();
        let Error::Encode { what, source, .. } = err else {
            unreachable!()
        };
        task.dead_letter_unencodable(&second, what, &source.to_string())
            .unwrap();
        let outbox = task.seal(NOW).unwrap();

        assert!(task.store().effect("refund:a").unwrap().is_some());
        assert!(task.store().effect("email:a").unwrap().is_none());
        assert_eq!(task.counters.inputs, 1, "the discarded pass is not counted");
        assert_eq!(task.counters.dead_lettered, 1);
        let dlq: Vec<&OutRecord> = outbox
            .records
            .iter()
            .filter(|r| r.topic == names.dlq())
            .collect();
        assert_eq!(dlq.len(), 1);
        let reply = outbox
            .records
            .iter()
            .filter(|r| r.topic == names.decisions())
            .map(
                |r| match codec.decode(r.value.as_deref().unwrap()).unwrap().record {
                    AnyRecord::Decision(d) => d,
                    other => panic!("{other:?}"),
                },
            )
            .find(|d| d.in_reply_to == email.proposal_id)
            .expect("the sender hears why");
        assert_eq!(reply.reason, Reason::Oversized);
        assert!(
            reply
                .detail
                .starts_with("its journal event cannot be written"),
            "{}",
            reply.detail
        );
        for r in &outbox.records {
            assert!(size(r) <= LIMIT + 4_096, "{} is {} bytes", r.topic, size(r));
        }
    }

    #[test]
    fn a_redelivered_last_record_must_match_its_fingerprint() {
        let codec = Codec::new();
        let (_dir, mut task, names) = task(codec.max_payload_bytes());
        let topic = names.proposals();
        let mut last = [0; 16];
        for offset in 0..3 {
            let proposal = sample::refund(&format!("refund:{offset}"), 100, NOW);
            let payload = codec.encode_single_object(&proposal).unwrap();
            let key = proposal.operation_key.as_bytes();
            task.handle_record(&InputRecord {
                source: Source::Proposals,
                topic: &topic,
                offset,
                key: Some(key),
                payload: Some(&payload),
                timestamp: NOW,
                capability: None,
            })
            .unwrap();
            last = fingerprint(Some(NOW), Some(key), Some(&payload));
        }
        task.note_last_consumed(&topic, 2, last);
        task.seal(NOW).unwrap();
        assert_eq!(task.stored_offset(&topic).unwrap(), Some(3));

        // The last record consumed, as it was: fine. Another record there: refused.
        task.check_redelivered(&topic, 2, || last).unwrap();
        let other = fingerprint(Some(NOW), Some(b"refund:x"), Some(b"x"));
        let err = task.check_redelivered(&topic, 2, || other).unwrap_err();
        assert!(
            err.to_string().starts_with(
                "t.proposals partition 0: the record at offset 2 is not the one this partition \
                 consumed there"
            ),
            "{err}"
        );
        // Earlier records have no stored fingerprint (not even computed), nor has a topic
        // with nothing consumed.
        task.check_redelivered(&topic, 1, || unreachable!())
            .unwrap();
        task.check_redelivered(&names.outcomes(), 2, || unreachable!())
            .unwrap();
    }
}
