/**
 * Airlock's TypeScript client: publish tool proposals, wait for decisions and outcomes.
 *
 * See `README.md` beside this package for the contract it implements.
 */

export {
  CanonicalError,
  MAX_DEPTH,
  MAX_SAFE_INTEGER,
  argumentsHash,
  canonicalJson,
  canonicalize,
  idempotencyKey,
  toJsonText,
  type Canonical,
  type CanonicalErrorKind,
} from "./canonical.js";
export {
  Client,
  buildProposal,
  type ClientOptions,
  type KafkaOptions,
  type ProposalCall,
  type ProposeOptions,
  type ToolProposal,
  type WaitSettledOptions,
} from "./client.js";
export * as codec from "./codec.js";
export { CodecError } from "./codec.js";
export { FINAL, NOT_REFUSED, SETTLING, type Decision, type Settlement } from "./decision.js";
export { AirlockError, BrokerUnavailable, Refused, RegistryError, TimedOut, type RegistryErrorKind } from "./errors.js";
export {
  FenceFilter,
  MarkerVerifier,
  fenceMessage,
  loadVerifyingKey,
  type Admit,
  type Header,
  type Verify,
} from "./fence.js";
export { contentId, deriveProposalId, proposalFingerprint } from "./ids.js";
export { murmur2, partitionFor } from "./partitioner.js";
export {
  SchemaRegistry,
  topicSubject,
  type SchemaIdOptions,
  type SchemaRegistryOptions,
} from "./registry.js";
export {
  AirlockTools,
  IDEMPOTENCY_ARGUMENT,
  describe,
  describeTool,
  inputSchema,
  loadRegistry,
  refused,
  type AirlockToolsOptions,
  type JsonObject,
  type Pending,
  type RegistryTool,
  type ToolResult,
  type ToolsClient,
} from "./tools.js";
