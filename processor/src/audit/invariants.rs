//! The invariants an auditor checks over a partition's journal, in journal order (DESIGN.md
//! sections 3, 5 and 10): no dispatch without a durable dispatch intent, at most one dispatch
//! per key and epoch, a second epoch only after a proven FAILED, at most one COMMITTED per key,
//! COMMITTED never regressed, nothing dispatched for a refused proposal or a closed intent.
//!
//! Memory: a few bytes per operation key and per (key, epoch) dispatched, and the ids of
//! refused proposals; the facts of a purged key are dropped with it.

use std::collections::{HashMap, HashSet};

use airlock_schemas::{EffectState, JournalEvent, JournalKind, Verdict};

use crate::core::record::Write;

/// Which rule an event broke.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// A dispatch command (or an attempt, or a settlement) without an earlier dispatch intent
    /// of the same key and epoch.
    DispatchWithoutIntent,
    /// A second dispatch intent for the same key and epoch.
    SecondDispatch,
    /// A dispatch intent at epoch n > 1 without a proven FAILED of epoch n - 1.
    RetryWithoutProvenFailure,
    /// A dispatch intent for a proposal that was refused (denied, rejected, conflicting,
    /// expired, stale-fenced).
    DispatchForRefusedProposal,
    /// A dispatch intent for a key whose intent is closed (committed, denied, expired,
    /// cancelled).
    DispatchAfterClose,
    /// A second COMMITTED settlement of the same key.
    SecondCommit,
    /// A transition that left a COMMITTED key in another state.
    CommittedRegressed,
}

impl Rule {
    pub fn as_str(self) -> &'static str {
        match self {
            Rule::DispatchWithoutIntent => "dispatch-without-intent",
            Rule::SecondDispatch => "second-dispatch-same-epoch",
            Rule::RetryWithoutProvenFailure => "retry-without-proven-failure",
            Rule::DispatchForRefusedProposal => "dispatch-for-refused-proposal",
            Rule::DispatchAfterClose => "dispatch-after-close",
            Rule::SecondCommit => "second-commit",
            Rule::CommittedRegressed => "committed-regressed",
        }
    }
}

/// One broken rule, with what the event said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Breach {
    pub rule: Rule,
    pub operation_key: String,
    pub detail: String,
}

#[derive(Debug, Default)]
struct KeyFacts {
    state: Option<EffectState>,
    committed: bool,
    /// Highest epoch settled FAILED with proof.
    failed_epoch: i64,
}

/// The facts of one partition's journal so far.
#[derive(Debug, Default)]
pub struct Invariants {
    keys: HashMap<String, KeyFacts>,
    /// Every (key, epoch) with a dispatch intent: the dispatch topic is checked against it.
    intents: HashSet<(String, i64)>,
    refused: HashSet<String>,
}

