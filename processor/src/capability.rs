//! Capabilities: the processor's Ed25519 signature on every dispatch and reconcile command, and
//! the check a connector worker runs before it lets a command near a real system.
//!
//! A worker that obeys any record on its dispatch topic lets whoever can write to that topic
//! move money. With a capability, only the holder of the processor's signing key can issue a
//! command, and nothing in a signed command can be changed on the way: the worker refuses it.
//!
//! # The signed message (version 1)
//!
//! `"airlock/capability/v1\0"`, then every field of the `DispatchCommand` except `capability`
//! itself and `arguments_json`, in schema order: `command_id`, `operation_key`, `epoch`,
//! `proposal_id`, `tool`, `tool_version`, `connector`, `tenant_id`, `principal_id`,
//! `arguments_hash`, `idempotency_key`, `deadline_at`, `attempt_deadline_at`,
//! `attempt_timeout_ms`, `policy_bundle_hash`, `owner_partition`, `owner_epoch`, `issued_at`.
//! Strings are a big-endian `u32` byte length followed by their UTF-8 bytes, `long`s are 8
//! big-endian bytes, `int`s 4. The arguments are bound through `arguments_hash`: a worker
//! recomputes the hash of the canonical arguments, so altered arguments are refused with their
//! own reason.
//!
//! The `capability` field holds `[1]` (the version) followed by the 64-byte signature. Ed25519
//! is deterministic: the same command signed with the same key gives the same bytes, so a
//! re-decided input produces byte-identical output (DESIGN.md section 6).
//!
//! THE ENCODING IS FROZEN: workers of another release verify it. A change is a new version.
//!
//! # Key files
//!
//! A key file holds the 32-byte key either as 64 hexadecimal characters (surrounding whitespace
//! allowed) or as exactly 32 raw bytes. The signing key file holds the secret seed; the
//! verifying key file the public key. `airlock keygen --out <prefix>` writes
//! `<prefix>.key` (mode 0600) and `<prefix>.pub`, both hex.

use std::path::{Path, PathBuf};

use airlock_schemas::{DispatchCommand, ReconcileCommand};
use ed25519_dalek::{Signature, Signer as _};
pub use ed25519_dalek::{SigningKey, VerifyingKey};

use crate::core::canonical;

/// Domain separation tag of version 1 of the signed message. Never change it.
const DOMAIN_V1: &[u8] = b"airlock/capability/v1\0";
/// Domain separation tag of version 1 of a reconcile command's signed message. Never change it.
const RECONCILE_DOMAIN_V1: &[u8] = b"airlock/reconcile/v1\0";
/// Domain separation tag of version 1 of a fence marker's signed message. Never change it.
const FENCE_DOMAIN_V1: &[u8] = b"airlock/fence/v1\0";
/// Domain separation tag of version 1 of an outcome's signed message. Never change it.
const OUTCOME_DOMAIN_V1: &[u8] = b"airlock/outcome/v1\0";
/// Domain separation tag of version 1 of a person's signed approval or control. Never change it.
const PERSON_DOMAIN_V1: &[u8] = b"airlock/person/v1\0";
/// The first byte of a version-1 capability.
pub const VERSION: u8 = 1;
/// Length of a version-1 capability: version byte and signature.
pub const CAPABILITY_LEN: usize = 1 + ed25519_dalek::SIGNATURE_LENGTH;

/// The public half of the demo key pair `deploy/config/demo-capability.{key,pub}`. Its secret
/// is published with the source, so a command it signs proves nothing: `airlock run` refuses to
/// sign with it and a connector worker to trust it, unless [`ALLOW_DEMO_KEY_ENV`] is `1`.
pub const DEMO_VERIFYING_KEY: &str =
    "6e8a4c8fb3d2245056423ee983167904e0ae3a554f1911217f5cf64e231cc3e6";

/// The variable that allows the demo key pair (`airlock demo` sets it for its children).
pub const ALLOW_DEMO_KEY_ENV: &str = "AIRLOCK_ALLOW_DEMO_KEY";

/// Whether `key` is the demo key pair's public key.
pub fn is_demo_key(key: &VerifyingKey) -> bool {
    hex::encode(key.to_bytes()) == DEMO_VERIFYING_KEY
}

