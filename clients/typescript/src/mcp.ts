/**
 * An MCP server in front of Airlock, on the official MCP SDK (`@modelcontextprotocol/sdk`):
 * every tool of Airlock's tool registry, callable by any MCP client, each call answered as
 * `./tools.js` describes (the operation key, the result statuses), the same answers as the
 * Python client's gateway.
 *
 * The `airlock-mcp` command (`./mcp-cli.js`) serves it over stdio (an agent runtime launches
 * it) or streamable HTTP. The gateway acts for one tenant and one principal, fixed by whoever
 * starts it; each gateway process is one agent run. A call without `airlock_idempotency_key`
 * is keyed by the MCP session and the request id.
 */

import { randomBytes, randomUUID } from "node:crypto";
import { createServer, type IncomingMessage, type Server as HttpServer, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";

import { Server } from "@modelcontextprotocol/sdk/server/index.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import {
  CallToolRequestSchema,
  ListToolsRequestSchema,
  isInitializeRequest,
  type CallToolResult,
} from "@modelcontextprotocol/sdk/types.js";

import { AirlockTools, IDEMPOTENCY_ARGUMENT, describeTool, inputSchema, type ToolResult } from "./tools.js";

/** The gateway's version, as it tells MCP clients. */
export const VERSION = "0.1.0";

/** What the gateway tells an MCP client about its tools. */
export const INSTRUCTIONS =
  "Tools with side effects, executed at most once through Airlock. Give every call an " +
  `${IDEMPOTENCY_ARGUMENT}; retry with the same one, never a new one, after an ` +
  "'outcome unknown' or 'in progress' answer.";

/** A {@link ToolResult} as an MCP `tools/call` result. */
export function callToolResult(result: ToolResult): CallToolResult {
  return {
    content: [{ type: "text", text: result.text }],
    structuredContent: result.structured,
    isError: result.isError,
  };
}

/**
 * The MCP server for one connection (stdio) or one streamable HTTP session: `tools/list` and
 * `tools/call` over `tools`. Connect it to one transport.
 */
export function buildServer(tools: AirlockTools): Server {
  const server = new Server({ name: "airlock", version: VERSION }, { capabilities: { tools: {} }, instructions: INSTRUCTIONS });
  // Request ids restart with each session: a call without an idempotency key is keyed by its
  // session (the streamable HTTP session id, else a random id of this server, which serves
  // one connection) and its request id.
  const connection = randomBytes(8).toString("hex");

  server.setRequestHandler(ListToolsRequestSchema, () => ({
    tools: [...tools.tools.values()].map((t) => ({
      name: t.name,
      description: describeTool(t),
      inputSchema: inputSchema(t) as { type: "object"; [key: string]: unknown },
    })),
  }));

  server.setRequestHandler(CallToolRequestSchema, async (request, extra) => {
    const session = extra.sessionId ?? connection;
    const callId = `${tools.runId}/${session}/${String(extra.requestId)}`;
    return callToolResult(await tools.call(request.params.name, request.params.arguments, callId));
  });
  return server;
}

/** Serves `tools` over this process's stdin and stdout until stdin ends; resolves then. */
export async function serveStdio(tools: AirlockTools): Promise<void> {
  const server = buildServer(tools);
  const transport = new StdioServerTransport();
  const closed = new Promise<void>((resolve) => {
    server.onclose = resolve;
  });
  await server.connect(transport);
  const end = (): void => void server.close();
  process.stdin.once("end", end);
  process.stdin.once("close", end);
  await closed;
}

/** A running streamable HTTP gateway. */
export interface HttpGateway {
  /** `http://host:port/mcp`. */
  readonly url: string;
  readonly server: HttpServer;
  /** Closes every session and stops listening. */
  close(): Promise<void>;
}

export interface HttpOptions {
  /** Default "127.0.0.1". */
  host?: string;
  /** Default 0: any free port. */
  port?: number;
  /** The largest request body taken, in bytes. Default 4 MiB. */
  maxBodyBytes?: number;
  /** A session without a call (a POST) open or made for this long is closed, its streams
   * too; its client must initialize again. Default one hour. */
  idleSessionMs?: number;
}

const LOOPBACK = new Set(["127.0.0.1", "localhost", "::1", "[::1]"]);

/**
 * Serves `tools` over streamable HTTP at `http://host:port/mcp`, one MCP session per client
 * (its `Mcp-Session-Id`), closed when its client deletes it or after `idleSessionMs` without
 * a call. Listening on a loopback address, requests whose `Host` is not that address
 * are refused (DNS rebinding).
 */
