//! The decision state machine: one entry point, [`Core::handle`], from (state view, input, now)
//! to [`Effects`]. Pure: no clock, no randomness, no I/O. Refusals are decisions, not errors;
//! `Err` means the state could not be read or a record could not be encoded.
//!
//! # Layout (one file per input kind)
//! - `handle_proposal`: DESIGN.md section 4, the validation order, then section 3's idempotency
//!   contract for an existing key.
//! - `handle_approval`: approvals bound to the hash, single use, expiring, entitled, not the
//!   requester, M distinct approvers; authorization re-evaluated when the quorum is reached.
//! - `handle_outcome`: attempt epochs (fence 2); stale outcomes kept as evidence; double-effect
//!   alert; COMMITTED never regresses; UNKNOWN starts reconciliation.
//! - `handle_control`: operator settle and cancel, run lease fences (fence 3).
//! - `handle_timer`: approval expiry, attempt timeout (UNKNOWN, never FAILED), reconcile rounds,
//!   retries of proven failures, purging after retention.

use airlock_schemas::{
    Approval, ApprovalVerdict, Control, ControlKind, Decision, DispatchCommand, JournalEvent,
    JournalKind, Outcome, OutcomeKind, Reason, ReconcileCommand, ToolProposal, Verdict,
};
use sha2::{Digest, Sha256};

mod approval;
mod control;
mod outcome;
mod proposal;
mod timer;

use super::canonical;
use super::input::{Input, TimerFired, TimerTarget};
use super::output::Effects;
use super::policy::{Authz, AuthzRequest, Operation, Policy};
use super::record::{
    EffectRecord, ProposalSeen, REDUCER_VERSION, RunRecord, State, TimerKind, Write,
};
use super::registry::{LookupError, Registry, Tool};
use super::{Error, Result, StateView};

/// Limits and durations of the core that are not per tool. Every field has a production default.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Added to an attempt's deadline before it is declared UNKNOWN, so that an outcome produced
    /// just before the deadline can still arrive.
    pub outcome_grace_ms: u64,
    /// How long a proposal id is remembered to give resends the same reply.
    pub proposal_dedup_retention_ms: u64,
    /// How long a run's fence and budget are kept after its last accepted proposal.
    pub run_retention_ms: u64,
    /// Dispatches one agent run may cause on one partition; stops runaway agent loops.
    pub max_dispatches_per_run: u32,
    /// Evidence from connectors and operators is truncated to this many bytes.
    pub max_evidence_bytes: usize,
    /// Upper bound on `arguments_json` before any tool-specific limit is known.
    pub max_arguments_bytes: usize,
    /// Upper bound on identifiers (operation key, proposal id, run id, ...).
    pub max_identifier_bytes: usize,
    /// How long a closed-intent marker outlives its record's retention: after the tool's
    /// `retention_ms` a terminal intent keeps only what binds its key (and a commit's
    /// receipt), so that an agent retrying blindly weeks later is still answered DUPLICATE
    /// instead of running the effect again. 0 deletes at retention, as before markers existed.
    pub closed_intent_retention_ms: u64,
    /// A control (settle, cancel, lease fence) read more than this long after its
    /// `issued_at` is refused DEADLINE_EXPIRED: a signed control cannot be replayed later.
    pub max_control_age_ms: u64,
    /// Whose identifiers an operation key, a run id and a proposal id are: every tenant's
    /// shared namespace, or each tenant's own ([`KeyScope`]).
    pub key_scope: KeyScope,
}

/// Whose identifiers operation keys, run ids and proposal ids are.
///
/// These ids are what every part of Airlock keys by: the partition and the state record, the
/// dispatch command, the connector worker's attempts and the idempotency key the downstream
/// system deduplicates on. In one namespace shared by every tenant, the first tenant to use a
/// key holds it: another tenant's intent under it is answered CONFLICT, and a run id or
/// proposal id used by another tenant first is another tenant's run or reply. Scoping the ids
/// by tenant at the boundary keeps them one identity end to end, with no other change.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyScope {
    /// One namespace for every tenant: right for a single tenant, or tenants that trust each
    /// other.
    #[default]
    Global,
    /// Each tenant's own: a proposal's operation key, run id and proposal id each begin with
    /// its tenant id and a `/` (`acme/refund:txn_1`), and a tenant id holds no `/`. A proposal
    /// outside its tenant's ids is refused TENANT_MISMATCH and not remembered, so it takes
    /// nothing from the tenant it names.
    Tenant,
}

