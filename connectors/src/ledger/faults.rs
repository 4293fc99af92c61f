//! Injectable faults: the ways a downstream system misbehaves that a connector must classify
//! correctly (a lost response, a slow commit, an error after the fact, a crash).
//!
//! A fault is armed for one request by the `Ledger-Fault: <fault>` header, or armed as a
//! [`Rule`] (at start by `--fault`, at runtime by `POST /v1/faults`) that the next matching
//! money requests consume, oldest rule first. Faults only touch requests that would commit a new
//! effect: a replay of a committed key is a lookup, and a request the ledger refuses anyway
//! (unknown account, insufficient funds, reused key) consumes nothing.
//!
//! Rule syntax (`--fault`, `AIRLOCK_LEDGER_FAULTS` separated by `;`):
//! `<fault>[@<cond>[,<cond>...]][*<times>]` where `<fault>` is one of `delay=<ms>`,
//! `drop-response`, `refuse`, `error-after-commit`, `error-before-commit`, `crash-after-commit`;
//! `<cond>` is `reference=<r>`, `account=<a>` or `kind=debit|refund` (all must match); `<times>`
//! is how many requests the rule hits (default 1, 0 = every matching request, forever).

use std::fmt;
use std::str::FromStr;
use std::sync::{Mutex, PoisonError};

use serde::{Deserialize, Serialize};

use super::model::{Kind, MoneyRequest};

/// A fault description that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error(
        "unknown fault {0:?}: expected delay=<ms>, drop-response, refuse, error-after-commit, error-before-commit or crash-after-commit"
    )]
    UnknownFault(String),
    #[error("delay needs a whole number of milliseconds (delay=<ms>), got {0:?}")]
    BadDelay(String),
    #[error("unknown condition {0:?}: expected reference=<r>, account=<a> or kind=debit|refund")]
    UnknownCondition(String),
    #[error("kind must be debit or refund, got {0:?}")]
    BadKind(String),
    #[error("condition {0} is given twice")]
    DuplicateCondition(&'static str),
    #[error("times must be a whole number (0 = forever), got {0:?}")]
    BadTimes(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// One way to misbehave on one money request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Commit, then wait this many milliseconds before answering (a client times out).
    Delay { ms: u64 },
    /// Commit durably, then close the connection without a single response byte.
    DropResponse,
    /// Refuse before committing with 422 `injected_refusal`: proof nothing happened.
    Refuse,
    /// Commit, then answer 500: an error that does not mean it did not happen.
    ErrorAfterCommit,
    /// Answer 503 without committing: ambiguous to the client, but nothing happened.
    ErrorBeforeCommit,
    /// Commit durably, then exit the process at once without answering.
    CrashAfterCommit,
}

impl Fault {
    /// Whether the request still commits its effect under this fault.
    pub fn commits(self) -> bool {
        !matches!(self, Fault::Refuse | Fault::ErrorBeforeCommit)
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::Delay { ms } => write!(f, "delay={ms}"),
            Fault::DropResponse => f.write_str("drop-response"),
            Fault::Refuse => f.write_str("refuse"),
            Fault::ErrorAfterCommit => f.write_str("error-after-commit"),
            Fault::ErrorBeforeCommit => f.write_str("error-before-commit"),
            Fault::CrashAfterCommit => f.write_str("crash-after-commit"),
        }
    }
}

impl FromStr for Fault {
    type Err = Error;

    fn from_str(s: &str) -> Result<Fault> {
        let s = s.trim();
        if let Some(ms) = s.strip_prefix("delay=") {
            return ms
                .trim()
                .parse()
                .map(|ms| Fault::Delay { ms })
                .map_err(|_| Error::BadDelay(ms.to_owned()));
        }
        match s {
            "drop-response" => Ok(Fault::DropResponse),
            "refuse" => Ok(Fault::Refuse),
            "error-after-commit" => Ok(Fault::ErrorAfterCommit),
            "error-before-commit" => Ok(Fault::ErrorBeforeCommit),
            "crash-after-commit" => Ok(Fault::CrashAfterCommit),
            "delay" => Err(Error::BadDelay(String::new())),
            other => Err(Error::UnknownFault(other.to_owned())),
        }
    }
}

