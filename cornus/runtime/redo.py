"""A participant's redo: the writes it buffered during execution, packed as the opaque bytes the
protocol logs with its vote and the storage applies after COMMIT. Length-prefixed, so keys and
values may hold any bytes, and it round-trips exactly."""

from __future__ import annotations

from collections.abc import Mapping

_LENGTH_BYTES = 4
_PUT, _DELETE = 1, 0


def encode(writes: Mapping[str, bytes | None]) -> bytes:
    out = bytearray()
    for key, value in writes.items():
        key_bytes = key.encode("utf-8")
        out += len(key_bytes).to_bytes(_LENGTH_BYTES, "big") + key_bytes
        if value is None:
            out.append(_DELETE)
        else:
            out.append(_PUT)
            out += len(value).to_bytes(_LENGTH_BYTES, "big") + value
    return bytes(out)


def decode(redo: bytes) -> dict[str, bytes | None]:
    writes: dict[str, bytes | None] = {}
    offset = 0

    def take(size: int) -> bytes:
        nonlocal offset
        assert offset + size <= len(redo), "truncated redo"
        chunk = redo[offset : offset + size]
        offset += size
        return chunk

    while offset < len(redo):
        key = take(int.from_bytes(take(_LENGTH_BYTES), "big")).decode("utf-8")
        flag = take(1)[0]
        assert flag in (_PUT, _DELETE), f"bad redo flag {flag}"
        writes[key] = take(int.from_bytes(take(_LENGTH_BYTES), "big")) if flag == _PUT else None
    return writes
