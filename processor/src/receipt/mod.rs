//! Receipts: a signed, hash-chained attestation of every terminal outcome and every refusal,
//! one chain per partition (DESIGN.md section 8), in `airlock.receipts`.
//!
//! # What gets a receipt
//!
//! An input that the core decided (it journaled a transition) gets one receipt per distinct
//! `(operation key, verdict, reason)` among its decisions whose verdict is
//! - a settlement: COMMITTED, FAILED or CANCELLED with the effect in that terminal state (a
//!   FAILED attempt that will be retried publishes no verdict, and UNKNOWN or
//!   OPERATOR_REQUIRED are not terminal), whether a connector, reconciliation, a timer or an
//!   operator settled it;
//! - a refusal: REJECTED, DENIED, CONFLICT or EXPIRED (STALE_FENCE, HASH_CONFLICT, ... are
//!   reasons of those verdicts).
//!
//! The same settlement is answered both to the operator and to the proposal; it is one receipt.
//! A producer's resend gets its earlier decision again without a journaled transition, and no
//! new receipt. Records refused before the core saw them (malformed, wrong key) get a REJECTED
//! receipt when their reply target is known ([`draft_of_dead_letter`]).
//!
//! # The chain
//!
//! Receipt `n` of partition `p` names the hash of receipt `n - 1` (64 zeros for receipt 0). The
//! chain head (next sequence, last hash) is a Meta row staged in the batch's `WriteBatch` and
//! carried by the changelog, so a new owner continues the chain where the state it restored
//! left it. Every field is a function of the input and the state (the time is the input's),
//! and Ed25519 signatures are deterministic: a re-decided input yields the same receipt bytes.
//!
//! `hash` is SHA-256 of [`CHAIN_DOMAIN`] followed by the receipt's Avro binary datum up to,
//! not including, the `hash` field (the schema keeps `hash` and `signature` last, so the
//! verifier hashes the very bytes it read). `signature` is Ed25519 over [`SIGNATURE_DOMAIN`]
//! followed by the 32 hash bytes. THE ENCODING IS FROZEN: receipts are kept forever.
//!
//! # Layout
//! - this file: which decisions get a receipt, sealing (number, chain, hash, sign), the chain
//!   head row.
//! - [`verify`]: the verifier `airlock receipts verify` runs over a partition's records.

use std::collections::BTreeSet;

use airlock_schemas::{
    Codec, Decision, EffectState, JournalEvent, JournalKind, Receipt, ReceiptKind, Verdict,
};
use ed25519_dalek::{Signature, Signer as _, SigningKey, Verifier as _, VerifyingKey};
use sha2::{Digest, Sha256};

use crate::core::Effects;

pub mod verify;

/// Domain separation tag of a receipt's content hash. Never change it.
pub const CHAIN_DOMAIN: &[u8] = b"airlock/receipt-chain/v1\0";
/// Domain separation tag of a receipt's signed message. Never change it.
pub const SIGNATURE_DOMAIN: &[u8] = b"airlock/receipt-signature/v1\0";
/// The Meta row holding a partition's chain head (not `local/`: the changelog carries it).
pub const META_CHAIN: &[u8] = b"receipt_chain";
/// `previous_hash` of the first receipt of a partition.
pub const GENESIS: [u8; 32] = [0; 32];

/// Errors of issuing or checking receipts.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("encoding receipt {sequence} of partition {partition}: {source}")]
    Encode {
        partition: i32,
        sequence: i64,
        #[source]
        source: airlock_schemas::Error,
    },
    #[error("the receipt chain head row is corrupt: {len} bytes, expected 40")]
    CorruptHead { len: usize },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Where a partition's chain stands: persisted as the [`META_CHAIN`] row. The default is the
/// empty chain (sequence 0, [`GENESIS`], which is all zeros).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Head {
    /// Sequence of the next receipt.
    pub next_sequence: i64,
    /// Hash of the last receipt ([`GENESIS`] before the first).
    pub previous_hash: [u8; 32],
}

