//! A run's lease fence on every partition (`airlock runs fence`), against a real broker and two
//! processor instances in one group: once the new owner has fenced the run, a proposal of the
//! stale owner is refused STALE_FENCE on every partition its keys land on, not only on the
//! partitions the new owner's own proposals reached; a lower fence is refused as coming from
//! the stale owner, also when that owner ran the same command successfully before the takeover;
//! the same fence again is recorded again. `airlock runs show` lists the run's
//! calls over every partition, what is open, and the fence and dispatches per partition.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use airlock_processor::runtime::partitioner::partition_for;
use airlock_processor::sample;
use airlock_schemas::{Reason, ToolProposal, Verdict};
use airlock_tests::airlock::{Airlock, Options};
use airlock_tests::wall_ms;

const PARTITIONS: i32 = 4;
const WAIT: Duration = Duration::from_secs(60);

/// One refund of `run` under `fence` per partition, each keyed to land there.
fn one_per_partition(run: &str, fence: i64, tag: &str) -> Vec<ToolProposal> {
    let mut by_partition = BTreeMap::new();
    for i in 0.. {
        let key = format!("refund:{tag}-{i}");
        by_partition
            .entry(partition_for(key.as_bytes(), PARTITIONS))
            .or_insert(key);
        if by_partition.len() == PARTITIONS as usize {
            break;
        }
    }
    by_partition
        .into_values()
        .map(|key| {
            let mut p = sample::refund(&key, 100, wall_ms());
            p.run_id = run.to_owned();
            p.lease_fence = fence;
            p
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_run_refuses_its_stale_owner_on_every_partition() -> anyhow::Result<()> {
    let a = Airlock::start_with("runs", PARTITIONS, Options::default()).await?;
    let p1 = a.spawn("p1")?;
    let p2 = a.spawn("p2")?;
    let producer = a.producer()?;
    let run = "run-fenced";

    let fence = |fence: &str| {
        a.cli(&[
            "runs",
            "fence",
            run,
            "--fence",
            fence,
            "--operator",
            "orchestrator-1",
        ])
    };
    // The first owner fences the run at 4 everywhere, then proposes on one partition only.
    let (ok, out, err) = fence("4")?;
    assert!(ok, "{out}\n{err}");
    let first = one_per_partition(run, 4, "first");
    a.send(
        &producer,
        &a.names.proposals(),
        &first[0].operation_key,
        &first[0],
    )
    .await?;
    let replies = a
        .await_replies([first[0].proposal_id.as_str()], WAIT)
        .await?;
    assert_eq!(replies[&first[0].proposal_id].verdict, Verdict::Accepted);

    // A new owner takes the run over at fence 5: every partition records it.
    let (ok, out, err) = fence("5")?;
    eprintln!("airlock runs fence {run} --fence 5:\n{out}{err}");
    assert!(ok, "{out}\n{err}");
    assert_eq!(
        out.lines()
            .filter(|l| l.starts_with("partition ") && l.contains("RECORDED FENCE_ADVANCED"))
            .count(),
        PARTITIONS as usize,
        "{out}"
    );

    // The stale owner goes on at fence 4, on every partition: refused everywhere.
    let stale = one_per_partition(run, 4, "stale");
    for p in &stale {
        a.send(&producer, &a.names.proposals(), &p.operation_key, p)
            .await?;
    }
    let replies = a
        .await_replies(stale.iter().map(|p| p.proposal_id.as_str()), WAIT)
        .await?;
    for p in &stale {
        let d = &replies[&p.proposal_id];
        assert_eq!(
            (d.verdict, d.reason),
            (Verdict::Rejected, Reason::StaleFence),
            "{} on partition {}: {}",
            p.operation_key,
            partition_for(p.operation_key.as_bytes(), PARTITIONS),
            d.detail
        );
    }
    assert!(
        a.dispatches()?
            .iter()
            .all(|d| !d.operation_key.starts_with("refund:stale-")),
        "nothing of the stale owner dispatched"
    );

    // The new owner proceeds at fence 5 on every partition.
    let fresh = one_per_partition(run, 5, "fresh");
    for p in &fresh {
        a.send(&producer, &a.names.proposals(), &p.operation_key, p)
            .await?;
    }
    let replies = a
        .await_replies(fresh.iter().map(|p| p.proposal_id.as_str()), WAIT)
        .await?;
    for p in &fresh {
        assert_eq!(replies[&p.proposal_id].verdict, Verdict::Accepted);
    }

    // The run as `airlock runs show` reads it from the changelog: the first owner's call and
    // the new owner's four, nothing of the stale owner's; fence 5 and the dispatches on every
    // partition. No worker runs, so every call is still open.
    let expected: Vec<&str> = std::iter::once(&first[0])
        .chain(&fresh)
        .map(|p| p.operation_key.as_str())
        .collect();
    let shown = airlock_tests::eventually("runs show with every call", WAIT, async || {
        let (ok, out, err) = a.cli(&["runs", "show", run, "--json"])?;
        anyhow::ensure!(ok, "{out}\n{err}");
        let v: serde_json::Value = serde_json::from_str(&out)?;
        let seen = v["calls"].as_array().map_or(0, Vec::len);
        Ok((seen == expected.len()).then_some(v))
    })
    .await?;
    let mut keys: Vec<&str> = shown["calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["operation_key"].as_str().unwrap())
        .collect();
    keys.sort_unstable();
    let mut want = expected.clone();
    want.sort_unstable();
    assert_eq!(keys, want, "{shown:#}");
    assert_eq!(shown["open"], expected.len(), "{shown:#}");
    let per_partition = shown["partitions"].as_array().unwrap();
    assert_eq!(per_partition.len(), PARTITIONS as usize, "{shown:#}");
    assert!(
        per_partition.iter().all(|p| p["lease_fence"] == 5),
        "{shown:#}"
    );
    let dispatched: u64 = per_partition
        .iter()
        .map(|p| p["dispatches"].as_u64().unwrap())
        .sum();
    assert_eq!(dispatched, expected.len() as u64, "{shown:#}");
    let (ok, out, err) = a.cli(&["runs", "show", run])?;
    eprintln!("airlock runs show {run}:\n{out}");
    assert!(ok, "{err}");
    assert!(
        out.starts_with(&format!("run {run}: 5 calls on 4 of 4 partitions")),
        "{out}"
    );
    assert!(
        out.contains("lease fence by partition: 0=5 1=5 2=5 3=5"),
        "{out}"
    );

    // The stale owner's own fence command, answered FENCE_ADVANCED before the takeover, is
    // refused on every partition now (an earlier answer to it does not count); the new
    // owner's fence again is recorded again.
    let (ok, out, err) = fence("4")?;
    eprintln!("airlock runs fence {run} --fence 4:\n{out}{err}");
    assert!(!ok, "{out}");
    assert!(err.contains("was not fenced at 4 on partitions"), "{err}");
    assert_eq!(
        out.lines()
            .filter(|l| l.contains("REJECTED STALE_FENCE") && l.contains("accepted fence 5"))
            .count(),
        PARTITIONS as usize,
        "{out}"
    );
    let (ok, out, err) = fence("5")?;
    assert!(ok, "{out}\n{err}");
    assert_eq!(
        out.matches("RECORDED FENCE_ADVANCED").count(),
        PARTITIONS as usize,
        "{out}"
    );

    p1.stop()?;
    p2.stop()?;
    Ok(())
}
