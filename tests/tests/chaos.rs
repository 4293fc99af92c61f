//! Chaos against the broker: two `airlock run` processors in one group over three partitions,
//! two connector workers in the workers' group, and the reference ledger, with the reference
//! attempt deadlines (10 s) so that attempt timeouts, UNKNOWN, reconciliation and retries all
//! happen while processes die. `AIRLOCK_CHAOS_KILLS` (default 100) times, every 0.3-1.5 s, a
//! victim is SIGKILLed and respawned at once under the same name and group: p1 or p2 two times
//! in three, else w1 or w2; a processor loses its state directory too after about a quarter of
//! its kills (at least two), so its restart restores from a changelog the kill may have cut.
//! The schedule comes from a fixed seed (printed).
//!
//! The workload flows through the kills: `workload::proposals` (30% duplicates, 5% changed
//! arguments), refunds above the automatic tier that wait for a human, each approved by a
//! finance approver (alice) with the canonical arguments hash once its PENDING_APPROVAL reply is
//! out, and a ledger that loses the response of the first call for a few percent of the keys
//! (armed before their proposals are sent).
//!
//! Afterwards: every proposal has a decision; every key settles for good (COMMITTED, FAILED with
//! the retry budget spent, or OPERATOR_REQUIRED), so no key is left UNKNOWN or in flight; no
//! (key, epoch) has two dispatch commands that differ; the ledger holds at most one effect per
//! key, exactly one for a COMMITTED key and none for a FAILED one, and nothing else. The counts
//! are printed. Logs of a failed run stay in `$TMPDIR/airlock-chaos-<pid>/`.
//!
//! This test found that an instance taking a partition over could decide an approval before
//! the proposal it answers (the approvals arrived in an earlier fetch than the backlog of
//! proposals ahead of them) and refuse it: the intake now merges a partition's topics by
//! append time while it catches up (`tests/tests/order.rs` shows it alone).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use airlock_processor::core::canonical;
use airlock_processor::sample;
use airlock_schemas::{Approval, ApprovalVerdict, Decision, Reason, ToolProposal, Verdict};
use airlock_tests::airlock::{Airlock, Options, Process};
use airlock_tests::connector::{Keys, Ledger, Worker};
use airlock_tests::eventually;
use airlock_tests::wall_ms;
use airlock_tests::workload::{self, Lcg};

const PARTITIONS: i32 = 3;
/// The refund tool's `retry.max_attempts` (`deploy/config/tools.toml`).
const BUDGET: i64 = 3;
const SEED: u64 = 0xc4a0_5eed;
/// The refunds above the automatic tier (10,000 minor units; `policies.cedar`).
const LARGE: usize = 40;
/// Percent of the workload's keys whose first ledger response is lost.
const DROP_PERCENT: u64 = 4;
const GROUP: &str = "group";

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// How a key ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    Committed,
    /// FAILED with proof and the retry budget spent.
    Failed,
    /// UNKNOWN after every reconciliation round: an operator must settle it.
    OperatorRequired,
}

/// The settlement of every key that settled for good (keys still open are left out), from the
/// settlement decisions (`e/<key>/<epoch>/<reason>`) in the order the key's partition holds them.
fn ends(decisions: &[Decision]) -> BTreeMap<String, End> {
    let mut last: BTreeMap<&str, &Decision> = BTreeMap::new();
    let mut committed = BTreeSet::new();
    for d in decisions.iter().filter(|d| d.decision_id.starts_with("e/")) {
        if d.verdict == Verdict::Committed {
            committed.insert(d.operation_key.as_str());
        }
        last.insert(&d.operation_key, d);
    }
    last.into_iter()
        .filter_map(|(k, d)| {
            let end = if committed.contains(k) {
                End::Committed
            } else if d.verdict == Verdict::Failed && d.epoch >= Some(BUDGET) {
                End::Failed
            } else if d.verdict == Verdict::Unknown && d.reason == Reason::OperatorRequired {
                End::OperatorRequired
            } else {
                return None;
            };
            Some((k.to_owned(), end))
        })
        .collect()
}

/// Alice, the finance approver: whenever a large refund waits for approval (its first decision,
/// and again before each retry of a proven failure), she approves the arguments the decision
/// names, their canonical hash, under a new approval id.
#[derive(Default)]
struct Approver {
    /// Decisions already answered.
    answered: BTreeSet<String>,
    /// Approvals sent, by key.
    sent: BTreeMap<String, usize>,
    last_sent: BTreeMap<String, Instant>,
}

