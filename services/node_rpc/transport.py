"""`GrpcTransport`: the runtime's `Transport` over gRPC (grpc.aio), one long-lived stream per peer.

Why streams: a unary call costs about twice the latency of a frame on an open stream and caps
a node at a few thousand calls/s (DESIGN 5). So each node opens ONE outbound bidirectional
stream to each peer and sends every one-way message and request on it; the peer sends the
responses back on that same stream. Traffic from B to A uses B's own outbound stream, so each
direction of a pair has exactly one stream, and ownership of reconnection is never shared.

Why frames: everything queued for a peer during one event-loop tick goes out as one `PeerFrame`,
which amortises gRPC's per-message cost over many protocol messages.

Failure model: the protocol tolerates lost messages and has its own timers, so the transport
never retries a message. A link is CONNECTING (first attempt: sends queue, bounded), UP, or DOWN
(sends drop and are counted, requests fail fast). A broken stream fails its pending requests at
once and reconnects with capped exponential backoff and jitter. Every queue, frame, message and
in-flight set is bounded by `TransportLimits`.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import random
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import grpc

from cornus.protocol.messages import Message
from cornus.runtime.transport import InboundHandler, PeerUnavailable, Transport
from cornus.runtime.wire import (
    ExecuteRequest,
    ExecuteResponse,
    PeerRequest,
    PeerResponse,
    Routed,
    StatusRequest,
    StatusResponse,
)
from services.node_rpc import codec
from services.node_rpc._generated import node_pb2 as pb
from storage_adapters.contract import NODE_ID_LENGTH_MAX, validate_id

logger = logging.getLogger(__name__)

SERVICE_NAME = "cornus.node.v1.NodePeer"
_STREAM_METHOD = f"/{SERVICE_NAME}/Stream"
_SERVICE = pb.DESCRIPTOR.services_by_name["NodePeer"]
# The handlers are registered by name rather than through the generated servicer (to control
# serialization, see _write_loop); fail at import if the .proto and these names drift apart.
assert _SERVICE.full_name == SERVICE_NAME
assert set(_SERVICE.methods_by_name) == {"Stream", "Status"}

PEER_COUNT_MAX = 1024
PORT_MAX = 65535
# The unary Status call's metadata key naming the caller, for handlers that care who probes.
STATUS_SENDER_METADATA_KEY = "cornus-sender"

_REQUEST_TO_RESPONSE: dict[type, type] = {ExecuteRequest: ExecuteResponse, StatusRequest: StatusResponse}


@dataclass(frozen=True, slots=True)
class TransportLimits:
    """Every bound the transport enforces. Both ends of a pair must agree on the frame limits."""

    # One-way messages and requests waiting for a peer's writer; beyond it sends are dropped.
    send_queue_count_max: int = 8192
    # Envelopes per PeerFrame; larger frames from a peer end its stream as malformed.
    frame_item_count_max: int = 512
    # gRPC max send/receive message length: a frame never exceeds it (frames split to fit), and
    # a single envelope over it is refused.
    message_bytes_max: int = 16 * 1024 * 1024
    # Requests awaiting a response, per peer, and requests being served, per inbound stream.
    request_inflight_count_max: int = 4096
    request_timeout_ms_max: int = 300_000
    # Time from opening a stream to the peer's hello before the attempt counts as failed.
    connect_timeout_ms: int = 2_000
    reconnect_backoff_ms_min: int = 20
    reconnect_backoff_ms_max: int = 2_000
    # HTTP/2 pings: a peer that stops answering is declared dead after about interval + timeout,
    # even when no traffic flows (a killed VM sends no RST).
    keepalive_interval_ms: int = 5_000
    keepalive_timeout_ms: int = 5_000
    status_timeout_ms: int = 5_000
    close_grace_ms: int = 200

    def __post_init__(self) -> None:
        assert 1 <= self.send_queue_count_max <= 1_000_000
        assert 1 <= self.frame_item_count_max <= 65_536
        assert 1024 <= self.message_bytes_max <= 1024 * 1024 * 1024
        assert 1 <= self.request_inflight_count_max <= 1_000_000
        assert 1 <= self.request_timeout_ms_max <= 2**32 - 1  # carried as uint32 on the wire
        assert self.connect_timeout_ms >= 1
        assert 1 <= self.reconnect_backoff_ms_min <= self.reconnect_backoff_ms_max <= 600_000
        assert self.keepalive_interval_ms >= 1_000  # gRPC refuses pings much faster than this
        assert self.keepalive_timeout_ms >= 1
        assert self.status_timeout_ms >= 1
        assert self.close_grace_ms >= 0


class MessageTooLarge(ValueError):
    """A request whose encoding exceeds `message_bytes_max`: the caller's bug, never retryable."""


