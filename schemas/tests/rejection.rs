//! Payloads that must be refused, each with its typed error.

mod common;

use airlock_schemas::{
    Codec, DEFAULT_MAX_PAYLOAD_BYTES, Decision, Error, Fingerprint, Framing, RecordKind, SchemaIds,
    ToolProposal,
};

fn proposal_payload(codec: &Codec, framing: Framing) -> Vec<u8> {
    codec
        .encode(framing, &common::sample_proposal())
        .expect("sample encodes")
}

fn confluent_codec() -> Codec {
    Codec::new().with_schema_ids(
        SchemaIds::new()
            .with(7, RecordKind::ToolProposal)
            .expect("fresh id")
            .with(8, RecordKind::Decision)
            .expect("fresh id"),
    )
}

#[test]
fn empty_payloads_are_rejected() {
    let codec = Codec::new();
    assert!(matches!(codec.decode(&[]), Err(Error::EmptyPayload)));
    assert!(matches!(
        codec.decode_as::<ToolProposal>(&[]),
        Err(Error::EmptyPayload)
    ));
    assert!(matches!(
        codec.decode_datum::<ToolProposal>(&[]),
        Err(Error::EmptyPayload)
    ));
}

#[test]
fn truncated_headers_are_rejected() {
    let codec = confluent_codec();
    let single = proposal_payload(&codec, Framing::SingleObject);
    for len in 1..10 {
        let err = codec.decode(&single[..len]).expect_err("cut header");
        assert!(
            matches!(
                err,
                Error::TruncatedHeader {
                    framing: Framing::SingleObject,
                    needed: 10,
                    ..
                }
            ),
            "{len}: {err}"
        );
    }
    let confluent = proposal_payload(&codec, Framing::Confluent);
    for len in 1..5 {
        let err = codec.decode(&confluent[..len]).expect_err("cut header");
        assert!(
            matches!(
                err,
                Error::TruncatedHeader {
                    framing: Framing::Confluent,
                    needed: 5,
                    ..
                }
            ),
            "{len}: {err}"
        );
    }
}

#[test]
fn truncated_datums_are_rejected_in_every_framing() {
    let codec = confluent_codec();
    for framing in [Framing::Raw, Framing::SingleObject, Framing::Confluent] {
        let payload = proposal_payload(&codec, framing);
        let header = framing.header_len();
        for len in (header + 1)..payload.len() {
            let cut = &payload[..len];
            let result = if framing == Framing::Raw {
                codec.decode_datum::<ToolProposal>(cut)
            } else {
                codec.decode_as::<ToolProposal>(cut)
            };
            let err = result.expect_err("truncated datum");
            assert!(
                matches!(
                    err,
                    Error::TruncatedDatum {
                        record: RecordKind::ToolProposal,
                        ..
                    }
                ),
                "{framing} cut to {len}: {err}"
            );
        }
    }
}

#[test]
fn oversized_payloads_are_rejected_before_decoding() {
    let codec = Codec::new();
    // Not even a valid header: the size check must come first.
    let huge = vec![0xFFu8; DEFAULT_MAX_PAYLOAD_BYTES + 1];
    assert!(matches!(
        codec.decode(&huge),
        Err(Error::PayloadTooLarge { len, max }) if len == huge.len() && max == DEFAULT_MAX_PAYLOAD_BYTES
    ));
    assert!(matches!(
        codec.decode_datum::<ToolProposal>(&huge),
        Err(Error::PayloadTooLarge { .. })
    ));

    let payload = proposal_payload(&codec, Framing::SingleObject);
    let small = Codec::new().with_max_payload_bytes(payload.len() - 1);
    assert!(matches!(
        small.decode(&payload),
        Err(Error::PayloadTooLarge { len, max }) if len == payload.len() && max == payload.len() - 1
    ));
    let exact = Codec::new().with_max_payload_bytes(payload.len());
    assert!(exact.decode(&payload).is_ok());
}

