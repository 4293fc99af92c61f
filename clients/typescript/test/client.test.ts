/**
 * The client's timers, its answer reader and its closing, without a broker: the reader reads
 * from a fake consumer, the client connects to a port where nothing listens or to a server
 * that never answers, or talks to the Kafka library's clients with their network calls
 * replaced. (Run by contract.test.ts, which imports this file.)
 */

import assert from "node:assert/strict";
import { getEventListeners } from "node:events";
import { createServer, type Server, type Socket } from "node:net";
import { describe, test } from "node:test";

import {
  AuthenticationError,
  Consumer,
  MultipleErrors,
  NetworkError,
  Producer,
  ResponseError,
  type ClusterMetadata,
} from "@platformatic/kafka";

import { BrokerUnavailable, Client, TimedOut, buildProposal, codec } from "../src/index.js";
import { Reader, Waiter, isAuthFailure } from "../src/reader.js";
import { MAX_TIMER_MS, pause, timer, within } from "../src/timers.js";
import { vectors } from "./vectors.js";

const DECISIONS = "airlock.decisions";
const OUTCOMES = "airlock.outcomes";

const never = new Promise<never>(() => undefined);

/** What `promise` settles to within `ms`: its value, its error, or "pending". */
async function settledWithin(promise: Promise<unknown>, ms: number): Promise<unknown> {
  return Promise.race([
    promise.then(
      (v) => v,
      (e: unknown) => e,
    ),
    new Promise((resolve) => setTimeout(() => resolve("pending"), ms)),
  ]);
}

async function rejection(promise: Promise<unknown>): Promise<Error> {
  try {
    await promise;
  } catch (e) {
    return e as Error;
  }
  assert.fail("resolved");
}

// -- timers ---------------------------------------------------------------------------------

describe("timers", () => {
  test("a timeout past 2^31-1 ms or Infinity does not fire at once", async () => {
    for (const ms of [Infinity, MAX_TIMER_MS + 1, 2 ** 40]) {
      let end!: (v: string) => void;
      const ended = new Promise<string>((resolve) => (end = resolve));
      const waited = within(ended, ms, () => new TimedOut("late"));
      assert.equal(await settledWithin(waited, 50), "pending", String(ms));
      // Settled, it leaves no timer behind.
      end("done");
      assert.equal(await waited, "done");
    }
    const e = await settledWithin(within(never, 10, () => new TimedOut("late")), 500);
    assert.ok(e instanceof TimedOut);
  });

  test("no time, a negative timeout or NaN fire at once, as in the Python client", async () => {
    for (const ms of [0, -5, Number.NaN, -Infinity]) {
      const e = await settledWithin(within(never, ms, () => new TimedOut("late")), 100);
      assert.ok(e instanceof TimedOut, String(ms));
    }
    // A promise settled already wins over a timeout of no time.
    assert.equal(await within(Promise.resolve(7), 0, () => new TimedOut("late")), 7);
  });

  test("a long timer is a chain of shorter ones", async () => {
    const started = performance.now();
    const fired = await new Promise<number>((resolve) => {
      timer(60, () => resolve(performance.now() - started), 15);
    });
    assert.ok(fired >= 50, `fired after ${fired} ms`);
    let calls = 0;
    const cancel = timer(40, () => (calls += 1), 10);
    await new Promise((resolve) => setTimeout(resolve, 25));
    cancel();
    await new Promise((resolve) => setTimeout(resolve, 40));
    assert.equal(calls, 0, "cancelled in the middle of the chain");
  });

  test("pause ends when aborted, and leaves no listener behind", async () => {
    const stop = new AbortController();
    for (let i = 0; i < 100; i++) {
      await pause(0, stop.signal);
    }
    assert.equal(getEventListeners(stop.signal, "abort").length, 0);
    const paused = pause(60_000, stop.signal);
    assert.equal(getEventListeners(stop.signal, "abort").length, 1);
    stop.abort();
    assert.equal(await settledWithin(paused, 100), undefined);
    assert.equal(getEventListeners(stop.signal, "abort").length, 0);
  });
});

