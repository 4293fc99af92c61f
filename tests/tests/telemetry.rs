//! The processor's telemetry endpoint against a real broker: `/readyz` answers 200 once its
//! partitions are claimed, and `/metrics` (a well-formed Prometheus exposition) counts exactly
//! the decisions, dispatches, dead letters and waiting approvals the processor produced.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use airlock_connectors::http::client::{self, Limits, Outgoing};
use airlock_processor::sample;
use airlock_schemas::{Decision, Verdict};
use airlock_tests::airlock::Airlock;
use airlock_tests::eventually;
use airlock_tests::wall_ms;
use hyper::Method;

const WAIT: Duration = Duration::from_secs(60);
const LIMITS: Limits = Limits {
    connect_timeout: Duration::from_secs(5),
    max_body: 4 << 20,
};

/// `(status, body)` of `GET <base><path>`.
async fn get(base: &str, path: &str) -> anyhow::Result<(u16, String)> {
    let request = Outgoing {
        method: Method::GET,
        url: format!("{base}{path}"),
        headers: Vec::new(),
        body: None,
    };
    let reply = client::send(&request, Duration::from_secs(5), LIMITS).await?;
    Ok((
        reply.status.as_u16(),
        String::from_utf8(reply.body.to_vec())?,
    ))
}

/// The samples of a text exposition, `name{labels}` → value, after checking its shape: every
/// sample belongs to a family announced by `# HELP` and `# TYPE` before it, and every
/// histogram's buckets are cumulative and end in `le="+Inf"` equal to its `_count`.
fn parse(text: &str) -> BTreeMap<String, f64> {
    let mut types: BTreeMap<String, String> = BTreeMap::new();
    let mut helped = std::collections::BTreeSet::new();
    let mut samples = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            helped.insert(rest.split(' ').next().unwrap().to_owned());
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            assert!(helped.contains(name), "TYPE before HELP: {line}");
            assert!(
                ["counter", "gauge", "histogram"].contains(&kind),
                "type of {line}"
            );
            types.insert(name.to_owned(), kind.to_owned());
            continue;
        }
        assert!(!line.starts_with('#'), "unexpected comment {line}");
        let (series, value) = line.rsplit_once(' ').unwrap();
        let name = series.split('{').next().unwrap();
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| {
                name.strip_suffix(s)
                    .filter(|f| types.get(*f).map(String::as_str) == Some("histogram"))
            })
            .unwrap_or(name);
        assert!(types.contains_key(family), "sample without TYPE: {line}");
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("value of {line}")),
        };
        assert!(
            samples.insert(series.to_owned(), value).is_none(),
            "twice: {line}"
        );
    }
    for (name, kind) in &types {
        if kind != "histogram" {
            continue;
        }
        let mut by_series: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        for (series, value) in samples.range(format!("{name}_bucket{{")..) {
            if !series.starts_with(&format!("{name}_bucket{{")) {
                break;
            }
            let labels = series.split_once("le=").unwrap().0.to_owned();
            by_series.entry(labels).or_default().push(*value);
            if series.contains("le=\"+Inf\"") {
                let count_key = series
                    .replace("_bucket{", "_count{")
                    .replace(",le=\"+Inf\"", "")
                    .replace("{le=\"+Inf\"}", "");
                let count_key = count_key.trim_end_matches("{}").to_owned();
                assert_eq!(
                    Some(value),
                    samples.get(&count_key),
                    "{series} vs {count_key}"
                );
            }
        }
        // BTreeMap order puts "+Inf" first among le values; compare the finite ones.
        for (labels, values) in by_series {
            let finite: Vec<f64> = values[1..].to_vec();
            assert!(
                finite.iter().all(|v| *v <= values[0]),
                "{name}{labels}: a bucket exceeds +Inf"
            );
        }
    }
    samples
}

