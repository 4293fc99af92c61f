//! `airlock runs show RUN`: every call of an agent run over every partition, with its state,
//! and the run's lease fence and dispatch count per partition, read from the changelog as
//! `airlock effects list` reads it (no processor needs to answer; each partition as of its last
//! whole batch).
//!
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
//! The control id is derived from the run, the fence and the operator; the command always
//! publishes (an earlier answer to the same command proves nothing once a newer owner may have
//! raised the fence since), and the same fence again is recorded again. A fence below the one
//! a partition has recorded is refused there STALE_FENCE (the caller is the stale owner), and a
//! partition that does not answer within `--timeout-seconds` is reported: the command then
//! exits non-zero naming those partitions, after trying every other one. Partitions are asked
//! one after the other.

use std::collections::BTreeMap;
use std::io::Write;

use airlock_schemas::{Control, ControlKind, Reason};
use anyhow::Context;

use super::ask::{self, Request};
use super::effects::{detail, read_changelogs};
use super::replay::{PartitionArgs, ReadArgs};
use crate::capability::PersonAct;
use crate::core::record::{EffectRecord, RunRecord};
use crate::runtime::config::Config;
use crate::runtime::logging::utc_from_millis;
use crate::runtime::topics::Names;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub command: Sub,
}

#[derive(Debug, clap::Subcommand)]
pub enum Sub {
    /// Every call of a run over every partition (its operation key, tool, state, attempts),
    /// what is still open, and the run's lease fence and dispatches per partition.
    Show(ShowArgs),
    /// Raise a run's lease fence on every partition and wait until each has recorded it.
    Fence(FenceArgs),
}

#[derive(Debug, clap::Args)]
pub struct ShowArgs {
    /// The agent run.
    pub run_id: String,
    #[command(flatten)]
    pub partitions: PartitionArgs,
    #[command(flatten)]
    pub read: ReadArgs,
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
    // The fence holds only on the partitions where it was recorded: all by default.
    #[command(flatten)]
    pub partitions: PartitionArgs,
    #[command(flatten)]
    pub common: ask::Common,
}

pub fn run(args: &Args, out: &mut impl Write) -> anyhow::Result<()> {
    match &args.command {
        Sub::Show(show) => run_show(show, out),
        Sub::Fence(fence) => run_fence(fence, out),
    }
}

/// A run's calls and per-partition records, as the changelog holds them.
#[derive(Debug, Default)]
struct RunView {
    /// (partition, effect), oldest first.
    calls: Vec<(i32, EffectRecord)>,
    /// The run's record on each partition that has one.
    records: BTreeMap<i32, RunRecord>,
}

impl RunView {
    fn open(&self) -> impl Iterator<Item = &(i32, EffectRecord)> {
        self.calls.iter().filter(|(_, e)| !e.is_terminal())
    }

    fn by_state(&self) -> BTreeMap<&'static str, usize> {
        let mut by = BTreeMap::new();
        for (_, e) in &self.calls {
            *by.entry(e.effect_state().as_str()).or_default() += 1;
        }
        by
    }
}

fn run_show(args: &ShowArgs, out: &mut impl Write) -> anyhow::Result<()> {
    let config = Config::load(args.read.config.as_deref()).context("loading the configuration")?;
    let selected = args.partitions.select(config.topics.partitions)?;
    let mut view = RunView::default();
    let skipped = read_changelogs(&config, &args.read, &selected, "runs", |p, read| {
        let (effects, mut runs) = read.into_state();
        view.calls.extend(
            effects
                .into_values()
                .filter(|e| e.run_id == args.run_id)
                .map(|e| (p, e)),
        );
        if let Some(run) = runs.remove(&args.run_id) {
            view.records.insert(p, run);
        }
    })?;
    skipped.ensure_complete()?;
    view.calls.sort_by(|(_, a), (_, b)| {
        (a.created_at, &a.operation_key).cmp(&(b.created_at, &b.operation_key))
    });
    if args.read.json {
        serde_json::to_writer_pretty(&mut *out, &json(&args.run_id, &view))?;
        writeln!(out)?;
    } else {
        text(
            &args.run_id,
            &view,
            selected.len(),
            &skipped.describe(),
            out,
        )?;
    }
    Ok(())
}

