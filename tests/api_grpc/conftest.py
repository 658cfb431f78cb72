"""A real 3-node cluster (`cornus serve` processes on the emulator) with the public gRPC API, shared by
a test module, and helpers to call it with the generated stubs."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

import services.public_api  # noqa: F401 - builds the generated code before it is imported below
from services.public_api._generated import public_pb2 as pb
from services.public_api._generated import public_pb2_grpc
from tests.cluster.harness import Cluster, running_cluster

# Every call in these tests has a deadline, so a hung node fails a test instead of stalling it.
TIMEOUT_S_CALL = 15.0
TIMEOUT_S_READ_BACK = 30.0


def emulator_storage(path: Path, timeout_ms_call: int = 2000, latency: str = "") -> dict[str, str]:
    storage = {"backend": "emulator", "emulator_path": str(path), "timeout_ms_call": str(timeout_ms_call)}
    if latency:
        storage["latency"] = latency
    return storage


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    storage = emulator_storage(tmp_path_factory.mktemp("grpc-api") / "c.db")
    with running_cluster("cornus", storage, grpc_api=True) as running:
        running.start_all()
        yield running


@pytest.fixture(scope="module")
def stubs(cluster: Cluster) -> Iterator[dict[str, public_pb2_grpc.CornusStub]]:
    channels = {node_id: grpc.insecure_channel(node.grpc_target) for node_id, node in cluster.nodes.items()}
    yield {node_id: public_pb2_grpc.CornusStub(channel) for node_id, channel in channels.items()}
    for channel in channels.values():
        channel.close()


def read_back(stub: public_pb2_grpc.CornusStub, keys: list[str]) -> dict[str, bytes | None]:
    """Committed values, retrying retryable aborts (a lock an earlier commit has not yet released)."""
    deadline = time.monotonic() + TIMEOUT_S_READ_BACK
    ops = [pb.Op(kind=pb.OP_KIND_GET, key=key) for key in keys]
    while True:
        outcome = stub.Execute(pb.ExecuteRequest(ops=ops), timeout=TIMEOUT_S_CALL)
        if outcome.outcome == pb.OUTCOME_COMMITTED:
            assert [read.key for read in outcome.reads] == keys
            return {read.key: read.value if read.HasField("value") else None for read in outcome.reads}
        assert outcome.retryable and time.monotonic() < deadline, outcome
        time.sleep(0.05)


def put(key: str, value: bytes) -> pb.Op:
    return pb.Op(kind=pb.OP_KIND_PUT, key=key, value=value)


def get(key: str) -> pb.Op:
    return pb.Op(kind=pb.OP_KIND_GET, key=key)
