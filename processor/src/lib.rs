//! Airlock's processor: the pure decision [`core`], the state [`store`]s it runs over, and the
//! `airlock` command line ([`cli`]).
//!
//! # Layout
//! - [`core`]: the deterministic state machine (no I/O, no clock, no randomness).
//! - [`store`]: typed state over RocksDB or memory, timers, projection hash, atomic batches.
//! - [`runtime`]: the Kafka shell: configuration, topics.
//! - [`capability`]: the Ed25519 signature on dispatch commands, and the check workers run.
//! - [`receipt`]: signed, hash-chained receipts of final outcomes and refusals, and their
//!   verifier.
//! - [`task`]: one partition's decision loop (decide, stamp, stage, fire timers, commit).
//! - [`telemetry`]: Prometheus metrics and the telemetry HTTP endpoint of every Airlock process.
//! - [`sample`]: the reference configuration and realistic inputs (tests, simulation, bench, demo).
//! - [`cli`]: subcommands of the `airlock` binary.

pub mod audit;
pub mod capability;
pub mod cli;
pub mod core;
pub mod receipt;
pub mod runtime;
pub mod sample;
pub mod store;
pub mod task;
pub mod telemetry;
