//! What Airlock's output records look like on the wire, beyond their Avro value: the headers
//! that carry each record's deterministic identity and owner epoch, the owner-epoch fence
//! markers (DESIGN.md section 5, fence 1), the outbox entry format, and the filter every
//! consumer of an output partition applies.
//!
//! Headers (UTF-8 values):
//!
//! | header | on | meaning |
//! | --- | --- | --- |
//! | `airlock-kind` | every output | `decision`, `dispatch`, `reconcile`, `journal`, `receipt`, `changelog`, `dlq`, `fence`, `barrier`, `outcome` (connector workers) |
//! | `airlock-id` | every output | deterministic identity: consumers deduplicate on it |
//! | `airlock-owner-partition` | every output | the task's partition |
//! | `airlock-owner-epoch` | every output | the task's owner epoch; a fence marker announces one |
//! | `airlock-dlq-reason`, `airlock-dlq-detail` | dlq | the refusal's reason code and text |
//! | `airlock-source-topic`, `-partition`, `-offset` | dlq | where the refused record was read |
//! | `traceparent`, `tracestate` | outputs caused by an input, outcomes | W3C trace context of the span that wrote it (`crate::telemetry::trace`); never part of an identity |
//!
//! The fence rule: a consumer of an output partition drops every record whose owner epoch is
//! lower than the highest fence marker it has read in that partition. A zombie task writes
//! behind the new owner's marker, so whatever it writes is dropped.

use std::collections::HashMap;
use std::io::{Read, Write};

/// Header names. Frozen: consumers in other languages read them.
pub mod header {
    pub const KIND: &str = "airlock-kind";
    pub const ID: &str = "airlock-id";
    pub const OWNER_PARTITION: &str = "airlock-owner-partition";
    pub const OWNER_EPOCH: &str = "airlock-owner-epoch";
    pub const DLQ_REASON: &str = "airlock-dlq-reason";
    pub const DLQ_DETAIL: &str = "airlock-dlq-detail";
    pub const SOURCE_TOPIC: &str = "airlock-source-topic";
    pub const SOURCE_PARTITION: &str = "airlock-source-partition";
    pub const SOURCE_OFFSET: &str = "airlock-source-offset";
    /// On a dead letter whose copy was cut to fit a record: `key`, `value` or `key,value`.
    pub const DLQ_TRUNCATED: &str = "airlock-dlq-truncated";
    /// On a cut dead letter: the size in bytes of the original key and value.
    pub const DLQ_KEY_BYTES: &str = "airlock-dlq-key-bytes";
    pub const DLQ_VALUE_BYTES: &str = "airlock-dlq-value-bytes";
    /// On a cut dead letter: SHA-256 (lowercase hex) of the original key and value.
    pub const DLQ_KEY_SHA256: &str = "airlock-dlq-key-sha256";
    pub const DLQ_VALUE_SHA256: &str = "airlock-dlq-value-sha256";
    /// On a fence marker when the processor signs (`capability.signing_key_file`): the
    /// marker's capability (`capability::sign_fence`), raw bytes. Connector workers honour a
    /// marker only when it verifies.
    pub const CAPABILITY: &str = "airlock-capability";
    /// On the last changelog record of a sealed batch (value `1`): restore applies a batch only
    /// once it has read this record (see `restore::WholeBatches`).
    pub const BATCH_END: &str = "airlock-batch-end";
}

/// The longest refusal detail a dead letter or a refusal decision carries, in bytes.
pub const MAX_DETAIL_BYTES: usize = 1_024;

/// The longest Kafka key a dead-letter copy keeps, in bytes.
pub const MAX_DEAD_LETTER_KEY_BYTES: usize = 1_024;