class LinkState(enum.Enum):
    CONNECTING = "connecting"  # first attempt since start: sends queue up
    UP = "up"
    DOWN = "down"  # lost or never reached; reconnecting in the background
    CLOSED = "closed"


@dataclass(slots=True)
class PeerCounters:
    """What happened on the outbound link to one peer. Plain ints; metrics will read them."""

    drop_count_queue_full: int = 0
    drop_count_peer_down: int = 0
    drop_count_oversized: int = 0
    connect_count: int = 0
    reconnect_count: int = 0
    connect_failure_count: int = 0
    disconnect_count: int = 0
    frame_sent_count: int = 0
    item_sent_count: int = 0
    # Responses for requests that had already timed out (or unknown ids).
    late_response_count: int = 0
    malformed_count: int = 0


@dataclass(slots=True)
class InboundCounters:
    """What happened on the streams peers opened to this node."""

    stream_count: int = 0
    frame_received_count: int = 0
    item_received_count: int = 0
    malformed_count: int = 0
    handler_error_count: int = 0
    overload_count: int = 0
    request_expired_count: int = 0
    response_drop_count: int = 0


def parse_address(address: str) -> tuple[str, int]:
    host, sep, port_text = address.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ValueError(f"address {address!r} must be host:port")
    port = int(port_text)
    if not 0 <= port <= PORT_MAX:
        raise ValueError(f"address {address!r}: port out of range")
    return host, port


class _Outbox:
    """Envelopes waiting for one stream's writer, already grouped into frames as they are queued.

    Envelopes are added in place inside the frame that will be written, so queuing costs no copy.
    """

    __slots__ = ("_count_max", "_frames", "_item_count_max", "_wake", "count")

    def __init__(self, count_max: int, item_count_max: int) -> None:
        self._count_max = count_max
        self._item_count_max = item_count_max
        self._frames: deque[pb.PeerFrame] = deque()
        self._wake = asyncio.Event()
        self.count = 0

    def add(self) -> pb.PeerEnvelope | None:
        """A fresh envelope at the tail, or None when the outbox is full."""
        if self.count >= self._count_max:
            return None
        frames = self._frames
        if not frames or len(frames[-1].items) >= self._item_count_max:
            frames.append(pb.PeerFrame())
        self.count += 1
        if not self._wake.is_set():
            self._wake.set()
        return frames[-1].items.add()

    def discard_last(self) -> None:
        """Undo the last `add` (its encoding failed)."""
        assert self.count > 0 and self._frames
        del self._frames[-1].items[-1]
        self.count -= 1

    async def take(self) -> pb.PeerFrame:
        while not self._frames:
            self._wake.clear()
            await self._wake.wait()
        frame = self._frames.popleft()
        self.count -= len(frame.items)
        assert self.count >= 0
        return frame

    def clear(self) -> list[pb.PeerEnvelope]:
        dropped = [envelope for frame in self._frames for envelope in frame.items]
        self._frames.clear()
        self.count = 0
        return dropped


def _serialize_bounded(
    frame: pb.PeerFrame, bytes_max: int, on_oversized: Callable[[pb.PeerEnvelope, int], None]
) -> list[bytes]:
    """`frame` as one or more encoded frames of at most `bytes_max` bytes each, in order.

    Splitting is the rare path; serializing once and measuring keeps the common path to a single
    encoding of each frame.
    """
    data = frame.SerializeToString()
    if len(data) <= bytes_max:
        return [data]
    items = frame.items
    if len(items) <= 1:
        if items:
            on_oversized(items[0], len(data))
        return []
    half = len(items) // 2
    head = pb.PeerFrame(sender=frame.sender)
    head.items.extend(items[:half])
    tail = pb.PeerFrame()
    tail.items.extend(items[half:])
    return _serialize_bounded(head, bytes_max, on_oversized) + _serialize_bounded(tail, bytes_max, on_oversized)


