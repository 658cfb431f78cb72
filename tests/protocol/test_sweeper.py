"""The sweeper's rule (cornus/protocol/sweeper.py, docs/sweeper-design.md step 5), as a pure
machine: which finished records a pass collects, which it leaves and why, and how a pass pages and
ends. Its storage calls are answered here by hand."""

from __future__ import annotations

import random

from cornus.protocol.config import ProtocolConfig
from cornus.protocol.effects import DeleteRecord, ReadRecord, ScanFinished, StartTimer, Timer
from cornus.protocol.events import DeleteReturned, FinishedScanned, RecordRead, StorageUnreachable, TimerFired
from cornus.protocol.status import kept_window_ms, late_vote_ms, requests_window_ms
from cornus.protocol.sweeper import (
    SWEEP_BUDGET,
    SWEEP_TIMER,
    SweepBudget,
    SweepConfig,
    Sweeper,
    sweep_age_ms_min,
    sweeper_owner,
    tombstone_keep_ms,
)
from storage_adapters.contract import LogId, Record, RecordBody, ScanPage, Tombstone, TxnState

CONFIG = ProtocolConfig()
AGE_MS = sweep_age_ms_min(CONFIG, 2_000)
NOW_MS = 10_000_000
OLD_MS = NOW_MS - AGE_MS - CONFIG.clock_slack_ms - 1  # old enough, by one ms
YOUNG_MS = OLD_MS + 2
LOG = LogId.partition("p0")
OWNER = sweeper_owner(LOG)
KEEP_MS = tombstone_keep_ms(CONFIG)


def _txn(begin_ms: int, number: int, tag: str = "cornus") -> str:
    return f"{begin_ms}.c0.x.{number}.{tag}"


def _record(txn: str, state: TxnState, *participants: str, coordinator: str = "c0") -> Record:
    begin_ms = int(txn.split(".", 1)[0])
    return Record(LOG, txn, state, RecordBody(participants or ("p0",), coordinator), applied=state is TxnState.COMMIT,
                  created_at_ms=begin_ms)


def _sweeper(runs: frozenset[str] = frozenset(), pages: int = 10) -> Sweeper:
    sweep = SweepConfig(age_ms=AGE_MS, interval_ms=60_000, timeout_ms_request=2_000, page_count_max=4,
                        pages_per_pass_max=pages)
    return Sweeper(OWNER, LOG, CONFIG, sweep, random.Random(1), runs=lambda txn: txn in runs)


def _pass(sweeper: Sweeper) -> ScanFinished:
    (timer,) = sweeper.start()
    assert isinstance(timer, StartTimer) and timer.timer == Timer(OWNER, "", SWEEP_TIMER)
    assert 0.8 * 60_000 <= timer.duration_ms <= 1.2 * 60_000
    (scan,) = sweeper.handle(TimerFired(timer.timer))
    assert scan == ScanFinished(OWNER, LOG, "", 4)
    return scan


def _tombstones(effects: list[object]) -> dict[str, TxnState]:
    return {e.txn: e.keep.decision for e in effects if isinstance(e, DeleteRecord) and e.keep is not None}


def _answer_deletes(sweeper: Sweeper, effects: list[object]) -> list[object]:
    out: list[object] = []
    for effect in effects:
        if isinstance(effect, DeleteRecord):
            out += sweeper.handle(DeleteReturned(effect, True))
    return out


def test_old_aborts_and_lone_commits_become_tombstones_and_the_rest_waits() -> None:
    running = _txn(OLD_MS, 3)
    sweeper = _sweeper(runs=frozenset({running}))
    scan = _pass(sweeper)
    aborted, committed, young = _txn(OLD_MS, 1), _txn(OLD_MS, 2), _txn(YOUNG_MS, 4)
    # The young one's begin is later than the cut: the pass ends with it (the rest is younger still).
    page = ScanPage((_record(aborted, TxnState.ABORT), _record(committed, TxnState.COMMIT),
                     _record(running, TxnState.ABORT), _record(young, TxnState.ABORT)), resume_after=young)
    effects = sweeper.handle(FinishedScanned(scan, page, NOW_MS))
    assert _tombstones(effects) == {aborted: TxnState.ABORT, committed: TxnState.COMMIT}
    assert all(e.keep == Tombstone(e.keep.decision, KEEP_MS) for e in effects if isinstance(e, DeleteRecord))
    assert sweeper.counters["skipped_running"] == 1 and sweeper.counters["skipped_young"] == 1
    rest = _answer_deletes(sweeper, effects)
    assert len(rest) == 1 and isinstance(rest[0], StartTimer), "the pass did not end at the young record"
    assert sweeper.idle and sweeper.counters["swept"] == 2


