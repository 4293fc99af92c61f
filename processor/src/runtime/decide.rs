//! One batch's decisions: each owned partition's task decides its records in offset order,
//! each after the timers its time brings due (see [`clock`](super::clock)), journals a
//! checkpoint when one is due and seals its `WriteBatch`, the partitions side by side on up to
//! `processor.threads` threads.
//!
//! A partition's work never leaves one thread, so its decisions, journal sequence and outbox
//! order are exactly those of a single-threaded run; only different partitions overlap. That
//! is where the time goes on a busy instance: deciding (Cedar, JSON, Avro) and the RocksDB
//! commit are per partition and share nothing but the `Core`. The commit's fsync is not
//! waited for here: each seal hands it on with its outbox (see [`flight`](super::flight)).

use std::collections::BTreeMap;

use rdkafka::Message;
use rdkafka::message::{BorrowedMessage, Headers, Timestamp};

use super::config;
use super::partition::{self, Fingerprint, InputRecord, PartitionTask, Position, Source};
use super::run::{Error, Result};
use super::telemetry::Observed;
use super::wire::Outbox;
use crate::store::WalSync;
use crate::telemetry::trace;

/// What a batch asks of every task besides its records.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// Wall-clock time of the batch. It decides nothing: a record's time caps at it (see
    /// [`clock`](super::clock)), ticks and changelog sweeps are asked for by it, and the outbox
    /// row notes it.
    pub now: i64,
    pub timers_per_batch: usize,
    /// A task whose inputs keep it waiting for time puts ticks on them this often.
    pub tick_ms: i64,
    pub checkpoint_every_ms: i64,
    /// An idle task puts a barrier on its changelog partition this often (see
    /// `PartitionTask::sweep_if_due`).
    pub changelog_sweep_ms: i64,
    /// At most this many threads, the calling one included.
    pub threads: usize,
}

impl Settings {
    /// The settings `airlock run` closes a batch with at `now`, from the processor's knobs.
    pub fn of(processor: &config::Processor, now: i64) -> Settings {
        Settings {
            now,
            timers_per_batch: processor.timers_per_batch,
            tick_ms: processor.clock_tick_ms as i64,
            checkpoint_every_ms: processor.checkpoint_interval_ms as i64,
            changelog_sweep_ms: processor.changelog_sweep_ms as i64,
            threads: processor.threads,
        }
    }
}

/// One partition's share of a decided batch.
#[derive(Debug)]
pub struct Decided {
    pub partition: i32,
    /// Input records decided or dead-lettered (redeliveries of consumed ones not counted, nor
    /// barriers such as ticks).
    pub handled: usize,
    /// Input records consumed: `handled` and the barriers.
    pub consumed: usize,
    /// What `seal_deferred` committed, in outbox order: to be produced once `unsynced` (if
    /// any) has made it durable.
    pub sealed: Outbox,
    /// The fsync the seal left owing (see `PartitionTask::seal_deferred`).
    pub unsynced: Option<WalSync>,
    pub observed: Observed,
}

