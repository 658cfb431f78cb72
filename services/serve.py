"""`cornus serve`: one node process. It opens the configured storage, joins its peers over TCP,
recovers its partitions, and serves the REST API (and the public gRPC API when `grpc_api_listen` is
set), until SIGTERM or SIGINT ends it cleanly.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import socket
import sys

import uvicorn

from cornus.protocol.cluster_record import ClusterMismatch
from cornus.runtime import patience
from cornus.runtime.cluster_record import EXIT_CODE_CLUSTER_MISMATCH
from cornus.runtime.config import NodeConfig, RuntimeLimits
from cornus.runtime.coordination import TIMEOUT_MS_COMMIT
from cornus.runtime.failpoints import Failpoints
from cornus.runtime.node import Node
from cornus.runtime.parking import EXIT_CODE_IDENTITY_VACANT
from cornus.runtime.transport import EXIT_CODE_ADDRESS_UNBOUND, ListenFailed
from services.api.http_limits import LimitedHttpProtocol
from services.api.logs import configure_json_logging, level_from_env
from services.api.metrics import InstrumentedStore, Metrics
from services.api.rest import build_app
from services.node_rpc.transport import PeerTransport, parse_address
from storage_adapters.errors import ValidationError
from storage_adapters.factory import open_store
from storage_adapters.store import LogStore

log = logging.getLogger("cornus.serve")

# A clean shutdown, part by part, each with a budget of its own: the node's own stop (delivering
# the decisions it coordinates, releasing its partitions) must run whatever the APIs' shutdown took.
# The REST API finishes its requests for up to a commit's own deadline (after which a commit
# answers UNKNOWN by itself) and a second more. Cut at 2 s, uvicorn cancelled commits still
# deciding, and their callers got a bare 500 that says nothing of the outcome (found by review).
SHUTDOWN_TIMEOUT_S_REQUESTS = TIMEOUT_MS_COMMIT / 1000 + 1
SHUTDOWN_TIMEOUT_S = SHUTDOWN_TIMEOUT_S_REQUESTS + 1
# Then the public gRPC API (its in-flight calls get 2 s, then its commits that outlived their
# caller run on in the node, whose stop waits for their decisions).
SHUTDOWN_TIMEOUT_S_GRPC = 5.0
# Then the node: up to 5 s delivering decisions and 2 s releasing partitions, and its tasks; and
# its collections' wait (RuntimeLimits.timeout_ms_stop_collect), added to it.
SHUTDOWN_TIMEOUT_S_NODE = 10.0
SHUTDOWN_TIMEOUT_S_STORE = 2.0
# All of it but the collections' wait; and all of it at the default wait: the chart's
# terminationGracePeriodSeconds must exceed the first plus timeouts.timeout_ms_stop_collect (its
# template checks), so by default the second.
SHUTDOWN_BUDGET_S_BUT_COLLECT = (SHUTDOWN_TIMEOUT_S + SHUTDOWN_TIMEOUT_S_GRPC + SHUTDOWN_TIMEOUT_S_NODE
                                 + SHUTDOWN_TIMEOUT_S_STORE)
SHUTDOWN_BUDGET_S = SHUTDOWN_BUDGET_S_BUT_COLLECT + RuntimeLimits().timeout_ms_stop_collect / 1000
# How long a start waits for unreachable storage (cornus.runtime.patience): the chart's startup
# probe must allow more.
STORAGE_OPEN_TIMEOUT_S = patience.STORAGE_WAIT_TIMEOUT_S
# Allocations (less deallocations) between two young-generation collections of the cyclic GC;
# Python's default is 700. A committed transaction allocates thousands of short-lived objects,
# nearly all freed by reference counting, so at 700 the collector ran several times per
# transaction and took about 5% of a node's CPU (perf, Redis bench). 20,000 keeps a young
# collection's work bounded (it only walks objects allocated since the last one) while running
# it ten to thirty times less often.
GC_GEN0_ALLOCATIONS_MAX = 20_000


async def _done_unless_stopped(task: asyncio.Task[object], stop: asyncio.Event) -> bool:
    """Wait for `task` unless `stop` comes first; then cancel it and answer False."""
    stopped = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()  # not left running under what the caller closes next (the store)
        raise
    finally:
        stopped.cancel()
    if task.done():
        return True
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return False


async def _close_store(store: LogStore) -> None:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(SHUTDOWN_TIMEOUT_S_STORE):
            await store.close()


def bind_api_socket(address: str) -> socket.socket:
    """The REST API's listening socket, bound (uvicorn listens on it): before the node takes
    anything, so a node that cannot serve its API never takes its identity (found by audit: bound
    after the start, a second `cornus serve` of one node deposed the process that served, then
    failed on the port that process held). OSError if it cannot be bound."""
    host, port = api_host_port(address)
    family, kind, proto, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds its own
        sock.bind(sockaddr)
        # Listening now: two sockets bound with SO_REUSEADDR that neither listens on may share an
        # address on Linux, so two processes started together would both pass the bind.
        sock.listen(socket.SOMAXCONN)
    except OSError:
        sock.close()
        raise
    return sock


def api_host_port(address: str) -> tuple[str, int]:
    """The host and port uvicorn binds for the REST API's `address`: an IPv6 host bare, as the
    peer transport binds its own (found by audit: "[::1]" went to uvicorn bracketed, and failed to
    resolve after the node had taken its identity and partitions)."""
    return parse_address(address)


async def serve(config: NodeConfig) -> int:
    """Serve until told to stop; the process's exit status (0; EXIT_CODE_IDENTITY_VACANT when a
    parked node found its identity vacant and must be restarted; EXIT_CODE_CLUSTER_MISMATCH when
    the storage is recorded for another cluster configuration; EXIT_CODE_ADDRESS_UNBOUND when an
    address it is given cannot be listened on)."""
    if not config.api_listen:
        raise ValidationError("api_listen is required to serve (file, CORNUS_API_LISTEN or --api-listen)")
    # Before anything that can wait (the bind below may resolve a host name): a container's first
    # process (PID 1, no init) gets no signal it has no handler for, and a node stopped while it
    # waited for storage at its start ignored SIGTERM, then took its identity and partitions and
    # was killed holding them (found by review).
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        api_socket = bind_api_socket(config.api_listen)
    except OSError as error:
        log.error("node %s: cannot listen on %s for its REST API (%s); it took nothing", config.node_id,
                  config.api_listen, error)
        return EXIT_CODE_ADDRESS_UNBOUND
    if 0 < config.limits.timeout_ms_stop_collect < config.protocol_config.gc_grace_ms:
        # Not refused: a shorter wait still collects what was acknowledged long enough before.
        log.warning("node %s: timeout_ms_stop_collect (%d ms) is shorter than gc_grace_ms (%d ms): a stop leaves "
                    "the records of its last transactions in storage for ever", config.node_id,
                    config.limits.timeout_ms_stop_collect, config.protocol_config.gc_grace_ms)
    failpoints = Failpoints.from_env()
    # Wrapped before the Node gets it, so every storage call of the node is measured.
    metrics = Metrics()
    deadline_s = patience.start_deadline_s()  # for every storage call of the start together
    opening = asyncio.create_task(
        patience.patiently(lambda: open_store(config.storage), "storage is unreachable at start", deadline_s))
    if not await _done_unless_stopped(opening, stop):
        log.info("node %s: stopped while it waited for storage at its start", config.node_id)
        api_socket.close()
        return 0
    store = InstrumentedStore(opening.result(), metrics)
    transport = PeerTransport(config.node_id, config.listen, config.peers,
                              tls=config.peer_tls.contexts() if config.peer_tls is not None else None)
    node = Node(config, store, transport, failpoints)
    # The cluster record is checked before the node takes anything, and may wait for storage too.
    claiming = asyncio.create_task(node.claim_cluster(deadline_s))
    try:
        if not await _done_unless_stopped(claiming, stop):
            log.info("node %s: stopped while it checked the storage's cluster record", config.node_id)
            return 0
        claiming.result()  # raises what the claim raised
    except ClusterMismatch as error:
        log.error("%s", error)
        return EXIT_CODE_CLUSTER_MISMATCH
    finally:
        if not node.cluster_claimed:  # the node never started: only its store (and socket) to close
            await _close_store(store)
            api_socket.close()
    server = uvicorn.Server(
        # log_config=None: uvicorn keeps its hands off logging, so its lines propagate to our JSON handler.
        # ws="none": the API has no WebSocket route, and uvicorn imported a WebSocket library for it.
        uvicorn.Config(build_app(node, metrics), log_level="warning", lifespan="off",
                       timeout_graceful_shutdown=SHUTDOWN_TIMEOUT_S_REQUESTS, log_config=None,
                       http=LimitedHttpProtocol, ws="none")
    )
    grpc_api = None
    if config.grpc_api_listen:
        # Before the node starts, as the REST API's socket: a node that cannot serve it takes
        # nothing (found by audit: bound after, a second serve of one node deposed the one that
        # served). Until the node is ready its health says NOT_SERVING. Imported only when
        # enabled: its health and reflection packages are needed only then.
        from services.public_api.server import PublicGrpcServer

        grpc_api = PublicGrpcServer(node, config.grpc_api_listen)
        try:
            await grpc_api.start()
        except (OSError, RuntimeError) as error:  # grpc's failed bind is a RuntimeError
            log.error("node %s: cannot listen on %s for its gRPC API (%s); it took nothing", config.node_id,
                      config.grpc_api_listen, error)
            await _close_store(store)
            api_socket.close()
            return EXIT_CODE_ADDRESS_UNBOUND
        log.info("node %s: public gRPC API on %s", config.node_id, config.grpc_api_listen)
    grpc_stopping: asyncio.Future[None] | None = None
    try:
        try:
            await node.start(wait_ready=False)
        except ListenFailed as error:  # raised before the node took anything, as the APIs' above
            # The stop below finds nothing to deliver or release: no identity, no partition.
            log.error("node %s: %s; it took nothing", config.node_id, error)
            api_socket.close()
            return EXIT_CODE_ADDRESS_UNBOUND
        # What exists now (modules, the app, the node's tables) lives as long as the process: kept
        # out of every later collection, so the old generation's full walks stay short.
        gc.freeze()
        gc.set_threshold(GC_GEN0_ALLOCATIONS_MAX, *gc.get_threshold()[1:])
        api = asyncio.create_task(server.serve(sockets=[api_socket]), name="cornus-api")
        log.info("node %s: peers on %s, REST on http://%s", config.node_id, config.listen, config.api_listen)
        stopped = asyncio.create_task(stop.wait())
        vacant = asyncio.create_task(node.parking.vacant.wait())
        await asyncio.wait({api, stopped, vacant}, return_when=asyncio.FIRST_COMPLETED)
        node.quiesce()  # through the APIs' shutdown, which takes seconds, it takes no partition
        vacant.cancel()
        server.should_exit = True
        if grpc_api is not None:
            # Both APIs stop at once: the gRPC one said SERVING and took new calls while the REST
            # one drained (found by audit, 2026-11-28, up to 12 s of transactions begun to be
            # aborted or left in doubt by the stop).
            grpc_stopping = asyncio.ensure_future(grpc_api.stop())
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(SHUTDOWN_TIMEOUT_S):
                await api
    finally:
        if grpc_api is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(SHUTDOWN_TIMEOUT_S_GRPC):
                    await (grpc_stopping or grpc_api.stop())
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(SHUTDOWN_TIMEOUT_S_NODE + config.limits.timeout_ms_stop_collect / 1000):
                await node.stop()
        await _close_store(store)
    return EXIT_CODE_IDENTITY_VACANT if node.parking.vacant.is_set() else 0


def run(config: NodeConfig) -> None:
    """Run a node until it is told to stop, on uvloop when it is installed. Logs are JSON lines on
    stderr (services.api.logs), at CORNUS_LOG_LEVEL."""
    configure_json_logging(config.node_id, level_from_env())
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; a plain loop also works
        code = asyncio.run(serve(config))
    else:
        code = uvloop.run(serve(config))
    if code:
        sys.exit(code)
