"""`PeerTransport`: the runtime's `Transport` over plain TCP, one long-lived connection per peer
and direction, carrying length-prefixed `PeerFrame`s (node.proto).

Why not gRPC: nodes used grpc.aio streams until a profile of a node under load (docs/performance.md)
showed gRPC's stream writes and its poller thread taking about 40% of a node's CPU, for about
eight messages per transaction. A frame on a plain connection costs one protobuf encode and one
socket write, so the same messages now cost a few percent.

Why one connection per direction: each node opens ONE outbound connection to each peer and sends
every one-way message and request on it; the peer sends the responses back on that same
connection. Traffic from B to A uses B's own outbound connection, so each direction of a pair has
exactly one connection, and ownership of reconnection is never shared.

Why frames: everything queued for a peer during one event-loop tick goes out as one frame (the
first message of a tick schedules the flush), in one write, which amortises the per-write cost over
many protocol messages.

Wire: a frame is a 4-byte big-endian length, then that many bytes of an encoded `PeerFrame`. The
connecting side sends a hello (a frame naming only its `sender`), the accepting side answers with
its own hello; then the connecting side sends messages and requests and the accepting side
answers with responses. A hello may be no larger than `HELLO_FRAME_BYTES_MAX`: until it arrives,
the other end could be anyone. An empty frame (length 0) is a heartbeat: each side writes one when it
has been quiet for half of `keepalive_interval_ms`, and ends a connection it has heard nothing
on for `keepalive_interval_ms + keepalive_timeout_ms`: a killed VM sends no RST.

TLS: with `PeerTlsContexts` (cornus.runtime.peer_tls) both ends of every connection show a
certificate of the cluster's CA before the hello; a connection that does not finish its handshake
within `connect_timeout_ms` is closed like one that sends no hello.

Backpressure: an inbound stream whose requester takes its responses more slowly than it asks
holds at most `inbound_response_bytes_max` of them queued, then stops reading that connection
until they drain; a flush adds no more than the socket's write buffer may hold.

Failure model: the protocol tolerates lost messages and has its own timers, so the transport
never retries a message. A link is CONNECTING (first attempt: sends queue, bounded), UP, or DOWN
(sends drop and are counted, requests fail fast). A broken connection fails its pending requests
at once and reconnects with capped exponential backoff and jitter. Every queue, frame, message and
in-flight set is bounded by `TransportLimits`.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import logging
import random
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from cornus.protocol.messages import Message
from cornus.runtime import eager
from cornus.runtime.config import TIMEOUT_MS_PEER_REQUEST_MAX
from cornus.runtime.effect_runner import crash_if_failed
from cornus.runtime.peer_tls import PeerTlsContexts
from cornus.runtime.transport import InboundHandler, ListenFailed, PeerUnavailable, RequestTooLarge, Transport
from cornus.runtime.wire import (
    READ_BYTES_MAX,
    READ_VALUE_OVERHEAD_BYTES,
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

# Inbound connections allowed beyond two per peer (probes, tools).
INBOUND_SPARE_COUNT = 8
# Inbound connections closed for sending no hello (or, with TLS, not finishing their handshake)
# are reported at most this often: a peer with a certificate of another CA retries every 2 s or
# less, for ever (found by review).
NO_HELLO_REPORT_INTERVAL_S = 60.0

# A connection's first frame (its hello) is refused past this, as soon as its length is read: a
# frame is parsed whole before its limits can be checked, and before the hello anyone may send one
# (found by audit, 2026-11-28, second: 16 MiB of empty envelopes cost ~0.4 s of CPU and ~500 MB).
# A hello names its sender; a tool's probe sends a status request with it.
HELLO_FRAME_BYTES_MAX = 4 * 1024

PEER_COUNT_MAX = 1024
PORT_MAX = 65535
_LENGTH_BYTES = 4
_HEARTBEAT = bytes(_LENGTH_BYTES)  # an empty frame

_REQUEST_TO_RESPONSE: dict[type, type] = {ExecuteRequest: ExecuteResponse, StatusRequest: StatusResponse}

# What a response's envelope adds around its body's fields, with the frame's tag and length for
# it: under 40 bytes (a varint takes at most 10).
RESPONSE_HEAD_BYTES_MAX = 64
_UTF8_CHARACTER_BYTES_MAX = 4


def _response_bytes(envelope: pb.PeerEnvelope, response: PeerResponse) -> int:
    """What `response`, encoded into `envelope`, adds to its frame, or a little more.

    An execute answer is counted from its values, as READ_BYTES_MAX counts them: ByteSize would
    serialise it a second time, ~2 ms a MiB, and an answer may be 8 MiB."""
    if type(response) is ExecuteResponse:
        byte_count = RESPONSE_HEAD_BYTES_MAX + _UTF8_CHARACTER_BYTES_MAX * len(response.detail)
        for value in response.values:
            byte_count += READ_VALUE_OVERHEAD_BYTES if value is None else READ_VALUE_OVERHEAD_BYTES + len(value)
        return byte_count
    return envelope.ByteSize()


@dataclass(frozen=True, slots=True)
class TransportLimits:
    """Every bound the transport enforces. Both ends of a pair must agree on the frame limits."""

    # One-way messages and requests waiting for a peer's writer; beyond it sends are dropped.
    send_queue_count_max: int = 8192
    # Envelopes per PeerFrame; larger frames from a peer end its stream as malformed.
    frame_item_count_max: int = 512
    # A frame never exceeds it (frames split to fit), a single envelope over it is refused, and a
    # peer announcing a longer frame is cut off as malformed.
    message_bytes_max: int = 16 * 1024 * 1024
    # Bytes a connection may hold in its socket buffer before it stops flushing (backpressure);
    # what waits meanwhile stays in the bounded send queue.
    write_buffer_bytes_max: int = 4 * 1024 * 1024
    # Requests awaiting a response, per peer, and handlers waiting (in a task) per inbound stream;
    # a request answered without waiting never counts against the second.
    request_inflight_count_max: int = 4096
    # Bytes of responses an inbound stream may hold queued for its requester before it takes no
    # more requests from that connection and stops reading it (what the peer sends then waits in
    # the sockets, and the peer's writes back up). Each response may be READ_BYTES_MAX, and a
    # requester that stops reading (an overloaded peer's loop, a raw client) made a node queue up to
    # ~36 GiB of them (found by audit, 2026-11-28, second): eight of the largest keep the socket
    # busy while the requester catches up. Reading resumes once flushes bring the queue down to
    # the second bound, so a stream that is read slowly does not stop and start per response.
    inbound_response_bytes_max: int = 64 * 1024 * 1024
    inbound_response_bytes_resume: int = 16 * 1024 * 1024
    request_timeout_ms_max: int = TIMEOUT_MS_PEER_REQUEST_MAX
    # Time from opening a stream to the peer's hello before the attempt counts as failed.
    connect_timeout_ms: int = 2_000
    reconnect_backoff_ms_min: int = 20
    reconnect_backoff_ms_max: int = 2_000
    # Heartbeats: a peer that stops sending is declared dead after about interval + timeout, even
    # when no traffic flows (a killed VM sends no RST).
    keepalive_interval_ms: int = 5_000
    keepalive_timeout_ms: int = 5_000
    status_timeout_ms: int = 5_000
    close_grace_ms: int = 200
    # A message sent with may_wait (an acknowledgement only garbage collection waits for) stays
    # queued until the next message to that peer takes it along, or this long: alone it would
    # cost a write, and a wake-up and a read at the peer, of its own.
    may_wait_delay_ms_max: int = 5
    # A frame (the hello too) must arrive whole within this long of its first byte: a connection
    # that announces a large frame and drips it, never silent, would hold that memory for ever.
    frame_timeout_ms: int = 10_000

    def __post_init__(self) -> None:
        assert 1 <= self.send_queue_count_max <= 1_000_000
        assert 1 <= self.frame_item_count_max <= 65_536
        assert 1024 <= self.message_bytes_max < 2 ** (8 * _LENGTH_BYTES)
        assert self.write_buffer_bytes_max >= 1024
        assert 1 <= self.request_inflight_count_max <= 1_000_000
        # Below the budget, so a stream that resumes reading can take at least one request.
        assert 0 <= self.inbound_response_bytes_resume < self.inbound_response_bytes_max
        assert 1 <= self.request_timeout_ms_max <= 2**32 - 1  # carried as uint32 on the wire
        assert self.connect_timeout_ms >= 1
        assert 1 <= self.reconnect_backoff_ms_min <= self.reconnect_backoff_ms_max <= 600_000
        assert self.keepalive_interval_ms >= 100  # a heartbeat per tick would be traffic for nothing
        assert self.keepalive_timeout_ms >= 1
        assert self.status_timeout_ms >= 1
        assert self.close_grace_ms >= 0
        # Well below the protocol's resend timeouts (100 ms by default): a late ack must not look lost.
        assert 0 <= self.may_wait_delay_ms_max <= 50
        assert self.frame_timeout_ms >= 1


# An owner answers a read with at most READ_BYTES_MAX of values (cornus.runtime.wire), whose
# envelope must fit a message with room to spare: a larger answer is lost on the link.
assert TransportLimits().message_bytes_max >= 2 * READ_BYTES_MAX


class MessageTooLarge(RequestTooLarge, ValueError):
    """A request whose encoding exceeds `message_bytes_max`: never sent, never retryable."""


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
    # Requests queued while the link connected whose callers' deadlines passed meanwhile.
    drop_count_expired: int = 0
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
    """What happened on the connections peers opened to this node."""

    stream_count: int = 0
    frame_received_count: int = 0
    item_received_count: int = 0
    malformed_count: int = 0
    handler_error_count: int = 0
    overload_count: int = 0
    # Requests whose handler's deadline passed, and those whose requester's time ran out while
    # they waited, unread, for their stream to take requests again.
    request_expired_count: int = 0
    response_drop_count: int = 0
    # Times an inbound connection stopped being read: its requester took its responses more
    # slowly than it asked for them.
    read_pause_count: int = 0
    refused_connection_count: int = 0  # past inbound_connection_count_max, none left to evict
    # Closed to make room for a new connection: the oldest of those yet to say hello, at the cap.
    evicted_connection_count: int = 0
    # Responses written back on inbound connections.
    frame_sent_count: int = 0
    item_sent_count: int = 0


def parse_address(address: str) -> tuple[str, int]:
    """(host, port) of "host:port"; an IPv6 host comes bracketed ("[::]:7000") and leaves bare."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ValueError(f"address {address!r} must be host:port")
    port = int(port_text)
    if not 0 <= port <= PORT_MAX:
        raise ValueError(f"address {address!r}: port out of range")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, port


