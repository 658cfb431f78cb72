"""The commit protocol is chosen per transaction: on one cluster (default Cornus), transactions of
all three protocols commit side by side, each runs its own protocol (its storage writes show it),
and they share one lock table."""

from __future__ import annotations

import pytest

from tests.api.conftest import API_PARTITION_COUNT
from tests.api.test_observability import _samples, _value
from tests.cluster.harness import Cluster, keys_on

PROTOCOL_TAGS = {"cornus": "cornus", "2pc": "2pc", "coordinator-log": "clog"}


def _store_calls(cluster: Cluster, node_id: str, call: str) -> float:
    samples = _samples(cluster.get(node_id, "/metrics").text)
    found = [value for labels, value in samples.get("cornus_storage_call_seconds_count", []) if labels["call"] == call]
    return sum(found)


def _owned_by_n1(count: int, prefix: str) -> list[str]:
    # p1 and p3 belong to n1 (round-robin over sorted node ids), so n0 only coordinates them.
    return [keys_on(f"p{p}", API_PARTITION_COUNT, 1, prefix=f"{prefix}{i}-")[0] for i in range(count) for p in (1, 3)]


@pytest.mark.parametrize("protocol", ["cornus", "2pc", "coordinator-log"])
def test_each_protocol_runs_per_transaction(api_cluster: Cluster, protocol: str) -> None:
    keys = _owned_by_n1(1, f"choice-{protocol}-")
    logs_before = _store_calls(api_cluster, "n0", "log")
    log_onces_before = _store_calls(api_cluster, "n0", "log_once")

    response = api_cluster.execute("n0", [{"op": "put", "key": k, "value": protocol} for k in keys], protocol)
    assert response.status_code == 200 and response.json()["outcome"] == "committed", response.text
    txn = response.json()["txn"]
    assert txn.endswith("." + PROTOCOL_TAGS[protocol]), txn
    assert api_cluster.get("n1", f"/v1/txn/{txn}").json()["outcome"] == "committed"
    assert api_cluster.read("n1", keys) == dict.fromkeys(keys, protocol)

    # n0 owns none of the keys, so its own writes are the coordinator's: Cornus logs nothing
    # there, 2PC logs its decision, coordinator-log its participants' redo and its decision.
    logs = _store_calls(api_cluster, "n0", "log") - logs_before
    assert _store_calls(api_cluster, "n0", "log_once") == log_onces_before
    assert logs == {"cornus": 0, "2pc": 1, "coordinator-log": 2}[protocol], f"{protocol}: {logs} coordinator log writes"
    samples = _samples(api_cluster.get("n0", "/metrics").text)
    assert _value(samples, "cornus_txn_outcomes_total", protocol=protocol, outcome="committed") >= 1
    assert _value(samples, "cornus_txn_phase_seconds_count", protocol=protocol, phase="prepare") >= 1


def test_protocols_share_locks_and_show_in_admin(api_cluster: Cluster) -> None:
    key = _owned_by_n1(1, "choice-lock-")[0]
    holder = api_cluster.post("n0", "/v1/txn", {"protocol": "2pc"})
    assert holder.status_code == 201, holder.text
    txn = holder.json()["txn"]
    assert api_cluster.post("n0", f"/v1/txn/{txn}/write", {"writes": {key: "2pc"}}).status_code == 200
    rows = [row for row in api_cluster.get("n0", "/v1/admin/transactions").json() if row["txn"] == txn]
    assert [row["protocol"] for row in rows] == ["2pc"], rows

    for other in ("cornus", "coordinator-log"):
        conflicted = api_cluster.execute("n1", [{"op": "put", "key": key, "value": other}], other)
        assert conflicted.status_code == 409 and conflicted.json()["reason"] == "conflict", conflicted.text
    assert api_cluster.post("n0", f"/v1/txn/{txn}/commit").json()["outcome"] == "committed"
    after = api_cluster.execute("n1", [{"op": "put", "key": key, "value": "cornus"}], "cornus")
    assert after.status_code == 200, after.text
    assert api_cluster.read("n0", [key]) == {key: "cornus"}
