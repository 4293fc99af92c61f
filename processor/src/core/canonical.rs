//! Canonical tool-call arguments: the one byte string, and its SHA-256, that a
//! proposal is bound to.
//!
//! An agent proposes a tool call with JSON arguments. Everything downstream
//! (deduplication, approval, authorization, execution) must refer to *exactly*
//! those arguments, so we reduce the JSON text to a canonical form and hash it.
//! Two texts that mean the same document (different key order, whitespace or
//! escapes) get the same hash; anything ambiguous is rejected instead of being
//! silently normalised.
//!
//! The rules are RFC 8785 (JCS) restricted to a safe subset:
//!
//! * Input must be a single valid JSON text; trailing content is rejected.
//! * Duplicate object keys are rejected (RFC 8259 leaves their meaning open,
//!   and parsers disagree on which one wins, so accepting them would let two
//!   components see different arguments under one hash).
//! * Numbers must be integer literals within ±(2^53−1). Fractions, exponents
//!   (`1e3`, `1.0`), `-0` and larger magnitudes are rejected: they are not
//!   exactly representable in every language that will read the record.
//!   Money is expressed as integer minor units plus a currency code.
//! * Nesting deeper than [`MAX_DEPTH`] is rejected.
//! * Output: object keys sorted by UTF-16 code units, no insignificant
//!   whitespace, minimal string escaping (`\"`, `\\`, `\b`, `\f`, `\n`, `\r`,
//!   `\t`, other control characters as lowercase `\u00xx`; everything else,
//!   including `/`, U+2028 and all non-ASCII, is written as-is in UTF-8),
//!   integers in plain decimal.
//!
//! THIS IS A FROZEN CONTRACT. Hashes computed here are stored in records and
//! compared across versions; the golden vectors in the tests must never change.

use std::fmt::{self, Write as _};

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use sha2::{Digest, Sha256};

/// Maximum nesting depth of arrays/objects. The top-level container is depth 1,
/// so `[[1]]` has depth 2. Deeper documents are rejected.
pub const MAX_DEPTH: usize = 64;

/// Largest magnitude accepted for an integer: 2^53−1, the largest integer that
/// an IEEE-754 double (JavaScript, many JSON libraries) represents exactly.
pub const MAX_SAFE_INTEGER: i64 = (1 << 53) - 1;

/// Domain tag for the idempotency key derivation. Never change it: downstream
/// systems deduplicate on keys derived with it.
const IDEMPOTENCY_KEY_DOMAIN: &[u8] = b"airlock/idempotency-key/v1\0";

/// Prefix of every idempotency key, naming the derivation version.
const IDEMPOTENCY_KEY_PREFIX: &str = "alk1-";

/// Number of hex characters of the digest kept in an idempotency key
/// (128 bits: collision-free in practice, short enough for any downstream API).
const IDEMPOTENCY_KEY_HEX_LEN: usize = 32;

/// Errors produced while canonicalizing a JSON text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The text is not a single valid JSON value (includes trailing content).
    #[error("invalid JSON: {message}")]
    Syntax {
        /// Parser message, including the position.
        message: String,
        /// 1-based line of the error (0 if unknown).
        line: usize,
        /// 1-based column of the error (0 if unknown).
        column: usize,
    },
    /// An object contains the same key twice.
    #[error("duplicate object key {key:?} in the object at {path}")]
    DuplicateKey {
        /// JSON pointer of the object containing the duplicate.
        path: String,
        /// The duplicated key.
        key: String,
    },
    /// A number is not an integer literal (fraction, exponent, `-0`, or a
    /// magnitude beyond 64 bits).
    #[error(
        "number at {path} is not an integer literal within ±(2^53−1): fractions, exponents and -0 \
         are not accepted (express money as integer minor units plus a currency code)"
    )]
    NonInteger {
        /// JSON pointer of the number.
        path: String,
    },
    /// An integer is outside ±(2^53−1).
    #[error(
        "integer {value} at {path} is outside ±(2^53−1) and not exactly representable everywhere"
    )]
    IntegerOutOfRange {
        /// JSON pointer of the number.
        path: String,
        /// The integer as parsed.
        value: i128,
    },
    /// Arrays/objects are nested deeper than [`MAX_DEPTH`].
    #[error("nesting deeper than {max_depth} levels at {path}")]
    TooDeep {
        /// JSON pointer of the container that exceeds the limit.
        path: String,
        /// The limit.
        max_depth: usize,
    },
}

