//! The Cedar request context, built from only what the policies can read.
//!
//! Turning JSON arguments into Cedar values is a good part of an authorization's cost, and most
//! policies read one or two arguments (`context.arguments.amount.minor_units`). At load, each
//! per-tool policy set is searched for the ways it reaches into `context`: a chain of attribute
//! reads from `context` (`context.a.b`, `context["a"].b`, `context.a has b`) names a path; any
//! other use of `context` (passing it whole, an expression the search does not know) needs all
//! of it. The request then carries only the fields on those paths, each path's value whole: the
//! top-level fields (`tenant`, `tool_version`, `resource`, `run_id`, `arguments`) and, inside
//! `arguments`, the argument fields. A policy can only observe the context through such reads,
//! so every policy evaluates exactly as over the whole context: the same values, the same
//! missing attributes, the same type errors (a value that is not a record where the path goes
//! on is kept whole).
//!
//! Validity is still judged on all the arguments: a null inside an array or a number that is not
//! a 64-bit integer anywhere in them denies the request as before, read or not.

use std::collections::BTreeMap;

use cedar_policy::{Context, PolicySet, RestrictedExpression};
use serde_json::Value;

use super::AuthzRequest;

/// Which parts of the request context a policy set can read (a record read field by field).
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

    /// What `set`'s policies can read of `context`.
    pub fn of(set: &PolicySet) -> Self {
        let mut reads = Reads::none();
        for policy in set.policies() {
            let Ok(est) = policy.to_json() else {
                return Reads::All;
            };
            let mut paths = Vec::new();
            context_paths(&est, &mut paths);
            for path in paths {
                reads.add(&path);
                if reads == Reads::All {
                    return reads;
                }
            }
        }
        reads
    }

    /// What is read of field `name` of this record, if anything.
    fn field(&self, name: &str) -> Option<&Reads> {
        match self {
            Reads::All => Some(&Reads::All),
            Reads::Fields(fields) => fields.get(name),
        }
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

/// The request context: those of tenant, tool version, resource, run id and arguments that
/// `reads` (what the policies read of `context`) names. Arguments are checked whole either way.
pub fn build(req: &AuthzRequest<'_>, reads: &Reads) -> Result<Context, String> {
    let mut pairs = Vec::with_capacity(5);
    for (name, value) in [
        ("tenant", req.tenant),
        ("tool_version", req.tool_version),
        ("resource", req.resource),
        ("run_id", req.run_id),
    ] {
        if reads.field(name).is_some() {
            pairs.push((
                name.to_owned(),
                RestrictedExpression::new_string(value.to_owned()),
            ));
        }
    }
    let path = Pointer::root("arguments");
    check(req.arguments, &path)?;
    if let Some(arguments) = reads.field("arguments")
        && let Some(arguments) = restricted(req.arguments, arguments, &path)?
    {
        pairs.push(("arguments".to_owned(), arguments));
    }
    Context::from_pairs(pairs).map_err(|error| format!("context: {error}"))
}

/// Where a value sits in the context, as a chain of borrowed steps on the stack: nothing is
/// allocated unless a message needs the JSON pointer (most requests never do).
enum Pointer<'a> {
    Root(&'a str),
    Key(&'a Pointer<'a>, &'a str),
    Index(&'a Pointer<'a>, usize),
}

impl<'a> Pointer<'a> {
    fn root(field: &'a str) -> Self {
        Pointer::Root(field)
    }

    fn key(&'a self, key: &'a str) -> Self {
        Pointer::Key(self, key)
    }

    fn index(&'a self, index: usize) -> Self {
        Pointer::Index(self, index)
    }
}

/// The JSON pointer (RFC 6901): `/arguments/notes/1`.
impl std::fmt::Display for Pointer<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Pointer::Root(field) => write!(f, "/{field}"),
            Pointer::Key(parent, key) => {
                write!(f, "{parent}/{}", key.replace('~', "~0").replace('/', "~1"))
            }
            Pointer::Index(parent, index) => write!(f, "{parent}/{index}"),
        }
    }
}

