//! `airlock run` against a real broker: a proposal becomes exactly one dispatch and one
//! decision, duplicates and changed arguments are answered, bad records land in the DLQ, and
//! state survives a restart and the loss of the state directory.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use airlock_processor::runtime::wire::{Admit, header};
use airlock_processor::sample;
use airlock_schemas::{Decision, Reason, Verdict};
use airlock_tests::airlock::Airlock;
use airlock_tests::eventually;
use airlock_tests::wall_ms;

const WAIT: Duration = Duration::from_secs(60);

fn decisions_by_reply(a: &Airlock) -> anyhow::Result<BTreeMap<String, Decision>> {
    a.proposal_replies()
}

/// Asserts that the `n` replies to proposals whose id ends with `suffix` (resends) are all
/// IN_PROGRESS.
fn assert_all_in_progress(replies: &BTreeMap<String, Decision>, suffix: &str, n: usize) {
    let resent: Vec<&Decision> = replies
        .values()
        .filter(|d| d.in_reply_to.ends_with(suffix))
        .collect();
    assert_eq!(resent.len(), n, "{suffix}");
    assert!(
        resent.iter().all(|d| d.verdict == Verdict::InProgress),
        "{resent:?}"
    );
}

async fn await_decisions(a: &Airlock, n: usize) -> anyhow::Result<BTreeMap<String, Decision>> {
    let result = eventually(&format!("{n} decisions"), WAIT, async || {
        let d = decisions_by_reply(a)?;
        Ok((d.len() >= n).then_some(d))
    })
    .await;
    if result.is_err() {
        let codec = airlock_schemas::Codec::new();
        for r in a.read_topic(&a.names.changelog())? {
            let kind = r.header_str(header::KIND).unwrap_or("").to_owned();
            if kind != "changelog" || r.value.is_none() {
                eprintln!(
                    "changelog p{} o{} {kind} {:?}",
                    r.partition, r.offset, r.admit
                );
                continue;
            }
            let c: airlock_schemas::ChangelogRecord =
                codec.decode_as(r.value.as_deref().unwrap_or_default())?;
            eprintln!(
                "changelog p{} o{} e{} {:?} {} {:?} {:?}",
                r.partition,
                r.offset,
                c.owner_epoch,
                c.table,
                String::from_utf8_lossy(&c.key),
                c.value.as_ref().map(|v| v.len()),
                c.input_offsets
            );
        }
        for r in a.read_topic(&a.names.proposals())? {
            eprintln!(
                "proposal p{} o{} {:?}",
                r.partition,
                r.offset,
                r.key
                    .as_ref()
                    .map(|k| String::from_utf8_lossy(k).into_owned())
            );
        }
        let raw = a.read_topic(&a.names.decisions())?;
        for r in &raw {
            eprintln!(
                "p{} o{} {:?} {:?}",
                r.partition,
                r.offset,
                r.admit,
                r.header_str(airlock_processor::runtime::wire::header::ID)
            );
        }
    }
    result
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proposal_dispatches_once_and_every_reply_and_refusal_is_emitted() -> anyhow::Result<()> {
    let a = Airlock::start("run-basic", 3).await?;
    let processor = a.spawn("p1")?;
    let producer = a.producer()?;
    let proposals = a.names.proposals();
    let now = wall_ms();

    let first = sample::refund("refund:txn_1", 2_500, now);
    a.send(&producer, &proposals, &first.operation_key, &first)
        .await?;
    let d = await_decisions(&a, 1).await?;
    assert_eq!(d[&first.proposal_id].verdict, Verdict::Accepted, "{d:?}");

    // The same message again (producer resend), a blind retry, and changed arguments.
    a.send(&producer, &proposals, &first.operation_key, &first)
        .await?;
    let retry = sample::resend(&first, 1);
    a.send(&producer, &proposals, &retry.operation_key, &retry)
        .await?;
    let mut changed = sample::refund("refund:txn_1", 9_900, now);
    changed.proposal_id = "prop-changed".to_owned();
    a.send(&producer, &proposals, &changed.operation_key, &changed)
        .await?;

    // Bad records: garbage, a proposal under the wrong Kafka key, a foreign fingerprint.
    a.send_raw(
        &producer,
        &proposals,
        Some(b"refund:txn_x"),
        b"\xc3\x01garbage",
    )
    .await?;
    let mut wrong_key = sample::refund("refund:txn_2", 100, now);
    wrong_key.proposal_id = "prop-wrong-key".to_owned();
    a.send(&producer, &proposals, "refund:txn_other", &wrong_key)
        .await?;
    a.send_raw(&producer, &proposals, Some(b"k"), b"{\"json\":true}")
        .await?;

    let d = await_decisions(&a, 4).await?;
    assert_eq!(d[&retry.proposal_id].verdict, Verdict::InProgress, "{d:?}");
    assert_eq!(d[&changed.proposal_id].verdict, Verdict::Conflict, "{d:?}");
    assert_eq!(
        d[&wrong_key.proposal_id].reason,
        Reason::KeyMismatch,
        "{d:?}"
    );

    let dlq = eventually("3 dead letters", WAIT, async || {
        let r = a.read_topic(&a.names.dlq())?;
        let r: Vec<_> = r.into_iter().filter(|r| r.admit == Admit::Accept).collect();
        Ok((r.len() >= 3).then_some(r))
    })
    .await?;
    let reasons: Vec<&str> = dlq
        .iter()
        .map(|r| r.header_str(header::DLQ_REASON).unwrap())
        .collect();
    assert!(reasons.contains(&"MALFORMED"), "{reasons:?}");
    assert!(reasons.contains(&"KEY_MISMATCH"), "{reasons:?}");
    assert!(reasons.contains(&"UNKNOWN_SCHEMA"), "{reasons:?}");
    for r in &dlq {
        assert_eq!(r.header_str(header::SOURCE_TOPIC), Some(proposals.as_str()));
        assert!(r.header_str(header::SOURCE_OFFSET).is_some());
        assert!(r.value.is_some(), "the original bytes are kept");
    }

    let dispatches = a.dispatches()?;
    assert_eq!(dispatches.len(), 1, "{dispatches:?}");
    assert_eq!(dispatches[0].operation_key, first.operation_key);
    assert_eq!(dispatches[0].epoch, 1);

    // Every output partition the task wrote opens with its fence marker.
    let raw = a.read_topic(&a.names.decisions())?;
    let first_on_partition = raw
        .iter()
        .find(|r| r.partition == dispatches[0].owner_partition);
    assert!(
        matches!(first_on_partition.map(|r| r.admit), Some(Admit::Marker(_))),
        "{first_on_partition:?}"
    );

    let summary = processor.stop()?;
    assert!(summary.inputs >= 7, "{summary:?}");
    Ok(())
}

/// Records built to break a partition: one whose outputs cannot be written (the effect record
/// its journal event carries escapes every quote of the arguments again, past the record
/// limit), one with a 20 KB identifier, 200 KB of garbage. Each is dead-lettered with its
/// reason, the partition goes on deciding, and a restart on the same disk goes on too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_records_are_dead_lettered_and_the_partition_goes_on() -> anyhow::Result<()> {
    let mut a = Airlock::start("run-hostile", 1).await?;
    a.config.kafka.max_message_bytes = 65_536;
    let payload_limit = a.config.kafka.max_payload_bytes();
    let processor = a.spawn("p1")?;
    let producer = a.producer()?;
    let proposals = a.names.proposals();
    let now = wall_ms();

    let mut email = sample::refund("email:a", 100, now);
    email.proposal_id = "prop-email".to_owned();
    email.tool = "send_email".to_owned();
    email.arguments_json = serde_json::json!({
        "tenant_id": "acme",
        "to": "ops@example.com",
        "subject": "s",
        "body": "\"".repeat(20_000),
    })
    .to_string();
    a.send(&producer, &proposals, &email.operation_key, &email)
        .await?;
    let mut long_id = sample::refund("refund:long", 100, now);
    long_id.proposal_id = "p".repeat(20_000);
    a.send(&producer, &proposals, &long_id.operation_key, &long_id)
        .await?;
    let garbage = vec![0xc3u8; 200_000];
    a.send_raw(&producer, &proposals, Some(b"refund:g"), &garbage)
        .await?;
    let fine = sample::refund("refund:fine", 100, now);
    a.send(&producer, &proposals, &fine.operation_key, &fine)
        .await?;

    let d = await_decisions(&a, 2).await?;
    assert_eq!(d[&fine.proposal_id].verdict, Verdict::Accepted, "{d:?}");
    let refused = &d[&email.proposal_id];
    assert_eq!(refused.reason, Reason::Oversized, "{refused:?}");
    assert!(
        refused
            .detail
            .starts_with("its journal event cannot be written"),
        "{refused:?}"
    );
    assert_eq!(d.len(), 2, "no reply echoes the 20 KB id: {:?}", d.keys());

    let dlq = eventually("3 dead letters", WAIT, async || {
        let r = a.read_topic(&a.names.dlq())?;
        let r: Vec<_> = r.into_iter().filter(|r| r.admit == Admit::Accept).collect();
        Ok((r.len() >= 3).then_some(r))
    })
    .await?;
    for r in &dlq {
        assert_eq!(r.header_str(header::DLQ_REASON), Some("OVERSIZED"), "{r:?}");
    }
    let cut = dlq
        .iter()
        .find(|r| r.header_str(header::DLQ_TRUNCATED).is_some())
        .expect("the garbage's copy is cut to fit");
    assert_eq!(cut.header_str(header::DLQ_VALUE_BYTES), Some("200000"));
    assert_eq!(cut.value.as_ref().map(Vec::len), Some(payload_limit));

    // The same disk again: the dead-lettered records stay behind, the partition decides on.
    processor.stop()?;
    let processor = a.spawn("p1")?;
    let after = sample::refund("refund:after", 100, now);
    a.send(&producer, &proposals, &after.operation_key, &after)
        .await?;
    let d = await_decisions(&a, 3).await?;
    assert_eq!(d[&after.proposal_id].verdict, Verdict::Accepted, "{d:?}");
    let summary = processor.stop()?;
    assert_eq!(summary.inputs, 1, "nothing decided twice: {summary:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_and_lost_disk_give_the_same_decisions() -> anyhow::Result<()> {
    let a = Airlock::start("run-restore", 2).await?;
    let producer = a.producer()?;
    let proposals = a.names.proposals();
    let now = wall_ms();
    let keys: Vec<String> = (0..20).map(|i| format!("refund:r{i}")).collect();

    let p1 = a.spawn("p1")?;
    for k in &keys {
        let p = sample::refund(k, 1_000, now);
        a.send(&producer, &proposals, k, &p).await?;
    }
    await_decisions(&a, keys.len()).await?;
    p1.stop()?;

    // Same disk: the blind retries are IN_PROGRESS, not new dispatches.
    let p1 = a.spawn("p1")?;
    for k in &keys[..10] {
        let p = sample::resend(&sample::refund(k, 1_000, now), 1);
        a.send(&producer, &proposals, k, &p).await?;
    }
    let d = await_decisions(&a, keys.len() + 10).await?;
    p1.stop()?;

    // Lost disk: the state comes back from the changelog.
    std::fs::remove_dir_all(a.state_dir("p1"))?;
    let p1 = a.spawn("p1")?;
    for k in &keys[10..] {
        let p = sample::resend(&sample::refund(k, 1_000, now), 1);
        a.send(&producer, &proposals, k, &p).await?;
    }
    let d2 = await_decisions(&a, keys.len() + 20).await?;
    p1.stop()?;

    // A damaged disk (RocksDB's CURRENT file overwritten): every partition's store is moved
    // aside and restored from the changelog; the retries still find their intents.
    let mut damaged = 0;
    for entry in std::fs::read_dir(a.state_dir("p1"))? {
        let current = entry?.path().join("CURRENT");
        if current.exists() {
            std::fs::write(&current, b"garbage")?;
            damaged += 1;
        }
    }
    assert_eq!(damaged, 2, "one store per partition");
    let p1 = a.spawn("p1")?;
    for k in &keys[..5] {
        let p = sample::resend(&sample::refund(k, 1_000, now), 2);
        a.send(&producer, &proposals, k, &p).await?;
    }
    let d3 = await_decisions(&a, keys.len() + 25).await?;
    p1.stop()?;
    for partition in 0..2 {
        let aside = a
            .state_dir("p1")
            .join(format!("partition-{partition}.unreadable"));
        assert!(aside.exists(), "{} kept", aside.display());
    }
    assert_all_in_progress(&d3, "-retry2", 5);

    for (reply, decision) in &d {
        assert_eq!(d2[reply].verdict, decision.verdict, "{reply}");
    }
    assert_all_in_progress(&d2, "-retry1", 20);
    let dispatches = a.dispatches()?;
    assert_eq!(dispatches.len(), keys.len());
    Ok(())
}

/// An input topic deleted and created again while its partition's state stays: the new log's
/// offsets restart at 0, below what the state consumed, so its records would be taken for ones
/// already decided. The task keeps the fingerprint of the last record it consumed; when the new
/// log reaches that offset, the record there differs and the instance stops, naming the cause,
/// instead of skipping the new log's records (or deciding the ones past the old offset).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_input_topic_stops_the_instance_instead_of_skipping_its_records()
-> anyhow::Result<()> {
    use rdkafka::ClientConfig;
    use rdkafka::admin::{AdminClient, AdminOptions};
    use rdkafka::client::DefaultClientContext;

    let a = Airlock::start("run-replaced", 1).await?;
    let producer = a.producer()?;
    let proposals = a.names.proposals();
    let now = wall_ms();
    let batch = |name: &str, n: usize| -> Vec<airlock_schemas::ToolProposal> {
        (0..n)
            .map(|i| sample::refund(&format!("refund:{name}{i}"), 1_000, now))
            .collect()
    };
    let send = async |ps: &[airlock_schemas::ToolProposal]| {
        a.send_many(&producer, &proposals, ps, |p| p.operation_key.as_str())
            .await
    };

    // Offsets 0-5 of the first log are consumed and decided.
    let old = batch("old", 6);
    let p1 = a.spawn("p1")?;
    send(&old).await?;
    a.await_replies(old.iter().map(|p| p.proposal_id.as_str()), WAIT)
        .await?;
    p1.stop()?;

    // The topic goes and comes back empty (`airlock topics create` makes the missing one).
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &a.config.kafka.brokers)
        .create()?;
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    for result in admin.delete_topics(&[&proposals], &options).await? {
        result.map_err(|(topic, code)| anyhow::anyhow!("deleting {topic}: {code}"))?;
    }
    let (created, out, err) = a.cli(&["topics", "create"])?;
    assert!(created, "airlock topics create: {out}{err}");
    assert!(out.contains(&proposals), "{out}");

    // Three records of the new log (offsets 0-2) before the instance comes back, five after
    // (3-7): the state's last consumed record was at offset 5, or after it where the instance
    // put ticks (`runtime::clock`) on the idle topic before it stopped.
    let new = batch("new", 8);
    send(&new[..3]).await?;
    let p1 = a.spawn("p1")?;
    send(&new[3..]).await?;
    eventually("the instance to stop", WAIT, async || {
        Ok((!p1.is_running()).then_some(()))
    })
    .await?;
    let error = format!(
        "{:#}",
        p1.stop().expect_err("the instance stopped on an error")
    );
    let stopped_at = error
        .split(&format!("{proposals} partition 0: the record at offset "))
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|offset| offset.parse::<i64>().ok());
    assert!(
        stopped_at.is_some_and(|o| o >= 5)
            && error.contains("is not the one this partition consumed there"),
        "{error}"
    );
    assert!(error.contains("deleted and created again"), "{error}");

    // Nothing of the new log was decided, neither below the old end nor past it.
    let replies = a.proposal_replies()?;
    assert_eq!(replies.len(), old.len(), "{replies:?}");
    for p in &new {
        assert!(!replies.contains_key(&p.proposal_id), "{replies:?}");
    }
    Ok(())
}