/// `text` cut to at most `max` bytes (at a character boundary), saying how much was cut.
pub fn clip(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if text.len() <= max {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    std::borrow::Cow::Owned(format!(
        "{}…[{} more bytes]",
        &text[..end],
        text.len() - end
    ))
}

/// The key and value a dead letter keeps of its input: the originals when they fit a record
/// whose payload may be `max_value` bytes (the key at most [`MAX_DEAD_LETTER_KEY_BYTES`]),
/// else their first bytes, with the original's size and SHA-256 added to `headers` so that
/// whoever holds the original can prove which record it was.
pub fn dead_letter_copy(
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    max_value: usize,
    headers: &mut Vec<(String, Vec<u8>)>,
) -> (Option<Vec<u8>>, Option<Vec<u8>>) {
    use sha2::{Digest, Sha256};
    let mut truncated = Vec::new();
    let mut keep = |bytes: &[u8], max: usize, what: &'static str, size: &str, digest: &str| {
        if bytes.len() <= max {
            return bytes.to_vec();
        }
        truncated.push(what);
        headers.push((size.to_owned(), bytes.len().to_string().into_bytes()));
        let sha = crate::core::canonical::hex_lower(&Sha256::digest(bytes));
        headers.push((digest.to_owned(), sha.into_bytes()));
        bytes[..max].to_vec()
    };
    let key = key.map(|k| {
        keep(
            k,
            MAX_DEAD_LETTER_KEY_BYTES,
            "key",
            header::DLQ_KEY_BYTES,
            header::DLQ_KEY_SHA256,
        )
    });
    let value = value.map(|v| {
        keep(
            v,
            max_value,
            "value",
            header::DLQ_VALUE_BYTES,
            header::DLQ_VALUE_SHA256,
        )
    });
    if !truncated.is_empty() {
        headers.push((
            header::DLQ_TRUNCATED.to_owned(),
            truncated.join(",").into_bytes(),
        ));
    }
    (key, value)
}

/// The value of `airlock-kind` on a fence marker.
pub const FENCE_KIND: &str = "fence";
/// The value of `airlock-kind` on a barrier: a record a task writes to learn where a partition
/// ends (its acknowledged offset). Carries owner epoch 0, so every fence drops it.
pub const BARRIER_KIND: &str = "barrier";
/// The Kafka key of every barrier record. Input topics carry barriers too (a connector learns
/// the end of an outcomes partition this way); the processor consumes them without deciding.
pub const BARRIER_KEY: &[u8] = b"\0airlock-barrier";
/// True for a barrier record (its key and an empty value), whoever wrote it: consumed, never
/// decided.
pub fn is_barrier(key: Option<&[u8]>, payload: Option<&[u8]>) -> bool {
    key == Some(BARRIER_KEY) && payload.is_none_or(<[u8]>::is_empty)
}

/// The Kafka key prefix of fence markers (`\0airlock-fence/<epoch>`): compacted topics refuse
/// records without a key, and one key per epoch keeps compaction from removing older markers.
pub const FENCE_KEY_PREFIX: &str = "\0airlock-fence/";

/// One record to produce, as kept in the outbox until the broker acknowledged it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutRecord {
    pub topic: String,
    /// Always the task's partition: every topic is co-partitioned.
    pub partition: i32,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(String, Vec<u8>)>,
    /// Produce order within a batch: every phase-0 record (decisions, dispatches, journal,
    /// DLQ) is acknowledged before phase 1 (changelog) is sent, so a changelog that shows a
    /// batch's state implies its outputs were delivered.
    pub phase: u8,
}

impl OutRecord {
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_slice())
    }

    /// A fence marker announcing `owner_epoch` on `topic`'s partition `partition`.
    pub fn fence_marker(topic: &str, partition: i32, owner_epoch: i64) -> OutRecord {
        OutRecord {
            topic: topic.to_owned(),
            partition,
            key: Some(format!("{FENCE_KEY_PREFIX}{owner_epoch}").into_bytes()),
            value: Some(owner_epoch.to_string().into_bytes()),
            headers: identity(
                FENCE_KIND,
                &format!("fence/{partition}/{owner_epoch}"),
                partition,
                owner_epoch,
            ),
            phase: 0,
        }
    }
}

impl OutRecord {
    /// A barrier on `topic`'s partition `partition` (see [`BARRIER_KIND`]).
    pub fn barrier(topic: &str, partition: i32) -> OutRecord {
        OutRecord {
            topic: topic.to_owned(),
            partition,
            key: Some(BARRIER_KEY.to_vec()),
            value: Some(Vec::new()),
            headers: identity(BARRIER_KIND, "barrier", partition, 0),
            phase: 0,
        }
    }
}

