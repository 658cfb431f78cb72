"""`cornus termination-bench`: how long Cornus participants take to finish a transaction whose
coordinator died (the paper's Figure 8), on your own storage.

It starts a real local cluster (`cornus serve` processes on 127.0.0.1, one partition per node) and
repeats a round: restart node n0 with the failpoint `coordinator.after_votes` armed, send it a
transaction that writes to every other node's partition, and let n0 die with kill -9 semantics the
moment every vote is in, before any decision leaves it. Each participant then times out waiting
for the decision and runs the termination protocol (LogOnce(ABORT) on every other participant's
log); the nodes time each run from its first LogOnce(ABORT) to the decision, and this prints those
figures per participant node, read from their /v1/admin/timings, and over all of them pooled: each
run's own duration, which a node logs as it decides and only its log holds (the timings endpoint
gives summaries, whose medians cannot be combined into the median of the runs).

A 99th percentile needs P99_RUN_COUNT_MIN runs: below that its nearest rank is the maximum, so it
is left out (NaN in the CSV, "-" per node) and the maximum stands for the tail.
"""

from __future__ import annotations

import json
import math
import re
import statistics
import time
from collections.abc import Mapping, Sequence
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
# A node writes its log lines from a thread of its own: how long to wait for the last round's.
TIMEOUT_S_LOG = 2.0
# Runs below which a "99th percentile" is only the maximum (its nearest rank is the last).
P99_RUN_COUNT_MIN = 100
# The line a node logs as a termination run decides (cornus.runtime.effect_runner).
_TERMINATION_LINE = re.compile(r"^termination of .+ decided .+ in ([0-9]+(?:\.[0-9]+)?) ms$")


@dataclass(frozen=True)
class NodeTermination:
    node: str
    count: int
    min_ms: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    # Every run's duration, from the node's log (fewer than count: lines missing, see sweep_row).
    durations_ms: tuple[float, ...] = ()


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
    count = int(summary["count"])
    return NodeTermination(member.config.node_id, count, summary["min"], summary["p50"], summary["p99"],
                           summary["max"], tuple(_logged_durations_ms(member, count)))


def _logged_durations_ms(member: ClusterNode, count: int) -> list[float]:
    """The durations `member` logged, once its log holds `count` of them (or TIMEOUT_S_LOG passed:
    a log level above INFO, dropped lines; sweep_row then leaves the pooled median out)."""
    deadline = time.monotonic() + TIMEOUT_S_LOG
    while True:
        try:
            durations = termination_durations_ms(member.log_path.read_text(errors="replace"))
        except OSError:
            durations = []
        if len(durations) >= count or time.monotonic() > deadline:
            return durations
        time.sleep(POLL_S)


def termination_durations_ms(log_text: str) -> list[float]:
    """Every termination run's duration a node's JSON log lines tell, in order."""
    durations = []
    for line in log_text.splitlines():
        try:
            message = json.loads(line).get("msg", "")
        except (ValueError, AttributeError):
            continue  # not a JSON object: a line some library printed
        match = _TERMINATION_LINE.match(message) if isinstance(message, str) else None
        if match:
            durations.append(float(match.group(1)))
    return durations


def sweep_row(nodes: int, rows: Sequence[NodeTermination]) -> dict[str, float | int]:
    """One node count's figures over every participant's runs pooled: the median of every run's
    duration, the 99th percentile (from P99_RUN_COUNT_MIN runs on), the maximum and the minimum.
    The median and the percentile need every run's duration: where a node's log did not give all
    of them they are NaN, not made up from the nodes' summaries."""
    count = sum(row.count for row in rows)
    pooled = sorted(duration for row in rows for duration in row.durations_ms)
    complete = count > 0 and all(len(row.durations_ms) == row.count for row in rows)
    p99 = pooled[min(count - 1, int(0.99 * count))] if complete and count >= P99_RUN_COUNT_MIN else math.nan
    return {
        "nodes": nodes,
        "terminations": count,
        "p50_ms": round(statistics.median(pooled), 3) if complete else math.nan,
        "p99_ms": round(p99, 3),
        "max_ms": round(max((row.max_ms for row in rows), default=0.0), 3),
        "min_ms": round(min((row.min_ms for row in rows), default=0.0), 3),
    }


def format_terminations(rows: Sequence[NodeTermination]) -> str:
    """Each participant's figures, from its own summary; its p99 only from P99_RUN_COUNT_MIN runs."""
    lines = [f"{'node':<6}{'terminations':>13}{'min ms':>9}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}"]
    for row in rows:
        p99 = f"{row.p99_ms:.2f}" if row.count >= P99_RUN_COUNT_MIN else "-"
        lines.append(f"{row.node:<6}{row.count:>13}{row.min_ms:>9.2f}{row.p50_ms:>9.2f}{p99:>9}{row.max_ms:>9.2f}")
    if any(row.count < P99_RUN_COUNT_MIN for row in rows):
        lines.append(f"p99 -: fewer than {P99_RUN_COUNT_MIN} runs, where it would only be the maximum")
    return "\n".join(lines)
