//! Airlock on a broker: topics created under a unique prefix, processors run in-process or as
//! `airlock run` child processes (to be killed, frozen and restarted), producers that partition
//! like every Airlock client (murmur2), and readers that apply the owner-epoch fence.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use airlock_processor::cli::run::load_core;
use airlock_processor::runtime::config::Config;
use airlock_processor::runtime::partitioner::LIBRDKAFKA_PARTITIONER;
use airlock_processor::runtime::produce::{Acked, Producer};
use airlock_processor::runtime::run::{self, Summary};
use airlock_processor::runtime::telemetry::Telemetry;
use airlock_processor::runtime::topics::{self, Names};
use airlock_processor::runtime::wire::{Admit, BARRIER_KIND, FenceFilter, OutRecord, header};
use airlock_processor::telemetry::server::Server;
use airlock_schemas::{Codec, Decision, DispatchCommand};
use anyhow::Context;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Headers, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

use crate::{Broker, unique_prefix};

const TIMEOUT: Duration = Duration::from_secs(30);

/// A broker with Airlock's topics under a prefix of its own, and a state root for processors.
pub struct Airlock {
    /// Shared with every [`Airlock::alongside`] of this one.
    pub broker: Arc<Broker>,
    /// The key connector workers spawned here sign their outcomes with
    /// ([`Options::signing_workers`]).
    pub worker_signing_key_file: Option<PathBuf>,
    pub config: Config,
    pub names: Names,
    state_root: tempfile::TempDir,
    /// [`Airlock::reader_codec`]'s last answer, and the registry it came from: the ids are
    /// resolved once per registry, not on every read a test polls.
    reader_codec: std::sync::Mutex<Option<(String, Codec)>>,
}

impl std::fmt::Debug for Airlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Airlock")
            .field("prefix", &self.config.topics.prefix)
            .finish_non_exhaustive()
    }
}

/// How [`Airlock::start_with`] sets Airlock up.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Keep the reference registry's attempt timeout caps (10 s) instead of ten minutes: for
    /// tests that run a connector, where attempt deadlines and reconciliation are the subject.
    pub reference_attempt_timeouts: bool,
    /// The processors sign dispatch commands with this key (`capability.signing_key_file`).
    pub signing_key_file: Option<PathBuf>,
    /// The processors issue receipts signed with this key (`receipts.signing_key_file`).
    pub receipts_key_file: Option<PathBuf>,
    /// Every topic's replication factor (default 1); 3 on a three-node cluster.
    pub replication_factor: Option<i32>,
    /// Connector workers sign their outcomes: a key pair of theirs is made (under the state
    /// root, [`Airlock::worker_signing_key_file`]), workers spawned here sign with it, and the
    /// processors take the outcomes of every connector of the registry only signed with it
    /// (`capability.worker_verifying_key_files`).
    pub signing_workers: bool,
    /// Approvers and operators sign: a key pair is made for each of [`PEOPLE`] (under the state
    /// root, [`Airlock::person_key_file`]), registered in the policy entities as the person's
    /// `verifying_keys`, and `capability.require_person_signatures` is on.
    pub signing_people: bool,
}

impl Options {
    /// What a test that runs connector workers and the ledger needs: the processors sign their
    /// dispatch commands with `keys` (workers are given its verifying key), workers spawned here
    /// sign their outcomes, and attempts keep the reference 10 s caps, so that deadlines and
    /// reconciliation happen during the test.
    pub fn with_workers(keys: &crate::connector::Keys) -> Options {
        Options {
            reference_attempt_timeouts: true,
            signing_key_file: Some(keys.signing_file.clone()),
            signing_workers: true,
            ..Options::default()
        }
    }
}

/// The approvers and operators of the reference entities, who sign with
/// [`Options::signing_people`].
pub const PEOPLE: &[&str] = &[
    "alice",
    "bob",
    "carol",
    "operator-olga",
    "ops-1",
    "operator-globex",
];

impl Airlock {
    /// Starts a broker and creates every topic with `partitions` partitions.
    pub async fn start(test: &str, partitions: i32) -> anyhow::Result<Airlock> {
        Self::start_with(test, partitions, Options::default()).await
    }

    /// [`Airlock::start`] with `options`.
    pub async fn start_with(
        test: &str,
        partitions: i32,
        options: Options,
    ) -> anyhow::Result<Airlock> {
        Self::on(Broker::start().await?, test, partitions, options).await
    }

