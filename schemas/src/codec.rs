//! Encoding and decoding Airlock records in three framings.
//!
//! * [`Framing::Raw`]: the bare Avro binary datum; the reader must know the record and schema.
//! * [`Framing::SingleObject`]: Avro's single-object encoding, `C3 01`, the 8-byte little-endian
//!   CRC-64-AVRO fingerprint of the writer schema's Parsing Canonical Form, then the datum.
//! * [`Framing::Confluent`]: Confluent's wire format, `00`, a 4-byte big-endian schema id, then
//!   the datum. Ids come from a caller-configured [`SchemaIds`]; nothing here talks to a registry.
//!
//! [`Codec::decode`] and [`Codec::decode_as`] recognise the two self-describing framings by
//! their first byte. Every decode checks the payload size against the configured maximum before
//! looking at any other byte, refuses foreign payloads, the wrong record type and trailing bytes,
//! and never allocates from a length it has not checked against the bytes present. (This crate
//! does not rely on apache-avro's `util::max_allocation_bytes` for that: it is a process-wide,
//! set-once value that other users of apache-avro in the process may need at another level, and
//! it does not bound the capacity apache-avro reserves for arrays.)
//!
//! Records are written by this crate's own schema-driven writer (`writer`), byte for byte what
//! apache-avro writes (the round-trip property tests compare the two). Data whose writer schema
//! is the current one (the normal case) is read by this crate's own zero-copy datum reader. Data written with an older snapshot is first checked by that reader
//! against its writer schema (bounds, truncation, trailing bytes), then resolved to the current
//! schema by apache-avro.

use std::{collections::HashMap, fmt};

use crate::{
    AnyRecord, Approval, ChangelogRecord, Control, Decision, DispatchCommand, Error, Fingerprint,
    JournalEvent, Outcome, Receipt, ReconcileCommand, Record, RecordKind, Result, SchemaVersion,
    ToolProposal,
    catalog::schema_by_fingerprint,
    datum::{self, DatumError, DatumErrorKind},
};

/// Default maximum payload size: 1 MiB, header included.
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 1 << 20;

/// First two bytes of an Avro single-object payload.
pub const SINGLE_OBJECT_MAGIC: [u8; 2] = [0xC3, 0x01];

/// First byte of a Confluent wire-format payload.
pub const CONFLUENT_MAGIC: u8 = 0x00;

/// How a datum is framed in a payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Framing {
    /// The bare Avro binary datum, no header.
    Raw,
    /// Avro single-object encoding: `C3 01`, 8-byte little-endian schema fingerprint, datum.
    SingleObject,
    /// Confluent wire format: `00`, 4-byte big-endian schema id, datum.
    Confluent,
}

impl Framing {
    /// Length of the header before the datum.
    #[must_use]
    pub const fn header_len(self) -> usize {
        match self {
            Self::Raw => 0,
            Self::SingleObject => 10,
            Self::Confluent => 5,
        }
    }
}

impl fmt::Display for Framing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Raw => "raw datum",
            Self::SingleObject => "single-object",
            Self::Confluent => "Confluent",
        })
    }
}

/// Confluent schema ids of Airlock's schemas, as registered by the caller's schema registry.
///
/// Each id names one record and schema version. The id registered with [`register`] for a
/// record's current schema is the one [`Codec::encode`] writes; ids of older versions
/// ([`register_version`]) are only read.
///
/// [`register`]: SchemaIds::register
/// [`register_version`]: SchemaIds::register_version
#[derive(Debug, Clone, Default)]
pub struct SchemaIds {
    by_id: HashMap<u32, &'static SchemaVersion>,
    current: HashMap<RecordKind, u32>,
}

impl SchemaIds {
    /// An empty registry.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `id` as the schema id of `kind`'s current schema. Registering the same pair
    /// again is a no-op.
    ///
    /// # Errors
    ///
    /// [`Error::SchemaIdTaken`] if `id` already names another schema,
    /// [`Error::DuplicateSchemaId`] if the current schema already has another id.
    pub fn register(&mut self, id: u32, kind: RecordKind) -> Result<&mut Self> {
        self.register_version(id, kind, kind.current().version())
    }

