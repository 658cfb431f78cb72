"""The commit-path cost model: round trips and log writes before the caller hears COMMIT, versus
the paper (2PC: 1 RTT + 2 writes; Cornus: 1 RTT + 1 write; coordinator-log, section 5.6: redo
logged in parallel with prepare, then the decision: max(RTT, write) + 1 write)."""

from __future__ import annotations

import pytest

from cornus.protocol.config import Protocol, ProtocolConfig
from cornus.protocol.effects import (
    ApplyRedo,
    CancelTimer,
    Decided,
    DeleteRecord,
    Effect,
    Log,
    LogOnce,
    Reply,
    Send,
    StartTimer,
    Timer,
)
from cornus.protocol.events import CommitRequested, MessageReceived
from cornus.protocol.hosts import CoordinatorHost, PartitionHost
from cornus.protocol.messages import Decision, ReadOnlyReleased, ReleaseReadOnly
from cornus.protocol.txn_ids import PROTOCOL_TAGS, protocol_of
from cornus.sim.invariants import check
from cornus.sim.schedule import Schedule, TxnPlan
from cornus.sim.world import World
from storage_adapters.contract import LogId, TxnState

from .helpers import replies, txn

# (message hops, sequential log writes) on each critical path; 2 hops = 1 round trip.
EXPECTED = {
    Protocol.CORNUS: {(2, 1)},
    Protocol.TWO_PC: {(2, 2)},
    Protocol.COORDINATOR_LOG: {(2, 1), (0, 2)},
}


@pytest.mark.parametrize("protocol", list(Protocol))
@pytest.mark.parametrize("participants", [1, 2, 4])
def test_commit_path_matches_paper(protocol: Protocol, participants: int) -> None:
    world = World(Schedule.single(protocol, (True,) * participants, seed=1), trace_paths=True)
    world.run()
    assert check(world) == []
    assert replies(world) == [TxnState.COMMIT]
    assert set(world.outcome.reply_paths[0]) == EXPECTED[protocol]


# The storage calls each participant makes for its own record and data in a fault-free run, in
# order. On COMMIT a participant whose record holds its VOTE_YES (Cornus, 2PC) makes no Log(COMMIT):
# its ApplyRedo turns the vote into COMMIT in the same call as it writes the data (safe because only
# it ever decides over its own vote, see LogStore.apply_redo). That is 2 calls where it used to be
# 3 (vote, Log(COMMIT), apply). A coordinator-log participant has no record before the decision,
# so it still logs the COMMIT with its redo first. An ABORT is still logged.
STORAGE_CALLS_ON_COMMIT = {
    Protocol.CORNUS: ["LogOnce(VOTE_YES)", "ApplyRedo"],
    Protocol.TWO_PC: ["Log(VOTE_YES)", "ApplyRedo"],
    Protocol.COORDINATOR_LOG: ["Log(COMMIT)", "ApplyRedo"],
}
STORAGE_CALLS_OF_A_YES_VOTER_ON_ABORT = {
    Protocol.CORNUS: ["LogOnce(VOTE_YES)", "Log(ABORT)"],
    Protocol.TWO_PC: ["Log(VOTE_YES)", "Log(ABORT)"],
    Protocol.COORDINATOR_LOG: [],  # presumed abort: no record of its own at all
}


def _own_storage_calls(protocol: Protocol, votes: tuple[bool, ...]) -> tuple[World, dict[str, list[str]]]:
    """Run one transaction; return each partition's storage calls that it made itself."""
    calls: dict[str, list[str]] = {}

    def spy(world: World, name: str, effect: Effect) -> None:
        if isinstance(effect, LogOnce | Log) and effect.owner.startswith("p"):
            calls.setdefault(effect.owner, []).append(f"{type(effect).__name__}({effect.state.value})")
        elif isinstance(effect, ApplyRedo | DeleteRecord) and effect.owner.startswith("p"):
            calls.setdefault(effect.owner, []).append(type(effect).__name__)

    world = World(Schedule.single(protocol, votes, seed=1))
    world.hook = spy
    world.run()
    assert check(world) == []
    return world, calls


@pytest.mark.parametrize("protocol", list(Protocol))
@pytest.mark.parametrize("participants", [1, 2, 3])
def test_a_committing_participant_makes_two_storage_calls(protocol: Protocol, participants: int) -> None:
    world, calls = _own_storage_calls(protocol, (True,) * participants)
    assert replies(world) == [TxnState.COMMIT]
    assert calls == {f"p{i}": STORAGE_CALLS_ON_COMMIT[protocol] for i in range(participants)}
    for i in range(participants):
        record = world.storage.read(LogId.partition(f"p{i}"), txn(world))
        # Collected by the coordinator after every ack, or still there: COMMIT and applied.
        assert record is None or (record.state, record.applied) == (TxnState.COMMIT, True)
        assert (f"p{i}", txn(world)) in world.outcome.applied


@pytest.mark.parametrize("protocol", list(Protocol))
def test_an_aborting_participant_still_logs_the_abort(protocol: Protocol) -> None:
    world, calls = _own_storage_calls(protocol, (True, False))
    assert replies(world) == [TxnState.ABORT]
    assert calls.get("p0", []) == STORAGE_CALLS_OF_A_YES_VOTER_ON_ABORT[protocol]
    assert not world.outcome.applied


