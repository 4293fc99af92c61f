//! The TypeScript client (`clients/typescript`), its MCP gateway and its framework adapters
//! against a real broker, processor, connector worker and the reference ledger: its contract,
//! README, tool-layer and integration tests run with this test's brokers, topics and tool
//! registry, then the ledger is checked for one business effect per refund they saw committed
//! (and none other); last, its forged-marker test.
//!
//! The package is prepared by `deploy/dev/typescript.sh` (dependencies cached under
//! `$HOME/.cache/airlock/typescript`, compiled by tsc), which this test runs; Node 20 or later
//! must be installed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use airlock_tests::airlock::{Airlock, Options};
use airlock_tests::connector::{Keys, Ledger};
use airlock_tests::typescript::{assert_all_passed, node_test, package};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_typescript_client_proposes_waits_and_never_doubles_an_effect() -> anyhow::Result<()> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let package = package(&root)?;
    let keys = Keys::generate()?;
    let a = Airlock::start_with(
        "typescript",
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
    let out = node_test(&package)
        .args([
            "dist/test/contract.test.js",
            "dist/test/readme.test.js",
            "dist/test/tools.test.js",
            "dist/test/integration/live.test.js",
            "dist/test/integration/mcp.test.js",
            "dist/test/integration/adapters.test.js",
        ])
        .env("AIRLOCK_TEST_BROKERS", &a.config.kafka.brokers)
        .env("AIRLOCK_TEST_PREFIX", &a.config.topics.prefix)
        .env("AIRLOCK_TEST_REPORT", &report)
        .env("AIRLOCK_TEST_REGISTRY", &a.config.tools.registry)
        // The idle-session and lost-response tests arm ledger faults.
        .env("AIRLOCK_TEST_LEDGER", &ledger.base_url)
        .output()?;
    assert_all_passed(&out, "the TypeScript client's tests", dir.path());

    // Each refund the client saw COMMITTED is one business effect, however often it was sent.
    let committed = std::fs::read_to_string(&report)?;
    let committed: Vec<&str> = committed.lines().filter(|l| !l.is_empty()).collect();
    assert!(committed.len() >= 5, "{committed:?}");
    for key in &committed {
        assert_eq!(ledger.effects_for(key).await?, 1, "{key}");
    }
    let distinct: std::collections::BTreeSet<&str> = committed.iter().copied().collect();
    assert_eq!(distinct.len(), committed.len(), "each key reported once");
    assert_eq!(ledger.effects_total().await?, committed.len() as u64);

    // Last: a forged fence marker stays in the decisions topic for good.
    let out = node_test(&package)
        .arg("dist/test/forged/forged.test.js")
        .env("AIRLOCK_TEST_BROKERS", &a.config.kafka.brokers)
        .env("AIRLOCK_TEST_PREFIX", &a.config.topics.prefix)
        .env("AIRLOCK_TEST_VERIFYING_KEY", &keys.verifying_file)
        .output()?;
    assert_all_passed(
        &out,
        "the TypeScript client's forged-marker test",
        dir.path(),
    );
    let _ = processor.kill();
    assert!(worker.stop()?, "the worker stops cleanly");
    Ok(())
}
