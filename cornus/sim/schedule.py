"""A schedule: everything that varies between simulator runs, drawn from one seeded RNG (the
explorer) or built by hypothesis (the tests). Times are simulated milliseconds."""

from __future__ import annotations

import random
from dataclasses import dataclass

# Faults (crashes, outages, message loss for the blocking protocols) happen only before this time;
# afterwards every node is up and storage is reachable, so liveness can be judged.
FAULTS_END_MS = 1000


@dataclass(frozen=True, slots=True)
class Crash:
    node: str
    at_ms: int
    down_ms: int


@dataclass(frozen=True, slots=True)
class Outage:
    """Storage unreachable for the named logs (log keys) from start to end."""

    logs: tuple[str, ...]
    start_ms: int
    end_ms: int


@dataclass(frozen=True, slots=True)
class Schedule:
    seed: int
    votes: tuple[bool, ...]  # one per written partition: does it want to commit?
    read_only_count: int = 0
    loss_probability: float = 0.0
    delay_ms_max: int = 20
    storage_ms_max: int = 10
    # An unreachable storage call takes effect anyway with this probability (it timed out after
    # the write landed), which is what makes retries and terminations subtle.
    ambiguous_probability: float = 0.5
    crashes: tuple[Crash, ...] = ()
    outages: tuple[Outage, ...] = ()

    def __post_init__(self) -> None:
        assert 1 <= len(self.votes) <= 8
        assert 0.0 <= self.loss_probability < 1.0
        assert self.delay_ms_max >= 1 and self.storage_ms_max >= 1
        for crash in self.crashes:
            assert 0 <= crash.at_ms <= FAULTS_END_MS and crash.down_ms >= 1
        for outage in self.outages:
            assert 0 <= outage.start_ms <= outage.end_ms <= FAULTS_END_MS

    @property
    def partitions(self) -> tuple[str, ...]:
        return tuple(f"p{i}" for i in range(len(self.votes)))


def random_schedule(rng: random.Random) -> Schedule:
    """A cheap, varied schedule: small clusters, mostly yes votes, frequent faults."""
    count = rng.choice((1, 2, 2, 3, 3, 3, 4, 5))
    votes = tuple(rng.random() < 0.9 for _ in range(count))
    partitions = [f"p{i}" for i in range(count)]
    nodes = ["c0", *partitions]
    crashes = tuple(
        Crash(rng.choice(nodes), rng.randrange(0, 400 if rng.random() < 0.7 else FAULTS_END_MS), rng.randrange(1, 600))
        for _ in range(rng.choice((0, 1, 1, 2, 3)))
    )
    logs = ["c.c0", *(f"p.{p}" for p in partitions)]
    outages = []
    for _ in range(rng.choice((0, 0, 1, 2))):
        start = rng.randrange(0, 600)
        chosen = tuple(sorted(rng.sample(logs, rng.randrange(1, len(logs) + 1))))
        outages.append(Outage(chosen, start, min(FAULTS_END_MS, start + rng.randrange(1, 500))))
    return Schedule(
        seed=rng.getrandbits(32),
        votes=votes,
        read_only_count=rng.choice((0, 0, 1)),
        loss_probability=rng.choice((0.0, 0.0, 0.05, 0.2)),
        delay_ms_max=rng.choice((2, 20, 60)),
        storage_ms_max=rng.choice((2, 10, 40)),
        crashes=crashes,
        outages=tuple(outages),
    )
