/**
 * Avro records as Airlock reads and writes them on Kafka.
 *
 * Two framings, as in `schemas/src/codec.rs`:
 *
 * - single-object encoding (what Airlock writes and what a proposal should use): `C3 01`, the
 *   8-byte CRC-64-AVRO fingerprint (little-endian) of the writer schema's Parsing Canonical
 *   Form, the datum;
 * - Confluent wire format: `00`, a 4-byte big-endian schema id, the datum. Ids come from the
 *   caller (`SchemaRegistry` in `registry.ts`, or a fixed table); nothing here talks to a
 *   registry.
 *
 * Every decode checks the size first, refuses a foreign payload, the wrong record type and
 * trailing bytes. Records written with an older schema version are resolved to the current
 * one. The schemas are the ones in `schemas/avro/history` of the Airlock repository, copied
 * into this package's `schemas/` directory (a test checks that they are byte for byte the
 * same), so that the package works installed on its own.
 */

import { readdirSync, readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { join } from "node:path";

import avro from "avsc";

/** The largest payload read or written, header included (the processor's default limit). */
export const MAX_PAYLOAD_BYTES = 1 << 20;

export const SINGLE_OBJECT_MAGIC = Buffer.from([0xc3, 0x01]);
export const CONFLUENT_MAGIC = Buffer.from([0x00]);

/** The records this package reads or writes. */
export const RECORDS = ["ToolProposal", "Decision", "Outcome", "Control"] as const;
export type RecordName = (typeof RECORDS)[number];

/** The package's copy of the schemas: `<package>/schemas/<Record>/v<N>.avsc`. */
export const SCHEMA_DIR = fileURLToPath(new URL("../../schemas/", import.meta.url));

/** A payload that is not the expected Airlock record. */
export class CodecError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "CodecError";
  }
}

// -- Parsing Canonical Form and its CRC-64-AVRO fingerprint ----------------------------------

const PRIMITIVES = new Set(["null", "boolean", "int", "long", "float", "double", "bytes", "string"]);

type Schema = string | Schema[] | { [key: string]: unknown };

function fullName(name: string, namespace: string | null): [string, string | null] {
  if (name.includes(".")) {
    return [name, name.slice(0, name.lastIndexOf("."))];
  }
  return [namespace ? `${namespace}.${name}` : name, namespace];
}

/** The Parsing Canonical Form of a schema (Avro specification, "Parsing Canonical Form for
 * Schemas"): full names, only the attributes that matter for parsing, in their fixed order,
 * no whitespace. */
export function parsingCanonicalForm(schema: Schema, namespace: string | null = null): string {
  if (typeof schema === "string") {
    return JSON.stringify(PRIMITIVES.has(schema) ? schema : fullName(schema, namespace)[0]);
  }
  if (Array.isArray(schema)) {
    return "[" + schema.map((branch) => parsingCanonicalForm(branch, namespace)).join(",") + "]";
  }
  const type = schema["type"] as Schema;
  if (typeof type !== "string") {
    return parsingCanonicalForm(type, namespace);
  }
  const named = (): [string, string | null] => {
    const ns = typeof schema["namespace"] === "string" ? (schema["namespace"] as string) : namespace;
    return fullName(schema["name"] as string, ns || null);
  };
  switch (type) {
    case "record":
    case "error": {
      const [name, ns] = named();
      const fields = (schema["fields"] as Array<Record<string, unknown>>).map(
        (f) =>
          `{"name":${JSON.stringify(f["name"])},"type":${parsingCanonicalForm(f["type"] as Schema, ns)}}`,
      );
      return `{"name":${JSON.stringify(name)},"type":"record","fields":[${fields.join(",")}]}`;
    }
    case "enum": {
      const [name] = named();
      return `{"name":${JSON.stringify(name)},"type":"enum","symbols":${JSON.stringify(schema["symbols"])}}`;
    }
    case "fixed": {
      const [name] = named();
      return `{"name":${JSON.stringify(name)},"type":"fixed","size":${Number(schema["size"])}}`;
    }
    case "array":
      return `{"type":"array","items":${parsingCanonicalForm(schema["items"] as Schema, namespace)}}`;
    case "map":
      return `{"type":"map","values":${parsingCanonicalForm(schema["values"] as Schema, namespace)}}`;
    default:
      // A primitive (logical types included: their annotation does not change the encoding)
      // or a reference to a named type.
      return parsingCanonicalForm(type, namespace);
  }
}

