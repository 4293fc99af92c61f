//! `airlock hash`: the canonical form of a JSON document and its SHA-256, exactly as the
//! processor computes them for tool arguments.

use std::io::{Read, Write};
use std::path::PathBuf;

use anyhow::Context;

use crate::core::canonical;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// JSON file to hash; `-` or nothing reads standard input.
    pub file: Option<PathBuf>,
    /// Also print the downstream idempotency key derived from this operation key.
    #[arg(long)]
    pub operation_key: Option<String>,
    /// Print a JSON object instead of `name: value` lines.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &Args, out: &mut impl Write) -> anyhow::Result<()> {
    let text = match &args.file {
        Some(path) if path.as_os_str() != "-" => {
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?
        }
        _ => {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .context("reading standard input")?;
            text
        }
    };
    let c = canonical::canonicalize(&text).context("the document has no canonical form")?;
    let key = args
        .operation_key
        .as_deref()
        .map(canonical::idempotency_key);
    if args.json {
        let mut report = serde_json::json!({ "canonical": c.json, "sha256": c.hash });
        if let (Some(op), Some(key)) = (&args.operation_key, &key) {
            report["operation_key"] = op.clone().into();
            report["idempotency_key"] = key.clone().into();
        }
        writeln!(out, "{report}")?;
    } else {
        writeln!(out, "canonical: {}", c.json)?;
        writeln!(out, "sha256: {}", c.hash)?;
        if let Some(key) = key {
            writeln!(out, "idempotency_key: {key}")?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_prints_canonical_form_hash_and_key() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let file = dir.path().join("args.json");
        std::fs::write(&file, r#"{ "b": 2, "a": 1 }"#)?;
        let mut out = Vec::new();
        run(
            &Args {
                file: Some(file),
                operation_key: Some("refund:txn_1".into()),
                json: false,
            },
            &mut out,
        )?;
        let text = String::from_utf8(out)?;
        let expected_hash = canonical::arguments_hash(r#"{"a":1,"b":2}"#);
        assert!(text.contains(r#"canonical: {"a":1,"b":2}"#), "{text}");
        assert!(text.contains(&format!("sha256: {expected_hash}")), "{text}");
        assert!(
            text.contains(&canonical::idempotency_key("refund:txn_1")),
            "{text}"
        );
        Ok(())
    }

    #[test]
    fn hash_refuses_floats_with_a_clear_error() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let file = dir.path().join("args.json");
        std::fs::write(&file, r#"{"amount": 12.5}"#)?;
        let err = run(
            &Args {
                file: Some(file),
                operation_key: None,
                json: true,
            },
            &mut Vec::new(),
        )
        .expect_err("floats have no canonical form");
        assert!(format!("{err:#}").contains("amount"), "{err:#}");
        Ok(())
    }
}
