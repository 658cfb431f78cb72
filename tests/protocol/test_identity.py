"""A node's identity in the core (NodeCore, CoordinatorHost): taken before recovery, and read
again, after the query came, before any presumed ABORT is answered. Driven step by step; the
simulator's Twin schedules (test_twins.py) explore the interleavings."""

from __future__ import annotations

import random

from cornus.protocol.config import Protocol, ProtocolConfig
from cornus.protocol.effects import CheckIdentity, Deposed, Effect, ScanLog, Send, StartTimer, TakeIdentity, Timer
from cornus.protocol.events import (
    IdentityChecked,
    IdentityTaken,
    MessageReceived,
    ScanReturned,
    StorageUnreachable,
    TimerFired,
)
from cornus.protocol.hosts import IDENTITY_CHECK_TIMER
from cornus.protocol.messages import DecisionAnswer, DecisionQuery
from cornus.protocol.node_core import NodeCore
from cornus.protocol.txn_ids import new_txn_id
from storage_adapters.contract import TxnState

NODE = "n0"
IDENTITY_CHECK_MS = ProtocolConfig().identity_check_ms


def _core() -> NodeCore:
    return NodeCore(NODE, (), (NODE, "n1"), ProtocolConfig(), random.Random(1))


def _timers(effects: list[Effect]) -> dict[str, StartTimer]:
    return {effect.timer.kind: effect for effect in effects if isinstance(effect, StartTimer)}


def _recovered(epoch: int = 3) -> NodeCore:
    """A core that took its identity at `epoch` and recovered an empty coordinator log."""
    core = _core()
    effects = core.handle(IdentityTaken(epoch))
    scans = core.handle(TimerFired(_timers(effects)["settle"].timer))
    for scan in scans:
        assert isinstance(scan, ScanLog)
        core.handle(ScanReturned(scan, ()))
    assert core.recovered
    return core


def _query(core: NodeCore, asker: str, counter: int) -> tuple[str, list[Effect]]:
    txn = new_txn_id(1, NODE, "i", counter, Protocol.TWO_PC)
    return txn, core.handle(MessageReceived(asker, NODE, DecisionQuery(txn, asker)))


def test_the_identity_is_taken_before_recovery_scans_anything() -> None:
    core = _core()
    assert core.start() == [TakeIdentity(NODE)]
    # Storage unreachable: retried after a backoff, and nothing else happens meanwhile.
    effects = core.handle(IdentityTaken(StorageUnreachable("down")))
    assert [type(effect) for effect in effects] == [StartTimer]
    assert core.handle(TimerFired(effects[0].timer)) == [TakeIdentity(NODE)]  # type: ignore[union-attr]
    assert core.identity_epoch == 0 and not core.recovered
    effects = core.handle(IdentityTaken(3))
    assert core.identity_epoch == 3
    timers = _timers(effects)
    assert set(timers) == {"settle", IDENTITY_CHECK_TIMER}, effects
    assert timers[IDENTITY_CHECK_TIMER].duration_ms == IDENTITY_CHECK_MS


def test_a_presumed_abort_waits_for_an_identity_check_that_left_after_the_query() -> None:
    core = _recovered()
    first, effects = _query(core, "p1", 1)
    assert effects == [CheckIdentity(NODE, 3)], "no answer before the check"
    # A query that comes while that check is out may have come after its read: the next check.
    second, effects = _query(core, "p2", 2)
    assert effects == []
    effects = core.handle(IdentityChecked(NODE, True))
    assert effects == [Send(NODE, "p1", DecisionAnswer(first, NODE, TxnState.ABORT)), CheckIdentity(NODE, 3)]
    effects = core.handle(IdentityChecked(NODE, True))
    assert effects == [Send(NODE, "p2", DecisionAnswer(second, NODE, TxnState.ABORT))]


def test_an_unreachable_check_answers_nothing_and_a_lost_identity_deposes() -> None:
    core = _recovered()
    _query(core, "p1", 1)
    assert core.handle(IdentityChecked(NODE, StorageUnreachable("down"))) == []  # the asker asks again
    _, effects = _query(core, "p1", 1)
    assert effects == [CheckIdentity(NODE, 3)]
    assert core.handle(IdentityChecked(NODE, False)) == [Deposed(NODE, 3)]


def test_the_identity_is_checked_periodically_with_no_query_waiting() -> None:
    core = _recovered()
    tick = TimerFired(Timer(NODE, "", IDENTITY_CHECK_TIMER))
    assert core.handle(tick) == [StartTimer(tick.timer, IDENTITY_CHECK_MS), CheckIdentity(NODE, 3)]
    # While that check is out, the next tick only rearms.
    assert core.handle(tick) == [StartTimer(tick.timer, IDENTITY_CHECK_MS)]
    assert core.handle(IdentityChecked(NODE, True)) == []
    assert core.handle(tick) == [StartTimer(tick.timer, IDENTITY_CHECK_MS), CheckIdentity(NODE, 3)]
    assert core.handle(IdentityChecked(NODE, False)) == [Deposed(NODE, 3)]