    /// Registers `id` as the schema id of version `version` of `kind`'s schema.
    ///
    /// # Errors
    ///
    /// [`Error::UnknownVersion`] if the version does not exist, [`Error::SchemaIdTaken`] if `id`
    /// already names another schema, [`Error::DuplicateSchemaId`] if the version is the current
    /// one and it already has another id.
    pub fn register_version(
        &mut self,
        id: u32,
        kind: RecordKind,
        version: u32,
    ) -> Result<&mut Self> {
        let schema = kind.version(version).ok_or(Error::UnknownVersion {
            record: kind,
            version,
        })?;
        if let Some(existing) = self.by_id.get(&id) {
            if existing.kind() == kind && existing.version() == version {
                return Ok(self);
            }
            return Err(Error::SchemaIdTaken {
                id,
                existing: existing.kind(),
                existing_version: existing.version(),
            });
        }
        if schema.is_current() {
            if let Some(&existing_id) = self.current.get(&kind) {
                return Err(Error::DuplicateSchemaId {
                    record: kind,
                    existing_id,
                    new_id: id,
                });
            }
            self.current.insert(kind, id);
        }
        self.by_id.insert(id, schema);
        Ok(self)
    }

    /// Builder form of [`register`](Self::register).
    ///
    /// # Errors
    ///
    /// As [`register`](Self::register).
    pub fn with(mut self, id: u32, kind: RecordKind) -> Result<Self> {
        self.register(id, kind)?;
        Ok(self)
    }

    /// The id of `kind`'s current schema, if registered.
    #[must_use]
    pub fn id_of(&self, kind: RecordKind) -> Option<u32> {
        self.current.get(&kind).copied()
    }

    /// The schema registered under `id`.
    #[must_use]
    pub fn resolve(&self, id: u32) -> Option<&'static SchemaVersion> {
        self.by_id.get(&id).copied()
    }

    /// Number of registered ids.
    #[must_use]
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether no id is registered.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }
}

/// The header of a self-describing payload: its framing and writer schema.
#[derive(Debug, Clone, Copy)]
pub struct FrameHeader {
    /// [`Framing::SingleObject`] or [`Framing::Confluent`].
    pub framing: Framing,
    /// The schema the datum was written with.
    pub writer: &'static SchemaVersion,
}

impl FrameHeader {
    /// The record the payload holds.
    #[must_use]
    pub fn kind(&self) -> RecordKind {
        self.writer.kind()
    }
}

/// A decoded self-describing payload.
#[derive(Debug, Clone)]
pub struct Decoded {
    /// How the payload was framed.
    pub framing: Framing,
    /// The schema the datum was written with.
    pub writer: &'static SchemaVersion,
    /// The record.
    pub record: AnyRecord,
}

/// Encoder and decoder with a payload size limit and Confluent schema ids.
///
/// Cheap to clone; holds no connection and no cache beyond the ids.
#[derive(Debug, Clone)]
pub struct Codec {
    max_payload_bytes: usize,
    schema_ids: SchemaIds,
}

impl Default for Codec {
    fn default() -> Self {
        Self::new()
    }
}

impl Codec {
    /// A codec with [`DEFAULT_MAX_PAYLOAD_BYTES`] and no Confluent schema ids.
    #[must_use]
    pub fn new() -> Self {
        Self {
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
            schema_ids: SchemaIds::new(),
        }
    }

    /// Sets the maximum payload size (header included) accepted by decoding and produced by
    /// encoding.
    #[must_use]
    pub fn with_max_payload_bytes(mut self, max_payload_bytes: usize) -> Self {
        self.max_payload_bytes = max_payload_bytes;
        self
    }

    /// Sets the Confluent schema ids.
    #[must_use]
    pub fn with_schema_ids(mut self, schema_ids: SchemaIds) -> Self {
        self.schema_ids = schema_ids;
        self
    }

    /// The maximum payload size.
    #[must_use]
    pub fn max_payload_bytes(&self) -> usize {
        self.max_payload_bytes
    }

    /// The Confluent schema ids.
    #[must_use]
    pub fn schema_ids(&self) -> &SchemaIds {
        &self.schema_ids
    }

