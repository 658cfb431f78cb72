"""The `cornus` CLI as a user runs it: `cornus cluster up` as a real process tree (its table, then
`cornus txn`, `cornus inspect` and `cornus resolve` against the nodes it printed), stopped with
SIGTERM or SIGINT (exit 0, every node process gone) or broken by a node's death (exit 1)."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from services import local_cluster, node_launcher
from services.cli import parse_op
from services.client import CornusClient
from storage_adapters.errors import ValidationError
from tests import worker
from tests.cluster.harness import unknown_txn_id

TIMEOUT_S_TABLE = 90.0
TIMEOUT_S_EXIT = 30.0
TIMEOUT_S_COMMAND = 60.0
# The interactive transaction below stays open across several `cornus` commands, each a Python
# process of its own, which a loaded 2-core box (parallel test workers) can stretch past the
# node's 30 s default idle timeout; the idle abort is not what that test is about.
TIMEOUT_MS_TXN_IDLE = 600_000
ROW = re.compile(
    r"^(n\d+)\s+(http://127\.0\.0\.1:\d+)\s+(127\.0\.0\.1:\d+)\s+(127\.0\.0\.1:\d+)\s+(\S+)\s+(yes|no)\s+(\d+)$"
)


@dataclass
class Row:
    node: str
    url: str
    grpc: str
    peer: str
    partitions: list[str]
    pid: int


class ClusterUp:
    """`cornus cluster up` in the background, its stdout read line by line by a thread so the
    test never blocks on a pipe."""

    def __init__(self, *args: str) -> None:
        # No wait for the collections at a node's stop: the cluster's storage goes with the test.
        self.process = subprocess.Popen(
            [sys.executable, "-m", "services.cli", "cluster", "up", "--set", "timeout_ms_stop_collect=0", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        assert self.process.stdout is not None
        self._pump_thread = threading.Thread(target=self._pump, args=(self.process.stdout,), daemon=True)
        self._pump_thread.start()

    def _pump(self, stream: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            self.lines.put(line.rstrip("\n"))

    def table(self) -> list[Row]:
        deadline = time.monotonic() + TIMEOUT_S_TABLE
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                assert self.process.poll() is None, f"cluster up exited early:\n{self.report()}"
                continue
            self.output.append(line)
            if line.startswith("Ctrl-C or SIGTERM"):
                rows = [ROW.match(text) for text in self.output]
                return [Row(m[1], m[2], m[3], m[4], m[5].split(","), int(m[7])) for m in rows if m]
        raise AssertionError(f"no table within {TIMEOUT_S_TABLE} s:\n{self.report()}")

    def wait(self) -> int:
        code = self.process.wait(TIMEOUT_S_EXIT)
        # The pump ends at the pipe's end of file, so once it has, every last line is queued.
        self._pump_thread.join(TIMEOUT_S_EXIT)
        while not self.lines.empty():
            self.output.append(self.lines.get())
        return code

    def report(self) -> str:
        stderr = ""
        if self.process.poll() is not None and self.process.stderr is not None:
            stderr = self.process.stderr.read()
        return "\n".join(self.output) + f"\n--- stderr ---\n{stderr}"

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(TIMEOUT_S_EXIT)


@pytest.fixture
def cluster_up() -> Iterator[list[ClusterUp]]:
    started: list[ClusterUp] = []
    yield started
    for cluster in started:
        cluster.kill()  # only if a test failed midway; the PDEATHSIG of its nodes ends them


def cornus(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "services.cli", *args], capture_output=True, text=True,
                          timeout=TIMEOUT_S_COMMAND, check=False)


def gone(pid: int) -> bool:
    """Exited: no such process, or a zombie (an orphan waits for whatever reaps in this container)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"


def wait_gone(pids: list[int]) -> list[int]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not all(gone(pid) for pid in pids):
        time.sleep(0.05)
    return [pid for pid in pids if not gone(pid)]


