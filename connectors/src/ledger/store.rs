//! The ledger's durable state in one SQLite file: accounts and committed effects.
//!
//! WAL mode with `synchronous=FULL`: a commit is on disk before the call returns, so "commit,
//! then crash" leaves the effect for the next process. One connection behind a mutex serializes
//! every request, and each money request is one `BEGIN IMMEDIATE` transaction covering the
//! idempotency check, the balance update and the effect insert; the idempotency key is also the
//! table's UNIQUE key. Lookups go through the same connection after the writer committed, so a
//! lookup that finds nothing proves no effect with that key is committed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use serde::Serialize;

use super::faults::Fault;
use super::model::{Account, AccountSpec, Amount, Effect, Kind, Submission};
use super::money::{self, Rejection};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot open the ledger database {path}: {source}")]
    Open {
        path: PathBuf,
        source: rusqlite::Error,
    },
    #[error("ledger database: {op} failed: {source}")]
    Sqlite {
        op: &'static str,
        source: rusqlite::Error,
    },
    #[error("ledger database: the stored response of {key} is not JSON: {source}")]
    Corrupt {
        key: String,
        source: serde_json::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS accounts (
    account_id            TEXT PRIMARY KEY,
    tenant_id             TEXT NOT NULL,
    currency              TEXT NOT NULL,
    -- what the creating request said; creating the account again must repeat it
    opening_balance_minor INTEGER NOT NULL,
    balance_minor         INTEGER NOT NULL,
    created_at            TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS effects (
    seq             INTEGER PRIMARY KEY,    -- effect_id = eff_<seq>
    idempotency_key TEXT NOT NULL UNIQUE,
    kind            TEXT NOT NULL CHECK (kind IN ('debit', 'refund')),
    tenant_id       TEXT NOT NULL,
    account_id      TEXT NOT NULL REFERENCES accounts(account_id),
    reference       TEXT NOT NULL,
    amount_minor    INTEGER NOT NULL,
    currency        TEXT NOT NULL,
    balance_after   INTEGER NOT NULL,
    request         TEXT NOT NULL,          -- canonical request body, extra fields included
    response        TEXT NOT NULL,          -- the first answer, replayed verbatim
    committed_at    TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS effects_by_reference ON effects(reference);
";

/// What creating an account did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Created {
    /// A new account.
    Created(Account),
    /// The account exists with the same tenant, currency and opening balance.
    Existing(Account),
    /// The account exists with something else.
    Conflict(Account),
}

/// What a money request did. Everything but `Committed` committed nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// A new effect; `fault` is an injected fault still to play after the commit.
    Committed {
        effect: Effect,
        /// The answer as stored for replays and lookups.
        response: String,
        fault: Option<Fault>,
    },
    /// The key was committed before with the same kind and body: the first answer.
    Replayed { response: String },
    /// The key was committed before with another kind or body.
    KeyReused,
    /// The business rules refuse it.
    Rejected(Rejection),
    /// An injected fault refused it before the commit.
    Faulted(Fault),
}

/// `GET /v1/stats`: counts of committed business effects.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Stats {
    pub effects_total: u64,
    pub by_kind: BTreeMap<String, u64>,
    /// Effects per business reference: more than one refund for a reference is a double refund.
    pub by_reference: BTreeMap<String, u64>,
    pub by_reference_and_kind: BTreeMap<String, BTreeMap<String, u64>>,
    pub by_idempotency_key: BTreeMap<String, u64>,
}

/// `GET /v1/stats?reference=<r>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReferenceStats {
    pub reference: String,
    pub effects: u64,
    pub debits: u64,
    pub refunds: u64,
}

/// The ledger database.
#[derive(Debug)]
pub struct Store {
    conn: Mutex<Connection>,
}