impl std::str::FromStr for KeyScope {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "global" => Ok(KeyScope::Global),
            "tenant" => Ok(KeyScope::Tenant),
            other => Err(format!("{other:?} is not global or tenant")),
        }
    }
}

impl KeyScope {
    /// The configuration's spelling: `global` or `tenant`.
    pub fn as_str(self) -> &'static str {
        match self {
            KeyScope::Global => "global",
            KeyScope::Tenant => "tenant",
        }
    }

    /// The tenant a tenant-scoped id belongs to: what comes before its first `/`, when neither
    /// that nor the rest is empty (`acme/refund:1` is acme's; `acme/`, `/x` and `x` are no
    /// tenant's).
    pub fn tenant_of(id: &str) -> Option<&str> {
        id.split_once('/')
            .filter(|(tenant, rest)| !tenant.is_empty() && !rest.is_empty())
            .map(|(tenant, _)| tenant)
    }

    /// What is wrong with `p`'s identifiers under this scope, if anything.
    ///
    /// ```
    /// # use airlock_processor::core::KeyScope;
    /// let mut p = airlock_processor::sample::refund("acme/refund:1", 100, 0); // tenant acme
    /// p.run_id = "acme/run-1".into();
    /// p.proposal_id = "acme/p-1".into();
    /// assert_eq!(KeyScope::Tenant.problem(&p), None);
    /// p.operation_key = "globex/refund:1".into();
    /// assert!(KeyScope::Tenant.problem(&p).unwrap().contains("operation_key"));
    /// assert_eq!(KeyScope::Global.problem(&p), None);
    /// ```
    pub fn problem(self, p: &ToolProposal) -> Option<String> {
        if self == KeyScope::Global {
            return None;
        }
        let tenant = &p.tenant_id;
        if tenant.is_empty() || tenant.contains('/') {
            return Some(format!(
                "tenant id {tenant:?} cannot scope identifiers: with processor.key_scope = \
                 \"tenant\" it is not empty and holds no '/'"
            ));
        }
        let ids = [
            ("operation_key", &p.operation_key),
            ("run_id", &p.run_id),
            ("proposal_id", &p.proposal_id),
        ];
        ids.iter().find_map(|(name, id)| {
            (KeyScope::tenant_of(id) != Some(tenant.as_str())).then(|| {
                format!(
                    "{name} {id:?} is not one of tenant {tenant}'s: with processor.key_scope = \
                     \"tenant\" it begins with \"{tenant}/\""
                )
            })
        })
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            outcome_grace_ms: 5_000,
            proposal_dedup_retention_ms: 7 * 24 * 3_600_000,
            run_retention_ms: 7 * 24 * 3_600_000,
            max_dispatches_per_run: 10_000,
            max_evidence_bytes: 4_096,
            max_arguments_bytes: 1 << 20,
            max_identifier_bytes: 512,
            closed_intent_retention_ms: 30 * 24 * 3_600_000,
            max_control_age_ms: 3_600_000,
            key_scope: KeyScope::Global,
        }
    }
}

