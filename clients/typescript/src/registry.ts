/**
 * Schema ids from a Confluent-compatible schema registry, for publishing in the Confluent wire
 * format (`00`, the 4-byte big-endian id, the Avro datum) instead of single-object encoding.
 *
 * Airlock's subjects (`airlock topics create` with `schema_registry.url` registers them, with
 * BACKWARD compatibility): `<topic>-value` for a topic of one record type, e.g.
 * `airlock.proposals-value` for the ToolProposal schema. {@link SchemaRegistry.schemaId} looks
 * the shipped schema up under a subject (`POST /subjects/<subject>`) and caches its id; with
 * `register: true` it registers the schema when the subject lacks it (`POST
 * /subjects/<subject>/versions`; the registry refuses an incompatible one). The same protocol
 * as the Python client's `airlock_client.registry`. Node's own `fetch` talks HTTP here; every
 * call is bounded by the timeout, reading the answer included.
 */

import { schemaText, isSchemaId, type RecordName } from "./codec.js";
import { RegistryError } from "./errors.js";
import { MAX_TIMER_MS } from "./timers.js";

const CONTENT_TYPE = "application/vnd.schemaregistry.v1+json";

/** The longest piece of a registry's answer quoted in an error. */
const QUOTED_CHARS = 500;

/** The subject of a topic that carries one record type (TopicNameStrategy). */
export function topicSubject(topic: string): string {
  return `${topic}-value`;
}

export interface SchemaRegistryOptions {
  /** The bound on each HTTP call, reading the answer included. Default 10 000. */
  timeoutMs?: number;
}

export interface SchemaIdOptions {
  /** Register the schema when the subject lacks it (default false). */
  register?: boolean;
}

/**
 * A client of a registry's Confluent API at `url` (e.g. `http://registry:8081`, or Apicurio's
 * `http://registry:8080/apis/ccompat/v7`): `http:` or `https:`, without credentials.
 */
export class SchemaRegistry {
  readonly url: string;
  readonly timeoutMs: number;
  readonly #ids = new Map<string, number>();

  constructor(url: string, options: SchemaRegistryOptions = {}) {
    let parsed: URL;
    try {
      parsed = new URL(url);
    } catch {
      throw new TypeError(`not a schema registry URL: ${JSON.stringify(url)}`);
    }
    if (parsed.protocol !== "http:" && parsed.protocol !== "https:") {
      throw new TypeError(`the schema registry URL must be http: or https:, not ${parsed.protocol} (${url})`);
    }
    if (parsed.username !== "" || parsed.password !== "") {
      throw new TypeError("the schema registry URL must not carry credentials (not supported)");
    }
    if (parsed.search !== "" || parsed.hash !== "") {
      throw new TypeError(`the schema registry URL must have no query nor fragment: ${url}`);
    }
    const timeoutMs = options.timeoutMs ?? 10_000;
    if (!(timeoutMs > 0) || timeoutMs > MAX_TIMER_MS) {
      throw new RangeError(`the schema registry timeout must be over 0 and at most ${MAX_TIMER_MS} ms: ${timeoutMs}`);
    }
    this.url = url.replace(/\/+$/, "");
    this.timeoutMs = Math.ceil(timeoutMs);
  }