/// Result alias for this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A canonicalized JSON document.
#[derive(Debug, Clone, PartialEq)]
pub struct Canonical {
    /// The canonical JSON text.
    pub json: String,
    /// Lowercase hex SHA-256 of `json`'s UTF-8 bytes.
    pub hash: String,
    /// The parsed document. Object entries are inserted in canonical order.
    pub value: serde_json::Value,
}

/// Canonicalizes `json_text` according to the module rules and hashes it.
///
/// # Errors
///
/// Returns an [`Error`] naming the offending location for invalid JSON,
/// duplicate keys, non-integer or out-of-range numbers, and excessive nesting.
pub fn canonicalize(json_text: &str) -> Result<Canonical> {
    let node = parse(json_text)?;
    let mut json = String::with_capacity(json_text.len());
    node.write_canonical(&mut json);
    let hash = arguments_hash(&json);
    Ok(Canonical {
        json,
        hash,
        value: node.into_value(),
    })
}

/// Lowercase hex SHA-256 of the canonical JSON text's UTF-8 bytes.
///
/// The caller is responsible for passing an already canonical text (as
/// produced by [`canonicalize`]); no normalisation happens here.
pub fn arguments_hash(canonical_json: &str) -> String {
    hex_lower(&Sha256::digest(canonical_json.as_bytes()))
}

/// Lowercase hex of `bytes`, as `hex::encode` spells it, from its table-driven slice encoder:
/// `hex::encode` collects an iterator of `char`s one by one, and the per-decision hashes and
/// ids go through here (≈ 1% of a fresh decision's samples in `perf`).
pub fn hex_lower(bytes: &[u8]) -> String {
    let mut digits = vec![0; bytes.len() * 2];
    hex::encode_to_slice(bytes, &mut digits).expect("the buffer holds two digits per byte");
    String::from_utf8(digits).expect("hex digits are ASCII")
}

/// Derives the idempotency key sent to the downstream system from an
/// operation key.
///
/// `"alk1-"` followed by the first 32 lowercase hex characters of
/// SHA-256(`"airlock/idempotency-key/v1\0"` ‖ UTF-8(operation_key)).
///
/// THIS DERIVATION MUST NEVER CHANGE: downstream systems deduplicate retries
/// and answer reconciliation queries by this key; changing it would turn a
/// retry after an upgrade into a second real effect (a second refund).
pub fn idempotency_key(operation_key: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(IDEMPOTENCY_KEY_DOMAIN);
    hasher.update(operation_key.as_bytes());
    let digest = hex_lower(&hasher.finalize()[..IDEMPOTENCY_KEY_HEX_LEN / 2]);
    let mut key = String::with_capacity(IDEMPOTENCY_KEY_PREFIX.len() + IDEMPOTENCY_KEY_HEX_LEN);
    key.push_str(IDEMPOTENCY_KEY_PREFIX);
    key.push_str(&digest);
    key
}

// ---------------------------------------------------------------------------
// Parsing
// ---------------------------------------------------------------------------

/// Parsed document. We parse into our own tree rather than
/// `serde_json::Value` because `Value` silently keeps the last of duplicate
/// keys and accepts floats; with our own visitor we see every key and number
/// exactly as the parser reports it.
#[derive(Debug)]
enum Node {
    Null,
    Bool(bool),
    Int(i64),
    Str(String),
    Array(Vec<Node>),
    /// Entries sorted by UTF-16 code units of the key, keys unique.
    Object(Vec<(String, Node)>),
}

/// One step of a JSON pointer, kept only to name locations in errors.
#[derive(Debug)]
enum Segment {
    Key(String),
    Index(usize),
}

