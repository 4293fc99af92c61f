//! The processor's configuration: one TOML file, every field with a production default, and
//! environment overrides for the fields that differ per deployment.
//!
//! | field | env override | default |
//! | --- | --- | --- |
//! | `kafka.brokers` | `AIRLOCK_KAFKA_BROKERS` | `localhost:9092` |
//! | `kafka.compatibility` (the broker's kind: `kafka` or `tansu-0.6`, see [`super::compat`]) | `AIRLOCK_KAFKA_COMPATIBILITY` | `kafka` |
//! | `kafka.max_message_bytes` (the largest record any client produces; larger inputs and inputs whose outputs would be larger are dead-lettered) | `AIRLOCK_KAFKA_MAX_MESSAGE_BYTES` | `1000000` |
//! | `kafka.properties` (librdkafka properties: SASL, SSL, `compression.type`, ...; not those Airlock sets, see [`Kafka::validate`]) | `AIRLOCK_KAFKA_PROPERTIES` (`k=v,k=v`, added) | none (producers: `compression.type=lz4`, `message.timeout.ms=120000`) |
//! | `topics.prefix` | `AIRLOCK_TOPICS_PREFIX` | `airlock.` |
//! | `topics.partitions` | `AIRLOCK_TOPICS_PARTITIONS` | `6` |
//! | `topics.replication_factor` | `AIRLOCK_TOPICS_REPLICATION_FACTOR` | `1` |
//! | `state.dir` | `AIRLOCK_STATE_DIR` | `./airlock-state` |
//! | `batch.max_records` | `AIRLOCK_BATCH_MAX_RECORDS` | `2000` |
//! | `batch.flush_interval_ms` | `AIRLOCK_BATCH_FLUSH_INTERVAL_MS` | `20` |
//! | `batch.idle_ms` | `AIRLOCK_BATCH_IDLE_MS` | `2` |
//! | `batch.max_in_flight` | `AIRLOCK_BATCH_MAX_IN_FLIGHT` | `4` |
//! | `state.sync` | `AIRLOCK_STATE_SYNC` | `true` |
//! | `state.background_write_mib_per_s` | `AIRLOCK_STATE_BACKGROUND_WRITE_MIB_PER_S` | `0` (unlimited) |
//! | `state.background_write_auto_tune` | `AIRLOCK_STATE_BACKGROUND_WRITE_AUTO_TUNE` | `false` |
//! | `tools.registry`, `tools.policies`, `tools.entities` | `AIRLOCK_REGISTRY`, `AIRLOCK_POLICIES`, `AIRLOCK_ENTITIES` | `deploy/config/...` |
//! | `processor.instance` | `AIRLOCK_INSTANCE` | `<hostname>-<pid>` |
//! | `processor.group_id` | `AIRLOCK_GROUP_ID` | `<prefix>processor` |
//! | `processor.session_timeout_ms` | `AIRLOCK_SESSION_TIMEOUT_MS` | `10000` |
//! | `processor.max_poll_interval_ms` | `AIRLOCK_MAX_POLL_INTERVAL_MS` | `300000` |
//! | `processor.timers_per_batch` | `AIRLOCK_TIMERS_PER_BATCH` | `1000` |
//! | `processor.checkpoint_interval_ms` | `AIRLOCK_CHECKPOINT_INTERVAL_MS` | `60000` |
//! | `processor.changelog_sweep_ms` | `AIRLOCK_CHANGELOG_SWEEP_MS` | `30000` |
//! | `processor.clock_tick_ms` | `AIRLOCK_CLOCK_TICK_MS` | `1000` |
//! | `processor.claim_stall_timeout_ms` | `AIRLOCK_CLAIM_STALL_TIMEOUT_MS` | `60000` |
//! | `processor.closed_intent_retention_ms` | `AIRLOCK_CLOSED_INTENT_RETENTION_MS` | `2592000000` (30 days) |
//! | `processor.key_scope` (whose identifiers operation keys, run ids and proposal ids are: `global`, one namespace for every tenant, or `tenant`, each beginning with its tenant id and `/`; see [`crate::core::KeyScope`]) | `AIRLOCK_KEY_SCOPE` | `global` |
//! | `processor.linger_ms` | `AIRLOCK_LINGER_MS` | `2` |
//! | `processor.threads` | `AIRLOCK_THREADS` | `4` |
//! | `capability.signing_key_file` | `AIRLOCK_CAPABILITY_SIGNING_KEY_FILE` | empty: dispatch commands unsigned |
//! | `capability.require_person_signatures` | `AIRLOCK_CAPABILITY_REQUIRE_PERSON_SIGNATURES` | `false`: people without registered keys act unsigned |
//! | `capability.worker_verifying_key_files` (per connector, its workers' verifying keys) | `AIRLOCK_CAPABILITY_WORKER_VERIFYING_KEY_FILES` (`name=a.pub,b.pub;name=c.pub`) | none: outcomes taken unsigned |
//! | `capability.verifying_key_files` (the processors' verifying keys, for readers of the decisions topic) | `AIRLOCK_CAPABILITY_VERIFYING_KEY_FILES` (comma separated) | none: fence markers on the decisions topic taken unsigned |
//! | `receipts.signing_key_file` | `AIRLOCK_RECEIPTS_SIGNING_KEY_FILE` | empty: no receipts issued |
//! | `telemetry.listen` | `AIRLOCK_TELEMETRY_LISTEN` | empty: no endpoint (`0.0.0.0:9464` in a container) |
//! | `telemetry.stall_after_ms` | `AIRLOCK_TELEMETRY_STALL_AFTER_MS` | `60000` |
//! | `telemetry.otlp_endpoint` | `AIRLOCK_TELEMETRY_OTLP_ENDPOINT` | empty: `OTEL_EXPORTER_OTLP_ENDPOINT` if set, else no export |
//! | `schema_registry.url` (a Confluent-compatible schema registry's base URL; see [`super::schema_registry`]) | `AIRLOCK_SCHEMA_REGISTRY_URL` | empty: no registry, inputs in Confluent framing are dead-lettered |
//! | `schema_registry.framing` (how decisions, journal events and receipts are written: `single-object` or `confluent`, which needs `url`) | `AIRLOCK_SCHEMA_REGISTRY_FRAMING` | `single-object` |

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Errors of loading the configuration; each names the file or variable at fault.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: String, message: String },
    #[error("environment variable {name}={value:?}: {message}")]
    Env {
        name: &'static str,
        value: String,
        message: String,
    },
    #[error("{field}: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub kafka: Kafka,
    pub topics: Topics,
    pub state: State,
    pub batch: Batch,
    pub tools: Tools,
    pub processor: Processor,
    pub capability: Capability,
    pub receipts: Receipts,
    pub telemetry: Telemetry,
    pub schema_registry: SchemaRegistry,
}

