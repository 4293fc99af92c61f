//! `airlock topics create`: every topic Airlock needs, co-partitioned; refuses to proceed when
//! existing topics have another partition count. With `schema_registry.url` set, it also
//! registers every version of Airlock's schemas there (see `runtime::schema_registry`).

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;

use crate::core::registry::Registry;
use crate::runtime::config::Config;
use crate::runtime::schema_registry;
use crate::runtime::topics::{self, Names};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub action: Action,
}

#[derive(Debug, clap::Subcommand)]
pub enum Action {
    /// Create the missing topics (after checking that the existing ones are co-partitioned).
    Create(Common),
}

#[derive(Debug, clap::Args)]
pub struct Common {
    /// Configuration file (TOML); environment variables override it.
    #[arg(long, short, env = "AIRLOCK_CONFIG")]
    pub config: Option<PathBuf>,
    /// How long to wait for the cluster.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub timeout: Duration,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    let (number, unit) = text
        .find(|c: char| !c.is_ascii_digit())
        .map_or((text, "s"), |i| text.split_at(i));
    let n: u64 = number.parse().map_err(|e| format!("{text:?}: {e}"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        other => Err(format!("{text:?}: unknown unit {other:?} (ms, s, m)")),
    }
}

pub fn run(args: &Args, out: &mut impl Write) -> anyhow::Result<()> {
    let Action::Create(common) = &args.action;
    let config = Config::load(common.config.as_deref()).context("loading the configuration")?;
    create(&config, common.timeout, out)
}

/// Creates the topics `config` and its tool registry need (the missing ones), reporting each.
pub fn create(config: &Config, timeout: Duration, out: &mut impl Write) -> anyhow::Result<()> {
    let registry = Registry::load(&config.tools.registry).with_context(|| {
        format!(
            "loading the tool registry {} (it names the connectors' dispatch topics)",
            config.tools.registry.display()
        )
    })?;
    let specs =
        Names::new(&config.topics.prefix).plan(registry.tools().map(|t| t.connector.as_str()));
    let outcomes_retention: u64 = topics::OUTCOMES_RETENTION_MS.parse()?;
    for tool in registry
        .tools()
        .filter(|t| t.retention_ms > outcomes_retention)
    {
        writeln!(
            out,
            "warning: tool {} v{} keeps its intents {} ms, longer than the outcomes topic \
             keeps the connectors' evidence ({outcomes_retention} ms); raise the topic's \
             retention.ms to match",
            tool.name, tool.version, tool.retention_ms
        )?;
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let report = runtime
        .block_on(topics::create(config, &specs, timeout))
        .with_context(|| format!("creating topics on {}", config.kafka.brokers))?;
    for name in &report.created {
        writeln!(
            out,
            "created  {name} ({} partitions)",
            config.topics.partitions
        )?;
    }
    for name in &report.existing {
        writeln!(
            out,
            "exists   {name} ({} partitions)",
            config.topics.partitions
        )?;
    }
    let url = config.schema_registry.url.trim();
    if !url.is_empty() {
        let client = schema_registry::Client::new(url)?;
        schema_registry::register(&client, &Names::new(&config.topics.prefix), out)
            .with_context(|| format!("registering Airlock's schemas in {url}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_have_units() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("2h").is_err());
    }
}
