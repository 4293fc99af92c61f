//! Deterministic simulation of the seed workshop over the core: several partitions (one task
//! each), a fake ledger that honours idempotency keys and counts business effects, connector
//! workers that record AttemptStarted before calling and can crash mid-call, impatient agents
//! that retry blindly, processor crashes that drop an uncommitted batch, and a virtual clock.
//! Everything is driven until idle, with a step bound.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;

use airlock_processor::core::{self, Core, Input, StateView};
use airlock_processor::sample;
use airlock_processor::store::MemoryStore;
use airlock_processor::task::Task;
use airlock_schemas::{
    Decision, DispatchCommand, EffectState, OutcomeKind, ReconcileCommand, ToolProposal, Verdict,
};

const T0: i64 = 1_790_000_000_000;
const TICK_MS: i64 = 50;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    None,
    /// The ledger commits; the reply never reaches the connector (it reports UNKNOWN).
    DropResponse,
    /// The ledger refuses before committing anything (a proven failure).
    FailBeforeCommit,
    /// The ledger commits; the connector process dies before it records the outcome.
    CrashAfterDebit,
}

/// The downstream system: debits by idempotency key, honoured; effects counted.
#[derive(Default)]
struct Ledger {
    by_key: HashMap<String, String>,
    effects: HashMap<String, u32>,
    calls: HashMap<String, u32>,
}

impl Ledger {
    fn debit(&mut self, cmd: &DispatchCommand) -> String {
        *self.calls.entry(cmd.operation_key.clone()).or_default() += 1;
        if let Some(txn) = self.by_key.get(&cmd.idempotency_key) {
            return txn.clone(); // same key: the first result, no second effect
        }
        let txn = format!("txn-{}", self.by_key.len() + 1);
        self.by_key.insert(cmd.idempotency_key.clone(), txn.clone());
        *self.effects.entry(cmd.operation_key.clone()).or_default() += 1;
        txn
    }
}

/// A connector worker. Its memory of started attempts is rebuilt from the outcomes it produced
/// (the outcomes topic) when it restarts.
#[derive(Default)]
struct Connector {
    started: HashSet<(String, i64)>,
    finished: HashSet<(String, i64)>,
    down_until: i64,
}

struct Sim {
    tasks: Vec<Task<MemoryStore>>,
    /// Per partition: inputs not yet committed by the task (the topic from the stored offset).
    inbox: Vec<VecDeque<(Input, i64)>>,
    dispatch: VecDeque<DispatchCommand>,
    reconcile: VecDeque<ReconcileCommand>,
    decisions: Vec<Decision>,
    ledger: Ledger,
    connector: Connector,
    faults: HashMap<String, VecDeque<Fault>>,
    now: i64,
    rng: u64,
    agents: BTreeMap<String, Agent>,
    crash_permille: u64,
    /// How long a crashed connector stays down (restart plus rebalance).
    restart_ms: i64,
    /// Published dispatch commands per (key, epoch).
    dispatched: HashMap<(String, i64), u32>,
}

struct Agent {
    proposal: ToolProposal,
    attempts: u32,
    last_sent: Option<i64>,
    done: bool,
}

impl Sim {
    fn new(partitions: usize, seed: u64, crash_permille: u64) -> Self {
        let core: Arc<Core> = Arc::new(sample::reference_core(core::Config::default()).unwrap());
        Sim {
            tasks: (0..partitions)
                .map(|p| {
                    let store = airlock_processor::store::StateStore::open(
                        airlock_processor::store::MemoryBackend::default(),
                    )
                    .unwrap();
                    Task::new(core.clone(), store, sample::task_context(p as i32)).unwrap()
                })
                .collect(),
            inbox: vec![VecDeque::new(); partitions],
            dispatch: VecDeque::new(),
            reconcile: VecDeque::new(),
            decisions: Vec::new(),
            ledger: Ledger::default(),
            connector: Connector::default(),
            faults: HashMap::new(),
            now: T0,
            rng: seed | 1,
            agents: BTreeMap::new(),
            crash_permille,
            dispatched: HashMap::new(),
            restart_ms: 10_000,
        }
    }

