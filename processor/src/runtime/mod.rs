//! The Kafka shell around the core (DESIGN.md sections 1, 5 and 6).
//!
//! # Layout
//! - [`config`]: the one configuration file and its environment overrides.
//! - [`partitioner`]: the partition of an operation key (Kafka's murmur2).
//! - [`topics`]: topic names, `airlock topics create`, the co-partitioning check.
//!
//! The consumer-group runtime (`airlock run`) builds on these; see the runtime issue.

pub mod config;
pub mod partitioner;
pub mod topics;
