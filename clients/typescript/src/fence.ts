/**
 * The reader's side of Airlock's owner-epoch fence.
 *
 * Each partition of an output topic (decisions, dispatch commands) is written by the processor
 * task that owns it; a task that claims a partition first writes a fence marker carrying its
 * owner epoch. A record whose owner epoch is below the highest marker read before it on the
 * same partition was written by an owner that had already lost the partition (a zombie) and
 * must be ignored. Records carry the epoch in the `airlock-owner-epoch` header (decimal
 * text); markers also carry `airlock-kind: fence`. A reader must read a partition from its
 * start to know its fence.
 *
 * A processor with a capability key signs each marker (header `airlock-capability`: version
 * byte 1 and an Ed25519 signature of {@link fenceMessage}). A reader given the processor's
 * verifying keys ({@link MarkerVerifier}) raises its fence only for markers that verify, so
 * that whoever can write the topic cannot make every later answer unreadable with a marker of
 * a huge epoch.
 */

import { createPublicKey, verify as verifySignature, type KeyObject } from "node:crypto";
import { readFileSync } from "node:fs";

import { utf8 } from "./utf8.js";

export const KIND = "airlock-kind";
export const OWNER_EPOCH = "airlock-owner-epoch";
export const CAPABILITY = "airlock-capability";
export const FENCE_KIND = "fence";
export const BARRIER_KIND = "barrier";

export const ACCEPT = "accept";
export const MARKER = "marker";
export const FENCED = "fenced";
/** A fence marker whose capability does not verify: it raises no fence. */
export const FORGED = "forged";

export type Verdict = typeof ACCEPT | typeof MARKER | typeof FENCED | typeof FORGED;

const FENCE_DOMAIN = Buffer.from("airlock/fence/v1\0", "utf8");
export const CAPABILITY_VERSION = 1;

const MIN_I64 = -(1n << 63n);
const MAX_I64 = (1n << 63n) - 1n;

/**
 * The signed message of a fence marker: the domain tag, the topic (big-endian u32 length and
 * UTF-8 bytes), the partition (i32) and the owner epoch (i64), big-endian.
 */
export function fenceMessage(topic: string, partition: number, ownerEpoch: bigint | number): Buffer {
  const name = utf8(topic, "the topic");
  const out = Buffer.alloc(FENCE_DOMAIN.length + 4 + name.length + 4 + 8);
  let at = FENCE_DOMAIN.copy(out, 0);
  at = out.writeUInt32BE(name.length, at);
  at += name.copy(out, at);
  at = out.writeInt32BE(partition, at);
  out.writeBigInt64BE(BigInt(ownerEpoch), at);
  return out;
}

const SPKI_ED25519_PREFIX = Buffer.from("302a300506032b6570032100", "hex");
const ASCII_WHITESPACE = new Set([0x20, 0x09, 0x0a, 0x0d, 0x0b, 0x0c]);

function strip(data: Buffer): Buffer {
  let start = 0;
  let end = data.length;
  while (start < end && ASCII_WHITESPACE.has(data[start]!)) {
    start += 1;
  }
  while (end > start && ASCII_WHITESPACE.has(data[end - 1]!)) {
    end -= 1;
  }
  return data.subarray(start, end);
}

/**
 * A verifying key as the processor's `airlock keygen` writes it: a file of 64 hex characters
 * or 32 raw bytes (a path), or the 32 key bytes themselves.
 */
export function loadVerifyingKey(key: string | Uint8Array): Buffer {
  if (typeof key !== "string") {
    if (key.length === 32) {
      return Buffer.from(key);
    }
    throw new Error(`a verifying key of ${key.length} bytes: not 32`);
  }
  const data = readFileSync(key);
  const text = strip(data);
  if (text.length === 64 && /^[0-9a-fA-F]{64}$/.test(text.toString("latin1"))) {
    return Buffer.from(text.toString("latin1"), "hex");
  }
  if (data.length === 32) {
    return data;
  }
  throw new Error(`${key}: not a verifying key (64 hex characters or 32 raw bytes)`);
}

/** Whether a fence marker's capability verifies for its topic, partition and owner epoch. */
export type Verify = (
  topic: string,
  partition: number,
  ownerEpoch: bigint,
  capability: Uint8Array | null,
) => boolean;

/**
 * Checks a fence marker's capability against the processor's verifying keys (several during a
 * key rotation), with node:crypto's Ed25519.
 */
export class MarkerVerifier {
  readonly #keys: KeyObject[];

  constructor(keys: Iterable<string | Uint8Array>) {
    this.#keys = [...keys].map((k) =>
      createPublicKey({
        key: Buffer.concat([SPKI_ED25519_PREFIX, loadVerifyingKey(k)]),
        format: "der",
        type: "spki",
      }),
    );
    if (this.#keys.length === 0) {
      throw new Error("MarkerVerifier needs at least one verifying key");
    }
  }

  /** True when `capability` is version 1 and an Ed25519 signature, by one of the keys, of
   * the marker's {@link fenceMessage}. */
  verify(topic: string, partition: number, ownerEpoch: bigint | number, capability: Uint8Array | null): boolean {
    if (!capability || capability.length !== 65 || capability[0] !== CAPABILITY_VERSION) {
      return false;
    }
    const message = fenceMessage(topic, partition, ownerEpoch);
    const signature = capability.subarray(1);
    return this.#keys.some((key) => verifySignature(null, message, key, signature));
  }

  /** {@link MarkerVerifier.verify} as a function, for {@link FenceFilter}. */
  get function(): Verify {
    return (topic, partition, ownerEpoch, capability) =>
      this.verify(topic, partition, ownerEpoch, capability);
  }
}

