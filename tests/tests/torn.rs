//! A batch torn on the changelog: an owner that dies while its last batch's changelog records
//! are in flight leaves only a prefix of them. One instance decides a workload and stops; its
//! changelog is then copied, cut inside its last deciding batch at every record boundary, to a
//! fresh set of topics (with the inputs, at the same offsets and times), and a new instance
//! restores from each cut. It must drop the torn rows, decide their inputs again exactly as
//! the first instance did (the same replies, and journal events with the same sequence
//! numbers and content: no number reused for another event), and a third instance restoring
//! from what the second left must reach the same state.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use airlock_processor::runtime::partition::Source;
use airlock_processor::runtime::wire::{self, Admit, header};
use airlock_processor::store::keys::Table;
use airlock_processor::store::{RocksBackend, RocksOptions, StateStore, Store};
use airlock_schemas::{
    ChangelogRecord, Codec, Decision, JournalEvent, JournalKind, StateTable, ToolProposal,
};
use airlock_tests::airlock::{Airlock, Options, Read};
use airlock_tests::eventually;
use airlock_tests::workload::{self, Lcg};
use anyhow::Context;
use rdkafka::admin::{AdminClient, AdminOptions, AlterConfig, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};

const WITHIN: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changelog_cut_inside_a_batch_is_restored_to_its_last_whole_batch() -> anyhow::Result<()>
{
    let a = Airlock::start("torn", 1).await?;
    let now = airlock_tests::wall_ms();
    let mut proposals = workload::proposals(20, now, &mut Lcg(7));
    // The last batch: three fresh refunds sent together once the rest are answered.
    let last: Vec<_> = (0..3)
        .map(|i| airlock_processor::sample::refund(&format!("refund:last{i}"), 500, now))
        .collect();
    let p1 = a.spawn("p1")?;
    let producer = a.producer()?;
    let topic = a.names.proposals();
    a.send_many(&producer, &topic, &proposals, |p| p.operation_key.as_str())
        .await?;
    a.await_replies(proposals.iter().map(|p| p.proposal_id.as_str()), WITHIN)
        .await?;
    a.send_many(&producer, &topic, &last, |p| p.operation_key.as_str())
        .await?;
    a.await_replies(last.iter().map(|p| p.proposal_id.as_str()), WITHIN)
        .await?;
    p1.stop()?;
    proposals.extend(last);

    // Every input topic, barriers too (the processor's ticks): copied with the rest, they keep
    // every record at its offset, and the last one consumed keeps its fingerprint.
    let all_inputs = Source::ALL
        .map(|s| Ok((s, a.read_topic_and_barriers(&a.names.input(s))?)))
        .into_iter()
        .collect::<anyhow::Result<Vec<_>>>()?;
    let inputs = all_inputs[0].1.clone();
    let changelog = a.read_topic(&a.names.changelog())?;
    let replies = normalized_replies(&a)?;
    let journal = journal_by_sequence(&a)?;

    // The last batch that decided proposals: it holds an input offset row and effect rows (a
    // batch of ticks alone holds an offset row only).
    let batches = batches(&changelog);
    let has = |first: usize, end: usize, table: Table| {
        changelog[first..=end]
            .iter()
            .any(|r| r.key.as_ref().and_then(|k| k.first()) == Some(&table.prefix()))
    };
    let (first, end) = batches
        .iter()
        .rev()
        .copied()
        .find(|&(first, end)| has(first, end, Table::Offset) && has(first, end, Table::Effect))
        .context("a batch that decided proposals")?;
    let len = end + 1 - first;
    assert!(len >= 3, "the last deciding batch has {len} changelog rows");
    eprintln!(
        "{} changelog records, {} batches, the last deciding one {len} rows",
        changelog.len(),
        batches.len()
    );

    for k in 0..=len {
        let b = a
            .alongside(&format!("torn-{k}"), 1, Options::default())
            .await?;
        // The inputs keep their times: producer time on the copy's input topic.
        let admin: AdminClient<DefaultClientContext> = b.config.client_config().create()?;
        let copied_inputs = Source::ALL.map(|s| b.names.input(s));
        let alter: Vec<AlterConfig<'_>> = copied_inputs
            .iter()
            .map(|t| {
                AlterConfig::new(ResourceSpecifier::Topic(t))
                    .set("message.timestamp.type", "CreateTime")
            })
            .collect();
        admin
            .alter_configs(
                &alter,
                &AdminOptions::new().request_timeout(Some(Duration::from_secs(30))),
            )
            .await?
            .into_iter()
            .collect::<Result<Vec<_>, _>>()
            .map_err(|(r, e)| anyhow::anyhow!("altering {r:?}: {e}"))?;
        let to_b = b.producer()?;
        for ((_, records), to) in all_inputs.iter().zip(&copied_inputs) {
            copy(&to_b, records, to, true, |r| Ok(r.clone())).await?;
        }
        copy(
            &to_b,
            &changelog[..first + k],
            &b.names.changelog(),
            false,
            |r| renamed(r, &a.config.topics.prefix, &b.config.topics.prefix),
        )
        .await?;

        // Whatever the cut, the inputs after the last whole batch are decided again.
        let whole_until = if k == len { end + 1 } else { first };
        let resumes_at = changelog[..whole_until]
            .iter()
            .rev()
            .find_map(|r| next_proposal_offset(r, &topic))
            .unwrap_or(0);
        let again: Vec<String> = inputs
            .iter()
            .filter(|r| {
                r.offset >= resumes_at && !wire::is_barrier(r.key.as_deref(), r.value.as_deref())
            })
            .map(proposal_id)
            .collect::<anyhow::Result<_>>()?;

        let p = b.spawn("p1")?;
        b.await_replies(again.iter().map(String::as_str), WITHIN)
            .await
            .with_context(|| format!("cut {k} of {len}: the inputs from offset {resumes_at}"))?;
        let torn = p.telemetry.restore_torn_rows.get(&[]);
        p.stop()?;
        let expected_torn = if k == len { 0 } else { k as u64 };
        assert_eq!(torn, expected_torn, "cut {k} of {len}: torn rows dropped");

        let replies_b = normalized_replies(&b)?;
        for id in &again {
            assert_eq!(
                replies_b.get(id),
                replies.get(id),
                "cut {k} of {len}: the reply to {id} decided again"
            );
        }
        let journal_b = journal_by_sequence(&b)?;
        for (sequence, event) in &journal_b {
            let theirs = journal.get(sequence);
            if event.kind == JournalKind::Checkpoint {
                // Checkpoints are journaled by the wall clock: only their place must agree.
                assert_eq!(
                    theirs.map(|e| (e.kind, &e.projection_hash)),
                    Some((event.kind, &event.projection_hash)),
                    "cut {k} of {len}: journal event {sequence}"
                );
                continue;
            }
            assert_eq!(
                Some(event),
                theirs,
                "cut {k} of {len}: journal event {sequence}"
            );
        }

        // A later restore, from what the cut and the second instance left, agrees with it.
        let q = b.spawn("p2")?;
        eventually("p2 claimed the partition", WITHIN, async || {
            Ok((q.telemetry.claims.get(&["rebuilt"]) > 0).then_some(()))
        })
        .await?;
        q.stop()?;
        assert_eq!(
            projection(&b, "p2")?,
            projection(&b, "p1")?,
            "cut {k} of {len}: the state restored from the second instance's changelog"
        );
        eprintln!(
            "cut {k} of {len}: {torn} torn rows dropped, {} inputs decided again, {} journal events",
            again.len(),
            journal_b.len()
        );
    }
    Ok(())
}

