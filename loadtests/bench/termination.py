"""`cornus termination-bench`: how long Cornus participants take to finish a transaction whose
coordinator died (the paper's Figure 8), on your own storage.

It starts a real local cluster (`cornus serve` processes on 127.0.0.1, one partition per node) and
repeats a round: restart node n0 with the failpoint `coordinator.after_votes` armed, send it a
transaction that writes to every other node's partition, and let n0 die with kill -9 semantics the
moment every vote is in, before any decision leaves it. Each participant then times out waiting
for the decision and runs the termination protocol (LogOnce(ABORT) on every other participant's
log); the nodes time each run from its first LogOnce(ABORT) to the decision, and this prints those
figures per participant node, read from their /v1/admin/timings.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

import httpx

from cornus.protocol.config import Protocol
from loadtests.bench.cluster import HTTP_TIMEOUT_S, admin_headers
from loadtests.bench.lifecycle import ClusterSpec, bench_cluster
from loadtests.workloads.base import KeyPinner
from services.local_cluster import ClusterNode
from storage_adapters.errors import ValidationError
from storage_adapters.factory import StoreConfig

FAILPOINT = "coordinator.after_votes"
ROUNDS_MAX = 1_000
NODES_MIN = 3  # a coordinator and at least two participants, so termination has peers to ask
NODES_MAX = 16
# Bounds on one round: the coordinator must die, then every participant must decide.
TIMEOUT_S_DEATH = 15.0
TIMEOUT_S_SETTLE = 60.0
TIMEOUT_S_LINKS = 30.0
LINK_PROBE_TXN = "termination-bench-link-probe"
POLL_S = 0.02


@dataclass(frozen=True)
class NodeTermination:
    node: str
    count: int
    min_ms: float
    p50_ms: float
    p99_ms: float
    max_ms: float


def run_termination_bench(
    storage: StoreConfig, storage_argv: list[str], *, nodes: int, rounds: int, settings: list[str],
    storage_environ: Mapping[str, str] | None = None, keep_storage: bool = False, flush_redis: bool = False,
    run_index: int = 0,
) -> list[NodeTermination]:
    """`storage_environ` goes to the nodes' environment (secrets: argv is visible to every user).
    `run_index`: the point of a sweep, whose container or table is its own (loadtests.bench.namespaces)."""
    if not NODES_MIN <= nodes <= NODES_MAX:
        raise ValidationError(f"--nodes must be in {NODES_MIN}..{NODES_MAX}")
    if not 0 < rounds <= ROUNDS_MAX:
        raise ValidationError(f"--rounds must be in 1..{ROUNDS_MAX}")
    # One partition per node: n0 coordinates, every other node is a participant.
    spec = ClusterSpec(nodes=nodes, partitions=nodes, protocol=Protocol.CORNUS, storage=storage,
                       storage_argv=storage_argv, settings=settings, environ=dict(storage_environ or {}),
                       keep_storage=keep_storage, flush_redis=flush_redis, run_index=run_index)
    with bench_cluster(spec, prefix="cornus-termination-") as cluster, \
            httpx.Client(timeout=HTTP_TIMEOUT_S) as http:
        coordinator, participants = cluster.members[0], cluster.members[1:]
        pinner = KeyPinner(nodes)
        targets = sorted(p for p, node in coordinator.config.placement().items() if node != coordinator.config.node_id)
        cluster.start()
        for round_index in range(rounds):
            cluster.restart(coordinator, environ={"CORNUS_FAILPOINTS": FAILPOINT})
            _wait_links_up(http, participants)
            ops = [{"op": "put", "key": pinner.key(f"t{round_index}", int(p[1:])), "value": "x"} for p in targets]
            _run_round(http, coordinator, participants, ops)
        return [_read_termination(http, member) for member in participants]


def _wait_links_up(http: httpx.Client, participants: list[ClusterNode]) -> None:
    """Until every participant reaches the restarted coordinator again. Their links to it
    reconnect with backoff; a vote sent before would be lost, the coordinator would time out and
    decide by termination itself, and the failpoint (which needs the votes) would never fire. A
    status call asks every node: 404 means all of them answered that they do not know the id."""
    deadline = time.monotonic() + TIMEOUT_S_LINKS
    for member in participants:
        while http.get(f"{member.url}/v1/txn/{LINK_PROBE_TXN}").status_code != 404:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{member.config.node_id} did not reach the restarted coordinator")
            time.sleep(POLL_S)


def _run_round(
    http: httpx.Client, coordinator: ClusterNode, participants: list[ClusterNode], ops: list[dict[str, str]]
) -> None:
    try:
        response = http.post(f"{coordinator.url}/v1/execute", json={"ops": ops})
        raise RuntimeError(f"the coordinator answered instead of dying at {FAILPOINT}: {response.text}")
    except httpx.HTTPError:
        pass  # it died with the request open, as armed
    assert coordinator.process is not None
    code = coordinator.process.wait(TIMEOUT_S_DEATH)
    if code != -9:
        raise RuntimeError(f"{coordinator.config.node_id} exited with {code}, not at the failpoint")
    deadline = time.monotonic() + TIMEOUT_S_SETTLE
    while time.monotonic() < deadline:
        rows = [row for member in participants
                for row in http.get(f"{member.url}/v1/admin/transactions", headers=admin_headers()).json()
                if row["role"] == "participant"]
        if not rows:
            return
        time.sleep(POLL_S)
    raise RuntimeError(f"participants did not decide within {TIMEOUT_S_SETTLE} s of the coordinator's death")


def _read_termination(http: httpx.Client, member: ClusterNode) -> NodeTermination:
    summary = http.get(f"{member.url}/v1/admin/timings", headers=admin_headers()).json().get("termination")
    if not summary:
        raise RuntimeError(f"{member.config.node_id} ran no termination")
    return NodeTermination(member.config.node_id, int(summary["count"]), summary["min"], summary["p50"],
                           summary["p99"], summary["max"])


def sweep_row(nodes: int, rows: list[NodeTermination]) -> dict[str, float | int]:
    """One node count's figures over every participant's runs: the median (the participants'
    medians weighted by their counts), the worst 99th percentile and the maximum."""
    count = sum(row.count for row in rows)
    return {
        "nodes": nodes,
        "terminations": count,
        "p50_ms": round(sum(row.p50_ms * row.count for row in rows) / count, 3) if count else 0.0,
        "p99_ms": round(max((row.p99_ms for row in rows), default=0.0), 3),
        "max_ms": round(max((row.max_ms for row in rows), default=0.0), 3),
        "min_ms": round(min((row.min_ms for row in rows), default=0.0), 3),
    }


def format_terminations(rows: list[NodeTermination]) -> str:
    lines = [f"{'node':<6}{'terminations':>13}{'min ms':>9}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}"]
    for row in rows:
        lines.append(f"{row.node:<6}{row.count:>13}{row.min_ms:>9.2f}{row.p50_ms:>9.2f}{row.p99_ms:>9.2f}"
                     f"{row.max_ms:>9.2f}")
    return "\n".join(lines)
