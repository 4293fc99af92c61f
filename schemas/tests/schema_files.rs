//! The `.avsc` files follow the project's conventions, and the Rust types mirror them exactly.

mod common;

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};

use airlock_schemas::{
    AnyRecord, ApprovalVerdict, ControlKind, EffectState, JournalKind, NAMESPACE, OutcomeKind,
    Reason, ReceiptKind, RecordKind, Schema, StateTable, Verdict,
};
use apache_avro::types::Value;
use serde_json::Value as Json;

fn avro_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("avro")
}

fn schema_json(kind: RecordKind) -> Json {
    serde_json::from_str(kind.avsc()).expect("schema file is JSON")
}

#[test]
fn every_schema_file_is_an_embedded_record() {
    let mut on_disk = BTreeSet::new();
    for entry in fs::read_dir(avro_dir()).expect("avro/ is readable") {
        let path = entry.expect("directory entry").path();
        if path.extension().is_some_and(|ext| ext == "avsc") {
            let stem = path
                .file_stem()
                .and_then(|s| s.to_str())
                .expect("UTF-8 name");
            let kind = RecordKind::from_name(stem)
                .unwrap_or_else(|| panic!("{} is not a RecordKind", path.display()));
            let text = fs::read_to_string(&path).expect("schema file is readable");
            assert_eq!(
                text,
                kind.avsc(),
                "{} differs from the embedded text",
                path.display()
            );
            on_disk.insert(kind);
        }
    }
    let all: BTreeSet<RecordKind> = RecordKind::ALL.iter().copied().collect();
    assert_eq!(on_disk, all, "one avro/<Record>.avsc per RecordKind");
}

#[test]
fn top_level_records_are_named_after_their_files() {
    for kind in RecordKind::ALL {
        let json = schema_json(*kind);
        assert_eq!(json["type"], "record", "{kind}");
        assert_eq!(json["name"], kind.name(), "{kind}");
        assert_eq!(json["namespace"], NAMESPACE, "{kind}");
        assert_eq!(kind.full_name(), format!("{NAMESPACE}.{}", kind.name()));
        match kind.schema() {
            Schema::Record(record) => assert_eq!(record.name.fullname(None), kind.full_name()),
            other => panic!("{kind} is not a record: {other:?}"),
        }
    }
}

/// Checks every field and named type under `json` (a type), collecting named definitions.
fn check_conventions(file: RecordKind, json: &Json, named: &mut Vec<(String, Json)>) {
    match json {
        Json::String(_) => {}
        Json::Array(branches) => {
            for branch in branches {
                check_conventions(file, branch, named);
            }
        }
        Json::Object(object) => match object["type"].as_str() {
            Some("record") => {
                let name = object["name"].as_str().expect("record name");
                assert!(has_doc(json), "{file}: record {name} has no doc");
                named.push((name.to_owned(), json.clone()));
                for field in object["fields"].as_array().expect("fields") {
                    check_field(file, name, field);
                    check_conventions(file, &field["type"], named);
                }
            }
            Some("enum") => {
                let name = object["name"].as_str().expect("enum name");
                assert!(has_doc(json), "{file}: enum {name} has no doc");
                if let Some(default) = object.get("default") {
                    let symbols = object["symbols"].as_array().expect("symbols");
                    assert!(
                        symbols.contains(default),
                        "{file}: {name} default is not a symbol"
                    );
                }
                named.push((name.to_owned(), json.clone()));
            }
            Some("array") => check_conventions(file, &object["items"], named),
            Some("long") | Some("int") | Some("string") | Some("bytes") => {}
            other => panic!("{file}: unexpected type {other:?}"),
        },
        other => panic!("{file}: unexpected JSON {other}"),
    }
}

fn has_doc(json: &Json) -> bool {
    json["doc"]
        .as_str()
        .is_some_and(|doc| !doc.trim().is_empty())
}

fn check_field(file: RecordKind, record: &str, field: &Json) {
    let name = field["name"].as_str().expect("field name");
    let what = format!("{file}: {record}.{name}");
    assert!(has_doc(field), "{what} has no doc");
    let ty = &field["type"];
    let timestamp = serde_json::json!({"type": "long", "logicalType": "timestamp-millis"});
    if name.ends_with("_at") {
        assert_eq!(ty, &timestamp, "{what} must be a timestamp-millis long");
    }
    if ty == &timestamp {
        assert!(name.ends_with("_at"), "{what}: timestamps are named *_at");
    }
    if let Json::Array(branches) = ty {
        assert_eq!(branches.len(), 2, "{what}: unions are [\"null\", T]");
        assert_eq!(branches[0], "null", "{what}: unions are [\"null\", T]");
        assert_eq!(
            field.get("default"),
            Some(&Json::Null),
            "{what}: optional fields default to null"
        );
    } else {
        assert!(
            field.get("default").is_none(),
            "{what}: only optional fields have defaults"
        );
    }
}

#[test]
fn fields_follow_the_conventions() {
    for kind in RecordKind::ALL {
        check_conventions(*kind, &schema_json(*kind), &mut Vec::new());
    }
}

#[test]
fn shared_named_types_are_identical_in_every_file() {
    let mut definitions: BTreeMap<String, Vec<(RecordKind, Json)>> = BTreeMap::new();
    for kind in RecordKind::ALL {
        let mut named = Vec::new();
        check_conventions(*kind, &schema_json(*kind), &mut named);
        let mut seen = BTreeSet::new();
        for (name, json) in named {
            assert!(seen.insert(name.clone()), "{kind} defines {name} twice");
            definitions.entry(name).or_default().push((*kind, json));
        }
    }
    let mut shared = BTreeSet::new();
    for (name, files) in &definitions {
        let (first_file, first) = &files[0];
        for (file, json) in &files[1..] {
            assert_eq!(
                json, first,
                "{name} is defined differently in {first_file}.avsc and {file}.avsc; shared types must be identical"
            );
        }
        if files.len() > 1 {
            shared.insert(name.as_str());
        }
    }
    // The types this test exists for (Decision and JournalEvent both embed them).
    for name in ["Verdict", "Reason", "EffectState"] {
        assert!(shared.contains(name), "{name} is expected in several files");
    }
}

