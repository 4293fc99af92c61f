//! Audit (DESIGN.md section 8): the journal replayed and checked, the history of one key or
//! run, and a candidate policy evaluated against recorded proposals. Pure logic over decoded
//! records; the `airlock replay` and `airlock audit` subcommands read the topics.
//!
//! # Layout
//! - [`replay`]: one partition's journal rebuilt into a projection, checkpoints verified,
//!   copies, orphans and anomalies told apart.
//! - [`invariants`]: the rules every journal must keep, checked event by event.
//! - [`whatif`]: recorded proposals screened under two policy bundles.

pub mod invariants;
pub mod replay;
pub mod whatif;
