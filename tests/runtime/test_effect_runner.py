"""EffectRunner: a partition owner's write in flight when its host is dropped is left to finish,
its answer is never fed to the core (a later host of the same name must not hear it), and a
refusal still tells the node it was deposed; other storage calls of the host are cancelled."""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Any

import pytest

from cornus.protocol import txn_ids
from cornus.protocol.config import Protocol, ProtocolConfig
from cornus.protocol.effects import (
    CancelTimer,
    DeleteRecord,
    LogOnce,
    ReadRecord,
    ReleaseLocks,
    ScanFinished,
    StartTimer,
    Timer,
)
from cornus.protocol.events import DeleteReturned, Event, FinishedScanned, StorageUnreachable, TimerFired
from cornus.protocol.locks import Policy
from cornus.protocol.sweeper import sweeper_owner
from cornus.runtime import clocks
from cornus.runtime.effect_runner import EffectRunner
from cornus.runtime.failpoints import Failpoints
from cornus.runtime.partition import PartitionRuntime
from cornus.runtime.timing import TimingLog
from storage_adapters.contract import (
    Fence,
    LogId,
    LogOnceResult,
    Record,
    RecordBody,
    ScanPage,
    Tombstone,
    TxnState,
)
from storage_adapters.errors import Fenced, StorageUnavailable
from storage_adapters.factory import StoreConfig, open_store
from tests.unused_store import UnusedStore

PARTITION = "p0"
# The storage deadline of the frozen-process test: short, so the freeze outlasts it quickly.
FROZEN_DEADLINE_MS = 300
FENCE = Fence(PARTITION, "n0", 1)
TXN = txn_ids.new_txn_id(int(time.time() * 1000), "n0", "abc123", 1, Protocol.CORNUS)


class _HeldStore(UnusedStore):
    """Each call waits until the test settles it with a result or an error."""

    def __init__(self) -> None:
        super().__init__(timeout_ms_call=30_000)
        self.calls: list[asyncio.Future[Any]] = []
        self.fences: list[Fence | None] = []
        self.arrived = asyncio.Event()

    async def _held(self, fence: Fence | None) -> Any:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.calls.append(future)
        self.fences.append(fence)
        self.arrived.set()
        return await future

    async def _log_once(self, log: LogId, txn: str, state: TxnState, body: RecordBody,
                        fence: Fence | None) -> LogOnceResult:
        return await self._held(fence)

    async def _read(self, log: LogId, txn: str) -> Record | None:
        return await self._held(None)

    async def _scan_finished_page(self, log: LogId, limit: int, after: str) -> ScanPage:
        return await self._held(None)

    async def _delete(self, log: LogId, txn: str, fence: Fence | None, keep: Tombstone | None) -> bool:
        return await self._held(fence)


class _Harness:
    def __init__(self) -> None:
        self.store = _HeldStore()
        self.fed: list[Event] = []
        self.fenced: list[tuple[str, int]] = []
        self.runner = EffectRunner(
            "n0", store=self.store, transport=None,  # type: ignore[arg-type]  # nothing is sent here
            partitions={}, route=lambda host: None, fence_of=lambda partition: FENCE,
            failpoints=Failpoints({}), timings=TimingLog(), counters=collections.Counter(),
            identity_write_window_ms=ProtocolConfig().identity_write_window_ms,
        )
        self.runner.feed = self.fed.append
        self.runner.acts_for_node = lambda host: False  # every host here is a partition's
        self.runner.on_fenced = lambda partition, epoch: self.fenced.append((partition, epoch))

    async def vote_in_flight(self) -> asyncio.Future[Any]:
        self.store.arrived.clear()
        self.runner.run([LogOnce(PARTITION, LogId.partition(PARTITION), TXN, TxnState.VOTE_YES, RecordBody())])
        await asyncio.wait_for(self.store.arrived.wait(), 5)
        assert self.store.fences[-1] == FENCE, "an owner's write to its own log carries its fence"
        return self.store.calls[-1]

    async def settle(self) -> None:
        for _ in range(10):
            await asyncio.sleep(0)


