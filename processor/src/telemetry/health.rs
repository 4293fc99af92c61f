//! Liveness and readiness of a consumer-group member (the processor and the connector workers
//! alike): alive while its loop makes progress and has not stopped on an error; ready when it
//! has joined its group, is not stopping, and has claimed every partition it was assigned
//! (restored state, rebuilt attempts) with no claim in progress.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::server::Probes;

/// What the probes of one process report.
#[derive(Debug)]
pub struct Health {
    started: Instant,
    /// Milliseconds after `started` of the last progress.
    beat_ms: AtomicU64,
    stall_after: Duration,
    /// The knob that sets `stall_after`, named in the liveness failure.
    knob: &'static str,
    state: Mutex<Assignment>,
}

#[derive(Debug, Default)]
struct Assignment {
    /// The group gave this member an assignment at least once (possibly empty).
    joined: bool,
    assigned: BTreeSet<i32>,
    claimed: BTreeSet<i32>,
    claiming: BTreeSet<i32>,
    stopping: bool,
    fatal: Option<String>,
    /// The last error the consumer reported, and when.
    consumer_error: Option<(Instant, String)>,
}

/// How long after the consumer's last error the process is not ready: librdkafka reports a
/// lasting one (an input topic deleted or not authorized) again at least this often.
pub const CONSUMER_ERROR_HOLD: Duration = Duration::from_secs(60);

impl Health {
    /// `stall_after`: the silence after which the process is not live; `knob` names the
    /// setting in the answer.
    pub fn new(stall_after: Duration, knob: &'static str) -> Self {
        Health {
            started: Instant::now(),
            beat_ms: AtomicU64::new(0),
            stall_after,
            knob,
            state: Mutex::new(Assignment::default()),
        }
    }

    /// The loop (or a claim it runs) made progress.
    pub fn beat(&self) {
        let ms = self.started.elapsed().as_millis() as u64;
        self.beat_ms.store(ms, Ordering::Relaxed);
    }

    /// The group assigned `partitions` (claims follow); empty after a revocation.
    pub fn assigned(&self, partitions: &BTreeSet<i32>) {
        let mut s = self.lock();
        s.joined = true;
        s.assigned = partitions.clone();
        s.claimed.retain(|p| partitions.contains(p));
    }

    pub fn claim_started(&self, partition: i32) {
        self.lock().claiming.insert(partition);
        self.beat();
    }

    /// A claim ended; `claimed` when it succeeded.
    pub fn claim_ended(&self, partition: i32, claimed: bool) {
        let mut s = self.lock();
        s.claiming.remove(&partition);
        if claimed {
            s.claimed.insert(partition);
        }
        drop(s);
        self.beat();
    }

    /// The loop stopped on an error: not live any more.
    pub fn failed(&self, reason: String) {
        self.lock().fatal = Some(reason);
    }

    /// The consumer reported `error` (an input topic missing or not authorized, the group
    /// coordinator out of reach...): logged, and not ready until [`CONSUMER_ERROR_HOLD`] passed
    /// without another. The loop goes on: librdkafka retries, and most such errors pass.
    /// Returns librdkafka's error code, the label to count it by.
    pub fn consumer_error(&self, error: &rdkafka::error::KafkaError) -> String {
        log::warn!("consumer: {error}");
        self.lock().consumer_error = Some((Instant::now(), error.to_string()));
        error
            .rdkafka_error_code()
            .map_or_else(|| "unknown".to_owned(), |code| format!("{code:?}"))
    }

    /// A graceful stop began: not ready any more.
    pub fn stopping(&self) {
        self.lock().stopping = true;
    }

    fn lock(&self) -> MutexGuard<'_, Assignment> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Probes for Health {
    fn live(&self) -> Result<(), String> {
        if let Some(fatal) = &self.lock().fatal {
            return Err(format!("stopped on an error: {fatal}"));
        }
        let beat = Duration::from_millis(self.beat_ms.load(Ordering::Relaxed));
        let silent = self.started.elapsed().saturating_sub(beat);
        if silent > self.stall_after {
            return Err(format!(
                "the loop made no progress for {:.1}s ({} = {})",
                silent.as_secs_f64(),
                self.knob,
                self.stall_after.as_millis()
            ));
        }
        Ok(())
    }

