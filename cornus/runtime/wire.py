"""What nodes say to each other besides the protocol's one-way messages: request/response pairs
for the execution phase (run operations on a partition the receiver owns) and for status.

These are plain values; `services/node_rpc` maps them to protobuf and back. The protocol's own
messages are `cornus.protocol.messages.Message`.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, fields

from cornus.protocol.messages import Message
from cornus.protocol.owner_answer import ExecuteStatus
from storage_adapters.contract import (
    DATA_VALUE_BYTES_MAX,
    NODE_ID_LENGTH_MAX,
    PARTICIPANT_COUNT_MAX,
    TxnState,
    validate_data_key,
    validate_id,
    validate_txn,
)
from storage_adapters.errors import ValidationError

# What the values one execute request reads may add up to, each counted with
# READ_VALUE_OVERHEAD_BYTES (more than its encoding adds around it): an owner refuses a request
# past it as the client's input, before it votes and with nothing of it kept. Its answer must fit
# one message of the peer link (services/node_rpc: 16 MiB by default), with room to spare for the
# envelope; found by audit (2026-11-27): a larger answer was lost on the link, and reported as
# "owner unavailable", so a client retried it for ever. An owner serving its own node holds to it
# too, so an answer never depends on where a partition lives.
READ_BYTES_MAX = 8 * 1024 * 1024
READ_VALUE_OVERHEAD_BYTES = 16


class OpKind(enum.StrEnum):
    GET = "get"  # shared lock, read the value
    PUT = "put"  # exclusive lock, buffer the write
    DELETE = "delete"  # exclusive lock, buffer the delete
    CHECK = "check"  # shared lock, abort the txn unless the value equals `value` (None: absent)


@dataclass(frozen=True, slots=True)
class Op:
    kind: OpKind
    key: str
    value: bytes | None = None


def validate_op(op: Op) -> None:
    """Raise ValidationError unless `op` is well formed (its kind, key and value)."""
    if not isinstance(op.kind, OpKind):
        raise ValidationError(f"unknown op {op.kind!r}")
    validate_data_key(op.key)
    if op.kind is OpKind.PUT and op.value is None:
        raise ValidationError(f"put of {op.key!r} needs a value")
    if op.kind in (OpKind.GET, OpKind.DELETE) and op.value is not None:
        raise ValidationError(f"{op.kind} of {op.key!r} takes no value")
    if op.value is not None and len(op.value) > DATA_VALUE_BYTES_MAX:
        raise ValidationError(f"value of {op.key!r} is {len(op.value)} bytes, the limit is {DATA_VALUE_BYTES_MAX}")


@dataclass(frozen=True, slots=True)
class ExecuteRequest:
    """Run `ops` in order on `partition` for `txn`, taking strict-2PL locks. `abort` True with no
    ops ends the execution phase early (the client aborted): release locks, drop buffered writes."""

    txn: str
    partition: str
    coordinator: str
    ops: tuple[Op, ...]
    abort: bool = False
    # True when the coordinator ran operations on this partition for this txn before: the
    # partition must still hold that execution state. A partition that restarted in between has
    # lost the txn's locks, so what the txn read there may have changed: it must refuse. With no
    # ops it is a refresh: the client is at work elsewhere, so the execution is not idle.
    continued: bool = False
    # Non-empty: a one-shot transaction's request that carries its prepare as well
    # (CommitRequested.prepare_sent). Once `ops` ran, the partition takes
    # Prepare(txn, participants, coordinator) as if it had arrived; if they did not run, it drops it.
    participants: tuple[str, ...] = ()
    # Unix ms after which (plus the clock slack) the receiver must not run it: its sender has given
    # up, and the status call's "not known" counts on no request of a transaction running later
    # (cornus/protocol/status.py). 0: none (a request of an older node).
    deadline_unix_ms: int = 0
    # The most its GETs may read, counted as READ_BYTES_MAX counts them, if less than it: a
    # one-shot's share of what it may read in all. 0: READ_BYTES_MAX.
    read_bytes_max: int = 0


@dataclass(frozen=True, slots=True)
class ExecuteResponse:
    """`values` holds one entry per GET op, in op order."""

    status: ExecuteStatus
    values: tuple[bytes | None, ...] = ()
    detail: str = ""


@dataclass(frozen=True, slots=True)
class StatusRequest:
    """Ask a node about itself, and about `txn` on the partitions it owns when `txn` is set.
    `memory_only`: what it knows of `txn` itself, reading no records (the resolve's question to
    a transaction's coordinator, which must not wait on that node's storage)."""

    txn: str = ""
    memory_only: bool = False


@dataclass(frozen=True, slots=True)
class StatusResponse:
    node: str
    ready: bool
    partitions: tuple[str, ...]
    # For StatusRequest.txn: each owned partition's state of that txn (absent: never logged).
    txn_states: tuple[tuple[str, TxnState], ...] = ()
    in_doubt_count: int = 0
    # For StatusRequest.txn: what this node knows as that txn's coordinator ("" if nothing): an
    # OutcomeStatus value.
    txn_outcome: str = ""
    # The windows this node's configuration sets (cornus.protocol.status.NodeAnswer): 0 from a
    # node of an older version.
    requests_window_ms: int = 0
    kept_window_ms: int = 0
    config_since_unix_ms: int = 0


@dataclass(frozen=True, slots=True)
class Routed:
    """A protocol message between two protocol hosts: `source` and `dest` name a partition or a
    coordinator node (the machines address each other that way); the transport carries it between
    the nodes that own them."""

    source: str
    dest: str
    message: Message


PeerRequest = ExecuteRequest | StatusRequest
PeerResponse = ExecuteResponse | StatusResponse


def carried_prepare_problem(request: ExecuteRequest, partitions: Collection[str]) -> str:
    """What is wrong with the prepare a request carries ("" if nothing): a machine asserts what
    a prepare says, so a malformed one from a peer must stop here."""
    if request.abort or request.continued:
        return "a request that carries a prepare runs a one-shot's operations, once"
    return participants_problem(request.partition, request.participants, partitions)


def participants_problem(partition: str, participants: tuple[str, ...], partitions: Collection[str]) -> str:
    """What is wrong with a prepare's participants as sent to `partition` ("" if nothing): each
    must be one of the cluster's `partitions` (found by audit, 2026-11-28: "p 1" reached the
    participant's record, whose check of it ended the owner's process)."""
    if partition not in participants:
        return f"the prepare's participants {participants[:8]} leave out {partition}"
    if len(participants) > PARTICIPANT_COUNT_MAX or list(participants) != sorted(set(participants)):
        return f"the prepare's participants must be sorted, unique and at most {PARTICIPANT_COUNT_MAX}"
    strangers = [p for p in participants if p not in partitions]
    if strangers:
        return f"the prepare names {strangers[:4]!r}, no partition of this cluster"
    return ""


# Host names found valid: a node hears the same few (its peers and the partitions) in every message,
# some ten times a transaction, and a regular expression each time was 3% of its calls. Names come
# from peers, so the set is bounded all the same, and emptied when full.
_VALID_HOSTS_COUNT_MAX = 4096
_valid_hosts: set[str] = set()


def ids_problem(txn: str, hosts: Iterable[str]) -> str:
    """What is wrong with the ids a peer's message or request names ("" if nothing): a txn id and
    host names (nodes, partitions) that storage refuses would end this process at the first call
    that carries them (found by audit, 2026-11-28), so they stop where they enter."""
    try:
        validate_txn(txn)
        for host in hosts:
            if host not in _valid_hosts:
                validate_id(host, "host name", NODE_ID_LENGTH_MAX)
                if len(_valid_hosts) >= _VALID_HOSTS_COUNT_MAX:
                    _valid_hosts.clear()
                _valid_hosts.add(host)
    except ValidationError as error:
        return str(error)
    return ""


# Each message class's fields but the txn id, found once (dataclasses.fields per message was 2% of
# a node's calls).
_fields_but_txn: dict[type[Message], tuple[str, ...]] = {}


def message_hosts(message: Message) -> Iterator[str]:
    """The host names a protocol message carries in its own fields: every string but the txn id
    (a prepare's participants are `participants_problem`'s)."""
    names = _fields_but_txn.get(type(message))
    if names is None:
        names = _fields_but_txn[type(message)] = tuple(field.name for field in fields(message) if field.name != "txn")
    for name in names:
        value = getattr(message, name)
        if isinstance(value, str):
            yield value


def ops_for_writes(writes: Mapping[str, bytes | None]) -> list[Op]:
    """The operations that make `writes` (None: delete the key)."""
    return [Op(OpKind.DELETE, key) if value is None else Op(OpKind.PUT, key, value) for key, value in writes.items()]
