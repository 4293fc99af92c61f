"""The framework adapters against the live Airlock of ``tests/tests/python_client.rs``: the
wrapped tools are invoked as each framework invokes them (no model in the loop)."""

import asyncio
import json
import os
import uuid

from agents.tool_context import ToolContext

from airlock_client import AsyncClient
from airlock_client.adapters import langchain_tools, openai_agents_tools
from airlock_client.tools import AirlockTools

from test_live import committed

RUN = uuid.uuid4().hex[:8]


def arguments(minor_units, **extra):
    return {
        "tenant_id": "acme",
        "account_id": "acct-42",
        "amount": {"minor_units": minor_units, "currency": "EUR"},
        **extra,
    }


def airlock_tools(client):
    return AirlockTools(
        client,
        os.environ["AIRLOCK_TEST_REGISTRY"],
        tenant="acme",
        principal="agent-support-1",
        wait_seconds=90,
    )


def test_langchain_and_openai_agents_tools_go_through_airlock():
    async def main():
        async with AsyncClient(
            os.environ["AIRLOCK_TEST_BROKERS"], topic_prefix=os.environ["AIRLOCK_TEST_PREFIX"]
        ) as client:
            tools = airlock_tools(client)

            # LangChain / LangGraph: a tool call as ToolNode sends it.
            refund = next(t for t in langchain_tools(tools) if t.name == "refund")
            key = f"lc-{RUN}"
            message = await refund.ainvoke(
                {"type": "tool_call", "id": "call-1", "name": "refund",
                 "args": arguments(600, airlock_idempotency_key=key)}
            )
            assert message.content.startswith("committed"), message
            assert message.artifact["status"] == "committed", message.artifact
            committed(message.artifact["operation_key"])
            refused = await refund.ainvoke(
                {"type": "tool_call", "id": "call-2", "name": "refund",
                 "args": arguments(601, airlock_idempotency_key=key)}
            )
            assert refused.artifact["status"] == "refused" and refused.artifact["is_error"]

            # The OpenAI Agents SDK: keyed by the model's tool-call id when no key is given,
            # so the same call delivered twice is one effect.
            refund = next(t for t in openai_agents_tools(tools) if t.name == "refund")
            call_id = f"call_{RUN}"
            text = json.dumps(arguments(650))
            answers = []
            for _ in range(2):
                ctx = ToolContext(
                    context=None, tool_name="refund", tool_call_id=call_id, tool_arguments=text
                )
                answers.append(await refund.on_invoke_tool(ctx, text))
            assert all(a.startswith("committed") for a in answers), answers
            committed(f"refund:{call_id}")

    asyncio.run(main())