    /// [`Airlock::start_with`] on a broker the test started itself (a cluster, a container).
    pub async fn on(
        broker: Broker,
        test: &str,
        partitions: i32,
        options: Options,
    ) -> anyhow::Result<Airlock> {
        Self::on_shared(Arc::new(broker), test, partitions, options).await
    }

    /// Another set of Airlock's topics, under a prefix of its own, on this one's broker.
    pub async fn alongside(
        &self,
        test: &str,
        partitions: i32,
        options: Options,
    ) -> anyhow::Result<Airlock> {
        Self::on_shared(self.broker.clone(), test, partitions, options).await
    }

    async fn on_shared(
        broker: Arc<Broker>,
        test: &str,
        partitions: i32,
        options: Options,
    ) -> anyhow::Result<Airlock> {
        let mut config = Config::default();
        config.kafka.brokers = broker.bootstrap.clone();
        config.kafka.compatibility = broker.compatibility;
        config.topics.prefix = unique_prefix(test);
        config.topics.partitions = partitions;
        config.topics.replication_factor = options.replication_factor.unwrap_or(1);
        config.processor.session_timeout_ms = 6_000;
        // The bound on a rebalance's wait for members that do not rejoin.
        config.processor.max_poll_interval_ms = 10_000;
        config.processor.checkpoint_interval_ms = 2_000;
        // Idle owners look for a zombie's changelog rows every second.
        config.processor.changelog_sweep_ms = 1_000;
        // Idle timers fire within a quarter second of their due time.
        config.processor.clock_tick_ms = 250;
        config.state.sync = false;
        let state_root = tempfile::tempdir()?;
        let dir = reference_config(
            state_root.path(),
            !options.reference_attempt_timeouts,
            options.signing_people,
        )?;
        config.capability.require_person_signatures = options.signing_people;
        if let Some(key) = options.signing_key_file {
            config.capability.signing_key_file = key;
        }
        if let Some(key) = options.receipts_key_file {
            config.receipts.signing_key_file = key;
        }
        config.tools.registry = dir.join("tools.toml");
        config.tools.policies = dir.join("policies.cedar");
        config.tools.entities = dir.join("entities.json");
        let mut worker_signing_key_file = None;
        if options.signing_workers {
            let (signing, verifying) = airlock_processor::capability::write_key_pair(
                &airlock_processor::capability::generate()?,
                &state_root.path().join("worker"),
            )?;
            let registry =
                airlock_processor::core::registry::Registry::load(&config.tools.registry)?;
            config.capability.worker_verifying_key_files = registry
                .tools()
                .map(|t| (t.connector.clone(), vec![verifying.clone()]))
                .collect();
            worker_signing_key_file = Some(signing);
        }
        let core = load_core(&config)?;
        let names = Names::new(&config.topics.prefix);
        let plan = names.plan(core.registry().tools().map(|t| t.connector.as_str()));
        topics::create(&config, &plan, TIMEOUT)
            .await
            .context("creating the topics")?;
        Ok(Airlock {
            broker,
            worker_signing_key_file,
            config,
            names,
            state_root,
            reader_codec: std::sync::Mutex::new(None),
        })
    }

    /// The configuration of processor instance `instance` (its own state directory).
    pub fn instance_config(&self, instance: &str) -> Config {
        let mut c = self.config.clone();
        c.processor.instance = instance.to_owned();
        c.state.dir = self.state_dir(instance);
        c
    }

    /// A single Kafka node started as a process whose log cleaner looks every half second, or
    /// `None` (the reason printed) where the provider cannot give one or does not compact
    /// (tansu 0.6, `compat::Broker::compacts`): for tests of compaction.
    pub async fn compacting_broker() -> anyhow::Result<Option<Broker>> {
        let broker = Broker::start_with(crate::Settings {
            nodes: 1,
            properties: vec![("log.cleaner.backoff.ms".into(), "500".into())],
        })
        .await?;
        if !broker.compatibility.compacts() || broker.processes().is_none() {
            eprintln!(
                "skipped: needs a broker this test started as a process that compacts ({:?}, {})",
                broker.provider, broker.compatibility
            );
            return Ok(None);
        }
        Ok(Some(broker))
    }

