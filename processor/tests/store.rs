//! The state store contract, run against both backends (in-memory and RocksDB): typed reads
//! see staged writes, commits are atomic, a discard forgets the batch, timers follow their
//! records, the projection hash is order-independent and survives a reopen, and values carry
//! their format version.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use airlock_processor::core::record::{ProposalSeen, RunRecord, State};
use airlock_processor::core::{StateView, TimerFired, TimerTarget, Write};
use airlock_processor::sample;
use airlock_processor::store::keys::Table;
use airlock_processor::store::rocks::RocksOptions;
use airlock_processor::store::{
    self, Backend, MemoryBackend, RocksBackend, StateStore, Store, codec,
};
use airlock_schemas::{Reason, Verdict};

/// A backend under test, and how to get the same data back after a "restart".
trait Fixture {
    type B: Backend;
    fn open(&mut self) -> StateStore<Self::B>;
    /// Closes `store` and opens the same data again (a process restart).
    fn reopen(&mut self, store: StateStore<Self::B>) -> StateStore<Self::B>;
}

struct Memory;

impl Fixture for Memory {
    type B = MemoryBackend;
    fn open(&mut self) -> StateStore<MemoryBackend> {
        StateStore::open(MemoryBackend::default()).unwrap()
    }
    fn reopen(&mut self, store: StateStore<MemoryBackend>) -> StateStore<MemoryBackend> {
        StateStore::open(store.backend().clone()).unwrap()
    }
}

struct Rocks(tempfile::TempDir);

impl Fixture for Rocks {
    type B = RocksBackend;
    fn open(&mut self) -> StateStore<RocksBackend> {
        let backend = RocksBackend::open(
            self.0.path(),
            &RocksOptions {
                sync: false,
                ..RocksOptions::default()
            },
        )
        .unwrap();
        StateStore::open(backend).unwrap()
    }
    fn reopen(&mut self, store: StateStore<RocksBackend>) -> StateStore<RocksBackend> {
        drop(store);
        self.open()
    }
}

fn effect(key: &str, state: State) -> Write {
    Write::Effect {
        key: key.to_owned(),
        record: Some(Box::new(sample::effect_record(key, state))),
    }
}

fn dispatched(timeout_at: i64) -> State {
    State::Dispatched {
        attempt_deadline_at: timeout_at - 5,
        timeout_at,
    }
}

fn seen(expires_at: i64) -> ProposalSeen {
    ProposalSeen {
        operation_key: "k".into(),
        decision_id: "p/x".into(),
        verdict: Verdict::Accepted,
        reason: Reason::AutoApproved,
        detail: String::new(),
        arguments_hash: None,
        policy_bundle_hash: None,
        decided_at: 0,
        expires_at,
        fingerprint: None,
    }
}

fn staged_writes_are_visible_and_commit_atomically(f: &mut impl Fixture) {
    let mut s = f.open();
    s.apply(&[effect("k1", dispatched(100))]).unwrap();
    assert!(
        s.effect("k1").unwrap().is_some(),
        "reads see the staged batch"
    );
    s.discard();
    assert!(
        s.effect("k1").unwrap().is_none(),
        "a discard forgets the batch"
    );
    s.apply(&[
        effect("k1", dispatched(100)),
        Write::Proposal {
            id: "p1".into(),
            seen: Some(seen(500)),
        },
        Write::Run {
            run_id: "run-1".into(),
            run: Some(RunRecord {
                highest_fence: 3,
                dispatches: 1,
                updated_at: 0,
                expires_at: 900,
            }),
        },
    ])
    .unwrap();
    s.commit().unwrap();
    let s = f.reopen(s);
    assert_eq!(s.effect("k1").unwrap().unwrap().epoch, 1);
    assert_eq!(s.proposal("p1").unwrap().unwrap().expires_at, 500);
    assert_eq!(s.run("run-1").unwrap().unwrap().highest_fence, 3);
}

fn timers_follow_their_records(f: &mut impl Fixture) {
    let mut s = f.open();
    s.apply(&[effect("k1", dispatched(100)), effect("k2", dispatched(50))])
        .unwrap();
    s.apply(&[Write::Proposal {
        id: "p1".into(),
        seen: Some(seen(70)),
    }])
    .unwrap();
    s.commit().unwrap();
    let due = s.due_timers(100, 10).unwrap();
    assert_eq!(
        due,
        vec![
            TimerFired {
                due_at: 50,
                target: TimerTarget::Effect("k2".into())
            },
            TimerFired {
                due_at: 70,
                target: TimerTarget::Proposal("p1".into())
            },
            TimerFired {
                due_at: 100,
                target: TimerTarget::Effect("k1".into())
            },
        ]
    );
    assert_eq!(s.due_timers(69, 10).unwrap().len(), 1, "only what is due");
    assert_eq!(s.due_timers(100, 2).unwrap().len(), 2, "bounded");
    // Moving a record moves its timer (staged, then committed); deleting removes it.
    s.apply(&[effect("k2", dispatched(300))]).unwrap();
    assert_eq!(
        s.due_timers(100, 10).unwrap().len(),
        2,
        "staged move is visible"
    );
    s.apply(&[Write::Effect {
        key: "k1".into(),
        record: None,
    }])
    .unwrap();
    s.commit().unwrap();
    let s = f.reopen(s);
    assert_eq!(
        s.due_timers(1_000, 10).unwrap(),
        vec![
            TimerFired {
                due_at: 70,
                target: TimerTarget::Proposal("p1".into())
            },
            TimerFired {
                due_at: 300,
                target: TimerTarget::Effect("k2".into())
            },
        ]
    );
    // OPERATOR_REQUIRED has no timer at all: held until a person settles it.
    let mut s = s;
    s.apply(&[effect(
        "k2",
        State::OperatorRequired {
            since: 0,
            rounds: 3,
            may_land_until: 0,
        },
    )])
    .unwrap();
    assert!(
        !s.due_timers(i64::MAX - 1, 10)
            .unwrap()
            .iter()
            .any(|t| t.target == TimerTarget::Effect("k2".into()))
    );
}

