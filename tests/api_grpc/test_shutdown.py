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

from cornus.runtime.config import load_node_config
from cornus.runtime.node import Node
from services import serve as serve_module
from services.public_api.server import PublicGrpcServer
from tests.worker import free_port

pytestmark = pytest.mark.timeout(90)


async def test_a_grpc_api_slow_to_stop_does_not_skip_the_node_s_own_stop(tmp_path: Path, monkeypatch) -> None:
    """The APIs' shutdown and the node's stop shared one 10 s budget, and the gRPC API alone may
    wait up to 14 s for commits that outlived their callers: under slow storage a SIGTERM then
    ended the process without delivering decisions or releasing partitions, and said nothing."""
    api_port = free_port()
    config = load_node_config(environ={}, overrides={
        "node_id": "n0", "peers": f"n0=127.0.0.1:{free_port()}", "partition_count": 1,
        "api_listen": f"127.0.0.1:{api_port}", "grpc_api_listen": f"127.0.0.1:{free_port()}",
        "storage_emulator_path": str(tmp_path / "cornus.db"),
    })
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
        for _ in range(300):
            try:
                if (await client.get(f"http://127.0.0.1:{api_port}/healthz")).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.05)
        else:
            pytest.fail("the node never answered /healthz")
    os.kill(os.getpid(), signal.SIGTERM)  # serve()'s own handler, on this event loop
    try:
        await asyncio.wait_for(serving, 40)
        assert grpc_stopped.is_set()
        assert node_stopped, "the node's own stop never ran"
    finally:
        for server in grpc_servers:  # stopped for real now, so the test leaves nothing running
            await real_grpc_stop(server)
