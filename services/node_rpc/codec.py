"""Maps the runtime's plain values (protocol messages, requests, responses) to `node.proto` and back.

Encoding writes straight into an envelope that already sits inside the frame being built, so the
hot path never copies a sub-message. Decoding checks what proto3 cannot: enum zero values
("unspecified") and empty oneofs are malformed input, never defaults.

Every dataclass maps field for field; `tests/node_rpc/test_codec.py` fails when a dataclass or a
proto message gains a field this module does not carry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cornus.protocol.config import gc_grace_ms_min
from cornus.protocol.messages import (
    Decision,
    DecisionAck,
    DecisionAnswer,
    DecisionQuery,
    Message,
    Prepare,
    ReadOnlyReleased,
    ReleaseReadOnly,
    Vote,
)
from cornus.runtime.config import OP_COUNT_MAX_MAX, PARTITION_COUNT_MAX, TIMER_MS_MAX
from cornus.runtime.wire import (
    ExecuteRequest,
    ExecuteResponse,
    ExecuteStatus,
    Op,
    OpKind,
    PeerRequest,
    PeerResponse,
    Routed,
    StatusRequest,
    StatusResponse,
)
from services.node_rpc._generated import node_pb2 as pb
from storage_adapters.contract import PARTICIPANT_COUNT_MAX, TXN_ID_LENGTH_MAX, TxnState


class MalformedEnvelope(ValueError):
    """An envelope that does not decode to a value: a bug or a version skew on the sender."""


_TXN_STATE_TO_PB: dict[TxnState, int] = {
    TxnState.VOTE_YES: pb.TXN_STATE_VOTE_YES,
    TxnState.COMMIT: pb.TXN_STATE_COMMIT,
    TxnState.ABORT: pb.TXN_STATE_ABORT,
}
_OP_KIND_TO_PB: dict[OpKind, int] = {
    OpKind.GET: pb.OP_KIND_GET,
    OpKind.PUT: pb.OP_KIND_PUT,
    OpKind.DELETE: pb.OP_KIND_DELETE,
    OpKind.CHECK: pb.OP_KIND_CHECK,
}
_EXECUTE_STATUS_TO_PB: dict[ExecuteStatus, int] = {
    ExecuteStatus.OK: pb.EXECUTE_STATUS_OK,
    ExecuteStatus.CONFLICT: pb.EXECUTE_STATUS_CONFLICT,
    ExecuteStatus.CHECK_FAILED: pb.EXECUTE_STATUS_CHECK_FAILED,
    ExecuteStatus.ABORTED: pb.EXECUTE_STATUS_ABORTED,
    ExecuteStatus.NOT_OWNER: pb.EXECUTE_STATUS_NOT_OWNER,
    ExecuteStatus.NOT_READY: pb.EXECUTE_STATUS_NOT_READY,
    ExecuteStatus.INVALID: pb.EXECUTE_STATUS_INVALID,
    ExecuteStatus.UNAVAILABLE: pb.EXECUTE_STATUS_UNAVAILABLE,
}
# An enum member without a wire value would fail only when first sent; fail at import instead.
assert set(_TXN_STATE_TO_PB) == set(TxnState)
assert set(_OP_KIND_TO_PB) == set(OpKind)
assert set(_EXECUTE_STATUS_TO_PB) == set(ExecuteStatus)
_TXN_STATE_FROM_PB = {value: key for key, value in _TXN_STATE_TO_PB.items()}
# A DecisionAck's grace_ms_min past this is malformed: gc_grace_ms_min of the longest storage
# deadline and slack a configuration allows (TIMER_MS_MAX each), so a peer's bug cannot hold a
# coordinator's records for ever.
GRACE_MS_MIN_MAX = gc_grace_ms_min(TIMER_MS_MAX, TIMER_MS_MAX)
# What a Decision, DecisionAck or DecisionAnswer may carry: a decision, never a vote (found by
# audit: VOTE_YES passed, and the machine it reached asserted on it, ending the node).
_DECISION_FROM_PB = {value: key for key, value in _TXN_STATE_TO_PB.items() if key.is_decision}
_OP_KIND_FROM_PB = {value: key for key, value in _OP_KIND_TO_PB.items()}
_EXECUTE_STATUS_FROM_PB = {value: key for key, value in _EXECUTE_STATUS_TO_PB.items()}
assert 0 not in _TXN_STATE_FROM_PB and 0 not in _OP_KIND_FROM_PB and 0 not in _EXECUTE_STATUS_FROM_PB


def _enum_from_pb(table: dict[int, Any], value: int, what: str) -> Any:
    try:
        return table[value]
    except KeyError:
        raise MalformedEnvelope(f"{what}: unknown or unspecified enum value {value}") from None


def _not_negative(value: int, what: str) -> int:
    # A time or a count: negative, it would read as none where 0 means "none" (found by audit: a
    # negative request deadline turned the owner's deadline check off).
    if value < 0:
        raise MalformedEnvelope(f"{what}: {value} is negative")
    return value


def _decision_from_pb(value: int, what: str) -> TxnState:
    decision: TxnState = _enum_from_pb(_TXN_STATE_FROM_PB, value, what)
    if value not in _DECISION_FROM_PB:
        raise MalformedEnvelope(f"{what}: {decision.value} is no decision (COMMIT or ABORT)")
    return decision


# --- Encoding: value -> the envelope's body ---
# Each encoder marks its body present first: a value whose fields are all proto3 defaults (empty
# strings, no items) must still select its oneof member.


def _encode_prepare(envelope: pb.PeerEnvelope, value: Prepare) -> None:
    body = envelope.prepare
    body.SetInParent()
    body.txn = value.txn
    body.participants.extend(value.participants)
    body.coordinator = value.coordinator


def _encode_release_read_only(envelope: pb.PeerEnvelope, value: ReleaseReadOnly) -> None:
    body = envelope.release_read_only
    body.SetInParent()
    body.txn = value.txn
    body.partition = value.partition


def _encode_read_only_released(envelope: pb.PeerEnvelope, value: ReadOnlyReleased) -> None:
    body = envelope.read_only_released
    body.SetInParent()
    body.txn = value.txn
    body.partition = value.partition
    body.held = value.held


def _encode_vote(envelope: pb.PeerEnvelope, value: Vote) -> None:
    body = envelope.vote
    body.SetInParent()
    body.txn = value.txn
    body.partition = value.partition
    body.yes = value.yes
    body.unknown = value.unknown


def _encode_decision(envelope: pb.PeerEnvelope, value: Decision) -> None:
    body = envelope.decision
    body.SetInParent()
    body.txn = value.txn
    body.decision = _TXN_STATE_TO_PB[value.decision]


def _encode_decision_ack(envelope: pb.PeerEnvelope, value: DecisionAck) -> None:
    body = envelope.decision_ack
    body.SetInParent()
    body.txn = value.txn
    body.partition = value.partition
    body.decision = _TXN_STATE_TO_PB[value.decision]
    body.grace_ms_min = value.grace_ms_min


def _encode_decision_query(envelope: pb.PeerEnvelope, value: DecisionQuery) -> None:
    body = envelope.decision_query
    body.SetInParent()
    body.txn = value.txn
    body.sender = value.sender


def _encode_decision_answer(envelope: pb.PeerEnvelope, value: DecisionAnswer) -> None:
    body = envelope.decision_answer
    body.SetInParent()
    body.txn = value.txn
    body.sender = value.sender
    if value.decision is not None:
        body.decision = _TXN_STATE_TO_PB[value.decision]


def _encode_execute_request(envelope: pb.PeerEnvelope, value: ExecuteRequest) -> None:
    body = envelope.execute_request
    body.SetInParent()
    body.txn = value.txn
    body.partition = value.partition
    body.coordinator = value.coordinator
    body.abort = value.abort
    body.continued = value.continued
    body.participants.extend(value.participants)
    body.deadline_unix_ms = value.deadline_unix_ms
    body.read_bytes_max = value.read_bytes_max
    ops = body.ops
    for op in value.ops:
        wire_op = ops.add()
        wire_op.kind = _OP_KIND_TO_PB[op.kind]
        wire_op.key = op.key
        if op.value is not None:
            wire_op.value = op.value


def _encode_execute_response(envelope: pb.PeerEnvelope, value: ExecuteResponse) -> None:
    body = envelope.execute_response
    body.SetInParent()
    body.status = _EXECUTE_STATUS_TO_PB[value.status]
    body.detail = value.detail
    values = body.values
    for item in value.values:
        wire_item = values.add()
        if item is not None:
            wire_item.value = item


def _encode_status_request(envelope: pb.PeerEnvelope, value: StatusRequest) -> None:
    body = envelope.status_request
    body.SetInParent()
    body.txn = value.txn
    body.memory_only = value.memory_only


def encode_status_response(body: pb.StatusResponse, value: StatusResponse) -> None:
    """Fill `body`; public because the unary Status call returns a bare StatusResponse."""
    body.SetInParent()
    body.node = value.node
    body.ready = value.ready
    body.partitions.extend(value.partitions)
    states = body.txn_states
    for partition, state in value.txn_states:
        wire_state = states.add()
        wire_state.partition = partition
        wire_state.state = _TXN_STATE_TO_PB[state]
    body.in_doubt_count = value.in_doubt_count
    body.txn_outcome = value.txn_outcome
    body.requests_window_ms = value.requests_window_ms
    body.kept_window_ms = value.kept_window_ms
    body.config_since_unix_ms = value.config_since_unix_ms


def _encode_status_response(envelope: pb.PeerEnvelope, value: StatusResponse) -> None:
    encode_status_response(envelope.status_response, value)


_ENCODERS: dict[type, Callable[[pb.PeerEnvelope, Any], None]] = {
    Prepare: _encode_prepare,
    ReleaseReadOnly: _encode_release_read_only,
    ReadOnlyReleased: _encode_read_only_released,
    Vote: _encode_vote,
    Decision: _encode_decision,
    DecisionAck: _encode_decision_ack,
    DecisionQuery: _encode_decision_query,
    DecisionAnswer: _encode_decision_answer,
    ExecuteRequest: _encode_execute_request,
    ExecuteResponse: _encode_execute_response,
    StatusRequest: _encode_status_request,
    StatusResponse: _encode_status_response,
}
MESSAGE_TYPES: tuple[type, ...] = (
    Prepare, ReleaseReadOnly, ReadOnlyReleased, Vote, Decision, DecisionAck, DecisionQuery, DecisionAnswer
)
_MESSAGE_TYPE_SET = frozenset(MESSAGE_TYPES)
REQUEST_TYPES: tuple[type, ...] = (ExecuteRequest, StatusRequest)
RESPONSE_TYPES: tuple[type, ...] = (ExecuteResponse, StatusResponse)


def encode(envelope: pb.PeerEnvelope, value: Routed | Message | PeerRequest | PeerResponse) -> None:
    """Write `value` into `envelope`'s body. The envelope's kind and ids are the caller's."""
    if type(value) is Routed:
        route = envelope.route
        route.SetInParent()
        route.source = value.source
        route.dest = value.dest
        value = value.message
        if type(value) not in _MESSAGE_TYPE_SET:
            raise TypeError(f"a Routed must carry a protocol message, not {type(value).__name__}")
    try:
        encoder = _ENCODERS[type(value)]
    except KeyError:
        raise TypeError(f"no wire encoding for {type(value).__name__}") from None
    encoder(envelope, value)


