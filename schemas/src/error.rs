//! The crate's single error type and its [`Result`] alias.
//!
//! Every variant carries the context needed to act on it without parsing the message: which
//! record, which byte offset, which limit. [`Error::is_foreign`] tells a payload that is simply
//! not ours (unknown framing, fingerprint or schema id) apart from one that is ours but broken.

use crate::{Fingerprint, Framing, RecordKind};

/// `Result` with this crate's [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while encoding, decoding or looking up Airlock schemas.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The payload has no bytes at all.
    #[error("empty payload")]
    EmptyPayload,

    /// The payload ends inside its framing header.
    #[error("payload of {len} bytes is too short for a {framing} header of {needed} bytes")]
    TruncatedHeader {
        /// The framing the first bytes announced.
        framing: Framing,
        /// Length of the payload.
        len: usize,
        /// Length of the header.
        needed: usize,
    },

    /// The payload ends inside the Avro datum, or a length inside the datum points past its end.
    #[error(
        "{record} datum truncated at payload byte {offset}: {needed} bytes needed, {available} left"
    )]
    TruncatedDatum {
        /// Record being decoded.
        record: RecordKind,
        /// Offset in the payload (header included) where more bytes were needed.
        offset: usize,
        /// Bytes the datum claimed or needed at that offset.
        needed: u64,
        /// Bytes that were left in the payload.
        available: usize,
    },

    /// The payload is larger than the configured maximum; nothing was decoded.
    #[error("payload of {len} bytes exceeds the maximum of {max} bytes")]
    PayloadTooLarge {
        /// Length of the payload.
        len: usize,
        /// Configured maximum.
        max: usize,
    },

    /// The first bytes are neither a single-object nor a Confluent header (foreign payload).
    #[error(
        "foreign payload: leading bytes {leading:02x?} are neither an Avro single-object header (c3 01) nor a Confluent magic byte (00)"
    )]
    UnknownFraming {
        /// Up to the first two bytes of the payload.
        leading: Vec<u8>,
    },

    /// A single-object payload whose writer-schema fingerprint is not one of ours (foreign payload).
    #[error("foreign payload: no Airlock schema has the fingerprint {fingerprint}")]
    UnknownFingerprint {
        /// Fingerprint found in the header.
        fingerprint: Fingerprint,
    },

    /// A Confluent payload whose schema id is not registered in the [`SchemaIds`](crate::SchemaIds)
    /// in use (foreign payload).
    #[error(
        "foreign payload: Confluent schema id {id} is none of Airlock's schemas known to this \
         reader (registered for another schema, unknown to the registry, or no \
         schema_registry.url configured)"
    )]
    UnknownSchemaId {
        /// Schema id found in the header.
        id: u32,
    },

    /// The payload holds another record than the one requested.
    #[error("expected a {expected} record, the payload holds a {found} record")]
    WrongRecord {
        /// Record type requested by the caller.
        expected: RecordKind,
        /// Record type named by the payload's header.
        found: RecordKind,
    },

    /// The payload is framed otherwise than the caller asked for (e.g. a Confluent payload given
    /// to [`Codec::decode_single_object`](crate::Codec::decode_single_object)).
    #[error("expected a {expected} payload, got a {found} payload")]
    WrongFraming {
        /// Framing requested by the caller.
        expected: Framing,
        /// Framing of the payload.
        found: Framing,
    },

    /// Bytes are left after a complete datum.
    #[error("{trailing} trailing bytes after the {record} datum, which ends at payload byte {end}")]
    TrailingBytes {
        /// Record that was decoded.
        record: RecordKind,
        /// Offset in the payload where the datum ended.
        end: usize,
        /// Number of bytes left after it.
        trailing: usize,
    },

    /// The datum does not decode with the writer schema (bad union or enum index, invalid UTF-8,
    /// value that does not fit the Rust type, ...).
    #[error("malformed {record} datum at payload byte {offset}: {reason}")]
    MalformedDatum {
        /// Record being decoded.
        record: RecordKind,
        /// Offset in the payload (header included) where decoding failed.
        offset: usize,
        /// What was wrong.
        reason: String,
    },

    /// Data written with an older schema version could not be resolved to the current schema.
    #[error(
        "cannot resolve {record} data written with schema v{writer_version} to the current schema: {source}"
    )]
    Resolution {
        /// Record being decoded.
        record: RecordKind,
        /// Version of the writer schema.
        writer_version: u32,
        /// The Avro library's error.
        #[source]
        source: apache_avro::Error,
    },

    /// The value could not be encoded with its schema.
    #[error("cannot encode a {record} record: {source}")]
    Encode {
        /// Record being encoded.
        record: RecordKind,
        /// The Avro library's error.
        #[source]
        source: apache_avro::Error,
    },

    /// Confluent framing was requested for a record that has no schema id.
    #[error("no Confluent schema id is registered for {record}")]
    SchemaIdMissing {
        /// Record being encoded.
        record: RecordKind,
    },

    /// A schema id is already registered for another schema.
    #[error("schema id {id} is already registered for {existing} v{existing_version}")]
    SchemaIdTaken {
        /// The id being registered.
        id: u32,
        /// Record the id is registered for.
        existing: RecordKind,
        /// Schema version the id is registered for.
        existing_version: u32,
    },

    /// The current schema of a record already has another schema id.
    #[error("{record} already has schema id {existing_id}, cannot also register {new_id}")]
    DuplicateSchemaId {
        /// Record being registered.
        record: RecordKind,
        /// Id it already has.
        existing_id: u32,
        /// Id that was refused.
        new_id: u32,
    },

    /// No schema version with this number exists for the record.
    #[error("{record} has no schema version {version}")]
    UnknownVersion {
        /// Record asked for.
        record: RecordKind,
        /// Version asked for.
        version: u32,
    },

    /// A name that is not one of Airlock's top-level records.
    #[error("{name:?} is not an Airlock record name")]
    UnknownRecordName {
        /// The name given.
        name: String,
    },

    /// A string that is not a symbol of the enum.
    #[error("{symbol:?} is not a symbol of the Avro enum {enum_name}")]
    UnknownSymbol {
        /// Name of the enum.
        enum_name: &'static str,
        /// The string given.
        symbol: String,
    },

    /// A schema uses a type this crate's canonical form or decoder does not handle.
    #[error("unsupported Avro schema type {schema_type}: {why}")]
    UnsupportedSchema {
        /// The schema type.
        schema_type: String,
        /// Why it is not supported.
        why: &'static str,
    },
}

impl Error {
    /// True when the payload is not an Airlock payload at all (unknown framing, unknown
    /// single-object fingerprint or unknown Confluent schema id), as opposed to an Airlock
    /// payload that is damaged, too large or of the wrong record type.
    #[must_use]
    pub fn is_foreign(&self) -> bool {
        matches!(
            self,
            Self::UnknownFraming { .. }
                | Self::UnknownFingerprint { .. }
                | Self::UnknownSchemaId { .. }
        )
    }
}
