//! A one-shot HTTP/1.1 client that does exactly one exchange per call: one fresh connection,
//! one request, no connection pool, no retries, no redirects. Its errors say what they prove
//! (STYLE.md): [`Error::NotExecuted`] when the request never left (name resolution, connect,
//! protocol setup, a deadline before the first request byte), [`Error::Ambiguous`] once the
//! request may have reached the server (a timeout, a reset, a closed connection before the
//! whole answer was read).
//!
//! Why not a general client: `reqwest` 0.12.28 retries protocol NACKs by default (its
//! `retry` layer, disabled only with `retry(never())`) and its pooled `hyper-util` client
//! retries requests canceled on a reused connection. Either is a hidden second send, and a
//! connector must never send twice (the processor owns retries). Here nothing is reused, so
//! nothing can be resent. `http://` only: TLS is terminated by an egress proxy or sidecar.

use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::header::{CONNECTION, CONTENT_TYPE, HOST, HeaderName, HeaderValue};
use hyper::{HeaderMap, Method, Request, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout_at};

/// A request that failed, by what the failure proves.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The request never left this process: the downstream cannot have acted on it.
    #[error("not executed: {0}")]
    NotExecuted(String),
    /// The request may have reached the downstream: it may or may not have taken effect.
    #[error("ambiguous: {0}")]
    Ambiguous(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// One request to send.
#[derive(Clone, Debug)]
pub struct Outgoing {
    pub method: Method,
    /// An absolute `http://` URL.
    pub url: String,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// A JSON body (sent with `Content-Type: application/json` unless a header says otherwise).
    pub body: Option<String>,
}

/// The answer, with at most `max_body` bytes of its body.
#[derive(Clone, Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// The body was longer than the limit; `body` holds its beginning.
    pub truncated: bool,
}

/// Client settings.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Bound on name resolution plus TCP connect (within the call's own timeout).
    pub connect_timeout: Duration,
    /// Bytes of a response body kept; the rest is not read.
    pub max_body: usize,
}

/// An `http://host[:port]/path` URL, split for a connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The host as resolvable (no IPv6 brackets).
    pub host: String,
    pub port: u16,
    /// The `Host` header value.
    pub authority: String,
    pub path_and_query: String,
}

/// `url` as errors may show it: scheme and host only (no user info, path or query), and how
/// many bytes were left out. A URL that does not parse shows its scheme alone: where its host
/// ends cannot be told (a password may hold a `/`).
fn shown(url: &str) -> String {
    let kept = match url.parse::<Uri>() {
        Ok(uri) => match (uri.scheme_str(), uri.host()) {
            (Some(scheme), Some(host)) => match uri.port_u16() {
                Some(port) => format!("{scheme}://{host}:{port}"),
                None => format!("{scheme}://{host}"),
            },
            (Some(scheme), None) => format!("{scheme}://"),
            _ => String::new(),
        },
        Err(_) => url
            .split_once("://")
            .map(|(scheme, _)| format!("{scheme}://"))
            .unwrap_or_default(),
    };
    if kept.is_empty() {
        format!("a {}-byte text (not shown)", url.len())
    } else if kept.len() == url.len() || format!("{kept}/") == url {
        format!("{url:?}")
    } else {
        format!("{kept:?} (and more, not shown)")
    }
}

/// Parses and checks an absolute `http://` URL. Its errors show only the scheme and the host:
/// a rendered URL may carry a secret (`{env:...}` in its path or query, or user info), and the
/// error becomes an outcome's evidence and a log line.
pub fn target(url: &str) -> Result<Target, String> {
    let shown = shown(url);
    let uri: Uri = url
        .parse()
        .map_err(|e| format!("{shown} is not a URL: {e}"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(format!(
                "{shown}: https is not built in; terminate TLS in an egress proxy or sidecar and \
                 point the connector at it over http"
            ));
        }
        _ => return Err(format!("{shown} is not an absolute http:// URL")),
    }
    let authority = uri
        .authority()
        .ok_or_else(|| format!("{shown} has no host"))?;
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    if host.is_empty() {
        return Err(format!("{shown} has no host"));
    }
    Ok(Target {
        host,
        port: authority.port_u16().unwrap_or(80),
        authority: authority.as_str().to_owned(),
        path_and_query: uri
            .path_and_query()
            .map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned()),
    })
}