/// The decision core: the tool registry, the policy bundle and the limits it decides under.
#[derive(Debug)]
pub struct Core {
    registry: Registry,
    policy: Policy,
    config: Config,
    /// The key the shell signs dispatch commands with (their capability), when one is
    /// configured. Kept here because the core is what every task of an instance shares; the
    /// decisions never read it (signing is deterministic, so replays stay byte-identical).
    capability_key: Option<std::sync::Arc<ed25519_dalek::SigningKey>>,
    /// The key the task signs receipts with (see `crate::receipt`), when one is configured; a
    /// key of its own, so that whoever can verify or forge one kind of signature cannot touch
    /// the other. Like the capability key, never read by a decision.
    receipt_key: Option<std::sync::Arc<ed25519_dalek::SigningKey>>,
    /// Per connector, the verifying keys of its workers: the shell takes an outcome naming a
    /// connector listed here only when its signature verifies (see `crate::capability`).
    worker_keys:
        std::sync::Arc<std::collections::BTreeMap<String, Vec<ed25519_dalek::VerifyingKey>>>,
    /// Whether an approval or control of a person without verifying keys in the policy
    /// entities is refused (`capability.require_person_signatures`); a person with keys must
    /// sign either way. Checked by the shell, like the worker keys.
    person_signatures_required: bool,
}

/// A reply owed to whoever sent an input: verdict, reason, human-readable detail.
type Reply = (Verdict, Reason, String);

/// Accumulates the outputs of one input.
struct Step {
    cause_id: String,
    now: i64,
    out: Effects,
}

impl Step {
    fn journal(&mut self, mut event: JournalEvent, writes: Vec<Write>) -> Result<()> {
        let encode = |source| Error::Encode {
            what: "journal writes",
            source,
        };
        if !writes.is_empty() {
            let rows = writes
                .iter()
                .map(Write::record_json)
                .collect::<serde_json::Result<Vec<_>>>()
                .map_err(encode)?;
            event.record_json = Some(Write::journal_json(&writes, &rows).map_err(encode)?);
            self.out.rows.extend(rows);
        }
        self.out.writes.extend(writes);
        self.out.journal.push(event);
        Ok(())
    }
}

impl Core {
    pub fn new(registry: Registry, policy: Policy, config: Config) -> Self {
        Core {
            registry,
            policy,
            config,
            capability_key: None,
            receipt_key: None,
            worker_keys: Default::default(),
            person_signatures_required: false,
        }
    }

    /// This core refusing approvals and controls of people without registered keys.
    pub fn with_person_signatures_required(mut self, required: bool) -> Self {
        self.person_signatures_required = required;
        self
    }

    /// The keys `person`'s approvals and controls must verify under: `Some` (possibly empty,
    /// which nothing verifies under) when they must be signed, `None` when they are taken
    /// unsigned (no keys registered, and signatures not required of everyone).
    pub fn person_keys(&self, person: &str) -> Option<&[ed25519_dalek::VerifyingKey]> {
        match self.policy.person_keys(person) {
            Some(keys) => Some(keys),
            None if self.person_signatures_required => Some(&[]),
            None => None,
        }
    }

    /// This core with the key the shell signs dispatch commands with (see `crate::capability`).
    pub fn with_capability_key(mut self, key: ed25519_dalek::SigningKey) -> Self {
        self.capability_key = Some(std::sync::Arc::new(key));
        self
    }

    /// The key dispatch commands are signed with; `None` leaves them unsigned.
    pub fn capability_key(&self) -> Option<&ed25519_dalek::SigningKey> {
        self.capability_key.as_deref()
    }

    /// This core with its connectors' worker verifying keys (see [`Core::worker_keys`]).
    pub fn with_worker_keys(
        mut self,
        keys: std::collections::BTreeMap<String, Vec<ed25519_dalek::VerifyingKey>>,
    ) -> Self {
        self.worker_keys = std::sync::Arc::new(keys);
        self
    }

    /// The verifying keys of `connector`'s workers; `None` when none are configured and its
    /// outcomes are taken unsigned.
    pub fn worker_keys(&self, connector: &str) -> Option<&[ed25519_dalek::VerifyingKey]> {
        self.worker_keys
            .get(connector)
            .map(Vec::as_slice)
            .filter(|k| !k.is_empty())
    }

    /// This core with the key the task signs receipts with (see `crate::receipt`).
    pub fn with_receipt_key(mut self, key: ed25519_dalek::SigningKey) -> Self {
        self.receipt_key = Some(std::sync::Arc::new(key));
        self
    }

