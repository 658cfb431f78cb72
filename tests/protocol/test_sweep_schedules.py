"""The sweepers explored by the simulator (docs/sweeper-design.md, step 6): every node of a sweep
schedule runs a sweeper per partition it holds and one for its own coordinator log, and every
tombstone one writes is checked against the world (cornus.sim.sweeps: no yes vote left, nothing
still deciding or able to vote, no write landing after it, the status call's window kept), and at
the end that what crashes left behind was collected. CI's share is small (its CPU is tight); the
explorer runs more (python -m cornus.sim.explore --sweeps).

And, as test_simulator_finds_old_bugs.py does for the rest of the core, the simulator must tell a
wrong sweeper from the right one: each of the last tests puts back a rule the design's review
rejected and finds it broken on a schedule built for it, which the real sweeper passes."""

from __future__ import annotations

import collections
import dataclasses
import random
import types
from collections.abc import Callable

import pytest

from cornus.protocol import status, sweeper, txn_ids
from cornus.protocol.config import Protocol, ProtocolConfig
from cornus.protocol.coordinator_cornus import CornusCoordinator
from cornus.protocol.effects import Effect, ScanFinished, Send
from cornus.protocol.messages import Decision, Vote
from cornus.protocol.node_core import NodeCore
from cornus.protocol.sweeper import SweepConfig, Sweeper, sweep_age_ms_min
from cornus.sim import sweeps
from cornus.sim.explore import explore
from cornus.sim.invariants import check
from cornus.sim.schedule import Abandon, Schedule, StorageCut, TxnPlan, random_schedule
from cornus.sim.status_probe import Question
from cornus.sim.steps import STEP_STATUS
from cornus.sim.world import EffectHook, World
from storage_adapters.contract import Record, TxnState

# Sweep schedules of the mixed stream CI runs (some 25 ms each), and their seed.
SWEEP_SCHEDULE_COUNT = 90
SEED = 29


def isolated(name: str) -> EffectHook:
    """A hook that loses every message to node `name`: its coordinator hears no vote and no
    acknowledgement, and decides only through the logs, or not at all."""
    def hook(world: World, node: str, effect: Effect) -> str | None:
        return "drop" if isinstance(effect, Send) and effect.to == name else None
    return hook


def _cut_cornus_coordinator(terminate_limit_ms: int, partitions: int) -> Schedule:
    """A Cornus one-shot whose coordinator c0 hears nothing from its participants and is cut off
    from storage alone: it terminates, unanswered, until its bound W; its participants commit
    by their own termination and nobody collects their records, but a sweeper."""
    plan = TxnPlan("c0", Protocol.CORNUS, 0, tuple((f"p{i}", 0) for i in range(partitions)), one_shot=True)
    return Schedule(seed=1, partition_count=partitions, txns=(plan,), storage_ms_max=2, delay_ms_max=2,
                    ambiguous_probability=0.0, terminate_limit_ms=terminate_limit_ms, sweep_interval_ms=50,
                    storage_cuts=(StorageCut("c0", 1, 3_000),))