@pytest.fixture
def harness() -> _Harness:
    return _Harness()


async def test_an_owned_write_is_answered_while_its_host_stays(harness: _Harness) -> None:
    write = await harness.vote_in_flight()
    write.set_result(LogOnceResult(TxnState.VOTE_YES, created=True))
    await harness.settle()
    assert len(harness.fed) == 1 and harness.fenced == []


async def test_a_dropped_hosts_write_finishes_unanswered(harness: _Harness) -> None:
    write = await harness.vote_in_flight()
    harness.runner.cancel_owned({PARTITION})
    await harness.settle()
    assert not write.cancelled(), "a write once sent may land either way: it is left to finish"
    write.set_result(LogOnceResult(TxnState.VOTE_YES, created=True))
    await harness.settle()
    assert harness.fed == [] and harness.fenced == []


async def test_a_dropped_hosts_refused_write_still_reports_the_fence(harness: _Harness) -> None:
    write = await harness.vote_in_flight()
    harness.runner.cancel_owned({PARTITION})
    write.set_exception(Fenced(FENCE, None))
    await harness.settle()
    assert harness.fed == [] and harness.fenced == [(PARTITION, 1)]


async def test_a_dropped_hosts_unavailable_write_is_forgotten(harness: _Harness) -> None:
    write = await harness.vote_in_flight()
    harness.runner.cancel_owned({PARTITION})
    write.set_exception(StorageUnavailable("storage went away"))
    await harness.settle()
    assert harness.fed == [] and harness.fenced == []


async def test_a_dropped_hosts_write_not_sent_yet_is_never_sent(harness: _Harness) -> None:
    """Found by audit: a fenced write looked its fence up by the partition's name as its task sent
    it, so a write of a host dropped before that, with the partition taken again meanwhile (here:
    fence_of answers a fence), would have gone out under the new take's fence, which storage
    accepts. Not sent: nothing waits for its answer, as for a host whose lease is not good."""
    harness.runner.run([LogOnce(PARTITION, LogId.partition(PARTITION), TXN, TxnState.VOTE_YES, RecordBody())])
    harness.runner.cancel_owned({PARTITION})  # before the call's task first runs
    await harness.settle()
    assert not harness.store.calls, "a dropped host's write went out under the partition's current fence"
    assert harness.runner.counters["writes_skipped_not_held"] == 1


async def test_a_dropped_hosts_read_is_cancelled(harness: _Harness) -> None:
    harness.runner.run([ReadRecord(PARTITION, LogId.partition(PARTITION), TXN)])
    await asyncio.wait_for(harness.store.arrived.wait(), 5)
    read = harness.store.calls[-1]
    harness.runner.cancel_owned({PARTITION})
    await harness.settle()
    assert read.cancelled() and harness.fed == []


async def test_a_write_storage_cannot_fence_is_not_sent_once_the_lease_ended(harness: _Harness) -> None:
    """A partition's machine's LogOnce(ABORT) on another partition's log (termination) carries no
    fence. Let through while the lease held, it is checked again as its task sends it: a node that
    stalled between the two would otherwise send it after its lease ended."""
    leases = {PARTITION: True}
    harness.runner.may_act = lambda host: leases.get(host, True)
    other = LogId.partition("p1")
    harness.runner.run([LogOnce(PARTITION, other, TXN, TxnState.ABORT, RecordBody())])
    leases[PARTITION] = False  # the stall: the lease ends before the call's task runs
    await harness.settle()
    assert not harness.store.calls, "sent after the lease ended"
    assert harness.runner.counters["writes_skipped_not_held"] == 1
    leases[PARTITION] = True
    harness.runner.run([LogOnce(PARTITION, other, TXN, TxnState.ABORT, RecordBody())])
    await asyncio.wait_for(harness.store.arrived.wait(), 5)
    assert harness.store.fences == [None]


