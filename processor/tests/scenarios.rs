//! Core scenario tests over the in-memory store and the reference configuration: every verdict
//! and reason code the core produces, and every row of the idempotency contract.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::sync::Arc;

use airlock_processor::core::record::{State, TimerKind};
use airlock_processor::core::registry::Registry;
use airlock_processor::core::{self, Core, Effects, Input, StateView};
use airlock_processor::sample::{self, HOUR_MS};
use airlock_processor::store::MemoryStore;
use airlock_processor::task::Task;
use airlock_schemas::{
    Approval, ApprovalVerdict, ControlKind, Decision, EffectState, JournalKind, OutcomeKind,
    Reason, ToolProposal, Verdict,
};

const T0: i64 = 1_790_000_000_000;

struct World {
    task: Task<MemoryStore>,
    now: i64,
    seen: Vec<Decision>,
}

impl World {
    fn new() -> Self {
        Self::with(core::Config::default())
    }

    fn with(config: core::Config) -> Self {
        let core = Arc::new(sample::reference_core(config).expect("reference config loads"));
        Self::over(core)
    }

    fn over(core: Arc<Core>) -> Self {
        World {
            task: sample::memory_task(core).expect("memory task"),
            now: T0,
            seen: Vec::new(),
        }
    }

    fn feed(&mut self, input: Input) -> Effects {
        let effects = self.task.handle(&input, self.now).expect("handle");
        self.task.commit().expect("commit");
        self.seen.extend(effects.decisions.iter().cloned());
        effects
    }

    fn propose(&mut self, p: &ToolProposal) -> Effects {
        self.feed(Input::Proposal(p.clone()))
    }

    /// Moves the clock and fires every due timer.
    fn advance_to(&mut self, t: i64) -> Effects {
        self.now = t;
        let fired = self.task.fire_timers(t, 10_000).expect("timers");
        self.task.commit().expect("commit");
        let mut all = Effects::default();
        for e in fired {
            self.seen.extend(e.decisions.iter().cloned());
            all.dispatches.extend(e.dispatches);
            all.reconciles.extend(e.reconciles);
            all.decisions.extend(e.decisions);
            all.journal.extend(e.journal);
            all.writes.extend(e.writes);
        }
        all
    }

    fn record(&self, key: &str) -> core::EffectRecord {
        self.task
            .store()
            .effect(key)
            .unwrap()
            .expect("record exists")
    }

    /// An outcome from the connector `key`'s effect was dispatched to.
    fn outcome(&mut self, key: &str, epoch: i64, kind: OutcomeKind) -> Effects {
        let mut o = sample::outcome(key, epoch, kind, "ledger says so");
        o.connector = self.record(key).connector;
        self.feed(Input::Outcome(o))
    }

    /// A connector's answer to reconcile round `round` (or to none) of `key`'s attempt `epoch`.
    fn reconciled(
        &mut self,
        key: &str,
        epoch: i64,
        kind: OutcomeKind,
        round: Option<i32>,
    ) -> Effects {
        let mut o = sample::outcome(key, epoch, kind, "looked it up");
        o.connector = self.record(key).connector;
        o.reconcile_round = round;
        o.outcome_id = format!("{}/r{round:?}", o.outcome_id);
        self.feed(Input::Outcome(o))
    }

    /// An operator control issued now (settle, cancel) for `key`.
    fn control(&mut self, id: &str, kind: ControlKind, key: Option<&str>) -> Effects {
        let c = sample::control(id, kind, key, self.now);
        self.feed(Input::Control(c))
    }
}

fn decision(e: &Effects) -> &Decision {
    assert_eq!(
        e.decisions.len(),
        1,
        "expected one decision: {:#?}",
        e.decisions
    );
    &e.decisions[0]
}

fn assert_verdict(e: &Effects, verdict: Verdict, reason: Reason) {
    let d = decision(e);
    assert_eq!((d.verdict, d.reason), (verdict, reason), "{}", d.detail);
}

fn hash_of(e: &Effects) -> String {
    e.decisions[0]
        .arguments_hash
        .clone()
        .expect("bound decision")
}

// ------------------------------------------------------------------------------------------
// Scenarios. Each returns the decisions it saw, for the coverage test at the bottom.

fn small_refund_dispatches_once_and_commits() -> Vec<Decision> {
    let mut w = World::new();
    let p = sample::refund("refund:txn_1", 500, w.now);
    let e = w.propose(&p);
    assert_verdict(&e, Verdict::Accepted, Reason::AutoApproved);
    assert_eq!(e.dispatches.len(), 1);
    let cmd = &e.dispatches[0];
    assert_eq!((cmd.epoch, cmd.connector.as_str()), (1, "ledger"));
    assert_eq!(cmd.arguments_hash, hash_of(&e));
    assert_eq!(
        cmd.idempotency_key,
        core::canonical::idempotency_key("refund:txn_1")
    );
    assert!(cmd.attempt_deadline_at <= p.deadline_at);
    assert_eq!(e.journal[0].kind, JournalKind::DispatchIntent);

    let started = w.outcome("refund:txn_1", 1, OutcomeKind::AttemptStarted);
    assert!(started.decisions.is_empty());
    assert_eq!(
        w.record("refund:txn_1").effect_state(),
        EffectState::InFlight
    );

    let committed = w.outcome("refund:txn_1", 1, OutcomeKind::Committed);
    assert_verdict(&committed, Verdict::Committed, Reason::OutcomeCommitted);
    assert!(committed.decisions[0].receipt.is_some());
    // A duplicate outcome is a no-op.
    assert!(
        w.outcome("refund:txn_1", 1, OutcomeKind::Committed)
            .is_empty()
    );
    w.seen
}

fn duplicate_proposal_dispatches_once() -> Vec<Decision> {
    let mut w = World::new();
    let p = sample::refund("refund:dup", 500, w.now);
    assert_eq!(w.propose(&p).dispatches.len(), 1);
    // Producer-side resend (same proposal id): the same reply again, nothing else.
    let again = w.propose(&p);
    assert_verdict(&again, Verdict::Accepted, Reason::AutoApproved);
    assert!(again.dispatches.is_empty() && again.journal.is_empty() && again.writes.is_empty());
    // Agent-side retry (new proposal id) while the attempt is open: IN_PROGRESS.
    let retry = w.propose(&sample::resend(&p, 1));
    assert_verdict(&retry, Verdict::InProgress, Reason::AttemptInProgress);
    assert!(retry.dispatches.is_empty());
    w.outcome("refund:dup", 1, OutcomeKind::AttemptStarted);
    let retry = w.propose(&sample::resend(&p, 2));
    assert_verdict(&retry, Verdict::InProgress, Reason::AttemptInProgress);
    // After COMMITTED: DUPLICATE with the original receipt.
    let c = w.outcome("refund:dup", 1, OutcomeKind::Committed);
    let receipt = c.decisions[0].receipt.clone();
    let dup = w.propose(&sample::resend(&p, 3));
    assert_verdict(&dup, Verdict::Duplicate, Reason::AlreadyCommitted);
    assert_eq!(dup.decisions[0].receipt, receipt);
    assert!(dup.dispatches.is_empty());
    w.seen
}

