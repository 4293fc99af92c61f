//! `airlock-bench-runtime`: the processor against a real broker, next to a pass-through
//! baseline measured in the same run on the same broker.
//!
//! 1. **pass-through**: a consumer assigned every proposals partition (no group: a join or
//!    rebalance inside its clock made it swing 3× between runs) that reads the proposals and,
//!    per batch (same size, `batch.max_records` per partition, and flush interval), produces
//!    as many records per input as the processor does, with the same producer (idempotent,
//!    acks=all, lz4) and the same number of batches in flight
//!    (`batch.max_in_flight`), waiting for the acknowledgements as the processor does;
//! 2. **processor, fresh keys**: `airlock run` (in-process) over N fresh proposals;
//! 3. **processor, duplicates**: the same N proposals again (producer resends);
//!    then **core alone**: the same N proposals decided on one thread over an in-memory store
//!    (bench-core's `fresh-mem`), which bounds the fresh ratio: the processor does at least the
//!    pass-through's work plus this, so with RocksDB, outbox and changelog free its ratio would
//!    be the pass-through's CPU per proposal over that plus the core's;
//! 4. **latency**: proposals produced at half the processor's fresh rate (or at
//!    `--latency-rate`, to compare settings at one load), on fresh topics and
//!    state; p50/p99 from produce to the decision being readable, next to the broker's own
//!    share measured first in the same run: records at the same rate through one hop (produce
//!    to readable, same producer and reader settings). The processor's path is two hops.
//! 5. **Kafka Streams** (with `--streams-peer JAR`): the peer application in
//!    `processor/bench-peer/kafka-streams` (RocksDB store keyed by operation key, dedup, SHA-256
//!    of the canonical arguments, one dispatch and one decision per fresh proposal,
//!    `exactly_once_v2`) over the same fresh proposals on topics of its own, then its latency
//!    at half its own rate.
//!
//! The proposals are refunds of a fleet of agent runs (`sample::fleet_refund`: 1,000 runs, so
//! that every proposal dispatches; with one run, every proposal past the run's dispatch budget
//! of 10,000 per partition was a cheaper denial, most of a latency phase's proposals).
//!
//! Every phase also reports the CPU it took, from `/proc`: this process's per proposal (every
//! thread: the in-process processor's and, in the last two phases, the load generator's and the
//! reader's, which the hop phase shows alone) and how busy the whole machine was (the broker's
//! container included): whether a phase was bound by CPU or by waiting. When the broker runs
//! on this machine (`--broker-process`, `java` by default: Apache Kafka) its CPU per proposal
//! is reported too, and the paced phases print it second by second.
//!
//! ```sh
//! deploy/broker/kafka/kafka.sh start /tmp/bench-kafka --port 9092
//! jar="$(processor/bench-peer/kafka-streams/build.sh)"
//! cargo run --release -p airlock-processor --bin airlock-bench-runtime -- --proposals 30000 \
//!   --streams-peer "$jar"
//! deploy/broker/kafka/kafka.sh stop /tmp/bench-kafka
//! ```
//!
//! No connector runs here, so every dispatched attempt times out after its tool's
//! `attempt_timeout_cap_ms` (10 s for `refund`) and the timers then compete with the measured
//! work; point `AIRLOCK_REGISTRY` at a copy of the registry with a long cap to measure the
//! decision path alone (the figures in the notes say which was used).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use airlock_processor::cli::run::load_core;
use airlock_processor::core::Core;
use airlock_processor::runtime::clock::wall_ms;
use airlock_processor::runtime::config::Config;
use airlock_processor::runtime::flight::Flights;
use airlock_processor::runtime::partitioner::LIBRDKAFKA_PARTITIONER;
use airlock_processor::runtime::produce::Producer;
use airlock_processor::runtime::run;
use airlock_processor::runtime::telemetry::Telemetry;
use airlock_processor::runtime::topics::{self, Names};
use airlock_processor::runtime::wire::{self, OutRecord, Outbox};
use airlock_processor::sample;
use airlock_processor::telemetry::server::Probes;
use airlock_schemas::{Codec, Decision, ToolProposal};
use anyhow::Context;
use clap::Parser;
use hdrhistogram::Histogram;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::BorrowedMessage;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer as _, ThreadedProducer};
use rdkafka::{Message, Offset, TopicPartitionList};