@pytest.mark.parametrize("protocol", list(Protocol))
def test_read_only_partitions_cost_one_round_trip_before_prepare(protocol: Protocol) -> None:
    """Their read locks must still be held when the votes are asked for (a restart would have lost
    them): one round trip to confirm them, then the protocol's own path."""
    world = World(Schedule.single(protocol, (True, True), seed=1, read_only_count=1), trace_paths=True)
    world.run()
    assert check(world) == []
    assert replies(world) == [TxnState.COMMIT]
    assert set(world.outcome.reply_paths[0]) == {(hops + 2, writes) for hops, writes in EXPECTED[protocol]}


def test_wholly_read_only_transaction_skips_both_phases() -> None:
    for protocol in Protocol:
        txn = f"9.c0.x.1.{PROTOCOL_TAGS[protocol]}"
        host = CoordinatorHost("c0", ProtocolConfig(), _Fixed(), protocol_of)
        effects = host.handle(CommitRequested("c0", txn, writes=(), reads=("r0", "r1")))
        votes = Timer("c0", txn, "votes")
        assert effects == [
            Send("c0", "r0", ReleaseReadOnly(txn, "r0")),
            Send("c0", "r1", ReleaseReadOnly(txn, "r1")),
            StartTimer(votes, ProtocolConfig().timeout_ms_votes),
        ]
        assert host.handle(MessageReceived("r0", "c0", ReadOnlyReleased(txn, "r0", held=True))) == []
        effects = host.handle(MessageReceived("r1", "c0", ReadOnlyReleased(txn, "r1", held=True)))
        assert effects == [CancelTimer(votes), Decided(txn, TxnState.COMMIT), Reply(txn, TxnState.COMMIT)]
        assert txn not in host.machines, "nothing to collect: the machine is forgotten at once"


def test_read_only_participant_is_released_without_logging() -> None:
    world = World(Schedule.single(Protocol.CORNUS, (True, True), seed=1, read_only_count=1))
    logged: list[str] = []

    def spy(world: World, name: str, effect: object) -> None:
        if isinstance(effect, LogOnce):
            logged.append(effect.log.name)

    world.hook = spy
    world.run()
    assert check(world) == []
    assert world.outcome.released_read_only == {("p2", txn(world))}
    assert "p2" not in logged


def test_a_read_only_partition_that_lost_its_locks_aborts_the_transaction() -> None:
    """A crash between the read and the commit loses the read locks; what was read may have
    changed since, so the transaction must abort, and nobody logs anything for it."""
    world = World(Schedule.single(Protocol.CORNUS, (True, True), seed=1, read_only_count=1))
    world.run(until_ms=1)
    world.crash(world.node_of_host("p2").name, 1)
    world.run()
    assert check(world) == []
    assert replies(world) == [TxnState.ABORT]
    assert not world.storage.voted_yes, "no participant may vote before the reads are confirmed"


def test_a_partition_without_the_execution_says_its_read_locks_are_gone() -> None:
    txn = "9.c0.x.1.cornus"
    host = PartitionHost("r0", ProtocolConfig(), _Fixed(), protocol_of)
    effects = host.handle(MessageReceived("c0", "r0", ReleaseReadOnly(txn, "r0")))
    assert effects == [Send("r0", "c0", ReadOnlyReleased(txn, "r0", held=False))]
    coordinator = CoordinatorHost("c0", ProtocolConfig(), _Fixed(), protocol_of)
    coordinator.handle(CommitRequested("c0", txn, writes=(("p0", b"redo"),), reads=("r0",)))
    effects = coordinator.handle(MessageReceived("r0", "c0", ReadOnlyReleased(txn, "r0", held=False)))
    replies_sent = [e for e in effects if isinstance(e, Reply)]
    assert [r.outcome for r in replies_sent] == [TxnState.ABORT] and "lost the read locks" in replies_sent[0].reason
    # The writer never got a prepare: it is told to drop its execution, and nothing was logged.
    assert Send("c0", "p0", Decision(txn, TxnState.ABORT)) in effects
    assert not [e for e in effects if isinstance(e, LogOnce | Log)]


class _Fixed:
    def random(self) -> float:
        return 0.5


@pytest.mark.parametrize("protocol", list(Protocol))
def test_a_partition_a_one_shot_only_reads_costs_it_no_round_trip(protocol: Protocol) -> None:
    """Paper 3.5: it votes in parallel with the partitions that write, so the one-shot's commit
    path is the same as one that writes on every partition (and its vote is logged)."""
    paths = []
    for reads in ((), (("p2", 0),)):
        plan = TxnPlan("c0", protocol, 0, (("p0", 0), ("p1", 0)), reads, (True, True), one_shot=True)
        world = World(Schedule(seed=1, partition_count=3, txns=(plan,)), trace_paths=True)
        world.run()
        assert check(world) == []
        assert replies(world) == [TxnState.COMMIT]
        paths.append(set(world.outcome.reply_paths[0]))
        if reads and protocol is not Protocol.COORDINATOR_LOG:
            assert (LogId.partition("p2"), world.txns[0]) in world.storage.voted_yes
    assert paths[0] == paths[1]
