//! Receipts against a real broker: `airlock run` (SIGKILLed once and replaced by an instance
//! that restores from the changelog) issues a signed receipt for every refusal and for an
//! operator's settlement, `airlock receipts verify` finds every partition's chain intact, and
//! tampered copies of it (a flipped byte, a dropped receipt, two swapped receipts), in a topic
//! and in files, are each named.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use airlock_processor::capability;
use airlock_processor::cli::receipts::Exported;
use airlock_processor::runtime::topics::{self, TopicSpec};
use airlock_schemas::{Control, ControlKind, Receipt, ReceiptKind, Verdict};
use airlock_tests::airlock::{Airlock, Options, airlock_binary};
use airlock_tests::eventually;
use airlock_tests::workload::{self, Lcg};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::FutureRecord;

const PARTITIONS: i32 = 2;
const WAIT: Duration = Duration::from_secs(120);

/// `airlock receipts verify` against the test's broker and topics, with `args`.
fn verify(a: &Airlock, public: &Path, args: &[&str]) -> anyhow::Result<(Output, String)> {
    let out = Command::new(airlock_binary()?)
        .args([
            "receipts",
            "verify",
            "--progress-seconds",
            "0",
            "--public-key",
        ])
        .arg(public)
        .args(args)
        .env("AIRLOCK_KAFKA_BROKERS", &a.config.kafka.brokers)
        .env("AIRLOCK_TOPICS_PREFIX", &a.config.topics.prefix)
        .output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok((out, text))
}

fn write_export(path: &Path, records: &[Exported]) -> anyhow::Result<()> {
    let lines: Vec<String> = records
        .iter()
        .map(serde_json::to_string)
        .collect::<Result<_, _>>()?;
    std::fs::write(path, lines.join("\n") + "\n")?;
    Ok(())
}

