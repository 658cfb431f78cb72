"""Paper section 3.4, case by case, for Cornus; plus the artifact's wrong-participant-list bug and
the honest comparison: 2PC blocks on a coordinator crash where Cornus does not."""

from __future__ import annotations

import random

import pytest

from cornus.protocol.config import REDO_DURABLE_MS_MAX, Protocol, ProtocolConfig, gc_grace_ms_min
from cornus.protocol.coordinator_base import CoordPhase
from cornus.protocol.coordinator_cornus import CornusCoordinator
from cornus.protocol.effects import (
    ApplyRedo,
    CacheRedo,
    CancelTimer,
    CheckIdentity,
    Log,
    LogOnce,
    ReleaseLocks,
    Reply,
    Send,
    StartTimer,
    TerminationEnded,
    TerminationStarted,
    Timer,
)
from cornus.protocol.events import (
    CommitRequested,
    Executed,
    LogReturned,
    MessageReceived,
    StorageUnreachable,
    TimerFired,
)
from cornus.protocol.hosts import CoordinatorHost, PartitionHost
from cornus.protocol.messages import Decision, DecisionAck, Prepare, Vote
from cornus.protocol.participant_base import Phase
from cornus.protocol.txn_ids import client_txn_id, protocol_of
from cornus.sim.explore import explore
from cornus.sim.invariants import check
from cornus.sim.schedule import Schedule
from cornus.sim.world import World
from storage_adapters.contract import LogId, LogOnceResult, TxnState

from .helpers import assert_clean, crash_on, replies, run, txn

CORNUS = Protocol.CORNUS


def _sends(kind: type) -> object:
    return lambda effect: isinstance(effect, Send) and isinstance(effect.message, kind)


# -- coordinator failures ---------------------------------------------------------------------
def test_coordinator_case1_fails_before_protocol_starts() -> None:
    world = run(CORNUS, hook=crash_on("c0", _sends(Prepare), nth=1), down_ms=2000)
    assert replies(world) == []
    assert_clean(world, TxnState.ABORT)


def test_coordinator_case2_fails_after_some_vote_requests() -> None:
    world = run(CORNUS, votes=(True, True, True), hook=crash_on("c0", _sends(Prepare), nth=2), down_ms=2000)
    assert replies(world) == []
    assert_clean(world, TxnState.ABORT)


def test_coordinator_case3_fails_before_any_decision_is_sent() -> None:
    world = run(CORNUS, votes=(True, True, True), hook=crash_on("c0", _sends(Decision), nth=1), down_ms=2000)
    # The reply went out before the decisions: the participants' termination must honour it.
    assert replies(world) == [TxnState.COMMIT]
    assert_clean(world, TxnState.COMMIT)


def test_coordinator_case4_fails_after_some_decisions() -> None:
    world = run(CORNUS, votes=(True, True, True), hook=crash_on("c0", _sends(Decision), nth=2), down_ms=2000)
    assert replies(world) == [TxnState.COMMIT]
    assert_clean(world, TxnState.COMMIT)


def test_coordinator_case5_fails_after_all_decisions() -> None:
    resend_timer = crash_on("c0", lambda e: isinstance(e, StartTimer) and e.timer.kind == "resend")
    world = run(CORNUS, votes=(True, True, True), hook=resend_timer, down_ms=2000)
    assert replies(world) == [TxnState.COMMIT]
    assert_clean(world, TxnState.COMMIT)


# -- participant failures ---------------------------------------------------------------------
def test_participant_case1_fails_before_vote_request() -> None:
    before_prepare = crash_on("p1", lambda e: isinstance(e, StartTimer) and e.timer.kind == "prepare")
    world = run(CORNUS, hook=before_prepare, down_ms=600)
    # The coordinator times out and logs ABORT on p1's behalf via LogOnce.
    assert replies(world) == [TxnState.ABORT]
    assert_clean(world, TxnState.ABORT)


def test_participant_case2_fails_before_logging_vote() -> None:
    before_vote_log = crash_on("p1", lambda e: isinstance(e, LogOnce) and e.state is TxnState.VOTE_YES)
    world = run(CORNUS, hook=before_vote_log, down_ms=600)
    assert replies(world) == [TxnState.ABORT]
    assert_clean(world, TxnState.ABORT)


