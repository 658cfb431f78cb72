"""A real cluster for tests: N `cornus serve` processes on 127.0.0.1, each with its own gRPC and REST
port, sharing one storage backend. Nodes can be killed with SIGKILL (optionally by an armed
failpoint) and restarted on the same ports."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from services import node_launcher
from storage_adapters.contract import LogId, Record
from storage_adapters.factory import StoreConfig, open_store
from storage_adapters.store import LogStore
from tests.worker import free_port

READY_TIMEOUT_S = 60.0
HTTP_TIMEOUT_S = 15.0
# Before a cluster stops: how long it waits for coordinated decisions to reach every participant
# (Cluster.stop), and the coordinator phases (admin listing) that still wait for an acknowledgement.
# A participant that is up acknowledges within a resend (backoff_ms_max, 320 ms); short, since a
# test may also end with storage gone, when nothing can be acknowledged.
DELIVER_WAIT_S = 1.0
UNDELIVERED_PHASES = frozenset({"validating", "collecting", "decided"})
# Every node of a test cluster runs on this machine, and a killed one takes its calls with it: a
# storage call lands at most a scheduling hiccup after its deadline. The production default slack
# (1 s, for networks and clock rates) would add 750 ms to every restart's recovery wait. Leases
# are short for the same reason: a node killed with SIGKILL waits out its own old leases.
DEFAULT_SETTINGS = {
    "clock_slack_ms": 250,
    "lease_ms": 1_000,
    "renew_interval_ms": 250,
    # Longer than a killed node takes to restart here, so it gets its partitions back itself
    # rather than by a hand-over from a node that took them meanwhile.
    "failover_delay_ms": 3_000,
    "drain_ms_max": 1_000,
    # A test's storage is thrown away after it: its nodes need not wait out the collection of
    # their transactions at a stop (tests/cluster/test_outcomes.py waits for it).
    "timeout_ms_stop_collect": 0,
    # Every test cluster sweeps, and often: the crash, bank and ownership tests run with sweepers
    # collecting beside them. A sweep comes only once a record is older than the sweep age, which
    # counts a Cornus coordinator's termination bound (sweeper.sweep_age_ms_min): at the default
    # 12 s few records would age within a test; at 2 s they do (about 8 s here).
    "sweep_interval_ms": 1_000,
    "coordinator_terminate_ms_max": 2_000,
}


@dataclass
class NodeProcess:
    node_id: str
    peer_port: int
    api_port: int
    process: subprocess.Popen[bytes] | node_launcher.LaunchedProcess | None = None
    log_path: Path | None = None
    env: dict[str, str] = field(default_factory=dict)  # on top of the cluster's, for this node only
    grpc_api_port: int = 0  # 0: no public gRPC API
    config_path: Path | None = None  # a TOML file of this node's own (`cornus serve --config`)

    @property
    def grpc_target(self) -> str:
        assert self.grpc_api_port, f"{self.node_id} runs no public gRPC API (Cluster(grpc_api=True))"
        return f"127.0.0.1:{self.grpc_api_port}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


class Cluster:
    def __init__(
        self,
        protocol: str,
        storage: Mapping[str, str],
        node_count: int = 3,
        partition_count: int = 6,
        settings: Mapping[str, int] | None = None,
        *,
        grpc_api: bool = False,
    ) -> None:
        self.protocol = protocol
        self.storage = dict(storage)
        self.partition_count = partition_count
        self.settings = {**DEFAULT_SETTINGS, **(settings or {})}
        self.directory = Path(tempfile.mkdtemp(prefix="cornus-cluster-"))
        self.nodes = {
            f"n{i}": NodeProcess(f"n{i}", free_port(), free_port()) for i in range(node_count)
        }
        if grpc_api:
            for node in self.nodes.values():
                node.grpc_api_port = free_port()
        # Pooled connections go after 1 s idle: uvicorn closes an idle keep-alive connection after
        # 5 s, and a request sent on one just as it closes fails with "Server disconnected".
        self.client = httpx.Client(timeout=HTTP_TIMEOUT_S, limits=httpx.Limits(keepalive_expiry=1.0))

    @property
    def peers(self) -> str:
        return ",".join(f"{n.node_id}=127.0.0.1:{n.peer_port}" for n in self.nodes.values())

    def owner(self, partition: str) -> str:
        index = int(partition[1:])
        return sorted(self.nodes)[index % len(self.nodes)]

    def start(self, node_id: str, failpoints: str = "", wait: bool = True) -> None:
        node = self.nodes[node_id]
        assert not node.alive, f"{node_id} is already running"
        env = {**os.environ, "CORNUS_PEERS": self.peers, "CORNUS_PROTOCOL": self.protocol,
               "CORNUS_PARTITION_COUNT": str(self.partition_count), "CORNUS_FAILPOINTS": failpoints}
        for name, value in self.storage.items():
            env[f"CORNUS_STORAGE_{name.upper()}"] = value
        for name, value in self.settings.items():
            env[f"CORNUS_{name.upper()}"] = str(value)
        if node.grpc_api_port:
            env["CORNUS_GRPC_API_LISTEN"] = f"127.0.0.1:{node.grpc_api_port}"
        env.update(node.env)
        node.log_path = self.directory / f"{node_id}.log"
        config = ["--config", str(node.config_path)] if node.config_path else []
        args = ["serve", "--node-id", node_id, "--api-listen", f"127.0.0.1:{node.api_port}", *config]
        if node_launcher.enabled():
            node.process = node_launcher.NodeLauncher.shared().spawn(args, env, node.log_path)
        else:
            with node.log_path.open("ab") as log:
                node.process = subprocess.Popen(
                    [sys.executable, "-m", "services.cli", *args],
                    env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                )
        if wait:
            self.wait_ready(node_id)

    def start_all(self, failpoints: Mapping[str, str] | None = None) -> None:
        for node_id in self.nodes:
            self.start(node_id, (failpoints or {}).get(node_id, ""), wait=False)
        for node_id in self.nodes:
            self.wait_ready(node_id)

    def wait_ready(self, node_id: str, timeout_s: float = READY_TIMEOUT_S) -> None:
        node = self.nodes[node_id]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not node.alive:
                raise RuntimeError(f"{node_id} exited while starting:\n{self.log(node_id)}")
            try:
                if self.client.get(f"{node.url}/readyz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"{node_id} not ready within {timeout_s} s:\n{self.log(node_id)}")

    def kill(self, node_id: str) -> None:
        node = self.nodes[node_id]
        if node.alive:
            assert node.process is not None
            os.killpg(node.process.pid, signal.SIGKILL)
            node.process.wait(10)

    def wait_exit(self, node_id: str, timeout_s: float = 30.0) -> int:
        node = self.nodes[node_id]
        assert node.process is not None
        return node.process.wait(timeout_s)

    def _wait_decisions_delivered(self, timeout_s: float = DELIVER_WAIT_S) -> None:
        """While every node is up, wait (a little) until no node coordinates a transaction whose
        decision some participant has not acknowledged. Each node's shutdown waits for that too
        (up to 5 s), but then its participants are shutting down with it and never answer: a
        coordinator resending to a participant that just restarted cost a whole 5 s at the end."""
        if not all(node.alive for node in self.nodes.values()):
            return  # a participant may be down for good: shutdown's own wait decides
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                rows = [row for node in self.nodes.values() for row in self._listing(node)]
            except (httpx.HTTPError, ValueError):
                return
            if not any(row["role"] == "coordinator" and row["phase"] in UNDELIVERED_PHASES for row in rows):
                return
            time.sleep(0.02)

    def _listing(self, node: NodeProcess) -> list[dict[str, object]]:
        """`node`'s transaction listing, with its admin token when it has one."""
        token = node.env.get("CORNUS_ADMIN_TOKEN")
        response = self.client.get(f"{node.url}/v1/admin/transactions", timeout=1,
                                   headers={"Authorization": f"Bearer {token}"} if token else None)
        response.raise_for_status()
        return response.json()

    def stop(self) -> None:
        self._wait_decisions_delivered()
        for node in self.nodes.values():
            if node.alive:
                assert node.process is not None
                node.process.send_signal(signal.SIGTERM)
        for node in self.nodes.values():
            if node.process is not None:
                try:
                    node.process.wait(15)
                except subprocess.TimeoutExpired:
                    os.killpg(node.process.pid, signal.SIGKILL)
                    node.process.wait(10)
        self.client.close()
        # The nodes' logs: a failing test has shown them already (running_cluster); some 60
        # clusters a run left theirs in /tmp, run after run.
        shutil.rmtree(self.directory, ignore_errors=True)

    def log(self, node_id: str) -> str:
        path = self.nodes[node_id].log_path
        return path.read_text(errors="replace")[-4000:] if path and path.exists() else ""

    # --- REST helpers ---

    def post(self, node_id: str, path: str, body: object | None = None) -> httpx.Response:
        return self.client.post(f"{self.nodes[node_id].url}{path}", json=body)

    def get(self, node_id: str, path: str) -> httpx.Response:
        return self.client.get(f"{self.nodes[node_id].url}{path}")

    def execute(self, node_id: str, ops: list[dict[str, object]], protocol: str | None = None) -> httpx.Response:
        body: dict[str, object] = {"ops": ops}
        if protocol is not None:
            body["protocol"] = protocol
        return self.post(node_id, "/v1/execute", body)

    def execute_retrying(self, node_id: str, ops: list[dict[str, object]], timeout_s: float = 30.0) -> httpx.Response:
        """`execute`, again while the outcome is a retryable abort (a lock held, a partition moving)."""
        deadline = time.monotonic() + timeout_s
        while True:
            response = self.execute(node_id, ops)
            retryable = response.status_code in (409, 503) and response.json().get("retryable", False)
            if not retryable or time.monotonic() >= deadline:
                return response
            time.sleep(0.05)

    def read(self, node_id: str, keys: list[str], timeout_s: float = 30.0) -> dict[str, str | None]:
        """Read committed values, retrying retryable aborts (a lock of an unfinished txn)."""
        deadline = time.monotonic() + timeout_s
        while True:
            response = self.execute(node_id, [{"op": "get", "key": key} for key in keys])
            if response.status_code == 200:
                return response.json()["reads"]
            retryable = response.status_code in (409, 503) and response.json().get("retryable", True)
            assert retryable and time.monotonic() < deadline, response.text
            time.sleep(0.05)


