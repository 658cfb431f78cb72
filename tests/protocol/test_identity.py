"""A node's identity in the core (NodeCore, CoordinatorHost): taken before recovery, and read
again, after the query came, before any presumed ABORT is answered. Driven step by step; the
simulator's Twin schedules (test_twins.py) explore the interleavings."""

from __future__ import annotations

import random

from cornus.protocol.config import Protocol, ProtocolConfig
from cornus.protocol.effects import (
    CheckIdentity,
    Deposed,
    Effect,
    Reply,
    ScanLog,
    Send,
    StartTimer,
    TakeIdentity,
    Timer,
)
from cornus.protocol.events import (
    CommitRequested,
    ExecuteFailed,
    IdentityChecked,
    IdentityTaken,
    MessageReceived,
    ScanReturned,
    StorageUnreachable,
    TimerFired,
)
from cornus.protocol.hosts import IDENTITY_CHECK_TIMER
from cornus.protocol.identity_watch import VacancyWatch
from cornus.protocol.messages import Decision, DecisionAnswer, DecisionQuery, Vote
from cornus.protocol.node_core import NodeCore
from cornus.protocol.txn_ids import client_txn_id, new_txn_id
from storage_adapters.contract import ScanPage, TxnState

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
        core.handle(ScanReturned(scan, ScanPage((), None)))
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


def test_the_identity_is_renewed_periodically_and_a_tick_during_a_check_owes_its_renewal() -> None:
    core = _recovered()
    tick = TimerFired(Timer(NODE, "", IDENTITY_CHECK_TIMER))
    renew = CheckIdentity(NODE, 3, renew=True)
    assert core.handle(tick) == [StartTimer(tick.timer, IDENTITY_CHECK_MS), renew]
    assert core.handle(IdentityChecked(NODE, True)) == []
    # A tick while a check is out rearms, and owes its renewal to the next check: under a stream
    # of presumptions every tick could find one out, and a parked process of this node watching
    # for renewals would take the identity for vacant.
    _query(core, "p1", 1)
    assert core.handle(tick) == [StartTimer(tick.timer, IDENTITY_CHECK_MS)]
    _query(core, "p2", 2)
    effects = core.handle(IdentityChecked(NODE, True))
    assert effects[-1] == renew and len(effects) == 2, effects
    assert core.handle(IdentityChecked(NODE, True))[-1:] != [renew], "one renewal owed, one made"
    assert core.handle(tick) == [StartTimer(tick.timer, IDENTITY_CHECK_MS), renew]
    assert core.handle(IdentityChecked(NODE, False)) == [Deposed(NODE, 3)]


def test_a_parked_process_takes_the_identity_for_vacant_only_after_landed_reads_see_it_unchanged() -> None:
    config = ProtocolConfig()
    vacant_ms = config.identity_vacant_ms
    tick, deadline, slack = config.identity_check_ms, config.storage_deadline_ms, config.clock_slack_ms
    assert vacant_ms == 5 * tick + 2 * deadline + slack
    watch = VacancyWatch(config, now_ms=0)
    assert not watch.observed(1_000, 1_000, (4, 7))
    assert not watch.observed(1_000 + vacant_ms - 1, 1_000 + vacant_ms, (4, 7))
    assert not watch.observed(1_000 + vacant_ms, 1_000 + vacant_ms, (4, 8)), "a renewal: the holder lives"
    assert not watch.observed(1_000 + 2 * vacant_ms - 1, 1_000 + 2 * vacant_ms - 1, (4, 8))
    # Storage unreachable says nothing of the holder, and the wait starts again at the next read
    # that lands: after an outage the holder renews within a tick of storage coming back.
    assert not watch.observed(1_000 + 2 * vacant_ms, 1_000 + 2 * vacant_ms, StorageUnreachable("down"))
    assert not watch.observed(1_000 + 3 * vacant_ms, 1_000 + 3 * vacant_ms, (4, 8))
    assert not watch.observed(1_000 + 4 * vacant_ms - 1, 1_000 + 4 * vacant_ms - 1, (4, 8))
    assert watch.observed(1_000 + 4 * vacant_ms, 1_000 + 4 * vacant_ms, (4, 8))
    # A missing record is a record unchanged like any other (a take would write one).
    watch = VacancyWatch(config, now_ms=0)
    assert not watch.observed(5, 5, None)
    assert watch.observed(5 + vacant_ms, 5 + vacant_ms, None)