def test_a_sweeper_tombstone_outlasts_what_the_status_call_counts_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by the simulator (step 6): sweep_age_ms_min ranged over the writes that may
    still reach a record, not the status call's window. With a termination bound W shorter than
    the grace, a committed transaction whose coordinator gave up was swept some 350 ms after its
    begin, its tombstone gone a keep later, and the status call, which counts on a record until
    gc_grace_ms + outcome_keep_ms after the begin (status.kept_window_ms), said "not known" of it:
    its client would run it again. The oracle said so at the sweep; with the oracle off, the
    status call asked then said it too. The age is at least the grace now."""
    def run() -> World:
        world = World(_cut_cornus_coordinator(terminate_limit_ms=50, partitions=1), hook=isolated("c0"))
        world.run(until_ms=0)
        # Asked just before the window ends, as the probe's last aim does.
        asked_ms = 1 + status.kept_window_ms(world.config) - world.status_answer_ms_max - 20
        world.probe.questions.append(Question(world.txns[0], asked_ms))
        world._push(asked_ms, STEP_STATUS, len(world.probe.questions) - 1)
        world.run()
        return world

    world = run()
    assert check(world) == []
    assert world.sweep_counters["swept"] == 1 and world.outcome.replies == {}, world.sweep_counters
    monkeypatch.setattr(sweeps.Sweeps, "_check_sweeper_write", lambda world, call: None)
    assert check(run()) == []


def test_a_cornus_coordinator_terminating_when_its_transaction_is_swept() -> None:
    """Found by the simulator (step 6): the coordinator's bound W counts from the
    start of its termination (CornusCoordinator._terminate), which comes up to two vote timeouts
    after the machine's (its read-only partitions, then its votes), and a one-shot's machine may
    start a request's window after the begin (a client's resend to another process of the node);
    the age counted W alone, with two deadlines, from the record. On storage that answers in 5 ms
    a sweeper collected the records at 1,110 ms while the coordinator, cut off from storage,
    still terminated, until 1,200 ms: a write it still had out could land in the slot (only
    the tombstone's keep, here, kept it harmless)."""
    schedule = _cut_cornus_coordinator(terminate_limit_ms=0, partitions=2)
    world = World(schedule, hook=isolated("c0"))
    world.run()
    assert check(world) == []
    assert world.sweep_counters["swept"] == 2 and world.outcome.terminations_given_up == 1, world.sweep_counters


def test_a_node_sweeps_only_when_told_and_never_younger_than_the_rule() -> None:
    """Off by default: the runtime builds its core with no SweepConfig, and must never see a
    ScanFinished (it does not drive one yet). And the core refuses an age below the rule."""
    config = ProtocolConfig()
    assert NodeCore("n0", (), ("n0",), config, random.Random(1)).sweep is None
    age_ms = sweep_age_ms_min(config, 2_000)
    NodeCore("n0", (), ("n0",), config, random.Random(1),
             sweep=SweepConfig(age_ms=age_ms, interval_ms=60_000, timeout_ms_request=2_000))
    with pytest.raises(AssertionError, match="below"):
        NodeCore("n0", (), ("n0",), config, random.Random(1),
                 sweep=SweepConfig(age_ms=age_ms - 1, interval_ms=60_000, timeout_ms_request=2_000))
    # The explorer's runs of an ordinary stream: no scan of finished records anywhere.
    scans: list[Effect] = []

    def spy(world: World, node: str, effect: Effect) -> None:
        if isinstance(effect, ScanFinished):
            scans.append(effect)
    _, failures = explore(None, 20, seed=SEED, hook=spy)
    assert failures == [] and scans == []


def test_seeded_sweep_schedules_keep_every_invariant_and_collect_what_crashes_left() -> None:
    rng = random.Random(SEED)
    counters: collections.Counter[str] = collections.Counter()
    for _ in range(SWEEP_SCHEDULE_COUNT):
        schedule = random_schedule(rng, None, sweeps=True)
        world = World(schedule)
        world.run()
        assert check(world) == [], schedule
        counters.update(world.sweep_counters)
        counters.update(world.sweep_stats)
    # What the schedules are for is reached, not only allowed: records swept (beside a
    # coordinator's own collection too), coordinators killed for good and their records left to
    # the sweepers, coordinator-log commits waiting on their coordinator's record, and the leak
    # check at the end finding them all collected.
    for name in ("swept", "beside_collection", "abandons", "skipped_coordinator", "skipped_young"):
        assert counters[name] > 0, (name, counters)


# -- the simulator finds the old sweepers ---------------------------------------------------------
def _crash_once(name: str, sends: type, to: str = "") -> EffectHook:
    """A hook that crashes node `name` once, as it is about to send its first `sends` message (to
    `to`, if given): what it logged before stays, what it sends from there on is lost."""
    crashed: list[str] = []

    def hook(world: World, node: str, effect: Effect) -> str | None:
        if (node == name and not crashed and isinstance(effect, Send) and isinstance(effect.message, sends)
                and effect.to in ("", to or effect.to)):
            crashed.append(node)
            return "crash"
        return None
    return hook


Run = tuple[Schedule, Callable[[], EffectHook | None], int]


def _first_found(monkeypatch: pytest.MonkeyPatch, runs: list[Run]) -> list[str]:
    """What the first of `runs` (schedule, hook maker, how long a crash by the hook lasts) to break
    an invariant broke, with the old rule the caller put back; then the same runs up to that one,
    on the real sweeper (the patches undone), must break nothing."""
    def first(chosen: list[Run]) -> tuple[int, list[str]]:
        for index, (schedule, hook, down_ms) in enumerate(chosen):
            world = World(schedule, hook=hook())
            world.hook_crash_down_ms = down_ms
            world.run()
            found = check(world)
            if found:
                return index, found
        return len(chosen), []

    index, found = first(runs)
    assert found, f"the simulator ran {len(runs)} schedules and did not find the old sweeper"
    monkeypatch.undo()
    assert first(runs[: index + 1])[1] == [], "the real sweeper breaks an invariant"
    return found


def test_a_sweeper_that_does_not_read_the_other_participants(monkeypatch: pytest.MonkeyPatch) -> None:
    """A COMMIT swept without reading the other participants' records: a 2PC coordinator logged
    COMMIT, told p0 and crashed before telling p1, which holds its vote until the coordinator is
    back; p0's COMMIT, old enough, was collected beside it (p1, had it been Cornus, would have
    terminated over p0's emptied slot once the tombstone was gone)."""
    original = Sweeper._judge

    def alone(machine: Sweeper, record: Record, young_after_ms: int) -> list[object]:
        if record.state is TxnState.COMMIT:  # as if its log's partition were the only participant
            record = dataclasses.replace(record, body=dataclasses.replace(record.body, participants=(record.log.name,)))
        return original(machine, record, young_after_ms)

    plan = TxnPlan("c0", Protocol.TWO_PC, 0, (("p0", 0), ("p1", 0)), one_shot=True)
    schedule = Schedule(seed=1, partition_count=2, txns=(plan,), storage_ms_max=2, delay_ms_max=2,
                        ambiguous_probability=0.0, terminate_limit_ms=1, sweep_interval_ms=50)
    monkeypatch.setattr(Sweeper, "_judge", alone)
    found = _first_found(monkeypatch, [(schedule, lambda: _crash_once("c0", Decision, to="p1"), 2_000)])
    assert any("still hold VOTE_YES" in v for v in found), found


def test_a_sweeper_that_ignores_the_coordinator_log_record(monkeypatch: pytest.MonkeyPatch) -> None:
    """A coordinator-log COMMIT swept while its coordinator's own record stays (the coordinator
    killed within its grace, for good): that record's redo is what a participant's recovery takes
    for an open yes vote, and its own collection, and recovery, read it first."""
    monkeypatch.setattr(sweeper, "txn_ids", types.SimpleNamespace(
        begin_ms_of=txn_ids.begin_ms_of, protocol_of=lambda txn: Protocol.CORNUS))
    plan = TxnPlan("c0", Protocol.COORDINATOR_LOG, 0, (("p0", 0), ("p1", 0)), one_shot=True)
    schedule = Schedule(seed=1, partition_count=2, txns=(plan,), storage_ms_max=2, delay_ms_max=2,
                        ambiguous_probability=0.0, sweep_interval_ms=50, abandons=(Abandon(0, 0),))
    found = _first_found(monkeypatch, [(schedule, lambda: None, 1)])
    assert any("coordinator's record in c.c0 is a live COMMIT" in v for v in found), found


def test_a_sweeper_that_keeps_its_tombstones_outcome_keep_ms_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tombstones kept outcome_keep_ms only, which may be 1 ms where storage refuses late calls:
    a terminating participant's LogOnce(ABORT) on its way when the sweeper read (storage answers
    in up to 300 ms here) lands in the emptied slot. The keep must be the grace and the late
    window at least (sweeper.tombstone_keep_ms): every call in flight lands within it."""
    monkeypatch.setattr(sweeper, "tombstone_keep_ms", lambda config: config.outcome_keep_ms)
    plan = TxnPlan("c0", Protocol.CORNUS, 0, (("p0", 0), ("p1", 0), ("p2", 0)), one_shot=True)
    runs: list[Run] = [
        (Schedule(seed=seed, partition_count=3, txns=(plan,), storage_ms_max=300, delay_ms_max=2,
                  ambiguous_probability=0.0, terminate_limit_ms=1, sweep_interval_ms=20, short_keep=True),
         lambda: _crash_once("n1", Vote), 2_000)
        for seed in range(16, 30)
    ]
    found = _first_found(monkeypatch, runs)
    assert any("after the tombstone's keep" in v or "recreated as ABORT" in v for v in found), found


def test_a_sweeper_beside_coordinators_that_terminate_without_a_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rule counts on W (ProtocolConfig.coordinator_terminate_ms_max, docs/sweeper-design.md
    step 1): without it, a Cornus coordinator cut off from storage terminates on past any age,
    and a write of it, back, lands where the sweeper's tombstone was."""
    monkeypatch.setattr(CornusCoordinator, "_give_up", lambda machine: [])
    found = _first_found(monkeypatch, [(_cut_cornus_coordinator(terminate_limit_ms=0, partitions=2),
                                        lambda: isolated("c0"), 1)])
    assert any("c0's coordinator still decides it" in v for v in found), found


def test_the_leak_check_finds_a_sweeper_that_collects_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check at a sweep schedule's end is no formality: a 2PC transaction's coordinator killed
    within its grace leaves both records, and a sweeper that leaves everything for a later pass
    leaves them to the end."""
    plan = TxnPlan("c0", Protocol.TWO_PC, 0, (("p0", 0), ("p1", 0)), one_shot=True)
    schedule = Schedule(seed=1, partition_count=2, txns=(plan,), storage_ms_max=2, delay_ms_max=2,
                        ambiguous_probability=0.0, sweep_interval_ms=50, abandons=(Abandon(0, 0),))
    monkeypatch.setattr(Sweeper, "_judge", lambda machine, record, young_after_ms: [])
    found = _first_found(monkeypatch, [(schedule, lambda: None, 1)])
    assert len(found) == 2 and all(v.startswith("leak: ") for v in found), found
