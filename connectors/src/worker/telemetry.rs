//! What a connector worker tells operators: its Prometheus metrics, and its liveness and
//! readiness, on the same kind of endpoint as the processor's
//! (`airlock_processor::telemetry::server`, `telemetry.listen`).
//!
//! | metric | type | labels | meaning |
//! | --- | --- | --- | --- |
//! | `airlock_connector_commands_total` | counter | `result` | records handled: `COMMITTED`, `FAILED`, `UNKNOWN` (executed), `RECONCILED_*`, `DEAD_LETTERED`, `DUPLICATE`, `FENCED`, `ABANDONED` |
//! | `airlock_connector_refused_total` | counter | `reason` | commands dead-lettered, by refusal (`FORGED`, `UNSIGNED`, `ARGUMENTS_ALTERED`, ...) |
//! | `airlock_connector_call_duration_seconds` | histogram | `call`, `result` | one downstream exchange: `execute` or `reconcile`, by what it proved |
//! | `airlock_connector_partitions_owned` | gauge | | dispatch partitions this worker owns |
//! | `airlock_connector_in_flight` | gauge | | commands started and not yet reported (at most `connector.max_in_flight`) |
//! | `airlock_connector_consumer_errors_total` | counter | `code` | errors the dispatch consumer reported (librdkafka's code) |
//!
//! Liveness fails when the loop made no progress for `telemetry.stall_after_ms` (calls run
//! beside the loop, which goes on while they wait; a claim rebuilding its partitions' started
//! attempts, or a broker that does not acknowledge, stalls it); readiness waits until
//! the started attempts of every assigned partition are rebuilt from the outcomes, and fails
//! for a minute after the dispatch consumer reported an error (a deleted or unauthorized
//! topic, an unreachable coordinator) while the loop goes on.

use std::sync::Arc;
use std::time::Duration;

use airlock_processor::telemetry::health::Health;
use airlock_processor::telemetry::metrics::{Counter, Gauge, Histogram, LATENCY_BUCKETS, Registry};
use airlock_processor::telemetry::server::Probes;

use super::handle::Handled;

/// The worker's metric families and probes.
pub struct Telemetry {
    pub registry: Arc<Registry>,
    pub commands: Arc<Counter>,
    pub refused: Arc<Counter>,
    pub call_duration: Arc<Histogram>,
    pub partitions_owned: Arc<Gauge>,
    pub in_flight: Arc<Gauge>,
    pub consumer_errors: Arc<Counter>,
    pub health: Health,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry").finish_non_exhaustive()
    }
}

impl Telemetry {
    pub fn new(stall_after: Duration) -> Self {
        let r = Registry::new();
        Telemetry {
            commands: r.counter(
                "airlock_connector_commands_total",
                "Dispatch-topic records handled, by what became of them.",
                &["result"],
            ),
            refused: r.counter(
                "airlock_connector_refused_total",
                "Commands refused to the dead-letter topic, by reason.",
                &["reason"],
            ),
            call_duration: r.histogram(
                "airlock_connector_call_duration_seconds",
                "One downstream exchange (execute or reconcile), by the outcome it proved.",
                &["call", "result"],
                LATENCY_BUCKETS,
            ),
            partitions_owned: r.gauge(
                "airlock_connector_partitions_owned",
                "Dispatch partitions this worker owns.",
                &[],
            ),
            in_flight: r.gauge(
                "airlock_connector_in_flight",
                "Commands started and not yet reported.",
                &[],
            ),
            consumer_errors: r.counter(
                "airlock_connector_consumer_errors_total",
                "Errors the dispatch consumer reported, by librdkafka error code.",
                &["code"],
            ),
            registry: Arc::new(r),
            health: Health::new(stall_after, "telemetry.stall_after_ms"),
        }
    }

    /// The dispatch consumer reported `error`: counted, logged, not ready for a while.
    pub fn consumer_error(&self, error: &rdkafka::error::KafkaError) {
        let code = self.health.consumer_error(error);
        self.consumer_errors.inc(&[&code]);
    }

    /// Counts one handled record.
    pub fn handled(&self, handled: Handled) {
        let result = match handled {
            Handled::DeadLettered => "DEAD_LETTERED",
            Handled::Duplicate => "DUPLICATE",
            Handled::Fenced => "FENCED",
            Handled::Abandoned => "ABANDONED",
            Handled::Executed(kind) | Handled::Reconciled(kind) => kind.as_str(),
        };
        self.commands.inc(&[result]);
    }
}

impl Probes for Telemetry {
    fn live(&self) -> Result<(), String> {
        self.health.live()
    }

    fn ready(&self) -> Result<(), String> {
        self.health.ready()
    }
}

#[cfg(test)]
mod tests {
    use airlock_schemas::OutcomeKind;

    use super::*;

    #[test]
    fn executed_and_reconciled_commands_are_counted_by_what_they_proved() {
        let t = Telemetry::new(Duration::from_secs(60));
        t.handled(Handled::Executed(OutcomeKind::Committed));
        t.handled(Handled::Executed(OutcomeKind::Committed));
        t.handled(Handled::Reconciled(OutcomeKind::ReconciledFailed));
        t.handled(Handled::DeadLettered);
        assert_eq!(t.commands.get(&["COMMITTED"]), 2);
        assert_eq!(t.commands.get(&["DEAD_LETTERED"]), 1);
        let text = t.registry.render();
        assert!(
            text.contains("airlock_connector_commands_total{result=\"RECONCILED_FAILED\"} 1\n"),
            "{text}"
        );
    }
}
