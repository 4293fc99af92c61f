//! The reference ledger (`airlock-ledger`) as the demo runs it: a child process on a free port
//! of 127.0.0.1 over a SQLite file in the work directory, restarted on the same database and
//! port after an injected crash, and the few calls of its HTTP API the demo needs: arm a fault
//! for one business reference (`POST /v1/faults`), count a reference's effects (`GET
//! /v1/stats?reference=`), read one effect (`GET /v1/effects/{idempotency key}`). See
//! connectors/README.md for the API.
//!
//! The processor crate cannot depend on the connectors crate (which depends on it), so the HTTP
//! client is a plain HTTP/1.1 exchange over a TCP stream: one request per connection.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::Context;
use serde_json::{Value, json};

use super::process::Proc;

/// Bound on one call of the ledger's API, and on its start.
const TIMEOUT: Duration = Duration::from_secs(10);

/// The account every demo refund is paid into.
pub const TENANT: &str = "acme";
pub const ACCOUNT: &str = "acct-42";

#[derive(Debug)]
pub struct Ledger {
    proc: Proc,
    /// `127.0.0.1:<port>`, the same across restarts (the connector worker keeps its base URL).
    pub addr: String,
    binary: PathBuf,
    db: PathBuf,
    accounts: PathBuf,
    /// How many times it was started again after exiting.
    pub restarts: u32,
}

impl Ledger {
    /// Starts a ledger with the demo's account on a free port; files go to `dir`.
    pub fn start(binary: &Path, dir: &Path) -> anyhow::Result<Ledger> {
        let accounts = dir.join("ledger-accounts.json");
        let seed = json!({"accounts": [{"tenant_id": TENANT, "account_id": ACCOUNT,
                          "currency": "EUR", "balance_minor": 100_000_000}]});
        std::fs::write(&accounts, seed.to_string())?;
        let db = dir.join("ledger.sqlite");
        let log = dir.join("ledger.log");
        let (proc, addr) = spawn(binary, "127.0.0.1:0", &db, &accounts, &log)?;
        Ok(Ledger {
            proc,
            addr,
            binary: binary.to_owned(),
            db,
            accounts,
            restarts: 0,
        })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn log(&self) -> &Path {
        &self.proc.log
    }

    /// Its exit status, when it has exited.
    pub fn exited(&mut self) -> anyhow::Result<Option<ExitStatus>> {
        self.proc.exited()
    }

    /// Starts it again on the same database and address. The old process must have exited.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.exited()?.is_some(),
            "the ledger is still running: not restarting it"
        );
        let (proc, addr) = spawn(
            &self.binary,
            &self.addr,
            &self.db,
            &self.accounts,
            &self.proc.log,
        )
        .with_context(|| format!("restarting the ledger on {}", self.addr))?;
        anyhow::ensure!(addr == self.addr, "the ledger came back on {addr}");
        // The exited process is reaped already; dropping it signals nothing.
        self.proc = proc;
        self.restarts += 1;
        Ok(())
    }

    /// Arms `fault` (`drop-response`, `crash-after-commit`, `delay=5000`, ...) for the next money
    /// request with business reference `reference` (the connector sends the operation key).
    pub fn arm(&self, fault: &str, reference: &str) -> anyhow::Result<()> {
        let rule = json!({"fault": fault, "match": {"reference": reference}, "times": 1});
        let (status, body) = self.call("POST", "/v1/faults", Some(&rule))?;
        anyhow::ensure!(status == 201, "arming {fault}: HTTP {status} {body}");
        Ok(())
    }

    /// Business effects committed under `reference`.
    pub fn effects_for(&self, reference: &str) -> anyhow::Result<u64> {
        let path = format!("/v1/stats?reference={}", percent_encode(reference));
        let (status, body) = self.call("GET", &path, None)?;
        anyhow::ensure!(status == 200, "stats of {reference}: HTTP {status} {body}");
        body["effects"]
            .as_u64()
            .with_context(|| format!("stats without effects: {body}"))
    }

    /// Every business effect committed.
    pub fn effects_total(&self) -> anyhow::Result<u64> {
        let (status, body) = self.call("GET", "/v1/stats", None)?;
        anyhow::ensure!(status == 200, "stats: HTTP {status} {body}");
        body["effects_total"]
            .as_u64()
            .with_context(|| format!("stats without effects_total: {body}"))
    }

    /// The effect committed under `idempotency_key`, or None (a 404 proves there is none).
    pub fn effect(&self, idempotency_key: &str) -> anyhow::Result<Option<Value>> {
        let path = format!("/v1/effects/{}", percent_encode(idempotency_key));
        match self.call("GET", &path, None)? {
            (200, body) => Ok(Some(body)),
            (404, _) => Ok(None),
            (status, body) => anyhow::bail!("effect {idempotency_key}: HTTP {status} {body}"),
        }
    }

    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> anyhow::Result<(u16, Value)> {
        exchange(
            &self.addr,
            method,
            path,
            body.map(Value::to_string).as_deref(),
        )
        .with_context(|| format!("calling the ledger: {method} {path}"))
    }
}