    /// The key receipts are signed with; `None` issues no receipts.
    pub fn receipt_key(&self) -> Option<&ed25519_dalek::SigningKey> {
        self.receipt_key.as_deref()
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Decides one input. `now` is the input record's timestamp (a timer's due time), never the
    /// wall clock, so that re-deciding after a crash gives the same outputs.
    pub fn handle(&self, view: &impl StateView, input: &Input, now: i64) -> Result<Effects> {
        let mut step = Step {
            cause_id: input.cause_id(),
            now,
            out: Effects::default(),
        };
        match input {
            Input::Proposal(p) => self.handle_proposal(view, p, &mut step)?,
            Input::Approval(a) => self.handle_approval(view, a, &mut step)?,
            Input::Outcome(o) => self.handle_outcome(view, o, &mut step)?,
            Input::Control(c) => self.handle_control(view, c, &mut step)?,
            Input::Timer(t) => self.handle_timer(view, t, &mut step)?,
        }
        // Every decision names the policy bundle in force, even a refusal that came before
        // authorization: an auditor asks "under which rules was this decided?" of all of them.
        for d in &mut step.out.decisions {
            if d.policy_bundle_hash.is_none() {
                d.policy_bundle_hash = Some(self.policy.bundle_hash().to_owned());
            }
        }
        Ok(step.out)
    }

    /// Records a dispatch intent for epoch n+1 and emits its command. The caller journals the
    /// record in the same step, so the command never leaves without a durable intent.
    fn dispatch(&self, rec: &mut EffectRecord, tool: &Tool, now: i64, step: &mut Step) {
        rec.epoch += 1;
        rec.attempts += 1;
        let attempt_deadline_at = rec
            .deadline_at
            .min(now.saturating_add_unsigned(tool.attempt_timeout_cap_ms));
        let timeout_at = attempt_deadline_at.saturating_add_unsigned(self.config.outcome_grace_ms);
        rec.state = State::Dispatched {
            attempt_deadline_at,
            timeout_at,
        };
        step.out.dispatches.push(DispatchCommand {
            command_id: format!("{}#{}", rec.operation_key, rec.epoch),
            operation_key: rec.operation_key.clone(),
            epoch: rec.epoch,
            proposal_id: rec.proposal_id.clone(),
            tool: rec.tool.clone(),
            tool_version: rec.tool_version.clone(),
            connector: rec.connector.clone(),
            tenant_id: rec.tenant_id.clone(),
            principal_id: rec.principal_id.clone(),
            arguments_json: rec.arguments_json.clone(),
            arguments_hash: rec.arguments_hash.clone(),
            idempotency_key: rec.idempotency_key.clone(),
            deadline_at: rec.deadline_at,
            attempt_deadline_at,
            attempt_timeout_ms: (attempt_deadline_at - now).max(0),
            policy_bundle_hash: rec.policy_bundle_hash.clone(),
            owner_partition: 0,
            owner_epoch: 0,
            capability: None,
            issued_at: now,
        });
    }

    fn reauthorize(&self, rec: &EffectRecord) -> Authz {
        self.authorize_on(rec, &rec.principal_id, Policy::authorize_invoke)
    }

    /// The attempt ceiling for a dispatch that is not a fresh proposal (quorum reached, retry
    /// timer). The run's dispatch budget counts proposals that dispatch at once: it exists to
    /// stop an agent loop, and a human approval or a scheduled retry is not one.
    fn budget_refusal(&self, rec: &mut EffectRecord, tool: &Tool, now: i64) -> Option<Reply> {
        if rec.attempts >= tool.retry.max_attempts {
            close_failed(rec, now, "attempt budget exhausted");
            return Some((
                Verdict::Failed,
                Reason::AttemptsExhausted,
                format!(
                    "{} of {} attempts used",
                    rec.attempts, tool.retry.max_attempts
                ),
            ));
        }
        None
    }

