//! Proposals: DESIGN.md section 4's validation order, then section 3's idempotency contract
//! for an existing key. Every proposal gets exactly one reply, remembered by proposal id.

use super::*;

impl Core {
    pub(super) fn handle_proposal(
        &self,
        view: &impl StateView,
        p: &ToolProposal,
        step: &mut Step,
    ) -> Result<()> {
        // Before the id is looked up: a proposal naming another tenant's ids must neither
        // learn whether they are used nor take them (its refusal is not remembered).
        if let Some(detail) = self.scope_problem(p) {
            return self.refuse_unremembered(
                p,
                (Verdict::Rejected, Reason::TenantMismatch, detail),
                step,
            );
        }
        if let Some(seen) = view.proposal(&p.proposal_id)? {
            let fingerprint = proposal_fingerprint(p);
            if seen.fingerprint.as_ref().is_some_and(|f| *f != fingerprint) {
                let detail = format!(
                    "proposal id {} was already used by another proposal; give each proposal \
                     its own id",
                    p.proposal_id
                );
                return self.refuse_unremembered(
                    p,
                    (Verdict::Conflict, Reason::HashConflict, detail),
                    step,
                );
            }
            // A producer-side resend: the same reply again, nothing else.
            step.out.decisions.push(Decision {
                decision_id: seen.decision_id.clone(),
                in_reply_to: p.proposal_id.clone(),
                operation_key: seen.operation_key.clone(),
                run_id: Some(p.run_id.clone()),
                verdict: seen.verdict,
                reason: seen.reason,
                detail: seen.detail.clone(),
                arguments_hash: seen.arguments_hash.clone(),
                policy_bundle_hash: seen.policy_bundle_hash.clone(),
                epoch: None,
                state: None,
                receipt: None,
                owner_partition: 0,
                owner_epoch: 0,
                decided_at: seen.decided_at,
            });
            return Ok(());
        }
        match self.evaluate_proposal(view, p, step.now)? {
            Evaluation::Refused(refusal) => self.refuse_proposal(p, refusal, step),
            Evaluation::Admitted(admitted) => self.admit_proposal(view, p, *admitted, step),
        }
    }

    /// Why `p` may not use the ids it names under tenant-scoped ids ([`KeyScope::problem`]),
    /// or may not name its tenant: the policy entities must place its principal in that tenant,
    /// or naming another tenant would give it that tenant's ids.
    fn scope_problem(&self, p: &ToolProposal) -> Option<String> {
        if let Some(problem) = self.config.key_scope.problem(p) {
            return Some(problem);
        }
        match self.scoped_to(&p.principal_id, &p.tenant_id) {
            true => None,
            false => Some(format!(
                "principal {} is not one of tenant {}'s in the policy entities: with \
                 processor.key_scope = \"tenant\" a proposal names its principal's tenant",
                p.principal_id, p.tenant_id
            )),
        }
    }

    /// Whether `principal` may act on ids of `tenant`: always in the shared namespace; under
    /// tenant-scoped ids only when the policy entities place the principal in that tenant.
    pub(super) fn scoped_to(&self, principal: &str, tenant: &str) -> bool {
        self.config.key_scope != KeyScope::Tenant
            || self.policy.principal_tenant(principal) == Some(tenant)
    }

    /// Whether `principal` may act on the tenant-scoped id `id` (an operation key, a run id):
    /// always in the shared namespace; under tenant-scoped ids only when `id` belongs to the
    /// principal's tenant ([`KeyScope::tenant_of`]).
    pub(super) fn scoped_id(&self, principal: &str, id: &str) -> bool {
        self.config.key_scope != KeyScope::Tenant
            || KeyScope::tenant_of(id).is_some_and(|tenant| self.scoped_to(principal, tenant))
    }

