//! `airlock-connector`: one worker of a connector's consumer group over
//! `<prefix>dispatch.<connector>` (range assignor, the processor's partition count).
//!
//! On gaining a partition the worker rebuilds the attempts started there from the outcomes
//! partition (`started`), reads the group's committed offset, and reads the dispatch partition
//! from its beginning: records before the committed offset only teach the fence filter the
//! owner-epoch markers (fence 1 needs the highest marker, wherever it is); records from the
//! committed offset on are handled in batches of up to `connector.max_in_flight` (`handle`:
//! started together, committed together, called concurrently). On losing a partition its state
//! is dropped. A claim that fails transiently (a broker down, a leader moving) does not stop
//! the worker: it drops the assignment, leaves the group and joins again after a pause that
//! doubles with each failure in a row (2 s to 30 s); only fatal errors stop it. SIGTERM and
//! SIGINT stop reading; every command started is still called and reported (each call bounded
//! by its timeout), then the worker leaves the group.
//!
//! Metrics, liveness and readiness (`telemetry`) are served on `telemetry.listen` when set.

use std::cell::RefCell;
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, mpsc};
use std::time::Duration;

use airlock_processor::runtime::produce::{self, Producer};
use airlock_processor::runtime::rejoin::Rejoin;
use airlock_processor::runtime::topics::{self, Names};
use airlock_processor::runtime::wire::{self, Admit, BARRIER_KIND, FenceFilter, header};
use airlock_processor::telemetry::server::{self, Server};
use airlock_schemas::{Codec, OutcomeKind};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::message::{BorrowedMessage, Headers};
use rdkafka::types::{RDKafkaErrorCode, RDKafkaRespErr};
use rdkafka::{ClientContext, Message, Offset, TopicPartitionList};

use super::check::Checker;
use super::config::{self, Config};
use super::handle::{self, Ended, Finished, Handled, Handler, Job, Record, Step};
use super::report::{Reporter, Source};
use super::started::{self, Started};
use super::telemetry::Telemetry;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] config::Error),
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error(transparent)]
    Topics(#[from] topics::Error),
    #[error(transparent)]
    Produce(#[from] produce::Error),
    #[error(transparent)]
    Rebuild(#[from] started::Error),
    #[error(transparent)]
    Telemetry(#[from] server::Error),
    #[error("starting the HTTP runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error(transparent)]
    Call(#[from] handle::Failed),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// True when a claim that failed with this error may succeed if tried again later.
    fn is_transient(&self) -> bool {
        match self {
            Error::Kafka(e) => airlock_processor::runtime::scan::transient(e),
            Error::Rebuild(e) => e.is_transient(),
            _ => false,
        }
    }
}

/// What a worker did, reported when it stops.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub commands: u64,
    pub committed: u64,
    pub failed: u64,
    pub unknown: u64,
    pub reconciled: u64,
    pub dead_lettered: u64,
    pub duplicates: u64,
    pub fenced: u64,
    pub abandoned: u64,
}

impl Summary {
    fn count(&mut self, handled: Handled) {
        self.commands += 1;
        match handled {
            Handled::DeadLettered => self.dead_lettered += 1,
            Handled::Duplicate => self.duplicates += 1,
            Handled::Fenced => self.fenced += 1,
            Handled::Abandoned => self.abandoned += 1,
            Handled::Executed(OutcomeKind::Committed) => self.committed += 1,
            Handled::Executed(OutcomeKind::Failed) => self.failed += 1,
            Handled::Executed(_) => self.unknown += 1,
            Handled::Reconciled(_) => self.reconciled += 1,
        }
    }
}

/// One owned dispatch partition.
#[derive(Debug)]
struct Owned {
    /// Records below this offset were handled (the group's committed offset, then progress).
    next: i64,
    started: Started,
}

struct Shared {
    owned: BTreeMap<i32, Owned>,
    fatal: Option<Error>,
    /// Counts rebalances: a batch gathered across one is dropped.
    generation: u64,
    /// After a claim failed transiently the worker owns nothing, leaves its group and joins
    /// again after a pause, so that the partitions are assigned anew.
    rejoin: Rejoin,
}

struct Ctx {
    shared: Arc<Mutex<Shared>>,
    /// Reads outcomes and the group's committed offsets; never joins the group.
    reader: BaseConsumer,
    producer: Arc<Producer>,
    dispatch: String,
    outcomes: String,
    connector: String,
    /// How long a claim may wait for the outcomes partition without progress: below the
    /// group's max.poll.interval.ms, since the claim runs inside the rebalance callback.
    claim_stall: Duration,
    telemetry: Arc<Telemetry>,
}

impl ClientContext for Ctx {}

impl ConsumerContext for Ctx {
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        let mut shared = lock(&self.shared);
        shared.generation += 1;
        match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                match self.assign(consumer, &mut shared, tpl) {
                    Ok(()) => shared.rejoin.claimed(),
                    Err(e) if e.is_transient() => {
                        let pause = shared.rejoin.failed();
                        log::error!(
                            "taking partitions: {e}; leaving the group, joining again in {pause:?}"
                        );
                    }
                    Err(e) => {
                        log::error!("taking partitions: {e}");
                        shared.fatal.get_or_insert(e);
                    }
                }
                if shared.fatal.is_some() || shared.rejoin.pending() {
                    shared.owned.clear();
                    self.owned(&shared);
                    if let Err(e) = consumer.assign(&TopicPartitionList::new()) {
                        log::error!("releasing the assignment: {e}");
                    }
                }
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                let revoked: BTreeSet<i32> = tpl.elements().iter().map(|e| e.partition()).collect();
                log::info!("partitions {revoked:?} revoked");
                shared.owned.clear();
                self.owned(&shared);
                if let Err(e) = consumer.unassign() {
                    log::error!("unassigning: {e}");
                }
            }
            other => {
                log::error!("rebalance error {other:?}: dropping every partition");
                shared.owned.clear();
                self.owned(&shared);
                if let Err(e) = consumer.unassign() {
                    log::error!("unassigning: {e}");
                }
            }
        }
    }
}