# --- Decoding: the envelope's body -> value ---


def _count_at_most(items: Any, count_max: int, what: str) -> Any:
    """`items` (a repeated field), refused before anything is built from it when longer than any
    node sends (found by audit: a 16 MiB frame of minimal ops became millions of Op objects)."""
    if len(items) > count_max:
        raise MalformedEnvelope(f"{what} holds {len(items)} items, the limit is {count_max}")
    return items


def _decode_prepare(body: pb.Prepare) -> Prepare:
    participants = _count_at_most(body.participants, PARTICIPANT_COUNT_MAX, "Prepare.participants")
    return Prepare(txn=body.txn, participants=tuple(participants), coordinator=body.coordinator)


def _decode_release_read_only(body: pb.ReleaseReadOnly) -> ReleaseReadOnly:
    return ReleaseReadOnly(txn=body.txn, partition=body.partition)


def _decode_read_only_released(body: pb.ReadOnlyReleased) -> ReadOnlyReleased:
    return ReadOnlyReleased(txn=body.txn, partition=body.partition, held=body.held)


def _decode_vote(body: pb.Vote) -> Vote:
    return Vote(txn=body.txn, partition=body.partition, yes=body.yes, unknown=body.unknown)


def _decode_decision(body: pb.Decision) -> Decision:
    return Decision(txn=body.txn, decision=_decision_from_pb(body.decision, "Decision.decision"))


