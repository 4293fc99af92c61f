//! A small Prometheus metrics registry: counters, gauges and histograms with labels, rendered
//! in the text exposition format 0.0.4 (`# HELP`, `# TYPE`, one sample per line; histograms as
//! cumulative `_bucket{le="..."}`, `_sum` and `_count`).
//!
//! Written here rather than taken from a crate: the processor records at batch granularity from
//! one thread and the exposition is a page of text, so a mutex per family is all it needs.
//! Families render in registration order, series in label order (stable scrapes, easy tests).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, MutexGuard};

/// The `Content-Type` of [`Registry::render`]'s output.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Buckets for latencies in seconds: 5 ms to 1 min.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// The families of one process, rendered together.
#[derive(Default)]
pub struct Registry {
    families: Mutex<Vec<Arc<dyn Render>>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("families", &lock(&self.families).len())
            .finish()
    }
}

trait Render: Send + Sync {
    fn render(&self, out: &mut String);
}

impl Registry {
    pub fn new() -> Self {
        Self::default()
    }

    /// A counter family; `name` should end in `_total`. Without labels its one series starts
    /// at 0 so that it is scraped before anything happened.
    pub fn counter(
        &self,
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
    ) -> Arc<Counter> {
        let c = Arc::new(Counter(Family::new(name, help, labels, "counter")));
        if labels.is_empty() {
            c.add(&[], 0);
        }
        lock(&self.families).push(c.clone());
        c
    }

    /// A gauge family. Without labels its one series starts at 0.
    pub fn gauge(
        &self,
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
    ) -> Arc<Gauge> {
        let g = Arc::new(Gauge(Family::new(name, help, labels, "gauge")));
        if labels.is_empty() {
            g.set(&[], 0.0);
        }
        lock(&self.families).push(g.clone());
        g
    }

    /// A histogram family with the upper bounds `buckets` (ascending; `+Inf` is implied).
    pub fn histogram(
        &self,
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
        buckets: &'static [f64],
    ) -> Arc<Histogram> {
        debug_assert!(buckets.windows(2).all(|w| w[0] < w[1]), "buckets ascend");
        let h = Arc::new(Histogram {
            family: Family::new(name, help, labels, "histogram"),
            buckets,
        });
        if labels.is_empty() {
            h.touch(&[]);
        }
        lock(&self.families).push(h.clone());
        h
    }

    /// Every family in the text exposition format 0.0.4.
    pub fn render(&self) -> String {
        let families: Vec<Arc<dyn Render>> = lock(&self.families).clone();
        let mut out = String::with_capacity(4096);
        for f in families {
            f.render(&mut out);
        }
        out
    }
}

/// Series of one family, by label values (in the order of the family's label names).
#[derive(Debug)]
struct Family<V> {
    name: &'static str,
    help: &'static str,
    labels: &'static [&'static str],
    kind: &'static str,
    series: Mutex<BTreeMap<Vec<String>, V>>,
}

impl<V> Family<V> {
    fn new(
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
        kind: &'static str,
    ) -> Self {
        debug_assert!(valid_name(name), "metric name {name:?}");
        debug_assert!(labels.iter().all(|l| valid_name(l) && *l != "le"));
        Family {
            name,
            help,
            labels,
            kind,
            series: Mutex::new(BTreeMap::new()),
        }
    }

    fn key(&self, values: &[&str]) -> Vec<String> {
        assert_eq!(
            values.len(),
            self.labels.len(),
            "{}: label values {values:?} for labels {:?}",
            self.name,
            self.labels
        );
        values.iter().map(|v| (*v).to_owned()).collect()
    }

    fn header(&self, out: &mut String) {
        let _ = writeln!(out, "# HELP {} {}", self.name, escape_help(self.help));
        let _ = writeln!(out, "# TYPE {} {}", self.name, self.kind);
    }

    /// `{a="x",b="y"}` (with `extra` appended, for `le`), or nothing without labels.
    fn label_set(&self, values: &[String], extra: Option<(&str, &str)>) -> String {
        let mut pairs: Vec<String> = self
            .labels
            .iter()
            .zip(values)
            .map(|(k, v)| format!("{k}=\"{}\"", escape_label(v)))
            .collect();
        if let Some((k, v)) = extra {
            pairs.push(format!("{k}=\"{}\"", escape_label(v)));
        }
        if pairs.is_empty() {
            String::new()
        } else {
            format!("{{{}}}", pairs.join(","))
        }
    }

