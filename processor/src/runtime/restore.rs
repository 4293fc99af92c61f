//! Gaining a partition (DESIGN.md sections 5 and 6): decide whether the local state is current,
//! resend what the local outbox still holds when it is (drop it unsent when it is not), restore
//! the state from `airlock.changelog` when it is missing or behind, claim the next owner epoch,
//! write the fence markers before any other output, and catch up to the marker.
//!
//! Local state is reused only when every changelog record after the position it last knew was
//! written by its own owner epoch; any record of a later owner means another task decided
//! inputs this store has not seen, so the store is dropped and rebuilt from the changelog.
//!
//! Rows are applied a whole batch at a time (`WholeBatches`). A batch's changelog records
//! can leave as several produce requests, and an owner that dies between them leaves a prefix
//! of its last batch: applying that prefix would advance some rows (an input offset, the
//! journal sequence) without the others, and the next owner would skip inputs or number events
//! twice. The prefix is dropped instead, the inputs it covered are decided again, and the claim
//! writes its own value of every key the prefix touched with its first batch, so that later
//! restores, which apply the prefix just before that batch, end with the same state.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_schemas::{ChangelogRecord, Codec};
use rdkafka::Message;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{BorrowedHeaders, Headers};
use rdkafka::{Offset, TopicPartitionList};

use super::partition::{self, META_CHANGELOG_NEXT, META_OWNER_EPOCH, PartitionTask};
use super::produce::{self, Producer};
use super::telemetry::Telemetry;
use super::topics::Names;
use super::wire::{self, Admit, FenceFilter, OutRecord};
use crate::core::{Core, TaskContext};
use crate::store::{self, RocksBackend, RocksOptions, RocksStore, StateStore, Store, keys::Table};

/// Errors of gaining a partition; each names the partition.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("partition {partition}: kafka: {source}")]
    Kafka {
        partition: i32,
        #[source]
        source: rdkafka::error::KafkaError,
    },
    #[error("partition {partition}: {source}")]
    Store {
        partition: i32,
        #[source]
        source: store::Error,
    },
    #[error(transparent)]
    Task(#[from] partition::Error),
    #[error(transparent)]
    Produce(#[from] produce::Error),
    #[error("partition {partition}: removing stale state at {path}: {source}")]
    Wipe {
        partition: i32,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("partition {partition}: changelog offset {offset} is not a changelog record: {detail}")]
    Corrupt {
        partition: i32,
        offset: i64,
        detail: String,
    },
    #[error(
        "partition {partition}: no progress reading the changelog at offset {at} (target {until}) for {stalled:?}"
    )]
    Stalled {
        partition: i32,
        at: i64,
        until: i64,
        stalled: Duration,
    },
    #[error(
        "partition {partition}: owner epoch {theirs} was claimed while this task claimed {ours}; \
         another instance owns the partition"
    )]
    Contended {
        partition: i32,
        ours: i64,
        theirs: i64,
    },
}

