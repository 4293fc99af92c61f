/**
 * Publishing proposals to Airlock and waiting for its answers.
 *
 * A {@link Client} owns one Kafka producer and one background reader. The reader reads the
 * decisions (and outcomes) partitions of the operation keys this client asked about, each
 * from its start (the owner-epoch fence needs every marker), then follows them; it keeps a
 * bounded index of the answers it read. A call waits only on that index, so many concurrent
 * calls can share one client, and many processes can publish for the same keys at once: an
 * answer is matched to a proposal by its id, and the id is derived from the proposal's
 * content.
 *
 * Every wait is bounded by a timeout; a partition is read from its start once per client, so
 * keep clients long-lived.
 */

import {
  Consumer,
  FetchIsolationLevels,
  ProduceAcks,
  Producer,
  UserError,
  type ClusterMetadata,
  type ProduceResult,
} from "@platformatic/kafka";

import type { ConnectionOptions as TlsOptions } from "node:tls";

import { viaCallback } from "./callback.js";
import { canonicalize, toJsonText } from "./canonical.js";
import * as codec from "./codec.js";
import { FINAL, NOT_REFUSED, SETTLING, type Decision, type Settlement } from "./decision.js";
import { AirlockError, BrokerUnavailable, Refused, RegistryError, TimedOut } from "./errors.js";
import { MarkerVerifier } from "./fence.js";
import { contentId, deriveProposalId, proposalFingerprint } from "./ids.js";
import { partitionFor } from "./partitioner.js";
import { evidenceKey, Reader, STOP_WAIT_MS, Waiter } from "./reader.js";
import { SchemaRegistry, topicSubject } from "./registry.js";
import { pause, timer, within } from "./timers.js";
import { utf8 } from "./utf8.js";

/** The ToolProposal record (fields as in the Avro schema; timestamps in epoch ms). */
export interface ToolProposal {
  proposal_id: string;
  operation_key: string;
  run_id: string;
  logical_call_id: string;
  provider_call_id: string | null;
  tenant_id: string;
  principal_id: string;
  tool: string;
  tool_version: string;
  arguments_json: string;
  arguments_hash: string | null;
  lease_owner: string;
  lease_fence: number;
  deadline_at: number;
  proposed_at: number;
}

/** One tool call to propose. */
export interface ProposalCall {
  tool: string;
  /** The identity of the side effect: the key Airlock deduplicates and gates on. */
  operationKey: string;
  /** A JSON text (string or UTF-8 bytes), or a value written as JSON (see `toJsonText`). It
   * must have a canonical form ({@link CanonicalError} if not). */
  arguments: unknown;
  tenant: string;
  principal: string;
  runId: string;
  logicalCallId: string;
  /** Default "1". */
  toolVersion?: string;
  /** Default: the run id. */
  leaseOwner?: string;
  /** Default 1. */
  leaseFence?: number;
  /** Default 3600. */
  deadlineSeconds?: number;
  providerCallId?: string | null;
  /** Default: derived from the call's content, so that a resend is the same proposal. */
  proposalId?: string;
  /** Default: now. */
  nowMs?: number;
}

export interface ProposeOptions {
  /** Default 60 000. */
  timeoutMs?: number;
}

export interface WaitSettledOptions {
  /** The attempt to wait for (default: the latest). */
  epoch?: number;
  /** Wait past UNKNOWN for a final verdict (default false). */
  final?: boolean;
  /** Default 300 000. */
  timeoutMs?: number;
}

/**
 * Kafka settings for both the producer and the reader, passed to @platformatic/kafka's
 * clients (declared here so that this package's types do not depend on that library's).
 */
export interface KafkaOptions {
  clientId?: string;
  /** TLS (node:tls options); `{}` for TLS with the system's CAs. */
  tls?: TlsOptions;
  tlsServerName?: string | boolean;
  sasl?: {
    mechanism: "PLAIN" | "SCRAM-SHA-256" | "SCRAM-SHA-512" | "OAUTHBEARER";
    username?: string;
    password?: string;
    token?: string;
  };
  /** Milliseconds. */
  connectTimeout?: number;
  /** Milliseconds. */
  requestTimeout?: number;
  /** Milliseconds per request. */
  timeout?: number;
  retries?: number;
  /** Milliseconds. */
  retryDelay?: number;
  /** Milliseconds. */
  metadataMaxAge?: number;
}

