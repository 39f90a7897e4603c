"""Java-compatible routing: Kafka's murmur2 and the default partitioner's
toPositive(murmur2(key)) % partitions.

It must stay byte-identical to org.apache.kafka.common.utils.Utils.murmur2,
librdkafka's rd_murmur2 and keylane's kl_murmur2(), or the same key
published from Python and from C lands on two partitions, and two workers
would write one entity (tests/clients checks 10,000 keys against
`keylane route`).
"""
from __future__ import annotations

import struct
from typing import Union

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(key: Union[bytes, bytearray, memoryview, str]) -> int:
    """Kafka's murmur2 (seed 0x9747b28c) of ``key`` (a str is UTF-8), as an
    unsigned 32-bit int."""
    data = key.encode("utf-8") if isinstance(key, str) else bytes(key)
    n = len(data)
    h = (_SEED ^ n) & _MASK
    end = n & ~3
    m = _M
    for (k,) in struct.iter_unpack("<I", data[:end]):
        k = (k * m) & _MASK
        k ^= k >> 24
        k = (k * m) & _MASK
        h = ((h * m) & _MASK) ^ k
    rest = n & 3
    if rest == 3:
        h ^= data[end + 2] << 16
    if rest >= 2:
        h ^= data[end + 1] << 8
    if rest >= 1:
        h ^= data[end]
        h = (h * m) & _MASK
    h ^= h >> 13
    h = (h * m) & _MASK
    h ^= h >> 15
    return h


def partition(key: Union[bytes, bytearray, memoryview, str], partitions: int) -> int:
    """The partition keylane, ``keylane route`` and the Java client's
    default partitioner pick for ``key``: (murmur2(key) & 0x7fffffff) %
    partitions. Raises ValueError for fewer than 1 partition."""
    if partitions < 1:
        raise ValueError("partitions is %d: a topic has at least 1" % partitions)
    return (murmur2(key) & 0x7FFFFFFF) % partitions
