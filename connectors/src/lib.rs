//! Airlock's connector side (DESIGN.md section 7): the worker runtime, the HTTP connector and the
//! reference downstream system they call.
//!
//! # Layout
//! - [`ledger`]: the reference ledger service (`airlock-ledger`): debits, refunds, idempotency
//!   keys, lookups that prove absence, and injectable faults, for the demo and the tests.
//! - [`worker`]: the connector worker runtime (`airlock-connector`): dispatch commands checked,
//!   started durably, executed at most once, reported; reconcile commands answered.
//! - [`http`]: the generic HTTP connector the worker calls through: request templates,
//!   classification, a client without retries.

pub mod http;
pub mod ledger;
pub mod worker;