impl Error {
    /// True when claiming again later may succeed: a broker down or a leader moving (librdkafka
    /// errors other than fatal ones), a read that stalled, another instance claiming at the
    /// same time. A damaged store, an unreadable changelog record or a local I/O failure is not.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Kafka { source, .. } => super::scan::transient(source),
            Error::Produce(e) => e.is_transient(),
            Error::Stalled { .. } | Error::Contended { .. } => true,
            Error::Store { .. } | Error::Task(_) | Error::Wipe { .. } | Error::Corrupt { .. } => {
                false
            }
        }
    }

    /// The damaged-store error behind this one, if any ([`store::Error::is_unreadable`]).
    fn unreadable_store(&self) -> Option<&store::Error> {
        let mut next: Option<&(dyn std::error::Error + 'static)> = Some(self);
        while let Some(e) = next {
            if let Some(s) = e.downcast_ref::<store::Error>()
                && s.is_unreadable()
            {
                return Some(s);
            }
            next = e.source();
        }
        None
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What gaining a partition needs; one per processor instance.
pub struct Claim {
    pub core: Arc<Core>,
    pub names: Names,
    pub codec: Codec,
    /// How the tasks frame decisions, journal events and receipts (see
    /// [`PartitionTask::with_output_framing`]).
    pub output_framing: airlock_schemas::Framing,
    pub partitions: i32,
    /// Every output topic: each gets a fence marker.
    pub output_topics: Vec<String>,
    pub state_dir: PathBuf,
    pub rocks: RocksOptions,
    pub producer: Arc<Producer>,
    /// A group-less consumer that reads the changelog.
    pub reader: BaseConsumer,
    /// The instance name, for the journal's task field.
    pub instance: String,
    pub stall_timeout: Duration,
    /// Restore progress and readiness (a partition being claimed is not ready).
    pub telemetry: Arc<Telemetry>,
}

impl std::fmt::Debug for Claim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Claim")
            .field("state_dir", &self.state_dir)
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

/// What a claim did, for the log.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Outbox records the last incarnation committed and had not seen acknowledged, sent now.
    pub resent: usize,
    /// Such records dropped unsent because a later owner took the partition over meanwhile.
    pub dropped: usize,
    /// Rows the task writes again with its first batch: keys of which the changelog holds a
    /// fenced owner's row that a compaction could leave in place of the valid one.
    pub rewritten: usize,
    pub restored_rows: u64,
    pub reused_local_state: bool,
    pub owner_epoch: i64,
    pub fenced_rows: u64,
    /// Rows of the previous owner's last batch that never reached the changelog whole: not
    /// applied (their inputs are decided again) and written over (counted in `rewritten`).
    pub torn_rows: usize,
}

/// How many times a claim that met a concurrent claimer starts over before giving up.
const CONTENDED_RETRIES: u32 = 3;

impl Claim {
    /// Takes partition `partition`: returns its task, ready at its stored offsets.
    ///
    /// Two instances can claim one partition at once while the group hands it over (the old
    /// owner was dropped from the group but has not noticed yet). When this claim finds
    /// another claimer's marker behind its barrier, its local state may hold that owner's
    /// rows as its own: it is wiped and the claim starts over, taking an epoch above both.
    pub fn take(&self, partition: i32) -> Result<(PartitionTask, Report)> {
        let claiming = self.telemetry.claiming(partition);
        let mut attempt = 0;
        let mut moved_aside = false;
        loop {
            match self.try_take(partition) {
                Ok((task, report)) => {
                    claiming.done(report.reused_local_state);
                    return Ok((task, report));
                }
                Err(e @ Error::Contended { .. }) if attempt < CONTENDED_RETRIES => {
                    attempt += 1;
                    log::warn!("{e}; rebuilding the partition and claiming again");
                    self.wipe(partition)?;
                }
                // A damaged store would fail every claim, on every instance that keeps this
                // disk: it is moved aside (kept for a post-mortem) and the partition restored
                // from the changelog, once.
                Err(e) if !moved_aside && e.unreadable_store().is_some() => {
                    moved_aside = true;
                    let to = self.move_aside(partition)?;
                    log::error!(
                        "partition {partition}: the local state is unreadable ({e}); moved it to \
                         {} and restoring the partition from the changelog",
                        to.display()
                    );
                }
                other => return other,
            }
        }
    }

    /// Moves partition `partition`'s store to `partition-<n>.unreadable` (replacing an earlier
    /// one: one copy per partition is kept) and returns where.
    fn move_aside(&self, partition: i32) -> Result<PathBuf> {
        let dir = self.state_dir.join(format!("partition-{partition}"));
        let to = self
            .state_dir
            .join(format!("partition-{partition}.unreadable"));
        let io = |path: &Path, source| Error::Wipe {
            partition,
            path: path.to_owned(),
            source,
        };
        if to.exists() {
            std::fs::remove_dir_all(&to).map_err(|e| io(&to, e))?;
        }
        std::fs::rename(&dir, &to).map_err(|e| io(&dir, e))?;
        Ok(to)
    }

    fn wipe(&self, partition: i32) -> Result<()> {
        let dir = self.state_dir.join(format!("partition-{partition}"));
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(|source| Error::Wipe {
                partition,
                path: dir.clone(),
                source,
            })?;
        }
        Ok(())
    }

    fn try_take(&self, partition: i32) -> Result<(PartitionTask, Report)> {
        let mut report = Report::default();
        let dir = self.state_dir.join(format!("partition-{partition}"));
        let mut store = self.open(&dir, partition)?;
        let local_epoch = self.read_i64(&store, META_OWNER_EPOCH, partition)?;

        // Where this store's knowledge of the changelog ends: it advances only over the
        // changelog records the previous owner task wrote back to back (see
        // `PartitionTask::acknowledged`), never past someone else's.
        let known_end = self.read_i64(&store, META_CHANGELOG_NEXT, partition)?;

        // 1. Is the local state current?
        let topic = self.names.changelog();
        let (low, _) = super::scan::watermarks(&self.reader, &topic, partition, self.stall_timeout)
            .map_err(|source| Error::Kafka { partition, source })?;
        // The end of the changelog, read-your-writes: the offset of a barrier record produced
        // now (see `compat`).
        let barrier = self
            .producer
            .send_phased(&[OutRecord::barrier(&topic, partition)])?;
        let high = barrier.placed(&topic, partition)?;
        let mut filter = FenceFilter::default();
        let mut max_epoch = local_epoch.unwrap_or(0);
        let mut stale = local_epoch.is_none();
        // Keys whose latest row read is fenced (an owner's row behind a later owner's marker):
        // on the compacted changelog such a row outlives the valid rows of its key, so the task
        // writes its own value of each again (see `PartitionTask::rewrite_rows`).
        let mut latest_fenced = LatestFenced::default();
        let mut batches = WholeBatches::default();
        if let Some(local) = local_epoch {
            let from = known_end.unwrap_or(low).max(low);
            self.read(partition, from, high, |_, epoch, record| {
                let record = record.map(|r| r.record);
                max_epoch = max_epoch.max(epoch);
                if epoch > local {
                    stale = true;
                }
                // Behind this store's own epoch: a zombie of an earlier owner wrote it.
                if let Some(record) = record {
                    latest_fenced.saw(&record, epoch < local);
                }
                Ok(())
            })?;
        }
        // 2. What the last incarnation committed but may not have produced. Resent only when
        // that incarnation is still the partition's latest owner. Behind a later owner's
        // records it is dropped unsent: whatever of it did not reach the changelog, that owner
        // decided again from the changelog's offsets; consumers would drop the records by the
        // fence anyway; and on the compacted changelog a stale row sent after the later owner's
        // row for the same key would outlive it and erase it from every later restore.
        let pending = partition::pending_outbox(&store, partition)?;
        let pending_records: usize = pending.iter().map(|o| o.records.len()).sum();
        if stale {
            if pending_records > 0 {
                log::warn!(
                    "partition {partition}: dropping {pending_records} unsent outbox records of \
                     owner epoch {}: a later owner (epoch {max_epoch}) decided their inputs again",
                    local_epoch.unwrap_or(0)
                );
            }
            report.dropped = pending_records;
            latest_fenced = LatestFenced::default();
            drop(store);
            self.wipe(partition)?;
            store = self.open(&dir, partition)?;
            let started = Instant::now();
            let mut last_log = Instant::now();
            let mut applied: u64 = 0;
            let mut committed: u64 = 0;
            self.read(partition, low, high, |offset, epoch, row| {
                max_epoch = max_epoch.max(epoch);
                if let Some(row) = row {
                    match filter_admit(&mut filter, &topic, partition, epoch, false) {
                        Admit::Accept => {
                            latest_fenced.saw(&row.record, false);
                            for (offset, record) in batches.row(offset, row) {
                                apply(&mut store, partition, offset, record)?;
                                applied += 1;
                                self.telemetry.restored_records.inc(&[]);
                            }
                        }
                        _ => {
                            report.fenced_rows += 1;
                            latest_fenced.saw(&row.record, true);
                        }
                    }
                } else {
                    filter_admit(&mut filter, &topic, partition, epoch, true);
                }
                // Bounded memory: the staged rows are written out every 10,000 or so, at a
                // batch boundary (a crash meanwhile leaves a store without an owner epoch,
                // which the next claim wipes).
                if applied >= committed + 10_000 {
                    committed = applied;
                    store
                        .commit()
                        .map_err(|source| Error::Store { partition, source })?;
                }
                if last_log.elapsed() >= Duration::from_secs(2) {
                    last_log = Instant::now();
                    log::info!(
                        "partition {partition}: restoring from {topic}: offset {offset} of {high} \
                         ({applied} rows, {:.1}s)",
                        started.elapsed().as_secs_f64()
                    );
                }
                Ok(())
            })?;
            report.restored_rows = applied;
        } else {
            report.reused_local_state = true;
            // They land behind the barrier: step 4 reads them back and applies its own rows
            // again (the same values, in the same order: a no-op).
            report.resent = pending_records;
            if !pending.is_empty() {
                let records: Vec<OutRecord> =
                    pending.iter().flat_map(|o| o.records.clone()).collect();
                self.producer.send_phased(&records)?;
                for o in &pending {
                    store.stage_raw(Table::Outbox, &o.row.to_be_bytes(), None);
                }
                store
                    .commit()
                    .map_err(|source| Error::Store { partition, source })?;
            }
        }

        // 3. Claim the next owner epoch; fence markers go out before any other output.
        let epoch = max_epoch + 1;
        report.owner_epoch = epoch;
        // Staged, committed only with the caught-up state and its changelog position below: a
        // claim that fails in between leaves the store without this epoch, so the next claim
        // finds the marker written here above the store's epoch and rebuilds, instead of
        // taking a state that lacks the rows step 4 would have applied for its own.
        store.stage_raw(
            Table::Meta,
            META_OWNER_EPOCH,
            Some(epoch.to_be_bytes().to_vec()),
        );
        // The changelog's marker is acknowledged before any other topic's: a changelog row of
        // the old owner that precedes it (and is restored) had its outputs acknowledged before
        // that row was sent, hence before every other marker, so they are not fenced; a row
        // behind it is fenced and its inputs are decided again here.
        let markers: Vec<OutRecord> = self
            .output_topics
            .iter()
            .map(|t| {
                let mut marker = OutRecord::fence_marker(t, partition, epoch);
                marker.phase = u8::from(*t != topic);
                if let Some(key) = self.core.capability_key() {
                    marker.headers.push((
                        wire::header::CAPABILITY.to_owned(),
                        crate::capability::sign_fence(key, t, partition, epoch),
                    ));
                }
                marker
            })
            .collect();
        let acked = self.producer.send_phased(&markers)?;
        let marker_offset = acked.placed(&topic, partition)?;

        // 4. Catch up to our marker: records there came from the old owner before the takeover.
        let mut applied: u64 = 0;
        self.read(partition, high, marker_offset + 1, |offset, their, row| {
            // A later epoch, or our epoch on anything but our own marker: another
            // instance claimed concurrently.
            if their > epoch || (their == epoch && offset != marker_offset) {
                return Err(Error::Contended {
                    partition,
                    ours: epoch,
                    theirs: their,
                });
            }
            match row {
                Some(row) => {
                    if filter_admit(&mut filter, &topic, partition, their, false) == Admit::Accept {
                        latest_fenced.saw(&row.record, false);
                        for (offset, record) in batches.row(offset, row) {
                            apply(&mut store, partition, offset, record)?;
                            applied += 1;
                            self.telemetry.restored_records.inc(&[]);
                        }
                    } else {
                        report.fenced_rows += 1;
                        latest_fenced.saw(&row.record, true);
                    }
                }
                None => {
                    if their != epoch {
                        filter_admit(&mut filter, &topic, partition, their, true);
                    }
                }
            }
            Ok(())
        })?;
        // Held rows at this claim's own marker: the previous owner's last batch, torn.
        let torn = batches.torn();
        report.torn_rows = torn.len();
        self.telemetry.restore_torn_rows.add(&[], torn.len() as u64);
        if !torn.is_empty() {
            log::warn!(
                "partition {partition}: the changelog ends with {} rows of a batch that never \
                 reached it whole (offsets {} to {}): not applied; their inputs are decided again",
                torn.len(),
                torn[0].0,
                torn[torn.len() - 1].0
            );
        }
        report.restored_rows += applied;
        store.stage_raw(
            Table::Meta,
            META_CHANGELOG_NEXT,
            Some((marker_offset + 1).to_be_bytes().to_vec()),
        );
        store
            .commit()
            .map_err(|source| Error::Store { partition, source })?;

        let ctx = TaskContext {
            partition,
            owner_epoch: epoch,
            task: format!("{}/{partition}", self.instance),
        };
        let mut task = PartitionTask::new(
            self.core.clone(),
            store,
            ctx,
            self.names.clone(),
            self.codec.clone(),
            self.partitions,
        )?
        .with_output_framing(self.output_framing);
        let mut rewrite = latest_fenced.keys();
        rewrite.extend(
            torn.iter()
                .map(|(_, r)| partition::store_table(r.table).key(&r.key)),
        );
        rewrite.sort();
        rewrite.dedup();
        report.rewritten = task.rewrite_rows(&rewrite)?;
        Ok((task, report))
    }

    fn open(&self, dir: &Path, partition: i32) -> Result<RocksStore> {
        std::fs::create_dir_all(dir).map_err(|source| Error::Wipe {
            partition,
            path: dir.to_owned(),
            source,
        })?;
        RocksBackend::open(dir, &self.rocks)
            .and_then(StateStore::open)
            .map_err(|source| Error::Store { partition, source })
    }

    fn read_i64(&self, store: &RocksStore, id: &[u8], partition: i32) -> Result<Option<i64>> {
        Ok(partition::read_i64(store, Table::Meta, id, partition)?)
    }

    /// The full store keys whose latest changelog row in `[from, until)` of `partition` an
    /// owner epoch below `owner_epoch` wrote: a zombie's rows behind this owner's fence marker
    /// (a later owner's rows mean this task is the zombie; they are left alone).
    pub fn fenced_rows(
        &self,
        partition: i32,
        owner_epoch: i64,
        from: i64,
        until: i64,
    ) -> Result<Vec<Vec<u8>>> {
        let mut latest_fenced = LatestFenced::default();
        self.read(partition, from, until, |_, epoch, row| {
            if let Some(row) = row {
                latest_fenced.saw(&row.record, epoch < owner_epoch);
            }
            Ok(())
        })?;
        Ok(latest_fenced.keys())
    }

    /// Reads changelog records `from..until` of `partition` in order: `visit(offset, owner
    /// epoch, row)`, with `row == None` for a fence marker.
    fn read(
        &self,
        partition: i32,
        from: i64,
        until: i64,
        mut visit: impl FnMut(i64, i64, Option<Row>) -> Result<()>,
    ) -> Result<()> {
        if from >= until {
            return Ok(());
        }
        let topic = self.names.changelog();
        let kafka = |source| Error::Kafka { partition, source };
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&topic, partition, Offset::Offset(from))
            .map_err(kafka)?;
        self.reader.assign(&tpl).map_err(kafka)?;
        let mut at = from;
        let mut progress = Instant::now();
        // The broker took every changelog record, whatever `kafka.max_message_bytes` says now
        // (it may have been lowered since): the write limit does not apply to reading them.
        let codec = self.codec.clone().with_max_payload_bytes(usize::MAX);
        let result = (|| {
            while at < until {
                let Some(message) = self.reader.poll(Duration::from_millis(200)) else {
                    if progress.elapsed() > self.stall_timeout {
                        return Err(Error::Stalled {
                            partition,
                            at,
                            until,
                            stalled: progress.elapsed(),
                        });
                    }
                    continue;
                };
                let message = match message {
                    Ok(m) => m,
                    Err(e)
                        if super::scan::transient(&e)
                            && progress.elapsed() <= self.stall_timeout =>
                    {
                        log::warn!("partition {partition}: restoring on after: {e}");
                        continue;
                    }
                    Err(e) => return Err(kafka(e)),
                };
                progress = Instant::now();
                self.telemetry.beat();
                let offset = message.offset();
                at = offset + 1;
                if offset >= until {
                    break;
                }
                let RowHeaders {
                    fence,
                    barrier,
                    batch_end,
                    owner_epoch,
                } = RowHeaders::of(message.headers());
                let corrupt = |detail: String| Error::Corrupt {
                    partition,
                    offset,
                    detail,
                };
                if barrier {
                    continue;
                }
                let epoch = owner_epoch
                    .ok_or_else(|| corrupt("no airlock-owner-epoch header".to_owned()))?;
                if fence {
                    visit(offset, epoch, None)?;
                    continue;
                }
                let record = match message.payload() {
                    Some(payload) => codec
                        .decode_as::<ChangelogRecord>(payload)
                        .map_err(|e| corrupt(e.to_string()))?,
                    // A tombstone: the deletion of the store key the record key names.
                    None => tombstone(partition, epoch, message.key())
                        .ok_or_else(|| corrupt("a tombstone without a store key".to_owned()))?,
                };
                // Rows written before the end header existed: a batch's last row carries the
                // input offsets (when the partition had consumed any).
                let ends_batch = batch_end || !record.input_offsets.is_empty();
                visit(offset, epoch, Some(Row { record, ends_batch }))?;
            }
            Ok(())
        })();
        self.reader
            .unassign()
            .map_err(|source| Error::Kafka { partition, source })?;
        result
    }
}