/// Decides `records` (any partitions, each partition's in offset order) with the tasks that own
/// them, and seals every task. Records of a partition not in `tasks` are left alone (it was
/// revoked; its next owner reads them from the stored offsets). Results are in partition order.
pub fn decide_batch(
    tasks: &mut BTreeMap<i32, PartitionTask>,
    records: Vec<BorrowedMessage<'_>>,
    sources: &BTreeMap<&str, Source>,
    settings: Settings,
) -> Result<Vec<Decided>> {
    let mut by_partition: BTreeMap<i32, Vec<BorrowedMessage<'_>>> = BTreeMap::new();
    for m in records {
        by_partition.entry(m.partition()).or_default().push(m);
    }
    let work: Vec<(&mut PartitionTask, Vec<BorrowedMessage<'_>>)> = tasks
        .iter_mut()
        .map(|(p, task)| (task, by_partition.remove(p).unwrap_or_default()))
        .collect();
    let lanes = lanes(work, settings.threads, |(_, records)| records.len());
    let decide_lane = |lane: Vec<(&mut PartitionTask, Vec<BorrowedMessage<'_>>)>| {
        lane.into_iter()
            .map(|(task, records)| decide_partition(task, records, sources, settings))
            .collect::<Result<Vec<_>>>()
    };
    let mut decided = if lanes.len() <= 1 {
        decide_lane(lanes.into_iter().flatten().collect())?
    } else {
        std::thread::scope(|scope| {
            let mut lanes = lanes.into_iter();
            let here = lanes.next().unwrap_or_default();
            let spawned: Vec<_> = lanes
                .map(|lane| scope.spawn(move || decide_lane(lane)))
                .collect();
            let mut all = decide_lane(here)?;
            for handle in spawned {
                match handle.join() {
                    Ok(lane) => all.extend(lane?),
                    // A panic in a task is a bug: let it end the process as it would have on
                    // the polling thread.
                    Err(panic) => std::panic::resume_unwind(panic),
                }
            }
            Ok::<_, Error>(all)
        })?
    };
    decided.sort_by_key(|d| d.partition);
    Ok(decided)
}

/// Records a batch must hold per lane beyond the calling thread's before another thread is
/// started for it. A lane's thread is spawned and joined per batch, and below load a batch
/// holds a few records per partition (closed by the 2 ms idle gap, fetches arriving every 5
/// ms): there the spawn and the cross-core wake-ups cost more than the parallel deciding saves.
/// On the 2-core dev machine, at 4,000 proposals/s (batches of ≈ 20 records), deciding on one
/// thread took ≈ 11% less CPU per proposal (152–156 against 171–175 µs, two alternating pairs
/// with `processor.threads` 1 and 4) at the same latency. A record takes ≈ 25–40 µs to decide,
/// a spawn and join ≈ 50–100 µs of CPU and wake-up.
pub const MIN_RECORDS_PER_LANE: usize = 64;

/// Splits `items` into at most `threads` lanes of about equal weight (heaviest first onto the
/// lightest lane), one lane per item of non-zero weight at most, and one more lane only for
/// every [`MIN_RECORDS_PER_LANE`] of total weight. An item of weight zero (a task without
/// records still seals: timers, acknowledgements) counts as one.
fn lanes<T>(mut items: Vec<T>, threads: usize, weight: impl Fn(&T) -> usize) -> Vec<Vec<T>> {
    let busy = items.iter().filter(|i| weight(i) > 0).count();
    let total: usize = items.iter().map(&weight).sum();
    let worth = 1 + total / MIN_RECORDS_PER_LANE;
    let n = threads.min(worth).clamp(1, busy.max(1));
    items.sort_by_key(|i| std::cmp::Reverse(weight(i)));
    let mut lanes: Vec<(usize, Vec<T>)> = (0..n).map(|_| (0, Vec::new())).collect();
    for item in items {
        let lightest = lanes
            .iter_mut()
            .min_by_key(|(load, _)| *load)
            .expect("at least one lane");
        lightest.0 += weight(&item).max(1);
        lightest.1.push(item);
    }
    lanes.into_iter().map(|(_, lane)| lane).collect()
}

fn decide_partition(
    task: &mut PartitionTask,
    records: Vec<BorrowedMessage<'_>>,
    sources: &BTreeMap<&str, Source>,
    settings: Settings,
) -> Result<Decided> {
    let partition = task.partition();
    // Records whose outputs could not be encoded (offset by topic, with the problem): the batch
    // is discarded and decided again with each of them dead-lettered instead (see
    // `PartitionTask::dead_letter_unencodable`). Each pass adds one, so this ends.
    let mut unencodable: BTreeMap<(&str, i64), (&'static str, String)> = BTreeMap::new();
    let start = task.save_point();
    let (handled, consumed) = loop {
        match decide_records(task, &records, sources, settings, &unencodable)? {
            Pass::Decided { handled, consumed } => break (handled, consumed),
            Pass::Unencodable {
                topic,
                offset,
                what,
                problem,
            } => {
                log::warn!(
                    "{topic} partition {partition} offset {offset}: its {what} cannot be \
                     written ({problem}); the record is dead-lettered and its batch decided again"
                );
                task.roll_back_to(&start)?;
                unencodable.insert((topic, offset), (what, problem));
            }
        }
    };
    // The messages go back to librdkafka before the commit.
    drop(records);
    let (sealed, unsynced) = close(task, settings)?;
    Ok(Decided {
        partition,
        handled,
        consumed,
        sealed,
        unsynced,
        observed: task.take_observed(),
    })
}

/// How one pass over a partition's records ended.
enum Pass<'a> {
    /// Every record decided (or dead-lettered): how many, and how many were consumed in all
    /// (barriers too).
    Decided { handled: usize, consumed: usize },
    /// The outputs of this record cannot be encoded; the pass stopped there.
    Unencodable {
        topic: &'a str,
        offset: i64,
        what: &'static str,
        problem: String,
    },
}

fn decide_records<'a>(
    task: &mut PartitionTask,
    records: &'a [BorrowedMessage<'_>],
    sources: &BTreeMap<&str, Source>,
    settings: Settings,
    unencodable: &BTreeMap<(&str, i64), (&'static str, String)>,
) -> Result<Pass<'a>> {
    let partition = task.partition();
    let mut handled = 0;
    let mut consumed = 0;
    // The last record consumed of each input topic: its fingerprint goes with the offset row.
    let mut last: BTreeMap<&str, &BorrowedMessage<'_>> = BTreeMap::new();
    for message in records {
        let topic = message.topic();
        let Some(&source) = sources.get(topic) else {
            continue;
        };
        match task.position_of(topic, message.offset())? {
            Position::Next => {}
            Position::AlreadyConsumed { last: false } => continue,
            Position::AlreadyConsumed { last: true } => {
                task.check_redelivered(topic, message.offset(), || fingerprint(message))?;
                continue;
            }
            Position::Gap { expected } => {
                return Err(Error::Gap {
                    topic: topic.to_owned(),
                    partition,
                    expected,
                    got: message.offset(),
                    why: String::new(),
                });
            }
        }
        // `now` of the record (DESIGN.md section 6): the broker's append time where the topic
        // has it; else the producer's, which the task reports once per topic. A record without
        // either is dead-lettered (`PartitionTask::handle_record`): no clock stands in for it.
        let timestamp = match message.timestamp() {
            Timestamp::LogAppendTime(ms) => ms,
            Timestamp::CreateTime(ms) => {
                // Ticks and other barriers are no agent's input.
                if !super::wire::is_barrier(message.key(), message.payload()) {
                    task.producer_clock(source, topic);
                }
                ms
            }
            Timestamp::NotAvailable => NO_TIMESTAMP,
        };
        task.advance_clock(source, timestamp, settings.now, settings.timers_per_batch)?;
        let record = InputRecord {
            source,
            topic,
            offset: message.offset(),
            key: message.key(),
            payload: message.payload(),
            timestamp,
            capability: message.headers().and_then(|hs| {
                hs.iter()
                    .find(|h| h.key == super::wire::header::CAPABILITY)
                    .and_then(|h| h.value)
            }),
        };
        if let Some((what, problem)) = unencodable.get(&(topic, message.offset())) {
            task.dead_letter_unencodable(&record, what, problem)?;
        } else {
            let parent = trace::extract(
                message
                    .headers()
                    .into_iter()
                    .flat_map(|hs| hs.iter())
                    .map(|h| (h.key, h.value.unwrap_or_default())),
            );
            match task.handle_record_in(&record, &parent) {
                Ok(()) => {}
                Err(partition::Error::Encode { what, source, .. }) => {
                    return Ok(Pass::Unencodable {
                        topic,
                        offset: message.offset(),
                        what,
                        problem: source.to_string(),
                    });
                }
                Err(e) => return Err(e.into()),
            }
        }
        // Ticks and other barriers are consumed, not decided.
        handled += usize::from(!super::wire::is_barrier(message.key(), message.payload()));
        consumed += 1;
        last.insert(topic, message);
    }
    for (topic, message) in last {
        task.note_last_consumed(topic, message.offset(), fingerprint(message));
    }
    Ok(Pass::Decided { handled, consumed })
}

