//! Control: operator settlement and cancellation, and run lease fences (fence 3).

use super::*;

impl Core {
    pub(super) fn handle_control(
        &self,
        view: &impl StateView,
        c: &Control,
        step: &mut Step,
    ) -> Result<()> {
        let now = step.now;
        let decision_id = format!("c/{}", c.control_id);
        let evidence = bounded(
            c.evidence.as_deref().unwrap_or(""),
            self.config.max_evidence_bytes,
        );
        // A control counts only fresh: a copy replayed long after it was issued (onto the
        // next intent of a key whose closed-intent marker is gone, which starts at epoch 1
        // again) is refused, whoever signed it.
        if now.saturating_sub(c.issued_at) > self.config.max_control_age_ms as i64 {
            return self.control_refused(
                c,
                None,
                Reason::DeadlineExpired,
                format!(
                    "the control was issued at {}, more than {} ms before it was read (now \
                     {now}); issue it again",
                    c.issued_at, self.config.max_control_age_ms
                ),
                step,
            );
        }
        if c.kind == ControlKind::LeaseFence {
            let (Some(run_id), Some(fence)) = (&c.run_id, c.lease_fence) else {
                return self.control_refused(
                    c,
                    None,
                    Reason::Malformed,
                    "LEASE_FENCE needs run_id and lease_fence".to_owned(),
                    step,
                );
            };
            if let Some(problem) = self.fence_problem(run_id, &c.operator_id) {
                return self.control_refused(c, None, Reason::TenantMismatch, problem, step);
            }
            let mut run = view.run(run_id)?.unwrap_or(RunRecord {
                highest_fence: fence,
                dispatches: 0,
                updated_at: now,
                expires_at: now,
            });
            if fence < run.highest_fence {
                // Whoever asks for a lower fence is the run's stale owner: told so, not
                // answered as if its fence held.
                return self.control_refused(
                    c,
                    None,
                    Reason::StaleFence,
                    format!(
                        "lease fence {fence} is below the run's accepted fence {} here; run \
                         {run_id} has a newer owner",
                        run.highest_fence
                    ),
                    step,
                );
            }
            run.highest_fence = fence;
            run.updated_at = now;
            run.expires_at = now.saturating_add_unsigned(self.config.run_retention_ms);
            let mut event = self.event(JournalKind::RunFenceAdvanced, step, None);
            event.run_id = Some(run_id.clone());
            event.principal_id = Some(c.operator_id.clone());
            event.lease_fence = Some(run.highest_fence);
            event.verdict = Some(Verdict::Recorded);
            event.reason = Some(Reason::FenceAdvanced);
            step.out.decisions.push(Decision {
                decision_id,
                in_reply_to: c.control_id.clone(),
                operation_key: c.operation_key.clone().unwrap_or_default(),
                run_id: Some(run_id.clone()),
                verdict: Verdict::Recorded,
                reason: Reason::FenceAdvanced,
                detail: format!("run {run_id} fenced at {}", run.highest_fence),
                arguments_hash: None,
                policy_bundle_hash: None,
                epoch: None,
                state: None,
                receipt: None,
                owner_partition: 0,
                owner_epoch: 0,
                decided_at: now,
            });
            return step.journal(
                event,
                vec![Write::Run {
                    run_id: run_id.clone(),
                    run: Some(run),
                }],
            );
        }
        let Some(key) = &c.operation_key else {
            return self.control_refused(
                c,
                None,
                Reason::Malformed,
                format!("{} needs an operation_key", c.kind.as_str()),
                step,
            );
        };
        // Under tenant-scoped ids an operator of another tenant than the key's is answered as
        // for a key nobody used: the intent's state is not theirs to learn.
        let found = match self.scoped_id(&c.operator_id, key) {
            true => view.effect(key)?,
            false => None,
        };
        let Some(mut rec) = found else {
            return self.control_refused(
                c,
                None,
                Reason::NoPendingApproval,
                format!("no intent for operation key {key}"),
                step,
            );
        };
        if rec.applied_controls.contains(&c.control_id) {
            return self.control_repeated(c, decision_id, &rec, step);
        }
        // The operator must be entitled to what the control does, on this intent's tool in its
        // tenant (Cedar actions `settle` and `cancel`), like an approver to approve.
        let operation = match c.kind {
            ControlKind::Cancel => Some(Operation::Cancel),
            ControlKind::SettleCommitted | ControlKind::SettleFailed => Some(Operation::Settle),
            ControlKind::LeaseFence => None,
        };
        if let Some(operation) = operation
            && let Err(denied) = self.authorize_on(&rec, &c.operator_id, |policy, req| {
                policy.authorize_operation(operation, req)
            })
        {
            let detail = format!(
                "{} may not {} {} intents of tenant {}: {denied}",
                c.operator_id,
                operation.action(),
                rec.tool,
                rec.tenant_id
            );
            return self.control_refused(c, Some(&rec), Reason::PolicyDenied, detail, step);
        }
        let open_attempt = matches!(
            rec.state,
            State::Dispatched { .. }
                | State::InFlight { .. }
                | State::Unknown { .. }
                | State::OperatorRequired { .. }
        );
        let (verdict, reason, detail) = match c.kind {
            ControlKind::SettleCommitted if open_attempt => {
                rec.state = State::Committed {
                    receipt: receipt(&rec, &c.control_id, &evidence),
                    evidence: evidence.clone(),
                    settled_at: now,
                };
                (
                    Verdict::Committed,
                    Reason::OperatorSettled,
                    format!("settled COMMITTED by {}: {evidence}", c.operator_id),
                )
            }
            // FAILED says the attempt did not happen and lets a retry run: an operator may say
            // it only once nobody can tell (UNKNOWN, or reconciliation gave up), never while
            // the attempt may still be running.
            ControlKind::SettleFailed if attempt_over(&rec, now) => {
                close_failed(&mut rec, now, &evidence);
                (
                    Verdict::Failed,
                    Reason::OperatorSettled,
                    format!("settled FAILED by {}: {evidence}", c.operator_id),
                )
            }
            ControlKind::Cancel
                if matches!(
                    rec.state,
                    State::AwaitingApproval { .. }
                        | State::Failed {
                            retry_at: Some(_),
                            ..
                        }
                ) =>
            {
                rec.state = State::Cancelled {
                    at: now,
                    by: c.operator_id.clone(),
                };
                (
                    Verdict::Cancelled,
                    Reason::CancelledByOperator,
                    format!("cancelled by {}: {evidence}", c.operator_id),
                )
            }
            _ => {
                let state = rec.effect_state().as_str();
                let detail = if c.kind == ControlKind::SettleFailed
                    && matches!(
                        rec.state,
                        State::Unknown { .. } | State::OperatorRequired { .. }
                    ) {
                    format!(
                        "the {state} attempt may still take effect until its command expires; \
                         settle it FAILED after that"
                    )
                } else {
                    format!(
                        "{} does not apply to an intent in state {state}",
                        c.kind.as_str()
                    )
                };
                return self.control_refused(c, Some(&rec), Reason::IntentClosed, detail, step);
            }
        };
        rec.updated_at = now;
        rec.applied_controls.push(c.control_id.clone());
        let answer = (verdict, reason, detail.clone());
        let event = self.answer_control(c, &decision_id, &rec, answer, step);
        let id = format!("e/{}/{}/{}", rec.operation_key, rec.epoch, reason.as_str());
        let to_proposal = self.reply(&id, &rec.proposal_id, &rec, verdict, reason, detail, now);
        step.out.decisions.push(to_proposal);
        step.journal(event, vec![effect_write(rec)])
    }

