"""Two processes running as one coordinator (a pod force-deleted with `kubectl delete --force`
while its process ran on, beside its replacement): what the simulator's Twin schedules show.

Cornus's coordinator logs nothing, and every participant decides from the participants' logs, so
a second process of its coordinator cannot split a transaction: the explorer finds nothing. 2PC
and coordinator-log presume ABORT for what a coordinator does not know, which the first process
may still commit: the explorer finds the split. That is a known limitation (docs/deploy.md, "One
process per node id"); its fix is fencing the coordinator log by node id, as partitions are
fenced. The strict xfail turns into a failure the day the fix lands, so that this file is
updated with it."""

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


@pytest.mark.xfail(strict=True, reason="known: docs/deploy.md, 'One process per node id'")
@pytest.mark.parametrize(("protocol", "seed"), [(Protocol.TWO_PC, 1), (Protocol.COORDINATOR_LOG, 3)])
def test_a_blocking_protocol_survives_a_second_process_of_its_coordinator(protocol: Protocol, seed: int) -> None:
    """Found at schedule 245 of seed 1 (2PC) and 318 of seed 3 (coordinator-log): the second
    process, asked about a transaction of the first, answers ABORT, and the first logs COMMIT."""
    count, failures = explore(protocol, SCHEDULE_COUNT, seed=seed, report_max=1, twins=True)
    assert not failures, f"after {count} schedules: {failures[0][1]}"
