//! OpenTelemetry traces across Kafka: the W3C trace context (`traceparent`, `tracestate`) is
//! read from an input record's headers and written on the records its handling produces, so
//! one trace runs from an agent's proposal through the processor's decision, the connector's
//! execution and the processor's settlement of the outcome.
//!
//! Spans are made with the global tracer provider. Without one (the default) they record
//! nothing, but the context still flows: a proposal's `traceparent` reaches the dispatch
//! command, so a connector with export configured joins the agent's trace. [`init`] installs a
//! provider that exports over OTLP/HTTP (protobuf) when an endpoint is configured.
//!
//! The headers ride in the outbox entry like every other header: an output resent after a
//! crash carries the same context; an input decided again after a crash gets a new span and
//! its outputs a new `traceparent` (the header is not part of any record's identity).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{SpanKind, TraceContextExt, Tracer};
use opentelemetry::{Context, KeyValue, global};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;

/// The W3C trace-context header names, used as Kafka header names (as OpenTelemetry's
/// messaging conventions do).
pub const TRACEPARENT: &str = "traceparent";
pub const TRACESTATE: &str = "tracestate";

/// The instrumentation scope of every Airlock span.
pub const SCOPE: &str = "airlock";

/// Errors of installing the exporter.
#[derive(Debug, thiserror::Error)]
#[error("OTLP trace exporter for {endpoint}: {message}")]
pub struct Error {
    pub endpoint: String,
    pub message: String,
}

/// Whether [`install`] put a provider in place. Without one every span would be a no-op, so
/// [`consume`] skips making them (their name, attributes and the global tracer lookup were
/// ≈ 1.5% of the processor's samples in a `perf` profile of `airlock-bench-runtime`) and
/// hands on the parent's context, which is what a no-op span carries too. A provider set
/// with `opentelemetry::global::set_tracer_provider` directly is not seen: use [`install`].
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// The tracer every Airlock span is made with.
pub fn tracer() -> global::BoxedTracer {
    global::tracer(SCOPE)
}

/// Makes `provider` the global tracer provider that Airlock's spans are made with (what
/// [`init`] does with its exporter; tests pass one that keeps spans in memory).
pub fn install(provider: SdkTracerProvider) {
    global::set_tracer_provider(provider);
    INSTALLED.store(true, Ordering::Release);
}

/// True when spans are recorded somewhere (a provider was [`install`]ed).
pub fn enabled() -> bool {
    INSTALLED.load(Ordering::Acquire)
}

/// Starts the span of handling one consumed record, a child of `parent` (the context the
/// record's headers carry), with OpenTelemetry's messaging attributes for Kafka and `extra`;
/// returns the context holding it (end it with `cx.span().end()`). `name` and `extra` are
/// only evaluated when a provider is installed; without one the parent's context is returned
/// as it is, so its trace still reaches the records this one causes.
pub fn consume<E: IntoIterator<Item = KeyValue>>(
    name: std::fmt::Arguments<'_>,
    topic: &str,
    partition: i32,
    offset: i64,
    extra: impl FnOnce() -> E,
    parent: &Context,
) -> Context {
    if !enabled() {
        return parent.clone();
    }
    let tracer = tracer();
    let mut attributes = vec![
        KeyValue::new("messaging.system", "kafka"),
        KeyValue::new("messaging.destination.name", topic.to_owned()),
        KeyValue::new("messaging.destination.partition.id", partition.to_string()),
        KeyValue::new("messaging.kafka.offset", offset),
    ];
    attributes.extend(extra());
    let span = tracer
        .span_builder(name.to_string())
        .with_kind(SpanKind::Consumer)
        .with_attributes(attributes)
        .start_with_context(&tracer, parent);
    parent.with_span(span)
}

/// The context a record's headers carry (an empty context when none or an invalid one: the
/// span made under it starts a new trace).
pub fn extract<'a>(headers: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> Context {
    let mut found = Found::default();
    for (k, v) in headers {
        let slot = match k {
            TRACEPARENT => &mut found.traceparent,
            TRACESTATE => &mut found.tracestate,
            _ => continue,
        };
        *slot = std::str::from_utf8(v).ok();
    }
    if found.traceparent.is_none() {
        return Context::new();
    }
    TraceContextPropagator::new().extract(&found)
}

/// The headers that carry `cx`'s span to the records it causes (none without a valid span).
pub fn inject(cx: &Context) -> Vec<(String, Vec<u8>)> {
    if !cx.span().span_context().is_valid() {
        return Vec::new();
    }
    let mut carrier: HashMap<String, String> = HashMap::new();
    TraceContextPropagator::new().inject_context(cx, &mut carrier);
    let mut out: Vec<(String, Vec<u8>)> = carrier
        .into_iter()
        .filter(|(k, v)| (k == TRACEPARENT || k == TRACESTATE) && !v.is_empty())
        .map(|(k, v)| (k, v.into_bytes()))
        .collect();
    // Deterministic header order: traceparent first.
    out.sort_by_key(|(k, _)| k != TRACEPARENT);
    out
}

