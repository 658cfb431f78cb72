"""How a node reaches its peers: the interface the runtime drives, whatever carries the bytes.

`services/node_rpc` implements it over TCP (one long-lived connection per peer and direction);
tests may implement it in memory. Protocol messages are one-way and may be lost (the protocol's
timers recover); requests get exactly one response or `PeerUnavailable` within their deadline (or
`RequestTooLarge`, never sent).
A node addressing itself is served in-process (no socket), asynchronously, like any peer.
"""

from __future__ import annotations

import abc
import asyncio
from typing import Protocol

from cornus.runtime.wire import PeerRequest, PeerResponse, Routed


class PeerUnavailable(Exception):
    """The peer did not answer within the deadline, or is not connected. Retryable."""


class RequestTooLarge(Exception):
    """A request larger than the transport carries: never sent, so never run by the peer. The
    caller's input is too large; never retryable as it is."""


# sysexits' EX_OSERR: an address of the node (its REST or gRPC API's, or its peers') cannot be
# listened on (taken, or not this host's); the node took nothing. A local cluster picks other
# ports when one of its nodes exits with it (loadtests.bench.lifecycle).
EXIT_CODE_ADDRESS_UNBOUND = 71


class ListenFailed(Exception):
    """The transport cannot listen on its address (taken, or not this host's). Raised by `start`
    before it reached any peer, so the node has taken nothing yet."""


class InboundHandler(Protocol):
    """What the runtime gives a transport to deliver what arrives."""

    def on_message(self, sender: str, message: Routed) -> None:
        """A protocol message from node `sender`. Must not block."""

    async def on_request(self, sender: str, request: PeerRequest) -> PeerResponse:
        """A request from node `sender`; the returned response goes back to it. A transport may
        run it outside any task until it first waits (cornus.runtime.eager), so up to then it
        must not need one (no asyncio.timeout, no asyncio.current_task); its deadline is the
        transport's to keep."""


class Transport(abc.ABC):
    node_id: str

    @abc.abstractmethod
    async def start(self, handler: InboundHandler) -> None:
        """Start serving inbound traffic and connecting to peers."""

    @abc.abstractmethod
    def send(self, to_node: str, message: Routed, may_wait: bool = False) -> None:
        """Queue a one-way message. Never blocks; if the peer's bounded queue is full or the peer
        is unknown, the message is dropped and counted (the protocol tolerates loss). `may_wait`:
        nothing urgent waits for it, so it may wait a few milliseconds (a bound of the transport's)
        to leave together with the next message to that node."""

    @abc.abstractmethod
    async def request(self, to_node: str, request: PeerRequest, timeout_ms: int) -> PeerResponse:
        """Send a request and wait for its response; PeerUnavailable past `timeout_ms`,
        RequestTooLarge if it is too large to send."""

    def start_request(self, to_node: str, request: PeerRequest, timeout_ms: int) -> asyncio.Future[PeerResponse]:
        """Start a request and return its response's future (failing with PeerUnavailable past
        `timeout_ms`); may raise PeerUnavailable at once. For a caller that sends several at a
        time: a transport that can queue the request right away spares it a task per request."""
        return asyncio.ensure_future(self.request(to_node, request, timeout_ms))

    def flush(self) -> None:
        """Send what is queued now, not at the end of this event-loop tick (where it would also
        wait behind every callback already queued): for requests the caller waits on, once it
        queued all of them. A transport that sends at once has nothing to do."""
        return None

    @abc.abstractmethod
    async def close(self) -> None:
        """Stop serving and drop connections."""

    def counts(self) -> dict[str, int]:
        """Monotonic counts of what went through (frames and messages each way); metrics read them.
        A transport that counts nothing reports nothing."""
        return {}
