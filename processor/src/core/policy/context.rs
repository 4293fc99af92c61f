//! The Cedar request context, built from only what the policies can read.
//!
//! Turning JSON arguments into Cedar values is a good part of an authorization's cost, and most
//! policies read one or two arguments (`context.arguments.amount.minor_units`). At load, each
//! per-tool policy set is searched for the ways it reaches into `context`: a chain of attribute
//! reads from `context` (`context.a.b`, `context["a"].b`, `context.a has b`) names a path; any
//! other use of `context` (passing it whole, an expression the search does not know) needs all
//! of it. The request's `arguments` then carry only the fields on those paths, each path's
//! value whole. A policy can only observe the context through such reads, so every policy
//! evaluates exactly as over the whole context: the same values, the same missing attributes,
//! the same type errors (a value that is not a record where the path goes on is kept whole).
//!
//! Validity is still judged on all the arguments: a null inside an array or a number that is not
//! a 64-bit integer anywhere in them denies the request as before, read or not.

use std::collections::BTreeMap;

use cedar_policy::{Context, PolicySet, RestrictedExpression};
use serde_json::Value;

use super::AuthzRequest;

/// Which parts of `context.arguments` a policy set can read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reads {
    /// All of them (or the policies could not be analysed).
    All,
    /// Only these fields, each either read whole or read further.
    Fields(BTreeMap<String, Reads>),
}

impl Reads {
    fn none() -> Self {
        Reads::Fields(BTreeMap::new())
    }

    /// What `set`'s policies can read of `context.arguments`.
    pub fn of(set: &PolicySet) -> Self {
        let mut reads = Reads::none();
        for policy in set.policies() {
            let Ok(est) = policy.to_json() else {
                return Reads::All;
            };
            let mut paths = Vec::new();
            context_paths(&est, &mut paths);
            for path in paths {
                match path.split_first() {
                    // `context` whole.
                    None => return Reads::All,
                    Some((top, rest)) if top == "arguments" => reads.add(rest),
                    Some(_) => {}
                }
            }
        }
        reads
    }

    fn add(&mut self, path: &[String]) {
        let Reads::Fields(fields) = self else {
            return;
        };
        match path.split_first() {
            None => *self = Reads::All,
            Some((first, rest)) => fields
                .entry(first.clone())
                .or_insert_with(Reads::none)
                .add(rest),
        }
    }
}

/// Every chain of attribute reads starting at `context` in a policy's JSON form (Cedar's EST),
/// as the attribute names; an empty path for a use of `context` that is not such a chain.
fn context_paths(node: &Value, out: &mut Vec<Vec<String>>) {
    if let Some(path) = chain(node) {
        out.push(path);
        return;
    }
    // `context.a has b` reads whether `b` exists: path `a.b`.
    if let Some(has) = node.get("has")
        && let (Some(left), Some(Value::String(attr))) = (has.get("left"), has.get("attr"))
        && let Some(mut path) = chain(left)
    {
        path.push(attr.clone());
        out.push(path);
        return;
    }
    match node {
        Value::Object(map) => map.values().for_each(|v| context_paths(v, out)),
        Value::Array(items) => items.iter().for_each(|v| context_paths(v, out)),
        _ => {}
    }
}

/// `Some(path)` when `node` is `context` followed by attribute reads.
fn chain(node: &Value) -> Option<Vec<String>> {
    let map = node.as_object()?;
    if map.len() != 1 {
        return None;
    }
    if map.get("Var").and_then(Value::as_str) == Some("context") {
        return Some(Vec::new());
    }
    let access = map.get(".")?;
    let attr = access.get("attr")?.as_str()?;
    let mut path = chain(access.get("left")?)?;
    path.push(attr.to_owned());
    Some(path)
}

/// The request context: tenant, tool version, resource and run id, and the arguments that
/// `reads` names.
pub fn build(req: &AuthzRequest<'_>, reads: &Reads) -> Result<Context, String> {
    let mut pairs = vec![
        (
            "tenant".to_owned(),
            RestrictedExpression::new_string(req.tenant.to_owned()),
        ),
        (
            "tool_version".to_owned(),
            RestrictedExpression::new_string(req.tool_version.to_owned()),
        ),
        (
            "resource".to_owned(),
            RestrictedExpression::new_string(req.resource.to_owned()),
        ),
        (
            "run_id".to_owned(),
            RestrictedExpression::new_string(req.run_id.to_owned()),
        ),
    ];
    let mut path = String::from("/arguments");
    check(req.arguments, &mut path)?;
    if let Some(arguments) = restricted(req.arguments, reads, &mut path)? {
        pairs.push(("arguments".to_owned(), arguments));
    }
    Context::from_pairs(pairs).map_err(|error| format!("context: {error}"))
}