export interface ClientOptions {
  /** Airlock's `topics.prefix`. Default "airlock.". */
  topicPrefix?: string;
  /** The topics' partition count (read from the broker when not given). */
  partitions?: number;
  /** Extra settings of the Kafka connections. */
  kafka?: KafkaOptions;
  /** How many operation keys' answers the reader keeps in memory. Default 100 000. */
  capacity?: number;
  /** Publish in the Confluent wire format with this registry id of the ToolProposal schema
   * instead of Avro single-object encoding. Not with `schemaRegistryUrl`. */
  schemaId?: number;
  /** Publish in the Confluent wire format with the id a Confluent-compatible schema registry
   * at this URL (`http:` or `https:`; Apicurio's is `.../apis/ccompat/v7`) gives the
   * ToolProposal schema under the subject `<topicPrefix>proposals-value`, looked up once, in
   * `connect` (the processor must run with the same `schema_registry.url`). A
   * `RegistryError` when the registry is unreachable or lacks the schema. Not with
   * `schemaId`. The Decision and Outcome schemas' ids are looked up too, so that decisions a
   * processor writes in the Confluent framing (`schema_registry.framing = "confluent"`) are
   * read. */
  schemaRegistryUrl?: string;
  /** With `schemaRegistryUrl`: register the schema when the subject lacks it (`airlock topics
   * create` normally does). Default false. */
  registerSchema?: boolean;
  /** How long to wait for the topics' metadata at start. Default 30 000. */
  timeoutMs?: number;
  /** The processor's capability verifying keys (paths of the `.pub` files `airlock keygen`
   * writes, or 32 key bytes; several during a rotation). With them, a fence marker raises the
   * reader's fence only when its signature verifies. */
  verifyingKeys?: Array<string | Uint8Array>;
  /** Where warnings go (a forged fence marker). Default: `console.warn`. */
  onWarning?: (message: string) => void;
}

/**
 * The ToolProposal record for a call, as {@link Client.propose} sends it: the canonical
 * arguments and their hash, and (unless given) the id derived from the call's content, the
 * same derivation as `airlock propose`. The arguments must have a canonical form
 * ({@link CanonicalError} if not).
 */
export function buildProposal(call: ProposalCall): ToolProposal {
  const args = call.arguments;
  // The canonical text goes on the wire: the processor tells a resend from a reuse of the
  // id by the raw text, so two processes that build the same arguments in another key
  // order must send the same bytes.
  const canonical =
    typeof args === "string" || args instanceof Uint8Array ? canonicalize(args) : canonicalize(toJsonText(args));
  const toolVersion = call.toolVersion ?? "1";
  const proposalId =
    call.proposalId ??
    deriveProposalId(call.tenant, call.operationKey, [
      call.operationKey,
      call.tool,
      toolVersion,
      canonical.hash,
      call.tenant,
      call.principal,
      call.runId,
      call.logicalCallId,
    ]);
  const now = call.nowMs ?? Date.now();
  return {
    proposal_id: proposalId,
    operation_key: call.operationKey,
    run_id: call.runId,
    logical_call_id: call.logicalCallId,
    provider_call_id: call.providerCallId ?? null,
    tenant_id: call.tenant,
    principal_id: call.principal,
    tool: call.tool,
    tool_version: toolVersion,
    arguments_json: canonical.json,
    arguments_hash: canonical.hash,
    lease_owner: call.leaseOwner ?? call.runId,
    lease_fence: call.leaseFence ?? 1,
    deadline_at: now + Math.trunc((call.deadlineSeconds ?? 3600) * 1000),
    proposed_at: now,
  };
}

function brokerList(bootstrapServers: string | readonly string[]): string[] {
  const list = typeof bootstrapServers === "string" ? bootstrapServers.split(",") : [...bootstrapServers];
  const brokers = list.map((b) => b.trim()).filter((b) => b.length > 0);
  if (brokers.length === 0) {
    throw new AirlockError("no Kafka broker given");
  }
  return brokers;
}

function message(e: unknown): string {
  return e instanceof Error ? e.message : String(e);
}

/** A client of one Airlock deployment. Make one with {@link Client.connect}; keep it for the
 * life of the process; {@link Client.close} it at the end. */
export class Client {
  readonly proposals: string;
  readonly decisions: string;
  readonly outcomes: string;
  readonly control: string;
  readonly schemaId: number | null;
  #partitions: number;
  readonly #producer: Producer;
  readonly #consumer: Consumer;
  readonly #reader: Reader;
  #closed: Promise<void> | null = null;

