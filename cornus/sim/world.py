"""The simulated world: nodes running protocol hosts, a lossy reordering network, an in-memory
LogStore with outages, crashes and restarts, all driven by one seeded RNG and a time-ordered queue.
A run is a pure function of (protocol, schedule, config, hooks)."""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cornus.protocol.config import Protocol, ProtocolConfig
from cornus.protocol.effects import (
    ApplyRedo,
    CancelTimer,
    DeleteRecord,
    Effect,
    Log,
    LogOnce,
    ReleaseLocks,
    Reply,
    Send,
    StartTimer,
)
from cornus.protocol.events import (
    CommitRequested,
    Event,
    Executed,
    LogReturned,
    MessageReceived,
    Recovered,
    StorageUnreachable,
    TimerFired,
)
from cornus.protocol.hosts import CoordinatorFactory, CoordinatorHost, ParticipantFactory, PartitionHost
from cornus.sim.schedule import FAULTS_END_MS, Schedule
from cornus.sim.storage_model import StorageModel
from storage_adapters.contract import LogId, TxnState

TXN = "t1"
COORDINATOR = "c0"
# A restarting node retries its recovery scan this often while its log is unreachable.
RESTART_RETRY_MS = 25

# Hook a test installs to force a failure at an exact point: called before each effect a node
# executes; "crash" crashes the node before the effect, "drop" skips it (a lost message).
EffectHook = Callable[["World", str, Effect], str | None]

_DELIVER, _STORE_ARRIVE, _STORE_RETURN, _TIMER, _CRASH, _RESTART, _COMMIT, _CHECK = range(8)


def _prune(paths: frozenset[tuple[int, int]]) -> frozenset[tuple[int, int]]:
    """Keep only the (round trips, writes) pairs no other pair dominates."""
    return frozenset(
        p for p in paths if not any(q != p and q[0] >= p[0] and q[1] >= p[1] for q in paths)
    )


@dataclass
class Node:
    name: str
    host: Any
    alive: bool = True
    incarnation: int = 0
    timers: dict[str, int] = field(default_factory=dict)
    timer_generation: int = 0
    path: frozenset[tuple[int, int]] = frozenset({(0, 0)})


@dataclass
class Outcome:
    """What a run produced, for the invariant checker."""

    replies: list[TxnState] = field(default_factory=list)
    reply_paths: list[frozenset[tuple[int, int]]] = field(default_factory=list)
    machine_decisions: dict[str, set[TxnState]] = field(default_factory=dict)
    coordinator_decisions: set[TxnState] = field(default_factory=set)
    applied: set[str] = field(default_factory=set)
    released_read_only: set[str] = field(default_factory=set)
    violations: list[str] = field(default_factory=list)
    undecided_at_liveness_check: list[str] = field(default_factory=list)
    log_writes: int = 0
    messages: int = 0


