"""What an operator sees: Prometheus /metrics after real transactions, JSON log lines tagged with
transaction ids, /healthz and /readyz (503 until recovery has run)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.api.metrics import PHASES, InstrumentedStore, Metrics
from storage_adapters.contract import (
    LogId,
    Record,
    ScanPage,
)
from storage_adapters.errors import StorageUnavailable
from tests.api.conftest import API_PARTITION_COUNT, emulator_storage
from tests.cluster.harness import Cluster, keys_on, running_cluster
from tests.unused_store import UnusedStore

READY_POLL_TIMEOUT_S = 30.0
# In-doubt and applying transactions drain within this once the last commit's apply lands.
DRAIN_WAIT_S = 10.0
DRAIN_POLL_S = 0.05


def _samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Metric family name -> its samples (labels, value), as a Prometheus server would parse them."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def _value(samples: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    matching = [value for found, value in samples.get(name, []) if labels.items() <= found.items()]
    assert matching, f"no sample {name}{labels}; have {sorted(samples)}"
    return sum(matching)


Samples = dict[str, list[tuple[dict[str, str], float]]]


def _samples_once(cluster: Cluster, node: str, condition: Callable[[Samples], bool]) -> Samples:
    """The node's metrics once `condition` holds of them, polled up to DRAIN_WAIT_S (then the last)."""
    deadline = time.monotonic() + DRAIN_WAIT_S
    while True:
        found = _samples(cluster.get(node, "/metrics").text)
        if condition(found) or time.monotonic() > deadline:
            return found
        time.sleep(DRAIN_POLL_S)