def _decode_decision_ack(body: pb.DecisionAck) -> DecisionAck:
    if not 0 <= body.grace_ms_min <= GRACE_MS_MIN_MAX:
        raise MalformedEnvelope(f"DecisionAck.grace_ms_min {body.grace_ms_min} out of range")
    return DecisionAck(
        txn=body.txn,
        partition=body.partition,
        decision=_decision_from_pb(body.decision, "DecisionAck.decision"),
        grace_ms_min=body.grace_ms_min,
    )


def _decode_decision_query(body: pb.DecisionQuery) -> DecisionQuery:
    return DecisionQuery(txn=body.txn, sender=body.sender)


def _decode_decision_answer(body: pb.DecisionAnswer) -> DecisionAnswer:
    decision = (
        _decision_from_pb(body.decision, "DecisionAnswer.decision")
        if body.HasField("decision")
        else None
    )
    return DecisionAnswer(txn=body.txn, sender=body.sender, decision=decision)


def _decode_execute_request(body: pb.ExecuteRequest) -> ExecuteRequest:
    _count_at_most(body.ops, OP_COUNT_MAX_MAX, "ExecuteRequest.ops")
    _count_at_most(body.participants, PARTICIPANT_COUNT_MAX, "ExecuteRequest.participants")
    ops = tuple(
        Op(
            kind=_enum_from_pb(_OP_KIND_FROM_PB, op.kind, "Op.kind"),
            key=op.key,
            value=op.value if op.HasField("value") else None,
        )
        for op in body.ops
    )
    return ExecuteRequest(
        txn=body.txn,
        partition=body.partition,
        coordinator=body.coordinator,
        ops=ops,
        abort=body.abort,
        continued=body.continued,
        participants=tuple(body.participants),
        deadline_unix_ms=_not_negative(body.deadline_unix_ms, "ExecuteRequest.deadline_unix_ms"),
        read_bytes_max=body.read_bytes_max,
    )


