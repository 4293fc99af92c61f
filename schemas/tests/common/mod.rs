//! Shared test helpers: proptest strategies for every record and fixed sample values.

#![allow(dead_code, unreachable_pub)]

use airlock_schemas::{
    AnyRecord, Approval, ApprovalVerdict, ChangelogRecord, Control, ControlKind, Decision,
    DispatchCommand, EffectState, InputOffset, JournalEvent, JournalKind, Outcome, OutcomeKind,
    Reason, Receipt, ReceiptKind, ReconcileCommand, StateTable, ToolProposal, Verdict,
};
use proptest::{collection::vec, option, prelude::*, sample::select};

/// Arbitrary Unicode text, sometimes empty, sometimes id-like.
pub fn text() -> BoxedStrategy<String> {
    prop_oneof![any::<String>(), "[a-z0-9:._-]{0,24}", Just(String::new())].boxed()
}

pub fn opt_text() -> impl Strategy<Value = Option<String>> {
    option::of(text())
}

pub fn bytes() -> impl Strategy<Value = Vec<u8>> {
    vec(any::<u8>(), 0..64)
}

pub fn tool_proposal() -> BoxedStrategy<ToolProposal> {
    (
        (
            text(),
            text(),
            text(),
            text(),
            opt_text(),
            text(),
            text(),
            text(),
        ),
        (
            text(),
            text(),
            opt_text(),
            text(),
            any::<i64>(),
            any::<i64>(),
            any::<i64>(),
        ),
    )
        .prop_map(
            |(
                (
                    proposal_id,
                    operation_key,
                    run_id,
                    logical_call_id,
                    provider_call_id,
                    tenant_id,
                    principal_id,
                    tool,
                ),
                (
                    tool_version,
                    arguments_json,
                    arguments_hash,
                    lease_owner,
                    lease_fence,
                    deadline_at,
                    proposed_at,
                ),
            )| ToolProposal {
                proposal_id,
                operation_key,
                run_id,
                logical_call_id,
                provider_call_id,
                tenant_id,
                principal_id,
                tool,
                tool_version,
                arguments_json,
                arguments_hash,
                lease_owner,
                lease_fence,
                deadline_at,
                proposed_at,
            },
        )
        .boxed()
}

pub fn approval() -> BoxedStrategy<Approval> {
    (
        text(),
        text(),
        text(),
        text(),
        text(),
        select(ApprovalVerdict::ALL),
        any::<i64>(),
        any::<i64>(),
        opt_text(),
    )
        .prop_map(
            |(
                approval_id,
                operation_key,
                arguments_hash,
                approver_id,
                tenant_id,
                verdict,
                expires_at,
                decided_at,
                comment,
            )| Approval {
                approval_id,
                operation_key,
                arguments_hash,
                approver_id,
                tenant_id,
                verdict,
                expires_at,
                decided_at,
                comment,
            },
        )
        .boxed()
}

pub fn outcome() -> BoxedStrategy<Outcome> {
    (
        text(),
        text(),
        any::<i64>(),
        select(OutcomeKind::ALL),
        text(),
        text(),
        opt_text(),
        opt_text(),
        option::of(any::<i32>()),
        any::<i64>(),
    )
        .prop_map(
            |(
                outcome_id,
                operation_key,
                epoch,
                kind,
                connector,
                worker_id,
                evidence,
                provider_reference,
                reconcile_round,
                observed_at,
            )| Outcome {
                outcome_id,
                operation_key,
                epoch,
                kind,
                connector,
                worker_id,
                evidence,
                provider_reference,
                reconcile_round,
                observed_at,
            },
        )
        .boxed()
}

pub fn control() -> BoxedStrategy<Control> {
    (
        text(),
        select(ControlKind::ALL),
        opt_text(),
        opt_text(),
        option::of(any::<i64>()),
        text(),
        opt_text(),
        any::<i64>(),
    )
        .prop_map(
            |(
                control_id,
                kind,
                operation_key,
                run_id,
                lease_fence,
                operator_id,
                evidence,
                issued_at,
            )| {
                Control {
                    control_id,
                    kind,
                    operation_key,
                    run_id,
                    lease_fence,
                    operator_id,
                    evidence,
                    issued_at,
                }
            },
        )
        .boxed()
}

