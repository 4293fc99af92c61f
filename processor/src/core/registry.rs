//! The tool registry: which tools exist, in which versions, how their
//! arguments are validated, and how Airlock must treat their executions.
//!
//! The registry is a TOML configuration file with a top-level `[[tool]]`
//! array. Each entry names a tool version, the connector that executes it,
//! the JSON Schema (draft 2020-12) of its arguments, business invariants
//! checked after schema validation, JSON pointers naming the tenant and the
//! resource inside the canonical arguments, the downstream contract
//! (idempotency, reconciliation) and the retry / reconcile / approval
//! policies. See `testdata/registry.toml` for a complete example.
//!
//! Everything is validated when the registry is loaded, so a running
//! processor never discovers a configuration mistake mid-proposal. The only
//! I/O is reading the registry file and the schema files it references.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Default for `max_arguments_bytes` (size of the canonical arguments).
pub const DEFAULT_MAX_ARGUMENTS_BYTES: usize = 65_536;
/// Default for `attempt_timeout_cap_ms`.
pub const DEFAULT_ATTEMPT_TIMEOUT_CAP_MS: u64 = 30_000;
/// Default for `retention_ms`: 7 days.
pub const DEFAULT_RETENTION_MS: u64 = 7 * 24 * 60 * 60 * 1000;

/// Domain tag of [`Registry::hash`], versioning the hashing scheme.
const REGISTRY_HASH_DOMAIN: &[u8] = b"airlock/registry/v1\0";

/// Validation messages embed offending values; cap them so a huge argument
/// cannot blow up a record's detail text.
const MAX_MESSAGE_CHARS: usize = 400;

/// Errors raised while loading a registry.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The registry file could not be read.
    #[error("cannot read registry file {}: {source}", path.display())]
    Read {
        /// The registry file.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The text is not valid TOML or does not match the registry structure
    /// (unknown field, wrong type, missing required field).
    #[error("invalid registry {origin}: {message}")]
    Toml {
        /// The file path, or `<inline>` for [`Registry::from_toml_str`].
        origin: String,
        /// The TOML parser's message, with position.
        message: String,
    },
    /// The registry defines no tool at all (almost certainly the wrong file).
    #[error("registry {origin} defines no [[tool]]")]
    NoTools {
        /// The file path, or `<inline>`.
        origin: String,
    },
    /// Two entries share the same name and version.
    #[error("tool {tool} version {version} is defined more than once")]
    DuplicateTool {
        /// Tool name.
        tool: String,
        /// Tool version.
        version: String,
    },
    /// A field has an invalid value.
    #[error("tool {tool} version {version}: field `{field}`: {reason}")]
    InvalidField {
        /// Tool name.
        tool: String,
        /// Tool version.
        version: String,
        /// The offending field, e.g. `retry.max_attempts` or `invariant[1].min`.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Neither or both of `arguments_schema` and `arguments_schema_file` are set.
    #[error(
        "tool {tool} version {version}: exactly one of `arguments_schema` and \
         `arguments_schema_file` must be set ({found})"
    )]
    SchemaSource {
        /// Tool name.
        tool: String,
        /// Tool version.
        version: String,
        /// `"both are set"` or `"neither is set"`.
        found: &'static str,
    },
    /// A schema file could not be read.
    #[error("tool {tool} version {version}: cannot read schema file {}: {source}", path.display())]
    SchemaRead {
        /// Tool name.
        tool: String,
        /// Tool version.
        version: String,
        /// The resolved schema path.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A schema is not JSON, or not a valid draft 2020-12 JSON Schema.
    #[error("tool {tool} version {version}: schema {origin} is invalid: {message}")]
    SchemaInvalid {
        /// Tool name.
        tool: String,
        /// Tool version.
        version: String,
        /// The schema file path, or `arguments_schema` for an inline schema.
        origin: String,
        /// Why it is invalid.
        message: String,
    },
}

/// Result alias for this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why [`Registry::lookup`] found no tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LookupError {
    /// No tool with this name exists in any version.
    #[error("unknown tool")]
    UnknownTool,
    /// The tool exists, but not in the requested version.
    #[error("unknown version of a known tool")]
    UnknownVersion,
}

/// The loaded, validated tool registry.
#[derive(Debug)]
pub struct Registry {
    /// Tools in file order.
    tools: Vec<Tool>,
    /// name -> version -> index into `tools`. Nested so lookups by `&str`
    /// need no allocation.
    index: HashMap<String, HashMap<String, usize>>,
    /// See [`Registry::hash`].
    hash: String,
}

/// One tool version.
#[derive(Debug)]
pub struct Tool {
    /// Tool name, as proposed by agents.
    pub name: String,
    /// Tool version; proposals name an exact version.
    pub version: String,
    /// Connector whose workers execute this tool (dispatch topic suffix).
    pub connector: String,
    /// JSON pointer to the tenant id inside the canonical arguments.
    pub tenant_argument: JsonPointer,
    /// JSON pointer to the resource acted on (string or integer).
    pub resource_argument: JsonPointer,
    /// Maximum size of the canonical arguments in bytes.
    pub max_arguments_bytes: usize,
    /// Upper bound of the per-attempt timeout.
    pub attempt_timeout_cap_ms: u64,
    /// How long settled records are retained.
    pub retention_ms: u64,
    /// What the downstream system guarantees.
    pub contract: Contract,
    /// Retries of attempts that failed with proof.
    pub retry: RetryPolicy,
    /// Reconciliation of attempts with an unknown outcome.
    pub reconcile: ReconcilePolicy,
    /// Human approval requirements.
    pub approval: ApprovalPolicy,
    /// Business invariants, checked after schema validation.
    pub invariants: Vec<Invariant>,
    /// Compiled argument schema.
    validator: jsonschema::Validator,
}

/// Guarantees of the downstream system executing a tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Contract {
    /// The downstream honours the idempotency key: repeating a call with the
    /// same key has the effect of a single call.
    pub idempotent_by_key: bool,
    /// The downstream can be queried by idempotency key to learn whether an
    /// attempt took effect.
    pub reconcilable: bool,
}

/// Retry policy for attempts that failed with proof of no effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetryPolicy {
    /// Total attempts including the first; at least 1 (1 = no retry).
    pub max_attempts: u32,
    /// Delay after the first failed attempt.
    pub initial_backoff_ms: u64,
    /// Cap of the exponential delay (before jitter).
    pub max_backoff_ms: u64,
    /// Growth factor per attempt; at least 1.
    pub multiplier: u32,
    /// Jitter amplitude in permille of the delay (200 = ±20%); at most 1000.
    pub jitter_permille: u32,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 1,
            initial_backoff_ms: 1_000,
            max_backoff_ms: 60_000,
            multiplier: 2,
            jitter_permille: 200,
        }
    }
}

