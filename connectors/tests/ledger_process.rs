//! The real `airlock-ledger` binary: the bound address on the first stdout line, start-up
//! faults and seed accounts from the command line, a crash between commit and answer that a
//! restart on the same database sees, and a clean stop on SIGTERM.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{ExitStatus, Stdio};

use common::{body, exchange, get, money, request_bytes, within};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const BIN: &str = env!("CARGO_BIN_EXE_airlock-ledger");

/// A running `airlock-ledger` and the address it printed.
struct Process {
    child: Child,
    addr: SocketAddr,
}

fn seed(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("accounts.toml");
    std::fs::write(
        &path,
        "[[accounts]]\ntenant_id = \"acme\"\naccount_id = \"acc_1\"\ncurrency = \"EUR\"\nbalance_minor = 10000\n",
    )
    .unwrap();
    path
}

async fn spawn(dir: &Path, extra: &[&str]) -> Process {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("ledger.log"))
        .unwrap();
    let mut child = Command::new(BIN)
        .arg("--listen")
        .arg("127.0.0.1:0")
        .arg("--db")
        .arg(dir.join("ledger.sqlite"))
        .arg("--accounts")
        .arg(seed(dir))
        .args(extra)
        .env_remove("AIRLOCK_LEDGER_FAULTS")
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log))
        .kill_on_drop(true)
        .spawn()
        .expect("spawn airlock-ledger");
    let stdout = child.stdout.take().unwrap();
    let mut first = String::new();
    within(
        "the listening line",
        BufReader::new(stdout).read_line(&mut first),
    )
    .await
    .unwrap();
    let addr = first
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("first stdout line is {first:?}"))
        .parse()
        .unwrap();
    Process { child, addr }
}

async fn exit_of(process: &mut Process) -> ExitStatus {
    within("the ledger to exit", process.child.wait())
        .await
        .unwrap()
}

#[tokio::test]
async fn crash_after_commit_survives_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut ledger = spawn(
        dir.path(),
        &[
            "--fault",
            "crash-after-commit@reference=txn_4821,kind=refund",
        ],
    )
    .await;
    let request = request_bytes(
        "POST",
        "/v1/refunds",
        &[("Idempotency-Key", "refund:txn_4821")],
        body("txn_4821", 1_250).to_string().as_bytes(),
    );
    let (received, _) = exchange(ledger.addr, &request).await;
    assert!(received.is_empty(), "the crash left no answer");
    let status = exit_of(&mut ledger).await;
    assert_eq!(status.code(), Some(70), "the injected crash exit code");

    let restarted = spawn(dir.path(), &[]).await;
    let lookup = get(restarted.addr, "/v1/effects/refund:txn_4821").await;
    assert_eq!(lookup.status, 200, "the commit outlived the crash");
    assert_eq!(lookup.json()["balance_after"], 11_250);
    let stats = get(restarted.addr, "/v1/stats").await.json();
    assert_eq!(stats["effects_total"], 1);
    assert_eq!(stats["by_reference"]["txn_4821"], 1);
    let retry = money(
        restarted.addr,
        "refund",
        "refund:txn_4821",
        &body("txn_4821", 1_250),
    )
    .await;
    assert_eq!(retry.status, 200, "the retry is a replay");
    assert_eq!(retry.json(), lookup.json());
    let account = get(restarted.addr, "/v1/accounts/acc_1").await.json();
    assert_eq!(
        account["balance_minor"], 11_250,
        "the seed did not reset the balance"
    );
}

#[tokio::test]
async fn start_up_faults_apply_to_matching_requests_only() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = spawn(
        dir.path(),
        &[
            "--fault",
            "refuse@reference=txn_9*2",
            "--fault",
            "error-after-commit@kind=debit",
        ],
    )
    .await;
    for key in ["a", "b"] {
        let reply = money(ledger.addr, "refund", key, &body("txn_9", 1)).await;
        assert_eq!(reply.error(), "injected_refusal");
    }
    assert_eq!(
        money(ledger.addr, "refund", "c", &body("txn_9", 1))
            .await
            .status,
        201
    );
    let debit = money(ledger.addr, "debit", "d", &body("txn_10", 1)).await;
    assert_eq!(debit.status, 500);
    assert_eq!(get(ledger.addr, "/v1/effects/d").await.status, 200);
}

#[tokio::test]
async fn sigterm_stops_the_ledger_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let mut ledger = spawn(dir.path(), &[]).await;
    assert_eq!(get(ledger.addr, "/healthz").await.status, 200);
    let pid = ledger.child.id().unwrap().to_string();
    let kill = within("kill", Command::new("kill").args(["-TERM", &pid]).status())
        .await
        .unwrap();
    assert!(kill.success());
    let status = exit_of(&mut ledger).await;
    assert!(status.success(), "{status}");
}

#[tokio::test]
async fn bad_command_lines_fail_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let output = within(
        "the ledger to refuse its command line",
        Command::new(BIN)
            .args(["--listen", "127.0.0.1:0", "--fault", "delay=soon", "--db"])
            .arg(dir.path().join("ledger.sqlite"))
            .output(),
    )
    .await
    .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("delay needs a whole number of milliseconds"),
        "{stderr}"
    );

    let bad_seed = dir.path().join("accounts.json");
    std::fs::write(&bad_seed, r#"[{"tenant_id":"acme"}]"#).unwrap();
    let output = within(
        "the ledger to refuse its seed file",
        Command::new(BIN)
            .args(["--listen", "127.0.0.1:0", "--accounts"])
            .arg(&bad_seed)
            .arg("--db")
            .arg(dir.path().join("ledger.sqlite"))
            .output(),
    )
    .await
    .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("accounts.json is not valid JSON"),
        "{stderr}"
    );
}
