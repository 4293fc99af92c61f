//! One processor task's logic without Kafka: decide each input with the core, stamp the outputs
//! with the task's partition and owner epoch, seal the receipts of final outcomes and refusals
//! onto the partition's chain, stage the state writes, the journal sequence and the chain head
//! in the store, fire due timers through the same path, and commit a whole batch at once.
//!
//! The Kafka runtime drives a `Task` per partition; tests, the simulation and the benchmark
//! drive it directly.

use std::sync::Arc;

use airlock_schemas::{Codec, JournalEvent, JournalKind, Receipt};

use crate::core::{self, Core, Effects, Input, TaskContext};
use crate::receipt;
use crate::store::{self, Store, WalSync, keys::Table};

/// Errors of a task: the core or the store failed. Input never causes one.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("partition {partition}: {source}")]
    Core {
        partition: i32,
        #[source]
        source: core::Error,
    },
    #[error("partition {partition}: replaying the journal: {source}")]
    Replay {
        partition: i32,
        #[source]
        source: core::reducer::Error,
    },
    #[error("partition {partition}: {source}")]
    Store {
        partition: i32,
        #[source]
        source: store::Error,
    },
    #[error("partition {partition}: {source}")]
    Receipt {
        partition: i32,
        #[source]
        source: receipt::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

const META_SEQUENCE: &[u8] = b"journal_sequence";

/// A partition's decision loop over a store.
#[derive(Debug)]
pub struct Task<S> {
    core: Arc<Core>,
    store: S,
    ctx: TaskContext,
    /// Sequence number of the next journal event of this partition (persisted with the batch).
    next_sequence: i64,
    /// Where the partition's receipt chain stands (persisted with the batch).
    receipt_head: receipt::Head,
    /// Encodes receipts to hash them.
    codec: Codec,
}

impl<S: Store> Task<S> {
    pub fn new(core: Arc<Core>, store: S, ctx: TaskContext) -> Result<Self> {
        let next_sequence = load_sequence(&store, ctx.partition)?;
        let receipt_head = load_receipt_head(&store, ctx.partition)?;
        Ok(Task {
            core,
            store,
            ctx,
            next_sequence,
            receipt_head,
            codec: Codec::new(),
        })
    }

    /// Rebuilds a task's state from its partition's journal alone (DESIGN.md section 8: state is
    /// a projection of the journal): applies every event's writes in order into `store`,
    /// continues the journal sequence after the last event, and commits.
    pub fn rebuild_from_journal<'a>(
        core: Arc<Core>,
        mut store: S,
        ctx: TaskContext,
        journal: impl IntoIterator<Item = &'a JournalEvent>,
    ) -> Result<Self> {
        let partition = ctx.partition;
        let mut next_sequence = 0;
        for event in journal {
            let writes = core::reducer::writes_of(event)
                .map_err(|source| Error::Replay { partition, source })?;
            store
                .apply(&writes)
                .map_err(|source| Error::Store { partition, source })?;
            next_sequence = event.sequence + 1;
        }
        store.stage_raw(
            Table::Meta,
            META_SEQUENCE,
            Some(next_sequence.to_be_bytes().to_vec()),
        );
        store
            .commit()
            .map_err(|source| Error::Store { partition, source })?;
        Task::new(core, store, ctx)
    }

    pub fn core(&self) -> &Core {
        &self.core
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    pub fn store_mut(&mut self) -> &mut S {
        &mut self.store
    }

    pub fn context(&self) -> &TaskContext {
        &self.ctx
    }

    pub fn into_store(self) -> S {
        self.store
    }

    /// Decides one input at `now` and stages its writes; nothing is durable until [`commit`].
    ///
    /// [`commit`]: Task::commit
    pub fn handle(&mut self, input: &Input, now: i64) -> Result<Effects> {
        let partition = self.ctx.partition;
        let mut effects = self
            .core
            .handle(&self.store, input, now)
            .map_err(|source| Error::Core { partition, source })?;
        self.stage(&mut effects)?;
        Ok(effects)
    }

    /// Fires every timer due by `now`, earliest first, each at its own due time, at most
    /// `limit` of them (the rest fire on the next call: bounded work per batch).
    pub fn fire_timers(&mut self, now: i64, limit: usize) -> Result<Vec<Effects>> {
        Ok(self.fire_timers_counted(now, limit)?.1)
    }

    /// [`fire_timers`](Self::fire_timers), also returning how many timers it took from the
    /// index, superseded ones (which do nothing) included: the count a per-batch bound spends.
    pub fn fire_timers_counted(&mut self, now: i64, limit: usize) -> Result<(usize, Vec<Effects>)> {
        let partition = self.ctx.partition;
        let due = self
            .store
            .due_timers(now, limit)
            .map_err(|source| Error::Store { partition, source })?;
        let taken = due.len();
        let mut out = Vec::with_capacity(due.len());
        for timer in due {
            let at = timer.due_at;
            let effects = self.handle(&Input::Timer(timer), at)?;
            if !effects.is_empty() {
                out.push(effects);
            }
        }
        Ok((taken, out))
    }

    /// A CHECKPOINT journal event carrying the projection hash after everything staged so far.
    pub fn checkpoint(&mut self, now: i64) -> Result<JournalEvent> {
        let mut event = JournalEvent {
            partition: self.ctx.partition,
            sequence: 0,
            owner_epoch: self.ctx.owner_epoch,
            task: self.ctx.task.clone(),
            reducer_version: core::record::REDUCER_VERSION,
            kind: JournalKind::Checkpoint,
            cause_id: format!("checkpoint:{now}"),
            operation_key: None,
            run_id: None,
            proposal_id: None,
            principal_id: None,
            tenant_id: None,
            tool: None,
            policy_bundle_hash: Some(self.core.policy().bundle_hash().to_owned()),
            lease_fence: None,
            epoch: None,
            verdict: None,
            reason: None,
            state: None,
            arguments_hash: None,
            evidence: None,
            record_json: None,
            projection_hash: Some(self.store.projection_hash()),
            recorded_at: now,
        };
        let mut effects = Effects {
            journal: vec![event.clone()],
            ..Effects::default()
        };
        self.stage(&mut effects)?;
        event.sequence = effects.journal[0].sequence;
        Ok(event)
    }

    /// Makes the batch durable: state, timers, projection hash and journal sequence together.
    pub fn commit(&mut self) -> Result<()> {
        let partition = self.ctx.partition;
        self.store
            .commit()
            .map_err(|source| Error::Store { partition, source })
    }

    /// [`commit`](Self::commit) with the fsync left to the returned [`WalSync`] where the
    /// store defers it: nothing may leave that depends on the batch before it is synced.
    pub fn commit_deferred(&mut self) -> Result<Option<WalSync>> {
        let partition = self.ctx.partition;
        self.store
            .commit_deferred()
            .map_err(|source| Error::Store { partition, source })
    }

    /// Forgets the uncommitted batch, as a crash would.
    /// Reloads what the task keeps in memory from its store (journal sequence, receipt chain
    /// head), after the store's staged rows were rolled back.
    pub fn reload(&mut self) -> Result<()> {
        self.next_sequence = load_sequence(&self.store, self.ctx.partition)?;
        self.receipt_head = load_receipt_head(&self.store, self.ctx.partition)?;
        Ok(())
    }

    pub fn discard(&mut self) -> Result<()> {
        self.store.discard();
        self.next_sequence = load_sequence(&self.store, self.ctx.partition)?;
        self.receipt_head = load_receipt_head(&self.store, self.ctx.partition)?;
        Ok(())
    }

    /// Seals `drafts` (see `receipt::drafts`) onto the partition's chain and stages the new
    /// head; nothing without a receipt key.
    pub fn seal_receipts(&mut self, drafts: Vec<Receipt>) -> Result<Vec<Receipt>> {
        let partition = self.ctx.partition;
        let Some(key) = self.core.receipt_key() else {
            return Ok(Vec::new());
        };
        if drafts.is_empty() {
            return Ok(drafts);
        }
        let mut sealed = drafts;
        for r in &mut sealed {
            receipt::seal(&self.codec, key, partition, &mut self.receipt_head, r)
                .map_err(|source| Error::Receipt { partition, source })?;
        }
        self.store.stage_raw(
            Table::Meta,
            receipt::META_CHAIN,
            Some(self.receipt_head.encode()),
        );
        Ok(sealed)
    }

    fn stage(&mut self, effects: &mut Effects) -> Result<()> {
        let partition = self.ctx.partition;
        let before = self.next_sequence;
        effects.stamp(&self.ctx, &mut self.next_sequence);
        effects.receipts = self.seal_receipts(receipt::drafts(effects))?;
        self.store
            .apply_encoded(&effects.writes, &effects.rows)
            .map_err(|source| Error::Store { partition, source })?;
        if self.next_sequence != before {
            self.store.stage_raw(
                Table::Meta,
                META_SEQUENCE,
                Some(self.next_sequence.to_be_bytes().to_vec()),
            );
        }
        Ok(())
    }
}

fn load_receipt_head(store: &impl Store, partition: i32) -> Result<receipt::Head> {
    match store
        .get_raw(Table::Meta, receipt::META_CHAIN)
        .map_err(|source| Error::Store { partition, source })?
    {
        Some(bytes) => {
            receipt::Head::decode(&bytes).map_err(|source| Error::Receipt { partition, source })
        }
        None => Ok(receipt::Head::default()),
    }
}

fn load_sequence(store: &impl Store, partition: i32) -> Result<i64> {
    let corrupt = |detail: String| Error::Store {
        partition,
        source: store::Error::Corrupt {
            table: Table::Meta,
            key: "journal_sequence".to_owned(),
            detail,
        },
    };
    match store
        .get_raw(Table::Meta, META_SEQUENCE)
        .map_err(|source| Error::Store { partition, source })?
    {
        Some(bytes) => {
            Ok(i64::from_be_bytes(bytes.as_slice().try_into().map_err(
                |_| corrupt(format!("{} bytes, expected 8", bytes.len())),
            )?))
        }
        None => Ok(0),
    }
}
