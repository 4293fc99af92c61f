//! Requests built from a command: URL and header templates with `{placeholder}`s, and JSON body
//! templates with `{"$arg": "/json/pointer"}` and `{"$command": "field"}` substitutions.
//!
//! Body templates (a JSON value, written as TOML tables in the connector configuration):
//!
//! - `{"$arg": "/amount"}` is replaced by the value at that JSON pointer of the command's
//!   canonical arguments. When the arguments have no such value, the member holding it is left
//!   out, or `{"$arg": "/reference", "default": <template>}` gives a replacement (itself a
//!   template).
//! - `{"$command": "operation_key"}` is replaced by a field of the command: `command_id`,
//!   `operation_key`, `idempotency_key`, `tenant_id`, `principal_id`, `tool`, `tool_version`,
//!   `connector`, `proposal_id` (strings) or `epoch` (a number).
//! - Anything else is kept as written.
//!
//! The rendered body is sent in canonical JSON, so every attempt of one intent sends the same
//! bytes (the downstream compares the bodies of repeated idempotency keys).
//!
//! String templates (URLs, header values) replace `{base_url}` as configured and
//! `{idempotency_key}`, `{operation_key}`, `{tool}`, `{tenant_id}` percent-encoded (the last
//! one not in lookups: a reconcile command carries no tenant). `{env:NAME}` is replaced by an
//! environment variable when the configuration is loaded (secrets such as bearer tokens).

use serde_json::{Map, Value};

use airlock_processor::core::canonical;

