//! The Python client (`clients/python`) and its MCP gateway against a real broker, processor,
//! connector worker and the reference ledger: their integration tests
//! (`clients/python/tests/integration`) run with this test's brokers, topics and tool registry,
//! then the ledger is checked for one business effect per refund they saw committed.
//!
//! The interpreter is `$AIRLOCK_PYTHON`, by default the virtual environment
//! `deploy/dev/python.sh` prepares (`$HOME/.cache/airlock/python`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use airlock_tests::airlock::{Airlock, Options};
use airlock_tests::connector::{Keys, Ledger};
use airlock_tests::{pytest, pytest_passes};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_client_proposes_waits_and_never_doubles_an_effect() -> anyhow::Result<()> {
    let keys = Keys::generate()?;
    let a = Airlock::start_with(
        "python",
        3,
        Options {
            signing_key_file: Some(keys.signing_file.clone()),
            // The reference 10 s attempt caps: a lost response is reconciled after its
            // attempt's deadline (the MCP lost-response tests wait for that).
            reference_attempt_timeouts: true,
            ..Options::default()
        },
    )
    .await?;
    let dir = tempfile::tempdir()?;
    let ledger = Ledger::start(
        &[("acme", "acct-42", "EUR", 1_000_000_000)],
        &dir.path().join("ledger.log"),
    )?;
    let worker = a.spawn_connector(
        "w1",
        &ledger,
        &[&keys.verifying_file],
        &dir.path().join("worker.log"),
    )?;
    let mut processor = a.spawn_process("p1", "group", &dir.path().join("run.log"))?;

    let report = dir.path().join("committed.txt");
    let mut tests = pytest("integration")?;
    tests
        .env("AIRLOCK_TEST_BROKERS", &a.config.kafka.brokers)
        .env("AIRLOCK_TEST_PREFIX", &a.config.topics.prefix)
        .env("AIRLOCK_TEST_REPORT", &report)
        .env("AIRLOCK_TEST_REGISTRY", &a.config.tools.registry)
        // The MCP lost-response test arms a ledger fault.
        .env("AIRLOCK_TEST_LEDGER", &ledger.base_url);
    let what = "the Python client's integration tests";
    if let Err(e) = pytest_passes(tests, Duration::from_secs(900), what).await {
        return Err(e.context(format!("logs in {}", dir.keep().display())));
    }

    // Each refund the client saw COMMITTED is one business effect, however often it was sent.
    let committed = std::fs::read_to_string(&report)?;
    let committed: Vec<&str> = committed.lines().filter(|l| !l.is_empty()).collect();
    assert!(committed.len() >= 10, "{committed:?}");
    for key in &committed {
        assert_eq!(ledger.effects_for(key).await?, 1, "{key}");
    }
    assert_eq!(ledger.effects_total().await?, committed.len() as u64);

    // Last: a forged fence marker stays in the decisions topic for good.
    let mut forged = pytest("forged")?;
    forged
        .env("AIRLOCK_TEST_BROKERS", &a.config.kafka.brokers)
        .env("AIRLOCK_TEST_PREFIX", &a.config.topics.prefix)
        .env("AIRLOCK_TEST_VERIFYING_KEY", &keys.verifying_file);
    let what = "the forged-marker test of the Python client";
    pytest_passes(forged, Duration::from_secs(300), what).await?;
    let _ = processor.kill();
    assert!(worker.stop()?, "the worker stops cleanly");
    Ok(())
}
