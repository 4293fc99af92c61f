//! The reference ledger: a small but real HTTP service that moves money on accounts, at most
//! once per idempotency key, and misbehaves on demand, so the connectors and the demo meet the
//! failures Airlock exists for (a lost response after a commit, an error that does not mean "it
//! did not happen", a crash between commit and answer). See `connectors/README.md` for the API.
//!
//! # Layout
//! - [`model`]: wire types, validation, the canonical body behind "same key, same body".
//! - [`money`]: the business rules (tenant, currency, funds), without I/O.
//! - [`store`]: SQLite persistence; one transaction per money request.
//! - [`faults`]: fault kinds, rule syntax, the book of armed rules.
//! - [`api`]: routes and handlers; outcomes and faults into responses.
//! - [`server`]: binding, the accept loop that can drop a connection unanswered, shutdown.
//! - [`config`]: the `airlock-ledger` command line and the accounts seed file.

pub mod api;
pub mod config;
pub mod faults;
pub mod model;
pub mod money;
pub mod server;
pub mod store;

pub use config::{Args, Config};
pub use server::Server;