@contextmanager
def running_cluster(protocol: str, storage: Mapping[str, str], **kwargs: object) -> Iterator[Cluster]:
    cluster = Cluster(protocol, storage, **kwargs)  # type: ignore[arg-type]
    try:
        yield cluster
    except BaseException:
        for node_id in cluster.nodes:
            sys.stderr.write(f"--- log of {node_id} ---\n{cluster.log(node_id)}\n")
        raise
    finally:
        cluster.stop()


def unknown_txn_id(node: str = "n9", counter: int = 1) -> str:
    """A transaction id no node knows, begun a minute ago: old enough that no request of it can
    still be on its way, young enough that its records and tombstone cannot have been collected.
    The status call answers "not known" only for such an id; a younger one is UNKNOWN (too
    recent to tell), an older one UNKNOWN past its tombstone (cornus/protocol/status.py)."""
    return f"{int(time.time() * 1000) - 60_000}.{node}.ffffff.{counter}"


def keys_on(partition: str, partition_count: int, count: int, prefix: str = "k") -> list[str]:
    """`count` keys that hash to `partition`."""
    from cornus.runtime.keys import partition_of

    found: list[str] = []
    index = 0
    while len(found) < count:
        key = f"{prefix}{index}"
        if partition_of(key, partition_count) == partition:
            found.append(key)
        index += 1
        assert index < 1_000_000
    return found


@asynccontextmanager
async def opened_store(storage: Mapping[str, str]) -> AsyncIterator[LogStore]:
    """The cluster's storage, opened by the test itself (to look at what the nodes left there)."""
    store = await open_store(StoreConfig(**{k: (int(v) if k == "timeout_ms_call" else v) for k, v in storage.items()}))
    try:
        yield store
    finally:
        await store.close()


async def read_records(storage: Mapping[str, str], txn: str, partitions: list[str]) -> dict[str, Record | None]:
    """`txn`'s record in each partition's log, read in the order given."""
    async with opened_store(storage) as store:
        return {p: await store.read(LogId.partition(p), txn) for p in partitions}
