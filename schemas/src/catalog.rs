//! The embedded schemas, parsed once: every record's current schema and its snapshots.
//!
//! `avro/<Record>.avsc` is the current schema; `avro/history/<Record>/vN.avsc` are frozen copies
//! of every version ever released, the newest being identical to the current one (tests enforce
//! both). A single-object payload is matched to its writer schema by fingerprint across all
//! versions, so data written by an older producer still decodes (through schema resolution).

use std::{collections::HashMap, fmt, sync::LazyLock};

use apache_avro::Schema;

use crate::{
    Fingerprint, RecordKind,
    fingerprint::{compat_canonical_form, parsing_canonical_form},
};

/// Full name → definition of every named type in a schema, to follow `Schema::Ref`s.
pub(crate) type NameMap = HashMap<String, Schema>;

macro_rules! snapshot {
    ($kind:ident, $version:literal) => {
        (
            RecordKind::$kind,
            $version,
            include_str!(concat!(
                "../avro/history/",
                stringify!($kind),
                "/v",
                stringify!($version),
                ".avsc"
            )),
        )
    };
}

/// Every snapshot file under `avro/history/`. Adding `vN+1.avsc` means adding its line here; a
/// test fails if the directory and this list disagree.
const SNAPSHOTS: &[(RecordKind, u32, &str)] = &[
    snapshot!(ToolProposal, 1),
    snapshot!(Approval, 1),
    snapshot!(Outcome, 1),
    snapshot!(Control, 1),
    snapshot!(DispatchCommand, 1),
    snapshot!(ReconcileCommand, 1),
    snapshot!(ReconcileCommand, 2),
    snapshot!(Decision, 1),
    snapshot!(JournalEvent, 1),
    snapshot!(ChangelogRecord, 1),
    snapshot!(Receipt, 1),
];

/// One version of one record's schema, parsed, with its canonical form and fingerprint.
pub struct SchemaVersion {
    kind: RecordKind,
    version: u32,
    current: bool,
    avsc: &'static str,
    schema: Schema,
    canonical_form: String,
    fingerprint: Fingerprint,
    compat_fingerprint: Fingerprint,
    names: NameMap,
}

impl SchemaVersion {
    fn parse(kind: RecordKind, version: u32, current: bool, avsc: &'static str) -> Self {
        let what = if current {
            format!("avro/{kind}.avsc")
        } else {
            format!("avro/history/{kind}/v{version}.avsc")
        };
        let schema = Schema::parse_str(avsc)
            .unwrap_or_else(|e| panic!("embedded schema {what} must parse (tests check it): {e}"));
        let canonical_form = parsing_canonical_form(&schema).unwrap_or_else(|e| {
            panic!("embedded schema {what} must only use supported types (tests check it): {e}")
        });
        let fingerprint = Fingerprint::of_bytes(canonical_form.as_bytes());
        let compat_form = compat_canonical_form(&schema).unwrap_or_else(|e| {
            panic!("embedded schema {what} must only use supported types (tests check it): {e}")
        });
        let compat_fingerprint = Fingerprint::of_bytes(compat_form.as_bytes());
        let mut names = NameMap::new();
        collect_names(&schema, &mut names);
        Self {
            kind,
            version,
            current,
            avsc,
            schema,
            canonical_form,
            fingerprint,
            compat_fingerprint,
            names,
        }
    }

    /// The record this schema describes.
    #[must_use]
    pub fn kind(&self) -> RecordKind {
        self.kind
    }

    /// The version number (`N` of `history/<Record>/vN.avsc`).
    #[must_use]
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Whether this is the record's current schema (the one Rust values are encoded with).
    #[must_use]
    pub fn is_current(&self) -> bool {
        self.current
    }

    /// The `.avsc` text.
    #[must_use]
    pub fn avsc(&self) -> &'static str {
        self.avsc
    }

    /// The parsed schema.
    #[must_use]
    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// The schema's Parsing Canonical Form (Java-compatible, see [`parsing_canonical_form`]).
    #[must_use]
    pub fn canonical_form(&self) -> &str {
        &self.canonical_form
    }

    /// The CRC-64-AVRO fingerprint of the canonical form: the id written in single-object
    /// headers, as Java's `SchemaNormalization.parsingFingerprint64` computes it.
    #[must_use]
    pub fn fingerprint(&self) -> Fingerprint {
        self.fingerprint
    }

    /// The fingerprint apache-avro 0.21 (Rust) and the Python `avro` package (1.12) compute for
    /// the same schema (they keep `{"type":"long"}` for timestamps in the canonical form; see
    /// [`parsing_canonical_form`]). Accepted in single-object headers, never written. Equal to
    /// [`fingerprint`](Self::fingerprint) for schemas without logical types.
    #[must_use]
    pub fn compat_fingerprint(&self) -> Fingerprint {
        self.compat_fingerprint
    }

    pub(crate) fn names(&self) -> &NameMap {
        &self.names
    }
}

impl fmt::Debug for SchemaVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SchemaVersion")
            .field("kind", &self.kind)
            .field("version", &self.version)
            .field("current", &self.current)
            .field("fingerprint", &self.fingerprint)
            .field("compat_fingerprint", &self.compat_fingerprint)
            .finish_non_exhaustive()
    }
}

