"""The simulated redo: the new value of each key a transaction writes on one partition, and, for a
one-shot's partition (which votes before the transaction's last lock elsewhere), the keys it only
read, which recovery locks shared again. The core treats a redo as opaque bytes; the world needs
to read it back to apply it and to lock its keys."""

from __future__ import annotations


def encode(writes: dict[str, int], reads: tuple[str, ...] = ()) -> bytes:
    assert not set(reads) & set(writes), "a key both read only and written"
    items = [*(f"{key}={value}" for key, value in sorted(writes.items())), *sorted(reads)]
    return ";".join(items).encode()


def value_bytes(value: int | None) -> int:
    """A simulated value's size in the owner's cache: a version number."""
    return 8


def decode(redo: bytes) -> dict[str, int]:
    """The writes, without the keys only read."""
    return {key: int(value) for key, _, value in _items(redo) if value}


def lock_keys(redo: bytes) -> tuple[list[str], list[str]]:
    """The keys written (locked exclusive) and the keys only read (locked shared)."""
    items = _items(redo)
    return [key for key, _, value in items if value], [key for key, _, value in items if not value]


def _items(redo: bytes) -> list[tuple[str, str, str]]:
    return [item.partition("=") for item in redo.decode().split(";")] if redo else []
