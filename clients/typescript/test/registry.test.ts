/**
 * The schema registry client without a registry, as clients/python/tests/test_registry.py
 * checks the Python one: the schema it sends, its subjects, and how it maps a registry's
 * answers (served by a tiny local HTTP server scripted per test) and failures to errors. The
 * proof against a real registry and processor is test/integration/registry.test.ts. (Run by
 * contract.test.ts, which imports this file.)
 */

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import { createServer as createTcpServer } from "node:net";
import { describe, test } from "node:test";

import { Client, RegistryError, SchemaRegistry, codec, topicSubject } from "../src/index.js";
import { REPO, inRepository } from "./vectors.js";

const CONTENT_TYPE = "application/vnd.schemaregistry.v1+json";

interface Seen {
  method: string;
  path: string;
  contentType: string | undefined;
  accept: string | undefined;
  body: unknown;
}

type Reply = (seen: Seen, res: ServerResponse) => void;

/** A local HTTP server answering the n-th request with `replies[n]` (the last one after
 * that), recording what it was asked. */
async function fakeRegistry(replies: Reply[]): Promise<{ url: string; seen: Seen[]; close: () => Promise<void> }> {
  const seen: Seen[] = [];
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const text = Buffer.concat(chunks).toString("utf8");
      const s: Seen = {
        method: req.method ?? "",
        path: req.url ?? "",
        contentType: req.headers["content-type"],
        accept: req.headers["accept"],
        body: text === "" ? undefined : JSON.parse(text),
      };
      seen.push(s);
      replies[Math.min(seen.length, replies.length) - 1]!(s, res);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as { port: number }).port;
  return {
    url: `http://127.0.0.1:${port}/apis/ccompat/v7`,
    seen,
    close: async () => {
      server.closeAllConnections();
      await new Promise((resolve) => server.close(resolve));
    },
  };
}

function json(status: number, body: unknown): Reply {
  return (_, res) => {
    res.writeHead(status, { "Content-Type": CONTENT_TYPE });
    res.end(JSON.stringify(body));
  };
}

function text(status: number, body: string): Reply {
  return (_, res) => {
    res.writeHead(status, { "Content-Type": "text/plain" });
    res.end(body);
  };
}

/** Apicurio's answer for a subject without the schema. */
const NOT_FOUND = json(404, { error_code: 40401, message: "Subject 'x' not found." });

async function registryError(promise: Promise<unknown>): Promise<RegistryError> {
  try {
    await promise;
  } catch (e) {
    assert.ok(e instanceof RegistryError, `a RegistryError, not ${String(e)}`);
    return e;
  }
  assert.fail("resolved");
}

/** A port where nothing listens. */
async function deadPort(): Promise<number> {
  const server = createTcpServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as { port: number }).port;
  await new Promise((resolve) => server.close(resolve));
  return port;
}

const SUBJECT = "airlock.proposals-value";

