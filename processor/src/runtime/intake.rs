//! Input records read ahead of the batches, per partition, and the order they are decided in.
//!
//! librdkafka hands a consumer its records one fetched chunk at a time, and a chunk is one
//! partition's (up to `max.partition.fetch.bytes`, thousands of proposals). A batch cut from
//! that stream in arrival order would mostly hold one partition, and its partitions could not
//! be decided side by side. So records wait here, in offset order per partition, and a batch
//! takes up to `batch.max_records` from every partition at once.
//!
//! **Order across a partition's input topics.** Partition `p` of the four input topics is one
//! task's input, and the topics are fetched side by side: in what order their records arrive
//! says nothing about the order the broker appended them. Live, the difference is a fetch's
//! worth of milliseconds and harmless: an approval appended after its proposal's reply was
//! read was appended after the proposal was decided. But an instance that takes a partition
//! over reads a backlog, and an approval (a few records) arrives before the thousands of
//! proposals ahead of it in time: decided first, it would be refused for want of an intent that
//! the previous owner had answered. So each topic's records wait in their own *lane*, a batch
//! takes the lanes' heads in record-time order (the broker's append time on Airlock's topics),
//! and while a lane is *behind* (it has not yet delivered the records the partition held when
//! it was assigned: [`Intake::catch_up`]) and has nothing waiting, no record later than the
//! last one it delivered is taken: what it has not delivered yet may come first. A lane that
//! stays behind with nothing to deliver for [`PATIENCE`] (its log ends in transaction markers,
//! which a consumer never receives, or the broker does not answer) stops being waited for, with
//! a warning. Records of one time keep their arrival order.
//!
//! Memory: at most `READ_AHEAD` batches' worth per owned partition is held (the records stay in
//! librdkafka's buffers; this holds references). A partition that waits for a lane keeps the
//! consumer polling (only a poll brings what it waits for), and once the bound is reached the
//! run loop pauses the fetching of its lanes that are ahead ([`Intake::lanes_to_pause`]) until
//! the wait ends: what was already fetched for them still arrives.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use rdkafka::Message;

use super::clock::wall_ms;

/// How many batches per owned partition may be read ahead.
pub const READ_AHEAD: usize = 4;

/// How long a partition waits for a lane that is behind and delivers nothing ...
pub const PATIENCE: Duration = Duration::from_secs(5);

/// ... and through how many polls of the consumer at least.
const MIN_POLLS: u64 = 10;

/// The read-ahead bound, in records.
fn bound(owned: usize, per_partition: usize) -> usize {
    per_partition
        .saturating_mul(owned.max(1))
        .saturating_mul(READ_AHEAD)
}

/// Records polled but not yet in a batch.
pub struct Intake<M> {
    by_partition: BTreeMap<i32, Lanes<M>>,
    len: usize,
    /// Arrival counter: the order of records of one time.
    arrivals: u64,
    patience: Duration,
    /// Polls of the consumer so far ([`Intake::polled`]).
    polls: u64,
}

/// One partition's records, a lane per input topic.
struct Lanes<M> {
    /// (topic, lane): at most one per input topic, so a scan beats a map.
    lanes: Vec<(String, Lane<M>)>,
    len: usize,
    /// Since when a lane has held this partition back (see [`PATIENCE`]), and the intake's
    /// poll count then.
    waiting_since: Option<(Instant, u64)>,
}

struct Lane<M> {
    /// (record time, arrival, record), in offset order.
    queue: VecDeque<(i64, u64, M)>,
    /// The offset after the last record pushed.
    next: Option<i64>,
    /// While the lane is behind: the offset it must reach.
    behind_until: Option<i64>,
    /// The time of the last record pushed: what the lane delivers next is no earlier (append
    /// times only grow along a partition).
    last_time: i64,
}

impl<M> Default for Lanes<M> {
    fn default() -> Self {
        Lanes {
            lanes: Vec::new(),
            len: 0,
            waiting_since: None,
        }
    }
}

