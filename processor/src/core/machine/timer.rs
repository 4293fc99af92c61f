//! Timers: approval expiry, attempt timeout (UNKNOWN, never FAILED), reconciliation rounds,
//! retries of proven failures, purging after retention. A timer that no longer matches its
//! record's next timer was superseded and does nothing.

use super::*;

impl Core {
    pub(super) fn handle_timer(
        &self,
        view: &impl StateView,
        t: &TimerFired,
        step: &mut Step,
    ) -> Result<()> {
        let now = step.now;
        match &t.target {
            TimerTarget::Proposal(id) => {
                if view.proposal(id)?.is_some_and(|s| s.expires_at == t.due_at) {
                    let mut event = self.event(JournalKind::RecordPurged, step, None);
                    event.proposal_id = Some(id.clone());
                    return step.journal(
                        event,
                        vec![Write::Proposal {
                            id: id.clone(),
                            seen: None,
                        }],
                    );
                }
                Ok(())
            }
            TimerTarget::Run(run_id) => {
                if view.run(run_id)?.is_some_and(|r| r.expires_at == t.due_at) {
                    let mut event = self.event(JournalKind::RecordPurged, step, None);
                    event.run_id = Some(run_id.clone());
                    return step.journal(
                        event,
                        vec![Write::Run {
                            run_id: run_id.clone(),
                            run: None,
                        }],
                    );
                }
                Ok(())
            }
            TimerTarget::Effect(key) => {
                let Some(mut rec) = view.effect(key)? else {
                    return Ok(());
                };
                let Some((due, kind)) = rec.next_timer() else {
                    return Ok(());
                };
                if due != t.due_at {
                    return Ok(()); // superseded by a later transition
                }
                let tool = self.registry.lookup(&rec.tool, &rec.tool_version).ok();
                let mut writes = Vec::new();
                let (journal_kind, reply) = match kind {
                    TimerKind::Purge => {
                        let retention = self.config.closed_intent_retention_ms;
                        if rec.closed_until.is_some() || retention == 0 {
                            let event = self.event(JournalKind::RecordPurged, step, Some(&rec));
                            return step.journal(
                                event,
                                vec![Write::Effect {
                                    key: key.clone(),
                                    record: None,
                                }],
                            );
                        }
                        // Retention passed: the bulk goes, a closed-intent marker stays.
                        let until = now.saturating_add_unsigned(retention);
                        rec.close(until);
                        rec.updated_at = now;
                        let mut event = self.event(JournalKind::RecordPurged, step, Some(&rec));
                        event.evidence = Some(format!(
                            "retention passed: arguments, approvals and evidence purged; the key \
                             stays bound to this intent until {until}"
                        ));
                        return step.journal(event, vec![effect_write(rec)]);
                    }
                    TimerKind::ApprovalExpiry => {
                        let reason = if rec.deadline_at <= now {
                            Reason::DeadlineExpired
                        } else {
                            Reason::ApprovalTimedOut
                        };
                        rec.state = State::Expired { at: now };
                        (
                            JournalKind::RecordExpired,
                            Some((
                                Verdict::Expired,
                                reason,
                                "no approval quorum before expiry; nothing was dispatched"
                                    .to_owned(),
                            )),
                        )
                    }
                    TimerKind::AttemptTimeout => {
                        self.become_unknown(&mut rec, tool, step);
                        (
                            JournalKind::Settled,
                            Some((
                                Verdict::Unknown,
                                Reason::AttemptTimedOut,
                                format!(
                                    "no outcome for attempt {} by its deadline; held as UNKNOWN",
                                    rec.epoch
                                ),
                            )),
                        )
                    }
                    TimerKind::Reconcile => {
                        let State::Unknown { since, rounds, .. } = rec.state else {
                            unreachable!("a reconcile timer belongs to an UNKNOWN record");
                        };
                        match tool.filter(|t| rounds < t.reconcile.max_rounds) {
                            Some(tool) => {
                                let round = rounds + 1;
                                self.reconcile(&rec, round, step);
                                rec.state = State::Unknown {
                                    since,
                                    rounds: round,
                                    next_reconcile_at: now
                                        .saturating_add_unsigned(tool.reconcile.backoff_ms(round)),
                                };
                                (JournalKind::ReconcileRequested, None)
                            }
                            None => {
                                rec.state = State::OperatorRequired {
                                    since,
                                    rounds,
                                    may_land_until: 0,
                                };
                                (
                                    JournalKind::OperatorRequired,
                                    Some((
                                        Verdict::Unknown,
                                        Reason::OperatorRequired,
                                        format!(
                                            "{rounds} reconciliation rounds found no proof; an operator must settle"
                                        ),
                                    )),
                                )
                            }
                        }
                    }
                    TimerKind::Retry => self.retry(&mut rec, tool, step)?,
                };
                rec.updated_at = now;
                let mut event = self.event(journal_kind, step, Some(&rec));
                if let Some((verdict, reason, detail)) = reply {
                    event.verdict = Some(verdict);
                    event.reason = Some(reason);
                    event.evidence = Some(detail.clone());
                    let id = format!("e/{}/{}/{}", rec.operation_key, rec.epoch, reason.as_str());
                    let d = self.reply(&id, &rec.proposal_id, &rec, verdict, reason, detail, now);
                    step.out.decisions.push(d);
                }
                writes.push(effect_write(rec));
                step.journal(event, writes)
            }
        }
    }

