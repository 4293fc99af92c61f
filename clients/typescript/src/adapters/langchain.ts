/**
 * Airlock's tools for LangChain and LangGraph JS (`@langchain/core`, an optional peer
 * dependency of this package: install it beside it). Each call goes through Airlock (a
 * proposal, policy, at most one execution) and the agent reads the same results as through
 * the MCP gateway (`../tools.js`):
 *
 *     import { langchainTools } from "@airlock/client/langchain";
 *     const tools = langchainTools(new AirlockTools(client, "tools.toml",
 *       { tenant: "acme", principal: "agent-support-1" }));
 *     const agent = createReactAgent({ llm, tools });      // or new ToolNode(tools)
 *
 * Each tool answers with the result text for the model and the structured result (with
 * `is_error`) as the tool message's artifact. A call without `airlock_idempotency_key` is keyed
 * by the model's tool-call id when the tool is invoked with a ToolCall (as LangGraph's
 * ToolNode does), else by a fresh id: pass the argument to make a retry under a new tool call
 * the same effect.
 *
 * LangChain checks the arguments against the tool's JSON Schema before the call: arguments
 * that do not match it are rejected by LangChain (`ToolInputParsingException`, which ToolNode
 * hands the model as an error message) and never reach Airlock.
 */

import { randomBytes } from "node:crypto";

import { tool, type DynamicStructuredTool } from "@langchain/core/tools";

import { type AirlockTools, type JsonObject, type ToolResult, describeTool, inputSchema } from "../tools.js";

/** A tool's answer as LangChain's `content_and_artifact`: the text, and the structured result
 * with `is_error`. */
export function contentAndArtifact(result: ToolResult): [string, JsonObject] {
  return [result.text, { ...result.structured, is_error: result.isError }];
}

/** One LangChain structured tool per registry tool (usable by LangGraph's ToolNode and
 * prebuilt agents). */
export function langchainTools(tools: AirlockTools): DynamicStructuredTool[] {
  return [...tools.tools.values()].map(
    (registryTool) =>
      tool(
        async (input: unknown, config?: { toolCall?: { id?: string } }) => {
          const callId = config?.toolCall?.id || `lc-${randomBytes(16).toString("hex")}`;
          return contentAndArtifact(await tools.call(registryTool.name, input, callId));
        },
        {
          name: registryTool.name,
          description: describeTool(registryTool),
          schema: inputSchema(registryTool),
          responseFormat: "content_and_artifact",
        },
      ) as unknown as DynamicStructuredTool,
  );
}