const CRC64_EMPTY = 0xc15d213aa4d7a795n;
const CRC64_TABLE: bigint[] = (() => {
  const table: bigint[] = [];
  for (let i = 0; i < 256; i++) {
    let fp = BigInt(i);
    for (let j = 0; j < 8; j++) {
      fp = (fp >> 1n) ^ (CRC64_EMPTY & -(fp & 1n));
    }
    table.push(fp);
  }
  return table;
})();

/** The CRC-64-AVRO (Rabin) fingerprint of `data`, as the 8 little-endian bytes
 * single-object encoding puts in its header. */
export function crc64Avro(data: Uint8Array): Buffer {
  let fp = CRC64_EMPTY;
  for (const byte of data) {
    fp = (fp >> 8n) ^ CRC64_TABLE[Number((fp ^ BigInt(byte)) & 0xffn)]!;
  }
  const out = Buffer.alloc(8);
  out.writeBigUInt64LE(fp);
  return out;
}

// -- the schemas ----------------------------------------------------------------------------

interface Version {
  readonly record: RecordName;
  readonly version: number;
  readonly type: avro.Type;
  readonly fingerprint: Buffer;
  /** The `.avsc` text as shipped. */
  readonly text: string;
}

function load(): [Map<RecordName, Version>, Map<string, Version>] {
  const current = new Map<RecordName, Version>();
  const byFingerprint = new Map<string, Version>();
  for (const record of RECORDS) {
    const versions: Version[] = [];
    for (const name of readdirSync(join(SCHEMA_DIR, record))) {
      const match = /^v([0-9]+)\.avsc$/.exec(name);
      if (match === null) {
        continue;
      }
      const text = readFileSync(join(SCHEMA_DIR, record, name), "utf8");
      const schema = JSON.parse(text) as Schema;
      versions.push({
        text,
        record,
        version: Number(match[1]),
        // A registry of its own per version: the versions name the same types.
        type: avro.Type.forSchema(schema as avro.Schema, { registry: {} }),
        fingerprint: crc64Avro(Buffer.from(parsingCanonicalForm(schema), "utf8")),
      });
    }
    if (versions.length === 0) {
      throw new Error(`no schema of ${record} in ${SCHEMA_DIR}`);
    }
    versions.sort((a, b) => a.version - b.version);
    current.set(record, versions[versions.length - 1]!);
    for (const v of versions) {
      byFingerprint.set(v.fingerprint.toString("hex"), v);
    }
  }
  return [current, byFingerprint];
}

const [CURRENT, BY_FINGERPRINT] = load();
const RESOLVERS = new Map<Version, avro.Resolver>();

function currentOf(record: RecordName): Version {
  const v = CURRENT.get(record);
  if (v === undefined) {
    throw new CodecError(`not a record of Airlock's: ${String(record)}`);
  }
  return v;
}

/** The 8 header bytes of `record`'s current schema in single-object encoding. */
export function fingerprint(record: RecordName): Buffer {
  return Buffer.from(currentOf(record).fingerprint);
}

/** The version number of `record`'s current schema (what this client writes and reads into). */
export function currentVersion(record: RecordName): number {
  return currentOf(record).version;
}

/** The `.avsc` text of `record`'s current schema, as shipped (and as `airlock topics create`
 * registers it in a schema registry). */
export function schemaText(record: RecordName): string {
  return currentOf(record).text;
}

/** Whether `id` can be a Confluent schema id (an unsigned 32-bit integer). */
export function isSchemaId(id: unknown): id is number {
  return typeof id === "number" && Number.isInteger(id) && id >= 0 && id <= 0xffffffff;
}

/**
 * `value` (an object of the record's fields, named as in the schema; timestamps as epoch
 * milliseconds) as a payload: single-object encoding, or the Confluent wire format when
 * `schemaId` (the registry's id of the current schema) is given.
 */