class _Outbox:
    """Envelopes waiting for one connection's flush, already grouped into frames as they are queued.

    Envelopes are added in place inside the frame that will be written, so queuing costs no copy.
    `wake` is called on every add: its owner schedules one flush per event-loop tick.

    The bytes its owner `charge`s for the envelopes are counted per frame, and a frame takes no
    more envelopes once it holds `frame_bytes_max` of them: a flush stops at a full write buffer
    only between frames, so a frame of many large responses would overshoot it by itself.
    """

    __slots__ = ("_count_max", "_frame_bytes", "_frame_bytes_max", "_frames", "_item_count_max", "_wake",
                 "byte_count", "count")

    def __init__(self, count_max: int, item_count_max: int, frame_bytes_max: int, wake: Callable[[], None]) -> None:
        assert count_max >= 1 and item_count_max >= 1 and frame_bytes_max >= 1
        self._count_max = count_max
        self._item_count_max = item_count_max
        self._frame_bytes_max = frame_bytes_max
        self._frames: deque[pb.PeerFrame] = deque()
        self._frame_bytes: deque[int] = deque()  # charged to each of `_frames`
        self._wake = wake
        self.count = 0
        self.byte_count = 0  # charged to every frame queued

    def add(self, wake: bool = True) -> pb.PeerEnvelope | None:
        """A fresh envelope at the tail, or None when the outbox is full. Without `wake` it waits
        for the next flush that something else asks for."""
        if self.count >= self._count_max:
            return None
        frames = self._frames
        if (not frames or len(frames[-1].items) >= self._item_count_max
                or self._frame_bytes[-1] >= self._frame_bytes_max):
            frames.append(pb.PeerFrame())
            self._frame_bytes.append(0)
        self.count += 1
        if wake:
            self._wake()
        return frames[-1].items.add()

    def charge(self, byte_count: int) -> None:
        """Count `byte_count` for the envelope the last `add` returned, once it is encoded."""
        assert byte_count > 0 and self._frames and self._frames[-1].items
        self._frame_bytes[-1] += byte_count
        self.byte_count += byte_count

    def discard_last(self) -> None:
        """Undo the last `add` (its encoding failed), before it was charged."""
        assert self.count > 0 and self._frames
        del self._frames[-1].items[-1]
        self.count -= 1

    def drop_if(self, dropped: Callable[[pb.PeerEnvelope], bool]) -> int:
        """Remove the queued envelopes `dropped` picks, keeping the others' order; how many went.
        `dropped` sees each envelope once, and may rewrite one it keeps. A scan of the whole
        queue: for a rare path only."""
        # Only a link's queue drops, and a link charges nothing: the bytes dropped are unknown.
        assert self.byte_count == 0
        count = 0
        for frame in self._frames:
            items = frame.items
            for index in range(len(items) - 1, -1, -1):
                if dropped(items[index]):
                    del items[index]
                    count += 1
        self._frames = deque(frame for frame in self._frames if frame.items)
        self._frame_bytes = deque(0 for _ in self._frames)
        self.count -= count
        assert self.count >= 0
        return count

    def pop(self) -> pb.PeerFrame | None:
        if not self._frames:
            return None
        frame = self._frames.popleft()
        self.count -= len(frame.items)
        self.byte_count -= self._frame_bytes.popleft()
        assert self.count >= 0 and self.byte_count >= 0
        return frame

    def clear(self) -> list[pb.PeerEnvelope]:
        dropped = [envelope for frame in self._frames for envelope in frame.items]
        self._frames.clear()
        self._frame_bytes.clear()
        self.count = 0
        self.byte_count = 0
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


