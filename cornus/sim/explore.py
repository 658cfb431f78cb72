"""Explorer: run many random schedules of one protocol and report invariant violations.

    python -m cornus.sim.explore --protocol cornus --schedules 100000 --seed 1

Exits non-zero if any schedule violates an invariant, printing the first few with their schedule
so they can be replayed (a run is a pure function of its schedule).
"""

from __future__ import annotations

import argparse
import random
import sys
import time

from cornus.protocol.config import Protocol
from cornus.sim.invariants import check
from cornus.sim.schedule import Schedule, random_schedule
from cornus.sim.world import World


def run_schedule(protocol: Protocol, schedule: Schedule, **world_options: object) -> list[str]:
    world = World(protocol, schedule, **world_options)  # type: ignore[arg-type]
    world.run()
    return check(world)


Failures = list[tuple[Schedule, list[str]]]


def explore(
    protocol: Protocol, schedules: int, seed: int, report_max: int = 5, **world_options: object
) -> tuple[int, Failures]:
    rng = random.Random(seed)
    failures: list[tuple[Schedule, list[str]]] = []
    for _ in range(schedules):
        schedule = random_schedule(rng)
        violations = run_schedule(protocol, schedule, **world_options)
        if violations:
            failures.append((schedule, violations))
            if len(failures) >= report_max:
                break
    return schedules, failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--protocol", choices=[p.value for p in Protocol], required=True)
    parser.add_argument("--schedules", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    count, failures = explore(Protocol(args.protocol), args.schedules, args.seed)
    elapsed = time.perf_counter() - started
    print(f"protocol={args.protocol} seed={args.seed} schedules={count} "
          f"time={elapsed:.1f}s ({count / elapsed:.0f}/s) violations={len(failures)}")
    for schedule, violations in failures:
        print(f"  {schedule}")
        for violation in violations:
            print(f"    - {violation}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
