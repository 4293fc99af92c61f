//! The two ways an effect happens without its record: the ledger commits and the response is
//! lost, or the ledger commits and dies before answering. Either way the worker cannot tell, the
//! effect is UNKNOWN (never FAILED, never retried blindly), and reconciliation looks the effect
//! up by its idempotency key and finds it: COMMITTED, one business effect, one attempt.

use airlock_schemas::{EffectState, Reason, Verdict};

use super::Ctx;
use crate::cli::demo::report::Report;
use crate::sample;

pub fn lost_response(cx: &mut Ctx<'_>, r: &mut Report) -> anyhow::Result<()> {
    let p = cx.refund("lost response", "lost", 2_500);
    let key = p.operation_key.clone();
    r.expect(&key, 1, 1, Some(EffectState::Committed));
    cx.stack.ledger()?.arm("drop-response", &key)?;
    cx.say(
        "ledger armed: commit the next refund of this key, then close the connection unanswered",
    )?;
    cx.propose(&p, None)?;
    cx.until(&key, "the lost response to leave the effect UNKNOWN", |d| {
        d.verdict == Verdict::Unknown
    })?;

    // The agent's retry loop read an error and tries again while the effect is UNKNOWN.
    let retry = sample::resend(&p, 1);
    cx.say("the agent retries blindly (same key and arguments, new proposal id)")?;
    cx.propose(&retry, Some("blind retry"))?;
    let reply = cx.reply(&retry.proposal_id, "the blind retry's answer")?;
    match (reply.verdict, reply.reason) {
        (Verdict::Ambiguous, Reason::OutcomeUnknown) => {
            r.note("the blind retry was held AMBIGUOUS: nothing dispatched while UNKNOWN");
        }
        // Reconciliation may settle the effect before the retry is decided on a slow machine:
        // the contract's answer for a committed key, as right.
        (Verdict::Duplicate, Reason::AlreadyCommitted) => r.note(
            "reconciliation settled the effect before the retry was decided: DUPLICATE, \
             nothing dispatched",
        ),
        _ => r.problem(format!(
            "the blind retry got {} {}, expected AMBIGUOUS OUTCOME_UNKNOWN",
            reply.verdict.as_str(),
            reply.reason.as_str()
        )),
    }
    cx.until_reconciled(&key, r)?;
    Ok(())
}

pub fn crash_after_commit(cx: &mut Ctx<'_>, r: &mut Report) -> anyhow::Result<()> {
    let p = cx.refund("crash after commit", "crash", 3_100);
    let key = p.operation_key.clone();
    r.expect(&key, 1, 1, Some(EffectState::Committed));
    cx.stack.ledger()?.arm("crash-after-commit", &key)?;
    cx.say("ledger armed: commit the next refund of this key durably, then exit at once")?;
    cx.propose(&p, None)?;
    let within = cx.wait;
    let stack = &mut *cx.stack;
    let status = cx.watch.wait_for(
        cx.out,
        "the ledger to crash after committing",
        within,
        |_| stack.ledger_mut()?.exited(),
    )?;
    cx.say(&format!(
        "the ledger died after committing ({status}); restarting it on the same database and port"
    ))?;
    cx.stack.ledger_mut()?.restart()?;
    r.note(format!(
        "the ledger crashed after committing ({status}) and was restarted on the same database"
    ));
    cx.until(&key, "the worker to report the effect UNKNOWN", |d| {
        d.verdict == Verdict::Unknown
    })?;
    cx.until_reconciled(&key, r)?;
    Ok(())
}
