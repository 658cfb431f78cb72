"""The cluster under test: N `cornus serve` processes (started, killed and restarted with
services.local_cluster) whose links run through Toxiproxy.

Links. Node i's peers list names, for every other node j, the listen port of proxy `ni-nj`, whose
upstream is j's real peer port; its own entry is its real listen address (cornus/runtime/config.py:
the own entry is only the default of `listen`, and the peer transport serves it in process; the
harness passes --listen explicitly too). A node opens one outbound connection per peer and gets its
answers back on it, so proxy `ni-nj` carries i's messages to j and j's answers to i's requests;
j's own messages to i go over `nj-ni`. With Redis, node i's storage URL points at proxy
`ni-storage`. The emulator is a SQLite file each node opens itself: there is no storage link to
proxy, so that backend gets node-node and process faults only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from cornus.runtime.config import NodeConfig, load_node_config
from loadtests.chaos.toxiproxy import Toxiproxy
from services.local_cluster import ClusterNode, StopSignals, start_node, stop_nodes, wait_cluster_ready

STORAGE = "storage"
KILL_WAIT_S = 10.0
READYZ_TIMEOUT_S = 2.0


@dataclass(frozen=True, slots=True)
class Link:
    """One proxied, directed link: `source` node to `target` (a node id, or STORAGE)."""

    name: str
    source: str
    target: str
    listen_port: int
    upstream: str

    @property
    def is_storage(self) -> bool:
        return self.target == STORAGE


@dataclass(frozen=True, slots=True)
class StorageTarget:
    """Where the data lives: `redis_url` is the real server (the auditor's direct path); nodes get
    the same URL with host and port swapped for their own proxy."""

    backend: str
    redis_url: str = ""
    emulator_path: str = ""
    timeout_ms_call: int = 2_000

    def __post_init__(self) -> None:
        assert self.backend in ("redis", "emulator"), self.backend
        assert (self.backend == "redis") == bool(self.redis_url)
        assert (self.backend == "emulator") == bool(self.emulator_path)

    @property
    def redis_upstream(self) -> str:
        parts = urlsplit(self.redis_url)
        return f"{parts.hostname or '127.0.0.1'}:{parts.port or 6379}"

    def redis_url_via(self, port: int) -> str:
        parts = urlsplit(self.redis_url)
        auth = parts.netloc.rpartition("@")[0]
        netloc = f"{auth}@127.0.0.1:{port}" if auth else f"127.0.0.1:{port}"
        return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


@dataclass(slots=True)
class ChaosNode:
    member: ClusterNode
    peers: str
    storage_argv: list[str]
    # Unix ms of every kill -9 the harness made: an ownership interval open at a kill ends there.
    kill_times_ms: list[int] = field(default_factory=list)
    paused: bool = False
    # Down because the harness killed it (a restart is due); any other exit is unexpected.
    killed: bool = False
    start_count: int = 0

    @property
    def node_id(self) -> str:
        return self.member.config.node_id

    @property
    def url(self) -> str:
        return self.member.url

    @property
    def alive(self) -> bool:
        return self.member.alive

    @property
    def pid(self) -> int:
        assert self.member.process is not None
        return self.member.process.pid


def _now_ms() -> int:
    return int(time.time() * 1000)


class ChaosCluster:
    def __init__(
        self,
        *,
        node_count: int,
        partition_count: int,
        protocol: str,
        storage: StorageTarget,
        settings: Mapping[str, int],
        workdir: Path,
        port: Callable[[], int],
        toxiproxy: Toxiproxy,
    ) -> None:
        self.storage = storage
        self.settings = dict(settings)
        self.toxiproxy = toxiproxy
        ids = [f"n{i}" for i in range(node_count)]
        api_ports = {node: port() for node in ids}
        peer_ports = {node: port() for node in ids}
        self.links: dict[str, Link] = {}
        for source in ids:
            for target in ids:
                if source != target:
                    self._add_link(source, target, port(), f"127.0.0.1:{peer_ports[target]}")
            if storage.backend == "redis":
                self._add_link(source, STORAGE, port(), storage.redis_upstream)
        self.nodes: dict[str, ChaosNode] = {}
        for node in ids:
            peers = ",".join(
                f"{other}=127.0.0.1:{peer_ports[other] if other == node else self.links[f'{node}-{other}'].listen_port}"
                for other in ids
            )
            overrides: dict[str, object] = {
                "node_id": node, "listen": f"127.0.0.1:{peer_ports[node]}",
                "api_listen": f"127.0.0.1:{api_ports[node]}",
                "grpc_api_listen": "", "peers": peers, "protocol": "cornus" if protocol == "mixed" else protocol,
                "partition_count": partition_count, "storage_backend": storage.backend,
                "storage_timeout_ms_call": storage.timeout_ms_call, **self.settings,
            }
            argv = ["--backend", storage.backend, "--timeout-ms-call", str(storage.timeout_ms_call)]
            if storage.backend == "redis":
                url = storage.redis_url_via(self.links[f"{node}-{STORAGE}"].listen_port)
                overrides["storage_redis_url"] = url
                argv += ["--redis-url", url]
            else:
                overrides["storage_emulator_path"] = storage.emulator_path
                argv += ["--emulator-path", storage.emulator_path]
            # Validates every setting here, before any process starts, with the node's own rules.
            config = load_node_config(environ={}, overrides=overrides)
            member = ClusterNode(config, api_ports[node], peer_ports[node], workdir / f"{node}.log")
            self.nodes[node] = ChaosNode(member, peers, argv)

    def _add_link(self, source: str, target: str, listen_port: int, upstream: str) -> None:
        name = f"{source}-{target}"
        self.links[name] = Link(name, source, target, listen_port, upstream)

    @property
    def config(self) -> NodeConfig:
        """n0's configuration; every node shares its timeouts and partitions."""
        return self.nodes["n0"].member.config

    @property
    def members(self) -> list[ClusterNode]:
        return [node.member for node in self.nodes.values()]

    def create_proxies(self) -> None:
        for link in self.links.values():
            self.toxiproxy.create_proxy(link.name, link.listen_port, link.upstream)

    def start(self, node_id: str) -> None:
        node = self.nodes[node_id]
        start_node(node.member, node.peers, node.storage_argv, [f"{k}={v}" for k, v in self.settings.items()])
        node.killed = False
        node.paused = False
        node.start_count += 1

    def start_all(self) -> None:
        for node_id in self.nodes:
            self.start(node_id)

    def wait_ready(self, timeout_s: float) -> bool:
        """True once every node answers /readyz; False (its log tail printed) if one dies or the deadline
        passes."""
        return wait_cluster_ready(self.members, StopSignals(), timeout_s)

    def kill(self, node_id: str) -> int:
        """kill -9 (also when paused: SIGKILL needs no SIGCONT); the unix ms it happened."""
        node = self.nodes[node_id]
        assert node.alive, f"{node_id} is not running"
        at_ms = _now_ms()
        node.killed = True
        # The node leads its own process group (start_new_session): anything it started dies too.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.pid, signal.SIGKILL)
        assert node.member.process is not None
        node.member.process.wait(KILL_WAIT_S)
        node.paused = False
        node.kill_times_ms.append(at_ms)
        return at_ms

    def pause(self, node_id: str) -> None:
        node = self.nodes[node_id]
        assert node.alive and not node.paused
        os.killpg(node.pid, signal.SIGSTOP)
        node.paused = True

    def resume(self, node_id: str) -> None:
        node = self.nodes[node_id]
        if node.alive:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.pid, signal.SIGCONT)
        node.paused = False

    def unexpected_exits(self) -> list[tuple[str, int]]:
        """Nodes that ended without the harness killing them, with their exit codes."""
        found: list[tuple[str, int]] = []
        for node in self.nodes.values():
            process = node.member.process
            if process is not None and not node.killed and process.poll() is not None:
                found.append((node.node_id, process.returncode))
        return found

    def running_urls(self) -> list[str]:
        """REST URLs of nodes whose process runs (a paused one too: clients do not know it is)."""
        return [node.url for node in self.nodes.values() if node.alive]

    def readyz(self, http: httpx.Client,
               bodies: dict[str, dict[str, Any]] | None = None) -> dict[str, tuple[bool, int] | None]:
        """Per node: (ready, in-doubt count) from /readyz, which reports both even when not ready
        (503); None when the node does not answer. `bodies` gets each answer whole."""
        found: dict[str, tuple[bool, int] | None] = {}
        for node_id, node in self.nodes.items():
            try:
                response = http.get(f"{node.url}/readyz", timeout=READYZ_TIMEOUT_S)
                body = response.json()
                found[node_id] = (response.status_code == 200 and bool(body["ready"]), int(body["in_doubt"]))
            except (httpx.HTTPError, ValueError, KeyError, TypeError):
                found[node_id] = None
                continue
            if bodies is not None:
                bodies[node_id] = body
        return found

    def stop_all(self) -> int:
        """SIGCONT then SIGTERM every node (a stopped process cannot act on SIGTERM), SIGKILL the ones
        that do not stop in time; the unix ms the stop began."""
        at_ms = _now_ms()
        for node_id in self.nodes:
            self.resume(node_id)
        stop_nodes(self.members, StopSignals())
        return at_ms

    def log_paths(self) -> dict[str, Path]:
        return {node_id: node.member.log_path for node_id, node in self.nodes.items()}

    def link_names(self, *, storage: bool) -> Sequence[str]:
        return [name for name, link in self.links.items() if link.is_storage == storage]
