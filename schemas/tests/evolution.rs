//! Schema evolution: every released schema version stays readable, and the current schema is
//! always a released (snapshotted) version.
//!
//! To change a schema: edit `avro/<Record>.avsc`, copy it to `avro/history/<Record>/vN+1.avsc`,
//! add the new file to `SNAPSHOTS` in `src/catalog.rs`, and update the frozen values in
//! `tests/golden.rs`. These tests then check that the new schema can read data written with every
//! older one.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::Path,
};

use airlock_schemas::{
    Approval, ChangelogRecord, Codec, Control, Decision, DispatchCommand, JournalEvent, Outcome,
    Receipt, ReconcileCommand, Record, RecordKind, Schema, SchemaVersion, ToolProposal,
    parsing_canonical_form,
};
use apache_avro::{schema_compatibility::SchemaCompatibility, types::Value};

/// Snapshot versions found on disk, per record.
fn snapshots_on_disk() -> BTreeMap<RecordKind, BTreeMap<u32, String>> {
    let history = Path::new(env!("CARGO_MANIFEST_DIR")).join("avro/history");
    let mut found = BTreeMap::new();
    for entry in fs::read_dir(&history).expect("avro/history is readable") {
        let dir = entry.expect("directory entry").path();
        let name = dir
            .file_name()
            .and_then(|n| n.to_str())
            .expect("UTF-8 name");
        let kind = RecordKind::from_name(name)
            .unwrap_or_else(|| panic!("avro/history/{name} is not a record"));
        let versions: &mut BTreeMap<u32, String> = found.entry(kind).or_default();
        for file in fs::read_dir(&dir).expect("history directory is readable") {
            let path = file.expect("directory entry").path();
            let file_name = path
                .file_name()
                .and_then(|n| n.to_str())
                .expect("UTF-8 name");
            let version = file_name
                .strip_prefix('v')
                .and_then(|rest| rest.strip_suffix(".avsc"))
                .and_then(|number| number.parse::<u32>().ok())
                .unwrap_or_else(|| panic!("{} is not named vN.avsc", path.display()));
            versions.insert(
                version,
                fs::read_to_string(&path).expect("snapshot is readable"),
            );
        }
    }
    found
}

#[test]
fn embedded_snapshots_are_exactly_the_files_on_disk() {
    let on_disk = snapshots_on_disk();
    let kinds: BTreeSet<RecordKind> = on_disk.keys().copied().collect();
    assert_eq!(
        kinds,
        RecordKind::ALL.iter().copied().collect(),
        "every record needs avro/history/<Record>/v1.avsc at least"
    );
    for (kind, files) in &on_disk {
        let numbers: Vec<u32> = files.keys().copied().collect();
        let expected: Vec<u32> = (1..=u32::try_from(files.len()).expect("few versions")).collect();
        assert_eq!(
            numbers, expected,
            "{kind}: snapshot versions must be v1..vN without gaps"
        );
        let embedded: Vec<(u32, &str)> = kind
            .snapshots()
            .iter()
            .map(|s| (s.version(), s.avsc()))
            .collect();
        let files: Vec<(u32, &str)> = files.iter().map(|(v, text)| (*v, text.as_str())).collect();
        assert_eq!(
            embedded, files,
            "{kind}: the snapshots listed in SNAPSHOTS (src/catalog.rs) differ from avro/history/{kind}/"
        );
    }
}

#[test]
fn the_current_schema_is_the_newest_snapshot() {
    for kind in RecordKind::ALL {
        let current = kind.current();
        let newest = kind.snapshots().last().expect("at least one snapshot");
        let next = newest.version() + 1;
        let advice = format!(
            "avro/{kind}.avsc changed since its newest snapshot v{}: copy it to \
             avro/history/{kind}/v{next}.avsc, add that file to SNAPSHOTS in src/catalog.rs \
             and update the frozen values in tests/golden.rs if they changed",
            newest.version()
        );
        assert_eq!(current.version(), newest.version(), "{advice}");
        assert_eq!(
            parsing_canonical_form(current.schema()).expect("supported schema"),
            parsing_canonical_form(newest.schema()).expect("supported schema"),
            "{advice}"
        );
        assert_eq!(current.fingerprint(), newest.fingerprint(), "{advice}");
        // Docs, defaults and logical types are not in the canonical form but matter to readers
        // and to schema resolution: the snapshot must be a faithful copy.
        let current_json: serde_json::Value =
            serde_json::from_str(current.avsc()).expect("schema is JSON");
        let newest_json: serde_json::Value =
            serde_json::from_str(newest.avsc()).expect("snapshot is JSON");
        assert_eq!(current_json, newest_json, "{advice}");
    }
}

