//! `airlock runs fence RUN --fence N --operator ID`: a new owner of an agent run raises the run's
//! lease fence on every partition before it proceeds.
//!
//! A run's calls land on the partitions of their operation keys, and each partition keeps the
//! highest lease fence it has seen for the run: a proposal under a lower fence is refused
//! STALE_FENCE. A proposal under a new fence raises it only on its own partition, so a stale
//! owner's proposal landing on another partition would still be accepted. This command closes
//! that: it publishes one LEASE_FENCE control to every partition of the control topic and waits
//! for each partition's owner to record it. Once it returns, every partition refuses the old
//! fences; an orchestrator taking a run over runs it (or the clients' equivalent) before the
//! run's first new proposal.
//!
//! The control id is derived from the run, the fence and the operator, so running the same
//! command again answers "before" on each partition and publishes nothing there. A fence below
//! the one a partition has recorded is refused there STALE_FENCE (the caller is the stale
//! owner): the command then exits non-zero naming those partitions.

use std::io::Write;

use airlock_schemas::{Control, ControlKind, Reason};

use super::ask::{self, Request};
use crate::capability::PersonAct;
use crate::runtime::topics::Names;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub command: Sub,
}

#[derive(Debug, clap::Subcommand)]
pub enum Sub {
    /// Raise a run's lease fence on every partition and wait until each has recorded it.
    Fence(FenceArgs),
}

#[derive(Debug, clap::Args)]
pub struct FenceArgs {
    /// The agent run.
    pub run_id: String,
    /// The new lease fence: proposals of the run under a lower one are refused STALE_FENCE.
    #[arg(long)]
    pub fence: i64,
    /// The principal raising it (the orchestrator or operator), recorded in the journal.
    #[arg(long, env = "AIRLOCK_OPERATOR")]
    pub operator: String,
    /// The principal's Ed25519 signing key (`airlock keygen`), whose verifying key the policy
    /// entities register for them (`verifying_keys`); without it the record leaves unsigned,
    /// which the processor refuses for anyone with keys registered.
    #[arg(long, env = "AIRLOCK_SIGNING_KEY")]
    pub signing_key: Option<std::path::PathBuf>,
    /// Only these partitions (repeatable; all by default: the fence holds only where it was
    /// recorded).
    #[arg(long = "partition")]
    pub partitions: Vec<i32>,
    #[command(flatten)]
    pub common: ask::Common,
}

pub fn run(args: &Args, out: &mut impl Write) -> anyhow::Result<()> {
    match &args.command {
        Sub::Fence(fence) => run_fence(fence, out),
    }
}

fn run_fence(args: &FenceArgs, out: &mut impl Write) -> anyhow::Result<()> {
    anyhow::ensure!(args.fence >= 0, "--fence must not be negative");
    let config = args.common.load()?;
    let names = Names::new(&config.topics.prefix);
    let selected = super::replay::partitions(&args.partitions, config.topics.partitions)?;
    let control_id = control_id(&args.run_id, args.fence, &args.operator);
    let control = Control {
        control_id: control_id.clone(),
        kind: ControlKind::LeaseFence,
        operation_key: None,
        run_id: Some(args.run_id.clone()),
        lease_fence: Some(args.fence),
        operator_id: args.operator.clone(),
        evidence: None,
        issued_at: crate::runtime::clock::wall_ms(),
    };
    let payload = ask::encode(&config, &control)?;
    let headers = ask::person_signature(
        args.signing_key.as_deref(),
        PersonAct::Control,
        &args.operator,
        &payload,
    )?;
    writeln!(
        out,
        "fencing run {} at {} on {} partitions as {control_id}",
        args.run_id,
        args.fence,
        selected.len()
    )?;
    let mut refused = Vec::new();
    for &partition in &selected {
        let request = Request {
            headers: headers.clone(),
            topic: names.control(),
            operation_key: &args.run_id,
            partition: Some(partition),
            payload: payload.clone(),
            reply_to: &control_id,
            done: |d| d.reason == Reason::FenceAdvanced,
        };
        let answer =
            ask::publish_and_await(&config, "runs", &request, args.common.timeout(), || Ok(()))?;
        let d = &answer.decision;
        writeln!(
            out,
            "partition {partition}: {} {}{}: {}",
            d.verdict.as_str(),
            d.reason.as_str(),
            if answer.earlier { " (before)" } else { "" },
            d.detail
        )?;
        if d.reason != Reason::FenceAdvanced {
            refused.push(format!("{partition} ({})", d.reason.as_str()));
        }
    }
    anyhow::ensure!(
        refused.is_empty(),
        "run {} was not fenced at {} on partitions {}",
        args.run_id,
        args.fence,
        refused.join(", ")
    );
    writeln!(
        out,
        "run {} fenced at {} on every partition asked ({})",
        args.run_id,
        args.fence,
        selected.len()
    )?;
    Ok(())
}

/// The fence's id: the same command gives the same id, so a repeat is answered once per
/// partition.
fn control_id(run_id: &str, fence: i64, operator: &str) -> String {
    ask::content_id("fence", &[run_id, &fence.to_string(), operator])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_fence_has_the_same_id() {
        let a = control_id("run-1", 5, "orchestrator");
        assert_eq!(a, control_id("run-1", 5, "orchestrator"));
        assert_ne!(a, control_id("run-1", 6, "orchestrator"));
        assert_ne!(a, control_id("run-2", 5, "orchestrator"));
    }
}
