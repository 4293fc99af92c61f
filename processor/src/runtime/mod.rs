//! The Kafka shell around the core (DESIGN.md sections 1, 5 and 6).
//!
//! # Layout
//! - [`config`]: the one configuration file and its environment overrides.
//! - [`compat`]: how brokers other than Apache Kafka differ, and the workarounds, in one place.
//! - [`partitioner`]: the partition of an operation key (Kafka's murmur2).
//! - [`topics`]: topic names, `airlock topics create`, the co-partitioning check.
//! - [`wire`]: output headers, owner-epoch fence markers, the outbox row format, the
//!   consumer-side fence filter.
//! - [`clock`]: a partition's record-time clock, by which its timers fire.
//! - [`partition`]: one partition's task: decode or dead-letter, decide, seal a batch.
//! - [`intake`]: records read ahead per partition, so that a batch holds every partition.
//! - [`decide`]: one batch's decisions and seals, partitions side by side on threads.
//! - [`produce`]: the idempotent producer and phase-ordered, acknowledged sends.
//! - [`flight`]: sealed batches on their way to the broker, pipelined behind the next ones.
//! - [`restore`]: gaining a partition: resend, restore, claim the owner epoch, fence.
//! - [`run`]: `airlock run`, the consumer-group batch loop.
//! - [`scan`]: read-only, fence-filtered reads of an output partition (replay, audit).
//! - [`telemetry`]: its metrics, health and readiness.
//! - [`logging`]: the stderr logger.
//! - [`signals`]: graceful stop on SIGTERM/SIGINT.

pub mod clock;
pub mod compat;
pub mod config;
pub mod decide;
pub mod effects;
pub mod flight;
pub mod intake;
pub mod logging;
pub mod partition;
pub mod partitioner;
pub mod produce;
pub mod rejoin;
pub mod restore;
pub mod run;
pub mod scan;
pub mod schema_registry;
pub mod signals;
pub mod telemetry;
pub mod topics;
pub mod wire;
