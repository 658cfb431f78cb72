"""Prometheus metrics of one node, served by the REST app at `/metrics`.

- `cornus_txn_phase_seconds{protocol,phase}`: where a commit's time goes (execution, prepare,
  commit, total), from the Outcome's timing_ms of every transaction that asked to commit.
- `cornus_txn_outcomes_total{protocol,outcome}` and `cornus_txn_aborts_total{protocol,reason}`.
- `cornus_in_doubt_transactions`: voted yes here, no decision known yet. Read at scrape time.
- `cornus_applying_transactions`: committed here, redo not in storage yet (retried until it is;
  its keys stay locked). Read at scrape time.
- `cornus_storage_call_seconds{backend,call}` and `cornus_storage_errors_total{backend,call,error}`:
  every LogStore call, measured by `InstrumentedStore`, which serve.py wraps around the store before
  the Node gets it, so protocol, recovery and data calls are all seen.
- `cornus_node_events_total{event}`: the Node's own counters (storage_unavailable, recovered,
  cache_hits, cache_misses, ...).
- `cornus_sweeper_events_total{event}`: what the node's sweepers (cornus.protocol.sweeper) did:
  records swept, skipped by reason (young, running, voted, ...), scans unanswered, pages that
  waited for the node's budget of sweeper calls, passes cut short by their page bound.
- `cornus_sweeper_backlog_records`: records older than the sweep age that the last pass of each
  log the node sweeps read and left (NodeCore.sweep_backlog_records): sweeping falls behind
  where it stays up, or where passes keep being cut short. Read at scrape time.
- `cornus_transport_events_total{event}`: frames and messages sent to and received from peers, and
  those a node addressed to itself (served in-process); `cornus bench` divides them by commits.

Each app gets its own CollectorRegistry: the global one would make a second app in one process (a
test) fail with duplicate series.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from cornus.runtime.node import Node
from cornus.runtime.outcome import Outcome
from services.api.logs import current_txn
from storage_adapters.contract import (
    IDENTITY_PAGE_COUNT_MAX,
    SCAN_PAGE_COUNT_MAX,
    Fence,
    LogId,
    LogOnceResult,
    Ownership,
    OwnerWriteResult,
    Record,
    RecordBody,
    ScanPage,
    Tombstone,
    TxnState,
)
from storage_adapters.store import DelegatingStore, LogStore

# From 100 us (a cached emulator read) to 10 s (a commit that waited out termination): the range
# between loopback storage and a slow cloud region, in roughly 2.5x steps.
LATENCY_BUCKETS_S = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)
PHASES = ("execution", "prepare", "commit", "total")
_storage_log = logging.getLogger("cornus.storage")

STORAGE_CALLS = (
    "log_once", "log", "read", "scan_unfinished", "scan_finished", "read_data", "apply_redo", "delete", "read_owners",
    "write_owner", "list_identities",
)


class Metrics:
    """The metric families of one node, in their own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._children: dict[tuple[str, str, str], Any] = {}  # (family, labels...) -> its labelled child
        self.txn_phase_seconds = LightHistogram(
            "cornus_txn_phase_seconds", "Commit-path time per phase of transactions that asked to commit",
            ("protocol", "phase"), LATENCY_BUCKETS_S,
        )
        self.registry.register(self.txn_phase_seconds)
        self.txn_outcomes = Counter(
            "cornus_txn_outcomes", "Coordinated transactions by outcome", ["protocol", "outcome"],
            registry=self.registry,
        )
        self.txn_aborts = Counter(
            "cornus_txn_aborts", "Aborted transactions by reason", ["protocol", "reason"], registry=self.registry,
        )
        self.in_doubt = Gauge(
            "cornus_in_doubt_transactions", "Transactions this node's partitions voted yes on, no decision yet",
            registry=self.registry,
        )
        self.applying = Gauge(
            "cornus_applying_transactions", "Committed transactions whose redo is not in storage yet (retried)",
            registry=self.registry,
        )
        self.ready = Gauge("cornus_ready", "1 once recovery has run", registry=self.registry)
        self.sweeper_backlog = Gauge(
            "cornus_sweeper_backlog_records",
            "Records older than the sweep age the last pass of each swept log read and left", registry=self.registry,
        )
        self.storage_call_seconds = LightHistogram(
            "cornus_storage_call_seconds", "LogStore call latency, errors included", ("backend", "call"),
            LATENCY_BUCKETS_S,
        )
        self.registry.register(self.storage_call_seconds)
        self.storage_errors = Counter(
            "cornus_storage_errors", "LogStore calls that raised, by exception type", ["backend", "call", "error"],
            registry=self.registry,
        )
        self._node: Node | None = None

    def bind(self, node: Node) -> None:
        """Observe `node`: its outcomes as they happen, its gauges and counters at scrape time."""
        assert self._node is None, "one Metrics per node"
        self._node = node
        node.outcome_observers.append(self.observe_outcome)
        self.in_doubt.set_function(node.in_doubt_count)
        self.applying.set_function(node.core.applying_count)
        self.ready.set_function(lambda: 1.0 if node.ready else 0.0)
        self.registry.register(_EventCounters("cornus_node_events", "The node runtime's event counters",
                                              lambda: node.counters))
        self.registry.register(_EventCounters("cornus_transport_events", "Frames and messages between the nodes",
                                              node.transport.counts))
        self.registry.register(_EventCounters("cornus_sweeper_events",
                                              "What the node's sweepers did: records swept, skipped by reason",
                                              lambda: node.core.sweep_counters))
        self.sweeper_backlog.set_function(node.core.sweep_backlog_records)
        self.registry.register(_EventCounters("cornus_storage_housekeeping",
                                              "The store's own background work (Azure: its tombstone sweep)",
                                              node.store.housekeeping_counts))

    def observe_outcome(self, protocol: str, outcome: Outcome) -> None:
        # `labels()` parses and checks its arguments on every call (some 3 us, five calls a
        # transaction); the label sets are few (protocols x statuses or phases), so each child is
        # looked up once and kept.
        children = self._children
        key = ("outcome", protocol, outcome.status.value)
        counter = children.get(key) or children.setdefault(key, self.txn_outcomes.labels(*key[1:]))
        counter.inc()
        if outcome.reason is not None:
            self.txn_aborts.labels(protocol, outcome.reason.value).inc()
        # Empty unless the transaction asked to commit: an abort during execution has no phases.
        for phase, elapsed_ms in outcome.timing_ms.items():
            assert elapsed_ms >= 0, (phase, elapsed_ms)
            key = ("phase", protocol, phase)
            histogram = children.get(key) or children.setdefault(key, self.txn_phase_seconds.labels(*key[1:]))
            histogram.observe(elapsed_ms / 1000)