impl RetryPolicy {
    /// Delay before the attempt following failed attempt number `attempt`
    /// (1-based; 0 is treated as 1).
    ///
    /// `initial_backoff_ms * multiplier^(attempt-1)`, capped at
    /// `max_backoff_ms` (saturating, so huge attempt numbers are safe), then
    /// scaled by a jitter factor in `[1000-j, 1000+j]` permille chosen by
    /// `seed`. The caller derives `seed` from a hash of the operation, so the
    /// result is deterministic and replays identically; jitter may take the
    /// delay up to `j` permille above `max_backoff_ms`.
    pub fn backoff_ms(&self, attempt: u32, seed: u64) -> u64 {
        let exponent = attempt.saturating_sub(1);
        let base = u64::from(self.multiplier)
            .checked_pow(exponent)
            .and_then(|factor| self.initial_backoff_ms.checked_mul(factor))
            .unwrap_or(u64::MAX)
            .min(self.max_backoff_ms);
        let jitter = u64::from(self.jitter_permille.min(1000));
        // offset in [0, 2j]; permille in [1000-j, 1000+j].
        let permille = 1000 - jitter + seed % (2 * jitter + 1);
        let scaled = u128::from(base) * u128::from(permille) / 1000;
        u64::try_from(scaled).unwrap_or(u64::MAX)
    }
}

/// Reconciliation policy for attempts whose outcome is unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReconcilePolicy {
    /// Maximum number of reconciliation queries before giving up.
    pub max_rounds: u32,
    /// Delay before the first round.
    pub initial_backoff_ms: u64,
    /// Cap of the doubling delay.
    pub max_backoff_ms: u64,
}

impl Default for ReconcilePolicy {
    fn default() -> Self {
        Self {
            max_rounds: 5,
            initial_backoff_ms: 2_000,
            max_backoff_ms: 120_000,
        }
    }
}

impl ReconcilePolicy {
    /// Delay before reconciliation round `round` (1-based; 0 is treated as
    /// 1): `initial_backoff_ms * 2^(round-1)` capped at `max_backoff_ms`,
    /// saturating.
    pub fn backoff_ms(&self, round: u32) -> u64 {
        let exponent = round.saturating_sub(1);
        1u64.checked_shl(exponent)
            .and_then(|factor| self.initial_backoff_ms.checked_mul(factor))
            .unwrap_or(u64::MAX)
            .min(self.max_backoff_ms)
    }
}

/// Human approval requirements, used when policy decides on the approval tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ApprovalPolicy {
    /// Number of distinct approvers needed; at least 1.
    pub quorum: u32,
    /// How long an approval request waits before expiring.
    pub ttl_ms: u64,
}

impl Default for ApprovalPolicy {
    fn default() -> Self {
        Self {
            quorum: 1,
            ttl_ms: 3_600_000,
        }
    }
}

/// A business invariant on one argument, checked after schema validation.
/// All bounds given must hold; a missing value is a violation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invariant {
    /// JSON pointer into the canonical arguments.
    pub pointer: JsonPointer,
    /// Inclusive lower bound; the value must be an integer.
    pub min: Option<i64>,
    /// Inclusive upper bound; the value must be an integer.
    pub max: Option<i64>,
    /// Allowed values (strings or integers only).
    pub one_of: Option<Vec<Value>>,
}

impl Invariant {
    fn check(&self, args: &Value) -> std::result::Result<(), String> {
        let pointer = &self.pointer;
        let Some(value) = pointer.resolve(args) else {
            return Err(format!("invariant on {pointer}: the value is missing"));
        };
        if self.min.is_some() || self.max.is_some() {
            // Canonical arguments hold integers within ±(2^53−1), but check
            // u64 too so a caller passing other JSON gets a correct answer.
            let number = value
                .as_i64()
                .map(i128::from)
                .or_else(|| value.as_u64().map(i128::from));
            let Some(number) = number else {
                return Err(truncate(format!(
                    "invariant on {pointer}: {value} is not an integer"
                )));
            };
            if let Some(min) = self.min
                && number < i128::from(min)
            {
                return Err(format!(
                    "invariant on {pointer}: {number} is below the minimum {min}"
                ));
            }
            if let Some(max) = self.max
                && number > i128::from(max)
            {
                return Err(format!(
                    "invariant on {pointer}: {number} is above the maximum {max}"
                ));
            }
        }
        if let Some(allowed) = &self.one_of
            && !allowed.contains(value)
        {
            let list = allowed
                .iter()
                .map(Value::to_string)
                .collect::<Vec<_>>()
                .join(", ");
            return Err(truncate(format!(
                "invariant on {pointer}: {value} is not one of [{list}]"
            )));
        }
        Ok(())
    }
}

impl Tool {
    /// Validates arguments against the tool's JSON Schema.
    ///
    /// # Errors
    ///
    /// A message naming the first failing instance location (JSON pointer)
    /// and why it fails.
    pub fn validate_arguments(&self, args: &Value) -> std::result::Result<(), String> {
        self.validator.validate(args).map_err(|error| {
            let location = error.instance_path().as_str();
            let location = if location.is_empty() {
                "(root)"
            } else {
                location
            };
            truncate(format!("at {location}: {error}"))
        })
    }

    /// Checks the business invariants, in configuration order.
    ///
    /// # Errors
    ///
    /// A message naming the pointer and the violated bound of the first
    /// failing invariant.
    pub fn check_invariants(&self, args: &Value) -> std::result::Result<(), String> {
        self.invariants
            .iter()
            .try_for_each(|invariant| invariant.check(args))
    }

    /// The tenant named by the arguments, if `tenant_argument` points at a string.
    pub fn tenant_of<'a>(&self, args: &'a Value) -> Option<&'a str> {
        self.tenant_argument.resolve(args)?.as_str()
    }

    /// The resource named by the arguments: a string, or an integer rendered
    /// in decimal. Anything else (missing, object, bool...) is `None`.
    pub fn resource_of(&self, args: &Value) -> Option<String> {
        match self.resource_argument.resolve(args)? {
            Value::String(text) => Some(text.clone()),
            Value::Number(number) => {
                if let Some(value) = number.as_i64() {
                    Some(value.to_string())
                } else {
                    number.as_u64().map(|value| value.to_string())
                }
            }
            _ => None,
        }
    }
}

impl Registry {
    /// Parses and validates a registry from TOML text. Schema file paths are
    /// resolved relative to `base_dir` (and read from disk).
    ///
    /// # Errors
    ///
    /// Any [`Error`] describing the first configuration problem found.
    pub fn from_toml_str(text: &str, base_dir: &Path) -> Result<Registry> {
        Self::build(text, base_dir, "<inline>")
    }

