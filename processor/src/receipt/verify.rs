//! The receipt verifier: reads the records of a receipts topic, partition by partition in
//! offset order, and names the first break of each partition's chain.
//!
//! Per record, in this order:
//! 1. Barriers are skipped; fence markers raise the partition's fence, and a record whose owner
//!    epoch is behind it (a zombie's write) is dropped, as every consumer of an output
//!    partition does (`runtime::wire`).
//! 2. **altered**: the record is not a receipt, or its content does not hash to its `hash`.
//! 3. **bad signature**: the hash holds but the signature is not a trusted key's.
//! 4. The sequence against the chain: the next one must name the last hash (else
//!    **reordered**); an earlier sequence whose hash was already read is a resend (benign, the
//!    outbox repeats records after a crash); an earlier sequence from a newer owner that links
//!    to the hash before it is a takeover re-deciding what the changelog had not recorded yet
//!    (benign, the old owner's copies are superseded); any other earlier sequence is
//!    **reordered**; a later one is **missing** receipts, unless the next record is the one
//!    skipped, which makes the pair **reordered**.
//!
//! After its first break a partition is only counted: what follows cannot be trusted to link.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;

use airlock_schemas::{Codec, Receipt};
use ed25519_dalek::VerifyingKey;

use super::{GENESIS, content_hash, content_of, key_id, signature_holds};
use crate::runtime::wire::{self, Admit, BARRIER_KIND, FenceFilter, header};

/// How many recent receipts per partition are remembered to recognise resends and takeovers.
/// An outbox resend or a takeover repeats at most the receipts of the batches in flight.
pub const WINDOW: usize = 1 << 16;

/// The first break of a partition's chain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Break {
    /// Not a readable receipt, or its content does not hash to its `hash`.
    Altered {
        offset: i64,
        sequence: Option<i64>,
        detail: String,
    },
    /// The hash holds, the signature does not (or the key is not trusted).
    BadSignature {
        offset: i64,
        sequence: i64,
        detail: String,
    },
    /// Receipts `expected..found` were never read.
    Missing {
        offset: i64,
        expected: i64,
        found: i64,
    },
    /// The sequence went backwards, or `previous_hash` does not name the receipt before.
    Reordered {
        offset: i64,
        sequence: i64,
        detail: String,
    },
}

impl Break {
    /// The break's name: `altered`, `bad signature`, `missing` or `reordered`.
    pub fn name(&self) -> &'static str {
        match self {
            Break::Altered { .. } => "altered",
            Break::BadSignature { .. } => "bad signature",
            Break::Missing { .. } => "missing",
            Break::Reordered { .. } => "reordered",
        }
    }

    /// The offset of the first record that breaks the chain.
    pub fn offset(&self) -> i64 {
        match self {
            Break::Altered { offset, .. }
            | Break::BadSignature { offset, .. }
            | Break::Missing { offset, .. }
            | Break::Reordered { offset, .. } => *offset,
        }
    }
}

impl fmt::Display for Break {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at offset {}: ", self.name(), self.offset())?;
        match self {
            Break::Altered {
                sequence: Some(s),
                detail,
                ..
            } => write!(f, "receipt {s}: {detail}"),
            Break::Altered { detail, .. } => f.write_str(detail),
            Break::BadSignature {
                sequence, detail, ..
            }
            | Break::Reordered {
                sequence, detail, ..
            } => write!(f, "receipt {sequence}: {detail}"),
            Break::Missing {
                expected, found, ..
            } => {
                if found - expected == 1 {
                    write!(f, "receipt {expected} is missing (found {found})")
                } else {
                    write!(
                        f,
                        "receipts {expected} to {} are missing (found {found})",
                        found - 1
                    )
                }
            }
        }
    }
}

/// What was read in one partition.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Records read (markers, fenced records and duplicates included; barriers not).
    pub records: u64,
    /// Receipts verified into the chain.
    pub chained: u64,
    /// Byte-identical resends of a receipt already chained.
    pub resent: u64,
    /// Receipts of an old owner replaced by a newer owner's re-decision.
    pub superseded: u64,
    /// Records behind the partition's owner-epoch fence (a zombie's writes).
    pub fenced: u64,
    /// Fence markers.
    pub markers: u64,
}