/// `schema` with named-type references followed through `names`; the error names the type no
/// schema of the catalog defines.
pub(crate) fn resolve<'s>(
    mut schema: &'s Schema,
    names: &'s NameMap,
) -> Result<&'s Schema, String> {
    while let Schema::Ref { name } = schema {
        let full_name = name.fullname(None);
        schema = names
            .get(&full_name)
            .ok_or_else(|| format!("reference to undefined named type {full_name}"))?;
    }
    Ok(schema)
}

fn collect_names(schema: &Schema, names: &mut NameMap) {
    match schema {
        Schema::Record(record) => {
            names.insert(record.name.fullname(None), schema.clone());
            for field in &record.fields {
                collect_names(&field.schema, names);
            }
        }
        Schema::Enum(enum_schema) => {
            names.insert(enum_schema.name.fullname(None), schema.clone());
        }
        Schema::Fixed(fixed) => {
            names.insert(fixed.name.fullname(None), schema.clone());
        }
        Schema::Array(array) => collect_names(&array.items, names),
        Schema::Map(map) => collect_names(&map.types, names),
        Schema::Union(union) => {
            for variant in union.variants() {
                collect_names(variant, names);
            }
        }
        _ => {}
    }
}

struct Catalog {
    /// Current schema per record, indexed by [`RecordKind::index`].
    current: Vec<SchemaVersion>,
    /// Snapshots per record, indexed by [`RecordKind::index`], oldest first.
    snapshots: Vec<Vec<SchemaVersion>>,
    /// Writer schema per fingerprint (reference and compat); reference fingerprints win over
    /// compat ones and the current schema over an identical snapshot.
    by_fingerprint: HashMap<Fingerprint, Slot>,
}

#[derive(Clone, Copy)]
enum Slot {
    Current(usize),
    Snapshot(usize, usize),
}

static CATALOG: LazyLock<Catalog> = LazyLock::new(|| {
    let mut snapshots: Vec<Vec<SchemaVersion>> =
        RecordKind::ALL.iter().map(|_| Vec::new()).collect();
    for &(kind, version, avsc) in SNAPSHOTS {
        snapshots[kind.index()].push(SchemaVersion::parse(kind, version, false, avsc));
    }
    for versions in &mut snapshots {
        versions.sort_by_key(SchemaVersion::version);
    }
    let current: Vec<SchemaVersion> = RecordKind::ALL
        .iter()
        .map(|&kind| {
            let version = snapshots[kind.index()]
                .last()
                .map(SchemaVersion::version)
                .unwrap_or_else(|| {
                    panic!("{kind} must have a snapshot in avro/history (tests check it)")
                });
            SchemaVersion::parse(kind, version, true, kind.avsc())
        })
        .collect();
    // Inserted from the weakest claim to the strongest, later insertions overwriting earlier
    // ones: compat before reference fingerprints, snapshots before the current schema.
    let mut by_fingerprint = HashMap::new();
    let picks: [fn(&SchemaVersion) -> Fingerprint; 2] = [
        SchemaVersion::compat_fingerprint,
        SchemaVersion::fingerprint,
    ];
    for pick in picks {
        for (kind_index, versions) in snapshots.iter().enumerate() {
            for (version_index, snapshot) in versions.iter().enumerate() {
                by_fingerprint.insert(pick(snapshot), Slot::Snapshot(kind_index, version_index));
            }
        }
        for (kind_index, schema) in current.iter().enumerate() {
            by_fingerprint.insert(pick(schema), Slot::Current(kind_index));
        }
    }
    Catalog {
        current,
        snapshots,
        by_fingerprint,
    }
});

impl Catalog {
    fn get(&'static self, slot: Slot) -> &'static SchemaVersion {
        match slot {
            Slot::Current(kind) => &self.current[kind],
            Slot::Snapshot(kind, version) => &self.snapshots[kind][version],
        }
    }
}

impl RecordKind {
    /// The record's current schema.
    #[must_use]
    pub fn current(self) -> &'static SchemaVersion {
        &CATALOG.current[self.index()]
    }

    /// The record's current parsed schema.
    #[must_use]
    pub fn schema(self) -> &'static Schema {
        &self.current().schema
    }

    /// The record's snapshots (`avro/history/<Record>/vN.avsc`), oldest first. The newest is
    /// identical to [`current`](Self::current).
    #[must_use]
    pub fn snapshots(self) -> &'static [SchemaVersion] {
        &CATALOG.snapshots[self.index()]
    }

    /// The schema of version `version`: the current schema for the newest version, a snapshot
    /// otherwise.
    #[must_use]
    pub fn version(self, version: u32) -> Option<&'static SchemaVersion> {
        let current = self.current();
        if version == current.version {
            return Some(current);
        }
        self.snapshots().iter().find(|s| s.version == version)
    }
}

/// The schema, of any record and version, whose fingerprint (reference or compat, see
/// [`SchemaVersion::compat_fingerprint`]) is `fingerprint`.
#[must_use]
pub fn schema_by_fingerprint(fingerprint: Fingerprint) -> Option<&'static SchemaVersion> {
    let catalog: &'static Catalog = &CATALOG;
    catalog
        .by_fingerprint
        .get(&fingerprint)
        .map(|&slot| catalog.get(slot))
}

#[cfg(test)]
impl SchemaVersion {
    /// A non-current schema version that is not part of the catalog, for tests.
    pub(crate) fn for_test(kind: RecordKind, version: u32, avsc: &'static str) -> Self {
        Self::parse(kind, version, false, avsc)
    }
}
