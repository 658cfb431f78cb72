"""A node whose identity a later process took parks (cornus.runtime.node): in process, what the
real-process test (tests/cluster/test_second_process.py) cannot time."""

from __future__ import annotations

import asyncio

import pytest

from cornus.protocol.effects import RecoveryFinished
from tests.runtime.faults import local_cluster

pytestmark = pytest.mark.timeout(60)


async def test_a_recovery_settling_after_the_node_was_deposed_serves_nothing(tmp_path) -> None:
    """Found by review: a recovery still waiting for its transactions to resolve (up to 5 s) when
    the node was deposed then served its partitions again, and logged it."""
    async with local_cluster(tmp_path, node_count=1, partition_count=2) as cluster:
        node = cluster.node()
        partition = sorted(node.serving)[0]
        node._deposed("a later process took the identity")
        await asyncio.sleep(0)
        assert not node.serving and not node.ready
        # What Readiness._settle calls once its wait ends.
        node.readiness.settled(RecoveryFinished(0, (partition,), node=False))
        assert partition not in node.serving, f"the deposed node serves {partition} again"
