//! The workload of the crash, rebalance and zombie tests, and the reference it is checked
//! against: the same proposals, in the order the broker holds them, decided by the same core
//! over an in-memory store without any interruption.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use airlock_processor::cli::run::load_core;
use airlock_processor::core::{Input, TaskContext};
use airlock_processor::sample;
use airlock_processor::store::{MemoryBackend, StateStore};
use airlock_processor::task::Task;
use airlock_schemas::{Codec, Decision, JournalEvent, ToolProposal, Verdict};

use crate::airlock::Airlock;

/// A small deterministic generator (no randomness crate needed for a test's schedule).
#[derive(Debug)]
pub struct Lcg(pub u64);

impl Lcg {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// `n` refund proposals: 30% duplicates (the same message again or a blind retry under a new
/// id), 5% changed arguments under an existing key, the rest fresh keys.
pub fn proposals(n: usize, now: i64, rng: &mut Lcg) -> Vec<ToolProposal> {
    let mut out: Vec<ToolProposal> = Vec::with_capacity(n);
    let mut fresh = 0usize;
    while out.len() < n {
        let roll = rng.below(100);
        if roll < 30 && fresh > 0 {
            // A duplicate: the same message again, or a blind retry under a new id.
            let k = rng.below(fresh as u64) as usize;
            let base = sample::refund(&format!("refund:c{k}"), 1_000, now);
            out.push(if rng.below(2) == 0 {
                base
            } else {
                sample::resend(&base, out.len() as u32)
            });
        } else if roll < 35 && fresh > 0 {
            let k = rng.below(fresh as u64) as usize;
            let mut changed = sample::refund(&format!("refund:c{k}"), 2_000, now);
            changed.proposal_id = format!("changed-{}", out.len());
            out.push(changed);
        } else {
            out.push(sample::refund(&format!("refund:c{fresh}"), 1_000, now));
            fresh += 1;
        }
    }
    out
}

/// What an uninterrupted run decided.
#[derive(Debug, Default)]
pub struct Reference {
    /// The first verdict given to each proposal id.
    pub verdicts: BTreeMap<String, Verdict>,
    /// Every (operation key, attempt epoch) dispatched.
    pub dispatches: BTreeSet<(String, i64)>,
}

/// The verdict of every proposal id and the set of (operation key, attempt epoch) dispatched
/// by an uninterrupted run over the proposals topic as it stands.
pub fn reference(a: &Airlock) -> anyhow::Result<Reference> {
    let core = Arc::new(load_core(&a.instance_config("reference"))?);
    let codec = Codec::new();
    let mut tasks = BTreeMap::new();
    let mut verdicts = BTreeMap::new();
    let mut dispatches = BTreeSet::new();
    for r in a.read_topic(&a.names.proposals())? {
        let task = match tasks.entry(r.partition) {
            std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::btree_map::Entry::Vacant(e) => {
                let ctx = TaskContext {
                    partition: r.partition,
                    owner_epoch: 1,
                    task: "reference".to_owned(),
                };
                e.insert(Task::new(
                    core.clone(),
                    StateStore::open(MemoryBackend::default())?,
                    ctx,
                )?)
            }
        };
        let p: ToolProposal = codec.decode_as(r.value.as_deref().unwrap_or_default())?;
        let effects = task.handle(&Input::Proposal(p.clone()), p.proposed_at)?;
        task.commit()?;
        for d in effects.decisions {
            verdicts.entry(d.in_reply_to).or_insert(d.verdict);
        }
        for d in effects.dispatches {
            dispatches.insert((d.operation_key, d.epoch));
        }
    }
    Ok(Reference {
        verdicts,
        dispatches,
    })
}

/// Why some proposals have no reply, for a failing test's message: how many, where the first
/// few sit in the proposals topic, every decision (fenced or not) that names them, and the
/// last lines of the processors' log.
pub fn explain_missing(
    a: &Airlock,
    distinct: &BTreeSet<String>,
    log: &std::path::Path,
) -> anyhow::Result<String> {
    use std::fmt::Write;
    let replies = a.proposal_replies()?;
    let missing: BTreeSet<&String> = distinct
        .iter()
        .filter(|id| !replies.contains_key(*id))
        .take(8)
        .collect();
    let mut out = String::new();
    writeln!(
        out,
        "{} proposals without a reply, e.g. {missing:?}",
        distinct
            .iter()
            .filter(|id| !replies.contains_key(*id))
            .count()
    )?;
    let codec = a.reader_codec()?;
    for r in a.read_topic(&a.names.proposals())? {
        if let Ok(p) = codec.decode_as::<ToolProposal>(r.value.as_deref().unwrap_or_default())
            && missing.contains(&p.proposal_id)
        {
            writeln!(
                out,
                "  proposal {} at p{} o{}",
                p.proposal_id, r.partition, r.offset
            )?;
        }
    }
    for r in a.read_topic(&a.names.decisions())? {
        if let Ok(d) = codec.decode_as::<Decision>(r.value.as_deref().unwrap_or_default())
            && missing.contains(&d.in_reply_to)
        {
            writeln!(
                out,
                "  decision {} at p{} o{} owner epoch {} {:?}",
                d.decision_id, r.partition, r.offset, d.owner_epoch, r.admit
            )?;
        }
    }
    // The periodic progress lines say little about a failure; claims, revocations, warnings and
    // errors say what happened to the partitions.
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let events: Vec<&str> = text
        .lines()
        .filter(|l| !l.contains(" inputs in ") || l.contains(" WARN ") || l.contains(" ERROR "))
        .collect();
    let tail = &events[events.len().saturating_sub(80)..];
    writeln!(
        out,
        "processor log ({} lines, the last {} without progress lines):\n{}",
        text.lines().count(),
        tail.len(),
        tail.join("\n")
    )?;
    Ok(out)
}

/// Asserts that the replies and the dispatches on the topics (after dedup and the fence) are
/// those of the uninterrupted reference run: the same verdict for every proposal, one dispatch
/// command per (key, epoch) however many copies, the same (key, epoch) set. Returns the number of dispatches.
pub fn assert_matches_reference(
    a: &Airlock,
    decided: &BTreeMap<String, Decision>,
) -> anyhow::Result<usize> {
    let expected = reference(a)?;
    for (id, verdict) in &expected.verdicts {
        let got = decided.get(id).map(|d| d.verdict);
        anyhow::ensure!(
            got == Some(*verdict),
            "proposal {id}: {got:?}, reference {verdict:?}"
        );
    }
    // One command per (key, epoch): `dispatches` fails on two different copies of one.
    let dispatches = a.dispatches()?;
    let got: BTreeSet<(String, i64)> = dispatches
        .iter()
        .map(|d| (d.operation_key.clone(), d.epoch))
        .collect();
    anyhow::ensure!(
        got == expected.dispatches,
        "dispatched (key, epoch) differ from the reference: {} here, {} there",
        got.len(),
        expected.dispatches.len()
    );
    Ok(dispatches.len())
}

/// How each operation key of `decisions` settled: `Committed` once any decision says so, else
/// `Failed` when its last decision is FAILED with proof at attempt epoch `budget` or later (the
/// retry budget spent). Keys still open are left out.
pub fn settled(decisions: Vec<Decision>, budget: i64) -> BTreeMap<String, Verdict> {
    let mut last: BTreeMap<String, Decision> = BTreeMap::new();
    let mut committed = BTreeSet::new();
    for d in decisions {
        if d.verdict == Verdict::Committed {
            committed.insert(d.operation_key.clone());
        }
        last.insert(d.operation_key.clone(), d);
    }
    last.into_iter()
        .filter_map(|(k, d)| {
            if committed.contains(&k) {
                Some((k, Verdict::Committed))
            } else {
                (d.verdict == Verdict::Failed && d.epoch >= Some(budget)).then_some((k, d.verdict))
            }
        })
        .collect()
}

/// The journal of `key`, one line per event (owner epoch, kind, attempt epoch, verdict, state,
/// evidence), for a failed test's message; empty when the journal cannot be read.
pub fn story(a: &Airlock, key: &str) -> String {
    let Ok(journal) = a.read_deduplicated::<JournalEvent>(&a.names.journal(), "journal") else {
        return String::new();
    };
    let lines: Vec<String> = journal
        .iter()
        .filter(|j| j.operation_key.as_deref() == Some(key))
        .map(|j| {
            format!(
                "  owner {} {} epoch {:?} {:?} {:?}: {}",
                j.owner_epoch,
                j.kind.as_str(),
                j.epoch,
                j.verdict,
                j.state,
                j.evidence.as_deref().unwrap_or_default()
            )
        })
        .collect();
    format!("{key}:\n{}", lines.join("\n"))
}