    fn remove_where(&self, mut drop: impl FnMut(&[String]) -> bool) {
        lock(&self.series).retain(|k, _| !drop(k));
    }
}

/// A monotonically increasing count.
#[derive(Debug)]
pub struct Counter(Family<u64>);

impl Counter {
    pub fn inc(&self, labels: &[&str]) {
        self.add(labels, 1);
    }

    pub fn add(&self, labels: &[&str], n: u64) {
        let key = self.0.key(labels);
        *lock(&self.0.series).entry(key).or_insert(0) += n;
    }

    /// The current value (0 for a series never touched).
    pub fn get(&self, labels: &[&str]) -> u64 {
        let key = self.0.key(labels);
        lock(&self.0.series).get(&key).copied().unwrap_or(0)
    }
}

impl Render for Counter {
    fn render(&self, out: &mut String) {
        self.0.header(out);
        for (k, v) in lock(&self.0.series).iter() {
            let _ = writeln!(out, "{}{} {v}", self.0.name, self.0.label_set(k, None));
        }
    }
}

/// A value that goes up and down; series can be removed (a partition this process lost).
#[derive(Debug)]
pub struct Gauge(Family<f64>);

impl Gauge {
    pub fn set(&self, labels: &[&str], value: f64) {
        let key = self.0.key(labels);
        lock(&self.0.series).insert(key, value);
    }

    pub fn add(&self, labels: &[&str], delta: f64) {
        let key = self.0.key(labels);
        *lock(&self.0.series).entry(key).or_insert(0.0) += delta;
    }

    pub fn get(&self, labels: &[&str]) -> Option<f64> {
        let key = self.0.key(labels);
        lock(&self.0.series).get(&key).copied()
    }

    /// Drops every series whose label values `drop` selects.
    pub fn remove_where(&self, drop: impl FnMut(&[String]) -> bool) {
        self.0.remove_where(drop);
    }
}

impl Render for Gauge {
    fn render(&self, out: &mut String) {
        self.0.header(out);
        for (k, v) in lock(&self.0.series).iter() {
            let _ = writeln!(
                out,
                "{}{} {}",
                self.0.name,
                self.0.label_set(k, None),
                number(*v)
            );
        }
    }
}

/// Counts of observations per bucket (not cumulative), their sum and their count.
#[derive(Clone, Debug, Default)]
struct Buckets {
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

/// Observations counted into buckets by upper bound.
#[derive(Debug)]
pub struct Histogram {
    family: Family<Buckets>,
    buckets: &'static [f64],
}

impl Histogram {
    pub fn observe(&self, labels: &[&str], value: f64) {
        let key = self.family.key(labels);
        let mut series = lock(&self.family.series);
        let b = series.entry(key).or_insert_with(|| Buckets {
            counts: vec![0; self.buckets.len()],
            ..Buckets::default()
        });
        if let Some(i) = self.buckets.iter().position(|le| value <= *le) {
            b.counts[i] += 1;
        }
        b.sum += value;
        b.count += 1;
    }

    /// Observations so far of one series: (count, sum).
    pub fn get(&self, labels: &[&str]) -> (u64, f64) {
        let key = self.family.key(labels);
        lock(&self.family.series)
            .get(&key)
            .map_or((0, 0.0), |b| (b.count, b.sum))
    }

    fn touch(&self, labels: &[&str]) {
        let key = self.family.key(labels);
        lock(&self.family.series)
            .entry(key)
            .or_insert_with(|| Buckets {
                counts: vec![0; self.buckets.len()],
                ..Buckets::default()
            });
    }
}

impl Render for Histogram {
    fn render(&self, out: &mut String) {
        let f = &self.family;
        f.header(out);
        for (k, b) in lock(&f.series).iter() {
            let mut cumulative = 0;
            for (le, n) in self.buckets.iter().zip(&b.counts) {
                cumulative += n;
                let le = number(*le);
                let _ = writeln!(
                    out,
                    "{}_bucket{} {cumulative}",
                    f.name,
                    f.label_set(k, Some(("le", &le)))
                );
            }
            let _ = writeln!(
                out,
                "{}_bucket{} {}",
                f.name,
                f.label_set(k, Some(("le", "+Inf"))),
                b.count
            );
            let _ = writeln!(
                out,
                "{}_sum{} {}",
                f.name,
                f.label_set(k, None),
                number(b.sum)
            );
            let _ = writeln!(out, "{}_count{} {}", f.name, f.label_set(k, None), b.count);
        }
    }
}

/// A sample value as Prometheus reads it: `+Inf`, `-Inf`, `NaN`, or the shortest decimal.
fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".to_owned()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.to_owned()
    } else {
        format!("{v}")
    }
}

