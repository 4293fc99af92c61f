/**
 * Canonical tool-call arguments, their hash, and the idempotency key.
 *
 * The same frozen contract as Airlock's processor (`processor/src/core/canonical.rs`) and the
 * Python client (`clients/python/airlock_client/canonical.py`): a proposal is bound to the
 * SHA-256 of its canonical arguments, so a client must compute that form byte for byte as the
 * processor does. The rules (RFC 8785 restricted to a safe subset):
 *
 * - one JSON text, nothing after it;
 * - no duplicate object keys;
 * - numbers are integer literals within +-(2**53 - 1): no fractions, exponents or `-0`
 *   (money is integer minor units plus a currency code);
 * - at most 64 levels of nesting;
 * - output: object keys sorted by UTF-16 code units, no whitespace, minimal string escapes,
 *   everything else as UTF-8.
 *
 * As in the Python client, the text is parsed whole first (any grammar error is a `syntax`
 * error), then checked and written in document order (the first rule broken is reported).
 * A text nested deeper than {@link PARSE_DEPTH_LIMIT} is not parsed at all: its error is the
 * `too_deep` one found by a scan of its structure, as the Python client does when its parser
 * runs out of recursion.
 *
 * The shared test vectors in `schemas/vectors/client.json` are checked by this package's tests.
 */

import { createHash } from "node:crypto";

import { utf8 } from "./utf8.js";

/** Deepest nesting accepted; the top-level container is depth 1. */
export const MAX_DEPTH = 64;
/** Largest integer magnitude accepted: 2**53 - 1. */
export const MAX_SAFE_INTEGER = (1n << 53n) - 1n;
/**
 * Nesting beyond which a text is not parsed but scanned for the path of its first container
 * past {@link MAX_DEPTH} (the Python client's parser gives up near its recursion limit, 1000).
 */
export const PARSE_DEPTH_LIMIT = 1000;

const IDEMPOTENCY_KEY_DOMAIN = Buffer.from("airlock/idempotency-key/v1\0", "utf8");
const IDEMPOTENCY_KEY_PREFIX = "alk1-";
const IDEMPOTENCY_KEY_HEX_LEN = 32;

/** The kinds of {@link CanonicalError}. */
export type CanonicalErrorKind =
  | "syntax"
  | "duplicate_key"
  | "non_integer"
  | "integer_out_of_range"
  | "too_deep";

/**
 * Arguments that have no canonical form. `kind` is one of `syntax`, `duplicate_key`,
 * `non_integer`, `integer_out_of_range`, `too_deep`; `path` is the JSON pointer of the
 * offending place (`(root)` for the document itself).
 */
export class CanonicalError extends Error {
  readonly kind: CanonicalErrorKind;
  readonly path: string;

  constructor(kind: CanonicalErrorKind, path: string, message: string) {
    super(message);
    this.name = "CanonicalError";
    this.kind = kind;
    this.path = path;
  }
}

/** A canonicalized document: its canonical text and the lowercase hex SHA-256 of it. */
export interface Canonical {
  readonly json: string;
  readonly hash: string;
}

// -- the parsed document -------------------------------------------------------------------

/** An object as parsed: keys in document order, duplicates kept (checked later). */
class JsonObject {
  constructor(readonly pairs: Array<[string, Node]>) {}
}

/** A number literal: an accepted integer (`kind` null) or one outside the subset. */
class JsonNumber {
  constructor(
    readonly kind: "non_integer" | "integer_out_of_range" | null,
    readonly literal: string,
  ) {}
}

type Node = null | boolean | string | JsonNumber | JsonObject | Node[];

type Segment = string | number;

/** Thrown by the parser when the text nests deeper than it parses. */
class NestedTooDeep extends Error {}

const MIN_I64 = -(1n << 63n);
const TWO_64 = 1n << 64n;

function numberOf(literal: string, integer: boolean): JsonNumber {
  if (!integer) {
    return new JsonNumber("non_integer", literal);
  }
  if (literal === "-0") {
    return new JsonNumber("non_integer", literal);
  }
  const value = BigInt(literal);
  if (-MAX_SAFE_INTEGER <= value && value <= MAX_SAFE_INTEGER) {
    return new JsonNumber(null, literal);
  }
  // Within 64 bits the processor's parser reads an integer and refuses its range; beyond,
  // it reads a float and refuses the kind.
  if (MIN_I64 <= value && value < TWO_64) {
    return new JsonNumber("integer_out_of_range", literal);
  }
  return new JsonNumber("non_integer", literal);
}