pub fn dispatch_command() -> BoxedStrategy<DispatchCommand> {
    (
        (
            text(),
            text(),
            any::<i64>(),
            text(),
            text(),
            text(),
            text(),
            text(),
            text(),
            text(),
        ),
        (
            text(),
            text(),
            any::<i64>(),
            any::<i64>(),
            any::<i64>(),
            text(),
            any::<i32>(),
            any::<i64>(),
            option::of(bytes()),
            any::<i64>(),
        ),
    )
        .prop_map(
            |(
                (
                    command_id,
                    operation_key,
                    epoch,
                    proposal_id,
                    tool,
                    tool_version,
                    connector,
                    tenant_id,
                    principal_id,
                    arguments_json,
                ),
                (
                    arguments_hash,
                    idempotency_key,
                    deadline_at,
                    attempt_deadline_at,
                    attempt_timeout_ms,
                    policy_bundle_hash,
                    owner_partition,
                    owner_epoch,
                    capability,
                    issued_at,
                ),
            )| DispatchCommand {
                command_id,
                operation_key,
                epoch,
                proposal_id,
                tool,
                tool_version,
                connector,
                tenant_id,
                principal_id,
                arguments_json,
                arguments_hash,
                idempotency_key,
                deadline_at,
                attempt_deadline_at,
                attempt_timeout_ms,
                policy_bundle_hash,
                owner_partition,
                owner_epoch,
                capability,
                issued_at,
            },
        )
        .boxed()
}

pub fn reconcile_command() -> BoxedStrategy<ReconcileCommand> {
    (
        text(),
        text(),
        any::<i64>(),
        text(),
        text(),
        text(),
        text(),
        any::<i32>(),
        any::<i32>(),
        any::<i64>(),
        option::of(bytes()),
        any::<i64>(),
    )
        .prop_map(
            |(
                command_id,
                operation_key,
                epoch,
                tool,
                connector,
                idempotency_key,
                arguments_hash,
                round,
                owner_partition,
                owner_epoch,
                capability,
                issued_at,
            )| ReconcileCommand {
                command_id,
                operation_key,
                epoch,
                tool,
                connector,
                idempotency_key,
                arguments_hash,
                round,
                owner_partition,
                owner_epoch,
                capability,
                issued_at,
            },
        )
        .boxed()
}

pub fn decision() -> BoxedStrategy<Decision> {
    (
        (
            text(),
            text(),
            text(),
            opt_text(),
            select(Verdict::ALL),
            select(Reason::ALL),
            text(),
            opt_text(),
        ),
        (
            opt_text(),
            option::of(any::<i64>()),
            option::of(select(EffectState::ALL)),
            opt_text(),
            any::<i32>(),
            any::<i64>(),
            any::<i64>(),
        ),
    )
        .prop_map(
            |(
                (
                    decision_id,
                    in_reply_to,
                    operation_key,
                    run_id,
                    verdict,
                    reason,
                    detail,
                    arguments_hash,
                ),
                (
                    policy_bundle_hash,
                    epoch,
                    state,
                    receipt,
                    owner_partition,
                    owner_epoch,
                    decided_at,
                ),
            )| Decision {
                decision_id,
                in_reply_to,
                operation_key,
                run_id,
                verdict,
                reason,
                detail,
                arguments_hash,
                policy_bundle_hash,
                epoch,
                state,
                receipt,
                owner_partition,
                owner_epoch,
                decided_at,
            },
        )
        .boxed()
}

pub fn journal_event() -> BoxedStrategy<JournalEvent> {
    (
        (
            any::<i32>(),
            any::<i64>(),
            any::<i64>(),
            text(),
            any::<i32>(),
            select(JournalKind::ALL),
            text(),
            opt_text(),
        ),
        (
            opt_text(),
            opt_text(),
            opt_text(),
            opt_text(),
            opt_text(),
            opt_text(),
            option::of(any::<i64>()),
            option::of(any::<i64>()),
        ),
        (
            option::of(select(Verdict::ALL)),
            option::of(select(Reason::ALL)),
            option::of(select(EffectState::ALL)),
            opt_text(),
            opt_text(),
            opt_text(),
            opt_text(),
            any::<i64>(),
        ),
    )
        .prop_map(
            |(
                (
                    partition,
                    sequence,
                    owner_epoch,
                    task,
                    reducer_version,
                    kind,
                    cause_id,
                    operation_key,
                ),
                (
                    run_id,
                    proposal_id,
                    principal_id,
                    tenant_id,
                    tool,
                    policy_bundle_hash,
                    lease_fence,
                    epoch,
                ),
                (
                    verdict,
                    reason,
                    state,
                    arguments_hash,
                    evidence,
                    record_json,
                    projection_hash,
                    recorded_at,
                ),
            )| JournalEvent {
                partition,
                sequence,
                owner_epoch,
                task,
                reducer_version,
                kind,
                cause_id,
                operation_key,
                run_id,
                proposal_id,
                principal_id,
                tenant_id,
                tool,
                policy_bundle_hash,
                lease_fence,
                epoch,
                verdict,
                reason,
                state,
                arguments_hash,
                evidence,
                record_json,
                projection_hash,
                recorded_at,
            },
        )
        .boxed()
}

pub fn input_offset() -> BoxedStrategy<InputOffset> {
    (text(), any::<i32>(), any::<i64>())
        .prop_map(|(topic, partition, offset)| InputOffset {
            topic,
            partition,
            offset,
        })
        .boxed()
}