    /// A control whose id was already applied to this intent (an operator's tool sending it
    /// again): answered DUPLICATE under the same decision id, with the reason of its first
    /// application; the intent is not touched and the proposal gets no second reply.
    fn control_repeated(
        &self,
        c: &Control,
        decision_id: String,
        rec: &EffectRecord,
        step: &mut Step,
    ) -> Result<()> {
        let reason = match c.kind {
            ControlKind::Cancel => Reason::CancelledByOperator,
            _ => Reason::OperatorSettled,
        };
        let detail = format!(
            "control {} was already applied; the intent is {}",
            c.control_id,
            rec.effect_state().as_str()
        );
        let answer = (Verdict::Duplicate, reason, detail);
        let event = self.answer_control(c, &decision_id, rec, answer, step);
        step.journal(event, Vec::new())
    }

    /// Replies to control `c` on intent `rec` under `decision_id` and returns its
    /// CONTROL_APPLIED journal event, for the caller to journal with its writes.
    fn answer_control(
        &self,
        c: &Control,
        decision_id: &str,
        rec: &EffectRecord,
        (verdict, reason, detail): Reply,
        step: &mut Step,
    ) -> JournalEvent {
        let mut event = self.event(JournalKind::ControlApplied, step, Some(rec));
        event.principal_id = Some(c.operator_id.clone());
        event.verdict = Some(verdict);
        event.reason = Some(reason);
        event.evidence = Some(detail.clone());
        let reply = self.reply(
            decision_id,
            &c.control_id,
            rec,
            verdict,
            reason,
            detail,
            step.now,
        );
        step.out.decisions.push(reply);
        event
    }