// -- the reader, from a fake consumer ------------------------------------------------------

type Callback<T> = (error: Error | null, value?: T) => void;
type Batch = {
  firstOffset: bigint;
  lastOffsetDelta: number;
  attributes: number;
  records: Array<{ offsetDelta: number; headers: Array<[Buffer, Buffer]> | null; value: Buffer | null }>;
};

interface Fake {
  /** The records of the decisions partition 0. */
  records: Batch["records"];
  /** Replaces the fetch (an error to fail with, or never to answer). */
  fetchError?: () => Error | "never";
  metadataError?: () => Error;
  closeNever?: boolean;
  fetches: number;
}

function fakeConsumer(fake: Fake): Consumer {
  const metadata: ClusterMetadata = {
    topics: new Map([
      [DECISIONS, { id: "decisions-id", partitions: [{ leader: 1 }], partitionsCount: 1 }],
      [OUTCOMES, { id: "outcomes-id", partitions: [{ leader: 1 }], partitionsCount: 1 }],
    ]),
  } as unknown as ClusterMetadata;
  return {
    topics: { trackAll: () => undefined },
    clearMetadata: () => undefined,
    listOffsets: (options: { timestamp: bigint }, cb: Callback<Map<string, bigint[]>>) => {
      const latest = options.timestamp === -1n;
      setImmediate(() => cb(null, new Map([[DECISIONS, [latest ? BigInt(fake.records.length) : 0n]]])));
    },
    metadata: (_: unknown, cb: Callback<ClusterMetadata>) => {
      setImmediate(() => (fake.metadataError ? cb(fake.metadataError()) : cb(null, metadata)));
    },
    fetch: (options: { topics: Array<{ partitions: Array<{ fetchOffset: bigint }> }> }, cb: Callback<unknown>) => {
      fake.fetches += 1;
      const failure = fake.fetchError?.();
      if (failure === "never") {
        return;
      }
      const from = Number(options.topics[0]!.partitions[0]!.fetchOffset);
      const batch: Batch = {
        firstOffset: 0n,
        lastOffsetDelta: fake.records.length - 1,
        attributes: 0,
        records: fake.records,
      };
      const response = {
        errorCode: 0,
        responses: [
          {
            topicId: "decisions-id",
            partitions: [
              {
                partitionIndex: 0,
                errorCode: 0,
                highWatermark: BigInt(fake.records.length),
                records: from < fake.records.length ? [batch] : [],
              },
            ],
          },
        ],
      };
      setTimeout(() => (failure ? cb(failure) : cb(null, response)), from < fake.records.length ? 0 : 20);
    },
    close: (_: boolean, cb: Callback<void>) => {
      if (!fake.closeNever) {
        setImmediate(() => cb(null));
      }
    },
  } as unknown as Consumer;
}

function header(name: string, value: string): [Buffer, Buffer] {
  return [Buffer.from(name), Buffer.from(value)];
}

const DECISION = vectors().avro.find((c: { record: string }) => c.record === "Decision");
const decisionRecord = (offsetDelta: number): Batch["records"][number] => ({
  offsetDelta,
  headers: [header("airlock-owner-epoch", "1")],
  value: Buffer.from(DECISION.single_object, "hex"),
});

function reader(fake: Fake, warn: (m: string) => void = () => undefined, verify = false): Reader {
  const r = new Reader(fakeConsumer(fake), {
    decisions: DECISIONS,
    outcomes: OUTCOMES,
    capacity: 100,
    // Every marker is forged.
    verify: verify ? () => false : null,
    warn,
  });
  r.start();
  return r;
}