/// The end of a task's share of a batch, once its records are handled: the timers still due by
/// the partition's record time, a due checkpoint (at that time), ticks when the task waits for
/// time, a due changelog sweep, then the seal with its fsync left owing (see
/// `PartitionTask::seal_deferred`).
pub fn close(task: &mut PartitionTask, settings: Settings) -> Result<(Outbox, Option<WalSync>)> {
    task.fire_due(settings.timers_per_batch)?;
    task.note_changes();
    if let Some(now) = task.clock().now() {
        task.checkpoint_if_due(now, settings.checkpoint_every_ms)?;
    }
    task.tick_if_due(settings.now, settings.tick_ms, settings.checkpoint_every_ms)?;
    task.sweep_if_due(settings.now, settings.changelog_sweep_ms);
    Ok(task.seal_deferred(settings.now)?)
}

/// The time of a record that carries none (`Timestamp::NotAvailable`).
pub const NO_TIMESTAMP: i64 = -1;

fn fingerprint(message: &BorrowedMessage<'_>) -> Fingerprint {
    partition::fingerprint(
        message.timestamp().to_millis(),
        message.key(),
        message.payload(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loads(weights: &[usize], threads: usize) -> Vec<Vec<usize>> {
        lanes(weights.to_vec(), threads, |w| *w)
    }

    #[test]
    fn lanes_balance_records_and_never_exceed_threads_or_busy_partitions() {
        assert_eq!(
            loads(&[100, 100, 100], 8),
            vec![vec![100], vec![100], vec![100]]
        );
        assert_eq!(
            loads(&[100, 300, 100, 100], 2),
            vec![vec![300], vec![100, 100, 100]]
        );
        // Idle tasks still seal, on the lanes the busy ones leave lightest.
        assert_eq!(loads(&[5, 0, 0], 4), vec![vec![5, 0, 0]]);
        assert_eq!(loads(&[0, 0], 4), vec![vec![0, 0]]);
        assert_eq!(loads(&[], 4), vec![Vec::<usize>::new()]);
        assert_eq!(loads(&[7, 7, 7], 1), vec![vec![7, 7, 7]]);
        assert_eq!(loads(&[7, 7, 7], 0), vec![vec![7, 7, 7]]);
    }

    #[test]
    fn a_small_batch_is_decided_on_the_calling_thread_alone() {
        let per = MIN_RECORDS_PER_LANE;
        // A low-load batch: a few records per partition, one lane (no thread started).
        assert_eq!(loads(&[7, 6, 7], 4), vec![vec![7, 7, 6]]);
        assert_eq!(loads(&[per - 1, 0, 0], 4).len(), 1);
        // One more lane per MIN_RECORDS_PER_LANE records, up to the threads and busy tasks.
        assert_eq!(
            loads(&[per, per - 1, 1], 4).len(),
            3,
            "2 × per in all: 3 lanes"
        );
        assert_eq!(loads(&[per, 0, 0], 4).len(), 1, "one busy task: one lane");
        assert_eq!(
            loads(&[per / 2, per / 2, per / 2], 4),
            vec![vec![per / 2, per / 2], vec![per / 2]],
            "1.5 × per: 2 lanes"
        );
        assert_eq!(
            loads(&[2000, 2000, 2000], 2).len(),
            2,
            "a full batch: the threads"
        );
    }
}
