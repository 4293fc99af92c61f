"""The MCP gateway, launched over stdio by the official MCP SDK's client, against the live
Airlock of ``tests/tests/python_client.rs`` (which also passes ``AIRLOCK_TEST_REGISTRY``, the
tool registry its processor runs with, and ``AIRLOCK_TEST_LEDGER``, the reference ledger's URL,
whose fault API makes a response get lost)."""

import asyncio
import json
import os
import sys
import urllib.request
import uuid

from mcp import Client
from mcp.client.stdio import StdioServerParameters

from test_live import committed

RUN = uuid.uuid4().hex[:8]


def gateway():
    return StdioServerParameters(
        command=sys.executable,
        args=[
            "-m", "airlock_client.mcp_gateway",
            "--brokers", os.environ["AIRLOCK_TEST_BROKERS"],
            "--topic-prefix", os.environ["AIRLOCK_TEST_PREFIX"],
            "--registry", os.environ["AIRLOCK_TEST_REGISTRY"],
            "--tenant", "acme",
            "--principal", "agent-support-1",
            "--wait-seconds", "90",
        ],
    )


def refund(minor_units, idempotency_key=None):
    arguments = {
        "tenant_id": "acme",
        "account_id": "acct-42",
        "amount": {"minor_units": minor_units, "currency": "EUR"},
    }
    if idempotency_key is not None:
        arguments["airlock_idempotency_key"] = idempotency_key
    return arguments


def test_an_agent_calls_airlock_tools_over_mcp():
    async def main():
        async with Client(gateway(), read_timeout_seconds=120) as mcp:
            tools = {t.name: t for t in (await mcp.list_tools()).tools}
            assert "refund" in tools, tools.keys()
            schema = tools["refund"].input_schema
            assert "airlock_idempotency_key" in schema["properties"]
            assert "amount" in schema["properties"]

            # Committed, with the downstream answer marked untrusted.
            first = await mcp.call_tool("refund", refund(900, f"mcp-{RUN}-1"))
            assert not first.is_error, first
            assert first.structured_content["status"] == "committed", first
            assert "<untrusted>" in first.content[0].text
            key = first.structured_content["operation_key"]
            assert key == f"refund:mcp-{RUN}-1"
            committed(key)

            # The same call again: attached to the same effect, not run twice.
            again = await mcp.call_tool("refund", refund(900, f"mcp-{RUN}-1"))
            assert again.structured_content["status"] == "committed", again
            assert again.structured_content["receipt"] == first.structured_content["receipt"]

            # The same id with other arguments is refused, and so is what policy forbids.
            other = await mcp.call_tool("refund", refund(901, f"mcp-{RUN}-1"))
            assert other.is_error and other.structured_content["verdict"] == "CONFLICT", other
            too_big = await mcp.call_tool("refund", refund(5_000_000, f"mcp-{RUN}-2"))
            assert too_big.is_error and too_big.structured_content["status"] == "refused", too_big
            unknown = await mcp.call_tool("no_such_tool", {})
            assert unknown.is_error and unknown.structured_content["reason"] == "UNKNOWN_TOOL"

            # Without an idempotency key: one effect per request.
            plain = await mcp.call_tool("refund", refund(902))
            assert plain.structured_content["status"] == "committed", plain
            committed(plain.structured_content["operation_key"])

    asyncio.run(main())


def test_the_gateway_over_streamable_http():
    import socket
    import subprocess
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    params = gateway()
    process = subprocess.Popen(
        [params.command, *params.args, "--http", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert process.poll() is None, process.stderr.read().decode()
                assert time.monotonic() < deadline, "the gateway did not listen"
                time.sleep(0.2)

        async def main():
            async with Client(f"http://127.0.0.1:{port}/mcp", read_timeout_seconds=120) as mcp:
                assert "refund" in {t.name for t in (await mcp.list_tools()).tools}
                done = await mcp.call_tool("refund", refund(910, f"mcp-{RUN}-http"))
                assert done.structured_content["status"] == "committed", done
                committed(done.structured_content["operation_key"])

        asyncio.run(main())
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_a_lost_response_gives_outcome_unknown_then_the_original_result_once():
    key = f"mcp-{RUN}-lost"
    # The ledger commits this refund and drops the connection before answering.
    armed = urllib.request.Request(
        os.environ["AIRLOCK_TEST_LEDGER"] + "/v1/faults",
        data=json.dumps(
            {"fault": "drop-response", "match": {"reference": f"refund:{key}"}, "times": 1}
        ).encode(),
        headers={"content-type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(armed, timeout=10) as response:
        assert response.status == 201

    async def main():
        async with Client(gateway(), read_timeout_seconds=120) as mcp:
            lost = await mcp.call_tool("refund", refund(940, key))
            assert not lost.is_error, lost
            assert lost.structured_content["status"] == "unknown", lost
            text = lost.content[0].text
            assert text.startswith(f"outcome unknown: refund:{key} may or may not have taken effect."), text
            assert "Do NOT retry" in text
            # Reconciliation finds the committed refund: the same call then reports it.
            again = lost
            for _ in range(60):
                if again.structured_content["status"] == "committed":
                    break
                await asyncio.sleep(1)
                again = await mcp.call_tool("refund", refund(940, key))
                assert again.structured_content["status"] in ("unknown", "committed"), again
            assert again.structured_content["status"] == "committed", again
            committed(f"refund:{key}")

    asyncio.run(main())