def test_participant_case3_fails_after_logging_vote_before_replying() -> None:
    before_reply = crash_on("p1", _sends(Vote))
    world = run(CORNUS, hook=before_reply, down_ms=600)
    # The coordinator's termination finds VOTE_YES in every log: COMMIT, without p1's message.
    assert replies(world) == [TxnState.COMMIT]
    assert_clean(world, TxnState.COMMIT)


def test_participant_case4_fails_after_sending_vote() -> None:
    after_vote = crash_on("p1", lambda e: isinstance(e, StartTimer) and e.timer.kind == "decision")
    world = run(CORNUS, hook=after_vote, down_ms=600)
    assert replies(world) == [TxnState.COMMIT]
    assert_clean(world, TxnState.COMMIT)


# -- a participant that commits by applying over its own vote ---------------------------------
@pytest.mark.parametrize("protocol", [CORNUS, Protocol.TWO_PC])
def test_participant_fails_before_its_apply_over_the_vote(protocol: Protocol) -> None:
    """The COMMIT is known, but the apply that would record it in p1's log never leaves: the record
    still says VOTE_YES. Recovery must find it unfinished, resolve it to COMMIT (Cornus: termination
    over the others' logs; 2PC: the coordinator) and only then apply."""
    found: list[object] = []

    def hook(world: World, name: str, effect: object) -> str | None:
        if found or not isinstance(effect, ApplyRedo) or effect.partition != "p1":
            return None
        found.append(world.storage.read(LogId.partition("p1"), effect.txn))
        return "crash"

    world = run(protocol, votes=(True, True, True), hook=hook, down_ms=600)
    (record,) = found
    assert record is not None and record.state is TxnState.VOTE_YES and not record.applied  # type: ignore[attr-defined]
    assert replies(world) == [TxnState.COMMIT]
    assert_clean(world, TxnState.COMMIT)
    assert ("p1", txn(world)) in world.outcome.applied
    if protocol is CORNUS:
        assert world.outcome.terminations >= 1, "p1's recovery resolves its vote by termination"


@pytest.mark.parametrize("protocol", [CORNUS, Protocol.TWO_PC])
def test_participant_fails_after_its_apply_over_the_vote_returned(protocol: Protocol) -> None:
    """The apply landed (record COMMIT and applied), the node dies before releasing or acking:
    recovery has nothing to do, and the coordinator's resent decision meets an unknown, finished
    transaction, which acks without applying again."""
    after_apply = crash_on("p1", lambda e: isinstance(e, CacheRedo))
    world = run(protocol, votes=(True, True, True), hook=after_apply, down_ms=600)
    assert replies(world) == [TxnState.COMMIT]
    assert_clean(world, TxnState.COMMIT)


# -- the paper artifact's bug -----------------------------------------------------------------
class ArtifactCoordinator(CornusCoordinator):
    """Sends each participant only itself as the participant list, as the paper's artifact did."""

    def _prepare_message(self, participant: str) -> Prepare:
        return Prepare(self.txn, (participant,), self.node)


def _drop_decisions(world: World, name: str, effect: object) -> str | None:
    return "drop" if isinstance(effect, Send) and isinstance(effect.message, Decision) else None


def test_artifact_wrong_participant_list_bug() -> None:
    # p1 votes no; p0 never hears the decision and terminates. With the full list it finds p1's
    # ABORT; with the artifact's list it checks only its own log and commits.
    right = run(CORNUS, votes=(True, False), hook=_drop_decisions)
    assert check(right) == []
    wrong = run(CORNUS, votes=(True, False), hook=_drop_decisions, coordinator_factory=ArtifactCoordinator)
    assert any("agreement" in v for v in check(wrong)), check(wrong)


def test_checker_catches_artifact_bug_in_random_schedules() -> None:
    _, failures = explore(CORNUS, 500, seed=3, report_max=1, coordinator_factory=ArtifactCoordinator)
    assert failures, "the explorer must detect a protocol that sends partial participant lists"