/**
 * What to do with one record: `accept` it, it is a `marker` (not a payload), it is `fenced`
 * (a zombie's write: ignore it), or a `forged` marker (ignore it too).
 */
export interface Admit {
  readonly verdict: Verdict;
  readonly ownerEpoch: bigint | null;
  readonly fence: bigint;
}

/** A record header as given: its name (text or UTF-8 bytes) and its value (bytes or text). */
export type Header = readonly [string | Uint8Array, Uint8Array | string | null | undefined];

function bytesOf(value: Uint8Array | string | null | undefined): Uint8Array | null {
  if (value === null || value === undefined) {
    return null;
  }
  return typeof value === "string" ? Buffer.from(value, "utf8") : value;
}

function equalsAscii(value: Uint8Array | null, text: string): boolean {
  if (value === null || value.length !== text.length) {
    return false;
  }
  for (let i = 0; i < text.length; i++) {
    if (value[i] !== text.charCodeAt(i)) {
      return false;
    }
  }
  return true;
}

/** A header's decimal value as Airlock parses it: an optional sign and ASCII digits, within
 * 64 bits; anything else is no value. */
export function decimalI64(value: Uint8Array | null): bigint | null {
  const text = value ?? new Uint8Array();
  const signed = text[0] === 0x2b || text[0] === 0x2d;
  const digits = signed ? text.subarray(1) : text;
  if (digits.length === 0) {
    return null;
  }
  for (const byte of digits) {
    if (byte < 0x30 || byte > 0x39) {
      return null;
    }
  }
  const magnitude = BigInt(Buffer.from(digits).toString("latin1"));
  const number = text[0] === 0x2d ? -magnitude : magnitude;
  return MIN_I64 <= number && number <= MAX_I64 ? number : null;
}

function nameOf(key: string | Uint8Array): string {
  return typeof key === "string" ? key : Buffer.from(key).toString("utf8");
}

/**
 * The highest fence marker read per (topic, partition). With `verify` (a
 * {@link MarkerVerifier} or a {@link Verify} function), only markers that verify raise the
 * fence; others are `forged`.
 */
export class FenceFilter {
  readonly #fences = new Map<string, bigint>();
  readonly #verify: Verify | null;

  constructor(verify?: Verify | MarkerVerifier | null) {
    this.#verify = verify instanceof MarkerVerifier ? verify.function : (verify ?? null);
  }

  /** Classifies one record, given its headers, in the order records are read. */
  admit(topic: string, partition: number, headers: Iterable<Header> | null | undefined): Admit {
    let kind: Uint8Array | null = null;
    let epoch: bigint | null = null;
    let capability: Uint8Array | null = null;
    // The last header of a name counts, as for every Airlock reader.
    for (const [key, value] of headers ?? []) {
      const name = nameOf(key);
      if (name === KIND) {
        kind = bytesOf(value);
      } else if (name === OWNER_EPOCH) {
        epoch = decimalI64(bytesOf(value));
      } else if (name === CAPABILITY) {
        capability = bytesOf(value);
      }
    }
    if (epoch === null) {
      // Not written by an Airlock task: nothing to fence.
      return { verdict: ACCEPT, ownerEpoch: null, fence: 0n };
    }
    const id = `${topic}\u0000${partition}`;
    const fence = this.#fences.get(id) ?? 0n;
    const isFence = equalsAscii(kind, FENCE_KIND);
    if (isFence && this.#verify !== null) {
      if (!this.#verify(topic, partition, epoch, capability)) {
        return { verdict: FORGED, ownerEpoch: epoch, fence };
      }
    }
    if (isFence) {
      const raised = epoch > fence ? epoch : fence;
      this.#fences.set(id, raised);
      return { verdict: MARKER, ownerEpoch: epoch, fence: raised };
    }
    if (epoch < fence) {
      return { verdict: FENCED, ownerEpoch: epoch, fence };
    }
    return { verdict: ACCEPT, ownerEpoch: epoch, fence };
  }

  /** The highest marker read on the partition (0 before any). */
  fence(topic: string, partition: number): bigint {
    return this.#fences.get(`${topic}\u0000${partition}`) ?? 0n;
  }
}

/** True when a record's headers mark it a barrier (any `airlock-kind: barrier` header). */
export function isBarrier(headers: Iterable<Header> | null | undefined): boolean {
  for (const [key, value] of headers ?? []) {
    if (nameOf(key) === KIND && equalsAscii(bytesOf(value), BARRIER_KIND)) {
      return true;
    }
  }
  return false;
}
