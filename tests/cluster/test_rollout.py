"""A rollout that changes the node set, on real node processes: a node whose configuration does not
name some coordinator (one a rollout removed, or added after this node's configuration was
written) must still find, at recovery, the coordinator-log yes votes that only that coordinator's
log holds (cornus.protocol.recovery step 2). It lists the nodes from storage."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.cluster.conftest import storage_for
from tests.cluster.harness import Cluster, keys_on, running_cluster
from tests.conftest import Services

PARTITIONS = 2  # p0 on n0, p1 on n1, round-robin over the sorted peers with or without n2
SETTINGS = {"timeout_ms_txn_idle": 1500}
SETTLE_TIMEOUT_S = 20.0


def _phase(cluster: Cluster, node_id: str) -> str | None:
    """The phase of the one participant machine on `node_id` (None: none)."""
    rows = [row for row in cluster.get(node_id, "/v1/admin/transactions").json() if row["role"] == "participant"]
    assert len(rows) <= 1, rows
    return rows[0]["phase"] if rows else None


@pytest.mark.parametrize("backend", ["emulator"])
def test_a_participant_restarted_with_a_configuration_that_drops_the_coordinator_recovers_its_votes(
    backend: str, services: Services, tmp_path: Path,
) -> None:
    storage = {**storage_for(backend, services, tmp_path), "timeout_ms_call": "1000"}
    keys = [keys_on("p0", PARTITIONS, 1, prefix="x")[0], keys_on("p1", PARTITIONS, 1, prefix="y")[0]]
    with running_cluster("coordinator-log", storage, node_count=3, partition_count=PARTITIONS,
                         settings=SETTINGS) as cluster:
        # n2 dies once it logged COMMIT, before any participant heard it: n1's yes vote (a
        # coordinator-log participant logs none) lives in n2's redo record alone.
        cluster.start_all({"n2": "coordinator.after_decision_log@1"})
        with pytest.raises(httpx.HTTPError):
            cluster.execute("n2", [{"op": "put", "key": k, "value": "new"} for k in keys])
        assert cluster.wait_exit("n2") == -9, "the failpoint must have killed the coordinator"
        assert _phase(cluster, "n1") == "voted"
        cluster.kill("n1")

        # A rollout takes n2 out of n1's configuration as n1 restarts (n2 comes back all the same,
        # as a node being drained does): n1's peers are n0 and n1, its partition p1 still.
        cluster.nodes["n1"].env["CORNUS_PEERS"] = ",".join(
            f"{n.node_id}=127.0.0.1:{n.peer_port}" for n in cluster.nodes.values() if n.node_id != "n2"
        )
        cluster.start("n1")
        cluster.start("n2")
        # n2's recovery finds its COMMIT and sends it again. Before, n1's recovery had not rebuilt
        # the vote, took that COMMIT for one of a transaction it had finished, and acknowledged it
        # without applying: the write to p1 was lost.
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        values = cluster.read("n0", keys)
        while values != dict.fromkeys(keys, "new") and time.monotonic() < deadline:
            time.sleep(0.1)
            values = cluster.read("n0", keys)
        assert values == dict.fromkeys(keys, "new"), f"a committed transaction lost its write: {values}"