def test_cluster_up_txn_inspect_resolve_then_sigterm(cluster_up: list[ClusterUp], tmp_path: Path) -> None:
    cluster = ClusterUp("--nodes", "3", "--partitions", "6", "--data-dir", str(tmp_path),
                        "--set", f"timeout_ms_txn_idle={TIMEOUT_MS_TXN_IDLE}")
    cluster_up.append(cluster)
    rows = cluster.table()
    assert [row.node for row in rows] == ["n0", "n1", "n2"], cluster.report()
    owned = [p for row in rows for p in row.partitions]
    assert sorted(owned) == sorted(f"p{i}" for i in range(6)), "every partition has exactly one owner"
    assert not any(gone(row.pid) for row in rows)
    urls = [row.url for row in rows]

    done = cornus("txn", "--url", urls[0], "put:greeting=hello=world", "put:n=1", "get:greeting")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("committed") and 'greeting = "hello=world"' in done.stdout
    txn_id = re.search(r"txn (\S+)", done.stdout)
    assert txn_id is not None

    read = cornus("txn", "--url", urls[1], "--json", "get:greeting", "get:missing")
    assert read.returncode == 0, read.stdout + read.stderr
    body = json.loads(read.stdout)
    assert body["outcome"] == "committed" and body["reads"] == {"greeting": "hello=world", "missing": None}

    failed = cornus("txn", "--url", urls[2], "put:n=2", "check:greeting=other")
    assert failed.returncode == 1 and failed.stdout.startswith("aborted: check_failed"), failed.stdout
    for bad in (["put:n"], ["get:n=1"], ["frob:n"], ["get:"]):
        refused = cornus("txn", "--url", urls[0], "put:n=3", *bad)
        assert refused.returncode == 2 and "cornus: error:" in refused.stderr, (bad, refused.stderr)
    refused = cornus("txn", "--url", "127.0.0.1:1", "put:n=4")
    assert refused.returncode == 2 and "http://HOST:PORT" in refused.stderr
    refused = cornus("txn", "--url", urls[0], "put:n=" + "x" * (64 * 1024 + 1))
    assert refused.returncode == 2, refused.stdout + refused.stderr
    with CornusClient(urls) as client:
        assert client.get("n") == "1", "no failed or refused command changed anything"

        # The public gRPC address in the table serves the same data (the README's gRPC example).
        via_grpc = subprocess.run(
            [sys.executable, "-m", "services.public_api.example", "--target", rows[2].grpc, "get", "greeting"],
            capture_output=True, text=True, timeout=TIMEOUT_S_COMMAND, check=False,
        )
        assert via_grpc.returncode == 0 and "greeting = b'hello=world'" in via_grpc.stdout, via_grpc.stdout

        # An interactive transaction in flight shows up in inspect on its coordinator.
        running = client.begin()
        running.write({"n": "5"})
        listing = cornus("inspect", "--url", running.node_url)
        assert listing.returncode == 0, listing.stderr
        assert running.txn in listing.stdout and "coordinator" in listing.stdout
        every = cornus("inspect", "--all-nodes", ",".join(urls), "--json")
        assert every.returncode == 0, every.stderr
        assert {row["txn"] for row in json.loads(every.stdout)} >= {running.txn}
        status = cornus("inspect", "--url", running.node_url, running.txn)
        assert status.returncode == 0 and status.stdout.startswith("active"), status.stdout
        # A resolve of it from another node writes nothing (no vote yet) and says it is active.
        other = next(url for url in urls if url != running.node_url)
        still = cornus("resolve", "--url", other, running.txn)
        assert still.returncode == 1 and still.stdout.startswith("active"), still.stdout + still.stderr
        assert running.abort().status.value == "aborted"

    listing = cornus("inspect", "--all-nodes", ",".join(urls))
    assert listing.returncode == 0 and "no in-flight or in-doubt transactions on 3 of 3" in listing.stdout
    status = cornus("inspect", "--url", urls[1], txn_id[1])
    assert status.returncode == 0 and status.stdout.startswith("committed"), status.stdout
    unknown = cornus("inspect", "--url", urls[1], unknown_txn_id("n7"))
    assert unknown.returncode == 1 and "no transaction" in unknown.stderr
    # An id old enough for its records to have been collected is UNKNOWN, never "no transaction".
    collected = cornus("inspect", "--url", urls[1], "1.n7.nothing.1")
    assert collected.returncode == 0 and collected.stdout.startswith("unknown"), collected.stdout
    resolved = cornus("resolve", "--url", urls[2], txn_id[1])
    assert resolved.returncode == 0 and resolved.stdout.startswith("committed"), resolved.stdout

    cluster.process.send_signal(signal.SIGTERM)
    assert cluster.wait() == 0, cluster.report()
    assert wait_gone([row.pid for row in rows]) == [], cluster.report()
    assert "cornus: cluster stopped" in cluster.output
    assert (tmp_path / "cornus.db").exists() and (tmp_path / "n0.log").exists(), "--data-dir is kept"


