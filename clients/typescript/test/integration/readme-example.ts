import { Client, Refused } from "@airlock/client";

const airlock = await Client.connect(process.env.AIRLOCK_BROKERS ?? "localhost:9092",
  { topicPrefix: process.env.AIRLOCK_PREFIX ?? "airlock." });
try {
  const decision = await airlock.propose({
    tool: "refund",
    operationKey: "refund:txn_1", // the identity of the side effect
    arguments: { tenant_id: "acme", account_id: "acct-42", amount: { minor_units: 1250, currency: "EUR" } },
    tenant: "acme", principal: "agent-support-1", runId: "run-7", logicalCallId: "step-3",
  });
  console.log(decision.verdict, decision.reason); // ACCEPTED, PENDING_APPROVAL, DUPLICATE, IN_PROGRESS
  const settled = await airlock.waitSettled("refund:txn_1", { timeoutMs: 300_000 });
  console.log(settled.decision.verdict, settled.final, settled.result); // result: untrusted evidence
} catch (e) {
  if (!(e instanceof Refused)) throw e;
  console.log(e.decision.verdict, e.decision.reason, e.decision.detail);
} finally {
  await airlock.close();
}