#[derive(Default)]
struct Found<'a> {
    traceparent: Option<&'a str>,
    tracestate: Option<&'a str>,
}

impl Extractor for Found<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        match key {
            TRACEPARENT => self.traceparent,
            TRACESTATE => self.tracestate,
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        vec![TRACEPARENT, TRACESTATE]
    }
}

/// Flushes and stops the exporter when dropped (at the end of `main`).
#[derive(Debug)]
pub struct Export {
    provider: SdkTracerProvider,
}

impl Drop for Export {
    fn drop(&mut self) {
        if let Err(e) = self.provider.shutdown() {
            log::warn!("stopping the trace exporter: {e}");
        }
    }
}

/// Installs a global tracer provider that exports spans of `service` in batches over
/// OTLP/HTTP to `endpoint` (the collector's base URL, `/v1/traces` appended), or, when that
/// is empty, to where `OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`
/// point. Neither set: nothing is installed and spans stay no-ops. Call it before any thread
/// is started that makes spans, outside any tokio runtime (the exporter's HTTP client blocks).
/// The client is built without TLS: `http://` only (a local collector or sidecar forwards).
pub fn init(service: &str, endpoint: &str) -> Result<Option<Export>, Error> {
    use opentelemetry_otlp::WithExportConfig;

    let from_env = [
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    ]
    .iter()
    .find_map(|v| std::env::var(v).ok().filter(|s| !s.trim().is_empty()));
    let endpoint = endpoint.trim();
    let mut builder = opentelemetry_otlp::SpanExporter::builder().with_http();
    let shown = if endpoint.is_empty() {
        match from_env {
            Some(e) => e,
            None => return Ok(None),
        }
    } else {
        let full = format!("{}/v1/traces", endpoint.trim_end_matches('/'));
        builder = builder.with_endpoint(full.clone());
        full
    };
    let exporter = builder.build().map_err(|e| Error {
        endpoint: shown.clone(),
        message: e.to_string(),
    })?;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name(service.to_owned())
                .build(),
        )
        .build();
    install(provider.clone());
    log::info!("exporting traces of {service} over OTLP/HTTP to {shown}");
    Ok(Some(Export { provider }))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};

    use super::*;

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_traceparent_header_round_trips_and_garbage_starts_a_new_trace() {
        let cx = extract([
            ("airlock-kind", &b"decision"[..]),
            (TRACEPARENT, PARENT.as_bytes()),
            (TRACESTATE, b"vendor=1"),
        ]);
        let sc = cx.span().span_context().clone();
        assert!(sc.is_valid() && sc.is_remote() && sc.is_sampled());
        assert_eq!(
            sc.trace_id(),
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap()
        );
        assert_eq!(
            inject(&cx),
            vec![
                (TRACEPARENT.to_owned(), PARENT.as_bytes().to_vec()),
                (TRACESTATE.to_owned(), b"vendor=1".to_vec()),
            ]
        );
        for bad in [&b"00-zz-00-01"[..], b"\xff", b""] {
            let cx = extract([(TRACEPARENT, bad)]);
            assert!(!cx.span().span_context().is_valid());
            assert!(inject(&cx).is_empty());
        }
        assert!(inject(&extract([])).is_empty());
    }

    #[test]
    fn without_a_provider_a_consumed_record_hands_on_its_parents_trace() {
        // No test of this binary installs a provider.
        assert!(!enabled());
        let parent = extract([(TRACEPARENT, PARENT.as_bytes())]);
        let cx = consume(
            format_args!("decide proposal"),
            "t",
            0,
            7,
            || -> Vec<KeyValue> { unreachable!("attributes are not built without a provider") },
            &parent,
        );
        assert_eq!(
            inject(&cx),
            vec![(TRACEPARENT.to_owned(), PARENT.as_bytes().to_vec())]
        );
        let orphan = consume(format_args!("x"), "t", 0, 8, Vec::new, &Context::new());
        assert!(inject(&orphan).is_empty());
    }

    #[test]
    fn a_child_span_context_keeps_the_trace_and_changes_the_parent_id() {
        let parent = SpanContext::new(
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap(),
            SpanId::from_hex("00f067aa0ba902b7").unwrap(),
            TraceFlags::SAMPLED,
            true,
            TraceState::default(),
        );
        let child = SpanContext::new(
            parent.trace_id(),
            SpanId::from_hex("1111111111111111").unwrap(),
            TraceFlags::SAMPLED,
            false,
            TraceState::default(),
        );
        let headers = inject(&Context::new().with_remote_span_context(child));
        assert_eq!(
            headers[0].1,
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-1111111111111111-01".to_vec()
        );
    }
}