    /// Makes the changelog as eager to compact as it gets (segments roll every second, any
    /// dirty ratio is worth cleaning, no compaction lag), with `extra` settings on top.
    /// AlterConfigs replaces a topic's whole dynamic configuration: the policy is restated.
    pub async fn eager_changelog(&self, extra: &[(&str, &str)]) -> anyhow::Result<()> {
        use rdkafka::admin::{AdminClient, AdminOptions, AlterConfig, ResourceSpecifier};
        let admin: AdminClient<rdkafka::client::DefaultClientContext> =
            self.config.client_config().create()?;
        let changelog = self.names.changelog();
        let mut eager = AlterConfig::new(ResourceSpecifier::Topic(&changelog))
            .set("cleanup.policy", "compact")
            .set("segment.ms", "1000")
            .set("min.cleanable.dirty.ratio", "0.01")
            .set("min.compaction.lag.ms", "0");
        for (name, value) in extra {
            eager = eager.set(name, value);
        }
        for result in admin
            .alter_configs(
                &[eager],
                &AdminOptions::new().request_timeout(Some(Duration::from_secs(30))),
            )
            .await?
        {
            result.map_err(|(r, e)| anyhow::anyhow!("altering {r:?}: {e}"))?;
        }
        Ok(())
    }

    /// The signing key of `person` (one of [`PEOPLE`]) made by [`Options::signing_people`].
    pub fn person_key_file(&self, person: &str) -> PathBuf {
        self.state_root
            .path()
            .join("people")
            .join(person)
            .with_extension("key")
    }

    /// The `airlock-capability` header that signs `person`'s record `value` as `act`.
    pub fn person_signature(
        &self,
        act: airlock_processor::capability::PersonAct,
        person: &str,
        value: &[u8],
    ) -> anyhow::Result<(String, Vec<u8>)> {
        let key = airlock_processor::capability::load_signing_key(&self.person_key_file(person))?;
        Ok((
            airlock_processor::runtime::wire::header::CAPABILITY.to_owned(),
            airlock_processor::capability::sign_person(&key, act, person, value),
        ))
    }

    pub fn state_dir(&self, instance: &str) -> PathBuf {
        self.state_root.path().join(instance)
    }

    /// An in-process processor instance (fast tests; stopped gracefully), its telemetry
    /// endpoint on a free local port ([`InProcess::telemetry_url`]).
    pub fn spawn(&self, instance: &str) -> anyhow::Result<InProcess> {
        airlock_processor::runtime::logging::init("");
        let config = self.instance_config(instance);
        let core = Arc::new(load_core(&config)?);
        let shutdown = Arc::new(AtomicBool::new(false));
        let flag = shutdown.clone();
        let telemetry = Arc::new(Telemetry::new(Duration::from_millis(
            config.telemetry.stall_after_ms,
        )));
        let endpoint = Server::start("127.0.0.1:0", telemetry.registry.clone(), telemetry.clone())?;
        let recorder = telemetry.clone();
        let handle = std::thread::Builder::new()
            .name(format!("airlock-{instance}"))
            .spawn(move || {
                run::run_with(&config, core, flag, recorder).map_err(anyhow::Error::from)
            })?;
        Ok(InProcess {
            handle: Some(handle),
            shutdown,
            telemetry,
            endpoint,
        })
    }

    /// The group a replacement for a killed or frozen member of `group` joins: `group` itself
    /// where the broker evicts a member that stops heartbeating (Apache Kafka), `fresh` where
    /// it never does (tansu 0.6, `compat::Broker::evicts_silent_members`). Airlock keeps its
    /// offsets with its state, not in the group, so a fresh group changes only who is assigned
    /// what.
    pub fn replacement_group<'g>(&self, group: &'g str, fresh: &'g str) -> &'g str {
        if self.config.kafka.compatibility.evicts_silent_members() {
            group
        } else {
            fresh
        }
    }