impl<M> Default for Lane<M> {
    fn default() -> Self {
        Lane {
            queue: VecDeque::new(),
            next: None,
            behind_until: None,
            last_time: i64::MIN,
        }
    }
}

impl<M> Lane<M> {
    fn is_behind(&self) -> bool {
        match (self.behind_until, self.next) {
            (Some(end), Some(next)) => next < end,
            (Some(_), None) => true,
            (None, _) => false,
        }
    }
}

impl<M> Default for Intake<M> {
    fn default() -> Self {
        Intake {
            by_partition: BTreeMap::new(),
            len: 0,
            arrivals: 0,
            patience: PATIENCE,
            polls: 0,
        }
    }
}

impl<M> std::fmt::Debug for Intake<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Intake").field("len", &self.len).finish()
    }
}

impl<M> Lanes<M> {
    /// The lane whose head comes next, if a lane that is behind does not hold it back.
    fn next_lane(&self) -> Next {
        let Some((i, time)) = self
            .lanes
            .iter()
            .enumerate()
            .filter_map(|(i, (_, l))| {
                l.queue
                    .front()
                    .map(|(time, arrival, _)| (i, (*time, *arrival)))
            })
            .min_by_key(|(_, key)| *key)
            .map(|(i, (time, _))| (i, time))
        else {
            return Next::Empty;
        };
        let held = self
            .lanes
            .iter()
            .any(|(_, l)| l.queue.is_empty() && l.is_behind() && time > l.last_time);
        if held {
            Next::Held(time)
        } else {
            Next::Lane(i)
        }
    }

    fn lane(&mut self, topic: &str) -> &mut Lane<M> {
        let i = match self.lanes.iter().position(|(t, _)| t == topic) {
            Some(i) => i,
            None => {
                self.lanes.push((topic.to_owned(), Lane::default()));
                self.lanes.len() - 1
            }
        };
        &mut self.lanes[i].1
    }

    fn is_held(&self) -> bool {
        matches!(self.next_lane(), Next::Held(_))
    }

    /// Stops waiting for the lanes that hold back a head of time `time` (behind, nothing
    /// waiting, last delivered earlier); says which.
    fn give_up_waiting(&mut self, time: i64) -> Vec<(String, Option<i64>, i64)> {
        let mut given_up = Vec::new();
        for (topic, lane) in &mut self.lanes {
            if lane.queue.is_empty() && lane.is_behind() && time > lane.last_time {
                given_up.push((topic.clone(), lane.next, lane.behind_until.unwrap_or(0)));
                lane.behind_until = None;
            }
        }
        self.waiting_since = None;
        given_up
    }
}

enum Next {
    Empty,
    /// A lane that is behind holds back the head, of this time.
    Held(i64),
    /// The index of the lane whose head comes next.
    Lane(usize),
}

impl<M: Message> Intake<M> {
    /// An intake that waits `patience` instead of [`PATIENCE`] for a lane that is behind.
    pub fn with_patience(patience: Duration) -> Self {
        Intake {
            patience,
            ..Intake::default()
        }
    }

    /// The consumer was polled once more: a lane that is waited for had that chance to deliver.
    pub fn polled(&mut self) {
        self.polls += 1;
    }

