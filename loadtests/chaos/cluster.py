"""The cluster under test: N `cornus serve` processes (started, killed and restarted with
services.local_cluster) whose links run through Toxiproxy.

Links. Node i's peers list names, for every other node j, the listen port of proxy `ni-nj`, whose
upstream is j's real peer port; its own entry is its real listen address (cornus/runtime/config.py:
the own entry is only the default of `listen`, and the peer transport serves it in process; the
harness passes --listen explicitly too). A node opens one outbound connection per peer and gets its
answers back on it, so proxy `ni-nj` carries i's messages to j and j's answers to i's requests;
j's own messages to i go over `nj-ni`. With Redis, Azure Blob (Azurite) and DynamoDB (moto), node
i's storage address points at proxy `ni-storage`: the Redis URL's host and port, the connection
string's BlobEndpoint, the DynamoDB endpoint URL, each swapped for the proxy's (Toxiproxy relays TCP,
and all three speak plain TCP: RESP, or HTTP). The emulator is a SQLite file each node opens itself:
there is no storage link to proxy, so that backend gets node-node and process faults only.
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
KILL_POLL_S = 0.01
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


# StoreConfig's names of the backends a chaos run knows; all but the emulator have a TCP storage link.
STORE_BACKENDS = ("redis", "emulator", "azure_blob", "dynamodb")
_AZURE_BLOB_ENDPOINT = "blobendpoint"


def _swap_netloc(url: str, port: int) -> str:
    """`url` with its host and port replaced by 127.0.0.1:`port` (credentials in it kept)."""
    parts = urlsplit(url)
    auth = parts.netloc.rpartition("@")[0]
    netloc = f"{auth}@127.0.0.1:{port}" if auth else f"127.0.0.1:{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _upstream(url: str, default_port: int) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname or '127.0.0.1'}:{parts.port or default_port}"


def _connection_string_fields(connection_string: str) -> list[tuple[str, str]]:
    """An Azure connection string's `Name=value` fields, in order (a value may hold '=': the
    account key is base64)."""
    fields = []
    for field_text in connection_string.split(";"):
        if field_text.strip():
            name, _, value = field_text.partition("=")
            fields.append((name.strip(), value.strip()))
    return fields


def azure_blob_endpoint(connection_string: str) -> str:
    """The BlobEndpoint of a connection string; ValueError if it has none or it is not plain HTTP.
    Only an explicit endpoint can be pointed at a proxy, and only over HTTP: TLS to 127.0.0.1 would
    fail the service certificate's host check, so a chaos run is for Azurite (or another emulator
    on plain HTTP), not a real account."""
    endpoints = [value for name, value in _connection_string_fields(connection_string)
                 if name.lower() == _AZURE_BLOB_ENDPOINT]
    if not endpoints or urlsplit(endpoints[0]).scheme != "http" or not urlsplit(endpoints[0]).hostname:
        raise ValueError("the azure connection string needs BlobEndpoint=http://host:port/account (an emulator "
                         "such as Azurite): the nodes reach it through a Toxiproxy TCP proxy, which TLS would refuse")
    return endpoints[0]


@dataclass(frozen=True, slots=True)
class StorageTarget:
    """Where the data lives, as the auditor reaches it directly (the real server's URL, connection
    string or endpoint); nodes get the same with host and port swapped for their own proxy.
    `backend` is StoreConfig's name (azure_blob, not the chaos CLI's azure). `name` is the run's own
    Azure container or DynamoDB table."""

    backend: str
    redis_url: str = ""
    emulator_path: str = ""
    azure_connection_string: str = ""
    dynamodb_endpoint: str = ""
    dynamodb_region: str = "us-east-1"
    name: str = ""
    timeout_ms_call: int = 2_000

    def __post_init__(self) -> None:
        assert self.backend in STORE_BACKENDS, self.backend
        assert (self.backend == "redis") == bool(self.redis_url)
        assert (self.backend == "emulator") == bool(self.emulator_path)
        assert (self.backend == "azure_blob") == bool(self.azure_connection_string)
        assert (self.backend == "dynamodb") == bool(self.dynamodb_endpoint)
        assert (self.backend in ("azure_blob", "dynamodb")) == bool(self.name)
        if self.backend == "azure_blob":
            azure_blob_endpoint(self.azure_connection_string)  # raises for one a proxy cannot carry

    @property
    def proxied(self) -> bool:
        """Whether nodes reach this storage over TCP, through a proxy per node (not the emulator)."""
        return self.backend != "emulator"

    @property
    def upstream(self) -> str:
        """host:port of the real storage service: the upstream of every node's storage proxy."""
        if self.backend == "redis":
            return _upstream(self.redis_url, 6379)
        if self.backend == "azure_blob":
            return _upstream(azure_blob_endpoint(self.azure_connection_string), 80)
        assert self.backend == "dynamodb", self.backend
        return _upstream(self.dynamodb_endpoint, 80)

    def redis_url_via(self, port: int) -> str:
        return _swap_netloc(self.redis_url, port)

    def azure_connection_string_via(self, port: int) -> str:
        """The connection string with its BlobEndpoint's host and port swapped for 127.0.0.1:`port`
        (Azurite takes the account from the URL's path, and the shared-key signature covers the path,
        not the host, so requests through the proxy are signed and served as direct ones)."""
        return ";".join(f"{name}={_swap_netloc(value, port) if name.lower() == _AZURE_BLOB_ENDPOINT else value}"
                        for name, value in _connection_string_fields(self.azure_connection_string))

    def direct_location(self) -> dict[str, str]:
        """StoreConfig fields that reach this storage directly, never through a proxy (the auditor's)."""
        if self.backend == "redis":
            return {"redis_url": self.redis_url}
        if self.backend == "emulator":
            return {"emulator_path": self.emulator_path}
        if self.backend == "azure_blob":
            return {"azure_connection_string": self.azure_connection_string, "azure_container": self.name}
        return {"dynamodb_endpoint": self.dynamodb_endpoint, "dynamodb_region": self.dynamodb_region,
                "dynamodb_table": self.name}

    def node_storage(self, proxy_port: int | None) -> tuple[list[str], dict[str, object], dict[str, str]]:
        """A node's storage flags, the same as load_node_config overrides, and the environment the
        node gets them by where they are secret (the Azure connection string holds the account key,
        which argv would show to every user of the machine; ps cannot read another's environment).
        `proxy_port` is the node's storage proxy (None for the emulator)."""
        argv = ["--backend", self.backend, "--timeout-ms-call", str(self.timeout_ms_call)]
        overrides: dict[str, object] = {"storage_backend": self.backend,
                                        "storage_timeout_ms_call": self.timeout_ms_call}
        environ: dict[str, str] = {}
        if self.backend == "emulator":
            overrides["storage_emulator_path"] = self.emulator_path
            return [*argv, "--emulator-path", self.emulator_path], overrides, environ
        assert proxy_port is not None
        if self.backend == "redis":
            url = self.redis_url_via(proxy_port)
            overrides["storage_redis_url"] = url
            argv += ["--redis-url", url]
        elif self.backend == "azure_blob":
            connection_string = self.azure_connection_string_via(proxy_port)
            overrides |= {"storage_azure_connection_string": connection_string, "storage_azure_container": self.name}
            environ["CORNUS_STORAGE_AZURE_CONNECTION_STRING"] = connection_string
            argv += ["--azure-container", self.name]
        else:
            endpoint = _swap_netloc(self.dynamodb_endpoint, proxy_port)
            overrides |= {"storage_dynamodb_endpoint": endpoint, "storage_dynamodb_table": self.name,
                          "storage_dynamodb_region": self.dynamodb_region}
            argv += ["--dynamodb-endpoint", endpoint, "--dynamodb-table", self.name,
                     "--dynamodb-region", self.dynamodb_region]
        return argv, overrides, environ


