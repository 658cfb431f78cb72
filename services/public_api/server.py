"""The public gRPC API of a node (grpc.aio): `cornus.public.v1.Cornus`, the twin of the REST API in
`services/api/rest.py`, with the standard `grpc.health.v1.Health` service (SERVING only once the
node has recovered) and server reflection beside it.

Outcomes are response bodies, not error statuses: an aborted transaction is an OK call whose
outcome is OUTCOME_ABORTED, as REST's body says "aborted". Error statuses mean the call was refused
and nothing changed, except DEADLINE_EXCEEDED of a call whose commit had begun, which goes on
without the caller and may commit: a one-shot names its transaction in the initial metadata
(`cornus-txn`) before it runs, so the caller can ask Status (public.proto says the same). The
others: INVALID_ARGUMENT (bad input, the message names it, whether this node or a
partition's owner refused it: REST's 400), NOT_FOUND (unknown transaction), FAILED_PRECONDITION
(wrong state, e.g. commit after abort, or another call of it still runs), UNAVAILABLE (node
recovering or overloaded, storage down; the status call too: REST's 503). The limits are REST's:
`op_count_max` operations per call and the key and value sizes of the storage contract (bytes
here, since values are bytes).

Deadlines: a call whose deadline has passed is not started. A call under way is never cancelled
half way, since a commit cut off mid-flight would leave its transaction in memory with no one to
finish it and an operation cut off would keep its locks until the idle sweep. So the node's work
runs in a task that the handler stops waiting for at the deadline; a one-shot transaction whose
deadline has passed by the time its operations finish is aborted instead of committed. A caller
that cancels its call, or whose connection drops, with no deadline, is not heard: its one-shot
commits all the same, and its library reports CANCELLED or UNAVAILABLE, which changed something
then; the caller asks Status about the `cornus-txn` it was sent.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from cornus.protocol.config import Protocol
from cornus.protocol.txn_ids import TXN_ID_PATTERN, TXN_ID_PATTERN_SAYS
from cornus.runtime.coordination import ONE_SHOT_READ_BYTES_MAX
from cornus.runtime.node import Node, TxnAborted, one_shot_outcome
from cornus.runtime.outcome import (
    AbortReason,
    NodeOverloaded,
    Outcome,
    OutcomeStatus,
    TxnNotFound,
    TxnWrongState,
)
from cornus.runtime.wire import Op, OpKind, ops_for_writes
from services.public_api import TXN_METADATA_KEY  # importing it builds the generated code first
from services.public_api._generated import public_pb2 as pb
from services.public_api._generated import public_pb2_grpc
from storage_adapters.contract import DATA_KEY_BYTES_MAX, DATA_VALUE_BYTES_MAX, TXN_ID_LENGTH_MAX
from storage_adapters.errors import StorageUnavailable, ValidationError

log = logging.getLogger("cornus.public_api")

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Cornus"].full_name
# gRPC refuses larger messages itself (RESOURCE_EXHAUSTED) before a handler runs. Its 4 MiB default
# would refuse a legal request well under op_count_max; a redo is capped per partition anyway.
MESSAGE_BYTES_MAX = 16 * 1024 * 1024
# What a reply holds besides the values read (its transaction id, detail, timings), and what one
# value read adds around its key and bytes, counted generously: a reply whose reads would not fit
# MESSAGE_BYTES_MAX with these is refused before the transaction commits (`_check_reply_fits`).
REPLY_MARGIN_BYTES = 64 * 1024
REPLY_VALUE_OVERHEAD_BYTES = 16
# Readiness has no event to wait on (recovery sets a flag), so the health service polls it.
READY_POLL_INTERVAL_MS = 50
# What one client can hold (found by review): grpc serves a call that sent its headers and never
# its request, with no deadline of its own, for as long as the connection lives, a task and its
# buffers each (10,000 such calls: 200 MB). Past CALLS_IN_FLIGHT_MAX calls at once a new call is
# refused with RESOURCE_EXHAUSTED before any work (retryable); a connection carries at most
# STREAMS_PER_CONNECTION_MAX calls at once, and lives at most CONNECTION_AGE_MS_MAX (clients
# reconnect on their own), its calls then given CONNECTION_AGE_GRACE_MS to finish: a call whose
# request never came ends with its connection.
CALLS_IN_FLIGHT_MAX = 1024
STREAMS_PER_CONNECTION_MAX = 256
CONNECTION_AGE_MS_MAX = 600_000
CONNECTION_AGE_GRACE_MS = 30_000
# How long in-flight calls may run on at shutdown before they are cut off.
SHUTDOWN_GRACE_MS = 2_000
# Calls still running this long before the grace ends answer for themselves (a commit under way:
# OUTCOME_UNKNOWN with its transaction): grpc's own cut at the end of the grace would answer
# UNAVAILABLE, which the API defines as "changed nothing". Half the grace when that is shorter.
SHUTDOWN_MS_ANSWER_MARGIN = 500
# Commits that outlived their caller's deadline finish on their own, bounded by the node's commit
# deadline; shutdown waits this long for them.
SHUTDOWN_MS_BACKGROUND = 12_000

_TXN_ID = re.compile(TXN_ID_PATTERN)

_OUTCOMES = {
    OutcomeStatus.COMMITTED: pb.OUTCOME_COMMITTED,
    OutcomeStatus.ABORTED: pb.OUTCOME_ABORTED,
    OutcomeStatus.UNAVAILABLE: pb.OUTCOME_UNAVAILABLE,
    OutcomeStatus.UNKNOWN: pb.OUTCOME_UNKNOWN,
    OutcomeStatus.ACTIVE: pb.OUTCOME_ACTIVE,
}
_REASONS = {
    AbortReason.CONFLICT: pb.ABORT_REASON_CONFLICT,
    AbortReason.CHECK_FAILED: pb.ABORT_REASON_CHECK_FAILED,
    AbortReason.VOTED_NO: pb.ABORT_REASON_VOTED_NO,
    AbortReason.CLIENT: pb.ABORT_REASON_CLIENT,
    AbortReason.TIMEOUT: pb.ABORT_REASON_TIMEOUT,
    AbortReason.NOT_READY: pb.ABORT_REASON_NOT_READY,
    AbortReason.PEER_UNAVAILABLE: pb.ABORT_REASON_PEER_UNAVAILABLE,
}
_KINDS = {
    pb.OP_KIND_GET: OpKind.GET,
    pb.OP_KIND_PUT: OpKind.PUT,
    pb.OP_KIND_DELETE: OpKind.DELETE,
    pb.OP_KIND_CHECK: OpKind.CHECK,
}
# A runtime enum member the wire cannot carry would surface as a crash in the middle of a call.
assert set(_OUTCOMES) == set(OutcomeStatus)
assert set(_REASONS) == set(AbortReason)
assert set(_KINDS.values()) == set(OpKind)

T = TypeVar("T")
Handler = Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[Any]]


class DeadlineExceeded(Exception):
    """The caller's deadline passed before the node's work finished (the work goes on)."""


@dataclass(slots=True)
class _OneShotCall:
    """What an Execute, Put or Get has done so far, for the answer it gives if the server stops
    before it finishes: UNKNOWN once its commit started, else a refusal that it then honours."""

    txn: str = ""
    committing: bool = False
    refused: bool = False

    def stopped(self) -> Outcome:
        if self.committing:
            return Outcome(self.txn, OutcomeStatus.UNKNOWN,
                           detail="the server stopped while the commit ran; it goes on: ask Status")
        self.refused = True  # _one_shot aborts instead of committing, nobody hears of it
        raise NodeOverloaded("the server is stopping; nothing was committed")


# === input ========================================================================================


def _key(key: str) -> str:
    if not key:
        raise ValidationError("key must not be empty")
    size = len(key.encode("utf-8"))
    if size > DATA_KEY_BYTES_MAX:
        raise ValidationError(f"key {key[:32]!r}... is {size} bytes, the limit is {DATA_KEY_BYTES_MAX}")
    return key


def _value(key: str, value: bytes) -> bytes:
    if len(value) > DATA_VALUE_BYTES_MAX:
        raise ValidationError(f"value of key {key!r} is {len(value)} bytes, the limit is {DATA_VALUE_BYTES_MAX}")
    return value


def _txn(txn: str) -> str:
    if not txn:
        raise ValidationError("txn must not be empty")
    if len(txn) > TXN_ID_LENGTH_MAX:
        raise ValidationError(f"txn is {len(txn)} characters, the limit is {TXN_ID_LENGTH_MAX}")
    if not _TXN_ID.fullmatch(txn):
        raise ValidationError(f"txn {txn!r} is not {TXN_ID_PATTERN_SAYS}")
    return txn


def _protocol(name: str) -> Protocol | None:
    if not name:
        return None
    try:
        return Protocol(name)
    except ValueError:
        raise ValidationError(
            f"protocol {name!r} is not one of {', '.join(p.value for p in Protocol)}"
        ) from None


def _count(count: int, what: str, count_max: int) -> None:
    if count == 0:
        raise ValidationError(f"no {what}: at least one is needed")
    if count > count_max:
        raise ValidationError(f"{count} {what}, the limit is {count_max}")


def _op(index: int, op: pb.Op) -> Op:
    kind = _KINDS.get(op.kind)
    if kind is None:
        raise ValidationError(f"ops[{index}]: kind {op.kind} is not one of GET, PUT, DELETE, CHECK")
    key = _key(op.key)
    has_value = op.HasField("value")
    if kind in (OpKind.GET, OpKind.DELETE) and has_value:
        raise ValidationError(f"ops[{index}]: a {kind.value} op takes no value (key {key!r})")
    if kind is OpKind.PUT and not has_value:
        raise ValidationError(f"ops[{index}]: a put op needs a value (key {key!r})")
    return Op(kind, key, _value(key, op.value) if has_value else None)


def _writes(writes: Sequence[pb.Write]) -> dict[str, bytes | None]:
    changes: dict[str, bytes | None] = {}
    for index, write in enumerate(writes):
        key = _key(write.key)
        if key in changes:
            # REST takes a JSON object, whose keys are unique; a repeated field must say so itself.
            raise ValidationError(f"writes[{index}]: key {key!r} is written twice")
        change = write.WhichOneof("change")
        if change is None:
            raise ValidationError(f"writes[{index}]: key {key!r} needs a value or delete=true")
        if change == "delete" and not write.delete:
            raise ValidationError(f"writes[{index}]: delete=false is not a change (key {key!r})")
        changes[key] = _value(key, write.value) if change == "value" else None
    return changes


# === output =======================================================================================


def _key_value(key: str, value: bytes | None) -> pb.KeyValue:
    return pb.KeyValue(key=key) if value is None else pb.KeyValue(key=key, value=value)


def outcome_message(outcome: Outcome) -> pb.TxnOutcome:
    return pb.TxnOutcome(
        txn=outcome.txn,
        outcome=_OUTCOMES[outcome.status],
        reason=pb.ABORT_REASON_UNSPECIFIED if outcome.reason is None else _REASONS[outcome.reason],
        retryable=outcome.retryable,
        detail=outcome.detail,
        reads=[_key_value(key, value) for key, value in outcome.reads],
        timing_ms=outcome.timing_ms,
    )


def _active(txn: str) -> pb.TxnOutcome:
    return pb.TxnOutcome(txn=txn, outcome=pb.OUTCOME_ACTIVE)


# === the service ==================================================================================


def _status_codes(method: Handler) -> Handler:
    """Map the node's typed errors to gRPC status codes, as rest.py maps them to HTTP ones."""

    @functools.wraps(method)
    async def handler(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await method(self, request, context)
        except ValidationError as error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        except TxnNotFound as error:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(error))
        except TxnWrongState as error:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(error))
        except NodeOverloaded as error:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(error))
        except StorageUnavailable as error:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"storage unavailable: {error}")
        except DeadlineExceeded as error:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, str(error))

    return handler