fn changed_arguments_conflict_in_every_state() -> Vec<Decision> {
    let mut w = World::new();
    // DISPATCHED
    let p = sample::refund("refund:c1", 500, w.now);
    let bound = hash_of(&w.propose(&p));
    let changed = ToolProposal {
        proposal_id: "changed-1".into(),
        arguments_json: sample::money_arguments("acme", "acct-42", 501, "EUR"),
        ..p.clone()
    };
    let e = w.propose(&changed);
    assert_verdict(&e, Verdict::Conflict, Reason::HashConflict);
    assert!(e.dispatches.is_empty());
    // COMMITTED
    w.outcome("refund:c1", 1, OutcomeKind::Committed);
    let e = w.propose(&ToolProposal {
        proposal_id: "changed-2".into(),
        ..changed.clone()
    });
    assert_verdict(&e, Verdict::Conflict, Reason::HashConflict);
    // The refusal names nothing of the intent the key is bound to.
    let detail = &e.decisions[0].detail;
    assert!(!detail.contains(&bound), "{detail}");
    // Another tool with the very same arguments under a committed key: not a duplicate of it.
    let debit = w.propose(&ToolProposal {
        proposal_id: "changed-tool".into(),
        tool: "debit".into(),
        ..p.clone()
    });
    assert_verdict(&debit, Verdict::Conflict, Reason::HashConflict);
    assert_eq!(debit.decisions[0].receipt, None);
    assert!(debit.dispatches.is_empty());
    // AWAITING_APPROVAL
    let big = sample::refund("refund:c2", 50_000, w.now);
    w.propose(&big);
    let e = w.propose(&ToolProposal {
        proposal_id: "changed-3".into(),
        arguments_json: sample::money_arguments("acme", "acct-42", 50_001, "EUR"),
        ..big
    });
    assert_verdict(&e, Verdict::Conflict, Reason::HashConflict);
    // Key order and whitespace are not a change: same canonical hash.
    let reordered = ToolProposal {
        proposal_id: "reordered".into(),
        arguments_json: r#"{ "amount": {"currency":"EUR","minor_units":500}, "account_id":"acct-42", "tenant_id":"acme" }"#.into(),
        ..p
    };
    assert_verdict(
        &w.propose(&reordered),
        Verdict::Duplicate,
        Reason::AlreadyCommitted,
    );
    w.seen
}

fn lost_response_is_unknown_then_ambiguous_then_reconciled() -> Vec<Decision> {
    let mut w = World::new();
    let p = sample::refund("refund:lost", 700, w.now);
    let cmd = w.propose(&p).dispatches[0].clone();
    w.outcome("refund:lost", 1, OutcomeKind::AttemptStarted);
    // No outcome by the attempt deadline + grace: UNKNOWN, never FAILED; reconcile round 1.
    let e = w.advance_to(cmd.attempt_deadline_at + 5_000);
    assert_verdict(&e, Verdict::Unknown, Reason::AttemptTimedOut);
    assert_eq!(e.reconciles.len(), 1);
    assert_eq!(e.reconciles[0].idempotency_key, cmd.idempotency_key);
    // The agent's blind retry is held.
    let blind = w.propose(&sample::resend(&p, 1));
    assert_verdict(&blind, Verdict::Ambiguous, Reason::OutcomeUnknown);
    assert!(blind.dispatches.is_empty());
    // Reconciliation finds the debit.
    let r = w.outcome("refund:lost", 1, OutcomeKind::ReconciledCommitted);
    assert_verdict(&r, Verdict::Committed, Reason::Reconciled);
    assert_eq!(w.record("refund:lost").attempts, 1);
    w.seen
}

fn connector_unknown_reconciles_until_operator_settles() -> Vec<Decision> {
    let mut w = World::new();
    let p = sample::refund("refund:unk", 900, w.now);
    w.propose(&p);
    let e = w.outcome("refund:unk", 1, OutcomeKind::Unknown);
    assert_verdict(&e, Verdict::Unknown, Reason::OutcomeUnknown);
    // The call may still land until the attempt's deadline: no lookup before it.
    assert!(e.reconciles.is_empty());
    let State::Unknown {
        next_reconcile_at, ..
    } = w.record("refund:unk").state
    else {
        panic!("expected UNKNOWN");
    };
    assert_eq!(
        next_reconcile_at,
        w.record("refund:unk").deadline_at.min(T0 + 10_000)
    );
    let first = w.advance_to(next_reconcile_at);
    assert_eq!(first.reconciles.len(), 1);
    // RECONCILED_UNKNOWN changes nothing; the rounds go on by timer (3 rounds in the config).
    let still = w.outcome("refund:unk", 1, OutcomeKind::ReconciledUnknown);
    assert!(still.decisions.is_empty() && still.writes.is_empty());
    let mut rounds = 1;
    let mut operator = None;
    for _ in 0..10 {
        let Some((due, _)) = w.record("refund:unk").next_timer() else {
            break;
        };
        let e = w.advance_to(due);
        rounds += e.reconciles.len();
        if let Some(d) = e.decisions.first() {
            operator = Some(d.clone());
        }
    }
    assert_eq!(rounds, 3);
    let d = operator.expect("the budget ends in OPERATOR_REQUIRED");
    assert_eq!(
        (d.verdict, d.reason),
        (Verdict::Unknown, Reason::OperatorRequired)
    );
    assert_eq!(
        w.record("refund:unk").effect_state(),
        EffectState::OperatorRequired
    );
    // Held while UNKNOWN: no timer at all, so it is never purged nor guessed.
    assert_eq!(w.record("refund:unk").next_timer(), None);
    let e = w.control("settle-1", ControlKind::SettleCommitted, Some("refund:unk"));
    assert_eq!(
        e.decisions.len(),
        2,
        "reply to the operator and to the proposal"
    );
    assert!(
        e.decisions
            .iter()
            .all(|d| d.verdict == Verdict::Committed && d.reason == Reason::OperatorSettled)
    );
    assert_eq!(e.journal[0].principal_id.as_deref(), Some("operator-olga"));
    let settled = w.record("refund:unk");
    // The operator's tool sends the same control again: answered DUPLICATE under the same
    // decision id, nothing changes, the proposal gets no second reply.
    let e = w.control("settle-1", ControlKind::SettleCommitted, Some("refund:unk"));
    assert_eq!(e.decisions.len(), 1, "{:?}", e.decisions);
    let d = &e.decisions[0];
    assert_eq!(
        (d.decision_id.as_str(), d.in_reply_to.as_str()),
        ("c/settle-1", "settle-1")
    );
    assert_eq!(
        (d.verdict, d.reason),
        (Verdict::Duplicate, Reason::OperatorSettled)
    );
    assert_eq!(d.state, Some(EffectState::Committed));
    assert!(e.writes.is_empty() && e.dispatches.is_empty());
    assert_eq!(w.record("refund:unk"), settled);
    // Another control on the closed intent is refused.
    let e = w.control("settle-2", ControlKind::SettleFailed, Some("refund:unk"));
    assert_verdict(&e, Verdict::Rejected, Reason::IntentClosed);
    assert_eq!(w.record("refund:unk"), settled);
    w.seen
}