    /// The retry timer of a proven failure: deadline, authorization now, budgets, then epoch n+1
    /// (or a new approval round when the policy now asks for one).
    fn retry(
        &self,
        rec: &mut EffectRecord,
        tool: Option<&Tool>,
        step: &mut Step,
    ) -> Result<(JournalKind, Option<Reply>)> {
        let now = step.now;
        let Some(tool) = tool else {
            close_failed(rec, now, "tool left the registry");
            return Ok((
                JournalKind::Settled,
                Some((
                    Verdict::Failed,
                    Reason::UnknownToolVersion,
                    format!("tool {} {} left the registry", rec.tool, rec.tool_version),
                )),
            ));
        };
        if rec.deadline_at <= now {
            close_failed(rec, now, "deadline passed before the retry");
            return Ok((
                JournalKind::Settled,
                Some((
                    Verdict::Failed,
                    Reason::DeadlineExpired,
                    "the deadline passed before the retry".to_owned(),
                )),
            ));
        }
        // As at an approval: the bundle in force decides the retry and is recorded either way.
        let authz = self.reauthorize(rec);
        rec.policy_bundle_hash = self.policy.bundle_hash().to_owned();
        match authz {
            Authz::Deny { .. } => {
                close_failed(rec, now, "retry denied by policy");
                Ok((
                    JournalKind::Settled,
                    Some((
                        Verdict::Failed,
                        Reason::PolicyDenied,
                        format!(
                            "authorized again before the retry under policy bundle {}: {}",
                            rec.policy_bundle_hash,
                            authz.summary()
                        ),
                    )),
                ))
            }
            Authz::Approval { .. } => {
                rec.state = State::AwaitingApproval {
                    expires_at: now
                        .saturating_add_unsigned(tool.approval.ttl_ms)
                        .min(rec.deadline_at),
                    approvals: Vec::new(),
                };
                Ok((
                    JournalKind::ProposalDecided,
                    Some((
                        Verdict::PendingApproval,
                        Reason::ApprovalRequired,
                        "the retry needs approval".to_owned(),
                    )),
                ))
            }
            Authz::Auto { .. } => {
                if let Some(refused) = self.budget_refusal(rec, tool, now) {
                    return Ok((JournalKind::Settled, Some(refused)));
                }
                self.dispatch(rec, tool, now, step);
                Ok((
                    JournalKind::DispatchIntent,
                    Some((
                        Verdict::Accepted,
                        Reason::RetryAfterFailure,
                        format!("retrying a proven failure as attempt {}", rec.epoch),
                    )),
                ))
            }
        }
    }
}
