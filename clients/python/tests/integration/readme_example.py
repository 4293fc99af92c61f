import os
from airlock_client import Client, Refused

with Client(os.environ.get("AIRLOCK_BROKERS", "localhost:9092"),
            topic_prefix=os.environ.get("AIRLOCK_PREFIX", "airlock.")) as airlock:
    try:
        decision = airlock.propose(
            tool="refund", operation_key="refund:txn_1",  # the identity of the side effect
            arguments={"tenant_id": "acme", "account_id": "acct-42",
                       "amount": {"minor_units": 1250, "currency": "EUR"}},
            tenant="acme", principal="agent-support-1", run_id="run-7", logical_call_id="step-3",
        )
    except Refused as refused:
        print(refused.decision.verdict, refused.decision.reason, refused.decision.detail)
    else:
        print(decision.verdict, decision.reason)  # ACCEPTED, PENDING_APPROVAL, DUPLICATE, ...
        settled = airlock.wait_settled("refund:txn_1", timeout=300)
        print(settled.decision.verdict, settled.final, settled.result)  # result: untrusted
