//! `airlock audit`: the history of one operation key or one run, in order, from the journal
//! (DESIGN.md section 8): who proposed what under which policy bundle, who approved, which
//! attempts ran, what evidence settled it. Readable by a person, or `--json`.
//!
//! The journal is read as `airlock replay` reads it: fence-filtered, byte-identical copies
//! skipped, and the orphaned tail of an owner that died or was fenced dropped when its
//! successor rewrites those sequences. A key lives on one partition (murmur2 of the key); a
//! run's events are on every partition its keys hash to, so a run reads them all.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;

use airlock_schemas::JournalEvent;
use anyhow::Context;

use super::replay::{Progress, ReadArgs, ends, reader};
use crate::runtime::config::Config;
use crate::runtime::logging::utc_from_millis;
use crate::runtime::partitioner::partition_for;
use crate::runtime::scan::{Bounds, Scanned, Scanner};
use crate::runtime::topics::Names;
use crate::runtime::wire::Admit;

#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("subject").required(true).args(["key", "run"])))]
pub struct Args {
    /// The operation key whose history to show.
    #[arg(long)]
    pub key: Option<String>,
    /// The agent run whose history to show (every key it proposed, every fence it advanced).
    #[arg(long)]
    pub run: Option<String>,
    #[command(flatten)]
    pub read: ReadArgs,
}

/// One partition's matching events by sequence, as the authoritative journal has them.
#[derive(Default)]
struct History {
    events: BTreeMap<i64, (i64, JournalEvent)>,
    /// Highest sequence read and the owner epoch that wrote it.
    last: Option<(i64, i64)>,
}

impl History {
    fn read(&mut self, offset: i64, e: JournalEvent, wanted: bool) {
        if let Some((seq, epoch)) = self.last
            && e.sequence <= seq
        {
            if e.owner_epoch <= epoch {
                return; // a copy (or an anomaly `airlock replay` names)
            }
            // A newer owner rewrites from here: what the old one wrote after is orphaned.
            self.events.split_off(&e.sequence);
        }
        self.last = Some((e.sequence, e.owner_epoch));
        if wanted {
            self.events.insert(e.sequence, (offset, e));
        }
    }
}

pub fn run(args: &Args, out: &mut impl Write) -> anyhow::Result<()> {
    let config = Config::load(args.read.config.as_deref()).context("loading the configuration")?;
    let names = Names::new(&config.topics.prefix);
    let count = config.topics.partitions;
    let selected = match &args.key {
        Some(key) => vec![partition_for(key.as_bytes(), count)],
        None => (0..count).collect(),
    };
    let consumer = reader(&config, "audit")?;
    let scanner = Scanner {
        consumer: &consumer,
        stall_timeout: Duration::from_secs(args.read.stall_timeout_seconds),
    };
    let journal = names.journal();
    let codec = crate::runtime::schema_registry::reader_codec(&config)?;
    let wanted: Vec<(String, i32)> = selected.iter().map(|&p| (journal.clone(), p)).collect();
    let bounds: Vec<(i32, Bounds)> = selected
        .iter()
        .copied()
        .zip(ends(&scanner, &config, args.read.read_only, &wanted, None)?)
        .collect();
    let progress = Progress::new("audit", bounds.iter().map(|(_, b)| b.high - b.low).sum());
    let mut found: Vec<(i32, i64, JournalEvent)> = Vec::new();
    for (p, b) in bounds {
        let mut history = History::default();
        let mut cursor = progress.partition(&b);
        scanner.scan(&journal, p, b, |s: Scanned<'_>| -> anyhow::Result<()> {
            cursor.advance(s.offset);
            if s.admit != Admit::Accept {
                return Ok(());
            }
            let Some(Ok(e)) = s.payload.map(|b| codec.decode_as::<JournalEvent>(b)) else {
                return Ok(()); // `airlock replay` names undecodable records
            };
            let wanted = match (&args.key, &args.run) {
                (Some(k), _) => e.operation_key.as_deref() == Some(k.as_str()),
                (None, Some(r)) => e.run_id.as_deref() == Some(r.as_str()),
                (None, None) => false,
            };
            history.read(s.offset, e, wanted);
            Ok(())
        })?;
        drop(cursor);
        found.extend(history.events.into_values().map(|(o, e)| (p, o, e)));
    }
    progress.finish();
    found.sort_by_key(|(p, _, e)| (e.recorded_at, *p, e.sequence));
    let subject = match (&args.key, &args.run) {
        (Some(k), _) => format!("operation key {k}"),
        (_, Some(r)) => format!("run {r}"),
        _ => unreachable!("clap requires --key or --run"),
    };
    if args.read.json {
        let events: Vec<_> = found
            .iter()
            .map(|(_, offset, e)| {
                let mut v = serde_json::to_value(e).expect("a journal event serializes");
                v["offset"] = serde_json::json!(offset);
                v
            })
            .collect();
        writeln!(out, "{}", serde_json::Value::Array(events))?;
        return Ok(());
    }
    anyhow::ensure!(!found.is_empty(), "no journal event concerns {subject}");
    writeln!(out, "history of {subject}: {} events", found.len())?;
    for (p, offset, e) in &found {
        describe(*p, *offset, e, out)?;
    }
    Ok(())
}

/// Two or three lines per event. Evidence and other free text are untrusted: printed escaped.
fn describe(p: i32, offset: i64, e: &JournalEvent, out: &mut impl Write) -> anyhow::Result<()> {
    let short = |h: &Option<String>| {
        h.as_deref()
            .map(|h| h.get(..12).unwrap_or(h).to_owned())
            .unwrap_or_else(|| "-".to_owned())
    };
    let verdict = match (e.verdict, e.reason) {
        (Some(v), Some(r)) => format!("{} ({})", v.as_str(), r.as_str()),
        (None, Some(r)) => r.as_str().to_owned(),
        (Some(v), None) => v.as_str().to_owned(),
        (None, None) => String::new(),
    };
    let state = e
        .state
        .map(|s| format!(" -> {}", s.as_str()))
        .unwrap_or_default();
    let epoch = e.epoch.map(|n| format!(" epoch {n}")).unwrap_or_default();
    writeln!(
        out,
        "{}  {:<20} {verdict}{state}{epoch}",
        utc_from_millis(e.recorded_at.max(0) as u128),
        e.kind.as_str()
    )?;
    writeln!(
        out,
        "    key {} run {} proposal {} by {} (tenant {}) tool {}; arguments {}; policy {}; lease fence {}",
        e.operation_key.as_deref().unwrap_or("-"),
        e.run_id.as_deref().unwrap_or("-"),
        e.proposal_id.as_deref().unwrap_or("-"),
        e.principal_id.as_deref().unwrap_or("-"),
        e.tenant_id.as_deref().unwrap_or("-"),
        e.tool.as_deref().unwrap_or("-"),
        short(&e.arguments_hash),
        short(&e.policy_bundle_hash),
        e.lease_fence.map_or("-".to_owned(), |f| f.to_string()),
    )?;
    writeln!(
        out,
        "    cause {:?}; journal partition {p} sequence {} offset {offset}; owner epoch {} task {:?}",
        e.cause_id, e.sequence, e.owner_epoch, e.task
    )?;
    if let Some(evidence) = &e.evidence {
        writeln!(out, "    evidence {evidence:?}")?;
    }
    Ok(())
}