fn is_receipt(r: &Exported) -> bool {
    r.headers
        .iter()
        .any(|(k, v)| k == "airlock-kind" && v == "receipt")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receipts_chain_across_a_crash_and_every_tampering_is_named() -> anyhow::Result<()> {
    let keys = tempfile::tempdir()?;
    let (secret, public) =
        capability::write_key_pair(&capability::generate()?, &keys.path().join("receipts"))?;
    let a = Airlock::start_with(
        "receipts",
        PARTITIONS,
        Options {
            receipts_key_file: Some(secret),
            ..Options::default()
        },
    )
    .await?;
    let log = std::env::temp_dir().join(format!("airlock-receipts-{}.log", std::process::id()));
    let now = airlock_tests::wall_ms();
    let proposals = workload::proposals(400, now, &mut Lcg(0x7ece));
    let topic = a.names.proposals();
    let producer = a.producer()?;

    let mut child = a.spawn_process("p1", "group-0", &log)?;
    a.send_many(&producer, &topic, &proposals[..200], |p| {
        p.operation_key.as_str()
    })
    .await?;
    tokio::time::sleep(Duration::from_millis(400)).await;
    child.kill()?;
    child.wait()?;
    // Another instance, without p1's state: it restores from the changelog and continues the
    // chains from the heads the changelog carries.
    let group = a.replacement_group("group-0", "group-1");
    let mut child = a.spawn_process("p2", group, &log)?;
    a.send_many(&producer, &topic, &proposals[200..], |p| {
        p.operation_key.as_str()
    })
    .await?;
    // Refused by the runtime before the core saw it: the Kafka key is not the operation key.
    let mut wrong_key = airlock_processor::sample::refund("refund:wrong-key", 100, now);
    wrong_key.proposal_id = "prop-wrong-key".to_owned();
    a.send(&producer, &topic, "refund:elsewhere", &wrong_key)
        .await?;
    let mut expected: BTreeSet<String> = proposals.iter().map(|p| p.proposal_id.clone()).collect();
    expected.insert(wrong_key.proposal_id.clone());
    let replies = eventually("a reply to every proposal", WAIT, async || {
        let d = a.proposal_replies()?;
        Ok(expected.iter().all(|id| d.contains_key(id)).then_some(d))
    })
    .await;
    let replies = match replies {
        Ok(d) => d,
        Err(e) => panic!("{e}\n{}", workload::explain_missing(&a, &expected, &log)?),
    };

    // An operator settles a dispatched refund: a settlement receipt.
    let settled = proposals
        .iter()
        .find(|p| replies[&p.proposal_id].verdict == Verdict::Accepted)
        .expect("the workload dispatches");
    let control = Control {
        control_id: "settle-receipts".to_owned(),
        kind: ControlKind::SettleCommitted,
        operation_key: Some(settled.operation_key.clone()),
        run_id: None,
        lease_fence: None,
        operator_id: "ops-1".to_owned(),
        evidence: Some("ledger entry 77".to_owned()),
        issued_at: now,
    };
    a.send(
        &producer,
        &a.names.control(),
        &settled.operation_key,
        &control,
    )
    .await?;
    let receipts = eventually("the settlement's receipt", WAIT, async || {
        let receipts: Vec<Receipt> = a.read_deduplicated(&a.names.receipts(), "receipt")?;
        Ok(receipts
            .iter()
            .any(|r| r.cause_id == format!("control:{}", control.control_id))
            .then_some(receipts))
    })
    .await?;
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();

    // Every refusal of a proposal has its receipt; the settlement has one; nothing else does.
    let refused: Vec<_> = replies
        .iter()
        .filter(|(_, d)| {
            matches!(
                d.verdict,
                Verdict::Rejected | Verdict::Denied | Verdict::Conflict | Verdict::Expired
            )
        })
        .collect();
    assert!(
        refused.len() >= 10,
        "the workload has refusals: {}",
        refused.len()
    );
    for (id, d) in &refused {
        assert!(
            receipts
                .iter()
                .any(|r| r.cause_id == format!("proposal:{id}")
                    && r.verdict == d.verdict
                    && r.reason == d.reason
                    && r.kind == ReceiptKind::Refusal),
            "no receipt for the refusal of {id}: {d:?}"
        );
    }
    let settlement = receipts
        .iter()
        .find(|r| r.cause_id == format!("control:{}", control.control_id))
        .unwrap();
    assert_eq!(settlement.kind, ReceiptKind::Settlement);
    assert_eq!(settlement.verdict, Verdict::Committed);
    assert_eq!(settlement.principal_id.as_deref(), Some("ops-1"));
    assert_eq!(receipts.len(), refused.len() + 1, "one receipt each");

    // The chains verify, read from the topic; the export is what an auditor takes away.
    let dir = tempfile::tempdir()?;
    let export = dir.path().join("receipts.jsonl");
    let (out, text) = verify(&a, &public, &["--export", export.to_str().unwrap()])?;
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains(&format!(
            "OK: {} receipts in {PARTITIONS} partitions verified",
            receipts.len()
        )),
        "{text}"
    );
    eprintln!("{text}");

    // Tampered copies: a partition with a few receipts, its second and third.
    let records: Vec<Exported> = std::fs::read_to_string(&export)?
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    let partition = (0..PARTITIONS)
        .max_by_key(|p| {
            records
                .iter()
                .filter(|r| r.partition == *p && is_receipt(r))
                .count()
        })
        .unwrap();
    let at: Vec<usize> = records
        .iter()
        .enumerate()
        .filter(|(_, r)| r.partition == partition && is_receipt(r))
        .map(|(i, _)| i)
        .collect();
    assert!(
        at.len() >= 4,
        "partition {partition} has {} receipts",
        at.len()
    );
    // Two receipts in a row, after the first, neither of them resent after the crash (a copy
    // left in place would still fill the gap a drop makes).
    let copies = |i: usize| {
        records
            .iter()
            .filter(|r| r.partition == partition && r.value == records[i].value)
            .count()
    };
    let (second, third) = at
        .windows(2)
        .skip(1)
        .map(|w| (w[0], w[1]))
        .find(|&(s, t)| copies(s) == 1 && copies(t) == 1)
        .expect("two receipts in a row that were produced once");

    // One byte flipped inside the operation key of the second receipt.
    let mut flipped = records.clone();
    let value = flipped[second].value.as_mut().unwrap();
    let mut bytes = from_hex(value);
    let receipt: Receipt = airlock_schemas::Codec::new().decode_as(&bytes)?;
    let key = receipt.operation_key.as_bytes();
    let pos = bytes
        .windows(key.len())
        .position(|w| w == key)
        .expect("the operation key is in the datum");
    bytes[pos + key.len() - 1] ^= 0x01;
    *value = to_hex(&bytes);
    let mut dropped = records.clone();
    dropped.remove(second);
    let mut swapped = records.clone();
    swapped.swap(second, third);

    // Named at the record that breaks the chain: the flipped one; the receipt after the gap;
    // the first of the swapped pair (the third receipt, which keeps its offset).
    for (name, copy, offset) in [
        ("altered", &flipped, records[second].offset),
        ("missing", &dropped, records[third].offset),
        ("reordered", &swapped, records[third].offset),
    ] {
        let file = dir.path().join(format!("{name}.jsonl"));
        write_export(&file, copy)?;
        let (out, text) = verify(&a, &public, &["--file", file.to_str().unwrap()])?;
        assert!(!out.status.success(), "{name}: {text}");
        assert!(
            text.contains(&format!(
                "partition {partition}: BROKEN, {name} at offset {offset}"
            )),
            "{name}: {text}"
        );
        let other = 1 - partition;
        assert!(
            text.contains(&format!("partition {other}: OK")),
            "{name}: {text}"
        );
    }

    // The flipped copy in a topic of its own: the Kafka path names it too.
    let copy = format!("{}receipts-tampered", a.config.topics.prefix);
    topics::create(
        &a.config,
        &[TopicSpec {
            name: copy.clone(),
            configs: Vec::new(),
        }],
        Duration::from_secs(30),
    )
    .await?;
    for r in &flipped {
        let mut headers = OwnedHeaders::new();
        for (k, v) in &r.headers {
            headers = headers.insert(Header {
                key: k,
                value: Some(v.as_bytes()),
            });
        }
        let value = r.value.as_deref().map(from_hex);
        let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&copy)
            .partition(r.partition)
            .headers(headers);
        if let Some(value) = &value {
            record = record.payload(value);
        }
        producer
            .send(record, Duration::from_secs(30))
            .await
            .map_err(|(e, _)| anyhow::anyhow!("producing to {copy}: {e}"))?;
    }
    let (out, text) = verify(&a, &public, &["--topic", &copy])?;
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains(&format!("partition {partition}: BROKEN, altered")),
        "{text}"
    );
    // Only the partition asked for.
    let (out, text) = verify(
        &a,
        &public,
        &[
            "--topic",
            &copy,
            "--partitions",
            &(1 - partition).to_string(),
        ],
    )?;
    assert!(out.status.success(), "{text}");
    Ok(())
}

fn from_hex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
        .collect()
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
