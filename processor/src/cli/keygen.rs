//! `airlock keygen --out <prefix>`: a new Ed25519 key pair for capabilities, from the operating
//! system's random source: `<prefix>.key` (the processor's signing key, mode 0600) and
//! `<prefix>.pub` (the verifying key connector workers trust). Existing files are never
//! overwritten.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;

use crate::capability;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Path prefix of the two files: `<prefix>.key` and `<prefix>.pub`.
    #[arg(long)]
    pub out: PathBuf,
}

pub fn run(args: &Args, out: &mut impl Write) -> anyhow::Result<()> {
    let key = capability::generate().context("generating a key pair")?;
    let (secret, public) = capability::write_key_pair(&key, &args.out)?;
    writeln!(
        out,
        "signing key (processor, keep secret): {}",
        secret.display()
    )?;
    writeln!(
        out,
        "verifying key (connector workers): {}",
        public.display()
    )?;
    writeln!(
        out,
        "verifying key: {}",
        hex::encode(key.verifying_key().to_bytes())
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keygen_writes_a_pair_that_signs_and_verifies() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let prefix = dir.path().join("airlock");
        let mut out = Vec::new();
        run(
            &Args {
                out: prefix.clone(),
            },
            &mut out,
        )?;
        let secret = capability::load_signing_key(&prefix.with_extension("key"))?;
        let public = capability::load_verifying_key(&prefix.with_extension("pub"))?;
        assert_eq!(secret.verifying_key(), public);
        let text = String::from_utf8(out)?;
        assert!(text.contains(&hex::encode(public.to_bytes())), "{text}");
        assert!(run(&Args { out: prefix }, &mut Vec::new()).is_err());
        Ok(())
    }
}
