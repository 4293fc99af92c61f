//! OpenTelemetry traces across Kafka: one proposal is one trace, from the processor's decision
//! through the connector worker's execution to the processor's settlement of the outcome, the
//! context carried in `traceparent` headers. Processor, worker and ledger run in this process,
//! all exporting to one in-memory exporter (its own test binary: the tracer provider is global).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use airlock_connectors::ledger;
use airlock_connectors::worker;
use airlock_processor::sample;
use airlock_processor::telemetry::trace::TRACEPARENT;
use airlock_schemas::{Codec, Decision, Verdict};
use airlock_tests::airlock::{Airlock, Options};
use airlock_tests::connector::Keys;
use airlock_tests::eventually;
use airlock_tests::wall_ms;
use opentelemetry::trace::{SpanId, TraceId};
use opentelemetry::{KeyValue, Value};
use opentelemetry_sdk::trace::{InMemorySpanExporterBuilder, SdkTracerProvider, SpanData};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::FutureRecord;

const WAIT: Duration = Duration::from_secs(90);
const AGENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const AGENT_SPAN: &str = "00f067aa0ba902b7";

fn attribute<'a>(span: &'a SpanData, key: &str) -> Option<&'a Value> {
    span.attributes
        .iter()
        .find(|KeyValue { key: k, .. }| k.as_str() == key)
        .map(|kv| &kv.value)
}

fn of_key<'a>(spans: &'a [SpanData], name: &str, key: &str) -> Vec<&'a SpanData> {
    spans
        .iter()
        .filter(|s| s.name == name)
        .filter(|s| attribute(s, "airlock.operation_key") == Some(&Value::from(key.to_owned())))
        .collect()
}