/// The four headers every output carries.
pub fn identity(kind: &str, id: &str, partition: i32, owner_epoch: i64) -> Vec<(String, Vec<u8>)> {
    vec![
        (header::KIND.to_owned(), kind.as_bytes().to_vec()),
        (header::ID.to_owned(), id.as_bytes().to_vec()),
        (
            header::OWNER_PARTITION.to_owned(),
            partition.to_string().into_bytes(),
        ),
        (
            header::OWNER_EPOCH.to_owned(),
            owner_epoch.to_string().into_bytes(),
        ),
    ]
}

/// An outbox entry that cannot be read back: the store is corrupt.
#[derive(Debug, thiserror::Error)]
#[error("outbox entry is corrupt at byte {at}: {what}")]
pub struct DecodeError {
    pub at: usize,
    pub what: &'static str,
}

/// One record per outbox row (how rows were written before version 2; still read).
const OUTBOX_VERSION: u8 = 1;
/// One row per sealed batch of a partition: `[2][n u32]{[length u32][version-1 entry]}`.
/// A batch's records are written, acknowledged and deleted together, so one RocksDB entry
/// instead of one per record (and one tombstone instead of one per record). Written
/// uncompressed before version 3; still read.
const OUTBOX_ROW_VERSION: u8 = 2;

/// One partition's sealed batch in the outbox: the row that holds it and its records, in
/// outbox order (outputs, then the changelog). Done once the row is deleted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outbox {
    /// The row's key in the outbox table (rows are numbered in seal order).
    pub row: u64,
    pub records: Vec<OutRecord>,
}

/// A version-2 row compressed as an LZ4 frame: `[3][frame]`. A batch's records repeat their
/// topics, header names, schema fingerprints and the JSON field names of the state rows that
/// both the journal and the changelog carry, so the row shrinks ≈ 8× (4.9 KB → 0.6 KB per
/// proposal in `airlock-bench-core`), and with it what every commit copies into the
/// `WriteBatch`, the write-ahead log and the memtable, which fills ≈ 3× less often.
const OUTBOX_LZ4_ROW_VERSION: u8 = 3;

/// Plain bytes handed to the LZ4 encoder at a time, one frame block: a row is compressed
/// while it is in cache and never held whole (a catch-up batch's is ≈ 10 MB). LZ4 looks back
/// 64 KB at most, and linked blocks keep that window across block boundaries.
const CHUNK: usize = 64 << 10;

/// Encodes sealed batches into outbox rows, reusing its chunk buffer from one batch to the
/// next. One per partition task.
#[derive(Debug, Default)]
pub struct RowEncoder {
    chunk: Vec<u8>,
}

impl RowEncoder {
    /// `records` as one outbox row, as [`decode_outbox_row`] reads it back.
    pub fn encode(&mut self, records: &[OutRecord]) -> Vec<u8> {
        self.chunk.clear();
        self.chunk.reserve(CHUNK + 4096);
        // ≈ 100 bytes a record compressed (`airlock-bench-core`): rarely grown, never by much.
        let mut row = Vec::with_capacity(64 + 128 * records.len());
        row.push(OUTBOX_LZ4_ROW_VERSION);
        const WHY: &str = "LZ4 frame compression into memory cannot fail: the crate sizes \
                           its output buffer to the bound";
        let mut lz4 = lz4::EncoderBuilder::new()
            .block_size(lz4::BlockSize::Max64KB)
            .block_mode(lz4::BlockMode::Linked)
            .checksum(lz4::ContentChecksum::NoChecksum)
            .build(row)
            .expect(WHY);
        plain_row_head(&mut self.chunk, records.len());
        for r in records {
            push_framed(&mut self.chunk, r);
            if self.chunk.len() >= CHUNK {
                lz4.write_all(&self.chunk).expect(WHY);
                self.chunk.clear();
            }
        }
        lz4.write_all(&self.chunk).expect(WHY);
        let (row, end) = lz4.finish();
        end.expect(WHY);
        // A record far larger than a chunk (a big DLQ payload) is not kept for every batch.
        if self.chunk.capacity() > 4 * CHUNK {
            self.chunk = Vec::new();
        }
        row
    }
}

