"""`cornus bench`: measure the commit protocols on your own storage. For each protocol it starts a
real local cluster (`cornus serve` processes on 127.0.0.1), runs distributed YCSB-like one-shot
transactions from concurrent clients for a fixed time, and prints throughput, client latency and
the nodes' own commit-path breakdown (prepare: until every vote is in; commit: until the caller
has its answer).

Every transaction touches `--partitions-per-txn` partitions and writes to each of them; its
operations alternate puts and gets over keys drawn uniformly from 2,000 per partition, so conflicts
exist but are rare (NO_WAIT aborts them; the abort count is printed). Every key is written once
before the clock starts (a YCSB-style load phase), so the owners serve reads from memory as the
paper's nodes do; the cache hit ratio printed says whether they did.

Beside throughput and latency it prints, per committed transaction of the measured window, the CPU
time of the node processes and of the load generator (each process's own CPU clock), the storage
calls by kind and the messages that crossed a socket between nodes (from the nodes' /metrics).
"""

from __future__ import annotations

import asyncio
import collections
import os
import statistics
import tempfile
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import httpx

from cornus.protocol.config import Protocol
from services.bench_load import keys_by_partition, load_keys, run_clients
from services.local_cluster import (
    ClusterNode,
    StopSignals,
    local_members,
    start_node,
    stop_nodes,
    wait_cluster_ready,
)
from storage_adapters.errors import ValidationError
from storage_adapters.factory import StoreConfig

T = TypeVar("T")

