"""Random schedules for every protocol: hypothesis builds fault plans (crashes, outages, loss,
delays, votes); a seeded batch adds breadth. CI's share; the explorer runs >= 100,000 each."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cornus.protocol.config import Protocol
from cornus.sim.explore import explore, run_schedule
from cornus.sim.schedule import FAULTS_END_MS, Crash, Outage, Schedule
from cornus.sim.world import World

NODES = ("c0", "p0", "p1", "p2", "p3")
LOGS = ("c.c0", "p.p0", "p.p1", "p.p2", "p.p3")


@st.composite
def schedules(draw: st.DrawFn) -> Schedule:
    votes = tuple(draw(st.lists(st.sampled_from((True, True, True, False)), min_size=1, max_size=4)))
    nodes = NODES[: len(votes) + 1]
    crashes = draw(st.lists(
        st.builds(Crash, st.sampled_from(nodes), st.integers(0, FAULTS_END_MS), st.integers(1, 700)),
        max_size=3,
    ))
    outages = []
    some_logs = st.sets(st.sampled_from(LOGS[: len(votes) + 1]), min_size=1)
    windows = st.lists(st.tuples(st.integers(0, 700), st.integers(1, 300), some_logs), max_size=2)
    for start, length, logs in draw(windows):
        outages.append(Outage(tuple(sorted(logs)), start, min(FAULTS_END_MS, start + length)))
    return Schedule(
        seed=draw(st.integers(0, 2**32 - 1)),
        votes=votes,
        read_only_count=draw(st.integers(0, 1)),
        loss_probability=draw(st.sampled_from((0.0, 0.05, 0.3))),
        delay_ms_max=draw(st.sampled_from((1, 20, 60))),
        storage_ms_max=draw(st.sampled_from((1, 10, 40))),
        ambiguous_probability=draw(st.sampled_from((0.0, 0.5, 1.0))),
        crashes=tuple(crashes),
        outages=tuple(outages),
    )


@pytest.mark.parametrize("protocol", list(Protocol))
@settings(max_examples=400, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(schedule=schedules())
def test_hypothesis_schedules_keep_every_invariant(protocol: Protocol, schedule: Schedule) -> None:
    assert run_schedule(protocol, schedule) == []


@pytest.mark.parametrize("protocol", list(Protocol))
def test_seeded_random_schedules_keep_every_invariant(protocol: Protocol) -> None:
    count, failures = explore(protocol, 4000, seed=20240601)
    assert count == 4000
    assert failures == []


def test_same_seed_same_run() -> None:
    import random

    from cornus.sim.schedule import random_schedule

    schedule = random_schedule(random.Random(99))
    first, second = World(Protocol.CORNUS, schedule), World(Protocol.CORNUS, schedule)
    first.run()
    second.run()
    assert first.outcome == second.outcome
    assert first.now_ms == second.now_ms
