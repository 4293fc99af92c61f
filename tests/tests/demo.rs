//! `airlock demo` end to end against the test broker: it starts the processor, the ledger and
//! the connector workers itself, runs every seed scenario and exits 0 only when each ended as it
//! should (one business effect where one was meant, none elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::Command;

use airlock_tests::airlock::{airlock_binary, connector_binary, ledger_binary};
use airlock_tests::connector::Keys;
use airlock_tests::{Broker, unique_prefix};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_runs_every_seed_scenario_to_its_expected_end() -> anyhow::Result<()> {
    let broker = Broker::start().await?;
    let keys = Keys::generate()?;
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let work = tempfile::tempdir()?;
    let output = tokio::task::spawn_blocking({
        let bootstrap = broker.bootstrap.clone();
        let compatibility = broker.compatibility;
        let work = work.path().to_owned();
        move || {
            Command::new(airlock_binary()?)
                .arg("demo")
                .arg("--ledger-bin")
                .arg(ledger_binary()?)
                .arg("--connector-bin")
                .arg(connector_binary()?)
                .arg("--work-dir")
                .arg(&work)
                .args(["--wait-seconds", "120"])
                .current_dir(&root)
                .env("AIRLOCK_KAFKA_BROKERS", bootstrap)
                .env("AIRLOCK_KAFKA_COMPATIBILITY", compatibility.to_string())
                .env("AIRLOCK_TOPICS_PREFIX", unique_prefix("demo"))
                .env("AIRLOCK_TOPICS_PARTITIONS", "2")
                .env("AIRLOCK_SESSION_TIMEOUT_MS", "6000")
                .env("AIRLOCK_CAPABILITY_SIGNING_KEY_FILE", &keys.signing_file)
                .env(
                    "AIRLOCK_CONNECTOR_VERIFYING_KEY_FILES",
                    &keys.verifying_file,
                )
                .output()
                .map_err(anyhow::Error::from)
        }
    })
    .await??;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "airlock demo exited {}:\n{stdout}\n{stderr}",
        output.status
    );
    assert!(
        stdout.contains("8 of 8 scenarios as they should be"),
        "{stdout}"
    );
    assert!(!stdout.contains("FAIL"), "{stdout}");
    Ok(())
}