/// The allocator of the `airlock` binary (see `main.rs`), so that the figures are its figures.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
struct Args {
    #[arg(long, default_value = "localhost:9092")]
    brokers: String,
    #[arg(long, default_value_t = 30_000)]
    proposals: usize,
    #[arg(long, default_value_t = 3)]
    partitions: i32,
    /// Seconds of the half-load latency phase.
    #[arg(long, default_value_t = 10)]
    latency_seconds: u64,
    /// Proposals per second of the latency phase (and of its broker hop) instead of half of
    /// this run's fresh rate: a fixed load, so that runs comparing settings of the processor
    /// compare their latency at the same rate and not at half of each one's own throughput.
    /// At least 100 (the floor the half rate has too).
    #[arg(long)]
    latency_rate: Option<f64>,
    /// Command name of the broker's process, when it runs on this machine (a local
    /// container's processes are visible here): each phase then reports the broker's CPU too.
    /// `java` for Apache Kafka (the lowest pid of that name: start the broker first), `tansu`.
    #[arg(long, default_value = "java")]
    broker_process: String,
    /// The Kafka Streams peer's jar (`processor/bench-peer/kafka-streams/build.sh` builds it
    /// and prints its path): when given, the same fresh proposals, then a latency phase at
    /// half its own rate, run through it on topics of its own, and it is compared.
    #[arg(long)]
    streams_peer: Option<std::path::PathBuf>,
    /// Stream threads of the Kafka Streams peer.
    #[arg(long, default_value_t = 2)]
    streams_threads: u32,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(rate) = args.latency_rate {
        anyhow::ensure!(
            rate.is_finite() && rate >= 100.0,
            "--latency-rate {rate}: must be at least 100 proposals per second"
        );
    }
    airlock_processor::runtime::logging::init("bench");
    let broker = Broker::find(&args.broker_process);
    if broker.is_none() {
        eprintln!(
            "no process named {:?} on this machine: the broker's CPU is not reported",
            args.broker_process
        );
    }
    BROKER.get_or_init(|| broker);
    // The processor's environment overrides apply (AIRLOCK_STATE_SYNC, AIRLOCK_BATCH_*, ...);
    // the arguments below win over them.
    let mut config = Config::default();
    let dir = sample::config_dir();
    config.tools.registry = dir.join("tools.toml");
    config.tools.policies = dir.join("policies.cedar");
    config.tools.entities = dir.join("entities.json");
    config.apply_env(|name| std::env::var(name).ok())?;
    config.kafka.brokers = args.brokers.clone();
    config.topics.prefix = format!("bench-{:x}.", wall_ms());
    config.topics.partitions = args.partitions;
    config.processor.session_timeout_ms = 6_000;
    let state = tempfile::tempdir()?;
    config.state.dir = state.path().to_owned();
    let names = Names::new(&config.topics.prefix);
    let core = Arc::new(load_core(&config)?);
    let rt = tokio::runtime::Runtime::new()?;
    let mut plan = names.plan(core.registry().tools().map(|t| t.connector.as_str()));
    plan.push(topics::TopicSpec {
        name: format!("{}passthrough", config.topics.prefix),
        configs: Vec::new(),
    });
    rt.block_on(topics::create(&config, &plan, Duration::from_secs(30)))?;
    let n = args.proposals;
    let now = wall_ms();
    let fresh: Vec<_> = (0..n)
        .map(|i| sample::fleet_refund(&format!("refund:b{i}"), i, now))
        .collect();
    println!(
        "broker {}, {} partitions, {n} proposals per phase",
        args.brokers, args.partitions
    );

    // 2. The processor on fresh keys (first, to learn its output records per input).
    produce_all(&config, &names.proposals(), &fresh)?;
    let fresh_run = run_processor(&config, core.clone(), &names, n)?;
    // 3. Duplicates: the same messages again.
    produce_all(&config, &names.proposals(), &fresh)?;
    let dup_run = run_processor(&config, core.clone(), &names, n)?;
    // 1. Pass-through over the same 2n proposals, same batch shape and producer.
    let per_input = fresh_run.records_per_input;
    let (pass_rate, pass_cpu) = pass_through(&config, &names, 2 * n, per_input)?;
    println!(
        "pass-through      {pass_rate:>9.0} proposals/s ({per_input:.1} records out per input)  {pass_cpu}"
    );
    for (name, run) in [("fresh", &fresh_run), ("dups ", &dup_run)] {
        println!(
            "processor {name}   {:>9.0} proposals/s  ratio {:.2}  {}",
            run.rate,
            run.rate / pass_rate,
            run.cpu
        );
    }
    // The decision core alone over the in-memory store: what the fresh ratio could reach if
    // RocksDB, the outbox and the changelog cost nothing, since the processor does at least
    // the pass-through's work (the same consume, as many produces) plus this.
    let alone = core_alone(core.clone(), &fresh, config.batch.max_records)?;
    let ceiling = pass_cpu.process_micros_per_input
        / (pass_cpu.process_micros_per_input + alone.micros_per_decision);
    println!(
        "core alone        {:>9.0} decisions/s on one thread, {:.1} µs each (in-memory store, no broker); \
         fresh ratio ceiling with a free store {ceiling:.2} (pass-through µs / (pass-through µs + core µs))",
        1e6 / alone.micros_per_decision,
        alone.micros_per_decision,
    );
    // 4. Latency at half the fresh rate, on topics and state of its own: the attempts the
    // phases above dispatched time out (no connector runs here) and must not fire meanwhile.
    let rate = match args.latency_rate {
        Some(rate) => rate,
        None => (fresh_run.rate / 2.0).max(100.0),
    };
    let mut config = config.clone();
    config.topics.prefix = format!("bench-{:x}-latency.", wall_ms());
    let latency_state = tempfile::tempdir()?;
    config.state.dir = latency_state.path().to_owned();
    let names = Names::new(&config.topics.prefix);
    let mut plan = names.plan(core.registry().tools().map(|t| t.connector.as_str()));
    let hop_topic = format!("{}hop", config.topics.prefix);
    plan.push(topics::TopicSpec {
        name: hop_topic.clone(),
        configs: Vec::new(),
    });
    rt.block_on(topics::create(&config, &plan, Duration::from_secs(30)))?;
    // The broker's share: one hop (produce to readable) at the same rate, same clients. The
    // processor's path is two hops (the proposal in, the decision out) plus its batch.
    let hop = hop_latency(&config, &hop_topic, rate, args.latency_seconds)?;
    println!(
        "broker hop at {rate:.0}/s: p50 {:.1} ms, p99 {:.1} ms over {} records (produce to readable)  {}",
        hop.p50, hop.p99, hop.count, hop.cpu
    );
    println!("  {}", hop.broker);
    let (lat, split, ready_after) = latency(&config, core, &names, rate, args.latency_seconds)?;
    println!(
        "latency at {rate:.0}/s: p50 {:.1} ms, p99 {:.1} ms over {} proposals (produce to decision readable)  p50 ratio to two hops {:.2}  {}",
        lat.p50,
        lat.p99,
        lat.count,
        lat.p50 / (2.0 * hop.p50),
        lat.cpu
    );
    println!("  {}", lat.broker);
    println!(
        "  load started once the instance was ready ({:.1} s after it started)",
        ready_after.as_secs_f64()
    );
    for (name, h) in [
        ("produce to sealed", &split.to_sealed),
        ("sealed to readable", &split.to_readable),
    ] {
        println!(
            "  of which {name:<19} p50 {:>5.1} ms, p99 {:>5.1} ms",
            h.value_at_quantile(0.5) as f64,
            h.value_at_quantile(0.99) as f64
        );
    }
    // 5. The Kafka Streams peer.
    if let Some(jar) = &args.streams_peer {
        let peer = streams_peer(&config, jar, args.streams_threads, &fresh, &args)?;
        println!(
            "kafka streams     {:>9.0} proposals/s  ratio {:.2}  airlock fresh ÷ streams {:.2}  {}  (the peer's JVM {:.0} µs per proposal)",
            peer.rate,
            peer.rate / pass_rate,
            fresh_run.rate / peer.rate,
            peer.cpu,
            peer.peer_micros_per_input,
        );
        let l = &peer.latency;
        println!(
            "kafka streams latency at {:.0}/s: p50 {:.1} ms, p99 {:.1} ms over {} proposals (produce to decision readable)  {}",
            peer.latency_rate, l.p50, l.p99, l.count, l.cpu
        );
        println!("  {}", l.broker);
    }
    Ok(())
}