fn text(
    run_id: &str,
    view: &RunView,
    partitions: usize,
    skipped: &str,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let with_calls: std::collections::BTreeSet<i32> = view.calls.iter().map(|(p, _)| *p).collect();
    writeln!(
        out,
        "run {run_id}: {} calls on {} of {partitions} partitions (each as of its last whole \
         batch){skipped}",
        view.calls.len(),
        with_calls.len(),
    )?;
    let fences: Vec<String> = view
        .records
        .iter()
        .map(|(p, r)| format!("{p}={}", r.highest_fence))
        .collect();
    let dispatches: Vec<String> = view
        .records
        .iter()
        .map(|(p, r)| format!("{p}={}", r.dispatches))
        .collect();
    writeln!(
        out,
        "lease fence by partition: {}",
        if fences.is_empty() {
            "none recorded".to_owned()
        } else {
            fences.join(" ")
        }
    )?;
    writeln!(
        out,
        "dispatches by partition: {} (total {})",
        if dispatches.is_empty() {
            "none".to_owned()
        } else {
            dispatches.join(" ")
        },
        view.records
            .values()
            .map(|r| u64::from(r.dispatches))
            .sum::<u64>()
    )?;
    let states: Vec<String> = view
        .by_state()
        .iter()
        .map(|(s, n)| format!("{s} {n}"))
        .collect();
    writeln!(out, "by state: {}", states.join(", "))?;
    let open: Vec<&str> = view.open().map(|(_, e)| e.operation_key.as_str()).collect();
    if open.is_empty() {
        writeln!(out, "open: none (every call settled)")?;
    } else {
        writeln!(out, "open: {} ({})", open.len(), open.join(", "))?;
    }
    for (p, e) in &view.calls {
        writeln!(
            out,
            "{}  {}  tool={} proposal={} fence={} epoch={} attempts={}{} partition={p} since={}",
            e.operation_key,
            e.effect_state().as_str(),
            e.tool,
            e.proposal_id,
            e.lease_fence,
            e.epoch,
            e.attempts,
            detail(&e.state),
            utc_from_millis(u128::try_from(e.updated_at).unwrap_or(0)),
        )?;
    }
    Ok(())
}

fn json(run_id: &str, view: &RunView) -> serde_json::Value {
    serde_json::json!({
        "run_id": run_id,
        "calls": view.calls.iter().map(|(p, e)| serde_json::json!({
            "operation_key": e.operation_key,
            "state": e.effect_state().as_str(),
            "open": !e.is_terminal(),
            "tenant_id": e.tenant_id,
            "tool": e.tool,
            "proposal_id": e.proposal_id,
            "lease_fence": e.lease_fence,
            "epoch": e.epoch,
            "attempts": e.attempts,
            "partition": p,
            "created_at": e.created_at,
            "updated_at": e.updated_at,
            "detail": detail(&e.state).trim(),
        })).collect::<Vec<_>>(),
        "by_state": view.by_state(),
        "open": view.open().count(),
        "partitions": view.records.iter().map(|(p, r)| serde_json::json!({
            "partition": p,
            "lease_fence": r.highest_fence,
            "dispatches": r.dispatches,
            "updated_at": r.updated_at,
        })).collect::<Vec<_>>(),
    })
}

fn run_fence(args: &FenceArgs, out: &mut impl Write) -> anyhow::Result<()> {
    anyhow::ensure!(args.fence >= 0, "--fence must not be negative");
    let config = args.common.load()?;
    let asker = ask::Asker::new(&config)?;
    let names = Names::new(&config.topics.prefix);
    let selected = args.partitions.select(config.topics.partitions)?;
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
    let payload = asker.encode(&control)?;
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
            // Always published, never answered by an earlier reply: since an earlier run of
            // this command a newer owner may have raised the fence, and only a fresh answer
            // says whether this one still holds (the same fence again is recorded again).
            done: |_| false,
            answer_ids: vec![format!("c/{control_id}")],
        };
        match ask::publish_and_await(&asker, "runs", &request, args.common.timeout(), || Ok(())) {
            Ok(answer) => {
                let d = &answer.decision;
                writeln!(
                    out,
                    "partition {partition}: {} {}: {}",
                    d.verdict.as_str(),
                    d.reason.as_str(),
                    d.detail
                )?;
                if d.reason != Reason::FenceAdvanced {
                    refused.push(format!("{partition} ({})", d.reason.as_str()));
                }
            }
            // One partition without an answer (no owner running, the broker away) does not
            // keep the others from being fenced; the command fails at the end naming it.
            Err(e) => {
                writeln!(out, "partition {partition}: no answer: {e:#}")?;
                refused.push(format!("{partition} (no answer)"));
            }
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
