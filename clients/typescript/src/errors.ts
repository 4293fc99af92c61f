/** The errors of the client (the canonical form's {@link CanonicalError} and the codec's
 * {@link CodecError} are in their own modules). */

import type { Decision } from "./decision.js";

/** Base of this package's errors about Airlock and Kafka. */
export class AirlockError extends Error {
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = new.target.name;
  }
}

/** The processor refused the proposal; `decision` says why (`reason`, `detail`). */
export class Refused extends AirlockError {
  readonly decision: Decision;

  constructor(decision: Decision) {
    super(`${decision.operationKey}: ${decision.verdict} ${decision.reason}: ${decision.detail}`);
    this.decision = decision;
  }
}

/** No answer within the timeout. Sending the same proposal again is safe. */
export class TimedOut extends AirlockError {}

/** Kafka did not take the record or answer the reader in time (or the client is closed). */
export class BrokerUnavailable extends AirlockError {}

/** What went wrong with the schema registry: it did not answer in time or at all
 * (`unreachable`), the subject lacks the schema (`not_registered`), it refused to register the
 * schema as incompatible (`incompatible`, HTTP 409), another HTTP status (`http`), or an
 * answer without a usable schema id (`malformed`). */
export type RegistryErrorKind = "unreachable" | "not_registered" | "incompatible" | "http" | "malformed";

/** The schema registry is unreachable, refuses a schema, or lacks the subject. `status` is the
 * registry's HTTP status when it answered (null when it did not). */
export class RegistryError extends AirlockError {
  readonly kind: RegistryErrorKind;
  readonly status: number | null;

  constructor(kind: RegistryErrorKind, message: string, status: number | null = null, options?: ErrorOptions) {
    super(message, options);
    this.kind = kind;
    this.status = status;
  }
}