fn committed(a: &Airlock, key: &str) -> anyhow::Result<Option<Decision>> {
    Ok(
        a.read_deduplicated::<Decision>(&a.names.decisions(), "decision")?
            .into_iter()
            .find(|d| d.operation_key == key && d.verdict == Verdict::Committed),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_proposal_is_one_trace_across_processor_and_connector() -> anyhow::Result<()> {
    let exporter = InMemorySpanExporterBuilder::new().build();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    airlock_processor::telemetry::trace::install(provider.clone());

    let keys = Keys::generate()?;
    let a = Airlock::start_with(
        "traces",
        2,
        Options {
            reference_attempt_timeouts: true,
            signing_key_file: Some(keys.signing_file.clone()),
            ..Options::default()
        },
    )
    .await?;

    // The reference ledger, in process.
    let ledger_dir = tempfile::tempdir()?;
    let mut ledger_config = ledger::config::Config::local(ledger_dir.path().join("l.sqlite"));
    ledger_config.accounts = vec![ledger::model::AccountSpec {
        tenant_id: "acme".to_owned(),
        account_id: "acct-42".to_owned(),
        currency: "EUR".to_owned(),
        balance_minor: 10_000_000,
    }];
    let server = ledger::server::Server::bind(&ledger_config).await?;
    let ledger_url = format!("http://{}", server.local_addr());
    let (stop_ledger, ledger_stopped) = tokio::sync::oneshot::channel::<()>();
    let ledger_task = tokio::spawn(server.run(async move {
        let _ = ledger_stopped.await;
    }));

    // The processor and the ledger's connector worker, in process.
    let processor = a.spawn("p1")?;
    let text = std::fs::read_to_string(sample::config_dir().join("connector-ledger.toml"))?;
    let mut config = worker::Config::parse(&text, "connector-ledger.toml")?;
    let partitions = a.config.topics.partitions.to_string();
    let verifying = keys.verifying_file.display().to_string();
    let env = BTreeMap::from([
        ("AIRLOCK_KAFKA_BROKERS", a.config.kafka.brokers.as_str()),
        ("AIRLOCK_TOPICS_PREFIX", a.config.topics.prefix.as_str()),
        ("AIRLOCK_TOPICS_PARTITIONS", partitions.as_str()),
        ("AIRLOCK_CONNECTOR_WORKER_ID", "w1"),
        ("AIRLOCK_CONNECTOR_BASE_URL", ledger_url.as_str()),
        ("AIRLOCK_CONNECTOR_VERIFYING_KEY_FILES", verifying.as_str()),
        ("AIRLOCK_CONNECTOR_SESSION_TIMEOUT_MS", "6000"),
        ("AIRLOCK_CONNECTOR_MAX_POLL_INTERVAL_MS", "30000"),
    ]);
    config.apply_env(|n| env.get(n).map(|v| (*v).to_owned()))?;
    config.validate()?;
    let stop_worker = Arc::new(AtomicBool::new(false));
    let flag = stop_worker.clone();
    let worker_telemetry = Arc::new(worker::telemetry::Telemetry::new(Duration::from_secs(60)));
    let recorder = worker_telemetry.clone();
    let worker_thread = std::thread::spawn(move || worker::run_with(&config, flag, recorder));

    // One proposal inside the agent's trace, one without any trace context.
    let producer = a.producer()?;
    let codec = Codec::new();
    let traced = sample::refund("refund:traced-1", 2_500, wall_ms());
    let untraced = sample::refund("refund:untraced-1", 1_500, wall_ms());
    let traceparent = format!("00-{AGENT_TRACE}-{AGENT_SPAN}-01");
    let proposals_topic = a.names.proposals();
    for (p, header) in [(&traced, Some(traceparent.as_str())), (&untraced, None)] {
        let payload = codec.encode_single_object(p)?;
        let mut record: FutureRecord<'_, str, [u8]> = FutureRecord::to(&proposals_topic)
            .key(p.operation_key.as_str())
            .payload(payload.as_slice());
        if let Some(value) = header {
            record = record.headers(OwnedHeaders::new().insert(Header {
                key: TRACEPARENT,
                value: Some(value),
            }));
        }
        producer
            .send(record, Duration::from_secs(30))
            .await
            .map_err(|(e, _)| anyhow::anyhow!("producing: {e}"))?;
    }
    for key in [&traced.operation_key, &untraced.operation_key] {
        eventually(&format!("{key} COMMITTED"), WAIT, async || {
            committed(&a, key)
        })
        .await?;
    }

    // Every span of a key: its proposal's decision, the worker's execution, and the
    // decisions of the outcomes the worker reported (ATTEMPT_STARTED, COMMITTED).
    let spans = eventually("the spans of both keys", WAIT, async || {
        let spans = exporter.get_finished_spans()?;
        let complete = [&traced.operation_key, &untraced.operation_key]
            .iter()
            .all(|key| {
                of_key(&spans, "decide proposal", key).len() == 1
                    && of_key(&spans, "execute refund", key).len() == 1
                    && of_key(&spans, "decide outcome", key).len() >= 2
            });
        Ok(complete.then_some(spans))
    })
    .await?;

    let agent_trace = TraceId::from_hex(AGENT_TRACE)?;
    let decide = of_key(&spans, "decide proposal", &traced.operation_key)[0];
    let execute = of_key(&spans, "execute refund", &traced.operation_key)[0];
    let settle = of_key(&spans, "decide outcome", &traced.operation_key);
    // One trace, the agent's: proposal → decision → execution → settlement.
    assert_eq!(decide.span_context.trace_id(), agent_trace);
    assert_eq!(decide.parent_span_id, SpanId::from_hex(AGENT_SPAN)?);
    assert_eq!(execute.span_context.trace_id(), agent_trace);
    assert_eq!(execute.parent_span_id, decide.span_context.span_id());
    for s in &settle {
        assert_eq!(s.span_context.trace_id(), agent_trace, "{}", s.name);
        assert_eq!(s.parent_span_id, execute.span_context.span_id());
    }
    assert_eq!(
        attribute(decide, "airlock.verdict"),
        Some(&Value::from("ACCEPTED"))
    );
    assert_eq!(
        attribute(execute, "airlock.outcome"),
        Some(&Value::from("COMMITTED"))
    );
    assert!(
        settle
            .iter()
            .any(|s| attribute(s, "airlock.verdict") == Some(&Value::from("COMMITTED"))),
        "{settle:#?}"
    );

    // Without a traceparent the decision starts a trace of its own, which the worker joins.
    let decide = of_key(&spans, "decide proposal", &untraced.operation_key)[0];
    let execute = of_key(&spans, "execute refund", &untraced.operation_key)[0];
    assert_eq!(decide.parent_span_id, SpanId::INVALID);
    assert_ne!(decide.span_context.trace_id(), agent_trace);
    assert_eq!(
        execute.span_context.trace_id(),
        decide.span_context.trace_id()
    );
    assert_eq!(execute.parent_span_id, decide.span_context.span_id());

    // The worker's own telemetry saw the two executions.
    assert_eq!(worker_telemetry.commands.get(&["COMMITTED"]), 2);
    assert_eq!(
        worker_telemetry
            .call_duration
            .get(&["execute", "COMMITTED"])
            .0,
        2
    );

    stop_worker.store(true, Ordering::Relaxed);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !worker_thread.is_finished() {
        anyhow::ensure!(Instant::now() < deadline, "the worker did not stop");
        std::thread::sleep(Duration::from_millis(50));
    }
    worker_thread
        .join()
        .map_err(|_| anyhow::anyhow!("worker thread panicked"))??;
    processor.stop()?;
    let _ = stop_ledger.send(());
    ledger_task.await?;
    provider.shutdown()?;
    Ok(())
}