    /// Appends `value`, framed as `framing` and written with its record's current schema, to
    /// `out`. On error `out` is left as it was.
    ///
    /// # Errors
    ///
    /// [`Error::SchemaIdMissing`] for Confluent framing without an id for the record,
    /// [`Error::Encode`] if the value does not fit the schema, [`Error::PayloadTooLarge`] if the
    /// payload would exceed the maximum.
    pub fn encode_into<T: Record>(
        &self,
        framing: Framing,
        value: &T,
        out: &mut Vec<u8>,
    ) -> Result<()> {
        let start = out.len();
        let writer = T::KIND.current();
        match framing {
            Framing::Raw => {}
            Framing::SingleObject => {
                out.extend_from_slice(&SINGLE_OBJECT_MAGIC);
                out.extend_from_slice(&writer.fingerprint().to_le_bytes());
            }
            Framing::Confluent => {
                let id = self
                    .schema_ids
                    .id_of(T::KIND)
                    .ok_or(Error::SchemaIdMissing { record: T::KIND })?;
                out.push(CONFLUENT_MAGIC);
                out.extend_from_slice(&id.to_be_bytes());
            }
        }
        if let Err(e) = crate::writer::encode(writer.schema(), writer.names(), value, out) {
            out.truncate(start);
            return Err(Error::Encode {
                record: T::KIND,
                source: apache_avro::Error::new(apache_avro::error::Details::SerializeValue(e.0)),
            });
        }
        let len = out.len() - start;
        if len > self.max_payload_bytes {
            out.truncate(start);
            return Err(Error::PayloadTooLarge {
                len,
                max: self.max_payload_bytes,
            });
        }
        Ok(())
    }

