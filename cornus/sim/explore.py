"""Explorer: run many random schedules and report invariant violations.

    python -m cornus.sim.explore --protocol cornus --schedules 100000 --seed 1
    python -m cornus.sim.explore --protocol mixed --schedules 100000 --seed 1 --workers 2

`mixed` gives each transaction of a world its own protocol. `--twins` adds schedules where a second
process of a coordinator starts while the first runs on (a force-deleted pod): Cornus survives
them; 2PC and coordinator-log do not yet (docs/deploy.md, "One process per node id"). `--sweeps`
runs sweepers on every node, adds the faults that leave records behind for them
(cornus.sim.schedule.with_sweeps), and reports what they swept and skipped. Exits
non-zero if any schedule violates an invariant, printing the first few with their schedule so
they can be replayed (a run is a pure function of its schedule).
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import random
import sys
import time
from collections.abc import Callable

from cornus.protocol.config import Protocol
from cornus.sim.invariants import check
from cornus.sim.schedule import Schedule, random_schedule
from cornus.sim.world import World
from storage_adapters.contract import TxnState

MIXED = "mixed"
REPORT_COUNT_MAX = 5


def run_schedule(schedule: Schedule, **world_options: object) -> list[str]:
    world = World(schedule, **world_options)  # type: ignore[arg-type]
    world.run()
    return check(world)


Failures = list[tuple[Schedule, list[str]]]


def explore(
    protocol: Protocol | None, schedules: int, seed: int, report_max: int = REPORT_COUNT_MAX, *,
    twins: bool = False, storage_cuts: bool = False, sweeps: bool = False,
    only: Callable[[Schedule], bool] | None = None, **world_options: object,
) -> tuple[int, Failures]:
    """Run `schedules` random schedules (`protocol` None: mixed; `twins`: some with a second
    process of a coordinator, and `storage_cuts` some of them cut from storage alone; `sweeps`:
    sweepers on every node: random_schedule); stop early after `report_max` failures. Returns
    how many of the seed's stream were drawn and the failures. `only` runs just the schedules it
    accepts (a test of one kind of fault spends no CPU on the others; the stream, and so the
    schedule a failure is found at, is the same)."""
    rng = random.Random(seed)
    failures: Failures = []
    count = 0
    for _ in range(schedules):
        schedule = random_schedule(rng, protocol, twins=twins, storage_cuts=storage_cuts, sweeps=sweeps)
        count += 1
        if only is not None and not only(schedule):
            continue
        violations = run_schedule(schedule, **world_options)
        if violations:
            failures.append((schedule, violations))
            if len(failures) >= report_max:
                break
    return count, failures


def _explore_share(args: tuple[str, int, int, bool, bool, bool]) -> tuple[int, Failures, dict[str, int]]:
    name, schedules, seed, twins, storage_cuts, sweeps = args
    protocol = None if name == MIXED else Protocol(name)
    rng = random.Random(seed)
    failures: Failures = []
    faults: collections.Counter[str] = collections.Counter()
    for _ in range(schedules):
        schedule = random_schedule(rng, protocol, twins=twins, storage_cuts=storage_cuts, sweeps=sweeps)
        world = World(schedule)
        world.run()
        violations = check(world)
        faults["crashes"] += len(schedule.crashes)
        faults["outages"] += len(schedule.outages)
        faults["resolves"] += len(schedule.resolves)
        faults["transactions"] += len(schedule.txns)
        faults["committed"] += sum(
            1 for txn in world.txns if TxnState.COMMIT in world.storage.decisions_seen.get(txn, set())
        )
        faults["terminations"] += world.outcome.terminations
        faults["terminations_given_up"] += world.outcome.terminations_given_up
        faults["late_landings"] += world.outcome.late_landings
        faults["late_duplicates"] += world.outcome.late_duplicates
        faults["status_questions"] += world.outcome.status_questions
        faults["status_not_known"] += world.outcome.status_not_known
        faults["small_scan_pages"] += schedule.scan_page_max < 500
        faults["moves"] += len(schedule.moves)
        faults["move_gaps"] += sum(move.gap_ms > 0 for move in schedule.moves)
        faults["move_lapses"] += sum(move.lapse_ms > 0 for move in schedule.moves)
        faults["writes_skipped_not_held"] += world.outcome.writes_skipped_not_held
        faults["timers_dropped_not_held"] += world.outcome.timers_dropped_not_held
        faults["reads_out_when_lost"] += world.outcome.reads_out_when_lost
        faults["twins"] += len(schedule.twins)
        faults["fenced_writes"] += world.outcome.fenced_writes
        faults["deposed"] += world.outcome.deposed
        faults["vacancy_exits"] += world.outcome.vacancy_exits
        faults["told_nothing_ran"] += len(world.outcome.told_nothing_ran)
        faults["refused_starting_in_doubt"] += world.outcome.refused_starting_in_doubt
        faults["refused_deposed_in_doubt"] += world.outcome.refused_deposed_in_doubt
        faults["refused_identity_stale"] += world.outcome.refused_identity_stale
        faults["stale_answers"] += world.outcome.stale_answers
        faults["lock_waits"] += world.outcome.lock_waits
        faults["wait_die_schedules"] += schedule.wait_die
        faults["slow_read_schedules"] += schedule.slow_read_probability > 0
        faults["thinking_schedules"] += schedule.think_ms > 0
        if sweeps:
            # Only then, so that every other run prints what it always did: records swept and
            # skipped by reason (the sweepers' own counts), and the oracle's.
            faults.update({f"sweep_{key}": value for key, value in world.sweep_counters.items()})
            faults.update({f"sweep_{key}": value for key, value in world.sweep_stats.items()})
        if violations:
            faults["violating_schedules"] += 1
            if len(failures) < REPORT_COUNT_MAX:
                failures.append((schedule, violations))
    return schedules, failures, dict(faults)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--protocol", choices=[*(p.value for p in Protocol), MIXED], required=True)
    parser.add_argument("--schedules", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", type=int, default=1, help="processes sharing the schedules")
    parser.add_argument("--twins", action="store_true",
                        help="one schedule in eight starts a second process of a coordinator beside the first")
    parser.add_argument("--storage-cuts", action="store_true",
                        help="with --twins: the schedules that cut a first process off cut it from storage alone")
    parser.add_argument("--sweeps", action="store_true",
                        help="every node runs sweepers, and faults leave records behind for them")
    args = parser.parse_args(argv)
    if args.schedules < 1 or args.workers < 1:
        parser.error("--schedules and --workers must be at least 1")
    if args.storage_cuts and not args.twins:
        parser.error("--storage-cuts cuts the first of two processes: it needs --twins")
    started = time.perf_counter()
    shares = [
        (args.protocol, args.schedules // args.workers + (i < args.schedules % args.workers), args.seed * 1000 + i,
         args.twins, args.storage_cuts, args.sweeps)
        for i in range(args.workers)
    ]
    if args.workers == 1:
        results = [_explore_share(shares[0])]
    else:
        with multiprocessing.Pool(args.workers) as pool:
            results = pool.map(_explore_share, shares)
    elapsed = time.perf_counter() - started
    count = sum(r[0] for r in results)
    failures = [f for r in results for f in r[1]]
    totals: collections.Counter[str] = collections.Counter()
    for r in results:
        totals.update(r[2])
    violating = totals.pop("violating_schedules", 0)
    print(f"protocol={args.protocol} seed={args.seed} schedules={count} time={elapsed:.1f}s "
          f"({count / elapsed:.0f}/s) violations={violating}")
    print("  " + " ".join(f"{name}={value}" for name, value in sorted(totals.items())))
    for schedule, violations in failures[:REPORT_COUNT_MAX]:
        print(f"  {schedule}")
        for violation in violations:
            print(f"    - {violation}")
    return 1 if violating else 0


if __name__ == "__main__":
    sys.exit(main())