# -- blocking, honestly -----------------------------------------------------------------------
def _coordinator_dies_after_votes(protocol: Protocol) -> World:
    if protocol is Protocol.CORNUS:
        hook = crash_on("c0", lambda e: isinstance(e, CancelTimer) and e.timer.kind == "votes")
    else:
        hook = crash_on("c0", lambda e: isinstance(e, Log) and e.state is TxnState.COMMIT)
    world = World(Schedule.single(protocol, (True, True), seed=11), hook=hook)
    world.hook_crash_down_ms = 900  # back at t=1000, when faults end
    return world


def _phases(world: World) -> list[Phase]:
    phases = []
    for partition in world.partitions:
        host = world.node_of_host(partition).core.partitions[partition]  # type: ignore[union-attr]
        machine = host.machines.get(txn(world))
        phases.append(Phase.DONE if machine is None else machine.phase)  # a finished machine is forgotten
    return phases


def test_2pc_blocks_while_coordinator_is_down() -> None:
    world = _coordinator_dies_after_votes(Protocol.TWO_PC)
    world.run(until_ms=900)
    assert not world.nodes["c0"].alive
    assert _phases(world) == [Phase.VOTED, Phase.VOTED], "2PC participants cannot decide alone"
    world.run()
    # The restarted coordinator found no COMMIT record: presumed abort unblocks them.
    assert_clean_2pc = check(world)
    assert assert_clean_2pc == []
    assert _phases(world) == [Phase.DONE, Phase.DONE]


def test_cornus_does_not_block_while_coordinator_is_down() -> None:
    world = _coordinator_dies_after_votes(Protocol.CORNUS)
    world.run(until_ms=900)
    assert not world.nodes["c0"].alive
    assert _phases(world) == [Phase.DONE, Phase.DONE]
    world.run()
    assert_clean(world, TxnState.COMMIT)


def test_an_unknown_vote_makes_a_cornus_coordinator_ask_the_logs_not_abort() -> None:
    """A participant without the transaction cannot vote yes, but may have voted yes before,
    decided by termination and forgotten: the coordinator must ask its log, not abort."""
    txn = "5.c0.x.1.cornus"
    host = CoordinatorHost("c0", ProtocolConfig(), random.Random(1), protocol_of)
    host.handle(CommitRequested("c0", txn, writes=(("p0", b"a"), ("p1", b"b"))))
    host.handle(MessageReceived("p0", "c0", Vote(txn, "p0", yes=True)))
    effects = host.handle(MessageReceived("p1", "c0", Vote(txn, "p1", yes=False, unknown=True)))
    assert not [e for e in effects if isinstance(e, Reply)], "no outcome before p1's log is asked"
    assert [e.log.name for e in effects if isinstance(e, LogOnce)] == ["p1"]


def test_a_coordinator_whose_termination_is_overtaken_still_ends_it() -> None:
    """A Cornus coordinator terminating on a vote timeout may learn the outcome another way (the
    last vote arrives late): its termination must still end, or the runtime keeps timing it forever."""
    txn = "5.c0.x.2.cornus"
    host = CoordinatorHost("c0", ProtocolConfig(), random.Random(1), protocol_of)
    host.handle(CommitRequested("c0", txn, writes=(("p0", b"a"), ("p1", b"b"))))
    host.handle(MessageReceived("p0", "c0", Vote(txn, "p0", yes=True)))
    started = host.handle(TimerFired(Timer("c0", txn, "votes")))
    assert TerminationStarted(txn, "c0") in started
    effects = host.handle(MessageReceived("p1", "c0", Vote(txn, "p1", yes=True)))
    assert TerminationEnded(txn, "c0", TxnState.COMMIT) in effects
    assert Reply(txn, TxnState.COMMIT) in effects


