//! Golden values frozen from the first release (v1) of the schemas.
//!
//! These bytes are what other languages and already-written Kafka data depend on. They must only
//! change together with a new schema version (a new `avro/history/<Record>/vN.avsc`); if one of
//! these tests fails otherwise, the wire format changed by accident.

mod common;

use airlock_schemas::{
    Codec, Fingerprint, Framing, RecordKind, ToolProposal, schema_by_fingerprint,
};

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Per record: the CRC-64-AVRO fingerprint written in single-object headers (Java's
/// `SchemaNormalization` canonical form, timestamps as `"long"`), then the compat fingerprint
/// also accepted (apache-avro 0.21 / Python `avro` 1.12, timestamps as `{"type":"long"}`), both
/// as the 8 header bytes in hex. The compat values were cross-checked with Python `avro` 1.12.2's
/// `Schema.fingerprint("CRC-64-AVRO")`, and the reference ones with the same CRC over its
/// canonical form with `{"type":"long"}` reduced to `"long"`.
///
/// Must only change with a new schema version.
const FINGERPRINTS: &[(RecordKind, &str, &str)] = &[
    (
        RecordKind::ToolProposal,
        "6439b7d84795b9b1",
        "25077c19e4d785e4",
    ),
    (RecordKind::Approval, "d820b7a6a9f86b6a", "7e7950dd7d43aa18"),
    (RecordKind::Outcome, "6ed537c518938628", "53105fbaa3e0b737"),
    (RecordKind::Control, "f7b9c9a34bf4cc9c", "d3942f492297ad44"),
    (
        RecordKind::DispatchCommand,
        "7e274f3a94654b1d",
        "6f27c0111c37c164",
    ),
    (
        RecordKind::ReconcileCommand,
        "1ab667f31b0e40f3",
        "68df7f0c180f1b1e",
    ),
    (RecordKind::Decision, "10bfd5276060e2c9", "b6d90f2168532fc6"),
    (
        RecordKind::JournalEvent,
        "faac48eefbee76af",
        "ff3f66368c45b221",
    ),
    (
        RecordKind::ChangelogRecord,
        "377bc0849627a7db",
        "fa6c63ef5a5fca53",
    ),
    (RecordKind::Receipt, "3c5cd0524f2c2193", "efa9caf6f7af2afb"),
];

#[test]
fn fingerprints_are_frozen() {
    assert_eq!(FINGERPRINTS.len(), RecordKind::ALL.len());
    for (kind, reference, compat) in FINGERPRINTS {
        let current = kind.current();
        assert_eq!(
            current.fingerprint().to_string(),
            *reference,
            "fingerprint of {kind} changed: a schema change needs a new snapshot version"
        );
        assert_eq!(
            current.compat_fingerprint().to_string(),
            *compat,
            "compat fingerprint of {kind} changed: a schema change needs a new snapshot version"
        );
        for fingerprint in [current.fingerprint(), current.compat_fingerprint()] {
            let found = schema_by_fingerprint(fingerprint).expect("known fingerprint");
            assert_eq!(found.kind(), *kind);
            assert!(found.is_current());
        }
    }
}

/// The Parsing Canonical Form of `ToolProposal` v1, as Java's
/// `SchemaNormalization.toParsingForm` renders it. Must only change with a new schema version.
const TOOL_PROPOSAL_CANONICAL_FORM: &str = concat!(
    r#"{"name":"dev.airlock.v1.ToolProposal","type":"record","fields":["#,
    r#"{"name":"proposal_id","type":"string"},"#,
    r#"{"name":"operation_key","type":"string"},"#,
    r#"{"name":"run_id","type":"string"},"#,
    r#"{"name":"logical_call_id","type":"string"},"#,
    r#"{"name":"provider_call_id","type":["null","string"]},"#,
    r#"{"name":"tenant_id","type":"string"},"#,
    r#"{"name":"principal_id","type":"string"},"#,
    r#"{"name":"tool","type":"string"},"#,
    r#"{"name":"tool_version","type":"string"},"#,
    r#"{"name":"arguments_json","type":"string"},"#,
    r#"{"name":"arguments_hash","type":["null","string"]},"#,
    r#"{"name":"lease_owner","type":"string"},"#,
    r#"{"name":"lease_fence","type":"long"},"#,
    r#"{"name":"deadline_at","type":"long"},"#,
    r#"{"name":"proposed_at","type":"long"}]}"#,
);

#[test]
fn tool_proposal_canonical_form_is_frozen() {
    let current = RecordKind::ToolProposal.current();
    assert_eq!(current.canonical_form(), TOOL_PROPOSAL_CANONICAL_FORM);
    assert_eq!(
        Fingerprint::of_bytes(TOOL_PROPOSAL_CANONICAL_FORM.as_bytes()),
        current.fingerprint()
    );
}

/// The sample proposal (`common::sample_proposal`) in single-object encoding: `c3 01`, the
/// fingerprint `6439b7d84795b9b1`, then the datum. Must only change with a new schema version.
const TOOL_PROPOSAL_SINGLE_OBJECT: &str = concat!(
    "c301",
    "6439b7d84795b9b1",
    "1270726f702d30303031",                       // proposal_id "prop-0001"
    "1e726566756e643a6f726465722d3432",           // operation_key "refund:order-42"
    "0a72756e2d37",                               // run_id "run-7"
    "0c63616c6c2d31",                             // logical_call_id "call-1"
    "0210746f6f6c755f3031",                       // provider_call_id: branch 1, "toolu_01"
    "0861636d65",                                 // tenant_id "acme"
    "0c757365722d31",                             // principal_id "user-1"
    "1e7061796d656e74732e726566756e64",           // tool "payments.refund"
    "0a312e302e30",                               // tool_version "1.0.0"
    "50",                                         // arguments_json: 40 bytes ...
    "7b22616d6f756e745f63656e7473223a313030302c", // {"amount_cents":1000,
    "226f72646572223a226f726465722d3432227d",     // "order":"order-42"}
    "00",                                         // arguments_hash: branch 0, null
    "1c6167656e742d776f726b65722d33",             // lease_owner "agent-worker-3"
    "0a",                                         // lease_fence 5
    "c0c9b2fef962",                               // deadline_at 1_700_000_060_000
    "80a0abfef962",                               // proposed_at 1_700_000_000_000
);

#[test]
fn tool_proposal_single_object_bytes_are_frozen() {
    let codec = Codec::new();
    let payload = codec
        .encode(Framing::SingleObject, &common::sample_proposal())
        .expect("sample encodes");
    assert_eq!(hex(&payload), TOOL_PROPOSAL_SINGLE_OBJECT);
    let decoded: ToolProposal = codec.decode_as(&payload).expect("golden decodes");
    assert_eq!(decoded, common::sample_proposal());
}

#[test]
fn compat_fingerprint_headers_are_accepted() {
    let codec = Codec::new();
    let mut payload = codec
        .encode(Framing::SingleObject, &common::sample_proposal())
        .expect("sample encodes");
    payload[2..10].copy_from_slice(
        &RecordKind::ToolProposal
            .current()
            .compat_fingerprint()
            .to_le_bytes(),
    );
    let decoded = codec.decode(&payload).expect("compat header decodes");
    assert_eq!(decoded.writer.kind(), RecordKind::ToolProposal);
    assert_eq!(
        ToolProposal::try_from(decoded.record).expect("a proposal"),
        common::sample_proposal()
    );
}