/// A Confluent-compatible schema registry (see [`super::schema_registry`]).
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct SchemaRegistry {
    /// Base URL of the registry's Confluent API (`http://registry:8081`, or Apicurio's
    /// `http://registry:8080/apis/ccompat/v7`; plain HTTP). Set: `airlock topics create`
    /// registers Airlock's schemas there, and `airlock run` resolves their ids at start so that
    /// inputs in Confluent framing are read. Empty: no registry.
    pub url: String,
    /// How the processor writes the records other systems read (decisions, journal events,
    /// receipts): `single-object` (Avro single-object encoding, the default) or `confluent`
    /// (the registry's ids; needs `url`). The changelog and the dispatch topics stay
    /// single-object whatever this says: only Airlock reads them, and a restore or a connector
    /// worker must not depend on the registry being up.
    pub framing: OutputFraming,
}

/// How the processor frames the records other systems read (`schema_registry.framing`).
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
pub enum OutputFraming {
    /// Avro single-object encoding: readable with the schemas alone.
    #[default]
    #[serde(rename = "single-object")]
    SingleObject,
    /// The Confluent wire format with the registry's ids: readable by Confluent deserializers.
    #[serde(rename = "confluent")]
    Confluent,
}

impl OutputFraming {
    /// The name the configuration gives it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SingleObject => "single-object",
            Self::Confluent => "confluent",
        }
    }

    /// The codec's framing.
    pub fn framing(self) -> airlock_schemas::Framing {
        match self {
            Self::SingleObject => airlock_schemas::Framing::SingleObject,
            Self::Confluent => airlock_schemas::Framing::Confluent,
        }
    }
}

impl std::str::FromStr for OutputFraming {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "single-object" => Ok(Self::SingleObject),
            "confluent" => Ok(Self::Confluent),
            other => Err(format!("{other:?} is not single-object or confluent")),
        }
    }
}

/// Signed receipts of final outcomes and refusals (see `crate::receipt`).
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct Receipts {
    /// The Ed25519 key receipts are signed with (same formats as the capability key; `airlock
    /// keygen` writes one), distinct from the capability key: auditors hold its public half.
    /// Empty issues no receipts and leaves `<prefix>receipts` unused.
    pub signing_key_file: PathBuf,
}

/// The telemetry endpoint (`runtime::telemetry`): Prometheus metrics, health and readiness.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct Telemetry {
    /// `host:port` of the HTTP endpoint serving `/metrics`, `/healthz` and `/readyz`; empty
    /// serves nothing. Off by default so that several instances can share a host; deployments
    /// set it (9464 is the customary Prometheus exporter port).
    pub listen: String,
    /// `/healthz` fails once the batch loop (or a restore it runs) made no progress for this
    /// long: a wedged process, for the orchestrator to restart.
    pub stall_after_ms: u64,
    /// Base URL of an OTLP/HTTP collector (`http://collector:4318`; `/v1/traces` is appended)
    /// that receives the spans. Empty: the standard `OTEL_EXPORTER_OTLP_ENDPOINT` (or
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) if set, else spans are not exported; the trace
    /// context still flows through the records' headers either way.
    pub otlp_endpoint: String,
}

impl Default for Telemetry {
    fn default() -> Self {
        Telemetry {
            listen: String::new(),
            stall_after_ms: 60_000,
            otlp_endpoint: String::new(),
        }
    }
}

/// Signing of dispatch commands (see `crate::capability`).
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct Capability {
    /// The Ed25519 signing key (64 hex characters or 32 raw bytes; `airlock keygen` writes
    /// one). Empty leaves dispatch commands unsigned, and connector workers refuse them unless
    /// they are configured with `allow_unsigned = true`.
    pub signing_key_file: PathBuf,
    /// Per connector name, the verifying keys of its workers (each worker signs its outcomes
    /// with `capability.signing_key_file` of its own configuration). An outcome naming a
    /// connector listed here is taken only when it verifies under one of them, else
    /// dead-lettered as UNSIGNED or FORGED; a connector not listed has its outcomes taken
    /// unsigned (`airlock run` warns at start).
    pub worker_verifying_key_files: BTreeMap<String, Vec<PathBuf>>,
    /// Approvals and operator controls are signed by their person (`airlock approve` and
    /// `airlock settle` with `--signing-key`) under a key the policy entities register for
    /// them (attribute `verifying_keys` of the principal). A person with keys registered must
    /// always sign; with this on, a person without any is refused too (UNKNOWN_SIGNER), else
    /// their records are taken unsigned (`airlock run` warns at start).
    pub require_person_signatures: bool,
    /// The processors' verifying keys (the `.pub` files `airlock keygen` writes), for the
    /// commands that read the decisions topic (`airlock propose`, `approve`, `settle`): a
    /// fence marker there raises the fence only when it is signed under one of them, so that a
    /// marker forged by whoever can write the topic cannot hide the answers. Keep an old key
    /// listed until no marker it signed can still be read. Empty: every marker counts.
    pub verifying_key_files: Vec<PathBuf>,
}