impl Invariants {
    /// Applies one journal event, in order; returns the rules it broke.
    pub fn observe(&mut self, e: &JournalEvent) -> Vec<Breach> {
        let mut breaches = Vec::new();
        if e.kind == JournalKind::ProposalDecided
            && let (Some(verdict), Some(id)) = (e.verdict, &e.proposal_id)
            && refusal(verdict)
        {
            self.refused.insert(id.clone());
        }
        let Some(key) = &e.operation_key else {
            return breaches;
        };
        let epoch = e.epoch.unwrap_or(0);
        let mut breach = |rule, detail: String| {
            breaches.push(Breach {
                rule,
                operation_key: key.clone(),
                detail,
            });
        };
        let facts = self.keys.entry(key.clone()).or_default();
        // The journal event that carries a dispatch's state write is its durable intent: a
        // DISPATCH_INTENT from a proposal or a retry, or the APPROVAL_DECIDED that completed a
        // quorum and dispatched (state DISPATCHED).
        let intent = e.kind == JournalKind::DispatchIntent
            || (e.kind == JournalKind::ApprovalDecided && e.state == Some(EffectState::Dispatched));
        match e.kind {
            _ if intent => {
                if let Some(id) = &e.proposal_id
                    && self.refused.contains(id)
                {
                    breach(
                        Rule::DispatchForRefusedProposal,
                        format!("epoch {epoch} dispatched for refused proposal {id}"),
                    );
                }
                let closed = if facts.committed {
                    Some(EffectState::Committed)
                } else {
                    facts.state.filter(|s| {
                        matches!(
                            s,
                            EffectState::Denied | EffectState::Expired | EffectState::Cancelled
                        )
                    })
                };
                if let Some(state) = closed {
                    breach(
                        Rule::DispatchAfterClose,
                        format!(
                            "epoch {epoch} dispatched after the key was {}",
                            state.as_str()
                        ),
                    );
                }
                if !self.intents.insert((key.clone(), epoch)) {
                    breach(
                        Rule::SecondDispatch,
                        format!("a second dispatch intent for epoch {epoch}"),
                    );
                }
                if epoch > 1 && facts.failed_epoch < epoch - 1 {
                    breach(
                        Rule::RetryWithoutProvenFailure,
                        format!(
                            "epoch {epoch} dispatched; the last proven failure was epoch {}",
                            facts.failed_epoch
                        ),
                    );
                }
            }
            JournalKind::AttemptStarted if !self.intents.contains(&(key.clone(), epoch)) => {
                breach(
                    Rule::DispatchWithoutIntent,
                    format!("attempt {epoch} started without a dispatch intent"),
                );
            }
            JournalKind::Settled => match e.state {
                Some(EffectState::Committed) => {
                    if facts.committed {
                        breach(
                            Rule::SecondCommit,
                            format!("settled COMMITTED again at epoch {epoch}"),
                        );
                    }
                    if epoch > 0 && !self.intents.contains(&(key.clone(), epoch)) {
                        breach(
                            Rule::DispatchWithoutIntent,
                            format!("epoch {epoch} settled COMMITTED without a dispatch intent"),
                        );
                    }
                }
                Some(EffectState::Failed) => facts.failed_epoch = facts.failed_epoch.max(epoch),
                _ => {}
            },
            _ => {}
        }
        if facts.committed
            && let Some(state) = e.state
            && state != EffectState::Committed
        {
            breach(
                Rule::CommittedRegressed,
                format!(
                    "{} left the committed key {}",
                    e.kind.as_str(),
                    state.as_str()
                ),
            );
        }
        if let Some(state) = e.state {
            facts.state = Some(state);
            facts.committed |= state == EffectState::Committed;
        }
        // A purge that deletes the record forgets the key; one that closes it (retention
        // passed, a closed-intent marker stays) keeps its facts: the marker still answers.
        if e.kind == JournalKind::RecordPurged && deletes_effect(e, key) {
            self.keys.remove(key);
        }
        breaches
    }

    /// Whether the journal holds a dispatch intent for `key` at `epoch`.
    pub fn intended(&self, key: &str, epoch: i64) -> bool {
        self.intents.contains(&(key.to_owned(), epoch))
    }
}

/// Whether `e` deletes the effect record of `key` (a write of it without a record).
fn deletes_effect(e: &JournalEvent, key: &str) -> bool {
    e.record_json
        .as_deref()
        .and_then(|json| serde_json::from_str::<Vec<Write>>(json).ok())
        .is_some_and(|writes| {
            writes
                .iter()
                .any(|w| matches!(w, Write::Effect { key: k, record: None } if k == key))
        })
}