async def _write_loop(
    outbox: _Outbox,
    write: Callable[[bytes], Awaitable[None]],
    bytes_max: int,
    on_oversized: Callable[[pb.PeerEnvelope, int], None],
    on_written: Callable[[int], None],
) -> None:
    # Frames reach gRPC already serialized (the method has no serializer), so the size check
    # above costs no second encoding.
    while True:
        frame = await outbox.take()
        item_count = len(frame.items)
        for data in _serialize_bounded(frame, bytes_max, on_oversized):
            await write(data)
        on_written(item_count)


def _describe(error: BaseException) -> str:
    if isinstance(error, grpc.aio.AioRpcError):
        return f"{error.code().name}: {error.details()}"
    return f"{type(error).__name__}: {error}"


class _DeadlinePassed(PeerUnavailable):
    """The handler ran past the request's deadline and was cancelled."""


class _LinkBroken(Exception):
    """The stream ended or the peer answered as someone else."""


class _PeerLink:
    """The outbound stream to one peer: its queue, its pending requests and its reconnect loop."""

    def __init__(self, node_id: str, peer_id: str, address: str, limits: TransportLimits) -> None:
        self.node_id = node_id
        self.peer_id = peer_id
        self.address = address
        self.limits = limits
        self.state = LinkState.CONNECTING
        self.counters = PeerCounters()
        self.down_reason = "not connected yet"
        self._outbox = _Outbox(limits.send_queue_count_max, limits.frame_item_count_max)
        # correlation id -> (future, the response type the request expects)
        self._pending: dict[int, tuple[asyncio.Future[PeerResponse], type]] = {}
        self._correlation_id_last = 0
        self._up = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._hello = pb.PeerFrame(sender=node_id).SerializeToString()

    def start(self) -> None:
        assert self._task is None
        self._task = asyncio.create_task(self._run(), name=f"node-rpc-link:{self.node_id}->{self.peer_id}")

    async def close(self) -> None:
        self.state = LinkState.CLOSED
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._fail_all("transport closed")
        assert not self._pending or all(future.done() for future, _ in self._pending.values())

    async def wait_up(self) -> None:
        await self._up.wait()

    def send(self, message: Routed | Message) -> None:
        if self.state is LinkState.DOWN or self.state is LinkState.CLOSED:
            self.counters.drop_count_peer_down += 1
            return
        envelope = self._outbox.add()
        if envelope is None:
            self.counters.drop_count_queue_full += 1
            return
        envelope.kind = pb.ENVELOPE_KIND_MESSAGE
        try:
            codec.encode(envelope, message)
        except BaseException:
            self._outbox.discard_last()
            raise

    async def request(self, request: PeerRequest, timeout_ms: int) -> PeerResponse:
        if self.state is LinkState.DOWN or self.state is LinkState.CLOSED:
            raise PeerUnavailable(f"peer {self.peer_id} at {self.address} is {self.state.value}: {self.down_reason}")
        if len(self._pending) >= self.limits.request_inflight_count_max:
            raise PeerUnavailable(
                f"peer {self.peer_id}: {len(self._pending)} requests in flight, "
                f"the limit is {self.limits.request_inflight_count_max}"
            )
        envelope = self._outbox.add()
        if envelope is None:
            raise PeerUnavailable(f"peer {self.peer_id}: send queue full ({self.limits.send_queue_count_max})")
        self._correlation_id_last += 1
        correlation_id = self._correlation_id_last
        envelope.kind = pb.ENVELOPE_KIND_REQUEST
        envelope.correlation_id = correlation_id
        envelope.timeout_ms = timeout_ms
        try:
            codec.encode(envelope, request)
        except BaseException:
            self._outbox.discard_last()
            raise
        loop = asyncio.get_running_loop()
        future: asyncio.Future[PeerResponse] = loop.create_future()
        assert correlation_id not in self._pending
        self._pending[correlation_id] = (future, _REQUEST_TO_RESPONSE[type(request)])
        # A bare timer, not asyncio.timeout: this is the hot path and a timer is the cheapest
        # deadline asyncio has.
        timer = loop.call_later(timeout_ms / 1000, self._expire, future, timeout_ms)
        try:
            return await future
        finally:
            timer.cancel()
            self._pending.pop(correlation_id, None)

    def _expire(self, future: asyncio.Future[PeerResponse], timeout_ms: int) -> None:
        if not future.done():
            future.set_exception(PeerUnavailable(f"peer {self.peer_id}: no response within {timeout_ms} ms"))

    def _fail_all(self, reason: str) -> None:
        for future, _ in self._pending.values():
            if not future.done():
                future.set_exception(PeerUnavailable(f"peer {self.peer_id} at {self.address}: {reason}"))

    def _set_up(self) -> None:
        assert self.state is not LinkState.CLOSED
        if self.counters.connect_count > 0:
            self.counters.reconnect_count += 1
        self.counters.connect_count += 1
        self.state = LinkState.UP
        self.down_reason = ""
        self._up.set()

    def _set_down(self, reason: str) -> None:
        if self.state is LinkState.UP:
            self.counters.disconnect_count += 1
        if self.state is not LinkState.CLOSED:
            self.state = LinkState.DOWN
        self.down_reason = reason
        self._up.clear()
        for envelope in self._outbox.clear():
            # Queued requests are failed below through their futures; messages are simply lost.
            if envelope.kind == pb.ENVELOPE_KIND_MESSAGE:
                self.counters.drop_count_peer_down += 1
        self._fail_all(f"connection lost ({reason})")

    async def _run(self) -> None:
        failure_count = 0  # consecutive attempts that never reached UP
        while True:
            reached_up = await self._connect_and_serve()
            failure_count = 0 if reached_up else failure_count + 1
            if not reached_up:
                self.counters.connect_failure_count += 1
            exponent = min(failure_count, 30)
            backoff_ms = min(self.limits.reconnect_backoff_ms_max, self.limits.reconnect_backoff_ms_min * 2**exponent)
            # Jitter keeps the nodes of a restarted cluster from reconnecting in lockstep.
            await asyncio.sleep(random.uniform(backoff_ms / 2, backoff_ms) / 1000)

    async def _connect_and_serve(self) -> bool:
        # A fresh channel per attempt: gRPC's own channel backoff would otherwise hold us off a
        # peer that has already restarted.
        channel = grpc.aio.insecure_channel(self.address, options=_channel_options(self.limits))
        call = None
        tasks: list[asyncio.Task[None]] = []
        reached_up = False
        reason = "stream ended"
        try:
            stream = channel.stream_stream(_STREAM_METHOD, response_deserializer=pb.PeerFrame.FromString)
            call = stream(wait_for_ready=False)
            await call.write(self._hello)
            async with asyncio.timeout(self.limits.connect_timeout_ms / 1000):
                hello = await call.read()
            if hello is grpc.aio.EOF:
                raise _LinkBroken("peer ended the stream before its hello")
            if hello.sender != self.peer_id:
                raise _LinkBroken(f"{self.address} is node {hello.sender!r}, expected {self.peer_id!r}")
            self._set_up()
            reached_up = True
            tasks.append(asyncio.create_task(self._read_loop(call)))
            tasks.append(
                asyncio.create_task(
                    _write_loop(
                        self._outbox, call.write, self.limits.message_bytes_max, self._on_oversized, self._on_written
                    )
                )
            )
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                error = task.exception()
                if error is not None:
                    reason = _describe(error)
        except (Exception, TimeoutError) as error:
            reason = _describe(error)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if call is not None:
                call.cancel()
            self._set_down(reason)
            await channel.close(grace=None)
        if reached_up:
            logger.info("link %s -> %s lost: %s", self.node_id, self.peer_id, reason)
        return reached_up

    async def _read_loop(self, call: grpc.aio.StreamStreamCall) -> None:
        item_count_max = self.limits.frame_item_count_max
        while True:
            frame = await call.read()
            if frame is grpc.aio.EOF:
                raise _LinkBroken("peer ended the stream")
            if len(frame.items) > item_count_max:
                self.counters.malformed_count += 1
                raise _LinkBroken(f"frame of {len(frame.items)} items, the limit is {item_count_max}")
            for envelope in frame.items:
                self._on_response(envelope)

    def _on_response(self, envelope: pb.PeerEnvelope) -> None:
        if envelope.kind != pb.ENVELOPE_KIND_RESPONSE:
            self.counters.malformed_count += 1
            return
        entry = self._pending.get(envelope.correlation_id)
        if entry is None or entry[0].done():
            self.counters.late_response_count += 1
            return
        future, response_type = entry
        if envelope.WhichOneof("body") == "request_failed":
            future.set_exception(PeerUnavailable(f"peer {self.peer_id}: {envelope.request_failed.detail}"))
            return
        try:
            response = codec.decode_response(envelope)
        except codec.MalformedEnvelope as error:
            self.counters.malformed_count += 1
            future.set_exception(PeerUnavailable(f"peer {self.peer_id}: malformed response: {error}"))
            return
        if type(response) is not response_type:
            self.counters.malformed_count += 1
            future.set_exception(
                PeerUnavailable(f"peer {self.peer_id} answered {type(response).__name__}, expected {response_type}")
            )
            return
        future.set_result(response)

    def _on_oversized(self, envelope: pb.PeerEnvelope, size_bytes: int) -> None:
        self.counters.drop_count_oversized += 1
        if envelope.kind == pb.ENVELOPE_KIND_REQUEST:
            entry = self._pending.get(envelope.correlation_id)
            if entry is not None and not entry[0].done():
                entry[0].set_exception(
                    MessageTooLarge(f"request of {size_bytes} bytes, the limit is {self.limits.message_bytes_max}")
                )

    def _on_written(self, item_count: int) -> None:
        self.counters.frame_sent_count += 1
        self.counters.item_sent_count += item_count