class _FrameConnection(asyncio.Protocol):
    """One TCP connection carrying length-prefixed frames both ways, with heartbeats.

    Frames are parsed and handed to `on_frame` as bytes arrive, inside the event loop's read
    callback: no task and no await per frame. `lost` resolves with the reason once the connection
    is gone, whoever ended it.

    Its owner may `pause_reading` (from `on_frame` too: no frame after that one is handed over)
    and `resume_reading`, which first hands over the frames that arrived meanwhile.
    """

    def __init__(self, limits: TransportLimits, on_frame: Callable[[pb.PeerFrame], None],
                 on_writable: Callable[[], None]) -> None:
        self.limits = limits
        self.on_frame = on_frame
        self.on_writable = on_writable
        self.loop = asyncio.get_running_loop()
        self.lost: asyncio.Future[str] = self.loop.create_future()
        self.closed = False
        self.paused = False  # writing: the socket's buffer is past write_buffer_bytes_max
        self.reading_paused = False
        self._transport_reading_paused = False  # lags reading_paused while a resume parses the buffer
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._reason = ""
        # The last sign of life: a read, or while reading is paused, the peer taking our bytes.
        self._last_heard_s = self._last_write_s = time.monotonic()
        self._written_bytes = 0  # handed to the transport, ever
        self._drained_bytes_max = 0  # of those, the most seen gone from its buffer while reading paused
        self._partial_since_s: float | None = None  # when the frame still incomplete began
        self._heartbeat: asyncio.TimerHandle | None = None
        self._hello_in = False  # a first frame has arrived: frames may be message_bytes_max

    # --- asyncio.Protocol ---

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self.closed:
            # Ended before it was made (a TLS handshake that finished after the hello deadline had
            # given its slot back, found by review): kept, it would read without bound.
            transport.abort()  # type: ignore[attr-defined]
            return
        # uvloop's TCP transport does not derive from asyncio.Transport; it has the same methods.
        self._transport = transport  # type: ignore[assignment]
        transport.set_write_buffer_limits(high=self.limits.write_buffer_bytes_max)
        self._heartbeat = self.loop.call_later(self.limits.keepalive_interval_ms / 2000, self._beat)

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return  # failed: what still arrives before the transport closes is dropped
        self._last_heard_s = time.monotonic()
        self._buffer += data
        if not self.reading_paused:  # a transport may hand over what it had read before it paused
            self._parse()

    def _parse(self) -> None:
        """Hand every whole frame buffered to `on_frame`, until reading is paused."""
        buffer = self._buffer
        position = 0
        end = len(buffer)
        bytes_max = self.limits.message_bytes_max if self._hello_in else min(
            HELLO_FRAME_BYTES_MAX, self.limits.message_bytes_max)
        while end - position >= _LENGTH_BYTES and not self.closed and not self.reading_paused:
            size = int.from_bytes(buffer[position:position + _LENGTH_BYTES], "big")
            if size > bytes_max:
                self.fail(f"frame of {size} bytes announced, the limit is {bytes_max}"
                          f"{'' if self._hello_in else ' for a hello'}")
                return
            start = position + _LENGTH_BYTES
            if end - start < size:
                break
            position = start + size
            if size == 0:
                continue  # a heartbeat
            try:
                frame = pb.PeerFrame.FromString(bytes(buffer[start:position]))
            except Exception:  # protobuf's DecodeError; the peer is not speaking our wire format
                self.fail("undecodable frame")
                return
            if not self._hello_in:
                self._hello_in = True
                bytes_max = self.limits.message_bytes_max
            self.on_frame(frame)
        del buffer[:position]
        if not buffer:
            self._partial_since_s = None
        elif position or self._partial_since_s is None:
            self._partial_since_s = self._last_heard_s  # a new frame began in this read

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self.on_writable()

    def pause_reading(self) -> None:
        """Read nothing more, and hand over no more frames, until `resume_reading`."""
        assert not self.reading_paused
        self.reading_paused = True
        if self.closed or self._transport is None:
            return
        self._drained_bytes_max = self._written_bytes - self._transport.get_write_buffer_size()
        if not self._transport_reading_paused:
            self._transport_reading_paused = True
            self._transport.pause_reading()

    def resume_reading(self) -> None:
        assert self.reading_paused
        self.reading_paused = False
        if self.closed or self._transport is None:
            return
        # Nothing was heard because we did not listen; what waits in the buffer arrives now.
        self._last_heard_s = time.monotonic()
        self._partial_since_s = None
        self._parse()
        if not self.reading_paused and not self.closed:
            assert self._transport_reading_paused
            self._transport_reading_paused = False
            self._transport.resume_reading()

    def write_buffer_bytes(self) -> int:
        return 0 if self._transport is None else self._transport.get_write_buffer_size()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        if not self.lost.done():
            reason = self._reason or (f"{type(exc).__name__}: {exc}" if exc else "connection closed by the peer")
            self.lost.set_result(reason)

    # --- ours ---

    def write_frames(self, frames: list[bytes]) -> None:
        if self.closed or self._transport is None:
            return
        parts: list[bytes] = []
        written_bytes = 0
        for data in frames:
            parts.append(len(data).to_bytes(_LENGTH_BYTES, "big"))
            parts.append(data)
            written_bytes += _LENGTH_BYTES + len(data)
        self._transport.writelines(parts)
        self._written_bytes += written_bytes
        self._last_write_s = time.monotonic()

    def fail(self, reason: str) -> None:
        """End the connection at once; `lost` will say `reason`."""
        if not self.closed:
            self._reason = reason
            self.closed = True
            if self._transport is not None:
                self._transport.abort()
            elif not self.lost.done():
                # Never made: a TLS handshake that did not finish calls neither connection_made
                # nor connection_lost, so nothing else would say it is gone (found by test
                # (2026-11-28): an inbound stream of a peer without a certificate held its slot for ever).
                self.lost.set_result(reason)

    def _beat(self) -> None:
        if self.closed or self._transport is None:
            return
        now = time.monotonic()
        limits = self.limits
        if self.reading_paused:
            # Its heartbeats wait unread, and we paused because it takes our bytes slowly: it is
            # alive while it takes some. One that takes none is cut off as a silent one is.
            drained_bytes = self._written_bytes - self._transport.get_write_buffer_size()
            if drained_bytes > self._drained_bytes_max:
                self._drained_bytes_max = drained_bytes
                self._last_heard_s = now
        silent_ms = (now - self._last_heard_s) * 1000
        if silent_ms > limits.keepalive_interval_ms + limits.keepalive_timeout_ms:
            self.fail(f"nothing heard from the peer for {silent_ms:.0f} ms"
                      f"{' (and nothing of ours taken)' if self.reading_paused else ''}")
            return
        # While reading is paused a frame may be whole but unread, or its end unread in the socket.
        if (self._partial_since_s is not None and not self.reading_paused
                and (now - self._partial_since_s) * 1000 > limits.frame_timeout_ms):
            self.fail(f"a frame took more than {limits.frame_timeout_ms} ms to arrive")
            return
        # Every half interval, so the peer hears something well within its interval + timeout.
        if (now - self._last_write_s) * 1000 >= limits.keepalive_interval_ms / 2:
            self._transport.write(_HEARTBEAT)
            self._written_bytes += len(_HEARTBEAT)
            self._last_write_s = now
        self._heartbeat = self.loop.call_later(limits.keepalive_interval_ms / 2000, self._beat)


