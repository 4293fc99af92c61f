//! Input records read ahead of the batches, per partition.
//!
//! librdkafka hands a consumer its records one fetched chunk at a time, and a chunk is one
//! partition's (up to `max.partition.fetch.bytes`, thousands of proposals). A batch cut from
//! that stream in arrival order would mostly hold one partition, and its partitions could not
//! be decided side by side. So records wait here, in offset order per partition, and a batch
//! takes up to `batch.max_records` from every partition at once.
//!
//! Memory: at most `READ_AHEAD` batches' worth per owned partition is held (the records stay
//! in librdkafka's buffers; this holds references).

use std::collections::{BTreeMap, VecDeque};

use rdkafka::Message;

/// How many batches per owned partition may be read ahead.
pub const READ_AHEAD: usize = 4;

/// Records polled but not yet in a batch.
pub struct Intake<M> {
    by_partition: BTreeMap<i32, VecDeque<M>>,
    len: usize,
}

impl<M> Default for Intake<M> {
    fn default() -> Self {
        Intake {
            by_partition: BTreeMap::new(),
            len: 0,
        }
    }
}

impl<M> std::fmt::Debug for Intake<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Intake").field("len", &self.len).finish()
    }
}

impl<M: Message> Intake<M> {
    pub fn push(&mut self, m: M) {
        self.by_partition
            .entry(m.partition())
            .or_default()
            .push_back(m);
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

    /// Whether polling should stop: every one of `owned` partitions has a full batch waiting,
    /// or the read-ahead bound is reached.
    pub fn is_full(&self, owned: usize, per_partition: usize) -> bool {
        let owned = owned.max(1);
        self.len
            >= per_partition
                .saturating_mul(owned)
                .saturating_mul(READ_AHEAD)
            || (self.by_partition.len() >= owned
                && self.by_partition.values().all(|q| q.len() >= per_partition))
    }

    /// The next batch: up to `per_partition` records of every partition, each partition's in
    /// offset order.
    pub fn take(&mut self, per_partition: usize) -> Vec<M> {
        let mut batch = Vec::new();
        for q in self.by_partition.values_mut() {
            let n = q.len().min(per_partition);
            batch.extend(q.drain(..n));
        }
        self.by_partition.retain(|_, q| !q.is_empty());
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
