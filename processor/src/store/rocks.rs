//! The RocksDB [`Backend`]: one database per task directory, one `WriteBatch` per commit.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rocksdb::{BlockBasedOptions, DB, Options, ReadOptions, WriteBatch, WriteOptions};

use super::{Backend, Error, Result, Visitor};

/// Settings of the RocksDB backend.
#[derive(Clone, Debug)]
pub struct RocksOptions {
    /// fsync the write-ahead log on every commit: survives power loss, not only process crashes.
    /// The outbox is produced only after a commit, so this is what "durable" means.
    pub sync: bool,
    /// MiB per second that the store's flushes and compactions may write (RocksDB's rate
    /// limiter); 0 = unlimited. A flush then runs longer at a lower rate. A limit below what a
    /// sustained backlog makes them write stalls the commits (processor/BENCHMARKS.md).
    pub background_write_mib_per_s: u32,
    /// Let RocksDB tune the limit to the recent demand, within `[limit / 20, limit]`: it starts
    /// at half the limit and moves ≈ 5% a second, so a limit near the demand still stalls.
    pub background_write_auto_tune: bool,
}

impl Default for RocksOptions {
    fn default() -> Self {
        RocksOptions {
            sync: true,
            background_write_mib_per_s: 0,
            background_write_auto_tune: false,
        }
    }
}

/// How often the rate limiter hands out its tokens: short, so that a flush is spread evenly
/// instead of writing a 100 ms quantum at once.
const RATE_LIMIT_REFILL_US: i64 = 10_000;
/// RocksDB's default: a low-priority (compaction) request is served first one time in ten.
const RATE_LIMIT_FAIRNESS: i32 = 10;

/// RocksDB's write stall state of one store ([`RocksBackend::write_pressure`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WritePressure {
    /// Writes are stopped until a flush or compaction catches up.
    pub stopped: bool,
    /// Bytes per second RocksDB slows writes to; 0 when it does not.
    pub delayed_write_rate: u64,
    /// SST files in level 0 (by default writes slow at 20 and stop at 36).
    pub level0_files: u64,
}

pub struct RocksBackend {
    /// Shared with the [`WalSync`]s of deferred commits; the database closes with the last.
    db: Arc<DB>,
    path: PathBuf,
    /// `sync` as configured (`RocksOptions::sync`).
    write_options: WriteOptions,
    /// Without fsync, for a commit whose fsync is deferred to a [`WalSync`].
    unsynced: WriteOptions,
    sync: bool,
    /// Point reads' options, made once: `DB::get` would create and free a C `ReadOptions`
    /// object on every read.
    read_options: ReadOptions,
}