  /**
   * The registry's id of `record`'s current schema under `subject` (cached after the first
   * answer). With `register`, a subject that lacks it gets it registered. Rejects with a
   * {@link RegistryError}.
   */
  async schemaId(subject: string, record: RecordName, options: SchemaIdOptions = {}): Promise<number> {
    const key = `${subject}\u0000${record}`;
    const cached = this.#ids.get(key);
    if (cached !== undefined) {
      return cached;
    }
    const text = schemaText(record);
    const path = "/subjects/" + encodeURIComponent(subject);
    let [status, body] = await this.#call(path, { schema: text });
    let schemaId: number;
    if (status === 200) {
      schemaId = this.#id(body, subject, status);
    } else if (status === 404 && !options.register) {
      throw new RegistryError(
        "not_registered",
        `schema registry ${this.url}: ${record}'s schema is not registered under ${subject} ` +
          `(${quote(body)}); run \`airlock topics create\` with schema_registry.url set, or pass ` +
          "registerSchema: true",
        status,
      );
    } else if (status === 404) {
      [status, body] = await this.#call(path + "/versions", { schema: text });
      if (status === 409) {
        throw new RegistryError(
          "incompatible",
          `schema registry ${this.url}: ${record}'s schema refused under ${subject} as incompatible: ${quote(body)}`,
          status,
        );
      }
      if (status !== 200) {
        throw new RegistryError(
          "http",
          `schema registry ${this.url}: registering ${record} under ${subject}: HTTP ${status}: ${quote(body)}`,
          status,
        );
      }
      schemaId = this.#id(body, subject, status);
    } else {
      throw new RegistryError(
        "http",
        `schema registry ${this.url}: looking up ${record} under ${subject}: HTTP ${status}: ${quote(body)}`,
        status,
      );
    }
    this.#ids.set(key, schemaId);
    return schemaId;
  }

  /** POSTs `body` as JSON to `path`: the status and the answer (JSON, else its text). */
  async #call(path: string, body: unknown): Promise<[number, unknown]> {
    const url = this.url + path;
    try {
      const response = await fetch(url, {
        method: "POST",
        headers: { "Content-Type": CONTENT_TYPE, Accept: CONTENT_TYPE },
        body: JSON.stringify(body),
        // Bounds the answer's body too: reading it rejects once the signal aborts.
        signal: AbortSignal.timeout(this.timeoutMs),
      });
      const text = await response.text();
      let parsed: unknown = text;
      try {
        parsed = JSON.parse(text);
      } catch {
        // Not JSON: quoted as text.
      }
      return [response.status, parsed];
    } catch (e) {
      throw new RegistryError(
        "unreachable",
        `schema registry unreachable: POST ${url} (timeout ${this.timeoutMs} ms): ${cause(e)}`,
        null,
        { cause: e },
      );
    }
  }

  #id(body: unknown, subject: string, status: number): number {
    const id = typeof body === "object" && body !== null ? (body as Record<string, unknown>)["id"] : undefined;
    if (!isSchemaId(id)) {
      throw new RegistryError(
        "malformed",
        `schema registry ${this.url}: ${subject}: no schema id in ${quote(body, true)}`,
        status,
      );
    }
    return id;
  }
}

/** The registry's message in an answer, else the answer, shortened. */
function quote(body: unknown, whole = false): string {
  let text: string;
  if (!whole && typeof body === "object" && body !== null && typeof (body as Record<string, unknown>)["message"] === "string") {
    text = (body as Record<string, string>)["message"]!;
  } else {
    text = typeof body === "string" ? body : JSON.stringify(body);
  }
  return text.length > QUOTED_CHARS ? `${text.slice(0, QUOTED_CHARS)}...` : text;
}

/** What failed under fetch's "fetch failed": the network error (a list of them when every
 * address of the host failed), or the timeout. */
function cause(e: unknown): string {
  if (e instanceof Error && e.name === "TimeoutError") {
    return "no answer in time";
  }
  const parts: string[] = [];
  const walk = (err: unknown, depth: number): void => {
    if (depth > 4 || err === undefined || err === null) {
      return;
    }
    if (err instanceof AggregateError && err.errors.length > 0) {
      for (const inner of err.errors) {
        walk(inner, depth + 1);
      }
      return;
    }
    if (err instanceof Error) {
      const code = (err as NodeJS.ErrnoException).code;
      const text = err.message || code || err.name;
      if (!(err instanceof TypeError && err.message === "fetch failed" && err.cause !== undefined)) {
        parts.push(text);
      }
      walk(err.cause, depth + 1);
      return;
    }
    parts.push(String(err));
  };
  walk(e, 0);
  return parts.length > 0 ? [...new Set(parts)].join("; ") : String(e);
}