/// What a changelog record's headers say, read one way for a restore and for the read model
/// of `airlock effects list` (so the two cannot class a row differently).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RowHeaders {
    /// A fence marker (`airlock-kind`): raises the partition's fence, holds no row.
    pub fence: bool,
    /// A barrier of the changelog sweep: no row, no fence.
    pub barrier: bool,
    /// `airlock-batch-end`: the last row of a sealed batch.
    pub batch_end: bool,
    /// `airlock-owner-epoch`, when present and a decimal `i64`.
    pub owner_epoch: Option<i64>,
}

impl RowHeaders {
    /// Reads `headers` as every Airlock reader takes them (the last of each name counts; see
    /// [`wire::kind_and_epoch`]).
    pub(crate) fn of(headers: Option<&BorrowedHeaders>) -> Self {
        let Some(headers) = headers else {
            return Self::default();
        };
        let batch_end = headers.iter().any(|h| h.key == wire::header::BATCH_END);
        let (kind, owner_epoch) =
            wire::kind_and_epoch(headers.iter().map(|h| (h.key, h.value.unwrap_or_default())));
        Self {
            fence: kind == Some(wire::FENCE_KIND.as_bytes()),
            barrier: kind == Some(wire::BARRIER_KIND.as_bytes()),
            batch_end,
            owner_epoch,
        }
    }
}

