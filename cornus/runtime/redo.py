"""A participant's redo: the writes it buffered during execution, packed as the opaque bytes the
protocol logs with its vote and the storage applies after COMMIT. Length-prefixed, so keys and
values may hold any bytes, and it round-trips exactly.

A one-shot's partitions vote as soon as their own operations ran, before the transaction has
taken its last lock elsewhere, so what they only read must stay locked until the decision even
across a restart of theirs: their redo also names those keys (READ entries, no value), which
recovery locks shared again and the apply skips."""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping

_LENGTH = struct.Struct(">I")
_LENGTH_BYTES = _LENGTH.size
_PUT, _DELETE, _READ = 1, 0, 2
_PUT_BYTE, _DELETE_BYTE, _READ_BYTE = bytes([_PUT]), bytes([_DELETE]), bytes([_READ])


def encode(writes: Mapping[str, bytes | None], reads: Iterable[str] = ()) -> bytes:
    """`reads`: keys only read, none of them in `writes` (a key read and written is locked
    exclusively, as a write)."""
    # One join over prepacked pieces: every transaction encodes its redo on each participant and
    # the coordinator, so this runs several times per commit.
    pack = _LENGTH.pack
    parts: list[bytes] = []
    for key in reads:
        assert key not in writes, f"key {key!r} both read only and written"
        key_bytes = key.encode("utf-8")
        parts.append(pack(len(key_bytes)))
        parts.append(key_bytes)
        parts.append(_READ_BYTE)
    for key, value in writes.items():
        key_bytes = key.encode("utf-8")
        parts.append(pack(len(key_bytes)))
        parts.append(key_bytes)
        if value is None:
            parts.append(_DELETE_BYTE)
        else:
            parts.append(_PUT_BYTE)
            parts.append(pack(len(value)))
            parts.append(value)
    return b"".join(parts)


def encoded_size(writes: Mapping[str, bytes | None]) -> int:
    """`len(encode(writes))`, without building it (the edge checks every transaction's size)."""
    size = 0
    for key, value in writes.items():
        size += _LENGTH_BYTES + len(key.encode("utf-8")) + 1
        if value is not None:
            size += _LENGTH_BYTES + len(value)
    return size


def value_bytes(value: bytes | None) -> int:
    """What a value takes in the owner's cache (cornus.protocol.execution), beside its key."""
    return 0 if value is None else len(value)


def decode(redo: bytes) -> dict[str, bytes | None]:
    """The writes (key -> new value, None for a delete), without the keys only read."""
    return _decode(redo, None)


def lock_keys(redo: bytes) -> tuple[list[str], list[str]]:
    """Recovery's locks: the keys written (exclusive) and the keys only read (shared)."""
    reads: list[str] = []
    return list(_decode(redo, reads)), reads


def _decode(redo: bytes, reads: list[str] | None) -> dict[str, bytes | None]:
    writes: dict[str, bytes | None] = {}
    unpack_from = _LENGTH.unpack_from
    end = len(redo)
    offset = 0
    while offset < end:
        assert offset + _LENGTH_BYTES <= end, "truncated redo"
        (size,) = unpack_from(redo, offset)
        offset += _LENGTH_BYTES
        key_end = offset + size
        assert key_end < end, "truncated redo"  # the flag byte follows the key
        key = redo[offset:key_end].decode("utf-8")
        flag = redo[key_end]
        offset = key_end + 1
        if flag == _PUT:
            assert offset + _LENGTH_BYTES <= end, "truncated redo"
            (size,) = unpack_from(redo, offset)
            offset += _LENGTH_BYTES
            assert offset + size <= end, "truncated redo"
            writes[key] = redo[offset : offset + size]
            offset += size
        elif flag == _READ:
            if reads is not None:
                reads.append(key)
        else:
            assert flag == _DELETE, f"bad redo flag {flag}"
            writes[key] = None
    return writes
