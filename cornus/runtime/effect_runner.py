"""Carries out the core's effects on one node: storage calls (their answers come back as events),
messages to peers, timers, locks and the owner's cache, replies to callers, and the timing marks.
It decides nothing: every rule is in `cornus.protocol`; this maps each effect to one action.
The timers themselves are timers.py's. It is past 450 lines because a storage call's gates (the
partition's lease, the node's identity window, the fence) sit with the call they gate: each is a
call into ownership.py or identity.py, and the call's task is where its deadline is fixed; and a
call's answer is the event its effect names (the unfenced reads' one task body, `_read_unowned`,
included), which a split would put behind an interface with this one user.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import time
import typing
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any

from cornus.protocol.effects import (
    ApplyRedo,
    CacheRedo,
    CancelTimer,
    CheckIdentity,
    ConfirmIdentity,
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
    Event,
    FinishedScanned,
    IdentitiesListed,
    LogReturned,
    StorageUnreachable,
    TimerFired,
    answer,
)
from cornus.protocol.messages import DecisionAck
from cornus.protocol.ownership import fenced_partition, without_lease_may
from cornus.protocol.sweeper import SWEEP
from cornus.runtime import identity
from cornus.runtime.failpoints import Failpoints
from cornus.runtime.partition import PartitionRuntime
from cornus.runtime.timers import TimerTable
from cornus.runtime.timing import TimingLog
from cornus.runtime.transport import Transport
from cornus.runtime.wire import Routed
from storage_adapters.contract import Fence, LogKind, TxnState
from storage_adapters.errors import Fenced, InvariantViolation, StorageUnavailable
from storage_adapters.store import CallDeadline, LogStore, call_deadline_at

log = logging.getLogger("cornus.node")

# How long the coordinator.after_reply failpoint lets the reply reach the caller before dying.
FAILPOINT_REPLY_FLUSH_S = 0.2
# An apply that keeps failing is logged at its first failure and then every this many attempts.
APPLY_FAILURE_LOG_EVERY = 20
# Terminations timed at once; past it the oldest is dropped. Every termination a machine starts
# also ends, so this only bounds the table against a machine that forgot to say so.
TERMINATIONS_TIMED_MAX = 10_000


def fatal(message: str) -> None:
    """An impossible state: crash loudly rather than run on with a broken invariant."""
    log.critical("FATAL: %s", message)
    os._exit(70)


def crash_if_failed(task: asyncio.Task[None]) -> None:
    """A done callback for a task that must run for the node's life (a housekeeping loop): one
    that ended with an error crashes the node, which would otherwise run on without it, its
    executions never idled out or its leases never renewed (found by audit, 2026-11-28)."""
    if not task.cancelled() and task.exception() is not None:
        fatal(f"{task.get_name()} failed: {task.exception()!r}")


class EffectRunner:
    """`feed` takes the event that answers a storage call or a timer; `route` names the node a
    host's messages go to (None: nobody holds that partition now); `fence_of` gives the fence of a
    partition this node holds (None: its lease is not good now); `may_act` says whether a host
    may act now (a partition's, only while the node's lease on it is good); the hooks tell the
    rest of the node about replies, decisions, recoveries and refused (fenced) writes."""

    def __init__(
        self,
        node_id: str,
        *,
        store: LogStore,
        transport: Transport,
        partitions: Mapping[str, PartitionRuntime],
        route: Callable[[str], str | None],
        fence_of: Callable[[str], Fence | None],
        failpoints: Failpoints,
        timings: TimingLog,
        counters: collections.Counter[str],
        identity_write_window_ms: int,
    ) -> None:
        self.node_id = node_id
        self.store = store
        self.transport = transport
        self.partitions = partitions
        self.route = route
        self.fence_of = fence_of
        self.failpoints = failpoints
        self.timings = timings
        self.counters = counters
        self.feed: Callable[[Event], None] = _unwired
        self.may_act: Callable[[str], bool] = _unwired
        self.acts_for_node: Callable[[str], bool] = _unwired  # a host of the node itself, not a partition's
        self.on_reply: Callable[[Reply], None] = _unwired
        self.on_decided: Callable[[Decided], None] = _unwired
        self.on_recovered: Callable[[RecoveryFinished], None] = _unwired
        self.on_fenced: Callable[[str, int], None] = _unwired  # (partition, epoch)
        self.on_deposed: Callable[[str], None] = _unwired  # (why): a later process took the node's identity
        self.stopped = False
        # This process's take of the node's identity, whose fence its coordinator-log writes carry.
        self.identity = identity.IdentityHolder(store, node_id, identity_write_window_ms)
        # The node's event loop, kept at first use: asyncio.get_running_loop() makes a getpid system
        # call on Python 3.11, and every storage call and timer of a transaction needs the loop. A
        # runner belongs to one node, which runs on one loop.
        self._loop: asyncio.AbstractEventLoop | None = None
        # Through the attribute, so that a test's stand-in for _fire is the one called.
        self.timers = TimerTable(lambda timer: self._fire(timer), counters)  # noqa: PLW0108
        self._tasks: dict[asyncio.Task[None], _Flight] = {}  # task -> whose call it is
        # (where, txn) -> when its termination protocol began (perf_counter seconds).
        self._terminating: dict[tuple[str, str], float] = {}
        self._handlers: dict[type, Callable[[Any], None]] = {
            Send: self._send,
            **dict.fromkeys((LogOnce, Log, ApplyRedo, DeleteRecord, ReadRecord, ScanLog), self._storage),
            ListIdentities: self._list_identities,
            ScanFinished: self._scan_finished,
            StartTimer: self._start_timer,
            CancelTimer: self._cancel_timer,
            ReleaseLocks: self._release_locks,
            LocksPrepared: lambda e: self.partitions[e.partition].locks.mark_prepared(e.txn),
            RetakeLocks: lambda e: self.partitions[e.partition].retake_locks(e.txn, e.redo),
            CacheRedo: lambda e: self.partitions[e.partition].cache_redo(e.redo),
            Reply: self._reply,
            Decided: self._decided,
            TerminationStarted: self._termination_started,
            TerminationEnded: self._termination_ended,
            RecoveryFinished: self._recovered,
            TakeIdentity: lambda e: self.spawn(self._identity_call(self.identity.take(e), e)),
            CheckIdentity: lambda e: self.spawn(self._identity_call(self.identity.check(e), e)),
            Deposed: lambda e: self.on_deposed(f"another process took node id {e.node} (epoch {e.epoch} was ours)"),
            ConfirmIdentity: _consumed_by_the_core,
        }
        assert set(self._handlers) == set(typing.get_args(Effect)), "an effect has no handler"

    # -- the one entry point ---------------------------------------------------------------------
    def run(self, effects: list[Effect]) -> None:
        for index, effect in enumerate(effects):
            if self.stopped:
                return
            if isinstance(effect, Reply) and self.failpoints.armed("coordinator.after_reply"):
                # The caller hears the outcome, and the process dies before the decisions go out.
                self.on_reply(effect)
                self.spawn(self._die_after_reply(effects[index + 1 :]))
                return
            self._run_one(effect)

    def _run_one(self, effect: Effect) -> None:
        # By exact type, one dict lookup: an isinstance chain cost ~8 checks per effect, and a
        # transaction runs some 30 effects over its nodes. Effect classes are final dataclasses.
        handler = self._handlers.get(type(effect))
        assert handler is not None, f"unexpected effect {effect!r}"
        handler(effect)

    def _send(self, effect: Send) -> None:
        node = self.route(effect.to)
        if node is None:
            # Nobody holds the partition now; the sender's timers repeat what matters.
            self.counters["messages_unroutable"] += 1
            return
        # An acknowledgement only garbage collection waits for may ride with the next message.
        self.transport.send(node, Routed(effect.source, effect.to, effect.message),
                            may_wait=type(effect.message) is DecisionAck)

    def _storage(self, effect: StorageCall) -> None:
        if _is_vote_write(effect):
            self.failpoints.hit("participant.before_log_vote")
        elif type(effect) is DeleteRecord and effect.owner.startswith(SWEEP):
            # Rare (only what a crash left), and what an operator asks after: which records went.
            assert effect.keep is not None, "a sweeper writes tombstones, never plain deletes"
            log.info("sweep collects %s in %s (%s)", effect.txn, effect.log.key, effect.keep.decision.value,
                     extra={"txn": effect.txn})
        flight = _Flight(effect.owner, fenced_partition(effect))
        self._track(self._running_loop().create_task(self._call(effect, flight)), flight)

    def _start_timer(self, effect: StartTimer) -> None:
        self.timers.start(self._running_loop(), effect.timer, effect.duration_ms)

    def _cancel_timer(self, effect: CancelTimer) -> None:
        self.timers.cancel(effect.timer)

    def _release_locks(self, effect: ReleaseLocks) -> None:
        partition = self.partitions[effect.partition]
        if effect.refuse_later:
            partition.abort_execution(effect.txn)
        else:
            partition.release(effect.txn)

    # Through self at call time: the node wires these hooks after construction.
    def _reply(self, effect: Reply) -> None:
        self.on_reply(effect)

    def _recovered(self, effect: RecoveryFinished) -> None:
        self.on_recovered(effect)

    def _decided(self, effect: Decided) -> None:
        self.on_decided(effect)
        self.failpoints.hit("coordinator.after_votes")

    def _termination_started(self, effect: TerminationStarted) -> None:
        self._terminating.setdefault((effect.where, effect.txn), time.perf_counter())
        while len(self._terminating) > TERMINATIONS_TIMED_MAX:
            del self._terminating[next(iter(self._terminating))]

    # -- storage ---------------------------------------------------------------------------------
    async def _call(self, call: StorageCall, flight: _Flight) -> None:
        partition = flight.partition
        # A write storage cannot fence: one the core lets no host without a lease make (below).
        unfenced = partition is None and not without_lease_may(call)
        # An unfenced write's deadline is fixed before its lease is checked (found by review):
        # fixed after, inside the store, a stall between the two (a stopped process) gave a fresh
        # deadline, and Redis and the emulator, which refuse a write past its deadline, took one
        # long after the lease had ended. (A fenced write needs no such care: storage checks the
        # epoch it carries.)
        deadline = CallDeadline.after(self.store.timeout_ms_call / 1000) if unfenced else None
        if unfenced and not self.may_act(call.owner):
            # A partition's machine whose lease ended (ownership.without_lease_may says why it
            # must not write). Checked as the call leaves, in its own task: not in the middle of
            # the effect list that issued it, where dropping the partition would pull it from
            # under the effects after this one (the simulator does the same).
            self.counters["writes_skipped_not_held"] += 1
            return
        if unfenced and self.acts_for_node(call.owner):
            assert deadline is not None
            deadline = await self._admit_for_node(call, deadline)
            if deadline is None:
                return
        fence = None
        if partition == self.identity.name:
            fence = self.identity.fence
            # The core starts no coordinator before its identity is taken (NodeCore.start).
            assert fence is not None, f"{call!r} before {self.node_id} took its identity"
        elif partition is not None:
            # Looked up by the partition's name: a host dropped before its write left would send it
            # under a later take's fence, which storage accepts (found by audit). Not sent, as below.
            fence = None if flight.dropped else self.fence_of(partition)
            if fence is None:
                # The lease is not good now: the host is being dropped, and nobody waits for this
                # answer. Not written at all, since storage would refuse it (on Azure: might not).
                self.counters["writes_skipped_not_held"] += 1
                return
            self.failpoints.hit("owner.before_fenced_write")
        try:
            with call_deadline_at(deadline):
                event = await self._answer(call, fence)
        except Fenced as error:
            # Heard even when the host was dropped meanwhile: a refusal is what tells the node it
            # was deposed.
            assert partition is not None and error.fence == fence
            if partition == self.identity.name:
                self.on_deposed(f"another process took node id {self.node_id}: storage refused {call!r} ({error})")
                return
            self.on_fenced(partition, error.fence.epoch)
            return
        except StorageUnavailable as error:
            if flight.dropped:
                return
            self.counters["storage_unavailable"] += 1
            event = answer(call, StorageUnreachable(str(error)))
        except InvariantViolation as error:
            fatal(f"storage refused {call!r}: {error}")
            return
        if flight.dropped:
            return  # its host is gone; a later host of the same name must not hear this answer
        if isinstance(event, LogReturned) and not isinstance(event.result, StorageUnreachable):
            if _is_vote_write(call):
                self.failpoints.hit("participant.after_log_vote")
            if call.owner == self.node_id and isinstance(call, Log) and call.state.is_decision:
                self.failpoints.hit("coordinator.after_decision_log")
        if not self.stopped:
            self.feed(event)

    async def _admit_for_node(self, call: StorageCall, deadline: CallDeadline) -> CallDeadline | None:
        """The deadline a write storage cannot fence, made for the node itself (its coordinator's,
        its start recovery's), may leave with (IdentityHolder.write_deadline); None if it must
        not leave: the node is deposed, or the write is answered as unreachable (its machine
        tries again later)."""
        admitted = await self.identity.write_deadline(deadline, self.store.timeout_ms_call / 1000, self.counters)
        if isinstance(admitted, CallDeadline):
            return admitted
        if admitted is identity.Refused.DEPOSED:
            self.on_deposed(f"another process took node id {self.node_id}: found before {call!r}")
        elif not self.stopped:
            self.feed(answer(call, StorageUnreachable(f"the node's identity is not confirmed: {admitted.value}")))
        return None

    async def _answer(self, call: StorageCall, fence: Fence | None) -> Event:
        store = self.store
        if isinstance(call, LogOnce):
            return answer(call, await store.log_once(call.log, call.txn, call.state, call.body, fence))
        if isinstance(call, Log):
            return answer(call, await store.log(call.log, call.txn, call.state, call.body, fence))
        if isinstance(call, ApplyRedo):
            assert fence is not None
            return await self._apply(call, fence)
        if isinstance(call, DeleteRecord):
            return answer(call, await store.delete(call.log, call.txn, fence, call.keep))
        if isinstance(call, ReadRecord):
            return answer(call, await store.read(call.log, call.txn))
        return answer(call, await store.scan_unfinished_page(call.log, call.limit, call.after))

    def _list_identities(self, effect: ListIdentities) -> None:
        async def listed() -> tuple[str, ...]:
            return tuple(await self.store.list_identities(effect.after, effect.limit))

        self._read_unowned(effect, listed, lambda result: IdentitiesListed(effect, result))

    def _scan_finished(self, effect: ScanFinished) -> None:
        # The wall clock as the effect runs, before its call leaves: every record the page holds
        # was written before it, and the sweeper judges their age by it (the core reads no clock).
        sent_ms = int(time.time() * 1000)
        self._read_unowned(effect, lambda: self.store.scan_finished_page(effect.log, effect.limit, effect.after),
                           lambda result: FinishedScanned(effect, result, sent_ms))

    def _read_unowned(self, call: ListIdentities | ScanFinished, read: Callable[[], Awaitable[Any]],
                      answer_of: Callable[[Any], Event]) -> None:
        """A read that carries no fence and needs no lease (recovery's listing of identities, a
        sweeper's scan), answered with `answer_of` its result or StorageUnreachable. `read` makes
        the call in the task: a task cancelled before it ran leaves no coroutine never awaited."""
        flight = _Flight(call.owner, None)
        self._track(self._running_loop().create_task(self._read_unowned_call(call, flight, read, answer_of)), flight)

    async def _read_unowned_call(self, call: ListIdentities | ScanFinished, flight: _Flight,
                                 read: Callable[[], Awaitable[Any]], answer_of: Callable[[Any], Event]) -> None:
        try:
            result = await read()
        except StorageUnavailable as error:
            result = StorageUnreachable(str(error))
        except InvariantViolation as error:
            fatal(f"storage refused {call!r}: {error}")
            return
        if flight.dropped or self.stopped:
            return  # its recovery or sweeper is gone (the partition dropped), or the node is
        if isinstance(result, StorageUnreachable):
            self.counters["storage_unavailable"] += 1
        self.feed(answer_of(result))

    async def _apply(self, call: ApplyRedo, fence: Fence) -> Event:
        self.failpoints.hit("participant.before_apply")
        partition = self.partitions.get(call.partition)
        if partition is None:
            # Dropped (lease lost, or the node stopping) between the effect and this write, which
            # has not left: nothing landed, and only a dropped write's bookkeeping hears of it.
            raise StorageUnavailable(f"{call.partition} was dropped before its apply of {call.txn} was sent")
        try:
            applied_now = await partition.apply(call.txn, call.redo, fence)
        except StorageUnavailable as error:
            self.counters["apply_retries"] += 1
            if self.counters["apply_retries"] % APPLY_FAILURE_LOG_EVERY == 1:
                # Said out loud: the transaction stays locked, and shows as "applying", until it lands.
                log.warning("apply of %s on %s: storage unavailable (%s); retrying, its keys stay locked",
                            call.txn, call.partition, error, extra={"txn": call.txn})
            raise
        self.failpoints.hit("participant.after_apply")
        return answer(call, applied_now)

    # -- the node's identity ---------------------------------------------------------------------
    async def _identity_call(self, call: Coroutine[Any, Any, Event], effect: TakeIdentity | CheckIdentity) -> None:
        try:
            event = await call
        except InvariantViolation as error:
            fatal(f"storage refused {effect!r} on {self.identity.name}: {error}")
            return
        if not self.stopped:
            self.feed(event)

    # -- timers, tasks, timing -------------------------------------------------------------------
    def catch_up_after_suspend(self) -> None:
        """The timers a suspend made overdue fire now (timers.TimerTable): the node calls this
        before every event it feeds its core or its partitions."""
        self.timers.catch_up_after_suspend(self._running_loop)

    def _fire(self, timer: Timer) -> None:
        if self.stopped:
            return
        if not self.may_act(timer.owner):
            # The node stalled past its lease and runs its expired timers before the ownership
            # tick that drops the partition: its machines must not act on it any more (asking
            # drops it now, and with it every other timer of its machines;
            # ownership.without_lease_may).
            self.counters["timers_dropped_not_held"] += 1
            return
        self.feed(TimerFired(timer))

    def _termination_ended(self, effect: TerminationEnded) -> None:
        started = self._terminating.pop((effect.where, effect.txn), None)
        if started is None:
            return
        elapsed_ms = (time.perf_counter() - started) * 1000
        self.timings.terminations_ms.append(elapsed_ms)
        if effect.outcome is None:
            log.warning("termination of %s on %s gave up undecided after %.0f ms (its participants terminate it)",
                        effect.txn, effect.where, elapsed_ms, extra={"txn": effect.txn})
            return
        log.info("termination of %s on %s decided %s in %.2f ms", effect.txn, effect.where, effect.outcome,
                 elapsed_ms, extra={"txn": effect.txn})

    async def _die_after_reply(self, rest: list[Effect]) -> None:
        await asyncio.sleep(FAILPOINT_REPLY_FLUSH_S)  # let the reply reach the caller
        self.failpoints.hit("coordinator.after_reply")
        self.run(rest)

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        if self.stopped:
            # Nothing would await or cancel it (found by audit: the idle sweep's aborts sent peer
            # requests during the shutdown).
            coroutine.close()
            return
        self._track(self._running_loop().create_task(coroutine), _UNOWNED)

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        return loop

    def _track(self, task: asyncio.Task[None], flight: _Flight) -> None:
        self._tasks[task] = flight
        task.add_done_callback(self._task_done)

    def cancel_owned(self, owners: set[str]) -> None:
        """Drop the timers and storage calls of hosts that are gone (a partition lost): their
        answers must not reach a host of the same name that a later take makes. A partition
        owner's write is not cancelled but left to finish unanswered: once sent it may land or be
        refused either way, and a refusal is what tells the node it was deposed."""
        assert "" not in owners, "the empty name is _UNOWNED's, no host's"
        self.timers.cancel_owned(owners)
        for task, flight in list(self._tasks.items()):
            if flight.owner in owners:
                flight.dropped = True
                if flight.partition is None:
                    task.cancel()

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.pop(task, None)
        if not task.cancelled() and task.exception() is not None:
            fatal(f"runtime task failed: {task.exception()!r}")

    async def stop(self) -> None:
        self.stopped = True
        self.timers.clear()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


class _Flight:
    """A storage call in flight: the host it is for, the partition whose fence it carries (None:
    not a partition owner's write), and whether the host was dropped since (its answer then goes
    nowhere)."""

    __slots__ = ("dropped", "owner", "partition")

    def __init__(self, owner: str, partition: str | None) -> None:
        self.owner = owner
        self.partition = partition
        self.dropped = False


_UNOWNED = _Flight("", None)  # a task of no host's (no cancel_owned names "")


def _is_vote_write(call: Effect) -> bool:
    """A participant logging its own yes vote (the failpoints around it name that moment)."""
    return (
        isinstance(call, LogOnce | Log)
        and call.state is TxnState.VOTE_YES
        and call.log.kind is LogKind.PARTITION
        and call.log.name == call.owner
    )


def _consumed_by_the_core(effect: object) -> None:
    raise AssertionError(f"{effect!r} left the core: its CoordinatorHost answers it")


def _unwired(_: object) -> None:
    raise AssertionError("EffectRunner used before the node wired its hooks")
