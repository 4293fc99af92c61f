/**
 * The client publishing in the Confluent wire format against a running Airlock and a real
 * schema registry, as clients/python/tests/registry/test_registry_live.py runs the Python
 * client; started by the Rust test `tests/tests/schema_registry.rs`, which passes:
 *
 * - AIRLOCK_TEST_BROKERS, AIRLOCK_TEST_PREFIX: where Airlock's topics are;
 * - AIRLOCK_TEST_SCHEMA_REGISTRY: the registry's Confluent API (Airlock's schemas registered
 *   there by `airlock topics create`, and the processor running with it);
 * - AIRLOCK_TEST_PROPOSAL_SCHEMA_ID: the id the registry gave the ToolProposal schema.
 *
 * Skipped unless AIRLOCK_TEST_SCHEMA_REGISTRY is set. The Rust test then checks that every
 * proposal on the topic is Confluent-framed with that id.
 */

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { describe, test } from "node:test";

import { Client, Refused, RegistryError, SchemaRegistry, type ProposalCall } from "../../src/index.js";

const BROKERS = process.env["AIRLOCK_TEST_BROKERS"] ?? "";
const PREFIX = process.env["AIRLOCK_TEST_PREFIX"] ?? "airlock.";
const REGISTRY_URL = process.env["AIRLOCK_TEST_SCHEMA_REGISTRY"];
const PROPOSAL_ID = Number(process.env["AIRLOCK_TEST_PROPOSAL_SCHEMA_ID"]);
const RUN = randomBytes(4).toString("hex");

/** Each test is skipped, and counted as skipped, without a registry. */
const live = { skip: !REGISTRY_URL && "AIRLOCK_TEST_SCHEMA_REGISTRY is not set", timeout: 120_000 };

function refund(key: string, minorUnits: number): ProposalCall {
  return {
    tool: "refund",
    operationKey: key,
    arguments: { tenant_id: "acme", account_id: "acct-42", amount: { minor_units: minorUnits, currency: "EUR" } },
    tenant: "acme",
    principal: "agent-support-1",
    runId: `run-${RUN}`,
    logicalCallId: key,
  };
}

describe("a live Airlock with a schema registry", () => {
  test("the id is looked up under the topic's subject", live, async () => {
    assert.ok(Number.isInteger(PROPOSAL_ID), "AIRLOCK_TEST_PROPOSAL_SCHEMA_ID is set");
    assert.equal(await new SchemaRegistry(REGISTRY_URL!).schemaId(`${PREFIX}proposals-value`, "ToolProposal"), PROPOSAL_ID);
  });

  test("a missing subject is refused unless registering", live, async () => {
    const registry = new SchemaRegistry(REGISTRY_URL!);
    const subject = `${PREFIX}ts-${RUN}-value`;
    await assert.rejects(
      registry.schemaId(subject, "ToolProposal"),
      (e: unknown) => e instanceof RegistryError && e.kind === "not_registered" && e.status === 404 && /is not registered under/.test(e.message),
    );
    const registered = await registry.schemaId(subject, "ToolProposal", { register: true });
    assert.ok(Number.isInteger(registered));
    assert.equal(await new SchemaRegistry(REGISTRY_URL!).schemaId(subject, "ToolProposal"), registered);
    // Registering what the subject holds already adds nothing: the same id.
    assert.equal(await new SchemaRegistry(REGISTRY_URL!).schemaId(subject, "ToolProposal", { register: true }), registered);
  });

  test("a proposal in the Confluent framing is decided", live, async () => {
    const client = await Client.connect(BROKERS, { topicPrefix: PREFIX, schemaRegistryUrl: REGISTRY_URL! });
    try {
      assert.equal(client.schemaId, PROPOSAL_ID);
      const key = `refund:ts-cf-${RUN}`;
      const call = refund(key, 1250);
      const first = await client.propose(call);
      assert.deepEqual([first.verdict, first.reason], ["ACCEPTED", "AUTO_APPROVED"], JSON.stringify(first));
      assert.equal(first.earlier, false);
      // The processor read the arguments out of the Confluent datum: its hash is the client's.
      assert.equal(first.argumentsHash, client.proposal(call).arguments_hash);
      assert.equal(first.inReplyTo, client.proposal(call).proposal_id);

      // The same proposal again: answered from before, not published again.
      const again = await client.propose(call);
      assert.ok(again.earlier && again.decisionId === first.decisionId, JSON.stringify(again));

      // Other arguments under the key: a CONFLICT, decided from the Confluent datum too.
      await assert.rejects(
        client.propose(refund(key, 1251)),
        (e: unknown) => e instanceof Refused && e.decision.verdict === "CONFLICT" && e.decision.operationKey === key,
      );
    } finally {
      await client.close();
    }
  });

  test("registerSchema with the subject registered already uses its id", live, async () => {
    const client = await Client.connect(BROKERS, { topicPrefix: PREFIX, schemaRegistryUrl: REGISTRY_URL!, registerSchema: true });
    try {
      assert.equal(client.schemaId, PROPOSAL_ID);
      const decision = await client.propose(refund(`refund:ts-cf-${RUN}-2`, 700));
      assert.deepEqual([decision.verdict, decision.reason], ["ACCEPTED", "AUTO_APPROVED"], JSON.stringify(decision));
    } finally {
      await client.close();
    }
  });
});
