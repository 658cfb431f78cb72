"""The simulated world: nodes running the very `NodeCore` the runtime runs, driven as the runtime
drives it (every partition comes through `add_partition`, with its own recovery), a lossy,
reordering, duplicating network, an in-memory LogStore with outages, calls that land after their
caller gave up and fences, crashes and restarts through the core's own recovery, partitions moving
between nodes, manual resolves, and the core's execution
state (cornus.protocol.execution: locks, buffered writes, refusals, the owner's cache), around
which the world plays the runtime's I/O (reads that answer late, idle executions timing out), and
the status call asked at random moments (cornus.sim.status_probe, with an RNG of its own). All
driven by one seeded RNG and a time-ordered queue: a run is a pure function of (schedule, config,
hooks)."""

from __future__ import annotations

import collections
import dataclasses
import heapq
import random
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from cornus.protocol import status, txn_ids
from cornus.protocol.backoff import JitterSource
from cornus.protocol.config import (
    Protocol,
    ProtocolConfig,
    gc_grace_ms_min,
    identity_window_admits,
    outcome_keep_ms_min,
)
from cornus.protocol.effects import (
    TAKE_IDENTITY_ROUND_COUNT_MAX,
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
    ExecuteFailed,
    IdentitiesListed,
    IdentityChecked,
    IdentityTaken,
    MessageReceived,
    ScanReturned,
    StorageUnreachable,
    TimerFired,
    answer,
)
from cornus.protocol.execution import Execution, PartitionExecutions, Refusal
from cornus.protocol.hosts import CoordinatorFactory, ParticipantFactory
from cornus.protocol.identity_watch import Observed, VacancyWatch
from cornus.protocol.locks import Grant, LockMode, Policy, Waiter
from cornus.protocol.messages import Prepare, ReleaseReadOnly
from cornus.protocol.node_core import ExecuteRefusal, NodeCore, recovery_owner
from cornus.protocol.owner_answer import ExecuteStatus, refuses
from cornus.protocol.ownership import fenced_partition, without_lease_may
from cornus.protocol.participant_base import ParticipantBase, Phase
from cornus.protocol.participant_blocking import CoordinatorLogParticipant
from cornus.protocol.resolve import AskCoordinator, CoordinatorAnswered, Resolver
from cornus.protocol.status import Known
from cornus.protocol.txn_ids import PROTOCOL_TAGS, begin_ms_of, protocol_of
from cornus.sim import redo
from cornus.sim.schedule import CLOCK_OFFSET_MS_MAX, COORDINATORS, FAULTS_END_MS, Move, Schedule, Twin, TxnPlan, node_of
from cornus.sim.status_probe import StatusProbe, memory_knows
from cornus.sim.storage_model import StorageModel, WriteRefused
from storage_adapters.contract import IDENTITY_PREFIX, LogId, TxnState, identity_name, is_identity

# Hook a test installs to force a failure at an exact point: called before each effect a node
# executes; "crash" crashes the node before the effect, "drop" skips it (a lost message).
EffectHook = Callable[["World", str, Effect], str | None]

# How late past its deadline a timed-out storage call may land, and how long an execution that
# never reached prepare keeps its locks before the owner drops it (the runtime's idle timeout).
CLOCK_SLACK_MS = 20
EXECUTION_IDLE_MS = 600

# How long a coordinator waits for the answer to a one-shot's request before it reports the
# partition's execution as failed without an answer (the runtime's peer request deadline).
TIMEOUT_MS_EXECUTE = 200

# How often a node reads its identity record here (ProtocolConfig.identity_check_ms): within a
# Twin's overlap (under 600 ms) where a schedule has a second process, so that a first process that
# neither writes its coordinator log nor presumes anything is deposed by the periodic read too.
# Without one, no read can find the identity taken (the world reports that as a violation), and
# reads every 150 ms were 60% of a schedule's steps: there they run every second, a few times a
# schedule still.
IDENTITY_CHECK_MS_TWINS = 150
IDENTITY_CHECK_MS = 1_000
IDENTITY_CHECK_MS_SLOW = 20  # Schedule.slow_identity: renewals more often than a deadline

# An owner's failed answers, as the world says them, and the status the runtime answers each with
# (Node.on_request, PartitionRuntime.execute), which the core's rule reads (owner_answer.refuses).
ALREADY_COMMITTING = "already committing"
ABORTED_HERE = "aborted here already"
ABORTED_WHILE_WAITING = "dropped while it waited"  # the coordinator aborted it while it waited
_STATUS_OF_ANSWER = {
    ALREADY_COMMITTING: ExecuteStatus.ABORTED,
    ABORTED_HERE: ExecuteStatus.ABORTED,
    ABORTED_WHILE_WAITING: ExecuteStatus.ABORTED,
    # Dropped while its storage read was out (an abort, an idle timeout): ABORTED in the runtime,
    # where the world took it for a refusal until the rule was shared (found by audit).
    "aborted while reading": ExecuteStatus.ABORTED,
    "not ready": ExecuteStatus.NOT_READY,
    "arrived past its deadline": ExecuteStatus.UNAVAILABLE,
    "conflict": ExecuteStatus.CONFLICT,
    "lock wait timed out": ExecuteStatus.CONFLICT,
    "aborted while waiting": ExecuteStatus.CONFLICT,  # its locks released under it: the runtime's CONFLICT
    "the partition was lost": ExecuteStatus.NOT_OWNER,
    "no node holds it": ExecuteStatus.NOT_OWNER,  # the coordinator's own answer (Coordination._start_prepared)
    "check failed": ExecuteStatus.CHECK_FAILED,
}

# How often the node a partition moves to tries its take again while it is down or recovering, at
# the end of a Move's gap (the runtime's ownership tick, which runs once the node is up).
TAKE_RETRY_MS = 10

# Where a schedule's storage walks finished records (Schedule.short_scans), how many of its scan
# pages stop short of where a page of an index ends.
SHORT_SCAN_PROBABILITY = 0.5

(
    _DELIVER, _ARRIVE, _RETURN, _TIMER, _CRASH, _RESTART, _EXECUTE, _COMMIT, _RESOLVE, _IDLE, _CHECK, _BOOTED,
    _EXECUTE_PREPARED, _EXECUTE_ANSWER, _READ_LANDED, _EXECUTE_WRITES, _MOVE, _LOCK_GRANTED, _LOCK_EXPIRY,
    _EXECUTE_DEADLINE, _TWIN, _TWIN_END, _IDENTITY_ARRIVE, _WATCH, _WATCH_LANDS, _WATCHED, _STATUS, _STATUS_ANSWER,
    _TAKE, _CONFIRM, _RESEND, _LAPSE_END, _ASKED, _RESOLVE_WRITES,
) = range(34)


_EXECUTION_STEPS: dict[int, Callable[[World, Any], None]] = {
    _EXECUTE: lambda world, txn: world._execute_txn(txn),
    _EXECUTE_PREPARED: lambda world, carried: world._execute_prepared(carried),
    _READ_LANDED: lambda world, data: world._read_landed(*data),
    _EXECUTE_WRITES: lambda world, txn: world._execute_writes(txn),
    _LOCK_GRANTED: lambda world, data: world._lock_granted(*data),
    _LOCK_EXPIRY: lambda world, data: world._lock_expiry(*data),
}


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
        # earlier, unanswered try of it had left and that had expired since).
        outcome_keep_ms=keep_ms + outcome_keep_ms_min(deadline, CLOCK_SLACK_MS, schedule.late_window_ms)
        if schedule.late_window_ms else keep_ms,
        late_write_window_ms=schedule.late_window_ms,
        scan_page_count_max=schedule.scan_page_max,
        # A cut Twin's first process must not learn of the second before its cut (the runtime
        # checks every 2 s): it is deposed by the read its writes wait for once back, or the next.
        identity_check_ms=(IDENTITY_CHECK_MS_SLOW if schedule.slow_identity
                           else IDENTITY_CHECK_MS if any(twin.cut_ms for twin in schedule.twins)
                           else IDENTITY_CHECK_MS_TWINS if schedule.twins else IDENTITY_CHECK_MS),
    )


