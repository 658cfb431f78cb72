"""A node's housekeeping loops (the idle sweep, the ownership ticker) run for its life: one that
fails crashes the node loudly.

Found by audit (2026-11-28): neither had a done callback, so an error in either ended the loop
silently, and the node ran on with abandoned executions never idled out (their locks held until a
restart) or with its leases never renewed.
"""

from __future__ import annotations

import dataclasses

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


async def test_a_parked_process_whose_vacancy_watch_fails_crashes(tmp_path, monkeypatch):
    """Found by audit (2026-11-28, second): a deposed process watches its node's identity record
    until the process that took it renews it no more, then exits to be restarted. An error other
    than StorageUnavailable (a malformed record) ended the watch silently: nothing awaited the
    task, and the process stayed parked for ever, the node with no live process if the other went."""
    async with local_cluster(tmp_path, partition_count=2) as cluster:
        node = cluster.node()
        # Read soon, not a check interval on.
        monkeypatch.setattr(node.parking, "_config", dataclasses.replace(node.parking._config, identity_check_ms=50))

        async def read_owners(names):
            raise Broken("a record the watch cannot read")

        monkeypatch.setattr(node.parking._store, "read_owners", read_owners)
        node._deposed("a test took the identity")

        async def crashed() -> bool:
            return bool(cluster.exits)

        await wait_until(crashed, 10, "the watch failed and the process stayed parked")
        assert set(cluster.exits) == {70}, cluster.exits
        cluster.exits.clear()  # the crash this test asks for
        monkeypatch.undo()