def test_metrics_after_transactions(api_cluster: Cluster) -> None:
    keys = [keys_on(f"p{p}", API_PARTITION_COUNT, 1, prefix="metrics-")[0] for p in range(API_PARTITION_COUNT)]
    commit_count = 5
    for round_index in range(commit_count):
        response = api_cluster.execute("n0", [{"op": "put", "key": k, "value": str(round_index)} for k in keys])
        assert response.status_code == 200, response.text
    txn = api_cluster.post("n0", "/v1/txn").json()["txn"]
    assert api_cluster.post("n0", f"/v1/txn/{txn}/abort").status_code == 409
    holder = api_cluster.post("n0", "/v1/txn").json()["txn"]
    assert api_cluster.post("n0", f"/v1/txn/{holder}/write", {"writes": {keys[0]: "held"}}).status_code == 200
    conflicted = api_cluster.execute("n0", [{"op": "put", "key": keys[0], "value": "loser"}])
    assert conflicted.status_code == 409 and conflicted.json()["reason"] == "conflict", conflicted.text
    assert api_cluster.post("n0", f"/v1/txn/{holder}/commit").status_code == 200

    # A key never read before misses the owner's cache: n0 owns p0, so it reads storage.
    unseen = keys_on("p0", API_PARTITION_COUNT, 1, prefix=f"metrics-unseen-{time.time_ns()}-")[0]
    assert api_cluster.read("n0", [unseen]) == {unseen: None}

    response = api_cluster.get("n0", "/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    samples = _samples(response.text)
    for phase in PHASES:
        assert _value(samples, "cornus_txn_phase_seconds_count", protocol="cornus", phase=phase) >= commit_count + 1
        assert _value(samples, "cornus_txn_phase_seconds_bucket", protocol="cornus", phase=phase, le="+Inf") >= 1
    assert _value(samples, "cornus_txn_outcomes_total", protocol="cornus", outcome="committed") >= commit_count + 1
    assert _value(samples, "cornus_txn_outcomes_total", protocol="cornus", outcome="aborted") >= 2
    assert _value(samples, "cornus_txn_aborts_total", protocol="cornus", reason="client") >= 1
    assert _value(samples, "cornus_txn_aborts_total", protocol="cornus", reason="conflict") >= 1
    # Both drain once the last commit's decision and apply have landed, which the commit's reply
    # does not wait for (its apply is in the emulator's write queue behind the other node's writes).
    drained = _samples_once(api_cluster, "n0", lambda found: _value(found, "cornus_in_doubt_transactions") == 0
                            and _value(found, "cornus_applying_transactions") == 0)
    assert _value(drained, "cornus_in_doubt_transactions") == 0
    assert _value(drained, "cornus_applying_transactions") == 0
    assert _value(samples, "cornus_ready") == 1
    for call in ("log_once", "read_data", "apply_redo", "scan_unfinished"):
        assert _value(samples, "cornus_storage_call_seconds_count", backend="emulator", call=call) >= 1, call
    assert _value(samples, "cornus_node_events_total", event="outcome_committed") >= commit_count + 1
    # The other node was a participant: its storage calls are its own, and it coordinated nothing.
    other = _samples(api_cluster.get("n1", "/metrics").text)
    assert _value(other, "cornus_storage_call_seconds_count", backend="emulator", call="log_once") >= commit_count


class _FlakyStore(UnusedStore):
    """Reads fail with StorageUnavailable; everything else is not reached by the test."""

    backend_name = "flaky"

    def __init__(self) -> None:
        super().__init__(timeout_ms_call=1_000)

    async def _read(self, log: LogId, txn: str) -> Record | None:
        raise StorageUnavailable("flaky: no answer within 1 ms")

    async def _scan_page(self, log: LogId, limit: int, after: str) -> ScanPage:
        return ScanPage((), None)

    async def _read_data(self, partition: str, keys: tuple[str, ...]) -> dict[str, bytes | None]:
        return dict.fromkeys(keys)


def test_instrumented_store_counts_errors_by_type_and_reraises_them() -> None:
    metrics = Metrics()
    store = InstrumentedStore(_FlakyStore(), metrics)

    async def calls() -> None:
        assert await store.read_data("p0", ["a", "b"]) == {"a": None, "b": None}
        for _ in range(3):
            with pytest.raises(StorageUnavailable, match="flaky"):
                await store.read(LogId.partition("p0"), "t1")

    asyncio.run(calls())
    registry = metrics.registry
    labels = {"backend": "flaky", "call": "read"}
    assert registry.get_sample_value("cornus_storage_errors_total", {**labels, "error": "StorageUnavailable"}) == 3
    assert registry.get_sample_value("cornus_storage_call_seconds_count", labels) == 3
    assert registry.get_sample_value("cornus_storage_call_seconds_count", {**labels, "call": "read_data"}) == 1
    assert registry.get_sample_value("cornus_storage_errors_total", {**labels, "call": "read_data",
                                                                      "error": "StorageUnavailable"}) is None


def _log_lines(path: Path) -> list[dict[str, object]]:
    lines = path.read_text().splitlines()
    assert lines, f"{path} is empty"
    parsed = []
    for line in lines:
        try:
            parsed.append(json.loads(line))
        except json.JSONDecodeError:
            raise AssertionError(f"not a JSON log line: {line!r}") from None
    return parsed


def test_log_lines_are_json_and_carry_the_txn(api_cluster: Cluster) -> None:
    key = keys_on("p2", API_PARTITION_COUNT, 1, prefix="logs-")[0]
    committed = api_cluster.execute("n0", [{"op": "put", "key": key, "value": "v"}]).json()["txn"]
    aborted = api_cluster.post("n0", "/v1/txn").json()["txn"]
    assert api_cluster.post("n0", f"/v1/txn/{aborted}/write", {"writes": {key: "never"}}).status_code == 200
    assert api_cluster.post("n0", f"/v1/txn/{aborted}/abort").status_code == 409
    rejected = api_cluster.post("n0", "/v1/txn").json()["txn"]
    assert api_cluster.post("n0", f"/v1/txn/{rejected}/read", {"keys": []}).status_code == 422

    log_path = api_cluster.nodes["n0"].log_path
    assert log_path is not None
    expected = {committed: "committed", aborted: "aborted", rejected: "422"}

    def found(lines: list[dict[str, object]]) -> set[str]:
        return {txn for txn, word in expected.items()
                if any(line.get("txn") == txn and word in str(line["msg"]) for line in lines)}

    deadline = time.monotonic() + READY_POLL_TIMEOUT_S
    while True:  # the node's writer thread writes its lines a moment after the calls
        lines = _log_lines(log_path)
        if found(lines) == set(expected) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for line in lines:
        assert {"ts", "level", "logger", "msg", "node"} <= line.keys(), line
        assert line["node"] == "n0", line
    assert found(lines) == set(expected), {txn: expected[txn] for txn in set(expected) - found(lines)}
    # Any line that names one of these transactions says which in its txn field.
    for line in lines:
        for txn in (committed, aborted, rejected):
            if txn in str(line["msg"]):
                assert line.get("txn") == txn, line


def test_healthz_and_readyz(api_cluster: Cluster) -> None:
    health = api_cluster.get("n1", "/healthz")
    assert health.status_code == 200
    assert {**health.json(), "now_unix_ms": 0} == {"status": "ok", "node": "n1", "protocol": "cornus", "now_unix_ms": 0,
                                                   "client_txn_age_ms_max": 1_000}
    ready = api_cluster.get("n1", "/readyz")
    # n1 serves the partitions it prefers (round-robin over n0, n1, ...), and was never deposed.
    serving = [f"p{i}" for i in range(API_PARTITION_COUNT) if i % len(api_cluster.nodes) == 1]
    assert ready.status_code == 200 and ready.json() == {
        "ready": True, "node": "n1", "in_doubt": 0, "serving": serving, "deposed": 0, "fenced_writes": 0,
    }


def test_published_openapi_and_docs(api_cluster: Cluster) -> None:
    assert api_cluster.get("n0", "/docs").status_code == 200
    schema = api_cluster.get("n0", "/openapi.json").json()
    execute = schema["paths"]["/v1/execute"]["post"]
    examples = execute["requestBody"]["content"]["application/json"]["examples"]
    assert examples["put"]["value"] == {"ops": [{"op": "put", "key": "k", "value": "v"}]}
    assert {"200", "202", "400", "409", "413", "422", "503"} <= execute["responses"].keys()
    assert schema["components"]["schemas"]["ExecuteIn"]["properties"]["ops"]["maxItems"] == 1_000


def test_readyz_is_503_until_recovery_has_run(tmp_path: Path) -> None:
    with running_cluster("cornus", emulator_storage(tmp_path / "c.db"), node_count=1, partition_count=2) as cluster:
        cluster.start("n0", wait=False)
        seen: list[int] = []
        deadline = time.monotonic() + READY_POLL_TIMEOUT_S
        while not seen or seen[-1] != 200:
            assert time.monotonic() < deadline, f"never ready; saw {seen}\n{cluster.log('n0')}"
            try:
                response = cluster.get("n0", "/readyz")
            except httpx.TransportError:
                time.sleep(0.02)  # not listening yet
                continue
            if response.status_code == 503:
                assert response.json()["ready"] is False
                # Liveness is independent of readiness: a recovering node is alive.
                assert cluster.get("n0", "/healthz").status_code == 200
            seen.append(response.status_code)
            time.sleep(0.02)
        # Recovery waits out one storage deadline (2 s here) before it scans, so the REST server,
        # which starts at once, answers 503 first.
        assert 503 in seen and set(seen) <= {200, 503}, seen


class _SweepingStore(UnusedStore):
    """A store whose own background work has done something (as Azure's tombstone sweep does)."""

    counts = {"tombstones_swept": 7, "tombstones_left_to_lifecycle_rule": 1}

    def housekeeping_counts(self) -> Mapping[str, int]:
        return dict(self.counts)


def test_the_store_s_housekeeping_counts_are_exported_as_they_are_at_scrape_time() -> None:
    """Azure's tombstone sweep runs beside the transactions; an operator sees it fall behind (its
    deletes refused, or more tombstones than it tracks) only through these counters."""
    metrics = Metrics()
    store = _SweepingStore(timeout_ms_call=1_000)
    backlog = [4]
    node = SimpleNamespace(
        outcome_observers=[], in_doubt_count=lambda: 0, ready=True,
        core=SimpleNamespace(applying_count=lambda: 0, sweep_counters={"swept": 2},
                             sweep_backlog_records=lambda: backlog[0]),
        counters={}, transport=SimpleNamespace(counts=dict), store=InstrumentedStore(store, metrics),
    )
    metrics.bind(node)  # type: ignore[arg-type]
    family = "cornus_storage_housekeeping_total"
    assert metrics.registry.get_sample_value(family, {"event": "tombstones_swept"}) == 7
    store.counts = {"tombstones_swept": 9, "tombstones_left_to_lifecycle_rule": 1}
    assert metrics.registry.get_sample_value(family, {"event": "tombstones_swept"}) == 9
    assert metrics.registry.get_sample_value(family, {"event": "tombstones_left_to_lifecycle_rule"}) == 1
    # The node's sweepers (cornus.protocol.sweeper), likewise read at scrape time.
    assert metrics.registry.get_sample_value("cornus_sweeper_events_total", {"event": "swept"}) == 2
    node.core.sweep_counters = {"swept": 5, "skipped_young": 3}
    assert metrics.registry.get_sample_value("cornus_sweeper_events_total", {"event": "skipped_young"}) == 3
    # And the records their last passes left, old enough to go (NodeCore.sweep_backlog_records).
    assert metrics.registry.get_sample_value("cornus_sweeper_backlog_records") == 4
    backlog[0] = 0
    assert metrics.registry.get_sample_value("cornus_sweeper_backlog_records") == 0

