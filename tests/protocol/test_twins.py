"""Two processes running as one coordinator (a pod force-deleted with `kubectl delete --force`
while its process ran on, beside its replacement): what the simulator's Twin schedules show.

Cornus's coordinator logs nothing, and every participant decides from the participants' logs, so
a second process of its coordinator cannot split a transaction. 2PC and coordinator-log presume
ABORT for what a coordinator does not know, which the other process may commit: before each
process took its node's identity (NodeCore.start) and fenced its coordinator log with it, the
explorer split a transaction at schedule 245 of seed 1 (2PC) and 318 of seed 3 (coordinator-log).
Now the first process's late COMMIT is refused by storage, and its presumption waits for a read
of the identity record, which deposes it."""

from __future__ import annotations

import random

import pytest

from cornus.protocol.config import Protocol
from cornus.sim.explore import explore
from cornus.sim.invariants import check
from cornus.sim.schedule import random_schedule
from cornus.sim.world import World

SCHEDULE_COUNT = 1500


def test_cornus_survives_a_second_process_of_its_coordinator() -> None:
    rng = random.Random(5)
    twins = 0
    for _ in range(SCHEDULE_COUNT):
        schedule = random_schedule(rng, Protocol.CORNUS, twins=True)
        twins += len(schedule.twins)
        world = World(schedule)
        world.run()
        assert not check(world), (schedule, check(world))
    assert twins > SCHEDULE_COUNT // 16, f"only {twins} schedules had a second process"


@pytest.mark.parametrize(("protocol", "seed"), [(Protocol.TWO_PC, 1), (Protocol.COORDINATOR_LOG, 3)])
def test_a_blocking_protocol_survives_a_second_process_of_its_coordinator(protocol: Protocol, seed: int) -> None:
    """The seeds that found the split: the second process, asked about a transaction of the
    first, answered ABORT, and the first then logged COMMIT."""
    count, failures = explore(protocol, SCHEDULE_COUNT, seed=seed, report_max=1, twins=True)
    assert not failures, f"after {count} schedules: {failures[0][1]}"
