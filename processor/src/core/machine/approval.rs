//! Approvals: bound to the arguments hash, single use, expiring, from an entitled approver who
//! is not the requester, counted until the tool's quorum of distinct approvers; authorization
//! is evaluated again when the quorum is reached.

use super::*;

impl Core {
    pub(super) fn handle_approval(
        &self,
        view: &impl StateView,
        a: &Approval,
        step: &mut Step,
    ) -> Result<()> {
        let now = step.now;
        // An approval names its intent's tenant, and under tenant-scoped ids its approver must
        // be one of that tenant's principals. Otherwise the intent is not there for it: answered
        // as a key nobody used, since whether the key is used, its state, run and approvals are
        // not the sender's to learn.
        let existing = match self.scoped_to(&a.approver_id, &a.tenant_id) {
            true => view
                .effect(&a.operation_key)?
                .filter(|rec| rec.tenant_id == a.tenant_id),
            false => None,
        };
        let refusal = |verdict: Verdict, reason: Reason, detail: String| (verdict, reason, detail);
        let checked = match &existing {
            None => Err(refusal(
                Verdict::Rejected,
                Reason::NoPendingApproval,
                format!(
                    "no intent of tenant {} under operation key {}",
                    a.tenant_id, a.operation_key
                ),
            )),
            Some(rec) if rec.used_approvals.contains(&a.approval_id) => Err(refusal(
                Verdict::Duplicate,
                Reason::ApprovalDuplicate,
                "this approval was already counted".to_owned(),
            )),
            Some(rec) => match &rec.state {
                State::AwaitingApproval {
                    approvals,
                    expires_at,
                } => self.check_approval(rec, approvals, *expires_at, a, now),
                _ => Err(refusal(
                    Verdict::Rejected,
                    Reason::NoPendingApproval,
                    format!(
                        "the intent is {}, not awaiting approval",
                        rec.effect_state().as_str()
                    ),
                )),
            },
        };
        let decision_id = format!("a/{}", a.approval_id);
        let mut event = self.event(JournalKind::ApprovalDecided, step, existing.as_ref());
        event.principal_id = Some(a.approver_id.clone());
        event.arguments_hash = Some(a.arguments_hash.clone());
        let (verdict, reason, detail) = match checked {
            Err(refused) => refused,
            Ok(()) => {
                let mut rec = existing.expect("checked approvals have a record");
                return self.count_approval(&mut rec, a, event, decision_id, step);
            }
        };
        event.verdict = Some(verdict);
        event.reason = Some(reason);
        event.evidence = Some(detail.clone());
        step.journal(event, Vec::new())?;
        step.out.decisions.push(Decision {
            decision_id,
            in_reply_to: a.approval_id.clone(),
            operation_key: a.operation_key.clone(),
            run_id: existing.as_ref().map(|r| r.run_id.clone()),
            verdict,
            reason,
            detail,
            arguments_hash: Some(a.arguments_hash.clone()),
            policy_bundle_hash: None,
            epoch: None,
            state: existing.as_ref().map(EffectRecord::effect_state),
            receipt: None,
            owner_partition: 0,
            owner_epoch: 0,
            decided_at: now,
        });
        Ok(())
    }

    fn check_approval(
        &self,
        rec: &EffectRecord,
        approvals: &[(String, String)],
        window_closes_at: i64,
        a: &Approval,
        now: i64,
    ) -> std::result::Result<(), Reply> {
        // The window is checked at the approval's own time, not only by the expiry timer: an
        // approval read late (lag, a restart) is judged by when it was recorded.
        if window_closes_at <= now {
            return Err((
                Verdict::Rejected,
                Reason::ApprovalExpired,
                format!("the intent's approval window closed at {window_closes_at} (now {now})"),
            ));
        }
        if a.arguments_hash != rec.arguments_hash {
            // Names only the approval's own hash: the intent's arguments are not the sender's
            // to learn.
            return Err((
                Verdict::Rejected,
                Reason::ApprovalHashMismatch,
                format!(
                    "the approval is for arguments {}, which are not the intent's",
                    a.arguments_hash
                ),
            ));
        }
        if a.expires_at <= now {
            return Err((
                Verdict::Rejected,
                Reason::ApprovalExpired,
                format!("the approval expired at {} (now {now})", a.expires_at),
            ));
        }
        if a.approver_id == rec.principal_id || rec.earlier_requesters.contains(&a.approver_id) {
            return Err((
                Verdict::Rejected,
                Reason::SelfApproval,
                "a requester of the intent cannot approve it".to_owned(),
            ));
        }
        if let Err(denied) = self.authorize_on(rec, &a.approver_id, Policy::authorize_approve) {
            return Err((
                Verdict::Rejected,
                Reason::ApproverNotEntitled,
                format!("{} may not approve {}: {denied:?}", a.approver_id, rec.tool),
            ));
        }
        if approvals
            .iter()
            .any(|(_, approver)| approver == &a.approver_id)
        {
            return Err((
                Verdict::Duplicate,
                Reason::ApprovalDuplicate,
                format!("{} already approved this intent", a.approver_id),
            ));
        }
        Ok(())
    }