/// What the Kafka Streams peer measured.
struct PeerRun {
    rate: f64,
    cpu: CpuUsage,
    /// CPU of the peer's own process (its JVM) per proposal, in µs.
    peer_micros_per_input: f64,
    latency_rate: f64,
    latency: RoundTrip,
}

/// The Kafka Streams peer (`processor/bench-peer/kafka-streams`) over `fresh` on topics of its
/// own (clock from its first decision to its last, as for the processor), then at half its own
/// rate (or `--latency-rate`) for the latency.
fn streams_peer(
    config: &Config,
    jar: &std::path::Path,
    threads: u32,
    fresh: &[ToolProposal],
    args: &Args,
) -> anyhow::Result<PeerRun> {
    let mut config = config.clone();
    config.topics.prefix = format!("bench-{:x}-streams.", wall_ms());
    let prefix = config.topics.prefix.clone();
    let (proposals, decisions) = (format!("{prefix}proposals"), format!("{prefix}decisions"));
    let plan: Vec<topics::TopicSpec> = ["proposals", "dispatch", "decisions"]
        .iter()
        .map(|t| topics::TopicSpec {
            name: format!("{prefix}{t}"),
            configs: Vec::new(),
        })
        .collect();
    tokio::runtime::Runtime::new()?.block_on(topics::create(
        &config,
        &plan,
        Duration::from_secs(30),
    ))?;
    produce_all(&config, &proposals, fresh)?;
    let work = tempfile::tempdir()?;
    let log = work.path().join("streams-peer.log");
    let schemas = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../schemas/avro");
    let mut child = std::process::Command::new("java")
        .args(["-Xms256m", "-Xmx1g", "-XX:+UseG1GC", "-jar"])
        .arg(jar)
        .arg(&config.kafka.brokers)
        .arg(&prefix)
        .arg(&schemas)
        .arg(work.path().join("state"))
        .arg(threads.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .spawn()
        .with_context(|| format!("starting java -jar {}", jar.display()))?;
    let result = measure_peer(&config, &decisions, fresh.len(), child.id(), args);
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let stopping = Instant::now() + Duration::from_secs(20);
    while matches!(child.try_wait(), Ok(None)) && Instant::now() < stopping {
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    result.with_context(|| format!("the Kafka Streams peer (its log: {})", log.display()))
}

fn measure_peer(
    config: &Config,
    decisions: &str,
    n: usize,
    pid: u32,
    args: &Args,
) -> anyhow::Result<PeerRun> {
    let peer_ticks = || -> anyhow::Result<u64> {
        process_ticks(&std::fs::read_to_string(format!("/proc/{pid}/stat"))?)
    };
    // Every decision readable (read_committed: the peer writes in transactions), counted.
    let reader: BaseConsumer = config
        .client_config()
        .set("group.id", "bench-streams-watch")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..config.topics.partitions {
        tpl.add_partition_offset(decisions, p, Offset::Beginning)?;
    }
    reader.assign(&tpl)?;
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut seen = 0usize;
    let mut started = None;
    while seen < n {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the peer decided {seen} of {n} in 600 s"
        );
        // Exited: gone, or a zombie until the caller reaps it.
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        anyhow::ensure!(
            !state.is_empty() && !state.contains(") Z "),
            "the peer exited after {seen} of {n} decisions"
        );
        if let Some(m) = reader.poll(Duration::from_millis(20)) {
            m?;
            seen += 1;
            if started.is_none() {
                started = Some((Instant::now(), seen, Cpu::now()?, peer_ticks()?));
            }
        }
    }
    let (t0, s0, cpu0, peer0) = started.context("no decision seen")?;
    let elapsed = t0.elapsed().as_secs_f64();
    let decided = (n - s0 + 1) as f64;
    let cpu = Cpu::now()?.since(cpu0, decided);
    let peer_micros_per_input = (peer_ticks()? - peer0) as f64 / USER_HZ * 1e6 / decided.max(1.0);
    let rate = decided / elapsed;
    let latency_rate = args.latency_rate.unwrap_or((rate / 2.0).max(100.0));
    let now = wall_ms();
    let sent: Arc<std::sync::Mutex<HashMap<String, Instant>>> = Arc::default();
    let codec = Codec::new();
    let latency = paced_round_trip(
        config,
        Paced {
            send_to: &format!("{}proposals", config.topics.prefix),
            read_from: decisions,
            group: "bench-streams-latency",
            rate: latency_rate,
            seconds: args.latency_seconds,
        },
        {
            let sent = sent.clone();
            let codec = Codec::new();
            move |i| {
                let p = sample::fleet_refund(&format!("refund:kslat{i}"), i, now);
                let payload = codec.encode_single_object(&p)?;
                sent.lock()
                    .map_err(|_| anyhow::anyhow!("poisoned"))?
                    .insert(p.proposal_id.clone(), Instant::now());
                Ok((p.operation_key, payload))
            }
        },
        |m| {
            let Some(Ok(d)) = m.payload().map(|p| codec.decode_as::<Decision>(p)) else {
                return Ok(None); // a barrier
            };
            let at = Instant::now();
            Ok(sent
                .lock()
                .map_err(|_| anyhow::anyhow!("poisoned"))?
                .remove(&d.in_reply_to)
                .map(|t| at.duration_since(t).as_micros() as u64))
        },
    )?;
    Ok(PeerRun {
        rate,
        cpu,
        peer_micros_per_input,
        latency_rate,
        latency,
    })
}

fn base_producer(config: &Config) -> anyhow::Result<ThreadedProducer<DefaultProducerContext>> {
    Ok(config
        .client_config()
        .set("partitioner", LIBRDKAFKA_PARTITIONER)
        .set("linger.ms", "5")
        .set("queue.buffering.max.messages", "1000000")
        .create()?)
}

fn produce_all(
    config: &Config,
    topic: &str,
    proposals: &[airlock_schemas::ToolProposal],
) -> anyhow::Result<()> {
    let producer = base_producer(config)?;
    let codec = Codec::new();
    for p in proposals {
        let payload = codec.encode_single_object(p)?;
        let mut record = BaseRecord::<str, [u8]>::to(topic)
            .key(p.operation_key.as_str())
            .payload(&payload);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((_, back)) => {
                    std::thread::sleep(Duration::from_millis(5));
                    record = back;
                }
            }
        }
    }
    producer.flush(Duration::from_secs(60))?;
    Ok(())
}

