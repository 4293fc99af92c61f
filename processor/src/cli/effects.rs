//! `airlock effects list`: the effects in a given state over every partition, for an operator
//! looking for what waits on a person (UNKNOWN after reconciliation, OPERATOR_REQUIRED,
//! AWAITING_APPROVAL).
//!
//! Served from the changelog, not by the running instances: each partition's changelog is
//! read as a restore reads it (`runtime::effects`), so the answer is the state as of each
//! partition's last whole batch, whichever instances own the partitions and whether or not
//! any runs. Cost: one read of the compacted changelog (its live keys, not the history).

use std::io::Write;
use std::time::Duration;

use airlock_schemas::{Codec, EffectState};
use anyhow::Context;

use super::replay::{PartitionArgs, Progress, ReadArgs, ends, reader};
use crate::core::record::{EffectRecord, State};
use crate::runtime::config::Config;
use crate::runtime::effects::ChangelogEffects;
use crate::runtime::logging::utc_from_millis;
use crate::runtime::scan::{Scanned, Scanner};
use crate::runtime::topics::Names;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub command: Sub,
}

#[derive(Debug, clap::Subcommand)]
pub enum Sub {
    /// List the effects in the given states (all states when none is given), oldest change
    /// first.
    List(ListArgs),
}

#[derive(Debug, clap::Args)]
pub struct ListArgs {
    /// Only effects in this state (repeatable): AWAITING_APPROVAL, DISPATCHED, IN_FLIGHT,
    /// UNKNOWN, OPERATOR_REQUIRED, FAILED, COMMITTED, EXPIRED, DENIED, CANCELLED.
    #[arg(long = "state", value_parser = parse_state)]
    pub states: Vec<EffectState>,
    /// Only effects of this tenant.
    #[arg(long)]
    pub tenant: Option<String>,
    /// Only effects of this tool.
    #[arg(long)]
    pub tool: Option<String>,
    /// Only the calls of this agent run (its keys may be on any partition).
    #[arg(long)]
    pub run: Option<String>,
    /// Only effects whose record last changed at least this many seconds ago (by the time
    /// of the inputs that changed it).
    #[arg(long, value_name = "SECONDS")]
    pub older_than: Option<u64>,
    #[command(flatten)]
    pub partitions: PartitionArgs,
    #[command(flatten)]
    pub read: ReadArgs,
}

fn parse_state(s: &str) -> Result<EffectState, String> {
    let wanted = s.to_ascii_uppercase().replace('-', "_");
    EffectState::ALL
        .iter()
        .find(|st| st.as_str() == wanted)
        .copied()
        .ok_or_else(|| {
            let all: Vec<&str> = EffectState::ALL.iter().map(EffectState::as_str).collect();
            format!("unknown state {s:?}; one of {}", all.join(", "))
        })
}

pub fn run(args: &Args, out: &mut impl Write) -> anyhow::Result<()> {
    match &args.command {
        Sub::List(list) => run_list(list, out),
    }
}

/// One listed effect: where it lives and its record.
struct Listed {
    partition: i32,
    effect: EffectRecord,
}

/// Rows of the changelog a read skipped.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Skipped {
    /// Rows that did not decode (an older binary than the processors that wrote them?).
    pub undecodable: u64,
    /// Rows behind an owner's fence: a zombie's writes.
    pub fenced: u64,
}

impl Skipped {
    /// `; N rows ... skipped` for a summary line, empty when nothing was.
    pub(super) fn describe(self) -> String {
        let mut s = String::new();
        if self.fenced > 0 {
            s.push_str(&format!(
                "; {} rows behind an owner's fence skipped",
                self.fenced
            ));
        }
        if self.undecodable > 0 {
            s.push_str(&format!(
                "; {} rows that do not decode skipped",
                self.undecodable
            ));
        }
        s
    }

    /// An error when a row did not decode: the answer would be incomplete.
    pub(super) fn ensure_complete(self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.undecodable == 0,
            "{} changelog rows did not decode: this binary may be older than the processors \
             that wrote them",
            self.undecodable
        );
        Ok(())
    }
}

