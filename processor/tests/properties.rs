//! Property tests over random input sequences: proposals (fresh, resent, changed arguments,
//! stale fences, forbidden amounts), approvals (right and wrong hash, entitled or not),
//! outcomes in and out of order with stale epochs, clock jumps that fire timers, operator
//! settlements, and crashes that drop the uncommitted batch and re-decide it.
//!
//! Invariants: at most one dispatch per key and epoch; epoch n+1 only after a proven FAILED of
//! epoch n; no reconciliation lookup before the attempt's deadline; nothing unauthorized, expired, stale-fenced or conflicting dispatches; COMMITTED
//! never regresses; re-deciding a dropped batch gives the same outputs; and state rebuilt from
//! the journal alone has the live projection hash.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, LazyLock};

use airlock_processor::core::record::State;
use airlock_processor::core::{self, Core, Effects, Input, StateView, reducer};
use airlock_processor::sample::{self, HOUR_MS};
use airlock_processor::store::{self, MemoryBackend, MemoryStore, StateStore, Store};
use airlock_processor::task::Task;
use airlock_schemas::{ApprovalVerdict, ControlKind, JournalEvent, OutcomeKind, Reason, Verdict};
use proptest::prelude::*;

const T0: i64 = 1_790_000_000_000;
const KEYS: &[&str] = &["k:0", "k:1", "k:2"];
/// Auto, approval tier, forbidden by policy, auto with other arguments (a conflict on reuse).
const AMOUNTS: &[i64] = &[500, 50_000, 600_000, 501];
const APPROVERS: &[&str] = &["alice", "bob", "mallory", "agent-support-1"];
const OUTCOMES: &[OutcomeKind] = &[
    OutcomeKind::AttemptStarted,
    OutcomeKind::Committed,
    OutcomeKind::Failed,
    OutcomeKind::Unknown,
    OutcomeKind::ReconciledCommitted,
    OutcomeKind::ReconciledFailed,
    OutcomeKind::ReconciledUnknown,
];

static CORE: LazyLock<Arc<Core>> = LazyLock::new(|| {
    Arc::new(sample::reference_core(core::Config::default()).expect("reference config"))
});

#[derive(Clone, Debug)]
enum Op {
    Propose {
        key: usize,
        amount: usize,
        fence: i64,
        short_deadline: bool,
    },
    Resend {
        key: usize,
    },
    Approve {
        key: usize,
        approver: usize,
        right_hash: bool,
        reject: bool,
    },
    Outcome {
        key: usize,
        epoch: i64,
        kind: usize,
    },
    Advance {
        ms: i64,
    },
    Settle {
        key: usize,
        committed: bool,
    },
    Commit,
    Crash,
    /// Lose the disk: rebuild the state from the committed journal alone and carry on.
    Rebuild,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..KEYS.len(), 0..AMOUNTS.len(), 1i64..4, prop::bool::weighted(0.2))
            .prop_map(|(key, amount, fence, short_deadline)| Op::Propose { key, amount, fence, short_deadline }),
        2 => (0..KEYS.len()).prop_map(|key| Op::Resend { key }),
        2 => (0..KEYS.len(), 0..APPROVERS.len(), prop::bool::weighted(0.8), prop::bool::weighted(0.15))
            .prop_map(|(key, approver, right_hash, reject)| Op::Approve { key, approver, right_hash, reject }),
        5 => (0..KEYS.len(), 0i64..4, 0..OUTCOMES.len())
            .prop_map(|(key, epoch, kind)| Op::Outcome { key, epoch, kind }),
        2 => prop_oneof![1i64..5_000, 5_000i64..120_000, Just(HOUR_MS)].prop_map(|ms| Op::Advance { ms }),
        1 => (0..KEYS.len(), any::<bool>()).prop_map(|(key, committed)| Op::Settle { key, committed }),
        2 => Just(Op::Commit),
        1 => Just(Op::Crash),
        1 => Just(Op::Rebuild),
    ]
}

/// Drives one task, remembering what a model of the invariants needs.
struct Harness {
    task: Task<MemoryStore>,
    now: i64,
    /// Inputs of the uncommitted batch (a crash re-delivers them) and their outputs.
    batch: Vec<(Input, i64)>,
    batch_outputs: Vec<Effects>,
    /// Journal of committed batches: the only source of the rebuilt projection.
    journal: Vec<JournalEvent>,
    dispatched: BTreeSet<(String, i64)>,
    /// Attempt deadline of every dispatch: no lookup may come before it.
    attempt_deadlines: HashMap<(String, i64), i64>,
    /// Per key, the epoch whose proven failure allows the next dispatch.
    failed_epoch: HashMap<String, i64>,
    committed: BTreeSet<String>,
    highest_fence: i64,
    proposals: u32,
    last_proposal: HashMap<usize, sample_proposal::P>,
}

