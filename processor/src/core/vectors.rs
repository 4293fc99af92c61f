//! The shared test vectors of Airlock's client contract, `schemas/vectors/client.json`: what
//! a client in any language must compute byte for byte as the processor does (canonical
//! arguments and their hash, idempotency keys, partitions, Avro payloads in both framings,
//! the owner-epoch fence and signed fence markers, derived ids). This test writes them from the processor's own code
//! and fails when the file differs; the Python and TypeScript clients' tests read the file.
//!
//! After a deliberate change (a new vector, never a changed one: these are frozen contracts),
//! run `AIRLOCK_BLESS_VECTORS=1 cargo test -p airlock-processor vectors` and commit the file.

use std::path::PathBuf;

use airlock_schemas::{
    Codec, Decision, EffectState, Outcome, OutcomeKind, Reason, Record, RecordKind, SchemaIds,
    ToolProposal, Verdict,
};
use serde_json::{Value, json};

use crate::cli::ask::content_id;
use crate::core::canonical::{self, Error};
use crate::core::machine::proposal_fingerprint;
use crate::runtime::partitioner::{murmur2, partition_for};
use crate::runtime::wire::{Admit, FenceFilter, header};

/// The Confluent schema id the vectors use for every record's current schema.
const SCHEMA_ID: u32 = 7;

fn path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../schemas/vectors/client.json")
}

