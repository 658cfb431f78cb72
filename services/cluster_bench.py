"""`cornus bench`: measure the commit protocols on your own storage. For each protocol it starts a
real local cluster (`cornus serve` processes on 127.0.0.1), runs distributed YCSB-like one-shot
transactions from concurrent clients for a fixed time, and prints throughput, client latency and
the nodes' own commit-path breakdown (prepare: until every vote is in; commit: until the caller
has its answer).

Every transaction touches `--partitions-per-txn` partitions and writes to each of them; its
operations alternate puts and gets over keys drawn uniformly from 2,000 per partition, so conflicts
exist but are rare (NO_WAIT aborts them; the abort count is printed).
"""

from __future__ import annotations

import random
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from cornus.protocol.config import Protocol
from cornus.runtime.keys import partition_of
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

SECONDS_MAX = 3600
CLIENTS_MAX = 256
OPS_PER_TXN_MAX = 64
HTTP_TIMEOUT_S = 15.0
READY_TIMEOUT_S = 60.0
# Keys per partition the generator picks from: enough that concurrent clients rarely collide.
KEYS_PER_PARTITION = 2_000
VALUE_BYTES = 100


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


def keys_by_partition(partition_count: int) -> dict[str, list[str]]:
    """A pool of keys per partition, so a transaction can aim at the partitions it wants."""
    pools: dict[str, list[str]] = {f"p{i}": [] for i in range(partition_count)}
    index = 0
    while min(len(pool) for pool in pools.values()) < KEYS_PER_PARTITION:
        key = f"k{index}"
        pools[partition_of(key, partition_count)].append(key)
        index += 1
    return pools


def _transaction(rng: random.Random, pools: dict[str, list[str]], partitions_per_txn: int,
                 ops_per_txn: int) -> list[dict[str, str]]:
    """Ops spread round-robin over the chosen partitions; each partition's first op is a put, so
    every touched partition is a participant (a distributed commit), then gets and puts alternate."""
    partitions = rng.sample(sorted(pools), partitions_per_txn)
    ops: list[dict[str, str]] = []
    for index in range(max(ops_per_txn, partitions_per_txn)):
        key = rng.choice(pools[partitions[index % partitions_per_txn]])
        if (index // partitions_per_txn) % 2 == 0:
            ops.append({"op": "put", "key": key, "value": "x" * VALUE_BYTES})
        else:
            ops.append({"op": "get", "key": key})
    return ops


def _run_clients(nodes: list[ClusterNode], seconds: float, clients: int, *, partitions_per_txn: int,
                 ops_per_txn: int, partition_count: int, result: ProtocolResult) -> None:
    pools = keys_by_partition(partition_count)
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds

    def client(index: int) -> None:
        rng = random.Random(index)
        with httpx.Client(timeout=HTTP_TIMEOUT_S) as http:
            while time.monotonic() < stop_at:
                node = nodes[rng.randrange(len(nodes))]
                ops = _transaction(rng, pools, partitions_per_txn, ops_per_txn)
                started = time.perf_counter()
                response = http.post(f"{node.url}/v1/execute", json={"ops": ops})
                elapsed_ms = (time.perf_counter() - started) * 1000
                outcome = response.json().get("outcome") if response.status_code in (200, 409, 202, 503) else None
                with lock:
                    if outcome == "committed":
                        result.committed += 1
                        result.latencies_ms.append(elapsed_ms)
                    elif outcome == "aborted":
                        result.aborted += 1
                    else:
                        result.other += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + 2 * HTTP_TIMEOUT_S)
    result.wall_s = time.monotonic() - started


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
                _run_clients(members, seconds, clients, partitions_per_txn=partitions_per_txn,
                             ops_per_txn=ops_per_txn, partition_count=partitions, result=result)
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


def format_results(results: list[ProtocolResult]) -> str:
    header = (f"{'protocol':<16} {'commits/s':>9} {'aborts':>6} {'p50 ms':>7} {'p99 ms':>7} | "
              f"{'node p50: execution':>19} {'prepare':>7} {'commit':>7} {'total':>7}")
    lines = [header]
    for r in results:
        latencies = sorted(r.latencies_ms)
        p50 = statistics.median(latencies) if latencies else 0.0
        p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] if latencies else 0.0
        b = r.breakdown
        lines.append(
            f"{r.protocol:<16} {r.committed / r.wall_s if r.wall_s else 0:>9.0f} {r.aborted:>6} {p50:>7.2f} "
            f"{p99:>7.2f} | {b.get('execution_p50', 0):>19.2f} {b.get('prepare_p50', 0):>7.2f} "
            f"{b.get('commit_p50', 0):>7.2f} {b.get('total_p50', 0):>7.2f}"
        )
    return "\n".join(lines)
