/**
 * The client's one background reader: it reads the decisions and outcomes partitions of the
 * operation keys the client asked about, each from its start (the owner-epoch fence needs
 * every marker), then follows them, and keeps a bounded index of the answers it read. It
 * fetches the chosen partitions itself (no consumer group, no committed offsets).
 */

import {
  AuthenticationError,
  Consumer,
  FetchIsolationLevels,
  IS_CONTROL,
  ListOffsetTimestamps,
  type ClusterMetadata,
  type KafkaRecord,
  type fetchV17,
} from "@platformatic/kafka";

type FetchResponse = fetchV17.FetchResponse;

import { viaCallback } from "./callback.js";
import * as codec from "./codec.js";
import { decisionOf, SETTLED_BY, type Decision } from "./decision.js";
import { BrokerUnavailable, TimedOut } from "./errors.js";
import { ACCEPT, FenceFilter, FORGED, isBarrier, type Header, type Verify } from "./fence.js";
import { pause, timer, within } from "./timers.js";

/** Per fetch request: how long the broker may hold it for data, and how much it returns. */
const FETCH_WAIT_MS = 200;
const FETCH_MAX_BYTES = 16 << 20;
const PARTITION_MAX_BYTES = 4 << 20;
/** The pause after a failed round before the next. */
const RETRY_PAUSE_MS = 500;
/** How long {@link Reader.stop} waits for the loop and the consumer's close (as the Python
 * client joins its reader thread). */
export const STOP_WAIT_MS = 10_000;
/** The latest few answers per key are what any caller asks about. */
const PER_KEY = 32;
const OFFSET_OUT_OF_RANGE = 1;

type Deferred<T> = {
  promise: Promise<T>;
  resolve: (value: T) => void;
  reject: (error: Error) => void;
};