function isWhitespace(ch: string): boolean {
  return ch === " " || ch === "\t" || ch === "\n" || ch === "\r";
}

const NUMBER = /-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?/y;
const HEX4 = /^[0-9a-fA-F]{4}$/;
const SIMPLE_ESCAPES: Record<string, string> = {
  '"': '"',
  "\\": "\\",
  "/": "/",
  b: "\b",
  f: "\f",
  n: "\n",
  r: "\r",
  t: "\t",
};

class SyntaxFailure extends Error {}

/** Reads a JSON string whose opening quote is at `start - 1`; returns it and the index after
 * its closing quote. Strict: control characters must be escaped. */
function scanString(text: string, start: number): [string, number] {
  let out = "";
  let i = start;
  let chunk = i;
  for (;;) {
    if (i >= text.length) {
      throw new SyntaxFailure(`Unterminated string starting at ${where(text, start - 1)}`);
    }
    const ch = text[i]!;
    const code = ch.charCodeAt(0);
    if (ch === '"') {
      out += text.slice(chunk, i);
      return [out, i + 1];
    }
    if (code < 0x20) {
      throw new SyntaxFailure(`Invalid control character at ${where(text, i)}`);
    }
    if (ch === "\\") {
      out += text.slice(chunk, i);
      const esc = text[i + 1];
      if (esc === undefined) {
        throw new SyntaxFailure(`Unterminated string starting at ${where(text, start - 1)}`);
      }
      if (esc === "u") {
        const hex = text.slice(i + 2, i + 6);
        if (!HEX4.test(hex)) {
          throw new SyntaxFailure(`Invalid \\uXXXX escape at ${where(text, i)}`);
        }
        // Code units are appended as they come: a high and a low surrogate make a pair, a
        // lone one stays lone and is refused when the string is checked.
        out += String.fromCharCode(parseInt(hex, 16));
        i += 6;
      } else {
        const simple = SIMPLE_ESCAPES[esc];
        if (simple === undefined) {
          throw new SyntaxFailure(`Invalid \\escape at ${where(text, i)}`);
        }
        out += simple;
        i += 2;
      }
      chunk = i;
      continue;
    }
    i += 1;
  }
}

function where(text: string, index: number): string {
  let line = 1;
  let lineStart = 0;
  for (let i = 0; i < index && i < text.length; i++) {
    if (text[i] === "\n") {
      line += 1;
      lineStart = i + 1;
    }
  }
  return `line ${line} column ${index - lineStart + 1} (char ${index})`;
}

class Parser {
  private i = 0;

  constructor(private readonly text: string) {}

  document(): Node {
    this.skipWhitespace();
    const node = this.value(0);
    this.skipWhitespace();
    if (this.i !== this.text.length) {
      throw new SyntaxFailure(`Extra data: ${where(this.text, this.i)}`);
    }
    return node;
  }

  private skipWhitespace(): void {
    const text = this.text;
    while (this.i < text.length && isWhitespace(text[this.i]!)) {
      this.i += 1;
    }
  }

  private expectingValue(): never {
    throw new SyntaxFailure(`Expecting value: ${where(this.text, this.i)}`);
  }

  /** The value at the current index (whitespace before it already skipped). */
  private value(nesting: number): Node {
    const text = this.text;
    const ch = text[this.i];
    switch (ch) {
      case '"': {
        const [value, end] = scanString(text, this.i + 1);
        this.i = end;
        return value;
      }
      case "{":
        return this.object(nesting + 1);
      case "[":
        return this.array(nesting + 1);
      case "n":
        return this.literal("null", null);
      case "t":
        return this.literal("true", true);
      case "f":
        return this.literal("false", false);
      case "N":
        if (text.startsWith("NaN", this.i)) {
          throw new SyntaxFailure(`NaN is not JSON: ${where(text, this.i)}`);
        }
        return this.expectingValue();
      case "I":
        if (text.startsWith("Infinity", this.i)) {
          throw new SyntaxFailure(`Infinity is not JSON: ${where(text, this.i)}`);
        }
        return this.expectingValue();
      default: {
        if (ch === "-" && text.startsWith("-Infinity", this.i)) {
          throw new SyntaxFailure(`-Infinity is not JSON: ${where(text, this.i)}`);
        }
        NUMBER.lastIndex = this.i;
        const match = NUMBER.exec(text);
        if (match === null) {
          return this.expectingValue();
        }
        this.i += match[0].length;
        return numberOf(match[0], match[1] === undefined && match[2] === undefined);
      }
    }
  }

