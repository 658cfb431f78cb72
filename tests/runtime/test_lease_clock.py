"""The lease clock counts time the machine spent suspended (found by review): CLOCK_MONOTONIC
stops while a machine is suspended or hibernated, and a node resumed from one believed its lease
still good, long after another node had taken its partitions."""

from __future__ import annotations

import collections
import time

import pytest

from storage_adapters.store import CallDeadline
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


async def test_a_node_resumed_from_a_suspend_reads_its_identity_before_writing_for_itself(tmp_path, monkeypatch):
    """Found by review: the identity window (a node's own unfenced writes, cornus.runtime.identity)
    counted on the event loop's clock, which a suspend stops: a process resumed after a later one
    of its node had collected a transaction still found its window open, and its termination's
    ABORT could re-create the collected record."""
    async with local_cluster(tmp_path, partition_count=1) as cluster:
        holder = cluster.node().runner.identity
        counters: collections.Counter[str] = collections.Counter()
        deadline = CallDeadline.after(1)
        assert await holder.write_deadline(deadline, 1.0, counters) is not None
        # Within the window now: a read just confirmed the identity, and the loop's clock barely moved.
        assert await holder.write_deadline(deadline, 1.0, counters) == deadline
        reads = counters["identity_reads_for_writes"]
        real = time.clock_gettime_ns

        def after_a_suspend(clock: int) -> int:
            boottime = getattr(time, "CLOCK_BOOTTIME", None)
            return real(clock) + (SUSPENDED_NS if clock == boottime else 0)

        monkeypatch.setattr(time, "clock_gettime_ns", after_a_suspend)
        admitted = await holder.write_deadline(deadline, 1.0, counters)
        assert counters["identity_reads_for_writes"] == reads + 1, "a write left on a window an hour old"
        assert isinstance(admitted, CallDeadline) and admitted != deadline
