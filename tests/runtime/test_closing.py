"""A node that is stopping cleanly starts no commit (found by review): it waits only for the
decisions of commits already under way, so one that started later could be left undelivered by a
node about to leave the cluster."""

from __future__ import annotations

import pytest

from cornus.runtime.outcome import AbortReason, OutcomeStatus
from tests.runtime.faults import local_cluster, puts, wait_until

pytestmark = pytest.mark.timeout(60)


async def test_a_stopping_node_refuses_to_commit_and_releases_the_transaction(tmp_path):
    """Refused, the transaction is aborted: its executions and locks on other nodes' partitions
    went only at their idle sweep, a minute later (found by review). Its caller hears the abort,
    retryable (found by audit, 2026-11-28, second: a 503 "nothing changed, retry" of a transaction
    the commit had just aborted, whose retry of the commit heard "already ended: aborted")."""
    async with local_cluster(tmp_path, node_count=2, partition_count=2) as cluster:
        n0, n1 = cluster.node("n0"), cluster.node("n1")
        remote = next(p for p in cluster.partitions if cluster.owner_of(p) == "n1")
        key = cluster.key_in(remote)
        txn = n0.begin()
        await n0.run_ops(txn, puts({key: b"v"}))
        n0.coordination.closing = True  # what a clean stop sets first
        refused = await n0.commit(txn)
        assert refused.status is OutcomeStatus.ABORTED and refused.reason is AbortReason.PEER_UNAVAILABLE, refused
        assert "stopping" in refused.detail and refused.retryable
        assert txn not in n1.partitions[remote].executions
        other = await n1.execute(puts({key: b"w"}))
        assert other.status is OutcomeStatus.COMMITTED, other

        async def applied() -> bool:
            return await cluster.value(key) == b"w"

        await wait_until(applied, 10, "the other writer's commit was never applied")
