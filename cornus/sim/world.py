"""The simulated world: nodes running the very `NodeCore` the runtime runs, driven as the runtime
drives it (every partition comes through `add_partition`, with its own recovery), a lossy,
reordering, duplicating network, an in-memory LogStore with outages, calls that land after their
caller gave up and fences, crashes and restarts through the core's own recovery, partitions moving
between nodes, manual resolves, and the core's execution
state (cornus.protocol.execution: locks, buffered writes, refusals, the owner's cache), around
which the world plays the runtime's I/O (reads that answer late, idle executions timing out), and
the status call asked at random moments (cornus.sim.status_probe, with an RNG of its own). All
driven by one seeded RNG and a time-ordered queue: a run is a pure function of (schedule, config,
hooks).

This module holds the world's core (its queue and steps, the network, storage calls, crashes,
the checks); each other concern is a module of World's methods, sharing its state: the execution
phase (execution_phase.py), node identities and second processes (identities.py), partition
moves (partition_moves.py), manual resolves (manual_resolve.py), sweepers and their oracle
(sweeps.py); a node's process state is process.py's, the kinds of steps steps.py's."""

from __future__ import annotations

import collections
import dataclasses
import heapq
import random
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cornus.protocol import status, txn_ids
from cornus.protocol.backoff import JitterSource
from cornus.protocol.config import (
    Protocol,
    ProtocolConfig,
    gc_grace_ms_min,
    outcome_keep_ms_min,
)
from cornus.protocol.effects import (
    ApplyRedo,
    CacheRedo,
    CancelTimer,
    CheckIdentity,
    Decided,
    DeleteRecord,
    Deposed,
    Effect,
    ListIdentities,
    LocksPrepared,
    Log,
    LogOnce,
    ReadRecord,
    RecoveryFinished,
    ReleaseLocks,
    Reply,
    RetakeLocks,
    ScanFinished,
    ScanLog,
    Send,
    StartTimer,
    StorageCall,
    TakeIdentity,
    TerminationEnded,
    TerminationStarted,
    Timer,
)
from cornus.protocol.events import (
    CommitRequested,
    Event,
    FinishedScanned,
    IdentityChecked,
    IdentityTaken,
    MessageReceived,
    ScanReturned,
    StorageUnreachable,
    TimerFired,
    answer,
)
from cornus.protocol.execution import Execution
from cornus.protocol.hosts import CoordinatorFactory, ParticipantFactory
from cornus.protocol.locks import Policy
from cornus.protocol.messages import ReleaseReadOnly
from cornus.protocol.node_core import NodeCore
from cornus.protocol.ownership import fenced_partition, without_lease_may
from cornus.protocol.participant_base import ParticipantBase, Phase
from cornus.protocol.participant_blocking import CoordinatorLogParticipant
from cornus.protocol.resolve import Resolver
from cornus.protocol.txn_ids import PROTOCOL_TAGS, protocol_of
from cornus.sim.execution_phase import EXECUTION_IDLE_MS, TIMEOUT_MS_EXECUTE, CarriedRequest, ExecutionPhase
from cornus.sim.identities import Identities, ParkedProcess
from cornus.sim.manual_resolve import ManualResolves
from cornus.sim.partition_moves import PartitionMoves
from cornus.sim.process import Node
from cornus.sim.schedule import (
    CLOCK_OFFSET_MS_MAX,
    CLOCK_SLACK_MS,
    COORDINATORS,
    FAULTS_END_MS,
    Move,
    Schedule,
    TxnPlan,
    node_of,
)
from cornus.sim.status_probe import StatusProbe
from cornus.sim.steps import (
    STEP_ABANDON,
    STEP_ARRIVE,
    STEP_ASKED,
    STEP_BOOTED,
    STEP_CHECK,
    STEP_COMMIT,
    STEP_CONFIRM,
    STEP_COUNT,
    STEP_CRASH,
    STEP_DELIVER,
    STEP_EXECUTE,
    STEP_EXECUTE_ANSWER,
    STEP_EXECUTE_DEADLINE,
    STEP_EXECUTE_PREPARED,
    STEP_EXECUTE_WRITES,
    STEP_IDENTITY_ARRIVE,
    STEP_IDLE,
    STEP_LAPSE_END,
    STEP_LOCK_EXPIRY,
    STEP_LOCK_GRANTED,
    STEP_MOVE,
    STEP_READ_LANDED,
    STEP_RESEND,
    STEP_RESOLVE,
    STEP_RESOLVE_WRITES,
    STEP_RESTART,
    STEP_RETURN,
    STEP_STATUS,
    STEP_STATUS_ANSWER,
    STEP_TAKE,
    STEP_TIMER,
    STEP_TWIN,
    STEP_TWIN_END,
    STEP_WATCH,
    STEP_WATCH_LANDS,
    STEP_WATCHED,
)
from cornus.sim.storage_model import StorageModel, WriteRefused
from cornus.sim.sweeps import Sweeps, is_sweep_owner
from storage_adapters.contract import LogId, TxnState, identity_name, is_identity

# Hook a test installs to force a failure at an exact point: called before each effect a node
# executes; "crash" crashes the node before the effect, "drop" skips it (a lost message).
EffectHook = Callable[["World", str, Effect], str | None]


# How often a node reads its identity record here (ProtocolConfig.identity_check_ms): within a
# Twin's overlap (under 600 ms) where a schedule has a second process, so that a first process that
# neither writes its coordinator log nor presumes anything is deposed by the periodic read too.
# Without one, no read can find the identity taken (the world reports that as a violation), and
# reads every 150 ms were 60% of a schedule's steps: there they run every second, a few times a
# schedule still.
IDENTITY_CHECK_MS_TWINS = 150
IDENTITY_CHECK_MS = 1_000
IDENTITY_CHECK_MS_SLOW = 20  # Schedule.slow_identity: renewals more often than a deadline

# Where a schedule's storage walks finished records (Schedule.short_scans), how many of its scan
# pages stop short of where a page of an index ends.
SHORT_SCAN_PROBABILITY = 0.5



def _prune(paths: frozenset[tuple[int, int]]) -> frozenset[tuple[int, int]]:
    """Keep only the (round trips, writes) pairs no other pair dominates."""
    return frozenset(p for p in paths if not any(q != p and q[0] >= p[0] and q[1] >= p[1] for q in paths))