export function encode(record: RecordName, value: Record<string, unknown>, schemaId?: number | null): Buffer {
  const current = currentOf(record);
  let datum: Buffer;
  try {
    datum = current.type.toBuffer(value);
  } catch (e) {
    throw new CodecError(`the ${record} does not encode: ${(e as Error).message}`);
  }
  let header: Buffer;
  if (schemaId === undefined || schemaId === null) {
    header = Buffer.concat([SINGLE_OBJECT_MAGIC, current.fingerprint]);
  } else {
    if (!isSchemaId(schemaId)) {
      throw new CodecError(`not a Confluent schema id (an unsigned 32-bit integer): ${String(schemaId)}`);
    }
    header = Buffer.alloc(5);
    header.writeUInt32BE(schemaId, 1);
  }
  const payload = Buffer.concat([header, datum]);
  if (payload.length > MAX_PAYLOAD_BYTES) {
    throw new CodecError(
      `the ${record} is ${payload.length} bytes encoded, over the ${MAX_PAYLOAD_BYTES}-byte limit`,
    );
  }
  return payload;
}

/** The Confluent schema ids a reader accepts: id to `[record, version]`. */
export type SchemaIds =
  | ReadonlyMap<number, readonly [string, number]>
  | Readonly<Record<number, readonly [string, number]>>;

function lookupId(ids: SchemaIds | null | undefined, id: number): readonly [string, number] | undefined {
  if (!ids) {
    return undefined;
  }
  if (ids instanceof Map) {
    return ids.get(id);
  }
  return Object.prototype.hasOwnProperty.call(ids, id)
    ? (ids as Record<number, readonly [string, number]>)[id]
    : undefined;
}

/**
 * The record in `payload`, resolved to the current schema, as a plain object (timestamps as
 * epoch milliseconds). `schemaIds` maps the Confluent ids this reader accepts to
 * `[record, version]`.
 */
export function decode(
  record: RecordName,
  payload: Uint8Array,
  schemaIds?: SchemaIds | null,
): Record<string, unknown> {
  const bytes = Buffer.isBuffer(payload) ? payload : Buffer.from(payload.buffer, payload.byteOffset, payload.length);
  if (bytes.length > MAX_PAYLOAD_BYTES) {
    throw new CodecError(`payload of ${bytes.length} bytes is over the ${MAX_PAYLOAD_BYTES}-byte limit`);
  }
  let writer: Version | undefined;
  let body: Buffer;
  if (bytes.length >= 2 && bytes[0] === 0xc3 && bytes[1] === 0x01) {
    if (bytes.length < 10) {
      throw new CodecError("a single-object payload shorter than its header");
    }
    const fp = bytes.subarray(2, 10).toString("hex");
    writer = BY_FINGERPRINT.get(fp);
    if (writer === undefined) {
      throw new CodecError(
        `unknown schema fingerprint ${fp}: written by a newer Airlock? upgrade this client`,
      );
    }
    body = bytes.subarray(10);
  } else if (bytes.length >= 1 && bytes[0] === 0x00) {
    if (bytes.length < 5) {
      throw new CodecError("a Confluent payload shorter than its header");
    }
    const schemaId = bytes.readUInt32BE(1);
    const known = lookupId(schemaIds, schemaId);
    if (known === undefined) {
      throw new CodecError(`unknown Confluent schema id ${schemaId}`);
    }
    for (const v of BY_FINGERPRINT.values()) {
      if (v.record === known[0] && v.version === known[1]) {
        writer = v;
      }
    }
    if (writer === undefined) {
      throw new CodecError(
        `schema id ${schemaId} names (${known[0]}, ${known[1]}), which this client lacks`,
      );
    }
    body = bytes.subarray(5);
  } else {
    throw new CodecError("not an Airlock payload (neither single-object nor Confluent framing)");
  }
  if (writer.record !== record) {
    throw new CodecError(`a ${writer.record}, not a ${record}`);
  }
  const reader = currentOf(record);
  let resolver = RESOLVERS.get(writer);
  if (resolver === undefined) {
    resolver = reader.type.createResolver(writer.type);
    RESOLVERS.set(writer, resolver);
  }
  let decoded: { value: unknown; offset: number };
  try {
    decoded = reader.type.decode(body, 0, resolver);
  } catch (e) {
    throw new CodecError(`the ${record} does not decode: ${(e as Error).message}`);
  }
  if (decoded.offset < 0) {
    throw new CodecError(`the ${record} does not decode: truncated`);
  }
  if (decoded.offset !== body.length) {
    throw new CodecError(`${body.length - decoded.offset} trailing bytes after the ${record}`);
  }
  return { ...(decoded.value as Record<string, unknown>) };
}
