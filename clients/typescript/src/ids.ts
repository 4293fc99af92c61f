/** Ids derived from content, as Airlock's processor and `airlock propose` derive them. */

import { createHash } from "node:crypto";

import { utf8 } from "./utf8.js";

function lengthPrefixed(data: Buffer): Buffer {
  const length = Buffer.alloc(8);
  length.writeBigUInt64BE(BigInt(data.length));
  return length;
}

/**
 * An id derived from `parts` (each length-prefixed), as `airlock propose` derives a proposal
 * id: the same proposal gets the same id, so sending it again is a resend.
 */
export function contentId(namespace: string, parts: readonly string[]): string {
  const h = createHash("sha256");
  for (const part of parts) {
    const data = utf8(part, "an id part");
    h.update(lengthPrefixed(data));
    h.update(data);
  }
  return `${namespace}/${h.digest("hex").slice(0, 32)}`;
}

/**
 * The id a proposal that names none gets: `contentId("propose", parts)` over the operation
 * key, tool, tool version, arguments hash, tenant, principal, run id and logical call id, under
 * the tenant's prefix (`acme/propose/...`) when `operationKey` has it, as a processor with
 * `key_scope = "tenant"` asks of every id of a tenant.
 */
export function deriveProposalId(tenant: string, operationKey: string, parts: readonly string[]): string {
  const derived = contentId("propose", parts);
  return tenant !== "" && operationKey.startsWith(`${tenant}/`) ? `${tenant}/${derived}` : derived;
}

/** The fields of a proposal that name it. */
export const PROPOSAL_IDENTITY = [
  "tenant_id",
  "principal_id",
  "operation_key",
  "tool",
  "tool_version",
  "run_id",
  "arguments_json",
] as const;

/**
 * What the processor names a proposal by when another proposal reused its id (the
 * `r/<id>/<fingerprint>` refusal): 128 bits of SHA-256 over its identity.
 */
export function proposalFingerprint(proposal: Readonly<Record<string, unknown>>): string {
  const h = createHash("sha256").update(Buffer.from("airlock/proposal/v1\0", "utf8"));
  for (const name of PROPOSAL_IDENTITY) {
    const value = proposal[name];
    if (typeof value !== "string") {
      throw new TypeError(`a proposal's ${name} is a string, not ${typeof value}`);
    }
    const data = utf8(value, name);
    h.update(lengthPrefixed(data));
    h.update(data);
  }
  return h.digest("hex").slice(0, 32);
}
