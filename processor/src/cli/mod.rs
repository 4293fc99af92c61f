//! Subcommands of the `airlock` binary. Each is a function from parsed arguments to an exit
//! status, so tests can drive them without a process.
//!
//! # Layout
//! - [`hash`]: `airlock hash` prints canonical arguments, their hash and the idempotency key.
//! - [`check`]: `airlock check` loads a tool registry and a policy bundle and reports them.
//! - [`topics`]: `airlock topics create` creates the co-partitioned topics.
//! - [`run`]: `airlock run`, one processor instance.
//! - [`demo`]: `airlock demo`, the whole loop through the seed failures, with a report.
//! - [`keygen`]: `airlock keygen`, a capability key pair (processor signs, connectors verify).
//! - [`propose`]: `airlock propose`, one tool proposal published as an agent would.
//! - [`approve`]: `airlock approve`, a human's approval (or rejection) of a pending proposal.
//! - [`settle`]: `airlock settle`, an operator's settlement of an effect nothing could prove.
//! - [`ask`]: what `approve` and `settle` share: publish one input, await its answer.
//! - [`replay`]: `airlock replay`, the journal rebuilt and verified; `--policy` for what-if.
//! - [`audit`]: `airlock audit`, the history of one operation key or run.
//! - [`receipts`]: `airlock receipts verify`, the check of the signed receipt chains.

pub mod approve;
pub mod ask;
pub mod audit;
pub mod check;
pub mod demo;
pub mod effects;
pub mod hash;
pub mod keygen;
pub mod propose;
pub mod receipts;
pub mod replay;
pub mod run;
pub mod runs;
pub mod settle;
pub mod topics;

use clap::{Parser, Subcommand};

/// Airlock: the execution boundary for AI agents' side effects.
#[derive(Debug, Parser)]
#[command(name = "airlock", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the canonical form and SHA-256 of a JSON document, so other languages can check
    /// theirs (reads standard input when no file is given).
    Hash(hash::Args),
    /// Load a tool registry and a policy bundle, report what they hold, exit non-zero on error.
    Check(check::Args),
    /// Manage Airlock's Kafka topics.
    Topics(topics::Args),
    /// Run a processor instance (consumer group member) until SIGTERM/SIGINT.
    Run(run::Args),
    /// Start the processor, the reference ledger and a connector worker against a broker, drive
    /// a demo agent fleet through the seed failures, report each scenario (non-zero exit when
    /// one ends otherwise than it should).
    Demo(demo::Args),
    /// Write a new Ed25519 key pair for dispatch-command capabilities: `<out>.key` for the
    /// processor (capability.signing_key_file), `<out>.pub` for connector workers.
    Keygen(keygen::Args),
    /// Publish one tool proposal as an agent would and print the processor's answer.
    Propose(propose::Args),
    /// Approve (or --reject) a proposal waiting for approval, bound to the arguments hash the
    /// approver reviewed; waits for the processor's answer.
    Approve(approve::Args),
    /// Settle an effect by hand (OPERATOR_REQUIRED or UNKNOWN) with the operator's evidence;
    /// waits for the processor's answer.
    Settle(settle::Args),
    /// Rebuild the projection from the journal, verify every checkpoint and the invariants,
    /// name every finding with its offsets; exits non-zero when the journal does not verify.
    /// With --policy, screen the recorded proposals under a candidate policy bundle instead.
    Replay(replay::Args),
    /// Show the history of one operation key or run from the journal.
    Audit(audit::Args),
    /// Signed receipts of final outcomes and refusals, chained per partition.
    Receipts(receipts::Args),
    /// The effects in a given state over every partition (`effects list --state UNKNOWN`),
    /// read from the changelog.
    Effects(effects::Args),
    /// Agent runs: `runs show RUN` lists a run's calls over every partition (from the
    /// changelog); `runs fence RUN --fence N` raises its lease fence on every partition before
    /// a new owner proceeds.
    Runs(runs::Args),
}

impl Cli {
    pub fn run(self) -> anyhow::Result<()> {
        match self.command {
            Command::Hash(args) => hash::run(&args, &mut std::io::stdout().lock()),
            Command::Check(args) => check::run(&args, &mut std::io::stdout().lock()),
            Command::Topics(args) => topics::run(&args, &mut std::io::stdout().lock()),
            Command::Run(args) => run::run(&args, &mut std::io::stdout().lock()),
            Command::Demo(args) => demo::run(&args, &mut std::io::stdout().lock()),
            Command::Keygen(args) => keygen::run(&args, &mut std::io::stdout().lock()),
            Command::Propose(args) => propose::run(&args, &mut std::io::stdout().lock()),
            Command::Approve(args) => approve::run(&args, &mut std::io::stdout().lock()),
            Command::Settle(args) => settle::run(&args, &mut std::io::stdout().lock()),
            Command::Replay(args) => replay::run(&args, &mut std::io::stdout().lock()),
            Command::Audit(args) => audit::run(&args, &mut std::io::stdout().lock()),
            Command::Receipts(args) => receipts::run(&args, &mut std::io::stdout().lock()),
            Command::Effects(args) => effects::run(&args, &mut std::io::stdout().lock()),
            Command::Runs(args) => runs::run(&args, &mut std::io::stdout().lock()),
        }
    }
}