impl std::fmt::Debug for RocksBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RocksBackend")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl RocksBackend {
    pub fn open(path: &Path, options: &RocksOptions) -> Result<Self> {
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.set_compression_type(rocksdb::DBCompressionType::Lz4);
        opts.increase_parallelism(2);
        // Most reads of fresh keys miss: bloom filters answer them without touching data
        // blocks of the SST files. No memtable bloom: keeping it up to date on every insert cost
        // more than it saved on lookups (airlock-bench-core fresh ≈ 32.6k → 35.3k decisions/s
        // without it, read latency unchanged).
        let mut table = BlockBasedOptions::default();
        table.set_bloom_filter(10.0, false);
        table.set_whole_key_filtering(true);
        opts.set_block_based_table_factory(&table);
        if options.background_write_mib_per_s > 0 {
            let bytes = i64::from(options.background_write_mib_per_s) << 20;
            if options.background_write_auto_tune {
                opts.set_auto_tuned_ratelimiter(bytes, RATE_LIMIT_REFILL_US, RATE_LIMIT_FAIRNESS);
            } else {
                opts.set_ratelimiter(bytes, RATE_LIMIT_REFILL_US, RATE_LIMIT_FAIRNESS);
            }
        }
        let db = DB::open(&opts, path).map_err(|source| Error::Rocks {
            path: path.display().to_string(),
            source,
        })?;
        let mut write_options = WriteOptions::default();
        write_options.set_sync(options.sync);
        let mut unsynced = WriteOptions::default();
        unsynced.set_sync(false);
        Ok(RocksBackend {
            db: Arc::new(db),
            path: path.to_owned(),
            write_options,
            unsynced,
            sync: options.sync,
            read_options: ReadOptions::default(),
        })
    }

    /// Whether RocksDB is holding the store's writes back right now, from its properties: read
    /// from memory, cheap enough for every telemetry interval.
    pub fn write_pressure(&self) -> Result<WritePressure> {
        let int = |name: &rocksdb::properties::PropName| -> Result<u64> {
            self.db
                .property_int_value(name)
                .map_err(|e| self.err(e))?
                .ok_or_else(|| Error::Property {
                    path: self.path.display().to_string(),
                    name: name.to_string(),
                })
        };
        Ok(WritePressure {
            stopped: int(rocksdb::properties::IS_WRITE_STOPPED)? != 0,
            delayed_write_rate: int(rocksdb::properties::ACTUAL_DELAYED_WRITE_RATE)?,
            level0_files: int(&rocksdb::properties::num_files_at_level(0))?,
        })
    }

    fn err(&self, source: rocksdb::Error) -> Error {
        Error::Rocks {
            path: self.path.display().to_string(),
            source,
        }
    }
}

impl Backend for RocksBackend {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.db
            .get_opt(key, &self.read_options)
            .map_err(|e| self.err(e))
    }

    fn visit(&self, start: &[u8], end: &[u8], limit: usize, f: &mut Visitor<'_>) -> Result<usize> {
        let mut read = ReadOptions::default();
        read.set_iterate_upper_bound(end.to_vec());
        // The raw iterator lends each entry: no copy of keys or values.
        let mut it = self.db.raw_iterator_opt(read);
        it.seek(start);
        let mut n = 0;
        while n < limit
            && let (Some(k), Some(v)) = (it.key(), it.value())
        {
            f(k, v)?;
            n += 1;
            it.next();
        }
        it.status().map_err(|e| self.err(e))?;
        Ok(n)
    }

    fn write_batch(&mut self, batch: Vec<(Vec<u8>, Option<Vec<u8>>)>) -> Result<()> {
        self.db
            .write_opt(write_batch_of(batch), &self.write_options)
            .map_err(|e| self.err(e))
    }

    /// With `sync` on, writes without the fsync and returns the [`WalSync`] that does it: the
    /// caller fsyncs off its own thread and lets nothing depend on the batch before that. With
    /// `sync` off there is nothing to defer.
    fn write_batch_deferred(
        &mut self,
        batch: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    ) -> Result<Option<WalSync>> {
        if !self.sync {
            self.write_batch(batch)?;
            return Ok(None);
        }
        self.db
            .write_opt(write_batch_of(batch), &self.unsynced)
            .map_err(|e| self.err(e))?;
        Ok(Some(WalSync {
            db: self.db.clone(),
            path: self.path.clone(),
        }))
    }
}

/// One RocksDB `WriteBatch` of puts (`Some`) and deletes (`None`).
fn write_batch_of(batch: Vec<(Vec<u8>, Option<Vec<u8>>)>) -> WriteBatch {
    // Sized up front: a batch carries its outbox row (hundreds of KB), and growing the
    // batch's buffer by doubling copied it several times over into freshly faulted pages.
    // 12 bytes of header; per entry a tag and two varint32 lengths of at most 5 bytes.
    let bytes = 12
        + batch
            .iter()
            .map(|(k, v)| 11 + k.len() + v.as_ref().map_or(0, Vec::len))
            .sum::<usize>();
    let mut wb = WriteBatch::with_capacity_bytes(bytes);
    for (k, v) in batch {
        match v {
            Some(v) => wb.put(k, v),
            None => wb.delete(k),
        }
    }
    wb
}