    /// Reads and validates the registry file at `path`; schema files are
    /// resolved relative to its directory.
    ///
    /// # Errors
    ///
    /// [`Error::Read`] if the file cannot be read, otherwise as
    /// [`Registry::from_toml_str`].
    pub fn load(path: &Path) -> Result<Registry> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let base_dir = path.parent().unwrap_or_else(|| Path::new("."));
        Self::build(&text, base_dir, &path.display().to_string())
    }

    /// Finds a tool by exact name and version.
    ///
    /// # Errors
    ///
    /// [`LookupError::UnknownTool`] if no version of `name` exists,
    /// [`LookupError::UnknownVersion`] if `name` exists in other versions.
    pub fn lookup(&self, name: &str, version: &str) -> std::result::Result<&Tool, LookupError> {
        let versions = self.index.get(name).ok_or(LookupError::UnknownTool)?;
        let index = versions.get(version).ok_or(LookupError::UnknownVersion)?;
        Ok(&self.tools[*index])
    }

    /// All tools, in file order.
    pub fn tools(&self) -> impl Iterator<Item = &Tool> {
        self.tools.iter()
    }

    /// Lowercase hex SHA-256 identifying this configuration, recorded with
    /// every decision: over a domain tag, the registry text, and the text of
    /// every schema file in tool order, each length-prefixed (u64 big-endian)
    /// so content cannot shift between the parts.
    pub fn hash(&self) -> &str {
        &self.hash
    }

    fn build(text: &str, base_dir: &Path, origin: &str) -> Result<Registry> {
        let file: RawFile = toml::from_str(text).map_err(|error| Error::Toml {
            origin: origin.to_owned(),
            message: error.to_string(),
        })?;
        if file.tool.is_empty() {
            return Err(Error::NoTools {
                origin: origin.to_owned(),
            });
        }

        let mut hasher = Sha256::new();
        hasher.update(REGISTRY_HASH_DOMAIN);
        hash_part(&mut hasher, text);

        let mut tools = Vec::with_capacity(file.tool.len());
        let mut index: HashMap<String, HashMap<String, usize>> = HashMap::new();
        for raw in file.tool {
            let tool = raw.into_tool(base_dir, &mut hasher)?;
            let versions = index.entry(tool.name.clone()).or_default();
            if versions.contains_key(&tool.version) {
                return Err(Error::DuplicateTool {
                    tool: tool.name,
                    version: tool.version,
                });
            }
            versions.insert(tool.version.clone(), tools.len());
            tools.push(tool);
        }
        Ok(Registry {
            tools,
            index,
            hash: hex::encode(hasher.finalize()),
        })
    }
}

fn hash_part(hasher: &mut Sha256, part: &str) {
    hasher.update((part.len() as u64).to_be_bytes());
    hasher.update(part.as_bytes());
}

/// Caps a message at [`MAX_MESSAGE_CHARS`] characters.
fn truncate(mut message: String) -> String {
    if let Some((cut, _)) = message.char_indices().nth(MAX_MESSAGE_CHARS) {
        message.truncate(cut);
        message.push('…');
    }
    message
}

/// A JSON pointer (RFC 6901) into a tool's arguments, split and unescaped once when the registry
/// is loaded: the tenant, the resource and every invariant are looked up on each proposal, and
/// `serde_json::Value::pointer` splits the text and unescapes each token on every call (≈ 600
/// instructions a lookup, ≈ 3% of a fresh decision). Resolves exactly as `Value::pointer` does.
#[derive(Clone, PartialEq, Eq)]
pub struct JsonPointer {
    text: String,
    tokens: Vec<PointerToken>,
}

/// One reference token: an object key, and the array index it also denotes, if any.
#[derive(Clone, PartialEq, Eq)]
struct PointerToken {
    key: String,
    index: Option<usize>,
}

impl JsonPointer {
    /// Parses a pointer that starts with `/` and escapes `~` only as `~0` or `~1` (RFC 6901).
    /// The empty pointer (the whole document) is rejected: every configured pointer must name a
    /// member.
    ///
    /// # Errors
    ///
    /// A message naming the pointer and what is wrong with it.
    pub fn parse(text: &str) -> std::result::Result<Self, String> {
        if !text.starts_with('/') {
            return Err(format!("JSON pointer {text:?} must start with '/'"));
        }
        let mut chars = text.chars();
        while let Some(ch) = chars.next() {
            if ch == '~' && !matches!(chars.next(), Some('0' | '1')) {
                return Err(format!(
                    "JSON pointer {text:?}: '~' must be followed by '0' or '1'"
                ));
            }
        }
        let tokens = text
            .split('/')
            .skip(1)
            .map(|raw| {
                let key = raw.replace("~1", "/").replace("~0", "~");
                let index = array_index(&key);
                PointerToken { key, index }
            })
            .collect();
        Ok(JsonPointer {
            text: text.to_owned(),
            tokens,
        })
    }

    /// The value the pointer names inside `value`, if there is one.
    pub fn resolve<'a>(&self, value: &'a Value) -> Option<&'a Value> {
        self.tokens
            .iter()
            .try_fold(value, |target, token| match target {
                Value::Object(map) => map.get(&token.key),
                Value::Array(items) => token.index.and_then(|index| items.get(index)),
                _ => None,
            })
    }
}

/// An array index as RFC 6901 spells one: decimal digits, no sign, no leading zero.
fn array_index(token: &str) -> Option<usize> {
    if token.starts_with('+') || (token.starts_with('0') && token.len() != 1) {
        return None;
    }
    token.parse().ok()
}

impl std::fmt::Display for JsonPointer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::fmt::Debug for JsonPointer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&self.text, f)
    }
}

impl PartialEq<&str> for JsonPointer {
    fn eq(&self, other: &&str) -> bool {
        self.text == *other
    }
}

/// Names, versions and connectors end up in topic names, keys and entity
/// ids; restricting them to Kafka's topic alphabet keeps them safe everywhere.
fn check_identifier(value: &str) -> std::result::Result<(), String> {
    if value.is_empty() {
        return Err("must not be empty".to_owned());
    }
    if let Some(bad) = value
        .chars()
        .find(|ch| !(ch.is_ascii_alphanumeric() || matches!(ch, '.' | '_' | '-')))
    {
        return Err(format!(
            "{value:?} contains {bad:?}; only ASCII letters, digits, '.', '_' and '-' are allowed"
        ));
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// TOML structure
// ---------------------------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    tool: Vec<RawTool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTool {
    name: String,
    version: String,
    connector: String,
    arguments_schema_file: Option<String>,
    arguments_schema: Option<String>,
    tenant_argument: String,
    resource_argument: String,
    max_arguments_bytes: Option<usize>,
    attempt_timeout_cap_ms: Option<u64>,
    retention_ms: Option<u64>,
    // Required: what the downstream guarantees is a safety-relevant claim
    // that must be made explicitly, not defaulted.
    contract: Contract,
    #[serde(default)]
    retry: RetryPolicy,
    #[serde(default)]
    reconcile: ReconcilePolicy,
    #[serde(default)]
    approval: ApprovalPolicy,
    #[serde(default)]
    invariant: Vec<RawInvariant>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawInvariant {
    pointer: String,
    min: Option<i64>,
    max: Option<i64>,
    one_of: Option<Vec<toml::Value>>,
}

/// Error constructor bound to one tool.
struct FieldError<'a> {
    tool: &'a str,
    version: &'a str,
}

impl FieldError<'_> {
    fn field(&self, field: impl Into<String>, reason: impl Into<String>) -> Error {
        Error::InvalidField {
            tool: self.tool.to_owned(),
            version: self.version.to_owned(),
            field: field.into(),
            reason: reason.into(),
        }
    }

    fn require(&self, ok: bool, field: &str, reason: &str) -> Result<()> {
        if ok {
            Ok(())
        } else {
            Err(self.field(field, reason))
        }
    }
}