fn projection_hash_is_order_independent_and_durable(f: &mut impl Fixture) {
    let writes = [
        effect("a", dispatched(10)),
        effect("b", dispatched(20)),
        Write::Proposal {
            id: "p".into(),
            seen: Some(seen(5)),
        },
    ];
    let mut s = f.open();
    let empty = s.projection_hash();
    s.apply(&writes).unwrap();
    s.commit().unwrap();
    let forward = s.projection_hash();
    assert_ne!(forward, empty);
    let mut reversed: Vec<_> = writes.to_vec();
    reversed.reverse();
    assert_eq!(store::projection_of(&reversed).unwrap(), forward);
    // Overwrite then restore: the hash follows the content, not the history.
    s.apply(&[effect("a", dispatched(99))]).unwrap();
    assert_ne!(s.projection_hash(), forward);
    s.apply(&[effect("a", dispatched(10))]).unwrap();
    assert_eq!(s.projection_hash(), forward);
    s.discard();
    assert_eq!(
        s.projection_hash(),
        forward,
        "a discard restores the committed hash"
    );
    let s = f.reopen(s);
    assert_eq!(s.projection_hash(), forward, "the hash survives a restart");
}

fn raw_tables_and_value_versions(f: &mut impl Fixture) {
    let mut s = f.open();
    s.stage_raw(
        Table::Offset,
        b"airlock.proposals/0",
        Some(42u64.to_be_bytes().to_vec()),
    );
    s.commit().unwrap();
    let s = f.reopen(s);
    assert_eq!(
        s.get_raw(Table::Offset, b"airlock.proposals/0").unwrap(),
        Some(42u64.to_be_bytes().to_vec())
    );
    // A value written by a future format is refused by name, never misread.
    let mut future = codec::frame(&serde_json::to_string(&seen(1)).unwrap(), Some(1));
    future[0] = codec::VALUE_FORMAT + 1;
    let err = codec::decode::<ProposalSeen>(Table::Proposal, "p", &future).unwrap_err();
    assert!(matches!(err, store::Error::Version { found, .. } if found == codec::VALUE_FORMAT + 1));
}

/// A batch decided again (an input whose outputs could not be encoded) rolls back to where it
/// started: what it staged goes, rows staged before it (an outbox acknowledgement) stay, and
/// the projection hash is the one at the save point.
fn a_roll_back_keeps_what_was_staged_before_the_save_point(f: &mut impl Fixture) {
    let mut s = f.open();
    s.stage_raw(Table::Outbox, &7u64.to_be_bytes(), None);
    s.stage_raw(
        Table::Offset,
        b"airlock.proposals/0",
        Some(41u64.to_be_bytes().to_vec()),
    );
    let before = s.projection_hash();
    let point = s.save_point();
    s.apply(&[effect("k1", dispatched(100))]).unwrap();
    s.stage_raw(
        Table::Offset,
        b"airlock.proposals/0",
        Some(42u64.to_be_bytes().to_vec()),
    );
    assert_ne!(s.projection_hash(), before);
    s.roll_back_to(&point);
    assert!(s.effect("k1").unwrap().is_none(), "the batch's rows go");
    assert_eq!(s.projection_hash(), before);
    assert_eq!(
        s.get_raw(Table::Offset, b"airlock.proposals/0").unwrap(),
        Some(41u64.to_be_bytes().to_vec()),
        "rows staged before the save point stay"
    );
    assert_eq!(s.staged().count(), 2);
}

macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {
        mod memory {
            $(#[test] fn $name() { super::$name(&mut super::Memory); })*
        }
        mod rocksdb {
            $(#[test] fn $name() {
                super::$name(&mut super::Rocks(tempfile::tempdir().expect("tempdir")));
            })*
        }
    };
}

both_backends!(
    staged_writes_are_visible_and_commit_atomically,
    timers_follow_their_records,
    projection_hash_is_order_independent_and_durable,
    raw_tables_and_value_versions,
    a_roll_back_keeps_what_was_staged_before_the_save_point,
);
