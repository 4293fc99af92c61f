//! How one tool maps onto an HTTP API: the request, the classification table, the lookup that
//! reconciles it. One `[[tool]]` table each in the connector configuration
//! (`deploy/config/connector-ledger.toml` is the worked example):
//!
//! ```toml
//! [[tool]]
//! name = "refund"                           # the registry's tool name
//! method = "POST"                           # default POST
//! url = "{base_url}/v1/refunds"             # string template (see `template`)
//! idempotency_header = "Idempotency-Key"    # default; "" sends none
//! provider_reference_pointer = "/effect_id" # JSON pointer into a 2xx answer (optional)
//! provider_reference_header = ""            # or a response header (optional)
//! [tool.headers]                            # extra headers, string templates
//! Authorization = "Bearer {env:LEDGER_TOKEN}"
//! [tool.body]                               # absent: the canonical arguments as they are
//! amount = { "$arg" = "/amount" }
//! [tool.classify]
//! failed = [400, 401, 403, 404, 409, 422]   # definitive refusals: proof of no effect
//! committed = []                            # empty: every 2xx
//! [tool.lookup]                             # reconciliation (absent: answers stay UNKNOWN)
//! url = "{base_url}/v1/effects/{idempotency_key}"
//! absent = [404]                            # statuses that prove absence
//! absent_body_contains = '"not_found"'      # and a marker the body must hold ("" = any)
//! ```

use std::collections::BTreeMap;

use hyper::Method;
use hyper::header::{HeaderName, HeaderValue};
use serde::Deserialize;

use super::template;

/// A tool description that cannot work; names the tool and the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tool {tool:?}: {field}: {message}")]
pub struct Error {
    pub tool: String,
    pub field: &'static str,
    pub message: String,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The default definitive refusals: the request was understood and refused, nothing happened.
pub const DEFAULT_FAILED: [u16; 6] = [400, 401, 403, 404, 409, 422];

/// Placeholders of request templates (a dispatch command is at hand).
pub const REQUEST_PLACEHOLDERS: [&str; 5] = [
    "base_url",
    "idempotency_key",
    "operation_key",
    "tool",
    "tenant_id",
];
/// Placeholders of lookup templates (a reconcile command carries no tenant).
pub const LOOKUP_PLACEHOLDERS: [&str; 4] = ["base_url", "idempotency_key", "operation_key", "tool"];

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ToolSpec {
    pub name: String,
    #[serde(default = "post")]
    pub method: String,
    pub url: String,
    /// The body template; `None` sends the canonical arguments unchanged.
    #[serde(default)]
    pub body: Option<serde_json::Value>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default = "idempotency_header")]
    pub idempotency_header: String,
    #[serde(default)]
    pub provider_reference_pointer: String,
    #[serde(default)]
    pub provider_reference_header: String,
    #[serde(default)]
    pub classify: Classify,
    #[serde(default)]
    pub lookup: Option<Lookup>,
}

/// Which statuses prove what; anything else is UNKNOWN.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct Classify {
    /// Definitive refusals (FAILED). Only 4xx, never 408 or 429: those say "not now", not "no".
    pub failed: Vec<u16>,
    /// Proofs of effect (COMMITTED); empty means every 2xx. Only 2xx.
    pub committed: Vec<u16>,
}

