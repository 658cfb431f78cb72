"""uvicorn's HTTP/1.1 protocol with a deadline on each request's arrival.

uvicorn closes a connection that stays idle between requests (`timeout_keep_alive`), but bounds
neither a request's own arrival nor the first request of a new connection: a client that sends its
head or body a byte at a time, each within TCP's patience, or opens a connection and sends
nothing, holds that connection and its buffers for as long as it likes. Here a request must
arrive whole, head and body, within `request_receive_ms_max` of its first byte, and a new
connection must start its first request within as long; past it the connection is closed. What
the app does with a request once it arrived is bounded by the node's own deadlines.
"""

from __future__ import annotations

import asyncio
import logging

from services.api.http_writes import GatheringHttpToolsProtocol

log = logging.getLogger("cornus.api")

# A request's whole head and body arrive within this long: REQUEST_BYTES_MAX (8 MiB) takes under
# 10 s at 8 Mbit/s, a slow link's speed, and no honest client pauses within a request for longer.
REQUEST_RECEIVE_MS_MAX = 30_000


class ReceiveDeadlineProtocol(GatheringHttpToolsProtocol):
    """GatheringHttpToolsProtocol with the arrival deadline above; pass as `uvicorn.Config(http=...)`."""

    request_receive_ms_max = REQUEST_RECEIVE_MS_MAX
    _receive_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        # A request still arriving (a body the app answered without reading, a pipelined request
        # begun) keeps its deadline. An idle connection must start its next request within as
        # long: any byte, a blank line too, cancels uvicorn's keep-alive timer for good (found by
        # review: disarmed here, all three kept a connection open).
        idle = self._receive_deadline is None and not self.pipeline
        super().on_response_complete()
        if idle and not self.transport.is_closing():
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._receive_deadline = self.loop.call_later(self.request_receive_ms_max / 1000, self._too_slow)

    def _disarm(self) -> None:
        if self._receive_deadline is not None:
            self._receive_deadline.cancel()
            self._receive_deadline = None

    def _too_slow(self) -> None:
        self._receive_deadline = None
        if not self.transport.is_closing():
            log.info("closed a connection from %s: its request did not arrive within %d ms",
                     self.client, self.request_receive_ms_max)
            self.transport.close()