impl Ctx {
    /// Tells the telemetry what is owned now (after a revocation: nothing).
    fn owned(&self, shared: &Shared) {
        let owned: BTreeSet<i32> = shared.owned.keys().copied().collect();
        self.telemetry.health.assigned(&owned);
        self.telemetry.partitions_owned.set(&[], owned.len() as f64);
    }

    fn assign(
        &self,
        consumer: &BaseConsumer<Self>,
        shared: &mut Shared,
        tpl: &TopicPartitionList,
    ) -> Result<()> {
        let partitions: BTreeSet<i32> = tpl.elements().iter().map(|e| e.partition()).collect();
        let mut wanted = TopicPartitionList::new();
        for &p in &partitions {
            wanted.add_partition(&self.dispatch, p);
        }
        let committed = self
            .reader
            .committed_offsets(wanted, Duration::from_secs(30))?;
        shared.owned.clear();
        self.telemetry.health.assigned(&partitions);
        self.telemetry.partitions_owned.set(&[], 0.0);
        let mut assignment = TopicPartitionList::new();
        for &p in &partitions {
            self.telemetry.health.claim_started(p);
            let rebuilt = started::rebuild(
                &self.reader,
                &self.producer,
                &self.outcomes,
                p,
                &self.connector,
                self.claim_stall,
            );
            self.telemetry.health.claim_ended(p, rebuilt.is_ok());
            let (started, report) = rebuilt?;
            self.telemetry.partitions_owned.add(&[], 1.0);
            let next = committed
                .find_partition(&self.dispatch, p)
                .and_then(|e| match e.offset() {
                    Offset::Offset(o) => Some(o),
                    _ => None,
                })
                .unwrap_or(0);
            log::info!(
                "partition {p}: {} started attempts rebuilt from {} offsets {}..{} ({} outcomes \
                 read); handling dispatch commands from offset {next}",
                started.len(),
                self.outcomes,
                report.from,
                report.end,
                report.outcomes
            );
            // From the beginning: the fence markers before `next` still count.
            assignment.add_partition_offset(&self.dispatch, p, Offset::Beginning)?;
            shared.owned.insert(p, Owned { next, started });
        }
        consumer.assign(&assignment)?;
        Ok(())
    }
}