def test_a_record_created_late_for_an_old_begin_waits_too() -> None:
    sweeper = _sweeper()
    scan = _pass(sweeper)
    txn = _txn(OLD_MS, 1)
    late = Record(LOG, txn, TxnState.ABORT, RecordBody(("p0",), "c0"), created_at_ms=YOUNG_MS)
    effects = sweeper.handle(FinishedScanned(scan, ScanPage((late,), None), NOW_MS))
    assert _tombstones(effects) == {} and sweeper.counters["skipped_young"] == 1
    assert len(effects) == 1 and isinstance(effects[0], StartTimer)


def _commit_over_two(other: Record | StorageUnreachable | None, tag: str = "cornus",
                     coordinator: Record | StorageUnreachable | None = None) -> tuple[Sweeper, list[object]]:
    """A pass over one old COMMIT of p0 and p1; p1's record (and a coordinator-log coordinator's)
    answered as given: what follows."""
    sweeper = _sweeper()
    scan = _pass(sweeper)
    txn = _txn(OLD_MS, 1, tag)
    effects = sweeper.handle(FinishedScanned(scan, ScanPage((_record(txn, TxnState.COMMIT, "p0", "p1"),), None),
                                             NOW_MS))
    reads = {e.log: e for e in effects if isinstance(e, ReadRecord)}
    expected = {LogId.partition("p1")} | ({LogId.coordinator("c0")} if tag == "clog" else set())
    assert set(reads) == expected and all(e.txn == txn and e.owner == OWNER for e in reads.values())
    assert not _tombstones(effects), "a COMMIT swept before the other records were read"
    out: list[object] = []
    for log, read in reads.items():
        result = other if log.kind.value == "p" else coordinator
        out += sweeper.handle(RecordRead(read, result))
    return sweeper, out


def test_a_commit_is_swept_once_no_other_participant_holds_a_vote() -> None:
    for other in (None, Record(LogId.partition("p1"), "x", TxnState.COMMIT, applied=True),
                  Record(LogId.partition("p1"), "x", TxnState.COMMIT)):
        _, effects = _commit_over_two(other)
        assert list(_tombstones(effects).values()) == [TxnState.COMMIT], other


def test_a_commit_waits_while_a_participant_holds_its_vote_or_cannot_be_read_and_a_conflict_is_never_touched() -> None:
    for other, why in ((Record(LogId.partition("p1"), "x", TxnState.VOTE_YES), "voted"),
                       (StorageUnreachable("down"), "unreadable"),
                       (Record(LogId.partition("p1"), "x", TxnState.ABORT), "conflict")):
        sweeper, effects = _commit_over_two(other)
        assert not _tombstones(effects), why
        assert sweeper.counters[f"skipped_{why}"] == 1, (why, sweeper.counters)
        assert len(effects) == 1 and isinstance(effects[0], StartTimer), "the pass did not end"


def test_a_coordinator_log_commit_waits_for_its_coordinator_s_record_to_go() -> None:
    coordinator_log = LogId.coordinator("c0")
    live = Record(coordinator_log, "x", TxnState.COMMIT)
    redo = Record(coordinator_log, "x", TxnState.VOTE_YES)
    tombstone = Record(coordinator_log, "x", TxnState.COMMIT, applied=True)
    for coordinator, swept in ((live, False), (redo, False), (tombstone, True), (None, True)):
        sweeper, effects = _commit_over_two(None, "clog", coordinator)
        assert bool(_tombstones(effects)) is swept, coordinator
        assert swept or sweeper.counters["skipped_coordinator"] == 1, sweeper.counters


