//! `airlock run`: one processor instance (see `runtime::run`). Stops gracefully on SIGTERM or
//! SIGINT: finishes the batch, flushes the outbox, leaves the group, exits 0.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::Context;

use crate::capability;
use crate::core::{self, Core};
use crate::runtime::{config::Config, logging, run, signals};
use crate::telemetry::trace;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The configuration file (TOML); every field has a default and an environment override
    /// (see deploy/config/airlock.toml).
    #[arg(long, short, env = "AIRLOCK_CONFIG")]
    pub config: Option<PathBuf>,
}

pub fn run(args: &Args, out: &mut impl Write) -> anyhow::Result<()> {
    let config = Config::load(args.config.as_deref()).context("loading the configuration")?;
    logging::init(&config.instance());
    // Flushes the spans still buffered when `run` returns.
    let _export = trace::init("airlock-processor", &config.telemetry.otlp_endpoint)
        .context("starting the trace exporter")?;
    let core = Arc::new(load_core(&config)?);
    let shutdown = Arc::new(AtomicBool::new(false));
    signals::watch(
        shutdown.clone(),
        "the batch",
        "the outbox is resent on restart",
    )
    .context("watching for SIGTERM/SIGINT")?;
    let summary = run::run(&config, core, shutdown).context("running the processor")?;
    writeln!(
        out,
        "stopped: {} inputs in {} batches, {} dead-lettered, {} records produced, {} partition claims",
        summary.inputs, summary.batches, summary.dead_lettered, summary.produced, summary.claims
    )?;
    Ok(())
}

/// The core's limits and settings that the configuration sets; the rest are the core's
/// defaults.
pub fn core_config(config: &Config) -> core::Config {
    core::Config {
        closed_intent_retention_ms: config.processor.closed_intent_retention_ms,
        key_scope: config.processor.key_scope,
        ..core::Config::default()
    }
}

/// The core the configuration names: tool registry and policy bundle.
pub fn load_core(config: &Config) -> anyhow::Result<Core> {
    let t = &config.tools;
    let (registry, policy) = super::check::load(&t.registry, &t.policies, &t.entities)?;
    log::info!(
        "tool registry {} ({} tools), policy bundle {}",
        registry.hash(),
        registry.tools().count(),
        policy.bundle_hash()
    );
    let connectors: std::collections::BTreeSet<String> =
        registry.tools().map(|t| t.connector.clone()).collect();
    let limits = core_config(config);
    let tenants = policy.principal_tenants();
    if limits.key_scope == core::KeyScope::Global && tenants.len() > 1 {
        log::warn!(
            "processor.key_scope is global and the policy entities name {} tenants ({}): one \
             tenant can take an operation key, run id or proposal id another will use; set \
             key_scope = \"tenant\" (AIRLOCK_KEY_SCOPE=tenant) where tenants do not trust each \
             other",
            tenants.len(),
            tenants.iter().cloned().collect::<Vec<_>>().join(", ")
        );
    }
    let people = policy.people_with_keys();
    let core = with_receipt_key(Core::new(registry, policy, limits), config)?
        .with_person_signatures_required(config.capability.require_person_signatures);
    if !config.capability.require_person_signatures {
        log::warn!(
            "capability.require_person_signatures is off: approvals and controls of people \
             without verifying_keys in the policy entities are taken unsigned ({people} \
             principals have keys registered)"
        );
    }
    let core = with_worker_keys(core, config, &connectors)?;
    let key_file = &config.capability.signing_key_file;
    if key_file.as_os_str().is_empty() {
        log::warn!(
            "capability.signing_key_file is not set: dispatch commands leave unsigned, and \
             connector workers refuse them unless they allow unsigned commands"
        );
        return Ok(core);
    }
    let key =
        capability::load_signing_key(key_file).context("loading the capability signing key")?;
    capability::refuse_demo_key(&key.verifying_key(), "capability.signing_key_file")
        .map_err(anyhow::Error::msg)?;
    log::info!(
        "dispatch commands are signed; verifying key {}",
        hex::encode(key.verifying_key().to_bytes())
    );
    Ok(core.with_capability_key(key))
}

/// The core with each connector's worker verifying keys; warns for every connector of the
/// registry whose outcomes will be taken unsigned.
fn with_worker_keys(
    core: Core,
    config: &Config,
    connectors: &std::collections::BTreeSet<String>,
) -> anyhow::Result<Core> {
    let mut keys = std::collections::BTreeMap::new();
    for (connector, files) in &config.capability.worker_verifying_key_files {
        let loaded = files
            .iter()
            .map(|f| {
                capability::load_verifying_key(f).with_context(|| {
                    format!(
                        "loading capability.worker_verifying_key_files.{connector}: {}",
                        f.display()
                    )
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        keys.insert(connector.clone(), loaded);
    }
    for connector in connectors.iter().filter(|c| !keys.contains_key(*c)) {
        log::warn!(
            "capability.worker_verifying_key_files has no keys for connector {connector}: its \
             outcomes are taken unsigned, from whoever can write the outcomes topic"
        );
    }
    Ok(core.with_worker_keys(keys))
}

fn with_receipt_key(core: Core, config: &Config) -> anyhow::Result<Core> {
    let key_file = &config.receipts.signing_key_file;
    if key_file.as_os_str().is_empty() {
        log::info!(
            "receipts.signing_key_file is not set: receipts are off (no signed receipt chain in \
             {}receipts)",
            config.topics.prefix
        );
        return Ok(core);
    }
    let key = capability::load_signing_key(key_file).context("loading the receipts signing key")?;
    log::info!(
        "receipts are on, chained per partition in {}receipts; verifying key {}",
        config.topics.prefix,
        hex::encode(key.verifying_key().to_bytes())
    );
    Ok(core.with_receipt_key(key))
}
