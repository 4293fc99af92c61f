/**
 * The MCP gateway against a running Airlock (broker, processor, connector worker, reference
 * ledger), called by the official MCP SDK's own client over stdio (the `airlock-mcp` command
 * launched as an agent runtime launches it), over an in-memory transport pair and over
 * streamable HTTP, as clients/python/tests/integration/test_mcp.py runs the Python gateway.
 * Started by tests/tests/typescript_client.rs, which passes, beside live.test.ts's variables,
 * AIRLOCK_TEST_REGISTRY: the tool registry its processor runs with. Skipped (and counted as
 * skipped) without them.
 */

import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { request } from "node:http";
import { fileURLToPath } from "node:url";
import { after, before, describe, test } from "node:test";

import { Client as McpClient } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { InMemoryTransport } from "@modelcontextprotocol/sdk/inMemory.js";

import { Client } from "../../src/index.js";
import { buildServer, serveHttp } from "../../src/mcp.js";
import { AirlockTools } from "../../src/tools.js";
import { committed, refund } from "./calls.js";

const BROKERS = process.env["AIRLOCK_TEST_BROKERS"];
const PREFIX = process.env["AIRLOCK_TEST_PREFIX"] ?? "airlock.";
const REGISTRY = process.env["AIRLOCK_TEST_REGISTRY"];
const RUN = randomBytes(4).toString("hex");
const CLI = fileURLToPath(new URL("../../src/mcp-cli.js", import.meta.url));

const live = { skip: !(BROKERS && REGISTRY) && "AIRLOCK_TEST_BROKERS or AIRLOCK_TEST_REGISTRY is not set" };

function gatewayArgs(): string[] {
  return [
    CLI,
    "--brokers",
    BROKERS!,
    "--topic-prefix",
    PREFIX,
    "--registry",
    REGISTRY!,
    "--tenant",
    "acme",
    "--principal",
    "agent-support-1",
    "--wait-seconds",
    "90",
  ];
}

interface Called {
  text: string;
  structured: Record<string, unknown>;
  isError: boolean;
}

/** One `tools/call`, waited for longer than the gateway waits (twice 90 s at most). */
async function call(mcp: McpClient, name: string, args: Record<string, unknown>): Promise<Called> {
  const result = await mcp.callTool({ name, arguments: args }, undefined, { timeout: 200_000 });
  const content = result.content as Array<{ type: string; text?: string }>;
  assert.equal(content.length, 1, JSON.stringify(result));
  assert.equal(content[0]!.type, "text");
  return {
    text: content[0]!.text!,
    structured: result.structuredContent as Record<string, unknown>,
    isError: result.isError === true,
  };
}

function mcpClient(): McpClient {
  return new McpClient({ name: "airlock-test", version: "0.0.0" });
}