def _decode_execute_response(body: pb.ExecuteResponse) -> ExecuteResponse:
    return ExecuteResponse(
        status=_enum_from_pb(_EXECUTE_STATUS_FROM_PB, body.status, "ExecuteResponse.status"),
        values=tuple(item.value if item.HasField("value") else None
                     for item in _count_at_most(body.values, OP_COUNT_MAX_MAX, "ExecuteResponse.values")),
        detail=body.detail,
    )


def _decode_status_request(body: pb.StatusRequest) -> StatusRequest:
    return StatusRequest(txn=body.txn, memory_only=body.memory_only)


def decode_status_response(body: pb.StatusResponse) -> StatusResponse:
    return StatusResponse(
        node=body.node,
        ready=body.ready,
        partitions=tuple(_count_at_most(body.partitions, PARTITION_COUNT_MAX, "StatusResponse.partitions")),
        txn_states=tuple(
            (item.partition, _enum_from_pb(_TXN_STATE_FROM_PB, item.state, "StatusResponse.txn_states"))
            for item in _count_at_most(body.txn_states, PARTITION_COUNT_MAX, "StatusResponse.txn_states")
        ),
        in_doubt_count=body.in_doubt_count,
        txn_outcome=body.txn_outcome,
        requests_window_ms=body.requests_window_ms,
        kept_window_ms=body.kept_window_ms,
        config_since_unix_ms=body.config_since_unix_ms,
    )


# Keyed by the oneof member name, which is what `WhichOneof` returns.
_MESSAGE_DECODERS: dict[str, Callable[[Any], Message]] = {
    "prepare": _decode_prepare,
    "release_read_only": _decode_release_read_only,
    "read_only_released": _decode_read_only_released,
    "vote": _decode_vote,
    "decision": _decode_decision,
    "decision_ack": _decode_decision_ack,
    "decision_query": _decode_decision_query,
    "decision_answer": _decode_decision_answer,
}
_REQUEST_DECODERS: dict[str, Callable[[Any], PeerRequest]] = {
    "execute_request": _decode_execute_request,
    "status_request": _decode_status_request,
}
_RESPONSE_DECODERS: dict[str, Callable[[Any], PeerResponse]] = {
    "execute_response": _decode_execute_response,
    "status_response": decode_status_response,
}
_ONEOF_NAMES = {field.name for field in pb.PeerEnvelope.DESCRIPTOR.oneofs_by_name["body"].fields}
assert {*_MESSAGE_DECODERS, *_REQUEST_DECODERS, *_RESPONSE_DECODERS, "request_failed"} == _ONEOF_NAMES


def _decode(envelope: pb.PeerEnvelope, decoders: dict[str, Callable[[Any], Any]], what: str) -> Any:
    name = envelope.WhichOneof("body")
    decoder = decoders.get(name) if name is not None else None
    if decoder is None:
        raise MalformedEnvelope(f"envelope of kind {what} carries body {name!r}")
    body = getattr(envelope, name)
    # Every body naming a transaction names one no node makes longer (found by audit: an id of
    # thousands of digits reached the core, where reading its begin time raised).
    txn = getattr(body, "txn", "")
    if len(txn) > TXN_ID_LENGTH_MAX:
        raise MalformedEnvelope(f"{name}.txn is {len(txn)} characters, the limit is {TXN_ID_LENGTH_MAX}")
    return decoder(body)


def decode_message(envelope: pb.PeerEnvelope) -> Routed | Message:
    """The message, wrapped in the Routed it was sent as, if any."""
    message = _decode(envelope, _MESSAGE_DECODERS, "message")
    if envelope.HasField("route"):
        route = envelope.route
        return Routed(source=route.source, dest=route.dest, message=message)
    return message


def decode_request(envelope: pb.PeerEnvelope) -> PeerRequest:
    return _decode(envelope, _REQUEST_DECODERS, "request")


def decode_response(envelope: pb.PeerEnvelope) -> PeerResponse:
    """The response, or MalformedEnvelope; a `request_failed` body is the caller's to check first."""
    return _decode(envelope, _RESPONSE_DECODERS, "response")
