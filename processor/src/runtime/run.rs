//! `airlock run`: the processor instance. One consumer group over the four input topics, one
//! [`PartitionTask`] per partition this instance owns, one batch loop:
//!
//! 1. poll until every owned partition has `batch.max_records` records waiting, or until
//!    `batch.flush_interval_ms` passed since the first one, or until none came for
//!    `batch.idle_ms`; the batch takes up to `batch.max_records` of each partition (the rest
//!    waits for the next, see [`intake`](super::intake));
//! 2. each record goes to its partition's task (decide or dead-letter; offset staged);
//! 3. each task fires its due timers, journals a checkpoint when one is due, and seals: one
//!    RocksDB `WriteBatch` with state, offsets and outbox, written without waiting for its
//!    fsync. Steps 2 and 3 run the partitions side by side on up to `processor.threads`
//!    threads ([`decide`]);
//! 4. the outbox is produced: on the sender thread, the batch's write-ahead logs are fsynced
//!    and then its outputs sent, its changelog once they are acknowledged, while the next
//!    batches are read and decided (at most `batch.max_in_flight` batches wait; see
//!    [`flight`]); entries whose changelog is acknowledged are marked done with
//!    the next batch;
//! 5. the offsets are committed to the group, for lag monitoring only (at most once a
//!    second, and on stopping).
//!
//! Rebalances happen inside `poll` (step 1), between batches: on assignment each partition is
//! claimed (`restore`) and the consumer is positioned at the offsets stored with the state; on
//! revocation each task that changed since its last checkpoint journals one, every sealed
//! batch still in flight is waited for (its outputs and changelog acknowledged), then the
//! tasks are dropped with whatever they had not sealed, and nothing more leaves them. A
//! graceful stop (SIGTERM, SIGINT) does the same before it leaves the group. The group uses
//! the `range` assignor, which keeps partition `p` of every input topic on one instance (they
//! all have the same partition count); an assignment that breaks this is refused.
//!
//! Offsets never move silently: a record past the next offset to consume stops the instance
//! (`Error::Gap`), and so does a log that is no longer the one the state consumed: the last
//! record consumed reading back different (its fingerprint, see
//! `PartitionTask::check_redelivered`).
//!
//! Metrics, health and readiness (`telemetry`) are recorded by this loop and served on
//! `telemetry.listen` when it is set.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use airlock_schemas::Codec;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::types::{RDKafkaErrorCode, RDKafkaRespErr};
use rdkafka::{ClientContext, Message, Offset, TopicPartitionList};

use super::clock::wall_ms;
use super::config::Config;
use super::decide;
use super::flight::{self, Done, Flights};
use super::intake::Intake;
use super::partition::{self, PartitionTask, Source};
use super::produce::{self, Producer};
use super::rejoin::Rejoin;
use super::restore::{self, Claim};
use super::schema_registry;
use super::telemetry::{LAG_INTERVAL, Telemetry};

