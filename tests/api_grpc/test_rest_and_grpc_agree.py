"""REST, gRPC and the SDK answer alike where a review found them apart, each on a real cluster of
its own: an owner's refusal of a one-shot as invalid input, and the status call on a node that is
still recovering."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import httpx
import pytest

from services.client import ClientConfig, CornusClient, InvalidRequest, Op, Unavailable
from services.public_api._generated import public_pb2 as pb
from services.public_api._generated import public_pb2_grpc
from tests.api_grpc.conftest import TIMEOUT_S_CALL, emulator_storage, put
from tests.cluster.harness import keys_on, running_cluster, unknown_txn_id

# The owner's limit, under the coordinator's (1,000): a rollout that lowers op_count_max.
OP_COUNT_MAX_OWNER = 1
PARTITION_COUNT = 2
# A short storage deadline: a node recovers about one of them after it starts, so the cluster of
# the invalid-input test is ready sooner.
TIMEOUT_MS_CALL_FAST = 500
# A long one: the recovering node of the status test stays so for longer than the test's calls.
TIMEOUT_MS_CALL_SLOW_RECOVERY = 5_000
LISTEN_WAIT_S = 30.0
POLL_INTERVAL_S = 0.02
# No retries: what is under test is how one answer maps, not how the SDK retries it.
NO_RETRY = ClientConfig(retry_count_max=0)


def test_an_owner_s_invalid_refusal_of_a_one_shot_is_invalid_input_everywhere(tmp_path: Path) -> None:
    """Found by review: REST answered 409 (aborted, reason client) where gRPC answered
    INVALID_ARGUMENT, and gRPC itself answered OUTCOME_ABORTED once another partition had run."""
    storage = emulator_storage(tmp_path / "c.db", timeout_ms_call=TIMEOUT_MS_CALL_FAST)
    with running_cluster("cornus", storage, node_count=2, partition_count=PARTITION_COUNT, grpc_api=True) as cluster:
        cluster.nodes["n1"].env["CORNUS_OP_COUNT_MAX"] = str(OP_COUNT_MAX_OWNER)
        cluster.start_all()
        assert cluster.owner("p1") == "n1" and cluster.owner("p0") == "n0"
        refused = keys_on("p1", PARTITION_COUNT, OP_COUNT_MAX_OWNER + 1, prefix="refused")
        ran = keys_on("p0", PARTITION_COUNT, 1, prefix="ran")  # runs on n0, then the abort drops it
        cases = {"only the refusing owner": refused, "beside a partition that ran": refused + ran}
        limit = f"the limit is {OP_COUNT_MAX_OWNER}"
        with grpc.insecure_channel(cluster.nodes["n0"].grpc_target) as channel, \
                CornusClient(cluster.nodes["n0"].url, config=NO_RETRY) as client:
            stub = public_pb2_grpc.CornusStub(channel)
            for case, keys in cases.items():
                rest = cluster.execute("n0", [{"op": "put", "key": key, "value": "x"} for key in keys])
                assert rest.status_code == 400, (case, rest.text)
                assert rest.json()["error"] == "invalid_request" and limit in rest.json()["detail"], (case, rest.text)
                with pytest.raises(grpc.RpcError) as grpc_refused:
                    stub.Execute(pb.ExecuteRequest(ops=[put(key, b"x") for key in keys]), timeout=TIMEOUT_S_CALL)
                assert grpc_refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT, (case, grpc_refused.value)
                assert limit in grpc_refused.value.details(), (case, grpc_refused.value)
                with pytest.raises(InvalidRequest, match=limit):
                    client.execute([Op.put(key, "x") for key in keys])
            # None of them changed anything (one key a read: n1 takes one operation per request).
            for key in refused + ran:
                assert cluster.read("n0", [key]) == {key: None}


def test_the_status_call_on_a_recovering_node_is_unavailable_everywhere(tmp_path: Path) -> None:
    """Found by review: gRPC answered UNAVAILABLE, REST an outcome (202 unknown, "some nodes are
    still recovering"), which the SDK handed back as the transaction's status instead of asking
    another node. A recovering node does not know yet what its logs hold: it answers no status."""
    storage = emulator_storage(tmp_path / "c.db", timeout_ms_call=TIMEOUT_MS_CALL_SLOW_RECOVERY)
    with running_cluster("cornus", storage, node_count=1, partition_count=PARTITION_COUNT, grpc_api=True) as cluster:
        cluster.start("n0", wait=False)
        deadline = time.monotonic() + LISTEN_WAIT_S
        while True:
            try:
                ready = cluster.get("n0", "/readyz")
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, cluster.log("n0")
                time.sleep(POLL_INTERVAL_S)
        assert ready.status_code == 503, ready.text
        # Old enough that a ready cluster would answer 404, "never committed".
        txn = unknown_txn_id("n0")
        rest = cluster.get("n0", f"/v1/txn/{txn}")
        assert rest.status_code == 503, rest.text
        assert rest.json()["error"] == "unavailable" and "still recovering" in rest.json()["detail"], rest.text
        assert rest.headers["Retry-After"] == "1"
        with grpc.insecure_channel(cluster.nodes["n0"].grpc_target) as channel, \
                pytest.raises(grpc.RpcError) as grpc_refused:
            # Waiting for the port, which may open after REST's.
            public_pb2_grpc.CornusStub(channel).Status(pb.TxnRequest(txn=txn), timeout=TIMEOUT_S_CALL,
                                                       wait_for_ready=True)
        assert grpc_refused.value.code() is grpc.StatusCode.UNAVAILABLE, grpc_refused.value
        assert "still recovering" in grpc_refused.value.details()
        with CornusClient(cluster.nodes["n0"].url, config=NO_RETRY) as client, \
                pytest.raises(Unavailable, match="still recovering"):
            client.status(txn)
        assert cluster.get("n0", "/readyz").status_code == 503, "recovered before the calls were made"