    /// `value` framed as `framing`, written with its record's current schema.
    ///
    /// # Errors
    ///
    /// As [`encode_into`](Self::encode_into).
    pub fn encode<T: Record>(&self, framing: Framing, value: &T) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(256);
        self.encode_into(framing, value, &mut out)?;
        Ok(out)
    }

    /// `value` as a bare Avro datum.
    ///
    /// # Errors
    ///
    /// As [`encode_into`](Self::encode_into).
    pub fn encode_datum<T: Record>(&self, value: &T) -> Result<Vec<u8>> {
        self.encode(Framing::Raw, value)
    }

    /// `value` in Avro single-object encoding.
    ///
    /// # Errors
    ///
    /// As [`encode_into`](Self::encode_into).
    pub fn encode_single_object<T: Record>(&self, value: &T) -> Result<Vec<u8>> {
        self.encode(Framing::SingleObject, value)
    }

    /// `value` in Confluent wire format, with the id registered for its current schema.
    ///
    /// # Errors
    ///
    /// As [`encode_into`](Self::encode_into).
    pub fn encode_confluent<T: Record>(&self, value: &T) -> Result<Vec<u8>> {
        self.encode(Framing::Confluent, value)
    }

    /// Decodes a bare Avro datum written with `T`'s current schema.
    ///
    /// # Errors
    ///
    /// [`Error::EmptyPayload`], [`Error::PayloadTooLarge`], [`Error::TruncatedDatum`],
    /// [`Error::MalformedDatum`] or [`Error::TrailingBytes`].
    pub fn decode_datum<T: Record>(&self, payload: &[u8]) -> Result<T> {
        self.check_size(payload)?;
        decode_body(T::KIND.current(), payload, 0)
    }

    /// Decodes a bare Avro datum written with version `writer_version` of `T`'s schema,
    /// resolving it to the current schema.
    ///
    /// # Errors
    ///
    /// As [`decode_datum`](Self::decode_datum), plus [`Error::UnknownVersion`] and
    /// [`Error::Resolution`].
    pub fn decode_datum_version<T: Record>(
        &self,
        payload: &[u8],
        writer_version: u32,
    ) -> Result<T> {
        self.check_size(payload)?;
        let writer = T::KIND
            .version(writer_version)
            .ok_or(Error::UnknownVersion {
                record: T::KIND,
                version: writer_version,
            })?;
        decode_body(writer, payload, 0)
    }

    /// Reads the header of a single-object or Confluent payload without decoding the datum.
    ///
    /// # Errors
    ///
    /// [`Error::EmptyPayload`], [`Error::PayloadTooLarge`], [`Error::TruncatedHeader`], or a
    /// foreign payload: [`Error::UnknownFraming`], [`Error::UnknownFingerprint`],
    /// [`Error::UnknownSchemaId`].
    pub fn read_header(&self, payload: &[u8]) -> Result<FrameHeader> {
        self.check_size(payload)?;
        match payload {
            [0xC3, 0x01, ..] => {
                let fingerprint: [u8; 8] = payload
                    .get(2..10)
                    .and_then(|bytes| bytes.try_into().ok())
                    .ok_or(Error::TruncatedHeader {
                        framing: Framing::SingleObject,
                        len: payload.len(),
                        needed: Framing::SingleObject.header_len(),
                    })?;
                let fingerprint = Fingerprint::from_le_bytes(fingerprint);
                let writer = schema_by_fingerprint(fingerprint)
                    .ok_or(Error::UnknownFingerprint { fingerprint })?;
                Ok(FrameHeader {
                    framing: Framing::SingleObject,
                    writer,
                })
            }
            [CONFLUENT_MAGIC, ..] => {
                let id: [u8; 4] = payload
                    .get(1..5)
                    .and_then(|bytes| bytes.try_into().ok())
                    .ok_or(Error::TruncatedHeader {
                        framing: Framing::Confluent,
                        len: payload.len(),
                        needed: Framing::Confluent.header_len(),
                    })?;
                let id = u32::from_be_bytes(id);
                let writer = self
                    .schema_ids
                    .resolve(id)
                    .ok_or(Error::UnknownSchemaId { id })?;
                Ok(FrameHeader {
                    framing: Framing::Confluent,
                    writer,
                })
            }
            // A lone 0xC3 may be the start of a cut single-object header.
            [0xC3] => Err(Error::TruncatedHeader {
                framing: Framing::SingleObject,
                len: 1,
                needed: Framing::SingleObject.header_len(),
            }),
            _ => Err(Error::UnknownFraming {
                leading: payload.iter().take(2).copied().collect(),
            }),
        }
    }

    /// Decodes a single-object or Confluent payload (recognised by its first byte) that must
    /// hold a `T`.
    ///
    /// # Errors
    ///
    /// As [`read_header`](Self::read_header), plus [`Error::WrongRecord`] and the datum errors of
    /// [`decode_datum_version`](Self::decode_datum_version).
    pub fn decode_as<T: Record>(&self, payload: &[u8]) -> Result<T> {
        // Hot path: a single-object payload written with T's current schema needs no lookup.
        let current = T::KIND.current();
        if payload.len() <= self.max_payload_bytes
            && payload.get(..2) == Some(&SINGLE_OBJECT_MAGIC[..])
            && payload.get(2..10) == Some(&current.fingerprint().to_le_bytes()[..])
        {
            return decode_body(current, payload, Framing::SingleObject.header_len());
        }
        let header = self.read_header(payload)?;
        if header.kind() != T::KIND {
            return Err(Error::WrongRecord {
                expected: T::KIND,
                found: header.kind(),
            });
        }
        decode_body(header.writer, payload, header.framing.header_len())
    }

    /// Decodes a single-object payload that must hold a `T`.
    ///
    /// # Errors
    ///
    /// As [`decode_as`](Self::decode_as), plus [`Error::WrongFraming`] for a Confluent payload.
    pub fn decode_single_object<T: Record>(&self, payload: &[u8]) -> Result<T> {
        self.decode_framed(Framing::SingleObject, payload)
    }

    /// Decodes a Confluent payload that must hold a `T`.
    ///
    /// # Errors
    ///
    /// As [`decode_as`](Self::decode_as), plus [`Error::WrongFraming`] for a single-object
    /// payload.
    pub fn decode_confluent<T: Record>(&self, payload: &[u8]) -> Result<T> {
        self.decode_framed(Framing::Confluent, payload)
    }

    /// Decodes a single-object or Confluent payload holding any Airlock record.
    ///
    /// # Errors
    ///
    /// As [`decode_as`](Self::decode_as), except [`Error::WrongRecord`].
    pub fn decode(&self, payload: &[u8]) -> Result<Decoded> {
        let header = self.read_header(payload)?;
        let writer = header.writer;
        let body = header.framing.header_len();
        let record = match writer.kind() {
            RecordKind::ToolProposal => decode_body::<ToolProposal>(writer, payload, body)?.into(),
            RecordKind::Approval => decode_body::<Approval>(writer, payload, body)?.into(),
            RecordKind::Outcome => decode_body::<Outcome>(writer, payload, body)?.into(),
            RecordKind::Control => decode_body::<Control>(writer, payload, body)?.into(),
            RecordKind::DispatchCommand => {
                decode_body::<DispatchCommand>(writer, payload, body)?.into()
            }
            RecordKind::ReconcileCommand => {
                decode_body::<ReconcileCommand>(writer, payload, body)?.into()
            }
            RecordKind::Decision => decode_body::<Decision>(writer, payload, body)?.into(),
            RecordKind::JournalEvent => decode_body::<JournalEvent>(writer, payload, body)?.into(),
            RecordKind::ChangelogRecord => {
                decode_body::<ChangelogRecord>(writer, payload, body)?.into()
            }
            RecordKind::Receipt => decode_body::<Receipt>(writer, payload, body)?.into(),
        };
        Ok(Decoded {
            framing: header.framing,
            writer,
            record,
        })
    }

    fn decode_framed<T: Record>(&self, framing: Framing, payload: &[u8]) -> Result<T> {
        let header = self.read_header(payload)?;
        if header.framing != framing {
            return Err(Error::WrongFraming {
                expected: framing,
                found: header.framing,
            });
        }
        if header.kind() != T::KIND {
            return Err(Error::WrongRecord {
                expected: T::KIND,
                found: header.kind(),
            });
        }
        decode_body(header.writer, payload, framing.header_len())
    }

    fn check_size(&self, payload: &[u8]) -> Result<()> {
        if payload.is_empty() {
            return Err(Error::EmptyPayload);
        }
        if payload.len() > self.max_payload_bytes {
            return Err(Error::PayloadTooLarge {
                len: payload.len(),
                max: self.max_payload_bytes,
            });
        }
        Ok(())
    }
}