    pub fn push(&mut self, m: M) {
        // A producer's timestamp (a topic without LogAppendTime) counts at most up to now, as
        // the partition's clock takes it: one from the future would starve its lane.
        let time = m.timestamp().to_millis().map(|t| t.min(wall_ms()));
        let offset = m.offset();
        let lanes = self.by_partition.entry(m.partition()).or_default();
        let lane = lanes.lane(m.topic());
        // A record without a time sorts with the last one its lane delivered.
        let time = time.unwrap_or(lane.last_time);
        lane.last_time = lane.last_time.max(time);
        lane.next = Some(lane.next.map_or(offset + 1, |n| n.max(offset + 1)));
        lane.queue.push_back((time, self.arrivals, m));
        lanes.len += 1;
        self.arrivals += 1;
        self.len += 1;
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Drops everything: after a rebalance the consumer reads every owned partition again from
    /// the offsets stored with its state.
    pub fn clear(&mut self) {
        self.by_partition.clear();
        self.len = 0;
    }

    /// Marks the lanes that start behind the end of their log: `(topic, partition, first offset
    /// to be read, end offset)`, the end as the broker reported it when the partition was
    /// assigned. Until a lane has delivered the records before its end, the records of the
    /// partition's other lanes do not pass what it may still deliver.
    pub fn catch_up(&mut self, lanes: impl IntoIterator<Item = (String, i32, i64, i64)>) {
        for (topic, partition, start, end) in lanes {
            if start >= end {
                continue;
            }
            let lane = self.by_partition.entry(partition).or_default().lane(&topic);
            lane.behind_until = Some(end);
            lane.next = Some(lane.next.map_or(start, |n| n.max(start)));
        }
    }

    /// Whether polling should stop: every one of `owned` partitions has a full batch waiting,
    /// or the read-ahead bound is reached. Never while a partition waits for a lane: only a
    /// poll can bring what it waits for (memory is bounded by pausing the lanes that are
    /// ahead instead, [`Intake::lanes_to_pause`]).
    pub fn is_full(&self, owned: usize, per_partition: usize) -> bool {
        if self.by_partition.values().any(Lanes::is_held) {
            return false;
        }
        self.len >= bound(owned, per_partition)
            || (self.by_partition.len() >= owned.max(1)
                && self.by_partition.values().all(|q| q.len >= per_partition))
    }

    /// The input partitions whose fetching should pause: once the read-ahead bound is reached,
    /// the lanes holding records of a partition that waits for another of its lanes. None
    /// otherwise: what was paused is resumed.
    pub fn lanes_to_pause(&self, owned: usize, per_partition: usize) -> BTreeSet<(String, i32)> {
        if self.len < bound(owned, per_partition) {
            return BTreeSet::new();
        }
        self.by_partition
            .iter()
            .filter(|(_, lanes)| lanes.is_held())
            .flat_map(|(p, lanes)| {
                lanes
                    .lanes
                    .iter()
                    .filter(|(_, l)| !l.queue.is_empty())
                    .map(|(t, _)| (t.clone(), *p))
            })
            .collect()
    }

    /// The next batch: up to `per_partition` records of every partition, each topic's in offset
    /// order, the topics merged by record time (see the module's documentation).
    pub fn take(&mut self, per_partition: usize) -> Vec<M> {
        let mut batch = Vec::new();
        for (partition, lanes) in &mut self.by_partition {
            let mut n = 0;
            while n < per_partition {
                let i = match lanes.next_lane() {
                    Next::Empty => break,
                    Next::Lane(i) => i,
                    Next::Held(time) => {
                        let (since, polls) = *lanes
                            .waiting_since
                            .get_or_insert((Instant::now(), self.polls));
                        // Patience counts while the consumer is polled: a long batch of other
                        // partitions gave the lane no chance to deliver.
                        if since.elapsed() < self.patience
                            || self.polls.saturating_sub(polls) < MIN_POLLS
                        {
                            break;
                        }
                        for (topic, next, end) in lanes.give_up_waiting(time) {
                            log::warn!(
                                "{topic} partition {partition}: read up to offset {next:?} of \
                                 the {end} it held when assigned, and nothing more for {:?}; \
                                 deciding its partition's other topics without waiting for it \
                                 (transaction markers at the log's end, or a slow broker)",
                                self.patience
                            );
                        }
                        continue;
                    }
                };
                let (_, _, m) = lanes.lanes[i]
                    .1
                    .queue
                    .pop_front()
                    .expect("the lane next_lane chose has a head");
                batch.push(m);
                lanes.len -= 1;
                lanes.waiting_since = None;
                n += 1;
            }
        }
        self.by_partition
            .retain(|_, l| l.len > 0 || l.lanes.iter().any(|(_, lane)| lane.is_behind()));
        self.len -= batch.len();
        batch
    }
}

#[cfg(test)]
mod tests {
    use rdkafka::Timestamp;
    use rdkafka::message::OwnedMessage;