def _parsing_handlers(servicer: CornusServicer) -> grpc.GenericRpcHandler:
    """The service's handlers, each parsing its own request: protobuf refuses a request that is
    not valid (a string field that is not UTF-8, a truncated message) as it parses it, and grpc
    answers a deserializer's exception with UNKNOWN, a code a client may take for "maybe it ran".
    Parsed here, such a request is INVALID_ARGUMENT, naming what it should have been."""
    handlers = {}
    for method in pb.DESCRIPTOR.services_by_name["Cornus"].methods:
        assert not (method.client_streaming or method.server_streaming), f"{method.name} streams"
        request_type = getattr(pb, method.input_type.name)
        response_type = getattr(pb, method.output_type.name)
        handlers[method.name] = grpc.unary_unary_rpc_method_handler(
            functools.partial(_parsed, request_type, getattr(servicer, method.name)),
            request_deserializer=None,  # the raw bytes
            response_serializer=response_type.SerializeToString,
        )
    return grpc.method_handlers_generic_handler(SERVICE_NAME, handlers)


async def _parsed(
    request_type: Any, call: Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]], raw: bytes,
    context: grpc.aio.ServicerContext,
) -> Any:
    try:
        request = request_type.FromString(raw)
    except DecodeError as error:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                            f"the request is not a valid {request_type.__name__}: {error}")
    return await call(request, context)