impl Capability {
    /// The keys fence markers on Airlock's outputs must verify under, for a reader with this
    /// configuration (see `verifying_key_files`): none means every marker counts.
    pub fn processor_verifying_keys(
        &self,
    ) -> std::result::Result<Vec<crate::capability::VerifyingKey>, crate::capability::Error> {
        // Never derived from `signing_key_file`: a person's command has no business reading
        // the processor's secret, nor needs to.
        let mut keys = Vec::new();
        for file in &self.verifying_key_files {
            keys.push(crate::capability::load_verifying_key(file)?);
        }
        Ok(keys)
    }
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct Processor {
    /// This instance's name in logs and in the journal's `task` field; empty = hostname-pid.
    pub instance: String,
    /// The consumer group of the processor instances; empty = `<prefix>processor`.
    pub group_id: String,
    /// How long the group waits for a silent instance before handing its partitions over.
    pub session_timeout_ms: u64,
    /// The group's rebalance timeout: how long a rebalance waits for every member to rejoin
    /// (some brokers only drop a crashed member after this, not after its session timeout).
    pub max_poll_interval_ms: u64,
    /// Timers fired per task per batch, at most: bounds a batch after a long pause.
    pub timers_per_batch: usize,
    /// How often each task journals a CHECKPOINT with its projection hash (when it changed);
    /// a task that stops (graceful shutdown, revocation) journals the one it owes at once.
    pub checkpoint_interval_ms: u64,
    /// An idle task puts a barrier on its changelog partition this often, so rows a zombie
    /// (an earlier owner that has not heard of the takeover) writes there are found and
    /// overwritten with the owner's values within this interval, long before compaction may
    /// keep them (the changelog's `min.compaction.lag.ms`, one hour as `airlock topics create`
    /// sets it). At most 600000.
    pub changelog_sweep_ms: u64,
    /// Timers fire by each partition's record time (`runtime::clock`): a partition waiting for
    /// time (a timer due by the wall clock, a checkpoint owed) while an input topic is silent
    /// puts a barrier, a tick, on that input partition at most this often. Its timers fire up
    /// to about this much after their due time when inputs are idle. 50 to 60000.
    pub clock_tick_ms: u64,
    /// A claim fails when reading its changelog partition makes no progress for this long
    /// (the broker stopped answering, or the partition's end moved out of reach); the group
    /// then hands the partition on.
    pub claim_stall_timeout_ms: u64,
    /// How long a terminal intent's key stays bound after the tool's `retention_ms` purged its
    /// arguments, approvals and evidence: a closed-intent marker (binding, state, a commit's
    /// receipt) answers blind retries of the key (DUPLICATE, or closed) until then, and is then
    /// deleted (a changelog tombstone). Set it well past the longest time an agent may retry
    /// an old key. 0 deletes the whole record at retention.
    pub closed_intent_retention_ms: u64,
    /// Whose identifiers operation keys, run ids and proposal ids are: `global` (one namespace
    /// for every tenant: a tenant can take a key another will use) or `tenant` (each begins
    /// with its tenant's id and `/`, and a proposal outside its tenant's is refused). Set
    /// `tenant` wherever tenants do not trust each other; `airlock run` warns when the policy
    /// entities name several tenants under `global`.
    pub key_scope: crate::core::KeyScope,
    /// The producer's linger: a little batching of the outputs.
    pub linger_ms: u64,
    /// Threads that decide and seal a batch's partitions side by side, the polling one
    /// included; one partition is only ever on one thread, and no more threads run than
    /// partitions have records, nor more than one per `decide::MIN_RECORDS_PER_LANE` (64)
    /// records of the batch (a small batch is decided on the polling thread alone: a thread
    /// started for a few records costs more than it saves). 1 = everything on the polling
    /// thread. (The commits' fsyncs
    /// run on the sender thread, off these threads.)
    pub threads: usize,
}

impl Default for Processor {
    fn default() -> Self {
        Processor {
            instance: String::new(),
            group_id: String::new(),
            session_timeout_ms: 10_000,
            max_poll_interval_ms: 300_000,
            timers_per_batch: 1_000,
            checkpoint_interval_ms: 60_000,
            changelog_sweep_ms: 30_000,
            clock_tick_ms: 1_000,
            claim_stall_timeout_ms: 60_000,
            closed_intent_retention_ms: 30 * 24 * 3_600_000,
            key_scope: crate::core::KeyScope::Global,
            linger_ms: 2,
            threads: 4,
        }
    }
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct Kafka {
    /// Bootstrap servers, comma separated.
    pub brokers: String,
    /// Which broker this is, where brokers differ (`super::compat`): `kafka` or `tansu-0.6`.
    pub compatibility: super::compat::Broker,
    /// The largest record any Airlock client produces, in bytes (librdkafka's
    /// `message.max.bytes`, set explicitly on every client). An input whose payload exceeds it
    /// less [`RECORD_RESERVE_BYTES`] is dead-lettered (its copy cut to fit, with the original's
    /// size and SHA-256 in headers), and so is an input whose outputs would: no record is ever
    /// staged that the broker would refuse. Keep it at or below the brokers' `message.max.bytes`
    /// and every Airlock topic's `max.message.bytes` (Kafka's defaults: 1,048,588);
    /// `airlock run` checks the topics at start.
    pub max_message_bytes: usize,
    /// Passed through to librdkafka for every client (security.protocol, sasl.*, ssl.*, ...).
    pub properties: BTreeMap<String, String>,
}

/// What a record's key, headers and framing may take of `kafka.max_message_bytes`: the payload
/// limit is the rest. Keys are bounded identifiers (`core.max_identifier_bytes`, 512 by
/// default, a dead letter's key at most 1 KiB), headers a few hundred bytes plus a refusal
/// detail of at most 1 KiB.
pub const RECORD_RESERVE_BYTES: usize = 8 * 1_024;

impl Default for Kafka {
    fn default() -> Self {
        Kafka {
            brokers: "localhost:9092".to_owned(),
            compatibility: super::compat::Broker::Kafka,
            max_message_bytes: 1_000_000,
            properties: BTreeMap::new(),
        }
    }
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct Topics {
    /// Prepended to every topic name: `airlock.proposals`, `airlock.dispatch.ledger`, ...
    pub prefix: String,
    /// One partition count for every topic: they are co-partitioned by operation key.
    pub partitions: i32,
    pub replication_factor: i32,
}

impl Default for Topics {
    fn default() -> Self {
        Topics {
            prefix: "airlock.".to_owned(),
            partitions: 6,
            replication_factor: 1,
        }
    }
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct State {
    /// One RocksDB directory per partition task below this directory.
    pub dir: PathBuf,
    /// fsync each batch's WriteBatch before its outputs leave: survives power loss, not only
    /// process crashes. The fsync runs on the sender thread while the next batch is decided.
    pub sync: bool,
    /// MiB per second that each partition store's RocksDB flushes and compactions may write
    /// (its rate limiter); 0 = unlimited. For a disk the stores share with other work: bounds
    /// their background bandwidth at the cost of a slower catch-up. A limit below what the
    /// flushes and compactions write at the peak rate stalls the commits; check it with
    /// `airlock-bench-core --background-write-mib N`, which reports the stalls
    /// (processor/BENCHMARKS.md: no latency gain was measured from it on the dev machine).
    pub background_write_mib_per_s: u32,
    /// RocksDB tunes the limit to recent demand within `[limit / 20, limit]`.
    pub background_write_auto_tune: bool,
}

impl Default for State {
    fn default() -> Self {
        State {
            dir: PathBuf::from("./airlock-state"),
            sync: true,
            background_write_mib_per_s: 0,
            background_write_auto_tune: false,
        }
    }
}

impl State {
    /// The RocksDB settings of every partition store.
    pub fn rocks(&self) -> crate::store::RocksOptions {
        crate::store::RocksOptions {
            sync: self.sync,
            background_write_mib_per_s: self.background_write_mib_per_s,
            background_write_auto_tune: self.background_write_auto_tune,
        }
    }
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct Batch {
    /// Inputs per partition per batch (one RocksDB WriteBatch per partition); every owned
    /// partition's are decided side by side (`processor.threads`), their outputs flushed together.
    /// Only a backlog fills a batch (below saturation the idle gap or the flush interval closes
    /// it first), so this sets the cost per record of catching up: a seal, an fsync and an
    /// outbox row per partition and batch. 2000 rather than 500 gave duplicates ≈ +40% and
    /// fresh keys ≈ +8% in `airlock-bench-runtime` (`processor/BENCHMARKS.md`).
    pub max_records: usize,
    /// A batch closes after this long even if not full: bounds added latency. On a broker
    /// that holds every fetch for its whole wait, the processor's consumer fetches with a
    /// quarter of it as `fetch.wait.max.ms` (`Kafka::fetch_wait`).
    pub flush_interval_ms: u64,
    /// A batch also closes once no record arrived for this long: under light load a decision
    /// does not wait out the flush interval; under load the consumer's prefetched records
    /// keep coming and batches fill. At or above `flush_interval_ms` only size and interval
    /// close a batch.
    pub idle_ms: u64,
    /// Sealed batches whose records may still be on their way to the broker while the next
    /// batch is read and decided (0: wait for each batch's acknowledgements before reading
    /// on). Each holds its records in memory until the broker acknowledged them.
    pub max_in_flight: usize,
}

impl Batch {
    /// How long the next poll of a batch whose first record came at `first` may wait; `None`
    /// once the flush interval is over. A batch closes when full, at the flush interval, or
    /// when a poll this long returns nothing (`idle_ms`).
    pub fn poll_timeout(&self, first: Option<std::time::Instant>) -> Option<std::time::Duration> {
        let interval = std::time::Duration::from_millis(self.flush_interval_ms.max(1));
        match first {
            None => Some(interval),
            Some(t) => interval
                .checked_sub(t.elapsed())
                .map(|left| left.min(std::time::Duration::from_millis(self.idle_ms))),
        }
    }
}

impl Default for Batch {
    fn default() -> Self {
        Batch {
            max_records: 2000,
            flush_interval_ms: 20,
            idle_ms: 2,
            max_in_flight: 4,
        }
    }
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct Tools {
    pub registry: PathBuf,
    pub policies: PathBuf,
    pub entities: PathBuf,
}

impl Default for Tools {
    fn default() -> Self {
        Tools {
            registry: PathBuf::from("deploy/config/tools.toml"),
            policies: PathBuf::from("deploy/config/policies.cedar"),
            entities: PathBuf::from("deploy/config/entities.json"),
        }
    }
}

/// `<hostname>-<pid>` (`<fallback>-<pid>` without a hostname): the default name of a process
/// in logs, outputs and consumer-group membership.
pub fn host_and_pid(fallback: &str) -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| fallback.to_owned());
    format!("{host}-{}", std::process::id())
}

/// Reads and parses a TOML configuration file of any Airlock process.
pub fn read_toml<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.to_owned(),
        source,
    })?;
    parse_toml(&text, &path.display().to_string())
}

/// Parses TOML configuration text; `origin` names it in the error.
pub fn parse_toml<T: serde::de::DeserializeOwned>(text: &str, origin: &str) -> Result<T> {
    toml::from_str(text).map_err(|e| Error::Parse {
        path: origin.to_owned(),
        message: e.to_string(),
    })
}

/// `name=a.pub,b.pub;name=c.pub`: per connector, its workers' verifying key files.
fn worker_key_files(value: &str) -> std::result::Result<BTreeMap<String, Vec<PathBuf>>, String> {
    let mut out = BTreeMap::new();
    for entry in value.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let (name, files) = entry
            .split_once('=')
            .ok_or_else(|| format!("{entry:?} is not connector=file[,file]"))?;
        let files: Vec<PathBuf> = files
            .split(',')
            .map(str::trim)
            .filter(|f| !f.is_empty())
            .map(PathBuf::from)
            .collect();
        if name.trim().is_empty() || files.is_empty() {
            return Err(format!("{entry:?} names no connector or no file"));
        }
        out.insert(name.trim().to_owned(), files);
    }
    Ok(out)
}

