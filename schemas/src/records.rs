//! Rust mirrors of Airlock's Avro records, the [`Record`] trait tying each to its schema, and
//! [`AnyRecord`] for payloads whose record type is only known after reading their header.
//!
//! Field order matters: apache-avro's serializer writes struct fields in declaration order, so
//! every struct declares its fields exactly in the order of its `.avsc` file (a test checks it).
//! Timestamps are milliseconds since the Unix epoch (`timestamp-millis`), optional fields are
//! `Option`s and Avro `bytes` are `Vec<u8>`.

use std::fmt;

use apache_avro::{Schema, serde_avro_bytes, serde_avro_bytes_opt};
use serde::{Deserialize, Serialize, de::DeserializeOwned};

use crate::{
    ApprovalVerdict, ControlKind, EffectState, Error, JournalKind, OutcomeKind, Reason,
    ReceiptKind, RecordKind, StateTable, Verdict,
};

mod sealed {
    pub trait Sealed {}
}

/// A Rust type that mirrors one of Airlock's top-level Avro records.
///
/// The trait is sealed: only the record types of this crate implement it, which is what lets the
/// crate's tests prove that every implementation matches its schema.
pub trait Record:
    Serialize
    + DeserializeOwned
    + fmt::Debug
    + Clone
    + PartialEq
    + Send
    + Sync
    + Into<AnyRecord>
    + TryFrom<AnyRecord, Error = Error>
    + sealed::Sealed
    + 'static
{
    /// Which record this is.
    const KIND: RecordKind;

    /// The record's name without namespace (e.g. `ToolProposal`).
    const NAME: &'static str = Self::KIND.name();

    /// The record's full name (e.g. `dev.airlock.v1.ToolProposal`).
    const FULL_NAME: &'static str = Self::KIND.full_name();

    /// The record's current schema, parsed once.
    #[must_use]
    fn schema() -> &'static Schema {
        Self::KIND.schema()
    }
}

/// An agent's request to perform one tool call with side effects (`ToolProposal.avsc`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolProposal {
    /// Unique id of this proposal message.
    pub proposal_id: String,
    /// Identity of the side effect; repeated keys are retries of the same effect.
    pub operation_key: String,
    /// The agent run that proposes the call.
    pub run_id: String,
    /// The agent's id for this logical call, stable across its retries.
    pub logical_call_id: String,
    /// The model provider's id for the tool call, when there is one.
    pub provider_call_id: Option<String>,
    /// Tenant on whose behalf the call is made.
    pub tenant_id: String,
    /// Identity the agent acts for.
    pub principal_id: String,
    /// Tool name in Airlock's catalog.
    pub tool: String,
    /// Version of the tool's contract.
    pub tool_version: String,
    /// Tool arguments as JSON text (canonicalized by Airlock).
    pub arguments_json: String,
    /// Hex SHA-256 of the canonical arguments as computed by the agent; must match when present.
    pub arguments_hash: Option<String>,
    /// Agent worker holding the run's lease.
    pub lease_owner: String,
    /// Fencing token of the lease.
    pub lease_fence: i64,
    /// Deadline of the whole intent, epoch milliseconds.
    pub deadline_at: i64,
    /// Creation time of the proposal, epoch milliseconds.
    pub proposed_at: i64,
}

/// A human decision on a proposal that waits for approval (`Approval.avsc`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Approval {
    /// Unique id of this approval message.
    pub approval_id: String,
    /// Identity of the side effect.
    pub operation_key: String,
    /// Hex SHA-256 of the canonical arguments the approver saw.
    pub arguments_hash: String,
    /// The human who decided.
    pub approver_id: String,
    /// Tenant of the approver.
    pub tenant_id: String,
    /// The decision.
    pub verdict: ApprovalVerdict,
    /// End of the approval's validity, epoch milliseconds.
    pub expires_at: i64,
    /// Time of the decision, epoch milliseconds.
    pub decided_at: i64,
    /// Free text from the approver, for audit only.
    pub comment: Option<String>,
}

