//! Airlock's Avro contract: the schemas every Airlock component and client speaks, typed Rust
//! records that mirror them, and their wire framings.
//!
//! * The `.avsc` files under `schemas/avro/` are the source of truth (namespace
//!   `dev.airlock.v1`); they are embedded in this crate and parsed once, on first use.
//!   [`RecordKind`] lists the top-level records and gives access to each one's current
//!   [`SchemaVersion`] and frozen snapshots.
//! * [`ToolProposal`], [`Approval`], [`Outcome`], [`Control`], [`DispatchCommand`],
//!   [`ReconcileCommand`], [`Decision`], [`JournalEvent`], [`ChangelogRecord`] (with the
//!   nested [`InputOffset`]) and [`Receipt`] mirror the records field for field; the [`Record`]
//!   trait ties each to its schema. The Avro enums are [`Verdict`], [`Reason`],
//!   [`EffectState`], [`JournalKind`], [`OutcomeKind`], [`ControlKind`], [`ApprovalVerdict`],
//!   [`StateTable`] and [`ReceiptKind`].
//! * [`Codec`] encodes and decodes them as bare datums, Avro single-object payloads or
//!   Confluent wire-format payloads, with a size limit and typed [`Error`]s.
//!
//! ```
//! use airlock_schemas::{Codec, Framing, ToolProposal};
//!
//! let proposal = ToolProposal {
//!     proposal_id: "p-1".into(),
//!     operation_key: "refund:order-42".into(),
//!     run_id: "run-7".into(),
//!     logical_call_id: "call-1".into(),
//!     provider_call_id: None,
//!     tenant_id: "acme".into(),
//!     principal_id: "user-1".into(),
//!     tool: "payments.refund".into(),
//!     tool_version: "1".into(),
//!     arguments_json: r#"{"amount":10}"#.into(),
//!     arguments_hash: None,
//!     lease_owner: "worker-1".into(),
//!     lease_fence: 3,
//!     deadline_at: 1_700_000_060_000,
//!     proposed_at: 1_700_000_000_000,
//! };
//! let codec = Codec::new();
//! let payload = codec.encode(Framing::SingleObject, &proposal)?;
//! assert_eq!(&payload[..2], &[0xC3, 0x01]);
//! let decoded: ToolProposal = codec.decode_as(&payload)?;
//! assert_eq!(decoded, proposal);
//! # Ok::<(), airlock_schemas::Error>(())
//! ```

mod catalog;
pub mod codec;
mod datum;
mod enums;
mod error;
mod fingerprint;
mod kind;
mod records;
mod writer;

pub use apache_avro::Schema;
pub use catalog::{SchemaVersion, schema_by_fingerprint};
pub use codec::{
    CONFLUENT_MAGIC, Codec, DEFAULT_MAX_PAYLOAD_BYTES, Decoded, FrameHeader, Framing,
    SINGLE_OBJECT_MAGIC, SchemaIds, decode_datum, decode_single_object, encode_datum,
    encode_single_object,
};
pub use enums::{
    ApprovalVerdict, ControlKind, EffectState, JournalKind, OutcomeKind, Reason, ReceiptKind,
    StateTable, Verdict,
};
pub use error::{Error, Result};
pub use fingerprint::{Fingerprint, parsing_canonical_form};
pub use kind::RecordKind;
pub use records::{
    AnyRecord, Approval, ChangelogRecord, Control, Decision, DispatchCommand, InputOffset,
    JournalEvent, Outcome, Receipt, ReconcileCommand, Record, ToolProposal,
};

/// The Avro namespace of every Airlock schema.
pub const NAMESPACE: &str = "dev.airlock.v1";
