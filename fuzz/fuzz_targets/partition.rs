//! A partition task (RocksDB in a temporary directory, the reference registry and policies) fed
//! batches of records as anyone who can write the four input topics can write them: proposals,
//! approvals, outcomes and controls on a handful of operation keys, with fields the fuzzer
//! chooses and bytes it flips after encoding, and raw bytes under any key. The task lives
//! across inputs (a fresh one every 2,000), so state builds up as it does in production.
//!
//! Each batch is decided as the runtime decides one (`runtime::decide`): a record whose
//! outputs cannot be encoded sends the batch back to its save point and is dead-lettered the
//! second time. Checked: deciding never fails, no output record exceeds the record limit, and
//! a fresh proposal after the batch is answered.
#![no_main]

use std::sync::{LazyLock, Mutex};

use airlock_processor::core::canonical::canonicalize;
use airlock_processor::runtime::config::RECORD_RESERVE_BYTES;
use airlock_processor::runtime::partition::{Error, InputRecord, PartitionTask, Source};
use airlock_processor::runtime::topics::Names;
use airlock_processor::sample;
use airlock_processor::store::{RocksBackend, RocksOptions, StateStore};
use airlock_schemas::{AnyRecord, ApprovalVerdict, Codec, ControlKind, OutcomeKind};
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;

/// The payload limit: small, so that the fuzzer reaches the oversized paths.
const LIMIT: usize = 16 * 1_024;
const TIMERS_PER_BATCH: usize = 64;
const KEYS: u8 = 6;
const TOOLS: [&str; 5] = [
    "refund",
    "debit",
    "wire_transfer",
    "send_email",
    "no_such_tool",
];
const PEOPLE: [&str; 4] = ["alice", "bob", "agent-support-1", "mallory"];

/// Byte flips applied to an encoded record: (position modulo the length, xor mask).
type Flips = Vec<(u16, u8)>;

#[derive(Arbitrary, Debug)]
enum Op {
    Proposal {
        key: u8,
        minor_units: i64,
        tool: u8,
        other_tenant: bool,
        arguments: Option<String>,
        flips: Flips,
    },
    Approval {
        key: u8,
        minor_units: i64,
        right_hash: bool,
        approver: u8,
        reject: bool,
        flips: Flips,
    },
    Outcome {
        key: u8,
        epoch: u8,
        kind: u8,
        evidence: String,
        round: Option<i32>,
        flips: Flips,
    },
    Control {
        key: u8,
        kind: u8,
        flips: Flips,
    },
    Raw {
        source: u8,
        key: Option<Vec<u8>>,
        value: Option<Vec<u8>>,
    },
}

#[derive(Arbitrary, Debug)]
struct Batch {
    /// Each record with the milliseconds since the one before it.
    records: Vec<(Op, u16)>,
}

struct Harness {
    _dir: tempfile::TempDir,
    task: PartitionTask,
    names: Names,
    codec: Codec,
    /// The next offset of each input topic, in `Source::ALL` order.
    offsets: [i64; 4],
    now: i64,
    fresh: u64,
}

/// A fresh task every this many inputs: state (one fresh key per input) and the cost of a
/// checkpoint, which hashes the whole projection, stay bounded.
const INPUTS_PER_TASK: u64 = 2_000;

static CORE: LazyLock<std::sync::Arc<airlock_processor::core::Core>> = LazyLock::new(|| {
    std::sync::Arc::new(
        sample::reference_core(airlock_processor::core::Config::default())
            .expect("the reference core loads"),
    )
});

static HARNESS: Mutex<Option<Harness>> = Mutex::new(None);

impl Harness {
    fn new() -> Harness {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let backend = RocksBackend::open(
            dir.path(),
            &RocksOptions {
                sync: false,
                ..RocksOptions::default()
            },
        )
        .expect("RocksDB opens");
        let store = StateStore::open(backend).expect("the store opens");
        let names = Names::new("fuzz.");
        let codec = Codec::new().with_max_payload_bytes(LIMIT);
        let task = PartitionTask::new(
            CORE.clone(),
            store,
            sample::task_context(0),
            names.clone(),
            codec.clone(),
            1,
        )
        .expect("the task opens");
        Harness {
            _dir: dir,
            task,
            names,
            codec,
            offsets: [0; 4],
            now: 1_767_225_600_000,
            fresh: 0,
        }
    }
}