/// A sealed batch's records as one outbox row (see [`RowEncoder`], which keeps its buffers).
pub fn encode_outbox_row(records: &[OutRecord]) -> Vec<u8> {
    RowEncoder::default().encode(records)
}

/// The start of a version-2 row of `n` records.
fn plain_row_head(out: &mut Vec<u8>, n: usize) {
    out.push(OUTBOX_ROW_VERSION);
    out.extend_from_slice(&(n as u32).to_be_bytes());
}

/// Appends `r` to a version-2 row: `[length u32][version-1 entry]`.
fn push_framed(out: &mut Vec<u8>, r: &OutRecord) {
    let at = out.len();
    out.extend_from_slice(&[0; 4]);
    write_outbox(out, r);
    let len = (out.len() - at - 4) as u32;
    out[at..at + 4].copy_from_slice(&len.to_be_bytes());
}

/// The records of an outbox row, of any version.
pub fn decode_outbox_row(buf: &[u8]) -> Result<Vec<OutRecord>, DecodeError> {
    match buf.first() {
        Some(&OUTBOX_VERSION) => Ok(vec![decode_outbox(buf)?]),
        Some(&OUTBOX_ROW_VERSION) => decode_plain_row(buf),
        Some(&OUTBOX_LZ4_ROW_VERSION) => {
            let corrupt = |what| DecodeError { at: 1, what };
            let mut lz4 = lz4::Decoder::new(&buf[1..]).map_err(|_| corrupt("lz4 frame"))?;
            let mut plain = Vec::new();
            lz4.read_to_end(&mut plain)
                .map_err(|_| corrupt("lz4 frame"))?;
            let (rest, end) = lz4.finish();
            end.map_err(|_| corrupt("lz4 frame end"))?;
            if !rest.is_empty() {
                return Err(DecodeError {
                    at: buf.len() - rest.len(),
                    what: "trailing bytes",
                });
            }
            // Only a version-2 row is ever compressed.
            if plain.first() != Some(&OUTBOX_ROW_VERSION) {
                return Err(corrupt("compressed row version"));
            }
            decode_plain_row(&plain).map_err(|e| corrupt(e.what))
        }
        _ => Err(DecodeError {
            at: 0,
            what: "unknown version",
        }),
    }
}

/// The big-endian `u32` at `at`.
fn be_u32(buf: &[u8], at: usize, what: &'static str) -> Result<usize, DecodeError> {
    buf.get(at..at + 4)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
        .ok_or(DecodeError { at, what })
}

/// The records of a version-2 row.
fn decode_plain_row(buf: &[u8]) -> Result<Vec<OutRecord>, DecodeError> {
    let n = be_u32(buf, 1, "record count")?;
    let mut at = 5;
    let mut records = Vec::with_capacity(n.min(4096));
    for _ in 0..n {
        let len = be_u32(buf, at, "record length")?;
        let entry = buf
            .get(at + 4..at + 4 + len)
            .ok_or(DecodeError { at, what: "record" })?;
        records.push(decode_outbox(entry).map_err(|e| DecodeError {
            at: at + 4 + e.at,
            what: e.what,
        })?);
        at += 4 + len;
    }
    if at != buf.len() {
        return Err(DecodeError {
            at,
            what: "trailing bytes",
        });
    }
    Ok(records)
}

/// `r` as a row of its own, as rows were written before version 2: the tests of reading
/// old stores write them with this.
#[cfg(test)]
pub fn encode_outbox(r: &OutRecord) -> Vec<u8> {
    let mut out = Vec::new();
    write_outbox(&mut out, r);
    out
}

