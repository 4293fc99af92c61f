//! Injected faults, over real HTTP against a ledger on 127.0.0.1:0: each fault commits or not
//! exactly as documented, lookups tell which, and armed rules are consumed in order.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::{TestLedger, body, call, exchange, get, money, post, request_bytes};
use serde_json::json;

async fn faulty(
    ledger: &TestLedger,
    kind: &str,
    key: &str,
    fault: &str,
    body: &serde_json::Value,
) -> common::Reply {
    call(
        ledger.addr,
        "POST",
        &format!("/v1/{kind}s"),
        &[("Idempotency-Key", key), ("Ledger-Fault", fault)],
        Some(body),
    )
    .await
}

#[tokio::test]
async fn dropped_response_still_commits_once() {
    let ledger = TestLedger::start().await;
    let refund = body("txn_4821", 1_250).to_string().into_bytes();
    let request = request_bytes(
        "POST",
        "/v1/refunds",
        &[
            ("Idempotency-Key", "refund:txn_4821"),
            ("Ledger-Fault", "drop-response"),
        ],
        &refund,
    );
    let (received, error) = exchange(ledger.addr, &request).await;
    assert!(
        received.is_empty(),
        "not a single response byte, got {:?}",
        String::from_utf8_lossy(&received)
    );
    if let Some(e) = error {
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}");
    }
    let lookup = get(ledger.addr, "/v1/effects/refund:txn_4821").await;
    assert_eq!(lookup.status, 200, "the lost response hid a commit");
    assert_eq!(lookup.json()["balance_after"], 11_250);
    // The client's retry with the same key is a replay, not a second refund.
    let retry = money(
        ledger.addr,
        "refund",
        "refund:txn_4821",
        &body("txn_4821", 1_250),
    )
    .await;
    assert_eq!(retry.status, 200);
    assert_eq!(retry.json(), lookup.json());
    assert_eq!(ledger.stats().await["by_reference"]["txn_4821"], 1);
    assert_eq!(ledger.balance().await, 11_250);
    ledger.stop().await;
}

#[tokio::test]
async fn refused_fault_commits_nothing_and_lookup_proves_absence() {
    let ledger = TestLedger::start().await;
    let refused = faulty(&ledger, "refund", "k1", "refuse", &body("txn_1", 100)).await;
    assert_eq!(
        (refused.status, refused.error()),
        (422, "injected_refusal".into())
    );
    let lookup = get(ledger.addr, "/v1/effects/k1").await;
    assert_eq!((lookup.status, lookup.error()), (404, "not_found".into()));
    assert_eq!(ledger.stats().await["effects_total"], 0);
    assert_eq!(ledger.balance().await, 10_000);
    // Nothing happened, so the retry under the same key is the first effect.
    let retry = money(ledger.addr, "refund", "k1", &body("txn_1", 100)).await;
    assert_eq!(retry.status, 201);
    ledger.stop().await;
}

#[tokio::test]
async fn error_before_commit_commits_nothing() {
    let ledger = TestLedger::start().await;
    let reply = faulty(
        &ledger,
        "debit",
        "k1",
        "error-before-commit",
        &body("t", 100),
    )
    .await;
    assert_eq!(
        (reply.status, reply.error()),
        (503, "injected_unavailable".into())
    );
    assert_eq!(get(ledger.addr, "/v1/effects/k1").await.status, 404);
    assert_eq!(ledger.balance().await, 10_000);
    ledger.stop().await;
}

#[tokio::test]
async fn error_after_commit_still_commits() {
    let ledger = TestLedger::start().await;
    let reply = faulty(
        &ledger,
        "debit",
        "k1",
        "error-after-commit",
        &body("t", 100),
    )
    .await;
    assert_eq!(
        (reply.status, reply.error()),
        (500, "injected_error".into())
    );
    let lookup = get(ledger.addr, "/v1/effects/k1").await;
    assert_eq!(
        lookup.status, 200,
        "a 500 that did not mean it didn't happen"
    );
    assert_eq!(lookup.json()["kind"], "debit");
    assert_eq!(ledger.balance().await, 9_900);
    ledger.stop().await;
}

