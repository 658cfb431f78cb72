"""A one-shot whose caller is cancelled after its transaction committed, while it still waits for an
owner's answer (the values read there): the node keeps the outcome COMMITTED, not an entry that
stays UNKNOWN for the life of the process with its writes' bytes held.

Found by audit (2026-11-28): the entry was finished only after that wait, so a cancel within it (a
REST request cut by the server's shutdown) left it in the node's table, its state UNKNOWN, its
share of WRITES_HELD_BYTES_MAX never given back; the status call answered UNKNOWN for a transaction
every log held committed.
"""

from __future__ import annotations

import asyncio

import pytest

from cornus.runtime.outcome import OutcomeStatus
from cornus.runtime.wire import Op, OpKind
from tests.runtime.faults import HoldingAnswers, local_cluster, wait_until

pytestmark = pytest.mark.timeout(60)


async def test_a_one_shot_cancelled_after_its_commit_is_remembered_committed(tmp_path):
    async with local_cluster(tmp_path, node_count=2, partition_count=2) as cluster:
        local, remote = cluster.key_in("p0", "a"), cluster.key_in("p1", "b")  # n0 owns p0, n1 owns p1
        assert cluster.owner_of("p1") == "n1"
        holding = HoldingAnswers(cluster.network.handlers["n1"])
        cluster.network.handlers["n1"] = holding
        node = cluster.node("n0")
        coordination = node.coordination
        committed: list[str] = []
        coordination.outcome_observers.append(
            lambda _protocol, outcome: committed.append(outcome.txn)
            if outcome.status is OutcomeStatus.COMMITTED else None)
        one_shot = asyncio.ensure_future(node.execute([Op(OpKind.PUT, local, b"1"), Op(OpKind.GET, remote)]))
        # Both votes are in and the machine replied COMMIT; the caller still waits for p1's answer.
        async def replied() -> bool:
            return holding.held_count == 1 and (bool(committed) or any(
                ctx.reply is not None and ctx.reply.done() for ctx in coordination.txns.values()))

        await wait_until(replied, 10, "the one-shot never committed")
        txn = committed[0] if committed else next(iter(coordination.txns))
        one_shot.cancel()
        with pytest.raises(asyncio.CancelledError):
            await one_shot
        holding.release.set()
        assert txn not in coordination.txns, "the committed one-shot's entry outlived its caller"
        assert coordination.writes_held_bytes == 0
        known = coordination.known(txn)
        assert known is not None and known.status is OutcomeStatus.COMMITTED, known
        read = await node.execute([Op(OpKind.GET, local)])
        assert dict(read.reads) == {local: b"1"}, read
