"""Airlock's tools for agent frameworks: each call goes through Airlock (a proposal, policy,
at most one execution) and the agent reads the same results as through the MCP gateway
(:mod:`airlock_client.tools`).

LangGraph and LangChain (``pip install 'airlock-client[langchain]'``)::

    tools = langchain_tools(AirlockTools(client, "tools.toml", tenant="acme",
                                         principal="agent-support-1"))
    graph = create_react_agent(model, tools)          # or ToolNode(tools)

The OpenAI Agents SDK (``pip install 'airlock-client[openai-agents]'``)::

    agent = Agent(name="support", tools=openai_agents_tools(airlock_tools))

A call without ``airlock_idempotency_key`` is keyed by the model's tool-call id (both
frameworks hand it over: a LangChain tool invoked with a ToolCall, as LangGraph's ToolNode
does), else by a fresh id: pass the argument to make a retry under a new tool call the same
effect.
"""

from __future__ import annotations

import json
import uuid
from contextvars import ContextVar
from typing import Any, List, Optional

from .tools import AirlockTools, ToolResult, input_schema


#: The model's id of the LangChain tool call being run (set by `_AirlockTool.ainvoke`).
_TOOL_CALL_ID: ContextVar[Optional[str]] = ContextVar("airlock_tool_call_id", default=None)


def langchain_tools(tools: AirlockTools) -> List[Any]:
    """One LangChain ``StructuredTool`` per registry tool (usable by LangGraph's ``ToolNode``
    and prebuilt agents). Each answers with the result text for the model and the structured
    result as the tool message's artifact. A call without ``airlock_idempotency_key`` is keyed
    by the model's tool-call id when it is invoked with a ToolCall (as ToolNode does)."""
    from langchain_core.tools import StructuredTool

    class _AirlockTool(StructuredTool):
        async def ainvoke(self, input: Any, config: Any = None, **kwargs: Any) -> Any:
            call_id = input.get("id") if isinstance(input, dict) and "args" in input else None
            token = _TOOL_CALL_ID.set(call_id)
            try:
                return await super().ainvoke(input, config, **kwargs)
            finally:
                _TOOL_CALL_ID.reset(token)

    def make(name: str) -> Any:
        async def call(**arguments: Any) -> Any:
            call_id = _TOOL_CALL_ID.get() or f"lc-{uuid.uuid4().hex}"
            return _content_and_artifact(await tools.call(name, arguments, call_id))

        tool = tools.tools[name]
        return _AirlockTool.from_function(
            coroutine=call,
            name=name,
            description=tool.description,
            args_schema=input_schema(tool),
            response_format="content_and_artifact",
        )

    return [make(name) for name in tools.tools]


def _content_and_artifact(result: ToolResult) -> Any:
    return result.text, {**result.structured, "is_error": result.is_error}


def openai_agents_tools(tools: AirlockTools) -> List[Any]:
    """One OpenAI Agents SDK ``FunctionTool`` per registry tool. A call without
    ``airlock_idempotency_key`` is keyed by the model's tool-call id."""
    from agents import FunctionTool

    def make(name: str) -> Any:
        async def invoke(ctx: Any, arguments_json: str) -> str:
            try:
                arguments = json.loads(arguments_json or "{}")
            except json.JSONDecodeError as e:
                return f"refused: the arguments are not JSON: {e}"
            if not isinstance(arguments, dict):
                return "refused: the arguments must be a JSON object"
            call_id = getattr(ctx, "tool_call_id", None) or f"oa-{uuid.uuid4().hex}"
            return (await tools.call(name, arguments, str(call_id))).text

        tool = tools.tools[name]
        return FunctionTool(
            name=name,
            description=tool.description,
            params_json_schema=input_schema(tool),
            on_invoke_tool=invoke,
            # The registry's schemas are JSON Schema as Airlock validates them, not the strict
            # subset: Airlock refuses what does not match, with its reason.
            strict_json_schema=False,
        )

    return [make(name) for name in tools.tools]