/// The deletion a changelog tombstone stands for: its record key is the full store key
/// (table prefix, then the table's key), its owner epoch in the identity headers.
pub(crate) fn tombstone(
    partition: i32,
    owner_epoch: i64,
    key: Option<&[u8]>,
) -> Option<ChangelogRecord> {
    let key = key?;
    Some(ChangelogRecord {
        partition,
        owner_epoch,
        table: partition::changelog_table(key)?,
        key: key[1..].to_vec(),
        value: None,
        input_offsets: Vec::new(),
        written_at: 0,
    })
}

/// A changelog row as read, with whether it is the last of its batch.
pub(crate) struct Row {
    pub(crate) record: ChangelogRecord,
    pub(crate) ends_batch: bool,
}

/// Accepted changelog rows held until their batch is known whole.
///
/// A batch ends at its row marked [`wire::header::BATCH_END`]; the rows read since the last
/// end are held until the next one and applied with it, in log order. Held rows can span
/// several batches and cross fence markers:
/// - a whole batch whose end row a compaction removed (a later row of the same key superseded
///   it) is held until a later batch's end; a compaction leaves the end of the log's latest
///   batch in place at least;
/// - the torn last batch of an owner, followed by the marker of the owner that claimed next:
///   that owner dropped the torn rows and wrote its own values of their keys with its first
///   batch, so they are applied at that batch's end and superseded by it. If that owner died
///   before its first batch landed, nothing ends them before the next claim's own marker, and
///   that claim drops them too.
///
/// At the claiming task's own marker every held row is of a batch that never reached the
/// changelog whole ([`torn`]).
///
/// [`torn`]: WholeBatches::torn
#[derive(Default)]
pub(crate) struct WholeBatches {
    held: Vec<(i64, ChangelogRecord)>,
}

