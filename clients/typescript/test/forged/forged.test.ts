/**
 * A forged fence marker on the decisions topic, against a running Airlock, as
 * clients/python/tests/forged does for the Python client. Run it after every other live test
 * (`npm run test:forged`): the marker stays in the topic and hides that partition's later
 * answers from readers without the processor's key. Skipped unless AIRLOCK_TEST_BROKERS and
 * AIRLOCK_TEST_VERIFYING_KEY (the processor's capability verifying key file) are set.
 */

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { test } from "node:test";

import { Producer } from "@platformatic/kafka";

import { viaCallback } from "../../src/callback.js";
import { Client, TimedOut, partitionFor, type ProposalCall } from "../../src/index.js";

const BROKERS = process.env["AIRLOCK_TEST_BROKERS"];
const PREFIX = process.env["AIRLOCK_TEST_PREFIX"] ?? "airlock.";
const KEY_FILE = process.env["AIRLOCK_TEST_VERIFYING_KEY"];
const RUN = randomBytes(4).toString("hex");

function refund(key: string): ProposalCall {
  return {
    tool: "refund",
    operationKey: key,
    arguments: { tenant_id: "acme", account_id: "acct-42", amount: { minor_units: 300, currency: "EUR" } },
    tenant: "acme",
    principal: "agent-support-1",
    runId: `run-${RUN}`,
    logicalCallId: key,
  };
}

function keyOn(partition: number, partitions: number, prefix: string): string {
  for (let i = 0; i < 10_000; i++) {
    const key = `${prefix}${i}`;
    if (partitionFor(key, partitions) === partition) {
      return key;
    }
  }
  throw new Error("no key lands there");
}

test(
  "a client with the processor's key reads past a forged marker; one without cannot",
  { skip: !(BROKERS && KEY_FILE) && "AIRLOCK_TEST_BROKERS and AIRLOCK_TEST_VERIFYING_KEY are not set" },
  async () => {
    const decisions = `${PREFIX}decisions`;
    const verifying = await Client.connect(BROKERS!, { topicPrefix: PREFIX, verifyingKeys: [KEY_FILE!] });
    let partition: number;
    const warnings: string[] = [];
    try {
      const first = `refund:ts-fence-${RUN}-1`;
      const answer = await verifying.propose(refund(first));
      assert.equal(answer.verdict, "ACCEPTED");
      // The processor's own marker verified: the partition's fence is its owner epoch.
      partition = verifying.partition(first);
      assert.ok(verifying.fenceOf(decisions, partition) >= 1n);

      // Anyone who can write the topic puts a marker of a huge epoch there, unsigned.
      const forger = new Producer({ clientId: "forger", bootstrapBrokers: BROKERS!.split(",") });
      try {
        await viaCallback((cb) =>
          forger.send(
            {
              messages: [
                {
                  topic: decisions,
                  partition,
                  key: Buffer.from("\u0000airlock-fence/999999"),
                  value: Buffer.from("999999"),
                  headers: new Map([
                    [Buffer.from("airlock-kind"), Buffer.from("fence")],
                    [Buffer.from("airlock-owner-epoch"), Buffer.from("999999")],
                  ]),
                },
              ],
            },
            cb,
          ),
        );
      } finally {
        await viaCallback<void>((cb) => forger.close(false, cb));
      }
    } finally {
      await verifying.close();
    }

    // A fresh client with the key reads the whole partition, the forged marker included.
    const second = await Client.connect(BROKERS!, {
      topicPrefix: PREFIX,
      verifyingKeys: [KEY_FILE!],
      onWarning: (m) => warnings.push(m),
    });
    try {
      const answer = await second.propose(refund(keyOn(partition, second.partitions, `refund:ts-fence-${RUN}-`)));
      assert.equal(answer.verdict, "ACCEPTED");
      assert.ok(second.fenceOf(decisions, partition) < 999_999n);
      assert.ok(second.fenceOf(decisions, partition) >= 1n);
      assert.ok(warnings.some((w) => /does not verify/.test(w)), warnings.join("\n"));
    } finally {
      await second.close();
    }

    // Without the key, the forged marker fences every later answer of the partition.
    const trusting = await Client.connect(BROKERS!, { topicPrefix: PREFIX });
    try {
      await assert.rejects(
        trusting.propose(refund(keyOn(partition, trusting.partitions, `refund:ts-fence-${RUN}-t`)), { timeoutMs: 8_000 }),
        TimedOut,
      );
      assert.equal(trusting.fenceOf(decisions, partition), 999_999n);
    } finally {
      await trusting.close();
    }
  },
);