/// Clock ticks per second of `/proc` (`USER_HZ`, which Linux fixes at 100 on x86 and Arm).
const USER_HZ: f64 = 100.0;

/// CPU time so far, in clock ticks: this process's (every thread, the in-process processor's
/// among them, exited ones included) and the whole machine's (the broker and its container too).
#[derive(Debug, Clone, Copy)]
struct Cpu {
    process: u64,
    /// The broker's process, when it runs on this machine and was found (see [`Broker`]).
    broker: Option<u64>,
    busy: u64,
    steal: u64,
    total: u64,
}

impl Cpu {
    fn now() -> anyhow::Result<Self> {
        let process =
            std::fs::read_to_string("/proc/self/stat").context("reading /proc/self/stat")?;
        let machine = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
        let mut cpu = Cpu::parse(&process, &machine)?;
        cpu.broker = broker_ticks();
        Ok(cpu)
    }

    /// From the texts of `/proc/self/stat` and `/proc/stat` (no broker).
    fn parse(process: &str, machine: &str) -> anyhow::Result<Self> {
        let process = process_ticks(process)?;
        let ticks: Vec<u64> = machine
            .lines()
            .next()
            .and_then(|line| line.strip_prefix("cpu "))
            .context("/proc/stat has no cpu line")?
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()?;
        // user nice system idle iowait irq softirq steal (guest time is counted in user).
        let [user, nice, system, idle, iowait, irq, softirq, steal, ..] = ticks[..] else {
            anyhow::bail!("/proc/stat: the cpu line has fewer than 8 fields");
        };
        let busy = user + nice + system + irq + softirq;
        Ok(Cpu {
            process,
            broker: None,
            busy,
            steal,
            total: busy + idle + iowait + steal,
        })
    }

    /// What was used from `start` to `self`, over `inputs` proposals.
    fn since(self, start: Cpu, inputs: f64) -> CpuUsage {
        let total = (self.total - start.total).max(1) as f64;
        let per_input = |ticks: u64| ticks as f64 / USER_HZ * 1e6 / inputs.max(1.0);
        CpuUsage {
            process_micros_per_input: per_input(self.process - start.process),
            broker_micros_per_input: match (start.broker, self.broker) {
                (Some(from), Some(to)) => Some(per_input(to.saturating_sub(from))),
                _ => None,
            },
            machine_busy: (self.busy - start.busy) as f64 / total,
            machine_steal: (self.steal - start.steal) as f64 / total,
        }
    }
}

/// CPU over a phase: the cost per proposal in this process, and how busy the machine was.
#[derive(Debug, Clone, Copy)]
struct CpuUsage {
    process_micros_per_input: f64,
    /// The broker's CPU per proposal, when its process was found on this machine.
    broker_micros_per_input: Option<f64>,
    /// Share of all cores' time, 0 to 1.
    machine_busy: f64,
    machine_steal: f64,
}

impl std::fmt::Display for CpuUsage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cpu {:.0} µs per proposal in this process",
            self.process_micros_per_input
        )?;
        if let Some(broker) = self.broker_micros_per_input {
            write!(f, ", {broker:.0} in the broker")?;
        }
        write!(f, ", machine {:.0}% busy", 100.0 * self.machine_busy)?;
        if self.machine_steal >= 0.005 {
            write!(f, " ({:.0}% stolen)", 100.0 * self.machine_steal)?;
        }
        Ok(())
    }
}

/// utime + stime of a `/proc/PID/stat` text, in clock ticks.
fn process_ticks(stat: &str) -> anyhow::Result<u64> {
    // After the command name (in parentheses, may hold spaces) come field 3 (state) on; utime
    // and stime are fields 14 and 15.
    let (_, rest) = stat
        .rsplit_once(')')
        .context("/proc/PID/stat has no command name")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| -> anyhow::Result<u64> {
        Ok(fields
            .get(n - 3)
            .context("/proc/PID/stat has too few fields")?
            .parse()?)
    };
    Ok(field(14)? + field(15)?)
}

/// The broker's process, found once by name (`--broker-process`): `None` when it does not run
/// on this machine (a remote cluster) or was not found.
static BROKER: std::sync::OnceLock<Option<Broker>> = std::sync::OnceLock::new();

/// The CPU time so far of the broker found at start, if any (see [`BROKER`]).
fn broker_ticks() -> Option<u64> {
    BROKER.get().copied().flatten().and_then(Broker::ticks)
}