    /// A proposal refused without being remembered: another proposal under an id already
    /// answered (a reused or guessed id, perhaps another tenant's), or one whose ids are not
    /// its tenant's ([`KeyScope::problem`]). The refusal names nothing of any other proposal
    /// or intent, and the id stays free, or the first proposal's.
    fn refuse_unremembered(&self, p: &ToolProposal, reply: Reply, step: &mut Step) -> Result<()> {
        let (verdict, reason, detail) = reply;
        let fingerprint = proposal_fingerprint(p);
        let mut event = self.event(JournalKind::ProposalDecided, step, None);
        fill_from_proposal(&mut event, p);
        // The id is another proposal's, or free: this refusal is not the decision of the
        // proposal that owns it (an auditor must not count that one as refused), so the
        // event names no proposal.
        event.proposal_id = None;
        event.verdict = Some(verdict);
        event.reason = Some(reason);
        event.evidence = Some(detail.clone());
        step.journal(event, Vec::new())?;
        step.out.decisions.push(Decision {
            // `r/`: an answer to this content under the id, never the answer of the proposal
            // that owns it (clients waiting for that one skip it).
            decision_id: format!("r/{}/{fingerprint}", p.proposal_id),
            in_reply_to: p.proposal_id.clone(),
            operation_key: p.operation_key.clone(),
            run_id: Some(p.run_id.clone()),
            verdict,
            reason,
            detail,
            arguments_hash: None,
            policy_bundle_hash: None,
            epoch: None,
            state: None,
            receipt: None,
            owner_partition: 0,
            owner_epoch: 0,
            decided_at: step.now,
        });
        Ok(())
    }

    /// The part of a proposal's decision that needs no state (DESIGN.md section 4, steps 1 to
    /// 6): what this core's registry and policy say of `p` before its key, run and deadline are
    /// consulted. `airlock replay --policy` compares two policy bundles with it.
    pub fn screen_proposal(&self, p: &ToolProposal) -> (Verdict, Reason) {
        match self.screen(p) {
            Screen::Refused(r) => (r.verdict, r.reason),
            Screen::Passed { authz, .. } => match authz {
                Authz::Approval { .. } => (Verdict::PendingApproval, Reason::ApprovalRequired),
                _ => (Verdict::Accepted, Reason::AutoApproved),
            },
        }
    }

    /// Steps (1) to (8) of DESIGN.md section 4, stopping at the first refusal.
    fn evaluate_proposal(
        &self,
        view: &impl StateView,
        p: &ToolProposal,
        now: i64,
    ) -> Result<Evaluation<'_>> {
        let (tool, canonical, authz) = match self.screen(p) {
            Screen::Refused(r) => return Ok(Evaluation::Refused(r)),
            Screen::Passed {
                tool,
                canonical,
                authz,
            } => (tool, canonical, authz),
        };