/// What a connector observed about one attempt (`Outcome.avsc`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    /// Unique id of this outcome message.
    pub outcome_id: String,
    /// Identity of the side effect.
    pub operation_key: String,
    /// Attempt epoch the outcome is about.
    pub epoch: i64,
    /// What was observed.
    pub kind: OutcomeKind,
    /// Connector that executed the attempt.
    pub connector: String,
    /// Connector worker instance that reports.
    pub worker_id: String,
    /// Bounded untrusted text from the downstream system; never interpreted.
    pub evidence: Option<String>,
    /// The downstream system's id for the effect.
    pub provider_reference: Option<String>,
    /// Reconcile round answered; `None` for outcomes of a dispatch.
    pub reconcile_round: Option<i32>,
    /// Observation time, epoch milliseconds.
    pub observed_at: i64,
}

/// An operator command (`Control.avsc`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Control {
    /// Unique id of this control message.
    pub control_id: String,
    /// The command.
    pub kind: ControlKind,
    /// Effect the command applies to.
    pub operation_key: Option<String>,
    /// Run the command applies to.
    pub run_id: Option<String>,
    /// New lease fence of the run (`LEASE_FENCE`).
    pub lease_fence: Option<i64>,
    /// Operator who issued the command.
    pub operator_id: String,
    /// Justification or external evidence, for audit only.
    pub evidence: Option<String>,
    /// Issue time, epoch milliseconds.
    pub issued_at: i64,
}

/// An order to a connector to perform one attempt (`DispatchCommand.avsc`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DispatchCommand {
    /// Unique id of this command.
    pub command_id: String,
    /// Identity of the side effect.
    pub operation_key: String,
    /// Attempt epoch; outcomes echo it.
    pub epoch: i64,
    /// Proposal the attempt executes.
    pub proposal_id: String,
    /// Tool name.
    pub tool: String,
    /// Version of the tool's contract.
    pub tool_version: String,
    /// Connector that must execute the attempt.
    pub connector: String,
    /// Tenant on whose behalf the call is made.
    pub tenant_id: String,
    /// Identity the call is made for.
    pub principal_id: String,
    /// Canonical JSON arguments.
    pub arguments_json: String,
    /// Hex SHA-256 of `arguments_json`.
    pub arguments_hash: String,
    /// Key passed downstream so that attempts take effect at most once.
    pub idempotency_key: String,
    /// Deadline of the whole intent, epoch milliseconds.
    pub deadline_at: i64,
    /// Expiry of this command, epoch milliseconds.
    pub attempt_deadline_at: i64,
    /// How long the connector may wait downstream before reporting `UNKNOWN`, milliseconds.
    pub attempt_timeout_ms: i64,
    /// Hash of the policy bundle that allowed the effect.
    pub policy_bundle_hash: String,
    /// Processor partition owning the operation key.
    pub owner_partition: i32,
    /// The owner's epoch when it issued the command.
    pub owner_epoch: i64,
    /// Signature proving Airlock issued the command; `None` until signing is enabled.
    #[serde(with = "serde_avro_bytes_opt")]
    pub capability: Option<Vec<u8>>,
    /// Issue time, epoch milliseconds.
    pub issued_at: i64,
}

/// An order to a connector to find out whether an attempt took effect (`ReconcileCommand.avsc`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReconcileCommand {
    /// Unique id of this command.
    pub command_id: String,
    /// Identity of the side effect.
    pub operation_key: String,
    /// Attempt epoch to reconcile.
    pub epoch: i64,
    /// Tool that was called.
    pub tool: String,
    /// Connector that must reconcile.
    pub connector: String,
    /// Idempotency key the attempt used downstream.
    pub idempotency_key: String,
    /// Hex SHA-256 of the attempt's canonical arguments.
    pub arguments_hash: String,
    /// Reconcile round, from 1.
    pub round: i32,
    /// Processor partition owning the operation key.
    pub owner_partition: i32,
    /// The owner's epoch when it issued the command.
    pub owner_epoch: i64,
    /// Signature proving Airlock issued the command; `None` until signing is enabled.
    #[serde(with = "serde_avro_bytes_opt")]
    pub capability: Option<Vec<u8>>,
    /// Issue time, epoch milliseconds.
    pub issued_at: i64,
}