/// A broker process on this machine (a local container's processes are visible in the host's
/// `/proc`), whose CPU each phase reports beside this process's: on two cores the broker's
/// share is part of what a phase costs.
#[derive(Debug, Clone, Copy)]
struct Broker {
    pid: u32,
}

impl Broker {
    /// The first process whose command name (`/proc/PID/comm`) is `name`.
    fn find(name: &str) -> Option<Broker> {
        let mut pids: Vec<u32> = std::fs::read_dir("/proc")
            .ok()?
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect();
        pids.sort_unstable();
        pids.into_iter()
            .find(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .is_ok_and(|comm| comm.trim_end() == name)
            })
            .map(|pid| Broker { pid })
    }

    /// Its CPU time so far, in clock ticks; `None` once it is gone.
    fn ticks(self) -> Option<u64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).ok()?;
        process_ticks(&stat).ok()
    }
}

/// The broker's CPU second by second over a paced phase, in cores (1.0 = one core busy): the
/// trend shows whether its cost per record grows with the log (tansu 0.6's memory engine lists
/// every stored batch of a partition on each fetch).
#[derive(Debug, Default)]
struct BrokerTrend {
    last: Option<(Instant, u64)>,
    cores: Vec<f64>,
}

impl BrokerTrend {
    /// Takes a sample when a second has passed since the last one (the first call starts it).
    /// Called once per record read: `/proc` is read only when a sample is due.
    fn tick(&mut self) {
        let now = Instant::now();
        if let Some((at, _)) = self.last
            && now.duration_since(at) < Duration::from_secs(1)
        {
            return;
        }
        let Some(ticks) = broker_ticks() else {
            return;
        };
        if let Some((at, before)) = self.last {
            let seconds = now.duration_since(at).as_secs_f64();
            self.cores
                .push(ticks.saturating_sub(before) as f64 / USER_HZ / seconds);
        }
        self.last = Some((now, ticks));
    }
}

impl std::fmt::Display for BrokerTrend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.cores.is_empty() {
            return write!(f, "broker process not found");
        }
        write!(f, "broker cores by second:")?;
        for c in &self.cores {
            write!(f, " {c:.2}")?;
        }
        Ok(())
    }
}

/// Count of records in `topic` (sum of high watermarks).
fn topic_size(consumer: &BaseConsumer, topic: &str, partitions: i32) -> anyhow::Result<i64> {
    let mut total = 0;
    for p in 0..partitions {
        let (low, high) = consumer.fetch_watermarks(topic, p, Duration::from_secs(10))?;
        total += high - low;
    }
    Ok(total)
}

/// What one run of the processor measured.
struct ProcessorRun {
    /// Decisions per second.
    rate: f64,
    /// Output records produced per input record.
    records_per_input: f64,
    /// CPU used while the clock ran.
    cpu: CpuUsage,
}

/// Runs the processor until `new_decisions` more decisions are readable.
fn run_processor(
    config: &Config,
    core: Arc<airlock_processor::core::Core>,
    names: &Names,
    new_decisions: usize,
) -> anyhow::Result<ProcessorRun> {
    let watcher: BaseConsumer = config
        .client_config()
        .set("group.id", "bench-watch")
        .create()?;
    let parts = config.topics.partitions;
    let decisions = names.decisions();
    let before = topic_size(&watcher, &decisions, parts)?;
    let shutdown = Arc::new(AtomicBool::new(false));
    let flag = shutdown.clone();
    let cfg = config.clone();
    let handle = std::thread::spawn(move || run::run(&cfg, core, flag));
    // tansu 0.6 reports a high watermark that stops inside the last batch produced: when the
    // count stalls, a barrier record on every decisions partition (skipped by readers) moves
    // it past the batch. The barriers are not counted as decisions.
    let producer = Producer::new(&config.client_config(), 0)?;
    let mut barriers = 0i64;
    // The clock starts at the first new decision (after the partitions were claimed).
    let target_new = new_decisions as i64;
    let mut started = None;
    let mut last = (0i64, Instant::now());
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let size = topic_size(&watcher, &decisions, parts)? - before - barriers;
        if started.is_none() && size > i64::from(parts) {
            started = Some((Instant::now(), size, Cpu::now()?));
        }
        if size >= target_new + i64::from(parts) {
            break;
        }
        if size != last.0 {
            last = (size, Instant::now());
        } else if started.is_some() && last.1.elapsed() >= Duration::from_millis(100) {
            let marks: Vec<OutRecord> = (0..parts)
                .map(|p| OutRecord::barrier(&decisions, p))
                .collect();
            producer.send_phased(&marks)?;
            barriers += i64::from(parts);
            last.1 = Instant::now();
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "processor too slow: {size} decisions"
        );
        if handle.is_finished() {
            let result = handle
                .join()
                .map_err(|_| anyhow::anyhow!("processor panicked"))?;
            anyhow::bail!("the processor stopped after {size} decisions: {result:?}");
        }
        // Each look is two ListOffsets requests per partition, which tansu 0.6 answers by
        // listing every batch stored in the partition: looking every 5 ms throughout took
        // broker CPU from the processor being measured. Fine steps where the clock starts and
        // stops, coarse ones in between.
        let coarse = started.is_some() && size < target_new - target_new / 10;
        std::thread::sleep(Duration::from_millis(if coarse { 50 } else { 5 }));
    }
    let (t0, s0, cpu0) = started.context("no decision seen")?;
    let elapsed = t0.elapsed().as_secs_f64();
    let decided = (target_new + i64::from(parts) - s0) as f64;
    let cpu = Cpu::now()?.since(cpu0, decided);
    shutdown.store(true, Ordering::Relaxed);
    let summary = handle
        .join()
        .map_err(|_| anyhow::anyhow!("processor panicked"))??;
    let per_input = summary.produced as f64 / summary.inputs.max(1) as f64;
    Ok(ProcessorRun {
        rate: decided / elapsed,
        records_per_input: per_input,
        cpu,
    })
}

/// What the core alone measured.
struct CoreAlone {
    /// Wall time per decision on one thread (CPU-bound: nothing else runs meanwhile).
    micros_per_decision: f64,
}

