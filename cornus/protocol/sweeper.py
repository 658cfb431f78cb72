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
flight at once; storage that does not answer ends the pass (the next one tries again). And the
node's sweepers together by `calls_per_s_max` (SweepBudget, shared through NodeCore): one page of
any of them at a time, and none before the calls already made are paid for at that rate.

Each pass leaves `backlog_records`: the records older than the age it read and did not sweep (the
gauge an operator watches for sweeping that falls behind).

Status (step 7): NodeCore runs a sweeper per recovered partition and one for its own coordinator
log when handed a SweepConfig, and the simulator explores them (cornus/sim/sweeps.py: every
tombstone checked by an oracle against every record, machine and call of the world, a leak check
at the end; tests/protocol/test_sweep_schedules.py). It found the age rule short twice, mended in
`sweep_age_ms_min`. A runtime node sweeps every sweep_interval_ms (RuntimeLimits: a minute by
default; tests/cluster/test_sweeper.py, and every test cluster sweeps each second).
"""

from __future__ import annotations

import enum
from collections import Counter, deque
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
# The owner of the node's sweep budget timer (SweepBudget): the node's own, not a partition's (no
# log key is a bare word: each has its kind's prefix), so that no partition's drop, lease gate or
# cancellation takes it with it: the sweepers still waiting count on it.
SWEEP_BUDGET = f"{SWEEP}:budget"
BUDGET_TIMER = "budget"
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
    # Storage calls (scans, reads, tombstones) all of a node's sweepers make a second, on average
    # (SweepBudget; RuntimeLimits.sweep_calls_per_s_max says why 200).
    calls_per_s_max: int = 200

    def __post_init__(self) -> None:
        assert self.age_ms > 0 and self.interval_ms > 0 and self.timeout_ms_request > 0
        assert 1 <= self.page_count_max <= SCAN_PAGE_COUNT_MAX and self.pages_per_pass_max >= 1
        assert self.calls_per_s_max >= 1, self.calls_per_s_max


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


class SweepBudget:
    """The node's sweepers' storage calls, at `calls_per_s_max` a second on average: one page of
    any of them at a time, and a page starts only once every call made before it is paid for, a
    call per 1/calls_per_s_max s, by the budget's timer (the core reads no clock: time passes for
    it only as timers fire). So in any t seconds the node's sweepers make at most
    calls_per_s_max * t calls, plus one page's (its scan, a read of each other participant's
    record and a tombstone per record: some 200 for a page of 100 two-partition records).

    Why this and not a token bucket per sweeper or a pause per page alone: a bucket needs a clock
    to refill, and a pause each sweeper takes after its own page leaves every sweeper's first page
    at once (a node holding many partitions after a long outage starts them all within a
    fifth of an interval); a delay per page proportional to its calls (calls / rate) is the
    bound only if the pages are one at a time, so the budget is both. The pay starts as the calls
    leave (not once the page is over): a page waiting on storage pays meanwhile.

    Waiting costs nothing in storage: a sweeper that waits holds no call (it has not scanned), and
    goes in turn (first come, first served: `_grant` asserts that none is passed over). A
    sweeper whose partition is dropped leaves at once (`leave`, which emits nothing: the runtime
    and the simulator drop a partition without effects); what it spent stays owed. So that its
    turn is never lost, the budget's timer is out whenever a sweeper waits: paying what is owed,
    or, with nothing owed and a page out, watching every `watch_ms` whether that page's sweeper
    left (`_check` asserts it)."""

    def __init__(self, calls_per_s_max: int, watch_ms: int) -> None:
        assert calls_per_s_max >= 1 and watch_ms >= 1, (calls_per_s_max, watch_ms)
        self.calls_per_s_max = calls_per_s_max
        self.watch_ms = watch_ms
        self.holder: Sweeper | None = None  # whose page is out
        self.owed_calls = 0  # made and not yet paid for
        # What the timer out pays when it fires (0: it only watches); None: no timer out.
        self._paying_calls: int | None = None
        # Who waits for a page, in turn, each with the grants made when it came and how many were
        # ahead of it then.
        self._waiting: deque[tuple[Sweeper, int, int]] = deque()
        self.grants = 0

    @property
    def timer(self) -> Timer:
        return Timer(SWEEP_BUDGET, "", BUDGET_TIMER)

    def waits(self, sweeper: Sweeper) -> bool:
        return any(waiting is sweeper for waiting, _, _ in self._waiting)

    def ask(self, sweeper: Sweeper) -> list[SweepEffect]:
        """`sweeper` wants to read a page: its scan now if nobody is before it, else it waits."""
        assert sweeper is not self.holder and not self.waits(sweeper), sweeper.owner
        ahead = len(self._waiting) + (self.holder is not None)
        self._waiting.append((sweeper, self.grants, ahead))
        if self.holder is not None or self.owed_calls:
            sweeper.counters["waited_for_budget"] += 1
        return self._advance()

    def spend(self, sweeper: Sweeper, calls: int) -> list[SweepEffect]:
        """The page out makes `calls` more storage calls."""
        assert sweeper is self.holder and calls >= 1, (sweeper.owner, calls)
        self.owed_calls += calls
        return self._arm()

    def release(self, sweeper: Sweeper) -> list[SweepEffect]:
        """`sweeper`'s page is over: every call of it answered."""
        assert sweeper is self.holder, sweeper.owner
        self.holder = None
        return self._advance()

    def leave(self, sweeper: Sweeper) -> None:
        """`sweeper` is gone (its partition dropped), waiting or with its page out: its turn goes
        to the next at the budget's next timer, which is out whenever anyone waits."""
        if self.holder is sweeper:
            self.holder = None
        self._waiting = deque(item for item in self._waiting if item[0] is not sweeper)
        self._check()

    def fired(self) -> list[SweepEffect]:
        """The budget's timer: what it was started for is paid."""
        assert self._paying_calls is not None, "a budget timer that was not started"
        self.owed_calls -= self._paying_calls
        assert self.owed_calls >= 0, self.owed_calls
        self._paying_calls = None
        return self._advance()

    def _advance(self) -> list[SweepEffect]:
        effects = self._grant() if self.holder is None and not self.owed_calls and self._waiting else []
        effects += self._arm()
        self._check()
        # Nobody waits while the turn is free (after a `leave` one may, until the timer fires).
        assert not (self._waiting and self.holder is None and not self.owed_calls), "a sweeper waits for nothing"
        return effects

    def _grant(self) -> list[SweepEffect]:
        sweeper, grants_when_asked, ahead = self._waiting.popleft()
        # First come, first served: only those ahead of it when it asked went before it.
        assert self.grants - grants_when_asked <= ahead, (sweeper.owner, self.grants, grants_when_asked, ahead)
        self.grants += 1
        self.holder = sweeper
        return sweeper.granted()

    def _arm(self) -> list[SweepEffect]:
        if self._paying_calls:
            return []  # what was spent since it started is paid by the next one
        if self.owed_calls:
            # Replaces a watch, if one is out (a timer started again restarts).
            self._paying_calls = self.owed_calls
            return [StartTimer(self.timer, -(-self.owed_calls * 1000 // self.calls_per_s_max))]
        if self._waiting and self._paying_calls is None:
            # Nothing owed, a page out, someone waiting: its sweeper may leave without a word.
            self._paying_calls = 0
            return [StartTimer(self.timer, self.watch_ms)]
        return []

    def _check(self) -> None:
        # Nobody waits without a timer out that will hand the turn on: none starves.
        assert not self._waiting or self._paying_calls is not None, "a sweeper waits with no timer out"


class Sweeper:
    def __init__(self, owner: str, log: LogId, config: ProtocolConfig, sweep: SweepConfig, jitter: JitterSource,
                 *, runs: Callable[[str], bool], counters: Counter[str] | None = None,
                 budget: SweepBudget | None = None) -> None:
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
        # The node's (NodeCore's, shared by its sweepers); None, for the rule's own tests: unpaced.
        self.budget = budget
        self._pages = 0  # of the pass under way
        self._resume: str | None = None  # where the pass's next page starts (None: the pass ends)
        self._pending: dict[str, _Pending] = {}
        self._deletes: set[str] = set()  # tombstones in flight
        self._scanning = False
        self._asked_after: str | None = None  # where the page it waits for the budget for starts
        # Records older than the age the last finished pass read and left (skipped for a reason
        # but their youth, or their tombstone unanswered), and those of the pass under way.
        self.backlog_records = 0
        self._pass_backlog = 0
        self._storage_failed = False  # the pass under way ends where storage did not answer

    @property
    def idle(self) -> bool:
        """No call of a pass is out."""
        return not (self._scanning or self._pending or self._deletes)

    @property
    def waiting(self) -> bool:
        """It waits for the budget to read its next page (no call out)."""
        return self._asked_after is not None

    def start(self) -> list[SweepEffect]:
        return [self._next_pass()]

    def handle(self, event: SweepEvent) -> list[SweepEffect]:
        if isinstance(event, TimerFired):
            assert event.timer == self._timer() and self.idle and not self.waiting, (event, self.idle)
            self._pages = 0
            self._pass_backlog = 0
            self._storage_failed = False
            return self._ask("")
        if isinstance(event, FinishedScanned):
            return self._on_page(event)
        if isinstance(event, RecordRead):
            return self._on_read(event)
        assert isinstance(event, DeleteReturned) and event.call.txn in self._deletes, event
        self._deletes.discard(event.call.txn)
        self.counters["swept" if not isinstance(event.result, StorageUnreachable) else "unanswered"] += 1
        if isinstance(event.result, StorageUnreachable):
            self._pass_backlog += 1
            self._storage_failed = True
            self._resume = None  # storage does not answer: the next pass tries again
        return self._page_done()

    def granted(self) -> list[SweepEffect]:
        """The budget's turn: the page it waited for."""
        after = self._asked_after
        assert after is not None and self.idle, (self.owner, after)
        self._asked_after = None
        return self._scan(after)

    # -- a pass ------------------------------------------------------------------------------------
    def _timer(self) -> Timer:
        return Timer(self.owner, "", SWEEP_TIMER)

    def _next_pass(self) -> StartTimer:
        share = INTERVAL_JITTER_SHARE * (2 * self._jitter.random() - 1)
        return StartTimer(self._timer(), max(1, round(self.sweep.interval_ms * (1 + share))))

    def _end_pass(self, *, whole: bool) -> StartTimer:
        """`whole`: the pass read what it was to (the log's end, a young record, its page bound),
        and its count replaces the last one. One that storage cut short read only a part of what
        the last whole one did: an outage must not read as a backlog cleared."""
        self.backlog_records = self._pass_backlog if whole else max(self.backlog_records, self._pass_backlog)
        return self._next_pass()

    def _ask(self, after: str) -> list[SweepEffect]:
        assert self.idle and not self.waiting and self._pages < self.sweep.pages_per_pass_max
        if self.budget is None:
            return self._scan(after)
        self._asked_after = after
        return self.budget.ask(self)

    def _spend(self, calls: int) -> list[SweepEffect]:
        return self.budget.spend(self, calls) if self.budget is not None else []

    def _scan(self, after: str) -> list[SweepEffect]:
        assert self.idle and self._pages < self.sweep.pages_per_pass_max
        self._pages += 1
        self._scanning = True
        return [ScanFinished(self.owner, self.log, after, self.sweep.page_count_max), *self._spend(1)]

    def _on_page(self, event: FinishedScanned) -> list[SweepEffect]:
        assert self._scanning and event.call.owner == self.owner, event
        self._scanning = False
        if isinstance(event.result, StorageUnreachable):
            self.counters["scans_unanswered"] += 1
            return [*self._release(), self._end_pass(whole=False)]
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
        calls: list[SweepEffect] = [ReadRecord(self.owner, log, record.txn)
                                    for log in sorted(reads, key=lambda log: log.key)]
        return calls + self._spend(len(calls))

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
        return [DeleteRecord(self.owner, self.log, txn, Tombstone(decision, self._keep_ms)), *self._spend(1)]

    def _skip(self, why: Skipped) -> list[SweepEffect]:
        self.counters[f"skipped_{why.value}"] += 1
        if why is not Skipped.YOUNG:
            self._pass_backlog += 1  # old, and left
        return []

    def _release(self) -> list[SweepEffect]:
        return self.budget.release(self) if self.budget is not None else []

    def _page_done(self) -> list[SweepEffect]:
        """Once a page's calls are all in: the budget's turn goes on (the next page, its own or
        another sweeper's, waits for it), then its next page, or the next pass."""
        if not self.idle:
            return []
        effects = self._release()
        if self._resume is not None and self._pages < self.sweep.pages_per_pass_max:
            return effects + self._ask(self._resume)
        if self._resume is not None:
            # Cut short by its bound with the log going on: what lies past it is not counted in
            # the backlog (reading it would cost the calls the bound saves), but this is.
            self.counters["passes_cut_short"] += 1
        self._resume = None
        return [*effects, self._end_pass(whole=not self._storage_failed)]


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