/// Airlock's answer to one input (`Decision.avsc`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    /// Unique id of this decision.
    pub decision_id: String,
    /// Id of the proposal, approval, control or outcome that caused it.
    pub in_reply_to: String,
    /// Identity of the side effect.
    pub operation_key: String,
    /// Run of the input, when known.
    pub run_id: Option<String>,
    /// Airlock's answer.
    pub verdict: Verdict,
    /// Machine-readable cause.
    pub reason: Reason,
    /// Human-readable explanation.
    pub detail: String,
    /// Hex SHA-256 of the canonical arguments, when the input had arguments.
    pub arguments_hash: Option<String>,
    /// Policy bundle evaluated, when policy was evaluated.
    pub policy_bundle_hash: Option<String>,
    /// Attempt epoch concerned, when an attempt exists.
    pub epoch: Option<i64>,
    /// State of the effect after the decision.
    pub state: Option<EffectState>,
    /// Receipt of a committed effect.
    pub receipt: Option<String>,
    /// Deciding processor partition.
    pub owner_partition: i32,
    /// The deciding owner's epoch.
    pub owner_epoch: i64,
    /// Decision time, epoch milliseconds.
    pub decided_at: i64,
}

/// One state transition of the processor (`JournalEvent.avsc`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalEvent {
    /// Processor partition that recorded the transition.
    pub partition: i32,
    /// Gap-free position in the partition's journal.
    pub sequence: i64,
    /// The owner's epoch when it recorded the transition.
    pub owner_epoch: i64,
    /// Processor task that recorded the transition.
    pub task: String,
    /// Version of the reducer whose rules produced the transition.
    pub reducer_version: i32,
    /// Kind of transition.
    pub kind: JournalKind,
    /// Id of the input (or timer) that caused the transition.
    pub cause_id: String,
    /// Effect concerned.
    pub operation_key: Option<String>,
    /// Run concerned.
    pub run_id: Option<String>,
    /// Proposal concerned.
    pub proposal_id: Option<String>,
    /// Principal concerned.
    pub principal_id: Option<String>,
    /// Tenant concerned.
    pub tenant_id: Option<String>,
    /// Tool concerned.
    pub tool: Option<String>,
    /// Policy bundle evaluated.
    pub policy_bundle_hash: Option<String>,
    /// The run's lease fence.
    pub lease_fence: Option<i64>,
    /// Attempt epoch.
    pub epoch: Option<i64>,
    /// Verdict published by the transition.
    pub verdict: Option<Verdict>,
    /// Reason of the transition.
    pub reason: Option<Reason>,
    /// State of the effect after the transition.
    pub state: Option<EffectState>,
    /// Hex SHA-256 of the canonical arguments.
    pub arguments_hash: Option<String>,
    /// Untrusted evidence that came with the input.
    pub evidence: Option<String>,
    /// Full per-key record after the transition, as JSON (read by the reducer).
    pub record_json: Option<String>,
    /// Hash of the partition's reduced state (on `CHECKPOINT`).
    pub projection_hash: Option<String>,
    /// Recording time, epoch milliseconds.
    pub recorded_at: i64,
}

/// A position in an input topic partition (nested in [`ChangelogRecord`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct InputOffset {
    /// Input topic.
    pub topic: String,
    /// Partition of the input topic.
    pub partition: i32,
    /// Offset of the next record to consume.
    pub offset: i64,
}

/// One change to the processor's local state (`ChangelogRecord.avsc`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangelogRecord {
    /// Processor partition whose state changed.
    pub partition: i32,
    /// The owner's epoch that wrote the change.
    pub owner_epoch: i64,
    /// State table of the entry.
    pub table: StateTable,
    /// Key of the entry within the table.
    #[serde(with = "serde_avro_bytes")]
    pub key: Vec<u8>,
    /// New value of the entry; `None` deletes it (tombstone).
    #[serde(with = "serde_avro_bytes_opt")]
    pub value: Option<Vec<u8>>,
    /// Input positions the state reflects once the change is applied.
    pub input_offsets: Vec<InputOffset>,
    /// Write time, epoch milliseconds.
    pub written_at: i64,
}

