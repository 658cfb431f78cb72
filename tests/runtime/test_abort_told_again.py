"""An abort before commit tells every partition the transaction touched to drop it, and tells it
again, a few times at most, where the first telling got no answer.

Found by audit (2026-11-28): a client's abort sent each partition one request and swallowed its
failure; one lost on the way left the execution, its locks held, until its owner idled it out
(timeout_ms_txn_idle, 30 s), and every transaction that wanted those keys meanwhile conflicted.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from cornus.runtime.transport import PeerUnavailable
from cornus.runtime.wire import ExecuteRequest, Op, OpKind
from tests.runtime.faults import keys_in, local_cluster, wait_until

pytestmark = pytest.mark.timeout(60)


class LosingFirstAborts:
    """A node's inbound handler that loses the first `count` abort requests sent to it."""

    def __init__(self, inner: Any, count: int) -> None:
        self.inner = inner
        self.left = count
        self.lost = 0

    def on_message(self, sender: str, message: Any) -> None:
        self.inner.on_message(sender, message)

    async def on_request(self, sender: str, request: Any) -> Any:
        if isinstance(request, ExecuteRequest) and request.abort and self.left:
            self.left -= 1
            self.lost += 1
            raise PeerUnavailable("the abort was lost on the way")
        return await self.inner.on_request(sender, request)


async def test_an_abort_whose_first_telling_was_lost_is_told_again(tmp_path):
    async with local_cluster(tmp_path, node_count=2, partition_count=2) as cluster:
        n0 = cluster.node("n0")
        key = keys_in(2, ["p1"])["p1"]
        owner = n0.coordination.owner_of("p1")
        assert owner == "n1", owner
        losing = LosingFirstAborts(cluster.network.handlers["n1"], 2)
        cluster.network.handlers["n1"] = losing
        txn = n0.begin()
        await n0.run_ops(txn, [Op(OpKind.PUT, key, b"v")])
        executions = cluster.node("n1").partitions["p1"].executions
        assert txn in executions
        await n0.abort(txn)

        async def dropped() -> bool:
            return txn not in executions

        await wait_until(dropped, 10, "the execution stayed after its abort was lost")
        assert losing.lost == 2


async def test_a_request_cancelled_while_it_read_leaves_no_execution(tmp_path):
    """Found by audit (2026-11-28, second): a request cancelled while it read storage (its caller's
    deadline passed, and the transport ended the handler) kept its execution and every lock it had
    taken, its PUTs' exclusive ones too, until its coordinator's abort came or the owner idled it
    out (60 s); a cancelled lock wait ended its execution already."""
    async with local_cluster(tmp_path, node_count=1, partition_count=1) as cluster:
        node = cluster.node()
        gate = cluster.faults["n0"].hold("read_data")
        txn = node.begin()
        request = ExecuteRequest(txn, "p0", "n0", (Op(OpKind.PUT, "a", b"v"), Op(OpKind.GET, "b")))
        partition = node.partitions["p0"]
        task = asyncio.ensure_future(partition.execute(request))

        async def reading() -> bool:
            return txn in partition.executions and bool(partition.locks.holders("a"))

        await wait_until(reading, 10, "the request never began to read")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        gate.set()
        assert txn not in partition.executions
        assert not partition.locks.holders("a") and not partition.locks.holders("b")