impl WholeBatches {
    /// Takes an accepted row at `offset`; returns the rows to apply now, in order: every held
    /// row and this one when it ends a batch, else none.
    pub(crate) fn row(&mut self, offset: i64, row: Row) -> Vec<(i64, ChangelogRecord)> {
        self.held.push((offset, row.record));
        if row.ends_batch {
            std::mem::take(&mut self.held)
        } else {
            Vec::new()
        }
    }

    /// The rows still held at the claiming task's own marker: a batch that never reached the
    /// changelog whole. Not to be applied.
    fn torn(self) -> Vec<(i64, ChangelogRecord)> {
        self.held
    }
}

/// Per store key that had a fenced changelog row, whether the latest row read of it was
/// fenced. Only such keys are held (bounded by the fenced rows, not by the state).
#[derive(Default)]
struct LatestFenced(BTreeMap<Vec<u8>, bool>);

impl LatestFenced {
    fn saw(&mut self, record: &ChangelogRecord, fenced: bool) {
        if !fenced && self.0.is_empty() {
            return;
        }
        let key = partition::store_table(record.table).key(&record.key);
        if fenced {
            self.0.insert(key, true);
        } else if let Some(latest) = self.0.get_mut(&key) {
            *latest = false;
        }
    }

    /// The keys whose latest row was fenced, in key order.
    fn keys(&self) -> Vec<Vec<u8>> {
        self.0
            .iter()
            .filter(|(_, fenced)| **fenced)
            .map(|(key, _)| key.clone())
            .collect()
    }
}