    /// An `airlock run` child process (to be killed with SIGKILL, frozen with SIGSTOP) in the
    /// consumer group `group`.
    pub fn spawn_process(
        &self,
        instance: &str,
        group: &str,
        log: &Path,
    ) -> anyhow::Result<Process> {
        let config = self.instance_config(instance);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?;
        let mut command = self.command(&config)?;
        command
            .arg("run")
            .env("AIRLOCK_STATE_DIR", &config.state.dir)
            .env("AIRLOCK_STATE_SYNC", config.state.sync.to_string())
            .env("AIRLOCK_INSTANCE", instance)
            .env(
                "AIRLOCK_GROUP_ID",
                format!("{}{group}", config.topics.prefix),
            )
            .env(
                "AIRLOCK_SESSION_TIMEOUT_MS",
                config.processor.session_timeout_ms.to_string(),
            )
            .env(
                "AIRLOCK_MAX_POLL_INTERVAL_MS",
                config.processor.max_poll_interval_ms.to_string(),
            )
            .env(
                "AIRLOCK_CHECKPOINT_INTERVAL_MS",
                config.processor.checkpoint_interval_ms.to_string(),
            )
            .env(
                "AIRLOCK_CHANGELOG_SWEEP_MS",
                config.processor.changelog_sweep_ms.to_string(),
            )
            .env(
                "AIRLOCK_CLOCK_TICK_MS",
                config.processor.clock_tick_ms.to_string(),
            )
            .env(
                "AIRLOCK_CAPABILITY_SIGNING_KEY_FILE",
                &config.capability.signing_key_file,
            )
            .env(
                "AIRLOCK_RECEIPTS_SIGNING_KEY_FILE",
                &config.receipts.signing_key_file,
            )
            .env(
                "AIRLOCK_CAPABILITY_REQUIRE_PERSON_SIGNATURES",
                config.capability.require_person_signatures.to_string(),
            )
            .env(
                "AIRLOCK_CLOSED_INTENT_RETENTION_MS",
                config.processor.closed_intent_retention_ms.to_string(),
            )
            .env("AIRLOCK_KEY_SCOPE", config.processor.key_scope.as_str())
            .env(
                "AIRLOCK_CAPABILITY_WORKER_VERIFYING_KEY_FILES",
                config
                    .capability
                    .worker_verifying_key_files
                    .iter()
                    .map(|(connector, files)| {
                        let files: Vec<String> =
                            files.iter().map(|f| f.display().to_string()).collect();
                        format!("{connector}={}", files.join(","))
                    })
                    .collect::<Vec<_>>()
                    .join(";"),
            )
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .map(Process)
            .context("starting `airlock run`")
    }

    /// The `airlock` binary with `config`'s brokers, topics and tool configuration in its
    /// environment: add a subcommand and its arguments.
    pub fn command(&self, config: &Config) -> anyhow::Result<Command> {
        let mut command = Command::new(airlock_binary()?);
        command
            .env("AIRLOCK_KAFKA_BROKERS", &config.kafka.brokers)
            .env(
                "AIRLOCK_KAFKA_COMPATIBILITY",
                config.kafka.compatibility.to_string(),
            )
            .env("AIRLOCK_TOPICS_PREFIX", &config.topics.prefix)
            .env(
                "AIRLOCK_TOPICS_PARTITIONS",
                config.topics.partitions.to_string(),
            )
            .env("AIRLOCK_REGISTRY", &config.tools.registry)
            .env("AIRLOCK_POLICIES", &config.tools.policies)
            .env("AIRLOCK_ENTITIES", &config.tools.entities)
            .env("AIRLOCK_SCHEMA_REGISTRY_URL", &config.schema_registry.url)
            .env(
                "AIRLOCK_SCHEMA_REGISTRY_FRAMING",
                config.schema_registry.framing.as_str(),
            );
        Ok(command)
    }

    /// Runs `airlock <args>` against this test's topics and returns its exit status, standard
    /// output and standard error (bounded by the subcommand's own timeouts).
    pub fn cli(&self, args: &[&str]) -> anyhow::Result<(bool, String, String)> {
        let out = self
            .command(&self.config)?
            .args(args)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running airlock {}", args.join(" ")))?;
        Ok((
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ))
    }

    /// A producer that partitions like every Airlock client.
    pub fn producer(&self) -> anyhow::Result<FutureProducer> {
        Ok(ClientConfig::new()
            .set("bootstrap.servers", &self.config.kafka.brokers)
            .set("partitioner", LIBRDKAFKA_PARTITIONER)
            .set("enable.idempotence", "true")
            .set("linger.ms", "5")
            .create()?)
    }

    /// Produces one Airlock record (single-object encoding), keyed by `key`.
    pub async fn send<T: airlock_schemas::Record>(
        &self,
        producer: &FutureProducer,
        topic: &str,
        key: &str,
        value: &T,
    ) -> anyhow::Result<()> {
        let payload = Codec::new().encode_single_object(value)?;
        self.send_raw(producer, topic, Some(key.as_bytes()), &payload)
            .await
    }