def test_a_coordinator_s_termination_gives_up_at_its_limit_and_acts_on_no_late_answer() -> None:
    """Found by review of the sweeper's design (docs/sweeper-design.md, step 1): a Cornus
    coordinator whose logs stay unreachable asked them again after every backoff, for ever (a
    retry loop with no bound, and a write that could land after a collector emptied the slot).
    Past coordinator_terminate_ms_max it stops, undecided, and ends once its calls are in; an
    answer that comes after is not acted on (the participants terminate by themselves)."""
    txn = "5.c0.x.4.cornus"
    config = ProtocolConfig(coordinator_terminate_ms_max=1_000)
    host = CoordinatorHost("c0", config, random.Random(1), protocol_of)
    host.handle(CommitRequested("c0", txn, writes=(("p0", b"a"), ("p1", b"b"))))
    started = host.handle(TimerFired(Timer("c0", txn, "votes")))
    assert StartTimer(Timer("c0", txn, "terminate-limit"), 1_000) in started
    calls = [e for e in started if isinstance(e, LogOnce)]
    assert len(calls) == 2
    for call in calls[:-1]:
        host.handle(LogReturned(call, StorageUnreachable("down")))
    retry_calls = host.handle(TimerFired(Timer("c0", txn, "termination")))
    assert [e for e in retry_calls if isinstance(e, LogOnce)], "the unreachable log was not asked again"
    gave_up = host.handle(TimerFired(Timer("c0", txn, "terminate-limit")))
    assert TerminationEnded(txn, "c0", None) in gave_up
    assert CancelTimer(Timer("c0", txn, "termination")) in gave_up
    assert not [e for e in gave_up if isinstance(e, LogOnce | Reply | Send)]
    assert host.handle(TimerFired(Timer("c0", txn, "termination"))) == []
    machine = host.machines[txn]
    assert machine.decision is None and not machine.finished, "ended with its calls still in flight"
    # The calls in flight come back (one with the answer that would have decided): nothing follows.
    in_flight = [calls[-1], *(e for e in retry_calls if isinstance(e, LogOnce))]
    for call in in_flight[:-1]:
        assert host.handle(LogReturned(call, StorageUnreachable("down"))) == []
    assert host.handle(LogReturned(in_flight[-1], LogOnceResult(TxnState.ABORT, True))) == []
    assert txn not in host.machines, "the machine did not end once its calls were in"


@pytest.mark.parametrize("redo_answered_first", [True, False], ids=["redo-landed", "redo-in-flight"])
def test_a_coordinator_log_abort_after_its_redo_left_is_logged_over_the_redo(redo_answered_first: bool) -> None:
    """Found by audit (2026-11-27): a coordinator-log coordinator that decided ABORT after its redo
    record went out logged nothing, so the record stayed VOTE_YES until collection. A node stopped
    cleanly and removed within the grace period left it so for good, and every later recovery of
    a participant's partition took it for an open yes vote: it locked the keys again and asked the
    removed coordinator for ever. The ABORT is logged over the redo, only once the redo's write has
    answered (two writes of one record in flight at once may land in either order, and a redo
    landing on the ABORT is refused as a decision flip), and collection waits for it."""
    txn = "5.c0.x.3.clog"
    host = CoordinatorHost("c0", ProtocolConfig(), random.Random(1), protocol_of)
    started = host.handle(CommitRequested("c0", txn, writes=(("p0", b"a"), ("p1", b"b"))))
    (redo,) = [e for e in started if isinstance(e, Log) and e.state is TxnState.VOTE_YES]
    if redo_answered_first:
        host.handle(LogReturned(redo, TxnState.VOTE_YES))
    effects = host.handle(MessageReceived("p1", "c0", Vote(txn, "p1", yes=False)))
    assert [e.outcome for e in effects if isinstance(e, Reply)] == [TxnState.ABORT]
    aborts = [e for e in effects if isinstance(e, Log) and e.state is TxnState.ABORT]
    if not redo_answered_first:
        assert aborts == [], "logged while the redo's write was still in flight"
        aborts = [e for e in host.handle(LogReturned(redo, TxnState.VOTE_YES))
                  if isinstance(e, Log) and e.state is TxnState.ABORT]
    assert [(e.log, e.txn) for e in aborts] == [(LogId.coordinator("c0"), txn)]
    for partition in ("p0", "p1"):
        host.handle(MessageReceived(partition, "c0", DecisionAck(txn, partition, TxnState.ABORT)))
    machine = host.machines[txn]
    assert machine.phase is not CoordPhase.GC_WAIT, "collection began with the ABORT's write unanswered"
    host.handle(LogReturned(aborts[0], TxnState.ABORT))
    assert machine.phase is CoordPhase.GC_WAIT