function deferred<T>(): Deferred<T> {
  let resolve!: (value: T) => void;
  let reject!: (error: Error) => void;
  const promise = new Promise<T>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

/** Whether `e` (or an error it wraps: the library's MultipleErrors, an AggregateError's
 * `errors`, a `cause`) is a failed authentication or authorization: retrying cannot help. */
export function isAuthFailure(e: unknown): boolean {
  const seen = new Set<unknown>();
  const check = (x: unknown, depth: number): boolean => {
    if (x === null || typeof x !== "object" || seen.has(x) || depth > 16) {
      return false;
    }
    seen.add(x);
    if (x instanceof AuthenticationError) {
      return true;
    }
    const { code, apiId, errors, cause } = x as { code?: unknown; apiId?: unknown; errors?: unknown; cause?: unknown };
    if (code === AuthenticationError.code) {
      return true;
    }
    if (typeof apiId === "string" && (apiId.endsWith("_AUTHORIZATION_FAILED") || AUTH_PROTOCOL_ERRORS.has(apiId))) {
      return true;
    }
    if (Array.isArray(errors) && errors.some((inner) => check(inner, depth + 1))) {
      return true;
    }
    return check(cause, depth + 1);
  };
  return check(e, 0);
}

const AUTH_PROTOCOL_ERRORS = new Set(["SASL_AUTHENTICATION_FAILED", "UNSUPPORTED_SASL_MECHANISM", "ILLEGAL_SASL_STATE"]);

/** An error's message with those of the errors it wraps (each distinct one once). */
export function describe(e: unknown): string {
  if (!(e instanceof Error)) {
    return String(e);
  }
  const inner: string[] = [];
  const seen = new Set<unknown>([e]);
  const walk = (x: unknown, depth: number): void => {
    if (depth > 8) {
      return;
    }
    const { errors, cause } = x as { errors?: unknown; cause?: unknown };
    for (const next of [...(Array.isArray(errors) ? errors : []), cause]) {
      if (next === undefined || next === null || seen.has(next)) {
        continue;
      }
      seen.add(next);
      const text = next instanceof Error ? next.message : String(next);
      if (text && text !== e.message && !inner.includes(text)) {
        inner.push(text);
      }
      walk(next, depth + 1);
    }
  };
  walk(e, 0);
  return inner.length > 0 ? `${e.message} (${inner.join("; ")})` : e.message || String(e);
}

/** An error of the reader's own processing of what it read (not of Kafka): retrying would
 * meet it again. */
class ProcessingFailure extends Error {
  constructor(readonly failure: unknown) {
    super(describe(failure));
  }
}

function id(topic: string, partition: number): string {
  return `${topic}\u0000${partition}`;
}

/** One partition the reader follows. */
class Followed {
  /** The end of the partition when it was first asked for (-1 until it is known). */
  end = -1n;
  position = 0n;
  caughtUp = false;
  error: string | null = null;
  readonly ready = deferred<void>();

  constructor(
    readonly topic: string,
    readonly partition: number,
  ) {}

  markCaughtUp(): void {
    if (!this.caughtUp) {
      this.caughtUp = true;
      this.ready.resolve();
    }
  }
}

/** A call waiting for a decision on one partition. */
export class Waiter {
  readonly answer = deferred<Decision>();
  done = false;

  constructor(
    readonly topic: string,
    readonly partition: number,
    readonly wants: (d: Decision) => boolean,
  ) {
    // A wait that nobody awaits any more (timed out) must not report an unhandled rejection.
    this.answer.promise.catch(() => undefined);
  }

  resolve(d: Decision): void {
    if (!this.done) {
      this.done = true;
      this.answer.resolve(d);
    }
  }

  reject(e: Error): void {
    if (!this.done) {
      this.done = true;
      this.answer.reject(e);
    }
  }
}

export interface ReaderOptions {
  decisions: string;
  outcomes: string;
  capacity: number;
  verify: Verify | null;
  warn: (message: string) => void;
  /** The Confluent ids accepted on decisions and outcomes (a processor with
   * `schema_registry.framing = "confluent"` writes decisions with them). */
  schemaIds?: codec.SchemaIds | null;
}

export class Reader {
  readonly followed = new Map<string, Followed>();
  readonly fence: FenceFilter;
  /** Answers by the id they reply to, decisions by operation key, outcome evidence by
   * (operation key, epoch, verdict). Oldest entries go first. */
  readonly replies = new Map<string, Decision[]>();
  readonly byKey = new Map<string, Decision[]>();
  readonly evidence = new Map<string, string>();
  evicted = false;
  /** Per partition, the last decision this client could not read (explains a timeout). */
  readonly unreadable = new Map<string, string>();
  failure: string | null = null;

  readonly #consumer: Consumer;
  readonly #options: ReaderOptions;
  readonly #waiters = new Set<Waiter>();
  #pending: Followed[] = [];
  #stopped = false;
  /** Resolved when there is something new to do (a partition to follow, or the stop). */
  #wake = deferred<void>();
  readonly #stopSignal = new AbortController();
  #loop: Promise<void> | null = null;
  #lastProblem: string | null = null;

  constructor(consumer: Consumer, options: ReaderOptions) {
    this.#consumer = consumer;
    this.#options = options;
    this.fence = new FenceFilter(options.verify);
    consumer.topics.trackAll(options.decisions, options.outcomes);
  }

  start(): void {
    this.#loop ??= this.#run();
  }

  // -- called by the client's calls ---------------------------------------------------------

  /** Resolves once `topic`'s `partition` has been read up to where it ended when it was first
   * asked for. */
  async follow(topic: string, partition: number, timeoutMs: number): Promise<void> {
    if (this.failure !== null) {
      throw new BrokerUnavailable(this.failure);
    }
    let state = this.followed.get(id(topic, partition));
    if (state === undefined) {
      state = new Followed(topic, partition);
      this.followed.set(id(topic, partition), state);
      this.#pending.push(state);
      this.#wake.resolve();
    }
    const followed = state;
    await within(followed.ready.promise, timeoutMs, () => {
      const why = this.#lastProblem ? `; last problem: ${this.#lastProblem}` : "";
      return new TimedOut(
        `reading ${topic} partition ${partition} up to offset ${followed.end} took over ` +
          `${Math.round(timeoutMs / 1000)}s (is the broker up?)${why}`,
      );
    });
    if (followed.error !== null) {
      throw new BrokerUnavailable(followed.error);
    }
  }

  /** Registers `waiter`, then resolves it at once when `check` finds an answer (in the same
   * turn of the event loop, so no record slips between the two). */
  wait(waiter: Waiter, check: () => Decision | null): Promise<Decision> {
    if (this.failure !== null) {
      throw new BrokerUnavailable(this.failure);
    }
    const found = check();
    if (found !== null) {
      waiter.resolve(found);
    } else {
      this.#waiters.add(waiter);
    }
    return waiter.answer.promise;
  }

  forget(waiter: Waiter): void {
    this.#waiters.delete(waiter);
  }

  /** The error of the reader's last failed round, while its rounds fail (null once one
   * succeeds): why answers do not come. */
  get lastProblem(): string | null {
    return this.#lastProblem;
  }

  /** Fails every wait still open, closes the consumer (which makes the library give up the
   * requests and retries it has under way), and waits for the loop to end: at most
   * `waitMs`. */
  async stop(waitMs: number = STOP_WAIT_MS): Promise<void> {
    this.#stopped = true;
    this.#stopSignal.abort();
    this.#wake.resolve();
    this.#fail("the client is closed");
    const closed = viaCallback<void>((cb) => this.#consumer.close(false, cb));
    const ended = Promise.allSettled([closed, this.#loop ?? Promise.resolve()]);
    await new Promise<void>((resolve) => {
      const cancel = timer(waitMs, resolve);
      void ended.then(() => {
        cancel();
        resolve();
      });
    });
  }

  // -- the loop --------------------------------------------------------------------------------

  async #run(): Promise<void> {
    while (!this.#stopped) {
      try {
        await this.#assignPending();
        const active = [...this.followed.values()].filter((s) => s.end >= 0n && s.error === null);
        if (active.length === 0) {
          await this.#wake.promise;
          this.#wake = deferred<void>();
          continue;
        }
        await this.#fetchRound(active);
        this.#lastProblem = null;
      } catch (e) {
        if (this.#stopped) {
          break;
        }
        if (e instanceof ProcessingFailure) {
          // As in the Python client: the reader must never die silently, nor read the same
          // records again for good.
          this.#fail(`the answer reader stopped: ${e.message}`);
          return;
        }
        if (isAuthFailure(e)) {
          this.#fail(`reading answers: ${describe(e)}`);
          return;
        }
        // Kafka clients retry for good: a broker that comes back is read again.
        this.#lastProblem = describe(e);
        try {
          this.#consumer.clearMetadata();
        } catch {
          // a closed consumer
        }
        await pause(RETRY_PAUSE_MS, this.#stopSignal.signal);
      }
    }
  }

  #fail(why: string): void {
    this.failure ??= why;
    const waiters = [...this.#waiters];
    this.#waiters.clear();
    for (const state of this.followed.values()) {
      state.error ??= why;
      state.markCaughtUp();
    }
    for (const w of waiters) {
      w.reject(new BrokerUnavailable(why));
    }
  }

  async #assignPending(): Promise<void> {
    if (this.#pending.length === 0) {
      return;
    }
    const pending = this.#pending;
    this.#pending = [];
    const partitions: Record<string, number[]> = {};
    for (const s of pending) {
      (partitions[s.topic] ??= []).push(s.partition);
    }
    const topics = Object.keys(partitions);
    let low: Map<string, bigint[]>;
    let high: Map<string, bigint[]>;
    try {
      const list = (timestamp: bigint): Promise<Map<string, bigint[]>> =>
        viaCallback((cb) =>
          this.#consumer.listOffsets(
            { topics: [...topics], partitions, timestamp, isolationLevel: FetchIsolationLevels.READ_COMMITTED },
            cb,
          ),
        );
      low = await list(ListOffsetTimestamps.EARLIEST);
      high = await list(ListOffsetTimestamps.LATEST);
    } catch (e) {
      for (const s of pending) {
        // Asked again by the next call that needs it.
        this.followed.delete(id(s.topic, s.partition));
        s.error = `reading ${s.topic} partition ${s.partition}: ${describe(e)}`;
        s.markCaughtUp();
      }
      return;
    }
    for (const s of pending) {
      const start = low.get(s.topic)?.[s.partition];
      const end = high.get(s.topic)?.[s.partition];
      if (start === undefined || end === undefined) {
        this.followed.delete(id(s.topic, s.partition));
        s.error = `reading ${s.topic} partition ${s.partition}: no such partition`;
        s.markCaughtUp();
        continue;
      }
      s.position = start;
      s.end = end;
      if (end <= start) {
        s.markCaughtUp();
      }
    }
  }

  async #fetchRound(active: Followed[]): Promise<void> {
    const metadata = await viaCallback<ClusterMetadata>((cb) =>
      this.#consumer.metadata({ topics: [this.#options.decisions, this.#options.outcomes] }, cb),
    );
    const byNode = new Map<number, Followed[]>();
    for (const s of active) {
      const leader = metadata.topics.get(s.topic)?.partitions[s.partition]?.leader;
      if (leader === undefined || leader < 0) {
        throw new Error(`no leader for ${s.topic} partition ${s.partition}`);
      }
      const list = byNode.get(leader) ?? [];
      list.push(s);
      byNode.set(leader, list);
    }
    const results = await Promise.allSettled(
      [...byNode].map(([node, states]) => this.#fetchFrom(node, states, metadata)),
    );
    const failed = results.find((r): r is PromiseRejectedResult => r.status === "rejected");
    if (failed !== undefined) {
      throw failed.reason;
    }
  }

  async #fetchFrom(node: number, states: Followed[], metadata: ClusterMetadata): Promise<void> {
    const names = new Map<string, string>();
    const byTopic = new Map<string, Followed[]>();
    for (const s of states) {
      const topicId = metadata.topics.get(s.topic)!.id;
      names.set(topicId, s.topic);
      const list = byTopic.get(topicId) ?? [];
      list.push(s);
      byTopic.set(topicId, list);
    }
    const requested = new Map<string, bigint>(states.map((s) => [id(s.topic, s.partition), s.position]));
    let response: FetchResponse;
    try {
      const options = {
        node,
        topics: [...byTopic].map(([topicId, list]) => ({
          topicId,
          partitions: list.map((s) => ({
            partition: s.partition,
            fetchOffset: s.position,
            partitionMaxBytes: PARTITION_MAX_BYTES,
            currentLeaderEpoch: -1,
            lastFetchedEpoch: -1,
          })),
        })),
        maxWaitTime: FETCH_WAIT_MS,
        minBytes: 1,
        maxBytes: FETCH_MAX_BYTES,
        isolationLevel: FetchIsolationLevels.READ_COMMITTED,
      };
      response = await viaCallback<FetchResponse>((cb) => this.#consumer.fetch(options, cb));
    } catch (e) {
      if (this.#outOfRange(e, names)) {
        return;
      }
      throw e;
    }
    for (const topicResponse of response.responses) {
      const topic = names.get(topicResponse.topicId) ?? topicResponse.topicId;
      for (const p of topicResponse.partitions) {
        const state = this.followed.get(id(topic, p.partitionIndex));
        const asked = requested.get(id(topic, p.partitionIndex));
        // A partition can linger in a fetch session: only what was asked for, from where.
        if (state === undefined || asked === undefined || state.position !== asked) {
          continue;
        }
        try {
          this.#takeBatches(state, p.records ?? []);
        } catch (e) {
          throw new ProcessingFailure(e);
        }
        if (state.position >= state.end || (state.position >= p.highWatermark && p.highWatermark >= 0n)) {
          state.markCaughtUp();
        }
      }
    }
  }

  /** Moves partitions whose position fell before the log's start (retention) to the start;
   * true when the error was only that. */
  #outOfRange(e: unknown, names: Map<string, string>): boolean {
    const response = (e as { response?: FetchResponse }).response;
    if (response === undefined || response.errorCode !== 0) {
      return false;
    }
    let moved = false;
    for (const topicResponse of response.responses) {
      const topic = names.get(topicResponse.topicId) ?? topicResponse.topicId;
      for (const p of topicResponse.partitions) {
        if (p.errorCode === 0) {
          continue;
        }
        const state = this.followed.get(id(topic, p.partitionIndex));
        if (p.errorCode !== OFFSET_OUT_OF_RANGE || state === undefined || p.logStartOffset < 0n) {
          return false;
        }
        if (state.position < p.logStartOffset) {
          state.position = p.logStartOffset;
          moved = true;
        } else {
          return false;
        }
      }
    }
    return moved;
  }

  #takeBatches(state: Followed, batches: Array<{ firstOffset: bigint; lastOffsetDelta: number; attributes: number; records: KafkaRecord[] }>): void {
    for (const batch of batches) {
      const next = batch.firstOffset + BigInt(batch.lastOffsetDelta) + 1n;
      if (!(batch.attributes & IS_CONTROL)) {
        for (const record of batch.records) {
          const offset = batch.firstOffset + BigInt(record.offsetDelta);
          if (offset < state.position) {
            continue; // a batch that began before the offset asked for
          }
          this.#take(state.topic, state.partition, offset, record);
          state.position = offset + 1n;
        }
      }
      if (next > state.position) {
        state.position = next;
      }
    }
  }

  #take(topic: string, partition: number, offset: bigint, record: KafkaRecord): void {
    const headers: Header[] = record.headers.map(([k, v]) => [k ?? "", v]);
    const barrier = isBarrier(headers);
    const admitted = this.fence.admit(topic, partition, headers);
    if (admitted.verdict === FORGED) {
      this.#warn(
        `${topic} partition ${partition} offset ${offset}: a fence marker (owner epoch ` +
          `${admitted.ownerEpoch}) that does not verify under the processor's keys: ignored`,
      );
    }
    if (barrier || admitted.verdict !== ACCEPT || record.value === null || record.value === undefined) {
      return;
    }
    if (topic === this.#options.decisions) {
      this.#takeDecision(record.value, partition, offset);
    } else if (topic === this.#options.outcomes) {
      this.#takeOutcome(record.value);
    }
  }

  /** The user's warning callback: a failure of its own does not stop the reader. */
  #warn(message: string): void {
    try {
      this.#options.warn(message);
    } catch (e) {
      try {
        console.warn(`airlock-client: ${message} (the onWarning callback failed: ${describe(e)})`);
      } catch {
        // nowhere left to report it
      }
    }
  }

  #takeDecision(payload: Buffer, partition: number, offset: bigint): void {
    let decision: Decision;
    try {
      decision = decisionOf(codec.decode("Decision", payload, this.#options.schemaIds), partition, Number(offset));
    } catch (e) {
      if (!(e instanceof codec.CodecError)) {
        throw e;
      }
      // Never written by a processor this client understands: a newer schema (upgrade the
      // client) or a stranger's record. Kept to explain a wait that times out.
      this.unreadable.set(id(this.#options.decisions, partition), `offset ${offset}: ${e.message}`);
      return;
    }
    this.#index(this.replies, decision.inReplyTo, decision);
    this.#index(this.byKey, decision.operationKey, decision);
    for (const w of this.#waiters) {
      if (w.topic === this.#options.decisions && w.partition === partition && w.wants(decision)) {
        this.#waiters.delete(w);
        w.resolve(decision);
      }
    }
  }

  #takeOutcome(payload: Buffer): void {
    let outcome: Record<string, unknown>;
    try {
      outcome = codec.decode("Outcome", payload, this.#options.schemaIds);
    } catch (e) {
      if (e instanceof codec.CodecError) {
        return;
      }
      throw e;
    }
    const settled = SETTLED_BY[outcome["kind"] as string];
    const evidence = outcome["evidence"];
    if (settled === undefined || typeof evidence !== "string") {
      return;
    }
    const key = evidenceKey(outcome["operation_key"] as string, outcome["epoch"] as number, settled);
    this.evidence.delete(key);
    this.evidence.set(key, evidence);
    this.#trim(this.evidence);
  }

  #index(index: Map<string, Decision[]>, key: string, d: Decision): void {
    const entries = index.get(key) ?? [];
    entries.push(d);
    if (entries.length > PER_KEY) {
      entries.splice(0, entries.length - PER_KEY);
    }
    index.delete(key);
    index.set(key, entries);
    this.#trim(index);
  }

  #trim(index: Map<string, unknown>): void {
    while (index.size > this.#options.capacity) {
      const oldest = index.keys().next().value as string;
      index.delete(oldest);
      this.evicted = true;
    }
  }
}

export function evidenceKey(operationKey: string, epoch: number, verdict: string): string {
  return JSON.stringify([operationKey, epoch, verdict]);
}
