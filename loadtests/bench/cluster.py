"""One measurement of `cornus bench`: start a real local cluster (`cornus serve` processes on
127.0.0.1) for one protocol over the chosen storage, load the workload's data, run the closed-loop
driver for a fixed time, check the workload's invariants, and collect what a reader needs to trust
the numbers: the nodes' and the driver's CPU per committed transaction, storage calls by kind and
peer messages per transaction, the owners' cache hit ratio, and the mean storage write latency the
nodes saw (W in the paper's formulas).

All of these cover the measured window, the one throughput and latency cover: the nodes' /proc
CPU and /metrics counters are snapshot at the warm-up boundary (by the driver, on its own loop,
while the clients run) and at the run's end, and their difference is charged to the transactions
committed in between. After the run and its check, the nodes' CPU is read over IDLE_BASELINE_S (or
a fifth of a shorter run) with no clients, for the fixed background work a per-commit CPU figure also holds.
"""

from __future__ import annotations

import asyncio
import collections
import os
import time
from collections.abc import Collection, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx

from cornus.protocol.config import Protocol
from loadtests.bench.driver import DriverResult, load_data, read_keys, run_clients
from loadtests.bench.lifecycle import ClusterSpec, bench_cluster
from loadtests.workloads import make_workload
from services.local_cluster import ClusterNode
from storage_adapters.errors import ValidationError
from storage_adapters.factory import StoreConfig

T = TypeVar("T")

SECONDS_MAX = 3600
CLIENTS_MAX = 256
NODES_MAX = 16
PARTITIONS_MAX = 256
HTTP_TIMEOUT_S = 15.0
OWNERS_ATTEMPT_COUNT_MAX = 20
OWNERS_PAUSE_S = 0.25
# The nodes' CPU with no clients is read over this long after the run (a lease renewal or two), or
# a fifth of the run where that is shorter: a seconds-long smoke run (the test suite's) is not
# made several times longer by it.
IDLE_BASELINE_S = 2.0
IDLE_BASELINE_RUN_DIVISOR = 5
_CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True, slots=True)
class RunSettings:
    """What one measurement runs: the workload and its knobs, the cluster's shape, the load."""

    workload: str = "ycsb"
    knobs: tuple[tuple[str, Any], ...] = ()
    nodes: int = 3
    partitions: int = 3
    clients: int = 8
    seconds: float = 10.0
    route_to_owner: bool = True
    lock_policy: str = "no_wait"
    node_settings: tuple[str, ...] = ()  # --set NAME=VALUE for every node

    def validate(self) -> None:
        if not 0 < self.seconds <= SECONDS_MAX:
            raise ValidationError(f"--seconds must be in (0, {SECONDS_MAX}]")
        if not 0 < self.clients <= CLIENTS_MAX:
            raise ValidationError(f"--clients must be in 1..{CLIENTS_MAX}")
        if not 1 <= self.nodes <= NODES_MAX:
            raise ValidationError(f"--nodes must be in 1..{NODES_MAX}")
        if not self.nodes <= self.partitions <= PARTITIONS_MAX:
            raise ValidationError(f"--partitions must be in {self.nodes}..{PARTITIONS_MAX} (at least one per node)")
        if self.lock_policy not in ("no_wait", "wait_die"):
            raise ValidationError(f"--lock-policy must be no_wait or wait_die, got {self.lock_policy!r}")