fn proven_failure_retries_with_a_new_epoch() -> Vec<Decision> {
    let mut w = World::new();
    let p = sample::refund("refund:fail", 800, w.now);
    w.propose(&p);
    let e = w.outcome("refund:fail", 1, OutcomeKind::Failed);
    assert!(
        e.decisions.is_empty(),
        "a retry is scheduled, the failure is not final"
    );
    let State::Failed {
        retry_at: Some(at), ..
    } = w.record("refund:fail").state
    else {
        panic!("expected a scheduled retry");
    };
    let e = w.advance_to(at);
    assert_verdict(&e, Verdict::Accepted, Reason::RetryAfterFailure);
    assert_eq!(e.dispatches[0].epoch, 2);
    // The stale epoch's late outcome changes nothing.
    let stale = w.outcome("refund:fail", 1, OutcomeKind::Failed);
    assert!(stale.decisions.is_empty() && stale.writes.is_empty());
    assert_eq!(stale.journal[0].kind, JournalKind::OutcomeIgnored);
    // Fail again, then exhaust the budget: attempts 3 of 3, then final FAILED.
    w.outcome("refund:fail", 2, OutcomeKind::Failed);
    let State::Failed {
        retry_at: Some(at), ..
    } = w.record("refund:fail").state
    else {
        panic!("expected a second retry");
    };
    assert_eq!(w.advance_to(at).dispatches[0].epoch, 3);
    let e = w.outcome("refund:fail", 3, OutcomeKind::Failed);
    assert_verdict(&e, Verdict::Failed, Reason::OutcomeFailed);
    // A re-proposal after the final failure: the attempt ceiling refuses.
    let again = w.propose(&sample::resend(&p, 9));
    assert_verdict(&again, Verdict::Rejected, Reason::AttemptsExhausted);
    // A commit of an older epoch after a newer one was dispatched: double-effect alert.
    let alert = w.outcome("refund:fail", 1, OutcomeKind::Committed);
    assert_eq!(alert.journal[0].kind, JournalKind::DoubleEffectAlert);
    assert!(alert.writes.is_empty());
    w.seen
}

fn reproposal_after_proven_failure_is_a_new_attempt() -> Vec<Decision> {
    let mut w = World::new();
    let p = sample::refund("refund:again", 800, w.now);
    w.propose(&p);
    w.outcome("refund:again", 1, OutcomeKind::Failed);
    let e = w.propose(&sample::resend(&p, 1));
    assert_verdict(&e, Verdict::Accepted, Reason::RetryAfterFailure);
    assert_eq!(e.dispatches[0].epoch, 2);
    // The scheduled retry timer is superseded and fires nothing.
    let e = w.advance_to(w.now + 60_000);
    assert!(e.dispatches.is_empty());
    w.seen
}

/// A retry proposed by another principal is that principal's attempt: it cannot approve it,
/// nor can the intent's first requester, and the dispatch carries the retry's requester.
fn no_requester_of_a_retried_intent_approves_it() -> Vec<Decision> {
    let mut w = World::new();
    let p = sample::refund("refund:retried", 50_000, w.now);
    let hash = hash_of(&w.propose(&p));
    let first = sample::approval(&p, &hash, "alice", ApprovalVerdict::Approve, w.now);
    assert_eq!(w.feed(Input::Approval(first)).dispatches.len(), 1);
    w.outcome("refund:retried", 1, OutcomeKind::Failed);

    // bob, an agent who is also a finance approver, proposes the retry.
    let retry = ToolProposal {
        principal_id: "bob".into(),
        ..sample::resend(&p, 1)
    };
    assert_verdict(
        &w.propose(&retry),
        Verdict::PendingApproval,
        Reason::ApprovalRequired,
    );
    for (id, requester) in [("by-bob", "bob"), ("by-agent", "agent-support-1")] {
        let own = Approval {
            approval_id: id.into(),
            ..sample::approval(&p, &hash, requester, ApprovalVerdict::Approve, w.now)
        };
        let e = w.feed(Input::Approval(own));
        assert_verdict(&e, Verdict::Rejected, Reason::SelfApproval);
        assert!(e.dispatches.is_empty());
    }
    let other = Approval {
        approval_id: "by-alice-again".into(),
        ..sample::approval(&p, &hash, "alice", ApprovalVerdict::Approve, w.now)
    };
    let e = w.feed(Input::Approval(other));
    assert_eq!(e.dispatches.len(), 1, "{:?}", e.decisions);
    assert_eq!(e.dispatches[0].epoch, 2);
    assert_eq!(e.dispatches[0].principal_id, "bob");
    w.seen
}

fn no_proof_of_failure_while_the_attempt_may_run() -> Vec<Decision> {
    let mut w = World::new();
    let p = sample::refund("refund:running", 700, w.now);
    let cmd = w.propose(&p).dispatches[0].clone();
    w.outcome("refund:running", 1, OutcomeKind::AttemptStarted);
    let running = w.record("refund:running");
    // Whoever writes the outcomes topic says "reconciled: it failed" while the call runs: no
    // round was asked, so it changes nothing and no second epoch is dispatched.
    for round in [None, Some(1)] {
        let e = w.reconciled("refund:running", 1, OutcomeKind::ReconciledFailed, round);
        assert!(e.writes.is_empty() && e.dispatches.is_empty() && e.decisions.is_empty());
        assert_eq!(e.journal[0].kind, JournalKind::OutcomeIgnored);
        assert!(
            e.journal[0]
                .evidence
                .as_deref()
                .is_some_and(|x| x.contains("no such round was asked")),
            "{:?}",
            e.journal[0].evidence
        );
    }
    // An outcome from another connector than the one the effect was dispatched to.
    let mut other = sample::outcome("refund:running", 1, OutcomeKind::Failed, "not mine");
    other.connector = "http".into();
    let e = w.feed(Input::Outcome(other));
    assert!(e.writes.is_empty() && e.dispatches.is_empty() && e.decisions.is_empty());
    assert!(
        e.journal[0]
            .evidence
            .as_deref()
            .is_some_and(|x| x.contains("the effect was dispatched to \"ledger\"")),
        "{:?}",
        e.journal[0].evidence
    );
    // Nor may an operator settle it FAILED while it may still land.
    let e = w.control(
        "settle-early",
        ControlKind::SettleFailed,
        Some("refund:running"),
    );
    assert_verdict(&e, Verdict::Rejected, Reason::IntentClosed);
    assert_eq!(w.record("refund:running"), running);
    // Once the attempt timed out, round 1 is asked: an answer for round 2 still counts for
    // nothing, the answer to round 1 is the proof.
    let e = w.advance_to(cmd.attempt_deadline_at + 5_000);
    assert_eq!(e.reconciles.len(), 1);
    let e = w.reconciled("refund:running", 1, OutcomeKind::ReconciledFailed, Some(2));
    assert!(e.writes.is_empty() && e.dispatches.is_empty());
    let e = w.reconciled("refund:running", 1, OutcomeKind::ReconciledFailed, Some(1));
    assert_eq!(e.writes.len(), 1);
    assert_eq!(
        w.record("refund:running").effect_state(),
        EffectState::Failed
    );
    // A later round's lookup finds the refund after all: what happened wins over the failure,
    // before any retry could run.
    let e = w.reconciled(
        "refund:running",
        1,
        OutcomeKind::ReconciledCommitted,
        Some(1),
    );
    assert_verdict(&e, Verdict::Committed, Reason::Reconciled);
    assert_eq!(
        w.record("refund:running").effect_state(),
        EffectState::Committed
    );
    w.seen
}