async def test_a_lease_found_lapsed_never_drops_a_partition_in_the_middle_of_its_effects(harness: _Harness) -> None:
    """Asking whether a host may act drops a partition whose lease ran out. Asked while the runner
    still worked through the effect list that issued an unfenced write, it pulled the partition
    from under the effects after that write (a KeyError out of the runner): the lease is asked as
    the write leaves, in its own task."""
    partitions = {PARTITION: PartitionRuntime(PARTITION, harness.store, Policy.NO_WAIT, 500, 1000, partition_count=1)}
    harness.runner.partitions = partitions

    def lapsed(host: str) -> bool:
        partitions.pop(PARTITION, None)  # what the node's ownership check does to a lapsed lease
        return False

    harness.runner.may_act = lapsed
    harness.runner.run([
        LogOnce(PARTITION, LogId.partition("p1"), TXN, TxnState.ABORT, RecordBody()),
        ReleaseLocks(PARTITION, TXN, refuse_later=True),
    ])
    await harness.settle()
    assert not harness.store.calls, "sent after the lease ended"
    assert harness.runner.counters["writes_skipped_not_held"] == 1


async def test_an_unfenced_write_frozen_after_its_lease_check_is_refused_by_storage(tmp_path: Any) -> None:
    """Found by review: the lease was checked as the call's task started, and the storage deadline
    fixed only afterwards, inside the store: a process stopped (SIGSTOP, a stall) between the two
    resumed with a fresh deadline, and storage took a termination's LogOnce(ABORT) long after the
    lease ended, when the partition's new owner may have finished the transaction and its records
    been collected (an ABORT beside a returned COMMIT). The deadline is fixed before the check now,
    so storage (the emulator's writer here, Redis's scripts likewise) refuses the write."""
    store = await open_store(StoreConfig(backend="emulator", emulator_path=str(tmp_path / "c.db"),
                                         timeout_ms_call=FROZEN_DEADLINE_MS))
    try:
        runner = EffectRunner(
            "n0", store=store, transport=None,  # type: ignore[arg-type]  # nothing is sent here
            partitions={}, route=lambda host: None, fence_of=lambda partition: FENCE,
            failpoints=Failpoints({}), timings=TimingLog(), counters=collections.Counter(),
            identity_write_window_ms=ProtocolConfig().identity_write_window_ms,
        )
        fed: list[Event] = []
        runner.feed = fed.append
        runner.acts_for_node = lambda host: False

        def held_then_frozen(host: str) -> bool:
            time.sleep(2 * FROZEN_DEADLINE_MS / 1000)  # stopped just after the check passed
            return True

        runner.may_act = held_then_frozen
        other = LogId.partition("p1")
        runner.run([LogOnce(PARTITION, other, TXN, TxnState.ABORT, RecordBody())])
        for _ in range(200):
            if fed:
                break
            await asyncio.sleep(0.01)
        assert fed and isinstance(fed[0].result, StorageUnreachable), fed  # type: ignore[attr-defined]
        assert await store.read(other, TXN) is None, "storage took a write sent long after its lease check"
    finally:
        await store.close()


class _PromptStore(UnusedStore):
    """Answers every call in a millisecond."""

    async def _log_once(self, log: LogId, txn: str, state: TxnState, body: RecordBody,
                        fence: Fence | None) -> LogOnceResult:
        await asyncio.sleep(0.001)
        return LogOnceResult(state, created=True)

    async def _read(self, log: LogId, txn: str) -> Record | None:
        await asyncio.sleep(0.001)
        return None