class CornusServicer(public_pb2_grpc.CornusServicer):
    def __init__(self, node: Node) -> None:
        self._node = node
        self._op_count_max = node.config.limits.op_count_max
        assert self._op_count_max > 0
        # Work that outlived its caller's deadline; held so it is neither collected nor forgotten.
        self.background: set[asyncio.Task[Any]] = set()
        # Set when the server stops: calls still running answer for themselves (see `answer_now`).
        self._stopping: asyncio.Future[None] | None = None

    def answer_now(self) -> None:
        """The server is about to cut its calls: every call still running answers now."""
        if self._stopping is None:
            self._stopping = asyncio.get_running_loop().create_future()
        if not self._stopping.done():
            self._stopping.set_result(None)

    async def _run(
        self, context: grpc.aio.ServicerContext, work: Coroutine[Any, Any, T], what: str,
        on_stop: Callable[[], T] | None = None, on_deadline: Callable[[asyncio.Task[T]], None] | None = None,
    ) -> T:
        """Run `work` on the node within the caller's deadline, shielded from cancellation. If
        the server stops first, the call answers with `on_stop()` (or UNAVAILABLE) while the
        work goes on; if the deadline passes first, `on_deadline` is given the work still running."""
        remaining_s = context.time_remaining()
        if remaining_s is not None and remaining_s <= 0:
            work.close()
            raise DeadlineExceeded(f"the deadline passed before {what} started; nothing changed")
        task = asyncio.ensure_future(work)
        self.background.add(task)
        task.add_done_callback(self._work_done)
        if self._stopping is None:
            self._stopping = asyncio.get_running_loop().create_future()
        scope = asyncio.timeout(remaining_s)
        try:
            async with scope:
                # Not cancelled with the call: asyncio.wait leaves its futures alone.
                await asyncio.wait((task, self._stopping), return_when=asyncio.FIRST_COMPLETED)
        except TimeoutError:
            if not scope.expired():
                raise  # the work's own, not our deadline
            if on_deadline is not None:
                on_deadline(task)
            raise DeadlineExceeded(f"the deadline passed during {what}; it goes on without the caller") from None
        if task.done():
            return task.result()
        if on_stop is not None:
            return on_stop()
        raise NodeOverloaded(f"the server is stopping; {what} goes on without the caller")

    def _abort_when_done(self, write: asyncio.Task[Any], txn: str) -> None:
        """Abort `txn` once `write`, whose caller's deadline passed, ends: that caller was told
        DEADLINE_EXCEEDED, "nothing changed", so no commit of it may carry what the write did
        (found by audit: a Commit after it committed the write). Its commit is refused from now,
        since the abort starts only a loop step or two after the write ends."""
        self._node.refuse_commit(txn, "a write of it passed its caller's deadline")

        def abort(_: asyncio.Task[Any]) -> None:
            task = asyncio.ensure_future(self._node.abort(txn))
            self.background.add(task)
            task.add_done_callback(self._work_done)

        write.add_done_callback(abort)

    def _work_done(self, task: asyncio.Task[Any]) -> None:
        self.background.discard(task)
        # Retrieve the result of work nobody waits for any more, so its errors are seen, not lost.
        if not task.cancelled() and task.exception() is not None:
            log.debug("work after the caller's deadline failed: %r", task.exception())

    def _deadline_s(self, context: grpc.aio.ServicerContext) -> float | None:
        remaining_s = context.time_remaining()
        return None if remaining_s is None else time.monotonic() + remaining_s

    async def _one_shot(
        self, context: grpc.aio.ServicerContext, call: _OneShotCall, ops: list[Op], protocol: Protocol | None,
        client_txn: str | None = None,
    ) -> Outcome:
        """Node.execute, except that a caller who has gone before the commit gets no commit, and
        that the transaction is named in the initial metadata before anything runs."""
        node = self._node
        deadline_s = self._deadline_s(context)
        # Its own id first (never an error status, which public.proto says changed nothing, for a
        # second delivery of a request the first ran), then whether the server still takes calls.
        began = node.begin_one_shot(protocol, client_txn)
        if isinstance(began, Outcome):
            return began
        txn = call.txn = began
        if call.refused:
            stopping = NodeOverloaded("the server is stopping; nothing was committed")
            # Frees a client-chosen id (nothing ran), unless another process of the node may have run it.
            in_doubt = await node.refuse_one_shot(txn, client_txn, stopping)
            if in_doubt is not None:
                return in_doubt
            raise stopping
        try:
            await context.send_initial_metadata(((TXN_METADATA_KEY, txn),))
            values = await node.run_ops(txn, ops, ONE_SHOT_READ_BYTES_MAX)  # each owner held to its share
            _check_reply_fits([op.key for op in ops if op.kind is OpKind.GET], values)
        except TxnAborted as aborted:
            # As Node.execute answers REST's one-shots: an owner's "invalid" is INVALID_ARGUMENT.
            return one_shot_outcome(aborted)
        except BaseException as error:
            # The caller is gone (metadata could not be sent), the input was bad, or the task was
            # cancelled: nothing committed, and the transaction must not wait for the idle sweep.
            # Bad input, or no room for its writes here, frees a client-chosen id for the corrected
            # request or the retry, as REST's execute does (Coordination.refuse_one_shot).
            if not isinstance(error, ValidationError | NodeOverloaded):
                await node.abort(txn)
                raise
            in_doubt = await node.refuse_one_shot(txn, client_txn, error)
            if in_doubt is not None:
                return in_doubt
            raise
        if call.refused or (deadline_s is not None and time.monotonic() >= deadline_s):
            # Nobody would hear of this commit: the caller was told DEADLINE_EXCEEDED (or, as the
            # server stopped, UNAVAILABLE) before it began, and may retry.
            return await node.abort(txn)
        call.committing = True  # in the same step as the check: no stop can come in between
        outcome = await node.commit(txn)
        if outcome.status is not OutcomeStatus.COMMITTED:
            return outcome
        gets = [op.key for op in ops if op.kind is OpKind.GET]
        reads = tuple(zip(gets, values, strict=True))
        return Outcome(outcome.txn, outcome.status, outcome.reason, outcome.detail, reads, outcome.timing_ms)

    @_status_codes
    async def Execute(self, request: pb.ExecuteRequest, context: grpc.aio.ServicerContext) -> pb.TxnOutcome:
        _count(len(request.ops), "operations", self._op_count_max)
        ops = [_op(index, op) for index, op in enumerate(request.ops)]
        protocol = _protocol(request.protocol)
        client_txn = _txn(request.txn) if request.txn else None
        return outcome_message(await self._run_one_shot(context, ops, protocol, "execute", client_txn))

    async def _run_one_shot(
        self, context: grpc.aio.ServicerContext, ops: list[Op], protocol: Protocol | None, what: str,
        client_txn: str | None = None,
    ) -> Outcome:
        call = _OneShotCall()
        return await self._run(context, self._one_shot(context, call, ops, protocol, client_txn), what,
                               on_stop=call.stopped)

    @_status_codes
    async def Begin(self, request: pb.BeginRequest, context: grpc.aio.ServicerContext) -> pb.BeginResponse:
        protocol = _protocol(request.protocol)
        return pb.BeginResponse(txn=self._node.begin(protocol))  # refused by the node while it recovers

    @_status_codes
    async def Read(self, request: pb.ReadRequest, context: grpc.aio.ServicerContext) -> pb.ReadResponse:
        txn = _txn(request.txn)
        _count(len(request.keys), "keys", self._op_count_max)
        keys = [_key(key) for key in request.keys]
        work = self._node.run_ops(txn, [Op(OpKind.GET, key) for key in keys])
        try:
            values = await self._run(context, work, f"the read of {txn}")
        except TxnAborted as aborted:
            return pb.ReadResponse(txn=txn, outcome=outcome_message(aborted.outcome))
        # The transaction goes on: the locks the read took stay to its end, as any read's.
        _check_reply_fits(keys, values)
        return pb.ReadResponse(
            txn=txn,
            values=[_key_value(key, value) for key, value in zip(keys, values, strict=True)],
            outcome=_active(txn),
        )

    @_status_codes
    async def Write(self, request: pb.WriteRequest, context: grpc.aio.ServicerContext) -> pb.WriteResponse:
        txn = _txn(request.txn)
        _count(len(request.writes), "writes", self._op_count_max)
        work = self._node.run_ops(txn, ops_for_writes(_writes(request.writes)))
        try:
            await self._run(context, work, f"the write of {txn}; its transaction is aborted once it ends",
                            on_deadline=lambda task: self._abort_when_done(task, txn))
        except TxnAborted as aborted:
            return pb.WriteResponse(txn=txn, outcome=outcome_message(aborted.outcome))
        return pb.WriteResponse(txn=txn, outcome=_active(txn))

    @_status_codes
    async def Commit(self, request: pb.TxnRequest, context: grpc.aio.ServicerContext) -> pb.TxnOutcome:
        txn = _txn(request.txn)

        def stopped() -> Outcome:
            return Outcome(txn, OutcomeStatus.UNKNOWN, detail="the server stopped while the commit ran; ask Status")

        what = f"the commit of {txn} (ask Status)"
        return outcome_message(await self._run(context, self._node.commit(txn), what, on_stop=stopped))

    @_status_codes
    async def Abort(self, request: pb.TxnRequest, context: grpc.aio.ServicerContext) -> pb.TxnOutcome:
        txn = _txn(request.txn)
        return outcome_message(await self._run(context, self._node.abort(txn), f"the abort of {txn}"))

    @_status_codes
    async def Status(self, request: pb.TxnRequest, context: grpc.aio.ServicerContext) -> pb.TxnOutcome:
        txn = _txn(request.txn)
        outcome = await self._run(context, self._node.resolve_status(txn), f"the status of {txn}")
        if outcome is None:
            raise TxnNotFound(f"no transaction {txn} is known to this cluster")
        return outcome_message(outcome)

    @_status_codes
    async def Get(self, request: pb.GetRequest, context: grpc.aio.ServicerContext) -> pb.TxnOutcome:
        ops = [Op(OpKind.GET, _key(request.key))]
        return outcome_message(await self._run_one_shot(context, ops, None, "get"))

    @_status_codes
    async def Put(self, request: pb.PutRequest, context: grpc.aio.ServicerContext) -> pb.TxnOutcome:
        key = _key(request.key)
        if not request.HasField("value"):
            raise ValidationError(f"a put needs a value (key {key!r})")
        ops = [Op(OpKind.PUT, key, _value(key, request.value))]
        return outcome_message(await self._run_one_shot(context, ops, None, "put"))