impl Default for Classify {
    fn default() -> Self {
        Classify {
            failed: DEFAULT_FAILED.to_vec(),
            committed: Vec::new(),
        }
    }
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Lookup {
    #[serde(default = "get")]
    pub method: String,
    pub url: String,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Statuses that prove the effect is absent (RECONCILED_FAILED).
    #[serde(default = "absent")]
    pub absent: Vec<u16>,
    /// A marker an absence answer's body must contain, so that a 404 of a wrong route is not
    /// taken for a proof of absence; empty accepts any body.
    #[serde(default)]
    pub absent_body_contains: String,
}

fn post() -> String {
    "POST".to_owned()
}
fn get() -> String {
    "GET".to_owned()
}
fn idempotency_header() -> String {
    "Idempotency-Key".to_owned()
}
fn absent() -> Vec<u16> {
    vec![404]
}

/// A tool description checked and with its `{env:...}` placeholders resolved.
#[derive(Clone, Debug)]
pub struct Prepared {
    pub name: String,
    pub method: Method,
    pub url: String,
    pub body: Option<serde_json::Value>,
    pub headers: Vec<(HeaderName, String)>,
    pub idempotency_header: Option<HeaderName>,
    pub provider_reference_pointer: Option<String>,
    pub provider_reference_header: Option<HeaderName>,
    pub classify: Classify,
    pub lookup: Option<PreparedLookup>,
}

#[derive(Clone, Debug)]
pub struct PreparedLookup {
    pub method: Method,
    pub url: String,
    pub headers: Vec<(HeaderName, String)>,
    pub absent: Vec<u16>,
    pub absent_body_contains: String,
}

impl ToolSpec {
    /// Checks the description and resolves `{env:NAME}` through `env`.
    pub fn prepare(&self, env: &impl Fn(&str) -> Option<String>) -> Result<Prepared> {
        let err = |field: &'static str, message: String| Error {
            tool: self.name.clone(),
            field,
            message,
        };
        if self.name.trim().is_empty() {
            return Err(err("name", "must not be empty".to_owned()));
        }
        let method = parse_method(&self.method).map_err(|m| err("method", m))?;
        let url = url_template(&self.url, env, &REQUEST_PLACEHOLDERS).map_err(|m| err("url", m))?;
        if let Some(body) = &self.body {
            template::check_body(body).map_err(|e| err("body", e.to_string()))?;
        }
        let headers = header_templates(&self.headers, env, &REQUEST_PLACEHOLDERS)
            .map_err(|m| err("headers", m))?;
        let idempotency_header = optional_header_name(&self.idempotency_header)
            .map_err(|m| err("idempotency_header", m))?;
        let provider_reference_pointer = match self.provider_reference_pointer.as_str() {
            "" => None,
            p if p.starts_with('/') => Some(p.to_owned()),
            p => {
                return Err(err(
                    "provider_reference_pointer",
                    format!("{p:?} is not a JSON pointer (\"/effect_id\")"),
                ));
            }
        };
        let provider_reference_header = optional_header_name(&self.provider_reference_header)
            .map_err(|m| err("provider_reference_header", m))?;
        for s in &self.classify.failed {
            if !(400..500).contains(s) || *s == 408 || *s == 429 {
                return Err(err(
                    "classify.failed",
                    format!(
                        "{s} does not prove that nothing happened (only 4xx other than 408 and \
                         429 may settle FAILED)"
                    ),
                ));
            }
        }
        for s in &self.classify.committed {
            if !(200..300).contains(s) {
                return Err(err(
                    "classify.committed",
                    format!("{s} is not a 2xx status"),
                ));
            }
        }
        let lookup = match &self.lookup {
            None => None,
            Some(l) => {
                for s in &l.absent {
                    if !(400..500).contains(s) || *s == 408 || *s == 429 {
                        return Err(err(
                            "lookup.absent",
                            format!("{s} does not prove absence (only 4xx other than 408, 429)"),
                        ));
                    }
                }
                Some(PreparedLookup {
                    method: parse_method(&l.method).map_err(|m| err("lookup.method", m))?,
                    url: url_template(&l.url, env, &LOOKUP_PLACEHOLDERS)
                        .map_err(|m| err("lookup.url", m))?,
                    headers: header_templates(&l.headers, env, &LOOKUP_PLACEHOLDERS)
                        .map_err(|m| err("lookup.headers", m))?,
                    absent: l.absent.clone(),
                    absent_body_contains: l.absent_body_contains.clone(),
                })
            }
        };
        Ok(Prepared {
            name: self.name.clone(),
            method,
            url,
            body: self.body.clone(),
            headers,
            idempotency_header,
            provider_reference_pointer,
            provider_reference_header,
            classify: self.classify.clone(),
            lookup,
        })
    }
}

