"""A short chaos run per backend: real node processes behind Toxiproxy, about 25 s of seeded
network and process faults under the bank and register workloads, then the quiet phase and every
check of loadtests/chaos (see its README). A check that finds a violation fails the test with the
summary table, which names the transactions and keys; the run's logs stay in the test's tmp_path.

Each test uses this xdist worker's ports (tests.worker.free_port) and Redis database
(tests.worker.redis_db_cluster, emptied first), and its own emulator file and Toxiproxy, so it runs
beside any other test. The Toxiproxy binary comes from scripts/toxiproxy.sh (built on first use:
about 30-60 s on a cold Go cache; concurrent workers wait on one build).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from loadtests.chaos.report import format_summary
from loadtests.chaos.runner import RunOptions, run
from loadtests.chaos.toxiproxy import toxiproxy_binary
from tests.cluster.conftest import storage_for
from tests.conftest import Services
from tests.worker import free_port

FAULT_PHASE_S = 25.0
# Fixed per backend, so a failure reproduces with the same schedule (`python -m loadtests.chaos
# --seed N`); CORNUS_CHAOS_SEED explores others.
SEEDS = {"emulator": 101, "redis": 202}


@pytest.fixture(scope="session")
def toxiproxy_bin() -> str:
    return toxiproxy_binary()


@pytest.mark.services
# Redis only in the suite: it has both kinds of link to break (node-node and node-storage), and the
# suite's time is bounded; the emulator run is the same command with --backend emulator.
@pytest.mark.parametrize("backend", ["redis"])
def test_chaos_short_run_passes_every_check(
    backend: str, services: Services, tmp_path: Path, toxiproxy_bin: str
) -> None:
    storage = storage_for(backend, services, tmp_path)
    seed = int(os.environ.get("CORNUS_CHAOS_SEED", SEEDS[backend]))
    options = RunOptions(
        backend=backend, duration_s=FAULT_PHASE_S, seed=seed, redis_url=storage.get("redis_url", ""),
        storage_timeout_ms_call=int(storage["timeout_ms_call"]), workdir=tmp_path / "chaos",
        toxiproxy_bin=toxiproxy_bin,
        # Fewer clients than the standalone default: the suite shares two cores among four workers.
        bank_clients=2, register_writers=2, register_readers=1, verbose=False,
    )
    summary = run(options, port=free_port)
    table = format_summary(summary)
    print(table)
    (tmp_path / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True, default=str))

    assert summary["error"] is None, table
    failing = [check["key"] for check in summary["checks"] if check["violations"]]
    assert not failing, f"checks {failing} found violations (reproduce with --seed {seed}):\n{table}"
    # The run must have meant something: faults happened and transactions committed through them.
    assert sum(summary["faults_injected"].values()) >= 5, table
    assert summary["workloads"]["bank transfers"]["committed"] >= 10, table
    assert summary["workloads"]["register writes"]["committed"] >= 10, table