def _flush(
    outbox: _Outbox,
    connection: _FrameConnection,
    bytes_max: int,
    on_oversized: Callable[[pb.PeerEnvelope, int], None],
    on_written: Callable[[int], None],
) -> bool:
    """What is queued, in one write, up to what the connection's write buffer may hold: whether
    some is left for a later flush.

    Found by audit (2026-11-28, second): one flush serialised the whole queue at once, and an
    inbound stream's could be gigabytes of responses. At least one frame goes, so a flush always
    makes progress; one that fills the buffer pauses writing, and resume_writing wakes the owner.
    """
    encoded: list[bytes] = []
    room_bytes = connection.limits.write_buffer_bytes_max - connection.write_buffer_bytes()
    while (room_bytes > 0 or not encoded) and (frame := outbox.pop()) is not None:
        for data in _serialize_bounded(frame, bytes_max, on_oversized):
            encoded.append(data)
            room_bytes -= _LENGTH_BYTES + len(data)
        on_written(len(frame.items))
    if encoded:
        connection.write_frames(encoded)
    return outbox.count > 0


def _frame_bytes_max(limits: TransportLimits) -> int:
    """An outbox frame's bytes past which it takes no more: one such frame, with the envelope that
    crossed it, is all a flush may add past a full write buffer. Half a message, so that frame with
    one more answer of READ_BYTES_MAX still fits one message, but for the envelopes' few bytes."""
    return min(limits.write_buffer_bytes_max, limits.message_bytes_max // 2)


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


class _Refused(asyncio.Protocol):
    """An inbound connection past the limit: closed as soon as it is made."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


class _LinkBroken(Exception):
    """The connection ended or the peer answered as someone else."""


class _PeerLink:
    """The outbound connection to one peer: its queue, its pending requests and its reconnect loop."""

    def __init__(self, node_id: str, peer_id: str, address: str, limits: TransportLimits,
                 tls: PeerTlsContexts | None) -> None:
        self.node_id = node_id
        self.peer_id = peer_id
        self.address = address
        self.limits = limits
        self.tls = tls
        self.state = LinkState.CONNECTING
        self.counters = PeerCounters()
        self.down_reason = "not connected yet"
        self._outbox = _Outbox(limits.send_queue_count_max, limits.frame_item_count_max, _frame_bytes_max(limits),
                               self._wake)
        # correlation id -> (future, the response type the request expects, its deadline's timer)
        self._pending: dict[int, tuple[asyncio.Future[PeerResponse], type, asyncio.TimerHandle]] = {}
        self._correlation_id_last = 0
        self._up = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._hello = pb.PeerFrame(sender=node_id).SerializeToString()
        self._connection: _FrameConnection | None = None
        self._flush_scheduled = False
        self._stalled = False  # a flush found the connection paused: what queued may have expired
        self._refused = False  # the last attempt found nobody listening
        self._may_wait_timer: asyncio.TimerHandle | None = None
        # Kept: asyncio.get_running_loop() makes a getpid system call on Python 3.11, and every
        # request needs the loop.
        self._loop = asyncio.get_running_loop()

    def start(self) -> None:
        assert self._task is None
        self._task = asyncio.create_task(self._run(), name=f"node-rpc-link:{self.node_id}->{self.peer_id}")
        # The link must run for the node's life: a link task that ended left its peer DOWN for
        # good, and said nothing (found by audit, 2026-11-28, second).
        self._task.add_done_callback(crash_if_failed)

    async def close(self) -> None:
        self.state = LinkState.CLOSED
        if self._may_wait_timer is not None:
            self._may_wait_timer.cancel()
            self._may_wait_timer = None
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._fail_all("transport closed")
        assert not self._pending or all(future.done() for future, _, _ in self._pending.values())

    async def wait_up(self) -> None:
        await self._up.wait()

    def send(self, message: Routed | Message, may_wait: bool = False) -> None:
        if self.state is LinkState.DOWN or self.state is LinkState.CLOSED:
            self.counters.drop_count_peer_down += 1
            return
        envelope = self._outbox.add(wake=not may_wait)
        if envelope is None:
            self.counters.drop_count_queue_full += 1
            return
        envelope.kind = pb.ENVELOPE_KIND_MESSAGE
        try:
            codec.encode(envelope, message)
        except BaseException:
            self._outbox.discard_last()
            raise
        if may_wait and not self._flush_scheduled and self._may_wait_timer is None:
            self._may_wait_timer = self._loop.call_later(
                self.limits.may_wait_delay_ms_max / 1000, self._may_wait_expired)

    def _may_wait_expired(self) -> None:
        self._may_wait_timer = None
        self._wake()

    def start_request(self, request: PeerRequest, timeout_ms: int) -> asyncio.Future[PeerResponse]:
        """Queue `request` now; its future resolves with the response, or fails with
        PeerUnavailable past `timeout_ms` or when the link is lost. Raises PeerUnavailable at once
        if it cannot even be queued. Cancelling the future forgets the request."""
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
        loop = self._loop
        future: asyncio.Future[PeerResponse] = loop.create_future()
        # A bare timer, not asyncio.timeout: this is the hot path and a timer is the cheapest
        # deadline asyncio has.
        timer = loop.call_later(timeout_ms / 1000, self._expire, future, timeout_ms)
        assert correlation_id not in self._pending
        self._pending[correlation_id] = (future, _REQUEST_TO_RESPONSE[type(request)], timer)
        future.add_done_callback(functools.partial(self._request_done, correlation_id, timer))
        return future

    def _request_done(self, correlation_id: int, timer: asyncio.TimerHandle, _: asyncio.Future[PeerResponse]) -> None:
        timer.cancel()
        self._pending.pop(correlation_id, None)

    def _expire(self, future: asyncio.Future[PeerResponse], timeout_ms: int) -> None:
        if not future.done():
            future.set_exception(PeerUnavailable(f"peer {self.peer_id}: no response within {timeout_ms} ms"))

    def _fail_all(self, reason: str) -> None:
        for future, _, _ in self._pending.values():
            if not future.done():
                future.set_exception(PeerUnavailable(f"peer {self.peer_id} at {self.address}: {reason}"))

    def flush_now(self) -> None:
        """Send what is queued now (the flush already scheduled then finds nothing)."""
        if self._flush_scheduled:
            self._flush()

    def _wake(self) -> None:
        # One flush per tick, and none before the connection is up (CONNECTING queues).
        if not self._flush_scheduled and self._connection is not None:
            self._flush_scheduled = True
            self._connection.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._may_wait_timer is not None:
            self._may_wait_timer.cancel()  # what waited leaves now
            self._may_wait_timer = None
        connection = self._connection
        if connection is None or connection.closed:
            return  # a lost connection's queue is cleared
        if connection.paused:
            self._stalled = True
            return  # resume_writing wakes us again
        if self._stalled:
            self._stalled = False
            self._drop_expired_requests()
        left = _flush(self._outbox, connection, self.limits.message_bytes_max, self._on_oversized, self._on_written)
        if left and not connection.paused:
            self._wake()  # the socket took it all at once: the rest goes on the next tick

    def _drop_expired_requests(self) -> None:
        """Drop the queued requests whose callers stopped waiting (past their deadline): sent
        after a reconnect or a stall, they would run at the peer for nobody (found by audit: an
        interactive one held its locks until the owner's idle sweep). Only then: it walks the
        whole queue.

        Those kept carry only the time their callers have left: the peer times a request from its
        arrival, and with its whole budget it could run long after its caller gave up (found by
        audit, 2026-11-28, second)."""
        pending = self._pending
        now_s = self._loop.time()

        def expired(envelope: pb.PeerEnvelope) -> bool:
            if envelope.kind != pb.ENVELOPE_KIND_REQUEST:
                return False
            entry = pending.get(envelope.correlation_id)
            if entry is None or entry[0].done():
                return True
            # Its timer has not fired yet, late as the loop may be: 1 ms, the least the wire takes.
            left_ms = max(1, int((entry[2].when() - now_s) * 1000))
            assert left_ms <= envelope.timeout_ms
            envelope.timeout_ms = left_ms
            return False

        self.counters.drop_count_expired += self._outbox.drop_if(expired)

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
        failure_count = 0  # consecutive attempts that never reached UP, or did not stay up
        reason_logged = ""
        while True:
            up_s = await self._connect_and_serve()
            reached_up = up_s is not None
            # A link that came up and fell within a backoff's longest counts as a failure too:
            # found by audit (2026-11-27), a peer that answered the hello and hung up at once was
            # reconnected to every 10-20 ms, for ever.
            stayed_up = up_s is not None and up_s * 1000 >= self.limits.reconnect_backoff_ms_max
            failure_count = 0 if stayed_up else failure_count + 1
            if reached_up:
                reason_logged = ""
            else:
                self.counters.connect_failure_count += 1
                # Said once per cause, not per attempt: a peer refusing this node's certificate
                # was silent before (found by test, 2026-11-27), and is retried every 2 s at most.
                # A refused connection is a peer not listening yet (a cluster starting, a node
                # restarting): no warning.
                if self.down_reason != reason_logged:
                    reason_logged = self.down_reason
                    level = logging.INFO if self._refused else logging.WARNING
                    logger.log(level, "link %s -> %s (%s) cannot connect: %s; retrying", self.node_id, self.peer_id,
                               self.address, reason_logged)
            exponent = min(failure_count, 30)
            backoff_ms = min(self.limits.reconnect_backoff_ms_max, self.limits.reconnect_backoff_ms_min * 2**exponent)
            # Jitter keeps the nodes of a restarted cluster from reconnecting in lockstep.
            await asyncio.sleep(random.uniform(backoff_ms / 2, backoff_ms) / 1000)

    async def _connect_and_serve(self) -> float | None:
        """One connection, served until it is lost: how long it was UP (None: it never was)."""
        loop = asyncio.get_running_loop()
        host, port = parse_address(self.address)
        hello: asyncio.Future[pb.PeerFrame] = loop.create_future()

        def on_hello(frame: pb.PeerFrame) -> None:
            if not hello.done():
                hello.set_result(frame)

        connection = _FrameConnection(self.limits, on_hello, self._wake)
        up_since_s: float | None = None
        self._refused = False
        reason = "connection ended"
        try:
            async with asyncio.timeout(self.limits.connect_timeout_ms / 1000):
                tls = self.tls
                await loop.create_connection(lambda: connection, host, port, ssl=tls.client if tls else None,
                                             server_hostname=host if tls else None)
                connection.write_frames([self._hello])
                await asyncio.wait((hello, connection.lost), return_when=asyncio.FIRST_COMPLETED)
            if not hello.done():
                raise _LinkBroken(f"peer ended the connection before its hello ({connection.lost.result()})")
            answer = hello.result()
            if answer.sender != self.peer_id:
                raise _LinkBroken(f"{self.address} is node {answer.sender!r}, expected {self.peer_id!r}")
            connection.on_frame = self._on_frame
            self._connection = connection
            self._set_up()
            up_since_s = time.monotonic()
            self._drop_expired_requests()  # what queued while CONNECTING leaves now, but not those
            self._wake()
            reason = await connection.lost
        except (OSError, TimeoutError, _LinkBroken) as error:  # ssl.SSLError is an OSError
            reason = _describe(error)
            # Nobody listening (a cluster starting, a node restarting); asyncio says it so for a
            # name with several addresses: "Multiple exceptions: [Errno 111] Connect call failed ...".
            self._refused = isinstance(error, ConnectionRefusedError) or (
                type(error) is OSError and str(error).startswith("Multiple exceptions") and "[Errno 111]" in str(error))
        except AssertionError:
            raise  # a broken invariant of ours: the node stops (crash_if_failed), it does not retry
        except Exception as error:
            # Anything else a connect raises fails this attempt only: a UnicodeError from encoding
            # a name IDNA refuses ended the link task for good (found by audit, 2026-11-28,
            # second). Cancellation is no Exception: it still ends the task.
            reason = _describe(error)
        finally:
            self._connection = None
            connection.fail(reason)
            self._set_down(reason)
        if up_since_s is None:
            return None
        logger.info("link %s -> %s lost: %s", self.node_id, self.peer_id, reason)
        return time.monotonic() - up_since_s

    def _on_frame(self, frame: pb.PeerFrame) -> None:
        if len(frame.items) > self.limits.frame_item_count_max:
            self.counters.malformed_count += 1
            assert self._connection is not None
            self._connection.fail(f"frame of {len(frame.items)} items, the limit is {self.limits.frame_item_count_max}")
            return
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
        future, response_type, _ = entry
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


class _InboundStream:
    """The accepting end of a connection a peer opened: its hello, then its messages and requests,
    with the responses going back on the same connection."""

    def __init__(self, owner: PeerTransport) -> None:
        limits = owner.limits
        self.owner = owner
        self.sender = ""
        self.connection = _FrameConnection(limits, self._on_hello, self._wake)
        # Each request gets exactly one reply, and the peer keeps at most request_inflight_count_max
        # requests unanswered, so that bounds the responses queued, whether answered at once (as
        # most are, cornus.runtime.eager) or by a handler that waited; the frame's worth is slack.
        # Their bytes are bounded by inbound_response_bytes_max: past it reading pauses.
        self.outbox = _Outbox(limits.request_inflight_count_max + limits.frame_item_count_max,
                              limits.frame_item_count_max, _frame_bytes_max(limits), self._wake)
        self.serving: set[asyncio.Task[PeerResponse]] = set()
        self._flush_scheduled = False
        # While reading is paused: the rest of the frame dispatch stopped in, from that envelope,
        # and since when (what was read before then waits to be dispatched).
        self._held: tuple[pb.PeerFrame, int] | None = None
        self._paused_since_s: float | None = None
        # A connection must say who it is within a connect's patience: one that sends nothing, or
        # only heartbeats, held one of the few inbound slots for good, and enough of them kept the
        # real peers' reconnects out (found by audit).
        assert owner._loop is not None, "an inbound stream of a transport not started"
        self._hello_deadline: asyncio.TimerHandle | None = owner._loop.call_later(
            limits.connect_timeout_ms / 1000, self._no_hello)
        self.connection.lost.add_done_callback(self._on_lost)

    def _no_hello(self) -> None:
        self._hello_deadline = None
        if not self.sender:
            self.owner.inbound.malformed_count += 1
            self.owner.no_hello_seen()
            self.connection.fail("no hello in time")

    def _on_hello(self, frame: pb.PeerFrame) -> None:
        self.owner.said_hello(self)
        if self._hello_deadline is not None:
            self._hello_deadline.cancel()
            self._hello_deadline = None
        if not frame.sender:
            self.owner.inbound.malformed_count += 1
            logger.warning("an inbound connection's first frame names no sender; closing it")
            self.connection.fail("no sender in the hello")
            return
        self.sender = frame.sender
        self.owner.inbound.stream_count += 1
        self.connection.write_frames([self.owner.hello])
        self.connection.on_frame = self._on_frame
        if frame.items:
            self._on_frame(frame)

    def _on_frame(self, frame: pb.PeerFrame) -> None:
        limits = self.owner.limits
        if len(frame.items) > limits.frame_item_count_max:
            self.owner.inbound.malformed_count += 1
            logger.warning("node %s sent a frame of %d items; ending its connection", self.sender, len(frame.items))
            self.connection.fail(f"frame of {len(frame.items)} items, the limit is {limits.frame_item_count_max}")
            return
        self.owner.inbound.frame_received_count += 1
        self.owner.inbound.item_received_count += len(frame.items)
        self._dispatch(frame, 0)

    def _dispatch(self, frame: pb.PeerFrame, start: int) -> bool:
        """Dispatch `frame` from its envelope `start`: False when its responses queued are past
        their budget, and the rest is held, with reading paused, until they are flushed."""
        waited_ms = 0
        if self._paused_since_s is not None:
            waited_ms = int((self.connection.loop.time() - self._paused_since_s) * 1000)
        stop = self.owner.dispatch(self.sender, frame, self.outbox, self.serving,
                                   start=start, waited_ms=waited_ms)
        if stop == len(frame.items):
            return True
        assert start <= stop < len(frame.items) and self._held is None
        self._held = (frame, stop)
        if not self.connection.reading_paused:
            self.connection.pause_reading()
            self.owner.inbound.read_pause_count += 1
            if self._paused_since_s is None:
                self._paused_since_s = self.connection.loop.time()
        return False

    def _resume_reading(self) -> None:
        """Take requests again: the frame held first, then what was read meanwhile, then the socket."""
        assert self.connection.reading_paused and self._paused_since_s is not None
        held, self._held = self._held, None
        if held is not None and not self._dispatch(*held):
            return
        self.connection.resume_reading()  # may pause again, on a frame that was buffered
        if not self.connection.reading_paused:
            self._paused_since_s = None

    def _wake(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.connection.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        connection = self.connection
        if connection.closed or connection.paused:
            return  # resume_writing wakes us again
        left = _flush(self.outbox, connection, self.owner.limits.message_bytes_max, self._on_oversized,
                      self.owner.on_inbound_written)
        if left and not connection.paused:
            self._wake()  # the socket took it all at once: the rest goes on the next tick
        if connection.reading_paused and self.outbox.byte_count <= self.owner.limits.inbound_response_bytes_resume:
            self._resume_reading()

    def _on_oversized(self, envelope: pb.PeerEnvelope, size_bytes: int) -> None:
        self.owner.inbound.response_drop_count += 1
        self.owner.reply_failed(self.outbox, envelope.correlation_id,
                                f"response of {size_bytes} bytes, limit {self.owner.limits.message_bytes_max}")

    def _on_lost(self, _: asyncio.Future[str]) -> None:
        if self._hello_deadline is not None:
            self._hello_deadline.cancel()
            self._hello_deadline = None
        for task in self.serving:
            task.cancel()
        self.outbox.clear()
        self._held = None
        self.owner.forget(self)

    def close(self) -> None:
        self.connection.fail("transport closed")


class PeerTransport(Transport):
    """One node's end of the mesh: a listener for inbound connections and one link per peer."""

    def __init__(
        self,
        node_id: str,
        listen_address: str,
        peers: Mapping[str, str],
        limits: TransportLimits | None = None,
        tls: PeerTlsContexts | None = None,
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
        self.tls = tls
        self.hello = pb.PeerFrame(sender=node_id).SerializeToString()
        # The node's own entry (a shared cluster map lists everyone) is served in-process.
        self._peer_addresses = {peer_id: address for peer_id, address in peers.items() if peer_id != node_id}
        self._links: dict[str, _PeerLink] = {}
        self._handler: InboundHandler | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # start() keeps it
        self._server: asyncio.Server | None = None
        self._inbound: set[_InboundStream] = set()
        # Those of `_inbound` yet to say hello (with TLS, maybe still in their handshake), oldest
        # first: at the cap the oldest makes room for a new connection.
        self._inbound_before_hello: dict[_InboundStream, None] = {}
        # Each peer keeps one connection to us (two while it reconnects); the spare ones are for
        # probes (a status check with nothing but a socket). Past it a connection is closed at once,
        # unless one yet to say hello can make room.
        self.inbound_connection_count_max = 2 * len(self._peer_addresses) + INBOUND_SPARE_COUNT
        self._self_pending_count = 0
        self._closed = False
        self.bound_port = 0
        self.inbound = InboundCounters()
        self.drop_count_unknown_peer = 0
        self.drop_count_self_queue_full = 0
        self._no_hello_unreported = 0
        self._no_hello_reported_s = -NO_HELLO_REPORT_INTERVAL_S
        self.self_item_count = 0  # messages and requests this node addressed to itself

    # --- Transport ---

    async def start(self, handler: InboundHandler) -> None:
        assert self._handler is None, "start() called twice"
        assert not self._closed
        self._handler = handler
        self._loop = asyncio.get_running_loop()  # kept, as _PeerLink keeps it
        host, port = parse_address(self.listen_address)

        def accept() -> asyncio.Protocol:
            if len(self._inbound) >= self.inbound_connection_count_max and not self._make_inbound_room():
                self.inbound.refused_connection_count += 1
                return _Refused()
            assert len(self._inbound) < self.inbound_connection_count_max
            stream = _InboundStream(self)
            self._inbound.add(stream)
            self._inbound_before_hello[stream] = None
            return stream.connection

        # reuse_port stays off: a second node started on the same port must fail, not share it.
        try:
            # With TLS, a handshake that does not finish in time ends as one that sends no hello.
            tls = self.tls
            self._server = await self._loop.create_server(
                accept, host, port, reuse_port=False, ssl=tls.server if tls else None,
                ssl_handshake_timeout=self.limits.connect_timeout_ms / 1000 if tls else None)
        except OSError as error:
            raise ListenFailed(f"cannot listen on {self.listen_address} for peers ({error})") from error
        self.bound_port = self._server.sockets[0].getsockname()[1]
        assert self.bound_port > 0, f"could not bind {self.listen_address}"
        for peer_id, address in self._peer_addresses.items():
            link = _PeerLink(self.node_id, peer_id, address, self.limits, self.tls)
            self._links[peer_id] = link
            link.start()

    def send(self, to_node: str, message: Routed | Message, may_wait: bool = False) -> None:
        link = self._links.get(to_node)
        if link is not None:
            link.send(message, may_wait)
        elif to_node == self.node_id and not self._closed:
            self._send_self(message)
        else:
            self.drop_count_unknown_peer += 1

    async def request(self, to_node: str, request: PeerRequest, timeout_ms: int) -> PeerResponse:
        return await self.start_request(to_node, request, timeout_ms)

    def flush(self) -> None:
        for link in self._links.values():
            link.flush_now()

    def start_request(self, to_node: str, request: PeerRequest, timeout_ms: int) -> asyncio.Future[PeerResponse]:
        assert 0 < timeout_ms <= self.limits.request_timeout_ms_max, f"timeout_ms {timeout_ms} out of range"
        if self._closed:
            raise PeerUnavailable("transport closed")
        link = self._links.get(to_node)
        if link is not None:
            return link.start_request(request, timeout_ms)  # queued now, no task
        if to_node == self.node_id:
            return self._request_self(request, timeout_ms)
        raise PeerUnavailable(f"unknown peer {to_node!r}")

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await asyncio.gather(*(link.close() for link in self._links.values()))
        if self._server is not None:
            self._server.close()
        streams = list(self._inbound)
        tasks = [task for stream in streams for task in stream.serving]
        for stream in streams:
            stream.close()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.limits.close_grace_ms / 1000):
                    await self._server.wait_closed()

    def counts(self) -> dict[str, int]:
        links = [link.counters for link in self._links.values()]
        return {
            "frames_sent": sum(counters.frame_sent_count for counters in links) + self.inbound.frame_sent_count,
            # Requests and one-way messages on our connections, responses on those peers opened.
            "messages_sent": sum(counters.item_sent_count for counters in links) + self.inbound.item_sent_count,
            "frames_received": self.inbound.frame_received_count,
            "messages_received": self.inbound.item_received_count,
            "messages_to_self": self.self_item_count,
        }

    # --- Introspection for the runtime, tests and metrics ---

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
        self.self_item_count += 1
        # Delivered on a later tick, as a peer's message would be: the caller's state machine
        # must not be re-entered from inside its own send.
        assert self._loop is not None, "send() before start()"
        self._loop.call_soon(self._deliver_self, message)

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

    def _request_self(self, request: PeerRequest, timeout_ms: int) -> asyncio.Future[PeerResponse]:
        assert self._handler is not None and self._loop is not None, "request() before start()"
        self.self_item_count += 1
        return eager.answer_soon(
            self._loop, functools.partial(self._handle, self.node_id, request), timeout_ms / 1000,
            functools.partial(self._self_request_expired, timeout_ms),
        )

    def _self_request_expired(self, timeout_ms: int) -> PeerUnavailable:
        self.inbound.request_expired_count += 1
        return PeerUnavailable(f"node {self.node_id}: no response within {timeout_ms} ms")

    async def _handle(self, sender: str, request: PeerRequest) -> PeerResponse:
        """The handler's response, or PeerUnavailable when it failed. Its deadline is the caller's:
        the handler runs eagerly (cornus.runtime.eager), and only one that waits gets a task, and
        with it a timer that cancels it at the deadline."""
        assert self._handler is not None
        try:
            response = await self._handler.on_request(sender, request)
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

    # --- Inbound: connections opened by peers ---

    def no_hello_seen(self) -> None:
        """An inbound connection sent no hello in time: reported now, or with the next report."""
        self._no_hello_unreported += 1
        now_s = time.monotonic()
        if now_s - self._no_hello_reported_s < NO_HELLO_REPORT_INTERVAL_S:
            return
        logger.warning("%d inbound connection(s) sent no hello within %d ms%s since the last report; closed",
                       self._no_hello_unreported, self.limits.connect_timeout_ms,
                       " (or did not finish their TLS handshake)" if self.tls is not None else "")
        self._no_hello_reported_s, self._no_hello_unreported = now_s, 0

    def forget(self, stream: _InboundStream) -> None:
        self._inbound.discard(stream)
        self._inbound_before_hello.pop(stream, None)

    def said_hello(self, stream: _InboundStream) -> None:
        self._inbound_before_hello.pop(stream, None)

    def _make_inbound_room(self) -> bool:
        """Close the oldest inbound connection yet to say hello, if any, to let a new one in.

        Found by audit (2026-11-28, second): connections that never say hello (no certificate
        needed, even with TLS) held every slot until their deadline, and reopened as they closed,
        they kept the real peers out of a restarted node for good. A real peer says hello at once,
        so the oldest silent one is the likeliest not to be one."""
        if not self._inbound_before_hello:
            return False
        oldest = next(iter(self._inbound_before_hello))
        assert not oldest.sender
        self.inbound.evicted_connection_count += 1
        oldest.connection.fail("closed to make room: no hello yet, and the inbound connections are at their limit")
        # Its slot is free now: `lost` tells `forget` only on a later tick.
        self.forget(oldest)
        return True

    def on_inbound_written(self, item_count: int) -> None:
        self.inbound.frame_sent_count += 1
        self.inbound.item_sent_count += item_count

    def dispatch(
        self, sender: str, frame: pb.PeerFrame, outbox: _Outbox, serving: set[asyncio.Task[PeerResponse]],
        *, start: int, waited_ms: int,
    ) -> int:
        """Dispatch `frame`'s envelopes from `start`, each request with `waited_ms` less of its
        time (it waited, read, while its stream took no requests): the index of the first left,
        a request met with `outbox`'s responses past their budget (len(items): none left)."""
        handler = self._handler
        assert handler is not None
        assert waited_ms >= 0
        items = frame.items
        assert 0 <= start <= len(items)
        response_bytes_max = self.limits.inbound_response_bytes_max
        for index in range(start, len(items)):
            envelope = items[index]
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
                    # One bad message must not take down the connection every other message rides on.
                    self.inbound.handler_error_count += 1
                    logger.exception("on_message failed for %s from %s", type(message).__name__, sender)
            elif kind == pb.ENVELOPE_KIND_REQUEST:
                if outbox.byte_count >= response_bytes_max:
                    return index  # what follows waits too: a connection's envelopes stay in order
                correlation_id = envelope.correlation_id
                timeout_ms = envelope.timeout_ms
                if len(serving) >= self.limits.request_inflight_count_max:
                    self.inbound.overload_count += 1
                    self.reply_failed(outbox, correlation_id, f"overloaded: {len(serving)} requests in flight")
                    continue
                if not 0 < timeout_ms <= self.limits.request_timeout_ms_max:
                    self.inbound.malformed_count += 1
                    self.reply_failed(outbox, correlation_id, f"timeout_ms {timeout_ms} out of range")
                    continue
                if waited_ms:
                    if timeout_ms <= waited_ms:
                        # Its requester has given up: run now, it would hold locks for nobody.
                        self.inbound.request_expired_count += 1
                        continue
                    timeout_ms -= waited_ms
                try:
                    request = codec.decode_request(envelope)
                except codec.MalformedEnvelope as error:
                    self.inbound.malformed_count += 1
                    self.reply_failed(outbox, correlation_id, f"malformed request: {error}")
                    continue
                self._serve(sender, request, outbox, serving, correlation_id=correlation_id, timeout_ms=timeout_ms)
            else:
                self.inbound.malformed_count += 1
                logger.warning("envelope of kind %d from %s on an inbound connection", kind, sender)
        return len(items)

    def _serve(self, sender: str, request: PeerRequest, outbox: _Outbox, serving: set[asyncio.Task[PeerResponse]],
               *, correlation_id: int, timeout_ms: int) -> None:
        assert self._loop is not None
        served = eager.start(self._loop, self._handle(sender, request))
        if served.done():
            if not served.cancelled():  # a handler that raised CancelledError before any wait
                self._reply(outbox, correlation_id, served)
            return
        assert isinstance(served, asyncio.Task)
        serving.add(served)
        served.add_done_callback(serving.discard)
        expiry = self._loop.call_later(timeout_ms / 1000, self._expire_served, served)
        served.add_done_callback(functools.partial(self._served, outbox, correlation_id, expiry))

    def _served(self, outbox: _Outbox, correlation_id: int, expiry: asyncio.TimerHandle,
                served: asyncio.Future[PeerResponse]) -> None:
        expiry.cancel()
        if not served.cancelled():  # cancelled: past its deadline (the requester gave up) or closing
            self._reply(outbox, correlation_id, served)

    def _expire_served(self, served: asyncio.Task[PeerResponse]) -> None:
        if served.done():
            return  # it finished as the timer fired; its answer goes out
        self.inbound.request_expired_count += 1
        served.cancel()

    def _reply(self, outbox: _Outbox, correlation_id: int, served: asyncio.Future[PeerResponse]) -> None:
        error = served.exception()
        if error is not None:
            assert isinstance(error, PeerUnavailable), f"_handle raised {error!r}"
            self.reply_failed(outbox, correlation_id, str(error))
            return
        envelope = outbox.add()
        if envelope is None:
            self.inbound.response_drop_count += 1
            return
        envelope.kind = pb.ENVELOPE_KIND_RESPONSE
        envelope.correlation_id = correlation_id
        response = served.result()
        try:
            codec.encode(envelope, response)
        except Exception as error:
            # A response the codec refuses is the handler's bug: that request fails, and the
            # connection, with every other request in flight on it, goes on.
            outbox.discard_last()
            self.inbound.handler_error_count += 1
            logger.exception("cannot encode the %s to request %d", type(response).__name__, correlation_id)
            self.reply_failed(outbox, correlation_id, f"node {self.node_id}: response not encodable: {error}")
            return
        outbox.charge(_response_bytes(envelope, response))

    def reply_failed(self, outbox: _Outbox, correlation_id: int, detail: str) -> None:
        envelope = outbox.add()
        if envelope is None:
            self.inbound.response_drop_count += 1
            return
        envelope.kind = pb.ENVELOPE_KIND_RESPONSE
        envelope.correlation_id = correlation_id
        envelope.request_failed.detail = detail
        outbox.charge(envelope.ByteSize())

