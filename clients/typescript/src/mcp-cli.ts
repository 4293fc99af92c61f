#!/usr/bin/env node
/**
 * `airlock-mcp`: the MCP gateway (`./mcp.js`) as a command.
 *
 *     airlock-mcp --brokers localhost:9092 --registry deploy/config/tools.toml \
 *         --tenant acme --principal agent-support-1            # stdio
 *     airlock-mcp ... --http 127.0.0.1:8765                    # http://127.0.0.1:8765/mcp
 *
 * Over stdio nothing but MCP messages goes to stdout; errors go to stderr. Exits 0 when stdin
 * ends (stdio) or on SIGINT / SIGTERM, 1 when Airlock cannot be reached or the registry not
 * read, 2 on a bad command line.
 */

import { parseArgs } from "node:util";

import { Client } from "./client.js";
import { serveHttp, serveStdio } from "./mcp.js";
import { AirlockTools, loadRegistry } from "./tools.js";

const USAGE = `usage: airlock-mcp --brokers HOST:PORT[,...] --registry TOOLS.TOML --tenant TENANT
                   --principal PRINCIPAL [--topic-prefix PREFIX] [--wait-seconds N]
                   [--schema-registry-url URL] [--key-scope global|tenant] [--http HOST:PORT]

An MCP server that calls tools through Airlock.

  --brokers        Kafka bootstrap servers
  --topic-prefix   Airlock's topics.prefix (default "airlock.")
  --registry       Airlock's tool registry (tools.toml)
  --tenant         the tenant every call is made for
  --principal      the principal the agent acts for
  --wait-seconds   how long a call waits for Airlock's answer, then again for the outcome
                   (default 60)
  --schema-registry-url
                   a Confluent-compatible schema registry (the processor's
                   schema_registry.url): proposals published in the Confluent framing,
                   answers read in either (needed when the processor runs with
                   schema_registry.framing = "confluent")
  --key-scope      the processor's processor.key_scope (default global): with tenant,
                   operation keys and the run id begin with the tenant and "/"
  --http           serve streamable HTTP at http://HOST:PORT/mcp instead of stdio
`;

function fail(message: string, code: number): never {
  process.stderr.write(`airlock-mcp: ${message}\n`);
  if (code === 2) {
    process.stderr.write(USAGE);
  }
  process.exit(code);
}

async function main(argv: string[]): Promise<void> {
  let values: Record<string, string | boolean | undefined>;
  try {
    ({ values } = parseArgs({
      args: argv,
      options: {
        brokers: { type: "string" },
        "topic-prefix": { type: "string", default: "airlock." },
        registry: { type: "string" },
        tenant: { type: "string" },
        principal: { type: "string" },
        "wait-seconds": { type: "string", default: "60" },
        "schema-registry-url": { type: "string" },
        "key-scope": { type: "string", default: "global" },
        http: { type: "string" },
        help: { type: "boolean", short: "h" },
      },
      strict: true,
      allowPositionals: false,
    }));
  } catch (e) {
    fail(e instanceof Error ? e.message : String(e), 2);
  }
  if (values["help"]) {
    process.stdout.write(USAGE);
    return;
  }
  const need = (name: string): string => {
    const value = values[name];
    if (typeof value !== "string" || value.length === 0) {
      fail(`--${name} is required`, 2);
    }
    return value;
  };
  const brokers = need("brokers");
  const registryPath = need("registry");
  const tenant = need("tenant");
  const principal = need("principal");
  const waitSeconds = Number(values["wait-seconds"]);
  if (!(waitSeconds > 0) || !Number.isFinite(waitSeconds)) {
    fail(`--wait-seconds must be a positive number, not ${String(values["wait-seconds"])}`, 2);
  }
  const keyScope = values["key-scope"];
  if (keyScope !== "global" && keyScope !== "tenant") {
    fail(`--key-scope takes global or tenant, not ${String(keyScope)}`, 2);
  }
  let listen: { host: string; port: number } | undefined;
  if (typeof values["http"] === "string") {
    const at = values["http"].lastIndexOf(":");
    const port = Number(values["http"].slice(at + 1));
    const host = values["http"].slice(0, Math.max(at, 0)).replace(/^\[(.*)\]$/, "$1");
    if (at <= 0 || !Number.isInteger(port) || port < 0 || port > 65535) {
      fail(`--http takes HOST:PORT, not ${values["http"]}`, 2);
    }
    listen = { host, port };
  }

  let registry;
  try {
    registry = loadRegistry(registryPath);
  } catch (e) {
    fail(`the registry ${registryPath}: ${e instanceof Error ? e.message : String(e)}`, 1);
  }
  let client: Client;
  try {
    const schemaRegistryUrl = values["schema-registry-url"] as string | undefined;
    client = await Client.connect(brokers, {
      topicPrefix: values["topic-prefix"] as string,
      ...(schemaRegistryUrl ? { schemaRegistryUrl } : {}),
    });
  } catch (e) {
    fail(e instanceof Error ? e.message : String(e), 1);
  }
  const tools = new AirlockTools(client, registry, { tenant, principal, waitSeconds, keyScope });

  let stopping = false;
  let stopHttp: (() => Promise<void>) | undefined;
  const stop = async (): Promise<void> => {
    if (stopping) {
      return;
    }
    stopping = true;
    await stopHttp?.();
    await client.close();
    process.exit(0);
  };
  process.once("SIGINT", () => void stop());
  process.once("SIGTERM", () => void stop());

  if (listen) {
    const gateway = await serveHttp(tools, listen).catch((e: unknown) =>
      fail(`cannot listen on ${String(values["http"])}: ${e instanceof Error ? e.message : String(e)}`, 1),
    );
    stopHttp = () => gateway.close();
    process.stderr.write(`airlock-mcp: serving ${gateway.url}\n`);
  } else {
    await serveStdio(tools);
    await stop();
  }
}

main(process.argv.slice(2)).catch((e: unknown) => {
  fail(e instanceof Error ? (e.stack ?? e.message) : String(e), 1);
});