/// How long the end of one input partition is asked for after a rebalance.
const WATERMARK_TIMEOUT: Duration = Duration::from_secs(2);
use super::topics::{self, Names};
use crate::core::Core;
use crate::telemetry::server;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error(transparent)]
    Topics(#[from] topics::Error),
    #[error(transparent)]
    Restore(#[from] restore::Error),
    #[error(transparent)]
    Task(#[from] partition::Error),
    #[error(transparent)]
    Produce(#[from] produce::Error),
    #[error(transparent)]
    Flight(#[from] flight::Error),
    #[error(transparent)]
    Telemetry(#[from] server::Error),
    #[error("rebalance: {0}")]
    Rebalance(String),
    /// The schema registry (`schema_registry.url`) unreachable, a subject missing, ...
    #[error("{0:#}")]
    SchemaRegistry(anyhow::Error),
    #[error(
        "{topic} partition {partition}: the consumer delivered offset {got} where {expected} was \
         next ({why}); refusing to skip input (the outbox and offsets are intact: restart resumes \
         at {expected})"
    )]
    Gap {
        topic: String,
        partition: i32,
        expected: i64,
        got: i64,
        /// What the broker says of the missing offsets (see `explain_gap`).
        why: String,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// True when a claim that failed with this error may succeed if tried again later (see
    /// [`restore::Error::is_transient`]).
    fn is_transient(&self) -> bool {
        match self {
            Error::Kafka(e) => super::scan::transient(e),
            Error::Restore(e) => e.is_transient(),
            _ => false,
        }
    }
}

/// What one instance did, reported when it stops.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub batches: u64,
    pub inputs: u64,
    pub dead_lettered: u64,
    pub produced: u64,
    pub claims: u64,
}

struct Shared {
    tasks: BTreeMap<i32, PartitionTask>,
    /// Sealed batches whose records are still on their way to the broker.
    flights: Flights,
    /// A failure inside a rebalance callback, raised by the loop after `poll` returns.
    fatal: Option<Error>,
    /// After a claim failed transiently the instance owns nothing, leaves its group and joins
    /// again after a pause, so that the partitions are assigned anew.
    rejoin: Rejoin,
    claims: u64,
    /// Counts rebalances: records polled before one are dropped (the consumer was positioned
    /// again at the stored offsets).
    generation: u64,
}

struct Ctx {
    shared: Arc<Mutex<Shared>>,
    claim: Arc<Claim>,
    inputs: Vec<String>,
    /// Where a gained partition's fetch starts (`compat::Broker::resume_offset`).
    broker: super::compat::Broker,
    telemetry: Arc<Telemetry>,
}

impl ClientContext for Ctx {
    /// Consumer lag per owned input partition, from librdkafka's statistics (emitted inside
    /// `poll` every `LAG_INTERVAL`): the partition's high watermark minus the task's next offset.
    /// At the same interval, each owned store's RocksDB write stall state.
    fn stats(&self, statistics: rdkafka::statistics::Statistics) {
        let shared = lock(&self.shared);
        for (&p, task) in &shared.tasks {
            match task.store().backend().write_pressure() {
                Ok(pressure) => self.telemetry.write_pressure(p, &pressure),
                Err(e) => log::warn!("partition {p}: reading RocksDB's write stall state: {e}"),
            }
        }
        for (topic, t) in &statistics.topics {
            if !self.inputs.contains(topic) {
                continue;
            }
            for (&p, stats) in &t.partitions {
                let Some(task) = shared.tasks.get(&p) else {
                    continue;
                };
                if stats.hi_offset < 0 {
                    continue;
                }
                let next = match task.stored_offset(topic) {
                    Ok(Some(next)) => next,
                    Ok(None) => stats.lo_offset.max(0),
                    Err(_) => continue,
                };
                self.telemetry.consumer_lag.set(
                    &[topic, &p.to_string()],
                    (stats.hi_offset - next).max(0) as f64,
                );
            }
        }
    }
}

impl ConsumerContext for Ctx {
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        let mut shared = lock(&self.shared);
        shared.generation += 1;
        if err == RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS {
            // The revoked tasks' last word, flushed with the rest just below.
            match send_closing_checkpoints(&mut shared, &self.claim.producer, wall_ms()) {
                Ok(records) => self.telemetry.produced.add(&[], records as u64),
                Err(e) => {
                    log::error!("journaling the revoked partitions' checkpoints: {e}");
                    shared.fatal.get_or_insert(e);
                }
            }
        }
        // Whatever the tasks sealed leaves before they are dropped or claimed again. Their
        // acknowledgements are not marked (the tasks go): the next claim resends those
        // outbox rows under the same identity, and readers drop the copies.
        if let Err(e) = shared.flights.advance(&self.claim.producer, 0) {
            log::error!("flushing the batches in flight: {e}");
            shared.fatal.get_or_insert(e.into());
        }
        match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                let failed = match self.assign(consumer, &mut shared, tpl) {
                    Ok(()) => {
                        shared.rejoin.claimed();
                        false
                    }
                    Err(e) if e.is_transient() => {
                        self.telemetry.claims_failed.inc(&["true"]);
                        let pause = shared.rejoin.failed();
                        log::error!(
                            "taking partitions: {e}; leaving the group, joining again in {pause:?}"
                        );
                        true
                    }
                    Err(e) => {
                        self.telemetry.claims_failed.inc(&["false"]);
                        log::error!("taking partitions: {e}");
                        shared.fatal.get_or_insert(e);
                        true
                    }
                };
                if failed {
                    // Own nothing rather than something half-claimed.
                    shared.tasks.clear();
                    self.telemetry.assigned(&BTreeSet::new());
                    if let Err(e) = consumer.assign(&TopicPartitionList::new()) {
                        log::error!("releasing the assignment: {e}");
                    }
                }
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                let revoked: BTreeSet<i32> = tpl.elements().iter().map(|e| e.partition()).collect();
                log::info!("partitions {revoked:?} revoked: their tasks stop");
                // Dropping a task drops its unsealed batch: nothing more leaves it.
                shared.tasks.clear();
                self.telemetry.assigned(&BTreeSet::new());
                if let Err(e) = consumer.unassign() {
                    log::error!("unassigning: {e}");
                }
            }
            other => {
                log::error!("rebalance error {other:?}: dropping every task");
                shared.tasks.clear();
                self.telemetry.assigned(&BTreeSet::new());
                if let Err(e) = consumer.unassign() {
                    log::error!("unassigning: {e}");
                }
            }
        }
    }
}

