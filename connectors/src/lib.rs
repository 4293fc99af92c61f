//! Airlock's connector side (DESIGN.md section 7): the downstream systems connectors call and,
//! later, the worker runtime that calls them.
//!
//! # Layout
//! - [`ledger`]: the reference ledger service (`airlock-ledger`): debits, refunds, idempotency
//!   keys, lookups that prove absence, and injectable faults, for the demo and the tests.
//! - [`logging`]: the stderr logger of the crate's binaries.
//! - [`worker`]: the connector worker runtime (`airlock-connector`): dispatch commands checked,
//!   started durably, executed at most once, reported; reconcile commands answered.
//! - [`http`]: the generic HTTP connector the worker calls through: request templates,
//!   classification, a client without retries.

pub mod http;
pub mod ledger;
pub mod logging;
pub mod worker;