def test_a_coordinator_log_redo_commits_only_if_durable_within_the_window_every_node_s_recovery_waits_out() -> None:
    """Found by audit (2026-11-27): a coordinator-log coordinator retried its redo record's write
    for its own timeout_ms_votes, while a node recovering a participant's partition waits out its
    own (recovery_settle_ms) before it reads that record. A coordinator configured with a longer
    one (a rolling change of it) could land its redo after the scan, commit, and have its COMMIT
    acknowledged by a new owner that knew nothing of the vote: that partition's writes were lost.
    Found by audit again (2026-11-27): bounding when the redo's writes leave was not enough, since
    a write lands within its sender's storage deadline, and a coordinator configured with a longer
    one than the recovering node's (a rolling change of timeout_ms_call) landed it after the scan.
    Whatever its own settings, a coordinator commits only a redo that was durable within
    REDO_DURABLE_MS_MAX of its first write, a bound every node's recovery waits out."""
    for deadline_ms in (100, 5_000, 30_000):  # the recovering node's own deadline does not matter
        settled = ProtocolConfig(storage_deadline_ms=deadline_ms, gc_grace_ms=2 * deadline_ms + 2_000)
        assert settled.recovery_settle_ms >= REDO_DURABLE_MS_MAX + settled.clock_slack_ms, deadline_ms
        assert settled.recovery_settle_ms >= deadline_ms + settled.clock_slack_ms, deadline_ms
    txn = "5.c0.x.4.clog"
    config = ProtocolConfig(timeout_ms_votes=10_000, storage_deadline_ms=30_000, gc_grace_ms=62_000)
    host = CoordinatorHost("c0", config, random.Random(1), protocol_of)
    started = host.handle(CommitRequested("c0", txn, writes=(("p0", b"a"), ("p1", b"b"))))
    (redo,) = [e for e in started if isinstance(e, Log) and e.state is TxnState.VOTE_YES]
    (window,) = [e for e in started if isinstance(e, StartTimer) and e.timer.kind == "redo-window"]
    assert window.duration_ms == REDO_DURABLE_MS_MAX
    failed = host.handle(LogReturned(redo, StorageUnreachable("down")))
    (retry,) = [e for e in failed if isinstance(e, StartTimer) and e.timer.kind == "retry"]
    for partition in ("p0", "p1"):
        host.handle(MessageReceived(partition, "c0", Vote(txn, partition, yes=True)))
    closed = host.handle(TimerFired(window.timer))
    assert [e.outcome for e in closed if isinstance(e, Reply)] == [TxnState.ABORT], closed
    again = host.handle(TimerFired(retry.timer))
    assert not [e for e in again if isinstance(e, Log) and e.state is TxnState.VOTE_YES], "a redo write past the window"

    # A redo write still unanswered when the window closes may land after a recovering node's
    # scan: the transaction aborts, and a late answer commits nothing. Its ABORT goes over the
    # redo once that write is answered.
    slow = "5.c0.x.5.clog"
    started = host.handle(CommitRequested("c0", slow, writes=(("p0", b"a"), ("p1", b"b"))))
    (redo,) = [e for e in started if isinstance(e, Log) and e.state is TxnState.VOTE_YES]
    for partition in ("p0", "p1"):
        host.handle(MessageReceived(partition, "c0", Vote(slow, partition, yes=True)))
    closed = host.handle(TimerFired(Timer("c0", slow, "redo-window")))
    assert [e.outcome for e in closed if isinstance(e, Reply)] == [TxnState.ABORT], closed
    landed = host.handle(LogReturned(redo, TxnState.VOTE_YES))
    assert [e.state for e in landed if isinstance(e, Log)] == [TxnState.ABORT], landed

    # A redo durable within the window commits as before.
    quick = "5.c0.x.6.clog"
    started = host.handle(CommitRequested("c0", quick, writes=(("p0", b"a"), ("p1", b"b"))))
    (redo,) = [e for e in started if isinstance(e, Log) and e.state is TxnState.VOTE_YES]
    for partition in ("p0", "p1"):
        host.handle(MessageReceived(partition, "c0", Vote(quick, partition, yes=True)))
    landed = host.handle(LogReturned(redo, TxnState.VOTE_YES))
    assert [e.state for e in landed if isinstance(e, Log)] == [TxnState.COMMIT], landed
    assert not host.handle(TimerFired(Timer("c0", quick, "redo-window")))