    /// FAILED with proof: schedule a retry when the contract, the attempt budget and the
    /// deadline allow; otherwise the failure is final. Returns the reply owed for a final failure.
    fn fail_with_proof(
        &self,
        rec: &mut EffectRecord,
        tool: Option<&Tool>,
        evidence: &str,
        now: i64,
    ) -> Option<String> {
        let retry_at = tool.and_then(|tool| {
            if !tool.contract.idempotent_by_key || rec.attempts >= tool.retry.max_attempts {
                return None;
            }
            let at = now.saturating_add_unsigned(
                tool.retry
                    .backoff_ms(rec.attempts, jitter_seed(&rec.operation_key, rec.epoch)),
            );
            (at < rec.deadline_at).then_some(at)
        });
        rec.state = State::Failed {
            evidence: evidence.to_owned(),
            settled_at: now,
            retry_at,
        };
        retry_at.is_none().then(|| {
            format!(
                "failed with proof, final after {} attempts: {evidence}",
                rec.attempts
            )
        })
    }

    /// UNKNOWN: never FAILED. Reconcile now when the tool can be reconciled, else an operator.
    /// UNKNOWN: never FAILED. Reconciled when the tool can be looked up downstream, else an
    /// operator settles it. The first lookup waits for the attempt's deadline: until then the
    /// call may still land, so "not found" would prove nothing.
    fn become_unknown(&self, rec: &mut EffectRecord, tool: Option<&Tool>, step: &mut Step) {
        let now = step.now;
        let call_bound = match rec.state {
            State::Dispatched {
                attempt_deadline_at,
                ..
            }
            | State::InFlight {
                attempt_deadline_at,
                ..
            } => attempt_deadline_at,
            _ => now,
        };
        match tool.filter(|t| t.contract.reconcilable && t.reconcile.max_rounds > 0) {
            Some(tool) if call_bound <= now => {
                self.reconcile(rec, 1, step);
                rec.state = State::Unknown {
                    since: now,
                    rounds: 1,
                    next_reconcile_at: now.saturating_add_unsigned(tool.reconcile.backoff_ms(1)),
                };
            }
            Some(_) => {
                rec.state = State::Unknown {
                    since: now,
                    rounds: 0,
                    next_reconcile_at: call_bound,
                };
            }
            None => {
                rec.state = State::OperatorRequired {
                    since: now,
                    rounds: 0,
                    may_land_until: call_bound,
                };
            }
        }
    }

    fn reconcile(&self, rec: &EffectRecord, round: u32, step: &mut Step) {
        step.out.reconciles.push(ReconcileCommand {
            command_id: format!("{}#{}/r{round}", rec.operation_key, rec.epoch),
            operation_key: rec.operation_key.clone(),
            epoch: rec.epoch,
            tool: rec.tool.clone(),
            connector: rec.connector.clone(),
            idempotency_key: rec.idempotency_key.clone(),
            arguments_hash: rec.arguments_hash.clone(),
            round: round as i32,
            owner_partition: 0,
            owner_epoch: 0,
            capability: None,
            issued_at: step.now,
        });
    }