macro_rules! any_record {
    ($($name:ident,)+) => {
        /// A value of any of Airlock's top-level records, as returned by
        /// [`Codec::decode`](crate::Codec::decode).
        // The variants differ in size, but an `AnyRecord` is moved a handful of times per
        // message; boxing would cost an allocation per message instead.
        #[allow(clippy::large_enum_variant)]
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub enum AnyRecord {
            $(
                #[doc = concat!("A [`", stringify!($name), "`].")]
                $name($name),
            )+
        }

        impl AnyRecord {
            /// Which record the value is.
            #[must_use]
            pub const fn kind(&self) -> RecordKind {
                match self {
                    $(Self::$name(_) => RecordKind::$name,)+
                }
            }
        }

        $(
            impl sealed::Sealed for $name {}

            impl Record for $name {
                const KIND: RecordKind = RecordKind::$name;
            }

            impl From<$name> for AnyRecord {
                fn from(record: $name) -> Self {
                    Self::$name(record)
                }
            }

            impl TryFrom<AnyRecord> for $name {
                type Error = Error;

                fn try_from(any: AnyRecord) -> Result<Self, Error> {
                    match any {
                        AnyRecord::$name(record) => Ok(record),
                        other => Err(Error::WrongRecord {
                            expected: RecordKind::$name,
                            found: other.kind(),
                        }),
                    }
                }
            }
        )+
    };
}

/// A signed, hash-chained attestation of one terminal outcome or one refusal (`Receipt.avsc`).
///
/// `hash` and `signature` are the last two fields: the hash covers the Avro datum up to them,
/// so a verifier hashes the bytes it read, whatever writer version produced them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    /// Processor partition whose chain holds the receipt.
    pub partition: i32,
    /// Gap-free position in the partition's chain, from 0.
    pub sequence: i64,
    /// Hex hash of the receipt at `sequence - 1` (64 zeros for the first).
    pub previous_hash: String,
    /// Settlement or refusal.
    pub kind: ReceiptKind,
    /// Effect concerned (empty when a refused input named none).
    pub operation_key: String,
    /// Id of the input (or timer) that caused the transition.
    pub cause_id: String,
    /// Proposal of the effect.
    pub proposal_id: Option<String>,
    /// Agent run.
    pub run_id: Option<String>,
    /// Tenant.
    pub tenant_id: Option<String>,
    /// Requester, approver, connector worker or operator the transition names.
    pub principal_id: Option<String>,
    /// Tool.
    pub tool: Option<String>,
    /// Verdict published.
    pub verdict: Verdict,
    /// Reason of the verdict.
    pub reason: Reason,
    /// State of the effect after the transition.
    pub state: Option<EffectState>,
    /// Attempt epoch.
    pub epoch: Option<i64>,
    /// Hex SHA-256 of the canonical arguments.
    pub arguments_hash: Option<String>,
    /// Policy bundle in force.
    pub policy_bundle_hash: Option<String>,
    /// Explanation published with the verdict (quotes untrusted evidence).
    pub detail: Option<String>,
    /// Time of the transition, epoch milliseconds.
    pub issued_at: i64,
    /// Hex Ed25519 public key of the signer.
    pub key_id: String,
    /// Hex SHA-256 of the content (the datum before this field).
    pub hash: String,
    /// Ed25519 signature of the hash.
    #[serde(with = "serde_avro_bytes")]
    pub signature: Vec<u8>,
}

any_record! {
    ToolProposal,
    Approval,
    Outcome,
    Control,
    DispatchCommand,
    ReconcileCommand,
    Decision,
    JournalEvent,
    ChangelogRecord,
    Receipt,
}