    /// Produces many records concurrently (all enqueued, then all awaited), in order per key.
    pub async fn send_many<T: airlock_schemas::Record>(
        &self,
        producer: &FutureProducer,
        topic: &str,
        values: &[T],
        key_of: impl Fn(&T) -> &str,
    ) -> anyhow::Result<()> {
        let codec = Codec::new();
        let mut pending = Vec::with_capacity(values.len());
        for v in values {
            let payload = codec.encode_single_object(v)?;
            let key = key_of(v).to_owned();
            let mut record: FutureRecord<'_, str, [u8]> = FutureRecord::to(topic)
                .key(key.as_str())
                .payload(payload.as_slice());
            // Enqueued now (the future does not borrow the record); a full queue is waited out.
            let delivery = loop {
                match producer.send_result(record) {
                    Ok(d) => break d,
                    Err((e, back)) => {
                        anyhow::ensure!(
                            matches!(
                                e,
                                rdkafka::error::KafkaError::MessageProduction(
                                    rdkafka::types::RDKafkaErrorCode::QueueFull
                                )
                            ),
                            "producing to {topic}: {e}"
                        );
                        record = back;
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
            };
            pending.push(delivery);
        }
        for d in pending {
            d.await?
                .map_err(|(e, _)| anyhow::anyhow!("producing to {topic}: {e}"))?;
        }
        Ok(())
    }

    pub async fn send_raw(
        &self,
        producer: &FutureProducer,
        topic: &str,
        key: Option<&[u8]>,
        payload: &[u8],
    ) -> anyhow::Result<()> {
        let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic).payload(payload);
        if let Some(key) = key {
            record = record.key(key);
        }
        let record = record.headers(OwnedHeaders::new().insert(Header {
            key: "test",
            value: Some("1"),
        }));
        producer
            .send(record, TIMEOUT)
            .await
            .map_err(|(e, _)| anyhow::anyhow!("producing to {topic}: {e}"))?;
        Ok(())
    }

    /// Produces `records` as Airlock's processes do (idempotent, each to its own partition, in
    /// order) and returns where they landed. On a thread of its own: the producer blocks on
    /// its own runtime, and tests call this from inside theirs.
    pub fn produce(&self, records: Vec<OutRecord>) -> anyhow::Result<Acked> {
        let client = self.config.client_config();
        std::thread::spawn(move || -> anyhow::Result<_> {
            Ok(Producer::new(&client, 0)?.send_phased(&records)?)
        })
        .join()
        .map_err(|_| anyhow::anyhow!("the producing thread panicked"))?
    }

    /// Every record of `topic` up to its current end, in partition order, with the fence
    /// verdict of each. The end of each partition is learnt by writing a barrier record there
    /// and reading up to its acknowledged offset: tansu 0.6 reports high watermarks that can
    /// stop inside the last produced batch.
    pub fn read_topic(&self, topic: &str) -> anyhow::Result<Vec<Read>> {
        self.read_topic_with(topic, false)
    }

    /// [`read_topic`](Self::read_topic) with the barrier records it reads past (a processor's
    /// ticks on an input topic, readers' barriers, this read's own at the end): for a test that
    /// copies a topic record for record.
    pub fn read_topic_and_barriers(&self, topic: &str) -> anyhow::Result<Vec<Read>> {
        self.read_topic_with(topic, true)
    }

    fn read_topic_with(&self, topic: &str, barriers_too: bool) -> anyhow::Result<Vec<Read>> {
        let barriers: Vec<OutRecord> = (0..self.config.topics.partitions)
            .map(|p| OutRecord::barrier(topic, p))
            .collect();
        let acked = self.produce(barriers)?;
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.config.kafka.brokers)
            .set("group.id", format!("{}reader", self.config.topics.prefix))
            .set("enable.auto.commit", "false")
            .set("fetch.wait.max.ms", "20")
            .create()?;
        let mut tpl = TopicPartitionList::new();
        let mut ends = std::collections::BTreeMap::new();
        for p in 0..self.config.topics.partitions {
            let (low, _) = consumer.fetch_watermarks(topic, p, TIMEOUT)?;
            let end = acked.placed(topic, p)?;
            if end > low {
                tpl.add_partition_offset(topic, p, Offset::Offset(low))?;
                ends.insert(p, end);
            }
        }
        let mut out = Vec::new();
        if ends.is_empty() {
            return Ok(out);
        }
        consumer.assign(&tpl)?;
        let mut filter = FenceFilter::default();
        let deadline = Instant::now() + TIMEOUT;
        while !ends.is_empty() {
            anyhow::ensure!(
                Instant::now() < deadline,
                "reading {topic}: timed out with {} partitions short of their end",
                ends.len()
            );
            let Some(m) = consumer.poll(Duration::from_millis(50)) else {
                continue;
            };
            let m = m?;
            let Some(&end) = ends.get(&m.partition()) else {
                continue;
            };
            if m.offset() >= end {
                ends.remove(&m.partition());
                continue;
            }
            if m.offset() + 1 >= end {
                ends.remove(&m.partition());
            }
            let headers: Vec<(String, Vec<u8>)> = m
                .headers()
                .map(|hs| {
                    hs.iter()
                        .map(|h| (h.key.to_owned(), h.value.unwrap_or_default().to_vec()))
                        .collect()
                })
                .unwrap_or_default();
            // Barriers (this reader's and others') are not data.
            if !barriers_too
                && headers
                    .iter()
                    .any(|(k, v)| k == header::KIND && v.as_slice() == BARRIER_KIND.as_bytes())
            {
                continue;
            }
            let admit = filter.admit(
                topic,
                m.partition(),
                headers.iter().map(|(k, v)| (k.as_str(), v.as_slice())),
            );
            out.push(Read {
                partition: m.partition(),
                offset: m.offset(),
                key: m.key().map(<[u8]>::to_vec),
                value: m.payload().map(<[u8]>::to_vec),
                headers,
                admit,
                producer_time: matches!(m.timestamp(), rdkafka::Timestamp::CreateTime(_)),
                timestamp: m.timestamp().to_millis(),
            });
        }
        out.sort_by_key(|r| (r.partition, r.offset));
        Ok(out)
    }