SECONDS_MAX = 3600
CLIENTS_MAX = 256
OPS_PER_TXN_MAX = 64
HTTP_TIMEOUT_S = 15.0
READY_TIMEOUT_S = 60.0
_CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass
class ProtocolResult:
    protocol: str
    committed: int = 0
    aborted: int = 0
    other: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    breakdown: dict[str, float] = field(default_factory=dict)
    termination: dict[str, float] = field(default_factory=dict)
    # Per committed transaction, over the measured window (the load phase excluded):
    node_cpu_ms: float | None = None  # the node processes' own CPU time (None: not on Linux)
    client_cpu_ms: float = 0.0  # this process, the load generator
    storage_calls: dict[str, float] = field(default_factory=dict)  # by LogStore call
    peer_messages: float = 0.0  # messages and responses that crossed a socket between nodes
    cache_hit_ratio: float | None = None  # reads the owners served from memory
    keys_loaded: int = 0
    # Unfinished transactions an earlier run left in this storage, which the nodes recovered at
    # start: their clean-up (garbage collection) then runs inside the measured window.
    recovered_at_start: int = 0


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds `pid` has used, from /proc (None where there is no /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces; the fields after its closing parenthesis do not.
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS_PER_S


def scrape_counts(http: httpx.Client, nodes: list[ClusterNode]) -> collections.Counter[str]:
    """The work counters of every node summed over the cluster: storage calls by kind, transport
    messages, cache hits and misses (read from each node's /metrics)."""
    totals: collections.Counter[str] = collections.Counter()
    for node in nodes:
        for line in http.get(f"{node.url}/metrics").text.splitlines():
            if line.startswith("#"):
                continue
            series, _, value = line.rpartition(" ")
            if series.startswith("cornus_storage_call_seconds_count{"):
                totals["storage:" + _label(series, "call")] += int(float(value))
            elif series.startswith("cornus_transport_events_total{"):
                totals["transport:" + _label(series, "event")] += int(float(value))
            elif series.startswith("cornus_node_events_total{"):
                totals["node:" + _label(series, "event")] += int(float(value))
    return totals


def _label(series: str, name: str) -> str:
    start = series.index(f'{name}="') + len(name) + 2
    return series[start:series.index('"', start)]


def _address(node: ClusterNode) -> tuple[str, int]:
    return "127.0.0.1", node.api_port


def _measure(nodes: list[ClusterNode], seconds: float, clients: int, *, partitions_per_txn: int,
             ops_per_txn: int, partition_count: int, result: ProtocolResult, route_to_owner: bool) -> None:
    """Load the keys, then run the clients for `seconds`, and charge the nodes' and the
    generator's CPU and the nodes' work counters of that window to its committed transactions."""
    pools = keys_by_partition(partition_count)
    addresses = [_address(node) for node in nodes]
    result.keys_loaded = _run_async(load_keys(addresses, pools))
    with httpx.Client(timeout=HTTP_TIMEOUT_S) as http:
        home = _owners(http, nodes) if route_to_owner else None
        counts_before = scrape_counts(http, nodes)
        node_cpu_before = [process_cpu_s(node.process.pid) for node in nodes if node.process is not None]
        client_cpu_before = time.process_time()
        load = _run_async(run_clients(addresses, pools, seconds=seconds, clients=clients,
                                      partitions_per_txn=partitions_per_txn, ops_per_txn=ops_per_txn, home=home))
        client_cpu_s = time.process_time() - client_cpu_before
        node_cpu_after = [process_cpu_s(node.process.pid) for node in nodes if node.process is not None]
        counts = scrape_counts(http, nodes)
    result.recovered_at_start = counts_before["node:recovered"]
    counts.subtract(counts_before)
    result.committed, result.aborted, result.other = load.committed, load.aborted, load.other
    result.latencies_ms, result.wall_s = load.latencies_ms, load.wall_s
    committed = max(load.committed, 1)
    result.client_cpu_ms = 1000 * client_cpu_s / committed
    pairs = list(zip(node_cpu_before, node_cpu_after, strict=True))
    if all(before is not None and after is not None for before, after in pairs):
        result.node_cpu_ms = 1000 * sum(after - before for before, after in pairs) / committed  # type: ignore[operator]
    result.storage_calls = {name.removeprefix("storage:"): count / committed
                            for name, count in sorted(counts.items()) if name.startswith("storage:") and count}
    result.peer_messages = counts["transport:messages_sent"] / committed
    hits, misses = counts["node:cache_hits"], counts["node:cache_misses"]
    result.cache_hit_ratio = hits / (hits + misses) if hits + misses else None


def _owners(http: httpx.Client, nodes: list[ClusterNode]) -> dict[str, int]:
    """Partition -> the index in `nodes` of the node that holds it now (from the ownership records)."""
    index_of = {node.config.node_id: index for index, node in enumerate(nodes)}
    answer = http.get(f"{nodes[0].url}/v1/partitions")
    answer.raise_for_status()
    return {p["partition"]: index_of[p["owner"]] for p in answer.json()["partitions"] if p["owner"] in index_of}


def _run_async(coroutine: Coroutine[object, object, T]) -> T:
    """On uvloop when installed: the generator's own cost per request is then lowest."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


def _merge_breakdowns(nodes: list[ClusterNode], protocol: str) -> tuple[dict[str, float], dict[str, float]]:
    """The coordinators' own p50s, weighted by how many transactions each coordinated."""
    merged: dict[str, float] = {}
    total = 0.0
    termination: dict[str, float] = {}
    with httpx.Client(timeout=HTTP_TIMEOUT_S) as http:
        for node in nodes:
            summary = http.get(f"{node.url}/v1/admin/timings").json()
            stats = summary.get(protocol)
            if stats:
                count = stats["count"]
                total += count
                for name, value in stats.items():
                    if name.endswith("_p50"):
                        merged[name] = merged.get(name, 0.0) + value * count
            if "termination" in summary:
                termination = summary["termination"]
    return ({name: value / total for name, value in merged.items()} if total else {}), termination


def run_bench(
    protocols: list[Protocol],
    storage: StoreConfig,
    storage_argv: list[str],
    *,
    nodes: int,
    partitions: int,
    seconds: float,
    clients: int,
    partitions_per_txn: int,
    ops_per_txn: int,
    settings: list[str],
    route_to_owner: bool = True,
) -> list[ProtocolResult]:
    if not 0 < seconds <= SECONDS_MAX:
        raise ValidationError(f"--seconds must be in (0, {SECONDS_MAX}]")
    if not 0 < clients <= CLIENTS_MAX:
        raise ValidationError(f"--clients must be in 1..{CLIENTS_MAX}")
    if not 0 < ops_per_txn <= OPS_PER_TXN_MAX:
        raise ValidationError(f"--ops-per-txn must be in 1..{OPS_PER_TXN_MAX}")
    if not 1 <= partitions_per_txn <= partitions:
        raise ValidationError(f"--partitions-per-txn must be in 1..{partitions} (the partition count)")
    results = []
    for protocol in protocols:
        with tempfile.TemporaryDirectory(prefix="cornus-bench-") as directory:
            data = Path(directory)
            argv = list(storage_argv) + namespace_argv(storage, protocol, data)
            members, peers = local_members(nodes, protocol, partitions, data)
            stop = StopSignals()
            try:
                for member in members:
                    start_node(member, peers, argv, settings)
                if not wait_cluster_ready(members, stop, READY_TIMEOUT_S):
                    raise RuntimeError(f"the {protocol} cluster did not start")
                result = ProtocolResult(protocol.value)
                _measure(members, seconds, clients, partitions_per_txn=partitions_per_txn,
                         ops_per_txn=ops_per_txn, partition_count=partitions, result=result,
                         route_to_owner=route_to_owner)
                result.breakdown, result.termination = _merge_breakdowns(members, protocol.value)
                results.append(result)
            finally:
                stop_nodes(members, stop)
    return results


def namespace_argv(storage: StoreConfig, protocol: Protocol, data: Path) -> list[str]:
    """Each protocol runs on storage of its own, so what one run leaves behind (records that wait
    for garbage collection, data) never weighs on the next protocol's measurement."""
    index = list(Protocol).index(protocol)
    if storage.backend == "emulator":
        return ["--emulator-path", str(data / "cornus.db")]
    if storage.backend == "redis":
        base, _, db = storage.redis_url.rpartition("/")
        if not db.isdigit():
            raise ValidationError("bench on redis needs a URL ending in a database number, e.g. redis://host:6379/0; "
                                  "the protocols use that database and the next two")
        return ["--redis-url", f"{base}/{int(db) + index}"]
    if storage.backend == "azure_blob":
        return ["--azure-container", f"{storage.azure_container}-{protocol.value.replace('-', '')}"]
    return ["--dynamodb-table", f"{storage.dynamodb_table}-{protocol.value}"]


def _p50(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def format_results(results: list[ProtocolResult]) -> str:
    header = (f"{'protocol':<16} {'commits/s':>9} {'aborts':>6} {'p50 ms':>7} {'p99 ms':>7} | "
              f"{'node p50: execution':>19} {'prepare':>7} {'commit':>7} {'total':>7}")
    lines = [header]
    for r in results:
        latencies = sorted(r.latencies_ms)
        p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] if latencies else 0.0
        b = r.breakdown
        lines.append(
            f"{r.protocol:<16} {r.committed / r.wall_s if r.wall_s else 0:>9.0f} {r.aborted:>6} "
            f"{_p50(latencies):>7.2f} {p99:>7.2f} | {b.get('execution_p50', 0):>19.2f} "
            f"{b.get('prepare_p50', 0):>7.2f} {b.get('commit_p50', 0):>7.2f} {b.get('total_p50', 0):>7.2f}"
        )
    lines += ["", "per committed transaction (measured window; the nodes' and this generator's own CPU time):",
              f"{'protocol':<16} {'node CPU ms':>11} {'client CPU ms':>13} {'storage calls':>13} "
              f"{'peer msgs':>9} {'cache hits':>10}"]
    for r in results:
        node_cpu = f"{r.node_cpu_ms:.2f}" if r.node_cpu_ms is not None else "n/a"
        hits = f"{100 * r.cache_hit_ratio:.1f}%" if r.cache_hit_ratio is not None else "n/a"
        lines.append(f"{r.protocol:<16} {node_cpu:>11} {r.client_cpu_ms:>13.2f} {sum(r.storage_calls.values()):>13.2f} "
                     f"{r.peer_messages:>9.2f} {hits:>10}")
    for r in results:
        calls = ", ".join(f"{call} {count:.2f}" for call, count in r.storage_calls.items())
        lines.append(f"  storage calls of {r.protocol}: {calls or 'none'} ({r.keys_loaded} keys loaded first)")
    for r in results:
        if r.recovered_at_start:
            lines.append(f"  note: the {r.protocol} nodes recovered {r.recovered_at_start} unfinished transactions "
                         "that an earlier run left in this storage; their clean-up ran during the measurement "
                         "(start from empty storage for clean figures)")
    by_name = {r.protocol: r for r in results}
    cornus, two_pc = by_name.get(Protocol.CORNUS.value), by_name.get(Protocol.TWO_PC.value)
    if cornus and two_pc and _p50(cornus.latencies_ms) and cornus.breakdown.get("total_p50"):
        commit_path = {name: r.breakdown.get("prepare_p50", 0) + r.breakdown.get("commit_p50", 0)
                       for name, r in by_name.items()}
        lines.append(
            f"2PC/Cornus: client p50 {_p50(two_pc.latencies_ms) / _p50(cornus.latencies_ms):.2f}x, "
            f"node total p50 {two_pc.breakdown.get('total_p50', 0) / cornus.breakdown['total_p50']:.2f}x, "
            f"commit path (prepare + commit) p50 "
            f"{commit_path[two_pc.protocol] / max(commit_path[cornus.protocol], 1e-9):.2f}x")
    return "\n".join(lines)
