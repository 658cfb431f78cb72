"""A partition whose recovery finished but which is not served yet (its readiness settling) answers
a request of a transaction its machine runs as "already committing", as the core's rule does, not
NOT_READY: that is a refusal, which tells the coordinator this owner never votes, though its vote
stands.

Found by audit (2026-11-28): the node checked its serving set before the core's rule. The
simulator, which has no settle window, answered such a request as committing.
"""

from __future__ import annotations

import pytest

from cornus.protocol.messages import Decision
from cornus.runtime.wire import ExecuteRequest, ExecuteStatus, Op, OpKind
from tests.runtime.faults import DroppingMessages, local_cluster

pytestmark = pytest.mark.timeout(60)


async def test_a_request_of_a_transaction_a_machine_runs_is_answered_committing_while_its_partition_settles(
        tmp_path):
    async with local_cluster(tmp_path, node_count=2, partition_count=2) as cluster:
        n0, n1 = cluster.node("n0"), cluster.node("n1")
        cluster.network.handlers["n1"] = DroppingMessages(cluster.network.handlers["n1"], Decision)
        outcome = await n0.execute([Op(OpKind.PUT, cluster.key_in("p0", "a"), b"1"),
                                    Op(OpKind.PUT, cluster.key_in("p1", "b"), b"2")])
        txn = outcome.txn
        # n1's machine waits for the decision; its termination's writes are held, so it goes on.
        gate = cluster.faults["n1"].hold("log_once")
        assert txn in n1.core.partitions["p1"].machines
        served_since = n1.serving.pop("p1")  # as in the settle after a recovery
        try:
            response = await n1.on_request("n0", ExecuteRequest(txn, "p1", "n0", ()))
        finally:
            n1.serving["p1"] = served_since
            gate.set()
        assert response.status is ExecuteStatus.ABORTED and "committing" in response.detail, response
