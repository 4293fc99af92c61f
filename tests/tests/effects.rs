//! `airlock effects list` against a real broker, two processor instances in one group and no
//! connector worker: a refund above the automatic tier waits for approval, a small one is
//! dispatched to a connector nobody runs, so after its attempt deadline (the reference 10 s)
//! it is UNKNOWN, then OPERATOR_REQUIRED once reconciliation gives up. The command lists each
//! under its state, filters by state, tool, tenant and age, answers in JSON, and still answers
//! once every processor has stopped (it reads the changelog, not the instances).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use airlock_processor::sample;
use airlock_tests::airlock::{Airlock, Options};
use airlock_tests::eventually;
use airlock_tests::wall_ms;

/// The operation keys `airlock effects list <args>` printed, one per line before its summary.
fn listed(a: &Airlock, args: &[&str]) -> anyhow::Result<Vec<String>> {
    let mut all = vec!["effects", "list"];
    all.extend_from_slice(args);
    let (ok, out, err) = a.cli(&all)?;
    anyhow::ensure!(ok, "airlock {}:\n{out}\n{err}", all.join(" "));
    let lines: Vec<&str> = out.lines().collect();
    let (summary, rows) = lines.split_last().expect("a summary line");
    anyhow::ensure!(summary.contains("effects listed"), "{out}");
    Ok(rows
        .iter()
        .map(|l| l.split_whitespace().next().unwrap_or_default().to_owned())
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn effects_are_listed_by_state_from_the_changelog_across_instances() -> anyhow::Result<()> {
    let a = Airlock::start_with(
        "effects",
        3,
        Options {
            reference_attempt_timeouts: true,
            ..Options::default()
        },
    )
    .await?;
    let p1 = a.spawn("p1")?;
    let p2 = a.spawn("p2")?;
    let producer = a.producer()?;
    let now = wall_ms();
    let waiting = sample::refund("refund:effects-waiting", 20_000, now);
    let mut stuck = sample::refund("refund:effects-stuck", 100, now);
    stuck.run_id = "run-effects-stuck".to_owned();
    for p in [&waiting, &stuck] {
        a.send(&producer, &a.names.proposals(), &p.operation_key, p)
            .await?;
    }
    a.await_replies(
        [waiting.proposal_id.as_str(), stuck.proposal_id.as_str()],
        Duration::from_secs(60),
    )
    .await?;

    // No worker answers: the dispatched refund becomes UNKNOWN at its attempt deadline, then
    // OPERATOR_REQUIRED when its reconciliation rounds go unanswered.
    let stuck_states = ["--state", "UNKNOWN", "--state", "operator-required"];
    eventually(
        "the dispatched refund listed UNKNOWN or OPERATOR_REQUIRED",
        Duration::from_secs(90),
        async || {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Ok(listed(&a, &stuck_states)?
                .contains(&stuck.operation_key)
                .then_some(()))
        },
    )
    .await?;
    assert_eq!(
        listed(&a, &stuck_states)?,
        std::slice::from_ref(&stuck.operation_key)
    );
    assert_eq!(
        listed(&a, &["--state", "AWAITING_APPROVAL"])?,
        std::slice::from_ref(&waiting.operation_key)
    );
    let mut all = listed(&a, &[])?;
    all.sort();
    let mut expected = vec![stuck.operation_key.clone(), waiting.operation_key.clone()];
    expected.sort();
    assert_eq!(all, expected, "no state asked: every effect");
    assert!(listed(&a, &["--tool", "send_email"])?.is_empty());
    assert_eq!(
        listed(&a, &["--run", &stuck.run_id])?,
        std::slice::from_ref(&stuck.operation_key),
        "the other refund is of another run"
    );
    assert!(listed(&a, &["--run", "no-such-run"])?.is_empty());
    assert!(listed(&a, &["--tenant", "someone-else"])?.is_empty());
    assert_eq!(
        listed(&a, &["--tenant", "acme", "--tool", "refund"])?.len(),
        2
    );
    assert!(
        listed(&a, &["--older-than", "3600"])?.is_empty(),
        "both changed within the hour"
    );
    let (ok, out, err) = a.cli(&["effects", "list", "--state", "bogus"])?;
    assert!(!ok && err.contains("unknown state"), "{out}\n{err}");

    // JSON, once every processor has stopped: the changelog answers alone.
    p1.stop()?;
    p2.stop()?;
    let (ok, out, err) = a.cli(&["effects", "list", "--json", "--state", "AWAITING_APPROVAL"])?;
    assert!(ok, "{out}\n{err}");
    let rows: Vec<serde_json::Value> = serde_json::from_str(&out)?;
    assert_eq!(rows.len(), 1, "{out}");
    assert_eq!(rows[0]["operation_key"], waiting.operation_key.as_str());
    assert_eq!(rows[0]["state"], "AWAITING_APPROVAL");
    assert_eq!(rows[0]["tenant_id"], "acme");
    assert_eq!(rows[0]["tool"], "refund");
    Ok(())
}
