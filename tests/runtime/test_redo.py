"""The redo codec round-trips exactly: any key and value bytes, deletes, and a one-shot's keys
only read, which decode leaves out (the apply writes nothing for them) and lock_keys names apart
(recovery locks them shared)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cornus.runtime import redo

keys = st.text(min_size=1, max_size=12)
writes_maps = st.dictionaries(keys, st.none() | st.binary(max_size=40), max_size=8)


@given(writes=writes_maps, read=st.lists(keys, max_size=8, unique=True))
def test_writes_and_reads_round_trip(writes: dict[str, bytes | None], read: list[str]) -> None:
    reads = [key for key in read if key not in writes]
    encoded = redo.encode(writes, reads)
    assert redo.decode(encoded) == writes
    assert redo.lock_keys(encoded) == (list(writes), reads)
    assert redo.encoded_size(writes) == len(redo.encode(writes))


def test_a_key_both_read_only_and_written_is_refused() -> None:
    with pytest.raises(AssertionError):
        redo.encode({"k": b"v"}, ["k"])


def test_a_redo_from_before_read_entries_still_decodes() -> None:
    # Bytes as the codec wrote them before READ entries: key length, key, PUT, value length, value.
    old = b"\x00\x00\x00\x01k\x01\x00\x00\x00\x01v" + b"\x00\x00\x00\x01d\x00"
    assert redo.decode(old) == {"k": b"v", "d": None}
    assert redo.lock_keys(old) == (["k", "d"], [])