#[tokio::test]
async fn a_slow_commit_is_visible_before_the_answer() {
    let ledger = TestLedger::start().await;
    let addr = ledger.addr;
    let started = Instant::now();
    let slow = tokio::spawn(async move {
        call(
            addr,
            "POST",
            "/v1/refunds",
            &[("Idempotency-Key", "slow"), ("Ledger-Fault", "delay=2500")],
            Some(&body("txn_slow", 10)),
        )
        .await
    });
    // A client that gives up early would see a timeout; the lookup already sees the effect.
    let lookup = loop {
        let lookup = get(addr, "/v1/effects/slow").await;
        if lookup.status == 200 || started.elapsed() > common::WAIT {
            break lookup;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(lookup.status, 200);
    assert!(!slow.is_finished(), "the answer is still delayed");
    let reply = common::within("the delayed answer", slow).await.unwrap();
    assert_eq!(reply.status, 201);
    assert!(started.elapsed() >= Duration::from_millis(2500));
    assert_eq!(reply.json(), lookup.json());
    ledger.stop().await;
}

#[tokio::test]
async fn faults_are_consumed_in_order() {
    let ledger = TestLedger::start().await;
    for (fault, times) in [("refuse", 1), ("error-before-commit", 2)] {
        let armed = post(
            ledger.addr,
            "/v1/faults",
            &json!({"fault": fault, "match": {"reference": "txn_1"}, "times": times}),
        )
        .await;
        assert_eq!(armed.status, 201, "{}", armed.json());
    }
    let listed = get(ledger.addr, "/v1/faults").await.json();
    assert_eq!(listed["faults"].as_array().unwrap().len(), 2);
    assert_eq!(listed["faults"][1]["remaining"], 2);

    let refund = body("txn_1", 100);
    let attempt = || money(ledger.addr, "refund", "refund:txn_1", &refund);
    let first = attempt().await;
    assert_eq!(
        (first.status, first.error()),
        (422, "injected_refusal".into())
    );
    for _ in 0..2 {
        let next = attempt().await;
        assert_eq!(
            (next.status, next.error()),
            (503, "injected_unavailable".into())
        );
    }
    let last = attempt().await;
    assert_eq!(last.status, 201, "the rules are used up");
    assert_eq!(
        get(ledger.addr, "/v1/faults").await.json()["faults"],
        json!([])
    );
    assert_eq!(ledger.stats().await["by_reference"]["txn_1"], 1);
    ledger.stop().await;
}

#[tokio::test]
async fn rules_hit_only_requests_that_would_commit() {
    let ledger = TestLedger::start().await;
    assert_eq!(
        money(ledger.addr, "refund", "done", &body("txn_1", 5))
            .await
            .status,
        201
    );
    let armed = post(ledger.addr, "/v1/faults", &json!({"fault": "refuse"})).await;
    assert_eq!(armed.status, 201);
    // A replay is a lookup, a business refusal is no commit, a reused key commits nothing:
    // none of them consumes the rule.
    let replay = money(ledger.addr, "refund", "done", &body("txn_1", 5)).await;
    assert_eq!(replay.status, 200);
    let poor = money(ledger.addr, "debit", "poor", &body("txn_2", 1_000_000)).await;
    assert_eq!(poor.error(), "insufficient_funds");
    let reused = money(ledger.addr, "refund", "done", &body("txn_1", 6)).await;
    assert_eq!(reused.status, 409);
    assert_eq!(
        get(ledger.addr, "/v1/faults").await.json()["faults"][0]["remaining"],
        1
    );
    // A rule narrowed to refunds skips a debit.
    call(ledger.addr, "DELETE", "/v1/faults", &[], None).await;
    post(
        ledger.addr,
        "/v1/faults",
        &json!({"fault": "refuse", "match": {"kind": "refund", "account_id": "acc_1"}, "times": 0}),
    )
    .await;
    assert_eq!(
        money(ledger.addr, "debit", "d", &body("txn_3", 1))
            .await
            .status,
        201
    );
    for key in ["r1", "r2"] {
        let reply = money(ledger.addr, "refund", key, &body("txn_3", 1)).await;
        assert_eq!(reply.error(), "injected_refusal", "times 0 is forever");
    }
    let cleared = call(ledger.addr, "DELETE", "/v1/faults", &[], None).await;
    assert_eq!(cleared.json(), json!({"cleared": 1}));
    ledger.stop().await;
}

#[tokio::test]
async fn a_header_fault_hits_its_request_only() {
    let ledger = TestLedger::start().await;
    post(
        ledger.addr,
        "/v1/faults",
        &json!({"fault": "error-after-commit"}),
    )
    .await;
    let reply = faulty(&ledger, "refund", "k1", "refuse", &body("t", 1)).await;
    assert_eq!(reply.error(), "injected_refusal");
    // The armed rule was left for the next request.
    let next = money(ledger.addr, "refund", "k2", &body("t", 1)).await;
    assert_eq!(next.error(), "injected_error");
    let clean = money(ledger.addr, "refund", "k3", &body("t", 1)).await;
    assert_eq!(clean.status, 201);
    ledger.stop().await;
}

#[tokio::test]
async fn bad_faults_are_refused_with_the_reason() {
    let ledger = TestLedger::start().await;
    let reply = faulty(&ledger, "refund", "k1", "explode", &body("t", 1)).await;
    assert_eq!((reply.status, reply.error()), (400, "invalid_fault".into()));
    assert!(reply.json()["detail"].as_str().unwrap().contains("explode"));
    let reply = post(ledger.addr, "/v1/faults", &json!({"fault": "delay=soon"})).await;
    assert_eq!((reply.status, reply.error()), (400, "invalid_fault".into()));
    let reply = post(
        ledger.addr,
        "/v1/faults",
        &json!({"fault": "refuse", "match": {"kind": "transfer"}}),
    )
    .await;
    assert_eq!((reply.status, reply.error()), (400, "invalid_fault".into()));
    assert_eq!(
        get(ledger.addr, "/v1/faults").await.json()["faults"],
        json!([])
    );
    assert_eq!(ledger.stats().await["effects_total"], 0);
    ledger.stop().await;
}
