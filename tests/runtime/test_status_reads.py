"""A node's answer to the status call reads the transaction's record in every partition it serves
side by side, within the asking node's wait for it.

Found by audit (2026-11-28): it read them one after another, so a node serving a few hundred
partitions on cloud storage (10 ms a read) took longer than the asker waits for any node
(timeout_ms_peer_request, 2 s), and the status call said "unknown" of every transaction the
nodes' memory no longer held: committed ones whose coordinator restarted, say.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from cornus.runtime.outcome import OutcomeStatus
from tests.runtime.faults import keys_in, local_cluster, puts

pytestmark = pytest.mark.timeout(90)

PARTITION_COUNT = 48
READ_DELAY_S = 0.06  # 48 reads one after another: 2.9 s, past the 2 s the asker waits


async def test_a_status_answer_reads_its_partitions_side_by_side(tmp_path):
    async with local_cluster(tmp_path, partition_count=PARTITION_COUNT) as cluster:
        node = cluster.node()
        keys = keys_in(PARTITION_COUNT, ["p0", "p1"])
        outcome = await node.execute(puts({keys["p0"]: b"a", keys["p1"]: b"b"}))
        assert outcome.status is OutcomeStatus.COMMITTED, outcome
        txn = outcome.txn
        # The coordinator's memory of it gone (a restart): only the records can tell.
        node.coordination.outcomes.pop(txn)
        node.core.coordinator.machines.pop(txn, None)
        store = node.admin.store
        real_read = store.read
        reads: list[float] = []

        async def slow_read(*args: Any, **kwargs: Any) -> Any:
            reads.append(asyncio.get_running_loop().time())
            await asyncio.sleep(READ_DELAY_S)
            return await real_read(*args, **kwargs)

        store.read = slow_read  # type: ignore[method-assign]
        try:
            status = await node.resolve_status(txn)
        finally:
            store.read = real_read  # type: ignore[method-assign]
        assert len(reads) >= PARTITION_COUNT
        assert status is not None and status.status is OutcomeStatus.COMMITTED, status