/// The runtime of the calls, shut down when dropped: the worker's calls stop with it (on a
/// clean stop none is left; on a fatal error they are cut like a crash would cut them).
struct CallRuntime(Option<tokio::runtime::Runtime>);

impl Drop for CallRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_timeout(Duration::from_secs(5));
        }
    }
}

/// The commands started and not yet reported: at most `max`, those waiting for an earlier
/// command of their operation key included.
struct Running {
    max: usize,
    count: usize,
    /// Per operation key with a command running, those read after it and waiting for it.
    waiting: HashMap<String, VecDeque<Job>>,
    ended_tx: mpsc::Sender<Ended>,
    ended_rx: mpsc::Receiver<Ended>,
}

impl Running {
    fn new(max: usize) -> Self {
        let (ended_tx, ended_rx) = mpsc::channel();
        Running {
            max,
            count: 0,
            waiting: HashMap::new(),
            ended_tx,
            ended_rx,
        }
    }

    fn free(&self) -> usize {
        self.max.saturating_sub(self.count)
    }

    /// Runs `job` now, or after the command of its key that runs already.
    fn start(&mut self, handler: &Arc<Handler>, job: Job) {
        self.count += 1;
        match self.waiting.entry(job.operation_key().to_owned()) {
            Entry::Occupied(mut waiting) => waiting.get_mut().push_back(job),
            Entry::Vacant(slot) => {
                slot.insert(VecDeque::new());
                handler.spawn(job, self.ended_tx.clone());
            }
        }
    }

    /// The next command that ended, waiting at most `wait` for one; the next one of its key
    /// starts.
    fn ended(
        &mut self,
        handler: &Arc<Handler>,
        wait: Duration,
    ) -> Option<Result<Finished, handle::Failed>> {
        let ended = if wait.is_zero() {
            self.ended_rx.try_recv().ok()?
        } else {
            self.ended_rx.recv_timeout(wait).ok()?
        };
        self.count -= 1;
        if let Entry::Occupied(mut waiting) = self.waiting.entry(ended.operation_key) {
            match waiting.get_mut().pop_front() {
                Some(next) => handler.spawn(next, self.ended_tx.clone()),
                None => {
                    waiting.remove();
                }
            }
        }
        Some(ended.result)
    }
}

fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    shared
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Runs one worker until `shutdown` is set or a fatal error, with its telemetry endpoint on
/// `telemetry.listen` when that is set.
pub fn run(config: &Config, shutdown: Arc<AtomicBool>) -> Result<Summary> {
    let telemetry = Arc::new(Telemetry::new(Duration::from_millis(
        config.telemetry.stall_after_ms,
    )));
    let _endpoint = match config.telemetry.listen.trim() {
        "" => None,
        listen => Some(Server::start(
            listen,
            telemetry.registry.clone(),
            telemetry.clone(),
        )?),
    };
    run_with(config, shutdown, telemetry)
}

/// [`run`], recording into `telemetry` (whose endpoint, if any, the caller serves).
pub fn run_with(
    config: &Config,
    shutdown: Arc<AtomicBool>,
    telemetry: Arc<Telemetry>,
) -> Result<Summary> {
    telemetry.health.beat();
    let result = run_loop(config, shutdown, &telemetry);
    match &result {
        Ok(_) => telemetry.health.stopping(),
        Err(e) => telemetry.health.failed(e.to_string()),
    }
    result
}

