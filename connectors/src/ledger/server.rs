//! The ledger's HTTP/1.1 server: opens the store, seeds accounts, arms start-up faults, binds,
//! and serves each connection in its own task until shutdown.
//!
//! The accept loop is ours rather than `axum::serve` for one fault: `drop-response` must close
//! the TCP connection without a single response byte, so every connection carries a
//! [`ConnectionControl`] that a handler trips to make the connection task drop the connection
//! while the response is still unwritten.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::{Extension, Router};
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Notify;

use super::api::{self, Ledger};
use super::config::Config;
use super::faults::FaultBook;
use super::store::{self, Created, Store};
use airlock_processor::runtime::logging::utc_now;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Store(#[from] store::Error),
    #[error("seed account {account_id} exists with another tenant, currency or opening balance")]
    SeedConflict { account_id: String },
    #[error("cannot listen on {listen}: {source}")]
    Bind {
        listen: String,
        source: std::io::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Lets a handler close its connection without answering.
#[derive(Debug, Clone, Default)]
pub struct ConnectionControl {
    drop: Arc<Notify>,
}

impl ConnectionControl {
    /// Asks the connection task to drop the connection now; the response in progress is never
    /// written.
    pub fn drop_connection(&self) {
        // notify_one keeps the permit if the connection task is not waiting yet.
        self.drop.notify_one();
    }

    async fn dropped(&self) {
        self.drop.notified().await;
    }
}

/// A bound ledger, ready to serve.
#[derive(Debug)]
pub struct Server {
    listener: TcpListener,
    addr: SocketAddr,
    app: Router,
    shutdown_grace: Duration,
    /// The database, for in-process callers that want to look behind the API.
    pub store: Arc<Store>,
    /// The armed fault rules, for in-process callers that arm faults directly.
    pub faults: Arc<FaultBook>,
}

impl Server {
    /// Opens the database, creates the configured accounts, arms the configured faults and
    /// binds the listener.
    pub async fn bind(config: &Config) -> Result<Server> {
        let store = Arc::new(Store::open(&config.db)?);
        for spec in &config.accounts {
            match store.create_account(spec, &utc_now())? {
                Created::Created(_) => log::info!("created seed account {}", spec.account_id),
                Created::Existing(_) => {}
                Created::Conflict(_) => {
                    return Err(Error::SeedConflict {
                        account_id: spec.account_id.clone(),
                    });
                }
            }
        }
        let faults = Arc::new(FaultBook::new(config.faults.iter().cloned()));
        for armed in faults.list() {
            log::info!("armed fault rule {}: {}", armed.id, armed.fault);
        }
        let listener = TcpListener::bind(&config.listen)
            .await
            .map_err(|source| Error::Bind {
                listen: config.listen.clone(),
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| Error::Bind {
            listen: config.listen.clone(),
            source,
        })?;
        let app = api::router(Arc::new(Ledger {
            store: store.clone(),
            faults: faults.clone(),
            body_limit: config.body_limit,
        }));
        Ok(Server {
            listener,
            addr,
            app,
            shutdown_grace: config.shutdown_grace,
            store,
            faults,
        })
    }

    /// The address actually bound (the port is real when the configured one was 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves until `shutdown` completes, then stops accepting and gives open requests the
    /// grace period to finish.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        log::info!("ledger listening on {}", self.addr);
        let graceful = GracefulShutdown::new();
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                accepted = self.listener.accept() => match accepted {
                    Ok((stream, peer)) => self.serve(stream, peer, &graceful),
                    Err(e) => {
                        // Typically out of file descriptors: back off instead of spinning.
                        log::warn!("accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
                () = &mut shutdown => break,
            }
        }
        drop(self.listener);
        log::info!("shutting down: no new connections, finishing open requests");
        tokio::select! {
            () = graceful.shutdown() => log::info!("all connections closed"),
            () = tokio::time::sleep(self.shutdown_grace) => {
                log::warn!("shutdown grace of {:?} over, closing open connections", self.shutdown_grace);
            }
        }
    }

    fn serve(&self, stream: tokio::net::TcpStream, peer: SocketAddr, graceful: &GracefulShutdown) {
        let control = ConnectionControl::default();
        let service = TowerToHyperService::new(self.app.clone().layer(Extension(control.clone())));
        let connection = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(stream), service);
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            tokio::select! {
                result = connection => {
                    if let Err(e) = result {
                        log::debug!("connection from {peer}: {e}");
                    }
                }
                () = control.dropped() => {
                    log::info!("closed the connection from {peer} without a response");
                }
            }
        });
    }
}