fn key(k: u8) -> String {
    format!("refund:f{}", k % KEYS)
}

fn flipped(mut bytes: Vec<u8>, flips: &Flips) -> Vec<u8> {
    if !bytes.is_empty() {
        for &(at, mask) in flips.iter().take(8) {
            let i = usize::from(at) % bytes.len();
            bytes[i] ^= mask;
        }
    }
    bytes
}

/// The record `op` writes: its topic, key and value.
fn record(op: Op, now: i64, codec: &Codec) -> (Source, Option<Vec<u8>>, Option<Vec<u8>>) {
    let encode = |r: Result<Vec<u8>, _>, flips: &Flips| r.ok().map(|b| flipped(b, flips));
    match op {
        Op::Proposal {
            key: k,
            minor_units,
            tool,
            other_tenant,
            arguments,
            flips,
        } => {
            let mut p = sample::refund(&key(k), minor_units, now);
            p.tool = TOOLS[usize::from(tool) % TOOLS.len()].to_owned();
            if other_tenant {
                p.tenant_id = "globex".to_owned();
            }
            if let Some(arguments) = arguments {
                p.arguments_json = arguments;
            }
            let value = encode(codec.encode_single_object(&p), &flips);
            (Source::Proposals, Some(p.operation_key.into_bytes()), value)
        }
        Op::Approval {
            key: k,
            minor_units,
            right_hash,
            approver,
            reject,
            flips,
        } => {
            let p = sample::refund(&key(k), minor_units, now);
            let hash = if right_hash {
                canonicalize(&p.arguments_json).map_or_else(|_| "00".to_owned(), |c| c.hash)
            } else {
                "00".to_owned()
            };
            let verdict = if reject {
                ApprovalVerdict::Reject
            } else {
                ApprovalVerdict::Approve
            };
            let who = PEOPLE[usize::from(approver) % PEOPLE.len()];
            let a = sample::approval(&p, &hash, who, verdict, now);
            let value = encode(codec.encode_single_object(&a), &flips);
            (Source::Approvals, Some(a.operation_key.into_bytes()), value)
        }
        Op::Outcome {
            key: k,
            epoch,
            kind,
            evidence,
            round,
            flips,
        } => {
            let kind = OutcomeKind::ALL[usize::from(kind) % OutcomeKind::ALL.len()];
            let mut o = sample::outcome(&key(k), i64::from(epoch % 4), kind, &evidence);
            o.reconcile_round = round;
            o.observed_at = now;
            let value = encode(codec.encode_single_object(&o), &flips);
            (Source::Outcomes, Some(o.operation_key.into_bytes()), value)
        }
        Op::Control {
            key: k,
            kind,
            flips,
        } => {
            let kind = ControlKind::ALL[usize::from(kind) % ControlKind::ALL.len()];
            let c = sample::control(&format!("c-{now}"), kind, Some(&key(k)), now);
            let value = encode(codec.encode_single_object(&c), &flips);
            (Source::Control, Some(key(k).into_bytes()), value)
        }
        Op::Raw { source, key, value } => {
            let source = Source::ALL[usize::from(source) % Source::ALL.len()];
            (source, key, value)
        }
    }
}

/// Key, value and headers of a record as the broker counts them, roughly.
fn size(r: &airlock_processor::runtime::wire::OutRecord) -> usize {
    r.key.as_ref().map_or(0, Vec::len)
        + r.value.as_ref().map_or(0, Vec::len)
        + r.headers
            .iter()
            .map(|(k, v)| k.len() + v.len())
            .sum::<usize>()
}