  private literal<T extends Node>(word: string, value: T): T {
    if (!this.text.startsWith(word, this.i)) {
      return this.expectingValue();
    }
    this.i += word.length;
    return value;
  }

  private array(nesting: number): Node[] {
    if (nesting > PARSE_DEPTH_LIMIT) {
      throw new NestedTooDeep();
    }
    const text = this.text;
    const items: Node[] = [];
    this.i += 1;
    this.skipWhitespace();
    if (text[this.i] === "]") {
      this.i += 1;
      return items;
    }
    for (;;) {
      items.push(this.value(nesting));
      this.skipWhitespace();
      const ch = text[this.i];
      if (ch === "]") {
        this.i += 1;
        return items;
      }
      if (ch !== ",") {
        throw new SyntaxFailure(`Expecting ',' delimiter: ${where(text, this.i)}`);
      }
      this.i += 1;
      this.skipWhitespace();
    }
  }

  private object(nesting: number): JsonObject {
    if (nesting > PARSE_DEPTH_LIMIT) {
      throw new NestedTooDeep();
    }
    const text = this.text;
    const pairs: Array<[string, Node]> = [];
    this.i += 1;
    this.skipWhitespace();
    if (text[this.i] === "}") {
      this.i += 1;
      return new JsonObject(pairs);
    }
    for (;;) {
      if (text[this.i] !== '"') {
        throw new SyntaxFailure(
          `Expecting property name enclosed in double quotes: ${where(text, this.i)}`,
        );
      }
      const [key, end] = scanString(text, this.i + 1);
      this.i = end;
      this.skipWhitespace();
      if (text[this.i] !== ":") {
        throw new SyntaxFailure(`Expecting ':' delimiter: ${where(text, this.i)}`);
      }
      this.i += 1;
      this.skipWhitespace();
      pairs.push([key, this.value(nesting)]);
      this.skipWhitespace();
      const ch = text[this.i];
      if (ch === "}") {
        this.i += 1;
        return new JsonObject(pairs);
      }
      if (ch !== ",") {
        throw new SyntaxFailure(`Expecting ',' delimiter: ${where(text, this.i)}`);
      }
      this.i += 1;
      this.skipWhitespace();
    }
  }
}

// -- checking and writing ------------------------------------------------------------------