/// Refuses the demo key pair unless [`ALLOW_DEMO_KEY_ENV`] is `1`; `role` says how the key is
/// used ("the capability signing key", "a trusted verifying key").
pub fn refuse_demo_key(key: &VerifyingKey, role: &str) -> Result<(), String> {
    if !is_demo_key(key) || std::env::var(ALLOW_DEMO_KEY_ENV).is_ok_and(|v| v == "1") {
        return Ok(());
    }
    Err(format!(
        "{role} is the public demo key (deploy/config/demo-capability): anyone can sign with \
         it. Generate your own pair with `airlock keygen --out <prefix>`, or set \
         {ALLOW_DEMO_KEY_ENV}=1 to run a demo"
    ))
}

/// Errors of loading or writing keys; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading key file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("writing key file {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("key file {path}: {what} (expected 64 hexadecimal characters or exactly 32 raw bytes)")]
    Format { path: PathBuf, what: String },
    #[error("key file {path} does not hold a valid Ed25519 public key: {source}")]
    BadPublicKey {
        path: PathBuf,
        #[source]
        source: ed25519_dalek::SignatureError,
    },
    #[error("drawing a key from the operating system's random source: {0}")]
    Random(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a worker refuses a dispatch command. Each proves the command must not run; none of them
/// may settle the attempt it names (a forged command must not be able to fail a real one).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// No capability: the command was not signed.
    #[error("the command carries no capability (it is unsigned)")]
    Missing,
    /// The capability is not a valid signature of this command by a trusted key: forged, or a
    /// signed field was altered.
    #[error("the capability does not verify: {0}")]
    Forged(String),
    /// The signature holds but `arguments_json` does not hash to the signed `arguments_hash`.
    #[error("the arguments do not match the signed arguments hash: {0}")]
    ArgumentsAltered(String),
    /// The command's attempt deadline has passed: it must not start.
    #[error("the command expired at {attempt_deadline_at} (now {now})")]
    Expired { attempt_deadline_at: i64, now: i64 },
}

impl Refused {
    /// The dead-letter reason code (`airlock-dlq-reason`). Frozen: operators alert on it.
    pub fn code(&self) -> &'static str {
        match self {
            Refused::Missing => "UNSIGNED",
            Refused::Forged(_) => "FORGED",
            Refused::ArgumentsAltered(_) => "ARGUMENTS_ALTERED",
            Refused::Expired { .. } => "EXPIRED",
        }
    }
}

/// A string of a signed message: its big-endian `u32` byte length, then its UTF-8 bytes.
fn string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u32).to_be_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// The version-1 signed message of `cmd` (see the module documentation).
pub fn message(cmd: &DispatchCommand) -> Vec<u8> {
    let mut out = Vec::with_capacity(DOMAIN_V1.len() + 512);
    out.extend_from_slice(DOMAIN_V1);
    string(&mut out, &cmd.command_id);
    string(&mut out, &cmd.operation_key);
    out.extend_from_slice(&cmd.epoch.to_be_bytes());
    string(&mut out, &cmd.proposal_id);
    string(&mut out, &cmd.tool);
    string(&mut out, &cmd.tool_version);
    string(&mut out, &cmd.connector);
    string(&mut out, &cmd.tenant_id);
    string(&mut out, &cmd.principal_id);
    string(&mut out, &cmd.arguments_hash);
    string(&mut out, &cmd.idempotency_key);
    out.extend_from_slice(&cmd.deadline_at.to_be_bytes());
    out.extend_from_slice(&cmd.attempt_deadline_at.to_be_bytes());
    out.extend_from_slice(&cmd.attempt_timeout_ms.to_be_bytes());
    string(&mut out, &cmd.policy_bundle_hash);
    out.extend_from_slice(&cmd.owner_partition.to_be_bytes());
    out.extend_from_slice(&cmd.owner_epoch.to_be_bytes());
    out.extend_from_slice(&cmd.issued_at.to_be_bytes());
    out
}

/// The capability of `cmd` (its current `capability` field is ignored): `[VERSION] ++
/// signature`.
pub fn sign(key: &SigningKey, cmd: &DispatchCommand) -> Vec<u8> {
    capability_of(key, &message(cmd))
}