/// The errors [`restricted`] would meet converting all of `value`, without converting it.
fn check(value: &Value, path: &Pointer<'_>) -> Result<(), String> {
    match value {
        Value::Number(number) if number.as_i64().is_none() => Err(format!(
            "context {path}: number {number} is not a 64-bit integer (Cedar has no floats)"
        )),
        Value::Array(items) => {
            for (index, item) in items.iter().enumerate() {
                let path = path.index(index);
                if item.is_null() {
                    return Err(format!(
                        "context {path}: null inside an array (Cedar has no null)"
                    ));
                }
                check(item, &path)?;
            }
            Ok(())
        }
        Value::Object(map) => {
            for (key, item) in map {
                check(item, &path.key(key))?;
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Converts the part of `value` that `reads` names to a Cedar value. `Ok(None)` means "null":
/// the caller drops the field. `path` locates `value`, for messages.
fn restricted(
    value: &Value,
    reads: &Reads,
    path: &Pointer<'_>,
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
                if let Some(field) = restricted(item, inner, &path.key(key))? {
                    record.push((key.clone(), field));
                }
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
                let path = path.index(index);
                match restricted(item, &Reads::All, &path)? {
                    Some(element) => elements.push(element),
                    None => {
                        return Err(format!(
                            "context {path}: null inside an array (Cedar has no null)"
                        ));
                    }
                }
            }
            RestrictedExpression::new_set(elements)
        }
    }))
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
                (
                    "arguments",
                    fields(&[
                        ("amount", fields(&[("minor_units", Reads::All)])),
                        ("currency", Reads::All),
                        ("order", fields(&[("id", Reads::All)])),
                    ])
                ),
                ("tenant", Reads::All),
            ])
        );
        assert_eq!(
            reads("permit (principal, action, resource) when { context.tenant == \"t\" };"),
            fields(&[("tenant", Reads::All)])
        );
        assert_eq!(
            reads("permit (principal, action, resource) when { context has run_id };"),
            fields(&[("run_id", Reads::All)])
        );
    }

    #[test]
    fn context_or_arguments_used_whole_need_all_of_them() {
        for policy in [
            "permit (principal, action, resource) when { context has arguments && context == {} };",
            "permit (principal, action, resource) when { context.tenant == \"t\" } \
             unless { context like \"*\" };",
        ] {
            assert_eq!(reads(policy), Reads::All, "{policy}");
        }
        for policy in [
            "permit (principal, action, resource) when { context.arguments == {} };",
            "permit (principal, action, resource) when { context.arguments.a == 1 } \
             unless { context.arguments like \"*\" };",
        ] {
            assert_eq!(
                reads(policy),
                fields(&[("arguments", Reads::All)]),
                "{policy}"
            );
        }
    }

    fn request(arguments: &Value) -> AuthzRequest<'_> {
        AuthzRequest {
            principal: "p",
            tenant: "t",
            tool: "refund",
            tool_version: "1",
            resource: "r",
            run_id: "run",
            arguments,
        }
    }

    fn keys(context: Context) -> Vec<String> {
        let mut keys: Vec<String> = context.into_iter().map(|(k, _)| k).collect();
        keys.sort();
        keys
    }

    #[test]
    fn fields_nobody_reads_are_left_out_of_the_context() {
        let arguments = serde_json::json!({"amount": 1});
        let only_tenant = fields(&[("tenant", Reads::All)]);
        assert_eq!(
            keys(build(&request(&arguments), &only_tenant).unwrap()),
            ["tenant"]
        );
        assert_eq!(
            keys(build(&request(&arguments), &Reads::All).unwrap()),
            ["arguments", "resource", "run_id", "tenant", "tool_version"]
        );
    }

    #[test]
    fn messages_point_at_the_value_with_escaped_keys() {
        let arguments = serde_json::json!({"a/b": {"c~d": [1, 2.5]}});
        assert_eq!(
            build(&request(&arguments), &fields(&[])).map(|_| ()),
            Err(
                "context /arguments/a~1b/c~0d/1: number 2.5 is not a 64-bit integer (Cedar has no floats)"
                    .to_owned()
            )
        );
    }

    #[test]
    fn arguments_nobody_reads_still_make_a_request_invalid() {
        let reads = fields(&[("arguments", fields(&[("amount", Reads::All)]))]);
        let request = |arguments: &Value| build(&request(arguments), &reads).map(|_| ());
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