/// The verdict on one partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionReport {
    pub partition: i32,
    pub counts: Counts,
    /// Sequence of the last receipt chained.
    pub last_sequence: Option<i64>,
    /// The first break, if any.
    pub first_break: Option<Break>,
}

impl fmt::Display for PartitionReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.counts;
        match &self.first_break {
            None => write!(f, "partition {}: OK, ", self.partition)?,
            Some(b) => write!(f, "partition {}: BROKEN, {b}; before it ", self.partition)?,
        }
        match self.last_sequence {
            Some(last) => write!(f, "{} receipts chained (0..={last})", c.chained)?,
            None => f.write_str("no receipts")?,
        }
        write!(
            f,
            "; {} resent, {} superseded by a takeover, {} fenced, {} fence markers",
            c.resent, c.superseded, c.fenced, c.markers
        )
    }
}

/// The verdict on every partition read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub partitions: Vec<PartitionReport>,
}

impl Report {
    /// True when no partition has a break.
    pub fn is_ok(&self) -> bool {
        self.partitions.iter().all(|p| p.first_break.is_none())
    }

    pub fn partition(&self, partition: i32) -> Option<&PartitionReport> {
        self.partitions.iter().find(|p| p.partition == partition)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for p in &self.partitions {
            writeln!(f, "{p}")?;
        }
        let broken = self
            .partitions
            .iter()
            .filter(|p| p.first_break.is_some())
            .count();
        let chained: u64 = self.partitions.iter().map(|p| p.counts.chained).sum();
        if broken == 0 {
            write!(
                f,
                "OK: {chained} receipts in {} partitions verified",
                self.partitions.len()
            )
        } else {
            write!(
                f,
                "BROKEN: {broken} of {} partitions have a break",
                self.partitions.len()
            )
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Seen {
    sequence: i64,
    hash: [u8; 32],
    owner_epoch: Option<i64>,
}

/// A sequence beyond the next one: missing receipts, or the first of a reordered pair.
#[derive(Clone, Copy, Debug)]
struct Gap {
    offset: i64,
    expected: i64,
    found: i64,
}

/// One partition's chain as read so far; the default is the empty chain (`last` is
/// [`GENESIS`], all zeros).
#[derive(Debug, Default)]
struct Chain {
    /// Sequence the next receipt must have.
    next: i64,
    /// Hash of the last receipt chained.
    last: [u8; 32],
    /// The last [`WINDOW`] receipts chained, to recognise resends and takeovers.
    recent: VecDeque<Seen>,
    gap: Option<Gap>,
    first_break: Option<Break>,
    counts: Counts,
}

impl Chain {
    fn seen(&self, sequence: i64) -> Option<Seen> {
        let first = self.recent.front()?.sequence;
        let index = usize::try_from(sequence.checked_sub(first)?).ok()?;
        self.recent.get(index).copied()
    }

    fn hash_before(&self, sequence: i64) -> Option<[u8; 32]> {
        if sequence == 0 {
            return Some(GENESIS);
        }
        self.seen(sequence - 1).map(|s| s.hash)
    }

    fn push(&mut self, seen: Seen) {
        while self
            .recent
            .back()
            .is_some_and(|s| s.sequence >= seen.sequence)
        {
            self.recent.pop_back();
        }
        self.recent.push_back(seen);
        if self.recent.len() > WINDOW {
            self.recent.pop_front();
        }
        self.next = seen.sequence + 1;
        self.last = seen.hash;
    }
}

/// One record of a receipts topic as read: where, its headers, its value.
#[derive(Clone, Copy, Debug)]
pub struct Read<'a> {
    pub partition: i32,
    pub offset: i64,
    pub headers: &'a [(String, Vec<u8>)],
    pub value: Option<&'a [u8]>,
}

/// Verifies the chains of the partitions it is fed (see the module documentation).
pub struct Verifier {
    codec: Codec,
    keys: HashMap<String, VerifyingKey>,
    fences: FenceFilter,
    chains: BTreeMap<i32, Chain>,
}

impl fmt::Debug for Verifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Verifier")
            .field("keys", &self.keys.keys().collect::<Vec<_>>())
            .field("partitions", &self.chains.len())
            .finish_non_exhaustive()
    }
}

