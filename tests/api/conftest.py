"""One real cluster for the REST API tests: `cornus serve` processes on 127.0.0.1 sharing an
emulator file, logging at DEBUG so every transaction leaves a JSON line to check. It serves the
public gRPC API too: values that are not UTF-8 can only be written through it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.harness import Cluster, running_cluster

API_NODE_COUNT = 2
API_PARTITION_COUNT = 4


def emulator_storage(path: Path) -> dict[str, str]:
    return {"backend": "emulator", "emulator_path": str(path), "timeout_ms_call": "2000"}


@pytest.fixture(scope="session")
def api_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    storage = emulator_storage(tmp_path_factory.mktemp("api") / "c.db")
    with running_cluster("cornus", storage, node_count=API_NODE_COUNT, partition_count=API_PARTITION_COUNT,
                         grpc_api=True) as cluster:
        # The harness hands its environment to the node processes; only while they start, so
        # clusters of other tests in this session keep the default level.
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("CORNUS_LOG_LEVEL", "DEBUG")
            cluster.start_all()
        yield cluster
