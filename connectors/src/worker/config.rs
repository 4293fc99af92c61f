//! A connector worker's configuration: one TOML file (`deploy/config/connector-ledger.toml` is
//! the worked example), every field with a default except the tools, and environment overrides
//! for what differs per deployment.
//!
//! | field | env override | default |
//! | --- | --- | --- |
//! | `kafka.brokers` | `AIRLOCK_KAFKA_BROKERS` | `localhost:9092` |
//! | `kafka.properties` (librdkafka properties; not those Airlock sets: see the processor's `Kafka::validate`) | `AIRLOCK_KAFKA_PROPERTIES` (`k=v,k=v`, added) | none |
//! | `topics.prefix` | `AIRLOCK_TOPICS_PREFIX` | `airlock.` |
//! | `topics.partitions` | `AIRLOCK_TOPICS_PARTITIONS` | `6` |
//! | `connector.name` | `AIRLOCK_CONNECTOR_NAME` | required: the registry's connector name |
//! | `connector.worker_id` | `AIRLOCK_CONNECTOR_WORKER_ID` | `<hostname>-<pid>` |
//! | `connector.group_id` | `AIRLOCK_CONNECTOR_GROUP_ID` | `<prefix>connector.<name>` |
//! | `connector.session_timeout_ms` | `AIRLOCK_CONNECTOR_SESSION_TIMEOUT_MS` | `10000` |
//! | `connector.max_poll_interval_ms` | `AIRLOCK_CONNECTOR_MAX_POLL_INTERVAL_MS` | `300000` |
//! | `connector.reserve_ms` | `AIRLOCK_CONNECTOR_RESERVE_MS` | `500` |
//! | `connector.reconcile_timeout_ms` | `AIRLOCK_CONNECTOR_RECONCILE_TIMEOUT_MS` | `10000` |
//! | `connector.max_evidence_bytes` | `AIRLOCK_CONNECTOR_MAX_EVIDENCE_BYTES` | `4096` |
//! | `connector.max_in_flight` (commands started and not yet reported: calls in flight at once, 1 to 1024) | `AIRLOCK_CONNECTOR_MAX_IN_FLIGHT` | `32` |
//! | `capability.verifying_key_files` | `AIRLOCK_CONNECTOR_VERIFYING_KEY_FILES` (comma separated) | none |
//! | `capability.allow_unsigned` | `AIRLOCK_CONNECTOR_ALLOW_UNSIGNED` | `false` |
//! | `capability.signing_key_file` (this connector's workers' own key: signs their outcomes) | `AIRLOCK_CONNECTOR_SIGNING_KEY_FILE` | empty: outcomes unsigned |
//! | `http.base_url` | `AIRLOCK_CONNECTOR_BASE_URL` | `http://127.0.0.1:8088` |
//! | `http.connect_timeout_ms` | `AIRLOCK_CONNECTOR_CONNECT_TIMEOUT_MS` | `2000` |
//! | `http.max_response_bytes` | `AIRLOCK_CONNECTOR_MAX_RESPONSE_BYTES` | `65536` |
//! | `telemetry.listen` | `AIRLOCK_CONNECTOR_TELEMETRY_LISTEN` | empty: no endpoint |
//! | `telemetry.stall_after_ms` | `AIRLOCK_CONNECTOR_TELEMETRY_STALL_AFTER_MS` | `60000` |
//! | `telemetry.otlp_endpoint` | `AIRLOCK_CONNECTOR_TELEMETRY_OTLP_ENDPOINT` | empty: `OTEL_EXPORTER_OTLP_ENDPOINT` if set, else no export |
//! | `[[tool]]` | none | required: see `crate::http::spec` |

use std::path::{Path, PathBuf};
use std::time::Duration;

use airlock_processor::capability::{self, VerifyingKey};
use airlock_processor::runtime::config::{self as shared, Kafka, Telemetry, Topics, env_value};
use serde::Deserialize;

use crate::http::spec::{self, ToolSpec};
use crate::http::{HttpConnector, client};

