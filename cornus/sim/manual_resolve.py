"""Manual resolves in a simulated World (cornus.sim.world): the world drives the core's Resolver
(cornus.protocol.resolve) as the runtime's admin does, and is its coordinator's node answering."""

from __future__ import annotations

import random
import zlib

from cornus.protocol.effects import (
    Effect,
    LogOnce,
    ReadRecord,
    StartTimer,
)
from cornus.protocol.events import (
    Event,
    TimerFired,
)
from cornus.protocol.resolve import AskCoordinator, CoordinatorAnswered, Resolver
from cornus.protocol.status import Known
from cornus.sim.execution_phase import TIMEOUT_MS_EXECUTE
from cornus.sim.schedule import FAULTS_END_MS
from cornus.sim.status_probe import memory_knows
from cornus.sim.steps import (
    STEP_ASKED,
    STEP_RESOLVE,
    STEP_RESOLVE_WRITES,
    STEP_RETURN,
)
from storage_adapters.contract import LogId, TxnState


class ManualResolves:
    """World's methods for manual resolves; they share the World's state."""

    # -- manual resolve ---------------------------------------------------------------------------
    def _start_resolve(self, index: int) -> None:
        txn = self.txns[self.schedule.resolves[index].txn_index]
        aim = bool(self.plans[txn].writes) and zlib.crc32(f"{self.schedule.seed}/{index}/aim".encode()) % 2 == 0
        if aim and self.now_ms < FAULTS_END_MS and not self._voted_undecided(txn):
            # Half the resolves wait for the moment they can write: a yes vote of the transaction
            # logged and no decision yet (by faults end at latest), when the coordinator may still
            # run it, and its records may be collected soon after.
            self._push(self.now_ms + 1, STEP_RESOLVE, index)
            return
        # Half the resolves are forced (the operator's --force), from a hash of the seed: the
        # schedules' draws stay what they were.
        force = zlib.crc32(f"{self.schedule.seed}/{index}/force".encode()) % 2 == 0
        resolver = Resolver(txn, self.partitions, self.config, random.Random(index), force=force)
        self._resolvers[index] = resolver
        self._resolver_effects(index, resolver.start())

    def _voted_undecided(self, txn: str) -> bool:
        states = {self.storage.state(LogId.partition(p), txn) for p, _ in self.plans[txn].writes}
        return TxnState.VOTE_YES in states and not any(state is not None and state.is_decision for state in states)

    def _resolver_step(self, index: int, event: Event | CoordinatorAnswered) -> None:
        resolver = self._resolvers[index]
        if resolver.done or index in self._resolves_abandoned:
            return  # the answer to a call the finished round no longer needed
        try:
            effects = resolver.handle(event)
        except AssertionError as error:
            self.outcome.violations.append(f"assertion in resolve of {resolver.txn}: {error}")
            return
        self._resolver_effects(index, effects)

    def _resolver_effects(self, index: int, effects: list[Effect | AskCoordinator]) -> None:
        resolver = self._resolvers[index]
        writes: list[LogOnce] = []
        for effect in effects:
            if isinstance(effect, StartTimer):
                self._resolve_window_end_ms[index] = self.now_ms + effect.duration_ms
                self._push(self.now_ms + effect.duration_ms, STEP_RETURN,
                           (f"~resolve/{index}", 0, TimerFired(effect.timer), frozenset(), 0))
            elif isinstance(effect, AskCoordinator):
                # The question reaches the coordinator's node after a message's delay, or, one in
                # four, about as late as its answer may come (a slow peer, or the asking process
                # suspended): the window may close meanwhile, which the resolver must notice.
                late = self.rng.random() < 0.25
                serve_ms = self.rng.randint(1, TIMEOUT_MS_EXECUTE if late else self.schedule.delay_ms_max)
                self._push(self.now_ms + serve_ms, STEP_ASKED, (index, effect))
            elif isinstance(effect, LogOnce):
                writes.append(effect)
            else:
                assert isinstance(effect, ReadRecord), effect
                self._call(f"~resolve/{index}", 0, effect, frozenset())
        if writes:
            # The driver's rule (cornus.protocol.resolve): the writes leave only before the window
            # ends. One round in four, its process is suspended first, up to a window's length.
            pause_ms = self.rng.randint(1, resolver.window_ms) if self.rng.random() < 0.25 else 0
            self._push(self.now_ms + pause_ms, STEP_RESOLVE_WRITES, (index, tuple(writes)))
        if resolver.done:
            self.outcome.resolves.append((resolver.txn, resolver.outcome, resolver.detail))

    def _asked(self, index: int, question: AskCoordinator) -> None:
        """The coordinator's node answers from its memory, if it is up; NOTHING when it does not
        answer (the runtime's request deadline)."""
        node = self.nodes[question.coordinator]
        if not node.alive or node.core is None or (node.name, node.incarnation) in self.parked:
            known, answer_ms = Known.NOTHING, TIMEOUT_MS_EXECUTE
        else:
            known, answer_ms = memory_knows(self, node, question.txn), self.rng.randint(1, self.schedule.delay_ms_max)
        self._push(self.now_ms + answer_ms, STEP_RETURN,
                   (f"~resolve/{index}", 0, CoordinatorAnswered(question.txn, known), frozenset(), 0))

    def _resolve_writes(self, index: int, writes: tuple[LogOnce, ...]) -> None:
        resolver = self._resolvers[index]
        if self.now_ms >= self._resolve_window_end_ms[index]:
            # Not sent: the runtime's driver answers "in doubt" and the round ends.
            self.outcome.resolve_writes_held_past_window += 1
            self._resolves_abandoned.add(index)
            self.outcome.resolves.append((resolver.txn, None, "the window closed before the writes left"))
            return
        for write in writes:
            self._call(f"~resolve/{index}", 0, write, frozenset())

