"""The cluster record, on real node processes: the first node to start over empty storage records
which cluster the storage holds and how many partitions its keys are spread over, and a node
configured otherwise refuses the storage before it takes anything. Without it (found by review), a
cluster reinstalled with another partition count over the same storage mapped about half its keys
to other partitions (committed values read as absent, new writes split a key in two), and a second
release of the same name over the same storage took the first one's node identities."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Mapping

import pytest

from cornus.runtime.cluster_record import EXIT_CODE_CLUSTER_MISMATCH
from storage_adapters.contract import Ownership, identity_name
from storage_adapters.factory import StoreConfig, open_store
from tests.cluster.harness import Cluster, running_cluster

PARTITIONS, PARTITIONS_OTHER = 4, 8
# A node that refuses the storage does so after one storage round trip; one that does not refuse
# (the bug) runs on, and this bounds the wait for its exit.
REFUSAL_EXIT_S_MAX = 20.0


def _stop_nodes(cluster: Cluster) -> None:
    for node in cluster.nodes.values():
        if node.alive:
            assert node.process is not None
            node.process.send_signal(signal.SIGTERM)
    for node_id in cluster.nodes:
        assert cluster.wait_exit(node_id) == 0, cluster.log(node_id)


async def _owner_records(storage: Mapping[str, str], nodes: list[str]) -> dict[str, Ownership]:
    config = StoreConfig(**{key: int(value) if key == "timeout_ms_call" else value for key, value in storage.items()})
    store = await open_store(config)
    try:
        names = [f"p{index}" for index in range(PARTITIONS_OTHER)] + [identity_name(node) for node in nodes]
        return await store.read_owners(names)
    finally:
        await store.close()


@pytest.mark.parametrize(("setting", "value", "named"), [
    ("CORNUS_PARTITION_COUNT", str(PARTITIONS_OTHER), ("partition_count", str(PARTITIONS), str(PARTITIONS_OTHER))),
    ("CORNUS_CLUSTER_ID", "another-release", ("cluster_id", "cornus", "another-release")),
])
def test_a_node_configured_for_another_cluster_refuses_the_storage_and_takes_nothing(
    storage: dict[str, str], setting: str, value: str, named: tuple[str, ...],
) -> None:
    with running_cluster("cornus", storage, node_count=2, partition_count=PARTITIONS) as cluster:
        cluster.start_all()
        written = cluster.execute_retrying("n0", [{"op": "put", "key": f"k{index}", "value": f"v{index}"}
                                                  for index in range(16)])
        assert written.status_code == 200, written.text
        _stop_nodes(cluster)
        before = asyncio.run(_owner_records(storage, list(cluster.nodes)))

        cluster.nodes["n0"].env[setting] = value
        cluster.start("n0", wait=False)
        try:
            code = cluster.wait_exit("n0", REFUSAL_EXIT_S_MAX)
        except Exception:
            pytest.fail(f"n0 ran over storage recorded for another cluster ({setting}={value}):\n{cluster.log('n0')}")
        assert code == EXIT_CODE_CLUSTER_MISMATCH, cluster.log("n0")
        for word in named:
            assert word in cluster.log("n0"), (word, cluster.log("n0"))
        # No identity, no partition taken: the ownership records are as the cluster left them.
        assert asyncio.run(_owner_records(storage, list(cluster.nodes))) == before

        # The cluster as recorded starts again over its storage and reads what it committed.
        del cluster.nodes["n0"].env[setting]
        cluster.start_all()
        assert cluster.read("n1", [f"k{index}" for index in range(16)]) == {
            f"k{index}": f"v{index}" for index in range(16)
        }
