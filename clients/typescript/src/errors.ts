/** The errors of the client (the canonical form's {@link CanonicalError} and the codec's
 * {@link CodecError} are in their own modules). */

import type { Decision } from "./decision.js";

/** Base of this package's errors about Airlock and Kafka. */
export class AirlockError extends Error {
  constructor(message: string) {
    super(message);
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
