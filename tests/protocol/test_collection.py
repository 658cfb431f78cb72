"""Garbage collection's failure paths, which random schedules do not reach (their faults end
before any grace has passed): the decision's tombstone goes first and alone, and no other record
goes unless it landed (DESIGN section 4)."""

from __future__ import annotations

import pytest

from cornus.protocol.config import Protocol
from cornus.protocol.effects import DeleteRecord, Effect
from cornus.sim.invariants import check
from cornus.sim.schedule import Schedule
from cornus.sim.world import World
from storage_adapters.contract import LogId, LogKind, TxnState

from .helpers import crash_on, run, txn

# Past the transaction's last acknowledgement, before its collection (a grace later).
OUTAGE_START_MS = 400


def _deletes_a_partition_record(effect: Effect) -> bool:
    return isinstance(effect, DeleteRecord) and effect.keep is None and effect.log.kind is LogKind.PARTITION


def _tombstone(world: World, partition: str, decision: TxnState) -> bool:
    stored = world.storage.records.get((LogId.partition(partition), txn(world)))
    return stored is not None and stored.state is decision and stored.expires_at_ms is not None


@pytest.mark.parametrize("protocol", list(Protocol))
def test_a_coordinator_that_dies_between_the_tombstone_and_the_deletes_loses_nothing(protocol: Protocol) -> None:
    crash = crash_on("c0", _deletes_a_partition_record)
    kept_at_crash: list[bool] = []

    def hook(world: World, name: str, effect: Effect) -> str | None:
        action = crash(world, name, effect)
        if action == "crash":
            # The first other delete leaves only once the tombstone stands in storage.
            kept_at_crash.append(_tombstone(world, "p0", TxnState.COMMIT))
        return action

    world = run(protocol, votes=(True, True, True), hook=hook, down_ms=50)
    assert kept_at_crash == [True]
    assert check(world) == []
    assert world.outcome.replies[txn(world)] == [TxnState.COMMIT]
    # Whatever the restart does with the records left, the outcome stays told.
    assert _tombstone(world, "p0", TxnState.COMMIT)


@pytest.mark.parametrize("protocol", list(Protocol))
def test_a_tombstone_that_cannot_be_written_leaves_every_other_record(protocol: Protocol) -> None:
    # p0's log is unreachable from after the decision is acknowledged to the end of the run
    # (longer than a schedule's outages may last): the tombstone's write fails every attempt, and
    # nothing else may go.
    deletes: list[DeleteRecord] = []

    def count(world: World, name: str, effect: Effect) -> None:
        if isinstance(effect, DeleteRecord) and effect.log.kind is LogKind.PARTITION:
            deletes.append(effect)

    world = World(Schedule.single(protocol, (True, True, True)), hook=count)
    reachable = world._unreachable
    world._unreachable = lambda log: (  # type: ignore[method-assign]
        (log.key == "p.p0" and world.now_ms >= OUTAGE_START_MS) or reachable(log))
    world.run()
    assert world.outcome.replies[txn(world)] == [TxnState.COMMIT]
    for partition in ("p1", "p2"):
        stored = world.storage.records.get((LogId.partition(partition), txn(world)))
        assert stored is not None and stored.expires_at_ms is None, partition
    assert check(world) == []
    # Collection ran: it tried the tombstone every time it may, and nothing else.
    assert len(deletes) == world.config.gc_attempt_count_max, deletes
    assert all(d.keep is not None and d.log == LogId.partition("p0") for d in deletes), deletes
