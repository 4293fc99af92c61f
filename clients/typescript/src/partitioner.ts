/**
 * The partition of an operation key: Kafka's Java-client partitioner (murmur2 of the key,
 * made positive, modulo the partition count). Airlock's topics are co-partitioned by it, so a
 * proposal must land on the partition the processor owns for its key. This client passes the
 * partition explicitly on every record it produces; it never leaves the choice to the Kafka
 * library (whose default partitioner is another function).
 */

import { utf8 } from "./utf8.js";

const M = 0x5bd1e995;

/** Kafka's murmur2 (`org.apache.kafka.common.utils.Utils.murmur2`), as a signed 32-bit
 * integer. */
export function murmur2(data: Uint8Array): number {
  const length = data.length;
  let h = (0x9747b28c ^ length) | 0;
  const end = length - (length % 4);
  for (let i = 0; i < end; i += 4) {
    let k = data[i]! | (data[i + 1]! << 8) | (data[i + 2]! << 16) | (data[i + 3]! << 24);
    k = Math.imul(k, M);
    k ^= k >>> 24;
    k = Math.imul(k, M);
    h = Math.imul(h, M);
    h ^= k;
  }
  const rest = length - end;
  if (rest > 0) {
    if (rest >= 3) {
      h ^= data[end + 2]! << 16;
    }
    if (rest >= 2) {
      h ^= data[end + 1]! << 8;
    }
    h ^= data[end]!;
    h = Math.imul(h, M);
  }
  h ^= h >>> 13;
  h = Math.imul(h, M);
  h ^= h >>> 15;
  return h | 0;
}

/** The partition a record keyed `key` (bytes, or a string as its UTF-8 bytes) lands on
 * among `partitions`. */
export function partitionFor(key: Uint8Array | string, partitions: number): number {
  if (!Number.isInteger(partitions) || partitions <= 0) {
    throw new RangeError("a topic has at least one partition");
  }
  const bytes = typeof key === "string" ? utf8(key, "the key") : key;
  return (murmur2(bytes) & 0x7fffffff) % partitions;
}
