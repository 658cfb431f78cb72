"""A node's housekeeping loops (the idle sweep, the ownership ticker) run for its life: one that
fails crashes the node loudly.

Found by audit (2026-11-28): neither had a done callback, so an error in either ended the loop
silently, and the node ran on with abandoned executions never idled out (their locks held until a
restart) or with its leases never renewed.
"""

from __future__ import annotations

import pytest

from tests.runtime.faults import local_cluster, wait_until

pytestmark = pytest.mark.timeout(60)


class Broken(Exception):
    pass


def _raise(*args: object) -> None:
    raise Broken("a bug in a housekeeping step")


@pytest.mark.parametrize("loop", ["sweep", "ownership"])
async def test_a_housekeeping_loop_that_fails_crashes_the_node(tmp_path, monkeypatch, loop):
    async with local_cluster(tmp_path, partition_count=2) as cluster:
        node = cluster.node()
        if loop == "sweep":
            monkeypatch.setattr(node.coordination, "sweep_idle", _raise)
        else:
            monkeypatch.setattr(type(node.ownership.machine), "tick", _raise)  # every node's

        async def crashed() -> bool:
            return bool(cluster.exits)

        await wait_until(crashed, 10, f"the {loop} loop failed and the node ran on")
        assert set(cluster.exits) == {70}, cluster.exits
        cluster.exits.clear()  # the crash this test asks for
        monkeypatch.undo()