impl Harness {
    /// Decides `records` as one batch and seals it; returns the records to produce.
    fn decide(
        &mut self,
        records: &[(Source, Option<Vec<u8>>, Option<Vec<u8>>, i64)],
    ) -> Vec<airlock_processor::runtime::wire::OutRecord> {
        let start = self.task.save_point();
        let mut unencodable = std::collections::BTreeSet::new();
        'batch: loop {
            let mut offsets = self.offsets;
            for (i, (source, key, value, at)) in records.iter().enumerate() {
                let slot = Source::ALL
                    .iter()
                    .position(|s| s == source)
                    .expect("a known source");
                let topic = match source {
                    Source::Proposals => self.names.proposals(),
                    Source::Approvals => self.names.approvals(),
                    Source::Outcomes => self.names.outcomes(),
                    Source::Control => self.names.control(),
                };
                self.task
                    .advance_clock(*source, *at, *at, TIMERS_PER_BATCH)
                    .expect("timers fire");
                let rec = InputRecord {
                    source: *source,
                    topic: &topic,
                    offset: offsets[slot],
                    key: key.as_deref(),
                    payload: value.as_deref(),
                    timestamp: *at,
                    capability: None,
                };
                offsets[slot] += 1;
                if unencodable.contains(&i) {
                    self.task
                        .dead_letter_unencodable(&rec, "outputs", "over the limit")
                        .expect("an unencodable input is dead-lettered");
                    continue;
                }
                match self.task.handle_record(&rec) {
                    Ok(()) => {}
                    Err(Error::Encode { .. }) => {
                        self.task
                            .roll_back_to(&start)
                            .expect("the batch rolls back");
                        unencodable.insert(i);
                        continue 'batch;
                    }
                    Err(e) => panic!("record {i} of the batch: {e}"),
                }
            }
            self.offsets = offsets;
            break;
        }
        self.task.fire_due(TIMERS_PER_BATCH).expect("timers fire");
        self.task.note_changes();
        if let Some(now) = self.task.clock().now() {
            self.task
                .checkpoint_if_due(now, 60_000)
                .expect("a checkpoint is written");
        }
        let outbox = self.task.seal(self.now).expect("the batch seals");
        for r in &outbox.records {
            assert!(
                size(r) <= LIMIT + RECORD_RESERVE_BYTES,
                "an output to {} of {} bytes",
                r.topic,
                size(r)
            );
        }
        if !outbox.records.is_empty() {
            self.task.acknowledged(outbox.row, None);
        }
        outbox.records
    }
}

fuzz_target!(|batch: Batch| {
    let mut guard = HARNESS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if guard.as_ref().is_none_or(|h| h.fresh >= INPUTS_PER_TASK) {
        *guard = Some(Harness::new());
    }
    let h = guard.as_mut().expect("a harness");
    let mut records = Vec::with_capacity(batch.records.len());
    for (op, after) in batch.records.into_iter().take(16) {
        // Up to 10 s between records: timers (approval windows, attempt deadlines) come due
        // within a task's life, checkpoints (every minute of record time) now and then.
        h.now += i64::from(after % 10_000);
        let (source, key, value) = record(op, h.now, &h.codec);
        records.push((source, key, value, h.now));
    }
    h.decide(&records);

    // The partition decides on: a fresh proposal is answered.
    h.fresh += 1;
    let fresh = sample::refund(&format!("refund:fresh-{}", h.fresh), 100, h.now);
    let value = h
        .codec
        .encode_single_object(&fresh)
        .expect("a refund encodes");
    let out = h.decide(&[(
        Source::Proposals,
        Some(fresh.operation_key.clone().into_bytes()),
        Some(value),
        h.now,
    )]);
    let answered = out.iter().any(|r| {
        r.topic == h.names.decisions()
            && matches!(
                r.value.as_deref().map(|v| h.codec.decode(v)),
                Some(Ok(d)) if matches!(&d.record, AnyRecord::Decision(d) if d.in_reply_to == fresh.proposal_id)
            )
    });
    assert!(answered, "a fresh proposal after the batch got no decision");
});