/// `[version][phase][partition i32][topic][key?][value?][n headers u32]{[name][value]}`, every
/// variable field as `u32 length ++ bytes`, optional fields with a presence byte first.
fn write_outbox(out: &mut Vec<u8>, r: &OutRecord) {
    fn bytes(out: &mut Vec<u8>, b: &[u8]) {
        out.extend_from_slice(&(b.len() as u32).to_be_bytes());
        out.extend_from_slice(b);
    }
    fn opt(out: &mut Vec<u8>, b: Option<&[u8]>) {
        match b {
            Some(b) => {
                out.push(1);
                bytes(out, b);
            }
            None => out.push(0),
        }
    }
    out.push(OUTBOX_VERSION);
    out.push(r.phase);
    out.extend_from_slice(&r.partition.to_be_bytes());
    bytes(out, r.topic.as_bytes());
    opt(out, r.key.as_deref());
    opt(out, r.value.as_deref());
    out.extend_from_slice(&(r.headers.len() as u32).to_be_bytes());
    for (k, v) in &r.headers {
        bytes(out, k.as_bytes());
        bytes(out, v);
    }
}

pub fn decode_outbox(buf: &[u8]) -> Result<OutRecord, DecodeError> {
    struct Reader<'a> {
        buf: &'a [u8],
        at: usize,
    }
    impl<'a> Reader<'a> {
        fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
            let end = self
                .at
                .checked_add(n)
                .filter(|e| *e <= self.buf.len())
                .ok_or(DecodeError { at: self.at, what })?;
            let s = &self.buf[self.at..end];
            self.at = end;
            Ok(s)
        }
        fn u32(&mut self, what: &'static str) -> Result<usize, DecodeError> {
            let b = self.take(4, what)?;
            Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
        }
        fn bytes(&mut self, what: &'static str) -> Result<Vec<u8>, DecodeError> {
            let n = self.u32(what)?;
            Ok(self.take(n, what)?.to_vec())
        }
        fn string(&mut self, what: &'static str) -> Result<String, DecodeError> {
            let at = self.at;
            String::from_utf8(self.bytes(what)?).map_err(|_| DecodeError { at, what })
        }
        fn opt(&mut self, what: &'static str) -> Result<Option<Vec<u8>>, DecodeError> {
            match self.take(1, what)?[0] {
                0 => Ok(None),
                1 => self.bytes(what).map(Some),
                _ => Err(DecodeError { at: self.at, what }),
            }
        }
    }
    let mut r = Reader { buf, at: 0 };
    if r.take(1, "version")?[0] != OUTBOX_VERSION {
        return Err(DecodeError {
            at: 0,
            what: "unknown version",
        });
    }
    let phase = r.take(1, "phase")?[0];
    let p = r.take(4, "partition")?;
    let partition = i32::from_be_bytes([p[0], p[1], p[2], p[3]]);
    let topic = r.string("topic")?;
    let key = r.opt("key")?;
    let value = r.opt("value")?;
    let n = r.u32("header count")?;
    let mut headers = Vec::with_capacity(n.min(64));
    for _ in 0..n {
        headers.push((r.string("header name")?, r.bytes("header value")?));
    }
    if r.at != buf.len() {
        return Err(DecodeError {
            at: r.at,
            what: "trailing bytes",
        });
    }
    Ok(OutRecord {
        topic,
        partition,
        key,
        value,
        headers,
        phase,
    })
}

/// What a consumer should do with a record read from an output partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    /// A fence marker: it raised (or repeated) the partition's fence; not a payload.
    Marker(i64),
    /// A record of the current owner (or of an older one written before the takeover).
    Accept,
    /// A record of an owner whose epoch is behind the partition's fence: a zombie's write.
    Fenced { owner_epoch: i64, fence: i64 },
    /// A fence marker whose `airlock-capability` does not verify under the processor's keys
    /// given to a [`FenceFilter::verifying`] reader: it raises no fence; not a payload.
    Forged(i64),
}

/// A record's `airlock-kind` and `airlock-owner-epoch` headers as every Airlock reader takes
/// them: the last of each name counts, and an epoch that is not a decimal `i64` is none.
pub fn kind_and_epoch<'h>(
    headers: impl IntoIterator<Item = (&'h str, &'h [u8])>,
) -> (Option<&'h [u8]>, Option<i64>) {
    let mut kind = None;
    let mut epoch = None;
    for (k, v) in headers {
        match k {
            header::KIND => kind = Some(v),
            header::OWNER_EPOCH => {
                epoch = std::str::from_utf8(v)
                    .ok()
                    .and_then(|s| s.parse::<i64>().ok());
            }
            _ => {}
        }
    }
    (kind, epoch)
}