/// Parses the value of environment override `name`; the error names the variable.
pub fn env_value<T: std::str::FromStr>(name: &'static str, value: String) -> Result<T>
where
    T::Err: std::fmt::Display,
{
    value.trim().parse().map_err(|e: T::Err| Error::Env {
        name,
        value,
        message: e.to_string(),
    })
}

/// Environment overrides read through `lookup` (the environment, or a map in tests), each
/// variable named once beside the field it sets.
struct Env<'a, F: Fn(&str) -> Option<String>>(&'a F);

impl<F: Fn(&str) -> Option<String>> Env<'_, F> {
    /// Sets `field` to the variable's value parsed as its type (surrounding whitespace
    /// ignored) when the variable is set; a value that does not parse is an error naming it.
    fn parse<T: std::str::FromStr>(&self, name: &'static str, field: &mut T) -> Result<()>
    where
        T::Err: std::fmt::Display,
    {
        if let Some(v) = (self.0)(name) {
            *field = env_value(name, v)?;
        }
        Ok(())
    }

    /// Sets `field` to the variable's value as given (names, addresses, paths) when it is set.
    fn take<T: From<String>>(&self, name: &str, field: &mut T) {
        if let Some(v) = (self.0)(name) {
            *field = T::from(v);
        }
    }
}