fn enum_schema(name: &str) -> apache_avro::schema::EnumSchema {
    fn find(schema: &Schema, name: &str) -> Option<apache_avro::schema::EnumSchema> {
        match schema {
            Schema::Enum(e) if e.name.name == name => Some(e.clone()),
            Schema::Record(r) => r.fields.iter().find_map(|f| find(&f.schema, name)),
            Schema::Union(u) => u.variants().iter().find_map(|v| find(v, name)),
            Schema::Array(a) => find(&a.items, name),
            _ => None,
        }
    }
    RecordKind::ALL
        .iter()
        .find_map(|kind| find(kind.schema(), name))
        .unwrap_or_else(|| panic!("no schema defines enum {name}"))
}

fn check_enum<T: serde::Serialize + std::fmt::Display + std::str::FromStr>(
    name: &str,
    all: &[T],
    as_str: impl Fn(&T) -> &'static str,
    default: Option<&str>,
) where
    T::Err: std::fmt::Debug,
{
    let schema = enum_schema(name);
    let rust: Vec<&str> = all.iter().map(&as_str).collect();
    assert_eq!(
        rust, schema.symbols,
        "{name}: Rust variants and Avro symbols differ"
    );
    for value in all {
        let json = serde_json::to_string(value).expect("enum serializes");
        assert_eq!(json, format!("\"{}\"", as_str(value)), "{name}: serde name");
        assert_eq!(value.to_string(), as_str(value));
    }
    assert_eq!(schema.default.as_deref(), default, "{name}: enum default");
}

#[test]
fn rust_enums_mirror_the_avro_enums() {
    check_enum("Verdict", Verdict::ALL, Verdict::as_str, None);
    check_enum("Reason", Reason::ALL, Reason::as_str, None);
    check_enum(
        "EffectState",
        EffectState::ALL,
        EffectState::as_str,
        Some("UNKNOWN"),
    );
    check_enum("JournalKind", JournalKind::ALL, JournalKind::as_str, None);
    check_enum(
        "OutcomeKind",
        OutcomeKind::ALL,
        OutcomeKind::as_str,
        Some("UNKNOWN"),
    );
    check_enum("ControlKind", ControlKind::ALL, ControlKind::as_str, None);
    check_enum(
        "ApprovalVerdict",
        ApprovalVerdict::ALL,
        ApprovalVerdict::as_str,
        Some("REJECT"),
    );
    check_enum("StateTable", StateTable::ALL, StateTable::as_str, None);
    check_enum("ReceiptKind", ReceiptKind::ALL, ReceiptKind::as_str, None);
}

/// apache-avro's serializer writes struct fields in declaration order without checking them
/// against the schema, so the Rust field order must be the schema's, recursively.
fn check_field_order(path: &str, value: &Value, schema: &Schema) {
    match (value, schema) {
        (Value::Record(fields), Schema::Record(record)) => {
            let rust: Vec<&str> = fields.iter().map(|(name, _)| name.as_str()).collect();
            let avro: Vec<&str> = record.fields.iter().map(|f| f.name.as_str()).collect();
            assert_eq!(
                rust, avro,
                "{path}: Rust fields must match the schema's, in order"
            );
            for ((name, value), field) in fields.iter().zip(&record.fields) {
                check_field_order(&format!("{path}.{name}"), value, &field.schema);
            }
        }
        (Value::Array(items), Schema::Array(array)) => {
            for item in items {
                check_field_order(&format!("{path}[]"), item, &array.items);
            }
        }
        (Value::Union(index, inner), Schema::Union(union)) => {
            let branch = &union.variants()[*index as usize];
            check_field_order(path, inner, branch);
        }
        _ => {}
    }
}

#[test]
fn rust_records_mirror_the_avro_records() {
    let mut seen = BTreeSet::new();
    for sample in common::samples() {
        let kind = sample.kind();
        seen.insert(kind);
        let value = match &sample {
            AnyRecord::ToolProposal(r) => apache_avro::to_value(r),
            AnyRecord::Approval(r) => apache_avro::to_value(r),
            AnyRecord::Outcome(r) => apache_avro::to_value(r),
            AnyRecord::Control(r) => apache_avro::to_value(r),
            AnyRecord::DispatchCommand(r) => apache_avro::to_value(r),
            AnyRecord::ReconcileCommand(r) => apache_avro::to_value(r),
            AnyRecord::Decision(r) => apache_avro::to_value(r),
            AnyRecord::JournalEvent(r) => apache_avro::to_value(r),
            AnyRecord::ChangelogRecord(r) => apache_avro::to_value(r),
            AnyRecord::Receipt(r) => apache_avro::to_value(r),
        }
        .expect("record converts to an Avro value");
        let resolved = value
            .clone()
            .resolve(kind.schema())
            .unwrap_or_else(|e| panic!("{kind} value does not fit its schema: {e}"));
        check_field_order(kind.name(), &resolved, kind.schema());
        check_field_order(kind.name(), &value, kind.schema());
    }
    assert_eq!(
        seen.len(),
        RecordKind::ALL.len(),
        "a sample of every record"
    );
}