/// Texts whose canonical form (or refusal) every client must agree on.
const CANONICAL: &[(&str, &str)] = &[
    ("key order", r#"{"b":1,"a":2}"#),
    ("whitespace", " { \"a\" : [ 1 , 2 ] }\n"),
    ("nested", r#"{"z":{"y":[true,false,null],"x":"s"},"a":[]}"#),
    // U+E000 sorts after U+1F600 by UTF-16 code units (0xE000 > 0xD83D) and before it by
    // code points: Python's sort_keys gets this wrong.
    ("utf-16 order", "{\"\u{1F600}\":1,\"\u{E000}\":2,\"a\":3}"),
    ("astral vs BMP", "{\"\u{10000}\":1,\"\u{FFFF}\":2}"),
    ("escapes", r#"{"s":"q\"b\\n\nt\tc\u0001d\u001fe\/f\u2028"}"#),
    ("unicode escapes unescaped", r#"{"s":"\u00e9\ud83d\ude00"}"#),
    ("control characters", "[\"\\u0000\\u0008\\u000c\\u007f\"]"),
    (
        "largest safe integers",
        "[9007199254740991,-9007199254740991,0,-1]",
    ),
    ("empty object", "{}"),
    ("top-level string", r#""x""#),
    ("fraction", r#"{"amount":1.5}"#),
    ("exponent", r#"{"amount":1e3}"#),
    ("negative zero", r#"{"a":[-0]}"#),
    ("just past safe", "[9007199254740992]"),
    ("past 64 bits", "[18446744073709551616]"),
    ("duplicate key", r#"{"a":1,"b":{"c":1,"c":2}}"#),
    ("trailing content", "{} {}"),
    ("NaN", "[NaN]"),
    ("lone surrogate", r#"["\ud800"]"#),
    ("single quotes", "{'a':1}"),
    ("trailing comma", "[1,]"),
    ("pointer escapes", r#"{"a/b":{"c~d":[1.5]}}"#),
];

fn canonical_vectors() -> Value {
    let mut out = Vec::new();
    for (name, text) in CANONICAL {
        let entry = match canonical::canonicalize(text) {
            Ok(c) => json!({"name": name, "input": text, "canonical": c.json, "hash": c.hash}),
            Err(e) => {
                let (kind, path) = match &e {
                    Error::Syntax { .. } => ("syntax", None),
                    Error::DuplicateKey { path, .. } => ("duplicate_key", Some(path)),
                    Error::NonInteger { path } => ("non_integer", Some(path)),
                    Error::IntegerOutOfRange { path, .. } => ("integer_out_of_range", Some(path)),
                    Error::TooDeep { path, .. } => ("too_deep", Some(path)),
                };
                json!({"name": name, "input": text, "error": kind, "path": path})
            }
        };
        out.push(entry);
    }
    let deep = format!("{}{}", "[".repeat(65), "]".repeat(65));
    let e = canonical::canonicalize(&deep).expect_err("65 levels are too deep");
    let Error::TooDeep { path, .. } = e else {
        panic!("{e}")
    };
    out.push(json!({"name": "65 levels", "input": deep, "error": "too_deep", "path": path}));
    let ok = format!("{}{}", "[".repeat(64), "]".repeat(64));
    let c = canonical::canonicalize(&ok).expect("64 levels are fine");
    out.push(json!({"name": "64 levels", "input": ok, "canonical": c.json, "hash": c.hash}));
    Value::Array(out)
}

fn partition_vectors() -> Value {
    let keys = [
        "",
        "a",
        "ab",
        "abc",
        "abcd",
        "refund:txn_1",
        "refund:txn_2",
        "email:ord-99/welcome",
        "clé-é",
        "\u{1F600}",
        "21",
        "foobar",
    ];
    let mut out = Vec::new();
    for key in keys {
        for partitions in [1, 2, 3, 12, 64] {
            out.push(json!({
                "key": key,
                "partitions": partitions,
                "murmur2": murmur2(key.as_bytes()),
                "partition": partition_for(key.as_bytes(), partitions),
            }));
        }
    }
    Value::Array(out)
}

fn proposal() -> ToolProposal {
    ToolProposal {
        proposal_id: "propose/0123456789abcdef0123456789abcdef".into(),
        operation_key: "refund:txn_1".into(),
        run_id: "run-7".into(),
        logical_call_id: "step-1".into(),
        provider_call_id: Some("toolu_01".into()),
        tenant_id: "acme".into(),
        principal_id: "agent-support-1".into(),
        tool: "refund".into(),
        tool_version: "1".into(),
        arguments_json: r#"{"account":"acct-42","amount_minor":1250,"currency":"EUR"}"#.into(),
        arguments_hash: Some(
            canonical::canonicalize(
                r#"{"account":"acct-42","amount_minor":1250,"currency":"EUR"}"#,
            )
            .expect("canonical")
            .hash,
        ),
        lease_owner: "run-7".into(),
        lease_fence: 1,
        deadline_at: 1_767_225_600_000,
        proposed_at: 1_767_222_000_000,
    }
}

fn decision() -> Decision {
    Decision {
        decision_id: "d/refund:txn_1/1".into(),
        in_reply_to: "propose/0123456789abcdef0123456789abcdef".into(),
        operation_key: "refund:txn_1".into(),
        run_id: Some("run-7".into()),
        verdict: Verdict::Accepted,
        reason: Reason::AutoApproved,
        detail: "dispatched to ledger".into(),
        arguments_hash: Some("ab".repeat(32)),
        policy_bundle_hash: None,
        epoch: Some(1),
        state: Some(EffectState::Dispatched),
        receipt: None,
        owner_partition: 3,
        owner_epoch: 2,
        decided_at: 1_767_222_000_123,
    }
}

fn outcome() -> Outcome {
    Outcome {
        outcome_id: "o/refund:txn_1/1".into(),
        operation_key: "refund:txn_1".into(),
        epoch: 1,
        kind: OutcomeKind::Committed,
        connector: "ledger".into(),
        worker_id: "w1".into(),
        evidence: Some(r#"{"status":"ok"}"#.into()),
        provider_reference: Some("tx-991".into()),
        reconcile_round: None,
        observed_at: 1_767_222_001_000,
    }
}

fn avro_vectors() -> Value {
    let mut ids = SchemaIds::new();
    for kind in [
        RecordKind::ToolProposal,
        RecordKind::Decision,
        RecordKind::Outcome,
    ] {
        ids.register(SCHEMA_ID + kind as u32, kind)
            .expect("distinct ids");
    }
    let codec = Codec::new().with_schema_ids(ids);
    json!([
        avro_entry(&codec, &proposal()),
        avro_entry(&codec, &decision()),
        avro_entry(&codec, &outcome()),
    ])
}

/// One record as JSON and in both framings (Confluent with its id in `codec`).
fn avro_entry<T: Record>(codec: &Codec, value: &T) -> Value {
    json!({
        "record": T::NAME,
        "value": serde_json::to_value(value).expect("json"),
        "single_object": hex::encode(codec.encode_single_object(value).expect("encodes")),
        "confluent_schema_id": SCHEMA_ID + T::KIND as u32,
        "confluent": hex::encode(codec.encode_confluent(value).expect("encodes")),
    })
}

/// One record's `airlock-kind` and `airlock-owner-epoch` headers, when present.
type Headers = (Option<&'static str>, Option<&'static str>);

/// Sequences of records on one partition, as their headers, and the verdict of the fence on
/// each.
fn fence_vectors() -> Value {
    let cases: &[(&str, &[Headers])] = &[
        (
            "a zombie's write after a newer marker",
            &[
                (Some("fence"), Some("1")),
                (None, Some("1")),
                (Some("fence"), Some("2")),
                (None, Some("1")),
                (None, Some("2")),
                (None, Some("3")),
            ],
        ),
        (
            "records without an owner epoch are not fenced",
            &[
                (Some("fence"), Some("5")),
                (None, None),
                (Some("barrier"), Some("0")),
            ],
        ),
        (
            "a lower marker does not lower the fence",
            &[
                (Some("fence"), Some("4")),
                (Some("fence"), Some("2")),
                (None, Some("3")),
            ],
        ),
        (
            "an unreadable epoch is no epoch",
            &[
                (Some("fence"), Some("3")),
                (None, Some("x")),
                (None, Some(" 1")),
                (None, Some("1_0")),
                (None, Some("+2")),
                (None, Some("99999999999999999999")),
            ],
        ),
    ];
    let mut out = Vec::new();
    for (name, records) in cases {
        let mut filter = FenceFilter::default();
        let mut verdicts = Vec::new();
        for (kind, epoch) in *records {
            let mut headers: Vec<(&str, &[u8])> = Vec::new();
            if let Some(k) = kind {
                headers.push((header::KIND, k.as_bytes()));
            }
            if let Some(e) = epoch {
                headers.push((header::OWNER_EPOCH, e.as_bytes()));
            }
            verdicts.push(match filter.admit("t", 0, headers) {
                Admit::Accept => "accept",
                Admit::Marker(_) => "marker",
                Admit::Fenced { .. } => "fenced",
                Admit::Forged(_) => "forged",
            });
        }
        let records: Vec<Value> = records
            .iter()
            .map(|(k, e)| json!({"kind": k, "owner_epoch": e}))
            .collect();
        out.push(json!({"name": name, "records": records, "verdicts": verdicts}));
    }
    Value::Array(out)
}

/// Signed fence markers: a reader with the processor's verifying key raises its fence only
/// for a marker whose `airlock-capability` verifies (`capability::sign_fence`).
fn fence_signature_vectors() -> Value {
    let key = crate::capability::SigningKey::from_bytes(&[7; 32]);
    let cases = [
        ("airlock.decisions", 3, 5),
        ("a.dispatch.ledger", 0, 1),
        ("clé", 11, 1 << 40),
    ];
    json!({
        "verifying_key": hex::encode(key.verifying_key().to_bytes()),
        "markers": cases
            .iter()
            .map(|&(topic, partition, epoch)| json!({
                "topic": topic,
                "partition": partition,
                "owner_epoch": epoch,
                "message": hex::encode(crate::capability::fence_message(topic, partition, epoch)),
                "capability": hex::encode(crate::capability::sign_fence(&key, topic, partition, epoch)),
            }))
            .collect::<Vec<_>>(),
    })
}

fn id_vectors() -> Value {
    let p = proposal();
    let keys = ["refund:txn_1", "email:ord-99/welcome", "clé", ""];
    json!({
        "idempotency_keys": keys
            .iter()
            .map(|k| json!({"operation_key": k, "idempotency_key": canonical::idempotency_key(k)}))
            .collect::<Vec<_>>(),
        "proposal_id": {
            "parts": [&p.operation_key, &p.tool, &p.tool_version,
                      p.arguments_hash.as_deref().unwrap_or_default(), &p.tenant_id,
                      &p.principal_id, &p.run_id, &p.logical_call_id],
            "id": content_id("propose", &[&p.operation_key, &p.tool, &p.tool_version,
                p.arguments_hash.as_deref().unwrap_or_default(), &p.tenant_id,
                &p.principal_id, &p.run_id, &p.logical_call_id]),
        },
        "scoped_proposal_id": scoped_proposal_id(),
        "proposal_fingerprint": {
            "proposal": serde_json::to_value(&p).expect("json"),
            "fingerprint": proposal_fingerprint(&p),
        },
    })
}

/// A proposal whose operation key has its tenant's prefix: its derived id has it too.
fn scoped_proposal_id() -> Value {
    let mut p = proposal();
    p.operation_key = format!("{}/{}", p.tenant_id, p.operation_key);
    p.run_id = format!("{}/{}", p.tenant_id, p.run_id);
    json!({
        "parts": [&p.operation_key, &p.tool, &p.tool_version,
                  p.arguments_hash.as_deref().unwrap_or_default(), &p.tenant_id,
                  &p.principal_id, &p.run_id, &p.logical_call_id],
        "tenant": &p.tenant_id,
        "operation_key": &p.operation_key,
        "id": crate::cli::ask::proposal_id(&p),
    })
}

fn vectors() -> String {
    let doc = json!({
        "about": "Airlock's client contract, written by processor/src/core/vectors.rs; never edit by hand",
        "canonical": canonical_vectors(),
        "partitions": partition_vectors(),
        "avro": avro_vectors(),
        "fence": fence_vectors(),
        "fence_signatures": fence_signature_vectors(),
        "ids": id_vectors(),
    });
    let mut text = serde_json::to_string_pretty(&doc).expect("json");
    text.push('\n');
    text
}

#[test]
fn the_shared_client_vectors_are_what_the_processor_computes() {
    let want = vectors();
    let path = path();
    if std::env::var_os("AIRLOCK_BLESS_VECTORS").is_some() {
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
        std::fs::write(&path, &want).expect("write");
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "{} differs from what the processor computes; after a deliberate addition run \
         AIRLOCK_BLESS_VECTORS=1 cargo test -p airlock-processor vectors",
        path.display()
    );
}