class LightHistogram(Collector):
    """A histogram family for the event loop's own thread: a child's `observe` is one bisect and
    two additions. prometheus_client's Histogram takes a lock per counter and walks its buckets in
    Python (some 3 us an observation), and a transaction makes a dozen observations. Exposed as
    the same family (`_bucket`, `_count`, `_sum`), counts made cumulative at scrape time."""

    def __init__(self, name: str, documentation: str, labelnames: tuple[str, ...], buckets: Sequence[float]) -> None:
        assert list(buckets) == sorted(set(buckets)) and buckets and buckets[-1] != float("inf"), buckets
        self.name = name
        self.documentation = documentation
        self.labelnames = labelnames
        self.bounds = tuple(buckets)
        self._bounds_text = [floatToGoString(bound) for bound in self.bounds]
        self._children: dict[tuple[str, ...], _HistogramChild] = {}

    def labels(self, *values: str) -> _HistogramChild:
        assert len(values) == len(self.labelnames), (values, self.labelnames)
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = _HistogramChild(self.bounds)
        return child

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=list(self.labelnames))
        for values, child in list(self._children.items()):
            running = 0
            buckets = []
            for bound_text, count in zip([*self._bounds_text, "+Inf"], child.counts, strict=True):
                running += count
                buckets.append((bound_text, running))
            family.add_metric(list(values), buckets, child.sum)
        yield family

    def describe(self) -> Iterator[HistogramMetricFamily]:
        yield HistogramMetricFamily(self.name, self.documentation, labels=list(self.labelnames))


