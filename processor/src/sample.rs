//! The reference configuration (`deploy/config`: tools, Cedar policies, principals) and
//! builders of realistic inputs against it. Used by the tests, the deterministic simulation, the
//! benchmarks and the demo fleet, so they all exercise the configuration users start from.

use std::path::PathBuf;
use std::sync::Arc;

use airlock_schemas::{
    Approval, ApprovalVerdict, Codec, Control, ControlKind, DispatchCommand, Outcome, OutcomeKind,
    ReconcileCommand, ToolProposal,
};
use anyhow::Context;

use crate::core::{
    self, Core, EffectRecord, State, TaskContext, policy::Policy, registry::Registry,
};
use crate::store::{MemoryBackend, MemoryStore, StateStore, Store};
use crate::task::Task;

/// An effect record of `key` in `state`: a dispatched refund with fixed times (deadline
/// 10,000, retention 1,000 ms), for tests of what the store and the reducer do with records.
pub fn effect_record(key: &str, state: State) -> EffectRecord {
    EffectRecord {
        operation_key: key.to_owned(),
        tenant_id: "acme".into(),
        principal_id: "agent-support-1".into(),
        run_id: "run-1".into(),
        proposal_id: format!("p-{key}"),
        tool: "refund".into(),
        tool_version: "1".into(),
        connector: "ledger".into(),
        arguments_json: r#"{"a":1}"#.into(),
        arguments_hash: "ab".repeat(32),
        idempotency_key: "alk1-x".into(),
        lease_fence: 1,
        deadline_at: 10_000,
        created_at: 0,
        policy_bundle_hash: "cd".repeat(32),
        epoch: 1,
        attempts: 1,
        used_approvals: vec![],
        applied_controls: Vec::new(),
        earlier_requesters: Vec::new(),
        retention_ms: 1_000,
        closed_until: None,
        state,
        updated_at: 0,
    }
}

/// An hour in milliseconds: the default intent deadline of sample proposals.
pub const HOUR_MS: i64 = 3_600_000;

/// `deploy/config` of this checkout, or `$AIRLOCK_CONFIG_DIR`.
pub fn config_dir() -> PathBuf {
    std::env::var_os("AIRLOCK_CONFIG_DIR").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/config"),
        PathBuf::from,
    )
}

/// The reference registry and policy bundle, under `config`.
pub fn reference_core(config: core::Config) -> anyhow::Result<Core> {
    let dir = config_dir();
    let registry = Registry::load(&dir.join("tools.toml")).context("loading tools.toml")?;
    let policy = Policy::load(&dir.join("policies.cedar"), &dir.join("entities.json"))
        .context("loading the policy bundle")?;
    Ok(Core::new(registry, policy, config))
}

/// A task over an in-memory store on partition 0, owner epoch 1.
pub fn memory_task(core: Arc<Core>) -> anyhow::Result<Task<MemoryStore>> {
    let store = StateStore::open(MemoryBackend::default())?;
    Ok(Task::new(core, store, task_context(0))?)
}

/// Decides one encoded proposal as the benches' core phases do: Avro decode, the core (state
/// staged in `task`, not committed), Avro encode of every dispatch, decision and journal event.
/// Returns the encoded outputs' bytes.
pub fn decide_encoded<S: Store>(
    task: &mut Task<S>,
    codec: &Codec,
    payload: &[u8],
) -> anyhow::Result<usize> {
    let p: ToolProposal = codec.decode_single_object(payload)?;
    let at = p.proposed_at;
    let effects = task.handle(&core::Input::Proposal(p), at)?;
    let mut bytes = 0;
    for d in &effects.dispatches {
        bytes += codec.encode_single_object(d)?.len();
    }
    for d in &effects.decisions {
        bytes += codec.encode_single_object(d)?.len();
    }
    for j in &effects.journal {
        bytes += codec.encode_single_object(j)?.len();
    }
    Ok(bytes)
}

pub fn task_context(partition: i32) -> TaskContext {
    TaskContext {
        partition,
        owner_epoch: 1,
        task: format!("sample/{partition}"),
    }
}

/// Money-movement arguments in the reference schema.
pub fn money_arguments(tenant: &str, account: &str, minor_units: i64, currency: &str) -> String {
    serde_json::json!({
        "tenant_id": tenant,
        "account_id": account,
        "amount": { "minor_units": minor_units, "currency": currency },
    })
    .to_string()
}

/// A refund of `minor_units` EUR by `agent-support-1` of tenant `acme`, deadline an hour after
/// `now`. Fields are public: adjust what a scenario needs.
pub fn refund(operation_key: &str, minor_units: i64, now: i64) -> ToolProposal {
    ToolProposal {
        proposal_id: format!("prop-{operation_key}-{minor_units}"),
        operation_key: operation_key.to_owned(),
        run_id: "run-1".to_owned(),
        logical_call_id: "step-1".to_owned(),
        provider_call_id: None,
        tenant_id: "acme".to_owned(),
        principal_id: "agent-support-1".to_owned(),
        tool: "refund".to_owned(),
        tool_version: "1".to_owned(),
        arguments_json: money_arguments("acme", "acct-42", minor_units, "EUR"),
        arguments_hash: None,
        lease_owner: "worker-a".to_owned(),
        lease_fence: 1,
        deadline_at: now + HOUR_MS,
        proposed_at: now,
    }
}

