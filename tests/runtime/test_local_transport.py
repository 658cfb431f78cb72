"""The in-process transport (cornus.runtime.local_transport) keeps the contract of the TCP one."""

from __future__ import annotations

import pytest

from cornus.runtime.local_transport import LocalNetwork
from cornus.runtime.transport import PeerUnavailable
from cornus.runtime.wire import StatusRequest, StatusResponse


async def test_the_local_transport_carries_no_request_from_a_node_that_is_down() -> None:
    """Found by audit (2026-11-27): LocalTransport dropped messages from a node that is down, but
    carried its requests, so the in-process tests of a partitioned node still reached its peers
    (the TCP transport's node cut off sends nothing)."""
    class Answering:
        def on_message(self, sender: str, message: object) -> None:
            raise AssertionError("no message is sent here")

        async def on_request(self, sender: str, request: object) -> StatusResponse:
            return StatusResponse(node="b", ready=True, partitions=())

    network = LocalNetwork()
    a, b = network.transport("a"), network.transport("b")
    await a.start(Answering())
    await b.start(Answering())
    assert (await a.request("b", StatusRequest(), 1_000)).node == "b"
    network.down.add("a")
    with pytest.raises(PeerUnavailable, match="a is down"):
        await a.request("b", StatusRequest(), 1_000)