/// Checks `cmd` as a worker must before starting it, at wall-clock time `now` (epoch ms):
/// signed by `key`, arguments unaltered, not expired, in that order.
pub fn verify(key: &VerifyingKey, cmd: &DispatchCommand, now: i64) -> Result<(), Refused> {
    verify_any(std::slice::from_ref(key), cmd, now)
}

/// [`verify`] against several trusted keys (a key rotation): the command must verify under one.
pub fn verify_any(keys: &[VerifyingKey], cmd: &DispatchCommand, now: i64) -> Result<(), Refused> {
    signed_by_any(keys, cmd.capability.as_deref(), &message(cmd))?;
    arguments_match(cmd)?;
    if now >= cmd.attempt_deadline_at {
        return Err(Refused::Expired {
            attempt_deadline_at: cmd.attempt_deadline_at,
            now,
        });
    }
    Ok(())
}

/// The version-1 signed message of a reconcile command: `"airlock/reconcile/v1\0"`, then every
/// field but `capability`, in schema order: `command_id`, `operation_key`, `epoch`, `tool`,
/// `connector`, `idempotency_key`, `arguments_hash`, `round`, `owner_partition`,
/// `owner_epoch`, `issued_at`, encoded as in [`message`]. Its own domain tag keeps a dispatch
/// signature from ever verifying as a reconcile signature, and back. Frozen like [`message`].
pub fn reconcile_message(cmd: &ReconcileCommand) -> Vec<u8> {
    let mut out = Vec::with_capacity(RECONCILE_DOMAIN_V1.len() + 256);
    out.extend_from_slice(RECONCILE_DOMAIN_V1);
    string(&mut out, &cmd.command_id);
    string(&mut out, &cmd.operation_key);
    out.extend_from_slice(&cmd.epoch.to_be_bytes());
    string(&mut out, &cmd.tool);
    string(&mut out, &cmd.connector);
    string(&mut out, &cmd.idempotency_key);
    string(&mut out, &cmd.arguments_hash);
    out.extend_from_slice(&cmd.round.to_be_bytes());
    out.extend_from_slice(&cmd.owner_partition.to_be_bytes());
    out.extend_from_slice(&cmd.owner_epoch.to_be_bytes());
    out.extend_from_slice(&cmd.issued_at.to_be_bytes());
    out
}

/// The capability of reconcile command `cmd` (its `capability` field is ignored).
pub fn sign_reconcile(key: &SigningKey, cmd: &ReconcileCommand) -> Vec<u8> {
    capability_of(key, &reconcile_message(cmd))
}

/// Checks that reconcile command `cmd` was signed by one of `keys`. A reconcile command has no
/// deadline: it asks a read-only question, and the processor accepts the answer only for a
/// round it asked (the round is signed).
pub fn verify_reconcile_any(keys: &[VerifyingKey], cmd: &ReconcileCommand) -> Result<(), Refused> {
    signed_by_any(keys, cmd.capability.as_deref(), &reconcile_message(cmd))
}

/// The version-1 signed message of a fence marker: `"airlock/fence/v1\0"`, then the topic
/// (as a string of [`message`]), the partition (`i32`) and the owner epoch (`i64`), big-endian.
/// A marker raises every consumer's fence for its partition; signed, only the processor can
/// raise it (a forged marker with a huge epoch would otherwise fence every later command).
/// Bound to its topic and partition, a genuine marker cannot be replayed elsewhere. Frozen like
/// [`message`].
pub fn fence_message(topic: &str, partition: i32, owner_epoch: i64) -> Vec<u8> {
    let mut out = Vec::with_capacity(FENCE_DOMAIN_V1.len() + topic.len() + 16);
    out.extend_from_slice(FENCE_DOMAIN_V1);
    string(&mut out, topic);
    out.extend_from_slice(&partition.to_be_bytes());
    out.extend_from_slice(&owner_epoch.to_be_bytes());
    out
}

/// The capability of the fence marker of `owner_epoch` on `topic`'s `partition`.
pub fn sign_fence(key: &SigningKey, topic: &str, partition: i32, owner_epoch: i64) -> Vec<u8> {
    capability_of(key, &fence_message(topic, partition, owner_epoch))
}

