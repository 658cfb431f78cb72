"""Shared helpers for the protocol tests: exact-point failure hooks and one-line scenario runs."""

from __future__ import annotations

from collections.abc import Callable

from cornus.protocol.config import Protocol
from cornus.protocol.effects import Effect
from cornus.sim.invariants import check, final_outcome
from cornus.sim.schedule import Schedule
from cornus.sim.world import World
from storage_adapters.contract import TxnState


def crash_on(node: str, predicate: Callable[[Effect], bool], nth: int = 1) -> Callable[..., str | None]:
    """A hook that crashes `node` just before its `nth` effect matching `predicate`."""
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
    world = World(protocol, Schedule(seed=7, votes=votes), hook=hook, **options)  # type: ignore[arg-type]
    world.hook_crash_down_ms = down_ms
    world.run()
    return world


def assert_clean(world: World, expected: TxnState) -> None:
    assert check(world) == []
    for partition in world.partitions:
        assert final_outcome(world, partition) is expected, partition
