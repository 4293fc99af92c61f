//! The partition of an operation key: Kafka's Java-client partitioner (murmur2 of the key,
//! positive, modulo the partition count), which librdkafka implements as `murmur2_random`.
//! Every Airlock producer sets `partitioner=murmur2_random` so Java, Python and Rust producers
//! put a key on the same partition of every co-partitioned topic. Frozen: changing it moves
//! keys between tasks. Cross-checked against librdkafka in `tests/tests/broker_features.rs`.

/// The librdkafka setting that matches [`partition_for`].
pub const LIBRDKAFKA_PARTITIONER: &str = "murmur2_random";

/// Kafka's murmur2 (`org.apache.kafka.common.utils.Utils.murmur2`), as an `i32`.
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let mut h: u32 = SEED ^ data.len() as u32;
    let mut chunks = data.chunks_exact(4);
    for chunk in &mut chunks {
        let mut k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        if rest.len() >= 3 {
            h ^= u32::from(rest[2]) << 16;
        }
        if rest.len() >= 2 {
            h ^= u32::from(rest[1]) << 8;
        }
        h ^= u32::from(rest[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition a keyed record lands on among `partitions`.
pub fn partition_for(key: &[u8], partitions: i32) -> i32 {
    assert!(partitions > 0, "a topic has at least one partition");
    (murmur2(key) & 0x7fff_ffff) % partitions
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values from Apache Kafka's own `UtilsTest.testMurmur2`; they must never change.
    #[test]
    fn murmur2_matches_kafka_golden_values() {
        let cases: [(&[u8], i32); 6] = [
            (b"21", -973932308),
            (b"foobar", -790332482),
            (b"a-little-bit-long-string", -985981536),
            (b"a-little-bit-longer-string", -1486304829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58897971,
            ),
            (b"abc", 479470107),
        ];
        for (input, expected) in cases {
            assert_eq!(murmur2(input), expected, "{input:?}");
        }
    }
}
