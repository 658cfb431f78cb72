"""`cornus storage-bench`: p50/p99 latency and throughput of `log_once` on each storage backend.

Two runs per backend: one caller at a time (the latency a single commit sees), then many
concurrent callers (what one process can push). Every call writes a fresh record, as a vote does.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass, replace

from storage_adapters.contract import LogId, RecordBody, TxnState
from storage_adapters.factory import StoreConfig, open_store
from storage_adapters.store import LogStore

OPS_MAX = 1_000_000
CONCURRENCY_MAX = 1024
WARM_UP_OPS = 20
REDO_BYTES = 100  # a small YCSB-like redo: a couple of 50-byte writes


@dataclass(frozen=True, slots=True)
class BenchResult:
    backend: str
    latency: str
    concurrency: int
    ops: int
    p50_ms: float
    p99_ms: float
    ops_per_s: float


def _percentile(sorted_ms: list[float], fraction: float) -> float:
    assert sorted_ms and 0 <= fraction <= 1
    return sorted_ms[min(len(sorted_ms) - 1, int(fraction * len(sorted_ms)))]


async def _run(store: LogStore, log: LogId, ops: int, concurrency: int, tag: str) -> tuple[list[float], float]:
    body = RecordBody((log.name, "peer"), "bench-node", b"r" * REDO_BYTES)
    latencies_ms: list[float] = []
    next_op = 0

    async def caller() -> None:
        nonlocal next_op
        while next_op < ops:
            op = next_op
            next_op += 1
            started = time.perf_counter()
            result = await store.log_once(log, f"{tag}-{op}", TxnState.VOTE_YES, body)
            latencies_ms.append((time.perf_counter() - started) * 1000)
            assert result.created, "every benchmark txn id is fresh"

    started = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(min(concurrency, ops))))
    return sorted(latencies_ms), time.perf_counter() - started


async def bench_backend(config: StoreConfig, ops: int, concurrency: int) -> list[BenchResult]:
    assert 0 < ops <= OPS_MAX and 0 < concurrency <= CONCURRENCY_MAX
    store = await open_store(config)
    run_id = uuid.uuid4().hex[:8]
    log = LogId.partition(f"bench-{run_id}")
    results = []
    try:
        await _run(store, log, WARM_UP_OPS, 1, f"warm-{run_id}")
        for level in sorted({1, concurrency}):
            latencies_ms, wall_s = await _run(store, log, ops, level, f"c{level}-{run_id}")
            results.append(
                BenchResult(
                    backend=config.backend,
                    latency=config.latency or "none",
                    concurrency=level,
                    ops=len(latencies_ms),
                    p50_ms=statistics.median(latencies_ms),
                    p99_ms=_percentile(latencies_ms, 0.99),
                    ops_per_s=len(latencies_ms) / wall_s,
                )
            )
    finally:
        await store.close()
    return results


def format_results(results: list[BenchResult]) -> str:
    lines = [f"{'backend':<11} {'injected':<16} {'conc':>4} {'ops':>7} {'p50 ms':>8} {'p99 ms':>8} {'ops/s':>9}"]
    for r in results:
        lines.append(
            f"{r.backend:<11} {r.latency:<16} {r.concurrency:>4} {r.ops:>7} {r.p50_ms:>8.3f} {r.p99_ms:>8.3f} "
            f"{r.ops_per_s:>9.0f}"
        )
    return "\n".join(lines)


async def run_storage_bench(configs: list[StoreConfig], ops: int, concurrency: int) -> list[BenchResult]:
    results: list[BenchResult] = []
    for config in configs:
        if config.backend == "emulator" and config.emulator_path == StoreConfig().emulator_path:
            # The default path is for real use; a benchmark must not leave thousands of rows in it.
            with tempfile.TemporaryDirectory(prefix="cornus-bench-") as directory:
                path = os.path.join(directory, "bench.db")
                results += await bench_backend(replace(config, emulator_path=path), ops, concurrency)
        else:
            results += await bench_backend(config, ops, concurrency)
    return results
