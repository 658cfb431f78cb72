"""A node that stops aborts the interactive transactions still open on it, so their locks on other
nodes' partitions go at once.

Found by audit (2026-11-28): a stop only refused new transactions; those still open (their
clients cannot reach them once the APIs are shut) kept their locks on the other nodes'
partitions until those owners idled them out, twice timeout_ms_txn_idle (a minute by default),
on every rolling restart.
"""

from __future__ import annotations

import pytest

from cornus.runtime.outcome import OutcomeStatus
from cornus.runtime.wire import Op, OpKind
from tests.runtime.faults import local_cluster

pytestmark = pytest.mark.timeout(60)


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