impl Ctx {
    fn assign(
        &self,
        consumer: &BaseConsumer<Self>,
        shared: &mut Shared,
        tpl: &TopicPartitionList,
    ) -> Result<()> {
        let mut by_partition: BTreeMap<i32, BTreeSet<String>> = BTreeMap::new();
        for e in tpl.elements() {
            by_partition
                .entry(e.partition())
                .or_default()
                .insert(e.topic().to_owned());
        }
        let all: BTreeSet<String> = self.inputs.iter().cloned().collect();
        for (p, topics) in &by_partition {
            if *topics != all {
                return Err(Error::Rebalance(format!(
                    "partition {p} was assigned for {topics:?} only; every input topic's \
                     partition {p} must go to one instance (partition.assignment.strategy=range, \
                     same partition count everywhere)"
                )));
            }
        }
        shared.tasks.clear();
        self.telemetry
            .assigned(&by_partition.keys().copied().collect());
        let mut assignment = TopicPartitionList::new();
        for &p in by_partition.keys() {
            let started = Instant::now();
            let (task, report) = self.claim.take(p)?;
            shared.claims += 1;
            log::info!(
                "partition {p}: owner epoch {} claimed in {:.0?} (local state {}, {} rows \
                 restored, {} outbox records resent, {} stale outbox records dropped, {} fenced \
                 rows skipped, {} rows of a torn last batch dropped, {} rows to write again \
                 over fenced or torn ones)",
                report.owner_epoch,
                started.elapsed(),
                if report.reused_local_state {
                    "reused"
                } else {
                    "rebuilt"
                },
                report.restored_rows,
                report.resent,
                report.dropped,
                report.fenced_rows,
                report.torn_rows,
                report.rewritten,
            );
            for topic in &self.inputs {
                let offset = self.broker.resume_offset(task.stored_offset(topic)?);
                assignment.add_partition_offset(topic, p, offset)?;
            }
            shared.tasks.insert(p, task);
        }
        consumer.assign(&assignment)?;
        Ok(())
    }
}

/// Pauses the fetching of the input partitions in `want` not paused yet and resumes the paused
/// ones no longer in it (see `Intake::lanes_to_pause`). A failure is logged and tried again at
/// the next batch; meanwhile the intake is bounded only by librdkafka's own prefetch limits.
fn sync_pauses<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    paused: &mut BTreeSet<(String, i32)>,
    want: BTreeSet<(String, i32)>,
) {
    let list = |set: &BTreeSet<(String, i32)>| {
        let mut tpl = TopicPartitionList::new();
        for (topic, p) in set {
            tpl.add_partition(topic, *p);
        }
        tpl
    };
    let pause: BTreeSet<(String, i32)> = want.difference(paused).cloned().collect();
    let resume: BTreeSet<(String, i32)> = paused.difference(&want).cloned().collect();
    if !pause.is_empty() {
        match consumer.pause(&list(&pause)) {
            Ok(()) => {
                log::info!(
                    "pausing {pause:?}: their partitions wait for another input topic to catch \
                     up, and the read-ahead bound is reached"
                );
                paused.extend(pause);
            }
            Err(e) => log::warn!("pausing {pause:?}: {e}"),
        }
    }
    if !resume.is_empty() {
        match consumer.resume(&list(&resume)) {
            Ok(()) => {
                log::info!("resuming {resume:?}");
                for r in &resume {
                    paused.remove(r);
                }
            }
            Err(e) => log::warn!("resuming {resume:?}: {e}"),
        }
    }
}

