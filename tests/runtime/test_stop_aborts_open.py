"""A node that stops aborts the interactive transactions still open on it, so their locks on other
nodes' partitions go at once.

Found by audit (2026-11-28): a stop only refused new transactions; those still open (their
clients cannot reach them once the APIs are shut) kept their locks on the other nodes'
partitions until those owners idled them out, twice timeout_ms_txn_idle (a minute by default),
on every rolling restart.
"""

from __future__ import annotations

import asyncio

import pytest

from cornus.runtime.coordination import TxnAborted
from cornus.runtime.outcome import OutcomeStatus
from cornus.runtime.wire import Op, OpKind
from tests.runtime.faults import HoldingAnswers, local_cluster, wait_until

pytestmark = pytest.mark.timeout(60)

SETTLE_POLL_COUNT = 20


async def test_a_stopping_node_aborts_its_open_transactions_and_frees_their_locks(tmp_path):
    async with local_cluster(tmp_path, node_count=2, partition_count=2,
                             limits={"timeout_ms_txn_idle": 30_000}) as cluster:
        key = cluster.key_in("p1")  # owned by n1
        n0, n1 = cluster.node("n0"), cluster.node("n1")
        txn = n0.begin()
        await n0.run_ops(txn, [Op(OpKind.PUT, key, b"never")])
        assert txn in n1.partitions["p1"].executions
        await cluster.stop("n0")
        assert txn not in n1.partitions["p1"].executions, "the stopped node's transaction still holds its lock"
        outcome = await n1.execute([Op(OpKind.PUT, key, b"mine")])
        assert outcome.status is OutcomeStatus.COMMITTED, outcome


async def test_a_transaction_whose_operations_run_when_the_node_stops_is_aborted_once_they_end(tmp_path):
    """Found by audit (2026-11-28): the stop's aborts skip a transaction with operations in flight
    (an abort under them would race their requests), and nothing aborted it once they ended: its
    execution and lock on the other node's partition stayed until that owner idled it out."""
    async with local_cluster(tmp_path, node_count=2, partition_count=2,
                             limits={"timeout_ms_txn_idle": 30_000}) as cluster:
        key = cluster.key_in("p1")  # owned by n1
        n0, n1 = cluster.node("n0"), cluster.node("n1")
        holding = HoldingAnswers(cluster.network.handlers["n1"])
        cluster.network.handlers["n1"] = holding
        txn = n0.begin()
        ops = asyncio.ensure_future(n0.run_ops(txn, [Op(OpKind.PUT, key, b"never")]))

        async def ran() -> bool:
            return holding.held_count == 1

        await wait_until(ran, 10, "the write never reached n1")
        assert txn in n1.partitions["p1"].executions
        stop = asyncio.ensure_future(cluster.stop("n0"))
        await asyncio.sleep(0.05)  # the stop's aborts have started, and skipped the busy one
        holding.release.set()
        with pytest.raises(TxnAborted):
            await ops
        await stop
        assert txn not in n1.partitions["p1"].executions, "the stopped node's transaction still holds its lock"
        outcome = await n1.execute([Op(OpKind.PUT, key, b"mine")])
        assert outcome.status is OutcomeStatus.COMMITTED, outcome


async def test_an_open_entry_whose_prepare_may_have_left_is_never_idled_out_as_aborted(tmp_path, monkeypatch):
    """Found by audit (2026-11-28): a one-shot whose requests (carrying its prepare) were queued
    when something unexpected raised before its commit began stayed ACTIVE with its prepares
    out; the idle sweep then recorded it ABORTED without the logs, though every request may have
    left and termination commit it. It is in doubt: the status call reads the logs."""
    async with local_cluster(tmp_path, node_count=2, partition_count=2) as cluster:
        node = cluster.node("n0")
        coordination = node.coordination

        def broken_flush() -> None:
            raise RuntimeError("an unexpected failure after the requests were queued")

        monkeypatch.setattr(coordination.transport, "flush", broken_flush)
        ops = [Op(OpKind.PUT, cluster.key_in("p0"), b"1"), Op(OpKind.PUT, cluster.key_in("p1"), b"2")]
        with pytest.raises(RuntimeError):
            await node.execute(ops)
        monkeypatch.undo()
        (txn,) = [txn for txn, ctx in coordination.txns.items() if ctx.prepare_left]
        coordination.txns[txn].last_active_s -= 3_600  # idle for an hour
        coordination.sweep_idle()
        for _ in range(SETTLE_POLL_COUNT):  # what the sweep spawned runs its course
            await asyncio.sleep(0.01)
        known = coordination.known(txn)
        assert known is not None and known.status is OutcomeStatus.UNKNOWN, known