/// Mutable parse state shared by the nested seeds.
#[derive(Debug, Default)]
struct State {
    /// Path from the root to the value being parsed.
    path: Vec<Segment>,
    /// Current container depth.
    depth: usize,
    /// The structured error, when a rule (not the JSON grammar) was violated.
    /// serde's error type is fixed to `serde_json::Error`, so the visitor
    /// parks our error here and returns an opaque one to unwind the parser.
    failure: Option<Error>,
}

impl State {
    fn pointer(&self) -> String {
        render_pointer(&self.path)
    }

    /// Records `error` and returns the opaque error that unwinds serde.
    fn fail<E: de::Error>(&mut self, error: Error) -> E {
        let message = error.to_string();
        self.failure = Some(error);
        E::custom(message)
    }
}

/// Renders a JSON pointer (RFC 6901); the root is shown as `(root)` because an
/// empty string is easy to miss in a message.
fn render_pointer(path: &[Segment]) -> String {
    if path.is_empty() {
        return "(root)".to_owned();
    }
    let mut out = String::new();
    for segment in path {
        out.push('/');
        match segment {
            Segment::Key(key) => {
                for ch in key.chars() {
                    match ch {
                        '~' => out.push_str("~0"),
                        '/' => out.push_str("~1"),
                        other => out.push(other),
                    }
                }
            }
            Segment::Index(index) => {
                // Writing to a String cannot fail.
                let _ = write!(out, "{index}");
            }
        }
    }
    out
}

fn parse(json_text: &str) -> Result<Node> {
    let mut state = State::default();
    let mut deserializer = serde_json::Deserializer::from_str(json_text);
    let parsed = NodeSeed { state: &mut state }.deserialize(&mut deserializer);
    let node = match parsed {
        Ok(node) => node,
        Err(error) => return Err(state.failure.take().unwrap_or_else(|| syntax(&error))),
    };
    // Reject anything but whitespace after the value.
    deserializer.end().map_err(|error| syntax(&error))?;
    Ok(node)
}

fn syntax(error: &serde_json::Error) -> Error {
    Error::Syntax {
        message: error.to_string(),
        line: error.line(),
        column: error.column(),
    }
}

struct NodeSeed<'s> {
    state: &'s mut State,
}

impl<'de> DeserializeSeed<'de> for NodeSeed<'_> {
    type Value = Node;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Node, D::Error> {
        deserializer.deserialize_any(NodeVisitor { state: self.state })
    }
}

struct NodeVisitor<'s> {
    state: &'s mut State,
}

impl NodeVisitor<'_> {
    fn enter<E: de::Error>(&mut self) -> Result<(), E> {
        if self.state.depth >= MAX_DEPTH {
            let path = self.state.pointer();
            return Err(self.state.fail(Error::TooDeep {
                path,
                max_depth: MAX_DEPTH,
            }));
        }
        self.state.depth += 1;
        Ok(())
    }

    fn leave(&mut self) {
        self.state.depth -= 1;
    }

    fn integer<E: de::Error>(self, value: i128) -> Result<Node, E> {
        match i64::try_from(value) {
            Ok(small) if (-MAX_SAFE_INTEGER..=MAX_SAFE_INTEGER).contains(&small) => {
                Ok(Node::Int(small))
            }
            _ => {
                let path = self.state.pointer();
                Err(self.state.fail(Error::IntegerOutOfRange { path, value }))
            }
        }
    }
}