    /// Every dispatch command on the ledger's dispatch topic that a worker would accept (not
    /// fenced), one per (operation key, attempt epoch). Copies of one attempt are expected (a
    /// resent outbox, an owner deciding again inputs whose changelog the previous owner had not
    /// written) but must say the same thing: identical in every field but the sender's stamp
    /// (`owner_epoch`, and the capability that signs it). Two different commands for one
    /// attempt fail here, whatever their record ids.
    pub fn dispatches(&self) -> anyhow::Result<Vec<DispatchCommand>> {
        let codec = Codec::new();
        let mut by_attempt: std::collections::BTreeMap<(String, i64), DispatchCommand> =
            std::collections::BTreeMap::new();
        for r in self.read_topic(&self.names.dispatch("ledger"))? {
            if r.admit != Admit::Accept || r.header(header::KIND) != Some(b"dispatch".as_slice()) {
                continue;
            }
            let cmd: DispatchCommand = codec.decode_as(r.value.as_deref().unwrap_or_default())?;
            match by_attempt.entry((cmd.operation_key.clone(), cmd.epoch)) {
                std::collections::btree_map::Entry::Vacant(v) => {
                    v.insert(cmd);
                }
                std::collections::btree_map::Entry::Occupied(o) => anyhow::ensure!(
                    DispatchCommand {
                        owner_epoch: cmd.owner_epoch,
                        capability: cmd.capability.clone(),
                        ..o.get().clone()
                    } == cmd,
                    "two different dispatch commands for {}#{}:\n{:?}\n{cmd:?}",
                    cmd.operation_key,
                    cmd.epoch,
                    o.get()
                ),
            }
        }
        Ok(by_attempt.into_values().collect())
    }

    /// A codec reading what this instance's processors write: with the registry's ids when
    /// `schema_registry.url` is set, resolved once per registry URL (a test may set one after
    /// [`Airlock::start`], before it creates the topics that register the schemas). The
    /// registry client blocks, and async tests call this: it runs on a thread of its own.
    pub fn reader_codec(&self) -> anyhow::Result<Codec> {
        let url = &self.config.schema_registry.url;
        if url.is_empty() {
            return Ok(Codec::new());
        }
        let mut cached = self
            .reader_codec
            .lock()
            .map_err(|_| anyhow::anyhow!("the reader codec's lock is poisoned"))?;
        if let Some((from, codec)) = cached.as_ref()
            && from == url
        {
            return Ok(codec.clone());
        }
        let codec = std::thread::scope(|s| {
            s.spawn(|| airlock_processor::runtime::schema_registry::reader_codec(&self.config))
                .join()
                .map_err(|_| anyhow::anyhow!("resolving the schema ids panicked"))?
        })?;
        *cached = Some((url.clone(), codec.clone()));
        Ok(codec)
    }

