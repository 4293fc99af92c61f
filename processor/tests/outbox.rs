//! A partition task's batch over real RocksDB, without a broker: what `seal` makes durable,
//! what it hands to the producer, and that the changelog it writes rebuilds the same state.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use airlock_processor::core::TaskContext;
use airlock_processor::runtime::partition::{
    self, InputRecord, PartitionTask, Source, changelog_table, store_table,
};
use airlock_processor::runtime::produce::Span;
use airlock_processor::runtime::topics::Names;
use airlock_processor::runtime::wire::{self, header};
use airlock_processor::sample;
use airlock_processor::store::keys::Table;
use airlock_processor::store::{RocksBackend, RocksOptions, StateStore, Store};
use airlock_schemas::{ChangelogRecord, Codec, Decision, Verdict};

const PARTITIONS: i32 = 1;

fn task(dir: &std::path::Path) -> PartitionTask {
    task_knowing(dir, None)
}

/// A task whose store knows the changelog up to `changelog_next` (as a claim leaves it).
fn task_knowing(dir: &std::path::Path, changelog_next: Option<i64>) -> PartitionTask {
    let core = Arc::new(sample::reference_core(Default::default()).unwrap());
    let mut store = StateStore::open(
        RocksBackend::open(
            dir,
            &RocksOptions {
                sync: false,
                ..RocksOptions::default()
            },
        )
        .unwrap(),
    )
    .unwrap();
    if let Some(next) = changelog_next {
        store.stage_raw(
            Table::Meta,
            partition::META_CHANGELOG_NEXT,
            Some(next.to_be_bytes().to_vec()),
        );
        store.commit().unwrap();
    }
    let ctx = TaskContext {
        partition: 0,
        owner_epoch: 3,
        task: "test/0".to_owned(),
    };
    PartitionTask::new(core, store, ctx, Names::new("t."), Codec::new(), PARTITIONS).unwrap()
}

fn record<'a>(offset: i64, key: &'a [u8], payload: &'a [u8]) -> InputRecord<'a> {
    InputRecord {
        source: Source::Proposals,
        topic: "t.proposals",
        offset,
        key: Some(key),
        payload: Some(payload),
        timestamp: 1_000,
        capability: None,
    }
}

#[test]
fn a_sealed_batch_holds_outputs_then_changelog_and_survives_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let codec = Codec::new();
    let p = sample::refund("refund:o1", 500, 1_000);
    let payload = codec.encode_single_object(&p).unwrap();
    let mut t = task(dir.path());
    t.handle_record(&record(0, b"refund:o1", &payload)).unwrap();
    t.handle_record(&record(1, b"refund:o1", b"not avro"))
        .unwrap();
    let out = t.seal(2_000).unwrap().records;

    let kinds: Vec<&str> = out
        .iter()
        .map(|r| std::str::from_utf8(r.header(header::KIND).unwrap()).unwrap())
        .collect();
    assert!(kinds.contains(&"dispatch") && kinds.contains(&"decision"));
    assert!(kinds.contains(&"journal") && kinds.contains(&"dlq"));
    // Every phase-0 record comes before the changelog (phase 1).
    let first_changelog = kinds.iter().position(|k| *k == "changelog").unwrap();
    assert!(kinds[first_changelog..].iter().all(|k| *k == "changelog"));
    for r in &out {
        assert_eq!(wire::header_i64(&r.headers, header::OWNER_EPOCH), Some(3));
        assert_eq!(r.partition, 0);
    }
    let decision: Decision = codec
        .decode_as(
            out.iter()
                .find(|r| r.header(header::KIND) == Some(b"decision"))
                .unwrap()
                .value
                .as_deref()
                .unwrap(),
        )
        .unwrap();
    assert_eq!(decision.verdict, Verdict::Accepted);

    // The batch is durable: the outbox and the offset survive a reopen; the record is not
    // decided twice.
    drop(t);
    let t = task(dir.path());
    assert_eq!(t.stored_offset("t.proposals").unwrap(), Some(2));
    assert!(t.already_consumed("t.proposals", 1).unwrap());
    // One row holds the whole batch, in outbox order.
    let pending = partition::pending_outbox(t.store(), 0).unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].records, out);

    // The changelog alone rebuilds the same projection.
    let restored_dir = tempfile::tempdir().unwrap();
    let mut restored = StateStore::open(
        RocksBackend::open(restored_dir.path(), &RocksOptions::default()).unwrap(),
    )
    .unwrap();
    for r in out.iter().filter(|r| r.phase == 1) {
        let c: ChangelogRecord = codec.decode_as(r.value.as_deref().unwrap()).unwrap();
        let key = store_table(c.table).key(&c.key);
        assert_eq!(changelog_table(&key), Some(c.table));
        restored.restore_row(&key, c.value).unwrap();
    }
    restored.commit().unwrap();
    assert_eq!(restored.projection_hash(), t.store().projection_hash());
    assert_eq!(
        partition::stored_offset(&restored, "t.proposals", 0).unwrap(),
        Some(2)
    );
}

