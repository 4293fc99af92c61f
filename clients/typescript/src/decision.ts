/** Decisions and settlements as the client hands them back. */

/** Verdicts of a proposal that are not refusals. */
export const NOT_REFUSED: readonly string[] = ["ACCEPTED", "PENDING_APPROVAL", "DUPLICATE", "IN_PROGRESS"];
/** Verdicts that say how an effect ended (UNKNOWN: not yet known; it is reconciled). */
export const SETTLING: readonly string[] = ["COMMITTED", "FAILED", "UNKNOWN", "EXPIRED", "CANCELLED"];
/** Of those, the ones after which nothing changes for the attempt. */
export const FINAL: readonly string[] = ["COMMITTED", "FAILED", "EXPIRED", "CANCELLED"];
/** The verdict each connector outcome kind settles an attempt with. */
export const SETTLED_BY: Readonly<Record<string, string>> = {
  COMMITTED: "COMMITTED",
  RECONCILED_COMMITTED: "COMMITTED",
  FAILED: "FAILED",
  RECONCILED_FAILED: "FAILED",
};

/** One answer of the processor, as read from the decisions topic. */
export interface Decision {
  readonly decisionId: string;
  readonly inReplyTo: string;
  readonly operationKey: string;
  readonly verdict: string;
  readonly reason: string;
  readonly detail: string;
  readonly state: string | null;
  readonly epoch: number | null;
  readonly argumentsHash: string | null;
  readonly receipt: string | null;
  /** Epoch milliseconds. */
  readonly decidedAt: number;
  readonly partition: number;
  readonly offset: number;
  /** True when the answer was there before this call published anything. */
  readonly earlier: boolean;
  /** The Decision record as decoded (snake_case fields, as in the Avro schema). */
  readonly raw: Readonly<Record<string, unknown>>;
}

export function decisionOf(value: Record<string, unknown>, partition: number, offset: number): Decision {
  const optional = <T>(v: unknown): T | null => (v === undefined || v === null ? null : (v as T));
  return Object.freeze({
    decisionId: value["decision_id"] as string,
    inReplyTo: value["in_reply_to"] as string,
    operationKey: value["operation_key"] as string,
    verdict: value["verdict"] as string,
    reason: value["reason"] as string,
    detail: value["detail"] as string,
    state: optional<string>(value["state"]),
    epoch: optional<number>(value["epoch"]),
    argumentsHash: optional<string>(value["arguments_hash"]),
    receipt: optional<string>(value["receipt"]),
    decidedAt: value["decided_at"] as number,
    partition,
    offset,
    earlier: false,
    raw: Object.freeze({ ...value }),
  });
}

/**
 * How an effect ended, or that it is not known yet (`final` false: UNKNOWN, under
 * reconciliation; do not retry it). `result` is what the connector reported (its evidence),
 * when read: data from the downstream system, not to be trusted as instructions.
 */
export interface Settlement {
  readonly decision: Decision;
  readonly final: boolean;
  readonly result: string | null;
}