    /// The accepted (not fenced, not marker) records of `topic` whose `airlock-kind` is `kind`,
    /// deduplicated on `airlock-id` (the first copy kept), decoded as `T` (in either framing
    /// with a schema registry configured).
    pub fn read_deduplicated<T: airlock_schemas::Record>(
        &self,
        topic: &str,
        kind: &str,
    ) -> anyhow::Result<Vec<T>> {
        let codec = self.reader_codec()?;
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::new();
        for r in self.read_topic(topic)? {
            if r.admit != Admit::Accept || r.header(header::KIND) != Some(kind.as_bytes()) {
                continue;
            }
            let id = r.header(header::ID).unwrap_or_default().to_vec();
            if !seen.insert(id) {
                continue;
            }
            let value = r.value.as_deref().unwrap_or_default();
            out.push(codec.decode_as(value)?);
        }
        Ok(out)
    }
}

impl Airlock {
    /// Waits, at most `within`, until every proposal in `ids` has its reply
    /// ([`Airlock::proposal_replies`]); returns every reply.
    pub async fn await_replies<'a>(
        &self,
        ids: impl IntoIterator<Item = &'a str>,
        within: Duration,
    ) -> anyhow::Result<std::collections::BTreeMap<String, Decision>> {
        let ids: Vec<&str> = ids.into_iter().collect();
        crate::eventually("a decision for every proposal", within, async || {
            let d = self.proposal_replies()?;
            Ok(ids.iter().all(|id| d.contains_key(*id)).then_some(d))
        })
        .await
    }

    /// The reply to each proposal (decision ids `p/...`, and `x/...` for records the processor
    /// refused before deciding), the first copy of each, by proposal id. Later decisions about
    /// the same intent (attempt timeouts, settlements) reply to the proposal too; they are not
    /// its answer.
    pub fn proposal_replies(&self) -> anyhow::Result<std::collections::BTreeMap<String, Decision>> {
        let mut out = std::collections::BTreeMap::new();
        for d in self.read_deduplicated::<Decision>(&self.names.decisions(), "decision")? {
            if d.decision_id.starts_with("p/") || d.decision_id.starts_with("x/") {
                out.entry(d.in_reply_to.clone()).or_insert(d);
            }
        }
        Ok(out)
    }
}

/// A copy of `deploy/config` under `root`, changed as asked:
/// - `long_attempts`: attempt timeout caps of ten minutes. Tests that run no connector would
///   otherwise see every attempt time out after the reference 10 s of wall clock, and later
///   replies would depend on how fast the machine is; with long caps, the verdicts can be
///   compared exactly with an untimed reference run.
/// - `signing_people`: a key pair for each of [`PEOPLE`] (`<root>/people/<id>.{key,pub}`), the
///   verifying key registered as the principal's `verifying_keys`.
fn reference_config(
    root: &Path,
    long_attempts: bool,
    signing_people: bool,
) -> anyhow::Result<PathBuf> {
    fn copy_dir(from: &Path, to: &Path) -> anyhow::Result<()> {
        std::fs::create_dir_all(to)?;
        for entry in std::fs::read_dir(from)? {
            let entry = entry?;
            let target = to.join(entry.file_name());
            if entry.file_type()?.is_dir() {
                copy_dir(&entry.path(), &target)?;
            } else {
                std::fs::copy(entry.path(), &target)?;
            }
        }
        Ok(())
    }
    let dir = root.join("config");
    copy_dir(&airlock_processor::sample::config_dir(), &dir)?;
    if long_attempts {
        let tools = dir.join("tools.toml");
        let text = std::fs::read_to_string(&tools)?;
        let patched: Vec<String> = text
            .lines()
            .map(|l| {
                if l.starts_with("attempt_timeout_cap_ms") {
                    "attempt_timeout_cap_ms = 600000".to_owned()
                } else {
                    l.to_owned()
                }
            })
            .collect();
        std::fs::write(&tools, patched.join("\n") + "\n")?;
    }
    if signing_people {
        let file = dir.join("entities.json");
        let mut entities: Vec<serde_json::Value> =
            serde_json::from_str(&std::fs::read_to_string(&file)?)?;
        std::fs::create_dir_all(root.join("people"))?;
        for id in PEOPLE {
            let key = airlock_processor::capability::generate()?;
            airlock_processor::capability::write_key_pair(&key, &root.join("people").join(id))?;
            let entity = entities
                .iter_mut()
                .find(|e| e["uid"]["id"] == *id)
                .with_context(|| format!("{id} is not in the reference entities"))?;
            entity["attrs"]["verifying_keys"] =
                serde_json::json!([hex::encode(key.verifying_key().to_bytes())]);
        }
        std::fs::write(&file, serde_json::to_string_pretty(&entities)?)?;
    }
    Ok(dir)
}