impl Head {
    /// `[next_sequence i64 BE][previous_hash 32 bytes]`.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(40);
        out.extend_from_slice(&self.next_sequence.to_be_bytes());
        out.extend_from_slice(&self.previous_hash);
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Head> {
        let corrupt = || Error::CorruptHead { len: bytes.len() };
        if bytes.len() != 40 {
            return Err(corrupt());
        }
        let (sequence, hash) = bytes.split_at(8);
        Ok(Head {
            next_sequence: i64::from_be_bytes(sequence.try_into().map_err(|_| corrupt())?),
            previous_hash: hash.try_into().map_err(|_| corrupt())?,
        })
    }
}

/// The `key_id` of receipts signed by `key`: its public key in lowercase hex.
pub fn key_id(key: &VerifyingKey) -> String {
    hex::encode(key.to_bytes())
}

fn is_refusal(verdict: Verdict) -> bool {
    matches!(
        verdict,
        Verdict::Rejected | Verdict::Denied | Verdict::Conflict | Verdict::Expired
    )
}

fn is_settlement(verdict: Verdict, state: Option<EffectState>) -> bool {
    matches!(
        (verdict, state),
        (Verdict::Committed, Some(EffectState::Committed))
            | (Verdict::Failed, Some(EffectState::Failed))
            | (Verdict::Cancelled, Some(EffectState::Cancelled))
    )
}

/// The unsealed receipts of one decided input (see the module documentation), in decision
/// order. Empty when the input journaled nothing (a resend) or decided nothing final.
pub fn drafts(effects: &Effects) -> Vec<Receipt> {
    let mut events = effects
        .journal
        .iter()
        .filter(|e| e.kind != JournalKind::Checkpoint);
    let Some(first) = events.next() else {
        return Vec::new();
    };
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for d in &effects.decisions {
        let kind = if is_settlement(d.verdict, d.state) {
            ReceiptKind::Settlement
        } else if is_refusal(d.verdict) {
            ReceiptKind::Refusal
        } else {
            continue;
        };
        if !seen.insert((d.operation_key.as_str(), d.verdict, d.reason)) {
            continue;
        }
        // The transition about the same effect carries who and what; an input has one.
        let event = effects
            .journal
            .iter()
            .find(|e| e.operation_key.as_deref() == Some(d.operation_key.as_str()))
            .unwrap_or(first);
        out.push(draft(kind, d, Some(event)));
    }
    out
}

/// The unsealed receipt of a refusal the runtime made before the core saw the input (a
/// dead-lettered record whose reply target is known); `cause_id` names the input as the journal
/// would (`proposal:<id>`, ...).
pub fn draft_of_dead_letter(decision: &Decision, cause_id: String) -> Option<Receipt> {
    is_refusal(decision.verdict).then(|| {
        let mut r = draft(ReceiptKind::Refusal, decision, None);
        r.cause_id = cause_id;
        r
    })
}

fn draft(kind: ReceiptKind, d: &Decision, event: Option<&JournalEvent>) -> Receipt {
    let from_event = |f: fn(&JournalEvent) -> &Option<String>| event.and_then(|e| f(e).clone());
    Receipt {
        partition: 0,
        sequence: 0,
        previous_hash: String::new(),
        kind,
        operation_key: d.operation_key.clone(),
        cause_id: event.map(|e| e.cause_id.clone()).unwrap_or_default(),
        proposal_id: from_event(|e| &e.proposal_id),
        run_id: d.run_id.clone().or_else(|| from_event(|e| &e.run_id)),
        tenant_id: from_event(|e| &e.tenant_id),
        principal_id: from_event(|e| &e.principal_id),
        tool: from_event(|e| &e.tool),
        verdict: d.verdict,
        reason: d.reason,
        state: d.state,
        epoch: d.epoch,
        arguments_hash: d
            .arguments_hash
            .clone()
            .or_else(|| from_event(|e| &e.arguments_hash)),
        policy_bundle_hash: d.policy_bundle_hash.clone(),
        detail: Some(d.detail.clone()),
        issued_at: d.decided_at,
        key_id: String::new(),
        hash: String::new(),
        signature: Vec::new(),
    }
}