/// Decodes the datum that starts at `payload[body..]`, written with `writer`, as a `T`.
fn decode_body<T: Record>(writer: &SchemaVersion, payload: &[u8], body: usize) -> Result<T> {
    debug_assert_eq!(writer.kind(), T::KIND, "caller checked the record kind");
    let datum = &payload[body..];
    let current = T::KIND.current();
    if writer.fingerprint() == current.fingerprint() {
        let (value, used) = datum::decode::<T>(current.schema(), current.names(), datum, body)
            .map_err(|e| datum_error(T::KIND, e))?;
        check_trailing(T::KIND, payload, body + used)?;
        return Ok(value);
    }
    resolve_older::<T>(writer, current, payload, body)
}

/// Decodes data written with an older schema: validated by our reader, resolved by apache-avro.
fn resolve_older<T: Record>(
    writer: &SchemaVersion,
    current: &SchemaVersion,
    payload: &[u8],
    body: usize,
) -> Result<T> {
    let mut datum = &payload[body..];
    let used = datum::skip(writer.schema(), writer.names(), datum, body)
        .map_err(|e| datum_error(T::KIND, e))?;
    check_trailing(T::KIND, payload, body + used)?;
    let resolution_error = |source| Error::Resolution {
        record: T::KIND,
        writer_version: writer.version(),
        source,
    };
    let value = apache_avro::from_avro_datum(writer.schema(), &mut datum, Some(current.schema()))
        .map_err(resolution_error)?;
    apache_avro::from_value::<T>(&value).map_err(resolution_error)
}

fn check_trailing(record: RecordKind, payload: &[u8], end: usize) -> Result<()> {
    if end < payload.len() {
        return Err(Error::TrailingBytes {
            record,
            end,
            trailing: payload.len() - end,
        });
    }
    Ok(())
}

fn datum_error(record: RecordKind, error: DatumError) -> Error {
    let offset = error.offset.unwrap_or_default();
    match error.kind {
        DatumErrorKind::Truncated { needed, available } => Error::TruncatedDatum {
            record,
            offset,
            needed,
            available,
        },
        DatumErrorKind::Invalid(reason) => Error::MalformedDatum {
            record,
            offset,
            reason,
        },
    }
}

/// [`Codec::encode_datum`] with the default codec.
///
/// # Errors
///
/// As [`Codec::encode_into`].
pub fn encode_datum<T: Record>(value: &T) -> Result<Vec<u8>> {
    Codec::new().encode_datum(value)
}

/// [`Codec::decode_datum`] with the default codec (1 MiB limit).
///
/// # Errors
///
/// As [`Codec::decode_datum`].
pub fn decode_datum<T: Record>(payload: &[u8]) -> Result<T> {
    Codec::new().decode_datum(payload)
}

/// [`Codec::encode_single_object`] with the default codec.
///
/// # Errors
///
/// As [`Codec::encode_into`].
pub fn encode_single_object<T: Record>(value: &T) -> Result<Vec<u8>> {
    Codec::new().encode_single_object(value)
}

