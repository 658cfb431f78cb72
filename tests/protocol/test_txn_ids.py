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


# A node's clock reading and the start of its coordinator process, for the client-id rule.
NOW_MS = 1_717_171_717_171
STARTED_MS = NOW_MS - 500  # within the age bound, so that rule is reached
TOKEN = "0123456789abcdef0123456789abcdef"


def _client_id(begin_ms: int = NOW_MS - 5, node: str = "n0.eu", token: str = TOKEN,
               protocol: Protocol = Protocol.CORNUS) -> str:
    return txn_ids.client_txn_id(begin_ms, node, token, protocol)


@pytest.mark.parametrize("protocol", list(Protocol))
def test_a_client_chosen_id_is_read_as_the_server_ids_are(protocol: Protocol) -> None:
    txn = _client_id(protocol=protocol)
    assert validate_txn(txn) == txn
    assert txn_ids.protocol_of(txn) is protocol
    assert txn_ids.begin_ms_of(txn) == NOW_MS - 5
    assert txn_ids.client_txn_problem(txn, "n0.eu", NOW_MS, STARTED_MS) == ""
    # The longest token fits every backend with the longest node id too.
    assert validate_txn(_client_id(node="n" * 64, token="f" * 32, protocol=protocol))


@pytest.mark.parametrize(("txn", "problem"), [
    (_client_id(node="n1"), "must name the node it is sent to"),
    (_client_id(begin_ms=NOW_MS + 1), "ahead of this node's clock"),
    (_client_id(begin_ms=NOW_MS - txn_ids.CLIENT_BEGIN_MS_AGE_MAX - 1), "behind this node's clock"),
    (_client_id(begin_ms=STARTED_MS), "not after this node's coordinator started"),
    (_client_id(begin_ms=STARTED_MS - 1), "not after this node's coordinator started"),
    (_client_id(token="abc"), "the token must be"),
    (_client_id(token="0123456789ABCDEF"), "the token must be"),
    (_client_id(token="f" * 33), "the token must be"),
    (f"{NOW_MS - 5}.n0.eu.a1b2c3.1.cornus", "the token must be"),  # a server's incarnation
    (f"{NOW_MS - 5}.n0.eu.c{TOKEN}.2.cornus", "the counter field"),
    (f"{NOW_MS - 5}.n0.eu.c{TOKEN}.1", "not a protocol tag"),
    (f"{NOW_MS - 5}.n0.eu.c{TOKEN}.1.paxos", "not a protocol tag"),
    (f"c{TOKEN}.1.cornus", "is not <begin ms>"),
    (f"x{NOW_MS}.n0.eu.c{TOKEN}.1.cornus", "begin time in Unix milliseconds"),
    (f"0{NOW_MS}.n0.eu.c{TOKEN}.1.cornus", "begin time in Unix milliseconds"),
    (_client_id(node="n" * 120), "the limit is 128"),
])
def test_a_bad_client_chosen_id_is_refused_naming_the_problem(txn: str, problem: str) -> None:
    assert problem in txn_ids.client_txn_problem(txn, "n0.eu", NOW_MS, STARTED_MS)


def test_the_begin_bounds_are_inclusive_where_safe() -> None:
    assert txn_ids.client_begin_problem(NOW_MS, NOW_MS, STARTED_MS, 1_000) == ""
    assert txn_ids.client_begin_problem(NOW_MS - 1_000, NOW_MS, NOW_MS - 60_000, 1_000) == ""
    assert txn_ids.client_begin_problem(STARTED_MS + 1, STARTED_MS + 2, STARTED_MS, 1_000) == ""
    # A smaller bound (the node's peer request timeout) is kept to.
    assert "the limit is 200 ms" in txn_ids.client_begin_problem(NOW_MS - 201, NOW_MS, NOW_MS - 60_000, 200)


def test_a_client_chosen_id_is_told_from_a_node_made_one() -> None:
    assert txn_ids.is_client_chosen(_client_id())
    assert not txn_ids.is_client_chosen(txn_ids.new_txn_id(NOW_MS, "n0", "c0ffee", 1, Protocol.CORNUS))
    assert not txn_ids.is_client_chosen("race-0")


def test_a_begin_of_digits_other_than_ascii_is_no_begin() -> None:
    """Found by audit (2026-11-27): str.isdigit takes "²" for a digit, and int() then raised, after
    an owner had registered the execution and before its locks: an orphan until the idle sweep.
    Only ASCII digits make a begin time."""
    assert txn_ids.begin_ms_of("²³.n0.000001.1.cornus") == 0
    assert txn_ids.begin_ms_of("1795797027483.n0.000001.1.cornus") == 1795797027483
