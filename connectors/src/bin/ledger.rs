//! The `airlock-ledger` binary: the reference ledger service (see `connectors/README.md`).

use std::io::Write;
use std::process::ExitCode;

use airlock_connectors::ledger::{Args, Server};
use airlock_processor::runtime::logging;
use anyhow::Context;
use clap::Parser;
use tokio::signal::unix::{SignalKind, signal};

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    logging::init("ledger");
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("airlock-ledger: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let config = args.into_config()?;
    let server = Server::bind(&config).await?;
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    // Scripts and tests read the bound address from the first line of stdout.
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "listening on {}", server.local_addr()).context("writing to stdout")?;
    stdout.flush().context("writing to stdout")?;
    drop(stdout);
    server
        .run(async move {
            tokio::select! {
                _ = term.recv() => log::info!("SIGTERM: stopping"),
                _ = int.recv() => log::info!("SIGINT: stopping"),
            }
        })
        .await;
    Ok(())
}
