"""A simulated node's process (cornus.sim.world): its core, the partitions it holds and the state
the runtime keeps in memory beside the core (timers, execution tables, tenures, lapsed leases),
which a crash loses."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from cornus.protocol.effects import Timer
from cornus.protocol.events import Event
from cornus.protocol.execution import PartitionExecutions
from cornus.protocol.locks import Policy
from cornus.protocol.node_core import NodeCore
from cornus.sim import redo


@dataclass
class Node:
    name: str
    core: NodeCore | None
    partitions: tuple[str, ...]
    alive: bool = True
    incarnation: int = 0
    timers: dict[Timer, int] = field(default_factory=dict)
    timer_generation: int = 0
    # Per partition, the core's execution state (locks, buffered writes, refusals, the cache),
    # which the runtime keeps in memory too: a crash loses it.
    tables: dict[str, PartitionExecutions[int]] = field(default_factory=dict)
    # The epoch of this node's tenure of each partition it holds: its fenced writes carry it.
    epochs: dict[str, int] = field(default_factory=dict)
    # How many times this node dropped each partition: an answer to a call of an earlier tenure is
    # dropped, never fed to the partition's host of a later one (the runtime's cancel_owned).
    tenures: dict[str, int] = field(default_factory=dict)
    path: frozenset[tuple[int, int]] = frozenset({(0, 0)})
    # When this process's latest take or check of its identity left, and when the latest one
    # that found the identity its own left: what admits its writes storage cannot fence for the
    # node itself (ProtocolConfig.identity_write_window_ms, cornus.runtime.identity).
    identity_left_ms: int = 0
    identity_confirmed_ms: int | None = None
    identity_taken_ms: int | None = None  # by the node's clock, when the take's answer came
    started_ms: int = 0  # a Twin's second process: by the node's clock, when it started
    # The partitions whose lease ended here while their hosts still run (a Move's `lapse_ms`: the
    # node has not noticed): the answers their calls got meanwhile, held for when it notices.
    lapsed: dict[str, list[tuple[Event, frozenset[tuple[int, int]]]]] = field(default_factory=dict)
    # Per partition, the scans of its recovery out now (their answers not heard yet): what a
    # Move's `after` "scan" waits for.
    scans_out: collections.Counter[str] = field(default_factory=collections.Counter)

    def reset_memory(self, policy: Policy) -> None:
        """What a process loses with its memory (a crash, a deposed process parking)."""
        self.timers.clear()
        for partition in self.lapsed:
            self.epochs.pop(partition, None)  # a lease that lapsed is not taken again on restart
        self.lapsed.clear()
        self.scans_out.clear()
        self.tables = {p: PartitionExecutions(p, redo, policy) for p in self.partitions}

    @property
    def ready(self) -> bool:
        return self.alive and self.core is not None and self.core.recovered
