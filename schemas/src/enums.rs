//! The Avro enums of Airlock's schemas as Rust enums.
//!
//! Each variant serializes to its Avro symbol (`SCREAMING_SNAKE_CASE`), [`as_str`](Verdict::as_str)
//! returns that symbol and `ALL` lists the variants in the schema's symbol order (tests check
//! both against the `.avsc` files).
//!
//! Enum defaults (the reader-side fallback for a symbol a newer writer added): `EffectState` and
//! `OutcomeKind` fall back to `UNKNOWN` and `ApprovalVerdict` to `REJECT`, the conservative
//! readings. `Verdict`, `Reason`, `JournalKind`, `ControlKind`, `StateTable` and `ReceiptKind` have no default
//! on purpose: reading an unknown symbol as a known one would misreport or misapply it, so adding
//! one of their symbols requires upgrading readers before writers.

use std::{fmt, str::FromStr};

use serde::{Deserialize, Serialize};

use crate::Error;

macro_rules! avro_enum {
    (
        $(#[$meta:meta])*
        $name:ident {
            $( $(#[$variant_meta:meta])* $variant:ident = $symbol:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(
            Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
        )]
        #[serde(rename_all = "SCREAMING_SNAKE_CASE")]
        pub enum $name {
            $( $(#[$variant_meta])* $variant, )+
        }

        impl $name {
            /// Name of the Avro enum (without namespace).
            pub const AVRO_NAME: &'static str = stringify!($name);

            /// Every variant, in the order of the schema's symbols.
            pub const ALL: &'static [Self] = &[$(Self::$variant,)+];

            /// The Avro symbol of the variant.
            #[must_use]
            pub const fn as_str(&self) -> &'static str {
                match self {
                    $(Self::$variant => $symbol,)+
                }
            }

            /// The variant whose Avro symbol is `symbol`.
            #[must_use]
            pub fn from_symbol(symbol: &str) -> Option<Self> {
                match symbol {
                    $($symbol => Some(Self::$variant),)+
                    _ => None,
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $name {
            type Err = Error;

            fn from_str(symbol: &str) -> Result<Self, Error> {
                Self::from_symbol(symbol).ok_or_else(|| Error::UnknownSymbol {
                    enum_name: Self::AVRO_NAME,
                    symbol: symbol.to_owned(),
                })
            }
        }
    };
}

avro_enum! {
    /// Airlock's answer to an input (Avro enum `Verdict`; no enum default).
    Verdict {
        /// The proposal is admitted and will be dispatched.
        Accepted = "ACCEPTED",
        /// The proposal waits for a human approval.
        PendingApproval = "PENDING_APPROVAL",
        /// The input is invalid (malformed, unknown tool, hash mismatch, stale fence, ...).
        Rejected = "REJECTED",
        /// Policy forbids the effect.
        Denied = "DENIED",
        /// The input repeats one already decided; the earlier answer stands.
        Duplicate = "DUPLICATE",
        /// An attempt of the effect is running.
        InProgress = "IN_PROGRESS",
        /// An earlier attempt's outcome is unknown, so no new attempt is made.
        Ambiguous = "AMBIGUOUS",
        /// The operation key is already bound to other arguments.
        Conflict = "CONFLICT",
        /// The effect took place.
        Committed = "COMMITTED",
        /// The effect did not take place.
        Failed = "FAILED",
        /// Whether the effect took place is unknown.
        Unknown = "UNKNOWN",
        /// A deadline or an approval expired.
        Expired = "EXPIRED",
        /// An operator cancelled the effect.
        Cancelled = "CANCELLED",
        /// The input was recorded; it does not change the effect's verdict.
        Recorded = "RECORDED",
    }
}

avro_enum! {
    /// Machine-readable cause of a verdict or journal transition (Avro enum `Reason`; no enum
    /// default).
    Reason {
        /// Policy allowed the effect without approval.
        AutoApproved = "AUTO_APPROVED",
        /// A human approved the effect.
        Approved = "APPROVED",
        /// A new attempt is allowed because the previous one failed.
        RetryAfterFailure = "RETRY_AFTER_FAILURE",
        /// The input could not be decoded.
        Malformed = "MALFORMED",
        /// The input exceeded the size limit.
        Oversized = "OVERSIZED",
        /// The input's schema is not an Airlock schema.
        UnknownSchema = "UNKNOWN_SCHEMA",
        /// The Kafka key does not match the record's key field.
        KeyMismatch = "KEY_MISMATCH",
        /// The tool arguments exceed their size limit.
        ArgumentsTooLarge = "ARGUMENTS_TOO_LARGE",
        /// The tool is not in the catalog.
        UnknownTool = "UNKNOWN_TOOL",
        /// The tool version is not in the catalog.
        UnknownToolVersion = "UNKNOWN_TOOL_VERSION",
        /// The arguments are not valid JSON.
        ArgumentsInvalid = "ARGUMENTS_INVALID",
        /// The arguments violate the tool's argument schema.
        ArgumentsSchemaViolation = "ARGUMENTS_SCHEMA_VIOLATION",
        /// The agent's arguments hash differs from Airlock's.
        ArgumentsHashMismatch = "ARGUMENTS_HASH_MISMATCH",
        /// The tenant differs from the one the effect or run belongs to.
        TenantMismatch = "TENANT_MISMATCH",
        /// The arguments name a resource the principal is not bound to.
        ResourceUnbound = "RESOURCE_UNBOUND",
        /// An internal invariant did not hold; the input was not applied.
        InvariantViolated = "INVARIANT_VIOLATED",
        /// Policy denied the effect.
        PolicyDenied = "POLICY_DENIED",
        /// Policy requires a human approval.
        ApprovalRequired = "APPROVAL_REQUIRED",
        /// The lease fence is older than the run's current fence.
        StaleFence = "STALE_FENCE",
        /// The intent's deadline has passed.
        DeadlineExpired = "DEADLINE_EXPIRED",
        /// The operation key is bound to a different arguments hash.
        HashConflict = "HASH_CONFLICT",
        /// The effect already committed.
        AlreadyCommitted = "ALREADY_COMMITTED",
        /// An attempt is in progress.
        AttemptInProgress = "ATTEMPT_IN_PROGRESS",
        /// The last attempt's outcome is unknown.
        OutcomeUnknown = "OUTCOME_UNKNOWN",
        /// The effect is waiting for approval.
        AwaitingApproval = "AWAITING_APPROVAL",
        /// The intent is closed (settled, expired, denied or cancelled).
        IntentClosed = "INTENT_CLOSED",
        /// No attempts are left.
        AttemptsExhausted = "ATTEMPTS_EXHAUSTED",
        /// The tool does not allow another attempt after this outcome.
        RetryNotAllowed = "RETRY_NOT_ALLOWED",
        /// The run's budget is spent.
        RunBudgetExhausted = "RUN_BUDGET_EXHAUSTED",
        /// The approval is for other arguments.
        ApprovalHashMismatch = "APPROVAL_HASH_MISMATCH",
        /// The approval has expired.
        ApprovalExpired = "APPROVAL_EXPIRED",
        /// The approver is the principal the effect is for.
        SelfApproval = "SELF_APPROVAL",
        /// The approver may not approve this effect.
        ApproverNotEntitled = "APPROVER_NOT_ENTITLED",
        /// The approval repeats one already applied.
        ApprovalDuplicate = "APPROVAL_DUPLICATE",
        /// No approval is pending for the operation key.
        NoPendingApproval = "NO_PENDING_APPROVAL",
        /// The approver rejected the effect.
        ApprovalRejected = "APPROVAL_REJECTED",
        /// The approval was recorded; more approvals are needed.
        ApprovalRecorded = "APPROVAL_RECORDED",
        /// The connector reported the effect committed.
        OutcomeCommitted = "OUTCOME_COMMITTED",
        /// The connector reported the effect failed.
        OutcomeFailed = "OUTCOME_FAILED",
        /// The attempt's deadline passed without an outcome.
        AttemptTimedOut = "ATTEMPT_TIMED_OUT",
        /// Reconciliation settled the effect.
        Reconciled = "RECONCILED",
        /// An operator settled the effect.
        OperatorSettled = "OPERATOR_SETTLED",
        /// Only an operator can settle the effect now.
        OperatorRequired = "OPERATOR_REQUIRED",
        /// No approval arrived before the deadline.
        ApprovalTimedOut = "APPROVAL_TIMED_OUT",
        /// An operator cancelled the effect.
        CancelledByOperator = "CANCELLED_BY_OPERATOR",
        /// An operator advanced the run's lease fence.
        FenceAdvanced = "FENCE_ADVANCED",
    }
}

avro_enum! {
    /// Lifecycle state of one side effect (Avro enum `EffectState`; enum default `UNKNOWN`).
    EffectState {
        /// Waiting for a human approval.
        AwaitingApproval = "AWAITING_APPROVAL",
        /// A dispatch command was issued; no attempt has started yet.
        Dispatched = "DISPATCHED",
        /// An attempt has started.
        InFlight = "IN_FLIGHT",
        /// The effect took place.
        Committed = "COMMITTED",
        /// The effect did not take place.
        Failed = "FAILED",
        /// Whether the effect took place is unknown.
        Unknown = "UNKNOWN",
        /// Only an operator can settle the effect.
        OperatorRequired = "OPERATOR_REQUIRED",
        /// The deadline passed before the effect took place.
        Expired = "EXPIRED",
        /// Policy or an approver refused the effect.
        Denied = "DENIED",
        /// An operator cancelled the effect.
        Cancelled = "CANCELLED",
    }
}

avro_enum! {
    /// Kind of journal transition (Avro enum `JournalKind`; no enum default).
    JournalKind {
        /// A proposal was decided.
        ProposalDecided = "PROPOSAL_DECIDED",
        /// An approval was decided.
        ApprovalDecided = "APPROVAL_DECIDED",
        /// A dispatch command is about to be issued.
        DispatchIntent = "DISPATCH_INTENT",
        /// A connector started an attempt.
        AttemptStarted = "ATTEMPT_STARTED",
        /// The effect was settled (committed, failed or unknown).
        Settled = "SETTLED",
        /// A reconcile command was issued.
        ReconcileRequested = "RECONCILE_REQUESTED",
        /// The effect was handed to an operator.
        OperatorRequired = "OPERATOR_REQUIRED",
        /// An outcome was ignored (stale epoch, duplicate, ...).
        OutcomeIgnored = "OUTCOME_IGNORED",
        /// Evidence that an effect happened twice.
        DoubleEffectAlert = "DOUBLE_EFFECT_ALERT",
        /// A run's lease fence advanced.
        RunFenceAdvanced = "RUN_FENCE_ADVANCED",
        /// A record expired.
        RecordExpired = "RECORD_EXPIRED",
        /// A record was purged from state.
        RecordPurged = "RECORD_PURGED",
        /// An operator control was applied.
        ControlApplied = "CONTROL_APPLIED",
        /// A checkpoint of the partition's reduced state.
        Checkpoint = "CHECKPOINT",
    }
}

avro_enum! {
    /// What a connector observed about one attempt (Avro enum `OutcomeKind`; enum default
    /// `UNKNOWN`).
    OutcomeKind {
        /// The connector started the attempt.
        AttemptStarted = "ATTEMPT_STARTED",
        /// The effect took place.
        Committed = "COMMITTED",
        /// The effect did not take place.
        Failed = "FAILED",
        /// The connector cannot tell whether the effect took place.
        Unknown = "UNKNOWN",
        /// Reconciliation found that the effect took place.
        ReconciledCommitted = "RECONCILED_COMMITTED",
        /// Reconciliation found that the effect did not take place.
        ReconciledFailed = "RECONCILED_FAILED",
        /// Reconciliation could not tell.
        ReconciledUnknown = "RECONCILED_UNKNOWN",
    }
}

avro_enum! {
    /// Operator command (Avro enum `ControlKind`; no enum default).
    ControlKind {
        /// Settle the effect as committed.
        SettleCommitted = "SETTLE_COMMITTED",
        /// Settle the effect as failed.
        SettleFailed = "SETTLE_FAILED",
        /// Cancel the effect.
        Cancel = "CANCEL",
        /// Advance a run's lease fence.
        LeaseFence = "LEASE_FENCE",
    }
}

avro_enum! {
    /// A human approver's decision (Avro enum `ApprovalVerdict`; enum default `REJECT`).
    ApprovalVerdict {
        /// Allow the effect.
        Approve = "APPROVE",
        /// Refuse the effect.
        Reject = "REJECT",
    }
}

avro_enum! {
    /// State table of a changelog entry (Avro enum `StateTable`; no enum default).
    StateTable {
        /// Per-effect records.
        Effect = "EFFECT",
        /// Per-proposal records.
        Proposal = "PROPOSAL",
        /// Per-run records.
        Run = "RUN",
        /// Input offsets.
        Offset = "OFFSET",
        /// Partition metadata.
        Meta = "META",
    }
}

avro_enum! {
    /// What a receipt attests (Avro enum `ReceiptKind`; no enum default).
    ReceiptKind {
        /// An effect reached a terminal state (COMMITTED, FAILED, CANCELLED).
        Settlement = "SETTLEMENT",
        /// A proposal, approval or operator command was refused.
        Refusal = "REFUSAL",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symbols_round_trip_through_from_str() {
        for verdict in Verdict::ALL {
            assert_eq!(verdict.as_str().parse::<Verdict>().ok(), Some(*verdict));
        }
        let err = "NOPE".parse::<Reason>().expect_err("not a symbol");
        assert!(matches!(
            err,
            Error::UnknownSymbol {
                enum_name: "Reason",
                ..
            }
        ));
    }
}
