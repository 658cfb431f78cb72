"""A peer's message or request that names a transaction, a node or a partition with an id no
storage call accepts is refused where it enters, never given to a machine.

Found by audit (2026-11-28, second): the boundary checked a prepare's participants for order and
count only, and no id's characters. A one-shot request whose participants named "p 1" beside the
owner's partition ran, fed its carried prepare, and the participant's record body refused the
name with a ValidationError, which ended the owner's process (fatal); the next owner after the
failover died of the same request. A txn id with a space did the same at the first storage call.
"""

from __future__ import annotations

import time

import pytest

from cornus.protocol import txn_ids
from cornus.protocol.config import Protocol
from cornus.protocol.messages import Decision, Prepare
from cornus.runtime.wire import ExecuteRequest, ExecuteStatus, Op, OpKind, Routed
from storage_adapters.contract import TxnState
from tests.runtime.faults import keys_in, local_cluster

pytestmark = pytest.mark.timeout(60)


def _txn() -> str:
    return txn_ids.new_txn_id(int(time.time() * 1000), "n1", "abc123", 1, Protocol.CORNUS)


async def test_a_one_shot_request_naming_a_partition_no_storage_accepts_is_refused(tmp_path):
    async with local_cluster(tmp_path, partition_count=2) as cluster:
        node = cluster.node()
        key = keys_in(2, ["p1"])["p1"]
        request = ExecuteRequest(_txn(), "p1", "n1", (Op(OpKind.PUT, key, b"v"),), participants=("p 1", "p1"))
        response = await node.on_request("n1", request)
        assert response.status is ExecuteStatus.INVALID and "p 1" in response.detail, response
        spaced = _txn().replace("abc123", "abc 123")
        request = ExecuteRequest(spaced, "p1", "n1", (Op(OpKind.PUT, key, b"v"),), participants=("p0", "p1"))
        response = await node.on_request("n1", request)
        assert response.status is ExecuteStatus.INVALID, response
        request = ExecuteRequest(_txn(), "p1", "n 1", (Op(OpKind.PUT, key, b"v"),), participants=("p0", "p1"))
        response = await node.on_request("n1", request)
        assert response.status is ExecuteStatus.INVALID, response
        assert not cluster.exits and not node.partitions["p1"].executions
        assert await cluster.value(key) is None


async def test_a_message_naming_an_id_no_storage_accepts_is_dropped(tmp_path):
    async with local_cluster(tmp_path, partition_count=2) as cluster:
        node = cluster.node()
        refused = node.counters["peer_messages_refused"]
        node.on_message("n1", Routed("n1", "p1", Prepare(_txn(), ("p 1", "p1"), "n1")))
        node.on_message("n1", Routed("n1", "p1", Prepare(_txn(), ("p0", "p1"), "n 1")))
        node.on_message("n1", Routed("n1", "p1", Prepare(_txn(), ("p1", "p7"), "n1")))  # no such partition
        spaced = _txn().replace("abc123", "abc 123")
        node.on_message("n1", Routed("n1", "p1", Decision(spaced, TxnState.ABORT)))
        node.on_message("n 1", Routed("n 1", "p1", Decision(_txn(), TxnState.ABORT)))
        assert node.counters["peer_messages_refused"] == refused + 5
        assert not cluster.exits