    /// Authorizes `principal` (an approver, an operator) on intent `rec` with `decide`: the
    /// request names the intent's tenant, tool, resource, run and canonical arguments.
    fn authorize_on<T>(
        &self,
        rec: &EffectRecord,
        principal: &str,
        decide: impl FnOnce(&Policy, &AuthzRequest<'_>) -> T,
    ) -> T {
        let args: serde_json::Value =
            serde_json::from_str(&rec.arguments_json).unwrap_or(serde_json::Value::Null);
        let resource = self
            .registry
            .lookup(&rec.tool, &rec.tool_version)
            .ok()
            .and_then(|t| t.resource_of(&args))
            .unwrap_or_default();
        decide(
            &self.policy,
            &AuthzRequest {
                principal,
                tenant: &rec.tenant_id,
                tool: &rec.tool,
                tool_version: &rec.tool_version,
                resource: &resource,
                run_id: &rec.run_id,
                arguments: &args,
            },
        )
    }

    fn event(&self, kind: JournalKind, step: &Step, rec: Option<&EffectRecord>) -> JournalEvent {
        JournalEvent {
            partition: 0,
            sequence: 0,
            owner_epoch: 0,
            task: String::new(),
            reducer_version: REDUCER_VERSION,
            kind,
            cause_id: step.cause_id.clone(),
            operation_key: rec.map(|r| r.operation_key.clone()),
            run_id: rec.map(|r| r.run_id.clone()),
            proposal_id: rec.map(|r| r.proposal_id.clone()),
            principal_id: rec.map(|r| r.principal_id.clone()),
            tenant_id: rec.map(|r| r.tenant_id.clone()),
            tool: rec.map(|r| r.tool.clone()),
            policy_bundle_hash: rec.map(|r| r.policy_bundle_hash.clone()),
            lease_fence: rec.map(|r| r.lease_fence),
            epoch: rec.map(|r| r.epoch),
            verdict: None,
            reason: None,
            state: rec.map(EffectRecord::effect_state),
            arguments_hash: rec.map(|r| r.arguments_hash.clone()),
            evidence: None,
            record_json: None,
            projection_hash: None,
            recorded_at: step.now,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn reply(
        &self,
        decision_id: &str,
        in_reply_to: &str,
        rec: &EffectRecord,
        verdict: Verdict,
        reason: Reason,
        detail: String,
        now: i64,
    ) -> Decision {
        let receipt = match &rec.state {
            State::Committed { receipt, .. } => Some(receipt.clone()),
            _ => None,
        };
        Decision {
            decision_id: decision_id.to_owned(),
            in_reply_to: in_reply_to.to_owned(),
            operation_key: rec.operation_key.clone(),
            run_id: Some(rec.run_id.clone()),
            verdict,
            reason,
            detail,
            arguments_hash: Some(rec.arguments_hash.clone()),
            policy_bundle_hash: Some(rec.policy_bundle_hash.clone()),
            epoch: (rec.epoch > 0).then_some(rec.epoch),
            state: Some(rec.effect_state()),
            receipt,
            owner_partition: 0,
            owner_epoch: 0,
            decided_at: now,
        }
    }
}

fn effect_write(rec: EffectRecord) -> Write {
    Write::Effect {
        key: rec.operation_key.clone(),
        record: Some(Box::new(rec)),
    }
}

fn close_failed(rec: &mut EffectRecord, now: i64, evidence: &str) {
    rec.state = State::Failed {
        evidence: evidence.to_owned(),
        settled_at: now,
        retry_at: None,
    };
}

/// Truncates untrusted text on a character boundary.
fn bounded(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…[truncated {} bytes]", &text[..end], text.len() - end)
}

/// The receipt of a committed effect: a digest binding key, epoch, arguments and the evidence
/// that settled it. Frozen: receipts are quoted back to agents and auditors.
fn receipt(rec: &EffectRecord, settled_by: &str, evidence: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"airlock/receipt/v1\0");
    for part in [
        rec.operation_key.as_bytes(),
        rec.epoch.to_string().as_bytes(),
        rec.arguments_hash.as_bytes(),
        settled_by.as_bytes(),
        evidence.as_bytes(),
    ] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part);
    }
    canonical::hex_lower(&h.finalize())
}

/// What a proposal says, for telling a producer's resend (identical) from another proposal
/// reusing its id: a digest of who proposes what, under which key. Frozen: stored in the
/// remembered replies.
pub(crate) fn proposal_fingerprint(p: &ToolProposal) -> String {
    let mut h = Sha256::new();
    h.update(b"airlock/proposal/v1\0");
    for part in [
        &p.tenant_id,
        &p.principal_id,
        &p.operation_key,
        &p.tool,
        &p.tool_version,
        &p.run_id,
        &p.arguments_json,
    ] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    canonical::hex_lower(&h.finalize()[..16])
}

/// Deterministic jitter: the randomness of a retry backoff is a function of its key and epoch.
fn jitter_seed(key: &str, epoch: i64) -> u64 {
    let mut h = Sha256::new();
    h.update(b"airlock/jitter/v1\0");
    h.update(key.as_bytes());
    h.update(epoch.to_be_bytes());
    let digest = h.finalize();
    u64::from_be_bytes(
        digest[..8]
            .try_into()
            .expect("a SHA-256 digest has 32 bytes"),
    )
}
