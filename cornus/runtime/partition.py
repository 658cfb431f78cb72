"""The execution side of one partition a node owns: strict-2PL locks, the writes each transaction
buffers until it commits, and a write-through cache of committed data (the owner is the only
writer of its partition, so its cache is never stale).

The protocol machines decide; this module only runs operations, and applies committed redo,
takes locks back, releases them and caches data when the machines' effects say so.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from cornus.protocol.locks import Grant, LockMode, LockTable, Policy, Waiter
from cornus.protocol.txn_ids import begin_ms_of
from cornus.runtime import redo as redo_codec
from cornus.runtime.wire import ExecuteRequest, ExecuteResponse, ExecuteStatus, Op, OpKind, validate_op
from storage_adapters.contract import Fence
from storage_adapters.errors import StorageUnavailable, ValidationError
from storage_adapters.store import LogStore

log = logging.getLogger("cornus.partition")

# Committed values kept in memory per partition; least recently used go first.
CACHE_KEY_COUNT_MAX = 100_000
# Transactions remembered as aborted here, so a late execute for one is refused, not restarted.
ABORTED_REMEMBERED_COUNT_MAX = 10_000


@dataclass(slots=True)
class Execution:
    """A transaction's state on this partition between its first operation and its prepare."""

    coordinator: str
    writes: dict[str, bytes | None] = field(default_factory=dict)
    # Keys a one-shot's request only read, in order: its vote comes before the transaction's last
    # lock elsewhere, so its redo names them for recovery to lock again (redo.py).
    reads: dict[str, None] = field(default_factory=dict)
    last_active_s: float = field(default_factory=time.monotonic)


