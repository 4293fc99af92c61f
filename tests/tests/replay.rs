//! `airlock replay` and `airlock audit` against a journal a real processor wrote: the untouched
//! journal verifies; copies of it with one byte altered, one record dropped and two records
//! swapped each fail, and the replay names the break. `airlock audit` tells one key's history.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use airlock_processor::runtime::produce::Producer;
use airlock_processor::runtime::topics;
use airlock_processor::runtime::wire::{self, OutRecord};
use airlock_schemas::{Codec, JournalEvent, JournalKind, ToolProposal};
use airlock_tests::airlock::{Airlock, Read};
use airlock_tests::workload::{self, Lcg};
use airlock_tests::{eventually, unique_prefix};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_names_an_altered_a_dropped_and_a_swapped_journal_record() -> anyhow::Result<()> {
    let a = Airlock::start("replay", 1).await?;
    let processor = a.spawn("p1")?;
    let now = airlock_tests::wall_ms();
    let proposals = workload::proposals(240, now, &mut Lcg(11));
    let producer = a.producer()?;
    let topic = a.names.proposals();
    // Spread over several checkpoint intervals (2 s in the harness).
    for chunk in proposals.chunks(40) {
        a.send_many(&producer, &topic, chunk, |p| p.operation_key.as_str())
            .await?;
        tokio::time::sleep(Duration::from_millis(900)).await;
    }
    a.await_replies(ids(&proposals), WAIT).await?;
    // A checkpoint follows the last decisions within the interval, even when idle.
    tokio::time::sleep(Duration::from_secs(3)).await;
    processor.stop()?;

    let journal: Vec<Read> = a
        .read_topic(&a.names.journal())?
        .into_iter()
        .filter(|r| r.header(wire::header::KIND) == Some(b"journal".as_slice()))
        .collect();
    let codec = Codec::new();
    let events: Vec<JournalEvent> = journal
        .iter()
        .map(|r| codec.decode_as(r.value.as_deref().unwrap()))
        .collect::<Result<_, _>>()?;
    let (ok, stdout, stderr) = a.cli(&["replay"])?;
    assert!(ok, "the untouched journal must verify:\n{stdout}\n{stderr}");
    assert!(
        stdout.contains(&format!("total: {} events", events.len()))
            && stdout.contains("0 findings"),
        "{} journal events:\n{stdout}",
        events.len()
    );
    let last_checkpoint = events
        .iter()
        .rposition(|e| e.kind == JournalKind::Checkpoint)
        .expect("the processor journaled checkpoints");
    // A record that writes an effect, with a checkpoint after it.
    let victim = events[..last_checkpoint]
        .iter()
        .rposition(|e| e.kind == JournalKind::DispatchIntent)
        .expect("a dispatch intent before the last checkpoint");

    // 1. One byte of the victim altered: the operation key inside its state write.
    let mut altered = journal.clone();
    let value = altered[victim].value.as_mut().unwrap();
    let at = find(value, b"\"key\":\"").expect("the record carries a state write") + 7;
    value[at] ^= 0x01;
    let (ok, out) = replay_copy(&a, "altered", &altered)?;
    assert!(!ok, "{out}");
    assert!(out.contains("checkpoint"), "{out}");
    assert!(out.contains("the replay rebuilt"), "{out}");

    // 2. The victim dropped.
    let mut dropped = journal.clone();
    dropped.remove(victim);
    let (ok, out) = replay_copy(&a, "dropped", &dropped)?;
    assert!(!ok, "{out}");
    let sequence = events[victim].sequence;
    assert!(
        out.contains(&format!("sequences {sequence}..{} missing", sequence + 1)),
        "{out}"
    );

    // 3. The victim and the record before it swapped.
    let mut swapped = journal.clone();
    swapped.swap(victim - 1, victim);
    let (ok, out) = replay_copy(&a, "swapped", &swapped)?;
    assert!(!ok, "{out}");
    assert!(
        out.contains(&format!(
            "sequence {} arrived after a later one",
            sequence - 1
        )),
        "{out}"
    );

    // The history of the victim's key, as an auditor reads it.
    let key = events[victim].operation_key.clone().unwrap();
    let (ok, out, err) = a.cli(&["audit", "--key", &key])?;
    assert!(ok, "{out}\n{err}");
    assert!(
        out.contains("PROPOSAL_DECIDED") || out.contains("DISPATCH_INTENT"),
        "{out}"
    );
    assert!(
        out.contains(&format!("history of operation key {key}")),
        "{out}"
    );
    let (ok, out, _) = a.cli(&["audit", "--key", &key, "--json"])?;
    assert!(ok);
    let parsed: serde_json::Value = serde_json::from_str(out.trim())?;
    assert!(
        parsed
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["operation_key"] == key.as_str()),
        "{out}"
    );
    Ok(())
}

