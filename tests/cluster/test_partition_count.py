"""Nodes that disagree on `partition_count`, on real node processes: each maps keys to partitions
with its own count, so without a check the same key would be stored and locked under two
partitions (lost updates, reads that miss acknowledged writes). An owner refuses an operation on a
key its count does not place in the partition asked, naming both, and nothing is written."""

from __future__ import annotations

import asyncio
import zlib
from pathlib import Path

from storage_adapters.factory import StoreConfig, open_store
from tests.cluster.conftest import storage_for
from tests.cluster.harness import running_cluster
from tests.conftest import Services

# n0 maps keys over 4 partitions, n1 over 3. Both prefer p1 for n1 (round-robin over n0, n1).
PARTITIONS, PARTITIONS_OF_N1 = 4, 3


def _key_in_p1_for_n0_only() -> str:
    for index in range(10_000):
        key = f"k{index}"
        crc = zlib.crc32(key.encode())
        if crc % PARTITIONS == 1 and crc % PARTITIONS_OF_N1 != 1:
            return key
    raise AssertionError("no key maps to p1 under 4 partitions and elsewhere under 3")


def test_an_owner_refuses_a_key_its_partition_count_places_elsewhere(services: Services, tmp_path: Path) -> None:
    key = _key_in_p1_for_n0_only()
    storage = {**storage_for("emulator", services, tmp_path), "timeout_ms_call": "1000"}
    with running_cluster("cornus", storage, node_count=2, partition_count=PARTITIONS) as cluster:
        cluster.nodes["n1"].env["CORNUS_PARTITION_COUNT"] = str(PARTITIONS_OF_N1)
        cluster.start_all()
        response = cluster.execute("n0", [{"op": "put", "key": key, "value": "v"}])
        assert response.status_code == 400, response.text
        assert "partition_count" in response.json()["detail"], response.text
        # A read is refused the same way, and nothing was written where either count places it.
        read = cluster.execute("n0", [{"op": "get", "key": key}])
        assert read.status_code == 400 and "partition_count" in read.json()["detail"], read.text
        assert asyncio.run(_stored(storage["emulator_path"], key)) == [None, None]


async def _stored(emulator_path: str, key: str) -> list[bytes | None]:
    store = await open_store(StoreConfig(backend="emulator", emulator_path=emulator_path))
    try:
        placed = {f"p{zlib.crc32(key.encode()) % count}" for count in (PARTITIONS, PARTITIONS_OF_N1)}
        return [(await store.read_data(partition, [key]))[key] for partition in sorted(placed)]
    finally:
        await store.close()