        let bundle = Some(self.policy.bundle_hash().to_owned());
        let refuse_bound = |verdict, reason, detail: String, receipt: Option<String>| {
            Ok(Evaluation::Refused(Refusal {
                verdict,
                reason,
                detail,
                arguments_hash: Some(canonical.hash.clone()),
                policy_bundle_hash: bundle.clone(),
                receipt,
            }))
        };
        // (7) lease fence, deadline, unresolved state of the key
        let run = view.run(&p.run_id)?;
        if let Some(run) = &run
            && p.lease_fence < run.highest_fence
        {
            return refuse_bound(
                Verdict::Rejected,
                Reason::StaleFence,
                format!(
                    "lease fence {} is below the run's accepted fence {}",
                    p.lease_fence, run.highest_fence
                ),
                None,
            );
        }
        if p.deadline_at <= now {
            return refuse_bound(
                Verdict::Rejected,
                Reason::DeadlineExpired,
                format!(
                    "the intent's deadline {} has passed (now {now})",
                    p.deadline_at
                ),
                None,
            );
        }
        let existing = view.effect(&p.operation_key)?;
        let mut retry = false;
        if let Some(rec) = &existing {
            // A key binds tool, version, tenant and arguments together: anything else under it
            // is another intent. The refusal names none of the bound intent's data (it may be
            // another tenant's).
            if rec.arguments_hash != canonical.hash
                || rec.tool != tool.name
                || rec.tool_version != tool.version
                || rec.tenant_id != p.tenant_id
            {
                return refuse_bound(
                    Verdict::Conflict,
                    Reason::HashConflict,
                    format!(
                        "operation key {} is bound to another intent (its tool, version, tenant \
                         or arguments differ); a new intent needs a new key",
                        p.operation_key
                    ),
                    None,
                );
            }
            if rec.closed_until.is_some() && !matches!(rec.state, State::Committed { .. }) {
                // A closed-intent marker: the arguments are gone, so nothing can be attempted
                // again under this key, and its state still answers.
                return refuse_bound(
                    Verdict::Rejected,
                    Reason::IntentClosed,
                    format!(
                        "the intent is closed ({}) and its details were purged after retention; \
                         a new intent needs a new key",
                        rec.effect_state().as_str()
                    ),
                    None,
                );
            }
            match &rec.state {
                State::Committed { receipt, .. } => {
                    return refuse_bound(
                        Verdict::Duplicate,
                        Reason::AlreadyCommitted,
                        format!("committed at epoch {}", rec.epoch),
                        Some(receipt.clone()),
                    );
                }
                State::Dispatched { .. } | State::InFlight { .. } => {
                    return refuse_bound(
                        Verdict::InProgress,
                        Reason::AttemptInProgress,
                        format!("attempt {} is in progress", rec.epoch),
                        None,
                    );
                }
                State::Unknown { .. } | State::OperatorRequired { .. } => {
                    return refuse_bound(
                        Verdict::Ambiguous,
                        Reason::OutcomeUnknown,
                        format!(
                            "attempt {} may have happened; held until reconciliation",
                            rec.epoch
                        ),
                        None,
                    );
                }
                State::AwaitingApproval { .. } => {
                    return refuse_bound(
                        Verdict::PendingApproval,
                        Reason::AwaitingApproval,
                        "waiting for approval".to_owned(),
                        None,
                    );
                }
                State::Expired { .. } | State::Denied { .. } | State::Cancelled { .. } => {
                    return refuse_bound(
                        Verdict::Rejected,
                        Reason::IntentClosed,
                        format!(
                            "the intent is closed ({}); a new intent needs a new key",
                            rec.effect_state().as_str()
                        ),
                        None,
                    );
                }
                State::Failed { .. } => {
                    // The deadline belongs to the intent, fixed by its first proposal: a
                    // re-proposal cannot extend it.
                    if rec.deadline_at <= now {
                        return refuse_bound(
                            Verdict::Rejected,
                            Reason::DeadlineExpired,
                            format!(
                                "the intent's deadline {} has passed (now {now}); a new intent needs a new key",
                                rec.deadline_at
                            ),
                            None,
                        );
                    }
                    // (8) a new attempt only if the contract and the attempt budget allow.
                    if !tool.contract.idempotent_by_key {
                        return refuse_bound(
                            Verdict::Rejected,
                            Reason::RetryNotAllowed,
                            format!(
                                "tool {} is not idempotent by key; a failed intent is final",
                                tool.name
                            ),
                            None,
                        );
                    }
                    if rec.attempts >= tool.retry.max_attempts {
                        return refuse_bound(
                            Verdict::Rejected,
                            Reason::AttemptsExhausted,
                            format!(
                                "{} of {} attempts used",
                                rec.attempts, tool.retry.max_attempts
                            ),
                            None,
                        );
                    }
                    retry = true;
                }
            }
        }
        // (8) the run's dispatch budget, when this proposal would dispatch now
        let dispatches = run.as_ref().map_or(0, |r| r.dispatches);
        if matches!(authz, Authz::Auto { .. }) && dispatches >= self.config.max_dispatches_per_run {
            return refuse_bound(
                Verdict::Rejected,
                Reason::RunBudgetExhausted,
                format!(
                    "run {} already caused {dispatches} dispatches on this partition",
                    p.run_id
                ),
                None,
            );
        }
        Ok(Evaluation::Admitted(Box::new(Admitted {
            tool,
            canonical,
            authz,
            existing,
            run,
            retry,
        })))
    }

    /// An empty identifier is MALFORMED; one over the limit is OVERSIZED.
    /// Steps (1) to (6): shape, tool, canonical arguments, binding, invariants, policy.
    fn screen(&self, p: &ToolProposal) -> Screen<'_> {
        let refuse = |verdict, reason, detail: String| {
            Screen::Refused(Evaluation::refusal(verdict, reason, detail))
        };
        // (1) shape and size
        if let Some((reason, problem)) = self.identity_problem(p) {
            return refuse(Verdict::Rejected, reason, problem);
        }
        if p.arguments_json.len() > self.config.max_arguments_bytes {
            return refuse(
                Verdict::Rejected,
                Reason::ArgumentsTooLarge,
                format!(
                    "arguments are {} bytes, the limit is {}",
                    p.arguments_json.len(),
                    self.config.max_arguments_bytes
                ),
            );
        }
        // (2) known tool and version
        let tool = match self.registry.lookup(&p.tool, &p.tool_version) {
            Ok(tool) => tool,
            Err(LookupError::UnknownTool) => {
                return refuse(
                    Verdict::Rejected,
                    Reason::UnknownTool,
                    format!("no tool named {:?} in the registry", p.tool),
                );
            }
            Err(LookupError::UnknownVersion) => {
                return refuse(
                    Verdict::Rejected,
                    Reason::UnknownToolVersion,
                    format!("tool {:?} has no version {:?}", p.tool, p.tool_version),
                );
            }
        };
        if p.arguments_json.len() > tool.max_arguments_bytes {
            return refuse(
                Verdict::Rejected,
                Reason::ArgumentsTooLarge,
                format!(
                    "arguments are {} bytes, tool {} allows {}",
                    p.arguments_json.len(),
                    tool.name,
                    tool.max_arguments_bytes
                ),
            );
        }
        // (3) canonical arguments and hash check
        let canonical = match canonical::canonicalize(&p.arguments_json) {
            Ok(c) => c,
            Err(e) => return refuse(Verdict::Rejected, Reason::ArgumentsInvalid, e.to_string()),
        };
        if let Err(problem) = tool.validate_arguments(&canonical.value) {
            return refuse(Verdict::Rejected, Reason::ArgumentsSchemaViolation, problem);
        }
        if let Some(claimed) = &p.arguments_hash
            && !claimed.eq_ignore_ascii_case(&canonical.hash)
        {
            return Screen::Refused(Evaluation::refusal_with_hash(
                Reason::ArgumentsHashMismatch,
                format!(
                    "the proposal claims arguments hash {claimed}, the canonical arguments hash to {}",
                    canonical.hash
                ),
                canonical.hash,
            ));
        }
        // (4) tenant and resource binding
        match tool.tenant_of(&canonical.value) {
            Some(tenant) if tenant == p.tenant_id => {}
            Some(tenant) => {
                return refuse(
                    Verdict::Rejected,
                    Reason::TenantMismatch,
                    format!(
                        "argument {} names tenant {tenant:?}, the proposal's tenant is {:?}",
                        tool.tenant_argument, p.tenant_id
                    ),
                );
            }
            None => {
                return refuse(
                    Verdict::Rejected,
                    Reason::TenantMismatch,
                    format!("argument {} (the tenant) is missing", tool.tenant_argument),
                );
            }
        }
        let Some(resource) = tool.resource_of(&canonical.value) else {
            return refuse(
                Verdict::Rejected,
                Reason::ResourceUnbound,
                format!(
                    "argument {} (the resource) is missing or not a string or integer",
                    tool.resource_argument
                ),
            );
        };
        // (5) business invariants
        if let Err(problem) = tool.check_invariants(&canonical.value) {
            return refuse(Verdict::Rejected, Reason::InvariantViolated, problem);
        }
        // (6) authorization, evaluated now
        let authz = self.policy.authorize_invoke(&AuthzRequest {
            principal: &p.principal_id,
            tenant: &p.tenant_id,
            tool: &p.tool,
            tool_version: &p.tool_version,
            resource: &resource,
            run_id: &p.run_id,
            arguments: &canonical.value,
        });
        if let Authz::Deny { .. } = authz {
            return Screen::Refused(Refusal {
                verdict: Verdict::Denied,
                reason: Reason::PolicyDenied,
                detail: authz.summary(),
                arguments_hash: Some(canonical.hash),
                policy_bundle_hash: Some(self.policy.bundle_hash().to_owned()),
                receipt: None,
            });
        }
        Screen::Passed {
            tool,
            canonical,
            authz,
        }
    }

    fn identity_problem(&self, p: &ToolProposal) -> Option<(Reason, String)> {
        let max = self.config.max_identifier_bytes;
        let fields = [
            ("proposal_id", &p.proposal_id),
            ("operation_key", &p.operation_key),
            ("run_id", &p.run_id),
            ("tenant_id", &p.tenant_id),
            ("principal_id", &p.principal_id),
            ("tool", &p.tool),
            ("tool_version", &p.tool_version),
        ];
        fields.iter().find_map(|(name, value)| {
            if value.is_empty() {
                Some((Reason::Malformed, format!("{name} is empty")))
            } else if value.len() > max {
                Some((
                    Reason::Oversized,
                    format!("{name} is {} bytes, the limit is {max}", value.len()),
                ))
            } else {
                None
            }
        })
    }

    fn refuse_proposal(&self, p: &ToolProposal, mut r: Refusal, step: &mut Step) -> Result<()> {
        // Refusals before authorization still record the bundle in force (and the resend
        // reply repeats it, whatever bundle is in force then).
        if r.policy_bundle_hash.is_none() {
            r.policy_bundle_hash = Some(self.policy.bundle_hash().to_owned());
        }
        let decision_id = format!("p/{}", p.proposal_id);
        let seen = ProposalSeen {
            operation_key: p.operation_key.clone(),
            decision_id: decision_id.clone(),
            verdict: r.verdict,
            reason: r.reason,
            detail: r.detail.clone(),
            arguments_hash: r.arguments_hash.clone(),
            policy_bundle_hash: r.policy_bundle_hash.clone(),
            decided_at: step.now,
            expires_at: step
                .now
                .saturating_add_unsigned(self.config.proposal_dedup_retention_ms),
            fingerprint: Some(proposal_fingerprint(p)),
        };
        let mut event = self.event(JournalKind::ProposalDecided, step, None);
        fill_from_proposal(&mut event, p);
        event.arguments_hash.clone_from(&r.arguments_hash);
        event.policy_bundle_hash.clone_from(&r.policy_bundle_hash);
        event.verdict = Some(r.verdict);
        event.reason = Some(r.reason);
        event.evidence = Some(r.detail.clone());
        step.journal(
            event,
            vec![Write::Proposal {
                id: p.proposal_id.clone(),
                seen: Some(seen),
            }],
        )?;
        step.out.decisions.push(Decision {
            decision_id,
            in_reply_to: p.proposal_id.clone(),
            operation_key: p.operation_key.clone(),
            run_id: Some(p.run_id.clone()),
            verdict: r.verdict,
            reason: r.reason,
            detail: r.detail,
            arguments_hash: r.arguments_hash,
            policy_bundle_hash: r.policy_bundle_hash,
            epoch: None,
            state: None,
            receipt: r.receipt,
            owner_partition: 0,
            owner_epoch: 0,
            decided_at: step.now,
        });
        Ok(())
    }

    fn admit_proposal(
        &self,
        _view: &impl StateView,
        p: &ToolProposal,
        a: Admitted<'_>,
        step: &mut Step,
    ) -> Result<()> {
        let now = step.now;
        let bundle = self.policy.bundle_hash().to_owned();
        let mut rec = match a.existing {
            Some(rec) => rec,
            None => EffectRecord {
                operation_key: p.operation_key.clone(),
                tenant_id: p.tenant_id.clone(),
                principal_id: p.principal_id.clone(),
                run_id: p.run_id.clone(),
                proposal_id: p.proposal_id.clone(),
                tool: a.tool.name.clone(),
                tool_version: a.tool.version.clone(),
                connector: a.tool.connector.clone(),
                arguments_json: a.canonical.json.clone(),
                arguments_hash: a.canonical.hash.clone(),
                idempotency_key: canonical::idempotency_key(&p.operation_key),
                lease_fence: p.lease_fence,
                deadline_at: p.deadline_at,
                created_at: now,
                policy_bundle_hash: bundle.clone(),
                epoch: 0,
                attempts: 0,
                used_approvals: Vec::new(),
                applied_controls: Vec::new(),
                earlier_requesters: Vec::new(),
                retention_ms: a.tool.retention_ms,
                closed_until: None,
                // Replaced below; a record is never written in this placeholder state.
                state: State::Expired { at: now },
                updated_at: now,
            },
        };
        if rec.principal_id != p.principal_id {
            // A retry proposed by another principal: the attempt is theirs.
            let earlier = std::mem::replace(&mut rec.principal_id, p.principal_id.clone());
            if !rec.earlier_requesters.contains(&earlier) {
                rec.earlier_requesters.push(earlier);
            }
        }
        rec.lease_fence = rec.lease_fence.max(p.lease_fence);
        rec.policy_bundle_hash.clone_from(&bundle);
        rec.updated_at = now;
        let mut run = a.run.unwrap_or(RunRecord {
            highest_fence: p.lease_fence,
            dispatches: 0,
            updated_at: now,
            expires_at: now,
        });
        run.highest_fence = run.highest_fence.max(p.lease_fence);
        run.updated_at = now;
        run.expires_at = now.saturating_add_unsigned(self.config.run_retention_ms);

        let (verdict, reason, detail, kind) = match &a.authz {
            Authz::Approval { .. } => {
                rec.state = State::AwaitingApproval {
                    expires_at: now
                        .saturating_add_unsigned(a.tool.approval.ttl_ms)
                        .min(rec.deadline_at),
                    approvals: Vec::new(),
                };
                (
                    Verdict::PendingApproval,
                    Reason::ApprovalRequired,
                    a.authz.summary(),
                    JournalKind::ProposalDecided,
                )
            }
            _ => {
                self.dispatch(&mut rec, a.tool, now, step);
                run.dispatches = run.dispatches.saturating_add(1);
                let reason = if a.retry {
                    Reason::RetryAfterFailure
                } else {
                    Reason::AutoApproved
                };
                (
                    Verdict::Accepted,
                    reason,
                    a.authz.summary(),
                    JournalKind::DispatchIntent,
                )
            }
        };
        let decision_id = format!("p/{}", p.proposal_id);
        let seen = ProposalSeen {
            operation_key: p.operation_key.clone(),
            decision_id: decision_id.clone(),
            verdict,
            reason,
            detail: detail.clone(),
            arguments_hash: Some(rec.arguments_hash.clone()),
            policy_bundle_hash: Some(bundle.clone()),
            decided_at: now,
            expires_at: now.saturating_add_unsigned(self.config.proposal_dedup_retention_ms),
            fingerprint: Some(proposal_fingerprint(p)),
        };
        let mut event = self.event(kind, step, Some(&rec));
        fill_from_proposal(&mut event, p);
        event.verdict = Some(verdict);
        event.reason = Some(reason);
        event.evidence = Some(detail.clone());
        step.out.decisions.push(self.reply(
            &decision_id,
            &p.proposal_id,
            &rec,
            verdict,
            reason,
            detail,
            now,
        ));
        step.journal(
            event,
            vec![
                Write::Proposal {
                    id: p.proposal_id.clone(),
                    seen: Some(seen),
                },
                Write::Run {
                    run_id: p.run_id.clone(),
                    run: Some(run),
                },
                effect_write(rec),
            ],
        )
    }
}