/// [`Codec::decode_single_object`] with the default codec (1 MiB limit).
///
/// # Errors
///
/// As [`Codec::decode_single_object`].
pub fn decode_single_object<T: Record>(payload: &[u8]) -> Result<T> {
    Codec::new().decode_single_object(payload)
}

#[cfg(test)]
mod tests {
    use apache_avro::{Schema, types::Value};

    use super::*;
    use crate::{Reason, Verdict};

    /// An older, hypothetical `Decision` writer schema: no `receipt` field and fewer verdicts.
    /// Only the codec's internal resolution path is exercised with it; real snapshots live in
    /// `avro/history`.
    const OLDER_DECISION: &str = r#"{"type":"record","name":"Decision","namespace":"dev.airlock.v1","fields":[
        {"name":"decision_id","type":"string"},
        {"name":"in_reply_to","type":"string"},
        {"name":"operation_key","type":"string"},
        {"name":"run_id","type":["null","string"],"default":null},
        {"name":"verdict","type":{"type":"enum","name":"Verdict","symbols":["ACCEPTED","REJECTED"]}},
        {"name":"reason","type":{"type":"enum","name":"Reason","symbols":["AUTO_APPROVED","MALFORMED"]}},
        {"name":"detail","type":"string"},
        {"name":"arguments_hash","type":["null","string"],"default":null},
        {"name":"policy_bundle_hash","type":["null","string"],"default":null},
        {"name":"epoch","type":["null","long"],"default":null},
        {"name":"state","type":["null",{"type":"enum","name":"EffectState","symbols":["COMMITTED"]}],"default":null},
        {"name":"owner_partition","type":"int"},
        {"name":"owner_epoch","type":"long"},
        {"name":"decided_at","type":{"type":"long","logicalType":"timestamp-millis"}}]}"#;

    #[test]
    fn older_writer_schemas_are_resolved_to_the_current_one() {
        let writer = SchemaVersion::for_test(RecordKind::Decision, 0, OLDER_DECISION);
        let value = Value::Record(vec![
            ("decision_id".into(), Value::String("d-1".into())),
            ("in_reply_to".into(), Value::String("p-1".into())),
            ("operation_key".into(), Value::String("op".into())),
            (
                "run_id".into(),
                Value::Union(1, Box::new(Value::String("run".into()))),
            ),
            ("verdict".into(), Value::Enum(1, "REJECTED".into())),
            ("reason".into(), Value::Enum(1, "MALFORMED".into())),
            ("detail".into(), Value::String("bad".into())),
            (
                "arguments_hash".into(),
                Value::Union(0, Box::new(Value::Null)),
            ),
            (
                "policy_bundle_hash".into(),
                Value::Union(0, Box::new(Value::Null)),
            ),
            ("epoch".into(), Value::Union(1, Box::new(Value::Long(-3)))),
            (
                "state".into(),
                Value::Union(1, Box::new(Value::Enum(0, "COMMITTED".into()))),
            ),
            ("owner_partition".into(), Value::Int(7)),
            ("owner_epoch".into(), Value::Long(9)),
            (
                "decided_at".into(),
                Value::TimestampMillis(1_700_000_000_000),
            ),
        ]);
        let datum = apache_avro::to_avro_datum(writer.schema(), value).expect("valid value");
        let current = RecordKind::Decision.current();
        assert_ne!(writer.fingerprint(), current.fingerprint());
        let decision: Decision = resolve_older(&writer, current, &datum, 0).expect("resolvable");
        assert_eq!(decision.verdict, Verdict::Rejected);
        assert_eq!(decision.reason, Reason::Malformed);
        assert_eq!(
            decision.receipt, None,
            "new optional field takes its default"
        );
        assert_eq!(decision.epoch, Some(-3));
        assert_eq!(decision.decided_at, 1_700_000_000_000);

        let mut padded = datum.clone();
        padded.push(0);
        assert!(matches!(
            resolve_older::<Decision>(&writer, current, &padded, 0),
            Err(Error::TrailingBytes { trailing: 1, .. })
        ));
        assert!(matches!(
            resolve_older::<Decision>(&writer, current, &datum[..datum.len() - 1], 0),
            Err(Error::TruncatedDatum { .. })
        ));
        // The older schema parses as an ordinary schema too (sanity check of the fixture).
        Schema::parse_str(OLDER_DECISION).expect("fixture parses");
    }
}
