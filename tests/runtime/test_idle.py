"""Idle executions: an owner drops the execution (locks, buffered writes) of a transaction no
request touched for twice timeout_ms_txn_idle, and its commit then aborts. A transaction whose
client is busy elsewhere is not idle, and must keep what it did on a partition it left a while
ago (found by review). Real in-process nodes over the emulator, with a short idle timeout."""

from __future__ import annotations

import asyncio
import time

import pytest

from cornus.protocol.execution import execution_idle_ms
from cornus.runtime.node import Node
from cornus.runtime.outcome import AbortReason, OutcomeStatus, TxnWrongState
from cornus.runtime.wire import Op, OpKind
from tests.runtime.faults import LocalCluster, local_cluster, puts, read_through, wait_until

pytestmark = pytest.mark.timeout(30)

# Short, so the test outlives the owner's drop (twice this, seen by a sweep every 200 ms) in a
# couple of seconds; long enough that a loaded machine's event-loop lag does not pass for idleness.
TIMEOUT_MS_TXN_IDLE = 400
# How long the client keeps working on the other partition: past the owner's drop, twice over.
BUSY_ELSEWHERE_S = 4 * TIMEOUT_MS_TXN_IDLE / 1000
# The client's think time between calls: well within the coordinator's idle timeout.
THINK_S = 0.1


def _remote_and_local(cluster: LocalCluster) -> tuple[str, str]:
    """A partition n1 owns (A, left early) and one n0 owns (B, worked on), n0 coordinating."""
    remote = next(p for p in cluster.partitions if cluster.owner_of(p) == "n1")
    local = next(p for p in cluster.partitions if cluster.owner_of(p) == "n0")
    return remote, local


async def _busy_elsewhere(node: Node, txn: str, key: str, duration_s: float = BUSY_ELSEWHERE_S) -> None:
    """Read and write `key` every THINK_S for `duration_s`: the client is never idle."""
    deadline = time.monotonic() + duration_s
    count = 0
    while time.monotonic() < deadline:
        count += 1
        await node.run_ops(txn, [Op(OpKind.GET, key), Op(OpKind.PUT, key, b"b%d" % count)])
        await asyncio.sleep(THINK_S)


async def test_a_transaction_busy_on_another_partition_keeps_its_execution_and_commits(tmp_path):
    """Before the fix the owner of A counted idleness from the transaction's last request to A,
    the coordinator from its last request anywhere: A's execution went after twice the idle
    timeout while the client worked on B, and the commit was aborted (VOTED_NO) although the
    client had never been idle."""
    limits = {"timeout_ms_txn_idle": TIMEOUT_MS_TXN_IDLE}
    async with local_cluster(tmp_path, node_count=2, partition_count=2, limits=limits) as cluster:
        n0, n1 = cluster.node("n0"), cluster.node("n1")
        remote, local = _remote_and_local(cluster)
        key_a, key_b = cluster.key_in(remote, "a"), cluster.key_in(local, "b")
        txn = n0.begin()
        await n0.run_ops(txn, puts({key_a: b"a"}))
        await _busy_elsewhere(n0, txn, key_b)
        outcome = await n0.commit(txn)
        assert outcome.status is OutcomeStatus.COMMITTED, outcome

        async def applied() -> bool:
            return await cluster.value(key_a) == b"a"

        await wait_until(applied, 5, "A's write was never applied")
        assert n1.counters["executions_idled_out"] == 0, "A dropped the execution of a transaction at work"


async def test_a_dropped_execution_is_never_refreshed_back_and_its_transaction_aborts_at_once(tmp_path):
    """The refreshes keep an execution alive; they never bring back one its owner dropped (by hand
    here, as after a coordinator that stalled past the drop): the client works on elsewhere, the
    refresh is refused, and the coordinator aborts the transaction at its next sweep, so that the
    client's next call hears of it and the locks held elsewhere are freed. Before the fix the
    transaction stayed ACTIVE, its client working on and holding B's locks until its commit was
    refused (VOTED_NO). Neither A's write nor B's lands, and A's key stays free."""
    limits = {"timeout_ms_txn_idle": TIMEOUT_MS_TXN_IDLE}
    async with local_cluster(tmp_path, node_count=2, partition_count=2, limits=limits) as cluster:
        n0, n1 = cluster.node("n0"), cluster.node("n1")
        remote, local = _remote_and_local(cluster)
        key_a, key_b = cluster.key_in(remote, "a"), cluster.key_in(local, "b")
        txn = n0.begin()
        await n0.run_ops(txn, puts({key_a: b"a"}))
        partition_a = n1.partitions[remote]
        partition_a.executions[txn].last_active_ms -= 10 * TIMEOUT_MS_TXN_IDLE
        assert partition_a.sweep_idle(execution_idle_ms(TIMEOUT_MS_TXN_IDLE), lambda _: False) == 1
        # A refresh is due after half the idle timeout (a sweep every 200 ms), the abort at the
        # sweep after its refusal: well inside the time the client keeps working.
        with pytest.raises(TxnWrongState):
            await _busy_elsewhere(n0, txn, key_b)
        assert n0.counters["executions_refresh_refused"] == 1, n0.counters
        assert txn not in partition_a.executions, "a refresh started the dropped execution again"
        outcome = n0.coordination.known(txn)
        assert outcome is not None and outcome.status is OutcomeStatus.ABORTED, outcome
        assert outcome.reason is AbortReason.VOTED_NO, outcome
        with pytest.raises(TxnWrongState):
            await n0.commit(txn)
        assert await read_through(n1, key_a) is None  # not written, and not locked either
        assert await read_through(n0, key_b) is None
