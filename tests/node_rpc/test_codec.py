"""Every dataclass crosses the wire and comes back equal, field for field.

Values are built from each dataclass's own fields and type hints, so a field added to a dataclass
(or to the .proto) without teaching the codec fails here loudly rather than vanishing in transit.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from typing import Any

import pytest

from cornus.protocol.messages import DecisionAck, Message
from cornus.runtime.wire import Op, PeerRequest, PeerResponse, Routed
from services.node_rpc import codec
from services.node_rpc._generated import node_pb2 as pb
from storage_adapters.contract import TxnState

ALL_TYPES = (*codec.MESSAGE_TYPES, *codec.REQUEST_TYPES, *codec.RESPONSE_TYPES)
# Proto message for each dataclass (nested ones too), by the shared name.
PROTO_FOR = {cls: getattr(pb, cls.__name__) for cls in (*ALL_TYPES, Op)}
# Proto fields with no dataclass field of the same name, and why.
PROTO_ONLY_FIELDS: dict[type, set[str]] = {}


def test_codec_covers_every_wire_type() -> None:
    assert set(codec.MESSAGE_TYPES) == set(typing.get_args(Message))
    assert set(codec.REQUEST_TYPES) == set(typing.get_args(PeerRequest))
    assert set(codec.RESPONSE_TYPES) == set(typing.get_args(PeerResponse))


@pytest.mark.parametrize("cls", PROTO_FOR, ids=lambda cls: cls.__name__)
def test_dataclass_and_proto_fields_match(cls: type) -> None:
    dataclass_fields = {field.name for field in dataclasses.fields(cls)}
    proto_fields = set(PROTO_FOR[cls].DESCRIPTOR.fields_by_name) - PROTO_ONLY_FIELDS.get(cls, set())
    assert dataclass_fields == proto_fields, f"{cls.__name__}: dataclass and node.proto disagree"


def _members(hint: type[enum.Enum], where: str) -> list[Any]:
    """The members a field may carry: a decision field's TxnState is COMMIT or ABORT, never a vote
    (the codec refuses one, test_a_decision_that_is_no_decision_is_malformed)."""
    if where == "decision":
        return [member for member in hint if member is not TxnState.VOTE_YES]
    return list(hint)


def _is_optional(hint: Any) -> bool:
    return isinstance(hint, types.UnionType) and type(None) in typing.get_args(hint)


def _sample(hint: Any, seed: int, where: str) -> Any:
    """A value of type `hint` that differs from every default (seed varies enum members)."""
    if _is_optional(hint):
        (inner,) = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        return _sample(inner, seed, where)
    if typing.get_origin(hint) is tuple:
        args = typing.get_args(hint)
        if Ellipsis not in args:  # fixed shape, e.g. tuple[str, TxnState]
            return tuple(_sample(arg, seed, where) for arg in args)
        element = args[0]
        values = [_sample(element, seed + index, where) for index in range(3)]
        if _is_optional(element):
            values.insert(1, None)  # a None between values must keep its position
        return tuple(values)
    if isinstance(hint, type):
        if issubclass(hint, enum.Enum):
            members = _members(hint, where)
            return members[seed % len(members)]
        if hint is bool:
            return True
        if hint is int:
            return 7 + seed
        if hint is str:
            return f"{where}-{seed}-é"  # non-ASCII: strings must survive UTF-8
        if hint is bytes:
            return bytes([0, 255, seed % 256]) + b"payload"
        if dataclasses.is_dataclass(hint):
            return _instance(hint, seed)
    raise AssertionError(f"no sample for {hint!r} ({where}): teach this test and services/node_rpc/codec.py")


def _instance(cls: type, seed: int) -> Any:
    hints = typing.get_type_hints(cls)
    return cls(**{field.name: _sample(hints[field.name], seed, field.name) for field in dataclasses.fields(cls)})


def _empty_instance(cls: type) -> Any:
    """Every field at the value proto3 does not store (empty, false, zero, None), enums aside."""
    hints = typing.get_type_hints(cls)
    values = {}
    for field in dataclasses.fields(cls):
        hint = hints[field.name]
        if _is_optional(hint):
            values[field.name] = None
        elif typing.get_origin(hint) is tuple:
            values[field.name] = ()
        elif isinstance(hint, type) and issubclass(hint, enum.Enum):
            values[field.name] = _members(hint, field.name)[0]
        else:
            values[field.name] = hint()
    return cls(**values)


def _optional_none_variants(cls: type) -> list[Any]:
    """One instance per optional field, with that field None and the others full."""
    hints = typing.get_type_hints(cls)
    full = _instance(cls, 0)
    return [
        dataclasses.replace(full, **{field.name: None})
        for field in dataclasses.fields(cls)
        if _is_optional(hints[field.name])
    ]


def _enum_variants(cls: type) -> list[Any]:
    """Enough instances that every member of every enum the type holds crosses the wire."""
    hints = typing.get_type_hints(cls)
    member_count = 1
    for field in dataclasses.fields(cls):
        for arg in (hints[field.name], *typing.get_args(hints[field.name])):
            if isinstance(arg, type) and issubclass(arg, enum.Enum):
                member_count = max(member_count, len(arg))
    return [_instance(cls, seed) for seed in range(member_count)]


def _round_trip(value: Any) -> Any:
    envelope = pb.PeerEnvelope()
    codec.encode(envelope, value)
    # Through bytes, as on the wire.
    envelope = pb.PeerEnvelope.FromString(envelope.SerializeToString())
    if type(value) in codec.MESSAGE_TYPES or type(value) is Routed:
        return codec.decode_message(envelope)
    if type(value) in codec.REQUEST_TYPES:
        return codec.decode_request(envelope)
    return codec.decode_response(envelope)


def _assert_all_fields_present(message: Any, where: str) -> None:
    """Every field of the proto message was written: catches a codec that forgets one."""
    present = {descriptor.name for descriptor, _ in message.ListFields()}
    missing = set(message.DESCRIPTOR.fields_by_name) - present
    assert not missing, f"{where}: codec never wrote {sorted(missing)}"
    for descriptor, value in message.ListFields():
        if descriptor.message_type is not None:
            nested = value[0] if descriptor.is_repeated else value
            _assert_all_fields_present(nested, f"{where}.{descriptor.name}")


@pytest.mark.parametrize("cls", ALL_TYPES, ids=lambda cls: cls.__name__)
def test_round_trip_every_field(cls: type) -> None:
    variants = [_instance(cls, 0), _empty_instance(cls), *_optional_none_variants(cls), *_enum_variants(cls)]
    for value in variants:
        decoded = _round_trip(value)
        assert type(decoded) is cls
        assert decoded == value
        for field in dataclasses.fields(cls):
            # Equality alone would accept a list for a tuple; the runtime hashes these values.
            assert type(getattr(decoded, field.name)) is type(getattr(value, field.name)), field.name

    envelope = pb.PeerEnvelope()
    codec.encode(envelope, _instance(cls, 0))
    body_name = envelope.WhichOneof("body")
    assert body_name is not None
    _assert_all_fields_present(getattr(envelope, body_name), cls.__name__)


def test_routed_fields_match_route_plus_body() -> None:
    # The Routed's message travels as the envelope body; its other fields as the Route header.
    route_fields = set(pb.Route.DESCRIPTOR.fields_by_name)
    assert {field.name for field in dataclasses.fields(Routed)} == {*route_fields, "message"}


@pytest.mark.parametrize("cls", codec.MESSAGE_TYPES, ids=lambda cls: cls.__name__)
def test_routed_round_trip(cls: type) -> None:
    for value in (
        Routed(source="p-1", dest="coordinator:n2", message=_instance(cls, 0)),
        Routed(source="", dest="", message=_empty_instance(cls)),
    ):
        assert _round_trip(value) == value
    # A bare message must not come back wrapped.
    assert type(_round_trip(_empty_instance(cls))) is cls
    envelope = pb.PeerEnvelope()
    codec.encode(envelope, Routed(source="a", dest="b", message=_instance(cls, 0)))
    _assert_all_fields_present(envelope.route, "Route")


def test_routed_must_carry_a_message() -> None:
    with pytest.raises(TypeError):
        codec.encode(pb.PeerEnvelope(), Routed(source="a", dest="b", message=_instance(codec.REQUEST_TYPES[0], 0)))


def test_op_value_none_and_empty_differ() -> None:
    request_type = codec.REQUEST_TYPES[0]
    for value in (None, b""):
        sample = _instance(request_type, 0)
        ops = tuple(dataclasses.replace(op, value=value) for op in sample.ops)
        assert _round_trip(dataclasses.replace(sample, ops=ops)).ops == ops


def test_empty_envelope_is_malformed() -> None:
    with pytest.raises(codec.MalformedEnvelope):
        codec.decode_message(pb.PeerEnvelope())
    with pytest.raises(codec.MalformedEnvelope):
        codec.decode_request(pb.PeerEnvelope())
    with pytest.raises(codec.MalformedEnvelope):
        codec.decode_response(pb.PeerEnvelope())


def test_body_of_the_wrong_kind_is_malformed() -> None:
    envelope = pb.PeerEnvelope()
    codec.encode(envelope, _instance(codec.MESSAGE_TYPES[0], 0))
    with pytest.raises(codec.MalformedEnvelope):
        codec.decode_request(envelope)
    with pytest.raises(codec.MalformedEnvelope):
        codec.decode_response(envelope)


def test_unspecified_enum_is_malformed() -> None:
    envelope = pb.PeerEnvelope()
    envelope.decision.txn = "t"  # decision left at TXN_STATE_UNSPECIFIED
    with pytest.raises(codec.MalformedEnvelope, match=r"Decision\.decision"):
        codec.decode_message(envelope)
    envelope = pb.PeerEnvelope()
    envelope.execute_request.ops.add().key = "k"  # kind left at OP_KIND_UNSPECIFIED
    with pytest.raises(codec.MalformedEnvelope, match=r"Op\.kind"):
        codec.decode_request(envelope)


def test_unknown_type_is_refused() -> None:
    with pytest.raises(TypeError):
        codec.encode(pb.PeerEnvelope(), object())  # type: ignore[arg-type]


@pytest.mark.parametrize("body", ["decision", "decision_ack", "decision_answer"])
def test_a_decision_that_is_no_decision_is_malformed(body: str) -> None:
    """Found by audit (2026-11-27): any TxnState was accepted as a decision, VOTE_YES too, and the
    machine it reached asserted on it (a participant's decide, a coordinator's adopted ack), so one
    such message from a peer (a bug, a version skew) ended the receiving node."""
    envelope = pb.PeerEnvelope()
    message = getattr(envelope, body)
    message.txn = "t"
    message.decision = pb.TXN_STATE_VOTE_YES
    with pytest.raises(codec.MalformedEnvelope, match="COMMIT or ABORT"):
        codec.decode_message(envelope)


def test_a_negative_request_deadline_is_malformed() -> None:
    """Found by audit (2026-11-27): a negative deadline_unix_ms from a peer came out of
    status.request_deadline_ms as the deadline, and status.request_expired counts only one above
    zero: the owner's deadline check was off for that request."""
    envelope = pb.PeerEnvelope()
    codec.encode(envelope, _instance(codec.REQUEST_TYPES[0], 0))
    assert envelope.WhichOneof("body") == "execute_request"
    envelope.execute_request.deadline_unix_ms = -1
    with pytest.raises(codec.MalformedEnvelope, match="deadline_unix_ms"):
        codec.decode_request(envelope)