impl Kafka {
    /// Sets a consumer's `fetch.wait.max.ms` for a reader that batches over
    /// `flush_interval_ms`, where the broker needs it (`compat::Broker::fetch_wait_ms`) and
    /// `properties` does not name it.
    pub fn fetch_wait(&self, consumer: &mut rdkafka::ClientConfig, flush_interval_ms: u64) {
        if self.properties.contains_key("fetch.wait.max.ms") {
            return;
        }
        if let Some(ms) = self.compatibility.fetch_wait_ms(flush_interval_ms) {
            consumer.set("fetch.wait.max.ms", ms.to_string());
        }
    }

    /// The largest payload (a record's value) Airlock reads or writes: `max_message_bytes`
    /// less what keys and headers may take.
    pub fn max_payload_bytes(&self) -> usize {
        self.max_message_bytes.saturating_sub(RECORD_RESERVE_BYTES)
    }

    /// Refuses a pass-through property that Airlock sets itself: one that its safety argument
    /// or its co-partitioning depends on, or one that another field of the configuration owns.
    /// librdkafka would otherwise take whichever was set last, and that is Airlock's value, so a
    /// user's `acks=1` would be dropped without a word. `compression.type` and
    /// `message.timeout.ms` are defaults (`lz4`, 120 s) that the properties may change.
    pub fn validate(&self) -> Result<()> {
        if !(64 * 1_024..=1_000_000_000).contains(&self.max_message_bytes) {
            return Err(Error::Invalid {
                field: "kafka.max_message_bytes",
                message: format!(
                    "{} is out of range: between 65536 and 1000000000 (librdkafka's limit)",
                    self.max_message_bytes
                ),
            });
        }
        for name in self.properties.keys() {
            let owned = OWNED_PROPERTIES
                .iter()
                .find(|(names, _)| names.contains(&name.as_str()));
            if let Some((_, why)) = owned {
                return Err(Error::Invalid {
                    field: "kafka.properties",
                    message: format!("{name:?} is set by Airlock ({why}); remove it"),
                });
            }
        }
        Ok(())
    }

    /// `AIRLOCK_KAFKA_BROKERS`, `AIRLOCK_KAFKA_COMPATIBILITY` and `AIRLOCK_KAFKA_PROPERTIES`
    /// (`k=v,k=v`), for every Airlock
    /// process that talks to the cluster.
    pub fn apply_env(&mut self, lookup: &impl Fn(&str) -> Option<String>) -> Result<()> {
        let env = Env(lookup);
        env.take("AIRLOCK_KAFKA_BROKERS", &mut self.brokers);
        env.parse("AIRLOCK_KAFKA_COMPATIBILITY", &mut self.compatibility)?;
        env.parse(
            "AIRLOCK_KAFKA_MAX_MESSAGE_BYTES",
            &mut self.max_message_bytes,
        )?;
        if let Some(v) = lookup("AIRLOCK_KAFKA_PROPERTIES") {
            for pair in v.split(',').filter(|p| !p.trim().is_empty()) {
                let Some((k, val)) = pair.split_once('=') else {
                    return Err(Error::Env {
                        name: "AIRLOCK_KAFKA_PROPERTIES",
                        value: v.clone(),
                        message: format!("{pair:?} is not key=value"),
                    });
                };
                self.properties
                    .insert(k.trim().to_owned(), val.trim().to_owned());
            }
        }
        Ok(())
    }
}

/// The librdkafka properties Airlock sets on its clients, each group with the reason a user
/// cannot set it through `kafka.properties`.
const OWNED_PROPERTIES: &[(&[&str], &str)] = &[
    (
        &["bootstrap.servers", "metadata.broker.list"],
        "from kafka.brokers",
    ),
    (
        &["enable.idempotence", "acks", "request.required.acks"],
        "the outbox resends after a crash: an idempotent producer with acks=all",
    ),
    (
        &["message.max.bytes"],
        "from kafka.max_message_bytes, which also bounds what the processor stages",
    ),
    (
        &["partitioner"],
        "every topic is co-partitioned by operation key with murmur2_random",
    ),
    (
        &["linger.ms", "queue.buffering.max.ms"],
        "from processor.linger_ms; a connector's producer does not linger",
    ),
    (
        &["group.id", "client.id"],
        "from the group and instance settings",
    ),
    (
        &[
            "enable.auto.commit",
            "enable.auto.offset.store",
            "auto.offset.reset",
            "enable.partition.eof",
        ],
        "offsets live with the state and are committed by Airlock",
    ),
    (
        &["partition.assignment.strategy"],
        "the range assignor keeps one partition number of every input topic on one task",
    ),
    (
        &["session.timeout.ms", "max.poll.interval.ms"],
        "from session_timeout_ms and max_poll_interval_ms",
    ),
];