/// The fsync a deferred commit still owes (`Backend::write_batch_deferred`): makes every write
/// of the store so far durable, from any thread. RocksDB's write-ahead log is one sequence, so
/// syncing it covers the deferred batch and everything before it; a crash before the sync
/// loses at most a suffix of the batches (recovery keeps a prefix), never one batch without
/// the batches it read.
///
/// Holds the database open: drop it before the store's directory is opened again.
#[derive(Clone)]
pub struct WalSync {
    db: Arc<DB>,
    path: PathBuf,
}

impl std::fmt::Debug for WalSync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WalSync")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl WalSync {
    /// fsyncs the write-ahead log (`DB::flush_wal(true)`, RocksDB's `SyncWAL`: every log file
    /// not yet synced, the current one included).
    pub fn sync(&self) -> Result<()> {
        self.db.flush_wal(true).map_err(|source| Error::Rocks {
            path: self.path.display().to_string(),
            source,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn options(sync: bool) -> RocksOptions {
        RocksOptions {
            sync,
            ..RocksOptions::default()
        }
    }

    /// The rate limit reaches RocksDB: a flush of ≈ 3 MiB of incompressible rows at 1 MiB/s
    /// takes at least two seconds (a lower bound only: the limit holds a flush back, it never
    /// makes one faster).
    #[test]
    fn a_background_write_limit_holds_a_flush_back() {
        let dir = tempfile::tempdir().unwrap();
        let limited = RocksOptions {
            sync: false,
            background_write_mib_per_s: 1,
            background_write_auto_tune: false,
        };
        let mut store = RocksBackend::open(dir.path(), &limited).unwrap();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let rows = (0..48u32)
            .map(|i| {
                let value = (0..64 * 1024 / 8)
                    .flat_map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x.to_le_bytes()
                    })
                    .collect();
                (i.to_be_bytes().to_vec(), Some(value))
            })
            .collect();
        store.write_batch(rows).unwrap();
        let started = std::time::Instant::now();
        store.db.flush().unwrap();
        let took = started.elapsed();
        assert!(
            took >= std::time::Duration::from_secs(2),
            "a 3 MiB flush at 1 MiB/s took only {took:?}"
        );
        assert_eq!(
            store.get(&7u32.to_be_bytes()).unwrap().unwrap().len(),
            64 * 1024
        );
    }

    /// A fresh store reports no pressure and no level-0 file; a flush makes one.
    #[test]
    fn write_pressure_reads_rocksdb_state() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = RocksBackend::open(dir.path(), &options(false)).unwrap();
        let calm = WritePressure {
            stopped: false,
            delayed_write_rate: 0,
            level0_files: 0,
        };
        assert_eq!(store.write_pressure().unwrap(), calm);
        store
            .write_batch(vec![(b"k".to_vec(), Some(b"v".to_vec()))])
            .unwrap();
        store.db.flush().unwrap();
        assert_eq!(
            store.write_pressure().unwrap(),
            WritePressure {
                level0_files: 1,
                ..calm
            }
        );
    }

    /// A deferred write is read back at once; only a syncing store leaves an fsync owing, and
    /// the data is there after that sync and a reopen.
    #[test]
    fn a_deferred_write_owes_its_fsync_only_where_the_store_syncs() {
        for sync in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let mut store = RocksBackend::open(dir.path(), &options(sync)).unwrap();
            let owed = store
                .write_batch_deferred(vec![(b"k".to_vec(), Some(b"v".to_vec()))])
                .unwrap();
            assert_eq!(owed.is_some(), sync, "sync {sync}");
            assert_eq!(store.get(b"k").unwrap(), Some(b"v".to_vec()));
            if let Some(owed) = owed {
                owed.sync().unwrap();
            }
            drop(store);
            let store = RocksBackend::open(dir.path(), &options(sync)).unwrap();
            assert_eq!(store.get(b"k").unwrap(), Some(b"v".to_vec()));
        }
    }
}
