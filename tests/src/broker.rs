//! The broker a test runs against, chosen by `AIRLOCK_TEST_BROKER`:
//!
//! | value | broker |
//! | --- | --- |
//! | `kafka` (default) | Apache Kafka 4.4 (KRaft), a process started per test by `deploy/broker/kafka/kafka.sh` |
//! | `tansu` | tansu 0.6 (memory storage), a process started per test by `deploy/broker/tansu/tansu.sh` |
//! | `external` | the broker(s) at `AIRLOCK_TEST_BROKERS` (`host:port,...`); nothing is started or stopped |
//! | `container` | the image `AIRLOCK_BROKER_IMAGE`, started per test by testcontainers (a Docker engine must answer) |
//!
//! Every provider is a real broker. A broker a test started is stopped when its [`Broker`] is
//! dropped (also when the test fails and unwinds); a process broker is also killed by the
//! script's watcher once the test process is gone (a test binary killed by a timeout leaves no
//! JVM behind). Every start is bounded.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use airlock_processor::runtime::compat;
use anyhow::Context;
use testcontainers::core::{ContainerPort, WaitFor};
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, GenericImage, ImageExt};

/// The bound on starting a broker: above the scripts' own bound (`KAFKA_START_SECONDS`, 90 s
/// for a whole start) plus a first fetch of the jars. A cold JVM on a busy two-core machine
/// starts in 5-15 s.
const STARTUP: Duration = Duration::from_secs(240);
/// How many ports a start tries before it gives up.
const PORT_ATTEMPTS: u32 = 5;
/// Exit status of the broker scripts when a port was taken.
pub(crate) const PORT_TAKEN: i32 = 75;

/// Which kind of broker the tests run against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Provider {
    Kafka,
    Tansu,
    External,
    Container,
}

impl Provider {
    /// `AIRLOCK_TEST_BROKER`, `kafka` when unset.
    pub fn from_env() -> anyhow::Result<Provider> {
        match std::env::var("AIRLOCK_TEST_BROKER").as_deref() {
            Err(_) | Ok("") | Ok("kafka") => Ok(Provider::Kafka),
            Ok("tansu") => Ok(Provider::Tansu),
            Ok("external") => Ok(Provider::External),
            Ok("container") => Ok(Provider::Container),
            Ok(other) => anyhow::bail!(
                "AIRLOCK_TEST_BROKER={other} is not a broker provider: use kafka, tansu, \
                 external or container"
            ),
        }
    }
}

/// How to start a broker beyond the provider's defaults.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Nodes of the cluster: 1, or 3 for replication (factor 3, `min.insync.replicas=2`).
    /// Only the `kafka` provider starts more than one.
    pub nodes: u32,
    /// Server properties added to every node (`kafka` only), e.g. the log cleaner's backoff.
    pub properties: Vec<(String, String)>,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            nodes: 1,
            properties: Vec::new(),
        }
    }
}

/// A running broker (or cluster), stopped when dropped if this test started it.
pub struct Broker {
    /// `host:port[,host:port...]`, for `bootstrap.servers`.
    pub bootstrap: String,
    pub provider: Provider,
    /// The broker's kind where brokers differ (`kafka.compatibility` of every Airlock process
    /// the tests start against it).
    pub compatibility: compat::Broker,
    handle: Handle,
}

enum Handle {
    Process(ProcessBroker),
    /// Held for its `Drop`, which removes the container.
    Container {
        _container: Box<ContainerAsync<GenericImage>>,
    },
    External,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field("bootstrap", &self.bootstrap)
            .field("provider", &self.provider)
            .finish_non_exhaustive()
    }
}

impl Broker {
    /// A fresh single-node broker of the configured provider.
    pub async fn start() -> anyhow::Result<Broker> {
        Broker::start_with(Settings::default()).await
    }

