//! The pure decision core: a deterministic state machine from (state, input, now) to outputs.
//!
//! Never imports tokio, rdkafka or rocksdb; never reads the clock; never draws random numbers.
//! Time comes in as `now` (the input record's timestamp), jitter from a hash of the key.
//!
//! # Layout
//! - [`canonical`]: canonical JSON arguments, their SHA-256, the downstream idempotency key.
//! - [`registry`]: the tool registry (schema, binding, contract, retry, retention).
//! - [`policy`]: Cedar authorization with auto / approval tiers, indexed per tool.
//! - [`record`]: the per-key state machine's data, run fences, timers, state writes.
//! - [`input`], [`output`]: what the core reacts to and what it asks the shell to do.
//! - [`machine`]: [`Core::handle`], the decisions themselves.
//! - [`reducer`]: state rebuilt from journal events alone, and the projection hash.

pub mod canonical;
pub mod input;
pub mod machine;
pub mod output;
pub mod policy;
pub mod record;
pub mod reducer;
pub mod registry;
#[cfg(test)]
mod vectors;

pub use input::Input;
pub use machine::{Config, Core, KeyScope};
pub use output::{Effects, TaskContext};
pub use record::{EffectRecord, ProposalSeen, RunRecord, State, TimerFired, TimerTarget, Write};

/// Errors of the core: the state could not be read, or a record could not be encoded. A refusal
/// is never an error; it is a decision.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("state store: {0}")]
    State(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("encoding {what}: {source}")]
    Encode {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What the core may read. The shell's store implements it; reads see the writes already
/// applied in the current batch.
pub trait StateView {
    fn effect(&self, key: &str) -> Result<Option<EffectRecord>>;
    fn proposal(&self, id: &str) -> Result<Option<ProposalSeen>>;
    fn run(&self, run_id: &str) -> Result<Option<RunRecord>>;
}