/// Reads the changelog of each of `selected` partitions as a restore reads it
/// ([`ChangelogEffects`]) and hands each partition's effects and runs to `each`, one partition
/// at a time; progress on standard error under `what`.
pub(super) fn read_changelogs(
    config: &Config,
    read: &ReadArgs,
    selected: &[i32],
    what: &'static str,
    mut each: impl FnMut(i32, ChangelogEffects),
) -> anyhow::Result<Skipped> {
    let names = Names::new(&config.topics.prefix);
    let consumer = reader(config, what)?;
    let scanner = Scanner {
        consumer: &consumer,
        stall_timeout: Duration::from_secs(read.stall_timeout_seconds),
    };
    let changelog = names.changelog();
    let wanted: Vec<(String, i32)> = selected.iter().map(|&p| (changelog.clone(), p)).collect();
    // Nothing but processors writes the changelog. On Kafka its end is the high watermark read
    // now (a read-only end, so no barrier is written); on a broker whose watermark lags
    // (`compat`) a barrier marks the end, unless --read-only.
    let read_only = read.read_only || config.kafka.compatibility.high_watermark_is_end();
    let bounds = ends(&scanner, config, read_only, &wanted, None)?;
    let progress = Progress::new(what, bounds.iter().map(|b| b.high - b.low).sum());
    // Every changelog record the broker took, whatever the write limit says now.
    let codec = Codec::new().with_max_payload_bytes(usize::MAX);
    let mut skipped = Skipped::default();
    for (&p, b) in selected.iter().zip(bounds) {
        let mut effects = ChangelogEffects::default();
        let mut cursor = progress.partition(&b);
        scanner.scan(&changelog, p, b, |s: Scanned<'_>| -> anyhow::Result<()> {
            cursor.advance(s.offset);
            effects.read(p, &codec, &s);
            Ok(())
        })?;
        drop(cursor);
        skipped.undecodable += effects.undecodable;
        skipped.fenced += effects.fenced;
        each(p, effects);
    }
    progress.finish();
    Ok(skipped)
}

fn run_list(args: &ListArgs, out: &mut impl Write) -> anyhow::Result<()> {
    let config = Config::load(args.read.config.as_deref()).context("loading the configuration")?;
    let selected = args.partitions.select(config.topics.partitions)?;
    let now = crate::runtime::clock::wall_ms();
    let cutoff = args
        .older_than
        .map(|s| now.saturating_sub(i64::try_from(s.saturating_mul(1000)).unwrap_or(i64::MAX)));
    let (mut listed, mut read) = (Vec::new(), 0usize);
    let skipped = read_changelogs(&config, &args.read, &selected, "effects", |p, effects| {
        let effects = effects.into_effects();
        read += effects.len();
        listed.extend(
            effects
                .into_values()
                .filter(|e| {
                    (args.states.is_empty() || args.states.contains(&e.effect_state()))
                        && args.tenant.as_ref().is_none_or(|t| *t == e.tenant_id)
                        && args.tool.as_ref().is_none_or(|t| *t == e.tool)
                        && args.run.as_ref().is_none_or(|r| *r == e.run_id)
                        && cutoff.is_none_or(|c| e.updated_at <= c)
                })
                .map(|effect| Listed {
                    partition: p,
                    effect,
                }),
        );
    })?;
    listed.sort_by(|a, b| {
        (a.effect.updated_at, &a.effect.operation_key)
            .cmp(&(b.effect.updated_at, &b.effect.operation_key))
    });
    if args.read.json {
        let rows: Vec<serde_json::Value> = listed.iter().map(|l| json(l, now)).collect();
        serde_json::to_writer_pretty(&mut *out, &rows)?;
        writeln!(out)?;
    } else {
        for l in &listed {
            writeln!(out, "{}", line(l, now))?;
        }
        writeln!(
            out,
            "{} of {read} effects listed, from the changelog of {} partitions (each as of its \
             last whole batch){}",
            listed.len(),
            selected.len(),
            skipped.describe(),
        )?;
    }
    skipped.ensure_complete()
}

/// What the state says beyond its name: reconciliation rounds, the retry, the approvals.
pub(super) fn detail(state: &State) -> String {
    match state {
        State::AwaitingApproval { approvals, .. } => {
            format!(" approvals={}", approvals.len())
        }
        State::Unknown { rounds, .. } | State::OperatorRequired { rounds, .. } => {
            format!(" rounds={rounds}")
        }
        State::Failed {
            retry_at: Some(_), ..
        } => " retry=scheduled".to_owned(),
        _ => String::new(),
    }
}

fn line(l: &Listed, now: i64) -> String {
    let e = &l.effect;
    format!(
        "{}  {}  tenant={} tool={} epoch={} attempts={}{} partition={} since={} ({}s ago)",
        e.operation_key,
        e.effect_state().as_str(),
        e.tenant_id,
        e.tool,
        e.epoch,
        e.attempts,
        detail(&e.state),
        l.partition,
        utc_from_millis(u128::try_from(e.updated_at).unwrap_or(0)),
        now.saturating_sub(e.updated_at) / 1000,
    )
}

fn json(l: &Listed, now: i64) -> serde_json::Value {
    let e = &l.effect;
    serde_json::json!({
        "operation_key": e.operation_key,
        "state": e.effect_state().as_str(),
        "tenant_id": e.tenant_id,
        "tool": e.tool,
        "tool_version": e.tool_version,
        "run_id": e.run_id,
        "proposal_id": e.proposal_id,
        "epoch": e.epoch,
        "attempts": e.attempts,
        "partition": l.partition,
        "updated_at": e.updated_at,
        "age_seconds": now.saturating_sub(e.updated_at) / 1000,
        "detail": detail(&e.state).trim(),
    })
}