/// Two refunds of 700 EUR cents under tenant-scoped ids (`processor.key_scope = "tenant"`), the
/// same key suffix `key` under each tenant's prefix: acme's by `agent-support-1` (proposal
/// `acme/p-1`, run `acme/run-1`) and globex's by `agent-globex-1` (`globex/p-1`,
/// `globex/run-1`), each on its own tenant's account.
pub fn tenant_refunds(key: &str, now: i64) -> (ToolProposal, ToolProposal) {
    let acme = ToolProposal {
        proposal_id: "acme/p-1".to_owned(),
        run_id: "acme/run-1".to_owned(),
        ..refund(&format!("acme/{key}"), 700, now)
    };
    let globex = ToolProposal {
        proposal_id: "globex/p-1".to_owned(),
        operation_key: format!("globex/{key}"),
        run_id: "globex/run-1".to_owned(),
        tenant_id: "globex".to_owned(),
        principal_id: "agent-globex-1".to_owned(),
        arguments_json: money_arguments("globex", "acct-7", 700, "EUR"),
        ..acme.clone()
    };
    (acme, globex)
}

/// Runs a [`fleet_refund`] spreads its proposals over.
pub const FLEET_RUNS: usize = 1_000;

/// The `i`-th refund of a fleet, for load: one of [`FLEET_RUNS`] agent runs (a run's dispatches
/// are budgeted, `max_dispatches_per_run`, so one run for a whole benchmark would turn every
/// proposal past the budget into a cheaper denial), 100 to 9,099 minor units (all within the
/// reference policy's automatic tier).
pub fn fleet_refund(operation_key: &str, i: usize, now: i64) -> ToolProposal {
    let mut p = refund(operation_key, 100 + (i % 9_000) as i64, now);
    p.run_id = format!("run-{}", i % FLEET_RUNS);
    p
}

/// The same proposal resent by the agent under a new proposal id (a blind retry).
pub fn resend(p: &ToolProposal, attempt: u32) -> ToolProposal {
    ToolProposal {
        proposal_id: format!("{}-retry{attempt}", p.proposal_id),
        ..p.clone()
    }
}

pub fn approval(
    p: &ToolProposal,
    arguments_hash: &str,
    approver: &str,
    verdict: ApprovalVerdict,
    now: i64,
) -> Approval {
    Approval {
        approval_id: format!("appr-{}-{approver}", p.operation_key),
        operation_key: p.operation_key.clone(),
        arguments_hash: arguments_hash.to_owned(),
        approver_id: approver.to_owned(),
        tenant_id: p.tenant_id.clone(),
        verdict,
        expires_at: now + HOUR_MS,
        decided_at: now,
        comment: None,
    }
}

/// The reconcile command, round `round` (unsigned), of the attempt `d` dispatched, as the
/// processor would issue it at `issued_at`.
pub fn reconcile_of(d: &DispatchCommand, round: i32, issued_at: i64) -> ReconcileCommand {
    ReconcileCommand {
        command_id: format!("{}#{}/r{round}", d.operation_key, d.epoch),
        operation_key: d.operation_key.clone(),
        epoch: d.epoch,
        tool: d.tool.clone(),
        connector: d.connector.clone(),
        idempotency_key: d.idempotency_key.clone(),
        arguments_hash: d.arguments_hash.clone(),
        round,
        owner_partition: d.owner_partition,
        owner_epoch: d.owner_epoch,
        capability: None,
        issued_at,
    }
}

pub fn outcome(key: &str, epoch: i64, kind: OutcomeKind, evidence: &str) -> Outcome {
    Outcome {
        outcome_id: format!("out-{key}-{epoch}-{}", kind.as_str()),
        operation_key: key.to_owned(),
        epoch,
        kind,
        connector: "ledger".to_owned(),
        worker_id: "ledger-worker-1".to_owned(),
        evidence: Some(evidence.to_owned()),
        provider_reference: None,
        // A reconcile answer is about round 1 unless the caller says otherwise.
        reconcile_round: matches!(
            kind,
            OutcomeKind::ReconciledCommitted
                | OutcomeKind::ReconciledFailed
                | OutcomeKind::ReconciledUnknown
        )
        .then_some(1),
        observed_at: 0,
    }
}

pub fn control(id: &str, kind: ControlKind, key: Option<&str>, now: i64) -> Control {
    Control {
        control_id: id.to_owned(),
        kind,
        operation_key: key.map(str::to_owned),
        run_id: None,
        lease_fence: None,
        operator_id: "operator-olga".to_owned(),
        evidence: Some("checked the ledger by hand".to_owned()),
        issued_at: now,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::Input;

    /// A fleet's proposals all dispatch (up to the budget times [`FLEET_RUNS`]) where the same
    /// load from one run stops at the run's dispatch budget (two here, so that the test needs a
    /// few thousand decisions, not 30,000).
    #[test]
    fn a_fleet_stays_within_the_run_budget_where_one_run_does_not() {
        let budget = 2;
        let core = Arc::new(
            reference_core(core::Config {
                max_dispatches_per_run: budget,
                ..core::Config::default()
            })
            .expect("the reference configuration loads"),
        );
        let proposals = budget as usize * FLEET_RUNS;
        let dispatched = |one_run: bool| {
            let mut task = memory_task(core.clone()).expect("a task over the memory store");
            (0..proposals)
                .map(|i| {
                    let mut p = fleet_refund(&format!("refund:fleet{i}"), i, 0);
                    if one_run {
                        p.run_id = "run-1".to_owned();
                    }
                    let effects = task.handle(&Input::Proposal(p), 0).expect("decided");
                    effects.dispatches.len()
                })
                .sum::<usize>()
        };
        assert_eq!(
            dispatched(false),
            proposals,
            "every fleet refund dispatched"
        );
        assert_eq!(
            dispatched(true),
            budget as usize,
            "one run: the budget, no more"
        );
    }
}