/// A claim that fails for a reason that passes does not stop the instance: it owns nothing,
/// leaves its group, joins again after a pause and claims once the cause is gone. The cause
/// here: an open transaction on the changelog, which holds its last stable offset below the
/// end, so the claim's `read_committed` restore cannot reach its barrier and stalls (as it
/// does while a leader moves or a broker is away).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_fails_transiently_is_tried_again_in_the_process() -> anyhow::Result<()> {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

    let mut a = Airlock::start("run-reclaim", 1).await?;
    if !a.config.kafka.compatibility.has_transactions() {
        eprintln!(
            "skipped: {} has no transactions",
            a.config.kafka.compatibility
        );
        return Ok(());
    }
    // A claim gives up after 3 s without progress (the default is a minute).
    a.config.processor.claim_stall_timeout_ms = 3_000;
    let changelog = a.names.changelog();
    let tx: BaseProducer = a
        .config
        .client_config()
        .set("transactional.id", format!("{changelog}-tx"))
        .create()?;
    tx.init_transactions(WAIT)?;
    tx.begin_transaction()?;
    tx.send(
        BaseRecord::to(&changelog)
            .partition(0)
            .key("k")
            .payload("v"),
    )
    .map_err(|(e, _)| anyhow::anyhow!("enqueueing: {e}"))?;
    tx.flush(WAIT)?;

    let p1 = a.spawn("p1")?;
    eventually("a failed claim", WAIT, async || {
        Ok((p1.telemetry.claims_failed.get(&["true"]) > 0 || !p1.is_running()).then_some(()))
    })
    .await?;
    assert!(
        p1.is_running(),
        "the instance stopped on a transient claim failure: {:?}",
        p1.stop()
    );
    assert_eq!(p1.telemetry.claims_failed.get(&["false"]), 0);

    tx.abort_transaction(WAIT)?;
    let p = sample::refund("refund:reclaim", 1_000, wall_ms());
    a.send(&a.producer()?, &a.names.proposals(), &p.operation_key, &p)
        .await?;
    let replies = a.await_replies([p.proposal_id.as_str()], WAIT).await?;
    assert_eq!(replies[&p.proposal_id].verdict, Verdict::Accepted);
    let failed = p1.telemetry.claims_failed.get(&["true"]);
    let summary = p1.stop()?;
    assert!(summary.claims >= 1, "{summary:?}");
    eprintln!("{failed} claims failed while the transaction was open; {summary:?}");
    Ok(())
}

/// A processor configured for larger records than its topics take would stage outputs the
/// broker refuses on every resend: it does not start, and says which topics and what to change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_whose_records_outgrow_its_topics_does_not_start() -> anyhow::Result<()> {
    let mut a = Airlock::start("run-limits", 1).await?;
    if !a.config.kafka.compatibility.reports_message_limits() {
        eprintln!(
            "skipped: {} does not report a topic's max.message.bytes",
            a.config.kafka.compatibility
        );
        return Ok(());
    }
    // Kafka's default max.message.bytes is 1,048,588.
    a.config.kafka.max_message_bytes = 2_000_000;
    let p1 = a.spawn("p1")?;
    eventually("the instance to stop", WAIT, async || {
        Ok((!p1.is_running()).then_some(()))
    })
    .await?;
    let error = format!(
        "{:#}",
        p1.stop().expect_err("the instance refused to start")
    );
    assert!(
        error.contains("topics accept smaller records than kafka.max_message_bytes (2000000)")
            && error.contains(&format!("{} takes 1048588", a.names.decisions())),
        "{error}"
    );
    Ok(())
}
