"""A deterministic world for the ownership machine (cornus.protocol.ownership): several nodes, one
storage with compare-and-swap ownership records, calls that are slow, lost or land after their
caller gave up, nodes cut off from storage for a while, nodes that pause (SIGSTOP), crash and
restart, clocks that run at different
rates, and preferences that disagree (configurations out of step). Every schedule is checked
for the rule that matters: once a node has taken a partition in an epoch, no node of an older
epoch acts on it as its owner, by its own lease or by a storage write.

    python -m cornus.sim.ownership_world --schedules 2000 --seed 1
"""

from __future__ import annotations

import argparse
import heapq
import random
import sys
from dataclasses import dataclass, field
from typing import Any

from cornus.protocol.ownership import (
    Acquired,
    Drain,
    Lost,
    LostReason,
    OwnershipConfig,
    OwnershipEffect,
    OwnershipMachine,
    ReadOwners,
    WriteOwner,
    placement,
)
from storage_adapters.contract import Ownership, OwnerWriteResult

CONFIG = OwnershipConfig(
    lease_ms=400, renew_interval_ms=100, clock_slack_ms=100, failover_delay_ms=50, drain_ms_max=300
)
# A call lands within this after it is sent (or never, if lost); its answer takes as long again.
CALL_DELAY_MS_MAX = 150
# A caller that has no answer after this gives up (the storage deadline); its call may land later,
# up to the slack after it.
CALL_DEADLINE_MS = 200
# Clock rates differ by at most this fraction: the slack covers 400 ms * 2 * 2% = 16 ms easily.
CLOCK_RATE_SPREAD = 0.02
RUN_MS = 6_000
EVENT_COUNT_MAX = 200_000


@dataclass
class _Node:
    name: str
    machine: OwnershipMachine
    rate: float
    offset_ms: int
    paused_until_ms: int = 0
    isolated_until_ms: int = 0  # its storage calls are lost until then (a network partition)
    alive: bool = True
    life: int = 0  # bumped by a crash: answers to an earlier life are dropped
    draining: set[str] = field(default_factory=set)

    def clock(self, t_ms: int) -> int:
        return self.offset_ms + int(t_ms * self.rate)


class Violation(AssertionError):
    pass