describe("the answer reader", () => {
  test("a throwing onWarning neither stops it nor makes it read the same records again", { timeout: 10_000 }, async () => {
    const fake: Fake = {
      records: [
        { offsetDelta: 0, headers: [header("airlock-kind", "fence"), header("airlock-owner-epoch", "9")], value: null },
        decisionRecord(1),
      ],
      fetches: 0,
    };
    const warnings: string[] = [];
    const r = reader(
      fake,
      (m) => {
        warnings.push(m);
        throw new Error("a broken warning callback");
      },
      true,
    );
    const warnedBefore = console.warn;
    console.warn = () => undefined;
    try {
      await r.follow(DECISIONS, 0, 3_000);
    } finally {
      console.warn = warnedBefore;
      await r.stop(1_000);
    }
    assert.equal(warnings.length, 1, warnings.join("\n"));
    assert.match(warnings[0]!, /does not verify/);
    assert.equal(r.byKey.get(DECISION.value.operation_key)?.length, 1, "the decision after it is read");
  });

  test("an error processing a record fails the waits with it instead of reading again for good", { timeout: 10_000 }, async () => {
    const fake: Fake = { records: [decisionRecord(0), { offsetDelta: 1, headers: null, value: null }], fetches: 0 };
    const r = reader(fake);
    try {
      const e = await rejection(r.follow(DECISIONS, 0, 3_000));
      assert.ok(e instanceof BrokerUnavailable, String(e));
      assert.match(e.message, /the answer reader stopped: .*null/);
      assert.equal(fake.fetches, 1);
      assert.throws(() => r.wait(new Waiter(DECISIONS, 0, () => false), () => null), BrokerUnavailable);
    } finally {
      await r.stop(1_000);
    }
  });

  test("authentication and authorization errors fail it also when the library wraps them", { timeout: 20_000 }, async () => {
    const wrapped: Array<[string, () => Error]> = [
      ["AuthenticationError", () => new AuthenticationError("SASL authentication failed")],
      [
        "in MultipleErrors",
        () => new MultipleErrors("fetch failed 2 times.", [new NetworkError("gone"), new AuthenticationError("SASL authentication failed")]),
      ],
      [
        "a topic authorization response",
        () => new MultipleErrors("fetch failed 1 times.", [new ResponseError(1, 17, { "/responses/0": [29, null] }, {})]),
      ],
      ["as a cause", () => new Error("fetching", { cause: new ResponseError(1, 17, { "/": [31, null] }, {}) })],
    ];
    for (const [name, error] of wrapped) {
      assert.ok(isAuthFailure(error()), name);
      const fake: Fake = { records: [decisionRecord(0)], fetchError: error, fetches: 0 };
      const r = reader(fake);
      try {
        const e = await rejection(r.follow(DECISIONS, 0, 3_000));
        assert.ok(e instanceof BrokerUnavailable, `${name}: ${String(e)}`);
        assert.match(e.message, /reading answers: .*(authentication|authorization) failed/i, name);
        assert.equal(fake.fetches, 1, name);
      } finally {
        await r.stop(1_000);
      }
    }
    assert.ok(!isAuthFailure(new MultipleErrors("fetch failed 4 times.", [new NetworkError("gone")])));
  });

  test("stop() is bounded when the consumer answers neither the fetch nor the close", { timeout: 10_000 }, async () => {
    const fake: Fake = { records: [decisionRecord(0)], fetchError: () => "never", closeNever: true, fetches: 0 };
    const r = reader(fake);
    const followed = r.follow(DECISIONS, 0, 60_000);
    followed.catch(() => undefined);
    while (fake.fetches === 0) {
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
    const started = performance.now();
    await r.stop(300);
    const took = performance.now() - started;
    assert.ok(took < 2_000, `stop took ${took} ms`);
    assert.ok((await rejection(followed)) instanceof BrokerUnavailable);
  });
});

// -- the client, without a broker -----------------------------------------------------------

/** A port where nothing listens. */
async function deadPort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as { port: number }).port;
  await new Promise((resolve) => server.close(resolve));
  return port;
}

