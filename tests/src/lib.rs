//! The integration-test harness: a real Kafka-protocol broker per test ([`broker`]: Apache
//! Kafka as a process by default), unique topic names per test, and bounded waits.
//!
//! Every wait in here is bounded: a test that hangs is a failure with a message, not a stuck CI.

pub mod airlock;
pub mod broker;
pub mod connector;
pub mod registry;
pub mod typescript;
pub mod workload;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use broker::{Broker, Provider, Settings};

/// The wall clock in milliseconds since the Unix epoch, as records' times are written.
pub use airlock_processor::runtime::clock::wall_ms;

/// The interpreter with the Python client installed: `$AIRLOCK_PYTHON`, by default the virtual
/// environment `deploy/dev/python.sh` prepares (`$HOME/.cache/airlock/python`).
pub fn python() -> anyhow::Result<std::path::PathBuf> {
    let path = match std::env::var_os("AIRLOCK_PYTHON") {
        Some(p) => std::path::PathBuf::from(p),
        None => std::path::PathBuf::from(std::env::var("HOME")?)
            .join(".cache/airlock/python/bin/python"),
    };
    anyhow::ensure!(
        path.exists(),
        "no Python environment at {} (run deploy/dev/python.sh, or set AIRLOCK_PYTHON)",
        path.display()
    );
    Ok(path)
}

/// pytest over one folder of the Python client's tests (`clients/python/tests/<suite>`), quiet,
/// every outcome reported, its input closed and killed when dropped: add the environment the
/// suite reads, then run it with [`pytest_passes`].
pub fn pytest(suite: &str) -> anyhow::Result<tokio::process::Command> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut command = tokio::process::Command::new(python()?);
    command
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA"])
        .arg(root.join("clients/python/tests").join(suite))
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    Ok(command)
}

/// Runs `pytest` ([`pytest`]) for at most `within`; an error naming `what` with pytest's output
/// when a test failed or was skipped (a skipped live test proves nothing). Prints pytest's
/// summary line.
pub async fn pytest_passes(
    mut pytest: tokio::process::Command,
    within: Duration,
    what: &str,
) -> anyhow::Result<()> {
    let out = tokio::time::timeout(within, pytest.output())
        .await
        .map_err(|_| anyhow::anyhow!("{what} did not finish within {within:?}"))??;
    let stdout = String::from_utf8_lossy(&out.stdout);
    anyhow::ensure!(
        out.status.success() && !stdout.contains("skipped"),
        "{what} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{what}: {}", stdout.lines().last().unwrap_or_default());
    Ok(())
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
