"""A hand-over of an idle partition writes its release (found by review): the holder asked for it
drains at once, but its renewal was still in flight, and the release it skipped for that left the
preferred node waiting out the lease and the clock slack."""

from __future__ import annotations

import time

import pytest

from tests.runtime.faults import local_cluster, wait_until

pytestmark = pytest.mark.timeout(60)


async def test_an_idle_hand_over_writes_its_release(tmp_path):
    async with local_cluster(tmp_path, node_count=2, partition_count=2) as cluster:
        n1 = cluster.node("n1")
        await cluster.stop("n0")  # releases p0, which n1 takes

        async def n1_serves_p0() -> bool:
            return "p0" in n1.serving

        await wait_until(n1_serves_p0, 10, "n1 never took p0")
        before = len(cluster.faults["n1"].calls)
        started = time.monotonic()
        await cluster.start("n0")  # p0's preferred node asks for it back
        n0 = cluster.node("n0")

        async def n0_serves_p0() -> bool:
            return "p0" in n0.serving

        await wait_until(n0_serves_p0, 15, "n0 never got p0 back")
        took_s = time.monotonic() - started
        releases = [c for c in cluster.faults["n1"].calls[before:]
                    if c.method == "write_owner" and c.args["new"].partition == "p0" and c.args["new"].owner == ""]
        assert releases, f"n1 handed p0 over without writing the release; n0 waited {took_s:.2f} s"