/// The fence filter keys fences by topic; the verifier reads one chain per partition.
const TOPIC: &str = "receipts";

impl Verifier {
    /// A verifier trusting signatures of `keys` (a rotation may have several).
    pub fn new(keys: impl IntoIterator<Item = VerifyingKey>) -> Self {
        Verifier {
            codec: Codec::new(),
            keys: keys.into_iter().map(|k| (key_id(&k), k)).collect(),
            fences: FenceFilter::default(),
            chains: BTreeMap::new(),
        }
    }

    /// Reads receipts with `codec` (one holding the registry's ids reads Confluent-framed
    /// receipts too; the signed content is the Avro datum either way).
    #[must_use]
    pub fn with_codec(mut self, codec: Codec) -> Self {
        self.codec = codec;
        self
    }

    /// Reports `partition` even if no record of it is fed.
    pub fn include(&mut self, partition: i32) {
        self.chains.entry(partition).or_default();
    }

    /// Records read so far, all partitions.
    pub fn records(&self) -> u64 {
        self.chains.values().map(|c| c.counts.records).sum()
    }

    /// Feeds the next record of a partition (records of one partition in offset order).
    pub fn observe(&mut self, read: &Read<'_>) {
        let barrier = read
            .headers
            .iter()
            .any(|(k, v)| k == header::KIND && v.as_slice() == BARRIER_KIND.as_bytes());
        if barrier {
            return;
        }
        let chain = self.chains.entry(read.partition).or_default();
        chain.counts.records += 1;
        let admit = self.fences.admit(
            TOPIC,
            read.partition,
            read.headers.iter().map(|(k, v)| (k.as_str(), v.as_slice())),
        );
        match admit {
            // This reader verifies no marker signatures: `Forged` is never returned.
            Admit::Marker(_) | Admit::Forged(_) => {
                chain.counts.markers += 1;
                return;
            }
            Admit::Fenced { .. } => {
                chain.counts.fenced += 1;
                return;
            }
            Admit::Accept => {}
        }
        if chain.first_break.is_some() {
            return;
        }
        let owner_epoch = wire::header_i64(read.headers, header::OWNER_EPOCH);
        if let Err(b) = check(&self.codec, &self.keys, chain, read, owner_epoch) {
            chain.first_break = Some(b);
        }
    }

    /// The verdict: a gap still open at the end is missing receipts.
    pub fn finish(self) -> Report {
        let partitions = self
            .chains
            .into_iter()
            .map(|(partition, chain)| {
                let first_break = chain.first_break.or(chain.gap.map(|g| Break::Missing {
                    offset: g.offset,
                    expected: g.expected,
                    found: g.found,
                }));
                PartitionReport {
                    partition,
                    counts: chain.counts,
                    last_sequence: (chain.next > 0).then_some(chain.next - 1),
                    first_break,
                }
            })
            .collect();
        Report { partitions }
    }
}

