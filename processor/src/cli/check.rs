//! `airlock check`: load the tool registry and the policy bundle the processor would run with.

use std::io::Write;
use std::path::PathBuf;

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

pub fn run(args: &Args, out: &mut impl Write) -> anyhow::Result<()> {
    let registry = Registry::load(&args.registry)
        .with_context(|| format!("loading the tool registry {}", args.registry.display()))?;
    let policy = Policy::load(&args.policies, &args.entities).with_context(|| {
        format!(
            "loading the policy bundle {} + {}",
            args.policies.display(),
            args.entities.display()
        )
    })?;
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