#[test]
fn acknowledged_entries_leave_the_outbox() {
    let dir = tempfile::tempdir().unwrap();
    let codec = Codec::new();
    let p = sample::refund("refund:o2", 500, 1_000);
    let payload = codec.encode_single_object(&p).unwrap();
    let mut t = task_knowing(dir.path(), Some(40));
    t.handle_record(&record(0, b"refund:o2", &payload)).unwrap();
    let out = t.seal(2_000).unwrap();
    let rows = out.records.iter().filter(|r| r.phase == 1).count() as i64;
    t.acknowledged(out.row, Some(span(40, rows)));
    assert!(
        t.seal(2_001).unwrap().records.is_empty(),
        "bookkeeping only: nothing to produce"
    );
    assert!(partition::pending_outbox(t.store(), 0).unwrap().is_empty());
    assert_eq!(known_end(&t), Some(40 + rows));
}

#[test]
fn a_change_gets_one_checkpoint_and_an_idle_partition_none_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let payload = refund_payload("refund:o4");
    let mut t = task(dir.path());
    let every = 1_000;
    // One batch as the decide loop runs it (checkpoint if due, seal), then the broker's
    // acknowledgement; returns the journal records the batch produced.
    let batch = |t: &mut PartitionTask, now: i64| -> usize {
        t.checkpoint_if_due(now, every).unwrap();
        let out = t.seal(now).unwrap();
        if !out.records.is_empty() {
            t.acknowledged(out.row, None);
        }
        out.records
            .iter()
            .filter(|r| r.header(header::KIND) == Some(b"journal".as_slice()))
            .count()
    };
    t.handle_record(&record(0, b"refund:o4", &payload)).unwrap();
    assert!(batch(&mut t, 0) > 0, "the proposal's own journal events");
    assert_eq!(batch(&mut t, 500), 0, "not due yet");
    assert_eq!(batch(&mut t, 1_000), 1, "the checkpoint the change owes");
    for now in [2_000, 3_000, 60_000] {
        assert_eq!(
            batch(&mut t, now),
            0,
            "at {now}: the checkpoint's acknowledgement owes no other checkpoint"
        );
    }
}

#[test]
fn another_writer_on_the_changelog_freezes_the_known_end() {
    let dir = tempfile::tempdir().unwrap();
    let codec = Codec::new();
    let mut t = task_knowing(dir.path(), Some(40));
    let mut offset = 0;
    let mut batch = |t: &mut PartitionTask, key: &str| {
        offset += 1;
        refund_batch(t, &codec, offset - 1, key)
    };
    let (row, rows) = batch(&mut t, "refund:o3");
    t.acknowledged(row, Some(span(40, rows)));
    let end = 40 + rows;
    // A new owner's fence marker landed at `end`: this task's next rows start one later.
    let (row, rows) = batch(&mut t, "refund:o4");
    t.acknowledged(row, Some(span(end + 1, rows)));
    assert_eq!(known_end(&t), Some(end), "frozen before the foreign marker");
    // Even contiguous rows later do not move it again.
    let (row, rows) = batch(&mut t, "refund:o5");
    t.acknowledged(row, Some(span(end + 1 + rows, rows)));
    t.commit_bookkeeping(2_001).unwrap();
    assert_eq!(known_end(&t), Some(end));
}