def config_for(schedule: Schedule) -> ProtocolConfig:
    """The protocol configuration matching the schedule's storage: a deadline just above the
    slowest round trip, and the smallest grace the rule allows (or 1 s, whichever is longer)."""
    deadline = 2 * schedule.storage_ms_max + 1
    # Past every one-shot request's window (status.requests_window_ms), as the runtime's defaults
    # are: a client's second send of a one-shot meets its records, never their collection.
    # Else 1 s; a cut Twin's second process must collect within the first's cut.
    grace_floor_ms = 2 * TIMEOUT_MS_EXECUTE if any(twin.cut_ms for twin in schedule.twins) else 1000
    grace_ms = max(grace_floor_ms, gc_grace_ms_min(deadline, CLOCK_SLACK_MS))
    keep_ms = max(1000, grace_ms)
    return ProtocolConfig(
        storage_deadline_ms=deadline,
        clock_slack_ms=CLOCK_SLACK_MS,
        gc_grace_ms=grace_ms,
        # As short as the grace (plus what outlives a late call, on storage that takes them), so
        # that tombstones expire within a run and a late call that meets the empty slot after one
        # is explored too; never under 1 s, which collection's retries through an outage fit in
        # (a cut Twin's shorter grace, kept as long, let a retry rewrite a tombstone that an
        # earlier, unanswered try of it had left and that had expired since). Except a sweep
        # schedule's short keep (Schedule.short_keep): the least the configuration allows, which
        # a tombstone written again of the same decision now survives (StorageModel.keep).
        outcome_keep_ms=outcome_keep_ms_min(deadline, CLOCK_SLACK_MS, schedule.late_window_ms) if schedule.short_keep
        else keep_ms + outcome_keep_ms_min(deadline, CLOCK_SLACK_MS, schedule.late_window_ms)
        if schedule.late_window_ms else keep_ms,
        late_write_window_ms=schedule.late_window_ms,
        scan_page_count_max=schedule.scan_page_max,
        # Where nodes sweep (their age outlasts the coordinators' termination bound), the grace by
        # default, as the runtime's: not the longer default, so that sweeps come within a run.
        **({"coordinator_terminate_ms_max": schedule.terminate_limit_ms or grace_ms} if schedule.sweep_interval_ms
           else {"coordinator_terminate_ms_max": schedule.terminate_limit_ms} if schedule.terminate_limit_ms else {}),
        # A cut Twin's first process must not learn of the second before its cut (the runtime
        # checks every 2 s): it is deposed by the read its writes wait for once back, or the next.
        identity_check_ms=(IDENTITY_CHECK_MS_SLOW if schedule.slow_identity
                           else IDENTITY_CHECK_MS if any(twin.cut_ms for twin in schedule.twins)
                           else IDENTITY_CHECK_MS_TWINS if schedule.twins else IDENTITY_CHECK_MS),
    )


@dataclass
class Outcome:
    """What a run produced, for the invariant checker."""

    replies: dict[str, list[TxnState]] = field(default_factory=dict)
    reply_paths: list[frozenset[tuple[int, int]]] = field(default_factory=list)
    decisions: dict[str, set[TxnState]] = field(default_factory=dict)  # every machine decision seen
    executed: set[str] = field(default_factory=set)  # reached commit: every lock was granted
    # One-shots: the partitions whose operations ran (every one of them: then it is `executed`).
    executed_on: dict[str, set[str]] = field(default_factory=dict)
    reads: dict[str, dict[tuple[str, str], int]] = field(default_factory=dict)  # version each txn read
    writes: dict[str, dict[tuple[str, str], int]] = field(default_factory=dict)  # version it wrote
    applied: set[tuple[str, str]] = field(default_factory=set)  # (partition, txn) applies that succeeded
    released_read_only: set[tuple[str, str]] = field(default_factory=set)
    resolves: list[tuple[str, TxnState | None, str]] = field(default_factory=list)
    terminations: int = 0
    terminations_given_up: int = 0  # Cornus coordinators that stopped asking the logs, undecided
    late_landings: int = 0  # storage calls that landed after their caller was told "unreachable"
    lock_waits: int = 0  # one-shot requests that waited for a lock
    stale_answers: int = 0  # answers to calls of a partition's earlier tenure on the same node, dropped
    fenced_writes: int = 0  # writes of a partition's old owner that storage refused after a move
    # A lapsed host's (Node.lapsed) writes not sent and timers not acted on: the lease gate at work.
    writes_skipped_not_held: int = 0
    reads_out_when_lost: int = 0  # slow reads of an owner that lost the partition meanwhile
    resolve_writes_held_past_window: int = 0  # a resolve's writes its driver did not send (suspended)
    timers_dropped_not_held: int = 0
    deposed: int = 0  # processes stopped because a later process of their node took its identity
    # Writes for the node itself that its identity window let through (no read first) while a
    # later process held the identity (World._call).
    stale_window_writes: int = 0
    vacancy_exits: int = 0  # parked processes that found their node's identity vacant and exited
    late_duplicates: int = 0  # second copies of messages sent to arrive after the GC grace
    status_questions: int = 0  # status calls asked of the world and answered by every node
    status_not_known: int = 0  # of them, answered "not known" (the caller may run it again)
    # Client-chosen one-shots a Twin's second process refused, not ready or full (a 503, "nothing
    # ran": the client runs it again under a new id), when.
    told_nothing_ran: dict[str, int] = field(default_factory=dict)
    refused_starting_in_doubt: int = 0  # and of them, those answered in doubt
    refused_identity_stale: int = 0  # client ids a process refused, in doubt, with its identity stale
    refused_deposed_in_doubt: int = 0  # one-shots a deposed process refused, in doubt
    violations: list[str] = field(default_factory=list)
    undecided_at_liveness_check: list[str] = field(default_factory=list)
    log_writes: int = 0
    messages: int = 0


