"""Collecting what a crash left behind, as a pure machine (docs/sweeper-design.md, step 5).

Garbage collection is its coordinator's job, `gc_grace_ms` after the decision. A coordinator killed
within the grace, or a Cornus transaction its participants finished by termination, leaves decided
records nobody deletes. One Sweeper per log (an owned partition's, or the node's own coordinator
log) walks that log's finished records (LogStore.scan_finished_page) every `interval_ms` and puts
a tombstone (never a plain delete) over each one no reader can still need:

- only records older than `age_ms` by the wall clock at which the scan left (`sent_ms`, which the
  driver reads: the core reads no clock), plus the clock slack; the pass stops at the first id
  whose begin is later than that (ids start with their begin);
- never one a machine of this node still runs (`runs`);
- an ABORT, in any log: its tombstone (an emptied ABORT slot can only be filled with ABORT again,
  and late votes land before a record is that old);
- a COMMIT (applied: the scan returns no other): only once every other participant's record has
  been read and none is VOTE_YES (that participant may still terminate, and would read this log)
  or unreadable; an ABORT there is a conflict, counted and never touched; a coordinator-log
  transaction also waits until its coordinator's record is gone, ABORT or a tombstone (that
  coordinator's own collection deletes its record first, and recovery reads it).

A tombstone is kept `tombstone_keep_ms`: at least `outcome_keep_ms` (the status call reads it) and
`gc_grace_ms` plus the late-write window (every call in flight when the sweeper read lands on it).
`age_ms` must outlast everything that may still write the slot (`sweep_age_ms_min`): a Cornus
coordinator's termination (`coordinator_terminate_ms_max`, from its start, which may come two
vote timeouts after its machine's, and a request's window after the begin), a late vote
(status.late_vote_ms), a manual resolve, each with its deadline, late window and slack; and the
grace, so that the tombstone outlasts what the status call counts on (status.kept_window_ms).

Bounded: `page_count_max` records a page, `pages_per_pass_max` pages a pass, one page's calls in
flight at once; storage that does not answer ends the pass (the next one tries again).

Status (step 7): NodeCore runs a sweeper per recovered partition and one for its own coordinator
log when handed a SweepConfig, and the simulator explores them (cornus/sim/sweeps.py: every
tombstone checked by an oracle against every record, machine and call of the world, a leak check
at the end; tests/protocol/test_sweep_schedules.py). It found the age rule short twice, mended in
`sweep_age_ms_min`. A runtime node sweeps every sweep_interval_ms (RuntimeLimits: a minute by
default; tests/cluster/test_sweeper.py, and every test cluster sweeps each second).
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from cornus.protocol import txn_ids
from cornus.protocol.backoff import JitterSource
from cornus.protocol.config import Protocol, ProtocolConfig
from cornus.protocol.effects import DeleteRecord, ReadRecord, ScanFinished, StartTimer, Timer
from cornus.protocol.events import DeleteReturned, FinishedScanned, RecordRead, StorageUnreachable, TimerFired
from cornus.protocol.status import late_vote_ms, requests_window_ms
from storage_adapters.contract import (
    SCAN_PAGE_COUNT_MAX,
    TOMBSTONE_KEEP_MS_MAX,
    LogId,
    LogKind,
    Record,
    Tombstone,
    TxnState,
)

# The owners of sweepers' storage calls and timers: '~' cannot appear in a partition or node id.
SWEEP = "~sweep"
SWEEP_TIMER = "sweep"
# How far a pass's start may move from its interval, either way, so that the nodes' sweepers of
# one deployment do not read storage in step.
INTERVAL_JITTER_SHARE = 0.2


def sweeper_owner(log: LogId) -> str:
    return f"{SWEEP}:{log.key}"


def sweep_age_ms_min(config: ProtocolConfig, timeout_ms_request: int) -> int:
    """The youngest a record may be when a sweeper collects it: past the last write that may
    still reach its slot, and past what the status call counts on.

    A Cornus coordinator's termination: its machine starts a one-shot's request window after the
    begin at the latest (status.requests_window_ms: a client may send its id again to another
    process of the node), and before any record of an interactive transaction exists; it starts
    asking the logs at most two vote timeouts later (its read-only partitions', then its votes'),
    and `coordinator_terminate_ms_max` counts from there (CornusCoordinator._terminate); its last
    call lands a storage deadline, the slack and the late window after it left. A manual resolve
    (a read and a write, a deadline each). A one-shot's latest vote (status.late_vote_ms). And the
    grace: the status call tells "not known" of a transaction that left no record once
    status.kept_window_ms passed since its begin, the grace and outcome_keep_ms, so the
    tombstone, kept at least outcome_keep_ms, must not be written before the grace passed
    (found by the simulator, step 6: with a bound W below the grace, a committed transaction
    was swept 350 ms after its begin, and the status call said "not known" of it; and, on fast
    storage, a coordinator still terminated when its records were swept: W had been counted from
    the record, not from the termination's start). Then the slack twice more, for the clocks that
    stamped the record and read the scan's time."""
    d, s, late = config.storage_deadline_ms, config.clock_slack_ms, config.late_write_window_ms
    terminations_ms = (requests_window_ms(timeout_ms_request, s) + 2 * config.timeout_ms_votes
                       + config.coordinator_terminate_ms_max + 2 * d + s + late)
    return max(terminations_ms, late_vote_ms(timeout_ms_request, config), config.gc_grace_ms) + 2 * s


def tombstone_keep_ms(config: ProtocolConfig) -> int:
    """How long a sweeper's tombstone stays: the status call reads it for `outcome_keep_ms`, and a
    call in flight when the sweeper read may land up to the grace and the late window after."""
    keep_ms = max(config.outcome_keep_ms, config.gc_grace_ms + config.late_write_window_ms)
    assert keep_ms <= TOMBSTONE_KEEP_MS_MAX, keep_ms
    return keep_ms


@dataclass(frozen=True, slots=True)
class SweepConfig:
    """How a node sweeps: the runtime's NodeConfig.sweep_config (from RuntimeLimits' sweep_*
    settings), the simulator's sweep schedules. NodeCore sweeps only when handed one, and refuses
    one whose age is below `sweep_age_ms_min` (`sweep_age_problem`)."""

    age_ms: int  # at least sweep_age_ms_min
    interval_ms: int  # between passes (jittered by INTERVAL_JITTER_SHARE)
    # The longest a one-shot's request may wait at its owner (the runtime's timeout_ms_request):
    # what the age is checked against, since a vote of it may land that late (status.late_vote_ms).
    timeout_ms_request: int
    page_count_max: int = 100  # records a scan page asks for
    pages_per_pass_max: int = 10

    def __post_init__(self) -> None:
        assert self.age_ms > 0 and self.interval_ms > 0 and self.timeout_ms_request > 0
        assert 1 <= self.page_count_max <= SCAN_PAGE_COUNT_MAX and self.pages_per_pass_max >= 1


def sweep_age_problem(sweep: SweepConfig, config: ProtocolConfig) -> str:
    """Why `sweep` may not run beside `config` ("" if it may): an age below `sweep_age_ms_min`
    would collect a record some write may still reach."""
    age_ms_min = sweep_age_ms_min(config, sweep.timeout_ms_request)
    if sweep.age_ms < age_ms_min:
        return (f"sweep age_ms {sweep.age_ms} is below {age_ms_min}: a write of a transaction that old may still "
                "land (a coordinator's termination, a late vote, a manual resolve)")
    return ""


class Skipped(enum.StrEnum):
    """Why a finished record was left for a later pass (or, a conflict, for good)."""

    RUNNING = "running"  # a machine of this node runs it
    YOUNG = "young"  # not older than age_ms yet
    VOTED = "voted"  # another participant still holds VOTE_YES
    UNREADABLE = "unreadable"  # a record it needs read did not answer
    COORDINATOR = "coordinator"  # a coordinator-log coordinator's record is still live
    CONFLICT = "conflict"  # COMMIT here, ABORT there: never touched


SweepEffect = ScanFinished | ReadRecord | DeleteRecord | StartTimer
SweepEvent = FinishedScanned | RecordRead | DeleteReturned | TimerFired


@dataclass(slots=True)
class _Pending:
    """A COMMIT whose other records are being read: what they hold so far."""

    reads: set[LogId]
    found: list[Record | StorageUnreachable | None] = field(default_factory=list)
    coordinator_live: bool = False  # a coordinator-log coordinator's record not collected yet


class Sweeper:
    def __init__(self, owner: str, log: LogId, config: ProtocolConfig, sweep: SweepConfig, jitter: JitterSource,
                 *, runs: Callable[[str], bool], counters: Counter[str] | None = None) -> None:
        assert log.kind in (LogKind.PARTITION, LogKind.COORDINATOR), log
        self.owner = owner
        self.log = log
        self.config = config
        self.sweep = sweep
        self._jitter = jitter
        self._runs = runs
        self._keep_ms = tombstone_keep_ms(config)
        # Shared by the node's sweepers when given (NodeCore's), so that a dropped one's counts stay.
        self.counters: Counter[str] = Counter() if counters is None else counters
        self._pages = 0  # of the pass under way
        self._resume: str | None = None  # where the pass's next page starts (None: the pass ends)
        self._pending: dict[str, _Pending] = {}
        self._deletes: set[str] = set()  # tombstones in flight
        self._scanning = False

    @property
    def idle(self) -> bool:
        """No call of a pass is out."""
        return not (self._scanning or self._pending or self._deletes)

    def start(self) -> list[SweepEffect]:
        return [self._next_pass()]

    def handle(self, event: SweepEvent) -> list[SweepEffect]:
        if isinstance(event, TimerFired):
            assert event.timer == self._timer() and self.idle, (event, self.idle)
            self._pages = 0
            return self._scan("")
        if isinstance(event, FinishedScanned):
            return self._on_page(event)
        if isinstance(event, RecordRead):
            return self._on_read(event)
        assert isinstance(event, DeleteReturned) and event.call.txn in self._deletes, event
        self._deletes.discard(event.call.txn)
        self.counters["swept" if not isinstance(event.result, StorageUnreachable) else "unanswered"] += 1
        if isinstance(event.result, StorageUnreachable):
            self._resume = None  # storage does not answer: the next pass tries again
        return self._page_done()

    # -- a pass ------------------------------------------------------------------------------------
    def _timer(self) -> Timer:
        return Timer(self.owner, "", SWEEP_TIMER)

    def _next_pass(self) -> StartTimer:
        share = INTERVAL_JITTER_SHARE * (2 * self._jitter.random() - 1)
        return StartTimer(self._timer(), max(1, round(self.sweep.interval_ms * (1 + share))))

    def _scan(self, after: str) -> list[SweepEffect]:
        assert self.idle and self._pages < self.sweep.pages_per_pass_max
        self._pages += 1
        self._scanning = True
        return [ScanFinished(self.owner, self.log, after, self.sweep.page_count_max)]

    def _on_page(self, event: FinishedScanned) -> list[SweepEffect]:
        assert self._scanning and event.call.owner == self.owner, event
        self._scanning = False
        if isinstance(event.result, StorageUnreachable):
            self.counters["scans_unanswered"] += 1
            return [self._next_pass()]
        page = event.result
        self._resume = page.resume_after
        young_after_ms = event.sent_ms - self.sweep.age_ms - self.config.clock_slack_ms
        effects: list[SweepEffect] = []
        for record in page.records:
            if txn_ids.begin_ms_of(record.txn) > young_after_ms:
                # Ids begin with their begin time: the rest of the log is younger still. (An id
                # of no begin, 0, sorts first and is judged by its record's time alone.)
                self._skip(Skipped.YOUNG)
                self._resume = None
                break
            effects += self._judge(record, young_after_ms)
        return effects + self._page_done()

    def _judge(self, record: Record, young_after_ms: int) -> list[SweepEffect]:
        assert record.log == self.log and record.state.is_decision, record
        if self._runs(record.txn):
            return self._skip(Skipped.RUNNING)
        if record.created_at_ms > young_after_ms:
            return self._skip(Skipped.YOUNG)
        if record.state is TxnState.ABORT:
            return self._tombstone(record.txn, TxnState.ABORT)
        assert self.log.kind is LogKind.PARTITION and record.applied, f"a finished scan returned {record}"
        reads = {LogId.partition(p) for p in record.body.participants if LogId.partition(p) != self.log}
        if txn_ids.protocol_of(record.txn) is Protocol.COORDINATOR_LOG:
            if not record.body.coordinator:
                return self._skip(Skipped.UNREADABLE)
            reads.add(LogId.coordinator(record.body.coordinator))
        if not reads:
            return self._tombstone(record.txn, TxnState.COMMIT)
        assert record.txn not in self._pending, record.txn
        self._pending[record.txn] = _Pending(set(reads))
        return [ReadRecord(self.owner, log, record.txn) for log in sorted(reads, key=lambda log: log.key)]

    def _on_read(self, event: RecordRead) -> list[SweepEffect]:
        pending = self._pending.get(event.call.txn)
        assert pending is not None and event.call.log in pending.reads, event
        pending.reads.discard(event.call.log)
        result = event.result
        if (event.call.log.kind is LogKind.COORDINATOR and isinstance(result, Record)
                and result.state is not TxnState.ABORT and not result.applied):
            # Its redo record or its live COMMIT (a COMMIT reads as applied only as a tombstone:
            # a coordinator's own never is applied): its collection, which goes first, is to come.
            pending.coordinator_live = True
        else:
            pending.found.append(result)
        if pending.reads:
            return []
        del self._pending[event.call.txn]
        verdict = _commit_verdict(pending)
        effects = self._skip(verdict) if verdict is not None else self._tombstone(event.call.txn, TxnState.COMMIT)
        return effects + self._page_done()

    def _tombstone(self, txn: str, decision: TxnState) -> list[SweepEffect]:
        assert txn not in self._deletes, txn
        self._deletes.add(txn)
        return [DeleteRecord(self.owner, self.log, txn, Tombstone(decision, self._keep_ms))]

    def _skip(self, why: Skipped) -> list[SweepEffect]:
        self.counters[f"skipped_{why.value}"] += 1
        return []

    def _page_done(self) -> list[SweepEffect]:
        """Once a page's calls are all in: its next page, or the next pass."""
        if not self.idle:
            return []
        if self._resume is not None and self._pages < self.sweep.pages_per_pass_max:
            return self._scan(self._resume)
        self._resume = None
        return [self._next_pass()]


def _commit_verdict(pending: _Pending) -> Skipped | None:
    """Why a COMMIT may not be swept yet, given the other records of its transaction as read (a
    record gone was collected); None: it may."""
    if any(isinstance(result, StorageUnreachable) for result in pending.found):
        return Skipped.UNREADABLE
    states = {result.state for result in pending.found if isinstance(result, Record)}
    if TxnState.ABORT in states:
        return Skipped.CONFLICT
    if TxnState.VOTE_YES in states:
        return Skipped.VOTED
    if pending.coordinator_live:
        return Skipped.COORDINATOR
    return None
