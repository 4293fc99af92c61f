//! Parsing Canonical Form and the CRC-64-AVRO (Rabin) fingerprint of schemas.
//!
//! The single-object encoding identifies the writer schema by the 64-bit Rabin fingerprint of
//! its [Parsing Canonical Form] (PCF). Implementations disagree on one detail that matters here,
//! because every Airlock timestamp is a `long` with a logical type:
//!
//! * Java's reference `SchemaNormalization` renders `{"type":"long","logicalType":"timestamp-millis"}`
//!   as `"long"`: a primitive is always written in its simple form, as the specification's
//!   [PRIMITIVES] rule asks.
//! * apache-avro 0.21 (Rust) and the Python `avro` package (1.12) strip the `logicalType`
//!   attribute but keep the object: `{"type":"long"}`.
//!
//! This crate computes both itself (rather than through `apache_avro::Schema::canonical_form`,
//! so that neither can drift with a dependency upgrade). It writes the reference (Java) form's
//! fingerprint and accepts both when reading, so payloads from producers in either camp are
//! recognised. [`parsing_canonical_form`] is the reference form; it is checked against the test
//! vectors of the Avro specification's repository.
//!
//! [Parsing Canonical Form]: https://avro.apache.org/docs/1.12.0/specification/#parsing-canonical-form-for-schemas

use std::{collections::HashSet, fmt, fmt::Write as _};

use apache_avro::Schema;

use crate::{Error, Result};

/// The CRC-64-AVRO "empty" value and polynomial from the Avro specification.
const EMPTY: u64 = 0xc15d_213a_a4d7_a795;

/// Lookup table of the byte-wise CRC-64-AVRO algorithm, computed at compile time.
const TABLE: [u64; 256] = {
    let mut table = [0u64; 256];
    let mut i = 0;
    while i < 256 {
        let mut fp = i as u64;
        let mut bit = 0;
        while bit < 8 {
            fp = (fp >> 1) ^ (EMPTY & (fp & 1).wrapping_neg());
            bit += 1;
        }
        table[i] = fp;
        i += 1;
    }
    table
};

/// A 64-bit CRC-64-AVRO (Rabin) schema fingerprint.
///
/// On the wire (single-object header) it is written little-endian, which is also the byte order
/// of its [`Display`](fmt::Display) form, so the hex text matches a hex dump of the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint(u64);

impl Fingerprint {
    /// Fingerprint of arbitrary bytes (normally a schema's Parsing Canonical Form).
    #[must_use]
    pub const fn of_bytes(bytes: &[u8]) -> Self {
        let mut fp = EMPTY;
        let mut i = 0;
        while i < bytes.len() {
            fp = (fp >> 8) ^ TABLE[((fp ^ bytes[i] as u64) & 0xff) as usize];
            i += 1;
        }
        Self(fp)
    }

    /// Fingerprint of a schema, computed over [`parsing_canonical_form`].
    ///
    /// # Errors
    ///
    /// [`Error::UnsupportedSchema`] for schema types the canonical form does not handle.
    pub fn of_schema(schema: &Schema) -> Result<Self> {
        Ok(Self::of_bytes(parsing_canonical_form(schema)?.as_bytes()))
    }

    /// Rebuilds a fingerprint from its 64-bit value (Java's `SchemaNormalization.parsingFingerprint64`).
    #[must_use]
    pub const fn from_u64(value: u64) -> Self {
        Self(value)
    }

    /// The 64-bit value (Java's `SchemaNormalization.parsingFingerprint64`, as unsigned).
    #[must_use]
    pub const fn as_u64(self) -> u64 {
        self.0
    }

    /// Rebuilds a fingerprint from the 8 bytes of a single-object header.
    #[must_use]
    pub const fn from_le_bytes(bytes: [u8; 8]) -> Self {
        Self(u64::from_le_bytes(bytes))
    }