/// Numbers `draft` as the next receipt of `partition`, chains it to `head`, hashes and signs
/// it, and advances `head`.
pub fn seal(
    codec: &Codec,
    key: &SigningKey,
    partition: i32,
    head: &mut Head,
    draft: &mut Receipt,
) -> Result<()> {
    draft.partition = partition;
    draft.sequence = head.next_sequence;
    draft.previous_hash = hex::encode(head.previous_hash);
    draft.key_id = key_id(&key.verifying_key());
    draft.hash = String::new();
    draft.signature = Vec::new();
    let datum = codec.encode_datum(draft).map_err(|source| Error::Encode {
        partition,
        sequence: draft.sequence,
        source,
    })?;
    // An empty string and empty bytes are one zero length byte each.
    let content = datum
        .strip_suffix(&[0, 0])
        .expect("an empty hash and signature encode as two zero bytes at the end of the datum");
    let hash = content_hash(content);
    draft.hash = hex::encode(hash);
    draft.signature = key.sign(&signed_message(&hash)).to_bytes().to_vec();
    head.next_sequence += 1;
    head.previous_hash = hash;
    Ok(())
}

/// SHA-256 of the chain domain and a receipt's content bytes.
pub fn content_hash(content: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(CHAIN_DOMAIN);
    h.update(content);
    h.finalize().into()
}

fn signed_message(hash: &[u8; 32]) -> Vec<u8> {
    let mut message = Vec::with_capacity(SIGNATURE_DOMAIN.len() + 32);
    message.extend_from_slice(SIGNATURE_DOMAIN);
    message.extend_from_slice(hash);
    message
}

/// The content bytes of a receipt read as `datum` (the Avro datum of `receipt`): the datum
/// without its encoded `hash` and `signature`, or `None` when the datum does not end with them.
pub fn content_of<'a>(datum: &'a [u8], receipt: &Receipt) -> Option<&'a [u8]> {
    let mut tail = Vec::with_capacity(receipt.hash.len() + receipt.signature.len() + 4);
    avro_bytes(&mut tail, receipt.hash.as_bytes());
    avro_bytes(&mut tail, &receipt.signature);
    datum.strip_suffix(tail.as_slice())
}

/// An Avro `bytes`/`string`: zig-zag varint length, then the bytes.
fn avro_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    let len = bytes.len() as i64;
    let mut n = ((len << 1) ^ (len >> 63)) as u64;
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            break;
        }
        out.push(byte | 0x80);
    }
    out.extend_from_slice(bytes);
}