mod sample_proposal {
    pub type P = airlock_schemas::ToolProposal;
}

impl Harness {
    fn new() -> Self {
        Harness {
            task: sample::memory_task(CORE.clone()).unwrap(),
            now: T0,
            batch: Vec::new(),
            batch_outputs: Vec::new(),
            journal: Vec::new(),
            dispatched: BTreeSet::new(),
            attempt_deadlines: HashMap::new(),
            failed_epoch: HashMap::new(),
            committed: BTreeSet::new(),
            highest_fence: 0,
            proposals: 0,
            last_proposal: HashMap::new(),
        }
    }

    fn feed(&mut self, input: Input, now: i64) -> Result<(), TestCaseError> {
        let before: BTreeMap<String, Option<core::EffectRecord>> = KEYS
            .iter()
            .map(|k| (k.to_string(), self.task.store().effect(k).unwrap()))
            .collect();
        let effects = self.task.handle(&input, now).unwrap();
        self.check(&input, &before, &effects)?;
        self.batch.push((input, now));
        self.batch_outputs.push(effects);
        Ok(())
    }

    fn check(
        &mut self,
        input: &Input,
        before: &BTreeMap<String, Option<core::EffectRecord>>,
        effects: &Effects,
    ) -> Result<(), TestCaseError> {
        for d in &effects.dispatches {
            let key = d.operation_key.clone();
            prop_assert!(
                self.dispatched.insert((key.clone(), d.epoch)),
                "second dispatch of {key} epoch {}",
                d.epoch
            );
            if d.epoch > 1 {
                prop_assert_eq!(
                    self.failed_epoch.get(&key).copied(),
                    Some(d.epoch - 1),
                    "epoch {} of {} without a proven failure of epoch {}",
                    d.epoch,
                    key,
                    d.epoch - 1
                );
            }
            self.attempt_deadlines
                .insert((key.clone(), d.epoch), d.attempt_deadline_at);
            let args: serde_json::Value = serde_json::from_str(&d.arguments_json).unwrap();
            let amount = args["amount"]["minor_units"].as_i64().unwrap();
            prop_assert!(amount <= 500_000, "a forbidden amount was dispatched");
            prop_assert!(d.issued_at < d.deadline_at, "dispatched after the deadline");
            prop_assert!(d.attempt_deadline_at <= d.deadline_at);
            let rec = self.task.store().effect(&key).unwrap().unwrap();
            prop_assert_eq!(
                &rec.arguments_hash,
                &d.arguments_hash,
                "dispatch of other arguments"
            );
            if let Input::Proposal(p) = input {
                prop_assert!(
                    p.lease_fence >= self.highest_fence,
                    "stale fence dispatched"
                );
                let reply = effects
                    .decisions
                    .iter()
                    .find(|x| x.in_reply_to == p.proposal_id);
                prop_assert_eq!(reply.map(|x| x.verdict), Some(Verdict::Accepted));
            }
        }
        for r in &effects.reconciles {
            let deadline = self.attempt_deadlines[&(r.operation_key.clone(), r.epoch)];
            prop_assert!(
                r.issued_at >= deadline,
                "reconciled {} epoch {} before its attempt deadline",
                r.operation_key,
                r.epoch
            );
        }
        if let Input::Proposal(p) = input {
            // Every proposal gets exactly one reply; refusals dispatch nothing.
            prop_assert_eq!(effects.decisions.len(), 1);
            let d = &effects.decisions[0];
            if d.verdict != Verdict::Accepted {
                prop_assert!(effects.dispatches.is_empty());
            }
            if d.verdict == Verdict::Accepted || d.reason == Reason::ApprovalRequired {
                self.highest_fence = self.highest_fence.max(p.lease_fence);
            }
        }
        for key in KEYS {
            let after = self.task.store().effect(key).unwrap();
            if self.committed.contains(*key)
                && let Some(after) = &after
            {
                prop_assert!(
                    matches!(after.state, State::Committed { .. }),
                    "COMMITTED regressed to {:?}",
                    after.state
                );
            }
            if let Some(after) = &after {
                match &after.state {
                    State::Committed { .. } => {
                        self.committed.insert(key.to_string());
                    }
                    State::Failed { .. } => {
                        self.failed_epoch.insert(key.to_string(), after.epoch);
                    }
                    _ => {}
                }
                if let Some(Some(prev)) = before.get(*key) {
                    prop_assert!(after.epoch >= prev.epoch, "epoch went backwards");
                }
            }
        }
        Ok(())
    }

    fn commit(&mut self) {
        self.task.commit().unwrap();
        for e in self.batch_outputs.drain(..) {
            self.journal.extend(e.journal);
        }
        self.batch.clear();
    }

