//! Property tests: every record survives every framing, apache-avro's reference encoder writes
//! the same bytes as this crate's writer, and its reference decoder reads exactly what this
//! crate writes.

mod common;

use airlock_schemas::{
    AnyRecord, Codec, Framing, Record, RecordKind, SchemaIds, decode_datum, decode_single_object,
    encode_datum, encode_single_object,
};
use proptest::{prelude::*, test_runner::TestCaseError};

fn codec() -> Codec {
    let mut ids = SchemaIds::new();
    for (i, kind) in RecordKind::ALL.iter().enumerate() {
        let id = 100 + u32::try_from(i).expect("few records");
        ids.register(id, *kind).expect("distinct ids");
    }
    Codec::new().with_schema_ids(ids)
}

fn check<T: Record>(codec: &Codec, value: &T) -> Result<(), TestCaseError> {
    // Raw datum.
    let raw = codec.encode_datum(value)?;
    prop_assert_eq!(&codec.decode_datum::<T>(&raw)?, value);
    prop_assert_eq!(&decode_datum::<T>(&raw)?, value);
    prop_assert_eq!(&encode_datum(value)?, &raw);

    // apache-avro's reference encoder writes the same bytes.
    let mut reference = Vec::new();
    apache_avro::write_avro_datum_ref(T::schema(), value, &mut reference)?;
    prop_assert_eq!(&reference, &raw);

    // apache-avro's reference decoder agrees with what was written.
    let reference = apache_avro::from_avro_datum(T::schema(), &mut raw.as_slice(), None)?;
    prop_assert_eq!(&apache_avro::from_value::<T>(&reference)?, value);

    // Single-object: header, fingerprint, then the same datum.
    let single = codec.encode_single_object(value)?;
    prop_assert_eq!(&single[..2], &[0xC3, 0x01]);
    prop_assert_eq!(
        &single[2..10],
        &T::KIND.current().fingerprint().to_le_bytes()
    );
    prop_assert_eq!(&single[10..], raw.as_slice());
    prop_assert_eq!(&codec.decode_single_object::<T>(&single)?, value);
    prop_assert_eq!(&decode_single_object::<T>(&single)?, value);
    prop_assert_eq!(&encode_single_object(value)?, &single);
    prop_assert_eq!(&codec.decode_as::<T>(&single)?, value);

    // Confluent: magic, big-endian id, then the same datum.
    let confluent = codec.encode_confluent(value)?;
    let id = codec.schema_ids().id_of(T::KIND).expect("registered");
    prop_assert_eq!(confluent[0], 0);
    prop_assert_eq!(&confluent[1..5], &id.to_be_bytes());
    prop_assert_eq!(&confluent[5..], raw.as_slice());
    prop_assert_eq!(&codec.decode_confluent::<T>(&confluent)?, value);
    prop_assert_eq!(&codec.decode_as::<T>(&confluent)?, value);

    // Auto-detection reports the framing, writer schema and record.
    for (payload, framing) in [
        (&single, Framing::SingleObject),
        (&confluent, Framing::Confluent),
    ] {
        let header = codec.read_header(payload)?;
        prop_assert_eq!(header.framing, framing);
        prop_assert_eq!(header.kind(), T::KIND);
        let decoded = codec.decode(payload)?;
        prop_assert_eq!(decoded.framing, framing);
        prop_assert_eq!(decoded.writer.kind(), T::KIND);
        prop_assert!(decoded.writer.is_current());
        prop_assert_eq!(decoded.record.kind(), T::KIND);
        prop_assert_eq!(&T::try_from(decoded.record)?, value);
    }

    // encode_into appends to what the buffer already holds.
    let mut buffer = vec![0xAA];
    codec.encode_into(Framing::SingleObject, value, &mut buffer)?;
    prop_assert_eq!(buffer[0], 0xAA);
    prop_assert_eq!(&buffer[1..], single.as_slice());
    Ok(())
}

fn check_any(codec: &Codec, any: &AnyRecord) -> Result<(), TestCaseError> {
    match any {
        AnyRecord::ToolProposal(r) => check(codec, r),
        AnyRecord::Approval(r) => check(codec, r),
        AnyRecord::Outcome(r) => check(codec, r),
        AnyRecord::Control(r) => check(codec, r),
        AnyRecord::DispatchCommand(r) => check(codec, r),
        AnyRecord::ReconcileCommand(r) => check(codec, r),
        AnyRecord::Decision(r) => check(codec, r),
        AnyRecord::JournalEvent(r) => check(codec, r),
        AnyRecord::ChangelogRecord(r) => check(codec, r),
        AnyRecord::Receipt(r) => check(codec, r),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn tool_proposal_round_trips(value in common::tool_proposal()) {
        check(&codec(), &value)?;
    }

    #[test]
    fn approval_round_trips(value in common::approval()) {
        check(&codec(), &value)?;
    }

    #[test]
    fn outcome_round_trips(value in common::outcome()) {
        check(&codec(), &value)?;
    }

    #[test]
    fn control_round_trips(value in common::control()) {
        check(&codec(), &value)?;
    }

    #[test]
    fn dispatch_command_round_trips(value in common::dispatch_command()) {
        check(&codec(), &value)?;
    }

    #[test]
    fn reconcile_command_round_trips(value in common::reconcile_command()) {
        check(&codec(), &value)?;
    }

    #[test]
    fn decision_round_trips(value in common::decision()) {
        check(&codec(), &value)?;
    }

    #[test]
    fn journal_event_round_trips(value in common::journal_event()) {
        check(&codec(), &value)?;
    }

    #[test]
    fn changelog_record_round_trips(value in common::changelog_record()) {
        check(&codec(), &value)?;
    }

    #[test]
    fn receipt_round_trips(value in common::receipt()) {
        check(&codec(), &value)?;
    }

    #[test]
    fn any_record_round_trips(value in common::any_record()) {
        check_any(&codec(), &value)?;
    }

    /// Cutting any encoded payload short never decodes to a value.
    #[test]
    fn every_strict_prefix_is_rejected(value in common::any_record()) {
        let codec = codec();
        let payload = match &value {
            AnyRecord::ToolProposal(r) => codec.encode_single_object(r)?,
            AnyRecord::Approval(r) => codec.encode_single_object(r)?,
            AnyRecord::Outcome(r) => codec.encode_single_object(r)?,
            AnyRecord::Control(r) => codec.encode_single_object(r)?,
            AnyRecord::DispatchCommand(r) => codec.encode_single_object(r)?,
            AnyRecord::ReconcileCommand(r) => codec.encode_single_object(r)?,
            AnyRecord::Decision(r) => codec.encode_single_object(r)?,
            AnyRecord::JournalEvent(r) => codec.encode_single_object(r)?,
            AnyRecord::ChangelogRecord(r) => codec.encode_single_object(r)?,
            AnyRecord::Receipt(r) => codec.encode_single_object(r)?,
        };
        for len in 0..payload.len() {
            prop_assert!(codec.decode(&payload[..len]).is_err(), "prefix of {} bytes decoded", len);
        }
    }
}

#[test]
fn fixed_samples_round_trip() {
    let codec = codec();
    for sample in common::samples() {
        check_any(&codec, &sample).expect("sample round-trips");
    }
}