impl Store {
    /// Opens (creating if needed) the database at `path`.
    pub fn open(path: &Path) -> Result<Store> {
        let open_err = |source| Error::Open {
            path: path.to_owned(),
            source,
        };
        let conn = Connection::open(path).map_err(open_err)?;
        let mode: String = conn
            .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
            .map_err(open_err)?;
        if !mode.eq_ignore_ascii_case("wal") {
            log::warn!(
                "{}: journal mode is {mode}, not WAL (in-memory or unsupported file system)",
                path.display()
            );
        }
        conn.execute_batch(
            "PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON; PRAGMA busy_timeout = 5000;",
        )
        .map_err(open_err)?;
        conn.execute_batch(SCHEMA).map_err(open_err)?;
        Ok(Store {
            conn: Mutex::new(conn),
        })
    }

    fn conn(&self) -> MutexGuard<'_, Connection> {
        // A panic mid-transaction drops the transaction, which rolls it back.
        self.conn.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Creates an account, or says how it relates to the existing one.
    pub fn create_account(&self, spec: &AccountSpec, now: &str) -> Result<Created> {
        let mut conn = self.conn();
        let tx = begin(&mut conn)?;
        let existing = tx
            .query_row(
                "SELECT tenant_id, account_id, currency, balance_minor, opening_balance_minor
                 FROM accounts WHERE account_id = ?1",
                [&spec.account_id],
                |row| Ok((account_from_row(row)?, row.get::<_, i64>(4)?)),
            )
            .optional()
            .map_err(sql("read account"))?;
        if let Some((account, opening)) = existing {
            let same = account.tenant_id == spec.tenant_id
                && account.currency == spec.currency
                && opening == spec.balance_minor;
            return Ok(if same {
                Created::Existing(account)
            } else {
                Created::Conflict(account)
            });
        }
        tx.execute(
            "INSERT INTO accounts
                (account_id, tenant_id, currency, opening_balance_minor, balance_minor, created_at)
             VALUES (?1, ?2, ?3, ?4, ?4, ?5)",
            params![
                spec.account_id,
                spec.tenant_id,
                spec.currency,
                spec.balance_minor,
                now
            ],
        )
        .map_err(sql("insert account"))?;
        tx.commit().map_err(sql("commit account"))?;
        Ok(Created::Created(Account {
            tenant_id: spec.tenant_id.clone(),
            account_id: spec.account_id.clone(),
            currency: spec.currency.clone(),
            balance_minor: spec.balance_minor,
        }))
    }

    pub fn account(&self, account_id: &str) -> Result<Option<Account>> {
        read_account(&self.conn(), account_id)
    }

    /// Runs one money request in one transaction. `fault` is asked only when the request is
    /// about to commit a new effect (after the replay check and the business rules): a fault
    /// that does not commit rolls the transaction back.
    pub fn submit(
        &self,
        kind: Kind,
        key: &str,
        submission: &Submission,
        now: &str,
        fault: impl FnOnce() -> Option<Fault>,
    ) -> Result<Outcome> {
        let mut conn = self.conn();
        let tx = begin(&mut conn)?;
        let previous = tx
            .query_row(
                "SELECT kind, request, response FROM effects WHERE idempotency_key = ?1",
                [key],
                |row| {
                    Ok((
                        row.get::<_, String>(0)?,
                        row.get::<_, String>(1)?,
                        row.get(2)?,
                    ))
                },
            )
            .optional()
            .map_err(sql("read effect"))?;
        if let Some((previous_kind, request, response)) = previous {
            return Ok(
                if previous_kind == kind.as_str() && request == submission.canonical {
                    Outcome::Replayed { response }
                } else {
                    Outcome::KeyReused
                },
            );
        }
        let request = &submission.request;
        let account = read_account(&tx, &request.account_id)?;
        let balance_after = match money::apply(account.as_ref(), kind, request) {
            Ok(balance) => balance,
            Err(rejection) => return Ok(Outcome::Rejected(rejection)),
        };
        let fault = fault();
        if let Some(f) = fault.filter(|f| !f.commits()) {
            return Ok(Outcome::Faulted(f));
        }
        let seq: i64 = tx
            .query_row("SELECT COALESCE(MAX(seq), 0) + 1 FROM effects", [], |row| {
                row.get(0)
            })
            .map_err(sql("next effect id"))?;
        let effect = Effect {
            effect_id: format!("eff_{seq}"),
            idempotency_key: key.to_owned(),
            kind,
            tenant_id: request.tenant_id.clone(),
            account_id: request.account_id.clone(),
            amount: Amount {
                minor_units: request.amount.minor_units,
                currency: request.amount.currency.clone(),
            },
            reference: request.reference.clone(),
            balance_after,
            committed_at: now.to_owned(),
        };
        let response = serde_json::to_string(&effect).expect("an effect always serializes");
        tx.execute(
            "UPDATE accounts SET balance_minor = ?2 WHERE account_id = ?1",
            params![request.account_id, balance_after],
        )
        .map_err(sql("update balance"))?;
        tx.execute(
            "INSERT INTO effects (seq, idempotency_key, kind, tenant_id, account_id, reference,
                amount_minor, currency, balance_after, request, response, committed_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
            params![
                seq,
                key,
                kind.as_str(),
                request.tenant_id,
                request.account_id,
                request.reference,
                request.amount.minor_units,
                request.amount.currency,
                balance_after,
                submission.canonical,
                response,
                now
            ],
        )
        .map_err(sql("insert effect"))?;
        tx.commit().map_err(sql("commit effect"))?;
        Ok(Outcome::Committed {
            effect,
            response,
            fault,
        })
    }