    /// Why `operator` may not raise run `run_id`'s fence, if it may not. With tenant-scoped ids
    /// a run belongs to the tenant its id begins with, and only that tenant's principals (as
    /// the policy entities know them) fence it; in one shared namespace a run has no tenant,
    /// and anyone who may write the control topic may.
    fn fence_problem(&self, run_id: &str, operator: &str) -> Option<String> {
        match self.scoped_id(operator, run_id) {
            true => None,
            false => Some(format!(
                "{operator} may not fence run {run_id}: with processor.key_scope = \"tenant\" \
                 only a principal of the tenant the run id begins with may"
            )),
        }
    }

    fn control_refused(
        &self,
        c: &Control,
        rec: Option<&EffectRecord>,
        reason: Reason,
        detail: String,
        step: &mut Step,
    ) -> Result<()> {
        let mut event = self.event(JournalKind::ControlApplied, step, rec);
        event.operation_key = c.operation_key.clone();
        // A refused lease fence names its run, so that `airlock audit --run` shows it.
        if event.run_id.is_none() {
            event.run_id = c.run_id.clone();
        }
        if event.lease_fence.is_none() {
            event.lease_fence = c.lease_fence;
        }
        event.principal_id = Some(c.operator_id.clone());
        event.verdict = Some(Verdict::Rejected);
        event.reason = Some(reason);
        event.evidence = Some(detail.clone());
        step.out.decisions.push(Decision {
            decision_id: format!("c/{}", c.control_id),
            in_reply_to: c.control_id.clone(),
            operation_key: c.operation_key.clone().unwrap_or_default(),
            run_id: c.run_id.clone(),
            verdict: Verdict::Rejected,
            reason,
            detail,
            arguments_hash: None,
            policy_bundle_hash: None,
            epoch: rec.map(|r| r.epoch),
            state: rec.map(EffectRecord::effect_state),
            receipt: None,
            owner_partition: 0,
            owner_epoch: 0,
            decided_at: step.now,
        });
        step.journal(event, Vec::new())
    }
}

/// Whether `rec`'s attempt can no longer take effect: its outcome is UNKNOWN or waits for an
/// operator, and its command has expired (no connector may start it later, and a call made is
/// bounded by it too). Before that, FAILED would be a guess that lets a retry run beside the
/// call.
fn attempt_over(rec: &EffectRecord, now: i64) -> bool {
    match rec.state {
        // A round is asked only once the call can no longer land; before the first, the
        // lookup is scheduled at that bound.
        State::Unknown {
            rounds,
            next_reconcile_at,
            ..
        } => rounds > 0 || now >= next_reconcile_at,
        State::OperatorRequired { may_land_until, .. } => now >= may_land_until,
        _ => false,
    }
}
