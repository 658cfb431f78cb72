"""The node-wide bound on sweeping (docs/sweeper-design.md, section 3: `sweep_calls_per_s_max`;
cornus.protocol.sweeper.SweepBudget) and the backlog the sweepers report, on a NodeCore whose
storage calls and timers are played here by hand against a simulated clock: a node holding many
partitions, each with a large backlog of old finished records (a long coordinator outage), must
stay under its rate of sweeper calls, sweep everything all the same, and lose no sweeper's turn
when a partition is dropped while its sweeper waits or holds the node's turn."""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from cornus.protocol.config import ProtocolConfig
from cornus.protocol.effects import (
    CheckIdentity,
    DeleteRecord,
    Effect,
    ListIdentities,
    ReadRecord,
    RecoveryFinished,
    ScanFinished,
    ScanLog,
    StartTimer,
    Timer,
)
from cornus.protocol.events import (
    DeleteReturned,
    Event,
    FinishedScanned,
    IdentitiesListed,
    IdentityChecked,
    IdentityTaken,
    RecordRead,
    ScanReturned,
    TimerFired,
)
from cornus.protocol.node_core import NodeCore
from cornus.protocol.sweeper import SweepConfig, sweep_age_ms_min, sweeper_owner
from storage_adapters.contract import LogId, LogKind, Record, RecordBody, ScanPage, TxnState

CONFIG = ProtocolConfig()
NODE = "n0"
RATE_PER_S = 200
SWEEP = SweepConfig(age_ms=sweep_age_ms_min(CONFIG, 2_000), interval_ms=60_000, timeout_ms_request=2_000,
                    calls_per_s_max=RATE_PER_S)
# A wall clock of today's 13 digits: ids sort by their begin as the runtime's do. Every record
# below begins long enough before it to be past the age from the first pass on, or after it.
START_MS = 1_800_000_000_000
OLD_MS = START_MS - SWEEP.age_ms - CONFIG.clock_slack_ms - 1
YOUNG_MS = START_MS + 100 * SWEEP.interval_ms  # young for the whole of every test
LATENCY_MS = 3
# The most calls one page makes here: its scan, and for each record a read of the other
# participant's record (a two-partition COMMIT) and a tombstone.
PAGE_CALLS_MAX = 1 + 2 * SWEEP.page_count_max
SWEEP_CALLS = (ScanFinished, ReadRecord, DeleteRecord)


def _txn(number: int, begin_ms: int = OLD_MS) -> str:
    return f"{begin_ms}.c0.x.{number:06d}.cornus"


@dataclass
class _Stored:
    state: TxnState
    participants: tuple[str, ...]
    applied: bool = False
    tombstone: bool = False


