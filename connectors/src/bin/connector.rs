//! The `airlock-connector` binary: one connector worker (see `airlock_connectors::worker`).
//! SIGTERM or SIGINT stops it once the commands it started are reported; a second signal exits
//! at once (an attempt in flight then settles through reconciliation).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use airlock_connectors::worker::{self, Config};
use airlock_processor::runtime::{logging, signals};
use airlock_processor::telemetry::trace;
use anyhow::Context;
use clap::Parser;

/// A connector worker: executes Airlock's dispatch commands against a downstream HTTP API, at
/// most once each, and reports what happened.
#[derive(Debug, Parser)]
#[command(name = "airlock-connector", version)]
struct Args {
    /// The worker's configuration (TOML; see deploy/config/connector-ledger.toml). Environment
    /// variables (AIRLOCK_KAFKA_*, AIRLOCK_TOPICS_*, AIRLOCK_CONNECTOR_*) override it.
    #[arg(long, short, env = "AIRLOCK_CONNECTOR_CONFIG")]
    config: PathBuf,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("airlock-connector: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> anyhow::Result<()> {
    let config = Config::load(&args.config).context("loading the configuration")?;
    logging::init(&config.worker_id());
    let _export = trace::init(
        &format!("airlock-connector-{}", config.connector.name),
        &config.telemetry.otlp_endpoint,
    )
    .context("starting the trace exporter")?;
    let shutdown = Arc::new(AtomicBool::new(false));
    signals::watch(
        shutdown.clone(),
        "the commands started",
        "an attempt in flight settles through reconciliation",
    )
    .context("watching for SIGTERM/SIGINT")?;
    let summary = worker::run(&config, shutdown).context("running the worker")?;
    println!(
        "stopped: {} commands, {} committed, {} failed, {} unknown, {} reconciled, {} \
         dead-lettered, {} duplicates, {} fenced",
        summary.commands,
        summary.committed,
        summary.failed,
        summary.unknown,
        summary.reconciled,
        summary.dead_lettered,
        summary.duplicates,
        summary.fenced
    );
    Ok(())
}