/// Where each owned input partition's reading starts: `(topic, partition, stored offset)`.
fn starts(
    tasks: &BTreeMap<i32, PartitionTask>,
    inputs: &[String],
) -> Result<Vec<(String, i32, Option<i64>)>> {
    let mut starts = Vec::with_capacity(tasks.len() * inputs.len());
    for (&p, task) in tasks {
        for topic in inputs {
            starts.push((topic.clone(), p, task.stored_offset(topic)?));
        }
    }
    Ok(starts)
}

/// The input partitions that start behind the end of their log, with that end, for the intake
/// to merge their topics by time while it catches up (see [`Intake`]). One watermark request
/// per input partition; one that fails leaves its partition unordered, with a warning.
fn catch_up_ends<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    starts: Vec<(String, i32, Option<i64>)>,
) -> Vec<(String, i32, i64, i64)> {
    let mut ends = Vec::new();
    for (topic, p, stored) in starts {
        match consumer.fetch_watermarks(&topic, p, WATERMARK_TIMEOUT) {
            Ok((low, high)) => {
                let start = stored.unwrap_or(low).max(low);
                if start < high {
                    ends.push((topic, p, start, high));
                }
            }
            Err(e) => log::warn!(
                "{topic} partition {p}: its end is unknown ({e}); its catch-up is decided in \
                 arrival order, not merged by time with the partition's other topics"
            ),
        }
    }
    ends
}

/// Why offsets `expected..` of an input partition never reached the consumer, as far as the
/// broker tells (see `gap_cause`).
fn explain_gap<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
    partition: i32,
    expected: i64,
) -> String {
    let low = consumer
        .fetch_watermarks(topic, partition, Duration::from_secs(10))
        .map(|(low, _)| low);
    gap_cause(low, expected)
}

/// The cause of a hole at `expected` given the partition's log start `low`: deleted by
/// retention (the log now starts later), or present in the log and still not delivered:
/// transaction markers and aborted records, which a read-committed consumer never sees (the
/// inputs take non-transactional producers: idempotent ones are fine), or a broker that
/// skipped records. Either way the inputs there were not decided, and the processor does not
/// guess which.
fn gap_cause(low: Result<i64, rdkafka::error::KafkaError>, expected: i64) -> String {
    match low {
        Ok(low) if low > expected => format!(
            "offsets {expected} to {} were deleted by the topic's retention before they were \
             decided: raise retention.ms on the input topics above the longest outage",
            low - 1
        ),
        Ok(low) => format!(
            "the log starts at {low}, so the missing offsets are in it: transaction markers or \
             aborted records of a transactional producer (write the inputs with \
             non-transactional producers), or records the broker skipped"
        ),
        Err(e) => format!("the broker's log start could not be read: {e}"),
    }
}

/// Marks done, in each task still owned, what the completed batches sealed. Returns where
/// another writer's records sit among a task's own on the changelog: (partition, from, until).
fn acknowledge(
    shared: &mut Shared,
    done: Vec<Done>,
    names: &Names,
    telemetry: &Telemetry,
) -> Vec<(i32, i64, i64)> {
    let changelog = names.changelog();
    let mut foreign = Vec::new();
    for batch in done {
        for &(p, row) in &batch.rows {
            telemetry.outbox_backlog.set(&[&p.to_string()], 0.0);
            // The task may have been revoked meanwhile: its next owner resends.
            if let Some(task) = shared.tasks.get_mut(&p)
                && let Some((from, until)) =
                    task.acknowledged(row, batch.changelog.span(&changelog, p))
            {
                foreign.push((p, from, until));
            }
        }
    }
    foreign
}

/// Has each task write again, with its next batch, the keys a fenced owner (a zombie that has
/// not heard of the takeover yet) wrote among its changelog records: on the compacted
/// changelog the zombie's rows would otherwise outlive this owner's (see
/// `PartitionTask::rewrite_rows`).
fn rewrite_fenced(shared: &mut Shared, claim: &Claim, foreign: Vec<(i32, i64, i64)>) -> Result<()> {
    for (p, from, until) in foreign {
        let Some(task) = shared.tasks.get_mut(&p) else {
            continue;
        };
        let keys = claim.fenced_rows(p, task.owner_epoch(), from, until)?;
        if keys.is_empty() {
            continue;
        }
        let staged = task.rewrite_rows(&keys)?;
        log::warn!(
            "partition {p}: a fenced owner wrote {} rows among this owner's changelog records \
             (offsets {from} to {until}); writing this owner's values of {staged} of those keys \
             again",
            keys.len()
        );
    }
    Ok(())
}

