//! Leaving a consumer group and joining it again after a claim failed for a reason that passes
//! (a broker away, a leader moving, a read without progress): the processor and the connector
//! workers release what they were assigned, pause, and rejoin, so that the group assigns the
//! partitions anew (to them or to another member), instead of exiting.

use std::time::{Duration, Instant};

/// The first pause before rejoining; it doubles with each failed claim in a row, up to
/// [`PAUSE_MAX`].
pub const PAUSE: Duration = Duration::from_secs(2);
/// The longest pause before rejoining.
pub const PAUSE_MAX: Duration = Duration::from_secs(30);

/// A pending rejoin, and the failed claims in a row that set its pause.
#[derive(Debug, Default)]
pub struct Rejoin {
    at: Option<Instant>,
    failures: u32,
}

impl Rejoin {
    /// A claim failed transiently: rejoin after a pause that grows with the failures in a
    /// row. Returns the pause.
    pub fn failed(&mut self) -> Duration {
        let pause = PAUSE
            .saturating_mul(1 << self.failures.min(4))
            .min(PAUSE_MAX);
        self.failures += 1;
        self.at = Some(Instant::now() + pause);
        pause
    }

    /// A claim succeeded (a rebalance during the pause assigned partitions anew): no rejoin
    /// is pending, and the next failure pauses the shortest time again.
    pub fn claimed(&mut self) {
        self.failures = 0;
        self.at = None;
    }

    /// True while a rejoin is pending.
    pub fn pending(&self) -> bool {
        self.at.is_some()
    }

    /// True once the pending rejoin is due (and no longer pending).
    pub fn due(&mut self) -> bool {
        match self.at {
            Some(at) if at <= Instant::now() => {
                self.at = None;
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pause_doubles_up_to_its_bound_and_a_good_claim_resets_it() {
        let mut r = Rejoin::default();
        let pauses: Vec<u64> = (0..7).map(|_| r.failed().as_secs()).collect();
        assert_eq!(pauses, [2, 4, 8, 16, 30, 30, 30]);
        assert!(r.pending());
        assert!(!r.due(), "not before its pause");
        r.claimed();
        assert!(!r.pending());
        assert_eq!(r.failed(), PAUSE);
    }

    #[test]
    fn a_due_rejoin_is_taken_once() {
        let mut r = Rejoin {
            at: Some(Instant::now()),
            failures: 1,
        };
        assert!(r.due());
        assert!(!r.due());
        assert!(!r.pending());
    }
}
