"""The simulated redo: the new value of each key a transaction writes on one partition. The core
treats a redo as opaque bytes; the world needs to read it back to apply it and to lock its keys."""

from __future__ import annotations


def encode(writes: dict[str, int]) -> bytes:
    return ";".join(f"{key}={value}" for key, value in sorted(writes.items())).encode()


def decode(redo: bytes) -> dict[str, int]:
    if not redo:
        return {}
    pairs = (item.split("=") for item in redo.decode().split(";"))
    return {key: int(value) for key, value in pairs}