impl Approver {
    async fn round(
        &mut self,
        a: &Arc<Airlock>,
        producer: &rdkafka::producer::FutureProducer,
        large: &[ToolProposal],
    ) -> anyhow::Result<()> {
        let reader = a.clone();
        let decisions = tokio::task::spawn_blocking(move || {
            reader.read_deduplicated::<Decision>(&reader.names.decisions(), "decision")
        })
        .await??;
        // The key's last reply or settlement; an answer to an approval (`a/...`) says nothing
        // of whether the intent still waits.
        let mut last: BTreeMap<&str, &Decision> = BTreeMap::new();
        for d in decisions
            .iter()
            .filter(|d| !d.decision_id.starts_with("a/"))
        {
            last.insert(&d.operation_key, d);
        }
        for p in large {
            let Some(d) = last.get(p.operation_key.as_str()) else {
                continue;
            };
            // Still waiting 10 s after an approval: that one was refused (a new owner that
            // re-decides the proposal may read the approval first and answer it
            // NO_PENDING_APPROVAL); the approver, told so, approves again.
            let again = self
                .last_sent
                .get(p.operation_key.as_str())
                .is_some_and(|t: &Instant| t.elapsed() > Duration::from_secs(10));
            if d.verdict != Verdict::PendingApproval
                || (self.answered.contains(&d.decision_id) && !again)
            {
                continue;
            }
            let hash = canonical::canonicalize(&p.arguments_json)?.hash;
            anyhow::ensure!(
                d.arguments_hash.as_deref() == Some(hash.as_str()),
                "{}: the decision names {:?}, the arguments hash to {hash}",
                p.operation_key,
                d.arguments_hash
            );
            let n = self.sent.entry(p.operation_key.clone()).or_default();
            *n += 1;
            let approval = Approval {
                approval_id: format!("appr-{}-alice-{n}", p.operation_key),
                ..sample::approval(p, &hash, "alice", ApprovalVerdict::Approve, wall_ms())
            };
            a.send(producer, &a.names.approvals(), &p.operation_key, &approval)
                .await?;
            self.answered.insert(d.decision_id.clone());
            self.last_sent
                .insert(p.operation_key.clone(), Instant::now());
        }
        Ok(())
    }
}

