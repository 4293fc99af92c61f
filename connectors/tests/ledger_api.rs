//! The ledger's API without faults: accounts, money moves, idempotency, lookups, stats and the
//! request checks, over real HTTP against a ledger on 127.0.0.1:0 with a real SQLite file.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{TestLedger, body, call, get, money, post, within};
use serde_json::json;

#[tokio::test]
async fn accounts_are_created_once_and_conflicts_are_refused() {
    let ledger = TestLedger::start().await;
    let spec =
        json!({"tenant_id":"acme","account_id":"acc_2","currency":"USD","balance_minor":500});
    let created = post(ledger.addr, "/v1/accounts", &spec).await;
    assert_eq!(created.status, 201, "{}", created.json());
    assert_eq!(created.json(), spec);
    let again = post(ledger.addr, "/v1/accounts", &spec).await;
    assert_eq!(again.status, 200);
    let other = json!({"tenant_id":"acme","account_id":"acc_2","currency":"USD","balance_minor":7});
    let conflict = post(ledger.addr, "/v1/accounts", &other).await;
    assert_eq!(conflict.status, 409);
    assert_eq!(conflict.error(), "account_exists");
    let read = get(ledger.addr, "/v1/accounts/acc_2").await;
    assert_eq!(read.json()["balance_minor"], 500);
    let missing = get(ledger.addr, "/v1/accounts/acc_404").await;
    assert_eq!(
        (missing.status, missing.error()),
        (404, "unknown_account".into())
    );
    let bad = post(
        ledger.addr,
        "/v1/accounts",
        &json!({"tenant_id":"acme","account_id":"acc_3","currency":"usd","balance_minor":1}),
    )
    .await;
    assert_eq!((bad.status, bad.error()), (400, "invalid_request".into()));
    ledger.stop().await;
}

#[tokio::test]
async fn a_debit_moves_money_out_and_a_refund_moves_it_back() {
    let ledger = TestLedger::start().await;
    let debit = money(ledger.addr, "debit", "debit:txn_1", &body("txn_1", 2_500)).await;
    assert_eq!(debit.status, 201, "{}", debit.json());
    let effect = debit.json();
    assert_eq!(effect["kind"], "debit");
    assert_eq!(effect["idempotency_key"], "debit:txn_1");
    assert_eq!(effect["tenant_id"], "acme");
    assert_eq!(effect["account_id"], "acc_1");
    assert_eq!(
        effect["amount"],
        json!({"minor_units":2500,"currency":"EUR"})
    );
    assert_eq!(effect["reference"], "txn_1");
    assert_eq!(effect["balance_after"], 7_500);
    assert!(effect["effect_id"].as_str().unwrap().starts_with("eff_"));
    assert!(effect["committed_at"].as_str().unwrap().ends_with('Z'));
    assert_eq!(debit.header("content-type"), Some("application/json"));
    assert_eq!(debit.header("idempotent-replayed"), None);

    let refund = money(ledger.addr, "refund", "refund:txn_1", &body("txn_1", 1_000)).await;
    assert_eq!(refund.status, 201);
    assert_eq!(refund.json()["balance_after"], 8_500);
    assert_eq!(ledger.balance().await, 8_500);
    ledger.stop().await;
}

#[tokio::test]
async fn same_key_same_body_replays_the_first_result() {
    let ledger = TestLedger::start().await;
    let first = money(
        ledger.addr,
        "refund",
        "refund:txn_4821",
        &body("txn_4821", 1_250),
    )
    .await;
    assert_eq!(first.status, 201);
    // The same body with its keys in another order is the same body.
    let reordered = json!({
        "reason": "customer_request", "reference": "txn_4821",
        "amount": { "currency": "EUR", "minor_units": 1_250 },
        "account_id": "acc_1", "tenant_id": "acme",
    });
    for _ in 0..3 {
        let replay = money(ledger.addr, "refund", "refund:txn_4821", &reordered).await;
        assert_eq!(replay.status, 200);
        assert_eq!(replay.header("idempotent-replayed"), Some("true"));
        assert_eq!(replay.body, first.body, "the identical first response");
    }
    let lookup = get(ledger.addr, "/v1/effects/refund:txn_4821").await;
    assert_eq!(lookup.status, 200);
    assert_eq!(lookup.json(), first.json());
    assert_eq!(ledger.balance().await, 11_250, "refunded once");
    let stats = ledger.stats().await;
    assert_eq!(stats["effects_total"], 1);
    assert_eq!(stats["by_idempotency_key"]["refund:txn_4821"], 1);
    ledger.stop().await;
}

