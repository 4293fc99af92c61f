"""The partition of an operation key: Kafka's Java-client partitioner (murmur2 of the key,
made positive, modulo the partition count). Airlock's topics are co-partitioned by it, so a
proposal must land on the partition the processor owns for its key. librdkafka-based clients
(confluent-kafka) default to another partitioner (``consistent_random``); this client passes
the partition explicitly, and sets ``partitioner=murmur2_random`` (the same function) too."""

from __future__ import annotations

#: The librdkafka setting that partitions like :func:`partition_for`.
LIBRDKAFKA_PARTITIONER = "murmur2_random"

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (``org.apache.kafka.common.utils.Utils.murmur2``), as a signed 32-bit
    integer."""
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    end = length - length % 4
    for i in range(0, end, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    rest = length - end
    if rest:
        if rest >= 3:
            h ^= data[end + 2] << 16
        if rest >= 2:
            h ^= data[end + 1] << 8
        h ^= data[end]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(key: bytes, partitions: int) -> int:
    """The partition a record keyed ``key`` lands on among ``partitions``."""
    if partitions <= 0:
        raise ValueError("a topic has at least one partition")
    return (murmur2(key) & 0x7FFFFFFF) % partitions
