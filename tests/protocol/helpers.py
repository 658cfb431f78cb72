"""Shared helpers for the protocol tests: exact-point failure hooks and one-line scenario runs of
one transaction (`Schedule.single`: coordinator c0, participants p0.. on nodes n0..)."""

from __future__ import annotations

from collections.abc import Callable

from cornus.protocol.config import Protocol
from cornus.protocol.effects import Effect
from cornus.sim.invariants import check, final_outcome
from cornus.sim.schedule import Schedule, node_of
from cornus.sim.world import World
from storage_adapters.contract import TxnState


def crash_on(host: str, predicate: Callable[[Effect], bool], nth: int = 1) -> Callable[..., str | None]:
    """A hook that crashes the node of `host` (a partition or a coordinator node) just before its
    `nth` effect matching `predicate`."""
    node = node_of(host) if host.startswith("p") else host
    seen = {"count": 0, "done": False}

    def hook(world: World, name: str, effect: Effect) -> str | None:
        if name != node or seen["done"] or not predicate(effect):
            return None
        seen["count"] += 1
        if seen["count"] == nth:
            seen["done"] = True
            return "crash"
        return None

    return hook


def run(
    protocol: Protocol,
    votes: tuple[bool, ...] = (True, True),
    hook: Callable[..., str | None] | None = None,
    down_ms: int = 1,
    **options: object,
) -> World:
    world = World(Schedule.single(protocol, votes), hook=hook, **options)  # type: ignore[arg-type]
    world.hook_crash_down_ms = down_ms
    world.run()
    return world


def txn(world: World) -> str:
    """The id of a single-transaction world's transaction."""
    (only,) = world.txns
    return only


def replies(world: World) -> list[TxnState]:
    return world.outcome.replies.get(txn(world), [])


def assert_clean(world: World, expected: TxnState) -> None:
    assert check(world) == []
    for partition, _ in world.plans[txn(world)].writes:
        assert final_outcome(world, txn(world), partition) is expected, partition