@dataclass
class Cluster:
    """One NodeCore, its storage (the finished records of every partition log, held here or not)
    and its clock. Every storage call is answered `latency_ms(call)` later, every timer fires on
    time; the sweepers' calls are recorded with the time they left."""

    partitions: tuple[str, ...]
    core: NodeCore = field(init=False)
    now_ms: int = START_MS
    records: dict[tuple[str, str], _Stored] = field(default_factory=dict)
    latency_ms: Callable[[Effect], int] = lambda call: LATENCY_MS
    calls: list[tuple[int, Effect]] = field(default_factory=list)
    out: dict[str, int] = field(default_factory=dict)  # sweeper calls unanswered, by owner
    dropped: set[str] = field(default_factory=set)  # owners whose calls and timers the runtime cancelled
    _queue: list[tuple[int, int, object]] = field(default_factory=list)
    _timers: dict[Timer, int] = field(default_factory=dict)
    _seq: int = 0

    def __post_init__(self) -> None:
        self.core = NodeCore(NODE, self.partitions, (NODE,), CONFIG, random.Random(7), sweep=SWEEP)
        self.core.start()
        self._run(self.core.handle(IdentityTaken(3)))

    def put(self, partition: str, txn: str, state: TxnState, *participants: str, applied: bool = True) -> None:
        self.records[(partition, txn)] = _Stored(state, participants or (partition,), applied)

    def live(self, partition: str) -> list[str]:
        """The records of `partition` a sweeper still has to collect."""
        return [txn for (p, txn), stored in self.records.items()
                if p == partition and not stored.tombstone and stored.state is not TxnState.VOTE_YES]

    def run_until(self, done: Callable[[], bool], until_ms: int,
                  on_call: Callable[[Effect], None] | None = None) -> None:
        while self._queue and not done():
            at_ms, _, item = heapq.heappop(self._queue)
            assert at_ms <= until_ms, f"not done by {until_ms - START_MS} ms"
            self.now_ms = at_ms
            if isinstance(item, tuple):  # a timer: (timer, generation)
                timer, generation = item
                if self._timers.get(timer) == generation and timer.owner not in self.dropped:
                    del self._timers[timer]
                    self._run(self.core.handle(TimerFired(timer)), on_call)
                continue
            owner = getattr(getattr(item, "call", None), "owner", "")
            if owner in self.dropped:
                continue
            if owner in self.out:
                self.out[owner] -= 1
            self._land(item)
            self._run(self.core.handle(item), on_call)

    def drop(self, partition: str) -> None:
        """The runtime's Node._lost: the core drops the partition, the runner cancels its
        sweeper's calls and timers."""
        self.core.drop_partition(partition)
        owner = sweeper_owner(LogId.partition(partition))
        self.dropped.add(owner)
        self.out.pop(owner, None)

    # -- answering effects -------------------------------------------------------------------------
    def _push(self, at_ms: int, item: object) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (at_ms, self._seq, item))

    def _run(self, effects: list[Effect], on_call: Callable[[Effect], None] | None = None) -> None:
        for effect in effects:
            if isinstance(effect, StartTimer):
                self._seq += 1
                self._timers[effect.timer] = self._seq
                self._push(self.now_ms + effect.duration_ms, (effect.timer, self._seq))
            elif isinstance(effect, SWEEP_CALLS):
                owner = effect.owner
                busy = [other for other, count in self.out.items() if count and other != owner]
                assert not busy, f"{owner} calls while {busy} have calls out: one page at a time"
                self.out[owner] = self.out.get(owner, 0) + 1
                self.calls.append((self.now_ms, effect))
                if on_call is not None:
                    on_call(effect)
                self._push(self.now_ms + self.latency_ms(effect), self._answer(effect))
            elif isinstance(effect, ScanLog):
                self._push(self.now_ms + LATENCY_MS, ScanReturned(effect, ScanPage((), None)))
            elif isinstance(effect, CheckIdentity):
                self._push(self.now_ms + LATENCY_MS, IdentityChecked(NODE, True))
            elif isinstance(effect, ListIdentities):
                self._push(self.now_ms + LATENCY_MS, IdentitiesListed(effect, (NODE,)))
            else:
                assert isinstance(effect, RecoveryFinished), effect

    def _record(self, log: LogId, txn: str) -> Record | None:
        stored = self.records.get((log.name, txn))
        if stored is None:
            return None
        if stored.tombstone:
            return Record(log, txn, stored.state, RecordBody(), applied=True, created_at_ms=OLD_MS)
        return Record(log, txn, stored.state, RecordBody(stored.participants, "c0"), applied=stored.applied,
                      created_at_ms=int(txn.split(".", 1)[0]))

    def _answer(self, call: Effect) -> Event | FinishedScanned:
        if isinstance(call, ScanFinished):
            txns = sorted(txn for (p, txn), stored in self.records.items()
                          if p == call.log.name and txn > call.after and not stored.tombstone
                          and (stored.state is TxnState.ABORT or (stored.state is TxnState.COMMIT and stored.applied)))
            page = tuple(record for txn in txns[: call.limit] if (record := self._record(call.log, txn)) is not None)
            return FinishedScanned(call, ScanPage(page, page[-1].txn if len(txns) > call.limit else None),
                                   self.now_ms)
        if isinstance(call, ReadRecord):
            return RecordRead(call, self._record(call.log, call.txn))
        assert isinstance(call, DeleteRecord)
        return DeleteReturned(call, True)

    def _land(self, event: object) -> None:
        # A tombstone takes effect as it is answered (storage's answer follows its write).
        if isinstance(event, DeleteReturned):
            self.records[(event.call.log.name, event.call.txn)].tombstone = True


def _backlogged(partition_count: int, records_per_partition: int, latency_ms: Callable[[Effect], int] | None = None,
                ) -> Cluster:
    """A node holding `partition_count` partitions, each with that many old finished records: one
    in four a COMMIT over it and its neighbour (its sweeper reads the other record first), the
    rest ABORTs."""
    partitions = tuple(f"p{i}" for i in range(partition_count))
    cluster = Cluster(partitions)
    if latency_ms is not None:
        cluster.latency_ms = latency_ms
    number = 0
    for index, partition in enumerate(partitions):
        neighbour = partitions[(index + 1) % partition_count]
        for record in range(records_per_partition):
            number += 1
            if record % 4 == 0 and neighbour != partition:
                cluster.put(partition, _txn(number), TxnState.COMMIT, partition, neighbour)
                cluster.put(neighbour, _txn(number), TxnState.COMMIT, partition, neighbour)
            else:
                cluster.put(partition, _txn(number), TxnState.ABORT)
    return cluster