/// Verdicts that refuse a proposal: nothing may be dispatched for it.
fn refusal(v: Verdict) -> bool {
    matches!(
        v,
        Verdict::Rejected
            | Verdict::Denied
            | Verdict::Conflict
            | Verdict::Expired
            | Verdict::Cancelled
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Arc;

    use airlock_schemas::{ApprovalVerdict, OutcomeKind};

    use super::*;
    use crate::audit::replay::tests::event;
    use crate::core::{self, Input, StateView};
    use crate::sample;

    #[test]
    fn a_dispatch_at_approval_quorum_is_its_own_intent() {
        // The reference core's own journal: a refund over the auto limit, approved by alice,
        // started and committed.
        let core = Arc::new(sample::reference_core(core::Config::default()).unwrap());
        let mut task = sample::memory_task(core).unwrap();
        let now = 1_790_000_000_000;
        let p = sample::refund("refund:large", 20_000, now);
        let mut journal = task
            .handle(&Input::Proposal(p.clone()), now)
            .unwrap()
            .journal;
        let hash = journal[0].arguments_hash.clone().unwrap();
        let a = sample::approval(&p, &hash, "alice", ApprovalVerdict::Approve, now);
        let approved = task.handle(&Input::Approval(a), now).unwrap();
        assert_eq!(approved.dispatches.len(), 1, "the quorum of one dispatches");
        journal.extend(approved.journal);
        for kind in [OutcomeKind::AttemptStarted, OutcomeKind::Committed] {
            let o = sample::outcome(&p.operation_key, 1, kind, "ledger eff_1");
            journal.extend(task.handle(&Input::Outcome(o), now).unwrap().journal);
        }
        let mut inv = Invariants::default();
        let breaches: Vec<Breach> = journal.iter().flat_map(|e| inv.observe(e)).collect();
        assert_eq!(breaches, Vec::new());
        assert!(inv.intended(&p.operation_key, 1));
    }

    /// Closing a record at retention keeps the key's facts (the marker still answers for the
    /// intent); deleting it forgets them.
    #[test]
    fn a_closed_key_keeps_its_facts_until_it_is_deleted() {
        let core = Arc::new(sample::reference_core(core::Config::default()).unwrap());
        let mut task = sample::memory_task(core).unwrap();
        let now = 1_790_000_000_000;
        let p = sample::refund("refund:old", 100, now);
        let mut journal = task
            .handle(&Input::Proposal(p.clone()), now)
            .unwrap()
            .journal;
        let o = sample::outcome(&p.operation_key, 1, OutcomeKind::Committed, "ledger eff_1");
        journal.extend(task.handle(&Input::Outcome(o), now).unwrap().journal);
        let purge = |task: &mut crate::task::Task<crate::store::MemoryStore>| {
            let (due_at, _) = task
                .store()
                .effect("refund:old")
                .unwrap()
                .unwrap()
                .next_timer()
                .unwrap();
            let timer = core::TimerFired {
                due_at,
                target: core::TimerTarget::Effect("refund:old".to_owned()),
            };
            task.handle(&Input::Timer(timer), due_at).unwrap().journal
        };
        journal.extend(purge(&mut task));
        assert!(
            task.store().effect("refund:old").unwrap().is_some(),
            "closed, not deleted"
        );
        let mut inv = Invariants::default();
        let breaches: Vec<Breach> = journal.iter().flat_map(|e| inv.observe(e)).collect();
        assert_eq!(breaches, Vec::new());
        let second = event(
            90,
            JournalKind::Settled,
            "refund:old",
            1,
            Some(EffectState::Committed),
        );
        let rules: Vec<Rule> = inv.observe(&second).into_iter().map(|b| b.rule).collect();
        assert_eq!(
            rules,
            [Rule::SecondCommit],
            "the closed key's commit is remembered"
        );

        let deleted = purge(&mut task);
        assert!(task.store().effect("refund:old").unwrap().is_none());
        let mut inv = Invariants::default();
        for e in journal.iter().chain(&deleted) {
            inv.observe(e);
        }
        assert!(
            inv.observe(&second)
                .iter()
                .all(|b| b.rule != Rule::SecondCommit)
        );
    }

    #[test]
    fn a_retry_after_a_proven_failure_is_clean() {
        let mut inv = Invariants::default();
        let mut seen = Vec::new();
        for (kind, epoch, state) in [
            (JournalKind::DispatchIntent, 1, EffectState::Dispatched),
            (JournalKind::AttemptStarted, 1, EffectState::InFlight),
            (JournalKind::Settled, 1, EffectState::Failed),
            (JournalKind::DispatchIntent, 2, EffectState::Dispatched),
            (JournalKind::Settled, 2, EffectState::Committed),
            (JournalKind::OutcomeIgnored, 2, EffectState::Committed),
        ] {
            seen.extend(inv.observe(&event(0, kind, "k", epoch, Some(state))));
        }
        assert_eq!(seen, Vec::new());
        assert!(inv.intended("k", 2));
        assert!(!inv.intended("k", 3));
    }

    #[test]
    fn each_rule_is_named() {
        let mut inv = Invariants::default();
        let mut refused = event(0, JournalKind::ProposalDecided, "a", 0, None);
        refused.verdict = Some(Verdict::Denied);
        refused.proposal_id = Some("p-a".to_owned());
        assert!(inv.observe(&refused).is_empty());
        let mut dispatch = event(1, JournalKind::DispatchIntent, "a", 1, None);
        dispatch.proposal_id = Some("p-a".to_owned());
        let rules = |b: Vec<Breach>| b.into_iter().map(|b| b.rule).collect::<Vec<_>>();
        assert_eq!(
            rules(inv.observe(&dispatch)),
            [Rule::DispatchForRefusedProposal]
        );
        let mut again = dispatch.clone();
        again.proposal_id = None;
        assert_eq!(rules(inv.observe(&again)), [Rule::SecondDispatch]);
        let retry = event(2, JournalKind::DispatchIntent, "a", 2, None);
        assert_eq!(
            rules(inv.observe(&retry)),
            [Rule::RetryWithoutProvenFailure]
        );
        let commit = event(
            3,
            JournalKind::Settled,
            "b",
            1,
            Some(EffectState::Committed),
        );
        assert_eq!(rules(inv.observe(&commit)), [Rule::DispatchWithoutIntent]);
        assert_eq!(
            rules(inv.observe(&commit)),
            [Rule::SecondCommit, Rule::DispatchWithoutIntent]
        );
        let regress = event(4, JournalKind::Settled, "b", 1, Some(EffectState::Unknown));
        assert_eq!(rules(inv.observe(&regress)), [Rule::CommittedRegressed]);
        let late = event(5, JournalKind::DispatchIntent, "b", 2, None);
        assert!(rules(inv.observe(&late)).contains(&Rule::DispatchAfterClose));
    }
}
