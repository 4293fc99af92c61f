"""An MCP server in front of Airlock, on the official MCP SDK: every tool of Airlock's tool
registry, callable by any MCP client, each call answered as :mod:`airlock_client.tools`
describes (the operation key, the result statuses).

Run it over stdio (an agent runtime launches it) or streamable HTTP::

    airlock-mcp --brokers localhost:9092 --registry deploy/config/tools.toml \\
        --tenant acme --principal agent-support-1            # stdio
    airlock-mcp ... --http 127.0.0.1:8765                    # http://127.0.0.1:8765/mcp

The gateway acts for one tenant and one principal, fixed by whoever starts it. Each gateway
process is one agent run; run one per agent (stdio does). A call without
``airlock_idempotency_key`` is keyed by the MCP session and the request id.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import sys
import weakref
from pathlib import Path
from typing import Any, List, Optional

import mcp_types as types
from mcp.server import Server
from mcp.server.stdio import stdio_server

from .aio import AsyncClient
from .client import AirlockError
from .tools import IDEMPOTENCY_ARGUMENT, AirlockTools, ToolResult, input_schema


def _result(result: ToolResult) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=result.text)],
        structured_content=result.structured,
        is_error=result.is_error,
    )


def build_server(tools: AirlockTools) -> Server:
    """The MCP server: ``tools/list`` and ``tools/call`` over ``tools``."""

    async def list_tools(_ctx: Any, _params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(
            tools=[
                types.Tool(name=t.name, description=t.description, input_schema=input_schema(t))
                for t in tools.tools.values()
            ]
        )

    # Request ids restart with each session: a call without an idempotency key is keyed by its
    # session (the streamable HTTP session id, else a random id per connection) and request id.
    sessions: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()

    def session_of(ctx: Any) -> str:
        headers = getattr(getattr(ctx, "request", None), "headers", None)
        if headers is not None and headers.get("mcp-session-id"):
            return str(headers["mcp-session-id"])
        try:
            return sessions.setdefault(ctx.session, secrets.token_hex(8))
        except TypeError:  # a session object that takes no weak reference
            return f"s{id(ctx.session)}"

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        call_id = f"{tools.run_id}/{session_of(ctx)}/{ctx.request_id}"
        return _result(await tools.call(params.name, params.arguments, call_id))

    return Server(
        "airlock",
        version="0.1.0",
        instructions=(
            "Tools with side effects, executed at most once through Airlock. Give every call an "
            f"{IDEMPOTENCY_ARGUMENT}; retry with the same one, never a new one, after an "
            "'outcome unknown' or 'in progress' answer."
        ),
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="airlock-mcp", description="An MCP server that calls tools through Airlock."
    )
    parser.add_argument("--brokers", required=True, help="Kafka bootstrap servers")
    parser.add_argument("--topic-prefix", default="airlock.", help="Airlock's topics.prefix")
    parser.add_argument(
        "--schema-registry-url",
        default=None,
        help="a Confluent-compatible schema registry: proposals published in the Confluent "
        "framing with its ids, answers read in either framing (the processor's "
        "schema_registry.url; needed when it runs with schema_registry.framing = \"confluent\")",
    )
    parser.add_argument("--registry", required=True, type=Path, help="Airlock's tools.toml")
    parser.add_argument("--tenant", required=True, help="the tenant every call is made for")
    parser.add_argument("--principal", required=True, help="the principal the agent acts for")
    parser.add_argument(
        "--wait-seconds",
        type=float,
        default=60.0,
        help="how long a call waits for Airlock's answer, then again for the outcome",
    )
    parser.add_argument(
        "--key-scope",
        choices=["global", "tenant"],
        default="global",
        help="the processor's processor.key_scope: with tenant, operation keys and the run id "
        "begin with the tenant and '/'",
    )
    parser.add_argument(
        "--http", metavar="HOST:PORT", help="serve streamable HTTP at http://HOST:PORT/mcp"
    )
    args = parser.parse_args(argv)

    async def serve() -> None:
        async with AsyncClient(
            args.brokers,
            topic_prefix=args.topic_prefix,
            schema_registry_url=args.schema_registry_url,
        ) as client:
            tools = AirlockTools(
                client,
                args.registry,
                tenant=args.tenant,
                principal=args.principal,
                run_id=None,
                wait_seconds=args.wait_seconds,
                key_scope=args.key_scope,
            )
            server = build_server(tools)
            if args.http:
                import uvicorn

                host, _, port = args.http.rpartition(":")
                app = server.streamable_http_app(host=host)
                config = uvicorn.Config(app, host=host, port=int(port), log_level="warning")
                await uvicorn.Server(config).serve()
            else:
                async with stdio_server() as (read, write):
                    await server.run(read, write, server.create_initialization_options())

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass
    except (AirlockError, OSError, ValueError) as e:
        print(f"airlock-mcp: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