@dataclass
class RunResult:
    protocol: str
    settings: RunSettings
    storage: str  # backend and injected latency, as the report names them
    driver: DriverResult
    warmup_s: float = 0.0
    keys_loaded: int = 0
    load_s: float = 0.0
    # Per committed transaction of the measured window (the load phase excluded):
    node_cpu_ms: float | None = None  # the node processes' own CPU time (None: not on Linux)
    # The node processes' CPU seconds per wall second over the measured window, and over
    # IDLE_BASELINE_S with no clients after the run (None: not on Linux, or not measured).
    node_cores: float | None = None
    node_idle_cores: float | None = None
    # The storage's own process on this machine: the emulator's writer, which runs every node's
    # writes (None: another backend, not on Linux, or the writer changed during the window).
    storage_cpu_ms: float | None = None
    client_cpu_ms: float = 0.0  # the driver (this process)
    storage_calls: dict[str, float] = field(default_factory=dict)  # by LogStore call
    peer_messages: float = 0.0
    cache_hit_ratio: float | None = None
    storage_mean_ms: dict[str, float] = field(default_factory=dict)  # mean latency per LogStore call, at the nodes
    violations: list[str] = field(default_factory=list)  # the workload's invariant check
    recovered_at_start: int = 0
    workload_knobs: dict[str, Any] = field(default_factory=dict)


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds `pid` has used, from /proc (None where there is no /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces; the fields after its closing parenthesis do not.
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS_PER_S


# How an emulator writer process shows in its command line (storage_adapters/emulator_writer.py).
_EMULATOR_WRITER_MODULE = b"storage_adapters.emulator_writer"


def emulator_writer_pids(parents: Collection[int]) -> list[int]:
    """The emulator writer processes that `parents` (the nodes) started, from /proc: found by
    their command line and parent, since the nodes' own CPU figure no longer holds their writes."""
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            arguments = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue  # gone meanwhile
        # Past the command name's closing parenthesis: state, then the parent's pid.
        if _EMULATOR_WRITER_MODULE in arguments and int(stat[stat.rindex(")") + 2:].split()[1]) in parents:
            found.append(int(entry))
    return sorted(found)


async def scrape_counts_async(http: httpx.AsyncClient, nodes: Sequence[ClusterNode]) -> collections.Counter[str]:
    """The work counters of every node summed over the cluster, from each node's /metrics (storage
    calls by kind and the seconds they took, transport messages, cache hits and misses), read from
    inside the driver's loop, which must keep serving its clients meanwhile."""
    totals: collections.Counter[str] = collections.Counter()
    for text in await asyncio.gather(*(_metrics_text(http, node) for node in nodes)):
        add_counts(totals, text)
    return totals


async def _metrics_text(http: httpx.AsyncClient, node: ClusterNode) -> str:
    return (await http.get(f"{node.url}/metrics")).text


def add_counts(totals: collections.Counter[str], text: str) -> None:
    """Add the work counters of one node's /metrics `text` to `totals`."""
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        if series.startswith("cornus_storage_call_seconds_count{"):
            totals["storage:" + _label(series, "call")] += int(float(value))
        elif series.startswith("cornus_storage_call_seconds_sum{"):
            totals["storage_ms:" + _label(series, "call")] += float(value) * 1000  # type: ignore[assignment]
        elif series.startswith("cornus_transport_events_total{"):
            totals["transport:" + _label(series, "event")] += int(float(value))
        elif series.startswith("cornus_node_events_total{"):
            totals["node:" + _label(series, "event")] += int(float(value))


def _label(series: str, name: str) -> str:
    start = series.index(f'{name}="') + len(name) + 2
    return series[start:series.index('"', start)]


def run_async(coroutine: Coroutine[object, object, T]) -> T:
    """On uvloop when installed: the driver's own cost per request is then lowest."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


def admin_headers() -> dict[str, str] | None:
    """What the admin endpoints and the partition listing ask of a node that has an admin token:
    the bench's nodes get theirs from its own environment (start_node hands it down), as nothing
    else of a run sets one."""
    token = os.environ.get("CORNUS_ADMIN_TOKEN")
    return {"Authorization": f"Bearer {token}"} if token else None


def owners(http: httpx.Client, nodes: Sequence[ClusterNode]) -> dict[str, int]:
    """Partition -> the index in `nodes` of the node that holds it now (from the ownership records,
    which a node reads from storage: a slow backend may answer 503 at first, so ask again)."""
    index_of = {node.config.node_id: index for index, node in enumerate(nodes)}
    headers = admin_headers()
    answer = None
    for attempt in range(OWNERS_ATTEMPT_COUNT_MAX):
        answer = http.get(f"{nodes[attempt % len(nodes)].url}/v1/partitions", headers=headers)
        if answer.status_code != 503:
            break
        time.sleep(OWNERS_PAUSE_S)
    assert answer is not None
    answer.raise_for_status()
    return {p["partition"]: index_of[p["owner"]] for p in answer.json()["partitions"] if p["owner"] in index_of}


def warmup_s_for(seconds: float) -> float:
    """The start of a run left out of its figures (connections opening, first lock-table and cache
    entries): a tenth of the run, at most 2 s."""
    return min(2.0, seconds / 10)


@dataclass
class WindowSnapshot:
    """What the nodes and the emulator's writer had used at one instant (`at_s`, time.monotonic()):
    CPU seconds per process (None: no /proc) and the nodes' work counters summed."""

    at_s: float
    node_cpu_s: list[float | None]
    storage_cpu_s: dict[int, float | None]
    counts: collections.Counter[str]


async def take_snapshot(http: httpx.AsyncClient, nodes: Sequence[ClusterNode], node_pids: Sequence[int],
                        writer_pids: Collection[int]) -> WindowSnapshot:
    """A WindowSnapshot, /proc first (instant) and then the counters (a few HTTP calls)."""
    at_s = time.monotonic()
    node_cpu = [process_cpu_s(pid) for pid in node_pids]
    storage_cpu = {pid: process_cpu_s(pid) for pid in writer_pids}
    return WindowSnapshot(at_s, node_cpu, storage_cpu, await scrape_counts_async(http, nodes))


def _cpu_spent_s(before: Sequence[float | None], after: Sequence[float | None]) -> float | None:
    pairs = list(zip(before, after, strict=True))
    if not pairs or any(b is None or a is None for b, a in pairs):
        return None
    return sum(a - b for b, a in pairs)  # type: ignore[operator]


def charge_window(result: RunResult, start: WindowSnapshot, end: WindowSnapshot) -> None:
    """Charge what the nodes, the emulator's writer and the driver used between `start` (the
    warm-up boundary) and `end` to the transactions committed in that window, those that
    throughput counts (started after the warm-up)."""
    committed = max(1, result.driver.committed(measured=True))
    window_s = max(end.at_s - start.at_s, 1e-9)
    counts = end.counts.copy()
    counts.subtract(start.counts)
    result.client_cpu_ms = 1000 * result.driver.measured_cpu_s / committed
    node_spent_s = _cpu_spent_s(start.node_cpu_s, end.node_cpu_s)
    if node_spent_s is not None:
        result.node_cpu_ms = 1000 * node_spent_s / committed
        result.node_cores = node_spent_s / window_s
    # The same writers at both ends, or the figure would miss one's work: then it is left blank.
    if start.storage_cpu_s and start.storage_cpu_s.keys() == end.storage_cpu_s.keys():
        pids = sorted(start.storage_cpu_s)
        spent = _cpu_spent_s([start.storage_cpu_s[pid] for pid in pids], [end.storage_cpu_s[pid] for pid in pids])
        if spent is not None:
            result.storage_cpu_ms = 1000 * spent / committed
    result.storage_calls = {name.removeprefix("storage:"): count / committed
                            for name, count in sorted(counts.items()) if name.startswith("storage:") and count}
    result.storage_mean_ms = {call: counts["storage_ms:" + call] / count for call, count in
                              ((name.removeprefix("storage:"), count) for name, count in counts.items()
                               if name.startswith("storage:") and count > 0)}
    result.peer_messages = counts["transport:messages_sent"] / committed
    hits, misses = counts["node:cache_hits"], counts["node:cache_misses"]
    result.cache_hit_ratio = hits / (hits + misses) if hits + misses else None


def idle_cores(node_pids: Sequence[int], seconds: float = IDLE_BASELINE_S) -> float | None:
    """The nodes' CPU seconds per wall second over `seconds` with no clients (None: no /proc)."""
    before, started = [process_cpu_s(pid) for pid in node_pids], time.monotonic()
    time.sleep(seconds)
    spent = _cpu_spent_s(before, [process_cpu_s(pid) for pid in node_pids])
    return None if spent is None else spent / (time.monotonic() - started)


def measure(nodes: Sequence[ClusterNode], protocol: Protocol, settings: RunSettings, storage: str) -> RunResult:
    """Load, run, check; charge the nodes' and the driver's CPU and the nodes' work counters of
    the measured window (from the warm-up boundary to the end) to the transactions committed in it."""
    workload = make_workload(settings.workload, settings.partitions, dict(settings.knobs))
    addresses = [("127.0.0.1", node.api_port) for node in nodes]
    result = RunResult(protocol.value, settings, storage, DriverResult(), warmup_s=warmup_s_for(settings.seconds),
                       workload_knobs=workload.describe())
    started = time.monotonic()
    result.keys_loaded = run_async(load_data(addresses, workload))
    result.load_s = time.monotonic() - started
    node_pids = [node.process.pid for node in nodes if node.process is not None]
    # Found once, before the run: a scan of /proc at the boundary would stall the clients' loop.
    writer_pids = emulator_writer_pids(node_pids)
    boundary: list[WindowSnapshot] = []

    async def run(home: dict[str, int] | None) -> tuple[DriverResult, WindowSnapshot]:
        async with httpx.AsyncClient(timeout=HTTP_TIMEOUT_S) as client:
            async def at_warmup() -> None:
                boundary.append(await take_snapshot(client, nodes, node_pids, writer_pids))

            driver = await run_clients(addresses, workload, seconds=settings.seconds, clients=settings.clients,
                                       home=home, warmup_s=result.warmup_s, on_warmup=at_warmup)
            end = await take_snapshot(client, nodes, node_pids, emulator_writer_pids(node_pids))
            return driver, end

    with httpx.Client(timeout=HTTP_TIMEOUT_S) as http:
        home = owners(http, nodes) if settings.route_to_owner else None
        result.driver, end = run_async(run(home))
    [start] = boundary
    # Recovery runs as a node starts, long before the boundary.
    result.recovered_at_start = start.counts["node:recovered"]
    charge_window(result, start, end)
    result.violations = workload.check(lambda keys: run_async(read_keys(addresses[0], keys)))
    result.node_idle_cores = idle_cores(node_pids, min(IDLE_BASELINE_S, settings.seconds / IDLE_BASELINE_RUN_DIVISOR))
    return result


def run_protocol(protocol: Protocol, storage: StoreConfig, storage_argv: list[str], settings: RunSettings, *,
                 storage_environ: Mapping[str, str] | None = None, run_index: int = 0, flush: bool = False,
                 keep_storage: bool = False, storage_label: str = "", logs_dir: Path | None = None) -> RunResult:
    """Start a cluster for `protocol` (loadtests.bench.lifecycle), measure it, stop it.
    `storage_environ` goes to the nodes' environment (secrets: their argv is visible to every
    user of the machine)."""
    settings.validate()
    spec = ClusterSpec(nodes=settings.nodes, partitions=settings.partitions, protocol=protocol, storage=storage,
                       storage_argv=storage_argv, settings=settings.node_settings,
                       environ={**(storage_environ or {}), "CORNUS_LOCK_POLICY": settings.lock_policy},
                       run_index=run_index, flush_redis=flush, keep_storage=keep_storage, logs_dir=logs_dir,
                       label=f"the {protocol.value} cluster")
    with bench_cluster(spec) as cluster:
        cluster.start()
        return measure(cluster.members, protocol, settings, storage_label or storage.backend)
