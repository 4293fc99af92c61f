//! A zombie that one consumer group makes by itself, on a broker that evicts a member which
//! stops heartbeating (Apache Kafka). Two `airlock run` instances share the partitions in one
//! group, with a connector worker and the reference ledger. One instance is frozen (SIGSTOP)
//! past its session timeout: the broker evicts it and the other instance claims its partitions
//! (a new owner epoch, fence markers first). Load keeps flowing. The freeze comes right after a
//! burst, so the frozen instance is caught deciding it: resumed, it finishes the batch and its
//! producer sends decisions and dispatch commands before it learns of the eviction, behind the
//! markers (up to six freezes until that happens). Every consumer drops those: the
//! connector worker (its log names each one), and the decision reader (the replies are the
//! surviving owner's); the ledger holds one effect per committed refund and none for a failed
//! one.
//!
//! tansu 0.6 never evicts a silent member (`compat::Broker::evicts_silent_members`): there the
//! test says so and stops.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use airlock_processor::runtime::wire::Admit;
use airlock_processor::sample;
use airlock_schemas::{Decision, Verdict};
use airlock_tests::airlock::{Airlock, Options};
use airlock_tests::connector::{Keys, Ledger};
use airlock_tests::eventually;

const PARTITIONS: i32 = 2;
/// At most this many freezes to catch the resumed instance writing before it learns.
const FREEZES: usize = 6;

fn signal(child: &Child, sig: &str) -> anyhow::Result<()> {
    let status = Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()?;
    anyhow::ensure!(status.success(), "kill {sig} {} failed", child.id());
    Ok(())
}

/// Records of `topic` that the owner-epoch fence drops.
fn fenced(a: &Airlock, topic: &str) -> anyhow::Result<usize> {
    Ok(a.read_topic(topic)?
        .iter()
        .filter(|r| matches!(r.admit, Admit::Fenced { .. }))
        .count())
}

