//! Outcomes: attempt epochs (fence 2). A stale epoch changes nothing and is kept as evidence;
//! a commit of an older epoch raises the double-effect alert; COMMITTED never regresses;
//! UNKNOWN starts reconciliation and is never guessed FAILED; a reconcile answer counts only
//! for a round that was asked.

use super::*;

impl Core {
    pub(super) fn handle_outcome(
        &self,
        view: &impl StateView,
        o: &Outcome,
        step: &mut Step,
    ) -> Result<()> {
        let now = step.now;
        let evidence = bounded(
            o.evidence.as_deref().unwrap_or(""),
            self.config.max_evidence_bytes,
        );
        let Some(mut rec) = view.effect(&o.operation_key)? else {
            let mut event = self.event(JournalKind::OutcomeIgnored, step, None);
            event.operation_key = Some(o.operation_key.clone());
            event.epoch = Some(o.epoch);
            event.principal_id = Some(o.worker_id.clone());
            event.evidence = Some(format!(
                "{} for an unknown operation key: {evidence}",
                o.kind.as_str()
            ));
            return step.journal(event, Vec::new());
        };
        if o.connector != rec.connector {
            // Only the connector the effect was dispatched to can know what became of it.
            let mut event = self.event(JournalKind::OutcomeIgnored, step, Some(&rec));
            event.principal_id = Some(o.worker_id.clone());
            event.epoch = Some(o.epoch);
            event.evidence = Some(format!(
                "{} from connector {:?}; the effect was dispatched to {:?}: {evidence}",
                o.kind.as_str(),
                o.connector,
                rec.connector
            ));
            return step.journal(event, Vec::new());
        }
        let committed = matches!(
            o.kind,
            OutcomeKind::Committed | OutcomeKind::ReconciledCommitted
        );
        if o.epoch != rec.epoch {
            // Fence 2: a stale epoch changes nothing; it is kept as evidence. A commit of an
            // older attempt means two attempts may both have taken effect.
            let alert = committed && o.epoch < rec.epoch;
            let kind = if alert {
                JournalKind::DoubleEffectAlert
            } else {
                JournalKind::OutcomeIgnored
            };
            let mut event = self.event(kind, step, Some(&rec));
            event.principal_id = Some(o.worker_id.clone());
            event.epoch = Some(o.epoch);
            event.evidence = Some(format!(
                "{} for epoch {} while the current epoch is {}: {evidence}",
                o.kind.as_str(),
                o.epoch,
                rec.epoch
            ));
            return step.journal(event, Vec::new());
        }
        let tool = self.registry.lookup(&rec.tool, &rec.tool_version).ok();
        let open_attempt = matches!(
            rec.state,
            State::Dispatched { .. }
                | State::InFlight { .. }
                | State::Unknown { .. }
                | State::OperatorRequired { .. }
        );
        let reconciled = matches!(
            o.kind,
            OutcomeKind::ReconciledCommitted
                | OutcomeKind::ReconciledFailed
                | OutcomeKind::ReconciledUnknown
        );
        // A reconcile answer counts only for a round this processor asked: while the attempt
        // is still running no round was asked, and a "proof" that it failed would let a second
        // epoch run beside it. Once the attempt is closed the arms below judge it like any
        // outcome (a reconciled commit still corrects a failure: it is what happened).
        let asked = match rec.state {
            State::Dispatched { .. } | State::InFlight { .. } => false,
            State::Unknown { rounds, .. } | State::OperatorRequired { rounds, .. } => o
                .reconcile_round
                .is_some_and(|r| r >= 1 && u32::try_from(r).is_ok_and(|r| r <= rounds)),
            _ => o.reconcile_round.is_some_and(|r| r >= 1),
        };
        if reconciled && !asked {
            let mut event = self.event(JournalKind::OutcomeIgnored, step, Some(&rec));
            event.principal_id = Some(o.worker_id.clone());
            event.evidence = Some(format!(
                "{} for reconcile round {} while {}: no such round was asked: {evidence}",
                o.kind.as_str(),
                o.reconcile_round
                    .map_or_else(|| "none".to_owned(), |r| r.to_string()),
                rec.effect_state().as_str()
            ));
            return step.journal(event, Vec::new());
        }
        let (kind, reply): (JournalKind, Option<Reply>) = match o.kind {
            OutcomeKind::AttemptStarted => match rec.state {
                State::Dispatched {
                    attempt_deadline_at,
                    timeout_at,
                } => {
                    rec.state = State::InFlight {
                        attempt_deadline_at,
                        timeout_at,
                        started_at: now,
                    };
                    (JournalKind::AttemptStarted, None)
                }
                _ => return Ok(()), // duplicate or late: no-op
            },
            OutcomeKind::Committed | OutcomeKind::ReconciledCommitted
                if open_attempt || matches!(rec.state, State::Failed { .. }) =>
            {
                let contradicted = matches!(rec.state, State::Failed { .. });
                rec.state = State::Committed {
                    receipt: receipt(&rec, &o.outcome_id, &evidence),
                    evidence: evidence.clone(),
                    settled_at: now,
                };
                let reason = if reconciled {
                    Reason::Reconciled
                } else {
                    Reason::OutcomeCommitted
                };
                let detail = if contradicted {
                    format!("committed, contradicting an earlier failure: {evidence}")
                } else {
                    format!("committed: {evidence}")
                };
                (
                    JournalKind::Settled,
                    Some((Verdict::Committed, reason, detail)),
                )
            }
            OutcomeKind::Failed | OutcomeKind::ReconciledFailed if open_attempt => {
                let reason = if reconciled {
                    Reason::Reconciled
                } else {
                    Reason::OutcomeFailed
                };
                let reply = self.fail_with_proof(&mut rec, tool, &evidence, now);
                (
                    JournalKind::Settled,
                    reply.map(|d| (Verdict::Failed, reason, d)),
                )
            }
            OutcomeKind::Unknown
                if matches!(rec.state, State::Dispatched { .. } | State::InFlight { .. }) =>
            {
                let detail = format!("the connector could not tell what happened: {evidence}");
                self.become_unknown(&mut rec, tool, step);
                (
                    JournalKind::Settled,
                    Some((Verdict::Unknown, Reason::OutcomeUnknown, detail)),
                )
            }
            _ => {
                // Duplicates, RECONCILED_UNKNOWN (the next round is already scheduled), and
                // anything that would regress a settled state: evidence only.
                if matches!(rec.state, State::Committed { .. }) && committed {
                    return Ok(());
                }
                let mut event = self.event(JournalKind::OutcomeIgnored, step, Some(&rec));
                event.principal_id = Some(o.worker_id.clone());
                event.evidence = Some(format!(
                    "{} while {}: {evidence}",
                    o.kind.as_str(),
                    rec.effect_state().as_str()
                ));
                return step.journal(event, Vec::new());
            }
        };
        rec.updated_at = now;
        let mut event = self.event(kind, step, Some(&rec));
        event.principal_id = Some(o.worker_id.clone());
        event.evidence = Some(evidence);
        if let Some((verdict, reason, detail)) = reply {
            event.verdict = Some(verdict);
            event.reason = Some(reason);
            let id = format!("e/{}/{}/{}", rec.operation_key, rec.epoch, reason.as_str());
            let decision = self.reply(&id, &rec.proposal_id, &rec, verdict, reason, detail, now);
            step.out.decisions.push(decision);
        }
        step.journal(event, vec![effect_write(rec)])
    }
}
