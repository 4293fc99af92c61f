//! A stale connector worker after a takeover. The worker is frozen (SIGSTOP) in the middle of
//! its call: the ledger has committed and holds its answer. Nothing is heard of the attempt, so
//! at its deadline the processor declares it UNKNOWN. A replacement worker joins the workers'
//! consumer group, which evicts the frozen member after its session timeout and hands the
//! replacement the dispatch partitions (on tansu 0.6, which never evicts, a fresh group:
//! `Stack::replacement_group`). In the same group it resumes past the command (the frozen
//! worker committed its offset before calling); in a fresh group, rebuilding the attempts
//! started from the outcomes, it refuses the redelivered command of the started epoch, and
//! answers the reconcile command: COMMITTED. Then the stale worker resumes: its call times out
//! and its late UNKNOWN for that epoch changes nothing (journaled OUTCOME_IGNORED). One attempt,
//! one business effect.

use airlock_schemas::{EffectState, JournalKind, Verdict};

use super::Ctx;
use crate::cli::demo::process::count_lines;
use crate::cli::demo::report::Report;
use crate::core::canonical;

/// How long the ledger holds its answer: beyond the worker's own call timeout (10 s) and the
/// whole scenario, so the stale worker can only learn its call's fate from its own timeout.
const HOLD_MS: u64 = 600_000;

pub fn stale_worker(cx: &mut Ctx<'_>, r: &mut Report) -> anyhow::Result<()> {
    let p = cx.refund("stale worker", "takeover", 4_200);
    let key = p.operation_key.clone();
    r.expect(&key, 1, 1, Some(EffectState::Committed));
    let stale = cx
        .stack
        .workers
        .first()
        .map(|w| w.id.clone())
        .ok_or_else(|| anyhow::anyhow!("no connector worker is running"))?;
    cx.stack.ledger()?.arm(&format!("delay={HOLD_MS}"), &key)?;
    cx.say("ledger armed: commit the next refund of this key and hold the answer")?;
    cx.propose(&p, None)?;

    let idempotency_key = canonical::idempotency_key(&key);
    let within = cx.wait;
    let stack = &mut *cx.stack;
    cx.watch
        .wait_for(cx.out, "the ledger to commit the refund", within, |_| {
            stack.ledger()?.effect(&idempotency_key)
        })?;
    cx.stack.worker_mut(&stale)?.proc.signal("STOP")?;
    cx.say(&format!(
        "the ledger committed; worker {stale} is frozen (SIGSTOP) waiting for the answer"
    ))?;
    cx.until(&key, "the attempt's deadline to pass (UNKNOWN)", |d| {
        d.verdict == Verdict::Unknown
    })?;

    let group = cx.stack.replacement_group(&format!("{}-takeover", cx.run));
    let replacement = "demo-worker-2";
    cx.say(&format!(
        "worker {replacement} takes the dispatch partitions over (group {group})"
    ))?;
    let log = cx.stack.start_worker(replacement, &group)?.proc.log.clone();
    cx.until_reconciled(&key, r)?;
    // In the workers' own group the replacement resumes at the offset the frozen worker
    // committed before it called the ledger: the command is not delivered again. In a fresh
    // group it is; expired by now (its attempt deadline passed while the worker was frozen)
    // or not, an authentic command of a started epoch is refused; the worker logs which.
    let refused = count_lines(&log, &format!("{key}#1: epoch 1 already started here"))
        + count_lines(&log, &format!("{key}#1: redelivered after it started"));
    if refused > 0 {
        r.note(format!(
            "{replacement} refused the redelivered command of epoch 1, already started: \
             {refused} (its log)"
        ));
    } else if group == cx.stack.default_group() {
        r.note(format!(
            "{replacement} resumed past the command of epoch 1 (the group kept the offset \
             {stale} committed before calling): nothing redelivered"
        ));
    } else {
        r.problem(format!(
            "{replacement} did not refuse the redelivered command of epoch 1 (see {})",
            log.display()
        ));
    }

    cx.stack.worker_mut(&stale)?.proc.signal("CONT")?;
    cx.say(&format!(
        "worker {stale} resumes (SIGCONT): its call has timed out"
    ))?;
    let stale_id = stale.clone();
    let ignored = cx.watch.wait_for(
        cx.out,
        &format!("{stale}'s late outcome to reach the processor"),
        within,
        |w| {
            let late: Vec<_> = w
                .history(&key)
                .journal
                .into_iter()
                .filter(|e| {
                    e.kind == JournalKind::OutcomeIgnored
                        && e.principal_id.as_deref() == Some(stale_id.as_str())
                })
                .collect();
            Ok((!late.is_empty()).then_some(late))
        },
    )?;
    r.note(format!(
        "{stale}'s late outcome after it resumed changed nothing: journal OUTCOME_IGNORED {} ({})",
        ignored.len(),
        ignored[0]
            .evidence
            .as_deref()
            .unwrap_or("")
            .chars()
            .take(60)
            .collect::<String>()
    ));
    let stopped = cx.stack.stop_worker(&stale)?;
    cx.say(&format!(
        "worker {stale} stopped{}; {replacement} carries on",
        if stopped { "" } else { " (killed)" }
    ))?;
    Ok(())
}
