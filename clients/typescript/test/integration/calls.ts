/** What the gateway's and the adapters' live tests share: the refund they call, and the
 * report of the operation keys they saw COMMITTED (AIRLOCK_TEST_REPORT, one per line, as
 * live.test.ts writes it: tests/tests/typescript_client.rs checks the ledger holds exactly one
 * effect for each). */

import { appendFileSync } from "node:fs";

/** A refund's arguments, with `airlock_idempotency_key` when `idempotencyKey` is given. */
export function refund(minorUnits: number, idempotencyKey?: string): Record<string, unknown> {
  return {
    tenant_id: "acme",
    account_id: "acct-42",
    amount: { minor_units: minorUnits, currency: "EUR" },
    ...(idempotencyKey === undefined ? {} : { airlock_idempotency_key: idempotencyKey }),
  };
}

export function committed(...keys: string[]): void {
  const report = process.env["AIRLOCK_TEST_REPORT"];
  if (report) {
    appendFileSync(report, keys.map((k) => k + "\n").join(""), "utf8");
  }
}