def _calls_in_window_max(times_ms: list[int], window_ms: int) -> int:
    """The most calls that left within any `window_ms` (half-open)."""
    most, first = 0, 0
    for last, at_ms in enumerate(times_ms):
        while times_ms[first] <= at_ms - window_ms:
            first += 1
        most = max(most, last - first + 1)
    return most


def _all_swept(cluster: Cluster, partitions: tuple[str, ...]) -> Callable[[], bool]:
    return lambda: not any(cluster.live(partition) for partition in partitions)


def test_a_node_with_many_backlogged_partitions_stays_under_its_sweep_rate_and_sweeps_them_all() -> None:
    """After a long coordinator outage a node may hold many partitions, each with thousands of old
    records: unbounded, every partition's sweeper pages through its own at full speed, hundreds
    of calls a page, and all of them at once (a pass of each within a fifth of the interval),
    which competes with the transactions for storage (on DynamoDB, burns its capacity). Bounded,
    the node makes at most sweep_calls_per_s_max a second, plus one page's calls, in any span,
    and still sweeps every record."""
    cluster = _backlogged(partition_count=8, records_per_partition=600)
    partitions = cluster.partitions
    cluster.run_until(_all_swept(cluster, partitions), until_ms=START_MS + 10 * SWEEP.interval_ms)
    times_ms = [at_ms for at_ms, _ in cluster.calls]
    assert len(times_ms) > 8 * 600, len(times_ms)
    for window_ms in (1_000, 5_000, 30_000):
        most = _calls_in_window_max(times_ms, window_ms)
        assert most <= RATE_PER_S * window_ms // 1_000 + PAGE_CALLS_MAX, (window_ms, most)
    # From the first call on, at the rate: what the budget owes is paid before the next page.
    elapsed_ms = times_ms[-1] - times_ms[0]
    assert len(times_ms) <= RATE_PER_S * elapsed_ms / 1_000 + PAGE_CALLS_MAX, (len(times_ms), elapsed_ms)
    # And not much slower than the rate allows: the sweepers kept the budget busy.
    assert elapsed_ms <= 2 * len(times_ms) * 1_000 / RATE_PER_S, (len(times_ms), elapsed_ms)
    assert cluster.core.sweep_counters["swept"] == sum(1 for stored in cluster.records.values() if stored.tombstone)
    assert cluster.core.sweep_counters["waited_for_budget"] > 0


def test_a_partition_dropped_while_its_sweeper_holds_the_node_s_turn_or_waits_for_it() -> None:
    """The node's turn must outlive a sweeper that goes with its partition (NodeCore pops it; the
    runtime cancels its calls and timers, so none of its answers ever comes): one dropped with
    its page out, one dropped while it waits. The others still sweep everything, under the rate."""
    cluster = _backlogged(partition_count=6, records_per_partition=600)
    budget = cluster.core.sweep_budget
    assert budget is not None
    dropped: list[str] = []

    def on_call(call: Effect) -> None:
        # The first page that starts while another sweeper waits: both go.
        sweepers = [s for s in cluster.core._sweepers.values() if s.log.kind is LogKind.PARTITION]
        waiting = [s for s in sweepers if budget.waits(s)]
        if isinstance(call, ScanFinished) and waiting and not dropped and call.log.kind is LogKind.PARTITION:
            assert budget.holder is not None and budget.holder.owner == call.owner and budget.owed_calls
            dropped.extend((call.log.name, waiting[-1].log.name))
            for partition in dropped:
                cluster.drop(partition)

    def kept_swept() -> bool:
        return bool(dropped) and _all_swept(cluster, tuple(cluster.core.partitions))()

    cluster.run_until(kept_swept, until_ms=START_MS + 10 * SWEEP.interval_ms, on_call=on_call)
    assert len(dropped) == 2 and not set(dropped) & set(cluster.core.partitions), dropped
    assert all(cluster.live(partition) for partition in dropped), "dropped before they were swept"
    times_ms = [at_ms for at_ms, _ in cluster.calls]
    assert _calls_in_window_max(times_ms, 1_000) <= RATE_PER_S + PAGE_CALLS_MAX


