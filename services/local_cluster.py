"""A local cluster of `cornus serve` processes on 127.0.0.1: ports, start, readiness, death
watch and a bounded, clean stop. `cornus cluster up` and `cornus bench` run their nodes with it."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from cornus.protocol.config import Protocol
from cornus.runtime.cluster_record import EXIT_CODE_CLUSTER_MISMATCH
from cornus.runtime.config import NodeConfig, load_node_config
from cornus.runtime.transport import EXIT_CODE_ADDRESS_UNBOUND
from services import node_launcher
from storage_adapters.errors import ValidationError


class StopSignals:
    """SIGINT and SIGTERM ask the cluster to stop; a second one while it stops kills the nodes."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.count = 0
        self.last = ""

    def install(self) -> None:
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        self.count += 1
        self.last = signal.Signals(signum).name
        self.event.set()


# A node that is not ready this long after its start has failed to start.
CLUSTER_TIMEOUT_S_READY = 60.0
# A node gets its own bounded stop after SIGTERM before it is killed (node_stop_wait_s), plus this
# for what no budget counts: the interpreter's exit, a loaded machine's scheduling.
CLUSTER_MARGIN_S_STOP = 5.0
# How long a killed node (SIGKILL cannot be refused) may take to be reaped.
CLUSTER_TIMEOUT_S_REAP = 30.0
CLUSTER_POLL_S = 0.1
_MS_PER_S = 1_000
LOG_TAIL_BYTES_MAX = 3_000


@dataclass
class ClusterNode:
    config: NodeConfig
    api_port: int
    peer_port: int
    log_path: Path
    process: subprocess.Popen[bytes] | node_launcher.LaunchedProcess | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self) -> str:
        try:
            data = self.log_path.read_bytes()[-LOG_TAIL_BYTES_MAX:]
        except OSError:
            return ""
        return data.decode("utf-8", "replace")


# How often a local cluster starts on freshly picked ports when a node found one of its ports taken:
# a port is probed free, let go, and bound by the node later, and another local cluster (a parallel
# test worker's bench or `cluster up`) may pick and bind it meanwhile. Each pick is fresh, so a
# second collision is as rare as the first; a third means something else holds the range.
PORT_PICK_COUNT_MAX = 3


def port_was_taken(nodes: Sequence[ClusterNode]) -> bool:
    """Whether a node of `nodes` died because an address it was given was taken (it exits with
    EXIT_CODE_ADDRESS_UNBOUND having taken nothing): the cluster may start again on other ports."""
    dead = dead_node(nodes)
    return dead is not None and dead.process is not None and dead.process.poll() == EXIT_CODE_ADDRESS_UNBOUND


def cluster_ports(node_count: int, base_port: int | None) -> list[tuple[int, int, int]]:
    """(REST port, peer port, public gRPC port) per node: with a base port, REST on base+i,
    peers on base+nodes+i and public gRPC on base+2*nodes+i; else ports the kernel picks."""
    if base_port is None:
        sockets: list[socket.socket] = []
        candidates = _stable_ports()
        try:
            # Hold every socket until all are bound, so no port is handed out twice.
            while len(sockets) < 3 * node_count:
                sock = socket.socket()
                try:
                    sock.bind(("127.0.0.1", candidates.pop() if candidates else 0))
                except OSError:
                    sock.close()
                    continue
                sockets.append(sock)
            ports = [sock.getsockname()[1] for sock in sockets]
        finally:
            for sock in sockets:
                sock.close()
        return [(ports[3 * i], ports[3 * i + 1], ports[3 * i + 2]) for i in range(node_count)]
    if base_port <= 0 or base_port + 3 * node_count - 1 > 65535:
        raise ValidationError(f"--base-port {base_port}: ports {base_port}..{base_port + 3 * node_count - 1} "
                              "must lie in 1..65535")
    pairs = [(base_port + i, base_port + node_count + i, base_port + 2 * node_count + i) for i in range(node_count)]
    for port in (port for pair in pairs for port in pair):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError as error:
                raise ValidationError(f"port 127.0.0.1:{port} is not free ({error.strerror})") from None
    return pairs