/// An `airlock run` child process, SIGKILLed when dropped if still running: a test that fails
/// half-way leaves no instance behind (frozen or retrying against a broker that is gone).
#[derive(Debug)]
pub struct Process(Child);

impl std::ops::Deref for Process {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Process {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// One record read back.
#[derive(Clone, Debug)]
pub struct Read {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(String, Vec<u8>)>,
    pub admit: Admit,
    /// The broker served the record with its producer's timestamp (CreateTime), not its own
    /// append time.
    pub producer_time: bool,
    /// The record's timestamp, epoch milliseconds (whichever kind).
    pub timestamp: Option<i64>,
}

impl Read {
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_slice())
    }

    pub fn header_str(&self, name: &str) -> Option<&str> {
        self.header(name).and_then(|v| std::str::from_utf8(v).ok())
    }
}

/// A processor running on a thread of the test process.
#[derive(Debug)]
pub struct InProcess {
    handle: Option<JoinHandle<anyhow::Result<Summary>>>,
    shutdown: Arc<AtomicBool>,
    /// What the instance records (the same values its endpoint serves).
    pub telemetry: Arc<Telemetry>,
    endpoint: Server,
}

impl InProcess {
    /// Asks for a graceful stop and waits for it (bounded).
    pub fn stop(mut self) -> anyhow::Result<Summary> {
        self.shutdown.store(true, Ordering::Relaxed);
        let handle = self.handle.take().expect("stopped once");
        let deadline = Instant::now() + TIMEOUT;
        while !handle.is_finished() {
            anyhow::ensure!(
                Instant::now() < deadline,
                "processor did not stop in {TIMEOUT:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        handle
            .join()
            .map_err(|_| anyhow::anyhow!("processor thread panicked"))?
    }

    /// `http://127.0.0.1:<port>` of its `/metrics`, `/healthz` and `/readyz`.
    pub fn telemetry_url(&self) -> String {
        format!("http://{}", self.endpoint.addr())
    }

    pub fn is_running(&self) -> bool {
        self.handle.as_ref().is_some_and(|h| !h.is_finished())
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        self.shutdown.store(true, Ordering::Relaxed);
    }
}

/// The `airlock` binary built with the workspace (next to the test executable's directory).
pub fn airlock_binary() -> anyhow::Result<PathBuf> {
    workspace_binary("airlock", "airlock-processor")
}

/// The `airlock-connector` binary (the connector worker) built with the workspace.
pub fn connector_binary() -> anyhow::Result<PathBuf> {
    workspace_binary("airlock-connector", "airlock-connectors")
}

/// The `airlock-ledger` binary (the reference ledger) built with the workspace.
pub fn ledger_binary() -> anyhow::Result<PathBuf> {
    workspace_binary("airlock-ledger", "airlock-connectors")
}

/// Binary `name` of workspace package `package`: in `$AIRLOCK_BIN_DIR` when set (binaries of
/// another build, or copies safe from a target directory that other checkouts share), else
/// next to the test executable's directory (`cargo test --workspace` builds every package's
/// binaries).
fn workspace_binary(name: &str, package: &str) -> anyhow::Result<PathBuf> {
    let dir = match std::env::var_os("AIRLOCK_BIN_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => {
            let exe = std::env::current_exe()?;
            exe.parent()
                .and_then(Path::parent)
                .context("test executable has no parent directory")?
                .to_owned()
        }
    };
    let bin = dir.join(name);
    anyhow::ensure!(
        bin.exists(),
        "{} is missing: build it with `cargo build -p {package} --bin {name}`",
        bin.display()
    );
    Ok(bin)
}