impl Serialize for Fault {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Fault {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Fault, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Which money requests a rule applies to; an empty match applies to all.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Match {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<Kind>,
}

impl Match {
    pub fn matches(&self, kind: Kind, request: &MoneyRequest) -> bool {
        self.reference
            .as_ref()
            .is_none_or(|r| *r == request.reference)
            && self
                .account_id
                .as_ref()
                .is_none_or(|a| *a == request.account_id)
            && self.kind.is_none_or(|k| k == kind)
    }
}

fn one() -> u32 {
    1
}

/// A fault to inject into the next `times` matching requests; also the body of
/// `POST /v1/faults`: `{"fault":"drop-response","match":{"reference":"txn_1"},"times":1}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    pub fault: Fault,
    #[serde(default, rename = "match")]
    pub matcher: Match,
    /// How many requests it hits; 0 = every matching request, forever.
    #[serde(default = "one")]
    pub times: u32,
}

impl FromStr for Rule {
    type Err = Error;

    /// `<fault>[@<cond>[,<cond>...]][*<times>]`.
    fn from_str(s: &str) -> Result<Rule> {
        let s = s.trim();
        let (rest, times) = match s.rsplit_once('*') {
            Some((rest, times)) => (
                rest,
                times
                    .trim()
                    .parse()
                    .map_err(|_| Error::BadTimes(times.to_owned()))?,
            ),
            None => (s, 1),
        };
        let (fault, conditions) = match rest.split_once('@') {
            Some((fault, conditions)) => (fault, Some(conditions)),
            None => (rest, None),
        };
        let mut matcher = Match::default();
        for cond in conditions.into_iter().flat_map(|c| c.split(',')) {
            let (key, value) = cond
                .split_once('=')
                .ok_or_else(|| Error::UnknownCondition(cond.to_owned()))?;
            let (key, value) = (key.trim(), value.trim().to_owned());
            match key {
                "reference" => set_once(&mut matcher.reference, "reference", value)?,
                "account" | "account_id" => set_once(&mut matcher.account_id, "account", value)?,
                "kind" => {
                    let kind = Kind::parse(&value).ok_or(Error::BadKind(value))?;
                    set_once(&mut matcher.kind, "kind", kind)?;
                }
                _ => return Err(Error::UnknownCondition(cond.to_owned())),
            }
        }
        Ok(Rule {
            fault: fault.parse()?,
            matcher,
            times,
        })
    }
}

fn set_once<T>(slot: &mut Option<T>, name: &'static str, value: T) -> Result<()> {
    if slot.replace(value).is_some() {
        return Err(Error::DuplicateCondition(name));
    }
    Ok(())
}

/// An armed rule as `GET /v1/faults` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Armed {
    /// Arming order; lower ids are consumed first.
    pub id: u64,
    pub fault: Fault,
    #[serde(rename = "match")]
    pub matcher: Match,
    pub times: u32,
    /// Hits left; None while `times` is 0 (forever).
    pub remaining: Option<u32>,
}

/// The armed rules, consumed in arming order by matching requests.
#[derive(Debug, Default)]
pub struct FaultBook {
    inner: Mutex<Book>,
}

#[derive(Debug, Default)]
struct Book {
    next_id: u64,
    armed: Vec<Armed>,
}

