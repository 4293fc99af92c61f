//! The integration-test harness: a real Kafka-protocol broker in a container, unique topic names
//! per test, and bounded waits.
//!
//! The broker image is `airlock/tansu:0.6.0`, built locally by `deploy/broker/build-image.sh`
//! (`.ci/run` builds it when missing). `AIRLOCK_BROKER_IMAGE` overrides it; an image whose name
//! contains `apache/kafka` is started in KRaft single-node mode instead of as tansu.
//!
//! Every wait in here is bounded: a test that hangs is a failure with a message, not a stuck CI.

pub mod airlock;
pub mod connector;
pub mod workload;

use std::net::TcpListener;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use testcontainers::core::{ContainerPort, WaitFor};
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, GenericImage, ImageExt};

/// The default broker image, built from the pinned tansu binary.
pub const DEFAULT_IMAGE: &str = "airlock/tansu:0.6.0";
const STARTUP: Duration = Duration::from_secs(60);

/// A running broker, stopped and removed when dropped.
pub struct Broker {
    _container: ContainerAsync<GenericImage>,
    /// `localhost:<port>`, for `bootstrap.servers`.
    pub bootstrap: String,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field("bootstrap", &self.bootstrap)
            .finish_non_exhaustive()
    }
}

impl Broker {
    /// Starts a fresh broker with in-memory storage on a free local port.
    pub async fn start() -> anyhow::Result<Broker> {
        let image = std::env::var("AIRLOCK_BROKER_IMAGE").unwrap_or_else(|_| DEFAULT_IMAGE.into());
        let (name, tag) = image.rsplit_once(':').unwrap_or((image.as_str(), "latest"));
        // The broker advertises the address clients must use, so the host port is chosen here
        // and mapped explicitly rather than left to Docker. Between choosing it and Docker
        // binding it another process (a client's outgoing connection, another test's broker)
        // may take it: then another port is tried.
        let mut attempt = 1;
        loop {
            let port = free_port()?;
            match Broker::start_on(name, tag, port).await {
                Ok(container) => {
                    return Ok(Broker {
                        _container: container,
                        bootstrap: format!("localhost:{port}"),
                    });
                }
                Err(e) if attempt < PORT_ATTEMPTS && port_taken(&e) => {
                    eprintln!("broker port {port} was taken before Docker bound it; another");
                    attempt += 1;
                }
                Err(e) => {
                    return Err(anyhow::Error::new(e).context(format!(
                        "starting the broker image {image} (build it with \
                         deploy/broker/build-image.sh, or set AIRLOCK_BROKER_IMAGE)"
                    )));
                }
            }
        }
    }

    async fn start_on(
        name: &str,
        tag: &str,
        port: u16,
    ) -> Result<ContainerAsync<GenericImage>, testcontainers::TestcontainersError> {
        if name.contains("apache/kafka") {
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
}

/// How many host ports a broker start tries before it gives up.
const PORT_ATTEMPTS: u32 = 5;

/// True when Docker could not bind the chosen host port because something else holds it.
fn port_taken(e: &testcontainers::TestcontainersError) -> bool {
    let text = e.to_string();
    text.contains("port is already allocated") || text.contains("address already in use")
}

fn free_port() -> anyhow::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("finding a free local port")?;
    Ok(listener.local_addr()?.port())
}

/// A topic prefix no other test (or earlier run against the same broker) uses.
pub fn unique_prefix(test: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("t-{test}-{nanos:x}-{n}.")
}

/// Polls `probe` until it yields `Some`, at most for `within`.
pub async fn eventually<T>(
    what: &str,
    within: Duration,
    mut probe: impl AsyncFnMut() -> anyhow::Result<Option<T>>,
) -> anyhow::Result<T> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(value) = probe().await? {
            return Ok(value);
        }
        if tokio::time::Instant::now() >= deadline {
            anyhow::bail!("timed out after {within:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Docker's refusal of a host port something else holds is told apart from other failures
    /// (which are not retried), against the real Docker daemon and broker image.
    #[tokio::test]
    async fn a_taken_host_port_is_recognised_as_such() -> anyhow::Result<()> {
        let image = std::env::var("AIRLOCK_BROKER_IMAGE").unwrap_or_else(|_| DEFAULT_IMAGE.into());
        let (name, tag) = image.rsplit_once(':').unwrap_or((image.as_str(), "latest"));
        let held = TcpListener::bind("0.0.0.0:0")?;
        let port = held.local_addr()?.port();
        let Err(e) = Broker::start_on(name, tag, port).await else {
            anyhow::bail!("the broker started on port {port}, which this test holds");
        };
        assert!(port_taken(&e), "{e}");
        let missing = Broker::start_on("airlock/no-such-image", "0", free_port()?)
            .await
            .err()
            .ok_or_else(|| anyhow::anyhow!("a missing image started"))?;
        assert!(!port_taken(&missing), "{missing}");
        Ok(())
    }
}