#[test]
fn oversized_values_are_not_encoded() {
    let mut proposal = common::sample_proposal();
    proposal.arguments_json = "x".repeat(DEFAULT_MAX_PAYLOAD_BYTES);
    let codec = Codec::new();
    let mut out = vec![1, 2, 3];
    let err = codec
        .encode_into(Framing::SingleObject, &proposal, &mut out)
        .expect_err("too large");
    assert!(
        matches!(
            err,
            Error::PayloadTooLarge {
                max: DEFAULT_MAX_PAYLOAD_BYTES,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(out, vec![1, 2, 3], "buffer left as it was");
}

#[test]
fn foreign_payloads_are_rejected() {
    let codec = confluent_codec();

    // Single-object header with a fingerprint of no Airlock schema.
    let mut single = proposal_payload(&codec, Framing::SingleObject);
    single[2..10].copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
    let err = codec.decode(&single).expect_err("unknown fingerprint");
    assert!(err.is_foreign());
    assert!(matches!(
        err,
        Error::UnknownFingerprint { fingerprint } if fingerprint == Fingerprint::from_le_bytes([1, 2, 3, 4, 5, 6, 7, 8])
    ));

    // Confluent id nobody registered.
    let mut confluent = proposal_payload(&codec, Framing::Confluent);
    confluent[1..5].copy_from_slice(&999u32.to_be_bytes());
    let err = codec.decode(&confluent).expect_err("unknown id");
    assert!(err.is_foreign());
    assert!(matches!(err, Error::UnknownSchemaId { id: 999 }));

    // A Confluent payload read by a codec without ids.
    let confluent = proposal_payload(&codec, Framing::Confluent);
    assert!(matches!(
        Codec::new().decode(&confluent),
        Err(Error::UnknownSchemaId { id: 7 })
    ));

    // Neither framing: JSON text, a single-object-like header with a wrong second byte.
    for payload in [
        &b"{\"proposal_id\":1}"[..],
        &[0xC3, 0x02, 0, 0][..],
        &[0x7F][..],
    ] {
        let err = codec.decode(payload).expect_err("unknown framing");
        assert!(err.is_foreign(), "{err}");
        assert!(matches!(err, Error::UnknownFraming { .. }), "{err}");
    }

    // A damaged payload of ours is not foreign.
    let single = proposal_payload(&codec, Framing::SingleObject);
    assert!(!codec.decode(&single[..12]).expect_err("cut").is_foreign());
}

#[test]
fn wrong_record_types_are_rejected() {
    let codec = confluent_codec();
    for framing in [Framing::SingleObject, Framing::Confluent] {
        let payload = proposal_payload(&codec, framing);
        let err = codec
            .decode_as::<Decision>(&payload)
            .expect_err("not a decision");
        assert!(
            matches!(
                err,
                Error::WrongRecord {
                    expected: RecordKind::Decision,
                    found: RecordKind::ToolProposal
                }
            ),
            "{err}"
        );
    }
    // Asking for one framing and getting another.
    let single = proposal_payload(&codec, Framing::SingleObject);
    assert!(matches!(
        codec.decode_confluent::<ToolProposal>(&single),
        Err(Error::WrongFraming {
            expected: Framing::Confluent,
            found: Framing::SingleObject
        })
    ));
    let confluent = proposal_payload(&codec, Framing::Confluent);
    let err = codec
        .decode_single_object::<ToolProposal>(&confluent)
        .expect_err("not single-object");
    assert!(!err.is_foreign());
    assert!(matches!(
        err,
        Error::WrongFraming {
            expected: Framing::SingleObject,
            found: Framing::Confluent
        }
    ));
    // AnyRecord conversions say what they found.
    let any = codec.decode(&single).expect("valid").record;
    assert!(matches!(
        Decision::try_from(any),
        Err(Error::WrongRecord {
            expected: RecordKind::Decision,
            found: RecordKind::ToolProposal
        })
    ));
}

#[test]
fn trailing_bytes_are_rejected() {
    let codec = confluent_codec();
    for framing in [Framing::Raw, Framing::SingleObject, Framing::Confluent] {
        let mut payload = proposal_payload(&codec, framing);
        let end = payload.len();
        payload.extend_from_slice(&[0, 0]);
        let result = if framing == Framing::Raw {
            codec.decode_datum::<ToolProposal>(&payload)
        } else {
            codec.decode_as::<ToolProposal>(&payload)
        };
        let err = result.expect_err("trailing bytes");
        assert!(
            matches!(
                err,
                Error::TrailingBytes { record: RecordKind::ToolProposal, end: e, trailing: 2 } if e == end
            ),
            "{framing}: {err}"
        );
    }
}

#[test]
fn malformed_datums_are_rejected() {
    let codec = Codec::new();
    let raw = proposal_payload(&codec, Framing::Raw);

    // Invalid UTF-8 in the first string (proposal_id = "prop-0001", length byte then text).
    let mut bad_utf8 = raw.clone();
    bad_utf8[1] = 0xFF;
    let err = codec
        .decode_datum::<ToolProposal>(&bad_utf8)
        .expect_err("bad utf-8");
    assert!(
        matches!(&err, Error::MalformedDatum { record: RecordKind::ToolProposal, offset: 0, reason } if reason.contains("UTF-8")),
        "{err}"
    );

    // A negative string length.
    let mut negative = raw.clone();
    negative[0] = 0x01;
    let err = codec
        .decode_datum::<ToolProposal>(&negative)
        .expect_err("negative length");
    assert!(
        matches!(err, Error::MalformedDatum { offset: 0, .. }),
        "{err}"
    );

    // Union index 5 for provider_call_id (["null","string"]): hand-built datum.
    let mut datum = Vec::new();
    for _ in 0..4 {
        datum.extend_from_slice(&[0x02, b'x']); // four strings
    }
    let union_offset = datum.len();
    datum.push(0x0A); // zig-zag 5
    let err = codec
        .decode_datum::<ToolProposal>(&datum)
        .expect_err("bad union index");
    assert!(
        matches!(&err, Error::MalformedDatum { offset, reason, .. } if *offset == union_offset && reason.contains("union index 5")),
        "{err}"
    );

    // Enum index out of range (Decision.verdict has 14 symbols).
    let decision_payload = {
        let mut datum = Vec::new();
        for _ in 0..3 {
            datum.extend_from_slice(&[0x02, b'x']); // decision_id, in_reply_to, operation_key
        }
        datum.push(0x00); // run_id = null
        datum.push(0x1C); // verdict index 14
        datum
    };
    let err = codec
        .decode_datum::<Decision>(&decision_payload)
        .expect_err("bad enum index");
    assert!(
        matches!(&err, Error::MalformedDatum { record: RecordKind::Decision, offset: 7, reason } if reason.contains("enum index 14")),
        "{err}"
    );
}

#[test]
fn a_crafted_huge_string_length_does_not_allocate() {
    // A single-object ToolProposal whose first string claims 2^62 bytes, under a codec that
    // accepts payloads as large as memory: the claimed length is checked against the bytes
    // actually present, so this fails at once instead of trying to allocate.
    let codec = Codec::new().with_max_payload_bytes(usize::MAX);
    let mut payload = vec![0xC3, 0x01];
    payload.extend_from_slice(
        &RecordKind::ToolProposal
            .current()
            .fingerprint()
            .to_le_bytes(),
    );
    payload.extend_from_slice(&[0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01]);
    payload.extend_from_slice(b"short");
    let err = codec.decode(&payload).expect_err("huge length");
    assert!(
        matches!(
            err,
            Error::TruncatedDatum { record: RecordKind::ToolProposal, offset: 20, needed, available: 5 } if needed == 1 << 62
        ),
        "{err}"
    );

    // The same with a length just over what is left, and for an array count (ChangelogRecord).
    let mut datum = vec![0x06, 0x00, 0x02, 0x00]; // partition 3, owner_epoch 0, table PROPOSAL, key ""
    datum.push(0x00); // value = null
    datum.extend_from_slice(&[0xFE, 0xFF, 0xFF, 0xFF, 0x0F]); // 2^31 - 1 input offsets
    datum.extend_from_slice(&[0x00; 8]);
    let err = codec
        .decode_datum::<airlock_schemas::ChangelogRecord>(&datum)
        .expect_err("huge array");
    assert!(
        matches!(
            err,
            Error::TruncatedDatum {
                record: RecordKind::ChangelogRecord,
                needed: 2_147_483_647,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn schema_id_registration_refuses_conflicts() {
    let mut ids = SchemaIds::new();
    ids.register(1, RecordKind::ToolProposal).expect("fresh");
    ids.register(1, RecordKind::ToolProposal)
        .expect("same pair again is fine");
    assert!(matches!(
        ids.register(1, RecordKind::Decision),
        Err(Error::SchemaIdTaken {
            id: 1,
            existing: RecordKind::ToolProposal,
            existing_version: 1
        })
    ));
    assert!(matches!(
        ids.register(2, RecordKind::ToolProposal),
        Err(Error::DuplicateSchemaId {
            record: RecordKind::ToolProposal,
            existing_id: 1,
            new_id: 2
        })
    ));
    assert!(matches!(
        ids.register_version(3, RecordKind::ToolProposal, 99),
        Err(Error::UnknownVersion {
            record: RecordKind::ToolProposal,
            version: 99
        })
    ));
    assert_eq!(ids.id_of(RecordKind::ToolProposal), Some(1));
    assert_eq!(ids.id_of(RecordKind::Decision), None);
    assert_eq!(ids.len(), 1);

    let err = Codec::new()
        .encode_confluent(&common::sample_proposal())
        .expect_err("no id");
    assert!(matches!(
        err,
        Error::SchemaIdMissing {
            record: RecordKind::ToolProposal
        }
    ));
}

#[test]
fn unknown_writer_versions_are_rejected() {
    let codec = Codec::new();
    let raw = proposal_payload(&codec, Framing::Raw);
    assert!(matches!(
        codec.decode_datum_version::<ToolProposal>(&raw, 0),
        Err(Error::UnknownVersion {
            record: RecordKind::ToolProposal,
            version: 0
        })
    ));
    assert_eq!(
        codec
            .decode_datum_version::<ToolProposal>(&raw, 1)
            .expect("v1 is current"),
        common::sample_proposal()
    );
}