pub fn changelog_record() -> BoxedStrategy<ChangelogRecord> {
    (
        any::<i32>(),
        any::<i64>(),
        select(StateTable::ALL),
        bytes(),
        option::of(bytes()),
        vec(input_offset(), 0..6),
        any::<i64>(),
    )
        .prop_map(
            |(partition, owner_epoch, table, key, value, input_offsets, written_at)| {
                ChangelogRecord {
                    partition,
                    owner_epoch,
                    table,
                    key,
                    value,
                    input_offsets,
                    written_at,
                }
            },
        )
        .boxed()
}

pub fn receipt() -> BoxedStrategy<Receipt> {
    (
        (
            any::<i32>(),
            any::<i64>(),
            text(),
            select(ReceiptKind::ALL),
            text(),
            text(),
            opt_text(),
            opt_text(),
        ),
        (
            opt_text(),
            opt_text(),
            opt_text(),
            select(Verdict::ALL),
            select(Reason::ALL),
            option::of(select(EffectState::ALL)),
            option::of(any::<i64>()),
            opt_text(),
        ),
        (
            opt_text(),
            opt_text(),
            any::<i64>(),
            text(),
            text(),
            bytes(),
        ),
    )
        .prop_map(
            |(
                (
                    partition,
                    sequence,
                    previous_hash,
                    kind,
                    operation_key,
                    cause_id,
                    proposal_id,
                    run_id,
                ),
                (tenant_id, principal_id, tool, verdict, reason, state, epoch, arguments_hash),
                (policy_bundle_hash, detail, issued_at, key_id, hash, signature),
            )| Receipt {
                partition,
                sequence,
                previous_hash,
                kind,
                operation_key,
                cause_id,
                proposal_id,
                run_id,
                tenant_id,
                principal_id,
                tool,
                verdict,
                reason,
                state,
                epoch,
                arguments_hash,
                policy_bundle_hash,
                detail,
                issued_at,
                key_id,
                hash,
                signature,
            },
        )
        .boxed()
}

pub fn any_record() -> BoxedStrategy<AnyRecord> {
    prop_oneof![
        tool_proposal().prop_map(AnyRecord::from),
        approval().prop_map(AnyRecord::from),
        outcome().prop_map(AnyRecord::from),
        control().prop_map(AnyRecord::from),
        dispatch_command().prop_map(AnyRecord::from),
        reconcile_command().prop_map(AnyRecord::from),
        decision().prop_map(AnyRecord::from),
        journal_event().prop_map(AnyRecord::from),
        changelog_record().prop_map(AnyRecord::from),
        receipt().prop_map(AnyRecord::from),
    ]
    .boxed()
}

/// A fixed, realistic proposal (used by golden and rejection tests).
pub fn sample_proposal() -> ToolProposal {
    ToolProposal {
        proposal_id: "prop-0001".into(),
        operation_key: "refund:order-42".into(),
        run_id: "run-7".into(),
        logical_call_id: "call-1".into(),
        provider_call_id: Some("toolu_01".into()),
        tenant_id: "acme".into(),
        principal_id: "user-1".into(),
        tool: "payments.refund".into(),
        tool_version: "1.0.0".into(),
        arguments_json: r#"{"amount_cents":1000,"order":"order-42"}"#.into(),
        arguments_hash: None,
        lease_owner: "agent-worker-3".into(),
        lease_fence: 5,
        deadline_at: 1_700_000_060_000,
        proposed_at: 1_700_000_000_000,
    }
}

/// A fixed changelog record (has bytes, an array and a tombstone-able value).
pub fn sample_changelog() -> ChangelogRecord {
    ChangelogRecord {
        partition: 3,
        owner_epoch: 11,
        table: StateTable::Effect,
        key: b"refund:order-42".to_vec(),
        value: Some(vec![0, 1, 2, 255]),
        input_offsets: vec![
            InputOffset {
                topic: "airlock.proposals".into(),
                partition: 3,
                offset: 1234,
            },
            InputOffset {
                topic: "airlock.outcomes".into(),
                partition: 3,
                offset: -1,
            },
        ],
        written_at: 1_700_000_000_500,
    }
}

/// One fixed value of every record.
pub fn samples() -> Vec<AnyRecord> {
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let mut out = vec![
        AnyRecord::from(sample_proposal()),
        AnyRecord::from(sample_changelog()),
    ];
    for strategy in [
        approval().prop_map(AnyRecord::from).boxed(),
        outcome().prop_map(AnyRecord::from).boxed(),
        control().prop_map(AnyRecord::from).boxed(),
        dispatch_command().prop_map(AnyRecord::from).boxed(),
        reconcile_command().prop_map(AnyRecord::from).boxed(),
        decision().prop_map(AnyRecord::from).boxed(),
        journal_event().prop_map(AnyRecord::from).boxed(),
        receipt().prop_map(AnyRecord::from).boxed(),
    ] {
        out.push(
            strategy
                .new_tree(&mut runner)
                .expect("deterministic runner generates a value")
                .current(),
        );
    }
    out
}