/// Checks that `capability` signs the fence marker of `owner_epoch` on `topic`'s `partition`
/// by one of `keys`.
pub fn verify_fence_any(
    keys: &[VerifyingKey],
    capability: Option<&[u8]>,
    topic: &str,
    partition: i32,
    owner_epoch: i64,
) -> Result<(), Refused> {
    signed_by_any(
        keys,
        capability,
        &fence_message(topic, partition, owner_epoch),
    )
}

/// The version-1 signed message of an outcome: `"airlock/outcome/v1\0"`, the connector's name
/// (as a string of [`message`]), then the record's value exactly as produced (its Avro bytes,
/// in whichever framing). The connector worker signs with its own key; the processor takes an
/// outcome of an effect dispatched to a connector only when it verifies under one of that
/// connector's worker keys (`capability.worker_verifying_key_files`), so that whoever can
/// write the outcomes topic cannot settle an effect. Frozen like [`message`].
pub fn outcome_message(connector: &str, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(OUTCOME_DOMAIN_V1.len() + connector.len() + 4 + value.len());
    out.extend_from_slice(OUTCOME_DOMAIN_V1);
    string(&mut out, connector);
    out.extend_from_slice(value);
    out
}

/// The capability of an outcome record of `connector` whose value is `value`.
pub fn sign_outcome(key: &SigningKey, connector: &str, value: &[u8]) -> Vec<u8> {
    capability_of(key, &outcome_message(connector, value))
}

/// Checks that `capability` signs the outcome value `value` of `connector` by one of `keys`.
pub fn verify_outcome_any(
    keys: &[VerifyingKey],
    capability: Option<&[u8]>,
    connector: &str,
    value: &[u8],
) -> Result<(), Refused> {
    signed_by_any(keys, capability, &outcome_message(connector, value))
}

/// What a person signs: an approval (`"approval"`) or an operator control (`"control"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PersonAct {
    Approval,
    Control,
}

impl PersonAct {
    pub fn as_str(self) -> &'static str {
        match self {
            PersonAct::Approval => "approval",
            PersonAct::Control => "control",
        }
    }
}

/// The version-1 signed message of a person's approval or control: `"airlock/person/v1\0"`,
/// what it is and the person's principal id (strings of [`message`]), then the record's value
/// exactly as produced. The approver or operator signs with their own key, registered in the
/// policy entities (`verifying_keys`); the processor counts the record only when it verifies
/// under one of that person's keys, so that whoever can write the approvals or control topic
/// cannot act as someone else. Frozen like [`message`].
pub fn person_message(act: PersonAct, person: &str, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(PERSON_DOMAIN_V1.len() + 8 + 16 + person.len() + value.len());
    out.extend_from_slice(PERSON_DOMAIN_V1);
    string(&mut out, act.as_str());
    string(&mut out, person);
    out.extend_from_slice(value);
    out
}

/// The capability (header `airlock-capability`) of `person`'s record whose value is `value`.
pub fn sign_person(key: &SigningKey, act: PersonAct, person: &str, value: &[u8]) -> Vec<u8> {
    capability_of(key, &person_message(act, person, value))
}

/// Checks that `capability` signs `person`'s record `value` by one of `keys`.
pub fn verify_person_any(
    keys: &[VerifyingKey],
    capability: Option<&[u8]>,
    act: PersonAct,
    person: &str,
    value: &[u8],
) -> Result<(), Refused> {
    signed_by_any(keys, capability, &person_message(act, person, value))
}

fn capability_of(key: &SigningKey, message: &[u8]) -> Vec<u8> {
    let signature = key.sign(message);
    let mut out = Vec::with_capacity(CAPABILITY_LEN);
    out.push(VERSION);
    out.extend_from_slice(&signature.to_bytes());
    out
}