impl FaultBook {
    pub fn new(rules: impl IntoIterator<Item = Rule>) -> FaultBook {
        let book = FaultBook::default();
        for rule in rules {
            book.arm(rule);
        }
        book
    }

    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        // The book is consistent after every statement: a panic elsewhere cannot break it.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn arm(&self, rule: Rule) -> Armed {
        let mut book = self.book();
        book.next_id += 1;
        let armed = Armed {
            id: book.next_id,
            fault: rule.fault,
            matcher: rule.matcher,
            times: rule.times,
            remaining: (rule.times > 0).then_some(rule.times),
        };
        book.armed.push(armed.clone());
        armed
    }

    pub fn list(&self) -> Vec<Armed> {
        self.book().armed.clone()
    }

    /// Disarms every rule; returns how many there were.
    pub fn clear(&self) -> usize {
        std::mem::take(&mut self.book().armed).len()
    }

    /// Consumes one hit of the oldest rule matching this request, if any. Call it only for a
    /// request that is about to commit a new effect.
    pub fn take(&self, kind: Kind, request: &MoneyRequest) -> Option<Fault> {
        let mut book = self.book();
        let index = book
            .armed
            .iter()
            .position(|a| a.matcher.matches(kind, request))?;
        let armed = &mut book.armed[index];
        let fault = armed.fault;
        if let Some(remaining) = armed.remaining.as_mut() {
            *remaining -= 1;
            if *remaining == 0 {
                book.armed.remove(index);
            }
        }
        Some(fault)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::ledger::model::Amount;

    fn request(reference: &str, account: &str) -> MoneyRequest {
        MoneyRequest {
            tenant_id: "acme".into(),
            account_id: account.into(),
            amount: Amount {
                minor_units: 1,
                currency: "EUR".into(),
            },
            reference: reference.into(),
            reason: None,
        }
    }

    #[test]
    fn rules_parse_from_the_documented_syntax() {
        let rule: Rule = "delay=250@reference=txn_1,kind=refund*3".parse().unwrap();
        assert_eq!(rule.fault, Fault::Delay { ms: 250 });
        assert_eq!(rule.matcher.reference.as_deref(), Some("txn_1"));
        assert_eq!(rule.matcher.kind, Some(Kind::Refund));
        assert_eq!(rule.matcher.account_id, None);
        assert_eq!(rule.times, 3);

        let rule: Rule = "drop-response@account=acc_9".parse().unwrap();
        assert_eq!(rule.fault, Fault::DropResponse);
        assert_eq!(rule.matcher.account_id.as_deref(), Some("acc_9"));
        assert_eq!(rule.times, 1);

        let rule: Rule = "refuse*0".parse().unwrap();
        assert_eq!((rule.fault, rule.times), (Fault::Refuse, 0));
        assert_eq!(rule.matcher, Match::default());

        for fault in [
            "delay=0",
            "drop-response",
            "refuse",
            "error-after-commit",
            "error-before-commit",
            "crash-after-commit",
        ] {
            assert_eq!(fault.parse::<Fault>().unwrap().to_string(), fault);
        }
    }

    #[test]
    fn bad_rules_say_what_is_wrong() {
        let err = |s: &str| s.parse::<Rule>().unwrap_err();
        assert_eq!(err("explode"), Error::UnknownFault("explode".into()));
        assert_eq!(err("delay=soon"), Error::BadDelay("soon".into()));
        assert_eq!(err("delay"), Error::BadDelay(String::new()));
        assert_eq!(err("refuse*twice"), Error::BadTimes("twice".into()));
        assert_eq!(
            err("refuse@colour=red"),
            Error::UnknownCondition("colour=red".into())
        );
        assert_eq!(
            err("refuse@kind=transfer"),
            Error::BadKind("transfer".into())
        );
        assert_eq!(
            err("refuse@kind=debit,kind=refund"),
            Error::DuplicateCondition("kind")
        );
        assert!(err("explode").to_string().contains("drop-response"));
    }

    #[test]
    fn json_rules_default_to_one_hit_and_refuse_typos() {
        let rule: Rule = serde_json::from_str(r#"{"fault":"refuse"}"#).unwrap();
        assert_eq!((rule.fault, rule.times), (Fault::Refuse, 1));
        let rule: Rule = serde_json::from_str(
            r#"{"fault":"delay=5","match":{"kind":"debit","reference":"r"},"times":0}"#,
        )
        .unwrap();
        assert_eq!(rule.matcher.kind, Some(Kind::Debit));
        assert!(serde_json::from_str::<Rule>(r#"{"fault":"refuse","tims":2}"#).is_err());
        assert!(serde_json::from_str::<Rule>(r#"{"fault":"nope"}"#).is_err());
    }

    #[test]
    fn matching_requests_consume_the_oldest_rule_first() {
        let book = FaultBook::new([
            "refuse@reference=a".parse().unwrap(),
            "error-before-commit*2".parse().unwrap(),
            "delay=1*0".parse().unwrap(),
        ]);
        let (a, b) = (request("a", "acc"), request("b", "acc"));
        assert_eq!(book.take(Kind::Debit, &b), Some(Fault::ErrorBeforeCommit));
        assert_eq!(book.take(Kind::Debit, &a), Some(Fault::Refuse));
        assert_eq!(book.take(Kind::Debit, &a), Some(Fault::ErrorBeforeCommit));
        assert_eq!(book.take(Kind::Debit, &a), Some(Fault::Delay { ms: 1 }));
        assert_eq!(book.take(Kind::Refund, &b), Some(Fault::Delay { ms: 1 }));
        let left = book.list();
        assert_eq!(left.len(), 1);
        assert_eq!((left[0].id, left[0].remaining), (3, None));
        assert_eq!(book.clear(), 1);
        assert_eq!(book.take(Kind::Debit, &a), None);
    }

    #[test]
    fn conditions_narrow_a_rule() {
        let book = FaultBook::new(["refuse@account=acc_2,kind=refund".parse().unwrap()]);
        assert_eq!(book.take(Kind::Refund, &request("r", "acc_1")), None);
        assert_eq!(book.take(Kind::Debit, &request("r", "acc_2")), None);
        assert_eq!(
            book.take(Kind::Refund, &request("r", "acc_2")),
            Some(Fault::Refuse)
        );
        assert!(book.list().is_empty());
    }
}