/// Errors of loading the configuration; each names the file, variable or field at fault.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{field}: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    #[error(transparent)]
    Shared(#[from] shared::Error),
    #[error(transparent)]
    Tool(#[from] spec::Error),
    #[error(transparent)]
    Key(#[from] capability::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub kafka: Kafka,
    pub topics: Topics,
    pub connector: Connector,
    pub capability: Capability,
    pub http: Http,
    /// The `/metrics`, `/healthz`, `/readyz` endpoint (`worker::telemetry`).
    pub telemetry: Telemetry,
    #[serde(rename = "tool")]
    pub tools: Vec<ToolSpec>,
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct Connector {
    /// The connector name tools name in the registry: the worker consumes
    /// `<prefix>dispatch.<name>` and executes only commands addressed to it.
    pub name: String,
    /// This worker in logs and in the outcomes' `worker_id`; empty = `<hostname>-<pid>`.
    pub worker_id: String,
    /// The workers' consumer group; empty = `<prefix>connector.<name>`.
    pub group_id: String,
    /// How long the group waits for a silent worker before handing its partitions over.
    pub session_timeout_ms: u64,
    /// How long a worker may stay out of `poll`: with every `max_in_flight` slot taken it
    /// waits for a call to end and its outcome to be acknowledged, so keep this above the
    /// largest attempt timeout cap of the tools plus a margin, or the group evicts busy
    /// workers.
    pub max_poll_interval_ms: u64,
    /// Kept free before a command's attempt deadline: the outcome must still reach the
    /// processor before it declares the attempt UNKNOWN.
    pub reserve_ms: u64,
    /// Bound on one reconciliation lookup.
    pub reconcile_timeout_ms: u64,
    /// Evidence (downstream answers, errors) is cut to this many bytes.
    pub max_evidence_bytes: usize,
    /// At most this many commands started and not yet reported: this many calls in flight
    /// downstream at once (those of one operation key one after the other), and commands
    /// read together share one acknowledgement wait and one offset commit. 1 handles one
    /// command at a time.
    pub max_in_flight: usize,
}

impl Default for Connector {
    fn default() -> Self {
        Connector {
            name: String::new(),
            worker_id: String::new(),
            group_id: String::new(),
            session_timeout_ms: 10_000,
            max_poll_interval_ms: 300_000,
            reserve_ms: 500,
            reconcile_timeout_ms: 10_000,
            max_evidence_bytes: 4_096,
            max_in_flight: 32,
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct Capability {
    /// The processor's verifying keys (hex or raw, see `airlock keygen`); several during a key
    /// rotation. A command must verify under one of them.
    pub verifying_key_files: Vec<PathBuf>,
    /// Executes commands without a capability (development only). Signed commands are still
    /// verified when keys are configured.
    pub allow_unsigned: bool,
    /// The workers' own Ed25519 key (`airlock keygen`; not the processor's): every outcome is
    /// signed with it (`airlock-capability` header), and processors that list its verifying
    /// key under `capability.worker_verifying_key_files.<connector>` take only outcomes that
    /// verify. Empty leaves outcomes unsigned.
    pub signing_key_file: PathBuf,
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct Http {
    /// Replaces `{base_url}` in the tools' URL templates.
    pub base_url: String,
    /// Bound on name resolution plus connect (within the attempt's own timeout).
    pub connect_timeout_ms: u64,
    /// Bytes of an answer's body read; the rest is left unread.
    pub max_response_bytes: usize,
}

impl Default for Http {
    fn default() -> Self {
        Http {
            base_url: "http://127.0.0.1:8088".to_owned(),
            connect_timeout_ms: 2_000,
            max_response_bytes: 65_536,
        }
    }
}

impl Config {
    /// Reads `path`, applies the environment overrides, validates.
    pub fn load(path: &Path) -> Result<Config> {
        let mut config: Config = shared::read_toml(path)?;
        config.apply_env(|name| std::env::var(name).ok())?;
        config.validate()?;
        Ok(config)
    }

    pub fn parse(text: &str, origin: &str) -> Result<Config> {
        Ok(shared::parse_toml(text, origin)?)
    }

    /// Applies overrides from `lookup` (the environment, or a map in tests).
    pub fn apply_env(&mut self, lookup: impl Fn(&str) -> Option<String>) -> Result<()> {
        self.kafka.apply_env(&lookup)?;
        self.topics.apply_env(&lookup)?;
        let c = &mut self.connector;
        if let Some(v) = lookup("AIRLOCK_CONNECTOR_NAME") {
            c.name = v;
        }
        if let Some(v) = lookup("AIRLOCK_CONNECTOR_WORKER_ID") {
            c.worker_id = v;
        }
        if let Some(v) = lookup("AIRLOCK_CONNECTOR_GROUP_ID") {
            c.group_id = v;
        }
        if let Some(v) = lookup("AIRLOCK_CONNECTOR_SESSION_TIMEOUT_MS") {
            c.session_timeout_ms = env_value("AIRLOCK_CONNECTOR_SESSION_TIMEOUT_MS", v)?;
        }
        if let Some(v) = lookup("AIRLOCK_CONNECTOR_MAX_POLL_INTERVAL_MS") {
            c.max_poll_interval_ms = env_value("AIRLOCK_CONNECTOR_MAX_POLL_INTERVAL_MS", v)?;
        }
        if let Some(v) = lookup("AIRLOCK_CONNECTOR_RESERVE_MS") {
            c.reserve_ms = env_value("AIRLOCK_CONNECTOR_RESERVE_MS", v)?;
        }
        if let Some(v) = lookup("AIRLOCK_CONNECTOR_RECONCILE_TIMEOUT_MS") {
            c.reconcile_timeout_ms = env_value("AIRLOCK_CONNECTOR_RECONCILE_TIMEOUT_MS", v)?;
        }
        if let Some(v) = lookup("AIRLOCK_CONNECTOR_MAX_EVIDENCE_BYTES") {
            c.max_evidence_bytes = env_value("AIRLOCK_CONNECTOR_MAX_EVIDENCE_BYTES", v)?;
        }
        if let Some(v) = lookup("AIRLOCK_CONNECTOR_MAX_IN_FLIGHT") {
            c.max_in_flight = env_value("AIRLOCK_CONNECTOR_MAX_IN_FLIGHT", v)?;
        }
        if let Some(v) = lookup("AIRLOCK_CONNECTOR_VERIFYING_KEY_FILES") {
            self.capability.verifying_key_files = v
                .split(',')
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(PathBuf::from)
                .collect();
        }
        if let Some(v) = lookup("AIRLOCK_CONNECTOR_ALLOW_UNSIGNED") {
            self.capability.allow_unsigned = env_value("AIRLOCK_CONNECTOR_ALLOW_UNSIGNED", v)?;
        }
        if let Some(v) = lookup("AIRLOCK_CONNECTOR_SIGNING_KEY_FILE") {
            self.capability.signing_key_file = PathBuf::from(v);
        }
        if let Some(v) = lookup("AIRLOCK_CONNECTOR_BASE_URL") {
            self.http.base_url = v;
        }
        if let Some(v) = lookup("AIRLOCK_CONNECTOR_CONNECT_TIMEOUT_MS") {
            self.http.connect_timeout_ms = env_value("AIRLOCK_CONNECTOR_CONNECT_TIMEOUT_MS", v)?;
        }
        if let Some(v) = lookup("AIRLOCK_CONNECTOR_MAX_RESPONSE_BYTES") {
            self.http.max_response_bytes = env_value("AIRLOCK_CONNECTOR_MAX_RESPONSE_BYTES", v)?;
        }
        if let Some(v) = lookup("AIRLOCK_CONNECTOR_TELEMETRY_LISTEN") {
            self.telemetry.listen = v;
        }
        if let Some(v) = lookup("AIRLOCK_CONNECTOR_TELEMETRY_STALL_AFTER_MS") {
            self.telemetry.stall_after_ms =
                env_value("AIRLOCK_CONNECTOR_TELEMETRY_STALL_AFTER_MS", v)?;
        }
        if let Some(v) = lookup("AIRLOCK_CONNECTOR_TELEMETRY_OTLP_ENDPOINT") {
            self.telemetry.otlp_endpoint = v;
        }
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
        let c = &self.connector;
        let legal = |ch: char| ch.is_ascii_alphanumeric() || matches!(ch, '.' | '_' | '-');
        if c.name.is_empty() || !c.name.chars().all(legal) {
            return invalid(
                "connector.name",
                "must be the registry's connector name (ASCII letters, digits, '.', '_', '-')",
            );
        }
        if c.session_timeout_ms < 1_000 {
            return invalid("connector.session_timeout_ms", "must be at least 1000");
        }
        if c.max_poll_interval_ms < c.session_timeout_ms {
            return invalid(
                "connector.max_poll_interval_ms",
                "must be at least connector.session_timeout_ms",
            );
        }
        if c.max_evidence_bytes < 64 {
            return invalid("connector.max_evidence_bytes", "must be at least 64");
        }
        if !(1..=1024).contains(&c.max_in_flight) {
            return invalid("connector.max_in_flight", "must be 1 to 1024");
        }
        if c.reconcile_timeout_ms == 0 {
            return invalid("connector.reconcile_timeout_ms", "must be more than 0");
        }
        if self.capability.verifying_key_files.is_empty() && !self.capability.allow_unsigned {
            return invalid(
                "capability.verifying_key_files",
                "is empty while allow_unsigned is false: every command would be refused (give \
                 the processor's verifying key, or allow unsigned commands for development)",
            );
        }
        client::target(&format!("{}/", self.http.base_url.trim_end_matches('/'))).map_err(
            |message| Error::Invalid {
                field: "http.base_url",
                message,
            },
        )?;
        if self.tools.is_empty() {
            return invalid("tool", "at least one [[tool]] must be described");
        }
        if self.telemetry.stall_after_ms < 1_000 {
            return invalid("telemetry.stall_after_ms", "must be at least 1000");
        }
        Ok(())
    }

    /// The worker id: configured, or `<hostname>-<pid>`.
    pub fn worker_id(&self) -> String {
        if !self.connector.worker_id.is_empty() {
            return self.connector.worker_id.clone();
        }
        shared::host_and_pid("connector")
    }

    /// The workers' consumer group: configured, or `<prefix>connector.<name>`.
    pub fn group_id(&self) -> String {
        if self.connector.group_id.is_empty() {
            format!("{}connector.{}", self.topics.prefix, self.connector.name)
        } else {
            self.connector.group_id.clone()
        }
    }

    /// The trusted verifying keys, read from their files.
    pub fn verifying_keys(&self) -> Result<Vec<VerifyingKey>> {
        self.capability
            .verifying_key_files
            .iter()
            .map(|p| {
                let key = capability::load_verifying_key(p)?;
                capability::refuse_demo_key(&key, &p.display().to_string()).map_err(|message| {
                    Error::Invalid {
                        field: "capability.verifying_key_files",
                        message,
                    }
                })?;
                Ok(key)
            })
            .collect()
    }

    /// The key this worker signs its outcomes with, if one is configured.
    pub fn signing_key(&self) -> Result<Option<capability::SigningKey>> {
        let file = &self.capability.signing_key_file;
        if file.as_os_str().is_empty() {
            return Ok(None);
        }
        Ok(Some(capability::load_signing_key(file)?))
    }

    /// The HTTP connector the tools describe (`{env:NAME}` resolved from the environment).
    pub fn http_connector(&self) -> Result<HttpConnector> {
        Ok(HttpConnector::new(
            &self.http.base_url,
            &self.tools,
            client::Limits {
                connect_timeout: Duration::from_millis(self.http.connect_timeout_ms),
                max_body: self.http.max_response_bytes,
            },
            self.connector.max_evidence_bytes,
            &|name| std::env::var(name).ok(),
        )?)
    }

    /// librdkafka settings shared by every client: brokers, then the pass-through properties.
    pub fn client_config(&self) -> rdkafka::ClientConfig {
        let mut c = rdkafka::ClientConfig::new();
        c.set("bootstrap.servers", &self.kafka.brokers);
        for (k, v) in &self.kafka.properties {
            c.set(k, v);
        }
        c
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn example() -> Config {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/config/connector-ledger.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        Config::parse(&text, "connector-ledger.toml").unwrap()
    }

    #[test]
    fn the_example_file_describes_the_ledger_tools() {
        let config = example();
        config.validate().unwrap();
        assert_eq!(config.connector.name, "ledger");
        assert!(!config.capability.allow_unsigned);
        let http = config.http_connector().unwrap();
        let tools: Vec<&str> = http.tools().collect();
        assert!(
            tools.contains(&"refund") && tools.contains(&"debit"),
            "{tools:?}"
        );
    }

    #[test]
    fn the_environment_overrides_the_file() {
        let mut config = example();
        let env = BTreeMap::from([
            ("AIRLOCK_CONNECTOR_BASE_URL", "http://127.0.0.1:9999"),
            ("AIRLOCK_CONNECTOR_VERIFYING_KEY_FILES", "a.pub, b.pub"),
            ("AIRLOCK_CONNECTOR_RESERVE_MS", "750"),
            ("AIRLOCK_TOPICS_PREFIX", "t."),
            ("AIRLOCK_CONNECTOR_TELEMETRY_LISTEN", "0.0.0.0:9465"),
        ]);
        config
            .apply_env(|n| env.get(n).map(|v| (*v).to_owned()))
            .unwrap();
        assert_eq!(config.http.base_url, "http://127.0.0.1:9999");
        assert_eq!(config.capability.verifying_key_files.len(), 2);
        assert_eq!(config.connector.reserve_ms, 750);
        assert_eq!(config.group_id(), "t.connector.ledger");
        assert_eq!(config.telemetry.listen, "0.0.0.0:9465");
    }

    #[test]
    fn a_worker_that_would_refuse_everything_does_not_start() {
        let mut config = example();
        config.capability.verifying_key_files.clear();
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("allow_unsigned"), "{err}");
        config.capability.allow_unsigned = true;
        config.validate().unwrap();
        config.http.base_url = "https://ledger".to_owned();
        assert!(config.validate().is_err());
    }

    #[test]
    fn the_public_demo_key_is_not_trusted_outside_a_demo() {
        if std::env::var(capability::ALLOW_DEMO_KEY_ENV).is_ok() {
            return; // run inside a demo: the key is allowed there
        }
        let mut config = example();
        config.capability.verifying_key_files = vec![
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/config/demo-capability.pub"),
        ];
        let err = config.verifying_keys().unwrap_err().to_string();
        assert!(err.contains("public demo key"), "{err}");
    }
}
