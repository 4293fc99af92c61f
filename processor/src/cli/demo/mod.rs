//! `airlock demo`: the whole loop on a real broker, through the seed workshop's failures. Given a
//! reachable broker (configuration and environment as for `airlock run`), it creates the
//! topics, starts the processor (`airlock run`), the reference ledger and a connector worker as
//! child processes, drives a small agent fleet through the scenarios (`scenarios`), printing
//! decisions as they arrive, and ends with a plain report per scenario: attempts, decisions,
//! business effects on the ledger, final state. Exits non-zero when a scenario ends otherwise
//! than it should. The children are stopped when it ends, also on error or Ctrl-C.
//!
//! # Layout
//! - `process`: one child process (log file, freeze/resume, bounded stop, stopped on drop).
//! - `ledger`: the ledger process and the calls of its HTTP API the demo makes.
//! - `stack`: the processor, the ledger and the workers, started with one configuration.
//! - `watch`: the agents' producer and the reader of decisions, journal, dispatches, dead letters.
//! - `scenarios`: the failures, one function each.
//! - `report`: what each scenario should end with, and the final report.

mod ledger;
mod process;
mod report;
mod scenarios;
mod stack;
mod watch;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;

use self::process::count_lines;
use self::report::Report;
use self::scenarios::Ctx;
use self::stack::{Binaries, Stack};
use self::watch::Watch;
use crate::core::registry::Registry;
use crate::runtime::config::Config;
use crate::runtime::signals;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The processor's configuration file (TOML), as for `airlock run`; AIRLOCK_* environment
    /// variables override it (AIRLOCK_KAFKA_BROKERS, AIRLOCK_TOPICS_PARTITIONS, ...). Dispatch
    /// commands must be signed: set capability.signing_key_file (the demo script uses the public
    /// demo key deploy/config/demo-capability.key).
    #[arg(long, short, env = "AIRLOCK_CONFIG")]
    pub config: Option<PathBuf>,
    /// The connector worker's configuration; its brokers, topics, base URL, worker id and group
    /// are set by the demo.
    #[arg(
        long,
        env = "AIRLOCK_DEMO_CONNECTOR_CONFIG",
        default_value = "deploy/config/connector-ledger.toml"
    )]
    pub connector_config: PathBuf,
    /// The `airlock-ledger` binary [default: next to this executable].
    #[arg(long, env = "AIRLOCK_DEMO_LEDGER_BIN")]
    pub ledger_bin: Option<PathBuf>,
    /// The `airlock-connector` binary [default: next to this executable].
    #[arg(long, env = "AIRLOCK_DEMO_CONNECTOR_BIN")]
    pub connector_bin: Option<PathBuf>,
    /// Where the logs, the processor's state and the ledger's database go [default: a new
    /// temporary directory, removed after a successful run unless --keep].
    #[arg(long, env = "AIRLOCK_DEMO_WORK_DIR")]
    pub work_dir: Option<PathBuf>,
    /// Keep the temporary work directory after a successful run (it is always kept after a
    /// failure).
    #[arg(long)]
    pub keep: bool,
    /// The bound on every wait (a start, a decision, a crash); a slow machine may want more.
    #[arg(long, env = "AIRLOCK_DEMO_WAIT_SECONDS", default_value_t = 120)]
    pub wait_seconds: u64,
}

pub fn run(args: &Args, out: &mut impl Write) -> anyhow::Result<()> {
    let out: &mut dyn Write = out;
    let (work, temp) = match &args.work_dir {
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("creating the work directory {}", dir.display()))?;
            (dir.clone(), None)
        }
        None => {
            let temp = tempfile::Builder::new()
                .prefix("airlock-demo-")
                .tempdir()
                .context("creating a work directory")?;
            (temp.path().to_owned(), Some(temp))
        }
    };
    let result = demo(args, &work, out);
    if let Some(temp) = temp
        && (args.keep || result.is_err())
    {
        let _ = temp.keep();
    }
    if result.is_err() || args.keep || args.work_dir.is_some() {
        writeln!(out, "demo: logs and state kept in {}", work.display())?;
    }
    result
}