describe("the MCP gateway against a live Airlock", () => {
  test("over stdio: lists the tools; commits once, attaches, refuses, waits for approval", live, async () => {
    const mcp = mcpClient();
    await mcp.connect(new StdioClientTransport({ command: process.execPath, args: gatewayArgs(), stderr: "inherit" }));
    try {
      const tools = new Map((await mcp.listTools()).tools.map((t) => [t.name, t]));
      assert.ok(tools.has("refund"), [...tools.keys()].join(","));
      const properties = tools.get("refund")!.inputSchema.properties ?? {};
      assert.ok("airlock_idempotency_key" in properties && "amount" in properties, JSON.stringify(properties));
      assert.match(tools.get("refund")!.description ?? "", /executed at most once/);
      assert.match(mcp.getInstructions() ?? "", /airlock_idempotency_key/);

      // Committed, with the downstream answer marked untrusted.
      const key = `mcp-${RUN}-1`;
      const first = await call(mcp, "refund", refund(900, key));
      assert.ok(!first.isError && first.structured["status"] === "committed", JSON.stringify(first));
      assert.match(first.text, /^committed: refund:mcp-\w+-1 took effect\.\n.*\n<untrusted>.*<\/untrusted>$/s);
      assert.equal(first.structured["operation_key"], `refund:${key}`);
      assert.equal(typeof first.structured["untrusted_result"], "string");
      committed(`refund:${key}`);

      // The same call again: attached to the same effect, not run twice.
      const again = await call(mcp, "refund", refund(900, key));
      assert.equal(again.structured["status"], "committed", JSON.stringify(again));
      assert.equal(again.structured["receipt"], first.structured["receipt"]);

      // The same id with other arguments is refused, and so is what policy forbids.
      const other = await call(mcp, "refund", refund(901, key));
      assert.ok(other.isError && other.structured["verdict"] === "CONFLICT", JSON.stringify(other));
      assert.equal(other.structured["status"], "refused");
      assert.ok(other.text.startsWith(`refused: this call of refund:${key} was not run (CONFLICT `), other.text);
      const tooBig = await call(mcp, "refund", refund(600_000, `mcp-${RUN}-2`));
      assert.ok(tooBig.isError && tooBig.structured["status"] === "refused", JSON.stringify(tooBig));
      assert.equal(tooBig.structured["reason"], "POLICY_DENIED");
      assert.match(tooBig.text, /^refused: this call of refund:mcp-\w+-2 was not run \(\w+ POLICY_DENIED: .+\)$/);
      const unknown = await call(mcp, "no_such_tool", {});
      assert.ok(unknown.isError && unknown.structured["reason"] === "UNKNOWN_TOOL", JSON.stringify(unknown));
      const malformed = await call(mcp, "refund", refund(900, ""));
      assert.ok(malformed.isError && malformed.structured["reason"] === "MALFORMED", JSON.stringify(malformed));

      // Over the auto-approval limit: waits for a person; the same call again attaches to it.
      const large = `mcp-${RUN}-approval`;
      for (let i = 0; i < 2; i++) {
        const waiting = await call(mcp, "refund", refund(20_000, large));
        assert.ok(!waiting.isError && waiting.structured["status"] === "awaiting_approval", JSON.stringify(waiting));
        assert.equal(waiting.structured["operation_key"], `refund:${large}`);
        assert.ok(
          waiting.text.startsWith(`awaiting approval: refund:${large} is not settled yet.`) &&
            waiting.text.includes(`airlock_idempotency_key="${large}"`),
          waiting.text,
        );
      }

      // Without an idempotency key: one effect per request, keyed by the session and request.
      const keys = new Set<string>();
      for (let i = 0; i < 2; i++) {
        const plain = await call(mcp, "refund", refund(902));
        assert.equal(plain.structured["status"], "committed", JSON.stringify(plain));
        const k = plain.structured["operation_key"] as string;
        assert.match(k, /^refund:run-[0-9a-f]+\/[0-9a-f]+\/\d+$/);
        keys.add(k);
        committed(k);
      }
      assert.equal(keys.size, 2, "each request is its own effect");
    } finally {
      await mcp.close();
    }
  });

  describe("in memory", () => {
    let client: Client;

    before(async () => {
      if (BROKERS && REGISTRY) {
        client = await Client.connect(BROKERS, { topicPrefix: PREFIX });
      }
    });

    after(async () => {
      await client?.close();
    });

    test("a call retried with the same idempotency argument, in other sessions, is one effect", live, async () => {
      const tools = new AirlockTools(client, REGISTRY!, { tenant: "acme", principal: "agent-support-1", waitSeconds: 90 });
      const connect = async (): Promise<McpClient> => {
        const [near, far] = InMemoryTransport.createLinkedPair();
        await buildServer(tools).connect(far);
        const mcp = mcpClient();
        await mcp.connect(near);
        return mcp;
      };
      const sessions = await Promise.all([connect(), connect(), connect()]);
      try {
        const key = `mcp-${RUN}-retried`;
        // Sent at once from two sessions, then again from a third once settled.
        const both = await Promise.all(sessions.slice(0, 2).map((mcp) => call(mcp, "refund", refund(920, key))));
        const late = await call(sessions[2]!, "refund", refund(920, key));
        for (const answer of [...both, late]) {
          assert.equal(answer.structured["status"], "committed", JSON.stringify(answer));
          assert.equal(answer.structured["operation_key"], `refund:${key}`);
          assert.equal(answer.structured["receipt"], both[0]!.structured["receipt"]);
        }
        committed(`refund:${key}`);
      } finally {
        await Promise.all(sessions.map((mcp) => mcp.close()));
      }
    });
  });

  describe("in process, with the reference ledger's faults", () => {
    let client: Client;

    before(async () => {
      if (BROKERS && REGISTRY) {
        client = await Client.connect(BROKERS, { topicPrefix: PREFIX });
      }
    });

    after(async () => {
      await client?.close();
    });

    const ledger = process.env["AIRLOCK_TEST_LEDGER"];
    const withLedger = { skip: live.skip || (!ledger && "AIRLOCK_TEST_LEDGER is not set") };

    /** Arms `fault` at the ledger for the next request of business reference `reference`. */
    async function arm(fault: string, reference: string): Promise<void> {
      const armed = await fetch(`${ledger}/v1/faults`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ fault, match: { reference }, times: 1 }),
        signal: AbortSignal.timeout(10_000),
      });
      assert.equal(armed.status, 201, await armed.text());
    }

    test("over streamable HTTP, an idle session is closed; one with a call open is not", withLedger, async () => {
      const idleMs = 500;
      const tools = new AirlockTools(client, REGISTRY!, { tenant: "acme", principal: "agent-support-1", waitSeconds: 90 });
      const gateway = await serveHttp(tools, { idleSessionMs: idleMs });
      try {
        // The ledger answers this refund after 2.5 s: its call outlasts the idle time.
        const key = `mcp-${RUN}-idle`;
        await arm("delay=2500", `refund:${key}`);
        const mcp = mcpClient();
        await mcp.connect(new StreamableHTTPClientTransport(new URL(gateway.url)));
        // A call that outlasts the idle time many times over still gets its answer.
        const started = Date.now();
        const done = await call(mcp, "refund", refund(930, key));
        assert.equal(done.structured["status"], "committed", JSON.stringify(done));
        committed(`refund:${key}`);
        assert.ok(Date.now() - started > 2 * idleMs, "the call took longer than twice the idle time");
        await new Promise((resolve) => setTimeout(resolve, 4 * idleMs));
        await assert.rejects(mcp.listTools(), /session not found|404/i);
        await mcp.close();
      } finally {
        await gateway.close();
      }
    });

    test("a lost response gives outcome unknown, then the original result, and one effect", withLedger, async () => {
      const tools = new AirlockTools(client, REGISTRY!, { tenant: "acme", principal: "agent-support-1", waitSeconds: 90 });
      const [near, far] = InMemoryTransport.createLinkedPair();
      await buildServer(tools).connect(far);
      const mcp = mcpClient();
      await mcp.connect(near);
      try {
        // The ledger commits this refund and drops the connection before answering.
        const key = `mcp-${RUN}-lost`;
        await arm("drop-response", `refund:${key}`);
        const lost = await call(mcp, "refund", refund(940, key));
        assert.ok(!lost.isError && lost.structured["status"] === "unknown", JSON.stringify(lost));
        assert.ok(lost.text.startsWith(`outcome unknown: refund:${key} may or may not have taken effect.`), lost.text);
        assert.match(lost.text, /Do NOT retry/);
        // Reconciliation finds the committed refund: the same call then reports it, once.
        let again = lost;
        for (let i = 0; i < 60 && again.structured["status"] !== "committed"; i++) {
          await new Promise((resolve) => setTimeout(resolve, 1000));
          again = await call(mcp, "refund", refund(940, key));
          assert.ok(["unknown", "committed"].includes(String(again.structured["status"])), JSON.stringify(again));
        }
        assert.equal(again.structured["status"], "committed", JSON.stringify(again));
        committed(`refund:${key}`);
      } finally {
        await mcp.close();
      }
    });
  });

  describe("over streamable HTTP", () => {
    let gateway: ChildProcess;
    let url: URL;

    before(async () => {
      if (!(BROKERS && REGISTRY)) {
        return;
      }
      gateway = spawn(process.execPath, [...gatewayArgs(), "--http", "127.0.0.1:0"], {
        stdio: ["ignore", "ignore", "pipe"],
      });
      url = await new Promise<URL>((resolve, reject) => {
        let seen = "";
        const timeout = setTimeout(() => reject(new Error(`the gateway did not listen within 60 s:\n${seen}`)), 60_000);
        gateway.stderr!.setEncoding("utf8").on("data", (chunk: string) => {
          seen += chunk;
          process.stderr.write(chunk);
          const at = /serving (http:\/\/\S+)/.exec(seen);
          if (at) {
            clearTimeout(timeout);
            resolve(new URL(at[1]!));
          }
        });
        gateway.once("exit", (code) => {
          clearTimeout(timeout);
          reject(new Error(`the gateway exited (${code}):\n${seen}`));
        });
      });
    });

    after(async () => {
      if (gateway && gateway.exitCode === null) {
        const exited = new Promise((resolve) => gateway.once("exit", resolve));
        gateway.kill("SIGTERM");
        await exited;
        assert.equal(gateway.exitCode, 0, "the gateway stops cleanly on SIGTERM");
      }
    });

    test("lists the tools, commits a refund, attaches a retry from another session", live, async () => {
      const key = `mcp-${RUN}-http`;
      let receipt: unknown;
      for (let session = 0; session < 2; session++) {
        const mcp = mcpClient();
        await mcp.connect(new StreamableHTTPClientTransport(url));
        try {
          assert.ok((await mcp.listTools()).tools.some((t) => t.name === "refund"));
          const done = await call(mcp, "refund", refund(910, key));
          assert.equal(done.structured["status"], "committed", JSON.stringify(done));
          receipt ??= done.structured["receipt"];
          assert.equal(done.structured["receipt"], receipt);
          if (session === 0) {
            const plain = await call(mcp, "refund", refund(911));
            assert.equal(plain.structured["status"], "committed", JSON.stringify(plain));
            committed(plain.structured["operation_key"] as string);
          }
        } finally {
          await mcp.close();
        }
      }
      committed(`refund:${key}`);
    });

    test("refuses a request for another host (DNS rebinding) or outside a session", live, async () => {
      const post = (headers: Record<string, string>, body: string): Promise<number> =>
        new Promise((resolve, reject) => {
          const req = request(url, { method: "POST", headers }, (res) => {
            res.resume();
            resolve(res.statusCode ?? 0);
          });
          req.once("error", reject);
          req.end(body);
        });
      const initialize = JSON.stringify({
        jsonrpc: "2.0",
        id: 1,
        method: "initialize",
        params: { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "t", version: "0" } },
      });
      const json = { "content-type": "application/json", accept: "application/json, text/event-stream" };
      assert.equal(await post({ ...json, host: `attacker.example:${url.port}` }, initialize), 403);
      assert.equal(await post(json, JSON.stringify({ jsonrpc: "2.0", id: 2, method: "tools/list" })), 400);
      assert.equal(await post({ ...json, "mcp-session-id": "no-such-session" }, initialize), 404);
    });
  });
});