const WAIT: Duration = Duration::from_secs(120);

fn ids(proposals: &[ToolProposal]) -> impl Iterator<Item = &str> {
    proposals.iter().map(|p| p.proposal_id.as_str())
}

/// Checkpoints every partition journaled, by partition (accepted records, first copies).
fn checkpoints_by_partition(a: &Airlock) -> anyhow::Result<BTreeMap<i32, usize>> {
    let mut out = BTreeMap::new();
    for e in a.read_deduplicated::<JournalEvent>(&a.names.journal(), "journal")? {
        if e.kind == JournalKind::Checkpoint {
            *out.entry(e.partition).or_default() += 1;
        }
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoked_and_stopped_partitions_journal_the_checkpoint_they_owe() -> anyhow::Result<()> {
    let mut a = Airlock::start("closing-checkpoint", 2).await?;
    // No checkpoint falls due during the test: every one journaled is a closing one.
    a.config.processor.checkpoint_interval_ms = 3_600_000;
    let now = airlock_tests::wall_ms();
    let proposals = workload::proposals(80, now, &mut Lcg(5));
    let (first, second) = proposals.split_at(40);
    let producer = a.producer()?;
    let topic = a.names.proposals();

    let p1 = a.spawn("p1")?;
    a.send_many(&producer, &topic, first, |p| p.operation_key.as_str())
        .await?;
    a.await_replies(ids(first), WAIT).await?;
    assert_eq!(checkpoints_by_partition(&a)?, BTreeMap::new());

    // A second instance joins: the rebalance revokes p1's partitions, and each journals the
    // checkpoint it owes before its task stops.
    let p2 = a.spawn("p2")?;
    eventually(
        "a checkpoint of each revoked partition",
        Duration::from_secs(60),
        async || {
            let c = checkpoints_by_partition(&a)?;
            Ok((c.len() == 2).then_some(()))
        },
    )
    .await?;

    a.send_many(&producer, &topic, second, |p| p.operation_key.as_str())
        .await?;
    a.await_replies(ids(second), WAIT).await?;
    p1.stop()?;
    p2.stop()?;

    // Every partition's journal ends on a checkpoint, and the replay verifies each of them.
    let events = a.read_deduplicated::<JournalEvent>(&a.names.journal(), "journal")?;
    let mut last: BTreeMap<i32, &JournalEvent> = BTreeMap::new();
    for e in &events {
        last.insert(e.partition, e);
    }
    assert_eq!(last.len(), 2, "both partitions journaled");
    for (p, e) in &last {
        assert_eq!(
            e.kind,
            JournalKind::Checkpoint,
            "partition {p} ends on {:?}",
            e.kind
        );
    }
    let checkpoints: usize = checkpoints_by_partition(&a)?.values().sum();
    let (ok, stdout, stderr) = a.cli(&["replay"])?;
    assert!(ok, "{stdout}\n{stderr}");
    assert!(
        stdout.contains(&format!(
            "total: {} events, {checkpoints} checkpoints verified, 0 findings",
            events.len()
        )),
        "{checkpoints} checkpoints, {} events:\n{stdout}",
        events.len()
    );
    Ok(())
}

/// Writes `records` to the journal of a fresh topic prefix and replays it there.
fn replay_copy(a: &Airlock, what: &str, records: &[Read]) -> anyhow::Result<(bool, String)> {
    let mut config = a.config.clone();
    config.topics.prefix = unique_prefix(what);
    let names = topics::Names::new(&config.topics.prefix);
    let plan: Vec<_> = names
        .plan(["ledger"])
        .into_iter()
        .filter(|s| s.name == names.journal())
        .collect();
    let journal = names.journal();
    let out: Vec<OutRecord> = records
        .iter()
        .map(|r| OutRecord {
            topic: journal.clone(),
            partition: 0,
            key: r.key.clone(),
            value: r.value.clone(),
            headers: r.headers.clone(),
            phase: 0,
        })
        .collect();
    let client = config.client_config();
    let create = config.clone();
    std::thread::spawn(move || -> anyhow::Result<()> {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(topics::create(&create, &plan, Duration::from_secs(30)))?;
        // One record per produce request, as the processor's batches were written: tansu 0.6
        // serves a fetch from inside a multi-record batch badly.
        let producer = Producer::new(&client, 0)?;
        for r in &out {
            producer.send_phased(std::slice::from_ref(r))?;
        }
        Ok(())
    })
    .join()
    .map_err(|_| anyhow::anyhow!("copy thread panicked"))??;
    let output = a
        .command(&config)?
        .args(["replay", "--no-dispatch-check"])
        .output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    eprintln!("replay of the {what} copy:\n{text}");
    Ok((output.status.success(), text))
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}