fn check(
    codec: &Codec,
    keys: &HashMap<String, VerifyingKey>,
    chain: &mut Chain,
    read: &Read<'_>,
    owner_epoch: Option<i64>,
) -> Result<(), Break> {
    let offset = read.offset;
    let verified = verify_record(codec, keys, read);
    // A gap is resolved by the record after it, whatever that record is.
    if let Some(gap) = chain.gap.take() {
        return Err(match verified {
            Ok((receipt, _)) if receipt.sequence == gap.expected => Break::Reordered {
                offset: gap.offset,
                sequence: gap.found,
                detail: format!(
                    "comes before receipt {} (at offset {offset})",
                    receipt.sequence
                ),
            },
            _ => Break::Missing {
                offset: gap.offset,
                expected: gap.expected,
                found: gap.found,
            },
        });
    }
    let (receipt, hash) = verified?;
    let sequence = receipt.sequence;
    let reordered = |detail: String| Break::Reordered {
        offset,
        sequence,
        detail,
    };
    if sequence > chain.next {
        chain.gap = Some(Gap {
            offset,
            expected: chain.next,
            found: sequence,
        });
        return Ok(());
    }
    let this = Seen {
        sequence,
        hash,
        owner_epoch,
    };
    if sequence == chain.next {
        if receipt.previous_hash != hex::encode(chain.last) {
            return Err(reordered(format!(
                "its previous hash {} is not the hash of receipt {} ({})",
                receipt.previous_hash,
                sequence - 1,
                hex::encode(chain.last)
            )));
        }
        chain.counts.chained += 1;
        chain.push(this);
        return Ok(());
    }
    let Some(earlier) = chain.seen(sequence) else {
        return Err(reordered(format!("comes after receipt {}", chain.next - 1)));
    };
    if earlier.hash == hash {
        chain.counts.resent += 1;
        return Ok(());
    }
    let newer_owner =
        matches!((earlier.owner_epoch, owner_epoch), (Some(old), Some(new)) if new > old);
    let links = chain
        .hash_before(sequence)
        .is_some_and(|before| receipt.previous_hash == hex::encode(before));
    if newer_owner && links {
        let replaced = (chain.next - sequence) as u64;
        chain.counts.superseded += replaced;
        chain.counts.chained -= replaced - 1;
        chain.push(this);
        return Ok(());
    }
    Err(reordered(format!(
        "comes after receipt {} and differs from the receipt {sequence} read before",
        chain.next - 1
    )))
}