/// The outcome of steps (1) to (8) for a proposal.
enum Evaluation<'a> {
    Refused(Refusal),
    Admitted(Box<Admitted<'a>>),
}

impl Evaluation<'_> {
    fn refusal(verdict: Verdict, reason: Reason, detail: String) -> Refusal {
        Refusal {
            verdict,
            reason,
            detail,
            arguments_hash: None,
            policy_bundle_hash: None,
            receipt: None,
        }
    }

    fn refusal_with_hash(reason: Reason, detail: String, hash: String) -> Refusal {
        Refusal {
            verdict: Verdict::Rejected,
            reason,
            detail,
            arguments_hash: Some(hash),
            policy_bundle_hash: None,
            receipt: None,
        }
    }
}

/// The outcome of steps (1) to (6) for a proposal.
enum Screen<'a> {
    Refused(Refusal),
    Passed {
        tool: &'a Tool,
        canonical: canonical::Canonical,
        authz: Authz,
    },
}

struct Refusal {
    verdict: Verdict,
    reason: Reason,
    detail: String,
    arguments_hash: Option<String>,
    policy_bundle_hash: Option<String>,
    receipt: Option<String>,
}

struct Admitted<'a> {
    tool: &'a Tool,
    canonical: canonical::Canonical,
    authz: Authz,
    existing: Option<EffectRecord>,
    run: Option<RunRecord>,
    /// The key's latest attempt failed with proof and this proposal retries it.
    retry: bool,
}

fn fill_from_proposal(event: &mut JournalEvent, p: &ToolProposal) {
    event.operation_key = Some(p.operation_key.clone());
    event.run_id = Some(p.run_id.clone());
    event.proposal_id = Some(p.proposal_id.clone());
    event.principal_id = Some(p.principal_id.clone());
    event.tenant_id = Some(p.tenant_id.clone());
    event.tool = Some(p.tool.clone());
    event.lease_fence = Some(p.lease_fence);
}
