//! The connector worker runtime (DESIGN.md section 7): consume a connector's dispatch topic,
//! check each command, record `ATTEMPT_STARTED` durably before calling, call at most once,
//! report what the call proves, answer reconcile commands. It never retries: the processor is
//! the single retry owner.
//!
//! # Layout
//! - [`config`]: the worker's TOML file and its environment overrides.
//! - [`check`]: decoding, placement and capability checks; refusals become dead letters.
//! - [`started`]: the attempts started per key (fence 2), rebuilt from the outcomes.
//! - [`report`]: outcome and dead-letter records with deterministic identities.
//! - [`handle`]: the two phases of a command: checked and started, then called and reported.
//! - [`run`](mod@run): the consumer group member, rebalances, the loop, graceful shutdown.
//! - [`telemetry`]: its metrics, liveness and readiness.

pub mod check;
pub mod config;
pub mod handle;
pub mod report;
pub mod run;
pub mod started;
pub mod telemetry;

pub use config::Config;
pub use run::{Summary, run, run_with};