fn sigkill(p: &mut Process) -> anyhow::Result<()> {
    p.kill()?;
    p.wait()?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_sigkills_leave_one_effect_per_intent_and_every_proposal_decided()
-> anyhow::Result<()> {
    let kills = env_or("AIRLOCK_CHAOS_KILLS", 100);
    let n = env_or("AIRLOCK_CHAOS_PROPOSALS", 600);
    let keys = Keys::generate()?;
    let mut a = Airlock::start_with("chaos", PARTITIONS, Options::with_workers(&keys)).await?;
    // The harness's 10 s poll interval is shorter than a debug build takes over a backlog
    // batch (up to 2,000 inputs a partition) on a loaded two-core machine: the instance busy
    // with it leaves the group, its peer redoes the batch (now larger) and leaves in turn, and
    // the pair never catches up. A dead member still leaves after the session timeout (6 s).
    a.config.processor.max_poll_interval_ms = 60_000;
    let a = Arc::new(a);
    // Logs outlive a failed run: $TMPDIR/airlock-chaos-<pid>/.
    let dir = std::env::temp_dir().join(format!("airlock-chaos-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let log = dir.join("run.log");
    let worker_log = |w: &str| dir.join(format!("{w}.log"));
    let ledger = Ledger::start(
        &[("acme", "acct-42", "EUR", 1_000_000_000)],
        &dir.join("ledger.log"),
    )?;
    let verifying = [keys.verifying_file.as_path()];

    // The workload: the crash test's proposals, and refunds that need an approval spread
    // through them.
    let mut rng = Lcg(SEED);
    let now = wall_ms();
    let mut proposals = workload::proposals(n, now, &mut rng);
    let large: Vec<ToolProposal> = (0..LARGE)
        .map(|j| sample::refund(&format!("refund:large-{j}"), 20_000 + 1_000 * j as i64, now))
        .collect();
    let stride = proposals.len() / LARGE + 1;
    for (j, p) in large.iter().enumerate().rev() {
        proposals.insert((j * stride).min(proposals.len()), p.clone());
    }
    let distinct: BTreeSet<String> = proposals.iter().map(|p| p.proposal_id.clone()).collect();
    let all_keys: BTreeSet<String> = proposals.iter().map(|p| p.operation_key.clone()).collect();
    // The ledger loses the first response for a few percent of the keys, armed before any
    // proposal is sent.
    let mut dropped = BTreeSet::new();
    for key in &all_keys {
        if rng.below(100) < DROP_PERCENT {
            ledger.arm("drop-response", key).await?;
            dropped.insert(key.clone());
        }
    }

    let mut procs: [Process; 2] = [
        a.spawn_process("p1", GROUP, &log)?,
        a.spawn_process("p2", GROUP, &log)?,
    ];
    let mut workers: [Option<Worker>; 2] = [
        Some(a.spawn_connector("w1", &ledger, &verifying, &worker_log("w1"))?),
        Some(a.spawn_connector("w2", &ledger, &verifying, &worker_log("w2"))?),
    ];

    // Chunks of 20 every 2 s: 640 proposals take about the 60 s of the first two thirds of
    // the kills.
    let sender = {
        let (a, proposals) = (a.clone(), proposals.clone());
        tokio::spawn(async move {
            let producer = a.producer()?;
            let topic = a.names.proposals();
            for chunk in proposals.chunks(20) {
                a.send_many(&producer, &topic, chunk, |p| p.operation_key.as_str())
                    .await?;
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            anyhow::Ok(())
        })
    };
    // The approver, until the keys are settled.
    let stop = Arc::new(AtomicBool::new(false));
    let approver = {
        let (a, large, stop) = (a.clone(), large.clone(), stop.clone());
        tokio::spawn(async move {
            let producer = a.producer()?;
            let mut approver = Approver::default();
            let mut failures = 0usize;
            while !stop.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(1_500)).await;
                // A read or a send that fails under the kills (a broker timeout) is tried again
                // at the next round: an approver that gave up would leave its keys open.
                if let Err(e) = approver.round(&a, &producer, &large).await {
                    failures += 1;
                    eprintln!("approver: round failed ({failures} so far): {e:#}");
                    anyhow::ensure!(failures < 20, "approver: {failures} rounds failed: {e:#}");
                }
            }
            anyhow::Ok(approver.sent.values().sum::<usize>())
        })
    };

    // The killer.
    let started = Instant::now();
    let (mut processor_kills, mut worker_kills, mut disks_lost) = (0usize, 0usize, 0usize);
    eprintln!("chaos seed {SEED:#x}: {kills} kills, {n} + {LARGE} proposals");
    for i in 0..kills {
        tokio::time::sleep(Duration::from_millis(300 + rng.below(1_200))).await;
        // Two kills in three are a processor's: a respawned worker stalls its group for a
        // session timeout, and with workers killed as often as processors most attempts
        // expired in the queue and few keys committed.
        let victim = match rng.below(6) {
            0..=3 => rng.below(2) as usize,
            _ => 2 + rng.below(2) as usize,
        };
        let what = if victim < 2 {
            let name = ["p1", "p2"][victim];
            sigkill(&mut procs[victim])?;
            processor_kills += 1;
            // A quarter of the processor kills take the disk; the last ones do until two have.
            let lose_disk = rng.below(4) == 0 || (disks_lost < 2 && i + 8 >= kills);
            if lose_disk {
                match std::fs::remove_dir_all(a.state_dir(name)) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
                    _ => {}
                }
                disks_lost += 1;
            }
            procs[victim] = a.spawn_process(name, GROUP, &log)?;
            format!("{name}{}", if lose_disk { " and its disk" } else { "" })
        } else {
            let name = ["w1", "w2"][victim - 2];
            workers[victim - 2].take().expect("a worker").kill()?;
            worker_kills += 1;
            workers[victim - 2] =
                Some(a.spawn_connector(name, &ledger, &verifying, &worker_log(name))?);
            name.to_owned()
        };
        eprintln!("kill {} at {:.1?}: {what}", i + 1, started.elapsed());
    }
    let kill_phase = started.elapsed();
    sender.await??;

    // Every proposal decided; a large refund first waits for its approval.
    // (Polled every 2 s, not every 0.1 s as `await_replies` does: each poll reads the whole
    // decisions topic, CPU the processors need on this machine.)
    let replies = match eventually(
        "a decision for every proposal",
        Duration::from_secs(120),
        async || {
            tokio::time::sleep(Duration::from_secs(2)).await;
            let r = a.proposal_replies()?;
            Ok(distinct.iter().all(|id| r.contains_key(id)).then_some(r))
        },
    )
    .await
    {
        Ok(r) => r,
        Err(e) => panic!(
            "{e}; logs in {}\n{}",
            dir.display(),
            workload::explain_missing(&a, &distinct, &log)?
        ),
    };
    for p in &large {
        let reply = &replies[&p.proposal_id];
        assert_eq!(reply.verdict, Verdict::PendingApproval, "{reply:?}");
    }

    // Every key settled for good.
    eprintln!("every proposal decided at {:.1?}", started.elapsed());
    let mut last_progress = Instant::now();
    let settled = eventually(
        "every key COMMITTED, FAILED for good or OPERATOR_REQUIRED",
        Duration::from_secs(180),
        async || {
            tokio::time::sleep(Duration::from_secs(2)).await;
            // An approver that stopped answers why below (`approver.await`).
            anyhow::ensure!(!approver.is_finished(), "the approver stopped");
            let decisions = a.read_deduplicated::<Decision>(&a.names.decisions(), "decision")?;
            let ends = ends(&decisions);
            if last_progress.elapsed() > Duration::from_secs(15) {
                eprintln!(
                    "{:.0?}: {} of {} keys settled",
                    started.elapsed(),
                    ends.len(),
                    all_keys.len()
                );
                last_progress = Instant::now();
            }
            Ok((ends.len() == all_keys.len()).then_some((ends, decisions)))
        },
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    let approvals = approver.await??;
    let (ends, decisions) = match settled {
        Ok(s) => s,
        Err(e) => {
            let decisions = a.read_deduplicated::<Decision>(&a.names.decisions(), "decision")?;
            let ends = ends(&decisions);
            let open: Vec<&String> = all_keys.iter().filter(|k| !ends.contains_key(*k)).collect();
            panic!(
                "{e}: {} of {} keys settled, open e.g. {:?}; logs in {}\n{}",
                ends.len(),
                all_keys.len(),
                &open[..open.len().min(8)],
                dir.display(),
                open.first()
                    .map(|k| workload::story(&a, k))
                    .unwrap_or_default()
            );
        }
    };
    let settle_phase = started.elapsed();
    // An approval is sent only once its key's PENDING_APPROVAL reply is out, so no instance
    // may find no intent for it: that would be an approval decided before its proposal (a
    // catch-up merging the topics out of append order). Refusals of repeats are expected.
    let before_intent: Vec<&Decision> = decisions
        .iter()
        .filter(|d| {
            d.decision_id.starts_with("a/")
                && d.reason == Reason::NoPendingApproval
                && d.detail.starts_with("no intent for operation key")
        })
        .collect();
    assert!(
        before_intent.is_empty(),
        "{} approvals were decided before their proposals, e.g. {:?}",
        before_intent.len(),
        before_intent.first()
    );

    for p in &mut procs {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &p.id().to_string()])
            .status();
        let _ = p.wait();
    }
    for w in workers.iter_mut() {
        if let Some(w) = w.take() {
            let _ = w.stop();
        }
    }

    // No (key, epoch) dispatched twice with different content.
    let dispatches = a.dispatches()?;
    // The ledger: at most one effect per key, one per COMMITTED key, none per FAILED key,
    // nothing besides.
    let mut effects = 0;
    for key in &all_keys {
        let got = ledger.effects_for(key).await?;
        let end = ends[key];
        let expected = match end {
            End::Committed => got == 1,
            End::Failed => got == 0,
            End::OperatorRequired => got <= 1,
        };
        assert!(
            expected,
            "{key} ended {end:?} with {got} ledger effects\n{}",
            workload::story(&a, key)
        );
        effects += got;
    }
    assert_eq!(
        ledger.effects_total().await?,
        effects,
        "the ledger holds effects for no other reference"
    );

    // Every UNKNOWN was resolved: by reconciliation, by the worker's own outcome arriving
    // late, or it waits for an operator.
    let mut unknown: BTreeSet<&str> = BTreeSet::new();
    let (mut reconciled, mut late) = (BTreeSet::new(), BTreeSet::new());
    for d in decisions.iter().filter(|d| d.decision_id.starts_with("e/")) {
        let key = d.operation_key.as_str();
        if d.verdict == Verdict::Unknown && d.reason != Reason::OperatorRequired {
            unknown.insert(key);
        } else if unknown.contains(key) && d.reason == Reason::Reconciled {
            reconciled.insert(key);
        } else if unknown.contains(key)
            && matches!(d.reason, Reason::OutcomeCommitted | Reason::OutcomeFailed)
        {
            late.insert(key);
        }
    }
    let count = |e: End| ends.values().filter(|v| **v == e).count();
    let operator = count(End::OperatorRequired);
    for key in &unknown {
        assert!(
            reconciled.contains(key) || late.contains(key) || ends[*key] == End::OperatorRequired,
            "{key} was UNKNOWN and never resolved\n{}",
            workload::story(&a, key)
        );
    }

    eprintln!(
        "chaos: {} proposals ({} distinct, {} keys, {LARGE} waiting for approval, \
         {approvals} approvals, {} keys losing a response), {kills} kills ({processor_kills} processors / \
         {worker_kills} workers / {disks_lost} disks lost), {} dispatches, {} committed, {} \
         failed, {operator} operator-required, {} unknown ({} reconciled, {} settled by a late \
         outcome), {effects} ledger effects, kills over at {kill_phase:.1?}, settled at \
         {settle_phase:.1?}, {:.1?} in all",
        proposals.len(),
        distinct.len(),
        all_keys.len(),
        dropped.len(),
        dispatches.len(),
        count(End::Committed),
        count(End::Failed),
        unknown.len(),
        reconciled.len(),
        late.len(),
        started.elapsed()
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