class World:
    def __init__(
        self,
        protocol: Protocol,
        schedule: Schedule,
        *,
        config: ProtocolConfig | None = None,
        hook: EffectHook | None = None,
        participant_factory: ParticipantFactory | None = None,
        coordinator_factory: CoordinatorFactory | None = None,
        trace_paths: bool = False,
    ) -> None:
        self.protocol = protocol
        self.schedule = schedule
        self.config = config or ProtocolConfig()
        # GC may delete only once nothing in flight can touch the record again.
        assert self.config.gc_grace_ms > schedule.delay_ms_max + 2 * schedule.storage_ms_max
        self.hook = hook
        # How long a node crashed by the hook stays down.
        self.hook_crash_down_ms = 1
        self.trace_paths = trace_paths
        self.rng = random.Random(schedule.seed)
        self.storage = StorageModel()
        self.outcome = Outcome()
        self.now_ms = 0
        self._started = False
        self._queue: list[tuple[int, int, int, Any]] = []
        self._seq = 0
        self._participant_factory = participant_factory
        self._coordinator_factory = coordinator_factory
        self.partitions = schedule.partitions
        self.read_only = tuple(f"r{i}" for i in range(schedule.read_only_count))
        self.nodes: dict[str, Node] = {COORDINATOR: Node(COORDINATOR, self._new_host(COORDINATOR))}
        for name in (*self.partitions, *self.read_only):
            self.nodes[name] = Node(name, self._new_host(name))
        self.logs = {name: LogId.partition(name) for name in self.partitions}
        self.logs[COORDINATOR] = LogId.coordinator(COORDINATOR)
        self._down_logs: dict[str, list[tuple[int, int]]] = {}
        for outage in schedule.outages:
            for key in outage.logs:
                self._down_logs.setdefault(key, []).append((outage.start_ms, outage.end_ms))
        self.liveness_check_ms = FAULTS_END_MS + self.liveness_bound_ms()
        self.end_ms = self.liveness_check_ms + 2 * self.config.gc_grace_ms
        for p in self.partitions:
            self.outcome.machine_decisions[p] = set()

    # -- setup ----------------------------------------------------------------------------------
    def liveness_bound_ms(self) -> int:
        """How long after faults stop every participant must have decided (Cornus's promise;
        the blocking protocols are held to it too, once their coordinator is back)."""
        c = self.config
        slowest_call = 2 * self.schedule.storage_ms_max + self.schedule.delay_ms_max
        return (
            c.timeout_ms_prepare + c.timeout_ms_votes + c.timeout_ms_decision
            + 4 * c.backoff_ms_max + 20 * slowest_call + c.timeout_ms_resend
        )

    def _new_host(self, name: str) -> Any:
        jitter = random.Random(hash((self.schedule.seed, name)) & 0xFFFFFFFF)
        if name == COORDINATOR:
            return CoordinatorHost(name, self.protocol, self.config, jitter, factory=self._coordinator_factory)
        return PartitionHost(name, self.protocol, self.config, jitter, factory=self._participant_factory)

    def _push(self, at_ms: int, kind: int, data: Any) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (at_ms, self._seq, kind, data))

    # -- run ----------------------------------------------------------------------------------------
    def run(self, until_ms: int | None = None) -> Outcome:
        """Run to the end (or pause at `until_ms`; a later call continues)."""
        if not self._started:
            self._started = True
            self._begin()
        limit = self.end_ms if until_ms is None else min(until_ms, self.end_ms)
        while self._queue and not self.outcome.violations and self._queue[0][0] <= limit:
            at_ms, _, kind, data = heapq.heappop(self._queue)
            self.now_ms = at_ms
            self._step(kind, data)
        if until_ms is None:
            self.outcome.violations.extend(self.storage.violations)
        return self.outcome

    def _begin(self) -> None:
        redo = {p: f"redo-{p}".encode() for p in self.partitions}
        for p, vote in zip(self.partitions, self.schedule.votes, strict=True):
            self._deliver_event(p, Executed(TXN, p, COORDINATOR, redo[p], vote), self.nodes[p].path)
        writes = tuple((p, redo[p]) for p in self.partitions)
        self._push(1, _COMMIT, CommitRequested(TXN, writes, self.read_only))
        for crash in self.schedule.crashes:
            self._push(crash.at_ms, _CRASH, crash)
        self._push(self.liveness_check_ms, _CHECK, None)

    def _step(self, kind: int, data: Any) -> None:
        if kind == _DELIVER:
            to, sender, message, path = data
            node = self.nodes[to]
            if node.alive:
                self._deliver_event(to, MessageReceived(sender, message), path)
        elif kind == _STORE_ARRIVE:
            self._storage_arrive(*data)
        elif kind == _STORE_RETURN:
            name, incarnation, call, result, path = data
            node = self.nodes[name]
            if node.alive and node.incarnation == incarnation:
                self._deliver_event(name, LogReturned(call, result), path)
        elif kind == _TIMER:
            name, incarnation, timer, generation, path = data
            node = self.nodes[name]
            if node.alive and node.incarnation == incarnation and node.timers.get(timer) == generation:
                del node.timers[timer]
                self._deliver_event(name, TimerFired(timer), path)
        elif kind == _CRASH:
            self._crash(data.node, data.down_ms)
        elif kind == _RESTART:
            self._restart(data)
        elif kind == _COMMIT:
            if self.nodes[COORDINATOR].alive:
                self._deliver_event(COORDINATOR, data, self.nodes[COORDINATOR].path)
        else:
            assert kind == _CHECK
            self._check_liveness()

    # -- nodes ------------------------------------------------------------------------------------
    def _deliver_event(self, name: str, event: Event, path: frozenset[tuple[int, int]]) -> None:
        node = self.nodes[name]
        if self.trace_paths:
            node.path = _prune(node.path | path)
        try:
            effects = node.host.handle(event)
        except AssertionError as error:
            self.outcome.violations.append(f"assertion in {name} on {type(event).__name__}: {error}")
            return
        self._observe(name, node)
        for effect in effects:
            if self.hook is not None:
                action = self.hook(self, name, effect)
                if action == "crash":
                    self._crash(name, self.hook_crash_down_ms)
                    return
                if action == "drop":
                    continue
            self._execute(node, effect)

    def _observe(self, name: str, node: Node) -> None:
        machine = node.host.machines.get(TXN)
        if machine is None or machine.decision is None:
            return
        if name == COORDINATOR:
            self.outcome.coordinator_decisions.add(machine.decision)
        elif name in self.outcome.machine_decisions:
            self.outcome.machine_decisions[name].add(machine.decision)

    def _crash(self, name: str, down_ms: int) -> None:
        node = self.nodes[name]
        if not node.alive:
            return
        node.alive = False
        node.incarnation += 1
        node.timers.clear()
        node.host = None
        # Recovery must not scan before the dead incarnation's storage calls have landed or
        # expired (a runtime waits out its call deadline), else a late VOTE_YES goes unseen.
        settle_ms = 2 * self.schedule.storage_ms_max + 1
        restart_at = self.now_ms + max(down_ms, settle_ms)
        # Every node is back when faults end, so liveness can be judged from then on.
        restart_at = min(restart_at, max(FAULTS_END_MS, self.now_ms + settle_ms))
        self._push(restart_at, _RESTART, name)

    def _restart(self, name: str) -> None:
        node = self.nodes[name]
        assert not node.alive
        log = self.logs.get(name)
        if log is not None and self._unreachable(log):
            self._push(self.now_ms + RESTART_RETRY_MS, _RESTART, name)
            return
        node.alive = True
        node.host = self._new_host(name)
        node.path = frozenset({(0, 0)})
        if log is not None:
            for record in self.storage.scan_unfinished(log):
                self._deliver_event(name, Recovered(record), node.path)

    def _unreachable(self, log: LogId) -> bool:
        windows = self._down_logs.get(log.key)
        return windows is not None and any(start <= self.now_ms < end for start, end in windows)

    # -- effects ----------------------------------------------------------------------------------
    def _execute(self, node: Node, effect: Effect) -> None:
        if isinstance(effect, Send):
            self.outcome.messages += 1
            lossy = self.now_ms < FAULTS_END_MS or self.protocol is Protocol.CORNUS
            if lossy and self.rng.random() < self.schedule.loss_probability:
                return
            delay = self.rng.randint(1, self.schedule.delay_ms_max)
            path = frozenset((h + 1, w) for h, w in node.path) if self.trace_paths else node.path
            self._push(self.now_ms + delay, _DELIVER, (effect.to, node.name, effect.message, path))
        elif isinstance(effect, LogOnce | Log):
            self.outcome.log_writes += 1
            latency = self.rng.randint(1, self.schedule.storage_ms_max)
            data = (node.name, node.incarnation, effect, node.path)
            self._push(self.now_ms + latency, _STORE_ARRIVE, data)
        elif isinstance(effect, StartTimer):
            node.timer_generation += 1
            node.timers[effect.name] = node.timer_generation
            data = (node.name, node.incarnation, effect.name, node.timer_generation, node.path)
            self._push(self.now_ms + effect.duration_ms, _TIMER, data)
        elif isinstance(effect, CancelTimer):
            node.timers.pop(effect.name, None)
        elif isinstance(effect, Reply):
            assert effect.txn == TXN
            self.outcome.replies.append(effect.outcome)
            self.outcome.reply_paths.append(node.path)
        elif isinstance(effect, ApplyRedo):
            self.storage.apply(self.logs[effect.partition], effect.txn)
            self.outcome.applied.add(effect.partition)
        elif isinstance(effect, ReleaseLocks):
            if effect.partition in self.read_only:
                self.outcome.released_read_only.add(effect.partition)
        else:
            assert isinstance(effect, DeleteRecord)
            self._check_collectable(effect)
            self.storage.delete(effect.log, effect.txn)

    def _storage_arrive(self, name: str, incarnation: int, call: LogOnce | Log, path: Any) -> None:
        # The call reaches storage even if its caller died meanwhile; only the answer is lost.
        latency = self.rng.randint(1, self.schedule.storage_ms_max)
        if self._unreachable(call.log):
            if self.rng.random() < self.schedule.ambiguous_probability:
                self._apply(call)
            result: Any = StorageUnreachable("outage")
        else:
            result = self._apply(call)
        if self.trace_paths:
            path = frozenset((h, w + 1) for h, w in path)
        self._push(self.now_ms + latency, _STORE_RETURN, (name, incarnation, call, result, path))

    def _apply(self, call: LogOnce | Log) -> Any:
        if isinstance(call, LogOnce):
            return self.storage.log_once(call.log, call.txn, call.state, call.body)
        return self.storage.log(call.log, call.txn, call.state, call.body)

    # -- checks made during the run -----------------------------------------------------------------
    def _check_collectable(self, effect: DeleteRecord) -> None:
        """DESIGN 4: no record may go while someone could still run termination against it."""
        for name in self.partitions:
            node = self.nodes[name]
            machine = node.host.machines.get(effect.txn) if node.alive else None
            if machine is not None and (not machine.decided_durably or machine.calls_in_flight):
                self.outcome.violations.append(
                    f"GC of {effect.log.key} while {name} is {machine.phase.value} "
                    f"with {machine.calls_in_flight} calls in flight"
                )
            if not node.alive and self.storage.state(self.logs[name], effect.txn) is TxnState.VOTE_YES:
                self.outcome.violations.append(f"GC of {effect.log.key} while {name} is down undecided")
        for _, _, kind, data in self._queue:
            if kind == _STORE_ARRIVE and data[2].txn == effect.txn:
                self.outcome.violations.append(f"GC of {effect.log.key} with a storage call in flight")

    def _check_liveness(self) -> None:
        """Faults ended a bound ago: every participant must hold a durable decision by now."""
        for name in self.partitions:
            node = self.nodes[name]
            machine = node.host.machines.get(TXN) if node.alive else None
            if machine is not None and not machine.decided_durably:
                self.outcome.undecided_at_liveness_check.append(f"{name} is {machine.phase.value}")
            if self.storage.state(self.logs[name], TXN) is TxnState.VOTE_YES:
                self.outcome.undecided_at_liveness_check.append(f"{name}'s log still holds VOTE_YES")