def test_collection_waits_out_the_longest_grace_a_participant_acknowledged_with() -> None:
    """Found by audit (2026-11-27): a coordinator collected its transaction's records after its
    own gc_grace_ms, which covers calls of its own storage deadline. During a rolling change of
    the deadline a participant with a longer one could have a timed-out vote write still on its
    way (it retried, and the retry landed): landing in the emptied slot, recovery would take it
    for an open vote and apply its old redo again over newer writes. Each acknowledgement says the
    least grace its sender's calls need, and collection waits out the longest."""
    txn = "5.c0.x.6.cornus"
    config = ProtocolConfig()
    host = CoordinatorHost("c0", config, random.Random(1), protocol_of)
    host.handle(CommitRequested("c0", txn, writes=(("p0", b"a"), ("p1", b"b"))))
    for partition in ("p0", "p1"):
        host.handle(MessageReceived(partition, "c0", Vote(txn, partition, yes=True)))
    longer = gc_grace_ms_min(3 * config.storage_deadline_ms, config.clock_slack_ms)
    assert longer > config.gc_grace_ms
    host.handle(MessageReceived("p0", "c0", DecisionAck(txn, "p0", TxnState.COMMIT, grace_ms_min=longer)))
    effects = host.handle(MessageReceived("p1", "c0", DecisionAck(txn, "p1", TxnState.COMMIT)))
    (collection,) = [e for e in effects if isinstance(e, StartTimer) and e.timer.kind == "gc"]
    assert collection.duration_ms == longer


def test_a_coordinator_log_abort_waiting_for_its_identity_read_writes_no_more_redo() -> None:
    """Found by review (2026-11-27): an ABORT of a client-chosen id waits for a read of the
    node's identity (ConfirmIdentity), which may wait for the next periodic check; meanwhile the
    redo's retry timer kept writing the redo, past REDO_DURABLE_MS_MAX. Nothing could commit, but
    a redo landing after a recovering node's scan would hold that node's locks for nothing."""
    txn = client_txn_id(5, "c0", "ab" * 16, Protocol.COORDINATOR_LOG)
    host = CoordinatorHost("c0", ProtocolConfig(), random.Random(1), protocol_of)
    host.identity_taken(1)
    started = host.handle(CommitRequested("c0", txn, writes=(("p0", b"a"), ("p1", b"b"))))
    (redo,) = [e for e in started if isinstance(e, Log) and e.state is TxnState.VOTE_YES]
    failed = host.handle(LogReturned(redo, StorageUnreachable("down")))
    (retry,) = [e for e in failed if isinstance(e, StartTimer) and e.timer.kind == "retry"]
    aborting = host.handle(MessageReceived("p0", "c0", Vote(txn, "p0", yes=False)))
    assert any(isinstance(e, CheckIdentity) for e in aborting), aborting
    assert not [e for e in host.handle(TimerFired(retry.timer)) if isinstance(e, Log)], "a redo write after ABORT"


def test_a_terminations_aborts_in_the_other_logs_carry_no_redo() -> None:
    """Found by audit (2026-11-28): the LogOnce(ABORT) a terminating participant writes in the
    logs of the others that never voted carried its own record's body, redo and all: up to
    REDO_BYTES_MAX of this partition's data copied into every other partition's log, where nothing
    applies an ABORT's redo. It carries the participants and the coordinator only."""
    from cornus.protocol.effects import LogOnce
    from cornus.protocol.events import Recovered
    from cornus.protocol.participant_cornus import CornusParticipant
    from storage_adapters.contract import Record, RecordBody

    tid = "1000.c0.a1b2c3.1.cornus"
    participant = CornusParticipant("p0", tid, ProtocolConfig(), random.Random(1))
    vote = Record(LogId.partition("p0"), tid, TxnState.VOTE_YES, RecordBody(("p0", "p1", "p2"), "c0", b"p0's data"))
    aborts = [e for e in participant.handle(Recovered(vote)) if isinstance(e, LogOnce)]
    assert sorted(e.log.key for e in aborts) == [LogId.partition("p1").key, LogId.partition("p2").key], aborts
    assert all(e.state is TxnState.ABORT and e.body == RecordBody(("p0", "p1", "p2"), "c0") for e in aborts), aborts