    fn count_approval(
        &self,
        rec: &mut EffectRecord,
        a: &Approval,
        mut event: JournalEvent,
        decision_id: String,
        step: &mut Step,
    ) -> Result<()> {
        let now = step.now;
        rec.used_approvals.push(a.approval_id.clone());
        rec.updated_at = now;
        let mut writes = Vec::new();
        let (verdict, reason, detail);
        let mut to_proposal: Option<Reply> = None;
        if a.verdict == ApprovalVerdict::Reject {
            rec.state = State::Denied {
                at: now,
                by: a.approver_id.clone(),
            };
            (verdict, reason, detail) = (
                Verdict::Recorded,
                Reason::ApprovalRejected,
                format!("{} rejected the intent", a.approver_id),
            );
            to_proposal = Some((Verdict::Denied, Reason::ApprovalRejected, detail.clone()));
        } else {
            let State::AwaitingApproval { approvals, .. } = &mut rec.state else {
                unreachable!("count_approval is only called for AWAITING_APPROVAL records");
            };
            approvals.push((a.approval_id.clone(), a.approver_id.clone()));
            let have = approvals.len() as u32;
            let tool = self.registry.lookup(&rec.tool, &rec.tool_version).ok();
            let quorum = tool.map_or(1, |t| t.approval.quorum);
            (verdict, reason) = (Verdict::Recorded, Reason::ApprovalRecorded);
            detail = format!("{have} of {quorum} approvals");
            if have >= quorum {
                to_proposal = Some(self.approved(rec, tool, step)?);
            }
        }
        event.verdict = Some(verdict);
        event.reason = Some(reason);
        event.evidence = Some(detail.clone());
        event.state = Some(rec.effect_state());
        event.epoch = Some(rec.epoch);
        event.policy_bundle_hash = Some(rec.policy_bundle_hash.clone());
        if let Some((v, r, d)) = to_proposal {
            let id = format!("e/{}/{}/{}", rec.operation_key, rec.epoch, r.as_str());
            let reply = self.reply(&id, &rec.proposal_id.clone(), rec, v, r, d, now);
            step.out.decisions.push(reply);
        }
        let to_approver = self.reply(
            &decision_id,
            &a.approval_id,
            rec,
            verdict,
            reason,
            detail,
            now,
        );
        step.out.decisions.push(to_approver);
        writes.push(effect_write(rec.clone()));
        step.journal(event, writes)
    }

    /// The quorum is reached: deadline, authorization (evaluated now, not when proposed) and
    /// budgets again, then dispatch. Returns the reply owed to the original proposal.
    fn approved(
        &self,
        rec: &mut EffectRecord,
        tool: Option<&Tool>,
        step: &mut Step,
    ) -> Result<Reply> {
        let now = step.now;
        let Some(tool) = tool else {
            rec.state = State::Denied {
                at: now,
                by: "registry".to_owned(),
            };
            return Ok((
                Verdict::Denied,
                Reason::UnknownToolVersion,
                format!("tool {} {} left the registry", rec.tool, rec.tool_version),
            ));
        };
        if rec.deadline_at <= now {
            rec.state = State::Expired { at: now };
            return Ok((
                Verdict::Expired,
                Reason::DeadlineExpired,
                "approved after the intent's deadline".to_owned(),
            ));
        }
        // The bundle in force now decides, and the intent records it whatever it answers: a
        // denial names the bundle that denied, not the one that asked for the approval.
        let authz = self.reauthorize(rec);
        rec.policy_bundle_hash = self.policy.bundle_hash().to_owned();
        if let Authz::Deny { .. } = authz {
            rec.state = State::Denied {
                at: now,
                by: "policy".to_owned(),
            };
            return Ok((
                Verdict::Denied,
                Reason::PolicyDenied,
                format!(
                    "authorized again at the approval under policy bundle {}: {}",
                    rec.policy_bundle_hash,
                    authz.summary()
                ),
            ));
        }
        if let Some(refused) = self.budget_refusal(rec, tool, now) {
            return Ok(refused);
        }
        self.dispatch(rec, tool, now, step);
        Ok((
            Verdict::Accepted,
            Reason::Approved,
            format!("approved; dispatched attempt {}", rec.epoch),
        ))
    }
}