/// Checks that `capability` is a version-1 signature of `message` by one of `keys`.
fn signed_by_any(
    keys: &[VerifyingKey],
    capability: Option<&[u8]>,
    message: &[u8],
) -> Result<(), Refused> {
    let capability = capability.ok_or(Refused::Missing)?;
    let Some((&version, signature)) = capability.split_first() else {
        return Err(Refused::Forged("the capability is empty".to_owned()));
    };
    if version != VERSION {
        return Err(Refused::Forged(format!(
            "unknown capability version {version}"
        )));
    }
    let signature = Signature::from_slice(signature).map_err(|_| {
        Refused::Forged(format!(
            "a version-1 capability is {CAPABILITY_LEN} bytes, this one {}",
            capability.len()
        ))
    })?;
    // Strict: no malleable signatures, no small-order keys.
    if !keys
        .iter()
        .any(|k| k.verify_strict(message, &signature).is_ok())
    {
        return Err(Refused::Forged(format!(
            "not signed by {} over these fields",
            if keys.len() == 1 {
                "the trusted key".to_owned()
            } else {
                format!("any of the {} trusted keys", keys.len())
            }
        )));
    }
    Ok(())
}

/// Checks that `arguments_json` is canonical JSON hashing to `arguments_hash` (also the check of
/// an unsigned command a worker was told to accept).
pub fn arguments_match(cmd: &DispatchCommand) -> Result<(), Refused> {
    let canonical = canonical::canonicalize(&cmd.arguments_json)
        .map_err(|e| Refused::ArgumentsAltered(format!("arguments_json: {e}")))?;
    if canonical.hash != cmd.arguments_hash {
        return Err(Refused::ArgumentsAltered(format!(
            "arguments_json hashes to {}, the command says {}",
            canonical.hash, cmd.arguments_hash
        )));
    }
    Ok(())
}

/// Reads a 32-byte key: 64 hex characters (whitespace around them allowed) or 32 raw bytes.
fn read_key_bytes(path: &Path) -> Result<[u8; 32]> {
    let bytes = std::fs::read(path).map_err(|source| Error::Read {
        path: path.to_owned(),
        source,
    })?;
    let format = |what: String| Error::Format {
        path: path.to_owned(),
        what,
    };
    if let Ok(raw) = <[u8; 32]>::try_from(bytes.as_slice())
        && !raw.iter().all(u8::is_ascii_hexdigit)
    {
        return Ok(raw);
    }
    let text = std::str::from_utf8(&bytes)
        .map_err(|_| format(format!("{} bytes that are not hex text", bytes.len())))?
        .trim();
    if text.len() != 64 {
        return Err(format(format!("{} characters of text", text.len())));
    }
    let decoded = hex::decode(text).map_err(|e| format(format!("not hexadecimal: {e}")))?;
    <[u8; 32]>::try_from(decoded.as_slice()).map_err(|_| format("not 32 bytes".to_owned()))
}

/// Loads the processor's signing key (the secret).
pub fn load_signing_key(path: &Path) -> Result<SigningKey> {
    let key = SigningKey::from_bytes(&read_key_bytes(path)?);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(meta) = std::fs::metadata(path)
            && meta.permissions().mode() & 0o077 != 0
        {
            log::warn!(
                "signing key file {} is readable by other users (mode {:o}); chmod 600 it",
                path.display(),
                meta.permissions().mode() & 0o777
            );
        }
    }
    Ok(key)
}

/// Loads a verifying key (public).
pub fn load_verifying_key(path: &Path) -> Result<VerifyingKey> {
    VerifyingKey::from_bytes(&read_key_bytes(path)?).map_err(|source| Error::BadPublicKey {
        path: path.to_owned(),
        source,
    })
}

/// A new key pair from the operating system's random source.
pub fn generate() -> Result<SigningKey> {
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|e| Error::Random(e.to_string()))?;
    Ok(SigningKey::from_bytes(&seed))
}

