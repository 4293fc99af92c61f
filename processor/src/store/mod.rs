//! The state store: typed tables over a byte-level [`Backend`], with the timer index and the
//! projection hash maintained on every write, and a staging overlay so that a whole batch of
//! inputs lands in one atomic write (DESIGN.md section 6).
//!
//! # Layout
//! - [`keys`]: table prefixes and order-preserving key encodings.
//! - [`codec`]: the value format (a version byte, the row's timer, then the record).
//! - [`digests`]: a projection kept as row digests only (an auditor's replay).
//! - [`memory`]: an in-memory backend (tests, simulation).
//! - [`rocks`]: the RocksDB backend (production).
//!
//! Both backends run through the same typed layer, [`StateStore`], and the same tests.

pub mod codec;
pub mod digests;
pub mod keys;
pub mod memory;
pub mod rocks;

use std::cell::RefCell;
use std::collections::BTreeMap;

use rustc_hash::FxHashMap;
use sha2::{Digest, Sha256};

use crate::core::{
    self, EffectRecord, ProposalSeen, RunRecord, StateView, TimerFired, TimerTarget, Write,
};
use keys::Table;

pub use memory::MemoryBackend;
pub use rocks::{RocksBackend, RocksOptions, WalSync, WritePressure};

/// Errors of the store. Each names what it was doing.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("rocksdb at {path}: {source}")]
    Rocks {
        path: String,
        #[source]
        source: rocksdb::Error,
    },
    #[error("rocksdb at {path}: property {name} is not reported")]
    Property { path: String, name: String },
    #[error("value under table {table:?} key {key:?} is corrupt: {detail}")]
    Corrupt {
        table: Table,
        key: String,
        detail: String,
    },
    #[error("value under table {table:?} has format version {found}; this build reads {expected}")]
    Version {
        table: Table,
        found: u8,
        expected: u8,
    },
}