async def test_a_call_started_after_an_unfenced_writes_answer_gets_a_deadline_of_its_own() -> None:
    """Found by review: the deadline fixed for an unfenced write stayed set in its task, and the
    core, fed the write's answer in that task, started its next calls and timers there: every
    call they led to inherited the spent deadline and failed at once, retries included (a
    termination's decision was never logged nor applied). The bound now ends with the write."""
    store = _PromptStore(timeout_ms_call=FROZEN_DEADLINE_MS)
    runner = EffectRunner(
        "n0", store=store, transport=None,  # type: ignore[arg-type]  # nothing is sent here
        partitions={}, route=lambda host: None, fence_of=lambda partition: FENCE,
        failpoints=Failpoints({}), timings=TimingLog(), counters=collections.Counter(),
        identity_write_window_ms=ProtocolConfig().identity_write_window_ms,
    )
    runner.may_act = lambda host: True
    runner.acts_for_node = lambda host: False
    fed: list[Event] = []
    timer = Timer(PARTITION, TXN, "retry")

    def feed(event: Event) -> None:
        fed.append(event)
        if len(fed) == 1:  # the unfenced write's answer: the machine starts a timer (a backoff)
            runner.run([StartTimer(timer, 2 * FROZEN_DEADLINE_MS)])
        elif isinstance(event, TimerFired):  # past the write's deadline, it reads a record
            runner.run([ReadRecord(PARTITION, LogId.partition(PARTITION), TXN)])

    runner.feed = feed
    runner.run([LogOnce(PARTITION, LogId.partition("p1"), TXN, TxnState.ABORT, RecordBody())])
    for _ in range(300):
        if len(fed) == 3:
            break
        await asyncio.sleep(0.01)
    assert len(fed) == 3, fed
    assert not isinstance(fed[2].result, StorageUnreachable), fed[2]  # type: ignore[attr-defined]


async def test_a_stopped_runner_starts_no_work(harness: _Harness) -> None:
    """Found by audit (2026-11-27): work spawned after `stop` (the idle sweep still ran while the
    node stopped: aborts and refreshes) got a task that nothing awaited or cancelled, and sent
    peer requests during the shutdown. A stopped runner starts nothing."""
    await harness.runner.stop()
    ran: list[str] = []

    async def work() -> None:
        ran.append("ran")

    harness.runner.spawn(work())
    await harness.settle()
    assert ran == [], "work started after the stop"


class _Suspends:
    """Suspends of the machine, as the runner's watch sees them: the boot clock moved ahead."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.ahead_ns = 0
        real_boot_ns = clocks.boot_ns
        monkeypatch.setattr(clocks, "boot_ns", lambda: real_boot_ns() + self.ahead_ns)

    def suspend(self, ms: int) -> None:
        self.ahead_ns += ms * 1_000_000


def _timer(kind: str) -> Timer:
    return Timer(PARTITION, TXN, kind)


async def test_a_suspend_fires_the_timers_it_made_overdue_in_order_and_moves_the_rest(
    harness: _Harness, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by audit (2026-11-27): timers run on the loop's clock, which a suspend stops."""
    suspends = _Suspends(monkeypatch)
    harness.runner.may_act = lambda host: True
    harness.runner.run([StartTimer(_timer("late"), 900), StartTimer(_timer("early"), 300),
                        StartTimer(_timer("long"), 60_000)])
    suspends.suspend(1_000)
    harness.runner.catch_up_after_suspend()
    assert harness.fed == [TimerFired(_timer("early")), TimerFired(_timer("late"))]
    handle = harness.runner.timers.handle(_timer("long"))
    assert 58.5 < handle.when() - asyncio.get_running_loop().time() <= 59.0  # a second earlier
    harness.runner.catch_up_after_suspend()  # seen already: nothing moves again
    assert len(harness.fed) == 2 and harness.runner.timers.handle(_timer("long")) is handle
    assert harness.runner.counters["suspends_caught_up"] == 1


