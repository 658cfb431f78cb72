"""One real 3-node cluster (`cornus serve` processes on 127.0.0.1, emulator storage) shared by
every SDK test: starting one costs seconds, and each test uses keys of its own. It serves the
public gRPC API too: values that are not UTF-8 can only be written through it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.cluster.harness import Cluster, running_cluster


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    path = tmp_path_factory.mktemp("client-cluster") / "c.db"
    storage = {"backend": "emulator", "emulator_path": str(path), "timeout_ms_call": "2000"}
    with running_cluster("cornus", storage, grpc_api=True) as started:
        started.start_all()
        yield started


@pytest.fixture
def urls(cluster: Cluster) -> list[str]:
    return [node.url for node in cluster.nodes.values()]


@pytest.fixture
def prefix() -> str:
    """Keys of this test only, so tests sharing the cluster cannot see each other's writes."""
    return f"t{uuid.uuid4().hex[:10]}-"