class PartitionRuntime:
    def __init__(
        self, name: str, store: LogStore, policy: Policy, timeout_ms_lock_wait: int, op_count_max: int,
        *, counters: collections.Counter[str] | None = None,
    ) -> None:
        self.name = name
        # cache_hits and cache_misses: the node's counters, so metrics and `cornus bench` see them.
        self.counters: collections.Counter[str] = counters if counters is not None else collections.Counter()
        self.store = store
        self.locks = LockTable(policy, timeout_ms_lock_wait)
        self.timeout_ms_lock_wait = timeout_ms_lock_wait
        self.op_count_max = op_count_max
        self.executions: dict[str, Execution] = {}
        self._aborted: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._cache: collections.OrderedDict[str, bytes | None] = collections.OrderedDict()
        self._waiters: dict[tuple[str, str], asyncio.Future[Grant]] = {}

    # --- execution phase ---------------------------------------------------------------------

    async def execute(self, request: ExecuteRequest) -> ExecuteResponse:
        assert request.partition == self.name
        txn = request.txn
        if request.abort:
            # Remembered: a request of the transaction still on its way must not start it again.
            self.abort_execution(txn)
            return ExecuteResponse(ExecuteStatus.OK)
        if txn in self._aborted:
            return ExecuteResponse(ExecuteStatus.ABORTED, detail=f"{txn} was aborted on {self.name}")
        if len(request.ops) > self.op_count_max:
            detail = f"{len(request.ops)} ops, the limit is {self.op_count_max}"
            return ExecuteResponse(ExecuteStatus.INVALID, detail=detail)
        try:
            for op in request.ops:
                validate_op(op)
        except ValidationError as error:
            return ExecuteResponse(ExecuteStatus.INVALID, detail=str(error))
        execution = self.executions.get(txn)
        if execution is None and request.continued:
            self.abort_execution(txn)
            return ExecuteResponse(
                ExecuteStatus.ABORTED, detail=f"{self.name} lost the execution state of {txn} (it restarted)"
            )
        if execution is None:
            execution = self.executions[txn] = Execution(request.coordinator)
            self.locks.register(txn, begin_ms_of(txn))
        execution.last_active_s = time.monotonic()
        begin_ms = begin_ms_of(txn)
        for op in request.ops:
            mode = LockMode.EXCLUSIVE if op.kind is OpKind.PUT or op.kind is OpKind.DELETE else LockMode.SHARED
            grant = self.locks.acquire(txn, op.key, mode, begin_ms, _now_ms())
            if grant is Grant.WAITING:  # a coroutine only for a wait: most locks are free
                grant = await self._wait_for_lock(txn, op.key)
            if grant is not Grant.GRANTED:
                self.abort_execution(txn)
                detail = f"key {op.key!r} is locked by another transaction"
                return ExecuteResponse(ExecuteStatus.CONFLICT, detail=detail)
            if txn not in self.executions:
                # Dropped while we waited (the coordinator aborted): do not resurrect it.
                self._release_locks(txn)
                return ExecuteResponse(ExecuteStatus.ABORTED, detail=f"{txn} was aborted on {self.name}")
        # Every key is locked now, so its committed value cannot change under us: the request's
        # reads are served from the cache and ONE storage read for the rest, not a round trip each.
        try:
            committed = await self._read_for(txn, execution, request.ops)
        except StorageUnavailable as error:
            self.abort_execution(txn)
            return ExecuteResponse(ExecuteStatus.UNAVAILABLE, detail=str(error))
        if txn not in self.executions:
            self._release_locks(txn)
            return ExecuteResponse(ExecuteStatus.ABORTED, detail=f"{txn} was aborted on {self.name}")
        values: list[bytes | None] = []
        writes = execution.writes
        carried = bool(request.participants)
        for op in request.ops:
            if op.kind is OpKind.PUT or op.kind is OpKind.DELETE:
                writes[op.key] = op.value if op.kind is OpKind.PUT else None
                continue
            if carried:
                execution.reads[op.key] = None
            current = writes[op.key] if op.key in writes else committed[op.key]
            if op.kind is OpKind.GET:
                values.append(current)
            elif current != op.value:
                self.abort_execution(txn)
                return ExecuteResponse(ExecuteStatus.CHECK_FAILED, detail=f"check of key {op.key!r} failed")
        return ExecuteResponse(ExecuteStatus.OK, tuple(values))

    async def _read_for(self, txn: str, execution: Execution, ops: tuple[Op, ...]) -> dict[str, bytes | None]:
        """The committed value of every key `ops` read that the execution's own writes do not hold
        yet: from the cache, then one storage call for the misses."""
        writes = execution.writes
        committed: dict[str, bytes | None] = {}
        missing: dict[str, None] = {}  # ordered and unique
        cache = self._cache
        for op in ops:
            key = op.key
            if op.kind is OpKind.PUT or op.kind is OpKind.DELETE or key in writes or key in committed:
                continue
            if key in cache:
                cache.move_to_end(key)
                committed[key] = cache[key]
            else:
                missing[key] = None
        self.counters["cache_hits"] += len(committed)
        if missing:
            self.counters["cache_misses"] += len(missing)
            found = await self.store.read_data(self.name, list(missing))
            # What storage answered is the committed value only while this execution's locks kept
            # every writer off those keys. One dropped while the read was out (an abort, its
            # partition lost) let a writer commit meanwhile: its answer may be older than that.
            current = self.executions.get(txn) is execution
            for key in missing:
                committed[key] = found[key]
                if current:
                    self._cache_put(key, found[key])
        return committed

    async def _wait_for_lock(self, txn: str, key: str) -> Grant:
        """The grant of a lock request the table queued (WAITING): GRANTED or ABORT, in time."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Grant] = loop.create_future()
        self._waiters[(txn, key)] = future
        # The lock table bounds the wait; this timer makes the expiry happen on time.
        handle = loop.call_later(self.timeout_ms_lock_wait / 1000 + 0.001, self._expire_waiters)
        try:
            grant = await future
        finally:
            handle.cancel()
            self._waiters.pop((txn, key), None)
        assert grant is not Grant.WAITING
        return grant

    def _expire_waiters(self) -> None:
        expired, granted = self.locks.expire(_now_ms())
        self._wake(expired, Grant.ABORT)
        self._wake(granted, Grant.GRANTED)

    def _wake(self, waiters: list[Waiter], grant: Grant) -> None:
        for waiter in waiters:
            future = self._waiters.get((waiter.txn, waiter.key))
            if future is not None and not future.done():
                future.set_result(grant)

    def ended_execution(self, txn: str) -> tuple[str, bytes] | None:
        """At prepare (or the release of a partition only read): the coordinator and the redo of
        what `txn` wrote here, empty if it only read; None if its execution state is gone. The
        execution stays until the machine releases it, with its locks."""
        execution = self.executions.get(txn)
        if execution is None:
            return None
        writes = execution.writes
        reads = [key for key in execution.reads if key not in writes]
        return execution.coordinator, redo_codec.encode(writes, reads) if writes or reads else b""

    def abort_execution(self, txn: str) -> None:
        """Abort before prepare: nobody can have voted for it here, so nothing is logged."""
        self._aborted[txn] = None
        while len(self._aborted) > ABORTED_REMEMBERED_COUNT_MAX:
            self._aborted.popitem(last=False)
        self.drop(txn)

    def drop(self, txn: str) -> None:
        self.executions.pop(txn, None)
        self.release(txn)

    def idle_since(self, txn: str) -> float | None:
        execution = self.executions.get(txn)
        return None if execution is None else execution.last_active_s

    # --- commit side -------------------------------------------------------------------------

    def retake_locks(self, txn: str, redo: bytes) -> None:
        """Recovery: lock what an unfinished record will write (and what a one-shot's read),
        before anyone else can. It voted yes (or committed), so its locks go at the decision:
        conflicting requests wait."""
        self.locks.register(txn, begin_ms_of(txn))
        written, read = redo_codec.lock_keys(redo)
        for key in written:
            self.locks.retake(txn, key)
        for key in read:
            self.locks.retake(txn, key, LockMode.SHARED)
        self.locks.mark_prepared(txn)

    def release(self, txn: str) -> None:
        self.executions.pop(txn, None)
        self._release_locks(txn)

    def _release_locks(self, txn: str) -> None:
        # Every release must wake the waiters it grants: a grant nobody hears of would hold the
        # key for a request that never learns it got it.
        self._wake(self.locks.release(txn), Grant.GRANTED)
        if self._waiters:
            # And its own requests still queued for a lock (the release took them out of the
            # queue): refused now, not left waiting until their deadline.
            for (waiter_txn, _), future in list(self._waiters.items()):
                if waiter_txn == txn and not future.done():
                    future.set_result(Grant.ABORT)

    async def apply(self, txn: str, redo: bytes, fence: Fence) -> bool:
        """One attempt to apply a committed redo: True if this call applied it, False if an earlier
        one did (StorageUnavailable: unknown; the participant machine retries; Fenced: this node
        is no longer the owner)."""
        writes = redo_codec.decode(redo)
        applied_now = await self.store.apply_redo(self.name, txn, writes, fence)
        if log.isEnabledFor(logging.DEBUG):  # the write list is built only when someone reads it
            shown = {key: None if value is None else value[:16] for key, value in writes.items()}
            log.debug("apply of %s on %s: %s, writes %s", txn, self.name,
                      "applied" if applied_now else "applied before", shown, extra={"txn": txn})
        return applied_now

    def cache_redo(self, redo: bytes) -> None:
        """The machine says this redo is in storage and its keys are still locked by it."""
        for key, value in redo_codec.decode(redo).items():
            self._cache_put(key, value)

    def close(self) -> None:
        """The partition is lost: every request waiting for a lock here is refused, now."""
        for future in self._waiters.values():
            if not future.done():
                future.set_result(Grant.ABORT)
        self.executions.clear()

    def sweep_idle(self, idle_s: float, busy: Callable[[str], bool]) -> int:
        """Drop executions idle longer than `idle_s` that no machine owns (`busy`): their
        coordinator is gone or gave up. Returns how many were dropped."""
        now = time.monotonic()
        idle = [txn for txn, e in self.executions.items() if now - e.last_active_s > idle_s and not busy(txn)]
        for txn in idle:
            self.abort_execution(txn)
        return len(idle)

    def _cache_put(self, key: str, value: bytes | None) -> None:
        self._cache[key] = value
        self._cache.move_to_end(key)
        while len(self._cache) > CACHE_KEY_COUNT_MAX:
            self._cache.popitem(last=False)


def _now_ms() -> int:
    return int(time.monotonic() * 1000)