class World(ExecutionPhase, Identities, ManualResolves, PartitionMoves, Sweeps):
    def __init__(
        self,
        schedule: Schedule,
        *,
        config: ProtocolConfig | None = None,
        hook: EffectHook | None = None,
        participant_factory: ParticipantFactory | None = None,
        coordinator_factory: CoordinatorFactory | None = None,
        trace_paths: bool = False,
        trace: list[str] | None = None,
    ) -> None:
        self.schedule = schedule
        # When given, every event a node handles and every effect it executes is appended here,
        # one line each, to read a failing schedule step by step.
        self.trace = trace
        self.config = config or config_for(schedule)
        # The deadline after which a caller hears "unreachable"; a slow call may land up to the
        # slack after it. The core's own rules are derived from these two numbers.
        self.deadline_ms = self.config.storage_deadline_ms
        assert self.deadline_ms > 2 * schedule.storage_ms_max, "a normal round trip must beat the deadline"
        self.hook = hook
        self.hook_crash_down_ms = 1  # how long a node crashed by the hook stays down
        self.trace_paths = trace_paths
        self.rng = random.Random(schedule.seed)
        # Where short scans stop (Schedule.short_scans): a generator of its own, so the other
        # schedules' draws, and their runs, stay what they were.
        self._scan_rng = random.Random(f"{schedule.seed}/scans")
        self.storage = StorageModel()
        self.outcome = Outcome()
        self.now_ms = 0
        self._started = False
        self._queue: list[tuple[int, int, int, Any]] = []
        self._seq = 0
        self._participant_factory = participant_factory
        self._coordinator_factory = coordinator_factory
        self.partitions = schedule.partitions
        assert CLOCK_OFFSET_MS_MAX <= CLOCK_SLACK_MS, "two nodes' clocks may differ by the slack at most"
        self.clock_offsets_ms = dict(schedule.clock_offsets_ms)
        # Each id begins with the time by its coordinator's clock when it began.
        self.txns = tuple(self._txn_id(index, plan) for index, plan in enumerate(schedule.txns))
        self.plans = dict(zip(self.txns, schedule.txns, strict=True))
        self.nodes: dict[str, Node] = {}
        # A coordinator's first process while a second one runs beside it (Twin), by node name.
        self.twins: dict[str, Node] = {}
        self.lock_policy = Policy.WAIT_DIE if schedule.wait_die else Policy.NO_WAIT
        for name in COORDINATORS:
            self.nodes[name] = Node(name, None, ())
        # Who holds each partition (None: nobody, in a Move's gap), and the epoch of its tenure (a
        # take raises it): storage refuses a fenced write that carries an older one. Each node's
        # identity record has its epoch here too (every process that starts takes it, raising it),
        # under identity_name(node).
        self.owner: dict[str, str | None] = {partition: node_of(partition) for partition in self.partitions}
        self.epoch = dict.fromkeys(self.partitions, 1)
        # The version of each identity record (every take and every renewal raises it): what a
        # parked process watches, with the epoch, to learn whether the holder lives.
        self.identity_version: dict[str, int] = {}
        # When each identity record last changed (a take or a renewal landed): what a vacancy the
        # watch of a parked process finds is checked against.
        self.identity_changed_ms: dict[str, int] = {}
        # When an identity call of each process (node name, incarnation) last went unanswered:
        # a holder whose renewals failed may be taken for vacant; one whose renewals all landed,
        # never.
        self._identity_unreachable_ms: dict[tuple[str, int], int] = {}
        # Parked processes (deposed by a later take of their node's identity), by node name and
        # incarnation; a crash, an exit, or the end of a Twin's first process ends one.
        self.parked: dict[tuple[str, int], ParkedProcess] = {}
        # When the first process of each node's Twin dies (Twin.overlap_ms after the second starts).
        self._twin_end_ms: dict[str, int] = {}
        self._twin_of = {twin.node: twin for twin in schedule.twins}
        # One-shots as first sent (their redos and the versions they expect), by id: a client
        # that sends one again sends the same; and those a cut Twin's first process took, by node.
        self._one_shot_sent: dict[str, tuple[tuple[tuple[str, bytes], ...], dict[str, int | None]]] = {}
        self._to_resend: dict[str, list[str]] = {}
        for partition in self.partitions:
            self.nodes[node_of(partition)] = Node(node_of(partition), None, (partition,), epochs={partition: 1})
        for node in self.nodes.values():
            node.reset_memory(self.lock_policy)
        self._partition_set = frozenset(self.partitions)
        self._down_logs: dict[str, list[tuple[int, int]]] = {}
        for outage in schedule.outages:
            for key in outage.logs:
                self._down_logs.setdefault(key, []).append((outage.start_ms, outage.end_ms))
        self._resolvers: dict[int, Resolver] = {}
        self._resolve_window_end_ms: dict[int, int] = {}
        self._resolves_abandoned: set[int] = set()  # rounds whose driver did not send their writes
        self._slow_reads_out: collections.Counter[str] = collections.Counter()  # per partition (Move.after)
        self._moves_done: set[Move] = set()
        # One-shot requests waiting for a lock (the runtime's _wait_for_lock), by (node name,
        # incarnation, partition, txn, key): resumed by the grant a release returns, or refused
        # when the lock table's bounded wait runs out.
        self._lock_waiters: dict[tuple[str, int, str, str, str], tuple[CarriedRequest, Execution[int]]] = {}
        # One-shot requests not answered yet, by (txn, partition, coordinator incarnation): at its
        # deadline from sending, the coordinator hears "no answer" (the runtime's transport does),
        # even if the request still runs and votes afterwards; an answer after it goes nowhere.
        self._unanswered: set[tuple[str, str, int]] = set()
        # Interactive transactions whose coordinator runs their operations now, by the process
        # (node name, incarnation) that began them: the runtime's transaction context, which a
        # restart loses (its caller's next call is refused, and the transaction never commits).
        self.executing: dict[str, tuple[str, int]] = {}
        # How long after its begin a one-shot's request may still run at its owner: the owner
        # refuses it past its deadline plus the slack (Node.on_request), which the status call's
        # verdict counts twice, for the owner's clock. Without deadlines (owners of an older
        # version that keep to none, during a rolling upgrade), as long as one may travel.
        timeout_ms_request = (TIMEOUT_MS_EXECUTE if schedule.request_deadlines
                              else schedule.delay_ms_max + schedule.late_request_ms)
        self.requests_ms = status.requests_window_ms(timeout_ms_request, CLOCK_SLACK_MS)
        # The runtime refuses a configuration that breaks this (config._check_late_votes): none
        # is explored (found by audit: the world never checked it).
        assert status.late_votes_meet_their_tombstone(timeout_ms_request, self.config), (
            "a late one-shot vote could outlive its transaction's tombstone", timeout_ms_request, self.config)
        self.probe = StatusProbe(schedule.seed)
        self._init_sweeps(timeout_ms_request)
        self._handlers = self._step_handlers()
        # A node's status answer comes as late as the asking node waits for it (a peer request's
        # deadline): it tells of that moment.
        self.status_answer_ms_max = TIMEOUT_MS_EXECUTE
        # A cut Twin's first process may come back after faults end (Twin.cut_ms): a fault too.
        faults_end_ms = max([FAULTS_END_MS, *(twin.at_ms + twin.overlap_ms for twin in schedule.twins),
                             *(cut.end_ms for cut in schedule.storage_cuts)])
        self.liveness_check_ms = faults_end_ms + self.liveness_bound_ms()
        # Late duplicates arrive up to two graces after they were sent: let them, and the garbage
        # collection they may race with, play out before the end.
        self.end_ms = self.liveness_check_ms + 4 * self.config.gc_grace_ms + schedule.delay_ms_max
        # Calls late by the storage's window land within the run, and tombstones that outlive
        # them expire within it too.
        self.end_ms += schedule.late_window_ms and self.config.outcome_keep_ms
        if self.sweep is not None:
            self.end_ms = max(self.end_ms, self._sweeps_end_ms())

    # -- setup ----------------------------------------------------------------------------------
    def liveness_bound_ms(self) -> int:
        """How long after faults stop every participant must have decided (Cornus's promise; the
        blocking protocols are held to it too, once their coordinator is back)."""
        c = self.config
        slowest_call = self.deadline_ms + c.clock_slack_ms + self.schedule.delay_ms_max
        # A newest process deposed by the first one of a Twin waits for that one's renewals to
        # stop (it dies by the time faults end), and a watch's read, before it exits and restarts.
        # So does one deposed by a take that a crashed process sent before it crashed and that
        # landed after its restart's take (found by the explorer, --twins seed 3, 2026-11-28).
        deposable = self.schedule.twins or self.schedule.crashes
        vacancy_ms = c.identity_vacant_ms + c.identity_check_ms + 2 * slowest_call if deposable else 0
        return (
            c.recovery_settle_ms + c.timeout_ms_prepare + c.timeout_ms_votes + c.timeout_ms_decision
            + c.timeout_ms_resend + 6 * c.backoff_ms_max + 30 * slowest_call + EXECUTION_IDLE_MS + vacancy_ms
        )

    def _new_core(self, node: Node) -> NodeCore:
        # zlib.crc32, not hash(): str hashes differ from process to process, and a run must be a
        # pure function of its schedule wherever it is replayed.
        seed = zlib.crc32(f"{self.schedule.seed}/{node.name}/{node.incarnation}".encode())
        jitter: JitterSource = random.Random(seed)
        # As the runtime does: the core starts holding nothing, and each partition the node holds
        # (its lease) comes through add_partition, with its own recovery.
        core = NodeCore(
            node.name, (), self._configured_coordinators(node.name), self.config, jitter,
            participant_factory=self._participant_factory, coordinator_factory=self._coordinator_factory,
            sweep=self.sweep,
        )
        if self.sweep is not None:
            self._cores.append(core)
        return core

    def _configured_coordinators(self, name: str) -> tuple[str, ...]:
        """The nodes `name`'s configuration names: every coordinator and itself; in a rollout
        (Schedule.rollout), the last coordinator only knows of itself what the others do not."""
        known = COORDINATORS[:-1] if self.schedule.rollout and name != COORDINATORS[-1] else COORDINATORS
        return tuple(dict.fromkeys((*known, name)))

    def clock_ms(self, name: str) -> int:
        """What node `name`'s clock reads now (Schedule.clock_offsets_ms)."""
        return self.now_ms + self.clock_offsets_ms.get(name, 0)

    def node_of_host(self, host: str) -> Node | None:
        return self.owner_of(host) if host in self._partition_set else self.nodes[host]

    def owner_of(self, partition: str) -> Node | None:
        """The node that holds `partition` now; None in a Move's gap, when nobody does."""
        owner = self.owner[partition]
        return None if owner is None else self.nodes[owner]

    @property
    def boot_ms(self) -> int:
        """Nodes start this long before time 0, so that the take of their identity and their
        recovery (of empty storage) are over when the first transaction begins; no fault happens
        before 0."""
        return self.config.recovery_settle_ms + 6 * self.schedule.storage_ms_max + 10

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
            if self.sweep is not None and not self.outcome.violations:
                self._sweeps_at_end()
            self.outcome.violations.extend(self.storage.violations)
        return self.outcome

    def _begin(self) -> None:
        self.now_ms = -self.boot_ms
        self._push(0, STEP_BOOTED, None)  # first at time 0: before any crash due then
        for node in self.nodes.values():
            self._start_core(node)
        for index, plan in enumerate(self.schedule.txns):
            self._push(plan.start_ms, STEP_EXECUTE, self.txns[index])
        for crash in self.schedule.crashes:
            self._push(crash.at_ms, STEP_CRASH, crash)
        for move in self.schedule.moves:
            self._push(move.at_ms, STEP_MOVE, move)
        for twin in self.schedule.twins:
            self._push(twin.at_ms, STEP_TWIN, twin)
            if twin.cut_ms and not twin.storage_only:
                # Its replies are lost in the cut: clients send their one-shots again.
                self._push(twin.cut_start_ms, STEP_RESEND, twin)
        for index, resolve in enumerate(self.schedule.resolves):
            self._push(resolve.at_ms, STEP_RESOLVE, index)
        self._push(self.liveness_check_ms, STEP_CHECK, None)
        for at_ms, index in self.probe.plan(self):
            self._push(at_ms, STEP_STATUS, index)

    def _step(self, kind: int, data: Any) -> None:
        self._handlers[kind](data)

    def _step_handlers(self) -> list[Callable[[Any], None]]:
        """Each step kind's handler, by kind (a list lookup per step: the queue runs hundreds of
        thousands of them a second)."""
        def execution(method: Callable[[Any], None]) -> Callable[[Any], None]:
            def step(data: Any) -> None:
                # The core's execution state asserts its invariants, as the machines do (_feed).
                try:
                    method(data)
                except AssertionError as error:
                    self.outcome.violations.append(f"assertion in the execution phase: {error}")
            return step

        handlers: dict[int, Callable[[Any], None]] = {
            STEP_DELIVER: lambda data: self._deliver(*data),
            STEP_ARRIVE: self._arrive,
            STEP_RETURN: self._returned,
            STEP_TIMER: self._timer_fired,
            STEP_EXECUTE: execution(self._execute_txn),
            STEP_EXECUTE_PREPARED: execution(self._execute_prepared),
            STEP_READ_LANDED: execution(lambda data: self._read_landed(*data)),
            STEP_EXECUTE_WRITES: execution(self._execute_writes),
            STEP_LOCK_GRANTED: execution(lambda data: self._lock_granted(*data)),
            STEP_LOCK_EXPIRY: execution(lambda data: self._lock_expiry(*data)),
            STEP_MOVE: self._move,
            STEP_TAKE: self._take,
            STEP_LAPSE_END: lambda data: self._lapse_ends(*data),
            STEP_ASKED: lambda data: self._asked(*data),
            STEP_RESOLVE_WRITES: lambda data: self._resolve_writes(*data),
            STEP_TWIN: self._twin,
            STEP_TWIN_END: lambda data: self._twin_ends(*data),
            STEP_CONFIRM: self._confirm_step,
            STEP_RESEND: self._resend,
            STEP_IDENTITY_ARRIVE: self._identity_arrive,
            STEP_WATCH: lambda data: self._watch(*data),
            STEP_WATCH_LANDS: lambda data: self._watch_lands(*data),
            STEP_WATCHED: lambda data: self._watched(*data),
            STEP_EXECUTE_ANSWER: lambda data: self._execute_answered(*data),
            STEP_EXECUTE_DEADLINE: lambda data: self._execute_deadline(*data),
            STEP_COMMIT: self._commit_requested,
            # Every node is asked at once; each answers in steps while the world goes on.
            STEP_STATUS: lambda data: self._push_status_steps(self.probe.ask(self, data)),
            STEP_STATUS_ANSWER: lambda data: self._push_status_steps(self.probe.step(self, data)),
            STEP_CRASH: lambda data: self.crash(data.node, data.down_ms),
            STEP_RESTART: self._restart,
            STEP_RESOLVE: self._start_resolve,
            STEP_IDLE: self._idle_step,
            STEP_BOOTED: self._booted,
            STEP_CHECK: lambda data: self._check_liveness(),
            STEP_ABANDON: self._abandon,
        }
        assert sorted(handlers) == list(range(STEP_COUNT)), "a step kind without a handler, or one twice"
        return [handlers[kind] for kind in range(STEP_COUNT)]

    def _returned(self, data: tuple[str, int, Event, frozenset[tuple[int, int]], int]) -> None:
        name, incarnation, event, path, tenure = data
        if name.startswith("~resolve/"):
            self._resolver_step(int(name.rsplit("/", 1)[1]), event)
            return
        node = self.process(name, incarnation)
        if node is None:
            return
        if tenure != self._tenure(node, event.host):
            self.outcome.stale_answers += 1
            return
        if isinstance(event, ScanReturned) and node.core is not None:
            scanned = node.core.partition_of(event.host)
            if scanned is not None:
                node.scans_out[scanned] -= 1
        held = self._lapsed(node, event.host)
        if held is not None:
            held.append((event, path))
            return
        if ((isinstance(event, IdentityChecked) and event.held is True)
                or (isinstance(event, IdentityTaken) and isinstance(event.epoch, int))):
            # Heard by the process: only now may it count on it (the runtime's await).
            self._identity_confirmed(node, node.identity_left_ms)
            if isinstance(event, IdentityTaken):
                node.identity_taken_ms = self.clock_ms(node.name)
        self._feed(node, event, path)

    def _timer_fired(self, data: tuple[str, int, Timer, int, frozenset[tuple[int, int]]]) -> None:
        name, incarnation, timer, generation, path = data
        node = self.process(name, incarnation)
        if node is None or node.timers.get(timer) != generation:
            return
        del node.timers[timer]
        if self._lapsed(node, timer.owner) is not None:
            # Not acted on (ownership.without_lease_may): the runtime drops the partition when
            # such a timer fires. Its host here still hears its answers until the lapse ends.
            self.outcome.timers_dropped_not_held += 1
            return
        self._feed(node, TimerFired(timer), path)

    def _commit_requested(self, data: tuple[str, tuple[tuple[str, bytes], ...], tuple[str, ...]]) -> None:
        txn, writes, reads = data
        node = self._executing_process(txn)
        self.executing.pop(txn, None)
        if node is not None:
            self._feed(node, CommitRequested(node.name, txn, writes, reads), node.path)

    def _push_status_steps(self, steps: list[tuple[int, Any]]) -> None:
        for at_ms, step in steps:
            self._push(at_ms, STEP_STATUS_ANSWER, step)

    def _idle_step(self, data: tuple[str, int, str, str]) -> None:
        name, incarnation, partition, txn = data
        node = self.process(name, incarnation)
        if node is not None:
            self._drop_idle(node, partition, txn)

    def _booted(self, data: None) -> None:
        booting = [node.name for node in self.nodes.values() if not node.ready]
        if booting:
            self.outcome.violations.append(f"recovery of an empty cluster did not finish on {booting}")

    # -- nodes ------------------------------------------------------------------------------------
    def _deliver(self, to: str, sender: str, message: Any, path: frozenset[tuple[int, int]]) -> None:
        node = self.node_of_host(to)
        first = self.twins.get(to)
        if first is not None and self.rng.random() < 0.5:
            # Two processes answer to the node's name: a message may reach either (a connection
            # the first one still holds, or a new one to the second).
            node = first
            if self._cut_off(first):
                return
        if node is None or not node.alive or node.core is None:
            return  # to a partition nobody holds (a Move's gap), or to a node that is down: lost
        if node.core.ends_execution(to, message):
            # As the runtime does: the execution phase ends when prepare (or the read-only release)
            # arrives, and the machine learns what the execution left; the plan says how it votes.
            executed = node.tables[to].ended(message.txn, isinstance(message, ReleaseReadOnly))
            if executed is not None:
                if not self.plans[message.txn].vote_of.get(to, True):
                    executed = dataclasses.replace(executed, vote_yes=False)
                self._feed(node, executed, path)
                if not node.alive:
                    return
        self._feed(node, MessageReceived(sender, to, message), path)

    def _feed(self, node: Node, event: Event, path: frozenset[tuple[int, int]]) -> None:
        assert node.core is not None
        if self.trace_paths:
            node.path = _prune(node.path | path)
        if self.trace is not None:
            self.trace.append(f"{self.now_ms:6d} {node.name:>3} <- {event}")
        try:
            effects = node.core.handle(event)
        except AssertionError as error:
            self.outcome.violations.append(f"assertion in {node.name} on {type(event).__name__}: {error}")
            return
        self._observe(node, event.host, event.txn)
        for effect in effects:
            if self.hook is not None:
                action = self.hook(self, node.name, effect)
                if action == "crash":
                    self.crash(node.name, self.hook_crash_down_ms)
                    return
                if action == "drop":
                    continue
            self._execute(node, effect)
            if not node.alive:
                return

    def _observe(self, node: Node, host_name: str, txn: str) -> None:
        assert node.core is not None
        host = node.core.host(host_name)
        machine = host.machines.get(txn) if host is not None and txn else None
        if machine is not None and machine.decision is not None:
            self.outcome.decisions.setdefault(txn, set()).add(machine.decision)

    def crash(self, name: str, down_ms: int) -> None:
        """Crash a node now (its memory is lost); it restarts after `down_ms`, by faults end at latest."""
        node = self.nodes[name]
        if self.parked.pop((name, node.incarnation), None) is not None:
            # The node's parked newest process crashes: its restart takes the identity, as its
            # exit's would.
            self._push(min(self.now_ms + max(1, down_ms), max(FAULTS_END_MS, self.now_ms + 1)), STEP_RESTART, name)
            return
        if not node.alive:
            return
        if self.trace is not None:
            self.trace.append(f"{self.now_ms:6d} {name:>3} CRASH for {down_ms} ms")
        # Requests waiting for a lock there are lost with the process: their coordinators hear
        # nothing until their deadline.
        self._unpark(lambda k: k[0] == name, None)
        node.alive = False
        node.incarnation += 1
        node.core = None
        node.reset_memory(self.lock_policy)
        restart_at = self.now_ms + max(1, down_ms)
        # Every node is back when faults end, so liveness can be judged from then on.
        self._push(min(restart_at, max(FAULTS_END_MS, self.now_ms + 1)), STEP_RESTART, name)

    def _restart(self, name: str) -> None:
        node = self.nodes[name]
        assert not node.alive
        node.alive = True
        node.path = frozenset({(0, 0)})
        # A restarted process holds no lease: it takes its partitions again, in a new epoch
        # (cornus.protocol.ownership), so storage refuses every fenced write of its earlier life
        # from now on, however late it lands.
        for partition in node.partitions:
            self.epoch[partition] += 1
            node.epochs[partition] = self.epoch[partition]
        self._start_core(node)

    def _start_core(self, node: Node) -> None:
        if node.incarnation:
            # A restart's tenure of each partition begins now (the world's first start has none
            # before it to mind).
            node.tables = {p: self._tenure_table(node, p) for p in node.partitions}
        node.core = self._new_core(node)
        incarnation = node.incarnation
        effects = node.core.start()
        for partition in node.partitions:
            effects += node.core.add_partition(partition)
        for effect in effects:
            self._execute(node, effect)
            if node.incarnation != incarnation:
                return

    def process(self, name: str, incarnation: int) -> Node | None:
        """The live process of node `name` in `incarnation`: the node, or its first process while a
        second one runs beside it (Twin); None once it is gone."""
        node = self.nodes[name]
        if node.alive and node.incarnation == incarnation:
            return node
        first = self.twins.get(name)
        return first if first is not None and first.incarnation == incarnation else None

    def _unreachable(self, log: LogId) -> bool:
        windows = self._down_logs.get(log.key)
        return windows is not None and any(start <= self.now_ms < end for start, end in windows)

    # -- effects ----------------------------------------------------------------------------------
    def _execute(self, node: Node, effect: Effect) -> None:
        if self.trace is not None:
            self.trace.append(f"{self.now_ms:6d} {node.name:>3} -> {effect}")
        if isinstance(effect, Send):
            self._send(node, effect)
        elif isinstance(effect, LogOnce | Log | ApplyRedo | DeleteRecord | ReadRecord | ScanLog | ScanFinished):
            if isinstance(effect, LogOnce | Log):
                self.outcome.log_writes += 1
            self._call(node.name, node.incarnation, effect, node.path)
        elif isinstance(effect, ListIdentities):
            self._list_identities(node, effect)
        elif isinstance(effect, StartTimer):
            node.timer_generation += 1
            node.timers[effect.timer] = node.timer_generation
            data = (node.name, node.incarnation, effect.timer, node.timer_generation, node.path)
            self._push(self.now_ms + effect.duration_ms, STEP_TIMER, data)
            if self._abandons and effect.timer.kind == "gc":
                self._gc_timer_started(node, effect.timer.txn)
        elif isinstance(effect, CancelTimer):
            node.timers.pop(effect.timer, None)
        elif isinstance(effect, Reply):
            if self._cut_off(node):
                return  # lost on the way to its client
            self.outcome.replies.setdefault(effect.txn, []).append(effect.outcome)
            self.outcome.reply_paths.append(node.path)
        elif isinstance(effect, ReleaseLocks):
            table = node.tables[effect.partition]
            plan = self.plans.get(effect.txn)
            if (effect.txn in table.executions and plan is not None and not plan.one_shot
                    and effect.partition in (p for p, _ in plan.reads)):
                self.outcome.released_read_only.add((effect.partition, effect.txn))
            granted = table.abort(effect.txn) if effect.refuse_later else table.release(effect.txn)
            self._wake(node, effect.partition, granted, effect.txn)
        elif isinstance(effect, LocksPrepared):
            node.tables[effect.partition].locks.mark_prepared(effect.txn)
        elif isinstance(effect, RetakeLocks):
            node.tables[effect.partition].retake_locks(effect.txn, effect.redo)
        elif isinstance(effect, CacheRedo):
            node.tables[effect.partition].cache_redo(effect.redo)
        elif isinstance(effect, TerminationStarted):
            self.outcome.terminations += 1
        elif isinstance(effect, TerminationEnded) and effect.outcome is None:
            self.outcome.terminations_given_up += 1
        elif isinstance(effect, TakeIdentity | CheckIdentity):
            node.identity_left_ms = self.now_ms
            if self._storage_cut_off(node):
                unanswered = (IdentityTaken(StorageUnreachable("cut off")) if isinstance(effect, TakeIdentity)
                              else IdentityChecked(node.name, StorageUnreachable("cut off")))
                data = (node.name, node.incarnation, unanswered, node.path, 0)
                self._push(self.now_ms + self.deadline_ms, STEP_RETURN, data)
                return
            if 0 <= self.now_ms < FAULTS_END_MS and self.rng.random() < self.schedule.late_call_probability:
                # Unreachable: its caller hears so at the deadline. A take may have landed all
                # the same, at once (the runtime's read-then-swap take cannot land after a later
                # take of the same node; this model's one-step take must not either), and the
                # core takes again after a backoff, a newer epoch.
                unreachable: IdentityTaken | IdentityChecked = (
                    IdentityTaken(StorageUnreachable("the take outlived its deadline"))
                    if isinstance(effect, TakeIdentity)
                    else IdentityChecked(node.name, StorageUnreachable("the read outlived its deadline"))
                )
                if isinstance(effect, TakeIdentity) and self.rng.random() < 0.5:
                    identity = identity_name(node.name)
                    self.epoch[identity] = self.epoch.get(identity, 0) + 1
                    self.identity_version[identity] = self.identity_version.get(identity, 0) + 1
                    self.identity_changed_ms[identity] = self.now_ms
                self._push(self.now_ms + self.deadline_ms, STEP_RETURN,
                           (node.name, node.incarnation, unreachable, node.path, 0))
                self._identity_unreachable_ms[(node.name, node.incarnation)] = self.now_ms
                return
            latency, answer_ms = self._identity_legs_ms()
            data = (node.name, node.incarnation, effect, node.path, None, 1, answer_ms)
            self._push(self.now_ms + latency, STEP_IDENTITY_ARRIVE, data)
        elif isinstance(effect, Deposed):
            self._depose(node.name, node.incarnation)
        elif isinstance(effect, RecoveryFinished):
            # A node back from a crash knows least: the status call is asked about what it
            # coordinated just then, while that transaction's requests and votes may be on their way.
            for at_ms, index in self.probe.after_recovery(self, node.name):
                self._push(at_ms, STEP_STATUS, index)
        else:
            # Decided marks a moment for timing (a 2PC coordinator emits it when it starts logging
            # COMMIT, which a crash can still undo); the machines' own decisions are observed.
            assert isinstance(effect, Decided | TerminationEnded), effect

    def _send(self, node: Node, effect: Send) -> None:
        self.outcome.messages += 1
        if self._cut_off(node):
            return
        lossy = 0 <= self.now_ms < FAULTS_END_MS or protocol_of(effect.message.txn) is Protocol.CORNUS
        if lossy and self.rng.random() < self.schedule.loss_probability:
            return
        path = frozenset((h + 1, w) for h, w in node.path) if self.trace_paths else node.path
        data = (effect.to, effect.source, effect.message, path)
        self._push(self.now_ms + self.rng.randint(1, self.schedule.delay_ms_max), STEP_DELIVER, data)
        if self.rng.random() < self.schedule.duplicate_probability:
            late = self.rng.random() < 0.5
            self.outcome.late_duplicates += late
            delay = self.config.gc_grace_ms + self.rng.randint(0, self.config.gc_grace_ms) if late else 0
            self._push(self.now_ms + delay + self.rng.randint(1, self.schedule.delay_ms_max), STEP_DELIVER, data)
        if self.schedule.late_copy_probability and self._sweep_rng.random() < self.schedule.late_copy_probability:
            # Past the sweeps of its transaction (Schedule.late_copy_ms), from the sweeps' generator.
            self.outcome.late_duplicates += 1
            late_ms = self.schedule.late_copy_ms + self._sweep_rng.randint(1, self.schedule.delay_ms_max)
            self._push(self.now_ms + late_ms, STEP_DELIVER, data)

    def _call(self, owner: str, incarnation: int, call: StorageCall, path: Any) -> None:
        """A storage call: it reaches storage even if its caller dies meanwhile (only the answer is
        lost). A slow one answers "unreachable" at the deadline and may land up to the slack later.
        A partition's write to its own log or data carries the epoch of its owner's tenure."""
        process = self.process(owner, incarnation) if owner in self.nodes else None
        # A sweeper's calls draw from the sweeps' generator (Sweeps._init_sweeps).
        rng = self._sweep_rng if self.sweep is not None and is_sweep_owner(call.owner) else self.rng
        # The caller's clock as the call left: what a scan's answer tells the sweeper
        # (FinishedScanned.sent_ms), and what the record a write creates is stamped with.
        sent_ms = self.clock_ms(owner)
        if process is not None and self._lapsed(process, call.owner) is not None and not without_lease_may(call):
            # The lease gate (the runtime's EffectRunner._call): not sent. The runtime drops the
            # partition at once then; here the host hears what its lapse held first, and then goes.
            self.outcome.writes_skipped_not_held += 1
            return
        if process is not None and isinstance(call, ScanLog) and process.core is not None:
            scanning = process.core.partition_of(call.owner)
            if scanning is not None:
                process.scans_out[scanning] += 1
        fenced = fenced_partition(call) if process is not None else None
        epoch = process.epochs[fenced] if process is not None and fenced is not None else 0
        tenure = self._tenure(process, call.owner) if process is not None else 0
        if process is not None and self._storage_cut_off(process):
            unreachable = self._answer(call, StorageUnreachable("cut off"), sent_ms)
            self._push(self.now_ms + self.deadline_ms, STEP_RETURN, (owner, incarnation, unreachable, path, tenure))
            return
        if (process is not None and fenced is None and isinstance(call, LogOnce | Log | DeleteRecord)
                and process.core is not None and process.core.partition_of(call.owner) is None
                and not self._identity_admits(process)):
            # A write for the node itself that storage cannot fence waits for a read of the
            # identity record (the runtime's EffectRunner._admit_for_node).
            self._push(self.now_ms + self.rng.randint(1, self.schedule.storage_ms_max), STEP_CONFIRM,
                       (owner, incarnation, call, path, self.now_ms, None))
            return
        if (process is not None and fenced is None and process.core is not None
                and process.core.identity_epoch != self.epoch.get(identity_name(owner), 0)
                and isinstance(call, LogOnce | Log | DeleteRecord) and process.core.partition_of(call.owner) is None):
            # Let through by the window although a later process holds the identity now: the
            # boundary the window's bound (gc_grace_ms less a deadline and the slack) keeps safe.
            self.outcome.stale_window_writes += 1
        if 0 <= self.now_ms < FAULTS_END_MS and rng.random() < self.schedule.late_call_probability:
            unreachable = self._answer(call, StorageUnreachable("the call outlived its deadline"), sent_ms)
            self._push(self.now_ms + self.deadline_ms, STEP_RETURN, (owner, incarnation, unreachable, path, tenure))
            if rng.random() < 0.5:
                # Where storage takes calls late, any protocol's call may land past the slack:
                # collection leaves tombstones in coordinators' logs too there.
                late_ms_max = self.config.clock_slack_ms + self.schedule.late_window_ms
                landing = self.now_ms + self.deadline_ms + rng.randint(0, late_ms_max)
                self._push(landing, STEP_ARRIVE, (owner, incarnation, call, path, False, epoch, tenure, sent_ms))
                if self.sweep is not None:
                    self._track_write(call, landing, fenced, epoch)
            return
        landing = self.now_ms + rng.randint(1, self.schedule.storage_ms_max)
        self._push(landing, STEP_ARRIVE, (owner, incarnation, call, path, True, epoch, tenure, sent_ms))
        if self.sweep is not None:
            self._track_write(call, landing, fenced, epoch)

    def _answer(self, call: StorageCall | ScanFinished, result: Any, sent_ms: int) -> Any:
        """The event answering `call` with `result`: a sweeper's scan hears when it left too."""
        if isinstance(call, ScanFinished):
            return FinishedScanned(call, result, sent_ms)
        return answer(call, result)

    def _txn_id(self, index: int, plan: TxnPlan) -> str:
        begin_ms = plan.start_ms + 1 + self.clock_offsets_ms.get(plan.coordinator, 0)
        twin = next((t for t in self.schedule.twins if t.node == plan.coordinator and t.cut_ms), None)
        sent_to_first_until_ms = 0 if twin is None else twin.cut_end_ms if twin.storage_only else twin.cut_start_ms
        if plan.one_shot and twin is not None and twin.at_ms <= plan.start_ms < sent_to_first_until_ms:
            # One its client may send again (Twin.cut_ms): an id the client chose.
            return txn_ids.client_txn_id(begin_ms, plan.coordinator, f"{index:016x}", plan.protocol)
        return f"{begin_ms}.{plan.coordinator}.sim.{index}.{PROTOCOL_TAGS[plan.protocol]}"

    def _tenure(self, node: Node, host: str) -> int:
        """The tenure of the partition `host` acts for on `node` (0 for the node's own hosts)."""
        assert node.core is not None or not node.alive
        partition = node.core.partition_of(host) if node.core is not None else None
        return 0 if partition is None else node.tenures.get(partition, 0)

    def _arrive(self, flight: tuple[str, int, StorageCall, Any, bool, int, int, int]) -> None:
        owner, incarnation, call, path, answered, epoch, tenure, sent_ms = flight
        sweeping = self.sweep is not None and is_sweep_owner(call.owner)
        rng = self._sweep_rng if sweeping else self.rng
        fenced = fenced_partition(call) if owner in self.nodes else None
        if self.sweep is not None:
            self._write_landed(call, fenced, epoch)
        if fenced is not None and epoch < self.epoch[fenced]:
            # The partition moved since the call left: storage refuses the old owner's write, and
            # the runtime, told Fenced, drops the partition (this node dropped it at the move).
            # A refused coordinator-log write means a later process runs as this node: the
            # runtime stops this one.
            self.outcome.fenced_writes += 1
            if is_identity(fenced):
                self._depose(owner, incarnation)
            return
        result: Any = StorageUnreachable("outage")
        landed = not self._unreachable(call.log) or rng.random() < self.schedule.ambiguous_probability
        if landed:
            try:
                outcome = self._apply(call, sent_ms)
            except WriteRefused as refused:
                outcome = StorageUnreachable("refused")
                if answered and not self._unreachable(call.log):
                    # The runtime treats a refusal it hears as an impossible state and stops.
                    self.outcome.violations.append(f"storage refused an answered call: {refused}")
            if not self._unreachable(call.log):
                result = outcome
        if self.trace is not None:
            self.trace.append(f"{self.now_ms:6d} storage {'LANDS' if landed else 'misses'}"
                              f"{'' if answered else ' LATE'}: {call} -> {result}")
        if not answered:
            self.outcome.late_landings += landed
            return  # a late landing: its caller was told "unreachable" long ago
        if self.trace_paths and isinstance(call, LogOnce | Log):
            path = frozenset((h, w + 1) for h, w in path)
        latency = rng.randint(1, self.schedule.storage_ms_max)
        self._push(self.now_ms + latency, STEP_RETURN, (owner, incarnation, self._answer(call, result, sent_ms), path,
                                                        tenure))

    def _apply(self, call: StorageCall | ScanFinished, sent_ms: int) -> Any:
        storage = self.storage
        storage.expire(self.now_ms)
        if isinstance(call, LogOnce):
            return storage.log_once(call.log, call.txn, call.state, call.body, sent_ms)
        if isinstance(call, Log):
            return storage.log(call.log, call.txn, call.state, call.body, sent_ms)
        if isinstance(call, ApplyRedo):
            applied = storage.apply(call.partition, call.txn, call.redo)
            self.outcome.applied.add((call.partition, call.txn))
            return applied
        if isinstance(call, DeleteRecord):
            if self.sweep is not None and is_sweep_owner(call.owner):
                self._check_sweeper_write(call)  # its own oracle: a sweeper collects what no coordinator did
            else:
                self._check_collectable(call)
            if call.keep is not None:
                return storage.keep(call.log, call.txn, call.keep, self.now_ms, sent_ms)
            return storage.delete(call.log, call.txn)
        if isinstance(call, ReadRecord):
            return storage.read(call.log, call.txn)
        if isinstance(call, ScanFinished):
            return self._scan_finished(call)
        page = storage.scan_unfinished(call.log, call.after, call.limit)
        if self.schedule.short_scans and self._scan_rng.random() < SHORT_SCAN_PROBABILITY:
            return storage.stopped_short(call.log, call.after, page, self._scan_rng)
        return page

    # -- checks made during the run -----------------------------------------------------------------
    def _check_collectable(self, call: DeleteRecord) -> None:
        """DESIGN 4: no record may go while someone could still run termination against it."""
        plan = self.plans.get(call.txn)
        if plan is None:
            return
        for partition, _ in plan.writes:
            node = self.owner_of(partition)
            if node is None:
                continue  # nobody holds it (a Move's gap): no machine of it runs
            host = node.core.partitions[partition] if node.alive and node.core is not None else None
            machine = host.machines.get(call.txn) if host is not None else None
            if (isinstance(machine, CoordinatorLogParticipant) and machine.phase is Phase.VOTED
                    and self.outcome.decisions.get(call.txn) == {TxnState.ABORT}):
                # Recovery rebuilds a vote from the coordinator's redo record whenever the
                # partition's own log holds no decision, which is also what an abort leaves; such a
                # machine asks, learns ABORT and writes nothing. Of an aborted transaction only:
                # one that committed left COMMIT in every participant's log before collection.
                continue
            if isinstance(machine, ParticipantBase) and (not machine.decided_durably or machine.calls_in_flight):
                self.outcome.violations.append(
                    f"GC of {call.log.key}/{call.txn} while {partition} is {machine.phase.value} "
                    f"with {machine.calls_in_flight} calls in flight"
                )

    def _check_liveness(self) -> None:
        """Faults ended a bound ago: every participant must hold a durable decision by now, every
        commit must be applied, and no lock may be left behind."""
        undecided = self.outcome.undecided_at_liveness_check
        for node in self.nodes.values():
            if node.name in self.abandoned:
                continue  # killed for good (Schedule.abandons): it holds no partition
            if not node.ready:
                undecided.append(f"{node.name} is not recovered")
                continue
            assert node.core is not None
            for partition in node.partitions:
                for txn, machine in node.core.partitions[partition].machines.items():
                    undecided.append(f"{partition} still runs {txn} ({machine.phase.value})")
                held = [txn for txn in self.txns if node.tables[partition].locks.holds_any(txn)]
                if held:
                    undecided.append(f"{partition} still locks for {held}")
        for txn in self.outcome.executed:
            for partition, _ in self.plans[txn].writes:
                log = LogId.partition(partition)
                record = self.storage.read(log, txn)
                if record is not None and (record.state is TxnState.VOTE_YES
                                           or (record.state is TxnState.COMMIT and not record.applied)):
                    undecided.append(f"{log.key} still holds {record.state} of {txn} (applied={record.applied})")
