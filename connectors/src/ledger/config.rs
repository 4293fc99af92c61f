//! How a ledger is configured: the `airlock-ledger` command line (every flag has an environment
//! variable) and the seed file of accounts.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::faults::Rule;
use super::model::{self, AccountSpec};

/// Largest accepted request body; larger bodies are answered 413 `body_too_large`.
pub const DEFAULT_BODY_LIMIT: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read the accounts file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("accounts file {path} is not valid JSON: {source}")]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("accounts file {path} is not valid TOML: {source}")]
    Toml {
        path: PathBuf,
        source: toml::de::Error,
    },
    #[error("accounts file {path}: account #{index}: {source}")]
    Invalid {
        path: PathBuf,
        index: usize,
        source: model::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The reference ledger: a downstream system with debits, refunds, idempotency keys, lookups
/// and injectable faults, for the demo and the tests.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "airlock-ledger", version)]
pub struct Args {
    /// Address to listen on; port 0 picks a free port. The bound address is printed on stdout
    /// as the first line: `listening on <addr>`.
    #[arg(long, env = "AIRLOCK_LEDGER_LISTEN", default_value = "127.0.0.1:8088")]
    pub listen: String,
    /// SQLite database file (created if missing).
    #[arg(long, env = "AIRLOCK_LEDGER_DB")]
    pub db: PathBuf,
    /// Accounts to create at start (JSON, or TOML when the name ends in .toml); accounts that
    /// already exist must match.
    #[arg(long, env = "AIRLOCK_LEDGER_ACCOUNTS")]
    pub accounts: Option<PathBuf>,
    /// Fault rule armed at start, repeatable:
    /// `<fault>[@reference=<r>,account=<a>,kind=debit|refund][*<times>]`
    /// (the environment variable separates rules with `;`).
    #[arg(long = "fault", env = "AIRLOCK_LEDGER_FAULTS", value_delimiter = ';')]
    pub faults: Vec<Rule>,
    /// Largest accepted request body in bytes.
    #[arg(long, env = "AIRLOCK_LEDGER_BODY_LIMIT", default_value_t = DEFAULT_BODY_LIMIT)]
    pub body_limit: usize,
    /// On SIGTERM/SIGINT, how long open requests may take to finish, in milliseconds.
    #[arg(
        long,
        env = "AIRLOCK_LEDGER_SHUTDOWN_GRACE_MS",
        default_value_t = 10_000
    )]
    pub shutdown_grace_ms: u64,
}

impl Args {
    pub fn into_config(self) -> Result<Config> {
        let accounts = match &self.accounts {
            Some(path) => load_accounts(path)?,
            None => Vec::new(),
        };
        Ok(Config {
            listen: self.listen,
            db: self.db,
            accounts,
            faults: self.faults,
            body_limit: self.body_limit,
            shutdown_grace: Duration::from_millis(self.shutdown_grace_ms),
        })
    }
}

/// A ledger's configuration, as the binary or a test builds it.
#[derive(Debug, Clone)]
pub struct Config {
    /// `host:port`; port 0 picks a free port.
    pub listen: String,
    pub db: PathBuf,
    /// Accounts created at start if missing (an existing account must match).
    pub accounts: Vec<AccountSpec>,
    /// Fault rules armed at start.
    pub faults: Vec<Rule>,
    pub body_limit: usize,
    /// How long open requests may take to finish once shutdown starts.
    pub shutdown_grace: Duration,
}

impl Config {
    /// A ledger on a free port of 127.0.0.1 over the database at `db`, no accounts, no faults.
    pub fn local(db: impl Into<PathBuf>) -> Config {
        Config {
            listen: "127.0.0.1:0".to_owned(),
            db: db.into(),
            accounts: Vec::new(),
            faults: Vec::new(),
            body_limit: DEFAULT_BODY_LIMIT,
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SeedTable {
    accounts: Vec<AccountSpec>,
}

/// Reads a seed file: JSON `[{account}, ...]` or `{"accounts": [...]}`, or TOML with
/// `[[accounts]]` tables when the file name ends in `.toml`.
pub fn load_accounts(path: &Path) -> Result<Vec<AccountSpec>> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.to_owned(),
        source,
    })?;
    let json_err = |source| Error::Json {
        path: path.to_owned(),
        source,
    };
    let accounts = if path.extension().is_some_and(|e| e == "toml") {
        toml::from_str::<SeedTable>(&text)
            .map_err(|source| Error::Toml {
                path: path.to_owned(),
                source,
            })?
            .accounts
    } else if text.trim_start().starts_with('[') {
        serde_json::from_str(&text).map_err(json_err)?
    } else {
        serde_json::from_str::<SeedTable>(&text)
            .map_err(json_err)?
            .accounts
    };
    for (index, account) in accounts.iter().enumerate() {
        account.validate().map_err(|source| Error::Invalid {
            path: path.to_owned(),
            index,
            source,
        })?;
    }
    Ok(accounts)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use clap::Parser;

    use super::*;
    use crate::ledger::faults::Fault;

    #[test]
    fn seed_files_load_from_json_and_toml() {
        let dir = tempfile::tempdir().unwrap();
        let json = dir.path().join("accounts.json");
        std::fs::write(
            &json,
            r#"{"accounts":[{"tenant_id":"acme","account_id":"acc_1","currency":"EUR","balance_minor":100}]}"#,
        )
        .unwrap();
        let toml = dir.path().join("accounts.toml");
        std::fs::write(
            &toml,
            "[[accounts]]\ntenant_id = \"acme\"\naccount_id = \"acc_1\"\ncurrency = \"EUR\"\nbalance_minor = 100\n",
        )
        .unwrap();
        assert_eq!(load_accounts(&json).unwrap(), load_accounts(&toml).unwrap());

        std::fs::write(
            &json,
            r#"[{"tenant_id":"acme","account_id":"acc_1","currency":"euro","balance_minor":1}]"#,
        )
        .unwrap();
        let err = load_accounts(&json).unwrap_err().to_string();
        assert!(
            err.contains("account #0") && err.contains("ISO 4217"),
            "{err}"
        );
    }

    #[test]
    fn the_command_line_arms_faults_and_explains_bad_ones() {
        let args = Args::try_parse_from([
            "airlock-ledger",
            "--db",
            "x.sqlite",
            "--fault",
            "drop-response@reference=txn_1",
            "--fault",
            "delay=20*0",
        ])
        .unwrap();
        let config = args.into_config().unwrap();
        assert_eq!(config.faults.len(), 2);
        assert_eq!(config.faults[0].fault, Fault::DropResponse);
        assert_eq!(config.faults[1].times, 0);

        let err = Args::try_parse_from(["airlock-ledger", "--db", "x", "--fault", "explode"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown fault \"explode\""), "{err}");
    }
}