  private constructor(
    bootstrapServers: string | readonly string[],
    options: ClientOptions,
    schemaIds: codec.SchemaIds | null = null,
  ) {
    const brokers = brokerList(bootstrapServers);
    const prefix = options.topicPrefix ?? "airlock.";
    this.proposals = `${prefix}proposals`;
    this.decisions = `${prefix}decisions`;
    this.outcomes = `${prefix}outcomes`;
    this.control = `${prefix}control`;
    this.schemaId = options.schemaId ?? null;
    if (this.schemaId !== null && !codec.isSchemaId(this.schemaId)) {
      throw new RangeError(`schemaId is not a Confluent schema id (an unsigned 32-bit integer): ${this.schemaId}`);
    }
    this.#partitions = options.partitions ?? 0;
    const verify = options.verifyingKeys?.length ? new MarkerVerifier(options.verifyingKeys).function : null;
    const kafka = (options.kafka ?? {}) as Record<string, unknown>;
    this.#producer = new Producer({
      clientId: "airlock-client",
      ...kafka,
      bootstrapBrokers: brokers,
      idempotent: true,
      acks: ProduceAcks.ALL,
      autocreateTopics: false,
    });
    this.#consumer = new Consumer({
      clientId: "airlock-client-reader",
      ...kafka,
      bootstrapBrokers: brokers,
      // Named for the broker's logs only: the reader never joins the group nor commits.
      groupId: `${prefix}client`,
      autocommit: false,
      isolationLevel: FetchIsolationLevels.READ_COMMITTED,
      autocreateTopics: false,
    });
    this.#reader = new Reader(this.#consumer, {
      decisions: this.decisions,
      outcomes: this.outcomes,
      capacity: options.capacity ?? 100_000,
      verify,
      warn: options.onWarning ?? ((m) => console.warn(`airlock-client: ${m}`)),
      schemaIds,
    });
  }

  /**
   * A client of the Airlock deployment at `bootstrapServers` (`host:port,...` or a list):
   * reads the topics' partition count unless `partitions` is given (an {@link AirlockError}
   * when the topics are missing or not co-partitioned, {@link BrokerUnavailable} when the
   * broker does not answer in time), then starts the reader. With `schemaRegistryUrl`, first
   * looks the ToolProposal schema's id up in the registry, and the Decision and Outcome
   * schemas' ids so that decisions written in the Confluent framing are read (a
   * `RegistryError` if that fails; bounded by `timeoutMs`, at most 10 s per call).
   */
  static async connect(bootstrapServers: string | readonly string[], options: ClientOptions = {}): Promise<Client> {
    const schemaIds = new Map<number, readonly [string, number]>();
    if (options.schemaRegistryUrl) {
      if (options.schemaId !== undefined && options.schemaId !== null) {
        throw new TypeError("give schemaId or schemaRegistryUrl, not both");
      }
      const timeoutMs = options.timeoutMs ?? 30_000;
      const registry = new SchemaRegistry(options.schemaRegistryUrl, {
        // No time at all (0, negative, NaN) is the shortest wait, as for the metadata.
        timeoutMs: timeoutMs > 0 ? Math.min(timeoutMs, 10_000) : 1,
      });
      const prefix = options.topicPrefix ?? "airlock.";
      const schemaId = await registry.schemaId(topicSubject(`${prefix}proposals`), "ToolProposal", {
        register: options.registerSchema ?? false,
      });
      options = { ...options, schemaId };
      // What the processor and the connector workers may write in the Confluent framing.
      // A registry without them (an older Airlock registered its schemas) is no reason not to
      // start: answers written single-object are read all the same.
      const warn = options.onWarning ?? ((m: string) => console.warn(`airlock-client: ${m}`));
      for (const [topic, record] of [
        [`${prefix}decisions`, "Decision"],
        [`${prefix}outcomes`, "Outcome"],
      ] as const) {
        try {
          schemaIds.set(await registry.schemaId(topicSubject(topic), record), [record, codec.currentVersion(record)]);
        } catch (e) {
          if (!(e instanceof RegistryError)) {
            throw e;
          }
          warn(`answers in the Confluent framing will not be read: ${e.message}`);
        }
      }
    }
    const client = new Client(bootstrapServers, options, schemaIds);
    try {
      if (client.#partitions <= 0) {
        client.#partitions = await client.#partitionCount(options.timeoutMs ?? 30_000);
      }
    } catch (e) {
      await client.close();
      throw e;
    }
    client.#reader.start();
    return client;
  }

  async #partitionCount(timeoutMs: number): Promise<number> {
    const topics = [this.proposals, this.decisions, this.outcomes];
    let metadata: ClusterMetadata;
    try {
      // Asked through the reader's connection: the idempotent producer's metadata call waits
      // far longer before it reports a missing topic.
      const asked = viaCallback<ClusterMetadata>((cb) => this.#consumer.metadata({ topics: [...topics] }, cb));
      asked.catch(() => undefined);
      metadata = await within(asked, timeoutMs, () => {
        return new BrokerUnavailable(`reading the topics' metadata took over ${timeoutMs} ms`);
      });
    } catch (e) {
      if (e instanceof UserError && /Unknown topic/.test(e.message)) {
        throw new AirlockError(
          `${e.message} (is \`airlock topics create\` done, and the prefix right?)`,
        );
      }
      if (e instanceof AirlockError) {
        throw e;
      }
      throw new BrokerUnavailable(`reading the topics' metadata: ${message(e)}`);
    }
    const counts: Record<string, number> = {};
    for (const topic of topics) {
      const found = metadata.topics.get(topic);
      if (found === undefined) {
        throw new AirlockError(
          `topic ${topic} not found (is \`airlock topics create\` done, and the prefix right?)`,
        );
      }
      counts[topic] = found.partitionsCount;
    }
    if (new Set(Object.values(counts)).size !== 1) {
      throw new AirlockError(`Airlock's topics are not co-partitioned: ${JSON.stringify(counts)}`);
    }
    return counts[this.proposals]!;
  }

  /** The owner-epoch fence the reader has read on `topic`'s `partition` so far: the highest
   * fence marker that counted (0 before any). */
  fenceOf(topic: string, partition: number): bigint {
    return this.#reader.fence.fence(topic, partition);
  }

  /** The topics' partition count. */
  get partitions(): number {
    return this.#partitions;
  }

  /** Stops the reader (every wait still open fails with {@link BrokerUnavailable} at once)
   * and closes the Kafka connections, waiting at most 10 seconds for them. */
  close(): Promise<void> {
    this.#closed ??= (async () => {
      const closed = Promise.allSettled([
        this.#reader.stop(STOP_WAIT_MS),
        viaCallback<void>((cb) => this.#producer.close(false, cb)),
      ]);
      await new Promise<void>((resolve) => {
        const cancel = timer(STOP_WAIT_MS, resolve);
        void closed.then(() => {
          cancel();
          resolve();
        });
      });
    })();
    return this.#closed;
  }

  /** The partition of `operationKey` on every Airlock topic. */
  partition(operationKey: string): number {
    return partitionFor(utf8(operationKey, "the operation key"), this.#partitions);
  }

  /** The ToolProposal record for a call, without sending it (see {@link buildProposal}). */
  proposal(call: ProposalCall): ToolProposal {
    return buildProposal(call);
  }

  /**
   * Publishes a tool proposal and returns the processor's answer: ACCEPTED (dispatched),
   * PENDING_APPROVAL, DUPLICATE or IN_PROGRESS (an earlier proposal of the key). Rejects with
   * {@link Refused} (carrying the decision) for any other answer, {@link TimedOut},
   * {@link BrokerUnavailable}, or {@link CanonicalError} before anything is sent.
   *
   * A proposal answered before (the same content, so the same id) is not published again:
   * its earlier answer is returned with `earlier` set.
   */
  async propose(call: ProposalCall, options: ProposeOptions = {}): Promise<Decision> {
    return this.send(this.proposal(call), options);
  }

  /** {@link Client.propose} for a proposal record built already. */
  async send(proposal: ToolProposal, options: ProposeOptions = {}): Promise<Decision> {
    const deadline = deadlineAfter(options.timeoutMs ?? 60_000);
    const key = proposal.operation_key;
    const pid = proposal.proposal_id;
    const ours = `r/${pid}/${proposalFingerprint(proposal as unknown as Record<string, unknown>)}`;
    const partition = this.partition(key);
    const payload = codec.encode("ToolProposal", proposal as unknown as Record<string, unknown>, this.schemaId);
    this.#checkOpen();
    await this.#reader.follow(this.decisions, partition, left(deadline));

    // The proposal's own answer: `p/<id>`, `x/...` (refused before it was decided), or the
    // refusal of this very content as a reuse of the id. Not a later settlement of its intent
    // (`e/...` replies to the proposal too), nor the refusal of another proposal that reused
    // the id.
    const wants = (d: Decision): boolean =>
      d.inReplyTo === pid &&
      d.partition === partition &&
      d.operationKey === key &&
      (d.decisionId === `p/${pid}` || d.decisionId.startsWith("x/") || d.decisionId === ours);
    const waiter = new Waiter(this.decisions, partition, wants);
    const earlier = (): Decision | null => {
      const replies = this.#reader.replies.get(pid) ?? [];
      for (let i = replies.length - 1; i >= 0; i--) {
        const d = replies[i]!;
        if (wants(d)) {
          return Object.freeze({ ...d, earlier: true });
        }
      }
      return null;
    };
    const answer = this.#reader.wait(waiter, earlier);
    try {
      if (!waiter.done) {
        await this.#produce(this.proposals, partition, key, payload, deadline);
      }
    } catch (e) {
      this.#reader.forget(waiter);
      throw e;
    }
    const decision = await this.#await(answer, waiter, deadline, `the answer to ${pid}`);
    if (!NOT_REFUSED.includes(decision.verdict)) {
      throw new Refused(decision);
    }
    return decision;
  }

  /**
   * Raises `runId`'s lease fence to `fence` on every partition, as `airlock runs fence` does,
   * and returns each partition's answer once every partition has recorded it.
   *
   * A proposal raises its run's fence only on its own partition; a new owner of a run calls
   * this before the run's first new proposal, so that every partition refuses the old owner's
   * proposals (STALE_FENCE) wherever their keys land. `operator`: the principal raising it
   * (journaled). Always published, also when the same fence was raised before (a newer owner
   * may have raised it since). Rejects with {@link Refused} carrying a partition's refusal
   * (STALE_FENCE: a newer owner fenced the run higher) after every partition answered,
   * {@link TimedOut} when one does not answer in time, {@link BrokerUnavailable}. The record
   * leaves unsigned: a processor that requires `operator`'s signature refuses it (use `airlock
   * runs fence --signing-key`).
   */
  async fenceRun(runId: string, fence: number, operator: string, options: ProposeOptions = {}): Promise<Map<number, Decision>> {
    if (!Number.isSafeInteger(fence) || fence < 0) {
      throw new RangeError(`fence must be a non-negative integer: ${fence}`);
    }
    const deadline = deadlineAfter(options.timeoutMs ?? 60_000);
    const controlId = contentId("fence", [runId, String(fence), operator]);
    const payload = codec.encode("Control", {
      control_id: controlId,
      kind: "LEASE_FENCE",
      operation_key: null,
      run_id: runId,
      lease_fence: fence,
      operator_id: operator,
      evidence: null,
      issued_at: Date.now(),
    });
    this.#checkOpen();
    const pending: [number, Promise<Decision>, Waiter][] = [];
    try {
      for (let partition = 0; partition < this.#partitions; partition++) {
        await this.#reader.follow(this.decisions, partition, left(deadline));
        const waiter = new Waiter(
          this.decisions,
          partition,
          // The processor's answer to this control (`c/<id>`, or `x/...` when it was
          // dead-lettered), not the refusal of another record naming its id.
          (d: Decision) =>
            d.inReplyTo === controlId &&
            d.partition === partition &&
            (d.decisionId === `c/${controlId}` || d.decisionId.startsWith("x/")),
        );
        // Only an answer read from now on: an earlier one to the same fence proves nothing.
        pending.push([partition, this.#reader.wait(waiter, () => null), waiter]);
        await this.#produce(this.control, partition, runId, payload, deadline);
      }
      const answers = new Map<number, Decision>();
      for (const [partition, answer, waiter] of pending) {
        answers.set(partition, await this.#await(answer, waiter, deadline, `partition ${partition}'s answer to ${controlId}`));
      }
      for (const decision of answers.values()) {
        if (decision.reason !== "FENCE_ADVANCED") {
          throw new Refused(decision);
        }
      }
      return answers;
    } finally {
      for (const [, , waiter] of pending) {
        this.#reader.forget(waiter);
      }
    }
  }

  /**
   * The latest decision about `answer`'s operation key after it (an approval's dispatch, an
   * approval rejected or expired, a settlement: these reply to the intent's first proposal,
   * whichever proposal this was), from what the reader has read; `answer` itself when nothing
   * came after it.
   */
  latestReply(answer: Decision): Decision {
    const replies = this.#reader.byKey.get(answer.operationKey) ?? [];
    const later = replies.filter(
      (d) =>
        d.partition === answer.partition &&
        d.operationKey === answer.operationKey &&
        d.offset > answer.offset &&
        !d.decisionId.startsWith("r/"),
    );
    return later.length > 0 ? later[later.length - 1]! : answer;
  }

  /**
   * Waits for how the effect of `operationKey` ended (of attempt `epoch` when given, else its
   * latest): COMMITTED, FAILED, EXPIRED or CANCELLED, or UNKNOWN (not `final`: reconciliation
   * is under way, do not retry) unless `final` asks to wait past it. Returns at once when it
   * is known already.
   */
  async waitSettled(operationKey: string, options: WaitSettledOptions = {}): Promise<Settlement> {
    const deadline = deadlineAfter(options.timeoutMs ?? 300_000);
    const epoch = options.epoch;
    const partition = this.partition(operationKey);
    this.#checkOpen();
    await this.#reader.follow(this.decisions, partition, left(deadline));
    await this.#reader.follow(this.outcomes, partition, left(deadline));
    const wanted = options.final ? FINAL : SETTLING;
    const wants = (d: Decision): boolean =>
      d.operationKey === operationKey &&
      wanted.includes(d.verdict) &&
      (epoch === undefined || d.epoch === epoch);
    const known = (): Decision | null => {
      const replies = this.#reader.byKey.get(operationKey) ?? [];
      for (let i = replies.length - 1; i >= 0; i--) {
        if (wants(replies[i]!)) {
          return replies[i]!;
        }
      }
      return null;
    };
    const waiter = new Waiter(this.decisions, partition, wants);
    const decision = await this.#await(
      this.#reader.wait(waiter, known),
      waiter,
      deadline,
      `the outcome of ${operationKey}`,
    );
    let result: string | null = null;
    if (decision.epoch !== null && (decision.verdict === "COMMITTED" || decision.verdict === "FAILED")) {
      // The connector's outcome precedes the decision on the topics, but the reader may meet
      // the two partitions in either order: give the outcome a moment.
      const until = Math.min(deadline, Date.now() + 5_000);
      const key = evidenceKey(operationKey, decision.epoch, decision.verdict);
      for (;;) {
        result = this.#reader.evidence.get(key) ?? null;
        if (result !== null || Date.now() >= until) {
          break;
        }
        await pause(50);
      }
    }
    return Object.freeze({ decision, final: FINAL.includes(decision.verdict), result });
  }

  #checkOpen(): void {
    if (this.#closed !== null) {
      throw new BrokerUnavailable("the client is closed");
    }
  }

  async #await(answer: Promise<Decision>, waiter: Waiter, deadline: number, what: string): Promise<Decision> {
    try {
      return await within(answer, left(deadline), () => {
        const unreadable = this.#reader.unreadable.get(`${waiter.topic}\u0000${waiter.partition}`);
        const problem = this.#reader.lastProblem;
        let hint = "";
        if (unreadable) {
          hint +=
            `; decisions on ${waiter.topic} partition ${waiter.partition} this client cannot read ` +
            `(a newer Airlock? upgrade the client): ${unreadable}`;
        }
        if (problem !== null) {
          hint += `; the answer reader's last error (is the broker up?): ${problem}`;
        }
        if (hint === "") {
          hint = " (is `airlock run` up?)";
        }
        return new TimedOut(`no answer for ${what} in time${hint}; sending the same proposal again is safe`);
      });
    } finally {
      this.#reader.forget(waiter);
    }
  }

  async #produce(topic: string, partition: number, key: string, payload: Buffer, deadline: number): Promise<void> {
    const sent = viaCallback<ProduceResult>((cb) =>
      this.#producer.send({ messages: [{ topic, partition, key: utf8(key, "the operation key"), value: payload }] }, cb),
    );
    // Rejections after the deadline must not surface as unhandled.
    sent.catch(() => undefined);
    try {
      await within(sent, left(deadline), () => {
        return new BrokerUnavailable(`producing to ${topic}: not acknowledged in time`);
      });
    } catch (e) {
      if (e instanceof BrokerUnavailable) {
        throw e;
      }
      throw new BrokerUnavailable(`producing to ${topic}: ${message(e)}`);
    }
  }
}

/** The deadline of a wait of `timeoutMs` from now: `Infinity` waits without limit; a negative
 * timeout or NaN gives no time at all (as in the Python client). */
function deadlineAfter(timeoutMs: number): number {
  return Date.now() + (timeoutMs > 0 ? timeoutMs : 0);
}

function left(deadline: number): number {
  return Math.max(0, deadline - Date.now());
}