#[tokio::test]
async fn same_key_other_body_is_refused() {
    let ledger = TestLedger::start().await;
    let first = money(ledger.addr, "refund", "k1", &body("txn_1", 100)).await;
    assert_eq!(first.status, 201);
    let mut extra = body("txn_1", 100);
    extra["note"] = json!("an extra field is part of the body");
    for (kind, other) in [
        ("refund", body("txn_1", 101)),
        ("refund", body("txn_2", 100)),
        ("refund", extra),
        ("debit", body("txn_1", 100)),
    ] {
        let reused = money(ledger.addr, kind, "k1", &other).await;
        assert_eq!(reused.status, 409, "{kind} {other}");
        assert_eq!(reused.error(), "idempotency_key_reused");
        assert!(reused.json()["detail"].is_string());
    }
    assert_eq!(ledger.stats().await["effects_total"], 1);
    assert_eq!(ledger.balance().await, 10_100);
    ledger.stop().await;
}

#[tokio::test]
async fn extra_fields_are_kept_and_replay_with_the_same_body() {
    let ledger = TestLedger::start().await;
    let mut with_extra = body("txn_7", 300);
    with_extra["operation_key"] = json!("refund:txn_7");
    with_extra["metadata"] = json!({"agent_run": "run_1", "step": 3});
    let first = money(ledger.addr, "refund", "k7", &with_extra).await;
    assert_eq!(first.status, 201);
    let replay = money(ledger.addr, "refund", "k7", &with_extra).await;
    assert_eq!((replay.status, replay.body), (200, first.body));
    ledger.stop().await;
}

#[tokio::test]
async fn money_requests_need_an_idempotency_key() {
    let ledger = TestLedger::start().await;
    let without = call(ledger.addr, "POST", "/v1/debits", &[], Some(&body("t", 1))).await;
    assert_eq!(
        (without.status, without.error()),
        (400, "missing_idempotency_key".into())
    );
    let empty = call(
        ledger.addr,
        "POST",
        "/v1/debits",
        &[("Idempotency-Key", "")],
        Some(&body("t", 1)),
    )
    .await;
    assert_eq!(
        (empty.status, empty.error()),
        (400, "invalid_idempotency_key".into())
    );
    assert_eq!(ledger.stats().await["effects_total"], 0);
    ledger.stop().await;
}

#[tokio::test]
async fn refused_requests_commit_nothing() {
    let ledger = TestLedger::start().await;
    let poor = money(ledger.addr, "debit", "d1", &body("txn_1", 10_001)).await;
    assert_eq!(
        (poor.status, poor.error()),
        (422, "insufficient_funds".into())
    );

    let mut unknown = body("txn_1", 1);
    unknown["account_id"] = json!("acc_404");
    let reply = money(ledger.addr, "refund", "r1", &unknown).await;
    assert_eq!(
        (reply.status, reply.error()),
        (404, "unknown_account".into())
    );

    let mut tenant = body("txn_1", 1);
    tenant["tenant_id"] = json!("globex");
    let reply = money(ledger.addr, "refund", "r2", &tenant).await;
    assert_eq!(
        (reply.status, reply.error()),
        (403, "tenant_mismatch".into())
    );

    let mut currency = body("txn_1", 1);
    currency["amount"]["currency"] = json!("USD");
    let reply = money(ledger.addr, "refund", "r3", &currency).await;
    assert_eq!(
        (reply.status, reply.error()),
        (422, "currency_mismatch".into())
    );

    let reply = money(ledger.addr, "refund", "r4", &body("txn_1", -5)).await;
    assert_eq!(
        (reply.status, reply.error()),
        (400, "invalid_request".into())
    );
    let reply = money(ledger.addr, "refund", "r5", &json!("not an object")).await;
    assert_eq!(
        (reply.status, reply.error()),
        (400, "invalid_request".into())
    );

    for key in ["d1", "r1", "r2", "r3", "r4", "r5"] {
        let lookup = get(ledger.addr, &format!("/v1/effects/{key}")).await;
        assert_eq!(
            (lookup.status, lookup.error()),
            (404, "not_found".into()),
            "{key}"
        );
    }
    assert_eq!(ledger.balance().await, 10_000);
    // A refused key is not spent: the corrected request commits under it.
    let retry = money(ledger.addr, "debit", "d1", &body("txn_1", 10_000)).await;
    assert_eq!(retry.status, 201);
    assert_eq!(retry.json()["balance_after"], 0);
    ledger.stop().await;
}