fn filter_admit(
    filter: &mut FenceFilter,
    topic: &str,
    partition: i32,
    epoch: i64,
    marker: bool,
) -> Admit {
    let epoch = epoch.to_string();
    let kind: &[u8] = if marker {
        wire::FENCE_KIND.as_bytes()
    } else {
        b"changelog"
    };
    filter.admit(
        topic,
        partition,
        [
            (wire::header::KIND, kind),
            (wire::header::OWNER_EPOCH, epoch.as_bytes()),
        ],
    )
}

fn apply(
    store: &mut RocksStore,
    partition: i32,
    offset: i64,
    record: ChangelogRecord,
) -> Result<()> {
    let table = partition::store_table(record.table);
    let key = table.key(&record.key);
    if table == Table::Meta && record.key.as_slice() == META_OWNER_EPOCH {
        // The claim below writes this task's own epoch; an older owner's is history.
        return Ok(());
    }
    store
        .restore_row(&key, record.value)
        .map_err(|source| Error::Corrupt {
            partition,
            offset,
            detail: source.to_string(),
        })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use airlock_schemas::StateTable;

    use super::*;

    /// A tombstone's record key is the full store key; keys that never go to the changelog
    /// (timers, the outbox, store-local meta rows) or no key at all are not a deletion.
    #[test]
    fn a_tombstone_deletes_the_store_key_its_record_key_names() {
        let deletion = tombstone(3, 7, Some(&Table::Effect.key(b"refund:1"))).unwrap();
        assert_eq!(
            (deletion.partition, deletion.owner_epoch, deletion.table),
            (3, 7, StateTable::Effect)
        );
        assert_eq!(deletion.key, b"refund:1");
        assert_eq!(deletion.value, None);
        assert!(deletion.input_offsets.is_empty());
        assert!(tombstone(3, 7, Some(&Table::Outbox.key(b"1"))).is_none());
        assert!(tombstone(3, 7, Some(&Table::Meta.key(META_CHANGELOG_NEXT))).is_none());
        assert!(tombstone(3, 7, Some(&[])).is_none());
        assert!(tombstone(3, 7, None).is_none());
    }

    fn row(n: u8, ends_batch: bool) -> Row {
        Row {
            record: ChangelogRecord {
                partition: 0,
                owner_epoch: 1,
                table: StateTable::Effect,
                key: vec![n],
                value: Some(vec![n]),
                input_offsets: Vec::new(),
                written_at: 0,
            },
            ends_batch,
        }
    }

    #[test]
    fn broker_trouble_and_a_rival_claimer_are_transient_a_damaged_changelog_is_not() {
        use rdkafka::error::KafkaError;
        use rdkafka::types::RDKafkaErrorCode;
        let kafka = |source| Error::Kafka {
            partition: 0,
            source,
        };
        assert!(
            kafka(KafkaError::MetadataFetch(
                RDKafkaErrorCode::BrokerTransportFailure
            ))
            .is_transient()
        );
        assert!(!kafka(KafkaError::MetadataFetch(RDKafkaErrorCode::Fatal)).is_transient());
        assert!(
            !kafka(KafkaError::MetadataFetch(
                RDKafkaErrorCode::TopicAuthorizationFailed
            ))
            .is_transient()
        );
        let stalled = Error::Stalled {
            partition: 0,
            at: 1,
            until: 2,
            stalled: Duration::from_secs(60),
        };
        assert!(stalled.is_transient());
        let contended = Error::Contended {
            partition: 0,
            ours: 2,
            theirs: 3,
        };
        assert!(contended.is_transient());
        let corrupt = Error::Corrupt {
            partition: 0,
            offset: 7,
            detail: "no value".to_owned(),
        };
        assert!(!corrupt.is_transient());
    }

    fn keys(rows: &[(i64, ChangelogRecord)]) -> Vec<u8> {
        rows.iter().map(|(_, r)| r.key[0]).collect()
    }

    /// Three batches of 3, 4 and 2 rows, read up to every record boundary: whole batches are
    /// applied, the rest is the torn batch, never applied.
    #[test]
    fn only_whole_batches_are_applied_wherever_the_changelog_is_cut() {
        let sizes = [3u8, 4, 2];
        let total: u8 = sizes.iter().sum();
        for cut in 0..=total {
            let mut batches = WholeBatches::default();
            let mut applied = Vec::new();
            let (mut n, mut whole) = (0u8, 0u8);
            for size in sizes {
                for i in 0..size {
                    if n == cut {
                        break;
                    }
                    applied.extend(batches.row(i64::from(n), row(n, i + 1 == size)));
                    n += 1;
                    if i + 1 == size {
                        whole = n;
                    }
                }
            }
            let torn = batches.torn();
            assert_eq!(keys(&applied), (0..whole).collect::<Vec<_>>(), "cut {cut}");
            assert_eq!(keys(&torn), (whole..cut).collect::<Vec<_>>(), "cut {cut}");
        }
    }

    /// Rows held across another owner's marker (a torn batch, or a whole one whose end row a
    /// compaction removed) are applied with the next batch that ends, before its rows; with
    /// none before the claim's own marker (that owner died before its first batch landed),
    /// they are torn.
    #[test]
    fn rows_held_across_a_marker_wait_for_the_next_batch_end() {
        let mut batches = WholeBatches::default();
        assert!(batches.row(0, row(0, false)).is_empty());
        assert!(batches.row(1, row(1, false)).is_empty());
        // (another owner's marker here: nothing is released)
        assert!(batches.row(3, row(3, false)).is_empty());
        assert_eq!(keys(&batches.row(4, row(4, true))), [0, 1, 3, 4]);

        let mut batches = WholeBatches::default();
        assert!(batches.row(0, row(0, false)).is_empty());
        // (the marker of an owner that died before writing, then this claim's own)
        assert_eq!(keys(&batches.torn()), [0]);
    }
}
