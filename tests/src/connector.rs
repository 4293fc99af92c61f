//! The connector side around a broker: the reference ledger (`airlock-ledger`) and connector
//! workers (`airlock-connector`) as child processes, a capability key pair, and a small HTTP
//! client for the ledger's API (faults, stats, lookups).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use airlock_connectors::http::client::{self, Limits, Outgoing};
use airlock_processor::capability::{self, SigningKey};
use anyhow::Context;
use hyper::Method;
use serde_json::{Value, json};

use crate::airlock::{Airlock, connector_binary, ledger_binary};

const TIMEOUT: Duration = Duration::from_secs(10);
const LIMITS: Limits = Limits {
    connect_timeout: Duration::from_secs(5),
    max_body: 1 << 20,
};

/// A capability key pair in a directory of its own.
#[derive(Debug)]
pub struct Keys {
    pub key: SigningKey,
    pub signing_file: PathBuf,
    pub verifying_file: PathBuf,
    _dir: tempfile::TempDir,
}

impl Keys {
    pub fn generate() -> anyhow::Result<Keys> {
        let dir = tempfile::tempdir()?;
        let key = capability::generate()?;
        let (signing_file, verifying_file) =
            capability::write_key_pair(&key, &dir.path().join("capability"))?;
        Ok(Keys {
            key,
            signing_file,
            verifying_file,
            _dir: dir,
        })
    }
}

/// The reference ledger as a child process, killed when dropped.
#[derive(Debug)]
pub struct Ledger {
    child: Child,
    /// `http://127.0.0.1:<port>`.
    pub base_url: String,
    _dir: tempfile::TempDir,
}

impl Ledger {
    /// Starts a ledger on a free port with the accounts `(tenant, account, currency, balance)`;
    /// its log goes to `log`.
    pub fn start(accounts: &[(&str, &str, &str, i64)], log: &Path) -> anyhow::Result<Ledger> {
        let dir = tempfile::tempdir()?;
        let seed: Vec<Value> = accounts
            .iter()
            .map(|(tenant, account, currency, balance)| {
                json!({"tenant_id": tenant, "account_id": account, "currency": currency,
                       "balance_minor": balance})
            })
            .collect();
        let accounts_file = dir.path().join("accounts.json");
        std::fs::write(&accounts_file, json!({ "accounts": seed }).to_string())?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?;
        let mut child = Command::new(ledger_binary()?)
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--db")
            .arg(dir.path().join("ledger.sqlite"))
            .arg("--accounts")
            .arg(&accounts_file)
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .context("starting airlock-ledger")?;
        let stdout = child.stdout.take().context("the ledger's stdout")?;
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .context("reading the ledger's address")?;
        let addr = line
            .trim()
            .strip_prefix("listening on ")
            .with_context(|| format!("the ledger printed {line:?}, not its address"))?
            .to_owned();
        Ok(Ledger {
            child,
            base_url: format!("http://{addr}"),
            _dir: dir,
        })
    }