    /// The 8 bytes written in a single-object header.
    #[must_use]
    pub const fn to_le_bytes(self) -> [u8; 8] {
        self.0.to_le_bytes()
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for byte in self.to_le_bytes() {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

/// The Parsing Canonical Form of a schema, as Java's `SchemaNormalization.toParsingForm` renders it.
///
/// Logical types are reduced to their underlying primitive (`timestamp-millis` becomes `"long"`);
/// doc, default, aliases and custom attributes are dropped; named types are written in full once
/// and referred to by full name afterwards.
///
/// # Errors
///
/// [`Error::UnsupportedSchema`] for `decimal`, `big-decimal`, `uuid` and `duration`, whose
/// underlying type apache-avro's parsed [`Schema`] no longer records exactly. Airlock's schemas
/// do not use them.
pub fn parsing_canonical_form(schema: &Schema) -> Result<String> {
    canonical_form(schema, Style::Reference)
}

/// The canonical form as apache-avro 0.21 and Python `avro` 1.12 render it: like
/// [`parsing_canonical_form`], except that a primitive carrying a logical type stays an object
/// (`{"type":"long"}`).
pub(crate) fn compat_canonical_form(schema: &Schema) -> Result<String> {
    canonical_form(schema, Style::Compat)
}

/// Which implementation's rendering of logical types to follow.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Style {
    /// Java's `SchemaNormalization`: `"long"`.
    Reference,
    /// apache-avro 0.21 and Python `avro` 1.12: `{"type":"long"}`.
    Compat,
}

fn canonical_form(schema: &Schema, style: Style) -> Result<String> {
    let mut out = String::with_capacity(512);
    let mut defined = HashSet::new();
    build(schema, style, &mut defined, &mut out)?;
    Ok(out)
}

fn build(
    schema: &Schema,
    style: Style,
    defined: &mut HashSet<String>,
    out: &mut String,
) -> Result<()> {
    let logical = !matches!(
        schema,
        Schema::Null
            | Schema::Boolean
            | Schema::Int
            | Schema::Long
            | Schema::Float
            | Schema::Double
            | Schema::Bytes
            | Schema::String
    );
    let primitive = match schema {
        Schema::Null => "null",
        Schema::Boolean => "boolean",
        Schema::Int | Schema::Date | Schema::TimeMillis => "int",
        Schema::Long
        | Schema::TimeMicros
        | Schema::TimestampMillis
        | Schema::TimestampMicros
        | Schema::TimestampNanos
        | Schema::LocalTimestampMillis
        | Schema::LocalTimestampMicros
        | Schema::LocalTimestampNanos => "long",
        Schema::Float => "float",
        Schema::Double => "double",
        Schema::Bytes => "bytes",
        Schema::String => "string",
        Schema::Union(union) => {
            out.push('[');
            for (i, variant) in union.variants().iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                build(variant, style, defined, out)?;
            }
            out.push(']');
            return Ok(());
        }
        Schema::Array(array) => {
            out.push_str(r#"{"type":"array","items":"#);
            build(&array.items, style, defined, out)?;
            out.push('}');
            return Ok(());
        }
        Schema::Map(map) => {
            out.push_str(r#"{"type":"map","values":"#);
            build(&map.types, style, defined, out)?;
            out.push('}');
            return Ok(());
        }
        Schema::Record(record) => {
            let full_name = record.name.fullname(None);
            if !define(defined, &full_name, out) {
                return Ok(());
            }
            out.push_str(r#","type":"record","fields":["#);
            for (i, field) in record.fields.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                // Field names are Avro names ([A-Za-z_][A-Za-z0-9_]*): no escaping needed.
                let _ = write!(out, r#"{{"name":"{}","type":"#, field.name);
                build(&field.schema, style, defined, out)?;
                out.push('}');
            }
            out.push_str("]}");
            return Ok(());
        }
        Schema::Enum(enum_schema) => {
            let full_name = enum_schema.name.fullname(None);
            if !define(defined, &full_name, out) {
                return Ok(());
            }
            out.push_str(r#","type":"enum","symbols":["#);
            for (i, symbol) in enum_schema.symbols.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                let _ = write!(out, r#""{symbol}""#);
            }
            out.push_str("]}");
            return Ok(());
        }
        Schema::Fixed(fixed) => {
            let full_name = fixed.name.fullname(None);
            if !define(defined, &full_name, out) {
                return Ok(());
            }
            let _ = write!(out, r#","type":"fixed","size":{}}}"#, fixed.size);
            return Ok(());
        }
        Schema::Ref { name } => {
            let _ = write!(out, r#""{}""#, name.fullname(None));
            return Ok(());
        }
        Schema::Decimal(_) | Schema::BigDecimal | Schema::Uuid | Schema::Duration => {
            return Err(Error::UnsupportedSchema {
                schema_type: format!("{:?}", apache_avro::schema::SchemaKind::from(schema)),
                why: "its underlying type is not recorded exactly by apache-avro",
            });
        }
    };
    if logical && style == Style::Compat {
        let _ = write!(out, r#"{{"type":"{primitive}"}}"#);
    } else {
        let _ = write!(out, r#""{primitive}""#);
    }
    Ok(())
}

/// Writes the opening of a named type's definition, or a reference to it when it was already
/// defined earlier in the schema. Returns whether the definition must be written.
fn define(defined: &mut HashSet<String>, full_name: &str, out: &mut String) -> bool {
    if defined.contains(full_name) {
        let _ = write!(out, r#""{full_name}""#);
        false
    } else {
        let _ = write!(out, r#"{{"name":"{full_name}""#);
        defined.insert(full_name.to_owned());
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Schema {
        Schema::parse_str(json).expect("test schema parses")
    }

    /// Vectors from the Avro repository's `share/test/data/schema-tests.txt`, which the Java
    /// implementation validates; fingerprints there are Java `long`s.
    #[test]
    fn matches_the_avro_specification_test_vectors() {
        let vectors: &[(&str, &str, i64)] = &[
            (r#""null""#, r#""null""#, 7_195_948_357_588_979_594),
            (
                r#"{"type":"boolean"}"#,
                r#""boolean""#,
                -6_970_731_678_124_411_036,
            ),
            (r#""int""#, r#""int""#, 8_247_732_601_305_521_295),
            (
                r#"{"type":"long"}"#,
                r#""long""#,
                -3_434_872_931_120_570_953,
            ),
            (r#""float""#, r#""float""#, 5_583_340_709_985_441_680),
            (r#""double""#, r#""double""#, -8_181_574_048_448_539_266),
            (r#""bytes""#, r#""bytes""#, 5_746_618_253_357_095_269),
            (r#""string""#, r#""string""#, -8_142_146_995_180_207_161),
            (r#"[ "int"  ]"#, r#"["int"]"#, -5_232_228_896_498_058_493),
            (
                r#"[ "int" , {"type":"boolean"} ]"#,
                r#"["int","boolean"]"#,
                5_392_556_393_470_105_090,
            ),
            (
                r#"{"fields":[], "type":"record", "name":"foo"}"#,
                r#"{"name":"foo","type":"record","fields":[]}"#,
                -4_824_392_279_771_201_922,
            ),
            (
                r#"{"fields":[], "type":"record", "name":"foo", "namespace":"x.y"}"#,
                r#"{"name":"x.y.foo","type":"record","fields":[]}"#,
                5_916_914_534_497_305_771,
            ),
            (
                r#"{"fields":[], "type":"record", "name":"a.b.foo", "namespace":"x.y"}"#,
                r#"{"name":"a.b.foo","type":"record","fields":[]}"#,
                -4_616_218_487_480_524_110,
            ),
            (
                r#"{"fields":[], "type":"record", "name":"foo", "doc":"foo", "aliases":["foo","bar"]}"#,
                r#"{"name":"foo","type":"record","fields":[]}"#,
                -4_824_392_279_771_201_922,
            ),
            (
                r#"{"fields":[{"type":{"type":"boolean"}, "name":"f1"}], "type":"record", "name":"foo"}"#,
                r#"{"name":"foo","type":"record","fields":[{"name":"f1","type":"boolean"}]}"#,
                7_843_277_075_252_814_651,
            ),
            (
                r#"{"type":"enum", "name":"foo", "symbols":["A1"]}"#,
                r#"{"name":"foo","type":"enum","symbols":["A1"]}"#,
                -6_342_190_197_741_309_591,
            ),
            (
                r#"{"namespace":"x.y.z", "type":"enum", "name":"foo", "doc":"foo bar", "symbols":["A1", "A2"]}"#,
                r#"{"name":"x.y.z.foo","type":"enum","symbols":["A1","A2"]}"#,
                -4_448_647_247_586_288_245,
            ),
            (
                r#"{"name":"foo","type":"fixed","size":15}"#,
                r#"{"name":"foo","type":"fixed","size":15}"#,
                1_756_455_273_707_447_556,
            ),
            (
                r#"{"namespace":"x.y.z", "type":"fixed", "name":"foo", "doc":"foo bar", "size":32}"#,
                r#"{"name":"x.y.z.foo","type":"fixed","size":32}"#,
                -3_064_184_465_700_546_786,
            ),
            (
                r#"{ "items":{"type":"null"}, "type":"array"}"#,
                r#"{"type":"array","items":"null"}"#,
                -589_620_603_366_471_059,
            ),
            (
                r#"{ "values":"string", "type":"map"}"#,
                r#"{"type":"map","values":"string"}"#,
                -8_732_877_298_790_414_990,
            ),
            (
                r#"{"name":"PigValue","type":"record","fields":[{"name":"value", "type":["null", "int", "long", "PigValue"]}]}"#,
                r#"{"name":"PigValue","type":"record","fields":[{"name":"value","type":["null","int","long","PigValue"]}]}"#,
                -1_759_257_747_318_642_341,
            ),
        ];
        for (input, canonical, fingerprint) in vectors {
            let schema = parse(input);
            let pcf = parsing_canonical_form(&schema).expect("supported schema");
            assert_eq!(&pcf, canonical, "canonical form of {input}");
            assert_eq!(
                Fingerprint::of_bytes(pcf.as_bytes()).as_u64(),
                u64::from_ne_bytes(fingerprint.to_ne_bytes()),
                "fingerprint of {input}"
            );
        }
    }

    #[test]
    fn logical_types_reduce_to_their_primitive_like_java() {
        let schema = parse(
            r#"{"type":"record","name":"T","namespace":"n","fields":[
                {"name":"at","type":{"type":"long","logicalType":"timestamp-millis"},"doc":"x"},
                {"name":"day","type":{"type":"int","logicalType":"date"}}]}"#,
        );
        assert_eq!(
            parsing_canonical_form(&schema).expect("supported schema"),
            r#"{"name":"n.T","type":"record","fields":[{"name":"at","type":"long"},{"name":"day","type":"int"}]}"#
        );
    }

    #[test]
    fn compat_form_matches_apache_avro_with_logical_types() {
        let schema = parse(
            r#"{"type":"record","name":"T","namespace":"n","fields":[
                {"name":"at","type":{"type":"long","logicalType":"timestamp-millis"}},
                {"name":"maybe","type":["null",{"type":"long","logicalType":"timestamp-micros"}]},
                {"name":"day","type":{"type":"int","logicalType":"date"}},
                {"name":"n","type":"long"}]}"#,
        );
        let compat = compat_canonical_form(&schema).expect("supported schema");
        assert_eq!(compat, schema.canonical_form());
        assert!(
            compat.contains(r#"{"name":"at","type":{"type":"long"}}"#),
            "{compat}"
        );
        assert!(compat.contains(r#"{"name":"n","type":"long"}"#), "{compat}");
    }

    #[test]
    fn agrees_with_apache_avro_when_there_is_no_logical_type() {
        let schema = parse(
            r#"{"type":"record","name":"R","namespace":"a.b","fields":[
                {"name":"s","type":["null","string"],"default":null},
                {"name":"e","type":{"type":"enum","name":"E","symbols":["X","Y"],"default":"X"}},
                {"name":"items","type":{"type":"array","items":{"type":"record","name":"I",
                    "fields":[{"name":"n","type":"long"}]}}},
                {"name":"again","type":"I"},
                {"name":"m","type":{"type":"map","values":"bytes"}}]}"#,
        );
        let ours = parsing_canonical_form(&schema).expect("supported schema");
        assert_eq!(ours, schema.canonical_form());
        assert_eq!(
            ours,
            compat_canonical_form(&schema).expect("supported schema")
        );
        let theirs = schema.fingerprint::<apache_avro::rabin::Rabin>();
        assert_eq!(
            Fingerprint::of_bytes(ours.as_bytes())
                .to_le_bytes()
                .as_slice(),
            theirs.bytes.as_slice()
        );
    }

    #[test]
    fn display_is_the_wire_byte_order() {
        let fp = Fingerprint::from_le_bytes([1, 2, 3, 4, 5, 6, 7, 0xff]);
        assert_eq!(fp.to_string(), "01020304050607ff");
        assert_eq!(Fingerprint::from_u64(fp.as_u64()), fp);
    }
}
