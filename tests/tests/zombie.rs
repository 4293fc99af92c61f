//! A zombie that claims its partition again. Instance `a` owns the partition; `b` takes it over
//! in another group (its fence marker voids everything `a` writes from then on) and leaves;
//! `a`, which never heard of the takeover, keeps deciding new proposals behind the fence; then
//! `a` restarts and claims the partition again.
//!
//! Its store holds decisions the fence voided, so the claim must not reuse it: it has to see
//! `b`'s records on the changelog, rebuild, take an epoch above `b`'s, and decide the voided
//! proposals again. (An earlier version advanced the store's known changelog end over `b`'s
//! records with `a`'s own acknowledgements, reused the store, claimed `b`'s epoch a second time
//! and never answered those proposals.) What its outbox still holds is dropped unsent, never
//! written behind `b`'s records.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::Duration;

use airlock_processor::runtime::wire::{self, Admit, FENCE_KIND, OutRecord, header};
use airlock_processor::store::keys::Table;
use airlock_processor::store::{RocksBackend, RocksOptions, StateStore, Store};
use airlock_schemas::{ChangelogRecord, Codec, StateTable, ToolProposal};
use airlock_tests::airlock::{Airlock, Process, Read};
use airlock_tests::eventually;
use airlock_tests::workload::{self, Lcg};

const WAIT: Duration = Duration::from_secs(90);

fn stop(mut child: Process) -> anyhow::Result<()> {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()?;
    anyhow::ensure!(status.success(), "kill -TERM {} failed", child.id());
    let status = child.wait()?;
    anyhow::ensure!(status.success(), "airlock run exited with {status}");
    Ok(())
}

