"""Nodes that disagree on `partition_count`, started together over one storage, on real node
processes: each would map keys to partitions with its own count, so the same key would be stored
and locked under two partitions (lost updates, reads that miss acknowledged writes). The storage's
cluster record (cornus/runtime/cluster_record.py) holds the count of whichever node claimed it
first, and the other refuses the storage before it takes anything. (An owner also refuses an
operation on a key its count places elsewhere, cornus/runtime/partition.py, a second line:
tests/runtime/test_partition.py.)"""

from __future__ import annotations

import time
from pathlib import Path

from cornus.runtime.cluster_record import EXIT_CODE_CLUSTER_MISMATCH
from tests.cluster.conftest import storage_for
from tests.cluster.harness import running_cluster
from tests.conftest import Services

PARTITIONS, PARTITIONS_OF_N1 = 4, 3
EXIT_WAIT_S = 30.0


def test_of_two_nodes_started_together_with_different_counts_one_refuses_the_storage(
    services: Services, tmp_path: Path,
) -> None:
    storage = {**storage_for("emulator", services, tmp_path), "timeout_ms_call": "1000"}
    with running_cluster("cornus", storage, node_count=2, partition_count=PARTITIONS) as cluster:
        cluster.nodes["n1"].env["CORNUS_PARTITION_COUNT"] = str(PARTITIONS_OF_N1)
        for node_id in cluster.nodes:
            cluster.start(node_id, wait=False)
        deadline = time.monotonic() + EXIT_WAIT_S
        while all(node.alive for node in cluster.nodes.values()):
            assert time.monotonic() < deadline, "both nodes run over one storage with different partition counts"
            time.sleep(0.05)
        (refused,) = [node_id for node_id, node in cluster.nodes.items() if not node.alive]
        (serving,) = [node_id for node_id in cluster.nodes if node_id != refused]
        assert cluster.wait_exit(refused) == EXIT_CODE_CLUSTER_MISMATCH, cluster.log(refused)
        assert "partition_count" in cluster.log(refused)
        counts = {"n0": PARTITIONS, "n1": PARTITIONS_OF_N1}
        assert f"partition_count {counts[serving]} (this node: {counts[refused]})" in cluster.log(refused)
        assert cluster.nodes[serving].alive