/// Starts `airlock-ledger` and reads its first stdout line, `listening on <addr>`; the rest of
/// its stdout and its stderr go to `log`.
fn spawn(
    binary: &Path,
    listen: &str,
    db: &Path,
    accounts: &Path,
    log: &Path,
) -> anyhow::Result<(Proc, String)> {
    let stderr = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    let mut child = Command::new(binary)
        .arg("--listen")
        .arg(listen)
        .arg("--db")
        .arg(db)
        .arg("--accounts")
        .arg(accounts)
        // A frozen worker's call is held open for minutes: do not wait for it when stopping.
        .args(["--shutdown-grace-ms", "1000"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(stderr))
        .spawn()
        .with_context(|| format!("starting the ledger ({})", binary.display()))?;
    let stdout = child.stdout.take().context("the ledger's stdout")?;
    let mut proc = Proc::adopt("the ledger", child, log);
    let (tx, rx) = mpsc::channel();
    let mut rest = std::fs::OpenOptions::new().append(true).open(log)?;
    std::thread::Builder::new()
        .name("ledger-stdout".to_owned())
        .spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = writeln!(rest, "{line}");
                let _ = tx.send(line);
            }
        })?;
    let first = match rx.recv_timeout(TIMEOUT) {
        Ok(line) => line,
        Err(_) => {
            let status = proc.exited()?;
            anyhow::bail!(
                "the ledger did not say where it listens within {TIMEOUT:?} ({}); see {}",
                status.map_or("still running".to_owned(), |s| format!("exited: {s}")),
                log.display()
            );
        }
    };
    let addr = first
        .strip_prefix("listening on ")
        .with_context(|| format!("the ledger printed {first:?}, not its address"))?
        .to_owned();
    Ok((proc, addr))
}

/// One HTTP/1.1 request on its own connection (`Connection: close`); the status and the body as
/// JSON (`Null` when it is not JSON).
fn exchange(
    addr: &str,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> anyhow::Result<(u16, Value)> {
    let socket = addr
        .parse()
        .with_context(|| format!("{addr} is not an address"))?;
    let mut stream = TcpStream::connect_timeout(&socket, TIMEOUT)?;
    stream.set_read_timeout(Some(TIMEOUT))?;
    stream.set_write_timeout(Some(TIMEOUT))?;
    let body = body.unwrap_or("");
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    parse_response(&raw)
}

fn parse_response(raw: &[u8]) -> anyhow::Result<(u16, Value)> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .with_context(|| format!("not an HTTP response ({} bytes)", raw.len()))?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .with_context(|| format!("no status in {:?}", head.lines().next()))?;
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    anyhow::ensure!(!chunked, "a chunked answer (the ledger sends lengths)");
    Ok((status, serde_json::from_str(body).unwrap_or(Value::Null)))
}

/// Percent-encodes everything but unreserved characters (RFC 3986), for a path segment or a
/// query value.
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_give_their_status_and_json_body() -> anyhow::Result<()> {
        let raw = b"HTTP/1.1 201 Created\r\ncontent-type: application/json\r\n\
                    content-length: 9\r\n\r\n{\"id\":1}\n";
        let (status, body) = parse_response(raw)?;
        assert_eq!(status, 201);
        assert_eq!(body["id"], 1);
        let (status, body) = parse_response(b"HTTP/1.1 404 Not Found\r\n\r\nnope")?;
        assert_eq!((status, body), (404, Value::Null));
        assert!(parse_response(b"").is_err(), "zero bytes is no answer");
        assert!(parse_response(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n").is_err());
        Ok(())
    }

    #[test]
    fn references_are_percent_encoded() {
        assert_eq!(
            percent_encode("refund:demo-1/a b"),
            "refund%3Ademo-1%2Fa%20b"
        );
    }
}