fn parse_method(text: &str) -> Result<Method, String> {
    text.to_ascii_uppercase()
        .parse()
        .map_err(|_| format!("{text:?} is not an HTTP method"))
}

fn url_template(
    text: &str,
    env: &impl Fn(&str) -> Option<String>,
    known: &[&str],
) -> Result<String, String> {
    let text = template::resolve_env(text, env).map_err(|e| e.to_string())?;
    template::check_string(&text, |n| known.contains(&n)).map_err(|e| e.to_string())?;
    if !text.starts_with("{base_url}") && !text.starts_with("http://") {
        return Err(format!(
            "{text:?} must start with {{base_url}} or http:// (https is not built in)"
        ));
    }
    Ok(text)
}

fn header_templates(
    headers: &BTreeMap<String, String>,
    env: &impl Fn(&str) -> Option<String>,
    known: &[&str],
) -> Result<Vec<(HeaderName, String)>, String> {
    headers
        .iter()
        .map(|(name, value)| {
            let header = HeaderName::try_from(name.as_str())
                .map_err(|_| format!("{name:?} is not a header name"))?;
            let value = template::resolve_env(value, env).map_err(|e| format!("{name}: {e}"))?;
            template::check_string(&value, |n| known.contains(&n))
                .map_err(|e| format!("{name}: {e}"))?;
            Ok((header, value))
        })
        .collect()
}

fn optional_header_name(name: &str) -> Result<Option<HeaderName>, String> {
    if name.is_empty() {
        return Ok(None);
    }
    HeaderName::try_from(name)
        .map(Some)
        .map_err(|_| format!("{name:?} is not a header name"))
}

/// Checks that a rendered header value is sendable.
pub fn header_value(name: &HeaderName, value: &str) -> Result<HeaderValue, String> {
    HeaderValue::try_from(value).map_err(|_| format!("header {name} has an unsendable value"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn spec(extra: &str) -> ToolSpec {
        toml::from_str(&format!(
            "name = \"refund\"\nurl = \"{{base_url}}/v1/refunds\"\n{extra}"
        ))
        .unwrap()
    }

    #[test]
    fn the_safe_defaults_apply_when_nothing_is_said() {
        let p = spec("").prepare(&|_| None).unwrap();
        assert_eq!(p.method, Method::POST);
        assert_eq!(p.classify.failed, DEFAULT_FAILED);
        assert!(p.classify.committed.is_empty());
        assert_eq!(p.idempotency_header.unwrap().as_str(), "idempotency-key");
        assert!(p.body.is_none() && p.lookup.is_none());
    }

    #[test]
    fn statuses_that_prove_nothing_cannot_settle_failed() {
        for bad in [
            "[classify]\nfailed = [503]",
            "[classify]\nfailed = [429]",
            "[classify]\ncommitted = [404]",
        ] {
            assert!(spec(bad).prepare(&|_| None).is_err(), "{bad}");
        }
        let lookup = "[lookup]\nurl = \"{base_url}/e/{idempotency_key}\"\nabsent = [500]";
        assert!(spec(lookup).prepare(&|_| None).is_err());
    }

    #[test]
    fn templates_are_checked_and_secrets_resolved_at_load() {
        let p = spec("[headers]\nAuthorization = \"Bearer {env:TOKEN}\"")
            .prepare(&|n| (n == "TOKEN").then(|| "t0k".to_owned()))
            .unwrap();
        assert_eq!(p.headers[0].1, "Bearer t0k");
        assert!(
            spec("[headers]\nAuthorization = \"Bearer {env:TOKEN}\"")
                .prepare(&|_| None)
                .is_err()
        );
        let lookup_with_tenant = "[lookup]\nurl = \"{base_url}/t/{tenant_id}/{idempotency_key}\"";
        assert!(spec(lookup_with_tenant).prepare(&|_| None).is_err());
        let https: ToolSpec = toml::from_str("name = \"x\"\nurl = \"https://api/\"").unwrap();
        assert!(https.prepare(&|_| None).is_err());
    }
}