    /// A fresh broker of the configured provider, started with `settings`.
    pub async fn start_with(settings: Settings) -> anyhow::Result<Broker> {
        let provider = Provider::from_env()?;
        anyhow::ensure!(
            settings.nodes == 1 || provider == Provider::Kafka,
            "a {}-node cluster needs AIRLOCK_TEST_BROKER=kafka (it is {provider:?})",
            settings.nodes
        );
        let compatibility = match provider {
            Provider::Tansu => compat::Broker::Tansu06,
            Provider::Kafka => compat::Broker::Kafka,
            Provider::Container => {
                image_compatibility(&std::env::var("AIRLOCK_BROKER_IMAGE").unwrap_or_default())
            }
            Provider::External => match std::env::var("AIRLOCK_KAFKA_COMPATIBILITY") {
                Ok(v) => v
                    .parse()
                    .map_err(|e| anyhow::anyhow!("AIRLOCK_KAFKA_COMPATIBILITY: {e}"))?,
                Err(_) => compat::Broker::Kafka,
            },
        };
        let (bootstrap, handle) = match provider {
            Provider::Kafka => {
                let broker = ProcessBroker::start(Script::Kafka, &settings).await?;
                (broker.bootstrap.clone(), Handle::Process(broker))
            }
            Provider::Tansu => {
                let broker = ProcessBroker::start(Script::Tansu, &settings).await?;
                (broker.bootstrap.clone(), Handle::Process(broker))
            }
            Provider::External => {
                let brokers = std::env::var("AIRLOCK_TEST_BROKERS").context(
                    "AIRLOCK_TEST_BROKER=external needs AIRLOCK_TEST_BROKERS=host:port[,...]",
                )?;
                (brokers, Handle::External)
            }
            Provider::Container => {
                let image = std::env::var("AIRLOCK_BROKER_IMAGE").context(
                    "AIRLOCK_TEST_BROKER=container needs AIRLOCK_BROKER_IMAGE (name:tag)",
                )?;
                let (bootstrap, container) = start_image_named(&image).await?;
                (
                    bootstrap,
                    Handle::Container {
                        _container: Box::new(container),
                    },
                )
            }
        };
        Ok(Broker {
            bootstrap,
            provider,
            compatibility,
            handle,
        })
    }

    /// Apache Kafka (or tansu) in a container of `image`, started by testcontainers whatever
    /// `AIRLOCK_TEST_BROKER` says: for the tests of the container path itself.
    pub async fn start_container(image: &str) -> anyhow::Result<Broker> {
        let (bootstrap, container) = start_image_named(image).await?;
        Ok(Broker {
            bootstrap,
            provider: Provider::Container,
            compatibility: image_compatibility(image),
            handle: Handle::Container {
                _container: Box::new(container),
            },
        })
    }

