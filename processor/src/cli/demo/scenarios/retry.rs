//! The idempotency contract on one key: a blind retry while the attempt runs is IN_PROGRESS and
//! once it committed DUPLICATE, never a second dispatch; the same key with another amount is a
//! CONFLICT, never dispatched, and the ledger keeps the first amount.

use airlock_schemas::{EffectState, Reason, Verdict};

use super::Ctx;
use crate::cli::demo::report::Report;
use crate::core::canonical;
use crate::sample;

/// How long the ledger holds the answer of the retried refund: the window in which the retry
/// is decided while the attempt is in flight (the worker's own timeout is 10 s).
const IN_FLIGHT_MS: u64 = 5_000;

pub fn blind_retry(cx: &mut Ctx<'_>, r: &mut Report) -> anyhow::Result<()> {
    let p = cx.refund("blind retry", "retry", 1_800);
    let key = p.operation_key.clone();
    r.expect(&key, 1, 1, Some(EffectState::Committed));
    cx.stack
        .ledger()?
        .arm(&format!("delay={IN_FLIGHT_MS}"), &key)?;
    cx.say(&format!(
        "ledger armed: commit the next refund of this key, answer {IN_FLIGHT_MS} ms later"
    ))?;
    cx.propose(&p, None)?;
    let accepted = cx.reply(&p.proposal_id, "the refund's decision")?;
    r.check(
        "the refund",
        &accepted,
        (Verdict::Accepted, Reason::AutoApproved),
    );
    // The agent's producer resends the same message: deduplicated on its proposal id.
    cx.propose(&p, None)?;
    let first = sample::resend(&p, 1);
    cx.say("the agent retries blindly while the call is in flight")?;
    cx.propose(&first, Some("blind retry 1"))?;
    let reply = cx.reply(&first.proposal_id, "the first retry's answer")?;
    if (reply.verdict, reply.reason) == (Verdict::Duplicate, Reason::AlreadyCommitted) {
        // Only when the machine took longer than IN_FLIGHT_MS to decide one proposal.
        r.note("the attempt committed before the first retry was decided: DUPLICATE");
    } else {
        r.check(
            "the retry during the call",
            &reply,
            (Verdict::InProgress, Reason::AttemptInProgress),
        );
    }
    cx.until_committed(&key)?;
    let second = sample::resend(&p, 2);
    cx.say("the agent retries blindly once more, after the commit")?;
    cx.propose(&second, Some("blind retry 2"))?;
    let reply = cx.reply(&second.proposal_id, "the second retry's answer")?;
    r.check(
        "the retry after the commit",
        &reply,
        (Verdict::Duplicate, Reason::AlreadyCommitted),
    );
    let resends = cx
        .watch
        .history(&key)
        .decisions
        .iter()
        .filter(|d| d.in_reply_to == p.proposal_id && d.verdict == Verdict::Accepted)
        .count();
    if resends != 1 {
        r.problem(format!(
            "the producer resend got its own decision: {resends} ACCEPTED replies"
        ));
    }
    Ok(())
}

pub fn changed_amount(cx: &mut Ctx<'_>, r: &mut Report) -> anyhow::Result<()> {
    let p = cx.refund("changed amount", "changed", 2_500);
    let key = p.operation_key.clone();
    r.expect(&key, 1, 1, Some(EffectState::Committed));
    cx.propose(&p, None)?;
    cx.until_committed(&key)?;
    // The model "corrects" the amount and proposes again under the same key.
    let changed = sample::refund(&key, 9_900, cx.now);
    let changed = airlock_schemas::ToolProposal {
        run_id: p.run_id.clone(),
        ..changed
    };
    cx.say("the agent proposes 99.00 EUR under the key of the committed 25.00 EUR refund")?;
    cx.propose(&changed, Some("changed amount"))?;
    let reply = cx.reply(&changed.proposal_id, "the changed proposal's answer")?;
    r.check(
        "the changed amount",
        &reply,
        (Verdict::Conflict, Reason::HashConflict),
    );
    let effect = cx
        .stack
        .ledger()?
        .effect(&canonical::idempotency_key(&key))?;
    match effect
        .as_ref()
        .and_then(|e| e["amount"]["minor_units"].as_i64())
    {
        Some(2_500) => {
            r.note("the ledger's only effect for the key is the first amount, 25.00 EUR")
        }
        other => r.problem(format!(
            "the ledger's effect for the key has amount {other:?}, expected 2500"
        )),
    }
    Ok(())
}
