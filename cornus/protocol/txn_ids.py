"""Transaction ids, and what an id tells: its begin time and the protocol the transaction runs.

An id reads `<begin ms>.<coordinator node>.<incarnation>.<counter>.<protocol tag>`. The protocol
is chosen per transaction at begin and never changes, and the id already travels in every message,
timer and log record of the transaction. So the id names the protocol: a participant that gets a
prepare, and recovery that finds a bare record after a crash, both know which protocol machine
owns the transaction, and no record or message format has to grow a field for it.
"""

from __future__ import annotations

from cornus.protocol.config import Protocol

PROTOCOL_TAGS: dict[Protocol, str] = {
    Protocol.CORNUS: "cornus",
    Protocol.TWO_PC: "2pc",
    Protocol.COORDINATOR_LOG: "clog",
}
_PROTOCOL_BY_TAG = {tag: protocol for protocol, tag in PROTOCOL_TAGS.items()}
assert len(_PROTOCOL_BY_TAG) == len(Protocol), "every protocol needs its own tag"


def new_txn_id(begin_ms: int, node: str, incarnation: str, counter: int, protocol: Protocol) -> str:
    assert begin_ms > 0 and counter > 0
    assert "." not in incarnation, "the incarnation is one field of the id"
    # Begin time first: WAIT_DIE orders transactions by it across partitions.
    return f"{begin_ms}.{node}.{incarnation}.{counter}.{PROTOCOL_TAGS[protocol]}"


def protocol_of(txn: str) -> Protocol | None:
    """The protocol an id names; None for an id this runtime did not make (the tag is last, so a
    node id holding dots cannot confuse it). There is no fallback to a node's default protocol:
    nodes with different defaults would then run different machines for one transaction. An id
    without a tag is refused wherever it enters."""
    return _PROTOCOL_BY_TAG.get(txn.rsplit(".", 1)[-1])


def coordinator_of(txn: str) -> str:
    """The coordinator node an id names ("" for an id this runtime did not make); a node id may
    hold dots, so it is what lies between the begin time and the last three fields."""
    fields = txn.split(".")
    return ".".join(fields[1:-3]) if len(fields) >= 5 else ""


def begin_ms_of(txn: str) -> int:
    """WAIT_DIE's age order: the begin time an id starts with (0 for an id this runtime did not make)."""
    head = txn.split(".", 1)[0]
    return int(head) if head.isdigit() else 0