impl Topics {
    /// `AIRLOCK_TOPICS_PREFIX`, `_PARTITIONS` and `_REPLICATION_FACTOR`.
    pub fn apply_env(&mut self, lookup: &impl Fn(&str) -> Option<String>) -> Result<()> {
        let env = Env(lookup);
        env.take("AIRLOCK_TOPICS_PREFIX", &mut self.prefix);
        env.parse("AIRLOCK_TOPICS_PARTITIONS", &mut self.partitions)?;
        env.parse(
            "AIRLOCK_TOPICS_REPLICATION_FACTOR",
            &mut self.replication_factor,
        )?;
        Ok(())
    }
}

impl Config {
    /// Reads `path` (when given), then applies the environment overrides, then validates.
    pub fn load(path: Option<&Path>) -> Result<Config> {
        let mut config = match path {
            Some(path) => read_toml(path)?,
            None => Config::default(),
        };
        config.apply_env(|name| std::env::var(name).ok())?;
        config.validate()?;
        Ok(config)
    }

    pub fn parse(text: &str, origin: &str) -> Result<Config> {
        parse_toml(text, origin)
    }

    /// Applies overrides from `lookup` (the environment, or a map in tests).
    pub fn apply_env(&mut self, lookup: impl Fn(&str) -> Option<String>) -> Result<()> {
        self.kafka.apply_env(&lookup)?;
        self.topics.apply_env(&lookup)?;
        let env = Env(&lookup);
        env.take("AIRLOCK_STATE_DIR", &mut self.state.dir);
        env.parse("AIRLOCK_BATCH_MAX_RECORDS", &mut self.batch.max_records)?;
        env.parse(
            "AIRLOCK_BATCH_FLUSH_INTERVAL_MS",
            &mut self.batch.flush_interval_ms,
        )?;
        env.parse("AIRLOCK_BATCH_IDLE_MS", &mut self.batch.idle_ms)?;
        env.parse("AIRLOCK_BATCH_MAX_IN_FLIGHT", &mut self.batch.max_in_flight)?;
        env.take("AIRLOCK_REGISTRY", &mut self.tools.registry);
        env.take("AIRLOCK_POLICIES", &mut self.tools.policies);
        env.take("AIRLOCK_ENTITIES", &mut self.tools.entities);
        env.parse("AIRLOCK_STATE_SYNC", &mut self.state.sync)?;
        env.parse(
            "AIRLOCK_STATE_BACKGROUND_WRITE_MIB_PER_S",
            &mut self.state.background_write_mib_per_s,
        )?;
        env.parse(
            "AIRLOCK_STATE_BACKGROUND_WRITE_AUTO_TUNE",
            &mut self.state.background_write_auto_tune,
        )?;
        env.take("AIRLOCK_INSTANCE", &mut self.processor.instance);
        env.take("AIRLOCK_GROUP_ID", &mut self.processor.group_id);
        env.parse(
            "AIRLOCK_SESSION_TIMEOUT_MS",
            &mut self.processor.session_timeout_ms,
        )?;
        env.parse(
            "AIRLOCK_MAX_POLL_INTERVAL_MS",
            &mut self.processor.max_poll_interval_ms,
        )?;
        env.parse(
            "AIRLOCK_TIMERS_PER_BATCH",
            &mut self.processor.timers_per_batch,
        )?;
        env.parse(
            "AIRLOCK_CHECKPOINT_INTERVAL_MS",
            &mut self.processor.checkpoint_interval_ms,
        )?;
        env.parse(
            "AIRLOCK_CHANGELOG_SWEEP_MS",
            &mut self.processor.changelog_sweep_ms,
        )?;
        env.parse("AIRLOCK_CLOCK_TICK_MS", &mut self.processor.clock_tick_ms)?;
        env.parse(
            "AIRLOCK_CLAIM_STALL_TIMEOUT_MS",
            &mut self.processor.claim_stall_timeout_ms,
        )?;
        env.parse(
            "AIRLOCK_CLOSED_INTENT_RETENTION_MS",
            &mut self.processor.closed_intent_retention_ms,
        )?;
        env.parse("AIRLOCK_KEY_SCOPE", &mut self.processor.key_scope)?;
        env.parse("AIRLOCK_LINGER_MS", &mut self.processor.linger_ms)?;
        env.parse("AIRLOCK_THREADS", &mut self.processor.threads)?;
        env.take(
            "AIRLOCK_CAPABILITY_SIGNING_KEY_FILE",
            &mut self.capability.signing_key_file,
        );
        env.parse(
            "AIRLOCK_CAPABILITY_REQUIRE_PERSON_SIGNATURES",
            &mut self.capability.require_person_signatures,
        )?;
        if let Some(v) = (env.0)("AIRLOCK_CAPABILITY_VERIFYING_KEY_FILES") {
            self.capability.verifying_key_files = v
                .split(',')
                .map(str::trim)
                .filter(|f| !f.is_empty())
                .map(PathBuf::from)
                .collect();
        }
        if let Some(v) = (env.0)("AIRLOCK_CAPABILITY_WORKER_VERIFYING_KEY_FILES") {
            self.capability.worker_verifying_key_files =
                worker_key_files(&v).map_err(|message| Error::Env {
                    name: "AIRLOCK_CAPABILITY_WORKER_VERIFYING_KEY_FILES",
                    value: v.clone(),
                    message,
                })?;
        }
        env.take(
            "AIRLOCK_RECEIPTS_SIGNING_KEY_FILE",
            &mut self.receipts.signing_key_file,
        );
        env.take("AIRLOCK_TELEMETRY_LISTEN", &mut self.telemetry.listen);
        env.parse(
            "AIRLOCK_TELEMETRY_STALL_AFTER_MS",
            &mut self.telemetry.stall_after_ms,
        )?;
        env.take(
            "AIRLOCK_TELEMETRY_OTLP_ENDPOINT",
            &mut self.telemetry.otlp_endpoint,
        );
        env.take("AIRLOCK_SCHEMA_REGISTRY_URL", &mut self.schema_registry.url);
        env.parse(
            "AIRLOCK_SCHEMA_REGISTRY_FRAMING",
            &mut self.schema_registry.framing,
        )?;
        Ok(())
    }