export async function serveHttp(tools: AirlockTools, options: HttpOptions = {}): Promise<HttpGateway> {
  const host = options.host ?? "127.0.0.1";
  const maxBody = options.maxBodyBytes ?? 4 * 1024 * 1024;
  const idleMs = options.idleSessionMs ?? 60 * 60 * 1000;
  interface Session {
    readonly transport: StreamableHTTPServerTransport;
    /** POST requests of the session not answered yet (a GET's stream, which only listens,
     * does not count). */
    open: number;
    lastSeen: number;
  }
  const sessions = new Map<string, Session>();
  let allowedHosts: string[] | undefined;
  const sweeper = setInterval(
    () => {
      const now = Date.now();
      for (const [id, session] of sessions) {
        if (session.open === 0 && now - session.lastSeen >= idleMs) {
          sessions.delete(id);
          void session.transport.close();
        }
      }
    },
    Math.max(10, Math.min(idleMs / 2, 60_000)),
  );
  sweeper.unref();

  const http = createServer((req, res) => {
    handle(req, res).catch((e: unknown) => {
      if (!res.headersSent) {
        jsonError(res, 500, -32603, `internal error: ${e instanceof Error ? e.message : String(e)}`);
      } else {
        res.destroy();
      }
    });
  });

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const path = new URL(req.url ?? "/", "http://gateway").pathname;
    if (path !== "/mcp") {
      return jsonError(res, 404, -32601, "not found: the MCP endpoint is /mcp");
    }
    const header = req.headers["mcp-session-id"];
    const sessionId = Array.isArray(header) ? header[0] : header;
    let body: unknown;
    if (req.method === "POST") {
      const read = await readBody(req, maxBody);
      if (read === null) {
        return jsonError(res, 413, -32600, `request body over ${maxBody} bytes`);
      }
      try {
        body = JSON.parse(read);
      } catch {
        return jsonError(res, 400, -32700, "parse error: the body is not JSON");
      }
    }
    if (sessionId !== undefined) {
      const session = sessions.get(sessionId);
      if (session === undefined) {
        return jsonError(res, 404, -32001, "session not found");
      }
      session.lastSeen = Date.now();
      if (req.method === "POST") {
        session.open += 1;
        res.once("close", () => {
          session.open -= 1;
          session.lastSeen = Date.now();
        });
      }
      return session.transport.handleRequest(req, res, body);
    }
    if (req.method !== "POST" || !isInitializeRequest(body)) {
      return jsonError(res, 400, -32000, "bad request: no Mcp-Session-Id, and not an initialize request");
    }
    const transport = new StreamableHTTPServerTransport({
      sessionIdGenerator: () => randomUUID(),
      onsessioninitialized: (id) => {
        sessions.set(id, { transport, open: 0, lastSeen: Date.now() });
      },
      ...(allowedHosts ? { enableDnsRebindingProtection: true, allowedHosts } : {}),
    });
    transport.onclose = () => {
      if (transport.sessionId !== undefined) {
        sessions.delete(transport.sessionId);
      }
    };
    await buildServer(tools).connect(transport);
    await transport.handleRequest(req, res, body);
  }

  await new Promise<void>((resolve, reject) => {
    http.once("error", (e) => {
      clearInterval(sweeper);
      reject(e);
    });
    http.listen(options.port ?? 0, host, () => {
      http.removeAllListeners("error");
      resolve();
    });
  });
  const port = (http.address() as AddressInfo).port;
  const shown = host.includes(":") && !host.startsWith("[") ? `[${host}]` : host;
  if (LOOPBACK.has(host)) {
    allowedHosts = [`127.0.0.1:${port}`, `localhost:${port}`, `[::1]:${port}`];
  }
  return {
    url: `http://${shown}:${port}/mcp`,
    server: http,
    async close() {
      clearInterval(sweeper);
      await Promise.allSettled([...sessions.values()].map((s) => s.transport.close()));
      sessions.clear();
      http.closeAllConnections();
      await new Promise<void>((resolve) => http.close(() => resolve()));
    },
  };
}

function jsonError(res: ServerResponse, status: number, code: number, message: string): void {
  res.writeHead(status, { "content-type": "application/json" });
  res.end(JSON.stringify({ jsonrpc: "2.0", error: { code, message }, id: null }));
}

/** The request's body as text, or null past `limit` bytes. */
async function readBody(req: IncomingMessage, limit: number): Promise<string | null> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req) {
    const buffer = chunk as Buffer;
    size += buffer.length;
    if (size > limit) {
      return null;
    }
    chunks.push(buffer);
  }
  return Buffer.concat(chunks).toString("utf8");
}