/// Whether `signature` is `key`'s signature of `hash`.
pub fn signature_holds(key: &VerifyingKey, hash: &[u8; 32], signature: &[u8]) -> bool {
    let Ok(signature) = Signature::from_slice(signature) else {
        return false;
    };
    key.verify(&signed_message(hash), &signature).is_ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod tests {
    use airlock_schemas::{Reason, Verdict};

    use super::*;

    pub(crate) fn key(seed: u8) -> SigningKey {
        SigningKey::from_bytes(&[seed; 32])
    }

    pub(crate) fn decision(key: &str, verdict: Verdict, reason: Reason) -> Decision {
        Decision {
            decision_id: format!("p/{key}"),
            in_reply_to: format!("prop-{key}"),
            operation_key: key.to_owned(),
            run_id: Some("run-1".into()),
            verdict,
            reason,
            detail: format!("{verdict} because {reason}"),
            arguments_hash: Some("ab".repeat(32)),
            policy_bundle_hash: Some("cd".repeat(32)),
            epoch: None,
            state: None,
            receipt: None,
            owner_partition: 0,
            owner_epoch: 0,
            decided_at: 1_700_000_000_000,
        }
    }

    pub(crate) fn event(key: &str, kind: JournalKind) -> JournalEvent {
        JournalEvent {
            partition: 0,
            sequence: 0,
            owner_epoch: 0,
            task: String::new(),
            reducer_version: 1,
            kind,
            cause_id: format!("proposal:prop-{key}"),
            operation_key: Some(key.to_owned()),
            run_id: Some("run-1".into()),
            proposal_id: Some(format!("prop-{key}")),
            principal_id: Some("agent-7".into()),
            tenant_id: Some("acme".into()),
            tool: Some("payments.refund".into()),
            policy_bundle_hash: None,
            lease_fence: None,
            epoch: None,
            verdict: None,
            reason: None,
            state: None,
            arguments_hash: None,
            evidence: None,
            record_json: None,
            projection_hash: None,
            recorded_at: 1_700_000_000_000,
        }
    }

    /// A sealed chain of `n` refusals on partition `partition`.
    pub(crate) fn chain(signer: &SigningKey, partition: i32, n: usize) -> Vec<Receipt> {
        let codec = Codec::new();
        let mut head = Head::default();
        (0..n)
            .map(|i| {
                let key = format!("refund:{i}");
                let effects = Effects {
                    decisions: vec![decision(&key, Verdict::Conflict, Reason::HashConflict)],
                    journal: vec![event(&key, JournalKind::ProposalDecided)],
                    ..Effects::default()
                };
                let mut r = drafts(&effects).pop().unwrap();
                seal(&codec, signer, partition, &mut head, &mut r).unwrap();
                r
            })
            .collect()
    }

    #[test]
    fn refusals_and_final_settlements_get_receipts_resends_and_progress_do_not() {
        let key = "refund:1";
        let refused = Effects {
            decisions: vec![decision(key, Verdict::Rejected, Reason::StaleFence)],
            journal: vec![event(key, JournalKind::ProposalDecided)],
            ..Effects::default()
        };
        let drafted = drafts(&refused);
        assert_eq!(drafted.len(), 1);
        assert_eq!(drafted[0].kind, ReceiptKind::Refusal);
        assert_eq!(drafted[0].reason, Reason::StaleFence);
        assert_eq!(drafted[0].principal_id.as_deref(), Some("agent-7"));
        assert_eq!(drafted[0].cause_id, "proposal:prop-refund:1");

        // A resend: the same decision, nothing journaled.
        let resend = Effects {
            decisions: refused.decisions.clone(),
            ..Effects::default()
        };
        assert!(drafts(&resend).is_empty());

        // Accepted, UNKNOWN and OPERATOR_REQUIRED are not final.
        for (verdict, state) in [
            (Verdict::Accepted, EffectState::Dispatched),
            (Verdict::Unknown, EffectState::Unknown),
            (Verdict::Unknown, EffectState::OperatorRequired),
        ] {
            let mut d = decision(key, verdict, Reason::OutcomeUnknown);
            d.state = Some(state);
            let effects = Effects {
                decisions: vec![d],
                journal: vec![event(key, JournalKind::Settled)],
                ..Effects::default()
            };
            assert!(drafts(&effects).is_empty(), "{verdict} {state}");
        }

        // An operator's settlement answers the operator and the proposal: one receipt.
        let mut to_operator = decision(key, Verdict::Committed, Reason::OperatorSettled);
        to_operator.state = Some(EffectState::Committed);
        let mut to_proposal = to_operator.clone();
        to_proposal.decision_id = "e/refund:1/1/OPERATOR_SETTLED".into();
        let settled = Effects {
            decisions: vec![to_operator, to_proposal],
            journal: vec![event(key, JournalKind::ControlApplied)],
            ..Effects::default()
        };
        let drafted = drafts(&settled);
        assert_eq!(drafted.len(), 1);
        assert_eq!(drafted[0].kind, ReceiptKind::Settlement);
    }

    #[test]
    fn sealing_chains_hashes_and_signs_deterministically() {
        let signer = key(7);
        let a = chain(&signer, 3, 3);
        assert_eq!(a, chain(&signer, 3, 3), "same inputs, same receipts");
        assert_eq!(a[0].previous_hash, hex::encode(GENESIS));
        for (i, r) in a.iter().enumerate() {
            assert_eq!(r.sequence, i as i64);
            assert_eq!(r.partition, 3);
            assert_eq!(r.key_id, key_id(&signer.verifying_key()));
            let datum = Codec::new().encode_datum(r).unwrap();
            let content = content_of(&datum, r).unwrap();
            let hash = content_hash(content);
            assert_eq!(hex::encode(hash), r.hash);
            assert!(signature_holds(
                &signer.verifying_key(),
                &hash,
                &r.signature
            ));
            assert!(!signature_holds(
                &key(8).verifying_key(),
                &hash,
                &r.signature
            ));
            if i > 0 {
                assert_eq!(r.previous_hash, a[i - 1].hash);
            }
        }
    }

    /// Frozen: a change here breaks every receipt already issued.
    #[test]
    fn the_first_receipt_matches_its_golden_hash() {
        let r = &chain(&key(7), 0, 1)[0];
        assert_eq!(r.hash, GOLDEN_HASH, "the receipt encoding changed");
    }

    const GOLDEN_HASH: &str = "39f96d355e937a30f6dbcd5a07110913a08c3c443e63a8cfe5f4feb17e7dec51";

    #[test]
    fn a_task_chains_receipts_and_re_deciding_after_a_crash_gives_the_same_bytes()
    -> anyhow::Result<()> {
        use crate::core::Input;
        use crate::sample;
        use crate::store::{Store, keys::Table};
        use std::sync::Arc;

        let core = sample::reference_core(crate::core::Config::default())?;
        let core = Arc::new(core.with_receipt_key(key(7)));
        let mut task = sample::memory_task(core)?;
        let now = 1_700_000_000_000;
        let first = sample::refund("refund:r1", 1_000, now);
        let mut changed = sample::refund("refund:r1", 2_000, now);
        changed.proposal_id = "changed-1".into();
        let accepted = task.handle(&Input::Proposal(first), now)?;
        assert!(
            accepted.receipts.is_empty(),
            "an accepted proposal is not final"
        );
        let conflict = task.handle(&Input::Proposal(changed.clone()), now + 1)?;
        assert_eq!(conflict.receipts.len(), 1);
        assert_eq!(conflict.receipts[0].sequence, 0);
        assert_eq!(conflict.receipts[0].verdict, Verdict::Conflict);
        task.commit()?;

        let mut again = changed.clone();
        again.proposal_id = "changed-2".into();
        let second = task.handle(&Input::Proposal(again.clone()), now + 2)?;
        assert_eq!(second.receipts[0].sequence, 1);
        assert_eq!(second.receipts[0].previous_hash, conflict.receipts[0].hash);
        // A crash before the commit: the same input decided again, the same receipt bytes.
        task.discard()?;
        let redone = task.handle(&Input::Proposal(again), now + 2)?;
        assert_eq!(redone.receipts, second.receipts);
        // The producer resends a refused proposal: its reply again, no second receipt.
        let resent = task.handle(&Input::Proposal(changed), now + 3)?;
        assert_eq!(resent.decisions.len(), 1);
        assert!(resent.receipts.is_empty());
        task.commit()?;
        let row = task.store().get_raw(Table::Meta, META_CHAIN)?;
        assert_eq!(Head::decode(&row.unwrap())?.next_sequence, 2);
        Ok(())
    }

    #[test]
    fn the_head_row_round_trips_and_refuses_other_lengths() {
        let head = Head {
            next_sequence: 42,
            previous_hash: [9; 32],
        };
        assert_eq!(Head::decode(&head.encode()).unwrap(), head);
        assert!(Head::decode(&[0; 39]).is_err());
    }
}