/// Decides `proposals` on this thread as bench-core's `fresh-mem` phase does: Avro decode, the
/// core over a fresh in-memory store, Avro encode of every output, a commit per `batch`.
fn core_alone(
    core: Arc<Core>,
    proposals: &[ToolProposal],
    batch: usize,
) -> anyhow::Result<CoreAlone> {
    let codec = Codec::new();
    let payloads: Vec<Vec<u8>> = proposals
        .iter()
        .map(|p| codec.encode_single_object(p))
        .collect::<Result<_, _>>()?;
    let mut task = sample::memory_task(core)?;
    let mut outputs = 0usize;
    let started = Instant::now();
    for chunk in payloads.chunks(batch.max(1)) {
        for bytes in chunk {
            outputs += sample::decide_encoded(&mut task, &codec, bytes)?;
        }
        task.commit()?;
    }
    let elapsed = started.elapsed();
    std::hint::black_box(outputs);
    Ok(CoreAlone {
        micros_per_decision: elapsed.as_secs_f64() * 1e6 / proposals.len().max(1) as f64,
    })
}

/// The baseline: consume, produce `per_input` records per input, wait for acks, per batch.
fn pass_through(
    config: &Config,
    names: &Names,
    total: usize,
    per_input: f64,
) -> anyhow::Result<(f64, CpuUsage)> {
    let mut consumer_config = config.client_config();
    config
        .kafka
        .fetch_wait(&mut consumer_config, config.batch.flush_interval_ms);
    let consumer: BaseConsumer = consumer_config
        .set("group.id", format!("{}passthrough", config.topics.prefix))
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("partition.assignment.strategy", "range")
        .set("session.timeout.ms", "6000")
        .create()?;
    // Assigned, not subscribed: the baseline should measure reading and writing, not a group
    // join or rebalance that happens to fall inside its clock.
    let mut assignment = TopicPartitionList::new();
    for p in 0..config.topics.partitions {
        assignment.add_partition_offset(&names.proposals(), p, Offset::Beginning)?;
    }
    consumer.assign(&assignment)?;
    let producer = Arc::new(Producer::new(
        &config.client_config(),
        config.processor.linger_ms,
    )?);
    let out_topic = format!("{}passthrough", config.topics.prefix);
    let mut consumed = 0usize;
    let mut owed = 0.0f64;
    // Sent on a sender thread, as the processor's are (without a store to sync).
    let mut flights = Flights::with_sender(producer.clone())?;
    let mut row = 0u64;
    let mut started = None;
    let deadline = Instant::now() + Duration::from_secs(600);
    // The processor takes up to `batch.max_records` of every partition per batch.
    let max_records = config.batch.max_records * config.topics.partitions.max(1) as usize;
    while consumed < total {
        anyhow::ensure!(
            Instant::now() < deadline,
            "pass-through stalled at {consumed}"
        );
        let mut batch = Vec::new();
        // Closed as the processor closes its batches (`Batch::poll_timeout`), and as large.
        let mut first: Option<Instant> = None;
        while batch.len() < max_records {
            let Some(timeout) = config.batch.poll_timeout(first) else {
                break;
            };
            match consumer.poll(timeout) {
                Some(Ok(m)) => {
                    if started.is_none() {
                        started = Some((Instant::now(), Cpu::now()?));
                    }
                    first.get_or_insert_with(Instant::now);
                    batch.push((
                        m.partition(),
                        m.key().map(<[u8]>::to_vec),
                        m.payload().map(<[u8]>::to_vec),
                    ));
                }
                Some(Err(e)) => eprintln!("pass-through consumer: {e}"),
                None if first.is_some() => break,
                None => {}
            }
        }
        let mut out = Vec::new();
        for (i, (p, k, v)) in batch.iter().enumerate() {
            owed += per_input;
            while owed >= 1.0 {
                owed -= 1.0;
                out.push(OutRecord {
                    topic: out_topic.clone(),
                    partition: *p,
                    key: k.clone(),
                    value: v.clone(),
                    headers: wire::identity("bench", &i.to_string(), *p, 1),
                    phase: 0,
                });
            }
        }
        if !out.is_empty() {
            flights.send(
                &producer,
                vec![(0, Outbox { row, records: out })],
                Vec::new(),
            )?;
            row += 1;
        }
        flights.advance(&producer, config.batch.max_in_flight)?;
        consumed += batch.len();
    }
    flights.advance(&producer, 0)?;
    let (t0, cpu0) = started.context("nothing consumed")?;
    let elapsed = t0.elapsed().as_secs_f64();
    Ok((
        total as f64 / elapsed,
        Cpu::now()?.since(cpu0, total as f64),
    ))
}

/// Records at `rate` per second for `seconds` to `topic`, read back as the latency phase reads
/// decisions; p50/p99 from produce to readable, in ms.
fn hop_latency(config: &Config, topic: &str, rate: f64, seconds: u64) -> anyhow::Result<RoundTrip> {
    let clock = Instant::now();
    paced_round_trip(
        config,
        Paced {
            send_to: topic,
            read_from: topic,
            group: "bench-hop",
            rate,
            seconds,
        },
        // The payload is when it was sent, in µs on `clock`: no shared map needed.
        move |i| {
            let at = (clock.elapsed().as_micros() as u64).to_be_bytes();
            Ok((format!("hop{i}"), at.to_vec()))
        },
        |m| {
            let Some(sent) = m.payload().and_then(|p| <[u8; 8]>::try_from(p).ok()) else {
                return Ok(None); // a barrier
            };
            let now = clock.elapsed().as_micros() as u64;
            Ok(Some(now.saturating_sub(u64::from_be_bytes(sent))))
        },
    )
}

/// Where a decision's latency goes, in ms (wall clock): from the proposal's produce to the
/// decision handed to the processor's producer (its record's create time: the hop in, the wait
/// for the batch, decide and seal), and from there to readable (the hop out).
struct Split {
    to_sealed: Histogram<u64>,
    to_readable: Histogram<u64>,
}