/// Writes `key` as `<prefix>.key` (hex secret, mode 0600) and `<prefix>.pub` (hex public key).
/// Refuses to overwrite either file. Returns both paths.
pub fn write_key_pair(key: &SigningKey, prefix: &Path) -> Result<(PathBuf, PathBuf)> {
    let with_ext = |ext: &str| {
        let mut name = prefix.as_os_str().to_owned();
        name.push(ext);
        PathBuf::from(name)
    };
    let (secret, public) = (with_ext(".key"), with_ext(".pub"));
    let write = |path: &Path, text: String, mode: u32| -> Result<()> {
        use std::io::Write as _;
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, mode);
        #[cfg(not(unix))]
        let _ = mode;
        let err = |source| Error::Write {
            path: path.to_owned(),
            source,
        };
        let mut file = options.open(path).map_err(err)?;
        file.write_all(text.as_bytes()).map_err(err)?;
        file.sync_all().map_err(err)
    };
    write(&secret, format!("{}\n", hex::encode(key.to_bytes())), 0o600)?;
    write(
        &public,
        format!("{}\n", hex::encode(key.verifying_key().to_bytes())),
        0o644,
    )?;
    Ok((secret, public))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const NOW: i64 = 1_700_000_000_000;

    fn key(seed: u8) -> SigningKey {
        SigningKey::from_bytes(&[seed; 32])
    }

    fn command() -> DispatchCommand {
        let arguments_json =
            r#"{"account_id":"acct-42","amount":{"currency":"EUR","minor_units":2500},"tenant_id":"acme"}"#
                .to_owned();
        DispatchCommand {
            command_id: "refund:txn_1#1".into(),
            operation_key: "refund:txn_1".into(),
            epoch: 1,
            proposal_id: "prop-1".into(),
            tool: "refund".into(),
            tool_version: "1".into(),
            connector: "ledger".into(),
            tenant_id: "acme".into(),
            principal_id: "agent-support-1".into(),
            arguments_hash: canonical::arguments_hash(&arguments_json),
            arguments_json,
            idempotency_key: canonical::idempotency_key("refund:txn_1"),
            deadline_at: NOW + 3_600_000,
            attempt_deadline_at: NOW + 10_000,
            attempt_timeout_ms: 10_000,
            policy_bundle_hash: "bundle".into(),
            owner_partition: 2,
            owner_epoch: 3,
            capability: None,
            issued_at: NOW,
        }
    }

    fn signed(key: &SigningKey) -> DispatchCommand {
        let mut cmd = command();
        cmd.capability = Some(sign(key, &cmd));
        cmd
    }

    #[test]
    fn a_signed_command_verifies_and_its_signature_is_deterministic() {
        let k = key(7);
        let cmd = signed(&k);
        assert_eq!(verify(&k.verifying_key(), &cmd, NOW), Ok(()));
        let capability = cmd.capability.clone().unwrap();
        assert_eq!(capability.len(), CAPABILITY_LEN);
        assert_eq!(capability[0], VERSION);
        // Signing again (an existing capability is not part of the message) gives the same bytes.
        assert_eq!(sign(&k, &cmd), capability);
    }

    /// The frozen version-1 message and its signature under a fixed key: must never change.
    #[test]
    fn the_version_one_encoding_matches_its_golden_vector() {
        let cmd = command();
        let message = message(&cmd);
        assert!(message.starts_with(b"airlock/capability/v1\0\0\0\0\x0erefund:txn_1#1"));
        use sha2::Digest;
        assert_eq!(
            hex::encode(sha2::Sha256::digest(&message)),
            GOLDEN_MESSAGE_SHA256
        );
        assert_eq!(hex::encode(sign(&key(7), &cmd)), GOLDEN_CAPABILITY);
    }

    /// Computed independently (Python: `struct` for the message, `cryptography`'s Ed25519 for
    /// the signature), so other languages can check their implementation against them.
    const GOLDEN_MESSAGE_SHA256: &str =
        "7312958315cb4d249cbcf43cb355cd41f88b9b5a327890576828b962132f2d93";
    const GOLDEN_CAPABILITY: &str = "010744839f331de3474b27d6a1d5d1f8caca6199ecea5efb2999ce424f43\
         6066064f30df88da4029517f3f344097d6d3f270a2d9e3e024e3e31f7dccf71956320c";

    fn reconcile_command() -> ReconcileCommand {
        ReconcileCommand {
            command_id: "refund:txn_1#1/r2".into(),
            operation_key: "refund:txn_1".into(),
            epoch: 1,
            tool: "refund".into(),
            connector: "ledger".into(),
            idempotency_key: "idem-refund-txn-1".into(),
            arguments_hash: "0".repeat(64),
            round: 2,
            owner_partition: 2,
            owner_epoch: 3,
            capability: None,
            issued_at: NOW,
        }
    }

    /// The frozen version-1 reconcile message, computed independently (Python, as above).
    #[test]
    fn the_reconcile_encoding_matches_its_golden_vector_and_verifies() {
        let mut cmd = reconcile_command();
        let message = reconcile_message(&cmd);
        use sha2::Digest;
        assert_eq!(
            hex::encode(sha2::Sha256::digest(&message)),
            "1d312b6ea166696976ba91380f553ce405cca4853d4c7f550d3d1d6826a8e428"
        );
        let capability = sign_reconcile(&key(7), &cmd);
        assert_eq!(
            hex::encode(&capability),
            "01b0c8f83530b98b99e48f5628b45570bcb657c0b3c6a9ed6a3ac76349bb476e46f72f7ed7c5c28a8cc5\
             00cd0a623b304b89c431ded01b98d57163cb0d93da6c09"
        );
        cmd.capability = Some(capability);
        let trusted = [key(7).verifying_key()];
        assert_eq!(verify_reconcile_any(&trusted, &cmd), Ok(()));
        cmd.round = 3;
        assert!(matches!(
            verify_reconcile_any(&trusted, &cmd),
            Err(Refused::Forged(_))
        ));
        cmd.capability = None;
        assert_eq!(verify_reconcile_any(&trusted, &cmd), Err(Refused::Missing));
    }

    #[test]
    fn the_demo_key_is_the_one_in_deploy_config() {
        let public = include_str!("../../deploy/config/demo-capability.pub").trim();
        assert_eq!(public, DEMO_VERIFYING_KEY);
        let secret = include_str!("../../deploy/config/demo-capability.key").trim();
        let seed: [u8; 32] = hex::decode(secret).unwrap().try_into().unwrap();
        let demo = SigningKey::from_bytes(&seed).verifying_key();
        assert!(is_demo_key(&demo));
        assert!(!is_demo_key(&key(7).verifying_key()));
        assert_eq!(refuse_demo_key(&key(7).verifying_key(), "k"), Ok(()));
        if std::env::var(ALLOW_DEMO_KEY_ENV).is_err() {
            let refused = refuse_demo_key(&demo, "the signing key").unwrap_err();
            assert!(refused.contains("public demo key"), "{refused}");
        }
    }

    #[test]
    fn an_unsigned_command_is_refused_as_missing() {
        let k = key(7);
        let err = verify(&k.verifying_key(), &command(), NOW).unwrap_err();
        assert_eq!(err, Refused::Missing);
        assert_eq!(err.code(), "UNSIGNED");
    }

    #[test]
    fn another_keys_signature_or_an_altered_field_is_forged() {
        let trusted = key(7).verifying_key();
        let by_other = signed(&key(8));
        assert!(matches!(
            verify(&trusted, &by_other, NOW),
            Err(Refused::Forged(_))
        ));
        let mut altered = signed(&key(7));
        altered.epoch = 2;
        assert!(matches!(
            verify(&trusted, &altered, NOW),
            Err(Refused::Forged(_))
        ));
        let mut moved = signed(&key(7));
        moved.attempt_deadline_at += 60_000;
        assert_eq!(verify(&trusted, &moved, NOW).unwrap_err().code(), "FORGED");
        let mut truncated = signed(&key(7));
        truncated.capability.as_mut().unwrap().pop();
        assert!(matches!(
            verify(&trusted, &truncated, NOW),
            Err(Refused::Forged(_))
        ));
        let mut versioned = signed(&key(7));
        versioned.capability.as_mut().unwrap()[0] = 2;
        assert!(matches!(
            verify(&trusted, &versioned, NOW),
            Err(Refused::Forged(_))
        ));
    }

    #[test]
    fn altered_arguments_under_a_valid_signature_are_refused() {
        let k = key(7);
        let mut cmd = signed(&k);
        cmd.arguments_json = cmd.arguments_json.replace("2500", "250000");
        let err = verify(&k.verifying_key(), &cmd, NOW).unwrap_err();
        assert!(matches!(err, Refused::ArgumentsAltered(_)), "{err}");
        assert_eq!(err.code(), "ARGUMENTS_ALTERED");
        // The same arguments written differently are the same arguments.
        let mut reformatted = signed(&k);
        reformatted.arguments_json =
            r#"{ "tenant_id": "acme", "amount": {"minor_units": 2500, "currency": "EUR"}, "account_id": "acct-42" }"#
                .to_owned();
        assert_eq!(verify(&k.verifying_key(), &reformatted, NOW), Ok(()));
    }

    #[test]
    fn a_command_past_its_attempt_deadline_is_expired() {
        let k = key(7);
        let cmd = signed(&k);
        let at = cmd.attempt_deadline_at;
        assert_eq!(verify(&k.verifying_key(), &cmd, at - 1), Ok(()));
        assert_eq!(
            verify(&k.verifying_key(), &cmd, at),
            Err(Refused::Expired {
                attempt_deadline_at: at,
                now: at
            })
        );
    }

    #[test]
    fn a_fence_marker_verifies_only_for_its_own_topic_partition_and_epoch() {
        let k = key(1);
        let keys = [k.verifying_key()];
        let cap = sign_fence(&k, "a.dispatch.ledger", 2, 5);
        assert_eq!(cap.len(), CAPABILITY_LEN);
        assert_eq!(
            verify_fence_any(&keys, Some(&cap), "a.dispatch.ledger", 2, 5),
            Ok(())
        );
        for (topic, partition, epoch) in [
            ("a.decisions", 2, 5),
            ("a.dispatch.ledger", 3, 5),
            ("a.dispatch.ledger", 2, 999_999),
        ] {
            assert!(matches!(
                verify_fence_any(&keys, Some(&cap), topic, partition, epoch),
                Err(Refused::Forged(_))
            ));
        }
        assert_eq!(
            verify_fence_any(&keys, None, "a.dispatch.ledger", 2, 5),
            Err(Refused::Missing)
        );
        let other = sign_fence(&key(2), "a.dispatch.ledger", 2, 5);
        assert!(verify_fence_any(&keys, Some(&other), "a.dispatch.ledger", 2, 5).is_err());
        // Never a dispatch or reconcile signature: its own domain.
        assert_ne!(fence_message("t", 0, 1), message(&command())[..]);
    }

    #[test]
    fn an_outcome_verifies_only_for_its_connector_and_exact_bytes() {
        let worker = key(3);
        let keys = [worker.verifying_key()];
        let value = b"\xc3\x01 some outcome bytes".to_vec();
        let cap = sign_outcome(&worker, "ledger", &value);
        assert_eq!(
            verify_outcome_any(&keys, Some(&cap), "ledger", &value),
            Ok(())
        );
        let mut altered = value.clone();
        altered[3] ^= 1;
        assert!(verify_outcome_any(&keys, Some(&cap), "ledger", &altered).is_err());
        assert!(verify_outcome_any(&keys, Some(&cap), "email", &value).is_err());
        assert_eq!(
            verify_outcome_any(&keys, None, "ledger", &value),
            Err(Refused::Missing)
        );
        // The processor's capability key is not a worker's.
        let processor = sign_outcome(&key(1), "ledger", &value);
        assert!(verify_outcome_any(&keys, Some(&processor), "ledger", &value).is_err());
    }

    #[test]
    fn any_key_of_a_rotation_verifies() {
        let cmd = signed(&key(9));
        let keys = [key(7).verifying_key(), key(9).verifying_key()];
        assert_eq!(verify_any(&keys, &cmd, NOW), Ok(()));
        assert!(verify_any(&keys[..1], &cmd, NOW).is_err());
    }

    #[test]
    fn key_files_round_trip_as_hex_and_raw_bytes() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let k = generate()?;
        let (secret, public) = write_key_pair(&k, &dir.path().join("demo"))?;
        assert_eq!(load_signing_key(&secret)?.to_bytes(), k.to_bytes());
        assert_eq!(load_verifying_key(&public)?, k.verifying_key());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(
                std::fs::metadata(&secret)?.permissions().mode() & 0o777,
                0o600
            );
        }
        assert!(
            write_key_pair(&k, &dir.path().join("demo")).is_err(),
            "existing key files are never overwritten"
        );
        let raw = dir.path().join("raw.pub");
        std::fs::write(&raw, k.verifying_key().to_bytes())?;
        assert_eq!(load_verifying_key(&raw)?, k.verifying_key());
        let bad = dir.path().join("bad.pub");
        std::fs::write(&bad, "abc\n")?;
        let err = load_verifying_key(&bad).unwrap_err().to_string();
        assert!(err.contains("64 hexadecimal characters"), "{err}");
        Ok(())
    }
}