#[tokio::test]
async fn oversized_bodies_are_refused() {
    let ledger = TestLedger::start().await;
    let mut big = body("txn_1", 1);
    big["padding"] = json!("x".repeat(70 * 1024));
    let reply = money(ledger.addr, "refund", "big", &big).await;
    assert_eq!(
        (reply.status, reply.error()),
        (413, "body_too_large".into())
    );
    assert_eq!(ledger.stats().await["effects_total"], 0);
    ledger.stop().await;
}

#[tokio::test]
async fn stats_expose_a_double_refund_under_two_keys() {
    let ledger = TestLedger::start().await;
    for key in ["refund:a", "refund:b"] {
        let reply = money(ledger.addr, "refund", key, &body("txn_4821", 500)).await;
        assert_eq!(reply.status, 201);
    }
    let reply = money(ledger.addr, "debit", "debit:x", &body("txn_9", 100)).await;
    assert_eq!(reply.status, 201);
    let stats = ledger.stats().await;
    assert_eq!(stats["effects_total"], 3);
    assert_eq!(stats["by_reference"]["txn_4821"], 2);
    assert_eq!(stats["by_reference"]["txn_9"], 1);
    assert_eq!(stats["by_kind"], json!({"debit": 1, "refund": 2}));
    assert_eq!(
        stats["by_reference_and_kind"]["txn_4821"],
        json!({"refund": 2})
    );
    assert_eq!(stats["by_idempotency_key"]["refund:a"], 1);
    let one = get(ledger.addr, "/v1/stats?reference=txn_4821").await;
    assert_eq!(
        one.json(),
        json!({"reference":"txn_4821","effects":2,"debits":0,"refunds":2})
    );
    let none = get(ledger.addr, "/v1/stats?reference=txn%200").await;
    assert_eq!(none.json()["reference"], "txn 0");
    assert_eq!(none.json()["effects"], 0);
    ledger.stop().await;
}

#[tokio::test]
async fn concurrent_same_key_requests_commit_once() {
    let ledger = TestLedger::start().await;
    let addr = ledger.addr;
    let requests: Vec<_> = (0..24)
        .map(|_| {
            tokio::spawn(async move {
                money(addr, "refund", "refund:race", &body("txn_race", 700)).await
            })
        })
        .collect();
    let mut replies = Vec::new();
    for request in requests {
        replies.push(within("a concurrent request", request).await.unwrap());
    }
    let created: Vec<_> = replies.iter().filter(|r| r.status == 201).collect();
    assert_eq!(created.len(), 1, "exactly one request commits");
    for reply in &replies {
        assert!(
            reply.status == 201 || reply.status == 200,
            "{}",
            reply.status
        );
        assert_eq!(reply.body, created[0].body, "everyone sees the one effect");
    }
    assert_eq!(ledger.stats().await["by_reference"]["txn_race"], 1);
    assert_eq!(ledger.balance().await, 10_700);
    ledger.stop().await;
}

#[tokio::test]
async fn concurrent_debits_never_overdraw() {
    let ledger = TestLedger::start().await;
    let addr = ledger.addr;
    let requests: Vec<_> = (0..12)
        .map(|i| {
            tokio::spawn(async move {
                money(
                    addr,
                    "debit",
                    &format!("debit:{i}"),
                    &body(&format!("t{i}"), 3_000),
                )
                .await
            })
        })
        .collect();
    let mut committed = 0;
    for request in requests {
        let reply = within("a concurrent debit", request).await.unwrap();
        match reply.status {
            201 => committed += 1,
            422 => assert_eq!(reply.error(), "insufficient_funds"),
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!(committed, 3);
    assert_eq!(ledger.balance().await, 1_000);
    ledger.stop().await;
}

#[tokio::test]
async fn every_error_is_json_and_health_is_ok() {
    let ledger = TestLedger::start().await;
    assert_eq!(get(ledger.addr, "/healthz").await.status, 200);
    let missing = get(ledger.addr, "/v2/nothing").await;
    assert_eq!((missing.status, missing.error()), (404, "no_route".into()));
    let wrong = call(ledger.addr, "DELETE", "/v1/debits", &[], None).await;
    assert_eq!(
        (wrong.status, wrong.error()),
        (405, "method_not_allowed".into())
    );
    let broken = call(
        ledger.addr,
        "POST",
        "/v1/refunds",
        &[("Idempotency-Key", "k")],
        None,
    )
    .await;
    assert_eq!(
        (broken.status, broken.error()),
        (400, "invalid_request".into())
    );
    ledger.stop().await;
}