/** A server that takes connections and never answers. */
async function silentServer(): Promise<{ port: number; close: () => Promise<void> }> {
  const sockets = new Set<Socket>();
  const server: Server = createServer((socket) => {
    sockets.add(socket);
    socket.on("error", () => undefined);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    port: (server.address() as { port: number }).port,
    close: async () => {
      for (const s of sockets) {
        s.destroy();
      }
      await new Promise((resolve) => server.close(resolve));
    },
  };
}

const CALL = { operationKey: "refund:txn_1" };

describe("the client without a broker", () => {
  for (const [what, broker] of [
    ["nothing listens", async () => ({ port: await deadPort(), close: async () => undefined })],
    ["the broker never answers", silentServer],
  ] as const) {
    test(`close() is bounded while the reader retries (${what}), and open waits fail`, { timeout: 30_000 }, async () => {
      const server = await broker();
      try {
        const client = await Client.connect(`127.0.0.1:${server.port}`, {
          partitions: 1,
          kafka: { retries: 1_000, retryDelay: 200, connectTimeout: 2_000, timeout: 2_000 },
        });
        const waiting = client.waitSettled(CALL.operationKey, { timeoutMs: 60_000 });
        waiting.catch(() => undefined);
        await new Promise((resolve) => setTimeout(resolve, 500));
        const started = performance.now();
        await client.close();
        const took = performance.now() - started;
        assert.ok(took < 3_000, `close took ${took} ms`);
        const e = await rejection(waiting);
        assert.ok(e instanceof BrokerUnavailable, String(e));
      } finally {
        await server.close();
      }
    });
  }

  test("waitSettled with an Infinity timeout waits instead of timing out at once", { timeout: 30_000 }, async () => {
    const client = await Client.connect(`127.0.0.1:${await deadPort()}`, {
      partitions: 1,
      kafka: { retries: 1_000, retryDelay: 200 },
    });
    try {
      const waiting = client.waitSettled(CALL.operationKey, { timeoutMs: Infinity });
      assert.equal(await settledWithin(waiting, 300), "pending");
      await client.close();
      assert.ok((await rejection(waiting)) instanceof BrokerUnavailable);
    } finally {
      await client.close();
    }
  });
});

/** Replaces methods of the Kafka library's clients for the length of `body`. */
async function patched(
  methods: Array<[object, string, (...args: never[]) => unknown]>,
  body: () => Promise<void>,
): Promise<void> {
  const saved = methods.map(([proto, name]) => [proto, name, Object.getOwnPropertyDescriptor(proto, name)] as const);
  for (const [proto, name, fn] of methods) {
    Object.defineProperty(proto, name, { value: fn, configurable: true, writable: true });
  }
  try {
    await body();
  } finally {
    for (const [proto, name, descriptor] of saved) {
      if (descriptor === undefined) {
        delete (proto as Record<string, unknown>)[name];
      } else {
        Object.defineProperty(proto, name, descriptor);
      }
    }
  }
}

describe("the client's timeouts", () => {
  test("a TimedOut names the reader's last error", { timeout: 10_000 }, async () => {
    await patched(
      [
        [
          Consumer.prototype,
          "listOffsets",
          (_: unknown, cb: Callback<Map<string, bigint[]>>) => setImmediate(() => cb(null, new Map([[DECISIONS, [0n]]]))),
        ],
        [
          Consumer.prototype,
          "metadata",
          (_: unknown, cb: Callback<unknown>) =>
            setImmediate(() => cb(new MultipleErrors("metadata failed 4 times.", [new NetworkError("TLS handshake refused by 10.0.0.7:9093")]))),
        ],
        [Producer.prototype, "send", (_: unknown, cb: Callback<unknown>) => setImmediate(() => cb(null, {}))],
      ],
      async () => {
        const client = await Client.connect("127.0.0.1:9", { partitions: 1 });
        try {
          const e = await rejection(
            client.propose(
              {
                tool: "refund",
                operationKey: CALL.operationKey,
                arguments: { amount: 1 },
                tenant: "acme",
                principal: "agent",
                runId: "run-1",
                logicalCallId: "call-1",
              },
              { timeoutMs: 1_000 },
            ),
          );
          assert.ok(e instanceof TimedOut, String(e));
          assert.match(e.message, /metadata failed 4 times\. \(TLS handshake refused by 10\.0\.0\.7:9093\)/);
        } finally {
          await client.close();
        }
      },
    );
  });
});

describe("the proposal's framing", () => {
  const call = {
    tool: "refund",
    operationKey: CALL.operationKey,
    arguments: { amount: 1 },
    tenant: "acme",
    principal: "agent",
    runId: "run-1",
    logicalCallId: "call-1",
    nowMs: 1_700_000_000_000,
  };

  /** The value the client hands the producer for `call` (no broker: the answer never comes). */
  async function published(options: { schemaId?: number }): Promise<Buffer> {
    const values: Buffer[] = [];
    await patched(
      [
        [
          Consumer.prototype,
          "listOffsets",
          (_: unknown, cb: Callback<Map<string, bigint[]>>) => setImmediate(() => cb(null, new Map([[DECISIONS, [0n]]]))),
        ],
        [
          Consumer.prototype,
          "metadata",
          (_: unknown, cb: Callback<unknown>) => setImmediate(() => cb(new NetworkError("no broker in this test"))),
        ],
        [
          Producer.prototype,
          "send",
          (options: { messages: Array<{ value: Buffer }> }, cb: Callback<unknown>) => {
            values.push(...options.messages.map((m) => m.value));
            setImmediate(() => cb(null, {}));
          },
        ],
      ],
      async () => {
        const client = await Client.connect("127.0.0.1:9", { partitions: 1, ...options });
        try {
          assert.equal(client.schemaId, options.schemaId ?? null);
          const e = await rejection(client.propose(call, { timeoutMs: 300 }));
          assert.ok(e instanceof TimedOut, String(e));
        } finally {
          await client.close();
        }
      },
    );
    assert.equal(values.length, 1);
    return values[0]!;
  }

  test("single-object by default; with a schema id, 00, the id big-endian, the same datum", { timeout: 10_000 }, async () => {
    const record = buildProposal(call) as unknown as Record<string, unknown>;
    const single = await published({});
    assert.deepEqual(single, codec.encode("ToolProposal", record));
    assert.deepEqual(single.subarray(0, 10), Buffer.concat([codec.SINGLE_OBJECT_MAGIC, codec.fingerprint("ToolProposal")]));

    const confluent = await published({ schemaId: 0x01020304 });
    assert.equal(confluent.subarray(0, 5).toString("hex"), "0001020304");
    assert.deepEqual(confluent.subarray(5), single.subarray(10));
    assert.deepEqual(codec.decode("ToolProposal", confluent, { [0x01020304]: ["ToolProposal", 1] }), record);
  });

  test("a schema id that is no unsigned 32-bit integer is refused before anything starts", async () => {
    for (const bad of [-1, 1.5, 2 ** 32, Number.NaN]) {
      await assert.rejects(Client.connect("127.0.0.1:9", { partitions: 1, schemaId: bad }), RangeError, String(bad));
      assert.throws(() => codec.encode("ToolProposal", buildProposal(call) as never, bad), codec.CodecError, String(bad));
    }
    assert.equal(codec.encode("ToolProposal", buildProposal(call) as never, 0xffffffff).subarray(0, 5).toString("hex"), "00ffffffff");
  });

  test("a fixed schema id and a registry URL are exclusive", async () => {
    await assert.rejects(
      Client.connect("127.0.0.1:9", { partitions: 1, schemaId: 7, schemaRegistryUrl: "http://127.0.0.1:9" }),
      (e: Error) => e instanceof TypeError && /not both/.test(e.message),
    );
  });
});

// The codec is used by the fake's records; a check that they are what the reader reads.
test("the fake's decision record decodes", () => {
  assert.equal(codec.decode("Decision", Buffer.from(DECISION.single_object, "hex"))["operation_key"], "refund:txn_1");
});