/// A batch whose changelog records the broker took without saying where (a request resent
/// after a lost response) moves neither the known end nor the range cursor: the next claim
/// reads them, and the next acknowledgement's range covers them (its reader finds this
/// owner's own rows there, nothing to write again). Before, the unknown offset (-1001) was
/// taken for a real one and the range read from it stopped the instance.
#[test]
fn changelog_records_acknowledged_without_offsets_are_read_again_not_guessed() {
    let dir = tempfile::tempdir().unwrap();
    let codec = Codec::new();
    let mut t = task_knowing(dir.path(), Some(40));
    let mut offset = 0;
    let mut batch = |t: &mut PartitionTask, key: &str| {
        offset += 1;
        refund_batch(t, &codec, offset - 1, key)
    };
    let (row, rows) = batch(&mut t, "refund:u1");
    assert_eq!(t.acknowledged(row, Some(span(40, rows))), None);
    let end = 40 + rows;
    let (row, unplaced) = batch(&mut t, "refund:u2");
    let unknown = Span {
        lowest: i64::MAX,
        highest: i64::MIN,
        count: 0,
        unplaced,
    };
    assert!(!unknown.is_contiguous());
    assert_eq!(t.acknowledged(row, Some(unknown)), None);
    let (row, rows) = batch(&mut t, "refund:u3");
    let last = end + unplaced + rows;
    assert_eq!(
        t.acknowledged(row, Some(span(end + unplaced, rows))),
        Some((end, last)),
        "the range from the last known end covers the records placed nowhere"
    );
    t.commit_bookkeeping(2_001).unwrap();
    assert_eq!(known_end(&t), Some(end), "the next claim reads them");
}

/// Decides a reference refund of `key` at input `offset` and seals it: the outbox row and how
/// many changelog records the batch has.
fn refund_batch(t: &mut PartitionTask, codec: &Codec, offset: i64, key: &str) -> (u64, i64) {
    let p = sample::refund(key, 500, 1_000);
    let payload = codec.encode_single_object(&p).unwrap();
    t.handle_record(&record(offset, key.as_bytes(), &payload))
        .unwrap();
    let out = t.seal(2_000).unwrap();
    let rows = out.records.iter().filter(|r| r.phase == 1).count() as i64;
    (out.row, rows)
}

/// A reference refund proposal of `key`, encoded as agents send it.
fn refund_payload(key: &str) -> Vec<u8> {
    Codec::new()
        .encode_single_object(&sample::refund(key, 500, 1_000))
        .unwrap()
}

fn span(lowest: i64, count: i64) -> Span {
    Span {
        lowest,
        highest: lowest + count - 1,
        count,
        unplaced: 0,
    }
}

fn known_end(t: &PartitionTask) -> Option<i64> {
    // Staged bookkeeping lands with the next batch; read what is committed.
    partition::read_i64(t.store(), Table::Meta, partition::META_CHANGELOG_NEXT, 0).unwrap()
}