/// `(first, last)` indexes into `changelog` of each whole batch of accepted rows.
fn batches(changelog: &[Read]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut first = None;
    for (i, r) in changelog.iter().enumerate() {
        if r.admit != Admit::Accept {
            continue;
        }
        let start = *first.get_or_insert(i);
        if r.header(header::BATCH_END).is_some() {
            out.push((start, i));
            first = None;
        }
    }
    out
}

/// Produces `records` to partition 0 of `topic` in order, with their keys, headers and times;
/// with `same_offsets`, each at the offset it had (inputs: the state names their offsets).
async fn copy(
    producer: &FutureProducer,
    records: &[Read],
    topic: &str,
    same_offsets: bool,
    transform: impl Fn(&Read) -> anyhow::Result<Read>,
) -> anyhow::Result<()> {
    for original in records {
        let r = transform(original)?;
        let mut headers = OwnedHeaders::new();
        for (k, v) in &r.headers {
            headers = headers.insert(Header {
                key: k,
                value: Some(v.as_slice()),
            });
        }
        let mut record: FutureRecord<'_, [u8], [u8]> =
            FutureRecord::to(topic).partition(0).headers(headers);
        if let Some(key) = &r.key {
            record = record.key(key.as_slice());
        }
        if let Some(value) = &r.value {
            record = record.payload(value.as_slice());
        }
        if let Some(ts) = r.timestamp {
            record = record.timestamp(ts);
        }
        let offset = producer
            .send(record, Duration::from_secs(30))
            .await
            .map_err(|(e, _)| anyhow::anyhow!("copying to {topic}: {e}"))?
            .offset;
        anyhow::ensure!(
            !same_offsets || offset == original.offset,
            "copying to {topic}: offset {offset} for the record at {}",
            original.offset
        );
    }
    Ok(())
}