describe("the schema registry client", () => {
  test("the schema looked up is the one Airlock registers, under the topic's subject", { skip: !inRepository() && "not in the repository" }, () => {
    // `airlock topics create` registers the .avsc text as it is; the lookup sends the same text.
    for (const record of codec.RECORDS) {
      assert.equal(codec.schemaText(record), readFileSync(`${REPO}schemas/avro/${record}.avsc`, "utf8"), record);
    }
    assert.equal(topicSubject("airlock.proposals"), SUBJECT);
  });

  test("the lookup is POST /subjects/<subject> with the schema, and its id is cached", async () => {
    const registry = await fakeRegistry([json(200, { subject: SUBJECT, version: 1, id: 7, schema: "..." })]);
    try {
      const client = new SchemaRegistry(registry.url + "/");
      assert.equal(await client.schemaId(SUBJECT, "ToolProposal"), 7);
      assert.equal(await client.schemaId(SUBJECT, "ToolProposal"), 7);
      assert.equal(registry.seen.length, 1, "the second answer came from the cache");
      assert.deepEqual(registry.seen[0], {
        method: "POST",
        path: `/apis/ccompat/v7/subjects/${SUBJECT}`,
        contentType: CONTENT_TYPE,
        accept: CONTENT_TYPE,
        body: { schema: codec.schemaText("ToolProposal") },
      });
      // Another subject, or another record, is another lookup; the subject is one path segment.
      assert.equal(await client.schemaId("a/b?c-value", "ToolProposal"), 7);
      assert.equal(await client.schemaId(SUBJECT, "Decision"), 7);
      assert.deepEqual(
        registry.seen.map((s) => s.path),
        [`/apis/ccompat/v7/subjects/${SUBJECT}`, "/apis/ccompat/v7/subjects/a%2Fb%3Fc-value", `/apis/ccompat/v7/subjects/${SUBJECT}`],
      );
      assert.deepEqual(registry.seen[2]!.body, { schema: codec.schemaText("Decision") });
    } finally {
      await registry.close();
    }
  });

  test("a subject without the schema is refused unless registering, naming the way out", async () => {
    const registry = await fakeRegistry([NOT_FOUND, NOT_FOUND, json(200, { id: 9 }), json(500, {})]);
    try {
      const client = new SchemaRegistry(registry.url);
      const e = await registryError(client.schemaId(SUBJECT, "ToolProposal"));
      assert.equal(e.kind, "not_registered");
      assert.equal(e.status, 404);
      assert.match(e.message, /ToolProposal's schema is not registered under airlock\.proposals-value \(Subject 'x' not found\.\)/);
      assert.match(e.message, /airlock topics create/);
      assert.equal(await client.schemaId(SUBJECT, "ToolProposal", { register: true }), 9);
      assert.deepEqual(
        registry.seen.map((s) => s.path),
        [`/apis/ccompat/v7/subjects/${SUBJECT}`, `/apis/ccompat/v7/subjects/${SUBJECT}`, `/apis/ccompat/v7/subjects/${SUBJECT}/versions`],
      );
      assert.deepEqual(registry.seen[2]!.body, { schema: codec.schemaText("ToolProposal") });
      assert.equal(await client.schemaId(SUBJECT, "ToolProposal"), 9, "cached");
      assert.equal(registry.seen.length, 3);
    } finally {
      await registry.close();
    }
  });

  test("the registry's refusals and other statuses are errors with its message", async () => {
    const cases: Array<[Reply[], string, number, RegExp]> = [
      [
        [NOT_FOUND, json(409, { error_code: 409, message: "Incompatible schema: field must_have" })],
        "incompatible",
        409,
        /ToolProposal's schema refused under airlock\.proposals-value as incompatible: Incompatible schema: field must_have$/,
      ],
      [[NOT_FOUND, text(500, "boom")], "http", 500, /registering ToolProposal under airlock\.proposals-value: HTTP 500: boom$/],
      [[text(503, "down for maintenance")], "http", 503, /looking up ToolProposal under airlock\.proposals-value: HTTP 503: down for maintenance$/],
      [[json(401, { message: "unauthorized" })], "http", 401, /HTTP 401: unauthorized$/],
      [[text(500, "x".repeat(5_000))], "http", 500, /HTTP 500: x{500}\.\.\.$/],
    ];
    for (const [replies, kind, status, message] of cases) {
      const registry = await fakeRegistry(replies);
      try {
        const e = await registryError(new SchemaRegistry(registry.url).schemaId(SUBJECT, "ToolProposal", { register: true }));
        assert.deepEqual([e.kind, e.status], [kind, status], e.message);
        assert.match(e.message, message);
      } finally {
        await registry.close();
      }
    }
  });

  test("an answer without a usable id is refused, and not cached", async () => {
    for (const body of [{}, { id: -1 }, { id: 2 ** 32 }, { id: 1.5 }, { id: "7" }, [7], "7"]) {
      const registry = await fakeRegistry([json(200, body), json(200, { id: 7 })]);
      try {
        const client = new SchemaRegistry(registry.url);
        const e = await registryError(client.schemaId(SUBJECT, "ToolProposal"));
        assert.deepEqual([e.kind, e.status], ["malformed", 200], e.message);
        assert.match(e.message, /airlock\.proposals-value: no schema id in /);
        assert.equal(await client.schemaId(SUBJECT, "ToolProposal"), 7);
      } finally {
        await registry.close();
      }
    }
    const registry = await fakeRegistry([NOT_FOUND, json(200, { version: 1 })]);
    try {
      const e = await registryError(new SchemaRegistry(registry.url).schemaId(SUBJECT, "ToolProposal", { register: true }));
      assert.equal(e.kind, "malformed");
      assert.match(e.message, /no schema id in \{"version":1\}/);
    } finally {
      await registry.close();
    }
  });

  test("an unreachable registry is named and bounded", { timeout: 10_000 }, async () => {
    const port = await deadPort();
    const started = performance.now();
    const e = await registryError(new SchemaRegistry(`http://127.0.0.1:${port}/apis/ccompat/v7`, { timeoutMs: 2_000 }).schemaId(SUBJECT, "ToolProposal"));
    assert.ok(performance.now() - started < 5_000);
    assert.deepEqual([e.kind, e.status], ["unreachable", null]);
    assert.match(e.message, new RegExp(`^schema registry unreachable: POST http://127\\.0\\.0\\.1:${port}/apis/ccompat/v7/subjects/airlock\\.proposals-value \\(timeout 2000 ms\\): .*ECONNREFUSED`));
  });

  for (const [what, reply] of [
    ["never answers", (() => undefined) as Reply],
    [
      "stops in the middle of its answer",
      ((_, res) => {
        res.writeHead(200, { "Content-Type": CONTENT_TYPE, "Content-Length": "100" });
        res.write('{"id":');
      }) as Reply,
    ],
  ] as const) {
    test(`a registry that ${what} times out`, { timeout: 10_000 }, async () => {
      const registry = await fakeRegistry([reply]);
      try {
        const started = performance.now();
        const e = await registryError(new SchemaRegistry(registry.url, { timeoutMs: 500 }).schemaId(SUBJECT, "ToolProposal"));
        const took = performance.now() - started;
        assert.ok(took >= 400 && took < 3_000, `took ${took} ms`);
        assert.deepEqual([e.kind, e.status], ["unreachable", null]);
        assert.match(e.message, /\(timeout 500 ms\): no answer in time$/);
      } finally {
        await registry.close();
      }
    });
  }

  test("only http(s) URLs without credentials, and a bounded timeout", () => {
    for (const url of ["registry:8081", "ftp://registry/x", "file:///tmp/x", "http://user:secret@registry:8081", "http://registry:8081/?x=1", ""]) {
      assert.throws(() => new SchemaRegistry(url), TypeError, url);
    }
    for (const timeoutMs of [0, -1, Number.NaN, Infinity, 2 ** 31]) {
      assert.throws(() => new SchemaRegistry("http://registry:8081", { timeoutMs }), RangeError, String(timeoutMs));
    }
    assert.equal(new SchemaRegistry("https://registry:8081//").url, "https://registry:8081");
  });
});

describe("the client with a schema registry", () => {
  test("connect fails with the registry's error before touching Kafka, as Python's constructor does", { timeout: 10_000 }, async () => {
    const registry = await fakeRegistry([NOT_FOUND]);
    try {
      // Nothing listens on the broker's port: the registry is asked first, and its answer ends it.
      const e = await registryError(
        Client.connect(`127.0.0.1:${await deadPort()}`, { topicPrefix: "t-1.", schemaRegistryUrl: registry.url }),
      );
      assert.equal(e.kind, "not_registered");
      assert.match(e.message, /under t-1\.proposals-value .*registerSchema: true/);
      assert.equal(registry.seen.length, 1);
      assert.equal(registry.seen[0]!.path, "/apis/ccompat/v7/subjects/t-1.proposals-value");
    } finally {
      await registry.close();
    }
  });

  test("a bad registry URL is refused", async () => {
    await assert.rejects(Client.connect("127.0.0.1:9", { partitions: 1, schemaRegistryUrl: "ftp://registry" }), TypeError);
  });
});