#[test]
fn rewritten_rows_go_out_again_unchanged_with_the_owners_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let codec = Codec::new();
    let payload = refund_payload("refund:o5");
    let mut t = task(dir.path());
    t.handle_record(&record(0, b"refund:o5", &payload)).unwrap();
    let out = t.seal(2_000).unwrap();
    t.acknowledged(out.row, None);
    t.seal(2_001).unwrap();
    let projection = t.store().projection_hash();

    let present = Table::Effect.key(b"refund:o5");
    let absent = Table::Effect.key(b"refund:never");
    let local = Table::Meta.key(partition::META_CHANGELOG_NEXT);
    assert_eq!(
        t.rewrite_rows(&[present.clone(), absent.clone(), local])
            .unwrap(),
        2,
        "store-local rows never go to the changelog"
    );
    let out = t.seal(3_000).unwrap().records;
    assert_eq!(t.store().projection_hash(), projection);
    let changelog: Vec<_> = out.iter().filter(|r| r.phase == 1).collect();
    let record = |key: &[u8]| {
        *changelog
            .iter()
            .find(|r| r.key.as_deref() == Some(key))
            .unwrap()
    };
    let present_row: ChangelogRecord = codec
        .decode_as(record(&present).value.as_deref().unwrap())
        .unwrap();
    assert_eq!(present_row.owner_epoch, 3);
    assert_eq!(
        present_row.value,
        t.store().get_raw(Table::Effect, b"refund:o5").unwrap()
    );
    assert!(present_row.value.is_some());
    // A key this owner does not hold: a Kafka tombstone (no value), under the owner's epoch,
    // and not the batch's last record.
    let tombstone = record(&absent);
    assert_eq!(tombstone.value, None);
    assert_eq!(tombstone.header(header::OWNER_EPOCH), Some(b"3".as_slice()));
    assert!(tombstone.header(header::BATCH_END).is_none());

    // Staged at a stop, before any batch: sealed into the outbox unsent, for the next claim.
    t.rewrite_rows(&[present]).unwrap();
    t.commit_bookkeeping(4_000).unwrap();
    let pending = partition::pending_outbox(t.store(), 0).unwrap();
    let kinds: Vec<&[u8]> = pending
        .iter()
        .flat_map(|o| &o.records)
        .filter_map(|r| r.header(header::KIND))
        .collect();
    assert!(kinds.contains(&b"changelog".as_slice()), "{pending:?}");
}

#[test]
fn an_idle_task_sweeps_its_changelog_partition_and_finds_another_writer_there() {
    let dir = tempfile::tempdir().unwrap();
    let payload = refund_payload("refund:o6");
    let mut t = task_knowing(dir.path(), Some(40));
    let every = 1_000;
    // A checkpoint writes a changelog row too (the journal sequence): kept out of the way.
    let checkpoint_every = 1_000_000;
    // One batch as the decide loop runs it; returns its changelog-phase records.
    let batch = |t: &mut PartitionTask, now: i64| -> (u64, Vec<wire::OutRecord>) {
        t.checkpoint_if_due(now, checkpoint_every).unwrap();
        t.sweep_if_due(now, every);
        let out = t.seal(now).unwrap();
        let changelog = out.records.into_iter().filter(|r| r.phase == 1).collect();
        (out.row, changelog)
    };
    t.handle_record(&record(0, b"refund:o6", &payload)).unwrap();
    let (row, rows) = batch(&mut t, 0);
    assert!(!rows.is_empty());
    let n = rows.len() as i64;
    t.acknowledged(row, Some(span(40, n)));
    // Nothing is due before `every` passed since the task last wrote there.
    for now in [500, 999] {
        let (row, rows) = batch(&mut t, now);
        assert!(rows.is_empty(), "at {now}: {rows:?}");
        t.acknowledged(row, None);
    }
    let (row, rows) = batch(&mut t, 1_000);
    assert_eq!(
        rows.len(),
        1,
        "one barrier once the task was idle for {every} ms"
    );
    assert_eq!(rows[0].topic, "t.changelog");
    assert_eq!(
        rows[0].header(header::KIND),
        Some(wire::BARRIER_KIND.as_bytes())
    );
    // Its own barrier right behind its rows: nobody else wrote; the known end moves on.
    assert_eq!(t.acknowledged(row, Some(span(40 + n, 1))), None);
    let (row, rows) = batch(&mut t, 1_500);
    assert!(rows.is_empty(), "not due again yet");
    t.acknowledged(row, None);
    assert_eq!(known_end(&t), Some(41 + n));
    // The next one lands behind three records of another writer: the range to read.
    let (row, rows) = batch(&mut t, 2_000);
    assert_eq!(rows.len(), 1);
    assert_eq!(
        t.acknowledged(row, Some(span(44 + n, 1))),
        Some((41 + n, 45 + n))
    );
    // A batch that writes rows is its own sweep.
    t.handle_record(&record(1, b"refund:o7", &refund_payload("refund:o7")))
        .unwrap();
    let (_, rows) = batch(&mut t, 5_000);
    assert!(
        rows.iter()
            .all(|r| r.header(header::KIND) == Some(b"changelog".as_slice()))
    );
    let (_, rows) = batch(&mut t, 5_999);
    assert!(rows.is_empty());
}