/// Steps 2 and 3: the receipt and its content hash, when it is intact and trusted.
fn verify_record(
    codec: &Codec,
    keys: &HashMap<String, VerifyingKey>,
    read: &Read<'_>,
) -> Result<(Receipt, [u8; 32]), Break> {
    let offset = read.offset;
    let altered = |sequence, detail: String| Break::Altered {
        offset,
        sequence,
        detail,
    };
    let value = read
        .value
        .ok_or_else(|| altered(None, "the record has no value".into()))?;
    let header = codec
        .read_header(value)
        .map_err(|e| altered(None, format!("not a receipt: {e}")))?;
    let receipt: Receipt = codec
        .decode_as(value)
        .map_err(|e| altered(None, format!("not a receipt: {e}")))?;
    let sequence = receipt.sequence;
    let datum = &value[header.framing.header_len()..];
    let content = content_of(datum, &receipt)
        .ok_or_else(|| altered(Some(sequence), "bytes after the signature".into()))?;
    let hash = content_hash(content);
    if hex::encode(hash) != receipt.hash {
        return Err(altered(
            Some(sequence),
            format!(
                "its content hashes to {}, the receipt says {}",
                hex::encode(hash),
                receipt.hash
            ),
        ));
    }
    let bad_signature = |detail: String| Break::BadSignature {
        offset,
        sequence,
        detail,
    };
    let key = keys.get(&receipt.key_id).ok_or_else(|| {
        bad_signature(format!(
            "signed by key {}, which is not trusted",
            receipt.key_id
        ))
    })?;
    if !signature_holds(key, &hash, &receipt.signature) {
        return Err(bad_signature(format!(
            "the signature is not key {}'s",
            receipt.key_id
        )));
    }
    if receipt.partition != read.partition {
        return Err(Break::Reordered {
            offset,
            sequence,
            detail: format!(
                "a receipt of partition {} in partition {}",
                receipt.partition, read.partition
            ),
        });
    }
    Ok((receipt, hash))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::receipt::tests::{chain as sealed_chain, key};
    use crate::runtime::wire::{OutRecord, identity};

    /// One record: its headers and its value.
    type Record = (Vec<(String, Vec<u8>)>, Option<Vec<u8>>);

    /// A topic partition's records in offset order: fence markers and receipts.
    struct Log {
        records: Vec<Record>,
    }

    impl Log {
        fn of(receipts: &[Receipt], owner_epoch: i64) -> Log {
            let mut log = Log {
                records: Vec::new(),
            };
            log.fence(owner_epoch);
            for r in receipts {
                log.push(r, owner_epoch);
            }
            log
        }

        fn fence(&mut self, epoch: i64) {
            let m = OutRecord::fence_marker("airlock.receipts", 0, epoch);
            self.records.push((m.headers, m.value));
        }

        fn push(&mut self, r: &Receipt, owner_epoch: i64) {
            let value = Codec::new().encode_single_object(r).unwrap();
            let headers = identity(
                "receipt",
                &format!("receipt/0/{}", r.sequence),
                0,
                owner_epoch,
            );
            self.records.push((headers, Some(value)));
        }

        fn verify(&self, keys: &[VerifyingKey]) -> PartitionReport {
            let mut v = Verifier::new(keys.iter().copied());
            for (offset, (headers, value)) in self.records.iter().enumerate() {
                v.observe(&Read {
                    partition: 0,
                    offset: offset as i64,
                    headers,
                    value: value.as_deref(),
                });
            }
            v.finish().partitions.remove(0)
        }
    }

    fn trusted() -> Vec<VerifyingKey> {
        vec![key(7).verifying_key()]
    }

    #[test]
    fn an_intact_chain_verifies_with_resends_and_zombies_ignored() {
        let receipts = sealed_chain(&key(7), 0, 5);
        let mut log = Log::of(&receipts, 1);
        // The outbox resends the last two after a crash; a zombie of epoch 0 writes late.
        log.push(&receipts[3], 1);
        log.push(&receipts[4], 1);
        let report = log.verify(&trusted());
        assert_eq!(report.first_break, None, "{report}");
        assert_eq!(report.counts.chained, 5);
        assert_eq!(report.counts.resent, 2);
        assert_eq!(report.last_sequence, Some(4));

        let mut zombie = Log::of(&receipts[..3], 1);
        zombie.fence(2);
        zombie.push(&sealed_chain(&key(7), 1, 4)[3], 1);
        let report = zombie.verify(&trusted());
        assert_eq!(report.first_break, None, "{report}");
        assert_eq!(report.counts.fenced, 1);
    }

    #[test]
    fn a_newer_owner_re_deciding_the_tail_supersedes_it() {
        let receipts = sealed_chain(&key(7), 0, 4);
        let mut log = Log::of(&receipts, 1);
        log.fence(2);
        // The new owner restored a head after receipt 1 and re-decided with another key.
        let mut other = sealed_chain(&key(9), 0, 4);
        // Same content up to receipt 1: chain it to the hashes the old owner wrote.
        let codec = Codec::new();
        let mut head = super::super::Head {
            next_sequence: 2,
            previous_hash: hex::decode(&receipts[1].hash).unwrap().try_into().unwrap(),
        };
        for r in &mut other[2..] {
            super::super::seal(&codec, &key(9), 0, &mut head, r).unwrap();
            log.push(r, 2);
        }
        let report = log.verify(&[key(7).verifying_key(), key(9).verifying_key()]);
        assert_eq!(report.first_break, None, "{report}");
        assert_eq!(report.counts.superseded, 2);
        assert_eq!(report.counts.chained, 4);
    }

    #[test]
    fn a_flipped_byte_is_altered_or_a_bad_signature() {
        let receipts = sealed_chain(&key(7), 0, 6);
        let mut log = Log::of(&receipts, 1);
        // Record 3 is receipt 2 (record 0 is the fence marker).
        let value = log.records[3].1.as_mut().unwrap();
        let detail = value
            .windows(b"HASH_CONFLICT".len())
            .position(|w| w == b"HASH_CONFLICT")
            .unwrap_or(value.len() / 2);
        value[detail] ^= 0x01;
        let report = log.verify(&trusted());
        let b = report.first_break.clone().unwrap();
        assert_eq!(b.name(), "altered", "{report}");
        assert_eq!(b.offset(), 3);
        assert!(b.to_string().contains("receipt 2"), "{b}");

        // The last byte is in the signature: the content still hashes, the signature fails.
        let mut log = Log::of(&receipts, 1);
        let value = log.records[3].1.as_mut().unwrap();
        *value.last_mut().unwrap() ^= 0x80;
        let b = log.verify(&trusted()).first_break.unwrap();
        assert_eq!(b.name(), "bad signature");
        assert_eq!(b.offset(), 3);

        // Every single-byte flip anywhere is caught.
        let clean = Log::of(&receipts, 1);
        let len = clean.records[3].1.as_ref().unwrap().len();
        for at in 0..len {
            let mut log = Log::of(&receipts, 1);
            log.records[3].1.as_mut().unwrap()[at] ^= 0x04;
            let report = log.verify(&trusted());
            assert!(report.first_break.is_some(), "flip at byte {at}: {report}");
        }
    }

    #[test]
    fn an_untrusted_key_is_a_bad_signature() {
        let log = Log::of(&sealed_chain(&key(7), 0, 2), 1);
        let b = log.verify(&[key(8).verifying_key()]).first_break.unwrap();
        assert_eq!(b.name(), "bad signature");
        assert!(b.to_string().contains("not trusted"), "{b}");
    }

    #[test]
    fn a_dropped_receipt_is_missing() {
        let receipts = sealed_chain(&key(7), 0, 6);
        let mut log = Log::of(&receipts, 1);
        log.records.remove(3); // receipt 2
        let report = log.verify(&trusted());
        assert_eq!(
            report.first_break,
            Some(Break::Missing {
                offset: 3,
                expected: 2,
                found: 3
            }),
            "{report}"
        );
        assert!(report.to_string().contains("receipt 2 is missing"));

        // The first receipt dropped, and a gap at the very end.
        let mut log = Log::of(&receipts, 1);
        log.records.remove(1);
        assert_eq!(
            log.verify(&trusted()).first_break.unwrap().name(),
            "missing"
        );
        let mut log = Log::of(&receipts, 1);
        log.records.remove(5);
        assert_eq!(
            log.verify(&trusted()).first_break.unwrap().name(),
            "missing"
        );
    }

    #[test]
    fn two_swapped_receipts_are_reordered() {
        let receipts = sealed_chain(&key(7), 0, 6);
        let mut log = Log::of(&receipts, 1);
        log.records.swap(3, 4); // receipts 2 and 3
        let report = log.verify(&trusted());
        let b = report.first_break.clone().unwrap();
        assert_eq!(b.name(), "reordered", "{report}");
        assert_eq!(b.offset(), 3);
        assert!(b.to_string().contains("receipt 3"), "{b}");

        // Another receipt 1 after receipt 2, from the same owner: the sequence went backwards.
        let mut log = Log::of(&receipts[..3], 1);
        let mut again = receipts[1].clone();
        again.detail = Some("another".into());
        let mut head = super::super::Head {
            next_sequence: 1,
            previous_hash: hex::decode(&receipts[0].hash).unwrap().try_into().unwrap(),
        };
        super::super::seal(&Codec::new(), &key(7), 0, &mut head, &mut again).unwrap();
        log.push(&again, 1);
        let b = log.verify(&trusted()).first_break.unwrap();
        assert_eq!(b.name(), "reordered");
        assert!(b.to_string().contains("differs"), "{b}");
        // The same receipt 1 again is a resend, not a break.
        let mut log = Log::of(&receipts[..3], 1);
        log.push(&receipts[1], 1);
        assert_eq!(log.verify(&trusted()).first_break, None);
    }

    #[test]
    fn a_receipt_from_another_chain_breaks_the_link() {
        let receipts = sealed_chain(&key(7), 0, 3);
        let mut other = sealed_chain(&key(7), 0, 3);
        let mut head = super::super::Head {
            next_sequence: 2,
            previous_hash: [1; 32],
        };
        super::super::seal(&Codec::new(), &key(7), 0, &mut head, &mut other[2]).unwrap();
        let mut log = Log::of(&receipts[..2], 1);
        log.push(&other[2], 1);
        let b = log.verify(&trusted()).first_break.unwrap();
        assert_eq!(b.name(), "reordered");
        assert!(b.to_string().contains("previous hash"), "{b}");
    }
}