@dataclass(frozen=True, slots=True)
class _Carried:
    """A one-shot's request to one partition: its write (the key, the version the caller expects
    there) or, on a partition it only reads, its read (`expected` None), and its prepare, from the
    coordinator's incarnation that sent it."""

    txn: str
    partition: str
    key: str
    expected: int | None
    participants: tuple[str, ...]
    incarnation: int
    # The partition's owner when sent, and its incarnation: a restart or a move loses the request.
    owner: str
    owner_incarnation: int


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


@dataclass(slots=True)
class _Parked:
    """A process a later take of its node's identity deposed: what it watches, and what it does."""

    watch: VacancyWatch
    restarts: bool  # the node's newest process: its exit on a vacancy is restarted at once
    ends_ms: int | None  # a Twin's first process: its pod is gone then, the watch with it


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
    violations: list[str] = field(default_factory=list)
    undecided_at_liveness_check: list[str] = field(default_factory=list)
    log_writes: int = 0
    messages: int = 0


class World:
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
        self.parked: dict[tuple[str, int], _Parked] = {}
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
        self._parked: dict[tuple[str, int, str, str, str], tuple[_Carried, Execution[int]]] = {}
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
        # A node's status answer comes as late as the asking node waits for it (a peer request's
        # deadline): it tells of that moment.
        self.status_answer_ms_max = TIMEOUT_MS_EXECUTE
        # A cut Twin's first process may come back after faults end (Twin.cut_ms): a fault too.
        faults_end_ms = max([FAULTS_END_MS, *(twin.at_ms + twin.overlap_ms for twin in schedule.twins)])
        self.liveness_check_ms = faults_end_ms + self.liveness_bound_ms()
        # Late duplicates arrive up to two graces after they were sent: let them, and the garbage
        # collection they may race with, play out before the end.
        self.end_ms = self.liveness_check_ms + 4 * self.config.gc_grace_ms + schedule.delay_ms_max
        # Calls late by the storage's window land within the run, and tombstones that outlive
        # them expire within it too.
        self.end_ms += schedule.late_window_ms and self.config.outcome_keep_ms

    # -- setup ----------------------------------------------------------------------------------
    def liveness_bound_ms(self) -> int:
        """How long after faults stop every participant must have decided (Cornus's promise; the
        blocking protocols are held to it too, once their coordinator is back)."""
        c = self.config
        slowest_call = self.deadline_ms + c.clock_slack_ms + self.schedule.delay_ms_max
        # A newest process deposed by the first one of a Twin waits for that one's renewals to
        # stop (it dies by the time faults end), and a watch's read, before it exits and restarts.
        vacancy_ms = c.identity_vacant_ms + c.identity_check_ms + 2 * slowest_call if self.schedule.twins else 0
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
        return NodeCore(
            node.name, (), self._configured_coordinators(node.name), self.config, jitter,
            participant_factory=self._participant_factory, coordinator_factory=self._coordinator_factory,
        )

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
            self.outcome.violations.extend(self.storage.violations)
        return self.outcome

    def _begin(self) -> None:
        self.now_ms = -self.boot_ms
        self._push(0, _BOOTED, None)  # first at time 0: before any crash due then
        for node in self.nodes.values():
            self._start_core(node)
        for index, plan in enumerate(self.schedule.txns):
            self._push(plan.start_ms, _EXECUTE, self.txns[index])
        for crash in self.schedule.crashes:
            self._push(crash.at_ms, _CRASH, crash)
        for move in self.schedule.moves:
            self._push(move.at_ms, _MOVE, move)
        for twin in self.schedule.twins:
            self._push(twin.at_ms, _TWIN, twin)
            if twin.cut_ms:
                self._push(twin.cut_start_ms, _RESEND, twin)
        for index, resolve in enumerate(self.schedule.resolves):
            self._push(resolve.at_ms, _RESOLVE, index)
        self._push(self.liveness_check_ms, _CHECK, None)
        for at_ms, index in self.probe.plan(self):
            self._push(at_ms, _STATUS, index)

    def _step(self, kind: int, data: Any) -> None:
        if kind == _DELIVER:
            self._deliver(*data)
        elif kind == _ARRIVE:
            self._arrive(data)
        elif kind == _RETURN:
            name, incarnation, event, path, tenure = data
            if name.startswith("~resolve/"):
                self._resolver_step(int(name.rsplit("/", 1)[1]), event)
                return
            node = self.process(name, incarnation)
            if node is not None:
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
        elif kind == _TIMER:
            name, incarnation, timer, generation, path = data
            node = self.process(name, incarnation)
            if node is not None and node.timers.get(timer) == generation:
                del node.timers[timer]
                if self._lapsed(node, timer.owner) is not None:
                    # Not acted on (ownership.without_lease_may): the runtime drops the partition
                    # when such a timer fires. Its host here still hears its answers until the
                    # lapse ends.
                    self.outcome.timers_dropped_not_held += 1
                    return
                self._feed(node, TimerFired(timer), path)
        elif kind in _EXECUTION_STEPS:
            # The core's execution state asserts its invariants, as the machines do (_feed).
            try:
                _EXECUTION_STEPS[kind](self, data)
            except AssertionError as error:
                self.outcome.violations.append(f"assertion in the execution phase: {error}")
        elif kind == _MOVE:
            self._move(data)
        elif kind == _TAKE:
            self._take(data)
        elif kind == _LAPSE_END:
            self._lapse_ends(*data)
        elif kind == _ASKED:
            self._asked(*data)
        elif kind == _RESOLVE_WRITES:
            self._resolve_writes(*data)
        elif kind == _TWIN:
            self._twin(data)
        elif kind == _TWIN_END:
            self._twin_ends(*data)
        elif kind == _CONFIRM:
            self._confirm_step(data)
        elif kind == _RESEND:
            self._resend(data)
        elif kind == _IDENTITY_ARRIVE:
            self._identity_arrive(data)
        elif kind == _WATCH:
            self._watch(*data)
        elif kind == _WATCH_LANDS:
            self._watch_lands(*data)
        elif kind == _WATCHED:
            self._watched(*data)
        elif kind == _EXECUTE_ANSWER:
            self._execute_answered(*data)
        elif kind == _EXECUTE_DEADLINE:
            self._execute_deadline(*data)
        elif kind == _COMMIT:
            txn, writes, reads = data
            node = self._executing_process(txn)
            self.executing.pop(txn, None)
            if node is not None:
                self._feed(node, CommitRequested(node.name, txn, writes, reads), node.path)
        elif kind == _STATUS:
            # Every node is asked at once; each answers in steps while the world goes on.
            for at_ms, step in self.probe.ask(self, data):
                self._push(at_ms, _STATUS_ANSWER, step)
        elif kind == _STATUS_ANSWER:
            for at_ms, step in self.probe.step(self, data):
                self._push(at_ms, _STATUS_ANSWER, step)
        elif kind == _CRASH:
            self.crash(data.node, data.down_ms)
        elif kind == _RESTART:
            self._restart(data)
        elif kind == _RESOLVE:
            self._start_resolve(data)
        elif kind == _IDLE:
            name, incarnation, partition, txn = data
            node = self.process(name, incarnation)
            if node is not None:
                self._drop_idle(node, partition, txn)
        elif kind == _BOOTED:
            booting = [node.name for node in self.nodes.values() if not node.ready]
            if booting:
                self.outcome.violations.append(f"recovery of an empty cluster did not finish on {booting}")
        else:
            assert kind == _CHECK
            self._check_liveness()

    # -- the execution phase (the runtime's I/O around the core's execution state) ---------------
    def _execute_txn(self, txn: str) -> None:
        """An interactive transaction's first requests: on each partition, lock its key (shared,
        NO_WAIT) and read it through the owner's cache; its writes follow in `_execute_writes`, as
        continued requests, a moment later. Any refusal aborts before commit, as the runtime's
        coordinator does when an execute request fails."""
        plan = self.plans[txn]
        first = self.twins.get(plan.coordinator)
        twin = self._twin_of.get(plan.coordinator)
        if (plan.one_shot and first is not None and first.ready and twin is not None and twin.cut_ms
                and self.now_ms < twin.cut_start_ms and txn not in self._one_shot_sent):
            # Over the client's old connection, to the first process; sent again at its cut.
            self._to_resend.setdefault(plan.coordinator, []).append(txn)
            self._start_one_shot(txn, first)
            return
        if not self.nodes[plan.coordinator].ready:
            return
        if txn in self._one_shot_sent and not self._accepts_again(txn):
            return  # its client is refused, and asks the status call instead
        if plan.one_shot:
            self._start_one_shot(txn, self.nodes[plan.coordinator])
            return
        coordinator = self.nodes[plan.coordinator]
        self.executing[txn] = (coordinator.name, coordinator.incarnation)
        reads: dict[tuple[str, str], int] = {}
        for partition, key_index in (*plan.writes, *plan.reads):
            node = self.owner_of(partition)
            key = f"k{key_index}"
            if not self._serves(node, partition, txn):
                self._abort_execution(txn)
                return
            execution = self._begin_execution(node, partition, txn)
            table = node.tables[partition]
            if execution is None or table.lock(txn, key, LockMode.SHARED, self.now_ms) is not Grant.GRANTED:
                self._abort_execution(txn)
                return
            reads[(partition, key)] = self._read_committed(node, partition, key, txn, execution)
        self.outcome.reads[txn] = reads
        if not plan.writes:
            self._executed(txn, [])
            return
        think_ms = self.schedule.think_ms + self.rng.randint(1, self.schedule.delay_ms_max)
        self._push(self.now_ms + think_ms, _EXECUTE_WRITES, txn)

    def _execute_writes(self, txn: str) -> None:
        """The writes of an interactive transaction: on each written partition a continued request
        that takes the key exclusive and buffers the next version. A partition whose owner
        restarted since the read has lost the execution, and with it the read lock: it refuses."""
        plan = self.plans[txn]
        if self._executing_process(txn) is None:
            # The coordinator is gone, or restarted and forgot it (its caller's next call is
            # refused): its executions idle out.
            self.executing.pop(txn, None)
            return
        writes: list[tuple[str, bytes]] = []
        self.outcome.writes[txn] = {}
        for partition, key_index in plan.writes:
            node = self.owner_of(partition)
            key = f"k{key_index}"
            if not self._serves(node, partition, txn):
                self._abort_execution(txn)
                return
            table = node.tables[partition]
            execution = table.begin(txn, plan.coordinator, self.now_ms, continued=True)
            granted = isinstance(execution, Execution) and table.lock(txn, key, LockMode.EXCLUSIVE, self.now_ms)
            if granted is not Grant.GRANTED:
                self._abort_execution(txn)
                return
            value = self.outcome.reads[txn][(partition, key)] + 1
            self.outcome.writes[txn][(partition, key)] = value
            execution.writes[key] = value
            writes.append((partition, redo.encode({key: value})))
        self._executed(txn, writes)

    def _executing_process(self, txn: str) -> Node | None:
        """The process that runs `txn`'s operations, while it lives and serves: the one that began
        it (the first process of a Twin too, until it is deposed)."""
        holder = self.executing.get(txn)
        node = None if holder is None else self.process(*holder)
        if node is None or not node.ready or (node.name, node.incarnation) in self.parked:
            return None
        return node

    def _executed(self, txn: str, writes: list[tuple[str, bytes]]) -> None:
        plan = self.plans[txn]
        self.outcome.executed.add(txn)
        self._push(self.now_ms + 1, _COMMIT, (txn, tuple(writes), tuple(p for p, _ in plan.reads)))

    def _abort_execution(self, txn: str) -> None:
        """The coordinator's abort of an execution that failed somewhere: every live owner drops it."""
        plan = self.plans[txn]
        self.executing.pop(txn, None)
        for partition, _ in (*plan.writes, *plan.reads):
            node = self.owner_of(partition)
            if self._serves(node, partition, txn, abort=True):
                self._wake(node, partition, node.tables[partition].abort(txn), txn)

    def _serves(self, node: Node | None, partition: str, txn: str, *, abort: bool = False) -> TypeGuard[Node]:
        """Whether `node` runs a request of `txn`'s execution phase on `partition` now: it holds
        it, and the core's admission rule (NodeCore.execute_refusal, the runtime's too) allows.
        None (nobody holds the partition): the runtime's coordinator refuses it ("no node holds")."""
        return (node is not None and node.alive and node.core is not None and partition in node.core.partitions
                and partition not in node.lapsed and node.core.execute_refusal(partition, txn, abort=abort) is None)

    def _begin_execution(self, node: Node, partition: str, txn: str) -> Execution[int] | None:
        """The core's execution of `txn` on `partition` (None if refused), with its idle timeout."""
        execution = node.tables[partition].begin(txn, self.plans[txn].coordinator, self.now_ms)
        if isinstance(execution, Refusal):
            return None
        self._push(self.now_ms + EXECUTION_IDLE_MS + 1, _IDLE, (node.name, node.incarnation, partition, txn))
        return execution

    def _start_one_shot(self, txn: str, coordinator: Node) -> None:
        """The runtime's one-shot with the prepares carried by the requests: the caller names each
        write's value (the version after the one it expects, read now through the owner's cache, as
        the caller's own earlier read would be served), the coordinator's machine starts at once,
        and each partition's request travels like any message (late, lost, or to a node that is
        down)."""
        plan = self.plans[txn]
        sent = self._one_shot_sent.get(txn)
        if sent is None:
            versions = {p: self._caller_read(p, f"k{k}") for p, k in plan.writes}
            redos = [(p, redo.encode({f"k{k}": versions[p] + 1})) for p, k in plan.writes]
            # A partition only read votes too (paper 3.5), and its redo names the key it read.
            redos += [(p, redo.encode({}, (f"k{k}",))) for p, k in plan.reads]
            expected: dict[str, int | None] = {**versions, **dict.fromkeys((p for p, _ in plan.reads), None)}
            writes = tuple(sorted(redos))
            self._one_shot_sent[txn] = (writes, expected)
            self.outcome.reads[txn], self.outcome.writes[txn] = {}, {}
            self.outcome.executed_on[txn] = set()
        else:
            writes, expected = sent  # sent again by its client: the same id and operations
        self._feed(coordinator, CommitRequested(coordinator.name, txn, writes, (), prepare_sent=True), coordinator.path)
        participants = tuple(p for p, _ in writes)
        for partition, key_index in (*plan.writes, *plan.reads):
            owner = self.owner_of(partition)
            if owner is None:
                # Nobody holds it (a Move's gap): the runtime's coordinator refuses the request
                # before sending it, and the machine hears so after it started.
                self._unanswered.add((txn, partition, coordinator.incarnation))
                self._push(self.now_ms, _EXECUTE_ANSWER, (txn, partition, coordinator.incarnation, "no node holds it"))
                continue
            sent = _Carried(txn, partition, f"k{key_index}", expected[partition], participants,
                            coordinator.incarnation, owner.name, owner.incarnation)
            self._unanswered.add((txn, partition, coordinator.incarnation))
            self._push(self.now_ms + TIMEOUT_MS_EXECUTE, _EXECUTE_DEADLINE, (txn, partition, coordinator.incarnation))
            if self.rng.random() < self.schedule.loss_probability and 0 <= self.now_ms < FAULTS_END_MS:
                continue  # lost on the way: its deadline tells the coordinator
            delay_ms = self.rng.randint(1, self.schedule.delay_ms_max)
            # Drawn only when late requests are on: every other schedule's run stays what it was.
            late_p = self.schedule.late_request_probability
            if late_p and (self.rng.random() < late_p or plan.late):
                delay_ms += self.schedule.late_request_ms
            self._push(self.now_ms + delay_ms, _EXECUTE_PREPARED, sent)

    def _execute_prepared(self, carried: _Carried) -> None:
        """A one-shot's request reaches the partition's owner: take the lock, read the key (from the
        cache, or storage, whose answer may take long), and go on in `_read_done`."""
        txn, partition, key, expected = carried.txn, carried.partition, carried.key, carried.expected
        incarnation = carried.incarnation
        node = self.nodes[carried.owner]
        if not node.alive or node.incarnation != carried.owner_incarnation:
            # Sent over a connection to a process that is gone: lost with it. A node that dropped
            # the partition since refuses it below (it hosts it no more).
            self._answer_execute(txn, partition, incarnation, None)
            return
        if partition in node.lapsed:
            # The runtime asks the lease first and drops what ran out (Node.on_request).
            self._answer_execute(txn, partition, incarnation, "the partition was lost")
            return
        if not self._serves(node, partition, txn):
            committing = (node.core is not None and partition in node.core.partitions
                          and node.core.execute_refusal(partition, txn) is ExecuteRefusal.COMMITTING)
            self._answer_execute(txn, partition, incarnation, ALREADY_COMMITTING if committing else "not ready")
            return
        begin_ms = begin_ms_of(txn)
        deadline_ms = (status.request_deadline_ms(begin_ms + TIMEOUT_MS_EXECUTE, begin_ms, TIMEOUT_MS_EXECUTE)
                       if self.schedule.request_deadlines else 0)
        if status.request_expired(deadline_ms, self.clock_ms(node.name), CLOCK_SLACK_MS):
            self._answer_execute(txn, partition, incarnation, "arrived past its deadline")  # as Node.on_request
            return
        table = node.tables[partition]
        execution = self._begin_execution(node, partition, txn)
        if execution is None:
            self._answer_execute(txn, partition, incarnation, ABORTED_HERE)
            return
        mode = LockMode.SHARED if expected is None else LockMode.EXCLUSIVE
        grant = table.lock(txn, key, mode, self.now_ms)
        if grant is Grant.WAITING:
            # Behind a holder that voted (its locks go at the decision), or older under WAIT_DIE.
            self._parked[(node.name, node.incarnation, partition, txn, key)] = (carried, execution)
            self.outcome.lock_waits += 1
            expiry_ms = self.now_ms + table.locks.timeout_ms_wait + 1
            self._push(expiry_ms, _LOCK_EXPIRY, (node.name, node.incarnation, partition))
            return
        if grant is not Grant.GRANTED:
            self._wake(node, partition, table.abort(txn), txn)
            self._answer_execute(txn, partition, incarnation, "conflict")
            return
        self._locked(carried, execution)

    def _lock_granted(self, name: str, incarnation: int, partition: str, txn: str, key: str) -> None:
        parked = self._parked.pop((name, incarnation, partition, txn, key), None)
        if parked is None:
            return  # its node restarted, or the wait ended otherwise
        carried, execution = parked
        node = self.nodes[name]
        table = node.tables.get(partition)
        if not node.alive or node.incarnation != incarnation or table is None:
            self._answer_execute(txn, partition, carried.incarnation, None)
            return
        if not table.is_current(txn, execution):
            # Dropped while it waited: not resurrected, and what the grant gave it goes back.
            self._wake(node, partition, table.release(txn), txn)
            self._answer_execute(txn, partition, carried.incarnation, ABORTED_WHILE_WAITING)
            return
        self._locked(carried, execution)

    def _lock_expiry(self, name: str, incarnation: int, partition: str) -> None:
        node = self.nodes[name]
        table = node.tables.get(partition)
        if not node.alive or node.incarnation != incarnation or table is None:
            return
        expired, granted = table.locks.expire(self.now_ms)
        for waiter in expired:
            parked = self._parked.pop((name, incarnation, partition, waiter.txn, waiter.key), None)
            if parked is not None:
                self._wake(node, partition, table.abort(waiter.txn), waiter.txn)
                self._answer_execute(waiter.txn, partition, parked[0].incarnation, "lock wait timed out")
        self._wake(node, partition, granted)

    def _wake(self, node: Node, partition: str, granted: list[Waiter], released: str = "") -> None:
        """Resume the requests a release granted, after the step that released (as the runtime's
        woken futures run on a later tick); and refuse the requests of the transaction whose
        locks went (`released`), which its release took out of the queue."""
        for waiter in granted:
            self._push(self.now_ms, _LOCK_GRANTED, (node.name, node.incarnation, partition, waiter.txn, waiter.key))
        if released:
            self._unpark(lambda k: k[:4] == (node.name, node.incarnation, partition, released), "aborted while waiting")

    def _unpark(self, matches: Callable[[tuple[str, int, str, str, str]], bool], refusal: str | None) -> None:
        for parked_key in [k for k in self._parked if matches(k)]:
            carried, _ = self._parked.pop(parked_key)
            self._answer_execute(carried.txn, carried.partition, carried.incarnation, refusal)

    def _locked(self, carried: _Carried, execution: Execution[int]) -> None:
        """The request holds its lock: read the key (from the cache, or storage, whose answer may
        take long), and go on in `_read_done`."""
        txn, partition, key = carried.txn, carried.partition, carried.key
        node = self.nodes[carried.owner]
        table = node.tables[partition]
        hit, value = table.cached(key)
        if hit:
            assert value is not None
            self._read_done(carried, execution, value)
            return
        found = self.storage.data.get((partition, key), 0)
        # A slow read answers late (drawn only when slow reads are on, so every other schedule's
        # run stays what it was): meanwhile the execution may be dropped and another transaction
        # commit a newer value, which this answer then predates.
        slow = self.schedule.slow_read_probability
        if slow and self.now_ms < FAULTS_END_MS and self.rng.random() < slow:
            self._slow_reads_out[partition] += 1
            self._push(self.now_ms + self.schedule.slow_read_ms, _READ_LANDED, (carried, execution, found))
            return
        table.read_landed(txn, execution, {key: found})
        self._read_done(carried, execution, found)

    def _read_landed(self, carried: _Carried, execution: Execution[int], found: int) -> None:
        self._slow_reads_out[carried.partition] -= 1
        node = self.nodes[carried.owner]
        if not node.alive or node.incarnation != carried.owner_incarnation:
            self._answer_execute(carried.txn, carried.partition, carried.incarnation, None)
            return
        if carried.partition not in node.tables or carried.partition in node.lapsed:
            # Lost while the read was out (dropped, or its lease ended): the runtime's check after
            # the execution (Node.on_request) answers NOT_OWNER, a refusal (found by audit: the
            # world answered nothing, or, once lapses were modelled, ran on as the owner).
            self.outcome.reads_out_when_lost += 1
            self._answer_execute(carried.txn, carried.partition, carried.incarnation, "the partition was lost")
            return
        table = node.tables[carried.partition]
        table.read_landed(carried.txn, execution, {carried.key: found})
        if not table.is_current(carried.txn, execution):
            # Dropped while the read was out (an abort, an idle timeout): not resurrected.
            self._answer_execute(carried.txn, carried.partition, carried.incarnation, "aborted while reading")
            return
        self._read_done(carried, execution, found)

    def _read_done(self, carried: _Carried, execution: Execution[int], value: int) -> None:
        """Check the version the request expects, record the write, and hand the machine its
        execution and prepare; a failed check drops it."""
        txn, partition, key, expected = carried.txn, carried.partition, carried.key, carried.expected
        incarnation = carried.incarnation
        plan = self.plans[txn]
        node = self.nodes[carried.owner]
        if expected is None:
            # Only read: it votes yes, keeping the read lock until the decision.
            self.outcome.reads[txn][(partition, key)] = value
            execution.reads[key] = None
        elif value != expected:
            self._wake(node, partition, node.tables[partition].abort(txn), txn)
            self._answer_execute(txn, partition, incarnation, "check failed")
            return
        else:
            self.outcome.reads[txn][(partition, key)] = expected
            self.outcome.writes[txn][(partition, key)] = expected + 1
            execution.writes[key] = expected + 1
        executed_on = self.outcome.executed_on[txn]
        executed_on.add(partition)
        if len(executed_on) == len(plan.writes) + len(plan.reads):
            self.outcome.executed.add(txn)
        self._deliver(partition, plan.coordinator, Prepare(txn, carried.participants, plan.coordinator), node.path)
        if node.alive:
            self._answer_execute(txn, partition, incarnation, "")

    def _answer_execute(self, txn: str, partition: str, incarnation: int, refusal: str | None) -> None:
        """The owner's answer leaves for the coordinator ("" executed; a reason: refused; None:
        none, the process is gone). It may be lost, or reach the coordinator after the request's
        deadline, which has told it "no answer" by then (`_execute_deadline`)."""
        if refusal is None or (self.rng.random() < self.schedule.loss_probability and self.now_ms < FAULTS_END_MS):
            return
        delay = self.rng.randint(1, self.schedule.delay_ms_max)
        self._push(self.now_ms + delay, _EXECUTE_ANSWER, (txn, partition, incarnation, refusal))

    def _execute_answered(self, txn: str, partition: str, incarnation: int, refusal: str) -> None:
        key = (txn, partition, incarnation)
        if key not in self._unanswered:
            return  # its deadline passed: the coordinator heard "no answer", and listens no more
        self._unanswered.discard(key)
        if refusal:
            coordinator = self.process(self.plans[txn].coordinator, incarnation)
            if coordinator is not None and self._cut_off(coordinator):
                self._unanswered.add(key)  # lost on the way: its deadline tells the coordinator
                return
            if coordinator is not None:
                failed = ExecuteFailed(coordinator.name, txn, partition,
                                       refused=refuses(_STATUS_OF_ANSWER[refusal]), detail=refusal)
                self._feed(coordinator, failed, coordinator.path)

    def _execute_deadline(self, txn: str, partition: str, incarnation: int) -> None:
        key = (txn, partition, incarnation)
        if key not in self._unanswered:
            return
        self._unanswered.discard(key)
        coordinator = self.process(self.plans[txn].coordinator, incarnation)
        if coordinator is not None:
            failed = ExecuteFailed(coordinator.name, txn, partition, refused=False, detail="no answer")
            self._feed(coordinator, failed, coordinator.path)

    def _read_committed(self, node: Node, partition: str, key: str, txn: str, execution: Execution[int]) -> int:
        """The committed value of a key `txn` holds locked: from the cache, or storage at once."""
        table = node.tables[partition]
        hit, value = table.cached(key)
        if hit:
            assert value is not None
            return value
        found = self.storage.data.get((partition, key), 0)
        table.read_landed(txn, execution, {key: found})
        return found

    def _caller_read(self, partition: str, key: str) -> int:
        """What a caller reading `key` before its one-shot is told: the owner's cached value, else
        storage's (also when nobody holds the partition now: the caller read it before)."""
        owner = self.owner_of(partition)
        hit, value = owner.tables[partition].cached(key) if owner is not None else (False, None)
        if hit:
            assert value is not None
            return value
        return self.storage.data.get((partition, key), 0)

    def _drop_idle(self, node: Node, partition: str, txn: str) -> None:
        assert node.core is not None
        table = node.tables.get(partition)
        if table is None:
            return  # moved away: its executions went with it
        execution = table.executions.get(txn)
        if execution is None:
            return
        if txn in table.idle(self.now_ms, EXECUTION_IDLE_MS):
            granted = table.idle_out(txn, txn in node.core.partitions[partition].machines)
            if granted is not None:
                self._wake(node, partition, granted, txn)
        else:
            # Touched since (a continued request): the runtime's periodic sweep looks again later.
            again_ms = execution.last_active_ms + EXECUTION_IDLE_MS + 1
            self._push(again_ms, _IDLE, (node.name, node.incarnation, partition, txn))

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
            self._push(min(self.now_ms + max(1, down_ms), max(FAULTS_END_MS, self.now_ms + 1)), _RESTART, name)
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
        self._push(min(restart_at, max(FAULTS_END_MS, self.now_ms + 1)), _RESTART, name)

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

    def _resend(self, twin: Twin) -> None:
        """The cut of a Twin's first process: the client of the one-shots it took sends them
        again, with their ids, to the second process (once that one is ready)."""
        if not self.nodes[twin.node].ready:
            if self.now_ms + TAKE_RETRY_MS < twin.cut_end_ms:
                self._push(self.now_ms + TAKE_RETRY_MS, _RESEND, twin)
            return
        for txn in self._to_resend.pop(twin.node, []):
            # Its client heard nothing (no reply, or, for half of them, one lost in the cut; not
            # drawn from the RNG), and named the transaction: it can send it again as it was.
            lost = txn not in self.outcome.replies or zlib.crc32(f"{txn}/lost".encode()) % 2 == 0
            if lost and txn_ids.is_client_chosen(txn):
                self._push(self.now_ms + self.rng.randint(1, self.schedule.delay_ms_max), _EXECUTE, txn)

    def _accepts_again(self, txn: str) -> bool:
        """Whether the second process runs a one-shot its client sent again: as the runtime's
        check_client_txn, only while its begin is recent (the peer request timeout here) and a
        clock slack after the process took the node's identity (Coordination._check_client_txn)."""
        name = self.plans[txn].coordinator
        taken_ms = self.nodes[name].identity_taken_ms
        if taken_ms is None:
            return False
        after_ms = txn_ids.client_begins_after_ms(0, taken_ms, CLOCK_SLACK_MS)
        return not txn_ids.client_begin_problem(begin_ms_of(txn), self.clock_ms(name), after_ms, TIMEOUT_MS_EXECUTE)

    def _twin(self, twin: Twin) -> None:
        """A second process of `twin.node` starts (and recovers) while the first runs on."""
        first = self.nodes[twin.node]
        if not first.alive:
            return  # nothing runs on: the node's restart is an ordinary one
        if self.trace is not None:
            self.trace.append(f"{self.now_ms:6d} {twin.node:>3} SECOND PROCESS starts, the first runs on")
        self.twins[twin.node] = first
        second = Node(first.name, None, first.partitions, incarnation=first.incarnation + 1)
        second.reset_memory(self.lock_policy)
        self.nodes[twin.node] = second
        self._push(self.now_ms + twin.overlap_ms, _TWIN_END, (twin.node, first.incarnation))
        self._twin_end_ms[twin.node] = self.now_ms + twin.overlap_ms
        self._start_core(second)

    def _twin_ends(self, name: str, incarnation: int) -> None:
        first = self.twins.get(name)
        if first is None or first.incarnation != incarnation:
            return  # it stopped already
        if self.trace is not None:
            self.trace.append(f"{self.now_ms:6d} {name:>3} FIRST PROCESS dies")
        del self.twins[name]
        first.alive = False
        first.core = None

    def _identity_legs_ms(self) -> tuple[int, int | None]:
        """How long an identity call takes to land, and then to answer (None: drawn when it
        lands, as every other call's is). In Schedule.slow_identity, half of them answer just
        before their deadline."""
        if self.schedule.slow_identity and self.rng.random() < 0.5:
            total_ms = self.deadline_ms - 1
            landing_ms = self.rng.randint(1, total_ms - 1)
            return landing_ms, total_ms - landing_ms
        return self.rng.randint(1, self.schedule.storage_ms_max), None

    def _identity_arrive(
        self, data: tuple[str, int, TakeIdentity | CheckIdentity, Any, int | None, int, int | None],
    ) -> None:
        """A read of the node's identity record lands, or a step of a take, which is what the
        runtime's is (cornus.runtime.identity.take): a read (`expected` None), then a
        compare-and-swap over what it read, a round trip later, which lands whether or not its
        process still lives and is refused if another take landed in between; then the next
        round, TAKE_IDENTITY_ROUND_COUNT_MAX at most."""
        name, incarnation, call, path, expected, round_count, answer_ms = data
        identity = identity_name(name)
        stored = self.epoch.get(identity, 0)
        result: IdentityTaken | IdentityChecked
        if isinstance(call, CheckIdentity):
            result = IdentityChecked(name, stored == call.epoch)
            if call.renew and stored == call.epoch:
                self.identity_version[identity] += 1
                self.identity_changed_ms[identity] = self.now_ms
        elif expected is None or stored != expected:
            if expected is not None and round_count >= TAKE_IDENTITY_ROUND_COUNT_MAX:
                result = IdentityTaken(StorageUnreachable(f"lost {TAKE_IDENTITY_ROUND_COUNT_MAX} races"))
            elif self.process(name, incarnation) is None and expected is not None:
                return  # a refused swap of a process that is gone: nobody takes the next round
            else:
                rounds = round_count + (expected is not None)
                # The read's answer, then the next call: one round trip, as the runtime's.
                latency, next_answer_ms = self._identity_legs_ms()
                if answer_ms is not None:
                    latency += answer_ms
                data = (name, incarnation, call, path, stored, rounds, next_answer_ms)
                self._push(self.now_ms + latency, _IDENTITY_ARRIVE, data)
                return
        else:
            self.epoch[identity] = stored + 1
            self.identity_version[identity] = self.identity_version.get(identity, 0) + 1
            self.identity_changed_ms[identity] = self.now_ms
            result = IdentityTaken(stored + 1)
            process = self.process(name, incarnation)
            if process is not None:
                process.epochs[identity] = stored + 1
        if self.trace is not None:
            self.trace.append(f"{self.now_ms:6d} storage identity of {name}: {call} -> {result}")
        latency = self.rng.randint(1, self.schedule.storage_ms_max) if answer_ms is None else answer_ms
        self._push(self.now_ms + latency, _RETURN, (name, incarnation, result, path, 0))

    def _depose(self, name: str, incarnation: int) -> None:
        """A process whose node's identity another process took after it: the runtime parks it (it
        acts no more), so a first process of a Twin ends here, as it would when its pod is gone.
        The newest process can be the one deposed too, when both take the identity at once and
        the older one's swap lands last: it parks, and watches the record (_watch) until the
        older one, which dies at the end of its overlap, stops renewing it; then it exits, and
        its restart takes the identity again. Its memory is lost meanwhile, as in a crash."""
        process = self.process(name, incarnation)
        if process is None:
            return
        self.outcome.deposed += 1
        if self.trace is not None:
            self.trace.append(f"{self.now_ms:6d} {name:>3} DEPOSED (incarnation {incarnation})")
        if self.twins.get(name) is process:
            # It acts no more; it watches the record until its pod is gone, and a vacancy it finds
            # meanwhile ends it too (its restart, by a kubelet the pod's deletion has not reached,
            # is not modelled: it would be one more process of the node, as a Twin is).
            self._twin_ends(name, incarnation)
            self._park(name, incarnation, restarts=False, ends_ms=self._twin_end_ms[name])
            return
        self._unpark(lambda k: k[0] == name, None)
        process.alive = False
        process.incarnation += 1
        process.core = None
        process.reset_memory(self.lock_policy)
        self._park(name, process.incarnation, restarts=True, ends_ms=None)

    def _park(self, name: str, incarnation: int, *, restarts: bool, ends_ms: int | None) -> None:
        self.parked[(name, incarnation)] = _Parked(VacancyWatch(self.config, self.now_ms), restarts, ends_ms)
        self._push(self.now_ms + self.config.identity_check_ms, _WATCH, (name, incarnation))

    def _watch(self, name: str, incarnation: int) -> None:
        """A parked process sends a read of its node's identity record (_watch_lands, _watched)."""
        parked = self.parked.get((name, incarnation))
        if parked is None:
            return  # it crashed or exited meanwhile
        if parked.ends_ms is not None and self.now_ms >= parked.ends_ms:
            del self.parked[(name, incarnation)]  # its pod is gone
            return
        self._push(self.now_ms + self.config.identity_check_ms, _WATCH, (name, incarnation))
        if 0 <= self.now_ms < FAULTS_END_MS and self.rng.random() < self.schedule.late_call_probability:
            unreachable = StorageUnreachable("the read outlived its deadline")
            self._push(self.now_ms + self.deadline_ms, _WATCHED, (name, incarnation, self.now_ms, unreachable, None))
            return
        landing_ms, answer_ms = self._identity_legs_ms()
        self._push(self.now_ms + landing_ms, _WATCH_LANDS, (name, incarnation, self.now_ms, answer_ms))

    def _watch_lands(self, name: str, incarnation: int, sent_ms: int, answer_ms: int | None) -> None:
        """A parked process's read lands: storage serves it now, and its answer arrives later."""
        identity = identity_name(name)
        stored = (self.epoch[identity], self.identity_version[identity]) if identity in self.epoch else None
        # How long what it read had stood then: the watch's promise is checked against it.
        stood_ms = self.now_ms - self.identity_changed_ms.get(identity, -self.boot_ms)
        latency = self.rng.randint(1, self.schedule.storage_ms_max) if answer_ms is None else answer_ms
        self._push(self.now_ms + latency, _WATCHED, (name, incarnation, sent_ms, stored, stood_ms))

    def _watched(self, name: str, incarnation: int, sent_ms: int, record: Observed, stood_ms: int | None) -> None:
        parked = self.parked.get((name, incarnation))
        if parked is None or not parked.watch.observed(sent_ms, self.now_ms, record):
            return
        # What the watch promises: the record it read last had stood unchanged for the whole wait
        # when storage served that read, by storage's own record of its changes.
        assert stood_ms is not None
        if stood_ms < self.config.identity_vacant_ms:
            self.outcome.violations.append(
                f"a parked process of {name} took its identity for vacant from a read of a record that had stood "
                f"{stood_ms} ms (the wait is {self.config.identity_vacant_ms} ms)")
        holder = self._identity_holder(name)
        # Judged for the holder of what the watch read: one whose take landed after that read (a
        # restart of the holder that had died) is no process the watch took for gone (found by
        # the explorer: mixed --twins seed 173, a false alarm).
        read_epoch = record[0] if isinstance(record, tuple) else None
        if holder is not None and holder.core is not None and holder.core.identity_epoch == read_epoch:
            failed_ms = self._identity_unreachable_ms.get((name, holder.incarnation))
            if failed_ms is None or failed_ms < self.now_ms - self.config.identity_vacant_ms - self.deadline_ms:
                self.outcome.violations.append(
                    f"a parked process of {name} took its identity for vacant while the process holding it lived "
                    f"and every renewal of its landed")
        if self.trace is not None:
            self.trace.append(f"{self.now_ms:6d} {name:>3} IDENTITY VACANT: the parked process exits")
        self.outcome.vacancy_exits += 1
        del self.parked[(name, incarnation)]
        if parked.restarts:
            self._push(self.now_ms + 1, _RESTART, name)

    def _identity_holder(self, name: str) -> Node | None:
        """The live process of node `name` that holds its identity now, if one does."""
        stored = self.epoch.get(identity_name(name))
        for process in (self.nodes[name], self.twins.get(name)):
            if (process is not None and process.alive and process.core is not None
                    and process.core.identity_epoch == stored):
                return process
        return None

    def _unreachable(self, log: LogId) -> bool:
        windows = self._down_logs.get(log.key)
        return windows is not None and any(start <= self.now_ms < end for start, end in windows)

    # -- effects ----------------------------------------------------------------------------------
    def _execute(self, node: Node, effect: Effect) -> None:
        if self.trace is not None:
            self.trace.append(f"{self.now_ms:6d} {node.name:>3} -> {effect}")
        if isinstance(effect, Send):
            self._send(node, effect)
        elif isinstance(effect, LogOnce | Log | ApplyRedo | DeleteRecord | ReadRecord | ScanLog):
            if isinstance(effect, LogOnce | Log):
                self.outcome.log_writes += 1
            self._call(node.name, node.incarnation, effect, node.path)
        elif isinstance(effect, ListIdentities):
            self._list_identities(node, effect)
        elif isinstance(effect, StartTimer):
            node.timer_generation += 1
            node.timers[effect.timer] = node.timer_generation
            data = (node.name, node.incarnation, effect.timer, node.timer_generation, node.path)
            self._push(self.now_ms + effect.duration_ms, _TIMER, data)
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
        elif isinstance(effect, TakeIdentity | CheckIdentity):
            node.identity_left_ms = self.now_ms
            if self._cut_off(node):
                unanswered = (IdentityTaken(StorageUnreachable("cut off")) if isinstance(effect, TakeIdentity)
                              else IdentityChecked(node.name, StorageUnreachable("cut off")))
                data = (node.name, node.incarnation, unanswered, node.path, 0)
                self._push(self.now_ms + self.deadline_ms, _RETURN, data)
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
                self._push(self.now_ms + self.deadline_ms, _RETURN,
                           (node.name, node.incarnation, unreachable, node.path, 0))
                self._identity_unreachable_ms[(node.name, node.incarnation)] = self.now_ms
                return
            latency, answer_ms = self._identity_legs_ms()
            data = (node.name, node.incarnation, effect, node.path, None, 1, answer_ms)
            self._push(self.now_ms + latency, _IDENTITY_ARRIVE, data)
        elif isinstance(effect, Deposed):
            self._depose(node.name, node.incarnation)
        elif isinstance(effect, RecoveryFinished):
            # A node back from a crash knows least: the status call is asked about what it
            # coordinated just then, while that transaction's requests and votes may be on their way.
            for at_ms, index in self.probe.after_recovery(self, node.name):
                self._push(at_ms, _STATUS, index)
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
        self._push(self.now_ms + self.rng.randint(1, self.schedule.delay_ms_max), _DELIVER, data)
        if self.rng.random() < self.schedule.duplicate_probability:
            late = self.rng.random() < 0.5
            self.outcome.late_duplicates += late
            delay = self.config.gc_grace_ms + self.rng.randint(0, self.config.gc_grace_ms) if late else 0
            self._push(self.now_ms + delay + self.rng.randint(1, self.schedule.delay_ms_max), _DELIVER, data)

    def _call(self, owner: str, incarnation: int, call: StorageCall, path: Any) -> None:
        """A storage call: it reaches storage even if its caller dies meanwhile (only the answer is
        lost). A slow one answers "unreachable" at the deadline and may land up to the slack later.
        A partition's write to its own log or data carries the epoch of its owner's tenure."""
        process = self.process(owner, incarnation) if owner in self.nodes else None
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
        if process is not None and self._cut_off(process):
            unreachable = answer(call, StorageUnreachable("cut off"))
            self._push(self.now_ms + self.deadline_ms, _RETURN, (owner, incarnation, unreachable, path, tenure))
            return
        if (process is not None and fenced is None and isinstance(call, LogOnce | Log | DeleteRecord)
                and process.core is not None and process.core.partition_of(call.owner) is None
                and not self._identity_admits(process)):
            # A write for the node itself that storage cannot fence waits for a read of the
            # identity record (the runtime's EffectRunner._admit_for_node).
            self._push(self.now_ms + self.rng.randint(1, self.schedule.storage_ms_max), _CONFIRM,
                       (owner, incarnation, call, path, self.now_ms, None))
            return
        if (process is not None and fenced is None and process.core is not None
                and process.core.identity_epoch != self.epoch.get(identity_name(owner), 0)
                and isinstance(call, LogOnce | Log | DeleteRecord) and process.core.partition_of(call.owner) is None):
            # Let through by the window although a later process holds the identity now: the
            # boundary the window's bound (gc_grace_ms less a deadline and the slack) keeps safe.
            self.outcome.stale_window_writes += 1
        if 0 <= self.now_ms < FAULTS_END_MS and self.rng.random() < self.schedule.late_call_probability:
            unreachable = answer(call, StorageUnreachable("the call outlived its deadline"))
            self._push(self.now_ms + self.deadline_ms, _RETURN, (owner, incarnation, unreachable, path, tenure))
            if self.rng.random() < 0.5:
                # Where storage takes calls late, any protocol's call may land past the slack:
                # collection leaves tombstones in coordinators' logs too there.
                late_ms_max = self.config.clock_slack_ms + self.schedule.late_window_ms
                landing = self.now_ms + self.deadline_ms + self.rng.randint(0, late_ms_max)
                self._push(landing, _ARRIVE, (owner, incarnation, call, path, False, epoch, tenure))
            return
        self._push(self.now_ms + self.rng.randint(1, self.schedule.storage_ms_max), _ARRIVE,
                   (owner, incarnation, call, path, True, epoch, tenure))

    def _txn_id(self, index: int, plan: TxnPlan) -> str:
        begin_ms = plan.start_ms + 1 + self.clock_offsets_ms.get(plan.coordinator, 0)
        twin = next((t for t in self.schedule.twins if t.node == plan.coordinator and t.cut_ms), None)
        if plan.one_shot and twin is not None and twin.at_ms <= plan.start_ms < twin.cut_start_ms:
            # One its client may send again (Twin.cut_ms): an id the client chose.
            return txn_ids.client_txn_id(begin_ms, plan.coordinator, f"{index:016x}", plan.protocol)
        return f"{begin_ms}.{plan.coordinator}.sim.{index}.{PROTOCOL_TAGS[plan.protocol]}"

    def _identity_admits(self, process: Node) -> bool:
        return identity_window_admits(process.identity_confirmed_ms, self.now_ms, self.config.identity_write_window_ms)

    def _identity_confirmed(self, process: Node, left_ms: int) -> None:
        if process.identity_confirmed_ms is None or left_ms > process.identity_confirmed_ms:
            process.identity_confirmed_ms = left_ms

    def _confirm_step(self, data: tuple[str, int, StorageCall, Any, int, bool | None]) -> None:
        """The read of the identity record a write for the node waits for: it lands (`held`
        None: read now), then its answer reaches the process, which then writes (the call again,
        admitted now), stops (deposed), or hears the write unreachable (the read was)."""
        owner, incarnation, call, path, left_ms, held = data
        process = self.process(owner, incarnation)
        if process is None:
            return
        tenure = self._tenure(process, call.owner)
        if held is None:
            if self._cut_off(process) or (
                    0 <= self.now_ms < FAULTS_END_MS and self.rng.random() < self.schedule.late_call_probability):
                unreachable = answer(call, StorageUnreachable("the identity read outlived its deadline"))
                self._push(left_ms + self.deadline_ms, _RETURN, (owner, incarnation, unreachable, path, tenure))
                return
            identity = identity_name(owner)
            still = self.epoch.get(identity, 0) == process.epochs.get(identity)
            self._push(self.now_ms + self.rng.randint(1, self.schedule.storage_ms_max), _CONFIRM,
                       (owner, incarnation, call, path, left_ms, still))
            return
        if not held:
            self._depose(owner, incarnation)
            return
        self._identity_confirmed(process, left_ms)
        self._call(owner, incarnation, call, path)

    def _cut_off(self, process: Node) -> bool:
        """Whether `process` is the first process of a cut Twin, within its cut."""
        if self.twins.get(process.name) is not process:
            return False
        twin = self._twin_of[process.name]
        return twin.cut_ms > 0 and twin.cut_start_ms <= self.now_ms < twin.cut_end_ms

    def _list_identities(self, node: Node, call: ListIdentities) -> None:
        """Which nodes ever took an identity: read as the call leaves (a node that takes one later
        starts after this recovery began, and no partition recovering here votes for it before the
        recovery ends), answered after a storage latency. A slow one answers "unreachable" at the
        deadline, and a read that lands late changes nothing."""
        tenure = self._tenure(node, call.owner)
        result: tuple[str, ...] | StorageUnreachable
        latency = self.rng.randint(1, self.schedule.storage_ms_max)
        if 0 <= self.now_ms < FAULTS_END_MS and self.rng.random() < self.schedule.late_call_probability:
            result, latency = StorageUnreachable("the listing outlived its deadline"), self.deadline_ms
        else:
            prefix = len(IDENTITY_PREFIX)
            listed = sorted(name[prefix:] for name in self.epoch if is_identity(name) and name[prefix:] > call.after)
            result = tuple(listed[: call.limit])
        self._push(self.now_ms + latency, _RETURN,
                   (node.name, node.incarnation, IdentitiesListed(call, result), node.path, tenure))

    def _tenure(self, node: Node, host: str) -> int:
        """The tenure of the partition `host` acts for on `node` (0 for the node's own hosts)."""
        assert node.core is not None or not node.alive
        partition = node.core.partition_of(host) if node.core is not None else None
        return 0 if partition is None else node.tenures.get(partition, 0)

    def _arrive(self, flight: tuple[str, int, StorageCall, Any, bool, int, int]) -> None:
        owner, incarnation, call, path, answered, epoch, tenure = flight
        fenced = fenced_partition(call) if owner in self.nodes else None
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
        landed = not self._unreachable(call.log) or self.rng.random() < self.schedule.ambiguous_probability
        if landed:
            try:
                outcome = self._apply(call)
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
        latency = self.rng.randint(1, self.schedule.storage_ms_max)
        self._push(self.now_ms + latency, _RETURN, (owner, incarnation, answer(call, result), path, tenure))

    def _apply(self, call: StorageCall) -> Any:
        storage = self.storage
        storage.expire(self.now_ms)
        if isinstance(call, LogOnce):
            return storage.log_once(call.log, call.txn, call.state, call.body)
        if isinstance(call, Log):
            return storage.log(call.log, call.txn, call.state, call.body)
        if isinstance(call, ApplyRedo):
            applied = storage.apply(call.partition, call.txn, call.redo)
            self.outcome.applied.add((call.partition, call.txn))
            return applied
        if isinstance(call, DeleteRecord):
            self._check_collectable(call)
            if call.keep is not None:
                return storage.keep(call.log, call.txn, call.keep, self.now_ms)
            return storage.delete(call.log, call.txn)
        if isinstance(call, ReadRecord):
            return storage.read(call.log, call.txn)
        page = storage.scan_unfinished(call.log, call.after, call.limit)
        if self.schedule.short_scans and self._scan_rng.random() < SHORT_SCAN_PROBABILITY:
            return storage.stopped_short(call.log, call.after, page, self._scan_rng)
        return page

    # -- manual resolve ---------------------------------------------------------------------------
    def _start_resolve(self, index: int) -> None:
        txn = self.txns[self.schedule.resolves[index].txn_index]
        aim = bool(self.plans[txn].writes) and zlib.crc32(f"{self.schedule.seed}/{index}/aim".encode()) % 2 == 0
        if aim and self.now_ms < FAULTS_END_MS and not self._voted_undecided(txn):
            # Half the resolves wait for the moment they can write: a yes vote of the transaction
            # logged and no decision yet (by faults end at latest), when the coordinator may still
            # run it, and its records may be collected soon after.
            self._push(self.now_ms + 1, _RESOLVE, index)
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
                self._push(self.now_ms + effect.duration_ms, _RETURN,
                           (f"~resolve/{index}", 0, TimerFired(effect.timer), frozenset(), 0))
            elif isinstance(effect, AskCoordinator):
                # The question reaches the coordinator's node after a message's delay, or, one in
                # four, about as late as its answer may come (a slow peer, or the asking process
                # suspended): the window may close meanwhile, which the resolver must notice.
                late = self.rng.random() < 0.25
                serve_ms = self.rng.randint(1, TIMEOUT_MS_EXECUTE if late else self.schedule.delay_ms_max)
                self._push(self.now_ms + serve_ms, _ASKED, (index, effect))
            elif isinstance(effect, LogOnce):
                writes.append(effect)
            else:
                assert isinstance(effect, ReadRecord), effect
                self._call(f"~resolve/{index}", 0, effect, frozenset())
        if writes:
            # The driver's rule (cornus.protocol.resolve): the writes leave only before the window
            # ends. One round in four, its process is suspended first, up to a window's length.
            pause_ms = self.rng.randint(1, resolver.window_ms) if self.rng.random() < 0.25 else 0
            self._push(self.now_ms + pause_ms, _RESOLVE_WRITES, (index, tuple(writes)))
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
        self._push(self.now_ms + answer_ms, _RETURN,
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

    # -- checks made during the run -----------------------------------------------------------------
    # -- partition moves -------------------------------------------------------------------------------
    def _move(self, move: Move) -> None:
        """The partition's owner lost its lease: it drops the partition (its machines, timers and
        executions; calls in flight still land, fenced ones refused once it is taken), at once or,
        with `move.lapse_ms`, once it notices (`_lapse_ends`), and the node `move.to` takes it
        (`_take`) at once or, after a gap, `move.gap_ms` later."""
        old, new = self.owner_of(move.partition), self.nodes[move.to]
        if move.after and self.now_ms + 1 + move.gap_ms <= FAULTS_END_MS and (
                old is None or not self._moved_before(move) or not self._worst_moment(move, old)):
            # Waiting for its moment (found by review: it waits through an earlier move's gap
            # too, and after that move, which may itself have waited past this one's time).
            self._push(self.now_ms + 1, _MOVE, move)
            return
        if old is None:
            return  # nobody holds it (the gap of an earlier move, its take held up): no lease to lapse
        self._moves_done.add(move)
        if not move.gap_ms and not new.ready:
            return  # a node that is down or recovering takes nothing
        partition = move.partition
        old.partitions = tuple(p for p in old.partitions if p != partition)
        self._unpark(lambda k: k[0] == old.name and k[2] == partition, "the partition was lost")
        if move.lapse_ms and old.alive and old.core is not None:
            old.lapsed[partition] = []
            self._push(self.now_ms + move.lapse_ms, _LAPSE_END, (old.name, old.incarnation, partition))
        else:
            self._drop(old, partition)
        if move.gap_ms:
            if self.trace is not None:
                self.trace.append(f"{self.now_ms:6d} DROP {partition} by {old.name}: nobody holds it for "
                                  f"{move.gap_ms} ms")
            self.owner[partition] = None
            self._push(self.now_ms + move.gap_ms, _TAKE, move)
            return
        self._take(move, old.name)

    def _moved_before(self, move: Move) -> bool:
        """Whether every move of the partition listed before `move` has had its turn (ran, or found
        nothing to move)."""
        earlier = self.schedule.moves[: self.schedule.moves.index(move)]
        return all(m in self._moves_done for m in earlier if m.partition == move.partition)

    def _worst_moment(self, move: Move, old: Node) -> bool:
        """Whether now is the moment a Move's `after` waits for."""
        if move.after == "vote":
            page = self.storage.scan_unfinished(LogId.partition(move.partition), "", len(self.txns) + 1)
            return any(record.state is TxnState.VOTE_YES for record in page.records)
        if move.after == "read":
            return self._slow_reads_out[move.partition] > 0
        # A moment while a scan is out, any one: the last page's answer is what finishes the
        # recovery (not drawn from `rng`, whose draws the rest of the run keeps).
        assert move.after == "scan", move
        moment = zlib.crc32(f"{self.schedule.seed}/{self.now_ms}".encode())
        return bool(old.scans_out[move.partition]) and moment % 3 == 0

    def _drop(self, node: Node, partition: str) -> None:
        """`node` drops `partition`'s host: its machines, timers and executions go; answers to its
        calls still in flight are dropped (`_tenure`)."""
        node.tables.pop(partition, None)
        node.epochs.pop(partition, None)
        node.lapsed.pop(partition, None)
        node.scans_out.pop(partition, None)
        node.tenures[partition] = node.tenures.get(partition, 0) + 1
        if node.alive and node.core is not None:
            node.core.drop_partition(partition)
            # The runtime cancels the timers of a dropped host's machines and of its recovery.
            for timer in [t for t in node.timers if t.owner in (partition, recovery_owner(partition))]:
                del node.timers[timer]

    def _lapsed(self, node: Node, host: str) -> list[tuple[Event, frozenset[tuple[int, int]]]] | None:
        """The answers held for `host` if it is the host of a partition whose lease lapsed here."""
        if not node.lapsed or node.core is None:
            return None
        partition = node.core.partition_of(host)
        return None if partition is None else node.lapsed.get(partition)

    def _lapse_ends(self, name: str, incarnation: int, partition: str) -> None:
        """The node notices the lease it lost: as a process back from a stall, it first runs what
        its host heard meanwhile (the runtime's loop runs the I/O that piled up before the
        ownership tick), which may do only what a host without a lease may; then it drops it."""
        node = self.process(name, incarnation)
        if node is None or partition not in node.lapsed:
            return
        if self.trace is not None:
            self.trace.append(f"{self.now_ms:6d} {name:>3} notices its lease on {partition} ended")
        held = node.lapsed[partition]
        while held and node.alive and node.incarnation == incarnation:
            event, path = held.pop(0)
            self._feed(node, event, path)
        if node.alive and node.incarnation == incarnation:
            self._drop(node, partition)

    def _take(self, move: Move, old: str = "nobody") -> None:
        """The node `move.to` takes the partition in a higher epoch, so that storage refuses its
        old owner's fenced writes from now on, and recovers its log before serving it; one that is
        down or recovering at the end of a gap takes it once it is ready."""
        partition, new = move.partition, self.nodes[move.to]
        if not new.ready:
            self._push(self.now_ms + TAKE_RETRY_MS, _TAKE, move)
            return
        if partition in new.lapsed:
            # Its lease lapsed here and it takes the partition again: it noticed the lapse first.
            self._lapse_ends(new.name, new.incarnation, partition)
            if not new.ready:
                self._push(self.now_ms + TAKE_RETRY_MS, _TAKE, move)
                return
        self.epoch[partition] += 1
        self.owner[partition] = new.name
        new.partitions = (*new.partitions, partition)
        new.tables[partition] = PartitionExecutions(partition, redo, self.lock_policy)
        new.epochs[partition] = self.epoch[partition]
        if self.trace is not None:
            self.trace.append(f"{self.now_ms:6d} MOVE {partition} from {old} to {new.name}")
        assert new.core is not None
        for effect in new.core.add_partition(partition):
            self._execute(new, effect)
            if not new.alive:
                return

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
            if isinstance(machine, CoordinatorLogParticipant) and machine.phase is Phase.VOTED:
                # Recovery rebuilds a vote from the coordinator's redo record whenever the
                # partition's own log holds no decision, which is also what an abort leaves; such a
                # machine asks, learns ABORT and writes nothing.
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