fn a_reused_proposal_id_gets_no_one_elses_reply() -> Vec<Decision> {
    let mut w = World::new();
    let p = sample::refund("refund:first", 700, w.now);
    let first = w.propose(&p);
    assert_verdict(&first, Verdict::Accepted, Reason::AutoApproved);
    // The producer's resend gets the same reply under the same decision id.
    let first = decision(&first).clone();
    let same = |e: &Effects| {
        let d = decision(e);
        (d.decision_id == first.decision_id)
            && (d.verdict, d.reason, &d.arguments_hash)
                == (first.verdict, first.reason, &first.arguments_hash)
    };
    assert!(same(&w.propose(&p)));
    // Another proposal under the same id (another key, another principal): refused, with
    // nothing of the first proposal's reply, and the first's reply stays the id's.
    let squatter = ToolProposal {
        operation_key: "refund:other".into(),
        principal_id: "agent-billing-2".into(),
        ..p.clone()
    };
    let e = w.propose(&squatter);
    assert_verdict(&e, Verdict::Conflict, Reason::HashConflict);
    let d = decision(&e);
    assert_ne!(d.decision_id, first.decision_id);
    assert_eq!(d.operation_key, "refund:other");
    assert!(d.arguments_hash.is_none() && d.receipt.is_none() && d.epoch.is_none());
    assert!(e.writes.is_empty() && e.dispatches.is_empty());
    assert!(same(&w.propose(&p)));
    w.seen
}

fn another_tenant_under_a_key_learns_nothing_and_changes_nothing() -> Vec<Decision> {
    let mut w = World::new();
    let p = sample::refund("refund:k-1", 700, w.now);
    assert_verdict(&w.propose(&p), Verdict::Accepted, Reason::AutoApproved);
    let bound = w.record("refund:k-1");
    // globex's agent proposes its own refund under acme's key.
    let squat = ToolProposal {
        proposal_id: "globex-1".into(),
        tenant_id: "globex".into(),
        principal_id: "agent-globex-1".into(),
        arguments_json: sample::money_arguments("globex", "acct-7", 700, "EUR"),
        ..p.clone()
    };
    let e = w.propose(&squat);
    assert_verdict(&e, Verdict::Conflict, Reason::HashConflict);
    let d = decision(&e);
    assert!(
        d.receipt.is_none() && d.state.is_none() && d.epoch.is_none(),
        "{d:?}"
    );
    assert!(
        !d.detail.contains(&bound.arguments_hash) && !d.detail.contains("acme"),
        "{}",
        d.detail
    );
    assert!(e.dispatches.is_empty());
    assert_eq!(w.record("refund:k-1"), bound);
    // An approval under globex's name for acme's intent is answered as one for a key nobody
    // used: not its state, run or approvals.
    let now = w.now;
    let approval = |key: &str| Approval {
        approval_id: format!("globex-approval-{key}"),
        tenant_id: "globex".into(),
        ..sample::approval(
            &p,
            &bound.arguments_hash,
            "operator-globex",
            ApprovalVerdict::Approve,
            now,
        )
    };
    let unused = w.feed(Input::Approval(Approval {
        operation_key: "refund:nobody".into(),
        ..approval("refund:nobody")
    }));
    let e = w.feed(Input::Approval(approval("refund:k-1")));
    let (d, nobody) = (decision(&e), decision(&unused));
    assert_eq!((d.verdict, d.reason), (nobody.verdict, nobody.reason));
    assert_eq!(d.reason, Reason::NoPendingApproval);
    assert_eq!(
        d.detail,
        nobody.detail.replace("refund:nobody", "refund:k-1")
    );
    assert!(
        d.state.is_none() && d.run_id.is_none() && d.receipt.is_none(),
        "{d:?}"
    );
    assert!(e.writes.is_empty() && e.dispatches.is_empty());
    assert_eq!(w.record("refund:k-1"), bound);
    // An outcome for a key nobody proposed: journaled as evidence, nothing else.
    let e = w.feed(Input::Outcome(sample::outcome(
        "refund:nobody",
        1,
        OutcomeKind::Committed,
        "made up",
    )));
    assert!(e.decisions.is_empty() && e.writes.is_empty() && e.dispatches.is_empty());
    assert_eq!(e.journal[0].kind, JournalKind::OutcomeIgnored);
    // A lease fence without its run: refused as malformed.
    let e = w.control("fence-x", ControlKind::LeaseFence, None);
    assert_verdict(&e, Verdict::Rejected, Reason::Malformed);
    w.seen
}

/// With `processor.key_scope = "tenant"` a tenant's operation keys, run ids and proposal ids
/// are its own: another tenant can neither take one before it is used (the proposal is
/// refused and not remembered) nor raise its run's fence, and the same key under two tenants
/// is two intents with two idempotency keys.
fn tenant_scoped_ids_belong_to_their_tenant() -> Vec<Decision> {
    let mut w = World::with(core::Config {
        key_scope: core::KeyScope::Tenant,
        ..core::Config::default()
    });
    let now = w.now;
    let (acme, globex) = sample::tenant_refunds("refund:k-1", now);
    // globex's agent, before acme uses them: acme's key, acme's proposal id, acme's run (at a
    // fence meant to lock acme out), a tenant id that could pass for a prefix, a bare prefix.
    let squats = [
        ToolProposal {
            operation_key: acme.operation_key.clone(),
            ..globex.clone()
        },
        ToolProposal {
            proposal_id: acme.proposal_id.clone(),
            ..globex.clone()
        },
        ToolProposal {
            run_id: acme.run_id.clone(),
            lease_fence: 99,
            ..globex.clone()
        },
        ToolProposal {
            tenant_id: "acme/x".into(),
            operation_key: "acme/x/refund:k-1".into(),
            ..globex.clone()
        },
        ToolProposal {
            operation_key: "globex/".into(),
            ..globex.clone()
        },
        // globex's agent naming acme as its tenant, with acme's ids and arguments.
        ToolProposal {
            principal_id: globex.principal_id.clone(),
            ..acme.clone()
        },
    ];
    for squat in &squats {
        let e = w.propose(squat);
        assert_verdict(&e, Verdict::Rejected, Reason::TenantMismatch);
        let d = decision(&e);
        assert!(d.decision_id.starts_with("r/"), "{d:?}");
        assert!(d.detail.contains("key_scope"), "{}", d.detail);
        assert!(e.writes.is_empty() && e.dispatches.is_empty(), "{e:?}");
        assert!(e.journal.iter().all(|j| j.proposal_id.is_none()), "{e:?}");
    }
    // acme's own proposal is decided as if nobody had tried.
    let e = w.propose(&acme);
    assert_verdict(&e, Verdict::Accepted, Reason::AutoApproved);
    assert_eq!(decision(&e).decision_id, "p/acme/p-1");
    let acme_dispatch = e.dispatches[0].clone();
    // The same key under globex's prefix is globex's own intent.
    let e = w.propose(&globex);
    assert_verdict(&e, Verdict::Accepted, Reason::AutoApproved);
    assert_ne!(
        e.dispatches[0].idempotency_key,
        acme_dispatch.idempotency_key
    );
    assert_eq!(w.record("acme/refund:k-1").tenant_id, "acme");
    assert_eq!(w.record("globex/refund:k-1").tenant_id, "globex");
    // Only acme's principals raise the fence of an acme run: globex's operator cannot lock
    // acme's agents out; acme's operator can.
    let fence = |id: &str, operator: &str, fence: i64| {
        let mut c = sample::control(id, ControlKind::LeaseFence, None, now);
        c.run_id = Some("acme/run-1".into());
        c.lease_fence = Some(fence);
        c.operator_id = operator.into();
        Input::Control(c)
    };
    let e = w.feed(fence("fence-globex", "operator-globex", 99));
    assert_verdict(&e, Verdict::Rejected, Reason::TenantMismatch);
    assert!(e.writes.is_empty(), "{e:?}");
    let next = ToolProposal {
        proposal_id: "acme/p-2".into(),
        ..sample::refund("acme/refund:k-2", 700, now)
    };
    let next = ToolProposal {
        run_id: acme.run_id.clone(),
        ..next
    };
    assert_verdict(&w.propose(&next), Verdict::Accepted, Reason::AutoApproved);
    let e = w.feed(fence("fence-acme", "operator-olga", 5));
    assert_verdict(&e, Verdict::Recorded, Reason::FenceAdvanced);
    // globex's operator approving or settling acme's intent, naming acme as the tenant, is
    // answered as for a key nobody used.
    let e = w.feed(Input::Approval(Approval {
        approval_id: "acme/approval-x".into(),
        ..sample::approval(
            &acme,
            &acme_dispatch.arguments_hash,
            "operator-globex",
            ApprovalVerdict::Approve,
            now,
        )
    }));
    assert_verdict(&e, Verdict::Rejected, Reason::NoPendingApproval);
    let d = decision(&e);
    assert!(d.state.is_none() && d.run_id.is_none(), "{d:?}");
    let mut settle = sample::control(
        "settle-x",
        ControlKind::SettleFailed,
        Some("acme/refund:k-1"),
        now,
    );
    settle.operator_id = "operator-globex".into();
    let e = w.feed(Input::Control(settle));
    assert_verdict(&e, Verdict::Rejected, Reason::NoPendingApproval);
    let d = decision(&e);
    assert!(d.state.is_none() && d.epoch.is_none(), "{d:?}");
    assert_eq!(d.detail, "no intent for operation key acme/refund:k-1");
    w.seen
}