fn count_lines(path: &Path, needle: &str) -> usize {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(needle))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_processor_evicted_while_frozen_writes_only_behind_the_fence() -> anyhow::Result<()> {
    let keys = Keys::generate()?;
    let a = Arc::new(
        Airlock::start_with(
            "evicted",
            PARTITIONS,
            Options {
                reference_attempt_timeouts: true,
                signing_key_file: Some(keys.signing_file.clone()),
                ..Options::default()
            },
        )
        .await?,
    );
    if !a.config.kafka.compatibility.evicts_silent_members() {
        eprintln!(
            "skipped: {} never evicts a silent group member",
            a.config.kafka.compatibility
        );
        return Ok(());
    }
    // Logs outlive a failed run: $TMPDIR/airlock-eviction-<pid>/.
    let dir = std::env::temp_dir().join(format!("airlock-eviction-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let (log, worker_log) = (dir.join("run.log"), dir.join("worker.log"));
    let ledger = Ledger::start(
        &[("acme", "acct-42", "EUR", 1_000_000_000)],
        &dir.join("ledger.log"),
    )?;
    let worker = a.spawn_connector("w1", &ledger, &[&keys.verifying_file], &worker_log)?;
    let mut p1 = a.spawn_process("p1", "group", &log)?;
    let mut p2 = a.spawn_process("p2", "group", &log)?;

    // About 20 refunds a second, each a fresh key, through every freeze and resume until the
    // freezes are over.
    let stop = Arc::new(AtomicBool::new(false));
    let sent: Arc<Mutex<BTreeMap<String, String>>> = Arc::default();
    let now = airlock_tests::wall_ms();
    let sender = {
        let (a, stop, sent) = (a.clone(), stop.clone(), sent.clone());
        tokio::spawn(async move {
            let producer = a.producer()?;
            let topic = a.names.proposals();
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let p = sample::refund(&format!("refund:evicted-{i}"), 100 + i, now);
                a.send(&producer, &topic, &p.operation_key, &p).await?;
                sent.lock()
                    .expect("sent")
                    .insert(p.proposal_id, p.operation_key);
                i += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            anyhow::Ok(())
        })
    };

    let session = Duration::from_millis(a.config.processor.session_timeout_ms);
    let started = Instant::now();
    let producer = a.producer()?;
    let (mut decisions_fenced, mut dispatches_fenced) = (0, 0);
    for round in 1..=FREEZES {
        tokio::time::sleep(Duration::from_secs(3)).await;
        // A burst, then the freeze as soon as the broker has it: p1 is caught deciding its
        // share or with the outputs still in its producer, which go out when it resumes,
        // before it notices it was evicted (librdkafka notices its own session timeout on
        // its first tick after SIGCONT, so records fetched then are never decided).
        let burst: Vec<_> = (0..1_000)
            .map(|j| sample::refund(&format!("refund:evicted-b{round}-{j}"), 100 + j, now))
            .collect();
        a.send_many(&producer, &a.names.proposals(), &burst, |p| {
            p.operation_key.as_str()
        })
        .await?;
        signal(&p1, "-STOP")?;
        sent.lock()
            .expect("sent")
            .extend(burst.into_iter().map(|p| (p.proposal_id, p.operation_key)));
        // Past the session timeout (the broker evicts p1, p2 claims its partitions) and below
        // the poll interval (past it, p1's own client would leave the group on resuming).
        tokio::time::sleep(session + Duration::from_secs(2)).await;
        signal(&p1, "-CONT")?;
        tokio::time::sleep(Duration::from_secs(4)).await;
        decisions_fenced = fenced(&a, &a.names.decisions())?;
        dispatches_fenced = fenced(&a, &a.names.dispatch("ledger"))?;
        eprintln!(
            "freeze {round} at {:.1?}: {decisions_fenced} decisions and {dispatches_fenced} \
             dispatch commands behind a fence",
            started.elapsed()
        );
        if decisions_fenced > 0 && dispatches_fenced > 0 {
            break;
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    sender.await??;
    let sent = std::mem::take(&mut *sent.lock().expect("sent"));
    let ids: BTreeSet<String> = sent.keys().cloned().collect();
    let refunds = sent.len();

    let replies = a.await_replies(ids.iter().map(String::as_str), Duration::from_secs(180));
    let replies = match replies.await {
        Ok(r) => r,
        Err(e) => panic!(
            "{e}\n{}",
            airlock_tests::workload::explain_missing(&a, &ids, &log)?
        ),
    };
    assert!(
        replies.values().all(|d| d.verdict == Verdict::Accepted),
        "every fresh refund is dispatched once"
    );
    // Settled: COMMITTED, or FAILED with proof and the retry budget (3 attempts) spent: a
    // burst queues more calls at the worker than the reference 10 s attempt cap allows, and
    // a command that expired in the queue is refused unexecuted.
    let settled = eventually(
        "every refund COMMITTED or FAILED for good",
        Duration::from_secs(240),
        async || {
            let decisions = a.read_deduplicated::<Decision>(&a.names.decisions(), "decision")?;
            let settled = airlock_tests::workload::settled(decisions, 3);
            Ok((settled.len() == refunds).then_some(settled))
        },
    )
    .await
    .map_err(|e| {
        let settled = a
            .read_deduplicated::<Decision>(&a.names.decisions(), "decision")
            .map(|d| airlock_tests::workload::settled(d, 3));
        // The journal of one refund that did not settle says what held it.
        let story = settled.as_ref().ok().and_then(|settled| {
            let key = sent.values().find(|k| !settled.contains_key(*k))?;
            Some(airlock_tests::workload::story(&a, key))
        });
        anyhow::anyhow!(
            "{e}: {:?} of {refunds} settled; logs in {}\n{}",
            settled.map(|s| s.len()),
            dir.display(),
            story.unwrap_or_default()
        )
    })?;
    let committed: BTreeSet<String> = settled
        .into_iter()
        .filter(|(_, v)| *v == Verdict::Committed)
        .map(|(k, _)| k)
        .collect();
    for p in [&mut p1, &mut p2] {
        let _ = signal(p, "-TERM");
        let _ = p.wait();
    }
    assert!(worker.stop()?, "the worker stops cleanly on SIGTERM");

    assert!(
        decisions_fenced > 0 && dispatches_fenced > 0,
        "after {FREEZES} freezes the resumed instance never wrote behind a fence: the zombie \
         path was not exercised"
    );
    // The worker read every fenced dispatch command and executed none of them.
    let ignored = count_lines(&worker_log, "behind the fence");
    assert!(
        ignored >= dispatches_fenced,
        "the worker ignored {ignored} commands, {dispatches_fenced} were fenced"
    );
    // One business effect per committed refund, none for a failed one.
    assert_eq!(ledger.effects_total().await?, committed.len() as u64);
    for key in &committed {
        assert_eq!(ledger.effects_for(key).await?, 1, "{key}");
    }
    // Both instances claimed partitions more than once: the eviction, and every rejoin.
    let claims = count_lines(&log, "claimed in");
    assert!(claims > PARTITIONS as usize, "{claims} claims");
    eprintln!(
        "{refunds} refunds, {decisions_fenced} fenced decisions, {dispatches_fenced} fenced \
         dispatch commands, {ignored} ignored by the worker, {claims} claims, {:.1?}",
        started.elapsed()
    );
    Ok(())
}
