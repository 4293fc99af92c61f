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

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use airlock_tests::airlock::{Airlock, Options};
use airlock_tests::connector::{Keys, Ledger};

fn package(root: &Path) -> anyhow::Result<PathBuf> {
    let out = Command::new("bash")
        .arg(root.join("deploy/dev/typescript.sh"))
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "deploy/dev/typescript.sh failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(PathBuf::from(String::from_utf8(out.stdout)?.trim()))
}

/// `node --test` in `package`, its summary in TAP on every Node version (Node 23 and later
/// default to another format when not on a terminal), each test bounded, the whole run too.
fn node_test(package: &Path) -> Command {
    let mut command = Command::new("timeout");
    command.current_dir(package).args([
        "600",
        "node",
        "--test",
        "--test-reporter=tap",
        "--test-timeout=300000",
    ]);
    command
}

/// The counts node's test runner prints last (`# pass N`, `# fail N`, `# skipped N`).
fn count(stdout: &str, what: &str) -> Option<u64> {
    stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix(&format!("# {what} ")))
        .and_then(|n| n.trim().parse().ok())
}

/// Every test ran and passed: none failed, none skipped (a skipped live test did not run).
fn assert_all_passed(out: &Output, what: &str, logs: &Path) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let (pass, fail, skipped) = (
        count(&stdout, "pass"),
        count(&stdout, "fail"),
        count(&stdout, "skipped"),
    );
    assert!(
        out.status.success()
            && pass.is_some_and(|n| n > 0)
            && fail == Some(0)
            && skipped == Some(0),
        "{what} failed (pass {pass:?}, fail {fail:?}, skipped {skipped:?}; logs in {}):\n{stdout}\n{}",
        logs.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{what}: {} passed", pass.unwrap_or(0));
}

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
