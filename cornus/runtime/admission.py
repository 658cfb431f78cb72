"""Limits at the edge: what one transaction may grow to, and the id its client chose, checked
before any of its operations run.

A transaction that would outgrow what a record or a commit can hold is refused here, with nothing
changed, naming the limit; past this point nothing may discover it (a machine that met an
oversized participant list or redo could only hang or crash)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from cornus.protocol import txn_ids
from cornus.protocol.config import Protocol
from cornus.runtime import redo as redo_codec
from cornus.runtime.config import RuntimeLimits
from cornus.runtime.outcome import ClientTxnBeginRefused, ClientTxnRefused
from cornus.runtime.wire import Op, OpKind
from storage_adapters.contract import DATA_BATCH_COUNT_MAX, REDO_BYTES_MAX
from storage_adapters.errors import ValidationError

# The framing redo_bundle adds per partition: a length prefix for the name and one for the redo.
_BUNDLE_BYTES_PER_PARTITION = 8

Writes = Mapping[str, Mapping[str, bytes | None]]


def check_growth(
    protocol: Protocol,
    limits: RuntimeLimits,
    touched: Writes,
    op_count: int,
    ops_by_partition: Mapping[str, Sequence[Op]],
) -> None:
    """Raise ValidationError unless the transaction, having run `op_count` operations with the
    writes `touched` (partition -> key -> value; an empty map for a partition only read), may run
    `ops_by_partition` as well."""
    new_ops = sum(len(ops) for ops in ops_by_partition.values())
    if op_count + new_ops > limits.txn_op_count_max:
        raise ValidationError(
            f"the transaction would run {op_count + new_ops} operations; the limit is "
            f"{limits.txn_op_count_max} (txn_op_count_max): split it"
        )
    partitions = set(touched) | set(ops_by_partition)
    if len(partitions) > limits.txn_partition_count_max:
        raise ValidationError(
            f"the transaction would touch {len(partitions)} partitions; the limit is "
            f"{limits.txn_partition_count_max} (txn_partition_count_max): split it"
        )
    redo_sizes: dict[str, int] = {}
    for partition in sorted(partitions):
        projected = dict(touched.get(partition, {}))
        projected.update(
            (op.key, op.value) for op in ops_by_partition.get(partition, ()) if op.kind in (OpKind.PUT, OpKind.DELETE)
        )
        if not projected:
            continue
        size = redo_codec.encoded_size(projected)
        if size > REDO_BYTES_MAX or len(projected) > DATA_BATCH_COUNT_MAX:
            raise ValidationError(
                f"the writes of this transaction to partition {partition} would take {size} bytes and "
                f"{len(projected)} keys; the limits are {REDO_BYTES_MAX} bytes (REDO_BYTES_MAX) and "
                f"{DATA_BATCH_COUNT_MAX} keys (DATA_BATCH_COUNT_MAX) per partition: split it"
            )
        redo_sizes[partition] = size
    if protocol is Protocol.COORDINATOR_LOG:
        bundle = _bundle_size(redo_sizes)
        if bundle > REDO_BYTES_MAX:
            raise ValidationError(
                f"coordinator-log keeps the redo of every written partition in one coordinator record, which "
                f"would take {bundle} bytes; the limit is {REDO_BYTES_MAX} (REDO_BYTES_MAX): write less, or "
                f"use the cornus or 2pc protocol, which keep each partition's redo in its own record"
            )


def one_shot_redo(protocol: Protocol, by_partition: Mapping[str, Sequence[Op]]) -> dict[str, bytes] | None:
    """Each partition's redo if the operations run as a one-shot (every partition votes with its
    request, so its redo also names the keys it only read: redo.py), or None when a redo that
    names them would outgrow a record; the transaction then runs its operations first and
    commits after, where reads need no record. The writes alone passed check_growth."""
    redo_by_partition: dict[str, bytes] = {}
    for partition, ops in by_partition.items():
        writes: dict[str, bytes | None] = {}
        for op in ops:
            if op.kind is OpKind.PUT or op.kind is OpKind.DELETE:
                writes[op.key] = op.value if op.kind is OpKind.PUT else None
        reads = [key for key in dict.fromkeys(op.key for op in ops) if key not in writes]
        redo = redo_codec.encode(writes, reads)
        if len(redo) > REDO_BYTES_MAX:
            return None
        redo_by_partition[partition] = redo
    sizes = {partition: len(redo) for partition, redo in redo_by_partition.items()}
    if protocol is Protocol.COORDINATOR_LOG and _bundle_size(sizes) > REDO_BYTES_MAX:
        return None
    return redo_by_partition


def _bundle_size(redo_sizes: Mapping[str, int]) -> int:
    return sum(size + len(p.encode()) + _BUNDLE_BYTES_PER_PARTITION for p, size in redo_sizes.items())


def client_txn_age_ms_max(timeout_ms_peer_request: int) -> int:
    """How far behind the node's clock a client-chosen id may begin (GET /healthz says it, so that a
    client dates its ids early by less). Capped at the peer request timeout as well: the status
    call's "a request may still be on its way" window starts with it (status.requests_window_ms),
    and an id arriving later than that could run after "not known" was said of it."""
    return min(txn_ids.CLIENT_BEGIN_MS_AGE_MAX, timeout_ms_peer_request)


def check_client_txn(
    txn: object, protocol: Protocol, node_id: str, *, now_ms: int, started_ms: int, timeout_ms_peer_request: int,
) -> str:
    """`txn` if node `node_id`, whose coordinator process started at `started_ms` (wall clock),
    may run a one-shot under that client-chosen id with `protocol` now; else ClientTxnRefused (its
    form) or ClientTxnBeginRefused (its begin), with nothing changed. Whether the node already
    knows the id is its own memory's to say."""
    if not isinstance(txn, str):
        raise ClientTxnRefused(f"txn must be a string, got {type(txn).__name__}")
    problem = txn_ids.client_txn_format_problem(txn, node_id)
    if problem:
        # An id whose only fault is to name another node: a proxy in front of several nodes may
        # have delivered the same request to that one first (found by audit: taken for "nothing
        # ran", it was run again).
        named = txn_ids.coordinator_of(txn)
        named_another = bool(named) and named != node_id and not txn_ids.client_txn_format_problem(txn, named)
        raise ClientTxnRefused(problem, may_have_run=named_another)
    if txn_ids.protocol_of(txn) is not protocol:
        # The id names the protocol every node runs it with; a request that asks for another says
        # two things, and which it meant is unknown.
        raise ClientTxnRefused(f"txn {txn!r} names protocol {txn_ids.protocol_of(txn)}, the request asks for "
                               f"{protocol.value}")
    age_ms_max = client_txn_age_ms_max(timeout_ms_peer_request)
    problem = txn_ids.client_begin_problem(txn_ids.begin_ms_of(txn), now_ms, started_ms, age_ms_max)
    if problem:
        # Too old, or begun before this process: how a second delivery after the first ran looks.
        # A begin ahead of the clock was ahead at any earlier delivery too.
        raise ClientTxnBeginRefused(f"txn {txn!r}: {problem}", may_have_run=txn_ids.begin_ms_of(txn) <= now_ms)
    return txn
