//! Tenant-scoped identifiers (`processor.key_scope = "tenant"`, set through the environment of
//! an `airlock run` process) against a real broker, a connector worker and the reference
//! ledger: a tenant that proposes under another tenant's operation key first takes nothing
//! from it, and the same key under each tenant's prefix is two intents, two dispatches with
//! two idempotency keys, and two effects in the ledger. Then the Python client's tenant tests
//! (`clients/python/tests/tenants`) run against the same processor: its derived proposal ids
//! and its tool layer's keys and run ids carry the tenant's prefix, and it takes the refusal of
//! a proposal under another tenant's key as its answer.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use airlock_processor::core::KeyScope;
use airlock_processor::sample;
use airlock_schemas::{Decision, Reason, ToolProposal, Verdict};
use airlock_tests::airlock::{Airlock, Options};
use airlock_tests::connector::{Keys, Ledger};
use airlock_tests::eventually;
use airlock_tests::wall_ms;
use airlock_tests::{pytest, pytest_passes};

const WAIT: Duration = Duration::from_secs(90);

fn log_file(what: &str) -> PathBuf {
    std::env::temp_dir().join(format!("airlock-tenants-{what}-{}.log", std::process::id()))
}

/// The decision replying to proposal `id`, whatever its kind (`p/`, or the `r/` refusal of a
/// proposal that is not remembered).
async fn reply_to(a: &Airlock, id: &str) -> anyhow::Result<Decision> {
    eventually(&format!("the reply to {id}"), WAIT, async || {
        Ok(
            a.read_deduplicated::<Decision>(&a.names.decisions(), "decision")?
                .into_iter()
                .find(|d| d.in_reply_to == id),
        )
    })
    .await
}

async fn committed(a: &Airlock, key: &str, logs: &[&Path]) -> anyhow::Result<Decision> {
    let result = eventually(&format!("{key} settled COMMITTED"), WAIT, async || {
        Ok(
            a.read_deduplicated::<Decision>(&a.names.decisions(), "decision")?
                .into_iter()
                .find(|d| d.operation_key == key && d.verdict == Verdict::Committed),
        )
    })
    .await;
    if result.is_err() {
        for log in logs {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(40).collect();
            eprintln!("--- {} (newest first)\n{}", log.display(), tail.join("\n"));
        }
    }
    result
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_never_share_a_key_from_proposal_to_ledger() -> anyhow::Result<()> {
    let keys = Keys::generate()?;
    let mut a = Airlock::start_with("tenants", 2, Options::with_workers(&keys)).await?;
    a.config.processor.key_scope = KeyScope::Tenant;
    let (processor_log, ledger_log, worker_log) = (
        log_file("processor"),
        log_file("ledger"),
        log_file("worker"),
    );
    let ledger = Ledger::start(
        &[
            ("acme", "acct-42", "EUR", 1_000_000),
            ("globex", "acct-7", "EUR", 1_000_000),
        ],
        &ledger_log,
    )?;
    let group = format!("{}processor", a.config.topics.prefix);
    let _processor = a.spawn_process("p1", &group, &processor_log)?;
    let worker = a.spawn_connector("w1", &ledger, &[&keys.verifying_file], &worker_log)?;
    let logs = [
        processor_log.as_path(),
        worker_log.as_path(),
        ledger_log.as_path(),
    ];
    let producer = a.producer()?;
    let now = wall_ms();

    let (acme, globex) = sample::tenant_refunds("refund:t-1", now);
    // globex's agent goes first, under acme's key and with acme's proposal id: as itself, then
    // naming acme as its tenant.
    let squats = [
        ToolProposal {
            operation_key: acme.operation_key.clone(),
            proposal_id: acme.proposal_id.clone(),
            ..globex.clone()
        },
        ToolProposal {
            principal_id: globex.principal_id.clone(),
            proposal_id: "acme/p-0".into(),
            ..acme.clone()
        },
    ];
    for squat in &squats {
        a.send(&producer, &a.names.proposals(), &squat.operation_key, squat)
            .await?;
        let refused = reply_to(&a, &squat.proposal_id).await?;
        assert_eq!(
            (refused.verdict, refused.reason),
            (Verdict::Rejected, Reason::TenantMismatch),
            "{refused:?}"
        );
        assert!(refused.decision_id.starts_with("r/"), "{refused:?}");
    }

    // acme's own proposal under that key and id, then globex's under its own prefix.
    for p in [&acme, &globex] {
        a.send(&producer, &a.names.proposals(), &p.operation_key, p)
            .await?;
    }
    let replies = a
        .await_replies(
            [acme.proposal_id.as_str(), globex.proposal_id.as_str()],
            WAIT,
        )
        .await?;
    for p in [&acme, &globex] {
        let d = &replies[&p.proposal_id];
        assert_eq!(d.verdict, Verdict::Accepted, "{d:?}");
        assert_eq!(d.operation_key, p.operation_key, "{d:?}");
        committed(&a, &p.operation_key, &logs).await?;
    }

    // Two dispatches, one per tenant, with idempotency keys of their own; one effect each.
    let dispatches = a.dispatches()?;
    assert_eq!(dispatches.len(), 2, "{dispatches:?}");
    assert_ne!(dispatches[0].idempotency_key, dispatches[1].idempotency_key);
    for p in [&acme, &globex] {
        let d = dispatches
            .iter()
            .find(|d| d.operation_key == p.operation_key)
            .expect("a dispatch of each intent");
        assert_eq!(d.tenant_id, p.tenant_id);
        assert_eq!(ledger.effects_for(&p.operation_key).await?, 1);
    }
    assert_eq!(ledger.effects_total().await?, 2);

    // The Python client against the same processor: two more effects, none for the squat.
    let mut tests = pytest("tenants")?;
    tests
        .env("AIRLOCK_TEST_BROKERS", &a.config.kafka.brokers)
        .env("AIRLOCK_TEST_PREFIX", &a.config.topics.prefix)
        .env("AIRLOCK_TEST_REGISTRY", &a.config.tools.registry);
    pytest_passes(
        tests,
        Duration::from_secs(240),
        "the Python client's tenant tests",
    )
    .await?;
    assert_eq!(ledger.effects_total().await?, 4);
    assert!(worker.stop()?);
    Ok(())
}
