"""An in-process transport: several nodes in one event loop, for tests and the embedded demo.

Same contract as the gRPC transport: messages are one-way and delivered asynchronously (never
inside the sender's call), requests time out with PeerUnavailable, and a node that is `down` in
the network neither receives nor answers.
"""

from __future__ import annotations

import asyncio
import collections
import functools

from cornus.runtime import eager
from cornus.runtime.transport import InboundHandler, PeerUnavailable, Transport
from cornus.runtime.wire import PeerRequest, PeerResponse, Routed


class LocalNetwork:
    def __init__(self) -> None:
        self.handlers: dict[str, InboundHandler] = {}
        self.down: set[str] = set()
        self.counters: collections.Counter[str] = collections.Counter()

    def transport(self, node_id: str) -> LocalTransport:
        return LocalTransport(self, node_id)


class LocalTransport(Transport):
    def __init__(self, network: LocalNetwork, node_id: str) -> None:
        self.network = network
        self.node_id = node_id

    async def start(self, handler: InboundHandler) -> None:
        self.network.handlers[self.node_id] = handler
        self.network.down.discard(self.node_id)

    def send(self, to_node: str, message: Routed, may_wait: bool = False) -> None:  # delivered at once either way
        handler = self.network.handlers.get(to_node)
        if handler is None or to_node in self.network.down or self.node_id in self.network.down:
            self.network.counters["dropped"] += 1
            return
        asyncio.get_running_loop().call_soon(handler.on_message, self.node_id, message)

    async def request(self, to_node: str, request: PeerRequest, timeout_ms: int) -> PeerResponse:
        handler = self.network.handlers.get(to_node)
        down = self.network.down
        if handler is None or to_node in down or self.node_id in down:
            raise PeerUnavailable(f"{self.node_id if self.node_id in down else to_node} is down")
        # Handled as the TCP transport handles it: on a later tick, outside any task until the
        # handler first waits, so the in-process tests run that path too.
        return await eager.answer_soon(
            asyncio.get_running_loop(), functools.partial(handler.on_request, self.node_id, request), timeout_ms / 1000,
            lambda: PeerUnavailable(f"{to_node} did not answer within {timeout_ms} ms"),
        )

    async def close(self) -> None:
        self.network.handlers.pop(self.node_id, None)
