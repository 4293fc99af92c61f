//! The telemetry HTTP endpoint of a process: `GET /metrics` (Prometheus text format 0.0.4),
//! `GET /healthz` (liveness: 200 while the process makes progress) and `GET /readyz`
//! (readiness: 200 only when the process can do its work; 503 with the reason otherwise).
//!
//! It runs on a thread of its own with a one-thread tokio runtime, so it answers while the
//! Kafka loop is busy (a long restore inside a rebalance, a slow batch) and never slows it down.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

use super::metrics::{CONTENT_TYPE, Registry};

/// What the probes ask of the process: `Err(reason)` answers 503 with the reason.
pub trait Probes: Send + Sync {
    fn live(&self) -> Result<(), String>;
    fn ready(&self) -> Result<(), String>;
}

/// Errors of starting the endpoint.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("telemetry endpoint: binding {addr}: {source}")]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("telemetry endpoint: {0}")]
    Runtime(#[source] std::io::Error),
}

/// A running endpoint; dropping it stops it.
#[derive(Debug)]
pub struct Server {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    /// Binds `addr` (`host:port`; port 0 picks a free one) and serves `registry` and `probes`.
    pub fn start(
        addr: &str,
        registry: Arc<Registry>,
        probes: Arc<dyn Probes>,
    ) -> Result<Server, Error> {
        let bind_err = |source| Error::Bind {
            addr: addr.to_owned(),
            source,
        };
        let listener = std::net::TcpListener::bind(addr).map_err(bind_err)?;
        listener.set_nonblocking(true).map_err(bind_err)?;
        let local = listener.local_addr().map_err(bind_err)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(Error::Runtime)?;
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("airlock-telemetry".to_owned())
            .spawn(move || {
                runtime.block_on(async move {
                    let listener = match tokio::net::TcpListener::from_std(listener) {
                        Ok(l) => l,
                        Err(e) => {
                            log::error!("telemetry endpoint {local}: {e}");
                            return;
                        }
                    };
                    loop {
                        tokio::select! {
                            _ = &mut stopped => break,
                            accepted = listener.accept() => {
                                let Ok((stream, _)) = accepted else { continue };
                                let registry = registry.clone();
                                let probes = probes.clone();
                                tokio::spawn(async move {
                                    let service = hyper::service::service_fn(move |req| {
                                        let answer = answer(&req, &registry, probes.as_ref());
                                        async move { Ok::<_, Infallible>(answer) }
                                    });
                                    let _ = hyper::server::conn::http1::Builder::new()
                                        .serve_connection(TokioIo::new(stream), service)
                                        .await;
                                });
                            }
                        }
                    }
                });
            })
            .map_err(Error::Runtime)?;
        log::info!("telemetry endpoint on http://{local} (/metrics, /healthz, /readyz)");
        Ok(Server {
            addr: local,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The address it listens on (the real port when 0 was asked).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn answer(
    req: &Request<Incoming>,
    registry: &Registry,
    probes: &dyn Probes,
) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n".to_owned());
    }
    match req.uri().path() {
        "/metrics" => {
            let mut r = Response::new(Full::new(Bytes::from(registry.render())));
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static(CONTENT_TYPE),
            );
            r
        }
        "/healthz" => probe(probes.live()),
        "/readyz" => probe(probes.ready()),
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: /metrics, /healthz, /readyz\n".to_owned(),
        ),
    }
}

fn probe(result: Result<(), String>) -> Response<Full<Bytes>> {
    match result {
        Ok(()) => text(StatusCode::OK, "ok\n".to_owned()),
        Err(reason) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")),
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    struct Flag(AtomicBool);

    impl Probes for Flag {
        fn live(&self) -> Result<(), String> {
            Ok(())
        }
        fn ready(&self) -> Result<(), String> {
            if self.0.load(Ordering::Relaxed) {
                Ok(())
            } else {
                Err("partition 3 is restoring".to_owned())
            }
        }
    }

    fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn serves_metrics_and_probes_over_http() {
        let registry = Arc::new(Registry::new());
        registry
            .counter("airlock_batches_total", "Batches.", &[])
            .add(&[], 7);
        let flag = Arc::new(Flag(AtomicBool::new(false)));
        let server = Server::start("127.0.0.1:0", registry, flag.clone()).unwrap();
        let metrics = get(server.addr(), "/metrics");
        assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
        assert!(metrics.contains("text/plain; version=0.0.4"), "{metrics}");
        assert!(metrics.contains("\nairlock_batches_total 7\n"), "{metrics}");
        assert!(get(server.addr(), "/healthz").starts_with("HTTP/1.1 200"));
        let not_ready = get(server.addr(), "/readyz");
        assert!(not_ready.starts_with("HTTP/1.1 503"), "{not_ready}");
        assert!(
            not_ready.contains("partition 3 is restoring"),
            "{not_ready}"
        );
        flag.0.store(true, Ordering::Relaxed);
        assert!(get(server.addr(), "/readyz").starts_with("HTTP/1.1 200"));
        assert!(get(server.addr(), "/nope").starts_with("HTTP/1.1 404"));
    }
}