def test_a_decision_ack_carries_its_sender_s_grace_and_a_grace_out_of_range_is_malformed() -> None:
    """The least grace a participant's calls need travels with its acknowledgement (collection
    waits out the longest), and one no configuration allows is a peer's bug, refused."""
    envelope = pb.PeerEnvelope()
    codec.encode(envelope, DecisionAck("t", "p0", TxnState.COMMIT, grace_ms_min=31_000))
    assert codec.decode_message(envelope) == DecisionAck("t", "p0", TxnState.COMMIT, grace_ms_min=31_000)
    for grace_ms in (-1, codec.GRACE_MS_MIN_MAX + 1):
        envelope.decision_ack.grace_ms_min = grace_ms
        with pytest.raises(codec.MalformedEnvelope, match="grace_ms_min"):
            codec.decode_message(envelope)


def test_counts_and_ids_past_what_any_node_sends_are_malformed_before_anything_is_built() -> None:
    """Found by audit (2026-11-27): a peer's frame was decoded whole into Python objects before
    any count was checked (a 16 MiB frame of minimal ops built millions of Op objects, stalling
    the loop), and a txn id of thousands of digits reached the core, where reading its begin
    time raised. Lists and ids past what any node sends are refused as malformed."""
    from cornus.runtime.config import OP_COUNT_MAX_MAX
    from storage_adapters.contract import PARTICIPANT_COUNT_MAX, TXN_ID_LENGTH_MAX

    long_txn = pb.PeerEnvelope()
    long_txn.decision.txn = "1" * (TXN_ID_LENGTH_MAX + 1) + ".n0.a.1.cornus"
    long_txn.decision.decision = pb.TXN_STATE_COMMIT
    with pytest.raises(codec.MalformedEnvelope, match="txn"):
        codec.decode_message(long_txn)
    many_ops = pb.PeerEnvelope()
    many_ops.execute_request.txn = "1.n0.a.1.cornus"
    many_ops.execute_request.ops.extend([pb.Op(kind=pb.OP_KIND_GET, key="k")] * (OP_COUNT_MAX_MAX + 1))
    with pytest.raises(codec.MalformedEnvelope, match="ops"):
        codec.decode_request(many_ops)
    many_participants = pb.PeerEnvelope()
    many_participants.prepare.txn = "1.n0.a.1.cornus"
    many_participants.prepare.participants.extend(["p"] * (PARTICIPANT_COUNT_MAX + 1))
    with pytest.raises(codec.MalformedEnvelope, match="participants"):
        codec.decode_message(many_participants)
    many_values = pb.PeerEnvelope()
    many_values.execute_response.status = pb.EXECUTE_STATUS_OK
    many_values.execute_response.values.extend([pb.OptionalBytes()] * (OP_COUNT_MAX_MAX + 1))
    with pytest.raises(codec.MalformedEnvelope, match="values"):
        codec.decode_response(many_values)