class World:
    def __init__(self, seed: int, node_count: int = 3, partition_count: int = 2) -> None:
        self.rng = random.Random(seed)
        self.partitions = [f"p{i}" for i in range(partition_count)]
        names = [f"n{i}" for i in range(node_count)]
        self.nodes = {name: self._node(name, names) for name in names}
        self.records: dict[str, Ownership] = {}
        self.queue: list[tuple[int, int, str, Any]] = []
        self.sequence = 0
        self.t_ms = 0
        # Highest epoch taken per partition, and when: no older epoch may act after it.
        self.taken: dict[str, tuple[int, int]] = {}
        self.counts = {"takes": 0, "losses": 0, "pauses": 0, "crashes": 0, "isolations": 0}

    def _node(self, name: str, names: list[str]) -> _Node:
        # Each node's preferences: mostly the nodes' own rule; sometimes skewed, as during a rollout.
        preferred = placement(self.partitions, names, {})
        if self.rng.random() < 0.3:
            preferred = {p: self.rng.choice(names) for p in self.partitions}
        rate = 1 + self.rng.uniform(-CLOCK_RATE_SPREAD, CLOCK_RATE_SPREAD)
        return _Node(name, OwnershipMachine(name, preferred, CONFIG), rate, self.rng.randrange(1_000_000))

    # --- scheduling --------------------------------------------------------------------------
    def at(self, t_ms: int, kind: str, payload: Any) -> None:
        self.sequence += 1
        heapq.heappush(self.queue, (t_ms, self.sequence, kind, payload))

    def run(self) -> None:
        for name in self.nodes:
            self.at(self.rng.randrange(50), "tick", (name, 0))
        for _ in range(self.rng.randrange(4)):
            self.at(self.rng.randrange(RUN_MS), "pause", self.rng.choice(list(self.nodes)))
        for _ in range(self.rng.randrange(3)):
            self.at(self.rng.randrange(RUN_MS), "crash", self.rng.choice(list(self.nodes)))
        for _ in range(self.rng.randrange(4)):
            self.at(self.rng.randrange(RUN_MS), "isolate", self.rng.choice(list(self.nodes)))
        for _ in range(EVENT_COUNT_MAX):
            if not self.queue:
                return
            t_ms, _, kind, payload = heapq.heappop(self.queue)
            if t_ms > RUN_MS:
                return
            self.t_ms = t_ms
            getattr(self, f"_on_{kind}")(payload)
        raise AssertionError(f"more than {EVENT_COUNT_MAX} events")

    def _busy(self, node: _Node) -> bool:
        """A paused node does nothing until it resumes: its events wait."""
        return not node.alive or self.t_ms < node.paused_until_ms

    def _deliver(self, name: str, life: int, step: Any) -> None:
        node = self.nodes[name]
        if node.life != life:
            return
        if self._busy(node):
            if node.alive:
                self.at(node.paused_until_ms, "step", (name, life, step))
            return
        self._run(node, step(node.machine, node.clock(self.t_ms)))
        self._check(node)

    def _on_step(self, payload: tuple[str, int, Any]) -> None:
        self._deliver(*payload)

    def _on_tick(self, payload: tuple[str, int]) -> None:
        name, life = payload
        node = self.nodes[name]
        if node.life != life:
            return
        self._deliver(name, life, lambda machine, now: machine.tick(now))
        # Drains finish some time after they start: transactions in flight end.
        for partition in list(node.draining):
            if self.rng.random() < 0.3:
                node.draining.discard(partition)
                self._deliver(name, life, lambda machine, now, p=partition: machine.drained(now, p))
        self.at(self.t_ms + CONFIG.renew_interval_ms // 2, "tick", (name, life))

    def _on_pause(self, name: str) -> None:
        node = self.nodes[name]
        node.paused_until_ms = max(node.paused_until_ms, self.t_ms + self.rng.randrange(100, 1500))
        self.counts["pauses"] += 1

    def _on_isolate(self, name: str) -> None:
        node = self.nodes[name]
        node.isolated_until_ms = max(node.isolated_until_ms, self.t_ms + self.rng.randrange(100, 1500))
        self.counts["isolations"] += 1

    def _on_crash(self, name: str) -> None:
        node = self.nodes[name]
        if not node.alive:
            return  # down already: its restart is scheduled
        node.alive = False
        node.life += 1
        node.draining.clear()
        self.counts["crashes"] += 1
        self.at(self.t_ms + self.rng.randrange(50, 800), "restart", name)

    def _on_restart(self, name: str) -> None:
        node = self.nodes[name]
        node.alive = True
        node.machine = OwnershipMachine(name, node.machine.preferred, CONFIG)
        self.at(self.t_ms, "tick", (name, node.life))

    def _on_land(self, payload: tuple[str, int, WriteOwner | ReadOwners, bool]) -> None:
        name, life, call, answered = payload
        if isinstance(call, ReadOwners):
            result: Any = dict(self.records)
        else:
            result = self._cas(call)
        if answered:
            delay = self.rng.randrange(CALL_DELAY_MS_MAX)
            self.at(self.t_ms + delay, "answer", (name, life, call, result))

    def _on_answer(self, payload: tuple[str, int, Any, Any]) -> None:
        name, life, call, result = payload
        if isinstance(call, ReadOwners):
            self._deliver(name, life, lambda machine, now: machine.owners_read(now, result))
        else:
            self._deliver(name, life, lambda machine, now: machine.owner_written(now, call, result))

    def _on_timeout(self, payload: tuple[str, int, Any]) -> None:
        name, life, call = payload
        if isinstance(call, ReadOwners):
            self._deliver(name, life, lambda machine, now: machine.owners_read(now, None))
        else:
            self._deliver(name, life, lambda machine, now: machine.owner_written(now, call, None))

    # --- storage -----------------------------------------------------------------------------
    def _cas(self, call: WriteOwner) -> OwnerWriteResult:
        stored = self.records.get(call.new.partition)
        expected = call.expected
        matches = stored is None if expected is None else (
            stored is not None and (stored.epoch, stored.version) == (expected.epoch, expected.version)
        )
        if not matches:
            return OwnerWriteResult(stored, False)
        self.records[call.new.partition] = call.new
        if stored is None or call.new.epoch != stored.epoch:
            self.taken[call.new.partition] = (call.new.epoch, self.t_ms)
            self.counts["takes"] += 1
        return OwnerWriteResult(call.new, True)

    # --- effects -----------------------------------------------------------------------------
    def _run(self, node: _Node, effects: list[OwnershipEffect]) -> None:
        for effect in effects:
            if isinstance(effect, ReadOwners | WriteOwner):
                self._send(node, effect)
            elif isinstance(effect, Drain):
                node.draining.add(effect.partition)
            elif isinstance(effect, Lost):
                node.draining.discard(effect.partition)
                self.counts["losses"] += 1
                stored = self.records.get(effect.partition)
                if (effect.reason is LostReason.TAKEN and stored is not None and stored.owner == node.name
                        and stored.epoch == effect.epoch):
                    # Found by audit (2026-11-28): a read served before the node's take landed,
                    # answered after it, made the node drop what it had just won.
                    raise Violation(f"{node.name} dropped {effect.partition} as taken, but storage still holds "
                                    f"its epoch {effect.epoch}: {stored}")
            else:
                assert isinstance(effect, Acquired)
                epoch, _ = self.taken[effect.ownership.partition]
                if epoch != effect.ownership.epoch:
                    raise Violation(f"{node.name} acquired {effect.ownership} but epoch {epoch} was taken since")

    def _send(self, node: _Node, call: ReadOwners | WriteOwner) -> None:
        roll = self.rng.random()
        land_ms = self.t_ms + self.rng.randrange(CALL_DELAY_MS_MAX)
        if roll < 0.05 or self.t_ms < node.isolated_until_ms:
            # Lost before it landed: the caller times out.
            self.at(self.t_ms + CALL_DEADLINE_MS, "timeout", (node.name, node.life, call))
        elif roll < 0.12:
            # Lands late, after the caller gave up, within the deadline plus the slack.
            late_ms = self.t_ms + CALL_DEADLINE_MS + self.rng.randrange(CONFIG.clock_slack_ms)
            self.at(late_ms, "land", (node.name, node.life, call, False))
            self.at(self.t_ms + CALL_DEADLINE_MS, "timeout", (node.name, node.life, call))
        else:
            self.at(land_ms, "land", (node.name, node.life, call, True))

    # --- the invariant -----------------------------------------------------------------------
    def _check(self, node: _Node) -> None:
        """A node that acts now must hold the newest epoch of every partition it thinks it holds."""
        now = node.clock(self.t_ms)
        for partition in node.machine.held:
            if not node.machine.holds(partition, now):
                continue
            epoch = node.machine.epoch(partition)
            newest, taken_ms = self.taken[partition]
            if epoch != newest:
                raise Violation(
                    f"t={self.t_ms}: {node.name} holds {partition} at epoch {epoch}, "
                    f"but epoch {newest} was taken at t={taken_ms}"
                )
            stored = self.records[partition]
            if stored.owner != node.name:
                # Storage would refuse this node's fenced writes: it acts on a lease it gave up.
                raise Violation(f"t={self.t_ms}: {node.name} holds {partition}, whose record is {stored}")


def explore(schedules: int, seed: int) -> tuple[int, dict[str, int]]:
    totals: dict[str, int] = {}
    for index in range(schedules):
        world = World(seed * 1_000_003 + index, node_count=2 + index % 3, partition_count=1 + index % 3)
        try:
            world.run()
        except Violation as violation:
            print(f"schedule {index}: {violation}", file=sys.stderr)
            return index + 1, {**totals, "violations": 1}
        for key, value in world.counts.items():
            totals[key] = totals.get(key, 0) + value
    return schedules, {**totals, "violations": 0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    ran, totals = explore(args.schedules, args.seed)
    print(f"schedules {ran}: " + ", ".join(f"{key} {value}" for key, value in sorted(totals.items())))
    sys.exit(1 if totals["violations"] else 0)


if __name__ == "__main__":
    main()