async fn send(a: &Airlock, proposals: &[ToolProposal]) -> anyhow::Result<()> {
    let producer = a.producer()?;
    a.send_many(&producer, &a.names.proposals(), proposals, |p| {
        p.operation_key.as_str()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zombie_that_claims_again_rebuilds_and_answers_what_the_fence_voided()
-> anyhow::Result<()> {
    let a = Airlock::start("zombie", 1).await?;
    let log = std::env::temp_dir().join(format!("airlock-zombie-{}.log", std::process::id()));
    let now = airlock_tests::wall_ms();
    let proposals = workload::proposals(200, now, &mut Lcg(0x2b1e));
    let (before, behind) = proposals.split_at(100);
    let ids = |ps: &[ToolProposal]| -> BTreeSet<String> {
        ps.iter().map(|p| p.proposal_id.clone()).collect()
    };
    let all = ids(&proposals);

    // `a` decides the first half.
    let first = a.spawn_process("a", "group-1", &log)?;
    send(&a, before).await?;
    let first_ids = ids(before);
    eventually("a's replies", WAIT, async || {
        let d = a.proposal_replies()?;
        Ok(first_ids.iter().all(|id| d.contains_key(id)).then_some(()))
    })
    .await?;

    // `b` claims the partition in another group (a replacement for an instance declared dead),
    // fences it, and leaves.
    let b = a.spawn_process("b", "group-2", &log)?;
    eventually("b's fence marker", WAIT, async || {
        let markers = a
            .read_topic(&a.names.changelog())?
            .iter()
            .filter(|r| r.header(header::KIND) == Some(FENCE_KIND.as_bytes()))
            .count();
        Ok((markers >= 2).then_some(()))
    })
    .await?;
    stop(b)?;

    // `a` still owns the partition in its group and decides the second half behind b's fence.
    send(&a, behind).await?;
    // Resends of first-half proposals are answered already; the rest only `a` will decide.
    let behind_ids: BTreeSet<String> = ids(behind).difference(&first_ids).cloned().collect();
    eventually("a's fenced replies to the second half", WAIT, async || {
        let fenced: BTreeSet<String> = a
            .read_topic(&a.names.decisions())?
            .into_iter()
            .filter(|r| matches!(r.admit, Admit::Fenced { .. }))
            .filter_map(|r| {
                r.header_str(header::ID)
                    .and_then(|id| id.strip_prefix("p/"))
                    .map(str::to_owned)
            })
            .collect();
        Ok(behind_ids.is_subset(&fenced).then_some(()))
    })
    .await?;
    let replies = a.proposal_replies()?;
    assert!(
        behind_ids.iter().all(|id| !replies.contains_key(id)),
        "the fence let a zombie reply through"
    );
    stop(first)?;

    // A batch `a` committed but never saw acknowledged (as if killed between the two): one
    // changelog row of its voided epoch 1. The claim must drop it unsent: sent behind b's
    // records, a compacted changelog would keep it over b's row of the same key.
    let unsent = "changelog/0/zombie-unsent";
    {
        let dir = a.state_dir("a").join("partition-0");
        let mut store = StateStore::open(RocksBackend::open(&dir, &RocksOptions::default())?)?;
        let row = OutRecord {
            topic: a.names.changelog(),
            partition: 0,
            key: Some(b"zombie-unsent".to_vec()),
            value: Some(Codec::new().encode_single_object(&ChangelogRecord {
                partition: 0,
                owner_epoch: 1,
                table: StateTable::Meta,
                key: b"zombie-unsent".to_vec(),
                value: Some(b"never sent".to_vec()),
                input_offsets: Vec::new(),
                written_at: now,
            })?),
            headers: wire::identity("changelog", unsent, 0, 1),
            phase: 1,
        };
        store.stage_raw(
            Table::Outbox,
            &(1u64 << 40).to_be_bytes(),
            Some(wire::encode_outbox_row(&[row])),
        );
        store.commit()?;
    }

    // `a` comes back on the same disk and claims again: every proposal gets an admitted reply,
    // the same as an uninterrupted run's.
    let again = a.spawn_process("a", "group-3", &log)?;
    let decided = eventually("a reply to every proposal", WAIT, async || {
        let d = a.proposal_replies()?;
        Ok(all.iter().all(|id| d.contains_key(id)).then_some(d))
    })
    .await;
    let decided = match decided {
        Ok(d) => d,
        Err(e) => panic!("{e}\n{}", workload::explain_missing(&a, &all, &log)?),
    };
    stop(again)?;
    let text = std::fs::read_to_string(&log)?;
    let last_claim = text
        .lines()
        .rfind(|l| l.contains("[a]") && l.contains("claimed"))
        .expect("a logged its claims");
    let sent = a
        .read_topic(&a.names.changelog())?
        .iter()
        .filter(|r| r.header_str(header::ID) == Some(unsent))
        .count();
    assert_eq!(sent, 0, "the stale outbox row reached the changelog");
    assert!(
        last_claim.contains("owner epoch 3")
            && last_claim.contains("rebuilt")
            && last_claim.contains("1 stale outbox records dropped"),
        "a's second claim: {last_claim}"
    );
    workload::assert_matches_reference(&a, &decided)?;
    Ok(())
}

/// Forges a zombie's changelog row: `of`'s key and table, written by owner epoch 0 (behind
/// every claim's marker), with a value no owner wrote.
fn zombie_row(a: &Airlock, of: &ChangelogRecord) -> anyhow::Result<OutRecord> {
    let forged = ChangelogRecord {
        owner_epoch: 0,
        value: Some(b"a zombie's value".to_vec()),
        input_offsets: Vec::new(),
        ..of.clone()
    };
    let key = airlock_processor::runtime::partition::store_table(of.table).key(&of.key);
    Ok(OutRecord {
        topic: a.names.changelog(),
        partition: 0,
        headers: wire::identity(
            "changelog",
            &format!("changelog/0/zombie/{}", String::from_utf8_lossy(&key)),
            0,
            0,
        ),
        key: Some(key),
        value: Some(Codec::new().encode_single_object(&forged)?),
        phase: 1,
    })
}

/// The latest changelog record of each Kafka key, as compaction would keep it.
fn compacted(a: &Airlock) -> anyhow::Result<BTreeMap<Vec<u8>, Read>> {
    let mut latest = BTreeMap::new();
    for r in a.read_topic(&a.names.changelog())? {
        if let Some(key) = r.key.clone()
            && r.header(header::KIND) == Some(b"changelog".as_slice())
        {
            latest.insert(key, r);
        }
    }
    Ok(latest)
}

/// The latest admitted effect row of `key` on the changelog, once the changelog reflects the
/// proposals up to offset `next` (a decision is readable before its batch's changelog rows).
async fn settled_row(a: &Airlock, key: &str, next: i64) -> anyhow::Result<ChangelogRecord> {
    eventually("the batch's changelog rows", WAIT, async || {
        let rows = effect_rows(a)?;
        let proposals = a.names.proposals();
        let reflected = rows.iter().any(|r| {
            r.input_offsets
                .iter()
                .any(|o| o.topic == proposals && o.offset >= next)
        });
        Ok(reflected
            .then(|| {
                rows.into_iter()
                    .rfind(|r| r.table == StateTable::Effect && r.key == key.as_bytes())
            })
            .flatten())
    })
    .await
}

/// The admitted rows of the owners on the changelog, decoded: effect rows with a value, and
/// every row that carries input offsets (a batch's last).
fn effect_rows(a: &Airlock) -> anyhow::Result<Vec<ChangelogRecord>> {
    let codec = Codec::new();
    let mut rows = Vec::new();
    for r in a.read_topic(&a.names.changelog())? {
        if r.header(header::KIND) != Some(b"changelog".as_slice())
            || r.admit != Admit::Accept
            || r.value.is_none()
        {
            continue;
        }
        let record: ChangelogRecord = codec.decode_as(r.value.as_deref().unwrap_or_default())?;
        if (record.table == StateTable::Effect && record.value.is_some())
            || !record.input_offsets.is_empty()
        {
            rows.push(record);
        }
    }
    Ok(rows)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_writes_again_the_keys_a_zombie_wrote_behind_its_marker() -> anyhow::Result<()> {
    let a = Airlock::start("zombie-rows", 1).await?;
    let now = airlock_tests::wall_ms();
    let producer = a.producer()?;
    let ask = async |key: &str| -> anyhow::Result<()> {
        let p = airlock_processor::sample::refund(key, 500, now);
        a.send(&producer, &a.names.proposals(), key, &p).await?;
        eventually("the reply", WAIT, async || {
            Ok(a.proposal_replies()?
                .contains_key(&p.proposal_id)
                .then_some(()))
        })
        .await
    };
    // Whether the latest row of `of`'s key (all compaction would keep) is the owner's.
    let owners_row_is_latest = |of: &ChangelogRecord| -> anyhow::Result<bool> {
        let key = airlock_processor::runtime::partition::store_table(of.table).key(&of.key);
        Ok(compacted(&a)?
            .get(&key)
            .is_some_and(|r| r.admit == Admit::Accept))
    };
    let wait_for_owners_row = async |of: &ChangelogRecord, what: &str| -> anyhow::Result<()> {
        eventually(what, WAIT, async || {
            Ok(owners_row_is_latest(of)?.then_some(()))
        })
        .await
    };

    // While the owner runs: a zombie's row lands among its changelog records.
    let b = a.spawn("b")?;
    ask("refund:zombie-1").await?;
    let first = settled_row(&a, "refund:zombie-1", 1).await?;
    a.produce(vec![zombie_row(&a, &first)?])?;
    // (Not asserted here: the owner's next changelog write, a checkpoint perhaps, may already
    // have put its row back.)
    // The owner's next batch shows it another writer's records among its own.
    ask("refund:zombie-2").await?;
    wait_for_owners_row(&first, "the owner's row of the key written again").await?;

    // While the owner runs idle (past the checkpoint its last change owed, nothing more to
    // decide): its sweep barrier shows it the zombie's row.
    let second = settled_row(&a, "refund:zombie-2", 2).await?;
    let checkpoint = Duration::from_millis(a.config.processor.checkpoint_interval_ms);
    tokio::time::sleep(checkpoint + Duration::from_secs(1)).await;
    a.produce(vec![zombie_row(&a, &second)?])?;
    // (Not asserted here either: the sweep, once a second, may have run already. Nothing but
    // the sweep writes for the idle owner: without it the wait below times out.)
    wait_for_owners_row(&second, "the idle owner's row of the key written again").await?;
    ask("refund:zombie-3").await?;
    let third = settled_row(&a, "refund:zombie-3", 3).await?;
    b.stop()?;

    // While nobody runs: the next claim finds the zombie's row after what its store knew.
    a.produce(vec![zombie_row(&a, &third)?])?;
    assert!(!owners_row_is_latest(&third)?);
    let again = a.spawn("b")?;
    wait_for_owners_row(&third, "the claimer's row of the key written again").await?;
    again.stop()?;

    // Every key holds the owner's value: a restore from the compacted changelog loses none.
    let compacted = compacted(&a)?;
    let codec = Codec::new();
    for of in [&first, &second, &third] {
        let key = airlock_processor::runtime::partition::store_table(of.table).key(&of.key);
        let latest: ChangelogRecord =
            codec.decode_as(compacted[&key].value.as_deref().unwrap_or_default())?;
        assert_ne!(
            latest.value.as_deref(),
            Some(b"a zombie's value".as_slice())
        );
        assert!(latest.value.is_some(), "the key kept its value");
    }
    Ok(())
}
