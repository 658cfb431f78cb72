"""`cornus serve`: one node process. It opens the configured storage, joins its peers over gRPC,
recovers its partitions, and serves the REST API, until SIGTERM or SIGINT ends it cleanly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal

import uvicorn

from cornus.runtime.config import NodeConfig
from cornus.runtime.failpoints import Failpoints
from cornus.runtime.node import Node
from services.api.rest import build_app
from services.node_rpc.transport import GrpcTransport
from storage_adapters.factory import open_store

log = logging.getLogger("cornus.serve")

# How long a clean shutdown may take before the process just exits.
SHUTDOWN_TIMEOUT_S = 10.0


async def serve(config: NodeConfig) -> None:
    if not config.api_listen:
        raise ValueError("api_listen is required to serve (file, CORNUS_API_LISTEN or --api-listen)")
    failpoints = Failpoints.from_env()
    store = await open_store(config.storage)
    transport = GrpcTransport(config.node_id, config.listen, config.peers)
    node = Node(config, store, transport, failpoints)
    host, port = config.api_listen.rsplit(":", 1)
    server = uvicorn.Server(
        uvicorn.Config(build_app(node), host=host, port=int(port), log_level="warning", lifespan="off",
                       timeout_graceful_shutdown=2)
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        await node.start(wait_ready=False)
        api = asyncio.create_task(server.serve(), name="cornus-api")
        log.info("node %s: peers on %s, REST on http://%s", config.node_id, config.listen, config.api_listen)
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait({api, stopped}, return_when=asyncio.FIRST_COMPLETED)
        server.should_exit = True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(SHUTDOWN_TIMEOUT_S):
                await api
    finally:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(SHUTDOWN_TIMEOUT_S):
                await node.stop()
                await store.close()


def run(config: NodeConfig) -> None:
    """Run a node until it is told to stop, on uvloop when it is installed."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; a plain loop also works
        asyncio.run(serve(config))
    else:
        uvloop.run(serve(config))