    /// The nodes' processes, when this test started the broker as processes (`kafka`,
    /// `tansu`): for tests that kill and restart a node.
    pub fn processes(&self) -> Option<&ProcessBroker> {
        match &self.handle {
            Handle::Process(p) => Some(p),
            Handle::Container { .. } | Handle::External => None,
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Script {
    Kafka,
    Tansu,
}

impl Script {
    fn path(self) -> PathBuf {
        let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/broker");
        match self {
            Script::Kafka => deploy.join("kafka/kafka.sh"),
            Script::Tansu => deploy.join("tansu/tansu.sh"),
        }
    }
}

/// A broker started as local processes by one of `deploy/broker`'s scripts, in a temporary
/// directory of its own (data, logs, pids), killed and removed when dropped.
#[derive(Debug)]
pub struct ProcessBroker {
    script: Script,
    dir: tempfile::TempDir,
    /// `127.0.0.1:port,...`, one per node.
    pub bootstrap: String,
}

impl ProcessBroker {
    async fn start(script: Script, settings: &Settings) -> anyhow::Result<ProcessBroker> {
        let mut attempt = 1;
        loop {
            // Built first: whatever way the start fails, dropping it kills what was launched.
            let mut broker = ProcessBroker {
                script,
                dir: tempfile::Builder::new()
                    .prefix("airlock-broker-")
                    .tempdir()?,
                bootstrap: String::new(),
            };
            // Two ports a node (clients, controller quorum), consecutive from the base.
            let port = pick_port_base(2 * settings.nodes);
            let mut command = tokio::process::Command::new(script.path());
            command
                .arg("start")
                .arg(broker.dir.path())
                .args(["--port", &port.to_string()])
                .args(["--watch-pid", &std::process::id().to_string()])
                .stdin(std::process::Stdio::null())
                .kill_on_drop(true);
            if let Script::Kafka = script {
                command.args(["--nodes", &settings.nodes.to_string()]);
                for (k, v) in &settings.properties {
                    command.args(["--set", &format!("{k}={v}")]);
                }
            }
            let out = tokio::time::timeout(STARTUP, command.output())
                .await
                .with_context(|| format!("{} did not start within {STARTUP:?}", script.name()))?
                .with_context(|| format!("running {}", script.path().display()))?;
            if out.status.success() {
                broker.bootstrap = String::from_utf8(out.stdout)?
                    .lines()
                    .last()
                    .unwrap_or_default()
                    .to_owned();
                anyhow::ensure!(
                    !broker.bootstrap.is_empty(),
                    "{} printed no bootstrap address",
                    script.name()
                );
                return Ok(broker);
            }
            let stderr = String::from_utf8_lossy(&out.stderr);
            if out.status.code() == Some(PORT_TAKEN) && attempt < PORT_ATTEMPTS {
                eprintln!("broker ports from {port} were taken; trying others");
                attempt += 1;
                continue;
            }
            anyhow::bail!(
                "starting {} failed ({}):\n{stderr}",
                script.name(),
                out.status
            );
        }
    }

    /// SIGKILLs node `node` (1-based), as a crash would; waits until it is gone.
    pub async fn kill(&self, node: u32) -> anyhow::Result<()> {
        self.run(&["kill", &node.to_string()]).await
    }

    /// Starts node `node` again on its data and waits until it answers.
    pub async fn restart(&self, node: u32) -> anyhow::Result<()> {
        self.run(&["restart", &node.to_string()]).await
    }

    /// The directory of node `node`'s data, configuration and `broker.log`.
    pub fn node_dir(&self, node: u32) -> PathBuf {
        match self.script {
            Script::Kafka => self.dir.path().join(format!("node-{node}")),
            Script::Tansu => self.dir.path().to_owned(),
        }
    }

    async fn run(&self, args: &[&str]) -> anyhow::Result<()> {
        let (verb, rest) = args.split_first().context("a verb")?;
        let out = tokio::time::timeout(
            STARTUP,
            tokio::process::Command::new(self.script.path())
                .arg(verb)
                .arg(self.dir.path())
                .args(rest)
                .stdin(std::process::Stdio::null())
                .kill_on_drop(true)
                .output(),
        )
        .await
        .with_context(|| format!("{} {} timed out", self.script.name(), args.join(" ")))??;
        anyhow::ensure!(
            out.status.success(),
            "{} {} failed: {}",
            self.script.name(),
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    }
}

impl Script {
    fn name(self) -> &'static str {
        match self {
            Script::Kafka => "kafka.sh",
            Script::Tansu => "tansu.sh",
        }
    }
}

impl Drop for ProcessBroker {
    /// Kills every node at once (a test's broker holds nothing worth a clean shutdown); the
    /// temporary directory then goes with its data.
    fn drop(&mut self) {
        for pid_file in pid_files(self.dir.path()) {
            if let Ok(pid) = std::fs::read_to_string(&pid_file) {
                let _ = std::process::Command::new("kill")
                    .args(["-9", pid.trim()])
                    .stderr(std::process::Stdio::null())
                    .status();
            }
        }
    }
}

fn pid_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![dir.join("pid")];
    if let Ok(entries) = std::fs::read_dir(dir) {
        out.extend(entries.flatten().map(|e| e.path().join("pid")));
    }
    out.into_iter().filter(|p| p.is_file()).collect()
}

/// A base for `count` consecutive ports, below Linux's ephemeral range (32768 and up) so that
/// clients' outgoing connections never hold them; spread by time, pid and a counter so that
/// concurrent tests rarely collide (a collision is retried by the caller).
pub(crate) fn pick_port_base(count: u32) -> u16 {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    const LOW: u32 = 20_000;
    const HIGH: u32 = 32_000;
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let mix = nanos
        .wrapping_mul(2_654_435_761)
        .wrapping_add(std::process::id().wrapping_mul(40_503))
        .wrapping_add(COUNTER.fetch_add(1, Ordering::Relaxed).wrapping_mul(7_919));
    let span = (HIGH - LOW - count) / 8;
    u16::try_from(LOW + (mix % span) * 8).expect("below 32,000")
}

/// A container of `image` on a free host port mapped explicitly (the broker advertises it);
/// another port is tried when Docker finds it taken.
async fn start_image_named(image: &str) -> anyhow::Result<(String, ContainerAsync<GenericImage>)> {
    let (name, tag) = image.rsplit_once(':').unwrap_or((image, "latest"));
    let mut attempt = 1;
    loop {
        let port = free_port()?;
        match start_image(name, tag, port).await {
            Ok(container) => return Ok((format!("localhost:{port}"), container)),
            Err(e) if attempt < PORT_ATTEMPTS && port_taken(&e) => {
                eprintln!("broker port {port} was taken before Docker bound it; another");
                attempt += 1;
            }
            Err(e) => {
                return Err(anyhow::Error::new(e).context(format!(
                    "starting the broker image {image} (a Docker engine must answer: \
                     deploy/dev/docker-engine.sh; images: deploy/broker/*/build-image.sh)"
                )));
            }
        }
    }
}

/// An image whose name contains `kafka` is started as a single KRaft node (the apache/kafka
/// image's variables), any other as tansu.
async fn start_image(
    name: &str,
    tag: &str,
    port: u16,
) -> Result<ContainerAsync<GenericImage>, testcontainers::TestcontainersError> {
    if name.contains("kafka") {
        GenericImage::new(name, tag)
            .with_wait_for(WaitFor::message_on_stdout("Kafka Server started"))
            .with_mapped_port(port, ContainerPort::Tcp(9092))
            .with_env_var("KAFKA_NODE_ID", "1")
            .with_env_var("KAFKA_PROCESS_ROLES", "broker,controller")
            .with_env_var("KAFKA_LISTENERS", "PLAINTEXT://:9092,CONTROLLER://:9093")
            .with_env_var(
                "KAFKA_ADVERTISED_LISTENERS",
                format!("PLAINTEXT://localhost:{port}"),
            )
            .with_env_var("KAFKA_CONTROLLER_LISTENER_NAMES", "CONTROLLER")
            .with_env_var("KAFKA_CONTROLLER_QUORUM_VOTERS", "1@localhost:9093")
            .with_env_var("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "1")
            .with_env_var("KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "1")
            .with_env_var("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "1")
            .with_env_var("KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS", "0")
            .with_env_var("KAFKA_GROUP_MIN_SESSION_TIMEOUT_MS", "1000")
            .with_startup_timeout(STARTUP)
            .start()
            .await
    } else {
        GenericImage::new(name, tag)
            .with_wait_for(WaitFor::message_on_stdout("ready in"))
            .with_mapped_port(port, ContainerPort::Tcp(9092))
            .with_cmd([
                "broker".to_owned(),
                "--storage-engine".to_owned(),
                "memory://tansu/".to_owned(),
                "--listener-url".to_owned(),
                "tcp://0.0.0.0:9092".to_owned(),
                "--advertised-listener-url".to_owned(),
                format!("tcp://localhost:{port}"),
            ])
            .with_startup_timeout(STARTUP)
            .start()
            .await
    }
}

/// tansu for an image named after it, Kafka for any other.
fn image_compatibility(image: &str) -> compat::Broker {
    if image.contains("tansu") {
        compat::Broker::Tansu06
    } else {
        compat::Broker::Kafka
    }
}

/// True when Docker could not bind the chosen host port because something else holds it.
fn port_taken(e: &testcontainers::TestcontainersError) -> bool {
    let text = e.to_string();
    text.contains("port is already allocated") || text.contains("address already in use")
}

fn free_port() -> anyhow::Result<u16> {
    let listener =
        std::net::TcpListener::bind("127.0.0.1:0").context("finding a free local port")?;
    Ok(listener.local_addr()?.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A port something else holds makes the script answer "taken" (which `start` retries),
    /// not a generic failure; and a broker that did start is gone once dropped.
    #[tokio::test]
    async fn a_taken_port_is_told_apart_and_a_dropped_broker_is_gone() -> anyhow::Result<()> {
        let script = match Provider::from_env()? {
            Provider::Kafka => Script::Kafka,
            Provider::Tansu => Script::Tansu,
            // Not started here: nothing to check.
            Provider::External | Provider::Container => return Ok(()),
        };
        let held = std::net::TcpListener::bind("127.0.0.1:0")?;
        let port = held.local_addr()?.port();
        let dir = tempfile::tempdir()?;
        let out = tokio::process::Command::new(script.path())
            .arg("start")
            .arg(dir.path())
            .args(["--port", &port.to_string()])
            .output()
            .await?;
        assert_eq!(
            out.status.code(),
            Some(PORT_TAKEN),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );

        let broker = ProcessBroker::start(script, &Settings::default()).await?;
        let pid_file = pid_files(broker.dir.path()).pop().context("a pid file")?;
        let pid = std::fs::read_to_string(&pid_file)?.trim().to_owned();
        let proc_dir = PathBuf::from(format!("/proc/{pid}"));
        assert!(proc_dir.exists(), "the broker runs as pid {pid}");
        drop(broker);
        crate::eventually(
            "the dropped broker's process to end",
            Duration::from_secs(10),
            async || {
                // A killed child of the script lingers as a zombie until reaped: gone or a zombie.
                let state = std::fs::read_to_string(proc_dir.join("stat")).unwrap_or_default();
                Ok((state.is_empty() || state.contains(") Z ")).then_some(()))
            },
        )
        .await?;
        Ok(())
    }
}