/// A changelog record of prefix `from` as prefix `to` writes it: input offset rows are keyed
/// by their topic's full name.
fn renamed(r: &Read, from: &str, to: &str) -> anyhow::Result<Read> {
    let Some(value) = r.value.as_ref().filter(|_| r.admit == Admit::Accept) else {
        // A fence marker, or a tombstone (its key is a store key of a table that is not renamed).
        return Ok(r.clone());
    };
    let codec = Codec::new();
    let mut record: ChangelogRecord = codec.decode_as(value)?;
    let rename = |name: &str| match name.strip_prefix(from) {
        Some(rest) => format!("{to}{rest}"),
        None => name.to_owned(),
    };
    if record.table == StateTable::Offset {
        record.key = rename(std::str::from_utf8(&record.key)?).into_bytes();
    }
    for o in &mut record.input_offsets {
        o.topic = rename(&o.topic);
    }
    let mut out = r.clone();
    out.key =
        Some(airlock_processor::runtime::partition::store_table(record.table).key(&record.key));
    out.value = Some(codec.encode_single_object(&record)?);
    Ok(out)
}

/// The proposals offset a changelog record's batch had consumed up to, if it says.
fn next_proposal_offset(r: &Read, topic: &str) -> Option<i64> {
    if r.admit != Admit::Accept {
        return None;
    }
    let record: ChangelogRecord = Codec::new().decode_as(r.value.as_ref()?).ok()?;
    record
        .input_offsets
        .iter()
        .find(|o| o.topic == topic)
        .map(|o| o.offset)
}

fn proposal_id(r: &Read) -> anyhow::Result<String> {
    let value = r
        .value
        .as_ref()
        .context("a proposal record without a value")?;
    Ok(Codec::new().decode_as::<ToolProposal>(value)?.proposal_id)
}

/// Replies by proposal id, without the owner's stamp (another instance's epoch).
fn normalized_replies(a: &Airlock) -> anyhow::Result<BTreeMap<String, Decision>> {
    Ok(a.proposal_replies()?
        .into_iter()
        .map(|(id, mut d)| {
            d.owner_epoch = 0;
            (id, d)
        })
        .collect())
}

/// The accepted journal events by sequence number, without the owner's stamp.
fn journal_by_sequence(a: &Airlock) -> anyhow::Result<BTreeMap<i64, JournalEvent>> {
    let codec = Codec::new();
    let mut out = BTreeMap::new();
    for r in a.read_topic(&a.names.journal())? {
        if r.admit != Admit::Accept {
            continue;
        }
        let Some(value) = &r.value else { continue };
        let mut event: JournalEvent = codec.decode_as(value)?;
        event.owner_epoch = 0;
        event.task = String::new();
        let seq = event.sequence;
        if let Some(seen) = out.insert(seq, event.clone()) {
            anyhow::ensure!(seen == event, "two journal events numbered {seq}");
        }
    }
    Ok(out)
}

/// The projection hash of instance `instance`'s store of partition 0.
fn projection(a: &Airlock, instance: &str) -> anyhow::Result<String> {
    let dir = a.state_dir(instance).join("partition-0");
    let store = StateStore::open(RocksBackend::open(&dir, &RocksOptions::default())?)?;
    Ok(store.projection_hash())
}
