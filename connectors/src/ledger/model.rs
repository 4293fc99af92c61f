//! The ledger's wire types: what clients send (accounts, money requests) and what it answers
//! (effects, balances), their validation, and the canonical form of a request body that decides
//! whether a repeated idempotency key carries "the same body".

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Longest accepted identifier (tenant, account, reference, idempotency key), in bytes.
pub const MAX_ID_LEN: usize = 255;

/// Why a request body is not acceptable; answered as 400 `invalid_request`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("body is not JSON: {0}")]
    NotJson(serde_json::Error),
    #[error("body does not match the request shape: {0}")]
    Shape(serde_json::Error),
    #[error(
        "{field} must be a non-empty string of at most {MAX_ID_LEN} bytes without control characters"
    )]
    BadId { field: &'static str },
    #[error("currency {0:?} is not an ISO 4217 code (three upper-case letters)")]
    BadCurrency(String),
    #[error("{field} must be {rule}, got {value}")]
    BadAmount {
        field: &'static str,
        rule: &'static str,
        value: i64,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The two money movements. The kind is part of what an idempotency key is bound to: the same
/// key on `/v1/debits` and then on `/v1/refunds` is a reused key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// Money out of the account; refused when the balance is too low.
    Debit,
    /// Money back into the account.
    Refund,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Debit => "debit",
            Kind::Refund => "refund",
        }
    }

    pub fn parse(s: &str) -> Option<Kind> {
        match s {
            "debit" => Some(Kind::Debit),
            "refund" => Some(Kind::Refund),
            _ => None,
        }
    }
}

/// Money as integer minor units and an ISO 4217 code; never a float.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Amount {
    pub minor_units: i64,
    pub currency: String,
}

/// `POST /v1/accounts`: an account and its opening balance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccountSpec {
    pub tenant_id: String,
    pub account_id: String,
    pub currency: String,
    /// The opening balance; creating the same account again must repeat it exactly.
    pub balance_minor: i64,
}

impl AccountSpec {
    pub fn validate(&self) -> Result<()> {
        check_id("tenant_id", &self.tenant_id)?;
        check_id("account_id", &self.account_id)?;
        check_currency(&self.currency)?;
        if self.balance_minor < 0 {
            return Err(Error::BadAmount {
                field: "balance_minor",
                rule: "zero or more",
                value: self.balance_minor,
            });
        }
        Ok(())
    }
}

/// An account as stored: `GET /v1/accounts/{account_id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Account {
    pub tenant_id: String,
    pub account_id: String,
    pub currency: String,
    pub balance_minor: i64,
}

/// `POST /v1/debits` and `POST /v1/refunds`. Unknown fields are allowed: they are kept in the
/// stored canonical body and take part in the same-body comparison.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct MoneyRequest {
    pub tenant_id: String,
    pub account_id: String,
    pub amount: Amount,
    /// The business reference (`txn_4821`); stats count effects per reference so a double
    /// refund under two different idempotency keys shows.
    pub reference: String,
    #[serde(default)]
    pub reason: Option<String>,
}

/// A money request as received: the typed fields and the canonical body they came from.
#[derive(Debug, Clone)]
pub struct Submission {
    pub request: MoneyRequest,
    /// The body in canonical JSON (sorted keys, no whitespace): two bodies are "the same" when
    /// their canonical forms are equal.
    pub canonical: String,
}

impl Submission {
    /// Parses and validates a money request body.
    pub fn parse(body: &[u8]) -> Result<Submission> {
        let value: Value = serde_json::from_slice(body).map_err(Error::NotJson)?;
        let canonical = canonical_json(&value);
        let request: MoneyRequest = serde_json::from_value(value).map_err(Error::Shape)?;
        check_id("tenant_id", &request.tenant_id)?;
        check_id("account_id", &request.account_id)?;
        check_id("reference", &request.reference)?;
        check_currency(&request.amount.currency)?;
        if request.amount.minor_units <= 0 {
            return Err(Error::BadAmount {
                field: "amount.minor_units",
                rule: "more than zero",
                value: request.amount.minor_units,
            });
        }
        Ok(Submission { request, canonical })
    }
}

/// A committed business effect, exactly as first answered; replays and lookups return the
/// stored JSON of this verbatim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Effect {
    /// `eff_<n>`, n counting committed effects from 1.
    pub effect_id: String,
    pub idempotency_key: String,
    pub kind: Kind,
    pub tenant_id: String,
    pub account_id: String,
    pub amount: Amount,
    pub reference: String,
    pub balance_after: i64,
    /// RFC 3339 UTC.
    pub committed_at: String,
}

/// Checks an identifier: non-empty, bounded, no control characters.
pub fn check_id(field: &'static str, value: &str) -> Result<()> {
    if value.is_empty() || value.len() > MAX_ID_LEN || value.chars().any(char::is_control) {
        return Err(Error::BadId { field });
    }
    Ok(())
}

fn check_currency(code: &str) -> Result<()> {
    if code.len() == 3 && code.bytes().all(|b| b.is_ascii_uppercase()) {
        Ok(())
    } else {
        Err(Error::BadCurrency(code.to_owned()))
    }
}

/// JSON with object keys sorted and no insignificant whitespace, whatever the `serde_json` map
/// order features of the build are.
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(item, out);
            }
            out.push('}');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    const BODY: &str = r#"{"tenant_id":"acme","account_id":"acc_1",
        "amount":{"minor_units":1250,"currency":"EUR"},"reference":"txn_4821","reason":"late","note":{"b":1,"a":[2,1]}}"#;

    #[test]
    fn reordered_and_reformatted_bodies_are_the_same_body() {
        let a = Submission::parse(BODY.as_bytes()).unwrap();
        let b = Submission::parse(
            br#"{ "note": {"a":[2,1],"b":1}, "reason":"late", "reference":"txn_4821",
                 "amount":{"currency":"EUR","minor_units":1250}, "account_id":"acc_1", "tenant_id":"acme" }"#,
        )
        .unwrap();
        assert_eq!(a.canonical, b.canonical);
        assert_eq!(
            a.canonical,
            r#"{"account_id":"acc_1","amount":{"currency":"EUR","minor_units":1250},"note":{"a":[2,1],"b":1},"reason":"late","reference":"txn_4821","tenant_id":"acme"}"#
        );
        assert_eq!(a.request.amount.minor_units, 1250);
    }

    #[test]
    fn malformed_requests_are_refused_with_the_reason() {
        let cases = [
            (r#"{"tenant_id":"acme""#, "not JSON"),
            (
                r#"{"tenant_id":"acme","account_id":"a","reference":"r"}"#,
                "missing field `amount`",
            ),
            (
                r#"{"tenant_id":"acme","account_id":"a","reference":"r","amount":{"minor_units":1.5,"currency":"EUR"}}"#,
                "request shape",
            ),
            (
                r#"{"tenant_id":"acme","account_id":"a","reference":"r","amount":{"minor_units":0,"currency":"EUR"}}"#,
                "more than zero",
            ),
            (
                r#"{"tenant_id":"acme","account_id":"a","reference":"r","amount":{"minor_units":5,"currency":"eur"}}"#,
                "ISO 4217",
            ),
            (
                r#"{"tenant_id":"","account_id":"a","reference":"r","amount":{"minor_units":5,"currency":"EUR"}}"#,
                "tenant_id must be",
            ),
        ];
        for (body, expected) in cases {
            let err = Submission::parse(body.as_bytes()).unwrap_err().to_string();
            assert!(err.contains(expected), "{body}: {err}");
        }
    }
}
