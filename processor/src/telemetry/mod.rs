//! Telemetry shared by every Airlock process (the processor and the connector workers):
//! Prometheus metrics and the HTTP endpoint that serves them with health and readiness.
//!
//! # Layout
//! - [`metrics`]: counters, gauges and histograms with labels; the text exposition format.
//! - [`health`]: liveness and readiness of a consumer-group member.
//! - [`trace`]: W3C trace context in Kafka headers; OTLP export.
//! - [`server`]: `/metrics`, `/healthz`, `/readyz` on a thread of its own.

pub mod health;
pub mod metrics;
pub mod server;
pub mod trace;