/// HELP text: backslash and line feed escaped.
fn escape_help(s: &str) -> String {
    s.replace('\\', "\\\\").replace('\n', "\\n")
}

/// Label values: backslash, double quote and line feed escaped.
fn escape_label(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// `[a-zA-Z_:][a-zA-Z0-9_:]*`.
fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Metrics are plain numbers: a panic elsewhere leaves them usable.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_and_gauges_render_help_type_and_escaped_labels() {
        let r = Registry::new();
        let c = r.counter(
            "airlock_decisions_total",
            "Decisions by verdict.\nOne line.",
            &["verdict", "reason"],
        );
        let g = r.gauge("airlock_up", "Whether it runs, a \\ b.", &[]);
        c.inc(&["ACCEPTED", "OK"]);
        c.add(&["REJECTED", "say \"no\"\n"], 2);
        c.inc(&["ACCEPTED", "OK"]);
        g.set(&[], 1.5);
        assert_eq!(c.get(&["ACCEPTED", "OK"]), 2);
        assert_eq!(
            r.render(),
            "# HELP airlock_decisions_total Decisions by verdict.\\nOne line.\n\
             # TYPE airlock_decisions_total counter\n\
             airlock_decisions_total{verdict=\"ACCEPTED\",reason=\"OK\"} 2\n\
             airlock_decisions_total{verdict=\"REJECTED\",reason=\"say \\\"no\\\"\\n\"} 2\n\
             # HELP airlock_up Whether it runs, a \\\\ b.\n\
             # TYPE airlock_up gauge\n\
             airlock_up 1.5\n"
        );
    }

    #[test]
    fn a_histogram_renders_cumulative_buckets_sum_and_count() {
        let r = Registry::new();
        let h = r.histogram(
            "airlock_latency_seconds",
            "Latency.",
            &["input"],
            &[0.1, 1.0, 2.5],
        );
        for v in [0.05, 0.1, 0.7, 3.0] {
            h.observe(&["proposal"], v);
        }
        assert_eq!(
            r.render(),
            "# HELP airlock_latency_seconds Latency.\n\
             # TYPE airlock_latency_seconds histogram\n\
             airlock_latency_seconds_bucket{input=\"proposal\",le=\"0.1\"} 2\n\
             airlock_latency_seconds_bucket{input=\"proposal\",le=\"1\"} 3\n\
             airlock_latency_seconds_bucket{input=\"proposal\",le=\"2.5\"} 3\n\
             airlock_latency_seconds_bucket{input=\"proposal\",le=\"+Inf\"} 4\n\
             airlock_latency_seconds_sum{input=\"proposal\"} 3.85\n\
             airlock_latency_seconds_count{input=\"proposal\"} 4\n"
        );
        assert_eq!(h.get(&["proposal"]).0, 4);
    }

    #[test]
    fn unlabelled_families_are_scraped_before_anything_happened_and_series_can_go() {
        let r = Registry::new();
        r.counter("airlock_batches_total", "Batches.", &[]);
        r.histogram("airlock_claim_seconds", "Claims.", &[], &[1.0]);
        let g = r.gauge("airlock_lag", "Lag.", &["partition"]);
        g.set(&["0"], 3.0);
        g.set(&["1"], f64::INFINITY);
        g.remove_where(|labels| labels[0] == "0");
        assert_eq!(
            r.render(),
            "# HELP airlock_batches_total Batches.\n\
             # TYPE airlock_batches_total counter\n\
             airlock_batches_total 0\n\
             # HELP airlock_claim_seconds Claims.\n\
             # TYPE airlock_claim_seconds histogram\n\
             airlock_claim_seconds_bucket{le=\"1\"} 0\n\
             airlock_claim_seconds_bucket{le=\"+Inf\"} 0\n\
             airlock_claim_seconds_sum 0\n\
             airlock_claim_seconds_count 0\n\
             # HELP airlock_lag Lag.\n\
             # TYPE airlock_lag gauge\n\
             airlock_lag{partition=\"1\"} +Inf\n"
        );
    }

    #[test]
    #[should_panic(expected = "label values")]
    fn label_values_must_match_the_label_names() {
        let r = Registry::new();
        r.counter("x_total", "X.", &["a"]).inc(&[]);
    }
}