/// Sends `request` once and reads the answer, all within `timeout`.
pub async fn send(request: &Outgoing, timeout: Duration, limits: Limits) -> Result<Reply> {
    let deadline = Instant::now() + timeout;
    let target = target(&request.url).map_err(Error::NotExecuted)?;
    let connect_budget = limits.connect_timeout.min(timeout);
    let stream = match timeout_at(Instant::now() + connect_budget, connect(&target)).await {
        Ok(stream) => stream?,
        Err(_) => {
            return Err(Error::NotExecuted(format!(
                "no connection to {}:{} within {connect_budget:?}",
                target.host, target.port,
            )));
        }
    };
    let http = build(request, &target).map_err(Error::NotExecuted)?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| Error::NotExecuted(format!("HTTP/1.1 setup: {e}")))?;
    // The connection task ends with the exchange: the request asks for `Connection: close`.
    let driver = tokio::spawn(async move {
        if let Err(e) = connection.await {
            log::debug!("connection closed with {e}");
        }
    });
    // From here on the request may be on the wire: every failure is ambiguous.
    let exchange = async {
        let response = sender.send_request(http).await.map_err(|e| {
            Error::Ambiguous(format!("sending the request or reading the answer: {e}"))
        })?;
        read(response, limits.max_body).await
    };
    let result = match timeout_at(deadline, exchange).await {
        Ok(result) => result,
        Err(_) => Err(Error::Ambiguous(format!(
            "no complete answer within {timeout:?} after the request was sent"
        ))),
    };
    driver.abort();
    result
}

async fn connect(target: &Target) -> Result<TcpStream> {
    let addrs: Vec<_> = tokio::net::lookup_host((target.host.as_str(), target.port))
        .await
        .map_err(|e| Error::NotExecuted(format!("resolving {}: {e}", target.host)))?
        .collect();
    let mut last = format!("{} resolved to no address", target.host);
    for addr in addrs {
        match TcpStream::connect(addr).await {
            Ok(stream) => {
                // Latency over throughput: one small request, then its answer.
                let _ = stream.set_nodelay(true);
                return Ok(stream);
            }
            Err(e) => last = format!("connecting to {addr}: {e}"),
        }
    }
    Err(Error::NotExecuted(last))
}

fn build(request: &Outgoing, target: &Target) -> Result<Request<Full<Bytes>>, String> {
    let mut builder = Request::builder()
        .method(request.method.clone())
        .uri(&target.path_and_query)
        .header(HOST, &target.authority)
        .header(CONNECTION, "close");
    let has_content_type = request.headers.iter().any(|(k, _)| k == CONTENT_TYPE);
    if request.body.is_some() && !has_content_type {
        builder = builder.header(CONTENT_TYPE, "application/json");
    }
    for (name, value) in &request.headers {
        builder = builder.header(name, value);
    }
    let body = request.body.clone().map(Bytes::from).unwrap_or_default();
    builder
        .body(Full::new(body))
        .map_err(|e| format!("building the request: {e}"))
}