    use super::*;

    fn record(partition: i32, offset: i64) -> OwnedMessage {
        OwnedMessage::new(
            None,
            None,
            "t".to_owned(),
            Timestamp::NotAvailable,
            partition,
            offset,
            None,
        )
    }

    fn positions(batch: &[OwnedMessage]) -> Vec<(i32, i64)> {
        batch.iter().map(|m| (m.partition(), m.offset())).collect()
    }

    #[test]
    fn a_batch_takes_every_partition_in_offset_order_though_they_arrived_in_chunks() {
        let mut intake = Intake::default();
        // Chunks as librdkafka delivers them: all of partition 0's fetch, then partition 1's.
        for o in 0..5 {
            intake.push(record(0, o));
        }
        assert!(!intake.is_full(2, 2), "partition 1 has nothing yet");
        for o in 10..13 {
            intake.push(record(1, o));
        }
        assert!(intake.is_full(2, 2));
        let batch = intake.take(2);
        assert_eq!(positions(&batch), vec![(0, 0), (0, 1), (1, 10), (1, 11)]);
        let batch = intake.take(2);
        assert_eq!(positions(&batch), vec![(0, 2), (0, 3), (1, 12)]);
        assert_eq!(positions(&intake.take(2)), vec![(0, 4)]);
        assert!(intake.is_empty());
        assert!(intake.take(2).is_empty());
    }

    fn at(topic: &str, offset: i64, time: i64) -> OwnedMessage {
        OwnedMessage::new(
            None,
            None,
            topic.to_owned(),
            Timestamp::LogAppendTime(time),
            0,
            offset,
            None,
        )
    }

    fn topics(batch: &[OwnedMessage]) -> Vec<(String, i64)> {
        batch
            .iter()
            .map(|m| (m.topic().to_owned(), m.offset()))
            .collect()
    }

    #[test]
    fn live_topics_are_merged_by_record_time_and_nothing_waits() {
        let mut intake = Intake::default();
        intake.push(at("approvals", 7, 30));
        intake.push(at("proposals", 3, 10));
        intake.push(at("proposals", 4, 40));
        intake.push(at("approvals", 8, 40));
        assert_eq!(
            topics(&intake.take(10)),
            [
                ("proposals", 3),
                ("approvals", 7),
                ("proposals", 4),
                ("approvals", 8)
            ]
            .map(|(t, o)| (t.to_owned(), o))
        );
    }

    #[test]
    fn an_approval_read_first_waits_for_the_proposals_of_its_time_while_they_catch_up() {
        let mut intake = Intake::default();
        // Assigned: proposals 100..103 and approvals 7..8 to read.
        intake.catch_up([
            ("proposals".to_owned(), 0, 100, 103),
            ("approvals".to_owned(), 0, 7, 8),
        ]);
        // The approval arrives first: what the proposals lane holds may be earlier.
        intake.push(at("approvals", 7, 50));
        assert!(intake.take(10).is_empty());
        assert!(
            !intake.is_full(1, 1),
            "polling goes on for the lane it waits on"
        );
        intake.push(at("proposals", 100, 10));
        intake.push(at("proposals", 101, 20));
        assert_eq!(
            topics(&intake.take(10)),
            [("proposals", 100), ("proposals", 101)].map(|(t, o)| (t.to_owned(), o))
        );
        intake.push(at("proposals", 102, 60));
        // The proposals lane reached its end: later proposals come as they are read.
        assert_eq!(
            topics(&intake.take(10)),
            [("approvals", 7), ("proposals", 102)].map(|(t, o)| (t.to_owned(), o))
        );
        intake.push(at("approvals", 8, 70));
        assert_eq!(topics(&intake.take(10)), [("approvals".to_owned(), 8)]);
        assert!(intake.is_empty());
    }

