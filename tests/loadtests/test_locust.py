"""Each Locust file runs headless for a few seconds against a local cluster (the REST files, and
the gRPC users), as a user would run it, and its CSV shows committed transactions and no failure
other than aborts. Locust runs as its own process: its gevent patching must not meet this
process's imports."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.harness import Cluster, running_cluster

REPO = Path(__file__).resolve().parents[2]
# Locust counts its run time from before its users start: under a loaded CI run (7 workers) a
# 4 s run ended 0.6 s after spawning, its CSV written before any request (the printed stats had
# 32), and the test saw none.
RUN_S = 6
TIMEOUT_S_LOCUST = 120
# Small data, so the load phase takes a moment.
KNOBS = {"ycsb": "rows_per_partition=500", "tpcc": "warehouses=2,items=100,customers=5",
         "bank": "accounts=20,audit_clients=1"}

# One cluster for the module: tests/conftest.py puts the tests of a `cluster` fixture in one xdist group.
pytestmark = pytest.mark.timeout(TIMEOUT_S_LOCUST * 4)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    storage = {"backend": "emulator", "emulator_path": str(tmp_path_factory.mktemp("locust") / "cornus.db")}
    with running_cluster("cornus", storage, node_count=2, partition_count=2, grpc_api=True) as cluster:
        cluster.start_all()
        yield cluster


def _locust(cluster: Cluster, out: Path, locustfile: str, host: str, *classes: str,
            env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "locust", "-f", str(REPO / "loadtests" / "locust" / locustfile), *classes,
         "--host", host, "--headless", "-u", "4", "-r", "4", "-t", f"{RUN_S}s", "--csv", str(out / "run"),
         "--only-summary", "--stop-timeout", "10", "--exit-code-on-error", "0"],
        capture_output=True, text=True, timeout=TIMEOUT_S_LOCUST, check=False, cwd=out,
        env={**os.environ, **env},
    )


def _check_csv(out: Path, kinds: set[str], call_type: str, done: subprocess.CompletedProcess[str]) -> None:
    with (out / "run_stats.csv").open() as handle:
        stats = {(row["Type"], row["Name"]): row for row in csv.DictReader(handle)}
    txns = {name: row for (kind, name), row in stats.items() if kind == "TXN"}
    # Locust's own account says why when nothing ran (a CI run once recorded no request at all).
    assert set(txns) == kinds, f"{stats.keys()}\n{done.stdout[-2000:]}{done.stderr[-3000:]}"
    for name, row in txns.items():
        committed = int(row["Request Count"]) - int(row["Failure Count"])
        assert committed > 0, (name, row)
    calls = [row for (kind, _), row in stats.items() if kind == call_type]
    assert calls and all(int(row["Failure Count"]) == 0 for row in calls), calls
    with (out / "run_failures.csv").open() as handle:
        failures = list(csv.DictReader(handle))
    for failure in failures:
        assert failure["Method"] == "TXN" and failure["Error"].startswith("TxnNotCommitted('aborted: "), failure


@pytest.mark.parametrize(("workload", "kinds"), [
    ("ycsb", {"ycsb"}), ("tpcc", {"new_order", "payment"}), ("bank", {"transfer", "audit"}),
])
def test_rest_locustfile_commits_with_no_failure_but_aborts(cluster, tmp_path, workload, kinds):
    done = _locust(cluster, tmp_path, f"{workload}.py", cluster.nodes["n0"].url,
                   env={"CORNUS_WORKLOAD_KNOBS": KNOBS[workload], "CORNUS_HOSTS": cluster.nodes["n1"].url})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "cornus: loaded" in done.stdout + done.stderr
    _check_csv(tmp_path, kinds, "POST", done)


def test_grpc_users_commit_with_no_failure_but_aborts(cluster, tmp_path):
    done = _locust(cluster, tmp_path, "grpc_users.py", cluster.nodes["n0"].grpc_target, "TpccGrpcUser",
                   env={"CORNUS_WORKLOAD_KNOBS": KNOBS["tpcc"], "CORNUS_PARTITIONS": "2"})
    assert done.returncode == 0, done.stdout + done.stderr
    _check_csv(tmp_path, {"new_order", "payment"}, "gRPC", done)