class _HistogramChild:
    """One label set's counts: `counts[i]` observations in (bounds[i-1], bounds[i]], the last +Inf."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, amount: float) -> None:
        # bisect_left: the first bound >= amount, so a value on a bound counts in that bound's
        # bucket (Prometheus buckets are "less than or equal").
        self.counts[bisect.bisect_left(self.bounds, amount)] += 1
        self.sum += amount


class _EventCounters(Collector):
    """A family of counters labelled by event, read from `read()` at scrape time."""

    def __init__(self, name: str, documentation: str, read: Callable[[], Mapping[str, int]]) -> None:
        self.name = name
        self.documentation = documentation
        self.read = read

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(self.name, self.documentation, labels=["event"])
        for event, count in sorted(self.read().items()):
            family.add_metric([event], count)
        yield family

    def describe(self) -> Iterator[CounterMetricFamily]:
        # Registration must not read the live counters (auto_describe would call collect()).
        yield CounterMetricFamily(self.name, self.documentation, labels=["event"])


class InstrumentedStore(DelegatingStore):
    """A LogStore that times every call and counts the ones that raise, then re-raises unchanged:
    the Node must see exactly what it would see without the wrapper."""

    def __init__(self, inner: LogStore, metrics: Metrics) -> None:
        super().__init__(inner)
        self._seconds = {call: metrics.storage_call_seconds.labels(inner.backend_name, call) for call in STORAGE_CALLS}
        self._errors = metrics.storage_errors
        self._logger = _storage_log

    def _done(self, call: str, started: float, error: BaseException | None, txn: str = "") -> None:
        self._seconds[call].observe(time.perf_counter() - started)
        if error is not None:
            self._errors.labels(self.backend_name, call, type(error).__name__).inc()
            # The store's txn argument names the transaction even when no handler set the context.
            self._logger.warning("storage %s %s failed: %s", self.backend_name, call, error,
                              extra={"txn": txn or current_txn.get()})

    async def log_once(
        self, log: LogId, txn: str, state: TxnState, body: RecordBody, fence: Fence | None = None
    ) -> LogOnceResult:
        started = time.perf_counter()
        try:
            result = await self.inner.log_once(log, txn, state, body, fence)
        except Exception as error:
            self._done("log_once", started, error, txn)
            raise
        self._done("log_once", started, None)
        return result

    async def log(
        self, log: LogId, txn: str, state: TxnState, body: RecordBody | None = None, fence: Fence | None = None
    ) -> TxnState:
        started = time.perf_counter()
        try:
            result = await self.inner.log(log, txn, state, body, fence)
        except Exception as error:
            self._done("log", started, error, txn)
            raise
        self._done("log", started, None)
        return result

    async def read(self, log: LogId, txn: str) -> Record | None:
        started = time.perf_counter()
        try:
            result = await self.inner.read(log, txn)
        except Exception as error:
            self._done("read", started, error, txn)
            raise
        self._done("read", started, None)
        return result

    async def scan_unfinished_page(self, log: LogId, limit: int = SCAN_PAGE_COUNT_MAX, after: str = "") -> ScanPage:
        started = time.perf_counter()
        try:
            result = await self.inner.scan_unfinished_page(log, limit, after)
        except Exception as error:
            self._done("scan_unfinished", started, error)
            raise
        self._done("scan_unfinished", started, None)
        return result

    async def scan_finished_page(self, log: LogId, limit: int = SCAN_PAGE_COUNT_MAX, after: str = "") -> ScanPage:
        started = time.perf_counter()
        try:
            result = await self.inner.scan_finished_page(log, limit, after)
        except Exception as error:
            self._done("scan_finished", started, error)
            raise
        self._done("scan_finished", started, None)
        return result

    async def read_data(self, partition: str, keys: Sequence[str]) -> dict[str, bytes | None]:
        started = time.perf_counter()
        try:
            result = await self.inner.read_data(partition, keys)
        except Exception as error:
            self._done("read_data", started, error)
            raise
        self._done("read_data", started, None)
        return result

    async def apply_redo(
        self, partition: str, txn: str, writes: Mapping[str, bytes | None], fence: Fence | None = None
    ) -> bool:
        started = time.perf_counter()
        try:
            applied = await self.inner.apply_redo(partition, txn, writes, fence)
        except Exception as error:
            self._done("apply_redo", started, error, txn)
            raise
        self._done("apply_redo", started, None)
        return applied

    async def delete(
        self, log: LogId, txn: str, fence: Fence | None = None, keep: Tombstone | None = None,
    ) -> bool:
        started = time.perf_counter()
        try:
            result = await self.inner.delete(log, txn, fence, keep)
        except Exception as error:
            self._done("delete", started, error, txn)
            raise
        self._done("delete", started, None)
        return result

    async def read_owners(self, partitions: Sequence[str]) -> dict[str, Ownership]:
        started = time.perf_counter()
        try:
            result = await self.inner.read_owners(partitions)
        except Exception as error:
            self._done("read_owners", started, error)
            raise
        self._done("read_owners", started, None)
        return result

    async def write_owner(self, expected: Ownership | None, new: Ownership) -> OwnerWriteResult:
        started = time.perf_counter()
        try:
            result = await self.inner.write_owner(expected, new)
        except Exception as error:
            self._done("write_owner", started, error)
            raise
        self._done("write_owner", started, None)
        return result

    async def list_identities(self, after: str = "", limit: int = IDENTITY_PAGE_COUNT_MAX) -> list[str]:
        started = time.perf_counter()
        try:
            result = await self.inner.list_identities(after, limit)
        except Exception as error:
            self._done("list_identities", started, error)
            raise
        self._done("list_identities", started, None)
        return result

    async def close(self) -> None:
        await self.inner.close()