    /// The stored answer of the effect committed under `key`; None proves there is none.
    pub fn effect(&self, key: &str) -> Result<Option<serde_json::Value>> {
        let response: Option<String> = self
            .conn()
            .query_row(
                "SELECT response FROM effects WHERE idempotency_key = ?1",
                [key],
                |row| row.get(0),
            )
            .optional()
            .map_err(sql("read effect"))?;
        response
            .map(|r| {
                serde_json::from_str(&r).map_err(|source| Error::Corrupt {
                    key: key.to_owned(),
                    source,
                })
            })
            .transpose()
    }

    pub fn stats(&self) -> Result<Stats> {
        let conn = self.conn();
        let mut stats = Stats::default();
        for kind in [Kind::Debit, Kind::Refund] {
            stats.by_kind.insert(kind.as_str().to_owned(), 0);
        }
        let mut query = conn
            .prepare("SELECT idempotency_key, kind, reference FROM effects")
            .map_err(sql("read stats"))?;
        let rows = query
            .query_map([], |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, String>(2)?,
                ))
            })
            .map_err(sql("read stats"))?;
        for row in rows {
            let (key, kind, reference) = row.map_err(sql("read stats"))?;
            stats.effects_total += 1;
            *stats.by_kind.entry(kind.clone()).or_default() += 1;
            *stats.by_reference.entry(reference.clone()).or_default() += 1;
            *stats
                .by_reference_and_kind
                .entry(reference)
                .or_default()
                .entry(kind)
                .or_default() += 1;
            *stats.by_idempotency_key.entry(key).or_default() += 1;
        }
        Ok(stats)
    }

    pub fn reference_stats(&self, reference: &str) -> Result<ReferenceStats> {
        let (debits, refunds) = self
            .conn()
            .query_row(
                "SELECT COALESCE(SUM(kind = 'debit'), 0), COALESCE(SUM(kind = 'refund'), 0)
                 FROM effects WHERE reference = ?1",
                [reference],
                |row| Ok((row.get::<_, i64>(0)?, row.get::<_, i64>(1)?)),
            )
            .map_err(sql("read stats"))?;
        let (debits, refunds) = (debits.unsigned_abs(), refunds.unsigned_abs());
        Ok(ReferenceStats {
            reference: reference.to_owned(),
            effects: debits + refunds,
            debits,
            refunds,
        })
    }
}

fn begin(conn: &mut Connection) -> Result<rusqlite::Transaction<'_>> {
    conn.transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(sql("begin"))
}

