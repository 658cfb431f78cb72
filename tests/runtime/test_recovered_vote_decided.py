"""A 2PC participant that restarts with a yes vote whose coordinator logged COMMIT and then left
for good (a node scaled away) commits it from that log, instead of asking the gone coordinator
for ever with the transaction's keys locked.

Found by audit (2026-11-28): recovery scanned the coordinator's log, found the COMMIT, and still
rebuilt the vote to ask the coordinator (Recovery's RecoveryResult.committed now names it).
"""

from __future__ import annotations

import pytest

from cornus.protocol.config import Protocol
from cornus.protocol.messages import Decision, DecisionAnswer
from cornus.runtime.outcome import OutcomeStatus
from cornus.runtime.wire import Op, OpKind
from tests.runtime.faults import DroppingMessages, local_cluster, wait_until

pytestmark = pytest.mark.timeout(90)


async def test_a_restarted_participant_commits_from_the_log_of_a_coordinator_gone_for_good(tmp_path):
    async with local_cluster(tmp_path, node_count=2, partition_count=2, protocol=Protocol.TWO_PC) as cluster:
        n1 = cluster.node("n1")
        cluster.network.handlers["n1"] = DroppingMessages(cluster.network.handlers["n1"], Decision, DecisionAnswer)
        mine, theirs = cluster.key_in("p0", "a"), cluster.key_in("p1", "b")  # n0 owns p0, n1 owns p1
        outcome = await cluster.node("n0").execute([Op(OpKind.PUT, mine, b"1"), Op(OpKind.PUT, theirs, b"2")])
        assert outcome.status is OutcomeStatus.COMMITTED, outcome
        assert (await cluster.coordinator_record("n0", outcome.txn)).state.value == "COMMIT"
        assert outcome.txn in n1.core.partitions["p1"].machines  # voted, and never told
        await cluster.stop("n0")  # gone for good: its decision never reaches n1
        await cluster.restart("n1")
        n1 = cluster.node("n1")

        async def applied() -> bool:
            return await cluster.value(theirs) == b"2"

        await wait_until(applied, 20, "n1 never applied the COMMIT its coordinator logged before it left")
        assert outcome.txn not in n1.core.partitions["p1"].machines