    /// Drops the uncommitted batch and re-delivers its inputs: the outputs must be identical.
    fn crash(&mut self) -> Result<(), TestCaseError> {
        self.task.discard().unwrap();
        let inputs = std::mem::take(&mut self.batch);
        let expected = std::mem::take(&mut self.batch_outputs);
        for ((input, now), before) in inputs.into_iter().zip(expected) {
            let again = self.task.handle(&input, now).unwrap();
            prop_assert_eq!(
                &again,
                &before,
                "re-deciding a dropped input changed its outputs"
            );
            self.batch.push((input, now));
            self.batch_outputs.push(again);
        }
        Ok(())
    }

    fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match op {
            Op::Propose {
                key,
                amount,
                fence,
                short_deadline,
            } => {
                self.proposals += 1;
                let mut p = sample::refund(KEYS[*key], AMOUNTS[*amount], self.now);
                p.proposal_id = format!("p-{}", self.proposals);
                p.lease_fence = *fence;
                if *short_deadline {
                    p.deadline_at = self.now + 2_000;
                }
                self.last_proposal.insert(*key, p.clone());
                self.feed(Input::Proposal(p), self.now)?;
            }
            Op::Resend { key } => {
                if let Some(p) = self.last_proposal.get(key).cloned() {
                    self.feed(Input::Proposal(p), self.now)?;
                }
            }
            Op::Approve {
                key,
                approver,
                right_hash,
                reject,
            } => {
                let Some(p) = self.last_proposal.get(key).cloned() else {
                    return Ok(());
                };
                let hash = match self.task.store().effect(KEYS[*key]).unwrap() {
                    Some(rec) if *right_hash => rec.arguments_hash,
                    _ => "0".repeat(64),
                };
                let verdict = if *reject {
                    ApprovalVerdict::Reject
                } else {
                    ApprovalVerdict::Approve
                };
                let mut a = sample::approval(&p, &hash, APPROVERS[*approver], verdict, self.now);
                a.approval_id = format!("{}-{}", a.approval_id, self.now);
                self.feed(Input::Approval(a), self.now)?;
            }
            Op::Outcome { key, epoch, kind } => {
                let mut o = sample::outcome(KEYS[*key], *epoch, OUTCOMES[*kind], "evidence");
                o.outcome_id = format!("{}-{}", o.outcome_id, self.now);
                self.feed(Input::Outcome(o), self.now)?;
            }
            Op::Advance { ms } => {
                self.now += ms;
                let due = self.task.store().due_timers(self.now, 1_000).unwrap();
                for t in due {
                    let at = t.due_at;
                    self.feed(Input::Timer(t), at)?;
                }
            }
            Op::Settle { key, committed } => {
                let kind = if *committed {
                    ControlKind::SettleCommitted
                } else {
                    ControlKind::SettleFailed
                };
                let c =
                    sample::control(&format!("c-{}", self.now), kind, Some(KEYS[*key]), self.now);
                self.feed(Input::Control(c), self.now)?;
            }
            Op::Commit => self.commit(),
            Op::Crash => self.crash()?,
            Op::Rebuild => self.rebuild()?,
        }
        Ok(())
    }

    /// The disk is lost after the last commit: a new task over state rebuilt from the journal
    /// takes over, with the same projection, and the uncommitted batch is re-delivered to it.
    fn rebuild(&mut self) -> Result<(), TestCaseError> {
        self.task.discard().unwrap();
        let live = self.task.store().projection_hash();
        let store = StateStore::open(MemoryBackend::default()).unwrap();
        self.task =
            Task::rebuild_from_journal(CORE.clone(), store, sample::task_context(0), &self.journal)
                .unwrap();
        prop_assert_eq!(self.task.store().projection_hash(), live);
        self.crash()
    }

    /// Rebuilds the projection from the committed journal alone and compares it to the live one.
    fn check_rebuild(&self) -> Result<(), TestCaseError> {
        let mut writes = Vec::new();
        for event in &self.journal {
            writes.extend(reducer::writes_of(event).unwrap());
        }
        let rebuilt = store::projection_of(&writes).unwrap();
        prop_assert_eq!(rebuilt, self.task.store().projection_hash());
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, max_shrink_iters: 2_000, ..ProptestConfig::default() })]

    #[test]
    fn random_sequences_keep_every_invariant(ops in prop::collection::vec(op(), 1..80)) {
        let mut h = Harness::new();
        for op in &ops {
            h.apply(op)?;
        }
        h.commit();
        h.check_rebuild()?;
        // Journal sequence numbers are dense per partition.
        for (i, e) in h.journal.iter().enumerate() {
            prop_assert_eq!(e.sequence, i as i64);
        }
    }
}
