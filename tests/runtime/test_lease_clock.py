"""The lease clock counts time the machine spent suspended (found by review): CLOCK_MONOTONIC
stops while a machine is suspended or hibernated, and a node resumed from one believed its lease
still good, long after another node had taken its partitions."""

from __future__ import annotations

import time

import pytest

from tests.runtime.faults import local_cluster

pytestmark = pytest.mark.timeout(60)

SUSPENDED_NS = 3600 * 10**9


async def test_a_node_resumed_from_a_suspend_finds_its_leases_lapsed(tmp_path, monkeypatch):
    async with local_cluster(tmp_path, partition_count=1) as cluster:
        node = cluster.node()
        assert node.ownership.fence("p0") is not None
        real = time.clock_gettime_ns

        def after_a_suspend(clock: int) -> int:
            # CLOCK_BOOTTIME went on while the machine slept; CLOCK_MONOTONIC did not.
            boottime = getattr(time, "CLOCK_BOOTTIME", None)
            return real(clock) + (SUSPENDED_NS if clock == boottime else 0)

        monkeypatch.setattr(time, "clock_gettime_ns", after_a_suspend)
        assert node.ownership.fence("p0") is None, "a lease held across an hour of suspend"