impl Error {
    /// Whether the stored bytes themselves are damaged (RocksDB reports corruption, or a row
    /// does not decode), as opposed to a directory in use, a full disk or a newer format. Such a
    /// store cannot be repaired in place; its content can be restored from the changelog.
    pub fn is_unreadable(&self) -> bool {
        match self {
            Error::Rocks { source, .. } => source.kind() == rocksdb::ErrorKind::Corruption,
            Error::Corrupt { .. } => true,
            Error::Property { .. } | Error::Version { .. } => false,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// One atomic write: puts (`Some`) and deletes (`None`), in key order.
type Rows = Vec<(Vec<u8>, Option<Vec<u8>>)>;

/// Called by [`Backend::visit`] with each entry's key and value, borrowed.
pub type Visitor<'a> = dyn FnMut(&[u8], &[u8]) -> Result<()> + 'a;

/// Byte-level storage: committed reads and one atomic write of a whole batch.
pub trait Backend {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>>;
    /// Calls `f` with up to `limit` committed entries with `start <= key < end`, in key order,
    /// borrowed from the backend (nothing is copied); returns how many it visited.
    fn visit(&self, start: &[u8], end: &[u8], limit: usize, f: &mut Visitor<'_>) -> Result<usize>;
    /// Up to `limit` committed entries with `start <= key < end`, in key order, copied out.
    fn scan(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut out = Vec::new();
        self.visit(start, end, limit, &mut |k, v| {
            out.push((k.to_vec(), v.to_vec()));
            Ok(())
        })?;
        Ok(out)
    }
    /// Applies every put (`Some`) and delete (`None`) atomically and durably.
    fn write_batch(&mut self, batch: Vec<(Vec<u8>, Option<Vec<u8>>)>) -> Result<()>;
    /// Applies the batch atomically; durably too, unless it returns the [`WalSync`] that makes
    /// it durable. Later reads see the batch either way.
    fn write_batch_deferred(
        &mut self,
        batch: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    ) -> Result<Option<WalSync>> {
        self.write_batch(batch).map(|()| None)
    }
}

/// What the runtime needs from a store, whatever the backend.
pub trait Store: StateView {
    /// Stages state writes; later reads in the batch see them.
    fn apply(&mut self, writes: &[Write]) -> Result<()> {
        self.apply_encoded(writes, &[])
    }
    /// [`apply`](Store::apply) with records' JSON already made (`rows`, one per write in order,
    /// as in `Effects::rows`): those rows are staged from their bytes, not serialized again; a
    /// write past the end of `rows` is serialized here.
    fn apply_encoded(&mut self, writes: &[Write], rows: &[Option<String>]) -> Result<()>;
    /// Stages a raw entry outside the projected tables (offsets, outbox, meta).
    fn stage_raw(&mut self, table: Table, id: &[u8], value: Option<Vec<u8>>);
    fn get_raw(&self, table: Table, id: &[u8]) -> Result<Option<Vec<u8>>>;
    /// Makes everything staged durable in one atomic write.
    fn commit(&mut self) -> Result<()>;
    /// [`commit`](Store::commit), except that the fsync may be left to the returned
    /// [`WalSync`]: nothing that depends on the batch being durable (its outbox, above all)
    /// may leave before that sync returned.
    fn commit_deferred(&mut self) -> Result<Option<WalSync>> {
        self.commit().map(|()| None)
    }
    /// Drops everything staged since the last commit (a crash, in tests).
    fn discard(&mut self);
    /// Timers due at or before `now`, earliest first.
    fn due_timers(&self, now: i64, limit: usize) -> Result<Vec<TimerFired>>;
    /// The order-independent hash of every projected record, hex.
    fn projection_hash(&self) -> String;
}

const META_PROJECTION: &[u8] = b"projection_hash";

/// The staged rows and projection hash of a [`StateStore`] at one moment
/// ([`StateStore::save_point`]).
#[derive(Debug)]
pub struct SavePoint {
    staged: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    projection: [u8; 32],
}

/// Typed tables, timers and projection hash over any [`Backend`].
#[derive(Debug)]
pub struct StateStore<B> {
    backend: B,
    /// Writes of the current batch, not yet committed: `None` deletes.
    staged: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    /// Committed values read during the current batch: the core reads a key and the
    /// write that follows reads it again (for the projection hash and the old timer).
    /// Bounded by the batch; dropped at every commit and discard. Keys are our own table
    /// keys, not an adversary's choice of hash inputs in a long-lived map, so the fast Fx hash
    /// serves (SipHash was ≈ 4% of a decision's samples in `perf`).
    read_cache: RefCell<FxHashMap<Vec<u8>, Option<Vec<u8>>>>,
    /// XOR of SHA-256(table, key, value) over the effect, proposal and run tables.
    projection: [u8; 32],
    committed_projection: [u8; 32],
}

pub type MemoryStore = StateStore<MemoryBackend>;

pub type RocksStore = StateStore<RocksBackend>;

impl<B: Backend> StateStore<B> {
    pub fn open(backend: B) -> Result<Self> {
        let projection = match backend.get(&Table::Meta.key(META_PROJECTION))? {
            Some(bytes) => bytes.as_slice().try_into().map_err(|_| Error::Corrupt {
                table: Table::Meta,
                key: "projection_hash".to_owned(),
                detail: format!("{} bytes, expected 32", bytes.len()),
            })?,
            None => [0; 32],
        };
        Ok(StateStore {
            backend,
            staged: BTreeMap::new(),
            read_cache: RefCell::new(FxHashMap::default()),
            projection,
            committed_projection: projection,
        })
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// What is staged now, to come back to with [`StateStore::roll_back_to`]: a batch decided
    /// again must keep the rows staged before it began (outbox acknowledgements, changelog
    /// rewrites), which a [`Store::discard`] would drop too.
    pub fn save_point(&self) -> SavePoint {
        SavePoint {
            staged: self.staged.clone(),
            projection: self.projection,
        }
    }

    /// Drops what was staged since `point` was taken, and only that.
    pub fn roll_back_to(&mut self, point: &SavePoint) {
        self.staged.clone_from(&point.staged);
        self.projection = point.projection;
        self.read_cache.get_mut().clear();
    }

    /// Everything staged since the last commit, in key order (`None` deletes): the runtime
    /// turns the projected and offset rows into changelog records before committing.
    pub fn staged(&self) -> impl Iterator<Item = (&[u8], Option<&[u8]>)> {
        self.staged
            .iter()
            .map(|(k, v)| (k.as_slice(), v.as_deref()))
    }

    /// Stages one row exactly as another store held it (restore from the changelog), keeping
    /// the timer index and the projection hash in step. `key` is a full store key.
    pub fn restore_row(&mut self, key: &[u8], value: Option<Vec<u8>>) -> Result<()> {
        let corrupt = |detail: String| Error::Corrupt {
            table: Table::Meta,
            key: String::from_utf8_lossy(key).into_owned(),
            detail,
        };
        let table = key
            .first()
            .and_then(|b| Table::from_prefix(*b))
            .ok_or_else(|| corrupt("unknown table prefix".to_owned()))?;
        match table {
            Table::Effect | Table::Proposal | Table::Run => {
                let id = std::str::from_utf8(&key[1..])
                    .map_err(|_| corrupt("row id is not UTF-8".to_owned()))?;
                let old = self.replaced(table, id, key)?;
                let new_timer = match &value {
                    Some(v) => row_timer(table, id, v)?,
                    None => None,
                };
                self.put_projected(key.to_vec(), old, value, new_timer);
                Ok(())
            }
            Table::Offset | Table::Meta => {
                self.staged.insert(key.to_vec(), value);
                Ok(())
            }
            Table::Timer | Table::Outbox => Err(corrupt(format!(
                "table {table:?} is local and never restored"
            ))),
        }
    }

    /// Calls `f` with the value under `key` as this batch sees it (staged, else committed),
    /// borrowed: a read decodes from the staged or cached bytes without copying them.
    fn with_read<R>(&self, key: &[u8], f: impl FnOnce(Option<&[u8]>) -> Result<R>) -> Result<R> {
        if let Some(staged) = self.staged.get(key) {
            return f(staged.as_deref());
        }
        if let Some(cached) = self.read_cache.borrow().get(key) {
            return f(cached.as_deref());
        }
        let value = self.backend.get(key)?;
        let out = f(value.as_deref());
        self.read_cache.borrow_mut().insert(key.to_vec(), value);
        out
    }

    fn read(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.with_read(key, |value| Ok(value.map(<[u8]>::to_vec)))
    }

    fn typed<T: serde::de::DeserializeOwned>(&self, table: Table, id: &str) -> Result<Option<T>> {
        self.with_read(&table.key(id.as_bytes()), |bytes| {
            bytes
                .map(|bytes| codec::decode(table, id, bytes))
                .transpose()
        })
    }

    /// The row a write to `key` (table `table`, id `id`) replaces, if any, as the write needs
    /// it: its share of the projection hash and its timer, taken from the borrowed bytes (the
    /// timer from the header: the record is not decoded).
    fn replaced(&self, table: Table, id: &str, key: &[u8]) -> Result<Option<Replaced>> {
        self.with_read(key, |old| {
            old.map(|old| {
                Ok(Replaced {
                    digest: row_digest(key, &[old]),
                    timer: row_timer(table, id, old)?,
                })
            })
            .transpose()
        })
    }

    /// Stages one projected row replacing `old` (see [`replaced`](Self::replaced)), keeping
    /// its timer and the projection hash in step.
    fn put_projected(
        &mut self,
        key: Vec<u8>,
        old: Option<Replaced>,
        new: Option<Vec<u8>>,
        new_timer: Option<TimerFired>,
    ) {
        let mut old_timer = None;
        if let Some(old) = old {
            xor(&mut self.projection, &old.digest);
            old_timer = old.timer;
        }
        if let Some(new) = &new {
            xor(&mut self.projection, &row_digest(&key, &[new]));
        }
        if old_timer != new_timer {
            if let Some(t) = old_timer {
                self.staged.insert(keys::timer_key(&t), None);
            }
            if let Some(t) = new_timer {
                self.staged.insert(keys::timer_key(&t), Some(Vec::new()));
            }
        }
        self.staged.insert(key, new);
    }
}

impl<B: Backend> StateStore<B> {
    /// Everything staged, with the projection hash when it changed, as one write; the read
    /// cache is dropped with it. `None` when nothing was staged.
    fn take_batch(&mut self) -> Option<Rows> {
        if self.staged.is_empty() {
            return None;
        }
        if self.projection != self.committed_projection {
            self.staged.insert(
                Table::Meta.key(META_PROJECTION),
                Some(self.projection.to_vec()),
            );
        }
        self.read_cache.get_mut().clear();
        Some(std::mem::take(&mut self.staged).into_iter().collect())
    }

    /// Stages one write's row, given as its record's JSON (`None` to delete; see
    /// [`Write::record_json`]), framed with its timer, moving the timer and keeping the
    /// projection hash in step. Both `apply` paths come here, so a row has one byte format.
    fn stage_write(&mut self, write: &Write, json: Option<&str>) -> Result<()> {
        let new_timer = write.timer();
        let value = json.map(|json| codec::frame(json, new_timer.as_ref().map(|t| t.due_at)));
        let (table, id) = match write {
            Write::Effect { key, .. } => (Table::Effect, key),
            Write::Proposal { id, .. } => (Table::Proposal, id),
            Write::Run { run_id, .. } => (Table::Run, run_id),
        };
        let key = table.key(id.as_bytes());
        let old = self.replaced(table, id, &key)?;
        self.put_projected(key, old, value, new_timer);
        Ok(())
    }
}

impl<B: Backend> StateView for StateStore<B> {
    fn effect(&self, key: &str) -> core::Result<Option<EffectRecord>> {
        self.typed(Table::Effect, key).map_err(into_core)
    }

    fn proposal(&self, id: &str) -> core::Result<Option<ProposalSeen>> {
        self.typed(Table::Proposal, id).map_err(into_core)
    }

    fn run(&self, run_id: &str) -> core::Result<Option<RunRecord>> {
        self.typed(Table::Run, run_id).map_err(into_core)
    }
}

impl<B: Backend> Store for StateStore<B> {
    fn apply_encoded(&mut self, writes: &[Write], rows: &[Option<String>]) -> Result<()> {
        for (i, write) in writes.iter().enumerate() {
            let made;
            let json = match rows.get(i) {
                Some(row) => {
                    debug_assert_eq!(
                        row.as_deref(),
                        write.record_json().ok().flatten().as_deref(),
                        "a row is its write's record as JSON",
                    );
                    row.as_deref()
                }
                None => {
                    made = write.record_json().expect(
                        "records are plain data with string keys: serializing them cannot fail",
                    );
                    made.as_deref()
                }
            };
            self.stage_write(write, json)?;
        }
        Ok(())
    }

    fn stage_raw(&mut self, table: Table, id: &[u8], value: Option<Vec<u8>>) {
        self.staged.insert(table.key(id), value);
    }

    fn get_raw(&self, table: Table, id: &[u8]) -> Result<Option<Vec<u8>>> {
        self.read(&table.key(id))
    }

    fn commit(&mut self) -> Result<()> {
        let Some(batch) = self.take_batch() else {
            return Ok(());
        };
        self.backend.write_batch(batch)?;
        self.committed_projection = self.projection;
        Ok(())
    }

    fn commit_deferred(&mut self) -> Result<Option<WalSync>> {
        let Some(batch) = self.take_batch() else {
            return Ok(None);
        };
        let sync = self.backend.write_batch_deferred(batch)?;
        self.committed_projection = self.projection;
        Ok(sync)
    }

    fn discard(&mut self) {
        self.staged.clear();
        self.read_cache.get_mut().clear();
        self.projection = self.committed_projection;
    }

    fn due_timers(&self, now: i64, limit: usize) -> Result<Vec<TimerFired>> {
        let (start, _) = Table::Timer.range();
        let end = keys::timer_bound(now);
        // Committed timers, then the overlay's view of the same range merged over them.
        let mut merged: BTreeMap<Vec<u8>, bool> = self
            .backend
            .scan(&start, &end, limit.saturating_add(self.staged.len()))?
            .into_iter()
            .map(|(k, _)| (k, true))
            .collect();
        for (k, v) in self.staged.range(start..end) {
            merged.insert(k.clone(), v.is_some());
        }
        Ok(merged
            .into_iter()
            .filter(|(_, live)| *live)
            .filter_map(|(k, _)| keys::decode_timer_key(&k))
            .take(limit)
            .collect())
    }

    fn projection_hash(&self) -> String {
        hex::encode(self.projection)
    }
}

/// What a staged write replaces: the old row's share of the projection hash and its timer.
struct Replaced {
    digest: [u8; 32],
    timer: Option<TimerFired>,
}

/// The timer stored in a row's header, as the timer it fires.
fn row_timer(table: Table, id: &str, bytes: &[u8]) -> Result<Option<TimerFired>> {
    Ok(codec::timer_of(table, id, bytes)?.map(|due_at| TimerFired {
        due_at,
        target: target_of(table, id),
    }))
}

fn target_of(table: Table, id: &str) -> TimerTarget {
    match table {
        Table::Proposal => TimerTarget::Proposal(id.to_owned()),
        Table::Run => TimerTarget::Run(id.to_owned()),
        _ => TimerTarget::Effect(id.to_owned()),
    }
}

fn into_core(e: Error) -> core::Error {
    core::Error::State(Box::new(e))
}

/// A row's share of the projection hash: SHA-256 of the key's length, the key and the value
/// (given in `parts`, concatenated). Changing it changes every recorded projection hash.
fn row_digest(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update((key.len() as u64).to_be_bytes());
    h.update(key);
    for part in parts {
        h.update(part);
    }
    h.finalize().into()
}

fn xor(acc: &mut [u8; 32], digest: &[u8; 32]) {
    for (a, d) in acc.iter_mut().zip(digest) {
        *a ^= d;
    }
}

/// Rebuilds a projection from writes alone, in memory: what a replay computes.
pub fn projection_of<'a>(writes: impl IntoIterator<Item = &'a Write>) -> Result<String> {
    let mut store = StateStore::open(MemoryBackend::default())?;
    for w in writes {
        store.apply(std::slice::from_ref(w))?;
    }
    Ok(store.projection_hash())
}