/// The owner epoch of a fence marker, read exactly as [`FenceFilter::admit`] reads it (`None`
/// for any other record, which raises no fence).
pub fn marker_epoch<'h>(headers: impl IntoIterator<Item = (&'h str, &'h [u8])>) -> Option<i64> {
    match kind_and_epoch(headers) {
        (Some(kind), Some(epoch)) if kind == FENCE_KIND.as_bytes() => Some(epoch),
        _ => None,
    }
}

/// The consumer side of fence 1: the highest marker read per (topic, partition).
///
/// A reader that holds the processor's verifying keys ([`FenceFilter::verifying`]) raises the
/// fence only for markers signed by one of them (`capability::sign_fence`): a marker forged by
/// whoever can write the topic (owner epoch 999999, say) would otherwise hide every later
/// answer on its partition. Without keys every marker counts (a processor that does not sign).
#[derive(Clone, Debug, Default)]
pub struct FenceFilter {
    fences: HashMap<(String, i32), i64>,
    keys: Option<std::sync::Arc<[crate::capability::VerifyingKey]>>,
}

impl FenceFilter {
    /// A filter that honours only fence markers signed under one of `keys` (none: every
    /// marker, as [`FenceFilter::default`]).
    pub fn verifying(keys: Vec<crate::capability::VerifyingKey>) -> FenceFilter {
        FenceFilter {
            fences: HashMap::new(),
            keys: (!keys.is_empty()).then(|| keys.into()),
        }
    }

    /// Classifies one record, given its headers, in the order records are read.
    pub fn admit<'h>(
        &mut self,
        topic: &str,
        partition: i32,
        headers: impl IntoIterator<Item = (&'h str, &'h [u8])>,
    ) -> Admit {
        let mut capability = None;
        let (kind, epoch) = kind_and_epoch(headers.into_iter().inspect(|(k, v)| {
            if *k == header::CAPABILITY {
                capability = Some(*v);
            }
        }));
        // Records without an owner epoch are not Airlock's: nothing to fence.
        let Some(epoch) = epoch else {
            return Admit::Accept;
        };
        if kind == Some(FENCE_KIND.as_bytes())
            && let Some(keys) = &self.keys
            && crate::capability::verify_fence_any(keys, capability, topic, partition, epoch)
                .is_err()
        {
            return Admit::Forged(epoch);
        }
        let fence = self
            .fences
            .entry((topic.to_owned(), partition))
            .or_insert(0);
        if kind == Some(FENCE_KIND.as_bytes()) {
            *fence = (*fence).max(epoch);
            return Admit::Marker(epoch);
        }
        if epoch < *fence {
            Admit::Fenced {
                owner_epoch: epoch,
                fence: *fence,
            }
        } else {
            Admit::Accept
        }
    }

    /// The highest marker read on `topic`'s `partition` (0 before any).
    pub fn fence(&self, topic: &str, partition: i32) -> i64 {
        self.fences
            .get(&(topic.to_owned(), partition))
            .copied()
            .unwrap_or(0)
    }
}