fn sql(op: &'static str) -> impl Fn(rusqlite::Error) -> Error {
    move |source| Error::Sqlite { op, source }
}

fn read_account(conn: &Connection, account_id: &str) -> Result<Option<Account>> {
    conn.query_row(
        "SELECT tenant_id, account_id, currency, balance_minor FROM accounts WHERE account_id = ?1",
        [account_id],
        account_from_row,
    )
    .optional()
    .map_err(sql("read account"))
}

fn account_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Account> {
    Ok(Account {
        tenant_id: row.get(0)?,
        account_id: row.get(1)?,
        currency: row.get(2)?,
        balance_minor: row.get(3)?,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn spec(balance: i64) -> AccountSpec {
        AccountSpec {
            tenant_id: "acme".into(),
            account_id: "acc_1".into(),
            currency: "EUR".into(),
            balance_minor: balance,
        }
    }

    fn refund(reference: &str, minor: i64) -> Submission {
        Submission::parse(
            format!(
                r#"{{"tenant_id":"acme","account_id":"acc_1","reference":"{reference}",
                    "amount":{{"minor_units":{minor},"currency":"EUR"}}}}"#
            )
            .as_bytes(),
        )
        .unwrap()
    }

    #[test]
    fn a_committed_effect_survives_reopening_and_replays_verbatim() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.sqlite");
        let first = {
            let store = Store::open(&path).unwrap();
            assert!(matches!(
                store.create_account(&spec(100), "t0").unwrap(),
                Created::Created(_)
            ));
            match store
                .submit(Kind::Refund, "k1", &refund("txn_1", 50), "t1", || None)
                .unwrap()
            {
                Outcome::Committed {
                    effect, response, ..
                } => {
                    assert_eq!(effect.balance_after, 150);
                    assert_eq!(effect.effect_id, "eff_1");
                    response
                }
                other => panic!("{other:?}"),
            }
        };
        let store = Store::open(&path).unwrap();
        assert_eq!(store.account("acc_1").unwrap().unwrap().balance_minor, 150);
        let replay = store
            .submit(Kind::Refund, "k1", &refund("txn_1", 50), "t2", || {
                panic!("a replay asks for no fault")
            })
            .unwrap();
        assert_eq!(replay, Outcome::Replayed { response: first });
        assert_eq!(
            store
                .submit(Kind::Debit, "k1", &refund("txn_1", 50), "t2", || None)
                .unwrap(),
            Outcome::KeyReused
        );
        assert_eq!(store.stats().unwrap().by_reference["txn_1"], 1);
        let per_ref = store.reference_stats("txn_1").unwrap();
        assert_eq!(
            (per_ref.effects, per_ref.refunds, per_ref.debits),
            (1, 1, 0)
        );
    }

    #[test]
    fn a_fault_before_commit_rolls_everything_back() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("ledger.sqlite")).unwrap();
        store.create_account(&spec(100), "t0").unwrap();
        let outcome = store
            .submit(Kind::Refund, "k1", &refund("txn_1", 50), "t1", || {
                Some(Fault::Refuse)
            })
            .unwrap();
        assert_eq!(outcome, Outcome::Faulted(Fault::Refuse));
        assert_eq!(store.effect("k1").unwrap(), None);
        assert_eq!(store.account("acc_1").unwrap().unwrap().balance_minor, 100);
        assert_eq!(store.stats().unwrap().effects_total, 0);
    }

    #[test]
    fn accounts_are_created_once_and_conflicts_show() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("ledger.sqlite")).unwrap();
        assert!(matches!(
            store.create_account(&spec(100), "t0").unwrap(),
            Created::Created(_)
        ));
        store
            .submit(Kind::Refund, "k1", &refund("r", 5), "t1", || None)
            .unwrap();
        match store.create_account(&spec(100), "t2").unwrap() {
            Created::Existing(account) => assert_eq!(account.balance_minor, 105),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            store.create_account(&spec(7), "t3").unwrap(),
            Created::Conflict(_)
        ));
    }
}
