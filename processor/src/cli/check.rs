//! `airlock check`: load the tool registry and the policy bundle the processor would run with.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::core::policy::Policy;
use crate::core::registry::Registry;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Tool registry (TOML).
    #[arg(long, env = "AIRLOCK_REGISTRY")]
    pub registry: PathBuf,
    /// Cedar policies.
    #[arg(long, env = "AIRLOCK_POLICIES")]
    pub policies: PathBuf,
    /// Cedar entities (JSON): principals, roles, their attributes.
    #[arg(long, env = "AIRLOCK_ENTITIES")]
    pub entities: PathBuf,
}

/// Loads a tool registry and a policy bundle, each error naming the file at fault.
pub fn load(
    registry: &Path,
    policies: &Path,
    entities: &Path,
) -> anyhow::Result<(Registry, Policy)> {
    let registry = Registry::load(registry)
        .with_context(|| format!("loading the tool registry {}", registry.display()))?;
    let policy = Policy::load(policies, entities).with_context(|| {
        format!(
            "loading the policy bundle {} + {}",
            policies.display(),
            entities.display()
        )
    })?;
    Ok((registry, policy))
}

pub fn run(args: &Args, out: &mut impl Write) -> anyhow::Result<()> {
    let (registry, policy) = load(&args.registry, &args.policies, &args.entities)?;
    writeln!(
        out,
        "registry {} ({})",
        args.registry.display(),
        registry.hash()
    )?;
    for tool in registry.tools() {
        writeln!(
            out,
            "  tool {} v{} → connector {} (idempotent_by_key={}, reconcilable={}, max_attempts={})",
            tool.name,
            tool.version,
            tool.connector,
            tool.contract.idempotent_by_key,
            tool.contract.reconcilable,
            tool.retry.max_attempts
        )?;
    }
    writeln!(out, "policy bundle {}", policy.bundle_hash())?;
    Ok(())
}