    fn ready(&self) -> Result<(), String> {
        self.live()?;
        let s = self.lock();
        if s.stopping {
            return Err("stopping".to_owned());
        }
        if let Some((at, reason)) = &s.consumer_error
            && at.elapsed() < CONSUMER_ERROR_HOLD
        {
            return Err(format!(
                "the consumer reported an error {:.1}s ago: {reason}",
                at.elapsed().as_secs_f64()
            ));
        }
        if !s.joined {
            return Err("waiting for the consumer group to assign partitions".to_owned());
        }
        if !s.claiming.is_empty() {
            let claiming: Vec<i32> = s.claiming.iter().copied().collect();
            return Err(format!("claiming partitions {claiming:?}"));
        }
        let unclaimed: Vec<i32> = s.assigned.difference(&s.claimed).copied().collect();
        if !unclaimed.is_empty() {
            return Err(format!(
                "partitions {unclaimed:?} are assigned but not claimed"
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_when_every_assigned_partition_is_claimed() {
        let h = Health::new(Duration::from_secs(60), "stall_after_ms");
        h.beat();
        assert!(h.live().is_ok());
        assert!(
            h.ready()
                .unwrap_err()
                .contains("waiting for the consumer group")
        );
        h.assigned(&BTreeSet::from([0, 1]));
        h.claim_started(0);
        assert!(h.ready().unwrap_err().contains("claiming partitions [0]"));
        h.claim_ended(0, true);
        assert!(
            h.ready()
                .unwrap_err()
                .contains("[1] are assigned but not claimed")
        );
        // A failed claim is not a claim.
        h.claim_started(1);
        h.claim_ended(1, false);
        assert!(h.ready().is_err());
        h.claim_started(1);
        h.claim_ended(1, true);
        assert_eq!(h.ready(), Ok(()));
        // Revoked, then nothing assigned: a member with nothing to own is ready.
        h.assigned(&BTreeSet::new());
        assert_eq!(h.ready(), Ok(()));
        h.assigned(&BTreeSet::from([1]));
        assert!(h.ready().unwrap_err().contains("[1] are assigned"));
        h.stopping();
        assert_eq!(h.ready(), Err("stopping".to_owned()));
        h.failed("kafka: broker down".to_owned());
        assert!(h.live().unwrap_err().contains("broker down"));
    }

    #[test]
    fn a_consumer_error_holds_readiness_back_for_a_while() {
        let h = Health::new(Duration::from_secs(60), "stall_after_ms");
        h.beat();
        h.assigned(&BTreeSet::new());
        assert_eq!(h.ready(), Ok(()));
        let code = h.consumer_error(&rdkafka::error::KafkaError::MessageConsumption(
            rdkafka::types::RDKafkaErrorCode::TopicAuthorizationFailed,
        ));
        assert_eq!(code, "TopicAuthorizationFailed");
        let not_ready = h.ready().unwrap_err();
        assert!(
            not_ready.contains("the consumer reported an error")
                && not_ready.contains("Topic authorization failed"),
            "{not_ready}"
        );
        assert!(h.live().is_ok(), "the loop goes on: no restart would help");
        // Once the hold passed without another error, ready again.
        let long_ago = Instant::now().checked_sub(CONSUMER_ERROR_HOLD).unwrap();
        h.lock().consumer_error.as_mut().unwrap().0 = long_ago;
        assert_eq!(h.ready(), Ok(()));
    }

    #[test]
    fn a_silent_loop_is_not_live() {
        let h = Health::new(Duration::from_millis(0), "stall_after_ms");
        std::thread::sleep(Duration::from_millis(5));
        assert!(h.live().unwrap_err().contains("no progress"));
    }
}
