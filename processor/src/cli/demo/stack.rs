//! The processes the demo runs against the broker: the processor (`airlock run`, this very
//! binary), the reference ledger and the ledger's connector workers, all child processes with
//! their logs in the work directory, stopped (workers first, then the ledger, then the
//! processor) when the stack is dropped.
//!
//! Children get the demo's environment, so `AIRLOCK_*` overrides reach them as they reach the
//! demo, plus what ties them together: the processor's state directory in the work directory;
//! the workers' brokers, topic prefix and partition count taken from the processor's
//! configuration, the ledger's address as their base URL, and a worker id and group of their
//! own.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;

use super::ledger::Ledger;
use super::process::{Proc, STOP_GRACE};
use crate::capability;
use crate::runtime::config::Config;

/// The binaries the demo starts.
#[derive(Clone, Debug)]
pub struct Binaries {
    pub airlock: PathBuf,
    pub ledger: PathBuf,
    pub connector: PathBuf,
}

/// A connector worker, known to the scenarios by its id.
#[derive(Debug)]
pub struct Worker {
    pub id: String,
    pub proc: Proc,
}

#[derive(Debug)]
pub struct Stack {
    pub bins: Binaries,
    /// Logs, the processor's state, the ledger's database.
    pub work: PathBuf,
    config: Config,
    config_file: Option<PathBuf>,
    /// The connector the registry names for the demo's tools.
    connector: String,
    connector_config: PathBuf,
    /// The log level children run at: at least `info`, the demo reads some of their lines.
    log_level: String,
    pub workers: Vec<Worker>,
    pub ledger: Option<Ledger>,
    pub processor: Option<Proc>,
    /// The workers' own key pair (signing, verifying), made in `work` on first use: workers
    /// sign their outcomes with it and the processor takes the connector's outcomes only
    /// signed with it.
    worker_keys: Option<(PathBuf, PathBuf)>,
    /// The approver's signing key and the policy entities that register it (a copy of the
    /// configured entities in the work directory): the demo's approvals are signed as a real
    /// approver's are, and the processor takes none unsigned from that approver.
    approver: Option<(capability::SigningKey, PathBuf)>,
}

/// The approver of the demo's approval scenario, whose key the demo registers.
pub const APPROVER: &str = "alice";

impl Stack {
    pub fn new(
        bins: Binaries,
        work: &Path,
        config: &Config,
        config_file: Option<&Path>,
        connector: &str,
        connector_config: &Path,
    ) -> Stack {
        let log_level = match std::env::var("AIRLOCK_LOG").as_deref() {
            Ok(level @ ("debug" | "trace")) => level.to_owned(),
            _ => "info".to_owned(),
        };
        Stack {
            bins,
            work: work.to_owned(),
            config: config.clone(),
            config_file: config_file.map(Path::to_owned),
            connector: connector.to_owned(),
            connector_config: connector_config.to_owned(),
            log_level,
            workers: Vec::new(),
            ledger: None,
            processor: None,
            worker_keys: None,
            approver: None,
        }
    }

    /// [`APPROVER`]'s signing key, registered (made on first use) in the demo's copy of the
    /// policy entities as their `verifying_keys`.
    pub fn approver_key(&mut self) -> anyhow::Result<capability::SigningKey> {
        Ok(self.approver()?.0)
    }

    fn approver(&mut self) -> anyhow::Result<(capability::SigningKey, PathBuf)> {
        if let Some(approver) = &self.approver {
            return Ok(approver.clone());
        }
        let key = capability::generate()?;
        let configured = &self.config.tools.entities;
        let text = std::fs::read_to_string(configured)
            .with_context(|| format!("reading the policy entities {}", configured.display()))?;
        let mut entities: Vec<serde_json::Value> = serde_json::from_str(&text)
            .with_context(|| format!("parsing the policy entities {}", configured.display()))?;
        let approver = entities
            .iter_mut()
            .find(|e| e["uid"]["id"] == APPROVER)
            .with_context(|| format!("{APPROVER} is not in {}", configured.display()))?;
        approver["attrs"][crate::core::policy::VERIFYING_KEYS_ATTR] =
            serde_json::json!([hex::encode(key.verifying_key().to_bytes())]);
        let file = self.work.join("entities.json");
        std::fs::write(&file, serde_json::to_string_pretty(&entities)?)
            .with_context(|| format!("writing {}", file.display()))?;
        Ok(self.approver.insert((key, file)).clone())
    }

    /// The workers' key pair (see `worker_keys`), made on first use.
    fn worker_keys(&mut self) -> anyhow::Result<(PathBuf, PathBuf)> {
        if let Some(keys) = &self.worker_keys {
            return Ok(keys.clone());
        }
        let keys = capability::write_key_pair(&capability::generate()?, &self.work.join("worker"))?;
        Ok(self.worker_keys.insert(keys).clone())
    }

    /// `airlock run` with the demo's configuration and a state directory of its own.
    pub fn start_processor(&mut self) -> anyhow::Result<&Proc> {
        let (_, verifying) = self.worker_keys()?;
        let (_, entities) = self.approver()?;
        let mut command = Command::new(&self.bins.airlock);
        command.arg("run");
        if let Some(file) = &self.config_file {
            command.arg("--config").arg(file);
        }
        command
            .env("AIRLOCK_STATE_DIR", self.work.join("processor-state"))
            .env("AIRLOCK_LOG", &self.log_level)
            .env("AIRLOCK_ENTITIES", entities)
            .env(
                "AIRLOCK_CAPABILITY_WORKER_VERIFYING_KEY_FILES",
                format!("{}={}", self.connector, verifying.display()),
            )
            .env(capability::ALLOW_DEMO_KEY_ENV, "1");
        if std::env::var_os("AIRLOCK_INSTANCE").is_none() {
            command.env("AIRLOCK_INSTANCE", "demo-processor");
        }
        let proc = Proc::spawn("the processor", command, &self.work.join("processor.log"))?;
        Ok(self.processor.insert(proc))
    }