fn run_loop(
    config: &Config,
    shutdown: Arc<AtomicBool>,
    telemetry: &Arc<Telemetry>,
) -> Result<Summary> {
    let names = Names::new(&config.topics.prefix);
    let dispatch = names.dispatch(&config.connector.name);
    let worker_id = config.worker_id();
    let keys = config.verifying_keys()?;
    let http = config.http_connector()?;

    let admin: rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> =
        config.client_config().create()?;
    let counts = topics::partition_counts(&admin, Duration::from_secs(30))?;
    drop(admin);
    let mismatched: Vec<(String, i32)> = [dispatch.clone(), names.outcomes(), names.dlq()]
        .into_iter()
        .filter_map(|t| match counts.get(&t) {
            Some(n) if *n == config.topics.partitions => None,
            Some(n) => Some((t, *n)),
            None => Some((t, 0)),
        })
        .collect();
    if !mismatched.is_empty() {
        return Err(topics::Error::NotCopartitioned {
            expected: config.topics.partitions,
            mismatched,
        }
        .into());
    }

    let producer = Arc::new(Producer::new(&config.client_config(), 0)?);
    let mut reader_config = config.client_config();
    reader_config
        .set("group.id", config.group_id())
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .set("fetch.wait.max.ms", "20");
    let reader: BaseConsumer = reader_config.create()?;
    let shared = Arc::new(Mutex::new(Shared {
        owned: BTreeMap::new(),
        fatal: None,
        generation: 0,
        rejoin: Rejoin::default(),
    }));
    let ctx = Ctx {
        shared: shared.clone(),
        reader,
        producer: producer.clone(),
        dispatch: dispatch.clone(),
        outcomes: names.outcomes(),
        connector: config.connector.name.clone(),
        claim_stall: Duration::from_millis(config.connector.max_poll_interval_ms / 2)
            .min(Duration::from_secs(60)),
        telemetry: telemetry.clone(),
    };
    let c = &config.connector;
    let mut consumer_config = config.client_config();
    consumer_config
        .set("group.id", config.group_id())
        .set("client.id", &worker_id)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("partition.assignment.strategy", "range")
        .set("session.timeout.ms", c.session_timeout_ms.to_string())
        .set("max.poll.interval.ms", c.max_poll_interval_ms.to_string())
        .set(
            "heartbeat.interval.ms",
            (c.session_timeout_ms / 4).max(250).to_string(),
        )
        .set("enable.partition.eof", "false");
    // A dispatch command waits in no batch: on a broker that holds every fetch for its whole
    // wait, keep that wait short (`compat::Broker::fetch_wait_ms` of a 20 ms interval: 5 ms).
    config.kafka.fetch_wait(&mut consumer_config, 20);
    let consumer: BaseConsumer<Ctx> = consumer_config.create_with_context(ctx)?;
    consumer.subscribe(&[dispatch.as_str()])?;

    // The calls wait on the network, not the CPU: two threads drive every one in flight.
    let calls = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("airlock-calls")
        .enable_all()
        .build()
        .map_err(Error::Runtime)?;
    let handler = Arc::new(Handler {
        checker: Checker {
            connector: c.name.clone(),
            partitions: config.topics.partitions,
            keys,
            allow_unsigned: config.capability.allow_unsigned,
            codec: Codec::new(),
        },
        reporter: Reporter {
            names: names.clone(),
            connector: c.name.clone(),
            worker_id: worker_id.clone(),
            codec: Codec::new(),
            signing_key: config.signing_key()?.map(Arc::new),
        },
        http,
        producer: producer.clone(),
        runtime: calls.handle().clone(),
        reserve_ms: c.reserve_ms as i64,
        reconcile_timeout: Duration::from_millis(c.reconcile_timeout_ms),
        telemetry: telemetry.clone(),
    });
    // Declared after the handler, so dropped before it on every way out: the calls' tasks
    // stop while this function still holds the handler (a task must never drop the last
    // reference, whose producer owns a runtime of its own).
    let _calls = CallRuntime(Some(calls));
    if config.capability.allow_unsigned {
        log::warn!("allow_unsigned = true: commands without a capability are executed");
    }
    log::info!(
        "worker {worker_id}: connector {} consuming {dispatch} in group {} ({} trusted keys, tools {:?})",
        c.name,
        config.group_id(),
        handler.checker.keys.len(),
        handler.http.tools().collect::<Vec<_>>()
    );

    let mut filter = FenceFilter::default();
    let summary = RefCell::new(Summary::default());
    let count = |handled: Handled| {
        summary.borrow_mut().count(handled);
        telemetry.handled(handled);
    };
    // A job that ended: what it learnt goes to its partition's started attempts, if this
    // worker still owns it (a partition taken again rebuilt them from the outcomes).
    let finished = |f: Finished| {
        if f.unsent
            && let Some(owned) = lock(&shared).owned.get_mut(&f.partition)
        {
            owned.started.record_unsent(&f.operation_key, f.epoch);
        }
        count(f.handled);
    };
    let mut running = Running::new(c.max_in_flight);
    while !shutdown.load(Ordering::Relaxed) {
        telemetry.health.beat();
        telemetry.in_flight.set(&[], running.count as f64);
        if lock(&shared).rejoin.due() {
            log::info!("worker {worker_id}: joining the group of {dispatch} again");
            consumer.unsubscribe();
            consumer.subscribe(&[dispatch.as_str()])?;
        }
        // Every slot taken: wait for one (the consumer is not polled meanwhile, for at most
        // one call's timeout; heartbeats go on in librdkafka's thread).
        let mut wait = if running.free() == 0 {
            Duration::from_millis(200)
        } else {
            Duration::ZERO
        };
        while let Some(ended) = running.ended(&handler, wait) {
            finished(ended?);
            wait = Duration::ZERO;
        }
        if running.free() == 0 {
            continue;
        }
        let batch = gather(&consumer, &shared, running.free(), telemetry)?;
        if batch.is_empty() {
            continue;
        }
        // Phase one, in the order read. The rebalance callback runs only inside `poll`, so
        // the owned partitions stay as they are until the next batch.
        let mut out = Vec::new();
        let mut jobs = Vec::new();
        let mut commits: BTreeMap<i32, i64> = BTreeMap::new();
        {
            let mut shared = lock(&shared);
            for message in &batch {
                let (partition, offset) = (message.partition(), message.offset());
                let headers: Vec<(&str, &[u8])> = message
                    .headers()
                    .map(|hs| {
                        hs.iter()
                            .map(|h| (h.key, h.value.unwrap_or_default()))
                            .collect()
                    })
                    .unwrap_or_default();
                let parent = airlock_processor::telemetry::trace::extract(headers.iter().copied());
                let barrier = headers
                    .iter()
                    .any(|(k, v)| *k == header::KIND && *v == BARRIER_KIND.as_bytes());
                // A fence marker raises the fence only once its capability verifies.
                let forged_marker = wire::marker_epoch(headers.iter().copied()).and_then(|epoch| {
                    // The last one, as for every header a reader takes.
                    let capability = headers
                        .iter()
                        .rev()
                        .find(|(k, _)| *k == header::CAPABILITY)
                        .map(|(_, v)| *v);
                    handler
                        .checker
                        .authorize_fence(&dispatch, partition, epoch, capability)
                        .err()
                });
                let admit = if barrier || forged_marker.is_some() {
                    None
                } else {
                    Some(filter.admit(&dispatch, partition, headers.iter().copied()))
                };
                let Some(owned) = shared.owned.get_mut(&partition) else {
                    continue;
                };
                if offset < owned.next {
                    continue;
                }
                owned.next = offset + 1;
                commits.insert(partition, offset + 1);
                let source = Source {
                    topic: &dispatch,
                    partition,
                    offset,
                    key: message.key(),
                    payload: message.payload(),
                };
                let step = if let Some(refused) = &forged_marker {
                    handler.refuse_marker(source, &parent, refused, &mut out)
                } else {
                    match admit {
                        // Markers are verified above (`forged_marker`): the filter itself
                        // verifies none and never answers `Forged`.
                        None | Some(Admit::Marker(_) | Admit::Forged(_)) => continue,
                        Some(Admit::Fenced { owner_epoch, fence }) => {
                            log::warn!(
                                "{dispatch} partition {partition} offset {offset}: written by \
                                 owner epoch {owner_epoch} behind the fence {fence}; ignored"
                            );
                            Step::Done(Handled::Fenced)
                        }
                        Some(Admit::Accept) => {
                            let record = Record {
                                source,
                                fence: filter.fence(&dispatch, partition),
                                parent: &parent,
                            };
                            handler.prepare(record, &mut owned.started, &mut out)
                        }
                    }
                };
                match step {
                    Step::Done(handled) => count(handled),
                    Step::Later(job) => jobs.push(*job),
                }
            }
        }
        if commits.is_empty() {
            continue;
        }
        // Started (and dead letters written) before the commit; called only after it.
        if !out.is_empty() {
            producer.send_phased(&out)?;
        }
        if !commit_sync(&consumer, &dispatch, &commits) {
            let (calls, lookups): (Vec<Job>, Vec<Job>) = jobs.into_iter().partition(Job::is_call);
            for job in calls {
                count(handler.abandon(job));
            }
            jobs = lookups;
        }
        for job in jobs {
            running.start(&handler, job);
        }
    }

    // Every command started is reported before the worker leaves (each call is bounded by its
    // timeout, each outcome by the producer's delivery timeout).
    if running.count > 0 {
        log::info!(
            "worker {worker_id}: waiting for {} commands started and not yet reported",
            running.count
        );
    }
    while running.count > 0 {
        telemetry.health.beat();
        telemetry.in_flight.set(&[], running.count as f64);
        if let Some(ended) = running.ended(&handler, Duration::from_millis(200)) {
            finished(ended?);
        }
    }
    telemetry.in_flight.set(&[], 0.0);
    let summary = summary.into_inner();
    log::info!("worker {worker_id}: stopping ({summary:?})");
    telemetry.health.stopping();
    consumer.unsubscribe();
    drop(consumer);
    producer.flush(Duration::from_secs(30))?;
    Ok(summary)
}