def test_a_page_out_longer_than_its_pay_dropped_hands_the_turn_on_within_a_deadline() -> None:
    """A page whose scan is slow (its storage answers near the deadline) has paid for its calls
    long before it is over: nothing is owed, and the others wait on it. Dropped then, it never
    answers: the budget's watch (a storage deadline) must hand the turn on."""
    slow = "p1"
    slow_ms = CONFIG.storage_deadline_ms - 1

    def latency_ms(call: Effect) -> int:
        return slow_ms if isinstance(call, ScanFinished) and call.log == LogId.partition(slow) else LATENCY_MS

    cluster = _backlogged(partition_count=4, records_per_partition=50, latency_ms=latency_ms)
    scanned: list[int] = []

    def on_call(call: Effect) -> None:
        if isinstance(call, ScanFinished) and call.log == LogId.partition(slow):
            scanned.append(cluster.now_ms)

    cluster.run_until(lambda: bool(scanned), until_ms=START_MS + 2 * SWEEP.interval_ms, on_call=on_call)
    # Its one call is paid within ms; the others wait for its page, the budget's timer watching.
    cluster.run_until(lambda: cluster.now_ms >= scanned[0] + slow_ms // 2, until_ms=scanned[0] + slow_ms)
    budget = cluster.core.sweep_budget
    assert budget is not None and budget.holder is not None and budget.holder.log == LogId.partition(slow)
    assert budget.owed_calls == 0
    dropped_ms = cluster.now_ms
    cluster.drop(slow)
    before = len(cluster.calls)
    cluster.run_until(lambda: len(cluster.calls) > before, until_ms=dropped_ms + 2 * CONFIG.storage_deadline_ms)
    assert cluster.now_ms - dropped_ms <= CONFIG.storage_deadline_ms, cluster.now_ms - dropped_ms
    kept = ("p0", "p2", "p3")
    cluster.run_until(_all_swept(cluster, kept), until_ms=START_MS + 10 * SWEEP.interval_ms)


def test_the_backlog_is_what_the_last_pass_of_each_log_saw_old_and_left() -> None:
    """An operator sees sweeping fall behind through NodeCore.sweep_backlog_records (the gauge
    cornus_sweeper_backlog_records): the records older than the age that the last pass of each
    log read and did not sweep. Young ones are not behind; records swept are not left."""
    cluster = Cluster(("p0", "p1"))
    # p9 is another node's: its participants' yes votes hold these COMMITs back.
    for number in range(5):
        cluster.put("p0", _txn(number), TxnState.COMMIT, "p0", "p9")
        cluster.records[("p9", _txn(number))] = _Stored(TxnState.VOTE_YES, ("p0", "p9"))
    for number in range(5, 8):
        cluster.put("p1", _txn(number), TxnState.ABORT)
    for number in range(8, 10):
        cluster.put("p1", _txn(number, YOUNG_MS), TxnState.ABORT)
    assert cluster.core.sweep_backlog_records() == 0
    passes = cluster.core.sweep_counters
    cluster.run_until(lambda: passes["skipped_voted"] == 5 and passes["swept"] == 3 and not any(cluster.out.values()),
                      until_ms=START_MS + 2 * SWEEP.interval_ms)
    assert cluster.core.sweep_backlog_records() == 5 and passes["skipped_young"] >= 1
    # The votes decided: the next pass sweeps them, and its count replaces the last one.
    for number in range(5):
        cluster.records[("p9", _txn(number))] = _Stored(TxnState.COMMIT, ("p0", "p9"), applied=True)
    cluster.run_until(lambda: passes["swept"] == 8 and cluster.core.sweep_backlog_records() == 0,
                      until_ms=START_MS + 4 * SWEEP.interval_ms)
    assert cluster.live("p1") == [_txn(8, YOUNG_MS), _txn(9, YOUNG_MS)]
    # A dropped partition's backlog goes with it.
    cluster.records[("p9", _txn(0))] = _Stored(TxnState.VOTE_YES, ("p0", "p9"))
    cluster.put("p0", _txn(0), TxnState.COMMIT, "p0", "p9")
    cluster.run_until(lambda: cluster.core.sweep_backlog_records() == 1, until_ms=START_MS + 6 * SWEEP.interval_ms)
    cluster.drop("p0")
    assert cluster.core.sweep_backlog_records() == 0
