"""uvicorn's HTTP/1.1 protocol with bounds on what one connection may hold.

uvicorn closes a connection that stays idle between requests (`timeout_keep_alive`), and bounds
nothing else: a client that sends its head or body a byte at a time, each within TCP's patience,
or opens a connection and sends nothing, or stops reading its answer, or sends a head that never
ends, holds the connection, its buffers and its task for as long as it likes (found by review).
Here, per connection:

- a request must arrive whole, head and body, within `request_receive_ms_max` of its first byte,
  and a connection must start each request within as long of its last answer (or of opening);
- an answer must drain within `response_drain_ms_max` once the socket's buffer is full;
- a request head may hold at most `head_bytes_max` bytes;
- at most `pipeline_count_max` pipelined requests may wait behind the one running.

And per node: at most `connection_count_max` connections and `request_count_max` requests in
flight. uvicorn bounds neither unless given `limit_concurrency`, whose refusal is plain text no
client of this API parses. Past either, a request gets the API's JSON 503 (`unavailable`,
retryable, Retry-After), and a connection past the count is closed after it; past twice the
count a connection is closed at once, unanswered, so that descriptors stay bounded too.

Past any of them the connection ends: aborted while the server still holds bytes of an answer (a
close would wait for bytes a client that stopped reading never takes), else closed, so that what
the kernel holds still reaches a client that reads on. What the app does with a request once it arrived is
bounded by the node's own deadlines.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from services.api.http_writes import GatheringHttpToolsProtocol

log = logging.getLogger("cornus.api")

# A request's whole head and body arrive within this long: REQUEST_BYTES_MAX (8 MiB) takes under
# 10 s at 8 Mbit/s, a slow link's speed, and no honest client pauses within a request for longer.
REQUEST_RECEIVE_MS_MAX = 30_000
# An answer whose socket buffer stays full this long goes to a client that stopped reading.
RESPONSE_DRAIN_MS_MAX = 30_000
# A request head (request line and headers) is a few hundred bytes; this is far above any real
# one. Counted per read, so a head is refused between this and this plus one read (256 KiB).
HEAD_BYTES_MAX = 1024 * 1024
# Connections one node keeps open: every client keeps one or a few (the SDK pools them, the bench
# one per client and node), and each costs a file descriptor (raise `ulimit -n` above this) and
# buffers. Requests in flight: as many as transactions a node coordinates (txn_count_max's
# default), plus the status and admin calls beside them.
CONNECTION_COUNT_MAX = 4_096
REQUEST_COUNT_MAX = 10_000
# Requests one connection may have queued behind the one running (HTTP/1.1 pipelining, which
# clients of this API hardly use): uvicorn reads on after every answer, so a client that streams
# requests without reading its answers queued thousands per read (found by audit).
PIPELINE_COUNT_MAX = 16


class LimitedHttpProtocol(GatheringHttpToolsProtocol):
    """GatheringHttpToolsProtocol with the limits above; pass as `uvicorn.Config(http=...)`."""

    request_receive_ms_max = REQUEST_RECEIVE_MS_MAX
    response_drain_ms_max = RESPONSE_DRAIN_MS_MAX
    head_bytes_max = HEAD_BYTES_MAX
    connection_count_max = CONNECTION_COUNT_MAX
    request_count_max = REQUEST_COUNT_MAX
    pipeline_count_max = PIPELINE_COUNT_MAX
    _past_connection_count = False
    _receive_deadline: asyncio.TimerHandle | None = None
    _drain_deadline: asyncio.TimerHandle | None = None
    # Bytes read since the current head began; None once its headers are complete.
    _head_bytes: int | None = 0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # uvicorn's set, shared by every connection of the server, this one counted in: the
        # connections past the count are the ones refused, not those that came before them.
        self._past_connection_count = len(self.connections) > self.connection_count_max
        if len(self.connections) > 2 * self.connection_count_max:
            # Far past it, a connection is not kept for its answer (each would hold a descriptor
            # until its request arrives, up to the receive deadline): it closes at once.
            log.warning("closed a connection at once: more than %d open", 2 * self.connection_count_max)
            transport.abort()
            return
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._head_bytes is not None and not self.transport.is_closing():
            self._head_bytes += len(data)
            if self._head_bytes > self.head_bytes_max:
                self._end(f"its request head passed {self.head_bytes_max} bytes")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._head_bytes = None
        if len(self.pipeline) >= self.pipeline_count_max:
            self._end(f"it queued more than {self.pipeline_count_max} pipelined requests")
            return
        # uvicorn's set of the server's request tasks, this request's not in it yet.
        too_many = self._past_connection_count
        if not too_many and len(self.tasks) < self.request_count_max:
            super().on_headers_complete()
            return
        if too_many:
            detail = f"this node has more than {self.connection_count_max} connections open"
        else:
            detail = f"this node runs {len(self.tasks)} requests, its limit is {self.request_count_max}"
        log.warning("refused a request: %s", detail)
        app, self.app = self.app, _unavailable(detail + "; retry later")
        try:
            super().on_headers_complete()
        finally:
            self.app = app
        if too_many and self.cycle is not None:
            self.cycle.keep_alive = False  # it closes after the answer, and the count goes down

    def on_message_complete(self) -> None:
        self._disarm()
        self._head_bytes = 0  # what follows is the next request's head
        super().on_message_complete()
        # Answered before its body was read (found by review): the body's bytes cancelled
        # keep-alive's timer, and on_response_complete found this deadline still armed. The
        # connection is idle from here, and must start its next request in time.
        answered = self.cycle is not None and self.cycle.response_complete
        if answered and not self.pipeline and not self.transport.is_closing():
            self._arm()

    def on_response_complete(self) -> None:
        # A request still arriving (a body the app answered without reading, a pipelined request
        # begun) keeps its deadline. An idle connection must start its next request within as
        # long: any byte, a blank line too, cancels uvicorn's keep-alive timer for good (found by
        # review: disarmed here, all three kept a connection open).
        idle = self._receive_deadline is None and not self.pipeline
        super().on_response_complete()
        if idle and not self.transport.is_closing():
            self._arm()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._drain_deadline is None:
            self._arm_drain()

    def _arm_drain(self) -> None:
        self._drain_deadline = self.loop.call_later(
            self.response_drain_ms_max / 1000, self._drain_check, self.transport.get_write_buffer_size(),
        )

    def _drain_check(self, buffered_bytes: int) -> None:
        """A client still reading is slow, not gone (found by review: a whole answer goes out in
        one write, and a steady reader of a large one was cut off): past the deadline only one
        that took nothing since it was armed loses the connection."""
        self._drain_deadline = None
        if self.transport.is_closing():
            return
        if self.transport.get_write_buffer_size() < buffered_bytes:
            self._arm_drain()
            return
        self._end(f"its answer did not drain for {self.response_drain_ms_max} ms")

    def resume_writing(self) -> None:
        self._drain_deadline_off()
        super().resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._drain_deadline_off()
        self._disarm()
        super().connection_lost(exc)

    def _drain_deadline_off(self) -> None:
        if self._drain_deadline is not None:
            self._drain_deadline.cancel()
            self._drain_deadline = None

    def _arm(self) -> None:
        self._disarm()
        self._receive_deadline = self.loop.call_later(
            self.request_receive_ms_max / 1000, self._arrival_check, self.transport.get_write_buffer_size(),
        )

    def _arrival_check(self, buffered_bytes: int) -> None:
        self._receive_deadline = None
        if 0 < self.transport.get_write_buffer_size() < buffered_bytes:
            # The last answer is still leaving, and its client took some of it since: the next
            # request's wait starts after it. A client that took nothing loses the connection,
            # also when the answer left was too small to pause writing (found by review: waited
            # for for ever).
            self._arm()
            return
        self._end(f"its request did not arrive in {self.request_receive_ms_max} ms")

    def _disarm(self) -> None:
        if self._receive_deadline is not None:
            self._receive_deadline.cancel()
            self._receive_deadline = None

    def _end(self, why: str) -> None:
        for handle in (self._receive_deadline, self._drain_deadline):
            if handle is not None:
                handle.cancel()
        self._receive_deadline = self._drain_deadline = None
        buffered = self.transport.get_write_buffer_size()
        if self.transport.is_closing() and not buffered:
            return
        log.info("ended a connection from %s: %s", self.client, why)
        if buffered:
            self.transport.abort()  # a close would wait for bytes this client does not take
        else:
            self.transport.close()  # what the kernel still holds reaches a client reading on


def _unavailable(detail: str) -> Callable[..., Awaitable[None]]:
    """An ASGI app that answers any request with the API's JSON 503 (services/api/rest.py's error
    shape for NodeOverloaded)."""
    body = json.dumps({"error": "busy", "detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"retry-after", b"1")]

    async def app(scope: dict[str, Any], receive: Any, send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app