fn non_idempotent_tool_is_never_retried() -> Vec<Decision> {
    let mut w = World::new();
    let p = ToolProposal {
        tool: "send_email".into(),
        arguments_json: serde_json::json!({
            "tenant_id": "acme", "to": "ops@example.com", "subject": "hi", "body": "hello"
        })
        .to_string(),
        ..sample::refund("email:1", 1, w.now)
    };
    assert_verdict(&w.propose(&p), Verdict::Accepted, Reason::AutoApproved);
    let e = w.outcome("email:1", 1, OutcomeKind::Failed);
    assert_verdict(&e, Verdict::Failed, Reason::OutcomeFailed);
    let again = w.propose(&sample::resend(&p, 1));
    assert_verdict(&again, Verdict::Rejected, Reason::RetryNotAllowed);
    // Not reconcilable either: an UNKNOWN goes straight to an operator.
    let p2 = ToolProposal {
        proposal_id: "email-2".into(),
        operation_key: "email:2".into(),
        ..p
    };
    let cmd = w.propose(&p2).dispatches[0].clone();
    let e = w.outcome("email:2", 1, OutcomeKind::Unknown);
    assert!(e.reconciles.is_empty());
    assert_eq!(
        w.record("email:2").effect_state(),
        EffectState::OperatorRequired
    );
    // Until its command expires the email may still go out: FAILED would be a guess.
    let e = w.control("settle-early", ControlKind::SettleFailed, Some("email:2"));
    assert_verdict(&e, Verdict::Rejected, Reason::IntentClosed);
    w.now = cmd.attempt_deadline_at;
    let e = w.control("settle-email", ControlKind::SettleFailed, Some("email:2"));
    assert_eq!(e.decisions[0].verdict, Verdict::Failed);
    w.seen
}

