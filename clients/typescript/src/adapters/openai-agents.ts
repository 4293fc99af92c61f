/**
 * Airlock's tools for the OpenAI Agents SDK for JavaScript (`@openai/agents`, an optional peer
 * dependency of this package: install it beside it). Each call goes through Airlock (a
 * proposal, policy, at most one execution) and the agent reads the same results as through
 * the MCP gateway (`../tools.js`):
 *
 *     import { openaiAgentsTools } from "@airlock/client/openai-agents";
 *     const agent = new Agent({ name: "support", tools: openaiAgentsTools(airlockTools) });
 *
 * A call without `airlock_idempotency_key` is keyed by the model's tool-call id (the SDK hands
 * it over), else by a fresh id.
 */

import { randomBytes } from "node:crypto";

import { ModelBehaviorError, tool, type FunctionTool, type RunContext } from "@openai/agents";

import { type AirlockTools, describeTool, inputSchema } from "../tools.js";

/** One function tool per registry tool; each answers with the result text. */
export function openaiAgentsTools(tools: AirlockTools): FunctionTool[] {
  return [...tools.tools.values()].map(
    (registryTool) =>
      tool({
        name: registryTool.name,
        description: describeTool(registryTool),
        // The registry's schemas are JSON Schema as Airlock validates them, not the strict
        // subset: Airlock refuses what does not match, with its reason.
        parameters: inputSchema(registryTool) as never,
        strict: false,
        execute: async (input: unknown, _context?: RunContext, details?: { toolCall?: { callId?: string } }) => {
          const callId = details?.toolCall?.callId || `oa-${randomBytes(16).toString("hex")}`;
          return (await tools.call(registryTool.name, input, callId)).text;
        },
        // The SDK parses the model's arguments before `execute`: arguments that are not JSON
        // are refused in the same words as through the Python adapter; any other error is
        // not Airlock's answer and is thrown on.
        errorFunction: (_context: RunContext, error: unknown) => {
          if (error instanceof ModelBehaviorError) {
            const cause = (error as { originalError?: unknown }).originalError;
            const why = cause instanceof Error ? cause.message : error.message;
            return `refused: the arguments are not JSON: ${why}`;
          }
          throw error;
        },
      }) as unknown as FunctionTool,
  );
}
