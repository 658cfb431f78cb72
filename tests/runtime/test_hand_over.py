"""A hand-over of an idle partition writes its release (found by review): the holder asked for it
drains at once, but its renewal was still in flight, and the release it skipped for that left the
preferred node waiting out the lease and the clock slack."""

from __future__ import annotations

import asyncio
import time

import pytest

from cornus.protocol import txn_ids
from cornus.protocol.config import Protocol
from cornus.runtime.node import Node
from cornus.runtime.outcome import OutcomeStatus
from cornus.runtime.wire import ExecuteRequest, ExecuteStatus, Op, OpKind
from tests.runtime.faults import local_cluster, wait_until

pytestmark = pytest.mark.timeout(60)


async def test_an_idle_hand_over_writes_its_release(tmp_path):
    async with local_cluster(tmp_path, node_count=2, partition_count=2) as cluster:
        n1 = cluster.node("n1")
        await cluster.stop("n0")  # releases p0, which n1 takes

        async def n1_serves_p0() -> bool:
            return "p0" in n1.serving

        await wait_until(n1_serves_p0, 10, "n1 never took p0")
        before = len(cluster.faults["n1"].calls)
        started = time.monotonic()
        await cluster.start("n0")  # p0's preferred node asks for it back
        n0 = cluster.node("n0")

        async def n0_serves_p0() -> bool:
            return "p0" in n0.serving

        await wait_until(n0_serves_p0, 15, "n0 never got p0 back")
        took_s = time.monotonic() - started
        releases = [c for c in cluster.faults["n1"].calls[before:]
                    if c.method == "write_owner" and c.args["new"].partition == "p0" and c.args["new"].owner == ""]
        assert releases, f"n1 handed p0 over without writing the release; n0 waited {took_s:.2f} s"


async def test_a_drain_lets_the_transactions_in_flight_on_the_partition_go_on(tmp_path):
    """Found by audit (2026-11-27): a node draining a partition (its preferred node asked for it)
    refused every request there, the continued requests and refreshes of the transactions already
    running included, which the drain is meant to wait for: those could neither finish nor be
    dropped (their executions live until the idle timeout), so the partition was unserved for the
    whole drain_ms_max, and they aborted. A drain refuses only new transactions."""
    async with local_cluster(tmp_path, node_count=2, partition_count=2,
                             ownership={"drain_ms_max": 30_000}) as cluster:
        n1 = await _n1_holds_p0(cluster)
        first, second = cluster.key_in("p0", "a"), cluster.key_in("p0", "b")
        txn = n1.begin()
        await n1.run_ops(txn, [Op(OpKind.PUT, first, b"1")])
        await _n1_drains_p0(cluster)
        await n1.run_ops(txn, [Op(OpKind.PUT, second, b"2")])  # refused NOT_OWNER before the fix
        outcome = await n1.commit(txn)
        assert outcome.status is OutcomeStatus.COMMITTED, outcome
        n0 = cluster.node("n0")

        async def n0_serves_p0() -> bool:
            return "p0" in n0.serving

        await wait_until(n0_serves_p0, 15, "n0 never got p0 back once the transaction ended")
        assert await cluster.value(first) == b"1" and await cluster.value(second) == b"2"


async def test_a_first_request_that_ran_as_its_partition_began_to_drain_leaves_no_execution(tmp_path):
    """Found by audit (2026-11-28): a first request that waited (here for a storage read) while its
    partition began to drain was answered NOT_OWNER, but its execution, locks and all, stayed: the
    drain could not hand the partition over until the coordinator's abort came, or drain_ms_max
    passed. What it ran goes with the answer."""
    async with local_cluster(tmp_path, node_count=2, partition_count=2,
                             ownership={"drain_ms_max": 30_000}) as cluster:
        n1 = await _n1_holds_p0(cluster)
        gate = cluster.faults["n1"].hold("read_data")
        txn = txn_ids.new_txn_id(int(time.time() * 1000), "n9", "abc123", 1, Protocol.CORNUS)
        request = ExecuteRequest(txn, "p0", "n9", (Op(OpKind.GET, cluster.key_in("p0", "a")),))
        answer = asyncio.ensure_future(n1.on_request("n9", request))

        async def reading() -> bool:
            return txn in n1.partitions["p0"].executions

        await wait_until(reading, 10, "the request never began")
        await _n1_drains_p0(cluster)
        gate.set()
        response = await answer
        assert response.status is ExecuteStatus.NOT_OWNER, response
        # Handed over by now, perhaps (the drain had nothing left to wait for): then gone with it.
        partition = n1.partitions.get("p0")
        assert partition is None or txn not in partition.executions, "the refused request's execution stayed"


async def _n1_holds_p0(cluster) -> Node:
    """n1, serving p0 once n0, its preferred node, stopped."""
    n1 = cluster.node("n1")
    await cluster.stop("n0")

    async def n1_serves_p0() -> bool:
        return "p0" in n1.serving

    await wait_until(n1_serves_p0, 10, "n1 never took p0")
    return n1


async def _n1_drains_p0(cluster) -> None:
    """n0 starts again and asks for p0 back: n1 begins to drain it."""
    await cluster.start("n0")
    n1 = cluster.node("n1")

    async def draining() -> bool:
        held = n1.ownership.machine.held.get("p0")
        return held is not None and held.drain_started_ms is not None

    await wait_until(draining, 10, "n1 never began to drain p0")