function pointer(path: readonly Segment[]): string {
  if (path.length === 0) {
    return "(root)";
  }
  return path
    .map((p) => "/" + (typeof p === "number" ? String(p) : p.replace(/~/g, "~0").replace(/\//g, "~1")))
    .join("");
}

const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;

function checkString(value: string, path: readonly Segment[]): void {
  if (LONE_SURROGATE.test(value)) {
    const at = pointer(path);
    throw new CanonicalError("syntax", at, `invalid JSON: a lone surrogate in a string at ${at}`);
  }
}

function enter(depth: number, path: readonly Segment[]): void {
  if (depth >= MAX_DEPTH) {
    const at = pointer(path);
    throw new CanonicalError("too_deep", at, `nesting deeper than ${MAX_DEPTH} levels at ${at}`);
  }
}

/** UTF-16 code unit order: JavaScript's own string comparison. */
function byCodeUnits(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

function write(node: Node, path: Segment[], depth: number): string {
  if (node === null) {
    return "null";
  }
  if (node === true) {
    return "true";
  }
  if (node === false) {
    return "false";
  }
  if (typeof node === "string") {
    checkString(node, path);
    return quote(node);
  }
  if (node instanceof JsonNumber) {
    if (node.kind === null) {
      return BigInt(node.literal).toString();
    }
    const at = pointer(path);
    if (node.kind === "integer_out_of_range") {
      throw new CanonicalError(
        node.kind,
        at,
        `integer ${node.literal} at ${at} is outside +-(2^53-1) and not exactly representable everywhere`,
      );
    }
    throw new CanonicalError(
      node.kind,
      at,
      `number at ${at} is not an integer literal within +-(2^53-1): fractions, exponents and -0 ` +
        "are not accepted (express money as integer minor units plus a currency code)",
    );
  }
  if (Array.isArray(node)) {
    enter(depth, path);
    const parts: string[] = [];
    node.forEach((item, index) => {
      path.push(index);
      parts.push(write(item, path, depth + 1));
      path.pop();
    });
    return "[" + parts.join(",") + "]";
  }
  enter(depth, path);
  const seen = new Set<string>();
  for (const [key] of node.pairs) {
    checkString(key, path);
    if (seen.has(key)) {
      const at = pointer(path);
      throw new CanonicalError(
        "duplicate_key",
        at,
        `duplicate object key ${JSON.stringify(key)} in the object at ${at}`,
      );
    }
    seen.add(key);
  }
  // Values are checked in document order (the first problem is the one reported), then
  // written in canonical order.
  const written: Array<[string, string]> = [];
  for (const [key, value] of node.pairs) {
    path.push(key);
    written.push([key, write(value, path, depth + 1)]);
    path.pop();
  }
  written.sort((a, b) => byCodeUnits(a[0], b[0]));
  return "{" + written.map(([key, text]) => quote(key) + ":" + text).join(",") + "}";
}

const ESCAPES: Record<string, string> = {
  '"': '\\"',
  "\\": "\\\\",
  "\b": "\\b",
  "\f": "\\f",
  "\n": "\\n",
  "\r": "\\r",
  "\t": "\\t",
};

// eslint-disable-next-line no-control-regex
const NEEDS_ESCAPE = /["\\\u0000-\u001f]/g;

/** A JSON string with the minimal escapes of RFC 8785. */
function quote(value: string): string {
  return (
    '"' +
    value.replace(NEEDS_ESCAPE, (ch) => {
      const escaped = ESCAPES[ch];
      return escaped ?? "\\u" + ch.charCodeAt(0).toString(16).padStart(4, "0");
    }) +
    '"'
  );
}

/** The error for a text nested too deep to parse: the path of the first container past the
 * limit, found by a scan of the text's structure. */
function tooDeep(text: string): CanonicalError {
  const stack: Array<[string, Segment]> = [];
  let expectKey = false;
  let i = 0;
  while (i < text.length) {
    const ch = text[i]!;
    if (ch === '"') {
      let value: string;
      try {
        [value, i] = scanString(text, i + 1);
      } catch (e) {
        return new CanonicalError("syntax", "(root)", `invalid JSON: ${(e as Error).message}`);
      }
      if (expectKey) {
        stack[stack.length - 1]![1] = value;
        expectKey = false;
      }
      continue;
    }
    if (ch === "[" || ch === "{") {
      if (stack.length >= MAX_DEPTH) {
        const at = pointer(stack.map((frame) => frame[1]));
        return new CanonicalError("too_deep", at, `nesting deeper than ${MAX_DEPTH} levels at ${at}`);
      }
      stack.push([ch, ch === "[" ? 0 : ""]);
      expectKey = ch === "{";
    } else if (ch === "]" || ch === "}") {
      stack.pop();
      expectKey = false;
    } else if (ch === "," && stack.length > 0) {
      const top = stack[stack.length - 1]!;
      if (top[0] === "[") {
        top[1] = (top[1] as number) + 1;
      } else {
        expectKey = true;
      }
    }
    i += 1;
  }
  return new CanonicalError("syntax", "(root)", "invalid JSON: nested too deep to parse");
}

const UTF8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

/**
 * The canonical form of a JSON text (a string, or its UTF-8 bytes) and its hash;
 * {@link CanonicalError} when the text has none (the processor would refuse the proposal as
 * MALFORMED).
 */
export function canonicalize(text: string | Uint8Array): Canonical {
  let source: string;
  if (typeof text === "string") {
    source = text;
  } else {
    try {
      source = UTF8.decode(text);
    } catch (e) {
      throw new CanonicalError("syntax", "(root)", `invalid JSON: not UTF-8 (${(e as Error).message})`);
    }
  }
  let node: Node;
  try {
    node = new Parser(source).document();
  } catch (e) {
    if (e instanceof NestedTooDeep) {
      throw tooDeep(source);
    }
    if (e instanceof SyntaxFailure) {
      throw new CanonicalError("syntax", "(root)", `invalid JSON: ${e.message}`);
    }
    throw e;
  }
  const json = write(node, [], 0);
  return { json, hash: argumentsHash(json) };
}

/** What a value that has no JSON form is, for the error that refuses it. */
function kindOf(v: unknown): string {
  if (v === undefined) {
    return "undefined";
  }
  if (typeof v === "function") {
    return "a function";
  }
  if (typeof v === "symbol") {
    return "a symbol";
  }
  const name = (v as { constructor?: { name?: unknown } }).constructor?.name;
  return typeof name === "string" && name !== "" ? `a ${name}` : "an object that is not a plain one";
}

/**
 * A JSON text of a JavaScript value, as the arguments of a call are given: plain objects
 * (whose prototype is `Object.prototype` or null), arrays, strings, booleans, null, numbers
 * and bigints. Anything else anywhere in it (`undefined`, a function, a symbol, a Map or Set,
 * a Date, a Buffer or typed array, an instance of a class; `toJSON` is not called) is refused
 * with a {@link CanonicalError} of kind `syntax` naming its place, as the Python client's
 * `json.dumps` refuses what is not JSON. Numbers are written so that the canonical rules see
 * what was meant: `-0` stays `-0` and non-finite numbers are written as the non-JSON
 * `NaN`/`Infinity`, both refused; a bigint is written in full.
 */
export function toJsonText(value: unknown): string {
  const active = new Set<object>();
  const path: Segment[] = [];
  const out = (v: unknown): string => {
    switch (typeof v) {
      case "string":
        return JSON.stringify(v);
      case "boolean":
        return v ? "true" : "false";
      case "bigint":
        return v.toString();
      case "number":
        if (Object.is(v, -0)) {
          return "-0";
        }
        if (Number.isNaN(v)) {
          return "NaN";
        }
        if (!Number.isFinite(v)) {
          return v > 0 ? "Infinity" : "-Infinity";
        }
        return JSON.stringify(v);
      default:
        break;
    }
    if (v === null) {
      return "null";
    }
    const plain =
      typeof v === "object" &&
      (Array.isArray(v) || Object.getPrototypeOf(v) === Object.prototype || Object.getPrototypeOf(v) === null);
    if (!plain) {
      const at = pointer(path);
      throw new CanonicalError(
        "syntax",
        at,
        `invalid JSON: ${kindOf(v)} at ${at} is not JSON (only plain objects, arrays, strings, ` +
          "numbers, bigints, booleans and null are)",
      );
    }
    const obj = v as object;
    if (active.has(obj)) {
      throw new TypeError(`arguments are a cyclic structure at ${pointer(path)}: not JSON`);
    }
    active.add(obj);
    try {
      if (Array.isArray(obj)) {
        const items: string[] = [];
        // By index: a hole of a sparse array is undefined, refused like any other.
        for (let i = 0; i < obj.length; i++) {
          path.push(i);
          items.push(out(obj[i]));
          path.pop();
        }
        return "[" + items.join(",") + "]";
      }
      const parts: string[] = [];
      for (const key of Object.keys(obj)) {
        path.push(key);
        parts.push(JSON.stringify(key) + ":" + out((obj as Record<string, unknown>)[key]));
        path.pop();
      }
      return "{" + parts.join(",") + "}";
    } finally {
      active.delete(obj);
    }
  };
  return out(value);
}

/** The canonical text of a JavaScript value (see {@link toJsonText}). */
export function canonicalJson(value: unknown): string {
  return canonicalize(toJsonText(value)).json;
}

/** Lowercase hex SHA-256 of an already canonical text's UTF-8 bytes. */
export function argumentsHash(canonical: string): string {
  return createHash("sha256").update(canonical, "utf8").digest("hex");
}

/**
 * The key Airlock's connectors send downstream for `operationKey`: `alk1-` and the first 32
 * hex digits of SHA-256(domain || key). Never changes.
 */
export function idempotencyKey(operationKey: string): string {
  const digest = createHash("sha256")
    .update(IDEMPOTENCY_KEY_DOMAIN)
    .update(utf8(operationKey, "the operation key"))
    .digest("hex");
  return IDEMPOTENCY_KEY_PREFIX + digest.slice(0, IDEMPOTENCY_KEY_HEX_LEN);
}
