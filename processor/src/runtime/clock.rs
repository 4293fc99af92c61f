//! A partition's record-time clock: when its timers fire.
//!
//! A timer (an approval window closing, an attempt's deadline, a reconciliation round, a
//! purge) fires when the partition's *inputs* say its time has come, never when the wall clock
//! of the instance deciding them does. Each input topic's time is the latest time of a record
//! read from it (the broker's append time where the topic has `LogAppendTime`); the partition's
//! time is the earliest of the four. A timer due at `t` therefore fires only once every input
//! topic has been read past `t`: an approval appended before its intent's window closed is
//! decided before the window's timer fires however late it is read (a lagging or restarted
//! instance, a catch-up). The topics are fetched side by side, so a record of a topic that is
//! ahead may still be decided before a timer due earlier; handlers judge the deadlines they
//! depend on at the record's own time for that (an approval after its window is refused
//! whether or not the window's timer fired).
//!
//! An input topic that stays silent would hold the clock back forever, so a task waiting for
//! time (a timer due by the wall clock, a checkpoint owed) puts a barrier on each input
//! partition whose time lags: a *tick*. The broker stamps it like any record, and reading it
//! advances that topic's time (see `PartitionTask::tick_if_due`). The wall clock decides only
//! *when to ask* for ticks, never what time it is.
//!
//! A producer's own timestamp (a topic without `LogAppendTime`) could claim any time; a
//! record's time moves its topic's clock at most to the wall clock of the batch reading it, so
//! a timestamp from the future cannot fire timers early (it still is the record's own `now`).

use super::partition::Source;

/// Milliseconds since the Unix epoch by this machine's clock: `0` before the epoch, saturating
/// far past it. The one wall clock of the processor, its CLI and its connector workers; the
/// deterministic path never reads it (see the module docs).
pub fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The time read so far on each input topic of one partition (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecordClock {
    /// By [`Source`], in [`Source::ALL`] order; `None` until a record of that topic was read.
    seen: [Option<i64>; 4],
}

impl RecordClock {
    /// Notes a record of `source` stamped `at`, read in a batch that began at wall time `wall`.
    /// A negative `at` (no timestamp) moves nothing.
    pub fn observe(&mut self, source: Source, at: i64, wall: i64) {
        if at < 0 {
            return;
        }
        let slot = &mut self.seen[index(source)];
        let at = at.min(wall);
        *slot = Some(slot.map_or(at, |seen| seen.max(at)));
    }

    /// The partition's time: how far every input topic has been read. `None` until each has
    /// been read once (a tick gives a silent topic its first record).
    pub fn now(&self) -> Option<i64> {
        self.seen
            .iter()
            .try_fold(i64::MAX, |min, seen| seen.map(|s| min.min(s)))
    }

    /// The latest time read on any input topic (`None` before the first record).
    pub fn latest(&self) -> Option<i64> {
        self.seen.iter().flatten().copied().max()
    }

    /// The input topics (by [`Source`]) whose time is unknown or before `before`: the ones a
    /// tick must advance.
    pub fn lagging(&self, before: i64) -> impl Iterator<Item = Source> + '_ {
        Source::ALL
            .into_iter()
            .filter(move |&s| self.seen[index(s)].is_none_or(|seen| seen < before))
    }
}

fn index(source: Source) -> usize {
    match source {
        Source::Proposals => 0,
        Source::Approvals => 1,
        Source::Outcomes => 2,
        Source::Control => 3,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_partition_is_as_late_as_its_least_read_topic() {
        let mut c = RecordClock::default();
        assert_eq!(c.now(), None);
        c.observe(Source::Proposals, 500, 1_000);
        c.observe(Source::Approvals, 300, 1_000);
        c.observe(Source::Outcomes, 900, 1_000);
        assert_eq!(c.now(), None, "the control topic was never read");
        assert_eq!(c.latest(), Some(900));
        assert_eq!(
            c.lagging(400).collect::<Vec<_>>(),
            [Source::Approvals, Source::Control]
        );
        c.observe(Source::Control, 400, 1_000);
        assert_eq!(c.now(), Some(300));
        c.observe(Source::Approvals, 700, 1_000);
        assert_eq!(c.now(), Some(400));
        // Time never goes back on a topic.
        c.observe(Source::Control, 100, 1_000);
        assert_eq!(c.now(), Some(400));
        assert_eq!(c.lagging(400).count(), 0);
    }

    #[test]
    fn a_timestamp_from_the_future_moves_its_topic_only_to_the_wall_clock() {
        let mut c = RecordClock::default();
        for s in Source::ALL {
            c.observe(s, 1_000, 2_000);
        }
        c.observe(Source::Proposals, i64::MAX, 2_000);
        c.observe(Source::Approvals, 5_000, 2_000);
        c.observe(Source::Outcomes, 1_500, 2_000);
        c.observe(Source::Control, -1, 2_000);
        assert_eq!(c.now(), Some(1_000), "control still at 1,000");
        c.observe(Source::Control, 9_000, 3_000);
        assert_eq!(c.now(), Some(1_500));
        assert_eq!(c.latest(), Some(3_000));
    }
}