/// Reads a decimal header value.
pub fn header_i64(headers: &[(String, Vec<u8>)], name: &str) -> Option<i64> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .and_then(|(_, v)| std::str::from_utf8(v).ok())
        .and_then(|s| s.parse().ok())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn headers(r: &OutRecord) -> Vec<(&str, &[u8])> {
        r.headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_slice()))
            .collect()
    }

    #[test]
    fn a_verifying_reader_raises_its_fence_only_for_signed_markers() {
        let key = crate::capability::SigningKey::from_bytes(&[9; 32]);
        let other = crate::capability::SigningKey::from_bytes(&[8; 32]);
        let marker = |epoch: i64, signer: Option<&crate::capability::SigningKey>| {
            let mut headers = vec![
                (header::KIND.to_owned(), FENCE_KIND.as_bytes().to_vec()),
                (
                    header::OWNER_EPOCH.to_owned(),
                    epoch.to_string().into_bytes(),
                ),
            ];
            if let Some(k) = signer {
                headers.push((
                    header::CAPABILITY.to_owned(),
                    crate::capability::sign_fence(k, "d", 0, epoch),
                ));
            }
            headers
        };
        let answer = |epoch: i64| {
            vec![
                (header::KIND.to_owned(), b"decision".to_vec()),
                (
                    header::OWNER_EPOCH.to_owned(),
                    epoch.to_string().into_bytes(),
                ),
            ]
        };
        fn borrow(h: &[(String, Vec<u8>)]) -> Vec<(&str, &[u8])> {
            h.iter().map(|(k, v)| (k.as_str(), v.as_slice())).collect()
        }
        let mut f = FenceFilter::verifying(vec![key.verifying_key()]);
        assert_eq!(
            f.admit("d", 0, borrow(&marker(2, Some(&key)))),
            Admit::Marker(2)
        );
        for forged in [marker(999_999, None), marker(999_999, Some(&other))] {
            assert_eq!(f.admit("d", 0, borrow(&forged)), Admit::Forged(999_999));
        }
        // The signature binds the partition: partition 0's marker does not verify on 1.
        assert_eq!(
            f.admit("d", 1, borrow(&marker(2, Some(&key)))),
            Admit::Forged(2)
        );
        assert_eq!(f.admit("d", 0, borrow(&answer(2))), Admit::Accept);
        assert_eq!(f.fence("d", 0), 2);
        // Without keys, the forged marker hides the owner's answers.
        let mut trusting = FenceFilter::default();
        trusting.admit("d", 0, borrow(&marker(999_999, None)));
        assert!(matches!(
            trusting.admit("d", 0, borrow(&answer(2))),
            Admit::Fenced { .. }
        ));
    }

    #[test]
    fn a_marker_epoch_is_read_as_the_fence_filter_reads_it() {
        let max = i64::MAX.to_string();
        let headers = [
            (header::KIND, FENCE_KIND.as_bytes()),
            (header::OWNER_EPOCH, b"x".as_slice()),
            (header::OWNER_EPOCH, max.as_bytes()),
        ];
        assert_eq!(marker_epoch(headers), Some(i64::MAX));
        let mut filter = FenceFilter::default();
        assert_eq!(filter.admit("t", 0, headers), Admit::Marker(i64::MAX));
        let not_a_marker = [
            (header::KIND, FENCE_KIND.as_bytes()),
            (header::KIND, b"decision".as_slice()),
            (header::OWNER_EPOCH, b"5".as_slice()),
        ];
        assert_eq!(marker_epoch(not_a_marker), None);
        assert_eq!(filter.admit("t", 1, not_a_marker), Admit::Accept);
    }

    #[test]
    fn outbox_entries_round_trip_and_refuse_corruption() {
        let r = OutRecord {
            topic: "airlock.decisions".into(),
            partition: 3,
            key: Some(b"refund:1".to_vec()),
            value: None,
            headers: identity("decision", "p/1", 3, 7),
            phase: 1,
        };
        let bytes = encode_outbox(&r);
        assert_eq!(decode_outbox(&bytes).unwrap(), r);
        for cut in 0..bytes.len() {
            assert!(decode_outbox(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = bytes.clone();
        long.push(0);
        assert!(decode_outbox(&long).is_err());
    }

    #[test]
    fn outbox_rows_hold_a_batch_and_still_read_single_record_rows() {
        let records: Vec<OutRecord> = (0..3)
            .map(|i| OutRecord {
                topic: format!("airlock.t{i}"),
                partition: i,
                key: (i != 1).then(|| format!("k{i}").into_bytes()),
                value: Some(vec![i as u8; 10 * i as usize]),
                headers: identity("decision", &format!("p/{i}"), i, 7),
                phase: u8::from(i == 2),
            })
            .collect();
        let plain = plain_row(&records);
        assert_eq!(plain[0], OUTBOX_ROW_VERSION);
        assert_eq!(decode_outbox_row(&plain).unwrap(), records);
        let row = encode_outbox_row(&records);
        assert_eq!(decode_outbox_row(&row).unwrap(), records);
        for cut in 0..row.len() {
            assert!(decode_outbox_row(&row[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = row.clone();
        long.push(0);
        assert!(decode_outbox_row(&long).is_err());
        assert_eq!(decode_outbox_row(&encode_outbox_row(&[])).unwrap(), vec![]);
        // A row written one record per row, before version 2.
        let single = encode_outbox(&records[0]);
        assert_eq!(
            decode_outbox_row(&single).unwrap(),
            vec![records[0].clone()]
        );
        assert!(decode_outbox_row(&[9, 0, 0, 0, 0]).is_err());
    }

    /// `records` as a version-2 row, as rows were stored before version 3.
    fn plain_row(records: &[OutRecord]) -> Vec<u8> {
        let mut out = Vec::new();
        plain_row_head(&mut out, records.len());
        for r in records {
            push_framed(&mut out, r);
        }
        out
    }

    /// A batch of look-alike records, as a sealed batch is.
    fn batch(n: usize) -> Vec<OutRecord> {
        (0..n)
            .map(|i| OutRecord {
                topic: "airlock.journal".into(),
                partition: 2,
                key: Some(format!("refund:txn_{i}").into_bytes()),
                value: Some(
                    format!(r#"{{"operation_key":"refund:txn_{i}","state":"DISPATCHED"}}"#)
                        .into_bytes(),
                ),
                headers: identity("journal", &format!("journal/2/{i}"), 2, 7),
                phase: 0,
            })
            .collect()
    }

    #[test]
    fn a_batch_row_is_stored_compressed_and_reads_back_whole() {
        let records = batch(200);
        let plain = plain_row(&records);
        let mut encoder = RowEncoder::default();
        let row = encoder.encode(&records);
        assert_eq!(row[0], OUTBOX_LZ4_ROW_VERSION);
        assert!(
            row.len() * 4 < plain.len(),
            "{} of {}",
            row.len(),
            plain.len()
        );
        assert_eq!(decode_outbox_row(&row).unwrap(), records);
        // The encoder's buffers carry nothing over from one batch to the next.
        let fewer = batch(3);
        assert_eq!(decode_outbox_row(&encoder.encode(&fewer)).unwrap(), fewer);
        for cut in 0..row.len() {
            assert!(decode_outbox_row(&row[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = row.clone();
        long.push(0);
        assert!(decode_outbox_row(&long).is_err());
        let mut magic = row.clone();
        magic[1] ^= 0xff;
        let err = decode_outbox_row(&magic).unwrap_err();
        assert_eq!((err.at, err.what), (1, "lz4 frame"));
        // A catch-up batch spans many of the encoder's chunks.
        let many = batch(5000);
        let row = encoder.encode(&many);
        assert!(plain_row(&many).len() > 4 * CHUNK);
        assert_eq!(decode_outbox_row(&row).unwrap(), many);
    }

    #[test]
    fn a_row_that_lz4_cannot_shrink_costs_only_its_framing() {
        // One record of bytes without repetition: LZ4 stores the block as it is.
        let mut noise = Vec::with_capacity(4096);
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        for _ in 0..4096 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            noise.push(x as u8);
        }
        let records = vec![OutRecord {
            topic: "airlock.dlq".into(),
            partition: 0,
            key: None,
            value: Some(noise),
            headers: Vec::new(),
            phase: 0,
        }];
        let row = encode_outbox_row(&records);
        assert!(row.len() <= plain_row(&records).len() + 32, "{}", row.len());
        assert_eq!(decode_outbox_row(&row).unwrap(), records);
    }

    #[test]
    fn a_zombie_behind_a_newer_marker_is_fenced() {
        let mut f = FenceFilter::default();
        let old = OutRecord {
            topic: "d".into(),
            partition: 0,
            key: None,
            value: None,
            headers: identity("decision", "x", 0, 1),
            phase: 0,
        };
        assert_eq!(f.admit("d", 0, headers(&old)), Admit::Accept);
        let m2 = OutRecord::fence_marker("d", 0, 2);
        assert_eq!(f.admit("d", 0, headers(&m2)), Admit::Marker(2));
        assert_eq!(
            f.admit("d", 0, headers(&old)),
            Admit::Fenced {
                owner_epoch: 1,
                fence: 2
            }
        );
        // Other partitions have their own fence.
        assert_eq!(f.admit("d", 1, headers(&old)), Admit::Accept);
        assert_eq!(f.fence("d", 0), 2);
    }
}