fn value(samples: &BTreeMap<String, f64>, series: &str) -> f64 {
    samples.get(series).copied().unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_what_the_processor_decided_and_readyz_waits_for_claims() -> anyhow::Result<()>
{
    let a = Airlock::start("telemetry-metrics", 2).await?;
    let processor = a.spawn("p1")?;
    let base = processor.telemetry_url();
    let (status, _) = get(&base, "/healthz").await?;
    assert_eq!(status, 200);
    eventually("/readyz 200", WAIT, async || {
        Ok((get(&base, "/readyz").await?.0 == 200).then_some(()))
    })
    .await?;

    let producer = a.producer()?;
    let topic = a.names.proposals();
    let now = wall_ms();
    let mut proposals = Vec::new();
    for i in 0..3 {
        proposals.push(sample::refund(&format!("refund:tm_{i}"), 2_500, now));
    }
    // A blind retry of the first (IN_PROGRESS), changed arguments (CONFLICT), a large refund
    // that waits for an approver, and one the policy forbids.
    let retry = sample::resend(&proposals[0], 1);
    let mut changed = sample::refund("refund:tm_0", 9_900, now);
    changed.proposal_id = "prop-changed".to_owned();
    let large = sample::refund("refund:tm_large", 50_000, now);
    let denied = sample::refund("refund:tm_denied", 900_000, now);
    proposals.extend([retry, changed, large, denied]);
    for p in &proposals {
        a.send(&producer, &topic, &p.operation_key, p).await?;
    }
    a.send_raw(&producer, &topic, Some(b"refund:tm_x"), b"\xc3\x01garbage")
        .await?;
    let replies = eventually("a reply to every proposal", WAIT, async || {
        let r = a.proposal_replies()?;
        Ok((r.len() >= proposals.len()).then_some(r))
    })
    .await?;
    let accepted = replies
        .values()
        .filter(|d| d.verdict == Verdict::Accepted)
        .count();
    assert_eq!(accepted, 3, "{replies:?}");

    // Every decision on the topic, by verdict and reason, is what the counter says.
    let decisions = a.read_deduplicated::<Decision>(&a.names.decisions(), "decision")?;
    let mut expected: BTreeMap<String, f64> = BTreeMap::new();
    for d in &decisions {
        let series = format!(
            "airlock_decisions_total{{verdict=\"{}\",reason=\"{}\"}}",
            d.verdict.as_str(),
            d.reason.as_str()
        );
        *expected.entry(series).or_default() += 1.0;
    }
    let samples = eventually("metrics that match the decisions topic", WAIT, async || {
        let (status, text) = get(&base, "/metrics").await?;
        assert_eq!(status, 200);
        let samples = parse(&text);
        let lag_settled = samples
            .iter()
            .filter(|(k, _)| k.starts_with("airlock_consumer_lag{"))
            .all(|(_, v)| *v == 0.0);
        let outstanding_seen = value(
            &samples,
            "airlock_outstanding_effects{partition=\"0\",state=\"AWAITING_APPROVAL\",older_than=\"0s\"}",
        ) + value(
            &samples,
            "airlock_outstanding_effects{partition=\"1\",state=\"AWAITING_APPROVAL\",older_than=\"0s\"}",
        ) == 1.0;
        // A checkpoint or sweep the processor sends on its own can be in flight at a scrape.
        let outbox_drained = samples
            .iter()
            .filter(|(k, _)| k.starts_with("airlock_outbox_backlog{"))
            .all(|(_, v)| *v == 0.0);
        let counted = expected.iter().all(|(k, v)| value(&samples, k) == *v);
        // Read with the consumer's statistics, once a second.
        let stores_read = (0..2).all(|p| {
            samples.contains_key(&format!("airlock_state_level0_files{{partition=\"{p}\"}}"))
        });
        Ok(
            (counted && lag_settled && outstanding_seen && outbox_drained && stores_read)
                .then_some(samples),
        )
    })
    .await;
    let samples = match samples {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{}", get(&base, "/metrics").await?.1);
            eprintln!("expected {expected:#?}");
            return Err(e);
        }
    };
    eprintln!("{}", get(&base, "/metrics").await?.1);
    let total: f64 = samples
        .iter()
        .filter(|(k, _)| k.starts_with("airlock_decisions_total{"))
        .map(|(_, v)| v)
        .sum();
    assert_eq!(
        total,
        decisions.len() as f64,
        "no decision counted twice or missed"
    );
    assert_eq!(
        value(
            &samples,
            "airlock_decisions_total{verdict=\"ACCEPTED\",reason=\"AUTO_APPROVED\"}"
        ),
        3.0
    );
    assert_eq!(
        value(&samples, "airlock_inputs_total{input=\"proposal\"}"),
        (proposals.len() + 1) as f64
    );
    assert_eq!(
        value(&samples, "airlock_dead_letters_total{reason=\"MALFORMED\"}"),
        1.0
    );
    // One latency per proposal that got a decision (the garbage got none).
    assert_eq!(
        value(
            &samples,
            "airlock_decision_latency_seconds_count{input=\"proposal\"}"
        ),
        proposals.len() as f64
    );
    assert_eq!(value(&samples, "airlock_dispatches_total"), 3.0);
    assert_eq!(value(&samples, "airlock_logical_calls_total"), 3.0);
    assert_eq!(value(&samples, "airlock_retry_amplification"), 1.0);
    assert_eq!(value(&samples, "airlock_partitions_owned"), 2.0);
    assert_eq!(value(&samples, "airlock_partitions_restoring"), 0.0);
    assert_eq!(
        value(&samples, "airlock_claims_total{local_state=\"rebuilt\"}"),
        2.0
    );
    for p in 0..2 {
        assert_eq!(
            value(
                &samples,
                &format!(
                    "airlock_outstanding_effects{{partition=\"{p}\",state=\"UNKNOWN\",older_than=\"0s\"}}"
                )
            ),
            0.0
        );
        assert!(samples.contains_key(&format!(
            "airlock_consumer_lag{{topic=\"{topic}\",partition=\"{p}\"}}"
        )));
        assert_eq!(
            value(
                &samples,
                &format!("airlock_outbox_backlog{{partition=\"{p}\"}}")
            ),
            0.0
        );
        // Each owned store's RocksDB stall state, read every second: a few records stall
        // nothing.
        for gauge in [
            "airlock_state_writes_stopped",
            "airlock_state_delayed_write_rate_bytes",
        ] {
            let series = format!("{gauge}{{partition=\"{p}\"}}");
            assert_eq!(samples.get(&series), Some(&0.0), "{series}");
        }
    }
    // Every input read at its producer's timestamp is counted: all of them on tansu 0.6, which
    // ignores the topic's LogAppendTime, none on a broker that honours it. Read after the
    // scrape: the reader's barriers are inputs too.
    let producer_time = a
        .read_topic(&topic)?
        .iter()
        .filter(|r| r.producer_time)
        .count();
    assert_eq!(
        value(
            &samples,
            "airlock_producer_time_inputs_total{input=\"proposal\"}"
        ),
        producer_time as f64
    );
    assert!(value(&samples, "airlock_batches_total") >= 1.0);
    assert!(value(&samples, "airlock_records_produced_total") >= decisions.len() as f64);
    assert_eq!(
        processor
            .telemetry
            .decisions
            .get(&["ACCEPTED", "AUTO_APPROVED"]),
        3
    );
    processor.stop()?;
    Ok(())
}