/// Proposals at `rate` per second for `seconds`; latency from produce to decision readable.
fn latency(
    config: &Config,
    core: Arc<airlock_processor::core::Core>,
    names: &Names,
    rate: f64,
    seconds: u64,
) -> anyhow::Result<(RoundTrip, Split, Duration)> {
    let shutdown = Arc::new(AtomicBool::new(false));
    let flag = shutdown.clone();
    let cfg = config.clone();
    let telemetry = Arc::new(Telemetry::new(Duration::from_millis(
        config.telemetry.stall_after_ms,
    )));
    let probes = telemetry.clone();
    let handle = std::thread::spawn(move || run::run_with(&cfg, core, flag, telemetry));
    // Steady state, not start-up: the load starts once the instance is ready (joined, every
    // partition claimed, fence markers written), not after a fixed wait that assumed the
    // claim would be done by then (it is ready ≈ 1 s after it starts on the dev machine).
    let ready_after = await_ready(probes.as_ref(), &handle, Duration::from_secs(60))?;
    let sent: Arc<std::sync::Mutex<HashMap<String, (Instant, i64)>>> = Arc::default();
    let mut split = Split {
        to_sealed: Histogram::new(3)?,
        to_readable: Histogram::new(3)?,
    };
    let now = wall_ms();
    let codec = Codec::new();
    let result = paced_round_trip(
        config,
        Paced {
            send_to: &names.proposals(),
            read_from: &names.decisions(),
            group: "bench-latency",
            rate,
            seconds,
        },
        {
            let sent = sent.clone();
            let codec = Codec::new();
            move |i| {
                let p = sample::fleet_refund(&format!("refund:lat{i}"), i, now);
                let payload = codec.encode_single_object(&p)?;
                sent.lock()
                    .map_err(|_| anyhow::anyhow!("poisoned"))?
                    .insert(p.proposal_id.clone(), (Instant::now(), wall_ms()));
                Ok((p.operation_key, payload))
            }
        },
        |m| {
            let Some(payload) = m.payload() else {
                return Ok(None);
            };
            let Ok(d) = codec.decode_as::<Decision>(payload) else {
                return Ok(None); // a fence marker or barrier
            };
            let (at, wall) = (Instant::now(), wall_ms());
            let Some((t, t_wall)) = sent
                .lock()
                .map_err(|_| anyhow::anyhow!("poisoned"))?
                .remove(&d.in_reply_to)
            else {
                return Ok(None);
            };
            if let Some(created) = m.timestamp().to_millis() {
                split.to_sealed.record((created - t_wall).max(0) as u64)?;
                split.to_readable.record((wall - created).max(0) as u64)?;
            }
            Ok(Some(at.duration_since(t).as_micros() as u64))
        },
    );
    shutdown.store(true, Ordering::Relaxed);
    handle
        .join()
        .map_err(|_| anyhow::anyhow!("processor panicked"))??;
    Ok((result?, split, ready_after))
}

