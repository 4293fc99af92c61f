//! Shared harness of the ledger tests: a raw HTTP/1.1 client over a TCP stream (so a test sees
//! exactly which bytes came back, or that none did), an in-process ledger on 127.0.0.1:0 over a
//! SQLite file in a temporary directory, and request bodies. Every wait is under a timeout.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use airlock_connectors::ledger::model::AccountSpec;
use airlock_connectors::ledger::store::Store;
use airlock_connectors::ledger::{Config, Server};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The bound on every single wait in these tests.
pub const WAIT: Duration = Duration::from_secs(10);

pub async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(WAIT, future)
        .await
        .unwrap_or_else(|_| panic!("timed out after {WAIT:?}: {what}"))
}

/// A parsed HTTP response.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "{} body is not JSON ({e}): {}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The `error` code of a JSON error body.
    pub fn error(&self) -> String {
        self.json()["error"]
            .as_str()
            .unwrap_or_else(|| panic!("no error code in {}", self.json()))
            .to_owned()
    }
}

/// The request bytes for one HTTP/1.1 request with `Connection: close`.
pub fn request_bytes(method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "{method} {path} HTTP/1.1\r\nHost: ledger\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !body.is_empty() {
        out.push_str("Content-Type: application/json\r\n");
    }
    for (name, value) in headers {
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    out.push_str("\r\n");
    let mut out = out.into_bytes();
    out.extend_from_slice(body);
    out
}

/// Sends raw request bytes and returns every byte received until the server closes the
/// connection, and the read error if it was reset rather than closed.
pub async fn exchange(addr: SocketAddr, request: &[u8]) -> (Vec<u8>, Option<std::io::Error>) {
    within("the exchange", async {
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        stream.write_all(request).await.expect("send the request");
        let mut received = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) => return (received, None),
                Ok(n) => received.extend_from_slice(&chunk[..n]),
                Err(e) => return (received, Some(e)),
            }
        }
    })
    .await
}

/// One request, one parsed response. Panics when no complete response comes back.
pub async fn call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&Value>,
) -> Reply {
    let body = body.map(|b| b.to_string().into_bytes()).unwrap_or_default();
    let (bytes, error) = exchange(addr, &request_bytes(method, path, headers, &body)).await;
    parse(&bytes).unwrap_or_else(|| {
        panic!(
            "{method} {path}: no complete response ({} bytes, {error:?}): {}",
            bytes.len(),
            String::from_utf8_lossy(&bytes)
        )
    })
}

pub async fn get(addr: SocketAddr, path: &str) -> Reply {
    call(addr, "GET", path, &[], None).await
}

pub async fn post(addr: SocketAddr, path: &str, body: &Value) -> Reply {
    call(addr, "POST", path, &[], Some(body)).await
}

/// `POST /v1/{kind}s` with an idempotency key.
pub async fn money(addr: SocketAddr, kind: &str, key: &str, body: &Value) -> Reply {
    call(
        addr,
        "POST",
        &format!("/v1/{kind}s"),
        &[("Idempotency-Key", key)],
        Some(body),
    )
    .await
}

/// Parses a complete response (Content-Length or chunked body); None when incomplete.
pub fn parse(bytes: &[u8]) -> Option<Reply> {
    let head_end = bytes.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&bytes[..head_end]).ok()?;
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let rest = &bytes[head_end + 4..];
    let header = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    };
    let body = if let Some(length) = header("content-length") {
        let length: usize = length.parse().ok()?;
        rest.get(..length)?.to_vec()
    } else if header("transfer-encoding").is_some_and(|t| t.eq_ignore_ascii_case("chunked")) {
        dechunk(rest)?
    } else {
        rest.to_vec()
    };
    Some(Reply {
        status,
        headers,
        body,
    })
}

fn dechunk(mut rest: &[u8]) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = rest.windows(2).position(|w| w == b"\r\n")?;
        let size =
            usize::from_str_radix(std::str::from_utf8(&rest[..line_end]).ok()?.trim(), 16).ok()?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Some(body);
        }
        body.extend_from_slice(rest.get(..size)?);
        rest = rest.get(size + 2..)?;
    }
}

/// A ledger served in this process over a fresh database.
pub struct TestLedger {
    pub addr: SocketAddr,
    pub store: Arc<Store>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
    pub dir: tempfile::TempDir,
}

/// The account every test starts with: tenant `acme`, `acc_1`, 100.00 EUR.
pub fn account() -> AccountSpec {
    AccountSpec {
        tenant_id: "acme".into(),
        account_id: "acc_1".into(),
        currency: "EUR".into(),
        balance_minor: 10_000,
    }
}

impl TestLedger {
    pub async fn start() -> TestLedger {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config = Config::local(dir.path().join("ledger.sqlite"));
        config.accounts = vec![account()];
        let server = Server::bind(&config).await.expect("bind the ledger");
        let (addr, store) = (server.local_addr(), server.store.clone());
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(server.run(async move {
            let _ = stopped.await;
        }));
        TestLedger {
            addr,
            store,
            stop: Some(stop),
            task: Some(task),
            dir,
        }
    }

    /// Shuts the server down and waits for it.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            within("the ledger to stop", task)
                .await
                .expect("ledger task");
        }
    }

    pub async fn stats(&self) -> Value {
        let reply = get(self.addr, "/v1/stats").await;
        assert_eq!(reply.status, 200);
        reply.json()
    }

    pub async fn balance(&self) -> i64 {
        let reply = get(self.addr, "/v1/accounts/acc_1").await;
        assert_eq!(reply.status, 200, "{}", reply.json());
        reply.json()["balance_minor"].as_i64().expect("balance")
    }
}

/// A money request body on `acc_1`.
pub fn body(reference: &str, minor_units: i64) -> Value {
    json!({
        "tenant_id": "acme",
        "account_id": "acc_1",
        "amount": { "minor_units": minor_units, "currency": "EUR" },
        "reference": reference,
        "reason": "customer_request",
    })
}