# Ports tried below the kernel's ephemeral range before falling back to one the kernel picks: a
# port from that range, probed free and let go until the node binds it, can meanwhile become the
# source port of any outgoing connection on the machine (found by the suite: a bench node failed
# to bind its gRPC port). Below the range only another listener can take it.
STABLE_PORTS_TRIED_MAX = 64
EPHEMERAL_RANGE_PATH = Path("/proc/sys/net/ipv4/ip_local_port_range")
# How many ports just below the ephemeral range local clusters draw from. Only these: the test
# suite hands its own servers ports from below them (tests/worker.py), which a node killed and
# restarted leaves free meanwhile; a bench of the suite drawing from the same ports took one such
# (the fresh-clone suite: a bench node could not bind its peer port).
STABLE_PORT_COUNT = 6_000


def stable_port_range() -> tuple[int, int] | None:
    """[low, high) of the STABLE_PORT_COUNT ports below the ephemeral range (None where it is unknown)."""
    try:
        ephemeral_low = int(EPHEMERAL_RANGE_PATH.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    if ephemeral_low - STABLE_PORT_COUNT < 1024:
        return None
    return ephemeral_low - STABLE_PORT_COUNT, ephemeral_low


def _stable_ports() -> list[int]:
    """Random candidate ports of stable_port_range (none where it is unknown)."""
    bounds = stable_port_range()
    return [] if bounds is None else random.sample(range(*bounds), STABLE_PORTS_TRIED_MAX)


def local_members(
    node_count: int, protocol: Protocol, partition_count: int, data: Path
) -> tuple[list[ClusterNode], str]:
    """Nodes n0..n{N-1} on free 127.0.0.1 ports, logging into `data`, with `protocol` as their
    default and default settings otherwise; and the peers list they all start with."""
    ports = cluster_ports(node_count, None)
    peers = ",".join(f"n{i}=127.0.0.1:{peer}" for i, (_, peer, _) in enumerate(ports))
    members = [
        ClusterNode(
            load_node_config(environ={}, overrides={
                "node_id": f"n{i}", "api_listen": f"127.0.0.1:{api}", "grpc_api_listen": f"127.0.0.1:{public}",
                "peers": peers, "protocol": protocol.value, "partition_count": partition_count,
            }),
            api, peer, data / f"n{i}.log",
        )
        for i, (api, peer, public) in enumerate(ports)
    ]
    return members, peers


def start_node(
    node: ClusterNode,
    peers: str,
    storage_argv: Sequence[str],
    settings: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
) -> None:
    """Start `node` as a `cornus serve` process (forked by `node_launcher`, see why there).
    `storage_argv` are its storage flags (e.g. --backend emulator --emulator-path F); `settings`
    are NAME=VALUE timeouts and limits; `environ` adds to its environment (e.g. CORNUS_FAILPOINTS
    for this node alone)."""
    assert not node.alive
    config = node.config
    args = ["serve", "--node-id", config.node_id,
            "--listen", config.listen, "--api-listen", config.api_listen,
            "--grpc-api-listen", config.grpc_api_listen, "--peers", peers,
            "--partition-count", str(config.partition_count), "--protocol", config.protocol.value, *storage_argv]
    for item in settings:
        args += ["--set", item]
    env = {**os.environ, **(environ or {})}
    if node_launcher.enabled():
        node.process = node_launcher.NodeLauncher.shared().spawn(args, env, node.log_path)
        return
    parent_pid = os.getpid()
    with node.log_path.open("ab") as log:
        node.process = subprocess.Popen(
            [sys.executable, "-m", "services.cli", *args], stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, env=env,
            # Its own session: a Ctrl-C in the terminal reaches the parent only, which then
            # stops the nodes in order instead of all of them racing to exit at once.
            start_new_session=True,
            # If `cluster up` itself is killed with SIGKILL it cannot stop its nodes; on Linux the
            # kernel then sends them SIGTERM instead of leaving orphans. preexec_fn is unsafe only
            # beside other threads; callers start nodes before any.
            preexec_fn=(lambda: node_launcher.die_with_parent(parent_pid))  # noqa: PLW1509
            if sys.platform.startswith("linux") else None,
        )


def node_ready(http: httpx.Client, node: ClusterNode) -> bool:
    try:
        return http.get(f"{node.url}/readyz", timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


def dead_node(nodes: Sequence[ClusterNode]) -> ClusterNode | None:
    return next((node for node in nodes if node.process is not None and node.process.poll() is not None), None)


def report_dead(node: ClusterNode) -> None:
    assert node.process is not None
    code = node.process.returncode
    how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
    if code == EXIT_CODE_CLUSTER_MISMATCH:
        # Local clusters reuse storage that outlives them: a Redis database, a --data-dir.
        how += (" (the storage holds an earlier cluster's, of another partition count or id: on Redis, --flush-redis "
                "of cornus bench and termination-bench empties a run's databases first; otherwise give the "
                "cluster storage of its own, e.g. another --data-dir)")
    elif code == EXIT_CODE_ADDRESS_UNBOUND:
        how += " (an address it was given is taken, or not this host's; it took nothing)"
    print(f"cornus: node {node.config.node_id} (pid {node.process.pid}) died: {how}; stopping the cluster\n"
          f"--- last lines of {node.log_path} ---\n{node.log_tail()}", file=sys.stderr, flush=True)


def node_stop_wait_s(config: NodeConfig) -> float:
    """How long a node of `config` may take to stop after SIGTERM: its own bounded stop
    (services/serve.py: its APIs, its decisions and release, its store, and its wait for
    collection, timeout_ms_stop_collect of its configuration) and a margin. Cut shorter, a node
    still delivering its decisions or waiting for its records' collection is killed in the middle
    of it (found by audit: a fixed 30 s, under the 44 s of the default configuration)."""
    # Here, not at the top: serve imports the REST API (FastAPI), which every `cornus` command
    # would then load.
    from services.serve import SHUTDOWN_BUDGET_S_BUT_COLLECT

    return SHUTDOWN_BUDGET_S_BUT_COLLECT + config.limits.timeout_ms_stop_collect / _MS_PER_S + CLUSTER_MARGIN_S_STOP


def stop_nodes(nodes: Sequence[ClusterNode], stop: StopSignals) -> bool:
    """SIGTERM every node, wait for each up to its own bound (node_stop_wait_s), then SIGKILL the
    stragglers. True if all stopped on SIGTERM alone. A further signal while waiting skips the
    wait."""
    signals_before = stop.count
    for node in nodes:
        if node.alive:
            assert node.process is not None
            node.process.send_signal(signal.SIGTERM)
    started = time.monotonic()
    deadlines = [started + node_stop_wait_s(node.config) for node in nodes]

    def waiting() -> bool:
        now = time.monotonic()
        return any(node.alive and now < deadline for node, deadline in zip(nodes, deadlines, strict=True))

    while waiting() and stop.count == signals_before:
        time.sleep(CLUSTER_POLL_S)
    clean = True
    for node in nodes:
        if node.alive:
            assert node.process is not None
            clean = False
            print(f"cornus: node {node.config.node_id} (pid {node.process.pid}) did not stop; killing it",
                  file=sys.stderr, flush=True)
            # The node leads its own process group (start_new_session): kill anything it started too.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.process.pid, signal.SIGKILL)
        if node.process is not None:
            node.process.wait(CLUSTER_TIMEOUT_S_REAP)
    return clean


def wait_cluster_ready(nodes: Sequence[ClusterNode], stop: StopSignals, timeout_s: float) -> bool:
    """True once every node answers /readyz with 200; False (after reporting why) if a node dies
    or the deadline passes. A stop signal ends the wait early (True: nothing failed)."""
    deadline = time.monotonic() + timeout_s
    waiting = list(nodes)
    with httpx.Client() as http:
        while waiting:
            if stop.event.is_set():
                return True
            dead = dead_node(nodes)
            if dead is not None:
                report_dead(dead)
                return False
            if time.monotonic() > deadline:
                names = ", ".join(node.config.node_id for node in waiting)
                print(f"cornus: {names} not ready within {timeout_s:g} s; stopping the cluster", file=sys.stderr)
                for node in waiting:
                    print(f"--- last lines of {node.log_path} ---\n{node.log_tail()}", file=sys.stderr, flush=True)
                return False
            waiting = [node for node in waiting if not node_ready(http, node)]
            if waiting:
                stop.event.wait(CLUSTER_POLL_S)
    return True


