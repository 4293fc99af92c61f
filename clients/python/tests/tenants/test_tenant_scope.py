"""The client against a processor with ``processor.key_scope = "tenant"`` (run by
``tests/tests/tenants.rs``, with its brokers, topics, tool registry, connector worker and
ledger): ids under the tenant's prefix are decided, a proposal under another tenant's key is
refused TENANT_MISMATCH and takes nothing from it, and the tool layer forms prefixed keys and
run ids."""

import asyncio
import os
import uuid

import pytest

from airlock_client import AsyncClient, Client, Refused
from airlock_client.tools import AirlockTools

RUN = uuid.uuid4().hex[:8]


def money(tenant, account, minor_units):
    return {
        "tenant_id": tenant,
        "account_id": account,
        "amount": {"minor_units": minor_units, "currency": "EUR"},
    }


def call(tenant, principal, account, key, minor_units=700):
    return dict(
        tool="refund",
        operation_key=key,
        arguments=money(tenant, account, minor_units),
        tenant=tenant,
        principal=principal,
        run_id=f"{tenant}/run-{RUN}",
        logical_call_id="step-1",
    )


def test_a_tenant_cannot_take_another_tenants_key():
    with Client(
        os.environ["AIRLOCK_TEST_BROKERS"], topic_prefix=os.environ["AIRLOCK_TEST_PREFIX"]
    ) as client:
        key = f"acme/refund:py-{RUN}"
        # globex's agent goes first, under acme's key: refused, and the client takes the
        # refusal as its own answer (it is not remembered under the proposal id).
        with pytest.raises(Refused) as refused:
            client.propose(**call("globex", "agent-globex-1", "acct-7", key), timeout=90)
        assert refused.value.decision.reason == "TENANT_MISMATCH", refused.value.decision
        assert "acme/" in refused.value.decision.detail

        # acme proposes under its key as if nobody had tried; its derived id has its prefix.
        decision = client.propose(**call("acme", "agent-support-1", "acct-42", key), timeout=90)
        assert decision.verdict == "ACCEPTED", decision
        assert decision.in_reply_to.startswith("acme/propose/"), decision
        settled = client.wait_settled(key, final=True, timeout=90)
        assert settled.decision.verdict == "COMMITTED", settled.decision


def test_the_tool_layer_scopes_keys_and_runs_by_tenant():
    async def main():
        async with AsyncClient(
            os.environ["AIRLOCK_TEST_BROKERS"], topic_prefix=os.environ["AIRLOCK_TEST_PREFIX"]
        ) as client:
            tools = AirlockTools(
                client,
                os.environ["AIRLOCK_TEST_REGISTRY"],
                tenant="globex",
                principal="agent-globex-1",
                wait_seconds=90,
                key_scope="tenant",
            )
            assert tools.run_id.startswith("globex/run-")
            arguments = {**money("globex", "acct-7", 650), "airlock_idempotency_key": f"t-{RUN}"}
            result = await tools.call("refund", arguments, "call-1")
            assert result.structured["status"] == "committed", result
            assert result.structured["operation_key"] == f"globex/refund:t-{RUN}"

    asyncio.run(main())