    async fn request(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<(u16, Value)> {
        let request = Outgoing {
            method,
            url: format!("{}{path}", self.base_url),
            headers: Vec::new(),
            body: body.map(|b| b.to_string()),
        };
        let reply = client::send(&request, TIMEOUT, LIMITS)
            .await
            .with_context(|| format!("calling the ledger: {path}"))?;
        let value = serde_json::from_slice(&reply.body).unwrap_or(Value::Null);
        Ok((reply.status.as_u16(), value))
    }

    /// Arms `fault` (`drop-response`, `refuse`, ...) for the next request with `reference`.
    pub async fn arm(&self, fault: &str, reference: &str) -> anyhow::Result<()> {
        let rule = json!({"fault": fault, "match": {"reference": reference}, "times": 1});
        let (status, body) = self.request(Method::POST, "/v1/faults", Some(rule)).await?;
        anyhow::ensure!(status == 201, "arming {fault}: HTTP {status} {body}");
        Ok(())
    }

    /// Arms `fault` for every money request from now on (`delay=300`: a slow downstream).
    pub async fn arm_always(&self, fault: &str) -> anyhow::Result<()> {
        let rule = json!({"fault": fault, "times": 0});
        let (status, body) = self.request(Method::POST, "/v1/faults", Some(rule)).await?;
        anyhow::ensure!(status == 201, "arming {fault}: HTTP {status} {body}");
        Ok(())
    }

    /// Effects committed for business reference `reference`.
    pub async fn effects_for(&self, reference: &str) -> anyhow::Result<u64> {
        let path = format!(
            "/v1/stats?reference={}",
            airlock_connectors::http::template::percent_encode(reference)
        );
        let (status, body) = self.request(Method::GET, &path, None).await?;
        anyhow::ensure!(status == 200, "stats: HTTP {status} {body}");
        body["effects"]
            .as_u64()
            .with_context(|| format!("stats without effects: {body}"))
    }

    /// Every effect committed.
    pub async fn effects_total(&self) -> anyhow::Result<u64> {
        let (status, body) = self.request(Method::GET, "/v1/stats", None).await?;
        anyhow::ensure!(status == 200, "stats: HTTP {status} {body}");
        body["effects_total"]
            .as_u64()
            .with_context(|| format!("stats without effects_total: {body}"))
    }
}

impl Drop for Ledger {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A connector worker process, killed when dropped.
#[derive(Debug)]
pub struct Worker {
    child: Child,
}

impl Worker {
    /// SIGKILL, wherever the worker is (a crash mid-call), and reaps it.
    pub fn kill(mut self) -> anyhow::Result<()> {
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }

    /// True while the worker process has not exited.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Stops the worker with SIGTERM and waits for it (bounded); false if it had to be killed.
    pub fn stop(mut self) -> anyhow::Result<bool> {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status()?;
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while std::time::Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status.success());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(false)
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Airlock {
    /// An `airlock-connector` worker for the ledger (`deploy/config/connector-ledger.toml`)
    /// against `ledger`, trusting `verifying_keys`; its log goes to `log`.
    pub fn spawn_connector(
        &self,
        worker: &str,
        ledger: &Ledger,
        verifying_keys: &[&Path],
        log: &Path,
    ) -> anyhow::Result<Worker> {
        self.spawn_connector_in(worker, None, ledger, verifying_keys, log)
    }

    /// [`Airlock::spawn_connector`] in consumer group `group` (default: the configuration's).
    /// The worker rereads what it needs from the topics, whichever group it joins.
    pub fn spawn_connector_in(
        &self,
        worker: &str,
        group: Option<&str>,
        ledger: &Ledger,
        verifying_keys: &[&Path],
        log: &Path,
    ) -> anyhow::Result<Worker> {
        let config_file = airlock_processor::sample::config_dir().join("connector-ledger.toml");
        let keys: Vec<String> = verifying_keys
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?;
        let child = Command::new(connector_binary()?)
            .arg("--config")
            .arg(config_file)
            .env("AIRLOCK_KAFKA_BROKERS", &self.config.kafka.brokers)
            .env(
                "AIRLOCK_KAFKA_COMPATIBILITY",
                self.config.kafka.compatibility.to_string(),
            )
            .env("AIRLOCK_TOPICS_PREFIX", &self.config.topics.prefix)
            .env(
                "AIRLOCK_TOPICS_PARTITIONS",
                self.config.topics.partitions.to_string(),
            )
            .env("AIRLOCK_CONNECTOR_WORKER_ID", worker)
            .env("AIRLOCK_CONNECTOR_BASE_URL", &ledger.base_url)
            .env("AIRLOCK_CONNECTOR_VERIFYING_KEY_FILES", keys.join(","))
            .env(
                "AIRLOCK_CONNECTOR_SIGNING_KEY_FILE",
                self.worker_signing_key_file
                    .as_deref()
                    .unwrap_or(Path::new("")),
            )
            .env("AIRLOCK_CONNECTOR_SESSION_TIMEOUT_MS", "6000")
            .env("AIRLOCK_CONNECTOR_MAX_POLL_INTERVAL_MS", "30000")
            .env(
                "AIRLOCK_CONNECTOR_GROUP_ID",
                group.map_or(String::new(), |g| {
                    format!("{}{g}", self.config.topics.prefix)
                }),
            )
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .context("starting airlock-connector")?;
        Ok(Worker { child })
    }
}
