//! The TypeScript client's tests (`clients/typescript`) run by the Rust tests: the package
//! prepared by `deploy/dev/typescript.sh` (dependencies cached under
//! `$HOME/.cache/airlock/typescript`, compiled by tsc), `node --test` on its compiled test
//! files, and the check that every test ran and passed. Node 20 or later must be installed.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Runs `deploy/dev/typescript.sh` of the repository at `root`: the package's directory.
pub fn package(root: &Path) -> anyhow::Result<PathBuf> {
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
pub fn node_test(package: &Path) -> Command {
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
pub fn count(stdout: &str, what: &str) -> Option<u64> {
    stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix(&format!("# {what} ")))
        .and_then(|n| n.trim().parse().ok())
}

/// Every test ran and passed: none failed, none skipped (a skipped live test did not run).
/// `logs`: where the harness's logs are, for the failure message.
pub fn assert_all_passed(out: &Output, what: &str, logs: &Path) {
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