fn demo(args: &Args, work: &Path, out: &mut dyn Write) -> anyhow::Result<()> {
    let config = Config::load(args.config.as_deref()).context("loading the configuration")?;
    anyhow::ensure!(
        !config.capability.signing_key_file.as_os_str().is_empty(),
        "capability.signing_key_file is not set: workers refuse unsigned dispatch commands. For \
         the demo, AIRLOCK_CAPABILITY_SIGNING_KEY_FILE=deploy/config/demo-capability.key (a \
         PUBLIC key, never deploy it)"
    );
    let registry = Registry::load(&config.tools.registry).with_context(|| {
        format!(
            "loading the tool registry {}",
            config.tools.registry.display()
        )
    })?;
    let connector = registry
        .lookup("refund", "1")
        .map_err(|e| anyhow::anyhow!("the demo refunds with tool refund 1: {e:?}"))?
        .connector
        .clone();
    let bins = binaries(args)?;
    let interrupted = Arc::new(AtomicBool::new(false));
    signals::watch(
        interrupted.clone(),
        "the wait at hand",
        "child processes may be left running",
    )
    .context("watching for SIGTERM/SIGINT")?;
    let wait = Duration::from_secs(args.wait_seconds);
    let now = crate::runtime::clock::wall_ms();
    let run = format!("demo-{now:x}");

    writeln!(
        out,
        "demo {run}: brokers {}, topics {}*, {} partitions; logs in {}",
        config.kafka.brokers,
        config.topics.prefix,
        config.topics.partitions,
        work.display()
    )?;
    super::topics::create(&config, Duration::from_secs(30), &mut &mut *out)?;
    let mut watch = Watch::new(&config, &connector, interrupted.clone())?;
    let mut stack = Stack::new(
        bins,
        work,
        &config,
        args.config.as_deref(),
        &connector,
        &args.connector_config,
    );
    let started = start(&mut stack, &mut watch, wait, out);
    if let Err(e) = started {
        tails(&stack, out)?;
        return Err(e);
    }

    let mut cx = Ctx {
        watch: &mut watch,
        stack: &mut stack,
        out: &mut *out,
        run: run.clone(),
        now,
        wait,
    };
    let mut reports = Vec::new();
    for (i, (title, scenario)) in scenarios::ALL.iter().enumerate() {
        writeln!(cx.out, "\n[{}/{}] {title}", i + 1, scenarios::ALL.len())?;
        let mut report = Report::new(title);
        if let Err(e) = scenario(&mut cx, &mut report) {
            writeln!(cx.out, "  ! {e:#}")?;
            report.problem(format!("{e:#}"));
            if interrupted.load(Ordering::Relaxed) {
                return Err(e);
            }
        }
        for dead in cx.stack.casualties() {
            report.problem(dead);
        }
        reports.push(report);
    }

    writeln!(out, "\nreport (run {run}):")?;
    let ledger = stack.ledger()?;
    let mut failed = 0;
    for (i, report) in reports.iter_mut().enumerate() {
        failed += usize::from(!report::render(i + 1, report, &watch, ledger, out)?);
    }
    writeln!(
        out,
        "\n{} of {} scenarios as they should be; the ledger holds {} business effects in all{}",
        reports.len() - failed,
        reports.len(),
        ledger.effects_total()?,
        if watch.fenced > 0 {
            format!("; {} records of fenced-off owners dropped", watch.fenced)
        } else {
            String::new()
        }
    )?;
    if failed > 0 {
        tails(&stack, out)?;
    }
    anyhow::ensure!(
        failed == 0,
        "{failed} scenario(s) did not end as they should"
    );
    Ok(())
}

/// Starts the processor, the ledger and the first worker, each awaited (bounded).
fn start(
    stack: &mut Stack,
    watch: &mut Watch,
    wait: Duration,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let log = stack.start_processor()?.log.clone();
    writeln!(out, "starting the processor (log {})", log.display())?;
    let partitions = watch.partitions;
    watch.wait_for(
        out,
        "the processor to claim every partition (fence markers on the decisions topic)",
        wait,
        |w| Ok((w.claimed.len() as i32 >= partitions).then_some(())),
    )?;
    let ledger = stack.start_ledger()?;
    writeln!(
        out,
        "the reference ledger listens on {} (log {})",
        ledger.addr,
        ledger.log().display()
    )?;
    let group = stack.default_group();
    let log = stack
        .start_worker("demo-worker-1", &group)?
        .proc
        .log
        .clone();
    writeln!(
        out,
        "starting connector worker demo-worker-1 in group {group} (log {})",
        log.display()
    )?;
    watch.wait_for(
        out,
        "the connector worker to take its dispatch partitions",
        wait,
        |_| {
            let ready = count_lines(&log, "handling dispatch commands from offset");
            Ok((ready as i32 >= partitions).then_some(()))
        },
    )?;
    writeln!(out, "the processor, the ledger and the worker are up")?;
    Ok(())
}

fn binaries(args: &Args) -> anyhow::Result<Binaries> {
    let airlock = std::env::current_exe().context("locating this executable")?;
    let beside = |name: &str| airlock.with_file_name(name);
    let bins = Binaries {
        ledger: args
            .ledger_bin
            .clone()
            .unwrap_or_else(|| beside("airlock-ledger")),
        connector: args
            .connector_bin
            .clone()
            .unwrap_or_else(|| beside("airlock-connector")),
        airlock: airlock.clone(),
    };
    for (what, path) in [("ledger", &bins.ledger), ("connector", &bins.connector)] {
        anyhow::ensure!(
            path.is_file(),
            "no {what} binary at {} (build it: cargo build -p airlock-connectors --bins; or \
             pass --{what}-bin)",
            path.display()
        );
    }
    Ok(bins)
}

/// The last lines of every child's log, after a failure.
fn tails(stack: &Stack, out: &mut dyn Write) -> anyhow::Result<()> {
    for log in stack.logs() {
        writeln!(out, "\n--- last lines of {}", log.display())?;
        for line in process::tail(&log, 8) {
            writeln!(out, "{line}")?;
        }
    }
    Ok(())
}