@dataclass(slots=True)
class ChaosNode:
    member: ClusterNode
    peers: str
    storage_argv: list[str]
    # Added to the node's environment at each start (the Azure connection string: see node_storage).
    storage_environ: dict[str, str] = field(default_factory=dict)
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


def pid_exists(pid: int) -> bool:
    """Whether a process `pid` exists (a zombie too): signal 0 checks without sending anything."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _proc_state(pid: int) -> str:
    """The kernel's view of `pid` (state, parent), for an anomaly's message."""
    try:
        fields = {line.split(":", 1)[0]: line.split(":", 1)[1].strip()
                  for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line}
    except OSError:
        return "no such process"
    return f"state {fields.get('State', '?')}, ppid {fields.get('PPid', '?')}, name {fields.get('Name', '?')}"


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
        # What the harness saw go wrong with its own processes (a node whose pid does not exist, a
        # kill -9 not seen to end the process): the run's own faults, not the system's. Reported.
        self.anomalies: list[str] = []
        ids = [f"n{i}" for i in range(node_count)]
        api_ports = {node: port() for node in ids}
        peer_ports = {node: port() for node in ids}
        self.links: dict[str, Link] = {}
        for source in ids:
            for target in ids:
                if source != target:
                    self._add_link(source, target, port(), f"127.0.0.1:{peer_ports[target]}")
            if storage.proxied:
                self._add_link(source, STORAGE, port(), storage.upstream)
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
                "partition_count": partition_count, **self.settings,
            }
            proxy = self.links.get(f"{node}-{STORAGE}")
            argv, storage_overrides, environ = storage.node_storage(proxy.listen_port if proxy else None)
            overrides |= storage_overrides
            # Validates every setting here, before any process starts, with the node's own rules
            # (on the backend the nodes run on: its late-write window and lease rules differ).
            config = load_node_config(environ={}, overrides=overrides)
            member = ClusterNode(config, api_ports[node], peer_ports[node], workdir / f"{node}.log")
            self.nodes[node] = ChaosNode(member, peers, argv, environ)

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
        start_node(node.member, node.peers, node.storage_argv, [f"{k}={v}" for k, v in self.settings.items()],
                   environ=node.storage_environ)
        launcher = getattr(node.member.process, "launcher", None)
        parent = launcher.process.pid if launcher is not None else os.getpid()
        if not pid_exists(node.pid):
            # The launcher answered a pid no process has: every kill, pause and stop of this node
            # would then miss it (found in runs: a restarted node that never logged a line).
            self.anomalies.append(f"{_now_ms()} start {node_id}: the launcher answered pid {node.pid}, which no "
                                  "process has")
        elif f"ppid {parent}," not in _proc_state(node.pid):
            self.anomalies.append(f"{_now_ms()} start {node_id}: pid {node.pid} is not a child of its starter "
                                  f"{parent}: {_proc_state(node.pid)}")
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
        try:
            os.killpg(node.pid, signal.SIGKILL)
        except ProcessLookupError:
            self.anomalies.append(f"{at_ms} kill {node_id}: no process group {node.pid} ({_proc_state(node.pid)}) "
                                  "although the launcher says the node runs")
        process = node.member.process
        assert process is not None
        # Polled with a bound of its own, so that a kill the launcher never reports says so.
        deadline = time.monotonic() + KILL_WAIT_S
        while node.alive:
            if time.monotonic() > deadline:
                # Nothing the run says afterwards about this node would be true (its ownership
                # intervals end at a kill that did not happen): the run ends here, saying why.
                raise RuntimeError(f"kill -9 of {node_id} (pid {node.pid}): not reported dead within "
                                   f"{KILL_WAIT_S:g} s; the kernel says {_proc_state(node.pid)}")
            time.sleep(KILL_POLL_S)
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
            if process is not None and not node.killed and not node.alive:
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
        members = []
        for node_id, node in self.nodes.items():
            if node.alive and not pid_exists(node.pid):
                # stop_nodes' SIGTERM would raise ProcessLookupError and leave the other nodes running.
                self.anomalies.append(f"{at_ms} stop {node_id}: pid {node.pid} does not exist although the "
                                      "launcher says the node runs")
                continue
            members.append(node.member)
        stop_nodes(members, StopSignals())
        return at_ms

    def log_paths(self) -> dict[str, Path]:
        return {node_id: node.member.log_path for node_id, node in self.nodes.items()}

    def link_names(self, *, storage: bool) -> Sequence[str]:
        return [name for name, link in self.links.items() if link.is_storage == storage]
