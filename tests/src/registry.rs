//! A Confluent-compatible schema registry per test: Apicurio Registry started as a local
//! process by `deploy/broker/registry/registry.sh` (installed into the cache on first use, a
//! Maven build of about 40 s; cached after), in a temporary directory of its own, killed when
//! dropped. The script also watches the test process (`--watch-pid`): a test killed before
//! dropping it leaves no registry behind.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;

use crate::broker::{PORT_TAKEN, pick_port_base};

/// The bound on a start: the first one installs the registry (a Maven build), then the JVM
/// starts (the script's own bound on that is 90 s).
const STARTUP: Duration = Duration::from_secs(300);

/// How many ports are tried when the chosen one is taken.
const PORT_ATTEMPTS: u32 = 5;

/// A running registry.
#[derive(Debug)]
pub struct Registry {
    dir: tempfile::TempDir,
    /// The base URL of its Confluent API (`http://127.0.0.1:PORT/apis/ccompat/v7`).
    pub url: String,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/broker/registry/registry.sh")
}

impl Registry {
    /// Starts a registry on a free local port and waits until its Confluent API answers.
    pub async fn start() -> anyhow::Result<Registry> {
        let mut attempt = 1;
        loop {
            // Built first: whatever way the start fails, dropping it kills what was launched.
            let mut registry = Registry {
                dir: tempfile::Builder::new()
                    .prefix("airlock-registry-")
                    .tempdir()?,
                url: String::new(),
            };
            let port = pick_port_base(1);
            let mut command = tokio::process::Command::new(script());
            command
                .arg("start")
                .arg(registry.dir.path())
                .args(["--port", &port.to_string()])
                .args(["--watch-pid", &std::process::id().to_string()])
                .stdin(std::process::Stdio::null())
                .kill_on_drop(true);
            let out = tokio::time::timeout(STARTUP, command.output())
                .await
                .with_context(|| format!("registry.sh did not start within {STARTUP:?}"))?
                .with_context(|| format!("running {}", script().display()))?;
            if out.status.success() {
                registry.url = String::from_utf8(out.stdout)?
                    .lines()
                    .last()
                    .unwrap_or_default()
                    .to_owned();
                anyhow::ensure!(
                    registry.url.starts_with("http://"),
                    "registry.sh printed no URL"
                );
                return Ok(registry);
            }
            let stderr = String::from_utf8_lossy(&out.stderr);
            if out.status.code() == Some(PORT_TAKEN) && attempt < PORT_ATTEMPTS {
                eprintln!("registry port {port} was taken; trying another");
                attempt += 1;
                continue;
            }
            anyhow::bail!("starting registry.sh failed ({}):\n{stderr}", out.status);
        }
    }

    /// The registry's log.
    pub fn log(&self) -> PathBuf {
        self.dir.path().join("registry.log")
    }
}

impl Drop for Registry {
    /// Kills the registry (its schemas live in its memory: nothing to shut down cleanly).
    fn drop(&mut self) {
        if let Ok(pid) = std::fs::read_to_string(self.dir.path().join("pid")) {
            let _ = std::process::Command::new("kill")
                .args(["-9", pid.trim()])
                .stderr(std::process::Stdio::null())
                .status();
        }
    }
}
