"""A node's clean shutdown (SIGTERM) against the real process wiring (services/serve.py): each part
has a budget of its own, so the node's own stop, which delivers the decisions it coordinates and
releases its partitions, runs however long the public gRPC API took to stop."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import httpx
import pytest

from cornus.runtime.config import NodeConfig, load_node_config
from cornus.runtime.node import Node
from services import serve as serve_module
from services.public_api.server import PublicGrpcServer
from tests.worker import free_port

pytestmark = pytest.mark.timeout(90)


def _config(tmp_path: Path, api_port: int) -> NodeConfig:
    """One node, alone, on the emulator, with both APIs: REST on `api_port`."""
    return load_node_config(environ={}, overrides={
        "node_id": "n0", "peers": f"n0=127.0.0.1:{free_port()}", "partition_count": 1,
        "api_listen": f"127.0.0.1:{api_port}", "grpc_api_listen": f"127.0.0.1:{free_port()}",
        "storage_emulator_path": str(tmp_path / "cornus.db"),
    })


async def _answers(client: httpx.AsyncClient, url: str) -> None:
    """Wait (15 s at most) until `url` answers 200."""
    for _ in range(300):
        try:
            if (await client.get(url)).status_code == 200:
                return
        except httpx.TransportError:
            pass
        await asyncio.sleep(0.05)
    pytest.fail(f"{url} never answered 200")


async def test_a_grpc_api_slow_to_stop_does_not_skip_the_node_s_own_stop(tmp_path: Path, monkeypatch) -> None:
    """The APIs' shutdown and the node's stop shared one 10 s budget, and the gRPC API alone may
    wait up to 14 s for commits that outlived their callers: under slow storage a SIGTERM then
    ended the process without delivering decisions or releasing partitions, and said nothing."""
    api_port = free_port()
    config = _config(tmp_path, api_port)
    grpc_stopped = asyncio.Event()
    grpc_servers: list[PublicGrpcServer] = []
    real_grpc_stop = PublicGrpcServer.stop

    async def stuck_stop(self: PublicGrpcServer) -> None:
        grpc_servers.append(self)
        grpc_stopped.set()
        await asyncio.sleep(600)  # as if waiting for commits that outlived their callers

    node_stopped: list[bool] = []
    real_stop = Node.stop

    async def recorded_stop(self: Node) -> None:
        node_stopped.append(True)
        await real_stop(self)

    monkeypatch.setattr(PublicGrpcServer, "stop", stuck_stop)
    monkeypatch.setattr(serve_module, "SHUTDOWN_TIMEOUT_S_GRPC", 0.5)
    monkeypatch.setattr(Node, "stop", recorded_stop)
    serving = asyncio.ensure_future(serve_module.serve(config))
    async with httpx.AsyncClient() as client:
        await _answers(client, f"http://127.0.0.1:{api_port}/healthz")
    os.kill(os.getpid(), signal.SIGTERM)  # serve()'s own handler, on this event loop
    try:
        await asyncio.wait_for(serving, 40)
        assert grpc_stopped.is_set()
        assert node_stopped, "the node's own stop never ran"
    finally:
        for server in grpc_servers:  # stopped for real now, so the test leaves nothing running
            await real_grpc_stop(server)


async def test_the_grpc_api_stops_taking_calls_while_the_rest_api_drains(tmp_path: Path, monkeypatch) -> None:
    """Found by audit (2026-11-28, second): on SIGTERM the REST API drained first (up to 12 s for
    its requests in flight), and only then did the gRPC API say NOT_SERVING and refuse new calls:
    clients on open HTTP/2 connections kept beginning transactions the stop then aborted or left
    in doubt. Both stop at once."""
    api_port = free_port()
    config = _config(tmp_path, api_port)
    grpc_stopping = asyncio.Event()
    real_grpc_stop = PublicGrpcServer.stop

    async def noted_stop(self: PublicGrpcServer) -> None:
        grpc_stopping.set()
        await real_grpc_stop(self)

    in_flight = asyncio.Event()
    real_execute = Node.execute

    async def slow_execute(self: Node, *args: object, **kwargs: object) -> object:
        in_flight.set()
        await asyncio.sleep(REST_REQUEST_HELD_S)  # a request the REST API waits for as it drains
        return await real_execute(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(PublicGrpcServer, "stop", noted_stop)
    monkeypatch.setattr(Node, "execute", slow_execute)
    serving = asyncio.ensure_future(serve_module.serve(config))
    async with httpx.AsyncClient(timeout=30) as client:
        await _answers(client, f"http://127.0.0.1:{api_port}/readyz")
        held = asyncio.ensure_future(client.post(f"http://127.0.0.1:{api_port}/v1/execute",
                                                 json={"ops": [{"op": "get", "key": "k"}]}))
        await asyncio.wait_for(in_flight.wait(), 10)
        os.kill(os.getpid(), signal.SIGTERM)  # serve()'s own handler, on this event loop
        try:
            await asyncio.wait_for(grpc_stopping.wait(), REST_REQUEST_HELD_S / 2)
            assert not held.done(), "the REST request ended before the test could look"
        finally:
            await asyncio.gather(held, return_exceptions=True)
            await asyncio.wait_for(serving, 40)


# How long the test's REST request runs once the node is told to stop.
REST_REQUEST_HELD_S = 4.0