/// Up to `max` records: waits at most 200 ms for the first, not at all for the rest. A
/// rebalance while gathering drops what was gathered before it: the new assignment reads its
/// partitions from their beginning again.
fn gather<'c>(
    consumer: &'c BaseConsumer<Ctx>,
    shared: &Mutex<Shared>,
    max: usize,
    telemetry: &Telemetry,
) -> Result<Vec<BorrowedMessage<'c>>> {
    let mut batch = Vec::new();
    let mut generation = lock(shared).generation;
    let mut wait = Duration::from_millis(200);
    while batch.len() < max {
        let polled = consumer.poll(wait);
        wait = Duration::ZERO;
        // The rebalance callback runs inside `poll`, whether or not a record comes back.
        {
            let mut shared = lock(shared);
            if let Some(e) = shared.fatal.take() {
                return Err(e);
            }
            if shared.generation != generation {
                generation = shared.generation;
                batch.clear();
            }
        }
        let Some(polled) = polled else {
            break;
        };
        match polled {
            Ok(m) => batch.push(m),
            Err(e) if e.rdkafka_error_code() == Some(RDKafkaErrorCode::Fatal) => {
                return Err(e.into());
            }
            Err(e) => telemetry.consumer_error(&e),
        }
    }
    Ok(batch)
}

/// Commits the offsets of the dispatch partitions synchronously: true when the group took
/// them all.
fn commit_sync(consumer: &BaseConsumer<Ctx>, topic: &str, offsets: &BTreeMap<i32, i64>) -> bool {
    let mut tpl = TopicPartitionList::new();
    for (&partition, &offset) in offsets {
        if let Err(e) = tpl.add_partition_offset(topic, partition, Offset::Offset(offset)) {
            log::error!("committing {topic} partition {partition} offset {offset}: {e}");
            return false;
        }
    }
    match consumer.commit(&tpl, CommitMode::Sync) {
        Ok(()) => true,
        Err(e) => {
            log::error!("committing {topic} offsets {offsets:?}: {e}");
            false
        }
    }
}
