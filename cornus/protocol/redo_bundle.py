"""Coordinator-log packs every participant's redo into one record body: a length-prefixed
encoding that round-trips exactly (redo is opaque bytes, so no separator would be safe)."""

from __future__ import annotations

_LENGTH_BYTES = 4


def encode(redo_by_partition: dict[str, bytes]) -> bytes:
    out = bytearray()
    for partition in sorted(redo_by_partition):
        for chunk in (partition.encode("utf-8"), redo_by_partition[partition]):
            out += len(chunk).to_bytes(_LENGTH_BYTES, "big")
            out += chunk
    return bytes(out)


def decode(bundle: bytes) -> dict[str, bytes]:
    chunks: list[bytes] = []
    offset = 0
    while offset < len(bundle):
        assert offset + _LENGTH_BYTES <= len(bundle), "truncated redo bundle"
        size = int.from_bytes(bundle[offset : offset + _LENGTH_BYTES], "big")
        offset += _LENGTH_BYTES
        assert offset + size <= len(bundle), "truncated redo bundle"
        chunks.append(bundle[offset : offset + size])
        offset += size
    assert len(chunks) % 2 == 0, "redo bundle holds an odd number of chunks"
    return {chunks[i].decode("utf-8"): chunks[i + 1] for i in range(0, len(chunks), 2)}