def test_an_abort_before_prepare_is_told_again_until_every_partition_acknowledges() -> None:
    """Found by audit (2026-11-28): a commit whose read-only partition did not confirm its read
    locks in time aborts before any vote, and told each partition once. A Decision lost on the way
    (a full queue, a reset link) left that partition's execution, locks and all, until its owner
    idled it out (twice timeout_ms_txn_idle, a minute by default). It is sent again until each
    partition acknowledges (PartitionHost answers a Decision of a transaction it has no machine
    for), a bounded number of times."""
    from cornus.protocol.messages import Decision, DecisionAck

    txn = "5.c0.x.3.cornus"
    host = CoordinatorHost("c0", ProtocolConfig(), random.Random(1), protocol_of)
    host.handle(CommitRequested("c0", txn, writes=(("p0", b"a"),), reads=("p1",)))
    aborted = host.handle(TimerFired(Timer("c0", txn, "votes")))
    assert Reply(txn, TxnState.ABORT, "read-only partitions did not confirm their read locks in time") in aborted
    told = {e.to for e in aborted if isinstance(e, Send) and e.message == Decision(txn, TxnState.ABORT)}
    assert told == {"p0", "p1"}, aborted
    again = host.handle(TimerFired(Timer("c0", txn, "resend")))
    assert {e.to for e in again if isinstance(e, Send)} == {"p0", "p1"}, again
    host.handle(MessageReceived("p0", "c0", DecisionAck(txn, "p0", TxnState.ABORT, 1)))
    again = host.handle(TimerFired(Timer("c0", txn, "resend")))
    assert {e.to for e in again if isinstance(e, Send)} == {"p1"}, again
    done = host.handle(MessageReceived("p1", "c0", DecisionAck(txn, "p1", TxnState.ABORT, 1)))
    assert CancelTimer(Timer("c0", txn, "resend")) in done
    assert txn not in host.machines
    # Bounded: a partition that never acknowledges is told so many times, then left to its idle timeout.
    other = "5.c0.x.4.cornus"
    host.handle(CommitRequested("c0", other, writes=(("p0", b"a"),), reads=("p1",)))
    host.handle(TimerFired(Timer("c0", other, "votes")))
    resends = 0
    while other in host.machines:
        assert resends < 100, "an abort told again without end"
        host.handle(TimerFired(Timer("c0", other, "resend")))
        resends += 1


def test_a_second_run_of_a_client_id_whose_vote_meets_its_commit_applies_nothing() -> None:
    """Found by audit (2026-11-28, third): a client-chosen id's second run at a partition whose
    first run committed and ended there under an earlier tenure (PartitionExecutions forgot it)
    voted, and LogOnce(VOTE_YES) found the COMMIT: an assertion crashed the owner. Now the
    participant applies nothing (the redo is not the logged one), lets its locks go, and tells
    its coordinator it does not know, which ends the transaction through the logs."""
    second = "1000.c1.c0123456789abcdef.1.cornus"
    config = ProtocolConfig(storage_deadline_ms=100, clock_slack_ms=20, gc_grace_ms=1_000)
    host = PartitionHost("p0", config, random.Random(1), protocol_of)
    host.handle(Executed(second, "p0", "c1", b"k=2"))
    vote = host.handle(MessageReceived("c1", "p0", Prepare(second, ("p0", "p1"), "c1")))
    call = next(effect for effect in vote if isinstance(effect, LogOnce))
    effects = host.handle(LogReturned(call, LogOnceResult(TxnState.COMMIT, created=False)))
    assert not any(isinstance(effect, ApplyRedo | CacheRedo) for effect in effects), effects
    assert Send("p0", "c1", Vote(second, "p0", False, unknown=True)) in effects, effects
    assert any(isinstance(effect, ReleaseLocks) for effect in effects), effects
    assert second not in host.machines
