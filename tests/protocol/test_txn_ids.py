"""Transaction ids name their protocol and begin time, and nothing else is mistaken for one."""

from __future__ import annotations

import pytest

from cornus.protocol import txn_ids
from cornus.protocol.config import Protocol
from storage_adapters.contract import validate_txn


@pytest.mark.parametrize("protocol", list(Protocol))
def test_an_id_names_its_protocol_and_begin_time(protocol: Protocol) -> None:
    # A node id with dots and a protocol's name in it must not confuse the parse.
    txn = txn_ids.new_txn_id(1_717_171_717_171, "n0.cornus.2pc", "a1b2c3", 42, protocol)
    assert validate_txn(txn) == txn  # every backend accepts it
    assert txn_ids.protocol_of(txn) is protocol
    assert txn_ids.begin_ms_of(txn) == 1_717_171_717_171


@pytest.mark.parametrize("txn", ["race-0", "1717171717171.n0.a1b2c3.1", "x.coordinator-log", ""])
def test_ids_the_runtime_did_not_make_name_no_protocol(txn: str) -> None:
    assert txn_ids.protocol_of(txn) is None


def test_begin_time_of_a_foreign_id_sorts_first() -> None:
    assert txn_ids.begin_ms_of("race-0") == 0


def test_the_coordinator_an_id_names() -> None:
    assert txn_ids.coordinator_of("1700000000000.n0.abcdef.1.cornus") == "n0"
    assert txn_ids.coordinator_of("1700000000000.node.with.dots.abcdef.7.2pc") == "node.with.dots"
    assert txn_ids.coordinator_of("not-an-id") == ""
