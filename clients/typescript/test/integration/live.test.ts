/**
 * The client against a running Airlock (broker, processor, connector worker, reference
 * ledger), as clients/python/tests/integration/test_live.py runs the Python client. Skipped
 * unless AIRLOCK_TEST_BROKERS is set; reads:
 *
 * - AIRLOCK_TEST_BROKERS, AIRLOCK_TEST_PREFIX: where Airlock's topics are;
 * - AIRLOCK_TEST_REPORT: a file to list the operation keys seen COMMITTED, one per line (a
 *   harness checks the ledger holds exactly one effect for each).
 */

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { randomBytes } from "node:crypto";
import { appendFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { after, before, describe, test } from "node:test";

import { CanonicalError, Client, Refused, type Decision, type ProposalCall } from "../../src/index.js";

const BROKERS = process.env["AIRLOCK_TEST_BROKERS"];
const PREFIX = process.env["AIRLOCK_TEST_PREFIX"] ?? "airlock.";
const REPORT = process.env["AIRLOCK_TEST_REPORT"];
const RUN = randomBytes(4).toString("hex");

function refund(key: string, minorUnits: number, overrides: Partial<ProposalCall> = {}): ProposalCall {
  return {
    tool: "refund",
    operationKey: key,
    arguments: { tenant_id: "acme", account_id: "acct-42", amount: { minor_units: minorUnits, currency: "EUR" } },
    tenant: "acme",
    principal: "agent-support-1",
    runId: `run-${RUN}`,
    logicalCallId: key,
    ...overrides,
  };
}

function committed(...keys: string[]): void {
  if (REPORT) {
    appendFileSync(REPORT, keys.map((k) => k + "\n").join(""), "utf8");
  }
}

async function refusal(promise: Promise<unknown>): Promise<Refused> {
  try {
    await promise;
  } catch (e) {
    assert.ok(e instanceof Refused, `a Refused, not ${String(e)}`);
    return e;
  }
  assert.fail("not refused");
}

/** Each test is skipped, and counted as skipped, without a broker. */
const live = { skip: !BROKERS && "AIRLOCK_TEST_BROKERS is not set" };

describe("a live Airlock", () => {
  let client: Client;

  before(async () => {
    if (!BROKERS) {
      return;
    }
    client = await Client.connect(BROKERS!, { topicPrefix: PREFIX });
  });

  after(async () => {
    await client?.close();
  });

  test("a refund is accepted, then committed once however often it is sent", live, async () => {
    const key = `refund:ts-${RUN}-1`;
    const first = await client.propose(refund(key, 1250));
    assert.deepEqual([first.verdict, first.reason], ["ACCEPTED", "AUTO_APPROVED"]);
    assert.equal(first.earlier, false);
    assert.ok(first.argumentsHash !== null && first.epoch === 1, JSON.stringify(first));

    // The same proposal again (a blind retry): answered from before, not published again.
    const again = await client.propose(refund(key, 1250));
    assert.ok(again.earlier && again.decisionId === first.decisionId, JSON.stringify(again));

    const settled = await client.waitSettled(key, { timeoutMs: 120_000 });
    assert.ok(settled.final && settled.decision.verdict === "COMMITTED", JSON.stringify(settled));
    assert.ok(settled.decision.receipt !== null);
    assert.ok(settled.result !== null, "the connector's evidence is handed back");
    assert.match(settled.result, new RegExp(`"reference":"${key}"`));
    committed(key);

    // Sent again after it settled: still its own answer (ACCEPTED), not the settlement that
    // also replies to it; and the same arguments built in another key order are the same
    // proposal, not a reuse of its id.
    const reordered = refund(key, 1250, {
      arguments: { amount: { currency: "EUR", minor_units: 1250 }, account_id: "acct-42", tenant_id: "acme" },
    });
    for (const call of [refund(key, 1250), reordered]) {
      const late = await client.propose(call);
      assert.ok(late.earlier && late.decisionId === first.decisionId, JSON.stringify(late));
      assert.equal(late.verdict, "ACCEPTED");
    }

    // Another process (a client of its own, reading the partition from its start) sending the
    // same call gets the same earlier answer, and the settlement with its evidence at once.
    const fresh = await Client.connect(BROKERS!, { topicPrefix: PREFIX });
    try {
      const resent = await fresh.propose(refund(key, 1250));
      assert.ok(resent.earlier && resent.decisionId === first.decisionId, JSON.stringify(resent));
      const known = await fresh.waitSettled(key, { timeoutMs: 10_000 });
      assert.equal(known.decision.decisionId, settled.decision.decisionId);
      assert.equal(known.result, settled.result);
      assert.equal(fresh.latestReply(resent).decisionId, settled.decision.decisionId);
    } finally {
      await fresh.close();
    }

    // A new proposal of the key (another logical call, so another id) is a DUPLICATE.
    const retry = await client.propose(refund(key, 1250, { logicalCallId: "another" }));
    assert.equal(retry.verdict, "DUPLICATE", JSON.stringify(retry));
    assert.equal(retry.earlier, false);
  });

  test("refusals are typed and carry the decision", live, async () => {
    const key = `refund:ts-${RUN}-2`;
    await client.propose(refund(key, 300));
    const conflict = await refusal(client.propose(refund(key, 301)));
    assert.equal(conflict.decision.verdict, "CONFLICT");
    assert.equal(conflict.decision.operationKey, key);
    const unknown = await refusal(client.propose(refund(`refund:ts-${RUN}-3`, 300, { tool: "no_such_tool" })));
    assert.equal(unknown.decision.reason, "UNKNOWN_TOOL");
    assert.ok(unknown.decision.detail.length > 0);
    assert.equal((await client.waitSettled(key, { timeoutMs: 120_000 })).decision.verdict, "COMMITTED");
    committed(key);
  });

  test("arguments without a canonical form are refused before sending", live, async () => {
    await assert.rejects(
      client.propose(refund(`refund:ts-${RUN}-4`, 100, { arguments: '{"amount": 1.5}' })),
      (e: unknown) => e instanceof CanonicalError && e.kind === "non_integer" && e.path === "/amount",
    );
  });

  test("many concurrent proposals share one client, each answered", live, async () => {
    const keys = Array.from({ length: 12 }, (_, i) => `refund:ts-${RUN}-c${i}`);
    const answers: Decision[] = await Promise.all(keys.map((k) => client.propose(refund(k, 500))));
    assert.deepEqual(new Set(answers.map((a) => a.verdict)), new Set(["ACCEPTED"]));
    answers.forEach((a, i) => assert.equal(a.operationKey, keys[i]));
    const settled = await Promise.all(keys.map((k) => client.waitSettled(k, { timeoutMs: 120_000 })));
    assert.deepEqual(new Set(settled.map((s) => s.decision.verdict)), new Set(["COMMITTED"]));
    committed(...keys);
  });

  test("two clients publishing the same call at once make one effect", live, async () => {
    const key = `refund:ts-${RUN}-a`;
    const [one, two] = await Promise.all([
      Client.connect(BROKERS!, { topicPrefix: PREFIX }),
      Client.connect(BROKERS!, { topicPrefix: PREFIX }),
    ]);
    try {
      const [a, b] = await Promise.all([one.propose(refund(key, 700)), two.propose(refund(key, 700))]);
      assert.equal(a.decisionId, b.decisionId);
      assert.equal(a.verdict, "ACCEPTED");
      const settled = await one.waitSettled(key, { final: true, timeoutMs: 120_000 });
      assert.equal(settled.decision.verdict, "COMMITTED");
      assert.equal((await two.waitSettled(key, { timeoutMs: 120_000 })).decision.decisionId, settled.decision.decisionId);
      committed(key);
    } finally {
      await Promise.all([one.close(), two.close()]);
    }
  });

  test("a fenced run refuses its stale owner on every partition", live, async () => {
    const run = `run-${RUN}-fenced`;
    const answers = await client.fenceRun(run, 5, "orchestrator-1", { timeoutMs: 120_000 });
    assert.deepEqual([...answers.keys()].sort(), [...Array(client.partitions).keys()]);
    for (const d of answers.values()) {
      assert.equal(d.reason, "FENCE_ADVANCED", JSON.stringify(d));
    }
    // The old owner, at fence 4, on a key of every partition: refused everywhere.
    const keys = new Map<number, string>();
    for (let i = 0; keys.size < client.partitions; i++) {
      const key = `refund:ts-${RUN}-stale-${i}`;
      if (!keys.has(client.partition(key))) {
        keys.set(client.partition(key), key);
      }
    }
    for (const key of keys.values()) {
      const refused = await refusal(client.propose(refund(key, 100, { runId: run, leaseFence: 4 })));
      assert.equal(refused.decision.reason, "STALE_FENCE", JSON.stringify(refused.decision));
    }
    // Its own lower fence is refused too, naming the accepted one.
    const stale = await refusal(client.fenceRun(run, 4, "orchestrator-0", { timeoutMs: 120_000 }));
    assert.equal(stale.decision.reason, "STALE_FENCE");
    assert.match(stale.decision.detail, /accepted fence 5/);
  });

  test("the README's example runs as printed", live, async () => {
    const example = fileURLToPath(new URL("./readme-example.js", import.meta.url));
    const stdout = await new Promise<string>((resolve, reject) => {
      execFile(
        process.execPath,
        [example],
        { env: { ...process.env, AIRLOCK_BROKERS: BROKERS, AIRLOCK_PREFIX: PREFIX }, timeout: 120_000 },
        (error, out, err) => (error ? reject(new Error(`${error.message}\n${out}\n${err}`)) : resolve(out)),
      );
    });
    const lines = stdout.trim().split("\n");
    assert.equal(lines[0], "ACCEPTED AUTO_APPROVED");
    assert.match(lines[1] ?? "", /^COMMITTED true HTTP 2\d\d .*"reference":"refund:txn_1"/);
    committed("refund:txn_1");
  });
});