def test_cluster_up_stops_on_sigint(cluster_up: list[ClusterUp]) -> None:
    cluster = ClusterUp("--nodes", "2", "--partitions", "2", "--protocol", "2pc")
    cluster_up.append(cluster)
    rows = cluster.table()
    assert [row.partitions for row in rows] == [["p0"], ["p1"]]
    done = cornus("txn", "--url", rows[1].url, "put:a=1", "put:b=2")
    assert done.returncode == 0, done.stdout + done.stderr
    data_dir = next(Path(line.split()[1]).parent for line in cluster.output if line.startswith("logs:"))
    assert data_dir.exists()

    cluster.process.send_signal(signal.SIGINT)
    assert cluster.wait() == 0, cluster.report()
    assert wait_gone([row.pid for row in rows]) == []
    assert "cornus: SIGINT: stopping 2 nodes" in cluster.output
    assert not data_dir.exists(), "a temporary data directory is removed on a clean stop"


def test_cluster_up_exits_nonzero_when_a_node_dies(cluster_up: list[ClusterUp]) -> None:
    cluster = ClusterUp("--nodes", "2", "--partitions", "4")
    cluster_up.append(cluster)
    rows = cluster.table()
    os.kill(rows[1].pid, signal.SIGKILL)
    assert cluster.wait() == 1, cluster.report()
    assert wait_gone([row.pid for row in rows]) == []
    assert f"node n1 (pid {rows[1].pid}) died: killed by SIGKILL" in cluster.report()


def parent_pid(pid: int) -> int:
    # /proc/PID/stat: "pid (comm) state ppid ..."; comm may hold spaces, so split after its ")".
    return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])


@pytest.mark.skipif(not node_launcher.enabled(), reason="nodes are forked by a launcher on Linux only")
def test_cluster_up_killed_with_sigkill_leaves_no_node_behind(cluster_up: list[ClusterUp]) -> None:
    cluster = ClusterUp("--nodes", "2", "--partitions", "2")
    cluster_up.append(cluster)
    rows = cluster.table()
    launchers = {parent_pid(row.pid) for row in rows}
    assert len(launchers) == 1 and cluster.process.pid not in launchers, "both nodes are the launcher's children"
    assert parent_pid(launchers.copy().pop()) == cluster.process.pid
    assert all(os.getsid(row.pid) == row.pid for row in rows), "each node leads a session of its own"
    assert all(Path(f"/proc/{row.pid}/comm").read_text() == "cornus-node\n" for row in rows)

    cluster.process.kill()  # nothing of `cluster up` runs: the kernel's death signals must end the rest
    cluster.process.wait(TIMEOUT_S_EXIT)
    assert wait_gone([*launchers, *(row.pid for row in rows)]) == []


def test_cluster_up_refuses_bad_input_and_starts_nothing(tmp_path: Path) -> None:
    for args in (["--nodes", "0"], ["--partitions", "1", "--nodes", "2"], ["--base-port", "65534"],
                 ["--protocol", "paxos"], ["--set", "timeout_ms_prepare"], ["--set", "no_such_limit=1"]):
        result = subprocess.run([sys.executable, "-m", "services.cli", "cluster", "up", "--data-dir",
                                 str(tmp_path / "d"), *args], capture_output=True, text=True,
                                timeout=TIMEOUT_S_COMMAND, check=False)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert "error" in result.stderr and "Cornus cluster up" not in result.stdout
    assert not (tmp_path / "d").exists(), "bad input is refused before anything is created"