fn validation_refusals_in_order() -> Vec<Decision> {
    let mut w = World::new();
    let base = sample::refund("refund:v", 500, w.now);
    let cases: Vec<(ToolProposal, Verdict, Reason)> = vec![
        (ToolProposal { operation_key: String::new(), ..base.clone() }, Verdict::Rejected, Reason::Malformed),
        (ToolProposal { run_id: "r".repeat(600), ..base.clone() }, Verdict::Rejected, Reason::Oversized),
        (ToolProposal { arguments_json: format!("{{\"memo\":\"{}\"}}", "x".repeat(20_000)), ..base.clone() }, Verdict::Rejected, Reason::ArgumentsTooLarge),
        (ToolProposal { tool: "launch_rocket".into(), ..base.clone() }, Verdict::Rejected, Reason::UnknownTool),
        (ToolProposal { tool_version: "7".into(), ..base.clone() }, Verdict::Rejected, Reason::UnknownToolVersion),
        (ToolProposal { arguments_json: r#"{"tenant_id":"acme","account_id":"a","amount":{"minor_units":12.5,"currency":"EUR"}}"#.into(), ..base.clone() }, Verdict::Rejected, Reason::ArgumentsInvalid),
        (ToolProposal { arguments_json: r#"{"tenant_id":"acme","account_id":"a"}"#.into(), ..base.clone() }, Verdict::Rejected, Reason::ArgumentsSchemaViolation),
        (ToolProposal { arguments_hash: Some("00".repeat(32)), ..base.clone() }, Verdict::Rejected, Reason::ArgumentsHashMismatch),
        (ToolProposal { arguments_json: sample::money_arguments("globex", "acct-42", 500, "EUR"), ..base.clone() }, Verdict::Rejected, Reason::TenantMismatch),
        (ToolProposal { arguments_json: sample::money_arguments("acme", "acct-42", 2_000_000, "EUR"), ..base.clone() }, Verdict::Rejected, Reason::InvariantViolated),
        (ToolProposal { arguments_json: sample::money_arguments("acme", "acct-42", 500, "JPY"), ..base.clone() }, Verdict::Rejected, Reason::InvariantViolated),
        (ToolProposal { arguments_json: sample::money_arguments("acme", "acct-42", 600_000, "EUR"), ..base.clone() }, Verdict::Denied, Reason::PolicyDenied),
        (ToolProposal { principal_id: "agent-globex-1".into(), ..base.clone() }, Verdict::Denied, Reason::PolicyDenied),
        (ToolProposal { principal_id: "mallory".into(), ..base.clone() }, Verdict::Denied, Reason::PolicyDenied),
        (ToolProposal { principal_id: "nobody-registered".into(), ..base.clone() }, Verdict::Denied, Reason::PolicyDenied),
        (ToolProposal { deadline_at: w.now, ..base.clone() }, Verdict::Rejected, Reason::DeadlineExpired),
    ];
    for (i, (mut p, verdict, reason)) in cases.into_iter().enumerate() {
        p.proposal_id = format!("v-{i}");
        let e = w.propose(&p);
        assert_verdict(&e, verdict, reason);
        assert!(e.dispatches.is_empty(), "case {i} dispatched");
        assert!(
            e.writes
                .iter()
                .all(|w| matches!(w, core::Write::Proposal { .. })),
            "case {i}: a refusal reserves nothing"
        );
    }
    // A correct agent-computed hash is accepted.
    let canonical = core::canonical::canonicalize(&base.arguments_json).unwrap();
    let ok = ToolProposal {
        arguments_hash: Some(canonical.hash),
        ..base
    };
    assert_verdict(&w.propose(&ok), Verdict::Accepted, Reason::AutoApproved);
    w.seen
}

fn resource_must_be_bound() -> Vec<Decision> {
    let dir = sample::config_dir();
    let registry = Registry::from_toml_str(
        r#"
[[tool]]
name = "refund"
version = "1"
connector = "ledger"
arguments_schema = '{"type":"object"}'
tenant_argument = "/tenant_id"
resource_argument = "/account_id"
[tool.contract]
idempotent_by_key = true
reconcilable = true
"#,
        &dir,
    )
    .unwrap();
    let policy = airlock_processor::core::policy::Policy::load(
        &dir.join("policies.cedar"),
        &dir.join("entities.json"),
    )
    .unwrap();
    let mut w = World::over(Arc::new(Core::new(
        registry,
        policy,
        core::Config::default(),
    )));
    let p = ToolProposal {
        arguments_json: r#"{"tenant_id":"acme","amount":{"minor_units":5,"currency":"EUR"}}"#
            .into(),
        ..sample::refund("refund:unbound", 5, w.now)
    };
    assert_verdict(&w.propose(&p), Verdict::Rejected, Reason::ResourceUnbound);
    w.seen
}

fn approval_flow_binds_hash_and_needs_an_entitled_other_person() -> Vec<Decision> {
    let mut w = World::new();
    let p = ToolProposal {
        principal_id: "bob".into(), // an agent who is also a finance approver
        ..sample::refund("refund:big", 50_000, w.now)
    };
    let e = w.propose(&p);
    assert_verdict(&e, Verdict::PendingApproval, Reason::ApprovalRequired);
    assert!(e.dispatches.is_empty());
    let hash = hash_of(&e);
    // Re-proposing while pending.
    let e2 = w.propose(&sample::resend(&p, 1));
    assert_verdict(&e2, Verdict::PendingApproval, Reason::AwaitingApproval);

    let mut a = sample::approval(
        &p,
        &"ab".repeat(32),
        "alice",
        ApprovalVerdict::Approve,
        w.now,
    );
    let e = w.feed(Input::Approval(a.clone()));
    assert_verdict(&e, Verdict::Rejected, Reason::ApprovalHashMismatch);
    // The refusal tells the sender nothing of the intent's arguments.
    assert!(
        !decision(&e).detail.contains(&hash),
        "{}",
        decision(&e).detail
    );
    a.approval_id = "a-2".into();
    a.arguments_hash = hash.clone();
    a.expires_at = w.now;
    assert_verdict(
        &w.feed(Input::Approval(a.clone())),
        Verdict::Rejected,
        Reason::ApprovalExpired,
    );
    let own = sample::approval(&p, &hash, "bob", ApprovalVerdict::Approve, w.now);
    assert_verdict(
        &w.feed(Input::Approval(own)),
        Verdict::Rejected,
        Reason::SelfApproval,
    );
    let rogue = sample::approval(&p, &hash, "mallory", ApprovalVerdict::Approve, w.now);
    assert_verdict(
        &w.feed(Input::Approval(rogue)),
        Verdict::Rejected,
        Reason::ApproverNotEntitled,
    );
    let wrong_team = sample::approval(&p, &hash, "carol", ApprovalVerdict::Approve, w.now);
    assert_verdict(
        &w.feed(Input::Approval(wrong_team)),
        Verdict::Rejected,
        Reason::ApproverNotEntitled,
    );

    let good = sample::approval(&p, &hash, "alice", ApprovalVerdict::Approve, w.now);
    let e = w.feed(Input::Approval(good.clone()));
    assert_eq!(e.dispatches.len(), 1, "quorum 1 reached: dispatched");
    let to_proposal = e
        .decisions
        .iter()
        .find(|d| d.in_reply_to == p.proposal_id)
        .unwrap();
    assert_eq!(
        (to_proposal.verdict, to_proposal.reason),
        (Verdict::Accepted, Reason::Approved)
    );
    let to_approver = e
        .decisions
        .iter()
        .find(|d| d.in_reply_to == good.approval_id)
        .unwrap();
    assert_eq!(to_approver.reason, Reason::ApprovalRecorded);
    // Single use: the same approval again is a duplicate and dispatches nothing.
    let again = w.feed(Input::Approval(good));
    assert_verdict(&again, Verdict::Duplicate, Reason::ApprovalDuplicate);
    assert!(again.dispatches.is_empty());
    // An approval for a key that is not waiting.
    let late = sample::approval(&p, &hash, "bob2", ApprovalVerdict::Approve, w.now);
    assert_verdict(
        &w.feed(Input::Approval(late)),
        Verdict::Rejected,
        Reason::NoPendingApproval,
    );
    w.seen
}

fn two_distinct_approvers_for_a_wire_transfer() -> Vec<Decision> {
    let mut w = World::new();
    let p = ToolProposal {
        tool: "wire_transfer".into(),
        ..sample::refund("wire:1", 900_000, w.now)
    };
    let hash = hash_of(&w.propose(&p));
    let e = w.feed(Input::Approval(sample::approval(
        &p,
        &hash,
        "alice",
        ApprovalVerdict::Approve,
        w.now,
    )));
    assert_verdict(&e, Verdict::Recorded, Reason::ApprovalRecorded);
    assert!(e.dispatches.is_empty(), "1 of 2");
    let mut again = sample::approval(&p, &hash, "alice", ApprovalVerdict::Approve, w.now);
    again.approval_id = "alice-second-click".into();
    assert_verdict(
        &w.feed(Input::Approval(again)),
        Verdict::Duplicate,
        Reason::ApprovalDuplicate,
    );
    let e = w.feed(Input::Approval(sample::approval(
        &p,
        &hash,
        "bob",
        ApprovalVerdict::Approve,
        w.now,
    )));
    assert_eq!(e.dispatches.len(), 1, "2 of 2: dispatched");
    w.seen
}

fn rejected_or_unanswered_approval_dispatches_nothing() -> Vec<Decision> {
    let mut w = World::new();
    let p = sample::refund("refund:no", 60_000, w.now);
    let hash = hash_of(&w.propose(&p));
    let e = w.feed(Input::Approval(sample::approval(
        &p,
        &hash,
        "alice",
        ApprovalVerdict::Reject,
        w.now,
    )));
    assert!(e.dispatches.is_empty());
    let to_proposal = e
        .decisions
        .iter()
        .find(|d| d.in_reply_to == p.proposal_id)
        .unwrap();
    assert_eq!(
        (to_proposal.verdict, to_proposal.reason),
        (Verdict::Denied, Reason::ApprovalRejected)
    );
    let closed = w.propose(&sample::resend(&p, 1));
    assert_verdict(&closed, Verdict::Rejected, Reason::IntentClosed);

    // Nobody answers within the approval TTL (1 h): EXPIRED, nothing dispatched.
    let p2 = ToolProposal {
        deadline_at: w.now + 3 * HOUR_MS,
        ..sample::refund("refund:quiet", 60_000, w.now)
    };
    w.propose(&p2);
    let e = w.advance_to(w.now + HOUR_MS);
    assert_verdict(&e, Verdict::Expired, Reason::ApprovalTimedOut);
    assert!(e.dispatches.is_empty());
    // An approval recorded after the window closed, read before the expiry timer fired (a
    // lagging or restarted instance): refused by its own time, nothing dispatched.
    let p_late = ToolProposal {
        deadline_at: w.now + 3 * HOUR_MS,
        ..sample::refund("refund:late", 60_000, w.now)
    };
    let hash = hash_of(&w.propose(&p_late));
    w.now += HOUR_MS + 1;
    let e = w.feed(Input::Approval(sample::approval(
        &p_late,
        &hash,
        "alice",
        ApprovalVerdict::Approve,
        w.now,
    )));
    assert_verdict(&e, Verdict::Rejected, Reason::ApprovalExpired);
    assert!(e.dispatches.is_empty());
    assert!(matches!(
        w.record("refund:late").state,
        State::AwaitingApproval { .. }
    ));
    // Its expiry timer, when it fires, expires it.
    let e = w.advance_to(w.now);
    assert_verdict(&e, Verdict::Expired, Reason::ApprovalTimedOut);
    // The intent deadline comes first: EXPIRED with DEADLINE_EXPIRED.
    let p3 = ToolProposal {
        deadline_at: w.now + 60_000,
        ..sample::refund("refund:short", 60_000, w.now)
    };
    w.propose(&p3);
    let e = w.advance_to(w.now + 60_000);
    assert_verdict(&e, Verdict::Expired, Reason::DeadlineExpired);
    // Cancelled by an operator while pending.
    let p4 = sample::refund("refund:cancel", 60_000, w.now);
    w.propose(&p4);
    let e = w.control("cancel-1", ControlKind::Cancel, Some("refund:cancel"));
    assert_eq!(e.decisions[0].verdict, Verdict::Cancelled);
    assert_eq!(e.decisions[0].reason, Reason::CancelledByOperator);
    // The same cancel again: DUPLICATE, the intent stays as the first one left it.
    let cancelled = w.record("refund:cancel");
    let e = w.control("cancel-1", ControlKind::Cancel, Some("refund:cancel"));
    assert_verdict(&e, Verdict::Duplicate, Reason::CancelledByOperator);
    assert_eq!(e.decisions[0].decision_id, "c/cancel-1");
    assert_eq!(w.record("refund:cancel"), cancelled);
    // A cancel cannot un-send a dispatched command.
    let p5 = sample::refund("refund:sent", 10, w.now);
    w.propose(&p5);
    let e = w.control("cancel-2", ControlKind::Cancel, Some("refund:sent"));
    assert_verdict(&e, Verdict::Rejected, Reason::IntentClosed);
    w.seen
}

fn stale_lease_fence_is_refused() -> Vec<Decision> {
    let mut w = World::new();
    let mut p = sample::refund("refund:f1", 100, w.now);
    p.lease_fence = 5;
    w.propose(&p);
    // The old worker of the same run, with fence 4, proposes another step.
    let mut zombie = sample::refund("refund:f2", 100, w.now);
    zombie.lease_fence = 4;
    let e = w.propose(&zombie);
    assert_verdict(&e, Verdict::Rejected, Reason::StaleFence);
    assert!(e.dispatches.is_empty());
    // A fence record on the control topic raises the fence without a proposal.
    let mut c = sample::control("fence-1", ControlKind::LeaseFence, None, w.now);
    c.run_id = Some("run-1".into());
    c.lease_fence = Some(9);
    assert_verdict(
        &w.feed(Input::Control(c)),
        Verdict::Recorded,
        Reason::FenceAdvanced,
    );
    let mut old = sample::refund("refund:f3", 100, w.now);
    old.lease_fence = 8;
    assert_verdict(&w.propose(&old), Verdict::Rejected, Reason::StaleFence);
    // A fence record below the accepted one comes from the stale owner: refused, and the
    // fence stays where it was.
    let mut stale = sample::control("fence-2", ControlKind::LeaseFence, None, w.now);
    stale.run_id = Some("run-1".into());
    stale.lease_fence = Some(7);
    let e = w.feed(Input::Control(stale));
    assert_verdict(&e, Verdict::Rejected, Reason::StaleFence);
    assert!(
        decision(&e).detail.contains("accepted fence 9"),
        "{}",
        decision(&e).detail
    );
    // Journaled under its run, so that the run's history shows the stale owner's attempt.
    assert_eq!(e.journal[0].run_id.as_deref(), Some("run-1"));
    assert_eq!(e.journal[0].lease_fence, Some(7));
    assert_verdict(&w.propose(&old), Verdict::Rejected, Reason::StaleFence);
    w.seen
}

fn run_dispatch_budget_stops_a_runaway_loop() -> Vec<Decision> {
    let mut w = World::with(core::Config {
        max_dispatches_per_run: 2,
        ..core::Config::default()
    });
    for i in 0..2 {
        let e = w.propose(&sample::refund(&format!("loop:{i}"), 10, w.now));
        assert_eq!(e.dispatches.len(), 1);
    }
    let e = w.propose(&sample::refund("loop:2", 10, w.now));
    assert_verdict(&e, Verdict::Rejected, Reason::RunBudgetExhausted);
    w.seen
}

fn settled_records_close_after_retention_and_answer_blind_retries() -> Vec<Decision> {
    let mut w = World::new();
    let purged = |e: &Effects| {
        e.journal
            .iter()
            .filter(|j| j.kind == JournalKind::RecordPurged)
            .count()
    };
    let p = sample::refund("refund:old", 10, w.now);
    w.propose(&p);
    w.outcome("refund:old", 1, OutcomeKind::Committed);
    let receipt = match w.record("refund:old").state {
        State::Committed { receipt, .. } => receipt,
        other => panic!("not committed: {other:?}"),
    };
    let (purge_at, _) = w.record("refund:old").next_timer().unwrap();
    assert_eq!(purge_at, w.now + 7 * 24 * HOUR_MS);
    w.advance_to(purge_at - 1);
    assert!(!w.record("refund:old").arguments_json.is_empty());
    let e = w.advance_to(purge_at);
    assert_eq!(
        purged(&e),
        3,
        "the effect's bulk, the proposal id and the run are purged: {:?}",
        e.journal
    );
    // What stays is a closed-intent marker: the binding, the state and the receipt.
    let marker = w.record("refund:old");
    let closed_until = purge_at + 30 * 24 * HOUR_MS;
    assert_eq!(marker.closed_until, Some(closed_until));
    assert!(marker.arguments_json.is_empty() && marker.used_approvals.is_empty());
    assert_eq!(marker.effect_state(), EffectState::Committed);
    assert_eq!(marker.next_timer(), Some((closed_until, TimerKind::Purge)));

    // An agent retrying blindly a week and a day later (a fresh proposal id, a fresh
    // deadline): answered with the commit, nothing dispatched again.
    let mut retry = sample::refund("refund:old", 10, w.now);
    retry.proposal_id = "blind-retry-1".into();
    let e = w.propose(&retry);
    assert_verdict(&e, Verdict::Duplicate, Reason::AlreadyCommitted);
    assert!(e.dispatches.is_empty());
    assert_eq!(e.decisions[0].receipt.as_deref(), Some(receipt.as_str()));
    // Other arguments under the key are still another intent.
    let mut other = sample::refund("refund:old", 11, w.now);
    other.proposal_id = "blind-retry-2".into();
    assert_verdict(&w.propose(&other), Verdict::Conflict, Reason::HashConflict);

    // A failure that was final closes the same way; the key cannot be attempted again.
    let p = ToolProposal {
        tool: "send_email".into(),
        arguments_json: serde_json::json!({
            "tenant_id": "acme", "to": "ops@example.com", "subject": "hi", "body": "hello"
        })
        .to_string(),
        ..sample::refund("email:old", 1, w.now)
    };
    w.propose(&p);
    w.outcome("email:old", 1, OutcomeKind::Failed);
    let (purge_at, _) = w.record("email:old").next_timer().unwrap();
    w.advance_to(purge_at);
    assert!(w.record("email:old").closed_until.is_some());
    let retry = ToolProposal {
        proposal_id: "email-blind-retry".into(),
        deadline_at: w.now + HOUR_MS,
        ..p
    };
    let e = w.propose(&retry);
    assert_verdict(&e, Verdict::Rejected, Reason::IntentClosed);
    assert!(e.dispatches.is_empty());

    // The marker goes at its own time; the key is free for a new intent after that.
    let e = w.advance_to(closed_until);
    assert!(purged(&e) >= 1);
    assert!(w.task.store().effect("refund:old").unwrap().is_none());
    w.seen
}

fn control_refusals() -> Vec<Decision> {
    let mut w = World::new();
    let e = w.control("c-none", ControlKind::SettleCommitted, Some("nope"));
    assert_verdict(&e, Verdict::Rejected, Reason::NoPendingApproval);
    let e = w.control("c-nokey", ControlKind::SettleFailed, None);
    assert_verdict(&e, Verdict::Rejected, Reason::Malformed);
    // Settling and cancelling are entitlements (Cedar actions `settle`, `cancel`): someone
    // without the operator role, or an operator of another tenant, changes nothing.
    let p = sample::refund("refund:held", 60_000, w.now);
    w.propose(&p);
    let pending = w.record("refund:held");
    for (id, kind, operator) in [
        ("c-mallory", ControlKind::Cancel, "mallory"),
        ("c-agent", ControlKind::SettleCommitted, "agent-support-1"),
        ("c-globex", ControlKind::Cancel, "operator-globex"),
        ("c-stranger", ControlKind::SettleFailed, "nobody-registered"),
    ] {
        let mut c = sample::control(id, kind, Some("refund:held"), w.now);
        c.operator_id = operator.to_owned();
        let e = w.feed(Input::Control(c));
        assert_verdict(&e, Verdict::Rejected, Reason::PolicyDenied);
        assert!(
            e.decisions[0].detail.contains(operator),
            "{:?}",
            e.decisions[0]
        );
        assert_eq!(w.record("refund:held"), pending, "{operator} changed it");
    }
    // A control read more than an hour after it was issued (a captured copy replayed) is
    // refused, whoever signed it.
    let mut stale = sample::control("c-stale", ControlKind::Cancel, Some("refund:held"), w.now);
    stale.operator_id = "operator-olga".to_owned();
    stale.issued_at = w.now - HOUR_MS - 1;
    let e = w.feed(Input::Control(stale));
    assert_verdict(&e, Verdict::Rejected, Reason::DeadlineExpired);
    assert_eq!(
        w.record("refund:held"),
        pending,
        "a stale control changed it"
    );
    let e = w.control("c-olga", ControlKind::Cancel, Some("refund:held"));
    assert_eq!(
        (e.decisions[0].verdict, e.decisions[0].reason),
        (Verdict::Cancelled, Reason::CancelledByOperator)
    );
    w.seen
}

fn late_commit_corrects_a_failure_of_the_same_epoch() -> Vec<Decision> {
    let mut w = World::new();
    let p = ToolProposal {
        tool: "send_email".into(),
        arguments_json: serde_json::json!({
            "tenant_id": "acme", "to": "ops@example.com", "subject": "hi", "body": "hello"
        })
        .to_string(),
        ..sample::refund("email:late", 1, w.now)
    };
    w.propose(&p);
    w.outcome("email:late", 1, OutcomeKind::Failed);
    let e = w.outcome("email:late", 1, OutcomeKind::Committed);
    assert_eq!(decision(&e).verdict, Verdict::Committed);
    // COMMITTED never regresses.
    let e = w.outcome("email:late", 1, OutcomeKind::Failed);
    assert!(e.writes.is_empty());
    assert_eq!(
        w.record("email:late").effect_state(),
        EffectState::Committed
    );
    w.seen
}

// ------------------------------------------------------------------------------------------
// Tests

macro_rules! scenario_tests {
    ($($name:ident),* $(,)?) => {
        $(#[test] fn $name() { super::$name(); })*
        pub(super) const ALL: &[fn() -> Vec<Decision>] = &[$(super::$name),*];
    };
}

mod run {
    use super::Decision;
    scenario_tests!(
        small_refund_dispatches_once_and_commits,
        duplicate_proposal_dispatches_once,
        changed_arguments_conflict_in_every_state,
        lost_response_is_unknown_then_ambiguous_then_reconciled,
        connector_unknown_reconciles_until_operator_settles,
        proven_failure_retries_with_a_new_epoch,
        reproposal_after_proven_failure_is_a_new_attempt,
        no_requester_of_a_retried_intent_approves_it,
        no_proof_of_failure_while_the_attempt_may_run,
        a_reused_proposal_id_gets_no_one_elses_reply,
        another_tenant_under_a_key_learns_nothing_and_changes_nothing,
        tenant_scoped_ids_belong_to_their_tenant,
        non_idempotent_tool_is_never_retried,
        validation_refusals_in_order,
        resource_must_be_bound,
        approval_flow_binds_hash_and_needs_an_entitled_other_person,
        two_distinct_approvers_for_a_wire_transfer,
        rejected_or_unanswered_approval_dispatches_nothing,
        stale_lease_fence_is_refused,
        run_dispatch_budget_stops_a_runaway_loop,
        settled_records_close_after_retention_and_answer_blind_retries,
        control_refusals,
        late_commit_corrects_a_failure_of_the_same_epoch,
    );
}

/// Reasons only the runtime's decode step produces (dead-letter decisions, issue 3).
const SHELL_REASONS: &[Reason] = &[Reason::UnknownSchema, Reason::KeyMismatch];

#[test]
fn every_verdict_and_reason_code_is_exercised() {
    let mut verdicts = BTreeSet::new();
    let mut reasons = BTreeSet::new();
    for scenario in run::ALL {
        for d in scenario() {
            verdicts.insert(d.verdict.as_str());
            reasons.insert(d.reason.as_str());
        }
    }
    let missing_verdicts: Vec<_> = Verdict::ALL
        .iter()
        .map(|v| v.as_str())
        .filter(|v| !verdicts.contains(v))
        .collect();
    let missing_reasons: Vec<_> = Reason::ALL
        .iter()
        .filter(|r| !SHELL_REASONS.contains(r))
        .map(|r| r.as_str())
        .filter(|r| !reasons.contains(r))
        .collect();
    assert!(
        missing_verdicts.is_empty(),
        "verdicts never produced: {missing_verdicts:?}"
    );
    assert!(
        missing_reasons.is_empty(),
        "reasons never produced: {missing_reasons:?}"
    );
}
