"""A transaction's outcome after its records are collected and its coordinator restarted, on real
node processes over real storage: the decision's tombstone in its first participant's log is what
the status call finds then (DESIGN section 4)."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from storage_adapters.contract import RecordBody, TxnState
from tests.cluster.harness import keys_on, read_records, running_cluster

# A storage deadline of 1 s and the smallest grace it and the slack (250 ms) allow, so that the
# records go soon within the test; the outcome is kept for a minute after.
STORAGE_TIMEOUT_MS = "1000"
SETTINGS = {"gc_grace_ms": 2_500, "outcome_keep_ms": 60_000}
COLLECT_WAIT_S = 30.0


@pytest.mark.parametrize("protocol", ["cornus", "2pc"])
def test_a_collected_transaction_s_outcome_survives_its_coordinator_s_restart(
    protocol: str, storage: dict[str, str]
) -> None:
    storage = {**storage, "timeout_ms_call": STORAGE_TIMEOUT_MS}
    with running_cluster(protocol, storage, settings=SETTINGS) as cluster:
        cluster.start_all()
        # p1 (n1) and p2 (n2) take part; n0 coordinates and holds no record of it.
        keys = [keys_on("p1", 6, 1)[0], keys_on("p2", 6, 1)[0]]
        response = cluster.execute("n0", [{"op": "put", "key": k, "value": "v"} for k in keys])
        assert response.status_code == 200, response.text
        txn = response.json()["txn"]
        deadline = time.monotonic() + COLLECT_WAIT_S
        while True:
            # p2 read first: the coordinator makes p1's record the tombstone before it deletes
            # p2's, so p2 found gone means p1, read after, is the tombstone. Read the other way
            # round, the two reads could straddle the collection (p1 still whole, then p2 gone:
            # failed once under a loaded CI run).
            records = asyncio.run(read_records(storage, txn, ["p2", "p1"]))
            kept = records["p1"]
            if records["p2"] is None and kept is not None:
                break
            assert time.monotonic() < deadline, f"{txn} was never collected: {records}"
            time.sleep(0.2)
        assert (kept.state, kept.applied, kept.body) == (TxnState.COMMIT, True, RecordBody()), kept
        cluster.kill("n0")  # its memory of the outcome goes with it
        cluster.start("n0")
        for node in ("n0", "n1"):
            status = cluster.get(node, f"/v1/txn/{txn}")
            assert status.status_code == 200 and status.json()["outcome"] == "committed", (node, status.text)


def test_a_coordinator_stopped_within_the_grace_collects_its_records_before_it_exits(storage: dict[str, str]) -> None:
    """Found by audit (2026-11-27): only a coordinator's machine collects its transaction's
    records, after the grace period, and a node stopped within it (every rolling restart, about
    a grace's worth of transactions) exited without collecting them: no later process knows a
    Cornus transaction its earlier one coordinated, so their records stayed in storage for ever,
    and DynamoDB's and Azure's recovery scans walk them. A stopping node, once it has released its
    partitions, waits out its collections (timeout_ms_stop_collect at most) before it exits."""
    storage = {**storage, "timeout_ms_call": STORAGE_TIMEOUT_MS}
    # A grace long enough that the stop surely comes within it, under the stop's wait.
    settings = {**SETTINGS, "gc_grace_ms": 5_000, "timeout_ms_stop_collect": 15_000}
    with running_cluster("cornus", storage, settings=settings) as cluster:
        cluster.start_all()
        keys = [keys_on("p1", 6, 1)[0], keys_on("p2", 6, 1)[0]]
        response = cluster.execute("n0", [{"op": "put", "key": k, "value": "v"} for k in keys])
        assert response.status_code == 200, response.text
        txn = response.json()["txn"]
        assert asyncio.run(read_records(storage, txn, ["p2"]))["p2"] is not None, "collected before the stop"
        coordinator = cluster.nodes["n0"].process
        assert coordinator is not None
        coordinator.send_signal(signal.SIGTERM)  # within the grace
        assert cluster.wait_exit("n0") == 0
        records = asyncio.run(read_records(storage, txn, ["p1", "p2"]))
        kept = records["p1"]
        assert records["p2"] is None and kept is not None, records
        assert (kept.state, kept.body) == (TxnState.COMMIT, RecordBody()), kept
        assert "left uncollected" not in cluster.log("n0")