@pytest.mark.parametrize(
    ("text", "kind", "key", "value"),
    [("put:k=v", "put", "k", "v"), ("put:a:b=c=d", "put", "a:b", "c=d"), ("put:k=", "put", "k", ""),
     ("get:k", "get", "k", None), ("delete:k", "delete", "k", None), ("check:k=v", "check", "k", "v"),
     ("check:k", "check", "k", None)],
)
def test_parse_op(text: str, kind: str, key: str, value: str | None) -> None:
    op = parse_op(text)
    assert (op.kind.value, op.key, op.value) == (kind, key, value)


@pytest.mark.parametrize("text", ["k=v", "put:", "put:k", "get:k=v", "delete:k=", "PUT:k=v", "put:=v", ":k"])
def test_parse_op_refuses(text: str) -> None:
    with pytest.raises(ValidationError):
        parse_op(text)


@pytest.mark.skipif(not local_cluster.EPHEMERAL_RANGE_PATH.exists(), reason="the kernel's ephemeral range is Linux's")
def test_cluster_ports_come_from_below_the_ephemeral_range_and_are_distinct() -> None:
    """A kernel-picked port, probed free and let go until the node binds it, can become the source
    port of another process's outgoing connection meanwhile (a bench node of the suite failed to
    bind its gRPC port so): the nodes' ports come from below that range."""
    low = int(local_cluster.EPHEMERAL_RANGE_PATH.read_text().split()[0])
    ports = [port for triple in local_cluster.cluster_ports(8, None) for port in triple]
    assert len(set(ports)) == len(ports) == 24
    assert all(low - local_cluster.STABLE_PORT_COUNT <= port < low for port in ports), ports
    # Nor from the ports the suite hands its own servers (a bench of the suite took one a test's
    # restarting node had left free).
    assert local_cluster.stable_port_range() == (low - local_cluster.STABLE_PORT_COUNT, low)
    assert worker.STABLE_PORT_RANGE[1] <= low - local_cluster.STABLE_PORT_COUNT, worker.STABLE_PORT_RANGE


def test_cluster_up_starts_again_on_other_ports_when_one_was_taken_before_its_node_bound_it(monkeypatch) -> None:
    """Found by the suite (fresh-clone CI, 2026-11-28): `cluster up` probes free ports and lets
    them go, and a parallel worker's cluster bound one (a REST port) before the node did; the node
    exited having taken nothing and `cluster up` gave up, where `cornus bench` starts again on
    other ports (test_bench_lifecycle). Now `cluster up` does too. In-process, the pick patched to
    hand node n1 a port a socket here holds, and SIGINT sent once the cluster is up."""
    from services import cli

    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    busy_port = busy.getsockname()[1]
    picks: list[list[tuple[int, int, int]]] = []
    real_pick = local_cluster.cluster_ports

    def first_pick_collides(node_count: int, base_port: int | None) -> list[tuple[int, int, int]]:
        ports = real_pick(node_count, base_port)
        if not picks:
            _, peer, public = ports[1]
            ports[1] = (busy_port, peer, public)
        picks.append(ports)
        return ports

    served: list[int] = []

    def up(nodes: list[local_cluster.ClusterNode], args: object, db_path: object) -> None:
        served.extend(node.api_port for node in nodes)
        os.kill(os.getpid(), signal.SIGINT)  # as the user's Ctrl-C: the cluster stops

    monkeypatch.setattr(cli, "cluster_ports", first_pick_collides)
    monkeypatch.setattr(cli, "_print_cluster", up)
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = cli.main(["cluster", "up", "--nodes", "2", "--partitions", "2", "--set", "timeout_ms_stop_collect=0"])
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        busy.close()
    assert code == 0 and len(picks) == 2, (code, picks)
    assert served and busy_port not in served, served