    pub fn start_ledger(&mut self) -> anyhow::Result<&Ledger> {
        let ledger = Ledger::start(&self.bins.ledger, &self.work)?;
        Ok(self.ledger.insert(ledger))
    }

    pub fn ledger(&self) -> anyhow::Result<&Ledger> {
        self.ledger.as_ref().context("the ledger is not running")
    }

    pub fn ledger_mut(&mut self) -> anyhow::Result<&mut Ledger> {
        self.ledger.as_mut().context("the ledger is not running")
    }

    /// The connector worker's default consumer group (as `airlock-connector` derives it).
    pub fn default_group(&self) -> String {
        format!("{}connector.{}", self.config.topics.prefix, self.connector)
    }

    /// The group a replacement for a frozen worker joins: the workers' own, where the broker
    /// evicts a member that stops heartbeating; a fresh one named after `fresh` where it never
    /// does (`compat::Broker::evicts_silent_members`), as an operator would there.
    pub fn replacement_group(&self, fresh: &str) -> String {
        let group = self.default_group();
        if self.config.kafka.compatibility.evicts_silent_members() {
            group
        } else {
            format!("{group}.{fresh}")
        }
    }

    /// Starts connector worker `id` in consumer group `group` against the ledger.
    pub fn start_worker(&mut self, id: &str, group: &str) -> anyhow::Result<&Worker> {
        let (signing, _) = self.worker_keys()?;
        let ledger = self.ledger()?.url();
        let properties: Vec<String> = self
            .config
            .kafka
            .properties
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let mut command = Command::new(&self.bins.connector);
        command
            .arg("--config")
            .arg(&self.connector_config)
            .env("AIRLOCK_KAFKA_BROKERS", &self.config.kafka.brokers)
            .env("AIRLOCK_TOPICS_PREFIX", &self.config.topics.prefix)
            .env(
                "AIRLOCK_TOPICS_PARTITIONS",
                self.config.topics.partitions.to_string(),
            )
            .env(capability::ALLOW_DEMO_KEY_ENV, "1")
            .env("AIRLOCK_CONNECTOR_NAME", &self.connector)
            .env("AIRLOCK_CONNECTOR_BASE_URL", ledger)
            .env("AIRLOCK_CONNECTOR_WORKER_ID", id)
            .env("AIRLOCK_CONNECTOR_GROUP_ID", group)
            .env("AIRLOCK_CONNECTOR_SIGNING_KEY_FILE", &signing)
            .env("AIRLOCK_LOG", &self.log_level);
        if !properties.is_empty() {
            command.env("AIRLOCK_KAFKA_PROPERTIES", properties.join(","));
        }
        if std::env::var_os("AIRLOCK_CONNECTOR_SESSION_TIMEOUT_MS").is_none() {
            command.env("AIRLOCK_CONNECTOR_SESSION_TIMEOUT_MS", "6000");
        }
        let proc = Proc::spawn(
            &format!("worker {id}"),
            command,
            &self.work.join(format!("{id}.log")),
        )?;
        self.workers.push(Worker {
            id: id.to_owned(),
            proc,
        });
        Ok(self.workers.last().expect("just pushed"))
    }

    pub fn worker_mut(&mut self, id: &str) -> anyhow::Result<&mut Worker> {
        self.workers
            .iter_mut()
            .find(|w| w.id == id)
            .with_context(|| format!("no worker {id}"))
    }

    /// Stops worker `id` (SIGTERM: it finishes the command at hand and leaves its group).
    pub fn stop_worker(&mut self, id: &str) -> anyhow::Result<bool> {
        let i = self
            .workers
            .iter()
            .position(|w| w.id == id)
            .with_context(|| format!("no worker {id}"))?;
        let mut worker = self.workers.remove(i);
        let (_, by_itself) = worker.proc.stop(STOP_GRACE)?;
        Ok(by_itself)
    }

    /// Every log, for the report's "where to look".
    pub fn logs(&self) -> Vec<PathBuf> {
        let mut logs = Vec::new();
        logs.extend(self.processor.as_ref().map(|p| p.log.clone()));
        logs.extend(self.ledger.as_ref().map(|l| l.log().to_owned()));
        logs.extend(self.workers.iter().map(|w| w.proc.log.clone()));
        logs
    }

    /// The children that exited by themselves (crashed), with their status.
    pub fn casualties(&mut self) -> Vec<String> {
        let mut dead = Vec::new();
        for w in &mut self.workers {
            if let Ok(Some(status)) = w.proc.exited() {
                dead.push(format!("worker {} exited ({status})", w.id));
            }
        }
        if let Some(p) = &mut self.processor
            && let Ok(Some(status)) = p.exited()
        {
            dead.push(format!("the processor exited ({status})"));
        }
        dead
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // Workers first (they report to the processor), the processor last (it flushes).
        self.workers.clear();
        self.ledger = None;
        self.processor = None;
    }
}