impl<'de> Visitor<'de> for NodeVisitor<'_> {
    type Value = Node;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a JSON value")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }

    fn visit_bool<E: de::Error>(self, value: bool) -> Result<Node, E> {
        Ok(Node::Bool(value))
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<Node, E> {
        self.integer(i128::from(value))
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<Node, E> {
        self.integer(i128::from(value))
    }

    // serde_json reports fractions, exponents, `-0` and integers beyond 64
    // bits as f64; all of them are outside our number subset.
    fn visit_f64<E: de::Error>(self, _value: f64) -> Result<Node, E> {
        let path = self.state.pointer();
        Err(self.state.fail(Error::NonInteger { path }))
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<Node, E> {
        Ok(Node::Str(value.to_owned()))
    }

    fn visit_string<E: de::Error>(self, value: String) -> Result<Node, E> {
        Ok(Node::Str(value))
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<Node, A::Error> {
        self.enter()?;
        let mut items = Vec::new();
        loop {
            self.state.path.push(Segment::Index(items.len()));
            let item = seq.next_element_seed(NodeSeed {
                state: &mut *self.state,
            })?;
            self.state.path.pop();
            match item {
                Some(item) => items.push(item),
                None => break,
            }
        }
        self.leave();
        Ok(Node::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<Node, A::Error> {
        self.enter()?;
        let mut entries: Vec<(String, Node)> = Vec::new();
        // Keys seen so far; a HashSet keeps duplicate detection linear.
        let mut seen = std::collections::HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if !seen.insert(key.clone()) {
                let path = self.state.pointer();
                return Err(self.state.fail(Error::DuplicateKey { path, key }));
            }
            self.state.path.push(Segment::Key(key.clone()));
            let value = map.next_value_seed(NodeSeed {
                state: &mut *self.state,
            })?;
            self.state.path.pop();
            entries.push((key, value));
        }
        // RFC 8785: sort by the UTF-16 code units of the key. This differs
        // from byte/code-point order for characters above U+FFFF versus
        // U+E000..U+FFFF.
        entries.sort_by(|(a, _), (b, _)| a.encode_utf16().cmp(b.encode_utf16()));
        self.leave();
        Ok(Node::Object(entries))
    }
}

// ---------------------------------------------------------------------------
// Output
// ---------------------------------------------------------------------------

impl Node {
    fn write_canonical(&self, out: &mut String) {
        match self {
            Node::Null => out.push_str("null"),
            Node::Bool(true) => out.push_str("true"),
            Node::Bool(false) => out.push_str("false"),
            Node::Int(value) => {
                // Writing to a String cannot fail.
                let _ = write!(out, "{value}");
            }
            Node::Str(value) => write_string(out, value),
            Node::Array(items) => {
                out.push('[');
                for (index, item) in items.iter().enumerate() {
                    if index > 0 {
                        out.push(',');
                    }
                    item.write_canonical(out);
                }
                out.push(']');
            }
            Node::Object(entries) => {
                out.push('{');
                for (index, (key, value)) in entries.iter().enumerate() {
                    if index > 0 {
                        out.push(',');
                    }
                    write_string(out, key);
                    out.push(':');
                    value.write_canonical(out);
                }
                out.push('}');
            }
        }
    }

    fn into_value(self) -> serde_json::Value {
        use serde_json::Value;
        match self {
            Node::Null => Value::Null,
            Node::Bool(value) => Value::Bool(value),
            Node::Int(value) => Value::from(value),
            Node::Str(value) => Value::String(value),
            Node::Array(items) => Value::Array(items.into_iter().map(Node::into_value).collect()),
            Node::Object(entries) => Value::Object(
                entries
                    .into_iter()
                    .map(|(key, value)| (key, value.into_value()))
                    .collect(),
            ),
        }
    }
}

/// Writes a JSON string with the minimal escaping of RFC 8785.
fn write_string(out: &mut String, value: &str) {
    out.push('"');
    for ch in value.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            control if u32::from(control) < 0x20 => {
                // Writing to a String cannot fail.
                let _ = write!(out, "\\u{:04x}", u32::from(control));
            }
            other => out.push(other),
        }
    }
    out.push('"');
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ok(text: &str) -> Canonical {
        canonicalize(text).unwrap()
    }

    fn err(text: &str) -> Error {
        canonicalize(text).unwrap_err()
    }

    /// Golden vectors: (input, canonical JSON, SHA-256 of the canonical JSON).
    /// These freeze the contract. NEVER edit an existing entry: a mismatch
    /// means the implementation changed meaning, not that the vector is stale.
    /// Hashes were cross-checked with `sha256sum` and an independent Python
    /// JCS implementation.
    const GOLDEN: &[(&str, &str, &str)] = &[
        (
            r#"{"a":1}"#,
            r#"{"a":1}"#,
            "015abd7f5cc57a2dd94b7590f04ad8084273905ee33ec5cebeae62276a97f862",
        ),
        // Nested objects and arrays, whitespace, unsorted keys.
        (
            r#"{ "b": {"z": true, "a": null}, "a": [1, {"y": false, "x": "s"}] }"#,
            r#"{"a":[1,{"x":"s","y":false}],"b":{"a":null,"z":true}}"#,
            "fe76dd546a8c9dd0d64c09122e5de58eec34e6cd4f65eb5f700d3e706c294ada",
        ),
        // UTF-16 order: U+10000 (D800 DC00) sorts before U+E000, unlike
        // code-point order.
        (
            r#"{"\ud800\udc00": 1, "\ue000": 2, "a": 3}"#,
            "{\"a\":3,\"\u{10000}\":1,\"\u{e000}\":2}",
            "8d75bb26b09f10c40967d32695b2a75902985d360f0d8aac3df6e2e1ccabef94",
        ),
        // Escapes: minimal set kept, `/`, DEL, U+2028 and non-ASCII unescaped,
        // other controls as lowercase \u00xx.
        (
            r#"{"s":"quote\" backslash\\ slash\/ tab\t nl\n cr\r bs\b ff\f nul\u0000 us\u001f del\u007f ls\u2028 \u00e9\u00E9 \ud83d\ude00"}"#,
            "{\"s\":\"quote\\\" backslash\\\\ slash/ tab\\t nl\\n cr\\r bs\\b ff\\f nul\\u0000 us\\u001f del\u{7f} ls\u{2028} \u{e9}\u{e9} \u{1f600}\"}",
            "a53258b1e66d31ff90cc59d202276a3f750f9595bf95fb9585f62c8aca144cee",
        ),
        // Integers at the limits.
        (
            "[9007199254740991, -9007199254740991, 0, -1, 10]",
            "[9007199254740991,-9007199254740991,0,-1,10]",
            "9d6890cffee76f0d1307b44297cea761a9dbc6d58e366c4687c855690e90779b",
        ),
        // Empty object, array and string.
        (
            r#"{"c":"","b":[],"a":{}}"#,
            r#"{"a":{},"b":[],"c":""}"#,
            "e052004170cc85d084722ffe760c499548014bfdbdf5275548b688255770dfc2",
        ),
        // Money: integer minor units plus currency code.
        (
            r#"{"tenant_id":"t1","account_id":"acct_1234","amount":{"minor_units":2500,"currency":"EUR"},"reason":"duplicate"}"#,
            r#"{"account_id":"acct_1234","amount":{"currency":"EUR","minor_units":2500},"reason":"duplicate","tenant_id":"t1"}"#,
            "5e2773e0c6d90d1f3e1b902599ba3153b0b7367c05681702227f3adcf5311b93",
        ),
        // Literals.
        (
            "[null, true, false, \"\"]",
            r#"[null,true,false,""]"#,
            "a74e1b08b88fe3f8988b260a2d7838c991ee31af094eaeac1d22741ea3f7b7d9",
        ),
        // Key order: empty key first, uppercase before lowercase, prefixes first.
        (
            r#"{"aa":1,"a":2,"b":3,"B":4,"":5}"#,
            r#"{"":5,"B":4,"a":2,"aa":1,"b":3}"#,
            "ce609adad70bd1ca99fa80e5f0e8b23b3b7e4ec3395949ab14a65eb6c71275dc",
        ),
        // Top-level scalar with surrounding whitespace.
        (
            "  \"\u{2028}/\u{e9}\"\n",
            "\"\u{2028}/\u{e9}\"",
            "1d4fc44f496696325d14525f25a98e8d082f19d9eabec3a060ff777698c08226",
        ),
    ];

    #[test]
    fn golden_vectors() {
        for (input, json, hash) in GOLDEN {
            let canonical = ok(input);
            assert_eq!(&canonical.json, json, "canonical form of {input}");
            assert_eq!(&canonical.hash, hash, "hash of {input}");
            assert_eq!(arguments_hash(json), *hash);
            // The canonical form is a fixed point.
            assert_eq!(&ok(json).json, json);
        }
    }

    #[test]
    fn golden_idempotency_keys() {
        // Frozen: cross-checked with
        // `printf 'airlock/idempotency-key/v1\0op-1' | sha256sum`.
        assert_eq!(
            idempotency_key("op-1"),
            "alk1-e677347564a591082725501edb64168d"
        );
        assert_eq!(
            idempotency_key("t1/run-42/refund/0"),
            "alk1-e3ced0fdfb7c33dadeb67d1a0f7d3ab6"
        );
        assert_eq!(
            idempotency_key("\u{fc}n\u{ef}code-\u{952e}"),
            "alk1-6a5ff8650da88b0bbb9df42e06c221db"
        );
    }

    #[test]
    fn value_matches_canonical_json() {
        let canonical = ok(r#"{"b":[1,{"d":2,"c":null}],"a":"x"}"#);
        let reparsed: serde_json::Value = serde_json::from_str(&canonical.json).unwrap();
        assert_eq!(canonical.value, reparsed);
        // Entries are inserted in canonical order.
        let keys: Vec<&String> = canonical.value.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["a", "b"]);
    }

    #[test]
    fn rejects_duplicate_keys_with_path() {
        assert_eq!(
            err(r#"{"a":1,"a":2}"#),
            Error::DuplicateKey {
                path: "(root)".into(),
                key: "a".into()
            }
        );
        assert_eq!(
            err(r#"{"x":[{"k":1},{"k":1,"k":2}]}"#),
            Error::DuplicateKey {
                path: "/x/1".into(),
                key: "k".into()
            }
        );
        // Duplicates after unescaping are still duplicates.
        assert!(matches!(
            err(r#"{"a":1,"\u0061":2}"#),
            Error::DuplicateKey { .. }
        ));
        // Pointer escaping of `~` and `/` in keys.
        assert_eq!(
            err(r#"{"a/b":{"c~d":{"z":1,"z":1}}}"#),
            Error::DuplicateKey {
                path: "/a~1b/c~0d".into(),
                key: "z".into()
            }
        );
    }

    #[test]
    fn rejects_non_integers_with_path() {
        for number in [
            "1.0",
            "1e3",
            "1E+2",
            "0.5",
            "-0",
            "-0.0",
            "2e-1",
            "18446744073709551616",
        ] {
            let text = format!(r#"{{"amount":{{"minor_units":{number}}}}}"#);
            assert_eq!(
                err(&text),
                Error::NonInteger {
                    path: "/amount/minor_units".into()
                },
                "{number}"
            );
        }
        assert_eq!(err("[0, 1.5]"), Error::NonInteger { path: "/1".into() });
    }

    #[test]
    fn integer_range_is_2_pow_53_minus_1() {
        assert_eq!(ok("9007199254740991").json, "9007199254740991");
        assert_eq!(ok("-9007199254740991").json, "-9007199254740991");
        assert_eq!(
            err("[9007199254740992]"),
            Error::IntegerOutOfRange {
                path: "/0".into(),
                value: 9_007_199_254_740_992
            }
        );
        assert_eq!(
            err(r#"{"n":-9007199254740992}"#),
            Error::IntegerOutOfRange {
                path: "/n".into(),
                value: -9_007_199_254_740_992
            }
        );
        assert!(matches!(
            err("18446744073709551615"),
            Error::IntegerOutOfRange { .. }
        ));
    }

    #[test]
    fn depth_limit() {
        let nested = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        assert_eq!(ok(&nested(MAX_DEPTH)).json, nested(MAX_DEPTH));
        let too_deep = err(&nested(MAX_DEPTH + 1));
        let Error::TooDeep { path, max_depth } = too_deep else {
            panic!("expected TooDeep, got {too_deep:?}");
        };
        assert_eq!(max_depth, MAX_DEPTH);
        assert_eq!(path, "/0".repeat(MAX_DEPTH));
        // Objects count too, and the limit is checked before serde_json's own.
        let objects = format!(
            "{}1{}",
            r#"{"a":"#.repeat(MAX_DEPTH + 1),
            "}".repeat(MAX_DEPTH + 1)
        );
        assert!(matches!(err(&objects), Error::TooDeep { .. }));
        assert!(matches!(err(&nested(10_000)), Error::TooDeep { .. }));
    }

    #[test]
    fn rejects_invalid_json_and_trailing_content() {
        for text in [
            "",
            "   ",
            "{",
            r#"{"a":}"#,
            "{} x",
            "{}{}",
            "[1,]",
            r#"{"a":1,}"#,
            "'a'",
            "NaN",
            "Infinity",
            "01",
            r#""\ud800""#,
            "\"\u{1}\"",
            "{\"a\":1} // comment",
        ] {
            assert!(
                matches!(err(text), Error::Syntax { .. }),
                "{text:?} should be a syntax error"
            );
        }
        let Error::Syntax { line, column, .. } = err("{\n  \"a\": @\n}") else {
            panic!("expected a syntax error");
        };
        assert_eq!(line, 2);
        assert!(column > 0);
    }

    #[test]
    fn scalars_and_whitespace() {
        assert_eq!(ok(" null ").json, "null");
        assert_eq!(ok("\ttrue\r\n").json, "true");
        assert_eq!(ok("-5").json, "-5");
        assert_eq!(ok(r#""\u00E9""#).json, "\"\u{e9}\"");
        assert_eq!(ok(r#""\u001F\u007f""#).json, "\"\\u001f\u{7f}\"");
    }

    #[test]
    fn hex_lower_spells_as_hex_encode() {
        let bytes: Vec<u8> = (0..=255).collect();
        assert_eq!(hex_lower(&bytes), hex::encode(&bytes));
        assert_eq!(hex_lower(&[]), "");
        assert_eq!(hex_lower(&[0x0a, 0xf0]), "0af0");
    }

    #[test]
    fn idempotency_key_shape() {
        let key = idempotency_key("anything");
        assert_eq!(key.len(), 5 + 32);
        assert!(key.starts_with("alk1-"));
        assert!(key[5..].chars().all(|c| matches!(c, '0'..='9' | 'a'..='f')));
        assert_ne!(idempotency_key("a"), idempotency_key("b"));
    }

    // ------------------------------------------------------------------
    // Property tests
    // ------------------------------------------------------------------

    /// Test document; `Float` holds a float literal that must be rejected.
    #[derive(Debug, Clone)]
    enum Doc {
        Null,
        Bool(bool),
        Int(i64),
        Float(String),
        Str(String),
        Array(Vec<Doc>),
        Object(Vec<(String, Doc)>),
    }

    impl Doc {
        fn has_float(&self) -> bool {
            match self {
                Doc::Float(_) => true,
                Doc::Array(items) => items.iter().any(Doc::has_float),
                Doc::Object(entries) => entries.iter().any(|(_, v)| v.has_float()),
                _ => false,
            }
        }
    }

    /// How to render a document as (non-canonical) JSON text.
    #[derive(Debug, Clone, Copy)]
    struct Style {
        reverse_keys: bool,
        whitespace: bool,
        escape_everything: bool,
    }

    fn render(doc: &Doc, style: Style, out: &mut String) {
        let ws = |out: &mut String| {
            if style.whitespace {
                out.push_str(" \n\t ");
            }
        };
        ws(out);
        match doc {
            Doc::Null => out.push_str("null"),
            Doc::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Doc::Int(n) => out.push_str(&n.to_string()),
            Doc::Float(literal) => out.push_str(literal),
            Doc::Str(s) => render_str(s, style, out),
            Doc::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    render(item, style, out);
                }
                ws(out);
                out.push(']');
            }
            Doc::Object(entries) => {
                out.push('{');
                let mut ordered: Vec<&(String, Doc)> = entries.iter().collect();
                if style.reverse_keys {
                    ordered.reverse();
                }
                for (i, (key, value)) in ordered.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    ws(out);
                    render_str(key, style, out);
                    ws(out);
                    out.push(':');
                    render(value, style, out);
                }
                ws(out);
                out.push('}');
            }
        }
        ws(out);
    }

    fn render_str(s: &str, style: Style, out: &mut String) {
        if style.escape_everything {
            out.push('"');
            for unit in s.encode_utf16() {
                out.push_str(&format!("\\u{unit:04X}"));
            }
            out.push('"');
        } else {
            out.push_str(&serde_json::to_string(s).unwrap());
        }
    }

    fn text(doc: &Doc, style: Style) -> String {
        let mut out = String::new();
        render(doc, style, &mut out);
        out
    }

    fn float_literal() -> impl Strategy<Value = String> {
        prop_oneof![
            (any::<i32>(), 0u32..1000).prop_map(|(i, f)| format!("{i}.{f}")),
            (any::<i16>(), 0u8..30).prop_map(|(i, e)| format!("{i}e{e}")),
            (any::<i16>(), 0u8..30).prop_map(|(i, e)| format!("{i}E-{e}")),
            (any::<i16>(), 0u8..30).prop_map(|(i, e)| format!("{i}.5e+{e}")),
            Just("-0".to_owned()),
        ]
    }

    fn doc_strategy(with_floats: bool) -> impl Strategy<Value = Doc> {
        let int = -MAX_SAFE_INTEGER..=MAX_SAFE_INTEGER;
        let leaf = if with_floats {
            prop_oneof![
                Just(Doc::Null),
                any::<bool>().prop_map(Doc::Bool),
                int.prop_map(Doc::Int),
                any::<String>().prop_map(Doc::Str),
                float_literal().prop_map(Doc::Float),
            ]
            .boxed()
        } else {
            prop_oneof![
                Just(Doc::Null),
                any::<bool>().prop_map(Doc::Bool),
                int.prop_map(Doc::Int),
                any::<String>().prop_map(Doc::Str),
            ]
            .boxed()
        };
        leaf.prop_recursive(6, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Doc::Array),
                // Unique keys; BTreeMap order, reversed by one style.
                prop::collection::btree_map(any::<String>(), inner, 0..6)
                    .prop_map(|map| Doc::Object(map.into_iter().collect())),
            ]
        })
    }

    fn style() -> impl Strategy<Value = Style> {
        (any::<bool>(), any::<bool>(), any::<bool>()).prop_map(|(r, w, e)| Style {
            reverse_keys: r,
            whitespace: w,
            escape_everything: e,
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn canonical_is_a_fixed_point(doc in doc_strategy(false), style in style()) {
            let first = canonicalize(&text(&doc, style)).unwrap();
            let second = canonicalize(&first.json).unwrap();
            prop_assert_eq!(&second.json, &first.json);
            prop_assert_eq!(&second.hash, &first.hash);
            prop_assert_eq!(&second.value, &first.value);
        }

        #[test]
        fn key_order_whitespace_and_escapes_do_not_change_the_hash(
            doc in doc_strategy(false),
            a in style(),
            b in style(),
        ) {
            let left = canonicalize(&text(&doc, a)).unwrap();
            let right = canonicalize(&text(&doc, b)).unwrap();
            prop_assert_eq!(left.hash, right.hash);
            prop_assert_eq!(left.json, right.json);
        }

        #[test]
        fn any_document_with_a_float_is_rejected(doc in doc_strategy(true), style in style()) {
            let result = canonicalize(&text(&doc, style));
            if doc.has_float() {
                prop_assert!(
                    matches!(result, Err(Error::NonInteger { .. })),
                    "accepted a float: {:?}", result
                );
            } else {
                prop_assert!(result.is_ok(), "{:?}", result);
            }
        }

        #[test]
        fn a_float_anywhere_is_rejected(doc in doc_strategy(false), float in float_literal()) {
            let plain = Style { reverse_keys: false, whitespace: false, escape_everything: false };
            let body = text(&doc, plain);
            for wrapped in [
                format!("[{body},{float}]"),
                format!(r#"{{"a":{body},"z":{{"deep":[{float}]}}}}"#),
            ] {
                let result = canonicalize(&wrapped);
                prop_assert!(matches!(result, Err(Error::NonInteger { .. })), "{:?}", result);
            }
        }
    }
}