def test_a_live_holder_on_slow_storage_is_never_taken_for_vacant() -> None:
    """Found by review: renewals that all land within their deadline can be a tick and two
    deadlines apart (one owed while a presumption read was out leaves when that read answers,
    then takes its deadline to land), and a watch that counted to its reads' answers, each up to a
    deadline late, took such a holder for vacant after 12 s with the defaults, and its restart
    deposed the holder. Here renewals land that far apart, and the parked process's reads are
    served just before each, answered a whole deadline late (the first after each renewal at once)."""
    config = ProtocolConfig()
    tick, deadline = config.identity_check_ms, config.storage_deadline_ms
    gap_ms = tick + 2 * deadline
    watch = VacancyWatch(config, now_ms=0)
    for version in range(1, 6):
        landed_ms = version * gap_ms  # when renewal `version` lands
        assert not watch.observed(landed_ms + 1, landed_ms + 1, (2, version))
        # Reads every tick; the one served just before the next renewal lands sees this version.
        for served_ms in [*range(landed_ms + 1 + tick, landed_ms + gap_ms, tick), landed_ms + gap_ms - 1]:
            # Sent a moment before it was served; its answer comes a deadline later.
            sent_ms = served_ms - 1
            assert not watch.observed(sent_ms, served_ms + deadline, (2, version)), (version, served_ms)


def _one_shot(core: NodeCore, protocol: Protocol) -> str:
    txn = client_txn_id(5, NODE, "0" * 16, protocol)
    core.handle(CommitRequested(NODE, txn, (("p1", b"k=1"),), (), prepare_sent=True))
    return txn


def test_a_blocking_abort_of_a_client_chosen_id_is_told_once_a_later_read_finds_the_identity() -> None:
    """A 2PC coordinator records an ABORT nowhere; a later process of the node may run the same
    client-chosen id and commit it, so the ABORT waits for a read made after it was decided."""
    core = _recovered()
    txn = _one_shot(core, Protocol.TWO_PC)
    effects = core.handle(TimerFired(Timer(NODE, txn, "votes")))
    assert CheckIdentity(NODE, 3) in effects and not any(isinstance(e, Reply | Send) for e in effects), effects
    # Unanswered: nothing is told, and no read at once (it would spin while storage is away) ...
    assert core.handle(IdentityChecked(NODE, StorageUnreachable("down"))) == []
    # ... but at the next periodic one.
    tick = TimerFired(Timer(NODE, "", IDENTITY_CHECK_TIMER))
    assert core.handle(tick) == [StartTimer(tick.timer, IDENTITY_CHECK_MS), CheckIdentity(NODE, 3, renew=True)]
    effects = core.handle(IdentityChecked(NODE, True))
    assert Reply(txn, TxnState.ABORT, "votes missing at the vote timeout") in effects, effects
    assert Send(NODE, "p1", Decision(txn, TxnState.ABORT)) in effects, effects
    # A system-made id is told at once: no other process can run it.
    other = new_txn_id(7, NODE, "i", 9, Protocol.TWO_PC)
    core.handle(CommitRequested(NODE, other, (("p1", b"k=1"),), (), prepare_sent=True))
    effects = core.handle(TimerFired(Timer(NODE, other, "votes")))
    assert Send(NODE, "p1", Decision(other, TxnState.ABORT)) in effects, effects


def test_a_client_chosen_id_refused_where_it_voted_for_another_process_waits_for_the_rest() -> None:
    """The vote for one process's request reaches the other, whose own request there is refused
    (past its deadline, say): no impossible state, and no ABORT."""
    core = _recovered()
    txn = _one_shot(core, Protocol.CORNUS)
    effects = core.handle(MessageReceived("p1", NODE, Vote(txn, "p1", yes=True)))
    assert Reply(txn, TxnState.COMMIT, "") in effects, effects
    assert core.handle(ExecuteFailed(NODE, txn, "p1", refused=True, detail="arrived past its deadline")) == []