    fn random(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    fn partition_of(&self, key: &str) -> usize {
        key.bytes()
            .fold(0usize, |h, b| h.wrapping_mul(31).wrapping_add(b as usize))
            % self.tasks.len()
    }

    fn send(&mut self, input: Input) {
        let key = input.operation_key().expect("keyed input").to_owned();
        let p = self.partition_of(&key);
        self.inbox[p].push_back((input, self.now));
    }

    fn add_agent(&mut self, key: &str, minor_units: i64, faults: &[Fault]) {
        let p = sample::refund(key, minor_units, self.now);
        self.faults
            .insert(key.to_owned(), faults.iter().copied().collect());
        self.agents.insert(
            key.to_owned(),
            Agent {
                proposal: p,
                attempts: 0,
                last_sent: None,
                done: false,
            },
        );
    }

    /// One virtual tick: agents, processor tasks (with crashes), timers, connector.
    fn tick(&mut self) {
        self.now += TICK_MS;
        // Agents: send, and retry blindly when no final answer came within 3 s.
        let now = self.now;
        let mut to_send = Vec::new();
        for agent in self.agents.values_mut() {
            let due = agent.last_sent.is_none_or(|at| now - at >= 3_000);
            if !agent.done && due && agent.attempts < 6 {
                agent.attempts += 1;
                agent.last_sent = Some(now);
                to_send.push(sample::resend(&agent.proposal, agent.attempts));
            }
        }
        for p in to_send {
            self.send(Input::Proposal(p));
        }
        // Processor tasks: a batch per tick; sometimes crash before the commit.
        for part in 0..self.tasks.len() {
            let batch: Vec<_> = self.inbox[part].iter().take(16).cloned().collect();
            let mut outputs = Vec::new();
            for (input, at) in &batch {
                outputs.push(self.tasks[part].handle(input, *at).unwrap());
            }
            outputs.extend(self.tasks[part].fire_timers(now, 100).unwrap());
            if self.random() % 1000 < self.crash_permille {
                self.tasks[part].discard().unwrap(); // crash: nothing of the batch survives
                continue;
            }
            self.tasks[part].commit().unwrap();
            self.inbox[part].drain(..batch.len());
            for e in outputs {
                for d in &e.dispatches {
                    *self
                        .dispatched
                        .entry((d.operation_key.clone(), d.epoch))
                        .or_default() += 1;
                }
                self.dispatch.extend(e.dispatches);
                self.reconcile.extend(e.reconciles);
                self.decisions.extend(e.decisions);
            }
        }
        self.settle_agents();
        self.run_connector();
    }

    fn settle_agents(&mut self) {
        for d in &self.decisions {
            if let Some(agent) = self.agents.get_mut(&d.operation_key)
                && matches!(
                    d.verdict,
                    Verdict::Committed | Verdict::Duplicate | Verdict::Failed
                )
            {
                agent.done = true;
            }
        }
    }

    fn run_connector(&mut self) {
        if self.now < self.connector.down_until {
            return;
        }
        if self.connector.down_until != 0 {
            // Restarted: attempts it started but never finished may have happened.
            self.connector.down_until = 0;
            let open: Vec<_> = self
                .connector
                .started
                .difference(&self.connector.finished)
                .cloned()
                .collect();
            for (key, epoch) in open {
                self.report(
                    &key,
                    epoch,
                    OutcomeKind::Unknown,
                    "worker restarted mid-call",
                );
            }
        }
        while let Some(cmd) = self.dispatch.pop_front() {
            let id = (cmd.operation_key.clone(), cmd.epoch);
            if self.connector.started.contains(&id) {
                continue; // already started once: never twice
            }
            if cmd.attempt_deadline_at <= self.now {
                // Never started, and now it never will: proof of no effect.
                self.connector.started.insert(id);
                let evidence = "capability expired before the attempt started";
                self.report(&cmd.operation_key, cmd.epoch, OutcomeKind::Failed, evidence);
                continue;
            }
            self.connector.started.insert(id.clone());
            self.report(
                &cmd.operation_key,
                cmd.epoch,
                OutcomeKind::AttemptStarted,
                "",
            );
            let fault = self
                .faults
                .get_mut(&cmd.operation_key)
                .and_then(VecDeque::pop_front)
                .unwrap_or(Fault::None);
            match fault {
                Fault::None => {
                    let txn = self.ledger.debit(&cmd);
                    self.report(&cmd.operation_key, cmd.epoch, OutcomeKind::Committed, &txn);
                }
                Fault::DropResponse => {
                    self.ledger.debit(&cmd);
                    self.report(
                        &cmd.operation_key,
                        cmd.epoch,
                        OutcomeKind::Unknown,
                        "timeout",
                    );
                }
                Fault::FailBeforeCommit => {
                    self.report(
                        &cmd.operation_key,
                        cmd.epoch,
                        OutcomeKind::Failed,
                        "409 refused",
                    );
                }
                Fault::CrashAfterDebit => {
                    self.ledger.debit(&cmd);
                    self.connector.down_until = self.now + self.restart_ms;
                    return;
                }
            }
        }
        while let Some(r) = self.reconcile.pop_front() {
            let kind = match self.ledger.by_key.get(&r.idempotency_key) {
                Some(_) => OutcomeKind::ReconciledCommitted,
                None => OutcomeKind::ReconciledFailed,
            };
            let mut o =
                sample::outcome(&r.operation_key, r.epoch, kind, "lookup by idempotency key");
            o.outcome_id = format!("{}-r{}-{}", o.outcome_id, r.round, self.now);
            o.reconcile_round = Some(r.round);
            self.send(Input::Outcome(o));
        }
    }

    fn report(&mut self, key: &str, epoch: i64, kind: OutcomeKind, evidence: &str) {
        if kind != OutcomeKind::AttemptStarted {
            self.connector.finished.insert((key.to_owned(), epoch));
        }
        let mut o = sample::outcome(key, epoch, kind, evidence);
        o.outcome_id = format!("{}-{}", o.outcome_id, self.now);
        self.send(Input::Outcome(o));
    }

    fn run_until_idle(&mut self, max_ticks: u32) {
        for _ in 0..max_ticks {
            self.tick();
            let idle = self.agents.values().all(|a| a.done)
                && self.inbox.iter().all(VecDeque::is_empty)
                && self.dispatch.is_empty()
                && self.reconcile.is_empty();
            if idle {
                return;
            }
        }
        panic!(
            "not idle after {max_ticks} ticks: agents {:?}",
            self.agents
                .iter()
                .filter(|(_, a)| !a.done)
                .map(|(k, _)| k)
                .collect::<Vec<_>>()
        );
    }

    fn state(&self, key: &str) -> (EffectState, u32) {
        let rec = self.tasks[self.partition_of(key)]
            .store()
            .effect(key)
            .unwrap()
            .expect("record");
        (rec.effect_state(), rec.attempts)
    }
}

#[test]
fn crash_after_the_debit_before_its_record_ends_with_exactly_one_effect() {
    let mut sim = Sim::new(1, 7, 0);
    sim.add_agent("refund:crash", 700, &[Fault::CrashAfterDebit]);
    sim.run_until_idle(20_000);
    let agent = &sim.agents["refund:crash"];
    assert!(agent.attempts >= 2, "the agent retried: {}", agent.attempts);
    assert_eq!(sim.ledger.effects["refund:crash"], 1);
    assert_eq!(sim.state("refund:crash"), (EffectState::Committed, 1));
    // The blind retries while the outcome was unknown were held, not dispatched.
    assert!(
        sim.decisions
            .iter()
            .any(|d| d.verdict == Verdict::Ambiguous || d.verdict == Verdict::InProgress)
    );
}

#[test]
fn blind_retry_after_a_lost_response_is_held_ambiguous_until_reconciled() {
    let mut sim = Sim::new(1, 11, 0);
    sim.add_agent("refund:lost", 900, &[Fault::DropResponse]);
    sim.run_until_idle(20_000);
    assert_eq!(sim.ledger.effects["refund:lost"], 1);
    assert_eq!(
        sim.ledger.calls["refund:lost"], 1,
        "no second call reached the ledger"
    );
    assert_eq!(sim.state("refund:lost"), (EffectState::Committed, 1));
    let verdicts: Vec<_> = sim
        .decisions
        .iter()
        .filter(|d| d.operation_key == "refund:lost")
        .map(|d| d.verdict)
        .collect();
    assert!(verdicts.contains(&Verdict::Unknown), "{verdicts:?}");
    assert!(verdicts.contains(&Verdict::Committed), "{verdicts:?}");
}

#[test]
fn proven_failure_is_retried_with_a_new_epoch_and_one_effect() {
    let mut sim = Sim::new(1, 13, 0);
    sim.add_agent("refund:fail", 300, &[Fault::FailBeforeCommit]);
    sim.run_until_idle(20_000);
    assert_eq!(sim.ledger.effects["refund:fail"], 1);
    assert_eq!(sim.state("refund:fail"), (EffectState::Committed, 2));
}

#[test]
fn many_partitions_with_faults_and_processor_crashes_settle_every_key_once() {
    for seed in 1..=5u64 {
        let mut sim = Sim::new(3, seed * 7919, 150);
        sim.restart_ms = 1_000; // a supervisor restarts the worker quickly
        let faults = [
            Fault::None,
            Fault::DropResponse,
            Fault::FailBeforeCommit,
            Fault::CrashAfterDebit,
        ];
        for i in 0..24 {
            let f = faults[(sim.random() % faults.len() as u64) as usize];
            sim.add_agent(&format!("refund:{seed}:{i}"), 100 + i, &[f]);
        }
        sim.run_until_idle(50_000);
        let mut committed = 0;
        for key in sim.agents.keys().cloned().collect::<Vec<_>>() {
            let history: Vec<_> = sim
                .decisions
                .iter()
                .filter(|d| d.operation_key == key)
                .map(|d| format!("{}/{}: {}", d.verdict.as_str(), d.reason.as_str(), d.detail))
                .collect();
            let effects = sim.ledger.effects.get(&key).copied().unwrap_or(0);
            // Settled either way, and the settlement tells the truth about the ledger.
            match sim.state(&key).0 {
                EffectState::Committed => {
                    committed += 1;
                    assert_eq!(effects, 1, "seed {seed} key {key}: {history:#?}");
                }
                EffectState::Failed => {
                    assert_eq!(effects, 0, "seed {seed} key {key}: {history:#?}")
                }
                other => panic!("seed {seed} key {key} ended {other:?}: {history:#?}"),
            }
        }
        assert!(
            committed >= 18,
            "seed {seed}: only {committed} of 24 committed"
        );
        // No key was dispatched twice for one epoch, even with the crashes and blind retries.
        for (id, count) in &sim.dispatched {
            assert_eq!(*count, 1, "seed {seed}: {id:?} dispatched {count} times");
        }
    }
}