impl RawTool {
    fn into_tool(self, base_dir: &Path, hasher: &mut Sha256) -> Result<Tool> {
        let fe = FieldError {
            tool: &self.name,
            version: &self.version,
        };
        check_identifier(&self.name).map_err(|reason| fe.field("name", reason))?;
        check_identifier(&self.version).map_err(|reason| fe.field("version", reason))?;
        check_identifier(&self.connector).map_err(|reason| fe.field("connector", reason))?;
        let tenant_argument = JsonPointer::parse(&self.tenant_argument)
            .map_err(|reason| fe.field("tenant_argument", reason))?;
        let resource_argument = JsonPointer::parse(&self.resource_argument)
            .map_err(|reason| fe.field("resource_argument", reason))?;

        let max_arguments_bytes = self
            .max_arguments_bytes
            .unwrap_or(DEFAULT_MAX_ARGUMENTS_BYTES);
        fe.require(
            max_arguments_bytes > 0,
            "max_arguments_bytes",
            "must be > 0",
        )?;
        let attempt_timeout_cap_ms = self
            .attempt_timeout_cap_ms
            .unwrap_or(DEFAULT_ATTEMPT_TIMEOUT_CAP_MS);
        fe.require(
            attempt_timeout_cap_ms > 0,
            "attempt_timeout_cap_ms",
            "must be > 0",
        )?;
        let retention_ms = self.retention_ms.unwrap_or(DEFAULT_RETENTION_MS);
        fe.require(retention_ms > 0, "retention_ms", "must be > 0")?;

        let retry = self.retry;
        fe.require(
            retry.max_attempts >= 1,
            "retry.max_attempts",
            "must be >= 1",
        )?;
        fe.require(retry.multiplier >= 1, "retry.multiplier", "must be >= 1")?;
        fe.require(
            retry.jitter_permille <= 1000,
            "retry.jitter_permille",
            "must be <= 1000",
        )?;
        fe.require(
            retry.initial_backoff_ms <= retry.max_backoff_ms,
            "retry.initial_backoff_ms",
            "must be <= retry.max_backoff_ms",
        )?;
        let reconcile = self.reconcile;
        fe.require(
            reconcile.initial_backoff_ms <= reconcile.max_backoff_ms,
            "reconcile.initial_backoff_ms",
            "must be <= reconcile.max_backoff_ms",
        )?;
        let approval = self.approval;
        fe.require(approval.quorum >= 1, "approval.quorum", "must be >= 1")?;
        fe.require(approval.ttl_ms > 0, "approval.ttl_ms", "must be > 0")?;

        let invariants = self
            .invariant
            .into_iter()
            .enumerate()
            .map(|(position, raw)| raw.into_invariant(position, &fe))
            .collect::<Result<Vec<_>>>()?;

        let validator = compile_schema(
            &fe,
            self.arguments_schema_file.as_deref(),
            self.arguments_schema.as_deref(),
            base_dir,
            hasher,
        )?;

        Ok(Tool {
            name: self.name,
            version: self.version,
            connector: self.connector,
            tenant_argument,
            resource_argument,
            max_arguments_bytes,
            attempt_timeout_cap_ms,
            retention_ms,
            contract: self.contract,
            retry,
            reconcile,
            approval,
            invariants,
            validator,
        })
    }
}

impl RawInvariant {
    fn into_invariant(self, position: usize, fe: &FieldError<'_>) -> Result<Invariant> {
        let field = |name: &str| format!("invariant[{position}].{name}");
        let pointer = JsonPointer::parse(&self.pointer)
            .map_err(|reason| fe.field(field("pointer"), reason))?;
        if self.min.is_none() && self.max.is_none() && self.one_of.is_none() {
            return Err(fe.field(
                format!("invariant[{position}]"),
                format!(
                    "invariant on {} has no bound: set min, max or one_of",
                    self.pointer
                ),
            ));
        }
        if let (Some(min), Some(max)) = (self.min, self.max)
            && min > max
        {
            return Err(fe.field(field("min"), format!("min {min} is greater than max {max}")));
        }
        let one_of = match self.one_of {
            None => None,
            Some(values) => {
                if values.is_empty() {
                    return Err(fe.field(field("one_of"), "must not be empty"));
                }
                let converted = values
                    .into_iter()
                    .map(|value| match value {
                        toml::Value::String(text) => Ok(Value::String(text)),
                        toml::Value::Integer(number) => Ok(Value::from(number)),
                        other => Err(fe.field(
                            field("one_of"),
                            format!(
                                "only strings and integers are allowed, found {}",
                                other.type_str()
                            ),
                        )),
                    })
                    .collect::<Result<Vec<_>>>()?;
                Some(converted)
            }
        };
        Ok(Invariant {
            pointer,
            min: self.min,
            max: self.max,
            one_of,
        })
    }
}

fn compile_schema(
    fe: &FieldError<'_>,
    file: Option<&str>,
    inline: Option<&str>,
    base_dir: &Path,
    hasher: &mut Sha256,
) -> Result<jsonschema::Validator> {
    let (text, origin) = match (file, inline) {
        (Some(file), None) => {
            let path = base_dir.join(file);
            let text = std::fs::read_to_string(&path).map_err(|source| Error::SchemaRead {
                tool: fe.tool.to_owned(),
                version: fe.version.to_owned(),
                path: path.clone(),
                source,
            })?;
            // Inline schemas are already covered by the registry text; files
            // must be hashed so a schema edit changes the registry hash.
            hash_part(hasher, &text);
            (text, path.display().to_string())
        }
        (None, Some(inline)) => (inline.to_owned(), "arguments_schema".to_owned()),
        (found_file, _) => {
            return Err(Error::SchemaSource {
                tool: fe.tool.to_owned(),
                version: fe.version.to_owned(),
                found: if found_file.is_some() {
                    "both are set"
                } else {
                    "neither is set"
                },
            });
        }
    };
    let invalid = |message: String| Error::SchemaInvalid {
        tool: fe.tool.to_owned(),
        version: fe.version.to_owned(),
        origin: origin.clone(),
        message,
    };
    let schema: Value =
        serde_json::from_str(&text).map_err(|error| invalid(format!("not JSON: {error}")))?;
    // Pin the draft so a `$schema` typo cannot silently change semantics, and
    // assert `format` (e.g. "email"): in 2020-12 it is only an annotation by
    // default, which would let malformed addresses through.
    jsonschema::options()
        .with_draft(jsonschema::Draft::Draft202012)
        .should_validate_formats(true)
        .build(&schema)
        .map_err(|error| {
            let mut message = error.to_string();
            let location = error.schema_path().as_str();
            if !location.is_empty() {
                // Writing to a String cannot fail.
                let _ = write!(message, " (at schema location {location})");
            }
            invalid(message)
        })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    const REFUND_SCHEMA: &str = r#"{
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "additionalProperties": false,
        "required": ["tenant_id", "account_id", "amount"],
        "properties": {
            "tenant_id": { "type": "string", "minLength": 1 },
            "account_id": { "type": "string" },
            "amount": {
                "type": "object",
                "additionalProperties": false,
                "required": ["minor_units", "currency"],
                "properties": {
                    "minor_units": { "type": "integer" },
                    "currency": { "type": "string", "pattern": "^[A-Z]{3}$" }
                }
            }
        }
    }"#;

    const REGISTRY: &str = r#"
