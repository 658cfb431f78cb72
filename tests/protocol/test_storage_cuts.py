"""A coordinator process cut off from storage alone while a later process of its node runs
(Twin.storage_only): its messages and replies pass, it never hears its identity renewal refused,
and clients keep sending it one-shots under ids they chose, which a proxy also delivers to the
later process, which refuses them for load. What the simulator's whole cuts never reached: the
"nothing ran" side of the client-id rules (txn_ids.identity_fresh_for_client_ids,
txn_ids.predecessor_may_have_run)."""

from __future__ import annotations

import random

import pytest

from cornus.protocol import txn_ids
from cornus.protocol.config import ProtocolConfig
from cornus.protocol.coordinator_blocking import TwoPhaseCoordinator
from cornus.protocol.effects import Log
from cornus.protocol.events import CommitRequested, MessageReceived
from cornus.protocol.messages import DecisionAck, Vote
from cornus.sim.explore import explore
from cornus.sim.invariants import check
from cornus.sim.schedule import Schedule, random_schedule
from cornus.sim.world import World
from storage_adapters.contract import TxnState

# Of the stream, one schedule in eight cuts a first process off from storage; only those run.
SCHEDULE_COUNT = 1_600


def _storage_cut(schedule: Schedule) -> bool:
    return any(twin.storage_only for twin in schedule.twins)


def test_every_protocol_survives_a_first_process_cut_from_storage_alone() -> None:
    rng = random.Random(11)
    cuts = told_nothing_ran = refused_stale = 0
    for _ in range(SCHEDULE_COUNT):
        schedule = random_schedule(rng, None, twins=True, storage_cuts=True)
        if not _storage_cut(schedule):
            continue
        cuts += 1
        world = World(schedule)
        world.run()
        assert not check(world), (schedule, check(world))
        told_nothing_ran += len(world.outcome.told_nothing_ran)
        refused_stale += world.outcome.refused_identity_stale
    assert cuts > SCHEDULE_COUNT // 16, f"only {cuts} schedules cut a first process from storage"
    # Both sides of the rule are reached: the later process tells clients "nothing ran" past its
    # predecessor's window, and the cut process refuses client ids once its identity is stale.
    assert told_nothing_ran > cuts // 4, f"{told_nothing_ran} ids told 'nothing ran' in {cuts} schedules"
    assert refused_stale > cuts // 4, f"{refused_stale} ids refused for a stale identity in {cuts} schedules"


def test_a_process_that_begins_client_ids_with_a_stale_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by audit (2026-11-28, second), explored since: a process cut off from storage alone
    never hears its renewal refused, and coordinated Cornus one-shots on (its coordinator writes
    nothing); the later process, past its predecessor's window, told the same id's resend "nothing
    ran", and its client ran it again under a new id. This puts the old rule back: any process
    whose identity was ever confirmed begins client ids."""
    monkeypatch.setattr(txn_ids, "identity_fresh_for_client_ids",
                        lambda confirmed_ms, now_ms, config: confirmed_ms is not None)
    count, failures = explore(None, SCHEDULE_COUNT, seed=11, report_max=1, twins=True, storage_cuts=True,
                              only=_storage_cut)
    assert failures, f"the simulator ran {count} schedules and did not find the old bug"
    assert any("said at" in v and "never ran" in v and "it committed" in v for v in failures[0][1]), failures[0][1]


def test_a_blocking_coordinator_logging_commit_hears_another_process_s_abort() -> None:
    """Found by the storage cuts (2026-11-28, third): a 2PC coordinator cut off from storage alone
    logs COMMIT (every try unanswered) while a later process of its node, asked by the
    participant, presumes ABORT (after a read of the identity record, so after its take, which
    fences this process's COMMIT: it can never land). The participant's ABORT acknowledgement then
    reached this one, whose machine asserted that it could not happen, and the node crashed. It
    adopts nothing: its COMMIT's refusal, or its next identity check, tells it it was deposed."""
    txn = "1000.c1.c0123456789abcdef.1.2pc"
    config = ProtocolConfig(storage_deadline_ms=100, clock_slack_ms=20, gc_grace_ms=1_000)
    machine = TwoPhaseCoordinator("c1", txn, config, random.Random(1))
    machine.handle(CommitRequested("c1", txn, (("p0", b"k=1"),), (), prepare_sent=True))
    effects = machine.handle(MessageReceived("p0", "c1", Vote(txn, "p0", yes=True, unknown=False)))
    assert any(isinstance(e, Log) and e.state is TxnState.COMMIT for e in effects), effects
    ack = DecisionAck(txn, "p0", TxnState.ABORT, config.grace_ms_min)
    assert machine.handle(MessageReceived("p0", "c1", ack)) == []
    assert machine.decision is None and "p0" not in machine.acked
