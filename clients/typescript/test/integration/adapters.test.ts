/**
 * The framework adapters against a running Airlock, as
 * clients/python/tests/integration/test_adapters.py runs the Python ones: the wrapped tools
 * are invoked as each framework invokes them (LangGraph's ToolNode with a model's tool call,
 * a LangChain ToolCall, the OpenAI Agents SDK's `invoke` with its tool-call details), no model
 * in the loop. Needs AIRLOCK_TEST_BROKERS and AIRLOCK_TEST_REGISTRY (skipped without them).
 */

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { after, before, describe, test } from "node:test";

import { AIMessage, ToolMessage } from "@langchain/core/messages";
import { ToolNode } from "@langchain/langgraph/prebuilt";
import { RunContext } from "@openai/agents";

import { langchainTools } from "../../src/adapters/langchain.js";
import { openaiAgentsTools } from "../../src/adapters/openai-agents.js";
import { Client } from "../../src/index.js";
import { AirlockTools } from "../../src/tools.js";
import { committed, refund } from "./calls.js";

const BROKERS = process.env["AIRLOCK_TEST_BROKERS"];
const PREFIX = process.env["AIRLOCK_TEST_PREFIX"] ?? "airlock.";
const REGISTRY = process.env["AIRLOCK_TEST_REGISTRY"];
const RUN = randomBytes(4).toString("hex");

const live = { skip: !(BROKERS && REGISTRY) && "AIRLOCK_TEST_BROKERS or AIRLOCK_TEST_REGISTRY is not set" };

describe("the framework adapters against a live Airlock", () => {
  let client: Client;
  let tools: AirlockTools;

  before(async () => {
    if (BROKERS && REGISTRY) {
      client = await Client.connect(BROKERS, { topicPrefix: PREFIX });
      tools = new AirlockTools(client, REGISTRY, { tenant: "acme", principal: "agent-support-1", waitSeconds: 90 });
    }
  });

  after(async () => {
    await client?.close();
  });

  test("LangChain: a ToolCall commits, a conflicting one is refused, a large one awaits approval", live, async () => {
    const refundTool = langchainTools(tools).find((t) => t.name === "refund")!;
    assert.ok(refundTool, "a refund tool");
    const key = `lc-${RUN}`;
    const message = (await refundTool.invoke({
      type: "tool_call",
      id: "call-1",
      name: "refund",
      args: refund(600, key),
    })) as ToolMessage;
    assert.ok(message instanceof ToolMessage, String(message));
    assert.equal(message.tool_call_id, "call-1");
    assert.ok(String(message.content).startsWith(`committed: refund:${key} took effect.`), String(message.content));
    assert.equal(message.artifact["status"], "committed", JSON.stringify(message.artifact));
    assert.equal(message.artifact["is_error"], false);
    committed(message.artifact["operation_key"]);

    const conflict = (await refundTool.invoke({
      type: "tool_call",
      id: "call-2",
      name: "refund",
      args: refund(601, key),
    })) as ToolMessage;
    assert.equal(conflict.artifact["status"], "refused", JSON.stringify(conflict.artifact));
    assert.equal(conflict.artifact["verdict"], "CONFLICT");
    assert.equal(conflict.artifact["is_error"], true);

    const waiting = (await refundTool.invoke({
      type: "tool_call",
      id: "call-3",
      name: "refund",
      args: refund(30_000, `lc-${RUN}-approval`),
    })) as ToolMessage;
    assert.equal(waiting.artifact["status"], "awaiting_approval", JSON.stringify(waiting.artifact));
    assert.equal(waiting.artifact["is_error"], false);
    assert.ok(String(waiting.content).startsWith("awaiting approval: "), String(waiting.content));
  });

  test("LangGraph: ToolNode runs a model's tool call through Airlock, once however often", live, async () => {
    const node = new ToolNode(langchainTools(tools));
    // No idempotency argument: keyed by the model's tool-call id, so the same tool call run
    // twice (a replayed graph step) is one effect.
    const callId = `call_lg_${RUN}`;
    const step = {
      messages: [new AIMessage({ content: "", tool_calls: [{ id: callId, name: "refund", args: refund(610), type: "tool_call" }] })],
    };
    const receipts = new Set<unknown>();
    for (let i = 0; i < 2; i++) {
      const out = (await node.invoke(step)) as { messages: ToolMessage[] };
      assert.equal(out.messages.length, 1);
      const answer = out.messages[0]!;
      assert.equal(answer.tool_call_id, callId);
      assert.ok(String(answer.content).startsWith(`committed: refund:${callId} took effect.`), String(answer.content));
      assert.equal(answer.artifact["operation_key"], `refund:${callId}`);
      receipts.add(answer.artifact["receipt"]);
    }
    assert.equal(receipts.size, 1, "one effect, one receipt");
    committed(`refund:${callId}`);
  });

  test("OpenAI Agents SDK: the same tool call delivered twice is one effect; refusals say why", live, async () => {
    const refundTool = openaiAgentsTools(tools).find((t) => t.name === "refund")!;
    assert.ok(refundTool, "a refund tool");
    assert.equal(refundTool.strict, false);
    assert.ok("airlock_idempotency_key" in (refundTool.parameters as { properties: object }).properties);
    const invoke = (callId: string, text: string): Promise<unknown> =>
      refundTool.invoke(new RunContext(), text, {
        toolCall: { type: "function_call", callId, name: "refund", arguments: text },
      });

    // Keyed by the model's tool-call id when no key is given.
    const callId = `call_${RUN}`;
    const text = JSON.stringify(refund(650));
    const answers = [await invoke(callId, text), await invoke(callId, text)];
    for (const answer of answers) {
      assert.ok(String(answer).startsWith(`committed: refund:${callId} took effect.`), String(answer));
    }
    committed(`refund:${callId}`);

    const denied = String(await invoke(`call_${RUN}_big`, JSON.stringify(refund(700_000))));
    assert.match(denied, new RegExp(`^refused: this call of refund:call_${RUN}_big was not run \\(\\w+ POLICY_DENIED: `));
    assert.match(String(await invoke(`call_${RUN}_bad`, "{not json")), /^refused: the arguments are not JSON: /);
    assert.equal(String(await invoke(`call_${RUN}_list`, "[1]")), "refused: the arguments must be a JSON object");
  });
});