/// Waits until `probes` report the in-process instance ready (what its `/readyz` answers);
/// how long that took. Fails if the instance stops first or is not ready within `limit`.
fn await_ready(
    probes: &dyn Probes,
    instance: &std::thread::JoinHandle<run::Result<run::Summary>>,
    limit: Duration,
) -> anyhow::Result<Duration> {
    let start = Instant::now();
    loop {
        let why = match probes.ready() {
            Ok(()) => return Ok(start.elapsed()),
            Err(why) => why,
        };
        anyhow::ensure!(
            !instance.is_finished(),
            "the processor stopped before it was ready ({why})"
        );
        anyhow::ensure!(
            start.elapsed() < limit,
            "the processor was not ready after {limit:?}: {why}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// What a paced round trip measured: latency in ms, how many records, the CPU it took.
struct RoundTrip {
    p50: f64,
    p99: f64,
    count: u64,
    cpu: CpuUsage,
    broker: BrokerTrend,
}

/// A paced sender sleeps only for a record due more than this far ahead and sends the records
/// due sooner at once: about one wake-up per millisecond rather than one per record. Each
/// record's latency counts from when it was actually sent, so sending up to this much early
/// changes the arrival pattern only, not what is measured. (A wake-up per record is a context
/// switch or two every 100-200 µs at these rates, CPU taken from the processor and the broker
/// that share the machine with the load generator.)
const PACE_SLACK: Duration = Duration::from_millis(1);

/// What a latency measurement sends and reads.
struct Paced<'a> {
    send_to: &'a str,
    read_from: &'a str,
    group: &'a str,
    rate: f64,
    seconds: u64,
}

/// Sends `rate × seconds` records (`record(i)` gives key and payload) at `rate` per second from
/// a thread with the proposals' producer, reads `read_from` from its current end and records
/// `latency(message)` in µs (`None`: not a measured record) until every record is measured or
/// the time is up. The last records stay behind tansu's high watermark until something follows
/// them: once the sender is done and the reader quiet, barriers (skipped) follow them.
fn paced_round_trip(
    config: &Config,
    paced: Paced<'_>,
    mut record: impl FnMut(usize) -> anyhow::Result<(String, Vec<u8>)> + Send + 'static,
    mut latency: impl FnMut(&BorrowedMessage<'_>) -> anyhow::Result<Option<u64>>,
) -> anyhow::Result<RoundTrip> {
    let reader: BaseConsumer = config
        .client_config()
        .set("group.id", paced.group)
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "5")
        // librdkafka's default, spelled out: the Kafka Streams peer writes in transactions,
        // and a decision counts once it is readable by everyone.
        .set("isolation.level", "read_committed")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..config.topics.partitions {
        let (_, high) = reader.fetch_watermarks(paced.read_from, p, Duration::from_secs(10))?;
        tpl.add_partition_offset(paced.read_from, p, Offset::Offset(high))?;
    }
    reader.assign(&tpl)?;
    let producer = base_producer(config)?;
    let total = (paced.rate * paced.seconds as f64) as usize;
    let cpu = Cpu::now()?;
    let interval = Duration::from_secs_f64(1.0 / paced.rate);
    let sender = {
        let topic = paced.send_to.to_owned();
        std::thread::spawn(move || -> anyhow::Result<()> {
            let start = Instant::now();
            for i in 0..total {
                let due = start + interval.mul_f64(i as f64);
                if let Some(wait) = due.checked_duration_since(Instant::now())
                    && wait > PACE_SLACK
                {
                    std::thread::sleep(wait);
                }
                let (key, payload) = record(i)?;
                let r = BaseRecord::<str, [u8]>::to(&topic)
                    .key(&key)
                    .payload(&payload);
                producer
                    .send(r)
                    .map_err(|(e, _)| anyhow::anyhow!("send: {e}"))?;
            }
            producer.flush(Duration::from_secs(30))?;
            Ok(())
        })
    };
    let mut hist = Histogram::<u64>::new(3)?;
    let deadline = Instant::now() + Duration::from_secs(paced.seconds + 60);
    let marker = Producer::new(&config.client_config(), 0)?;
    let mut quiet_since = Instant::now();
    let mut broker = BrokerTrend::default();
    while (hist.len() as usize) < total && Instant::now() < deadline {
        if !sender.is_finished() {
            broker.tick();
        }
        let Some(m) = reader.poll(Duration::from_millis(20)) else {
            if sender.is_finished() && quiet_since.elapsed() >= Duration::from_millis(100) {
                let marks: Vec<OutRecord> = (0..config.topics.partitions)
                    .map(|p| OutRecord::barrier(paced.read_from, p))
                    .collect();
                marker.send_phased(&marks)?;
                quiet_since = Instant::now();
            }
            continue;
        };
        quiet_since = Instant::now();
        if let Some(micros) = latency(&m?)? {
            hist.record(micros)?;
        }
    }
    sender
        .join()
        .map_err(|_| anyhow::anyhow!("sender panicked"))??;
    Ok(RoundTrip {
        p50: hist.value_at_quantile(0.5) as f64 / 1000.0,
        p99: hist.value_at_quantile(0.99) as f64 / 1000.0,
        count: hist.len(),
        cpu: Cpu::now()?.since(cpu, hist.len() as f64),
        broker,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MACHINE: &str = "cpu  100 20 30 800 40 5 5 10 7 0\ncpu0 50 10 15 400 20 2 3 5 3 0\n";

    #[test]
    fn cpu_reads_utime_and_stime_past_a_command_name_with_spaces_and_parentheses() {
        let process = "4242 (bench (x) y) S 1 4242 4242 0 -1 4194304 10 0 0 0 \
                       250 75 0 0 20 0 9 0 100 1000 50";
        let cpu = Cpu::parse(process, MACHINE).expect("well-formed /proc texts");
        assert_eq!(cpu.process, 325);
        assert_eq!(cpu.busy, 160, "user + nice + system + irq + softirq");
        assert_eq!(cpu.steal, 10);
        assert_eq!(
            cpu.total, 1010,
            "busy + idle + iowait + steal; guest is inside user"
        );

        let later = Cpu {
            process: cpu.process + 100,
            broker: None,
            busy: cpu.busy + 150,
            steal: cpu.steal + 10,
            total: cpu.total + 200,
        };
        let usage = later.since(cpu, 500.0);
        assert_eq!(
            usage.process_micros_per_input, 2_000.0,
            "1 s of CPU over 500"
        );
        assert_eq!(usage.machine_busy, 0.75);
        assert_eq!(usage.machine_steal, 0.05);
        assert_eq!(
            usage.to_string(),
            "cpu 2000 µs per proposal in this process, machine 75% busy (5% stolen)"
        );

        // With the broker's process found at both ends, its share is reported beside ours.
        let with_broker = |ticks| Cpu {
            broker: Some(ticks),
            ..cpu
        };
        let usage = Cpu {
            broker: Some(40),
            ..later
        }
        .since(with_broker(15), 500.0);
        assert_eq!(
            usage.broker_micros_per_input,
            Some(500.0),
            "0.25 s over 500"
        );
        assert_eq!(
            usage.to_string(),
            "cpu 2000 µs per proposal in this process, 500 in the broker, machine 75% busy (5% stolen)"
        );
        assert_eq!(
            later.since(with_broker(15), 500.0).broker_micros_per_input,
            None,
            "gone by the end: not reported"
        );
    }

    #[test]
    fn the_broker_is_found_by_command_name_and_its_ticks_read() {
        let comm = std::fs::read_to_string("/proc/self/comm").expect("procfs");
        let found = Broker::find(comm.trim_end()).expect("this process is running");
        assert!(found.ticks().is_some());
        assert!(Broker::find("no-such-process-name").is_none());
    }

    #[test]
    fn the_broker_trend_prints_its_cores_by_second() {
        let mut trend = BrokerTrend::default();
        assert_eq!(trend.to_string(), "broker process not found");
        trend.cores = vec![0.25, 0.5];
        assert_eq!(trend.to_string(), "broker cores by second: 0.25 0.50");
    }

    #[test]
    fn cpu_rejects_truncated_proc_texts() {
        assert!(
            Cpu::parse("4242 bench S 1", MACHINE).is_err(),
            "no parentheses"
        );
        assert!(
            Cpu::parse("4242 (bench) S 1 2 3", MACHINE).is_err(),
            "too few fields"
        );
        let process = "1 (b) S 1 1 1 0 -1 0 0 0 0 0 1 1 0 0";
        assert!(
            Cpu::parse(process, "cpu  1 2 3 4 5 6 7\n").is_err(),
            "7 fields"
        );
        assert!(Cpu::parse(process, "intr 1 2 3\n").is_err(), "no cpu line");
        assert!(Cpu::parse(process, MACHINE).is_ok());
    }
}