[[tool]]
name = "refund"
version = "1"
connector = "ledger"
arguments_schema_file = "refund.schema.json"
tenant_argument = "/tenant_id"
resource_argument = "/account_id"
max_arguments_bytes = 16384
attempt_timeout_cap_ms = 10000
retention_ms = 604800000
[tool.contract]
idempotent_by_key = true
reconcilable = true
[tool.retry]
max_attempts = 3
initial_backoff_ms = 1000
max_backoff_ms = 60000
multiplier = 2
jitter_permille = 200
[tool.reconcile]
max_rounds = 5
initial_backoff_ms = 2000
max_backoff_ms = 120000
[tool.approval]
quorum = 1
ttl_ms = 3600000
[[tool.invariant]]
pointer = "/amount/minor_units"
min = 1
max = 500000
[[tool.invariant]]
pointer = "/amount/currency"
one_of = ["EUR", "USD", "GBP"]

[[tool]]
name = "send_email"
version = "2"
connector = "http"
arguments_schema = '''
{
  "type": "object",
  "required": ["tenant_id", "to", "customer"],
  "properties": {
    "tenant_id": { "type": "string" },
    "to": { "type": "string", "format": "email" },
    "customer": { "type": "integer" }
  }
}
'''
tenant_argument = "/tenant_id"
resource_argument = "/customer"
[tool.contract]
idempotent_by_key = true
reconcilable = false
"#;

    /// A temp dir holding the refund schema, and the registry parsed from `text`.
    fn parse(text: &str) -> (tempfile::TempDir, Result<Registry>) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("refund.schema.json"), REFUND_SCHEMA).unwrap();
        let registry = Registry::from_toml_str(text, dir.path());
        (dir, registry)
    }

    fn registry() -> (tempfile::TempDir, Registry) {
        let (dir, registry) = parse(REGISTRY);
        (dir, registry.unwrap())
    }

    fn refund_args(minor_units: i64, currency: &str) -> Value {
        json!({
            "tenant_id": "t1",
            "account_id": "acct_42",
            "amount": { "minor_units": minor_units, "currency": currency }
        })
    }

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn registry_is_shareable_across_threads() {
        assert_send_sync::<Registry>();
    }

    #[test]
    fn parses_a_realistic_registry() {
        let (_dir, registry) = registry();
        let names: Vec<(&str, &str)> = registry
            .tools()
            .map(|t| (t.name.as_str(), t.version.as_str()))
            .collect();
        assert_eq!(names, [("refund", "1"), ("send_email", "2")]);

        let refund = registry.lookup("refund", "1").unwrap();
        assert_eq!(refund.connector, "ledger");
        assert_eq!(refund.tenant_argument, "/tenant_id");
        assert_eq!(refund.resource_argument, "/account_id");
        assert_eq!(refund.max_arguments_bytes, 16384);
        assert_eq!(refund.attempt_timeout_cap_ms, 10_000);
        assert_eq!(refund.retention_ms, 604_800_000);
        assert_eq!(
            refund.contract,
            Contract {
                idempotent_by_key: true,
                reconcilable: true
            }
        );
        assert_eq!(
            refund.retry,
            RetryPolicy {
                max_attempts: 3,
                initial_backoff_ms: 1000,
                max_backoff_ms: 60_000,
                multiplier: 2,
                jitter_permille: 200
            }
        );
        assert_eq!(refund.reconcile.max_rounds, 5);
        assert_eq!(
            refund.approval,
            ApprovalPolicy {
                quorum: 1,
                ttl_ms: 3_600_000
            }
        );
        assert_eq!(
            refund.invariants,
            [
                Invariant {
                    pointer: JsonPointer::parse("/amount/minor_units").unwrap(),
                    min: Some(1),
                    max: Some(500_000),
                    one_of: None
                },
                Invariant {
                    pointer: JsonPointer::parse("/amount/currency").unwrap(),
                    min: None,
                    max: None,
                    one_of: Some(vec![json!("EUR"), json!("USD"), json!("GBP")])
                }
            ]
        );

        // Defaults.
        let email = registry.lookup("send_email", "2").unwrap();
        assert_eq!(email.max_arguments_bytes, DEFAULT_MAX_ARGUMENTS_BYTES);
        assert_eq!(email.attempt_timeout_cap_ms, DEFAULT_ATTEMPT_TIMEOUT_CAP_MS);
        assert_eq!(email.retention_ms, DEFAULT_RETENTION_MS);
        assert_eq!(email.retry, RetryPolicy::default());
        assert_eq!(email.retry.max_attempts, 1);
        assert_eq!(email.reconcile, ReconcilePolicy::default());
        assert_eq!(email.approval, ApprovalPolicy::default());
        assert!(email.invariants.is_empty());

        assert_eq!(registry.hash().len(), 64);
        assert!(
            registry
                .hash()
                .chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
    }

    #[test]
    fn loads_the_demo_registry() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/registry.toml");
        let registry = Registry::load(&path).unwrap();
        let names: Vec<(&str, &str)> = registry
            .tools()
            .map(|t| (t.name.as_str(), t.connector.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                ("refund", "ledger"),
                ("debit", "ledger"),
                ("send_email", "http")
            ]
        );
        let refund = registry.lookup("refund", "1").unwrap();
        let args = json!({
            "tenant_id": "t1",
            "account_id": "acct_1234",
            "charge_id": "ch_5678",
            "amount": { "minor_units": 2500, "currency": "EUR" },
            "reason": "duplicate"
        });
        refund.validate_arguments(&args).unwrap();
        refund.check_invariants(&args).unwrap();
        let email = registry.lookup("send_email", "1").unwrap();
        let mail = json!({
            "tenant_id": "t1", "to": "not-an-address", "subject": "Hi", "body": "Hello"
        });
        let message = email.validate_arguments(&mail).unwrap_err();
        assert!(message.starts_with("at /to:"), "{message}");
        assert_eq!(registry.lookup("debit", "1").unwrap().approval.quorum, 2);
    }

    #[test]
    fn lookup_distinguishes_unknown_tool_and_version() {
        let (_dir, registry) = registry();
        assert_eq!(
            registry.lookup("wire_transfer", "1").unwrap_err(),
            LookupError::UnknownTool
        );
        assert_eq!(
            registry.lookup("refund", "2").unwrap_err(),
            LookupError::UnknownVersion
        );
    }

    #[test]
    fn several_versions_of_a_tool() {
        let second = REGISTRY.replace("name = \"send_email\"", "name = \"refund\"");
        let (_dir, registry) = parse(&second);
        let registry = registry.unwrap();
        assert_eq!(registry.lookup("refund", "1").unwrap().connector, "ledger");
        assert_eq!(registry.lookup("refund", "2").unwrap().connector, "http");
        assert_eq!(
            registry.lookup("refund", "3").unwrap_err(),
            LookupError::UnknownVersion
        );
    }

    #[test]
    fn hash_covers_registry_text_and_schema_files() {
        let (dir, registry) = registry();
        let again = Registry::from_toml_str(REGISTRY, dir.path()).unwrap();
        assert_eq!(registry.hash(), again.hash());

        let edited = format!("{REGISTRY}\n# comment\n");
        let with_comment = Registry::from_toml_str(&edited, dir.path()).unwrap();
        assert_ne!(registry.hash(), with_comment.hash());

        let schema = REFUND_SCHEMA.replace("\"minLength\": 1", "\"minLength\": 2");
        std::fs::write(dir.path().join("refund.schema.json"), schema).unwrap();
        let new_schema = Registry::from_toml_str(REGISTRY, dir.path()).unwrap();
        assert_ne!(registry.hash(), new_schema.hash());
    }

    #[test]
    fn load_reports_unreadable_file() {
        let error = Registry::load(Path::new("/nonexistent/registry.toml")).unwrap_err();
        assert!(matches!(error, Error::Read { .. }), "{error}");
        assert!(error.to_string().contains("/nonexistent/registry.toml"));
    }

    fn load_error(text: &str) -> Error {
        parse(text).1.unwrap_err()
    }

    /// Asserts an `InvalidField` error on `field` of the tool named `tool`.
    fn assert_field(error: Error, expected_tool: &str, expected_field: &str) {
        match &error {
            Error::InvalidField { tool, field, .. } => {
                assert_eq!(tool, expected_tool, "{error}");
                assert_eq!(field, expected_field, "{error}");
            }
            other => panic!("expected InvalidField on {expected_field}, got {other}"),
        }
    }

    #[test]
    fn rejects_toml_errors_and_unknown_fields() {
        for text in [
            "this is not toml",
            "[[tool]]\nname = 1",
            "[[tools]]\nname = \"x\"",
            &REGISTRY.replace(
                "connector = \"ledger\"",
                "connector = \"ledger\"\ncolour = \"red\"",
            ),
            &REGISTRY.replace("multiplier = 2", "multiplier = 2\nfactor = 3"),
            &REGISTRY.replace("min = 1\n", "min = 1\nexclusive = true\n"),
            &REGISTRY.replace("reconcilable = true", ""),
            // The contract must be stated explicitly.
            &REGISTRY.replace(
                "[tool.contract]\nidempotent_by_key = true\nreconcilable = false\n",
                "",
            ),
            &REGISTRY.replace("max = 500000", "max = 500000.5"),
        ] {
            let error = load_error(text);
            assert!(matches!(error, Error::Toml { .. }), "{text}: {error}");
        }
        let error = load_error(&REGISTRY.replace("multiplier = 2", "multiplier = 2\nfactor = 3"));
        assert!(error.to_string().contains("factor"), "{error}");
    }

    #[test]
    fn rejects_empty_registry() {
        assert!(matches!(load_error(""), Error::NoTools { .. }));
        assert!(matches!(load_error("# nothing\n"), Error::NoTools { .. }));
    }

    #[test]
    fn rejects_duplicate_name_and_version() {
        let duplicate = REGISTRY
            .replace("version = \"2\"", "version = \"1\"")
            .replace("name = \"send_email\"", "name = \"refund\"");
        let error = load_error(&duplicate);
        assert!(
            matches!(&error, Error::DuplicateTool { tool, version } if tool == "refund" && version == "1"),
            "{error}"
        );
    }

    #[test]
    fn rejects_both_or_neither_schema_source() {
        let both = REGISTRY.replace(
            "arguments_schema_file = \"refund.schema.json\"",
            "arguments_schema_file = \"refund.schema.json\"\narguments_schema = '{}'",
        );
        let error = load_error(&both);
        assert!(
            matches!(&error, Error::SchemaSource { tool, found: "both are set", .. } if tool == "refund"),
            "{error}"
        );
        let neither = REGISTRY.replace("arguments_schema_file = \"refund.schema.json\"", "");
        assert!(matches!(
            load_error(&neither),
            Error::SchemaSource {
                found: "neither is set",
                ..
            }
        ));
    }

    #[test]
    fn rejects_bad_schemas() {
        let missing = REGISTRY.replace("refund.schema.json", "missing.schema.json");
        let error = load_error(&missing);
        assert!(
            matches!(&error, Error::SchemaRead { tool, path, .. }
                if tool == "refund" && path.ends_with("missing.schema.json")),
            "{error}"
        );

        // Replaces the inline schema of send_email.
        let inline = |schema: &str| {
            let start = REGISTRY.find("arguments_schema = '''").unwrap();
            let end = REGISTRY[start..].find("'''\ntenant").unwrap() + start + 3;
            format!(
                "{}arguments_schema = '''{schema}'''{}",
                &REGISTRY[..start],
                &REGISTRY[end..]
            )
        };
        let error = load_error(&inline("{ not json }"));
        assert!(
            matches!(&error, Error::SchemaInvalid { tool, origin, message, .. }
                if tool == "send_email" && origin == "arguments_schema" && message.contains("not JSON")),
            "{error}"
        );
        for bad in [
            r#"{"type": "nonsense"}"#,
            r#"{"minimum": "ten"}"#,
            r#"{"required": "tenant_id"}"#,
            // No remote or file resolution: external references are rejected.
            r#"{"$ref": "https://schemas.example/other.json"}"#,
        ] {
            let error = load_error(&inline(bad));
            assert!(
                matches!(&error, Error::SchemaInvalid { tool, .. } if tool == "send_email"),
                "{bad}: {error}"
            );
        }
        // A valid inline schema is accepted by the same helper.
        assert!(parse(&inline(r#"{"type": "object"}"#)).1.is_ok());
    }

    #[test]
    fn rejects_invalid_pointers() {
        let error = load_error(&REGISTRY.replace(
            "tenant_argument = \"/tenant_id\"\nresource_argument = \"/account_id\"",
            "tenant_argument = \"tenant_id\"\nresource_argument = \"/account_id\"",
        ));
        assert_field(error, "refund", "tenant_argument");
        let error = load_error(&REGISTRY.replace("\"/customer\"", "\"/cust~2omer\""));
        assert_field(error, "send_email", "resource_argument");
        let error = load_error(&REGISTRY.replace("\"/amount/currency\"", "\"amount/currency\""));
        assert_field(error, "refund", "invariant[1].pointer");
        let error = load_error(&REGISTRY.replace("\"/customer\"", "\"\""));
        assert_field(error, "send_email", "resource_argument");
    }

    #[test]
    fn rejects_bad_identifiers() {
        let error =
            load_error(&REGISTRY.replace("connector = \"http\"", "connector = \"http topic\""));
        assert_field(error, "send_email", "connector");
        let error = load_error(&REGISTRY.replace("name = \"refund\"", "name = \"\""));
        assert_field(error, "", "name");
        let error = load_error(&REGISTRY.replace("version = \"2\"", "version = \"2/beta\""));
        assert_field(error, "send_email", "version");
    }

    #[test]
    fn rejects_bad_numbers() {
        for (from, to, field) in [
            ("max_attempts = 3", "max_attempts = 0", "retry.max_attempts"),
            ("multiplier = 2", "multiplier = 0", "retry.multiplier"),
            (
                "jitter_permille = 200",
                "jitter_permille = 1001",
                "retry.jitter_permille",
            ),
            (
                "initial_backoff_ms = 1000",
                "initial_backoff_ms = 70000",
                "retry.initial_backoff_ms",
            ),
            (
                "initial_backoff_ms = 2000",
                "initial_backoff_ms = 200000",
                "reconcile.initial_backoff_ms",
            ),
            ("quorum = 1", "quorum = 0", "approval.quorum"),
            ("ttl_ms = 3600000", "ttl_ms = 0", "approval.ttl_ms"),
            (
                "max_arguments_bytes = 16384",
                "max_arguments_bytes = 0",
                "max_arguments_bytes",
            ),
            (
                "attempt_timeout_cap_ms = 10000",
                "attempt_timeout_cap_ms = 0",
                "attempt_timeout_cap_ms",
            ),
            (
                "retention_ms = 604800000",
                "retention_ms = 0",
                "retention_ms",
            ),
        ] {
            let error = load_error(&REGISTRY.replace(from, to));
            assert_field(error, "refund", field);
        }
        // Negative values do not fit the unsigned types.
        assert!(matches!(
            load_error(&REGISTRY.replace("quorum = 1", "quorum = -1")),
            Error::Toml { .. }
        ));
    }

    #[test]
    fn rejects_bad_invariants() {
        let error = load_error(&REGISTRY.replace("min = 1\nmax = 500000\n", ""));
        assert_field(error, "refund", "invariant[0]");
        let error = load_error(&REGISTRY.replace("min = 1\nmax = 500000", "min = 10\nmax = 5"));
        assert_field(error, "refund", "invariant[0].min");
        let error = load_error(&REGISTRY.replace("[\"EUR\", \"USD\", \"GBP\"]", "[]"));
        assert_field(error, "refund", "invariant[1].one_of");
        let error = load_error(&REGISTRY.replace("[\"EUR\", \"USD\", \"GBP\"]", "[\"EUR\", 1.5]"));
        assert_field(error, "refund", "invariant[1].one_of");
        // Integers are allowed in one_of.
        assert!(
            parse(&REGISTRY.replace("[\"EUR\", \"USD\", \"GBP\"]", "[\"EUR\", 978]"))
                .1
                .is_ok()
        );
    }

    #[test]
    fn error_messages_name_tool_and_field() {
        let error = load_error(&REGISTRY.replace("quorum = 1", "quorum = 0"));
        assert_eq!(
            error.to_string(),
            "tool refund version 1: field `approval.quorum`: must be >= 1"
        );
    }

    #[test]
    fn validates_arguments_against_the_schema() {
        let (_dir, registry) = registry();
        let refund = registry.lookup("refund", "1").unwrap();
        refund.validate_arguments(&refund_args(100, "EUR")).unwrap();

        let mut missing = refund_args(100, "EUR");
        missing.as_object_mut().unwrap().remove("amount");
        let message = refund.validate_arguments(&missing).unwrap_err();
        assert!(message.starts_with("at (root):"), "{message}");
        assert!(message.contains("amount"), "{message}");

        let wrong_type = json!({
            "tenant_id": "t1", "account_id": "a",
            "amount": { "minor_units": "100", "currency": "EUR" }
        });
        let message = refund.validate_arguments(&wrong_type).unwrap_err();
        assert!(message.starts_with("at /amount/minor_units:"), "{message}");

        let message = refund
            .validate_arguments(&refund_args(100, "euro"))
            .unwrap_err();
        assert!(message.starts_with("at /amount/currency:"), "{message}");

        let mut extra = refund_args(100, "EUR");
        extra["surprise"] = json!(true);
        let message = refund.validate_arguments(&extra).unwrap_err();
        assert!(message.contains("surprise"), "{message}");

        // Formats are asserted, not just annotations.
        let email = registry.lookup("send_email", "2").unwrap();
        email
            .validate_arguments(&json!({"tenant_id": "t1", "to": "a@b.example", "customer": 7}))
            .unwrap();
        let message = email
            .validate_arguments(&json!({"tenant_id": "t1", "to": "nope", "customer": 7}))
            .unwrap_err();
        assert!(message.starts_with("at /to:"), "{message}");

        // Huge offending values do not produce huge messages.
        let huge = json!({"tenant_id": "t1", "to": "x".repeat(10_000), "customer": 7});
        let message = email.validate_arguments(&huge).unwrap_err();
        assert!(
            message.chars().count() <= MAX_MESSAGE_CHARS + 1,
            "{}",
            message.len()
        );
    }

    #[test]
    fn checks_invariants() {
        let (_dir, registry) = registry();
        let refund = registry.lookup("refund", "1").unwrap();
        refund.check_invariants(&refund_args(1, "EUR")).unwrap();
        refund
            .check_invariants(&refund_args(500_000, "GBP"))
            .unwrap();

        let message = refund.check_invariants(&refund_args(0, "EUR")).unwrap_err();
        assert_eq!(
            message,
            "invariant on /amount/minor_units: 0 is below the minimum 1"
        );
        let message = refund
            .check_invariants(&refund_args(500_001, "EUR"))
            .unwrap_err();
        assert_eq!(
            message,
            "invariant on /amount/minor_units: 500001 is above the maximum 500000"
        );
        let message = refund.check_invariants(&refund_args(5, "JPY")).unwrap_err();
        assert_eq!(
            message,
            r#"invariant on /amount/currency: "JPY" is not one of ["EUR", "USD", "GBP"]"#
        );
        let message = refund
            .check_invariants(&json!({"tenant_id": "t1", "amount": {"currency": "EUR"}}))
            .unwrap_err();
        assert_eq!(
            message,
            "invariant on /amount/minor_units: the value is missing"
        );
        let message = refund
            .check_invariants(&json!({"amount": {"minor_units": "5", "currency": "EUR"}}))
            .unwrap_err();
        assert_eq!(
            message,
            r#"invariant on /amount/minor_units: "5" is not an integer"#
        );
        // Values beyond i64 are compared correctly, not wrapped.
        let message = refund
            .check_invariants(&json!({"amount": {"minor_units": u64::MAX, "currency": "EUR"}}))
            .unwrap_err();
        assert!(message.contains("above the maximum"), "{message}");
    }

    #[test]
    fn extracts_tenant_and_resource() {
        let (_dir, registry) = registry();
        let refund = registry.lookup("refund", "1").unwrap();
        let args = refund_args(1, "EUR");
        assert_eq!(refund.tenant_of(&args), Some("t1"));
        assert_eq!(refund.resource_of(&args).as_deref(), Some("acct_42"));
        assert_eq!(refund.tenant_of(&json!({"tenant_id": 5})), None);
        assert_eq!(refund.tenant_of(&json!({})), None);
        assert_eq!(refund.resource_of(&json!({"account_id": true})), None);
        assert_eq!(refund.resource_of(&json!({"account_id": {"id": 1}})), None);
        assert_eq!(refund.resource_of(&json!({})), None);

        let email = registry.lookup("send_email", "2").unwrap();
        assert_eq!(
            email.resource_of(&json!({"customer": 12345})).as_deref(),
            Some("12345")
        );
        assert_eq!(
            email.resource_of(&json!({"customer": -7})).as_deref(),
            Some("-7")
        );
        assert_eq!(
            email.resource_of(&json!({"customer": u64::MAX})).as_deref(),
            Some("18446744073709551615")
        );
    }

    #[test]
    fn retry_backoff_examples() {
        let policy = RetryPolicy {
            max_attempts: 5,
            initial_backoff_ms: 1000,
            max_backoff_ms: 60_000,
            multiplier: 2,
            jitter_permille: 0,
        };
        let delays: Vec<u64> = (0..=8)
            .map(|attempt| policy.backoff_ms(attempt, 12345))
            .collect();
        assert_eq!(
            delays,
            [1000, 1000, 2000, 4000, 8000, 16_000, 32_000, 60_000, 60_000]
        );
        assert_eq!(policy.backoff_ms(u32::MAX, u64::MAX), 60_000);

        let jittered = RetryPolicy {
            jitter_permille: 200,
            ..policy
        };
        // seed % 401 == 0 -> -20%; == 200 -> exact; == 400 -> +20%.
        assert_eq!(jittered.backoff_ms(1, 0), 800);
        assert_eq!(jittered.backoff_ms(1, 200), 1000);
        assert_eq!(jittered.backoff_ms(1, 400), 1200);
        assert_eq!(jittered.backoff_ms(1, 401), 800);
        // Jitter applies after the cap.
        assert_eq!(jittered.backoff_ms(100, 400), 72_000);

        let flat = RetryPolicy {
            multiplier: 1,
            ..policy
        };
        assert_eq!(flat.backoff_ms(u32::MAX, 0), 1000);
    }

    #[test]
    fn reconcile_backoff_examples() {
        let policy = ReconcilePolicy {
            max_rounds: 5,
            initial_backoff_ms: 2000,
            max_backoff_ms: 120_000,
        };
        let delays: Vec<u64> = (0..=8).map(|round| policy.backoff_ms(round)).collect();
        assert_eq!(
            delays,
            [
                2000, 2000, 4000, 8000, 16_000, 32_000, 64_000, 120_000, 120_000
            ]
        );
        assert_eq!(policy.backoff_ms(64), 120_000);
        assert_eq!(policy.backoff_ms(u32::MAX), 120_000);
    }

    fn retry_policy() -> impl Strategy<Value = RetryPolicy> {
        (
            1u32..10,
            0u64..1_000_000,
            0u64..10_000_000,
            1u32..20,
            0u32..=1000,
        )
            .prop_map(
                |(max_attempts, initial, extra, multiplier, jitter)| RetryPolicy {
                    max_attempts,
                    initial_backoff_ms: initial,
                    max_backoff_ms: initial + extra,
                    multiplier,
                    jitter_permille: jitter,
                },
            )
    }

    /// A document whose keys and arrays exercise every rule of RFC 6901 that `resolve` follows.
    fn pointer_document() -> Value {
        json!({
            "": {"": 1, "a": 2},
            "a": {"b": [10, 11, {"c": "deep"}], "0": "key zero", "01": "key 01"},
            "a/b": "slash",
            "m~n": "tilde",
            "~1": "escaped twice",
            "list": [[1, 2], {"x": null}],
            "n": 5
        })
    }

    /// Pointers over `pointer_document`: keys, escapes, array indexes with leading zeros,
    /// signs and out of range, empty tokens, trailing slashes, and paths through scalars.
    fn pointer_texts() -> Vec<&'static str> {
        vec![
            "/",
            "//",
            "//a",
            "/a",
            "/a/b",
            "/a/b/0",
            "/a/b/2/c",
            "/a/b/3",
            "/a/b/-",
            "/a/b/00",
            "/a/b/01",
            "/a/b/+1",
            "/a/b/1/",
            "/a/0",
            "/a/01",
            "/a~1b",
            "/m~0n",
            "/~01",
            "/~1",
            "/list/0/1",
            "/list/1/x",
            "/list/1/x/y",
            "/n",
            "/n/0",
            "/missing",
            "/a/b/18446744073709551616",
        ]
    }

    /// Small JSON documents whose keys come from the pointer tokens' alphabet.
    fn json_tree() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![Just(Value::Null), any::<i64>().prop_map(Value::from)];
        leaf.prop_recursive(4, 32, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map("[a~/0-9+]{0,3}", inner, 0..4)
                    .prop_map(|map| Value::Object(map.into_iter().collect())),
            ]
        })
    }

    #[test]
    fn json_pointers_resolve_as_serde_json_does() {
        let document = pointer_document();
        for text in pointer_texts() {
            let pointer = JsonPointer::parse(text).unwrap();
            assert_eq!(pointer.resolve(&document), document.pointer(text), "{text}");
            assert_eq!(pointer.to_string(), text);
        }
        let found = |text| {
            JsonPointer::parse(text)
                .unwrap()
                .resolve(&document)
                .cloned()
        };
        assert_eq!(found("/a~1b"), Some(json!("slash")));
        assert_eq!(found("/~01"), Some(json!("escaped twice")));
        assert_eq!(found("/a/b/2/c"), Some(json!("deep")));
        assert_eq!(found("/a/b/01"), None);
        assert_eq!(found("/a/01"), Some(json!("key 01")));
        for bad in ["", "a/b", "/a~", "/a~2"] {
            assert!(JsonPointer::parse(bad).is_err(), "{bad:?}");
        }
    }

    proptest! {
        /// Any pointer made of keys and indexes resolves as `Value::pointer` over any document
        /// built from the same alphabet.
        #[test]
        fn json_pointers_agree_with_serde_json_on_random_paths(
            tokens in prop::collection::vec("[a~/0-9+]{0,3}", 0..5),
            document in json_tree(),
        ) {
            let text: String = tokens
                .iter()
                .map(|t| format!("/{}", t.replace('~', "~0").replace('/', "~1")))
                .collect();
            let text = if text.is_empty() { "/".to_owned() } else { text };
            let pointer = JsonPointer::parse(&text).unwrap();
            prop_assert_eq!(pointer.resolve(&document), document.pointer(&text));
        }
    }

    proptest! {
        #[test]
        fn retry_backoff_is_monotonic_capped_and_jitter_bounded(
            policy in retry_policy(),
            attempt in 1u32..200,
            seed in any::<u64>(),
        ) {
            let delay = policy.backoff_ms(attempt, seed);
            let next = policy.backoff_ms(attempt + 1, seed);
            prop_assert!(next >= delay, "{next} < {delay}");

            let unjittered = RetryPolicy { jitter_permille: 0, ..policy };
            let base = unjittered.backoff_ms(attempt, seed);
            prop_assert!(base <= policy.max_backoff_ms);
            prop_assert!(base >= policy.initial_backoff_ms.min(policy.max_backoff_ms));
            let j = u128::from(policy.jitter_permille);
            let low = u128::from(base) * (1000 - j) / 1000;
            let high = u128::from(base) * (1000 + j) / 1000;
            prop_assert!((low..=high).contains(&u128::from(delay)), "{delay} not in {low}..={high}");
            // Deterministic.
            prop_assert_eq!(delay, policy.backoff_ms(attempt, seed));
        }

        #[test]
        fn retry_backoff_never_overflows(policy in retry_policy(), attempt in any::<u32>(), seed in any::<u64>()) {
            let huge = RetryPolicy { initial_backoff_ms: u64::MAX / 2, max_backoff_ms: u64::MAX, ..policy };
            let _ = huge.backoff_ms(attempt, seed);
            prop_assert!(policy.backoff_ms(attempt, seed) <= policy.max_backoff_ms * 2);
        }

        #[test]
        fn reconcile_backoff_is_monotonic_and_capped(
            initial in 0u64..1_000_000,
            extra in 0u64..10_000_000,
            round in 0u32..300,
        ) {
            let policy = ReconcilePolicy { max_rounds: 3, initial_backoff_ms: initial, max_backoff_ms: initial + extra };
            let delay = policy.backoff_ms(round);
            prop_assert!(policy.backoff_ms(round + 1) >= delay);
            prop_assert!(delay <= policy.max_backoff_ms);
            prop_assert!(delay >= initial);
        }
    }
}
