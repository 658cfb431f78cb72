"""Which partition holds a key: a stable hash (the same in every process and release, unlike
Python's salted `hash`) modulo the partition count; and the partitions' names."""

from __future__ import annotations

import zlib


def partition_of(key: str, partition_count: int) -> str:
    assert partition_count > 0
    return f"p{zlib.crc32(key.encode('utf-8')) % partition_count}"


def partition_names(partition_count: int) -> tuple[str, ...]:
    """The partitions of a cluster of `partition_count`: p0 to p<count - 1>."""
    assert partition_count > 0
    return tuple(f"p{index}" for index in range(partition_count))
