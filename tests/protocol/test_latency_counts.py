"""The commit-path cost model: round trips and log writes before the caller hears COMMIT, versus
the paper (2PC: 1 RTT + 2 writes; Cornus: 1 RTT + 1 write; coordinator-log, section 5.6: redo
logged in parallel with prepare, then the decision: max(RTT, write) + 1 write)."""

from __future__ import annotations

import pytest

from cornus.protocol.config import Protocol, ProtocolConfig
from cornus.protocol.effects import LogOnce, Reply, Send
from cornus.protocol.events import CommitRequested
from cornus.protocol.hosts import CoordinatorHost
from cornus.protocol.messages import ReleaseReadOnly
from cornus.sim.invariants import check
from cornus.sim.schedule import Schedule
from cornus.sim.world import World
from storage_adapters.contract import TxnState

# (message hops, sequential log writes) on each critical path; 2 hops = 1 round trip.
EXPECTED = {
    Protocol.CORNUS: {(2, 1)},
    Protocol.TWO_PC: {(2, 2)},
    Protocol.COORDINATOR_LOG: {(2, 1), (0, 2)},
}


@pytest.mark.parametrize("protocol", list(Protocol))
@pytest.mark.parametrize("participants", [1, 2, 4])
def test_commit_path_matches_paper(protocol: Protocol, participants: int) -> None:
    world = World(protocol, Schedule(seed=1, votes=(True,) * participants), trace_paths=True)
    world.run()
    assert check(world) == []
    assert world.outcome.replies == [TxnState.COMMIT]
    assert set(world.outcome.reply_paths[0]) == EXPECTED[protocol]


def test_wholly_read_only_transaction_skips_both_phases() -> None:
    for protocol in Protocol:
        host = CoordinatorHost("c0", protocol, ProtocolConfig(), jitter=_Fixed())
        effects = host.handle(CommitRequested("t9", writes=(), reads=("r0", "r1")))
        assert effects == [
            Send("r0", ReleaseReadOnly("t9", "r0")),
            Send("r1", ReleaseReadOnly("t9", "r1")),
            Reply("t9", TxnState.COMMIT),
        ]


def test_read_only_participant_is_released_without_logging() -> None:
    world = World(Protocol.CORNUS, Schedule(seed=1, votes=(True, True), read_only_count=1))
    logged: list[str] = []

    def spy(world: World, name: str, effect: object) -> None:
        if isinstance(effect, LogOnce):
            logged.append(effect.log.name)

    world.hook = spy
    world.run()
    assert check(world) == []
    assert world.outcome.released_read_only == {"r0"}
    assert "r0" not in logged


class _Fixed:
    def random(self) -> float:
        return 0.5