    #[test]
    fn a_lane_that_never_reaches_its_end_is_waited_for_only_so_long() {
        let mut intake = Intake::with_patience(Duration::from_millis(50));
        // The proposals log ends in a transaction marker the consumer never receives.
        intake.catch_up([("proposals".to_owned(), 0, 100, 102)]);
        intake.push(at("proposals", 100, 10));
        intake.push(at("approvals", 7, 50));
        assert_eq!(topics(&intake.take(10)), [("proposals".to_owned(), 100)]);
        assert!(intake.take(10).is_empty(), "offset 101 may still come");
        std::thread::sleep(Duration::from_millis(60));
        assert!(
            intake.take(10).is_empty(),
            "the time passed, but the consumer was not polled meanwhile"
        );
        for _ in 0..MIN_POLLS {
            intake.polled();
        }
        assert_eq!(topics(&intake.take(10)), [("approvals".to_owned(), 7)]);
    }

    #[test]
    fn a_waiting_partition_keeps_polling_and_pauses_its_lanes_ahead_at_the_bound() {
        let mut intake = Intake::default();
        intake.catch_up([("approvals".to_owned(), 0, 7, 8)]);
        // Proposals pile up while the approvals lane has delivered nothing.
        let bound = 2 * READ_AHEAD;
        for o in 0..bound as i64 - 1 {
            intake.push(at("proposals", o, 10 + o));
        }
        assert!(intake.take(2).is_empty());
        assert!(intake.lanes_to_pause(1, 2).is_empty(), "below the bound");
        intake.push(at("proposals", 100, 200));
        assert!(!intake.is_full(1, 2), "only a poll brings the approval");
        assert_eq!(
            intake.lanes_to_pause(1, 2),
            BTreeSet::from([("proposals".to_owned(), 0)])
        );
        intake.push(at("approvals", 7, 5));
        assert_eq!(
            topics(&intake.take(2)),
            [("approvals", 7), ("proposals", 0)].map(|(t, o)| (t.to_owned(), o))
        );
        assert!(intake.lanes_to_pause(1, 2).is_empty(), "the wait is over");
    }

    #[test]
    fn a_producer_time_from_the_future_counts_as_now() {
        let mut intake = Intake::default();
        let future = wall_ms() + 3_600_000;
        intake.push(OwnedMessage::new(
            None,
            None,
            "proposals".to_owned(),
            Timestamp::CreateTime(future),
            0,
            0,
            None,
        ));
        intake.push(at("approvals", 0, wall_ms() + 60_000));
        assert_eq!(
            topics(&intake.take(10)),
            [("proposals", 0), ("approvals", 0)].map(|(t, o)| (t.to_owned(), o))
        );
    }

    #[test]
    fn a_catch_up_already_at_its_end_holds_nothing() {
        let mut intake = Intake::default();
        intake.catch_up([("proposals".to_owned(), 0, 100, 100)]);
        intake.push(at("approvals", 7, 50));
        assert_eq!(topics(&intake.take(10)), [("approvals".to_owned(), 7)]);
    }

    #[test]
    fn read_ahead_is_bounded_when_a_partition_stays_idle() {
        let mut intake = Intake::default();
        let bound = 3 * 2 * READ_AHEAD;
        for o in 0..bound as i64 - 1 {
            intake.push(record(0, o));
        }
        assert!(!intake.is_full(2, 3), "partition 1 may still come");
        intake.push(record(0, bound as i64));
        assert!(intake.is_full(2, 3));
        intake.clear();
        assert!(intake.is_empty());
        assert!(!intake.is_full(2, 3));
    }
}