    pub fn validate(&self) -> Result<()> {
        let invalid = |field, message: &str| {
            Err(Error::Invalid {
                field,
                message: message.to_owned(),
            })
        };
        if self.kafka.brokers.trim().is_empty() {
            return invalid("kafka.brokers", "must name at least one broker");
        }
        self.kafka.validate()?;
        if !(1..=10_000).contains(&self.topics.partitions) {
            return invalid("topics.partitions", "must be between 1 and 10000");
        }
        if self.topics.replication_factor < 1 {
            return invalid("topics.replication_factor", "must be at least 1");
        }
        let legal = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
        if !self.topics.prefix.chars().all(legal) {
            return invalid(
                "topics.prefix",
                "may only hold ASCII letters, digits, '.', '_' and '-' (Kafka topic names)",
            );
        }
        if self.state.background_write_auto_tune && self.state.background_write_mib_per_s == 0 {
            return invalid(
                "state.background_write_auto_tune",
                "needs state.background_write_mib_per_s above 0: the limit it tunes below",
            );
        }
        if self.batch.max_records == 0 {
            return invalid("batch.max_records", "must be at least 1");
        }
        if self.processor.threads == 0 {
            return invalid("processor.threads", "must be at least 1");
        }
        if self.processor.timers_per_batch == 0 {
            return invalid("processor.timers_per_batch", "must be at least 1");
        }
        if !(100..=600_000).contains(&self.processor.changelog_sweep_ms) {
            return invalid(
                "processor.changelog_sweep_ms",
                "must be between 100 and 600000 (well under the changelog's \
                 min.compaction.lag.ms of one hour)",
            );
        }
        if !(50..=60_000).contains(&self.processor.clock_tick_ms) {
            return invalid("processor.clock_tick_ms", "must be between 50 and 60000");
        }
        if self.processor.claim_stall_timeout_ms < 1_000 {
            return invalid("processor.claim_stall_timeout_ms", "must be at least 1000");
        }
        if self.processor.session_timeout_ms < 1_000 {
            return invalid("processor.session_timeout_ms", "must be at least 1000");
        }
        if self.processor.max_poll_interval_ms < self.processor.session_timeout_ms {
            return invalid(
                "processor.max_poll_interval_ms",
                "must be at least processor.session_timeout_ms",
            );
        }
        if self.telemetry.stall_after_ms < self.batch.flush_interval_ms.max(1_000) {
            return invalid(
                "telemetry.stall_after_ms",
                "must be at least 1000 and at least batch.flush_interval_ms",
            );
        }
        let url = self.schema_registry.url.trim();
        if !url.is_empty() && !url.starts_with("http://") {
            return invalid(
                "schema_registry.url",
                "must be an http:// URL (the registry's Confluent API; HTTPS is not supported)",
            );
        }
        if url.is_empty() && self.schema_registry.framing == OutputFraming::Confluent {
            return invalid(
                "schema_registry.framing",
                "confluent needs schema_registry.url (the ids come from the registry)",
            );
        }
        Ok(())
    }

    /// The instance name: configured, or `<hostname>-<pid>`.
    pub fn instance(&self) -> String {
        if !self.processor.instance.is_empty() {
            return self.processor.instance.clone();
        }
        host_and_pid("airlock")
    }

    /// The processor's consumer group: configured, or `<prefix>processor`.
    pub fn group_id(&self) -> String {
        if self.processor.group_id.is_empty() {
            format!("{}processor", self.topics.prefix)
        } else {
            self.processor.group_id.clone()
        }
    }

    /// librdkafka settings shared by every client: brokers, then the pass-through properties.
    pub fn client_config(&self) -> rdkafka::ClientConfig {
        let mut c = rdkafka::ClientConfig::new();
        c.set("bootstrap.servers", &self.kafka.brokers);
        c.set(
            "message.max.bytes",
            self.kafka.max_message_bytes.to_string(),
        );
        for (k, v) in &self.kafka.properties {
            c.set(k, v);
        }
        c
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn defaults_then_file_then_environment() -> Result<()> {
        let mut config = Config::parse(
            r#"
[kafka]
brokers = "k1:9092,k2:9092"
properties = { "security.protocol" = "sasl_ssl", "sasl.mechanism" = "SCRAM-SHA-512" }
[topics]
partitions = 12
"#,
            "test.toml",
        )?;
        assert_eq!(config.topics.prefix, "airlock.");
        assert_eq!(config.batch.flush_interval_ms, 20);
        let env = BTreeMap::from([
            ("AIRLOCK_TOPICS_PARTITIONS", "24"),
            ("AIRLOCK_KAFKA_PROPERTIES", "ssl.ca.location=/etc/ca.pem"),
        ]);
        config.apply_env(|name| env.get(name).map(|v| (*v).to_owned()))?;
        config.validate()?;
        assert_eq!(config.topics.partitions, 24);
        assert_eq!(config.kafka.properties.len(), 3);
        let client = config.client_config();
        assert_eq!(client.get("sasl.mechanism"), Some("SCRAM-SHA-512"));
        assert_eq!(client.get("bootstrap.servers"), Some("k1:9092,k2:9092"));
        Ok(())
    }

    #[test]
    fn the_reference_file_spells_out_the_defaults() -> Result<()> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/config/airlock.toml");
        let text = std::fs::read_to_string(&path).map_err(|source| Error::Read {
            path: path.clone(),
            source,
        })?;
        assert_eq!(Config::parse(&text, "airlock.toml")?, Config::default());
        Ok(())
    }

