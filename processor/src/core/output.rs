//! What the core asks the shell to do. Nothing here has happened yet: the shell makes the
//! writes durable together with the outbox, then produces the records.

use airlock_schemas::{Decision, DispatchCommand, JournalEvent, Receipt, ReconcileCommand};

use super::record::Write;

/// Where a task stands; stamped onto every output so consumers can fence zombies (DESIGN.md
/// section 5, fence 1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskContext {
    pub partition: i32,
    /// Claimed each time the task takes the partition; strictly increasing.
    pub owner_epoch: i64,
    /// Human-readable task identity for the journal (`instance/partition`).
    pub task: String,
}

/// The result of handling one input.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Effects {
    /// Commands to connector workers (`airlock.dispatch.<connector>`), one per key and epoch.
    pub dispatches: Vec<DispatchCommand>,
    /// Reconciliation queries for UNKNOWN attempts.
    pub reconciles: Vec<ReconcileCommand>,
    /// Replies to agents, approvers and operators (`airlock.decisions`).
    pub decisions: Vec<Decision>,
    /// Every transition (`airlock.journal`); each event carries its own state writes.
    pub journal: Vec<JournalEvent>,
    /// The state changes, in order: exactly the concatenation of the journal events' writes.
    pub writes: Vec<Write>,
    /// Each write's record as JSON (`None` for a delete), one per write: made once, carried by
    /// the journal event and staged by the store as they are (see [`Write::record_json`]).
    pub rows: Vec<Option<String>>,
    /// Signed receipts of the final outcomes and refusals (`airlock.receipts`): sealed by the
    /// task from the decisions above when a receipt key is configured, never by the core.
    pub receipts: Vec<Receipt>,
}

impl Effects {
    /// True when the input changed nothing and produced nothing.
    pub fn is_empty(&self) -> bool {
        self.dispatches.is_empty()
            && self.reconciles.is_empty()
            && self.decisions.is_empty()
            && self.journal.is_empty()
            && self.writes.is_empty()
            && self.receipts.is_empty()
    }

    /// Stamps the task's partition and owner epoch on every output and numbers the journal
    /// events from `next_sequence`, which is advanced.
    pub fn stamp(&mut self, ctx: &TaskContext, next_sequence: &mut i64) {
        for d in &mut self.dispatches {
            d.owner_partition = ctx.partition;
            d.owner_epoch = ctx.owner_epoch;
        }
        for r in &mut self.reconciles {
            r.owner_partition = ctx.partition;
            r.owner_epoch = ctx.owner_epoch;
        }
        for d in &mut self.decisions {
            d.owner_partition = ctx.partition;
            d.owner_epoch = ctx.owner_epoch;
        }
        for j in &mut self.journal {
            j.partition = ctx.partition;
            j.owner_epoch = ctx.owner_epoch;
            j.task.clone_from(&ctx.task);
            j.sequence = *next_sequence;
            *next_sequence += 1;
        }
    }
}