/// Has every owned task that changed since its last checkpoint journal one now, and sends
/// those (see `PartitionTask::seal_closing_checkpoint`): an instance that stops or loses its
/// partitions leaves a journal that a replay verifies up to its last change. Returns the
/// records sent.
fn send_closing_checkpoints(shared: &mut Shared, producer: &Producer, now: i64) -> Result<usize> {
    let mut sealed = Vec::new();
    for (&p, task) in &mut shared.tasks {
        let outbox = task.seal_closing_checkpoint(now)?;
        if !outbox.records.is_empty() {
            sealed.push((p, outbox));
        }
    }
    if sealed.is_empty() {
        return Ok(0);
    }
    // Sealed durably: nothing to sync first.
    Ok(shared.flights.send(producer, sealed, Vec::new())?)
}

/// Commits every owned task's next offsets to the group (monitoring only: the offsets that
/// count are stored with each task's state). A failure is logged, not fatal.
fn commit_group_offsets(
    consumer: &BaseConsumer<Ctx>,
    shared: &Mutex<Shared>,
    mode: CommitMode,
) -> Result<()> {
    let guard = lock(shared);
    let mut tpl = TopicPartitionList::new();
    for (&p, task) in &guard.tasks {
        for (topic, offset) in task.positions()? {
            tpl.add_partition_offset(&topic, p, Offset::Offset(offset))?;
        }
    }
    drop(guard);
    if tpl.count() > 0
        && let Err(e) = consumer.commit(&tpl, mode)
    {
        log::debug!("committing group offsets (monitoring only): {e}");
    }
    Ok(())
}

fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    // A panic while holding the lock ends the process anyway; the data is still consistent
    // because tasks only change through sealed batches.
    shared
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Runs one processor instance until `shutdown` is set (then finishes the batch, flushes the
/// outbox and leaves the group) or a fatal error, with its telemetry endpoint on
/// `telemetry.listen` when that is set.
pub fn run(config: &Config, core: Arc<Core>, shutdown: Arc<AtomicBool>) -> Result<Summary> {
    let telemetry = Arc::new(Telemetry::new(Duration::from_millis(
        config.telemetry.stall_after_ms,
    )));
    let _endpoint = match config.telemetry.listen.trim() {
        "" => None,
        listen => Some(server::Server::start(
            listen,
            telemetry.registry.clone(),
            telemetry.clone(),
        )?),
    };
    run_with(config, core, shutdown, telemetry)
}

/// [`run`], recording into `telemetry` (whose endpoint, if any, the caller serves).
pub fn run_with(
    config: &Config,
    core: Arc<Core>,
    shutdown: Arc<AtomicBool>,
    telemetry: Arc<Telemetry>,
) -> Result<Summary> {
    telemetry.beat();
    let result = run_loop(config, core, shutdown, &telemetry);
    match &result {
        Ok(_) => telemetry.stopping(),
        Err(e) => telemetry.failed(e.to_string()),
    }
    result
}

fn run_loop(
    config: &Config,
    core: Arc<Core>,
    shutdown: Arc<AtomicBool>,
    telemetry: &Arc<Telemetry>,
) -> Result<Summary> {
    let names = Names::new(&config.topics.prefix);
    // With a schema registry, the ids of every registered version of the inputs' schemas (and
    // the outputs'), so that Confluent-framed inputs are read; a missing subject stops here.
    let schema_ids = schema_registry::configured_ids(config, &schema_registry::subjects(&names))
        .map_err(Error::SchemaRegistry)?;
    let output_framing = config.schema_registry.framing.framing();
    let connectors: BTreeSet<String> = core
        .registry()
        .tools()
        .map(|t| t.connector.clone())
        .collect();
    let mut output_topics = vec![
        names.decisions(),
        names.journal(),
        names.changelog(),
        names.dlq(),
    ];
    output_topics.extend(connectors.iter().map(|c| names.dispatch(c)));
    // Without a receipt key nothing is written there: a cluster may lack the topic.
    if core.receipt_key().is_some() {
        output_topics.push(names.receipts());
    }
    let inputs = vec![
        names.proposals(),
        names.approvals(),
        names.outcomes(),
        names.control(),
    ];
    let admin: rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> =
        config.client_config().create()?;
    let partitions = topics::partition_counts(&admin, Duration::from_secs(30))?;
    let mut mismatched: Vec<(String, i32)> = Vec::new();
    for topic in inputs.iter().chain(&output_topics) {
        match partitions.get(topic) {
            Some(n) if *n == config.topics.partitions => {}
            Some(n) => mismatched.push((topic.clone(), *n)),
            None => mismatched.push((topic.clone(), 0)),
        }
    }
    if !mismatched.is_empty() {
        return Err(topics::Error::NotCopartitioned {
            expected: config.topics.partitions,
            mismatched,
        }
        .into());
    }
    topics::check_message_limits(
        &admin,
        &output_topics,
        config.kafka.max_message_bytes,
        Duration::from_secs(30),
    )?;
    drop(admin);

    let instance = config.instance();
    let producer = Arc::new(Producer::new(
        &config.client_config(),
        config.processor.linger_ms,
    )?);
    let mut reader_config = config.client_config();
    reader_config
        .set("group.id", format!("{}-restore", config.group_id()))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        // Claims read short ranges: do not let the broker hold a fetch for its default 500 ms.
        .set("fetch.wait.max.ms", "20");
    let reader: BaseConsumer = reader_config.create()?;
    let claim = Arc::new(Claim {
        core: core.clone(),
        names: names.clone(),
        codec: Codec::new()
            .with_max_payload_bytes(config.kafka.max_payload_bytes())
            .with_schema_ids(schema_ids),
        output_framing,
        partitions: config.topics.partitions,
        output_topics,
        state_dir: config.state.dir.clone(),
        rocks: config.state.rocks(),
        producer: producer.clone(),
        reader,
        instance: instance.clone(),
        stall_timeout: Duration::from_millis(config.processor.claim_stall_timeout_ms),
        telemetry: telemetry.clone(),
    });
    let shared = Arc::new(Mutex::new(Shared {
        tasks: BTreeMap::new(),
        flights: Flights::with_sender(producer.clone())?,
        fatal: None,
        rejoin: Rejoin::default(),
        claims: 0,
        generation: 0,
    }));
    let ctx = Ctx {
        shared: shared.clone(),
        claim: claim.clone(),
        inputs: inputs.clone(),
        broker: config.kafka.compatibility,
        telemetry: telemetry.clone(),
    };
    let mut consumer_config = config.client_config();
    consumer_config
        .set("group.id", config.group_id())
        .set("client.id", &instance)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("partition.assignment.strategy", "range")
        .set(
            "session.timeout.ms",
            config.processor.session_timeout_ms.to_string(),
        )
        .set(
            "max.poll.interval.ms",
            config.processor.max_poll_interval_ms.to_string(),
        )
        .set(
            "heartbeat.interval.ms",
            (config.processor.session_timeout_ms / 4)
                .max(250)
                .to_string(),
        )
        .set("enable.partition.eof", "false")
        .set(
            "statistics.interval.ms",
            LAG_INTERVAL.as_millis().to_string(),
        );
    config
        .kafka
        .fetch_wait(&mut consumer_config, config.batch.flush_interval_ms);
    // No static membership (group.instance.id): see `compat`.
    let consumer: BaseConsumer<Ctx> = consumer_config.create_with_context(ctx)?;
    let topic_refs: Vec<&str> = inputs.iter().map(String::as_str).collect();
    consumer.subscribe(&topic_refs)?;
    log::info!(
        "instance {instance}: consuming {topic_refs:?} in group {} ({} partitions)",
        config.group_id(),
        config.topics.partitions
    );

    let sources: BTreeMap<&str, Source> =
        inputs.iter().map(String::as_str).zip(Source::ALL).collect();
    let mut summary = Summary::default();
    let mut last_report = Instant::now();
    let mut intake = Intake::default();
    // Input partitions whose fetching the intake asked to pause (`Intake::lanes_to_pause`).
    let mut paused: BTreeSet<(String, i32)> = BTreeSet::new();
    let mut generation = lock(&shared).generation;
    let mut uncommitted = false;
    let mut last_group_commit = Instant::now();

    while !shutdown.load(Ordering::Relaxed) {
        telemetry.beat();
        if lock(&shared).rejoin.due() {
            log::info!("instance {instance}: joining the group again");
            consumer.unsubscribe();
            consumer.subscribe(&topic_refs)?;
        }
        // 1. Collect a batch: up to `batch.max_records` of every owned partition.
        let owned = lock(&shared).tasks.len();
        let per_partition = config.batch.max_records;
        let mut first = (!intake.is_empty()).then(Instant::now);
        while !intake.is_full(owned, per_partition) {
            let Some(timeout) = config.batch.poll_timeout(first) else {
                break;
            };
            let polled = consumer.poll(timeout);
            intake.polled();
            let Some(polled) = polled else {
                break;
            };
            let reassigned = {
                let mut guard = lock(&shared);
                if let Some(e) = guard.fatal.take() {
                    return Err(e);
                }
                // A rebalance inside this poll positioned every owned partition at its stored
                // offsets: what was read before is fetched again.
                if guard.generation != generation {
                    generation = guard.generation;
                    intake.clear();
                    Some(starts(&guard.tasks, &inputs)?)
                } else {
                    None
                }
            };
            if let Some(starts) = reassigned {
                // The new assignment starts unpaused.
                paused.clear();
                if config.kafka.compatibility.high_watermark_is_end() {
                    intake.catch_up(catch_up_ends(&consumer, starts));
                }
            }
            match polled {
                Ok(m) if sources.contains_key(m.topic()) => {
                    first.get_or_insert_with(Instant::now);
                    intake.push(m);
                }
                Ok(_) => {}
                // librdkafka raises a fatal error only for what it cannot go on from.
                Err(e) if e.rdkafka_error_code() == Some(RDKafkaErrorCode::Fatal) => {
                    return Err(e.into());
                }
                Err(e) => telemetry.consumer_error(&e),
            }
        }
        if let Some(e) = lock(&shared).fatal.take() {
            return Err(e);
        }
        sync_pauses(
            &consumer,
            &mut paused,
            intake.lanes_to_pause(owned, per_partition),
        );
        let records = intake.take(per_partition);
        if log::log_enabled!(log::Level::Debug) && !records.is_empty() {
            let wall = wall_ms();
            let ages: Vec<i64> = records
                .iter()
                .filter_map(|m| m.timestamp().to_millis())
                .map(|t| wall - t)
                .collect();
            log::debug!(
                "batch start: {} records, age {}..{} ms, {} waiting",
                records.len(),
                ages.iter().min().unwrap_or(&0),
                ages.iter().max().unwrap_or(&0),
                intake.len()
            );
        }

        // 2-3. Decide, fire timers, checkpoint, seal: each partition on one thread.
        let t_decided = Instant::now();
        let now = wall_ms();
        let mut out = Vec::new();
        let mut unsynced = Vec::new();
        let mut observed = Vec::new();
        let mut handled = 0;
        let mut consumed = 0;
        {
            let mut guard = lock(&shared);
            let settings = decide::Settings::of(&config.processor, now);
            let decided = match decide::decide_batch(&mut guard.tasks, records, &sources, settings)
            {
                Err(Error::Gap {
                    topic,
                    partition,
                    expected,
                    got,
                    ..
                }) => {
                    let why = explain_gap(&consumer, &topic, partition, expected);
                    return Err(Error::Gap {
                        topic,
                        partition,
                        expected,
                        got,
                        why,
                    });
                }
                other => other?,
            };
            for d in decided {
                handled += d.handled;
                consumed += d.consumed;
                observed.push(d.observed);
                if !d.sealed.records.is_empty() {
                    telemetry
                        .outbox_backlog
                        .set(&[&d.partition.to_string()], d.sealed.records.len() as f64);
                    out.push((d.partition, d.sealed));
                    // A seal without records owes no sync of its own: the next one that has
                    // records syncs the same log, this write included.
                    unsynced.extend(d.unsynced);
                }
            }
        }

        let t_sealed = Instant::now();
        // 4. Send; mark done what the broker acknowledged.
        {
            let mut guard = lock(&shared);
            if !out.is_empty() {
                let records = guard.flights.send(&producer, out, unsynced)?;
                summary.produced += records as u64;
                telemetry.produced.add(&[], records as u64);
            }
            let done = guard
                .flights
                .advance(&producer, config.batch.max_in_flight)?;
            let foreign = acknowledge(&mut guard, done, &names, telemetry);
            rewrite_fenced(&mut guard, &claim, foreign)?;
            // Monitoring reads the state after the outputs left, never before.
            for (&p, task) in &guard.tasks {
                telemetry.scan_outstanding(p, task.store(), now, handled > 0);
            }
        }
        if handled > 0 {
            log::debug!(
                "batch of {handled} inputs: sealed in {:?}, sent in {:?}, {} batches in flight",
                t_sealed - t_decided,
                t_sealed.elapsed(),
                lock(&shared).flights.len()
            );
        }
        summary.batches += u64::from(handled > 0);
        summary.inputs += handled as u64;
        telemetry.batches.add(&[], u64::from(handled > 0));
        let acked_at = wall_ms();
        for o in &observed {
            telemetry.record(o, acked_at);
        }

        // 5. Group offsets, for lag monitoring only: at most once per `LAG_INTERVAL` (one
        // commit per batch cost the broker an offset commit every few milliseconds).
        // Ticks too: else the group's lag would count them forever on an idle topic.
        uncommitted |= consumed > 0;
        if uncommitted && last_group_commit.elapsed() >= LAG_INTERVAL {
            commit_group_offsets(&consumer, &shared, CommitMode::Async)?;
            uncommitted = false;
            last_group_commit = Instant::now();
        }
        if last_report.elapsed() >= Duration::from_secs(10) {
            last_report = Instant::now();
            let guard = lock(&shared);
            let owned: Vec<i32> = guard.tasks.keys().copied().collect();
            log::info!(
                "instance {instance}: partitions {owned:?}, {} inputs in {} batches, {} records produced",
                summary.inputs,
                summary.batches,
                summary.produced
            );
        }
    }

    // Graceful stop: journal the checkpoints owed, wait for every batch in flight, commit the
    // acknowledgements, then leave the group.
    log::info!("instance {instance}: stopping");
    telemetry.stopping();
    {
        let mut guard = lock(&shared);
        let records = send_closing_checkpoints(&mut guard, &producer, wall_ms())?;
        summary.produced += records as u64;
        telemetry.produced.add(&[], records as u64);
        let done = guard.flights.advance(&producer, 0)?;
        // A fenced owner's rows found now are left to the next claim, which finds them after
        // the store's known changelog end (they froze it) and writes those keys again.
        acknowledge(&mut guard, done, &names, telemetry);
        for task in guard.tasks.values_mut() {
            task.commit_bookkeeping(wall_ms())?;
            summary.dead_lettered += task.counters.dead_lettered;
        }
        summary.claims = guard.claims;
    }
    if uncommitted {
        // Sync: the consumer closes right after.
        commit_group_offsets(&consumer, &shared, CommitMode::Sync)?;
    }
    // Read ahead, never decided: the next owner reads them from the stored offsets.
    drop(intake);
    consumer.unsubscribe();
    drop(consumer);
    producer.flush(Duration::from_secs(30))?;
    log::info!("instance {instance}: stopped ({summary:?})");
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::error::KafkaError;

    #[test]
    fn a_gap_names_retention_when_the_log_starts_past_it() {
        let why = gap_cause(Ok(40), 12);
        assert!(
            why.contains("offsets 12 to 39 were deleted by the topic's retention"),
            "{why}"
        );
    }

    #[test]
    fn a_gap_inside_the_log_names_transactions_or_the_broker() {
        for low in [0, 12] {
            let why = gap_cause(Ok(low), 12);
            assert!(why.contains(&format!("the log starts at {low}")), "{why}");
            assert!(why.contains("transaction markers"), "{why}");
        }
    }

    #[test]
    fn a_gap_whose_log_start_is_unknown_says_so() {
        let why = gap_cause(
            Err(KafkaError::MetadataFetch(
                RDKafkaErrorCode::BrokerTransportFailure,
            )),
            3,
        );
        assert!(
            why.starts_with("the broker's log start could not be read"),
            "{why}"
        );
    }
}