    #[test]
    fn confluent_framing_needs_a_registry() -> Result<()> {
        let framed = "[schema_registry]\nframing = \"confluent\"\n";
        let err = Config::parse(framed, "a.toml")?.validate().unwrap_err();
        assert!(err.to_string().contains("schema_registry.framing"), "{err}");
        let with_url = format!(
            "[schema_registry]\nurl = \"http://r:8081\"\n{}",
            &framed[18..]
        );
        let config = Config::parse(&with_url, "a.toml")?;
        config.validate()?;
        assert_eq!(config.schema_registry.framing, OutputFraming::Confluent);
        let odd = Config::parse("[schema_registry]\nframing = \"avro\"\n", "a.toml").unwrap_err();
        assert!(odd.to_string().contains("framing"), "{odd}");
        Ok(())
    }

    #[test]
    fn mistakes_are_named() {
        let unknown = Config::parse("[topics]\npartition = 3\n", "a.toml").unwrap_err();
        assert!(unknown.to_string().contains("partition"), "{unknown}");
        let mut config = Config::default();
        let err = config
            .apply_env(|n| (n == "AIRLOCK_TOPICS_PARTITIONS").then(|| "many".to_owned()))
            .unwrap_err();
        assert!(
            err.to_string().contains("AIRLOCK_TOPICS_PARTITIONS"),
            "{err}"
        );
        let mut owned = Config::default();
        owned
            .apply_env(|n| {
                (n == "AIRLOCK_KAFKA_PROPERTIES")
                    .then(|| "compression.type=zstd, acks = 1".to_owned())
            })
            .unwrap();
        let err = owned.validate().unwrap_err().to_string();
        assert!(
            err.contains("kafka.properties")
                && err.contains("\"acks\"")
                && err.contains("acks=all"),
            "{err}"
        );
        owned.kafka.properties.remove("acks");
        owned.validate().unwrap();
        let mut tuned = Config::default();
        tuned
            .apply_env(|n| (n == "AIRLOCK_STATE_BACKGROUND_WRITE_AUTO_TUNE").then(|| "true".into()))
            .unwrap();
        let err = tuned.validate().unwrap_err().to_string();
        assert!(err.contains("state.background_write_mib_per_s"), "{err}");
        tuned
            .apply_env(|n| {
                (n == "AIRLOCK_STATE_BACKGROUND_WRITE_MIB_PER_S").then(|| "16".to_owned())
            })
            .unwrap();
        tuned.validate().unwrap();
        assert_eq!(tuned.state.rocks().background_write_mib_per_s, 16);
        let mut sweep = Config::default();
        sweep.processor.changelog_sweep_ms = 3_600_000;
        let err = sweep.validate().unwrap_err().to_string();
        assert!(err.contains("processor.changelog_sweep_ms"), "{err}");
        config.topics.prefix = "air lock".to_owned();
        assert!(
            config
                .validate()
                .unwrap_err()
                .to_string()
                .contains("topics.prefix")
        );
    }

    #[test]
    fn every_variable_in_the_table_overrides_a_field_and_no_other_is_read() {
        use std::cell::RefCell;
        use std::collections::BTreeSet;
        let documented: BTreeSet<String> = include_str!("config.rs")
            .lines()
            .take_while(|line| line.starts_with("//!"))
            .filter(|line| line.starts_with("//! | `"))
            .flat_map(|line| line.split('`').filter(|w| w.starts_with("AIRLOCK_")))
            .map(str::to_owned)
            .collect();
        assert!(documented.len() > 30, "{documented:?}");
        let asked = RefCell::new(BTreeSet::new());
        Config::default()
            .apply_env(|name| {
                asked.borrow_mut().insert(name.to_owned());
                None
            })
            .unwrap();
        let asked = asked.into_inner();
        let unread: Vec<_> = documented.difference(&asked).collect();
        let undocumented: Vec<_> = asked.difference(&documented).collect();
        assert!(unread.is_empty(), "documented, never read: {unread:?}");
        assert!(
            undocumented.is_empty(),
            "read, not in the table: {undocumented:?}"
        );
        for name in &documented {
            // A value each kind of field takes and that differs from its default.
            let changes = [
                "7",
                "false",
                "true",
                "k=v",
                "tansu-0.6",
                "confluent",
                "tenant",
            ]
            .iter()
            .any(|value| {
                let mut config = Config::default();
                let applied = config.apply_env(|n| (n == name).then(|| (*value).to_owned()));
                applied.is_ok() && config != Config::default()
            });
            assert!(changes, "{name} sets no field");
        }
    }

    #[test]
    fn a_batch_closes_at_its_interval_or_when_idle() {
        use std::time::{Duration, Instant};
        let batch = Batch {
            flush_interval_ms: 20,
            idle_ms: 2,
            ..Batch::default()
        };
        assert_eq!(batch.poll_timeout(None), Some(Duration::from_millis(20)));
        assert_eq!(
            batch.poll_timeout(Some(Instant::now())),
            Some(Duration::from_millis(2))
        );
        let late = Instant::now() - Duration::from_millis(30);
        assert_eq!(batch.poll_timeout(Some(late)), None);
        // An idle time at or above the interval leaves only size and interval.
        let no_idle = Batch {
            idle_ms: 20,
            ..batch
        };
        let left = no_idle.poll_timeout(Some(Instant::now())).unwrap();
        assert!(left > Duration::from_millis(2) && left <= Duration::from_millis(20));
    }
}