def test_a_pass_follows_its_pages_up_to_its_bound_and_ends_where_storage_does_not_answer() -> None:
    sweeper = _sweeper(pages=2)
    scan = _pass(sweeper)
    first = _txn(OLD_MS, 1)
    effects = sweeper.handle(FinishedScanned(scan, ScanPage((_record(first, TxnState.ABORT),), first), NOW_MS))
    (second_scan,) = _answer_deletes(sweeper, effects)
    assert second_scan == ScanFinished(OWNER, LOG, first, 4)
    # A page may be empty and not the last; the pass's bound ends it all the same.
    (timer,) = sweeper.handle(FinishedScanned(second_scan, ScanPage((), _txn(OLD_MS, 9)), NOW_MS))
    assert isinstance(timer, StartTimer) and sweeper.idle
    (scan,) = sweeper.handle(TimerFired(timer.timer))
    assert scan.after == ""
    (timer,) = sweeper.handle(FinishedScanned(scan, StorageUnreachable("down"), NOW_MS))
    assert isinstance(timer, StartTimer) and sweeper.counters["scans_unanswered"] == 1
    # A tombstone unanswered ends the pass too.
    (scan,) = sweeper.handle(TimerFired(timer.timer))
    effects = sweeper.handle(FinishedScanned(scan, ScanPage((_record(first, TxnState.ABORT),), first), NOW_MS))
    (delete,) = effects
    (timer,) = sweeper.handle(DeleteReturned(delete, StorageUnreachable("down")))
    assert isinstance(timer, StartTimer) and sweeper.counters["unanswered"] == 1


def test_the_age_outlasts_every_late_write_and_the_keep_every_reader() -> None:
    for config in (CONFIG, ProtocolConfig(late_write_window_ms=900_000, outcome_keep_ms=1_000_000),
                   ProtocolConfig(coordinator_terminate_ms_max=100_000),
                   ProtocolConfig(coordinator_terminate_ms_max=50, storage_deadline_ms=5, clock_slack_ms=20,
                                  gc_grace_ms=1_000, timeout_ms_votes=10_000, outcome_keep_ms=1)):
        age_ms = sweep_age_ms_min(config, 2_000)
        # A Cornus coordinator's termination starts up to two vote timeouts after its machine, which
        # starts up to a request's window after the begin, and W counts from there (found by the
        # simulator, step 6: the age counted W from the record).
        termination_ends_ms = requests_window_ms(2_000, config.clock_slack_ms) + 2 * config.timeout_ms_votes + (
            config.coordinator_terminate_ms_max)
        assert age_ms > termination_ends_ms + config.storage_deadline_ms + config.late_write_window_ms
        assert age_ms > late_vote_ms(2_000, config)
        # The status call counts on a record until kept_window_ms after the begin (found by the
        # simulator, step 6: a tombstone written before the grace went too soon).
        assert age_ms + config.outcome_keep_ms >= kept_window_ms(config) + config.clock_slack_ms
        keep_ms = tombstone_keep_ms(config)
        assert keep_ms >= config.outcome_keep_ms and keep_ms >= config.gc_grace_ms + config.late_write_window_ms


