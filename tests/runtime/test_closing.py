"""A node that is stopping cleanly starts no commit (found by review): it waits only for the
decisions of commits already under way, so one that started later could be left undelivered by a
node about to leave the cluster."""

from __future__ import annotations

import pytest

from cornus.runtime.outcome import NodeOverloaded, OutcomeStatus
from tests.runtime.faults import keys_in, local_cluster, puts

pytestmark = pytest.mark.timeout(60)


async def test_a_stopping_node_refuses_to_commit_and_changes_nothing(tmp_path):
    async with local_cluster(tmp_path, partition_count=2) as cluster:
        node = cluster.node()
        keys = keys_in(2, ["p0", "p1"])
        writes = {keys["p0"]: b"a", keys["p1"]: b"b"}
        txn = node.begin()
        await node.run_ops(txn, puts(writes))
        node.coordination.closing = True  # what a clean stop sets first
        with pytest.raises(NodeOverloaded):
            await node.commit(txn)
        node.coordination.closing = False
        assert (await node.abort(txn)).status is OutcomeStatus.ABORTED
        assert [await cluster.value(k) for k in writes] == [None, None]