def _check_reply_fits(keys: list[str], values: list[bytes | None]) -> None:
    """ValidationError if the values read under `keys` would not fit a reply (MESSAGE_BYTES_MAX):
    grpc would fail to send it after the work was done, with a code that public.proto calls a
    refusal before any work (found by audit: a one-shot so refused had committed, and its retry
    committed again). The owners hold each partition's share to READ_BYTES_MAX and a one-shot's
    whole to ONE_SHOT_READ_BYTES_MAX, which is this reply's limit too, but for its keys and framing."""
    size = REPLY_MARGIN_BYTES + sum(
        len(key) + REPLY_VALUE_OVERHEAD_BYTES + (0 if value is None else len(value))
        for key, value in zip(keys, values, strict=True)
    )
    if size > MESSAGE_BYTES_MAX:
        raise ValidationError(f"the values read come to about {size} bytes, more than a reply carries "
                              f"({MESSAGE_BYTES_MAX}): read fewer keys at a time; nothing was committed")


# === the server ===================================================================================


class PublicGrpcServer:
    """The Cornus, health and reflection services on one port. `start`, then `stop` once."""

    def __init__(self, node: Node, address: str) -> None:
        assert address, "the public gRPC API needs an address"
        self._node = node
        self._address = address
        self._server: grpc.aio.Server | None = None
        self._servicer = CornusServicer(node)
        self._health = health.aio.HealthServicer()
        self._readiness: asyncio.Task[None] | None = None
        self.port = 0

    async def start(self) -> int:
        """Bind and serve; the port bound (useful when the address asks for port 0)."""
        assert self._server is None, "started twice"
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", MESSAGE_BYTES_MAX),
                ("grpc.max_send_message_length", MESSAGE_BYTES_MAX),
                ("grpc.max_concurrent_streams", STREAMS_PER_CONNECTION_MAX),
                ("grpc.max_connection_age_ms", CONNECTION_AGE_MS_MAX),
                ("grpc.max_connection_age_grace_ms", CONNECTION_AGE_GRACE_MS),
                # grpc shares a port between listeners that all ask (SO_REUSEPORT, its default): a
                # second process of this node would serve beside the first (found by review).
                ("grpc.so_reuseport", 0),
            ],
            maximum_concurrent_rpcs=CALLS_IN_FLIGHT_MAX,
        )
        server.add_generic_rpc_handlers((_parsing_handlers(self._servicer),))
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        for service in ("", SERVICE_NAME):
            await self._health.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
        reflection.enable_server_reflection((SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
        self.port = server.add_insecure_port(self._address)
        if self.port == 0:
            raise OSError(f"the public gRPC API could not bind {self._address}")
        await server.start()
        self._server = server
        self._readiness = asyncio.create_task(self._serve_when_ready(), name="cornus-grpc-api-health")
        return self.port

    async def _serve_when_ready(self) -> None:
        while not self._node.ready:  # noqa: ASYNC110 - see READY_POLL_INTERVAL_MS
            await asyncio.sleep(READY_POLL_INTERVAL_MS / 1000)
        for service in ("", SERVICE_NAME):
            await self._health.set(service, health_pb2.HealthCheckResponse.SERVING)
        log.info("public gRPC API on %s is SERVING", self._address)
        # SERVING from then on, unless a later process of this node id deposes this one (it
        # parks: cornus.runtime.node), which the load balancer must hear as readiness lost.
        while not self._node.deposed:  # noqa: ASYNC110 - see READY_POLL_INTERVAL_MS
            await asyncio.sleep(READY_POLL_INTERVAL_MS / 1000)
        for service in ("", SERVICE_NAME):
            await self._health.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
        log.info("public gRPC API on %s is NOT_SERVING: this process was deposed", self._address)

    async def stop(self) -> None:
        assert self._server is not None, "stop before start"
        if self._readiness is not None:
            self._readiness.cancel()
        # Health says NOT_SERVING first, so load balancers stop sending before calls are refused.
        await self._health.enter_graceful_shutdown()
        stopping = asyncio.ensure_future(self._server.stop(SHUTDOWN_GRACE_MS / 1000))
        answer_at_ms = max(SHUTDOWN_GRACE_MS // 2, SHUTDOWN_GRACE_MS - SHUTDOWN_MS_ANSWER_MARGIN)
        done, _ = await asyncio.wait((stopping,), timeout=answer_at_ms / 1000)
        if not done:
            self._servicer.answer_now()
        await stopping
        background = list(self._servicer.background)
        if background:
            await asyncio.wait(background, timeout=SHUTDOWN_MS_BACKGROUND / 1000)