async fn read(response: hyper::Response<Incoming>, max_body: usize) -> Result<Reply> {
    let (parts, mut body) = response.into_parts();
    let mut kept = Vec::new();
    let mut truncated = false;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            Error::Ambiguous(format!(
                "HTTP {} answered, then its body broke off: {e}",
                parts.status.as_u16()
            ))
        })?;
        if let Ok(data) = frame.into_data() {
            let room = max_body.saturating_sub(kept.len());
            if data.len() > room {
                kept.extend_from_slice(&data[..room]);
                truncated = true;
                break;
            }
            kept.extend_from_slice(&data);
        }
    }
    Ok(Reply {
        status: parts.status,
        headers: parts.headers,
        body: Bytes::from(kept),
        truncated,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    const LIMITS: Limits = Limits {
        connect_timeout: Duration::from_secs(2),
        max_body: 16,
    };

    fn post(url: String) -> Outgoing {
        Outgoing {
            method: Method::POST,
            url,
            headers: vec![(
                HeaderName::from_static("idempotency-key"),
                HeaderValue::from_static("alk1-x"),
            )],
            body: Some("{\"a\":1}".to_owned()),
        }
    }

    /// A server that reads one request and then plays `answer` (`None`: close unanswered).
    async fn server(
        answer: Option<&'static str>,
        pause: Duration,
    ) -> (String, tokio::task::JoinHandle<Vec<u8>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/v1/refunds", listener.local_addr().unwrap());
        let handle = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut seen = Vec::new();
            let mut buf = [0u8; 4096];
            while !seen.windows(7).any(|w| w == b"{\"a\":1}") {
                let n = socket.read(&mut buf).await.unwrap();
                if n == 0 {
                    break;
                }
                seen.extend_from_slice(&buf[..n]);
            }
            tokio::time::sleep(pause).await;
            if let Some(answer) = answer {
                let _ = socket.write_all(answer.as_bytes()).await;
            }
            seen
        });
        (url, handle)
    }

    #[tokio::test]
    async fn an_answer_is_read_and_its_long_body_truncated() {
        let (url, server) = server(
            Some("HTTP/1.1 201 Created\r\ncontent-length: 26\r\n\r\n{\"effect_id\":\"eff_1\",\"x\":1}"),
            Duration::ZERO,
        )
        .await;
        let reply = send(&post(url), Duration::from_secs(5), LIMITS)
            .await
            .unwrap();
        assert_eq!(reply.status, StatusCode::CREATED);
        assert!(reply.truncated);
        assert_eq!(reply.body.len(), 16);
        let request = String::from_utf8(server.await.unwrap()).unwrap();
        assert!(
            request.starts_with("POST /v1/refunds HTTP/1.1\r\n"),
            "{request}"
        );
        assert!(request.contains("idempotency-key: alk1-x"), "{request}");
        assert!(
            request.contains("content-type: application/json"),
            "{request}"
        );
    }

    #[tokio::test]
    async fn a_refused_connection_is_not_executed() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/v1/refunds", listener.local_addr().unwrap());
        drop(listener);
        let err = send(&post(url), Duration::from_secs(5), LIMITS)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::NotExecuted(_)), "{err}");
    }

    #[tokio::test]
    async fn a_name_that_does_not_resolve_is_not_executed() {
        let err = send(
            &post("http://no-such-host.invalid/v1".to_owned()),
            Duration::from_secs(5),
            LIMITS,
        )
        .await
        .unwrap_err();
        assert!(matches!(err, Error::NotExecuted(_)), "{err}");
    }

    #[tokio::test]
    async fn a_connection_closed_after_the_request_is_ambiguous() {
        let (url, _server) = server(None, Duration::ZERO).await;
        let err = send(&post(url), Duration::from_secs(5), LIMITS)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Ambiguous(_)), "{err}");
    }

    #[tokio::test]
    async fn a_timeout_after_sending_is_ambiguous() {
        let (url, _server) = server(
            Some("HTTP/1.1 201 Created\r\ncontent-length: 0\r\n\r\n"),
            Duration::from_secs(3),
        )
        .await;
        let err = send(&post(url), Duration::from_millis(300), LIMITS)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Ambiguous(_)), "{err}");
    }

    #[test]
    fn only_absolute_http_urls_are_targets() {
        let t = target("http://[::1]:8088/v1/effects/k?x=1").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("::1", 8088));
        assert_eq!(t.path_and_query, "/v1/effects/k?x=1");
        assert_eq!(target("http://ledger/").unwrap().port, 80);
        assert!(target("https://ledger/").unwrap_err().contains("https"));
        assert!(target("/v1/debits").is_err());
        // A secret in the user info, path or query never shows in an error.
        for url in [
            "https://ops:s3cret@ledger/v1/refunds",
            "https://ledger/hooks/s3cret",
            "ftp://ledger/v1?token=s3cret",
            "http://ops:s3cret@/v1",
            "s3cret",
        ] {
            let e = target(url).unwrap_err();
            assert!(!e.contains("s3cret"), "{url}: {e}");
        }
        // A password holding a `/` (where the authority ends cannot be told by text).
        let e = shown("http://ops:ab/s3cret@ledger/x");
        assert!(!e.contains("s3cret"), "{e}");
        assert!(
            target("https://ledger/hooks/s3cret")
                .unwrap_err()
                .contains("\"https://ledger\"")
        );
    }
}