async def test_a_timer_started_after_a_suspend_not_yet_seen_keeps_its_time(
    harness: _Harness, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A suspend in the middle of an effect list is seen at the next event: the timers the list
    started after it moved nothing of it (a collection's grace must not shrink by it). Nor does
    a second suspend before that event move them by the first (found by review)."""
    suspends = _Suspends(monkeypatch)
    harness.runner.may_act = lambda host: True
    harness.runner.run([StartTimer(_timer("before"), 1_500)])
    suspends.suspend(1_000)
    harness.runner.run([StartTimer(_timer("after"), 1_500)])
    suspends.suspend(1_000)
    harness.runner.catch_up_after_suspend()
    assert harness.fed == [TimerFired(_timer("before"))]  # 2 s of suspend against its 1.5 s
    handle = harness.runner.timers.handle(_timer("after"))
    # Moved by the second suspend only: about 0.5 s left of its 1.5 s.
    assert 0.2 < handle.when() - asyncio.get_running_loop().time() <= 0.5


async def test_a_timer_an_earlier_one_cancels_as_it_fires_does_not_fire(
    harness: _Harness, monkeypatch: pytest.MonkeyPatch,
) -> None:
    suspends = _Suspends(monkeypatch)
    harness.runner.may_act = lambda host: True
    harness.runner.run([StartTimer(_timer("first"), 100), StartTimer(_timer("second"), 200)])

    def feed(event: Event) -> None:
        harness.fed.append(event)
        if event == TimerFired(_timer("first")):
            harness.runner.run([CancelTimer(_timer("second"))])

    harness.runner.feed = feed
    suspends.suspend(1_000)
    harness.runner.catch_up_after_suspend()
    assert harness.fed == [TimerFired(_timer("first"))] and not len(harness.runner.timers)


SWEEPER = sweeper_owner(LogId.partition(PARTITION))


async def test_a_sweepers_scan_is_answered_with_the_wall_clock_it_left_at(harness: _Harness) -> None:
    """The sweeper judges the records' age by the clock as its scan left (the core reads none):
    every record the page holds was written before it; unreachable storage is an answer too."""
    scan = ScanFinished(SWEEPER, LogId.partition(PARTITION), "", 100)
    for result in (ScanPage((), None), StorageUnavailable("storage went away")):
        harness.store.arrived.clear()
        before_ms = int(time.time() * 1000)
        harness.runner.run([scan])
        await asyncio.wait_for(harness.store.arrived.wait(), 5)
        call = harness.store.calls[-1]
        if isinstance(result, Exception):
            call.set_exception(result)
        else:
            call.set_result(result)
        await harness.settle()
        answer = harness.fed[-1]
        assert isinstance(answer, FinishedScanned) and answer.call == scan, answer
        assert before_ms <= answer.sent_ms <= int(time.time() * 1000)
        assert answer.result == result if not isinstance(result, Exception) else (
            isinstance(answer.result, StorageUnreachable))


async def test_a_dropped_sweepers_scan_is_cancelled_and_its_tombstones_carry_the_fence(harness: _Harness) -> None:
    """A partition dropped takes its sweeper with it (Node._lost names the sweeper's owner): its
    scan's answer must not reach the sweeper a later take starts. The tombstones it writes carry
    the partition's fence, as its host's writes do: a deposed holder's are refused by storage."""
    harness.runner.run([ScanFinished(SWEEPER, LogId.partition(PARTITION), "", 100)])
    await asyncio.wait_for(harness.store.arrived.wait(), 5)
    scan = harness.store.calls[-1]
    harness.runner.cancel_owned({PARTITION, SWEEPER})
    await harness.settle()
    assert scan.cancelled() and harness.fed == []
    harness.store.arrived.clear()
    keep = Tombstone(TxnState.COMMIT, 60_000)
    harness.runner.run([DeleteRecord(SWEEPER, LogId.partition(PARTITION), TXN, keep)])
    await asyncio.wait_for(harness.store.arrived.wait(), 5)
    assert harness.store.fences[-1] == FENCE
    harness.store.calls[-1].set_result(True)
    await harness.settle()
    assert isinstance(harness.fed[-1], DeleteReturned)
