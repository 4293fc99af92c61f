//! Authorization (deploy/config/policies.cedar): a refund above 100.00 EUR waits for a finance
//! approver bound to its exact arguments hash; approved, it is dispatched and commits once;
//! rejected, it is denied and nothing is dispatched. Above 5000.00 EUR policy forbids it
//! outright: denied, no record, no approval asked.

use airlock_schemas::{ApprovalVerdict, EffectState, Reason, Verdict};

use super::Ctx;
use crate::cli::demo::report::Report;
use crate::cli::demo::stack::APPROVER;
use crate::sample;

pub fn approvals(cx: &mut Ctx<'_>, r: &mut Report) -> anyhow::Result<()> {
    let approved = cx.refund("approval", "approved", 50_000);
    r.expect(&approved.operation_key, 1, 1, Some(EffectState::Committed));
    let rejected = cx.refund("approval", "rejected", 40_000);
    r.expect(&rejected.operation_key, 0, 0, Some(EffectState::Denied));
    let denied = cx.refund("approval", "denied", 600_000);
    r.expect(&denied.operation_key, 0, 0, None);

    let key = cx.stack.approver_key()?;
    for (p, verdict) in [
        (&approved, ApprovalVerdict::Approve),
        (&rejected, ApprovalVerdict::Reject),
    ] {
        cx.propose(p, None)?;
        let pending = cx.reply(&p.proposal_id, "the large refund's decision")?;
        if !r.check(
            "a refund over 100.00 EUR",
            &pending,
            (Verdict::PendingApproval, Reason::ApprovalRequired),
        ) {
            continue;
        }
        let hash = pending.arguments_hash.clone().unwrap_or_default();
        let approval = sample::approval(p, &hash, APPROVER, verdict, cx.now);
        let what = format!("{APPROVER}: {}", verdict.as_str());
        cx.say(&format!(
            "finance approver {APPROVER} answers {} for {} (bound to arguments {}, signed with \
             {APPROVER}'s key)",
            verdict.as_str(),
            p.operation_key,
            &hash[..hash.len().min(12)]
        ))?;
        cx.watch.name_input(&approval.approval_id, &what);
        cx.watch.approve(&approval, &key)?;
        let answer = cx.reply(&approval.approval_id, "the approval's answer")?;
        let want = match verdict {
            ApprovalVerdict::Approve => Reason::ApprovalRecorded,
            ApprovalVerdict::Reject => Reason::ApprovalRejected,
        };
        r.check(&what, &answer, (Verdict::Recorded, want));
    }
    cx.until(
        &approved.operation_key,
        "the approved refund's dispatch",
        |d| d.reason == Reason::Approved,
    )?;
    cx.until_committed(&approved.operation_key)?;
    let closed = cx.until(
        &rejected.operation_key,
        "the rejected refund's denial",
        |d| d.verdict == Verdict::Denied,
    )?;
    r.check(
        "the rejected refund",
        &closed,
        (Verdict::Denied, Reason::ApprovalRejected),
    );

    cx.propose(&denied, None)?;
    let reply = cx.reply(&denied.proposal_id, "the huge refund's decision")?;
    r.check(
        "a refund over 5000.00 EUR",
        &reply,
        (Verdict::Denied, Reason::PolicyDenied),
    );
    Ok(())
}