def _channel_options(limits: TransportLimits) -> list[tuple[str, int]]:
    return [
        ("grpc.max_send_message_length", limits.message_bytes_max),
        ("grpc.max_receive_message_length", limits.message_bytes_max),
        ("grpc.keepalive_time_ms", limits.keepalive_interval_ms),
        ("grpc.keepalive_timeout_ms", limits.keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        # Our reconnect loop owns backoff; a private subchannel keeps gRPC's shared subchannel
        # pool from carrying an old failure's backoff into a new attempt.
        ("grpc.use_local_subchannel_pool", 1),
        ("grpc.initial_reconnect_backoff_ms", limits.reconnect_backoff_ms_min),
        ("grpc.min_reconnect_backoff_ms", limits.reconnect_backoff_ms_min),
        ("grpc.max_reconnect_backoff_ms", limits.reconnect_backoff_ms_max),
        ("grpc.enable_retries", 0),
    ]


def _server_options(limits: TransportLimits) -> list[tuple[str, int]]:
    return [
        ("grpc.max_send_message_length", limits.message_bytes_max),
        ("grpc.max_receive_message_length", limits.message_bytes_max),
        ("grpc.keepalive_time_ms", limits.keepalive_interval_ms),
        ("grpc.keepalive_timeout_ms", limits.keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", 1),
        # Accept the clients' keepalive pings (the default minimum is 5 minutes, and a client
        # pinging faster gets a GOAWAY).
        ("grpc.http2.min_ping_interval_without_data_ms", limits.keepalive_interval_ms // 2),
        ("grpc.http2.max_ping_strikes", 0),
        # Without this, a second node started on the same port would silently share it.
        ("grpc.so_reuseport", 0),
    ]


class GrpcTransport(Transport):
    """One node's end of the mesh: a server for inbound streams and one link per peer."""

    def __init__(
        self,
        node_id: str,
        listen_address: str,
        peers: Mapping[str, str],
        limits: TransportLimits | None = None,
    ) -> None:
        validate_id(node_id, "node id", NODE_ID_LENGTH_MAX)
        parse_address(listen_address)
        if len(peers) > PEER_COUNT_MAX:
            raise ValueError(f"{len(peers)} peers, the limit is {PEER_COUNT_MAX}")
        for peer_id, address in peers.items():
            validate_id(peer_id, "peer id", NODE_ID_LENGTH_MAX)
            parse_address(address)
        self.node_id = node_id
        self.listen_address = listen_address
        self.limits = limits if limits is not None else TransportLimits()
        # The node's own entry (a shared cluster map lists everyone) is served in-process.
        self._peer_addresses = {peer_id: address for peer_id, address in peers.items() if peer_id != node_id}
        self._links: dict[str, _PeerLink] = {}
        self._handler: InboundHandler | None = None
        self._server: grpc.aio.Server | None = None
        self._inbound_tasks: set[asyncio.Task[None]] = set()
        self._self_pending_count = 0
        self._closed = False
        self.bound_port = 0
        self.inbound = InboundCounters()
        self.drop_count_unknown_peer = 0
        self.drop_count_self_queue_full = 0

    # --- Transport ---

    async def start(self, handler: InboundHandler) -> None:
        assert self._handler is None, "start() called twice"
        assert not self._closed
        self._handler = handler
        server = grpc.aio.server(options=_server_options(self.limits))
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    SERVICE_NAME,
                    {
                        "Stream": grpc.stream_stream_rpc_method_handler(
                            self._serve_stream, request_deserializer=pb.PeerFrame.FromString
                        ),
                        "Status": grpc.unary_unary_rpc_method_handler(
                            self._serve_status,
                            request_deserializer=pb.StatusRequest.FromString,
                            response_serializer=pb.StatusResponse.SerializeToString,
                        ),
                    },
                ),
            )
        )
        self.bound_port = server.add_insecure_port(self.listen_address)
        assert self.bound_port > 0, f"could not bind {self.listen_address}"
        await server.start()
        self._server = server
        for peer_id, address in self._peer_addresses.items():
            link = _PeerLink(self.node_id, peer_id, address, self.limits)
            self._links[peer_id] = link
            link.start()

    def send(self, to_node: str, message: Routed | Message) -> None:
        link = self._links.get(to_node)
        if link is not None:
            link.send(message)
        elif to_node == self.node_id and not self._closed:
            self._send_self(message)
        else:
            self.drop_count_unknown_peer += 1

    async def request(self, to_node: str, request: PeerRequest, timeout_ms: int) -> PeerResponse:
        assert 0 < timeout_ms <= self.limits.request_timeout_ms_max, f"timeout_ms {timeout_ms} out of range"
        if self._closed:
            raise PeerUnavailable("transport closed")
        link = self._links.get(to_node)
        if link is not None:
            return await link.request(request, timeout_ms)
        if to_node == self.node_id:
            return await self._request_self(request, timeout_ms)
        raise PeerUnavailable(f"unknown peer {to_node!r}")

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await asyncio.gather(*(link.close() for link in self._links.values()))
        for task in list(self._inbound_tasks):
            task.cancel()
        await asyncio.gather(*self._inbound_tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.stop(self.limits.close_grace_ms / 1000)

    # --- Introspection for the runtime, tests and (later) metrics ---

    def peer_ids(self) -> tuple[str, ...]:
        return tuple(self._peer_addresses)

    def link_state(self, peer_id: str) -> LinkState:
        return self._links[peer_id].state

    def link_down_reason(self, peer_id: str) -> str:
        """Why the link to `peer_id` is not up ("" when it is)."""
        return self._links[peer_id].down_reason

    def peer_counters(self, peer_id: str) -> PeerCounters:
        return self._links[peer_id].counters

    async def wait_connected(self, peer_id: str, timeout_ms: int) -> bool:
        """True once the link to `peer_id` is UP, False if it is not within `timeout_ms`."""
        try:
            async with asyncio.timeout(timeout_ms / 1000):
                await self._links[peer_id].wait_up()
        except TimeoutError:
            return False
        return True

    @property
    def drop_count(self) -> int:
        """Every one-way message that was accepted by `send` and will never be delivered."""
        total = self.drop_count_unknown_peer + self.drop_count_self_queue_full
        for link in self._links.values():
            counters = link.counters
            total += counters.drop_count_queue_full + counters.drop_count_peer_down + counters.drop_count_oversized
        return total

    @property
    def reconnect_count(self) -> int:
        return sum(link.counters.reconnect_count for link in self._links.values())

    # --- Self-addressed traffic: served in-process, never through a socket ---

    def _send_self(self, message: Routed | Message) -> None:
        if self._self_pending_count >= self.limits.send_queue_count_max:
            self.drop_count_self_queue_full += 1
            return
        self._self_pending_count += 1
        # Delivered on a later tick, as a peer's message would be: the caller's state machine
        # must not be re-entered from inside its own send.
        asyncio.get_running_loop().call_soon(self._deliver_self, message)

    def _deliver_self(self, message: Routed | Message) -> None:
        self._self_pending_count -= 1
        assert self._self_pending_count >= 0
        if self._closed:
            self.drop_count_self_queue_full += 1
            return
        assert self._handler is not None
        try:
            self._handler.on_message(self.node_id, message)
        except Exception:
            self.inbound.handler_error_count += 1
            logger.exception("on_message failed for a self-addressed %s", type(message).__name__)

    async def _request_self(self, request: PeerRequest, timeout_ms: int) -> PeerResponse:
        assert self._handler is not None, "request() before start()"
        await asyncio.sleep(0)  # never run the handler inside the caller's step, as for a peer
        return await self._call_handler(self.node_id, request, timeout_ms)

    async def _call_handler(self, sender: str, request: PeerRequest, timeout_ms: int) -> PeerResponse:
        """The handler's response, or PeerUnavailable: past the deadline the handler is cancelled,
        as gRPC cancels a unary handler whose deadline passed."""
        assert self._handler is not None
        deadline = asyncio.timeout(timeout_ms / 1000)
        try:
            async with deadline:
                response = await self._handler.on_request(sender, request)
        except TimeoutError:
            if deadline.expired():
                self.inbound.request_expired_count += 1
                raise _DeadlinePassed(f"node {self.node_id}: no response within {timeout_ms} ms") from None
            self.inbound.handler_error_count += 1
            logger.exception("on_request failed for %s from %s", type(request).__name__, sender)
            raise PeerUnavailable(f"node {self.node_id}: handler failed") from None
        except Exception as error:
            self.inbound.handler_error_count += 1
            logger.exception("on_request failed for %s from %s", type(request).__name__, sender)
            raise PeerUnavailable(f"node {self.node_id}: handler failed: {type(error).__name__}") from error
        expected = _REQUEST_TO_RESPONSE[type(request)]
        if type(response) is not expected:
            self.inbound.handler_error_count += 1
            raise PeerUnavailable(
                f"node {self.node_id}: handler answered {type(response).__name__} to {type(request).__name__}"
            )
        return response

    # --- Inbound: streams and probes opened by peers ---

    async def _serve_stream(self, request_iterator: object, context: grpc.aio.ServicerContext) -> None:
        # The work runs in a task we own, so close() can end it and let the RPC finish cleanly
        # instead of waiting out the server's grace period.
        task = asyncio.create_task(self._serve_stream_frames(context))
        self._inbound_tasks.add(task)
        try:
            await task
        except asyncio.CancelledError:
            task.cancel()
            if not self._closed:
                raise
        finally:
            self._inbound_tasks.discard(task)

    async def _serve_stream_frames(self, context: grpc.aio.ServicerContext) -> None:
        hello = await context.read()
        if hello is grpc.aio.EOF:
            return
        sender = hello.sender
        if not sender:
            self.inbound.malformed_count += 1
            logger.warning("inbound stream from %s has no sender in its first frame", context.peer())
            return
        self.inbound.stream_count += 1
        limits = self.limits
        # Each request gets exactly one reply, so responses are bounded by the requests in flight
        # plus the immediate refusals of one frame.
        outbox = _Outbox(limits.request_inflight_count_max + limits.frame_item_count_max, limits.frame_item_count_max)
        serving: set[asyncio.Task[None]] = set()
        await context.write(pb.PeerFrame(sender=self.node_id).SerializeToString())

        def on_oversized(envelope: pb.PeerEnvelope, size_bytes: int) -> None:
            self.inbound.response_drop_count += 1
            self._reply_failed(
                outbox, envelope.correlation_id, f"response of {size_bytes} bytes, limit {limits.message_bytes_max}"
            )

        writer = asyncio.create_task(
            _write_loop(outbox, context.write, limits.message_bytes_max, on_oversized, lambda _count: None)
        )
        try:
            frame = hello
            while True:
                if len(frame.items) > limits.frame_item_count_max:
                    self.inbound.malformed_count += 1
                    logger.warning("node %s sent a frame of %d items; ending its stream", sender, len(frame.items))
                    return
                self.inbound.frame_received_count += 1
                self.inbound.item_received_count += len(frame.items)
                self._dispatch(sender, frame, outbox, serving)
                if writer.done():
                    return  # the stream broke under the writer; the peer will reconnect
                frame = await context.read()
                if frame is grpc.aio.EOF:
                    return
        finally:
            writer.cancel()
            for task in serving:
                task.cancel()
            await asyncio.gather(writer, *serving, return_exceptions=True)

    def _dispatch(self, sender: str, frame: pb.PeerFrame, outbox: _Outbox, serving: set[asyncio.Task[None]]) -> None:
        handler = self._handler
        assert handler is not None
        for envelope in frame.items:
            kind = envelope.kind
            if kind == pb.ENVELOPE_KIND_MESSAGE:
                try:
                    message = codec.decode_message(envelope)
                except codec.MalformedEnvelope as error:
                    self.inbound.malformed_count += 1
                    logger.warning("malformed message from %s: %s", sender, error)
                    continue
                try:
                    handler.on_message(sender, message)
                except Exception:
                    # One bad message must not take down the stream every other message rides on.
                    self.inbound.handler_error_count += 1
                    logger.exception("on_message failed for %s from %s", type(message).__name__, sender)
            elif kind == pb.ENVELOPE_KIND_REQUEST:
                correlation_id = envelope.correlation_id
                timeout_ms = envelope.timeout_ms
                if len(serving) >= self.limits.request_inflight_count_max:
                    self.inbound.overload_count += 1
                    self._reply_failed(outbox, correlation_id, f"overloaded: {len(serving)} requests in flight")
                    continue
                if not 0 < timeout_ms <= self.limits.request_timeout_ms_max:
                    self.inbound.malformed_count += 1
                    self._reply_failed(outbox, correlation_id, f"timeout_ms {timeout_ms} out of range")
                    continue
                try:
                    request = codec.decode_request(envelope)
                except codec.MalformedEnvelope as error:
                    self.inbound.malformed_count += 1
                    self._reply_failed(outbox, correlation_id, f"malformed request: {error}")
                    continue
                task = asyncio.create_task(self._serve_request(sender, correlation_id, timeout_ms, request, outbox))
                serving.add(task)
                task.add_done_callback(serving.discard)
            else:
                self.inbound.malformed_count += 1
                logger.warning("envelope of kind %d from %s on an inbound stream", kind, sender)

    async def _serve_request(
        self, sender: str, correlation_id: int, timeout_ms: int, request: PeerRequest, outbox: _Outbox
    ) -> None:
        try:
            response = await self._call_handler(sender, request, timeout_ms)
        except _DeadlinePassed:
            return  # the requester has given up by now: a reply would only be discarded
        except PeerUnavailable as error:
            self._reply_failed(outbox, correlation_id, str(error))
            return
        envelope = outbox.add()
        if envelope is None:
            self.inbound.response_drop_count += 1
            return
        envelope.kind = pb.ENVELOPE_KIND_RESPONSE
        envelope.correlation_id = correlation_id
        codec.encode(envelope, response)

    def _reply_failed(self, outbox: _Outbox, correlation_id: int, detail: str) -> None:
        envelope = outbox.add()
        if envelope is None:
            self.inbound.response_drop_count += 1
            return
        envelope.kind = pb.ENVELOPE_KIND_RESPONSE
        envelope.correlation_id = correlation_id
        envelope.request_failed.detail = detail

    async def _serve_status(self, request: pb.StatusRequest, context: grpc.aio.ServicerContext) -> pb.StatusResponse:
        metadata = {key: value for key, value in (context.invocation_metadata() or ()) if isinstance(value, str)}
        sender = metadata.get(STATUS_SENDER_METADATA_KEY, "")
        timeout_ms = self.limits.status_timeout_ms
        remaining_s = context.time_remaining()
        if remaining_s is not None:
            timeout_ms = max(1, min(timeout_ms, int(remaining_s * 1000)))
        try:
            response = await self._call_handler(sender, StatusRequest(txn=request.txn), timeout_ms)
        except PeerUnavailable as error:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(error))
            raise AssertionError("abort() returned") from error
        assert isinstance(response, StatusResponse)
        body = pb.StatusResponse()
        codec.encode_status_response(body, response)
        return body