/// The errors [`restricted`] would meet converting all of `value`, without converting it.
fn check(value: &Value, path: &mut String) -> Result<(), String> {
    match value {
        Value::Number(number) if number.as_i64().is_none() => Err(format!(
            "context {path}: number {number} is not a 64-bit integer (Cedar has no floats)"
        )),
        Value::Array(items) => {
            for (index, item) in items.iter().enumerate() {
                let base = path.len();
                path.push('/');
                path.push_str(&index.to_string());
                if item.is_null() {
                    return Err(format!(
                        "context {path}: null inside an array (Cedar has no null)"
                    ));
                }
                check(item, path)?;
                path.truncate(base);
            }
            Ok(())
        }
        Value::Object(map) => {
            for (key, item) in map {
                let base = path.len();
                push_key(path, key);
                check(item, path)?;
                path.truncate(base);
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Converts the part of `value` that `reads` names to a Cedar value. `Ok(None)` means "null":
/// the caller drops the field. `path` is the JSON pointer of `value`, for messages.
fn restricted(
    value: &Value,
    reads: &Reads,
    path: &mut String,
) -> Result<Option<RestrictedExpression>, String> {
    Ok(Some(match (value, reads) {
        (Value::Null, _) => return Ok(None),
        (Value::Object(map), reads) => {
            // The fields `reads` names that are present, each with what is read of it.
            let fields: Vec<(&String, &Value, &Reads)> = match reads {
                Reads::All => map.iter().map(|(k, v)| (k, v, &Reads::All)).collect(),
                Reads::Fields(fields) => fields
                    .iter()
                    .filter_map(|(k, inner)| map.get(k).map(|v| (k, v, inner)))
                    .collect(),
            };
            let mut record = Vec::with_capacity(fields.len());
            for (key, item, inner) in fields {
                let base = path.len();
                push_key(path, key);
                if let Some(field) = restricted(item, inner, path)? {
                    record.push((key.clone(), field));
                }
                path.truncate(base);
            }
            RestrictedExpression::new_record(record)
                .map_err(|error| format!("context {path}: {error}"))?
        }
        (Value::Bool(flag), _) => RestrictedExpression::new_bool(*flag),
        (Value::Number(number), _) => match number.as_i64() {
            Some(integer) => RestrictedExpression::new_long(integer),
            None => {
                return Err(format!(
                    "context {path}: number {number} is not a 64-bit integer (Cedar has no floats)"
                ));
            }
        },
        (Value::String(text), _) => RestrictedExpression::new_string(text.clone()),
        (Value::Array(items), _) => {
            let mut elements = Vec::with_capacity(items.len());
            for (index, item) in items.iter().enumerate() {
                let base = path.len();
                path.push('/');
                path.push_str(&index.to_string());
                match restricted(item, &Reads::All, path)? {
                    Some(element) => elements.push(element),
                    None => {
                        return Err(format!(
                            "context {path}: null inside an array (Cedar has no null)"
                        ));
                    }
                }
                path.truncate(base);
            }
            RestrictedExpression::new_set(elements)
        }
    }))
}

fn push_key(path: &mut String, key: &str) {
    path.push('/');
    path.push_str(&key.replace('~', "~0").replace('/', "~1"));
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::str::FromStr;

    use super::*;

    fn reads(policies: &str) -> Reads {
        Reads::of(&PolicySet::from_str(policies).unwrap())
    }

    fn fields(entries: &[(&str, Reads)]) -> Reads {
        Reads::Fields(
            entries
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.clone()))
                .collect(),
        )
    }

    #[test]
    fn attribute_chains_name_the_arguments_policies_read() {
        assert_eq!(
            reads(
                r#"permit (principal, action, resource)
                   when { context.arguments.amount.minor_units <= 10000
                          && context["arguments"]["currency"] == "EUR"
                          && context.arguments.order has id
                          && context.tenant == "t" };"#
            ),
            fields(&[
                ("amount", fields(&[("minor_units", Reads::All)])),
                ("currency", Reads::All),
                ("order", fields(&[("id", Reads::All)])),
            ])
        );
        assert_eq!(
            reads("permit (principal, action, resource) when { context.tenant == \"t\" };"),
            fields(&[])
        );
    }

    #[test]
    fn context_or_arguments_used_whole_need_all_of_them() {
        for policy in [
            "permit (principal, action, resource) when { context.arguments == {} };",
            "permit (principal, action, resource) when { context has arguments && context == {} };",
            "permit (principal, action, resource) when { context.arguments.a == 1 } \
             unless { context.arguments like \"*\" };",
        ] {
            assert_eq!(reads(policy), Reads::All, "{policy}");
        }
    }

    #[test]
    fn arguments_nobody_reads_still_make_a_request_invalid() {
        let reads = fields(&[("amount", Reads::All)]);
        let request = |arguments: &Value| {
            build(
                &AuthzRequest {
                    principal: "p",
                    tenant: "t",
                    tool: "refund",
                    tool_version: "1",
                    resource: "r",
                    run_id: "run",
                    arguments,
                },
                &reads,
            )
            .map(|_| ())
        };
        assert_eq!(
            request(&serde_json::json!({"amount": 1, "notes": ["a"]})),
            Ok(())
        );
        assert_eq!(
            request(&serde_json::json!({"amount": 1, "notes": ["a", null]})),
            Err("context /arguments/notes/1: null inside an array (Cedar has no null)".to_owned())
        );
        assert_eq!(
            request(&serde_json::json!({"amount": 1, "rate": 0.5})),
            Err(
                "context /arguments/rate: number 0.5 is not a 64-bit integer (Cedar has no floats)"
                    .to_owned()
            )
        );
    }
}