def test_a_pass_counts_the_old_records_it_leaves_as_its_backlog() -> None:
    """Sweeper.backlog_records (NodeCore sums them: the gauge cornus_sweeper_backlog_records): the
    records older than the age that its last pass read and left, whatever the reason; not the
    young ones, nor those swept. A pass storage cut short read less: the count stays."""
    running = _txn(OLD_MS, 3)
    sweeper = _sweeper(runs=frozenset({running}))
    scan = _pass(sweeper)
    aborted, committed, young = _txn(OLD_MS, 1), _txn(OLD_MS, 2), _txn(YOUNG_MS, 4)
    page = ScanPage((_record(aborted, TxnState.ABORT), _record(committed, TxnState.COMMIT, "p0", "p1"),
                     _record(running, TxnState.ABORT), _record(young, TxnState.ABORT)), resume_after=young)
    effects = sweeper.handle(FinishedScanned(scan, page, NOW_MS))
    (read,) = [e for e in effects if isinstance(e, ReadRecord)]
    assert sweeper.backlog_records == 0, "counted before its pass ended"
    effects = _answer_deletes(sweeper, effects)
    (timer,) = sweeper.handle(RecordRead(read, Record(LogId.partition("p1"), committed, TxnState.VOTE_YES)))
    assert isinstance(timer, StartTimer) and sweeper.counters["swept"] == 1
    assert sweeper.backlog_records == 2  # the running one, and the one whose other participant voted
    (scan,) = sweeper.handle(TimerFired(timer.timer))
    (timer,) = sweeper.handle(FinishedScanned(scan, StorageUnreachable("down"), NOW_MS))
    assert sweeper.backlog_records == 2, "an outage read as a backlog cleared"
    (scan,) = sweeper.handle(TimerFired(timer.timer))
    (timer,) = sweeper.handle(FinishedScanned(scan, ScanPage((_record(young, TxnState.ABORT),), None), NOW_MS))
    assert sweeper.backlog_records == 0 and isinstance(timer, StartTimer)


def test_the_node_s_sweepers_take_turns_a_page_each_paid_for_at_the_budget_s_rate() -> None:
    """SweepBudget: one page of the node's sweepers out at a time; the next starts once the calls
    made are paid for (calls / calls_per_s_max, by the budget's own timer), in the order they
    asked; a sweeper waiting holds no call; one that leaves (its partition dropped) gives up its
    place, and the turn of one that leaves with its page out goes on at the budget's timer."""
    budget = SweepBudget(calls_per_s_max=200, watch_ms=5_000)
    sweep = SweepConfig(age_ms=AGE_MS, interval_ms=60_000, timeout_ms_request=2_000, page_count_max=4)
    a, b, c = (Sweeper(sweeper_owner(LogId.partition(p)), LogId.partition(p), CONFIG, sweep, random.Random(1),
                       runs=lambda txn: False, budget=budget) for p in ("p0", "p1", "p2"))
    budget_timer = Timer(SWEEP_BUDGET, "", "budget")
    timers = {s: s.start()[0] for s in (a, b, c)}
    effects_a = a.handle(TimerFired(timers[a].timer))
    scan_a, pay = effects_a
    assert isinstance(scan_a, ScanFinished) and pay == StartTimer(budget_timer, 5)  # 1 call at 200/s
    assert b.handle(TimerFired(timers[b].timer)) == [] and b.waiting and b.idle
    assert c.handle(TimerFired(timers[c].timer)) == [] and c.waiting
    # a's page: two tombstones (paid by the next timer), then over; b waits for the pay.
    two = ScanPage((_record(_txn(OLD_MS, 1), TxnState.ABORT), _record(_txn(OLD_MS, 2), TxnState.ABORT)), None)
    deletes = a.handle(FinishedScanned(scan_a, two, NOW_MS))
    assert [type(e) for e in deletes] == [DeleteRecord, DeleteRecord]
    assert budget.owed_calls == 3 and budget.holder is a
    assert budget.fired() == [StartTimer(budget_timer, 10)]  # the scan paid; the tombstones next
    (next_pass,) = _answer_deletes(a, deletes)
    assert isinstance(next_pass, StartTimer) and next_pass.timer.owner == a.owner, "a's pass did not end"
    assert budget.holder is None and b.waiting
    (scan_b, pay) = budget.fired()
    assert scan_b == ScanFinished(b.owner, b.log, "", 4) and budget.holder is b and not b.waiting
    assert pay == StartTimer(budget_timer, 5)
    # b goes with its partition, its page out: its turn goes on at the budget's timer.
    budget.leave(b)
    (scan_c, _) = budget.fired()
    assert scan_c.owner == c.owner and budget.holder is c
    # c leaves while a waits: a's turn comes all the same.
    assert a.handle(TimerFired(next_pass.timer)) == [] and a.waiting
    budget.leave(c)
    (scan_a, _) = budget.fired()
    assert scan_a.owner == a.owner and budget.holder is a
    assert budget.grants == 4 and [s.counters["waited_for_budget"] for s in (a, b, c)] == [1, 1, 1]