#[test]
fn the_current_schema_can_read_every_snapshot() {
    for kind in RecordKind::ALL {
        for snapshot in kind.snapshots() {
            SchemaCompatibility::can_read(snapshot.schema(), kind.schema()).unwrap_or_else(|e| {
                panic!(
                    "{kind}: the current schema cannot read data written with v{}: {e}",
                    snapshot.version()
                )
            });
        }
    }
}

/// A value of `schema` with every optional field set (`full`) or null, enums at their last
/// (`full`) or first symbol, two items per array.
fn sample(schema: &Schema, full: bool) -> Value {
    match schema {
        Schema::Null => Value::Null,
        Schema::Boolean => Value::Boolean(full),
        Schema::Int => Value::Int(if full { -7 } else { 0 }),
        Schema::Long => Value::Long(if full { -42 } else { 0 }),
        Schema::TimestampMillis => Value::TimestampMillis(1_700_000_000_000),
        Schema::Float => Value::Float(1.5),
        Schema::Double => Value::Double(-2.5),
        Schema::Bytes => Value::Bytes(if full { vec![0, 1, 255] } else { Vec::new() }),
        Schema::String => Value::String(if full {
            "sample ✓".into()
        } else {
            String::new()
        }),
        Schema::Array(array) => Value::Array(vec![
            sample(&array.items, full),
            sample(&array.items, !full),
        ]),
        Schema::Union(union) => {
            let variants = union.variants();
            let index = if full {
                variants
                    .iter()
                    .rposition(|v| !matches!(v, Schema::Null))
                    .expect("a non-null branch")
            } else {
                variants
                    .iter()
                    .position(|v| matches!(v, Schema::Null))
                    .unwrap_or(0)
            };
            Value::Union(
                u32::try_from(index).expect("few branches"),
                Box::new(sample(&variants[index], full)),
            )
        }
        Schema::Record(record) => Value::Record(
            record
                .fields
                .iter()
                .map(|field| (field.name.clone(), sample(&field.schema, full)))
                .collect(),
        ),
        Schema::Enum(e) => {
            let index = if full { e.symbols.len() - 1 } else { 0 };
            Value::Enum(
                u32::try_from(index).expect("few symbols"),
                e.symbols[index].clone(),
            )
        }
        other => panic!("sample values for {other:?} are not implemented"),
    }
}

/// Decodes a datum written with `snapshot` both through apache-avro's schema resolution and
/// through the codec, and checks they agree.
fn read_snapshot_datum<T: Record>(snapshot: &SchemaVersion, full: bool) {
    let kind = T::KIND;
    let value = sample(snapshot.schema(), full);
    let datum = apache_avro::to_avro_datum(snapshot.schema(), value).unwrap_or_else(|e| {
        panic!(
            "{kind} v{}: sample does not encode: {e}",
            snapshot.version()
        )
    });

    let resolved =
        apache_avro::from_avro_datum(snapshot.schema(), &mut datum.as_slice(), Some(T::schema()))
            .unwrap_or_else(|e| panic!("{kind} v{}: resolution failed: {e}", snapshot.version()));
    let expected: T = apache_avro::from_value(&resolved).unwrap_or_else(|e| {
        panic!(
            "{kind} v{}: resolved value does not fit the Rust type: {e}",
            snapshot.version()
        )
    });

    let codec = Codec::new();
    let decoded: T = codec
        .decode_datum_version(&datum, snapshot.version())
        .unwrap_or_else(|e| panic!("{kind} v{}: codec cannot read it: {e}", snapshot.version()));
    assert_eq!(decoded, expected, "{kind} v{}", snapshot.version());

    let mut single = vec![0xC3, 0x01];
    single.extend_from_slice(&snapshot.fingerprint().to_le_bytes());
    single.extend_from_slice(&datum);
    let decoded: T = codec
        .decode_as(&single)
        .unwrap_or_else(|e| panic!("{kind} v{}: single-object payload: {e}", snapshot.version()));
    assert_eq!(
        decoded,
        expected,
        "{kind} v{} single-object",
        snapshot.version()
    );
}

fn read_all_snapshots<T: Record>() -> RecordKind {
    for snapshot in T::KIND.snapshots() {
        read_snapshot_datum::<T>(snapshot, true);
        read_snapshot_datum::<T>(snapshot, false);
    }
    T::KIND
}

#[test]
fn data_written_with_every_snapshot_decodes_with_the_current_schema() {
    let covered: BTreeSet<RecordKind> = [
        read_all_snapshots::<ToolProposal>(),
        read_all_snapshots::<Approval>(),
        read_all_snapshots::<Outcome>(),
        read_all_snapshots::<Control>(),
        read_all_snapshots::<DispatchCommand>(),
        read_all_snapshots::<ReconcileCommand>(),
        read_all_snapshots::<Decision>(),
        read_all_snapshots::<JournalEvent>(),
        read_all_snapshots::<ChangelogRecord>(),
        read_all_snapshots::<Receipt>(),
    ]
    .into();
    assert_eq!(covered, RecordKind::ALL.iter().copied().collect());
}