/// A template that cannot be rendered; nothing was sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("template at {at}: {what}")]
    Invalid { at: String, what: String },
    #[error("template at {at}: the arguments have no value at {pointer} and no default is given")]
    MissingArgument { at: String, pointer: String },
    #[error("placeholder {{{0}}} is unknown or not available here")]
    UnknownPlaceholder(String),
    #[error("template {template:?} has an unclosed placeholder")]
    Unclosed { template: String },
    #[error("environment variable {0} (named in the configuration) is not set")]
    MissingEnv(String),
    #[error("the rendered body has no canonical form: {0}")]
    NotCanonical(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Command fields a template may name with `$command`.
pub const COMMAND_FIELDS: [&str; 10] = [
    "command_id",
    "operation_key",
    "idempotency_key",
    "tenant_id",
    "principal_id",
    "tool",
    "tool_version",
    "connector",
    "proposal_id",
    "epoch",
];

/// What a template may read from the command it renders.
pub trait Fields {
    /// The value of `$command` field `name` (one of [`COMMAND_FIELDS`]), `None` if unknown.
    fn field(&self, name: &str) -> Option<Value>;
}

impl Fields for airlock_schemas::DispatchCommand {
    fn field(&self, name: &str) -> Option<Value> {
        let s = |v: &str| Some(Value::String(v.to_owned()));
        match name {
            "command_id" => s(&self.command_id),
            "operation_key" => s(&self.operation_key),
            "idempotency_key" => s(&self.idempotency_key),
            "tenant_id" => s(&self.tenant_id),
            "principal_id" => s(&self.principal_id),
            "tool" => s(&self.tool),
            "tool_version" => s(&self.tool_version),
            "connector" => s(&self.connector),
            "proposal_id" => s(&self.proposal_id),
            "epoch" => Some(Value::from(self.epoch)),
            _ => None,
        }
    }
}

/// Checks a body template's `$arg` / `$command` objects (at configuration load).
pub fn check_body(template: &Value) -> Result<()> {
    check_at(template, "")
}

fn check_at(template: &Value, at: &str) -> Result<()> {
    let invalid = |what: String| Error::Invalid {
        at: if at.is_empty() {
            "/".to_owned()
        } else {
            at.to_owned()
        },
        what,
    };
    match template {
        Value::Object(map) if map.contains_key("$arg") => {
            if map.keys().any(|k| k != "$arg" && k != "default") {
                return Err(invalid(
                    "an {\"$arg\": ...} object may only hold \"default\" besides".to_owned(),
                ));
            }
            match &map["$arg"] {
                Value::String(p) if p.is_empty() || p.starts_with('/') => {}
                other => {
                    return Err(invalid(format!(
                        "$arg must be a JSON pointer (\"/a/b\"), got {other}"
                    )));
                }
            }
            match map.get("default") {
                Some(default) => check_at(default, &format!("{at}/default")),
                None => Ok(()),
            }
        }
        Value::Object(map) if map.contains_key("$command") => {
            if map.len() != 1 {
                return Err(invalid(
                    "a {\"$command\": ...} object holds nothing else".to_owned(),
                ));
            }
            match &map["$command"] {
                Value::String(f) if COMMAND_FIELDS.contains(&f.as_str()) => Ok(()),
                other => Err(invalid(format!(
                    "$command must name one of {COMMAND_FIELDS:?}, got {other}"
                ))),
            }
        }
        Value::Object(map) => map
            .iter()
            .try_for_each(|(k, v)| check_at(v, &format!("{at}/{k}"))),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .try_for_each(|(i, v)| check_at(v, &format!("{at}/{i}"))),
        _ => Ok(()),
    }
}

/// Renders a body template over `arguments` (the canonical arguments) and `command`, and
/// returns the canonical JSON text of the result.
pub fn render_body(template: &Value, arguments: &Value, command: &impl Fields) -> Result<String> {
    let rendered =
        render_at(template, arguments, command, "")?.ok_or_else(|| Error::MissingArgument {
            at: "/".to_owned(),
            pointer: template
                .get("$arg")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
        })?;
    canonical::canonicalize(&rendered.to_string())
        .map(|c| c.json)
        .map_err(|e| Error::NotCanonical(e.to_string()))
}

/// `None`: an `$arg` without a value and without a default (its member is left out).
fn render_at(
    template: &Value,
    arguments: &Value,
    command: &impl Fields,
    at: &str,
) -> Result<Option<Value>> {
    match template {
        Value::Object(map) if map.contains_key("$arg") => {
            let pointer = map["$arg"].as_str().unwrap_or_default();
            match arguments.pointer(pointer) {
                Some(v) => Ok(Some(v.clone())),
                None => match map.get("default") {
                    Some(default) => render_at(default, arguments, command, at),
                    None => Ok(None),
                },
            }
        }
        Value::Object(map) if map.contains_key("$command") => {
            let name = map["$command"].as_str().unwrap_or_default();
            command
                .field(name)
                .map(Some)
                .ok_or_else(|| Error::UnknownPlaceholder(format!("$command {name}")))
        }
        Value::Object(map) => {
            let mut out = Map::new();
            for (k, v) in map {
                if let Some(v) = render_at(v, arguments, command, &format!("{at}/{k}"))? {
                    out.insert(k.clone(), v);
                }
            }
            Ok(Some(Value::Object(out)))
        }
        Value::Array(items) => {
            let mut out = Vec::with_capacity(items.len());
            for (i, v) in items.iter().enumerate() {
                let at = format!("{at}/{i}");
                match render_at(v, arguments, command, &at)? {
                    Some(v) => out.push(v),
                    None => {
                        return Err(Error::MissingArgument {
                            pointer: v
                                .get("$arg")
                                .and_then(Value::as_str)
                                .unwrap_or("")
                                .to_owned(),
                            at,
                        });
                    }
                }
            }
            Ok(Some(Value::Array(out)))
        }
        other => Ok(Some(other.clone())),
    }
}

/// Replaces every `{env:NAME}` of `text` by the environment variable `NAME` (via `lookup`).
pub fn resolve_env(text: &str, lookup: &impl Fn(&str) -> Option<String>) -> Result<String> {
    substitute(text, |name| match name.strip_prefix("env:") {
        Some(var) => lookup(var)
            .map(Some)
            .ok_or_else(|| Error::MissingEnv(var.to_owned())),
        // Left for the per-request rendering.
        None => Ok(None),
    })
}

/// Renders a string template: each `{name}` is replaced by `value(name)` (already encoded as
/// it must appear); an unknown name is an error.
pub fn render_string(text: &str, value: impl Fn(&str) -> Option<String>) -> Result<String> {
    substitute(text, |name| {
        value(name)
            .map(Some)
            .ok_or_else(|| Error::UnknownPlaceholder(name.to_owned()))
    })
}

/// Checks a string template's placeholders against the names `known` accepts.
pub fn check_string(text: &str, known: impl Fn(&str) -> bool) -> Result<()> {
    render_string(text, |name| known(name).then(String::new)).map(|_| ())
}

/// The placeholder walk: `replace(name)` gives `Some(text)` to substitute, `None` to keep the
/// placeholder as written.
fn substitute(
    text: &str,
    mut replace: impl FnMut(&str) -> Result<Option<String>>,
) -> Result<String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let close = after.find('}').ok_or_else(|| Error::Unclosed {
            template: text.to_owned(),
        })?;
        let name = &after[..close];
        match replace(name)? {
            Some(value) => out.push_str(&value),
            None => {
                out.push('{');
                out.push_str(name);
                out.push('}');
            }
        }
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Percent-encodes everything but RFC 3986's unreserved characters (a path segment or a query
/// value can hold the result as is).
pub fn percent_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    struct Cmd;
    impl Fields for Cmd {
        fn field(&self, name: &str) -> Option<Value> {
            match name {
                "operation_key" => Some(json!("refund:txn_1")),
                "epoch" => Some(json!(2)),
                _ => None,
            }
        }
    }

    fn ledger_template() -> Value {
        json!({
            "tenant_id": {"$arg": "/tenant_id"},
            "account_id": {"$arg": "/account_id"},
            "amount": {"$arg": "/amount"},
            "reference": {"$arg": "/reference", "default": {"$command": "operation_key"}},
            "reason": {"$arg": "/memo"},
            "source": "airlock",
        })
    }

    #[test]
    fn a_body_template_takes_arguments_defaults_and_command_fields() {
        let template = ledger_template();
        check_body(&template).unwrap();
        let args = json!({"tenant_id": "acme", "account_id": "acct-42",
                          "amount": {"minor_units": 2500, "currency": "EUR"}});
        let body = render_body(&template, &args, &Cmd).unwrap();
        assert_eq!(
            body,
            r#"{"account_id":"acct-42","amount":{"currency":"EUR","minor_units":2500},"reference":"refund:txn_1","source":"airlock","tenant_id":"acme"}"#
        );
        let with_reference = json!({"tenant_id": "acme", "account_id": "acct-42",
            "amount": {"minor_units": 1, "currency": "EUR"}, "reference": "txn_9", "memo": "late"});
        let body = render_body(&template, &with_reference, &Cmd).unwrap();
        assert!(body.contains(r#""reference":"txn_9""#), "{body}");
        assert!(body.contains(r#""reason":"late""#), "{body}");
    }

    #[test]
    fn a_missing_argument_without_default_fails_inside_an_array_or_at_the_top() {
        let args = json!({});
        let err = render_body(&json!([{"$arg": "/x"}]), &args, &Cmd).unwrap_err();
        assert!(matches!(err, Error::MissingArgument { .. }), "{err}");
        assert!(render_body(&json!({"$arg": "/x"}), &args, &Cmd).is_err());
        assert_eq!(
            render_body(&json!({"$arg": ""}), &json!({"a": 1}), &Cmd).unwrap(),
            r#"{"a":1}"#
        );
    }

    #[test]
    fn malformed_body_templates_are_refused_at_load() {
        for bad in [
            json!({"a": {"$arg": "x"}}),
            json!({"a": {"$arg": "/x", "other": 1}}),
            json!({"a": {"$command": "secret"}}),
            json!([{"$command": "epoch", "b": 1}]),
        ] {
            assert!(check_body(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn string_templates_substitute_known_placeholders_and_refuse_others() {
        let url = render_string("{base_url}/v1/effects/{idempotency_key}", |n| match n {
            "base_url" => Some("http://ledger:8088".to_owned()),
            "idempotency_key" => Some(percent_encode("alk1-ab/c d")),
            _ => None,
        })
        .unwrap();
        assert_eq!(url, "http://ledger:8088/v1/effects/alk1-ab%2Fc%20d");
        assert!(render_string("{nope}", |_| None).is_err());
        assert!(render_string("{open", |_| Some(String::new())).is_err());
        let env = |n: &str| (n == "TOKEN").then(|| "s3cret".to_owned());
        assert_eq!(
            resolve_env("Bearer {env:TOKEN} {idempotency_key}", &env).unwrap(),
            "Bearer s3cret {idempotency_key}"
        );
        assert!(resolve_env("{env:UNSET}", &env).is_err());
    }
}
