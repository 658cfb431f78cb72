"""The execution side of one partition a node owns: strict-2PL locks, the writes each transaction
buffers until it commits, and a write-through cache of committed data (the owner is the only
writer of its partition, so its cache is never stale).

The protocol machines decide; this module only runs operations, applies committed redo and
releases locks when told to.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from dataclasses import dataclass, field

from cornus.protocol.locks import Grant, LockMode, LockTable, Policy, Waiter
from cornus.runtime import redo as redo_codec
from cornus.runtime.txn_ids import begin_ms_of
from cornus.runtime.wire import ExecuteRequest, ExecuteResponse, ExecuteStatus, Op, OpKind
from storage_adapters.contract import DATA_VALUE_BYTES_MAX, LogStore, validate_data_key
from storage_adapters.errors import StorageUnavailable, ValidationError

log = logging.getLogger("cornus.partition")

# Committed values kept in memory per partition; least recently used go first.
CACHE_KEY_COUNT_MAX = 100_000
# Transactions remembered as aborted here, so a late execute for one is refused, not restarted.
ABORTED_REMEMBERED_COUNT_MAX = 10_000
# Applying a committed redo retries while storage is unreachable: the data must get there, and the
# locks stay held until it does. Past this many attempts the node gives up on this redo; the record
# stays COMMIT-unapplied and the next recovery applies it.
APPLY_ATTEMPT_COUNT_MAX = 200
APPLY_BACKOFF_MS_MAX = 2_000


@dataclass(slots=True)
class Execution:
    """A transaction's state on this partition between its first operation and its prepare."""

    coordinator: str
    writes: dict[str, bytes | None] = field(default_factory=dict)
    last_active_s: float = field(default_factory=time.monotonic)


class PartitionRuntime:
    def __init__(
        self, name: str, store: LogStore, policy: Policy, timeout_ms_lock_wait: int, op_count_max: int
    ) -> None:
        self.name = name
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
            self.drop(txn)
            return ExecuteResponse(ExecuteStatus.OK)
        if request.end_read_only:
            if request.ops:
                return ExecuteResponse(ExecuteStatus.INVALID, detail="end_read_only carries no operations")
            return self._end_read_only(txn)
        if txn in self._aborted:
            return ExecuteResponse(ExecuteStatus.ABORTED, detail=f"{txn} was aborted on {self.name}")
        if len(request.ops) > self.op_count_max:
            detail = f"{len(request.ops)} ops, the limit is {self.op_count_max}"
            return ExecuteResponse(ExecuteStatus.INVALID, detail=detail)
        try:
            for op in request.ops:
                _validate_op(op)
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
        values: list[bytes | None] = []
        for op in request.ops:
            mode = LockMode.EXCLUSIVE if op.kind in (OpKind.PUT, OpKind.DELETE) else LockMode.SHARED
            if not await self._lock(txn, op.key, mode):
                self.abort_execution(txn)
                detail = f"key {op.key!r} is locked by another transaction"
                return ExecuteResponse(ExecuteStatus.CONFLICT, detail=detail)
            if txn not in self.executions:
                # Dropped while we waited (the coordinator aborted): do not resurrect it.
                self._release_locks(txn)
                return ExecuteResponse(ExecuteStatus.ABORTED, detail=f"{txn} was aborted on {self.name}")
            if op.kind is OpKind.PUT or op.kind is OpKind.DELETE:
                execution.writes[op.key] = op.value if op.kind is OpKind.PUT else None
                continue
            try:
                current = execution.writes[op.key] if op.key in execution.writes else await self.read_committed(op.key)
            except StorageUnavailable as error:
                self.abort_execution(txn)
                return ExecuteResponse(ExecuteStatus.UNAVAILABLE, detail=str(error))
            if op.kind is OpKind.GET:
                values.append(current)
            elif current != op.value:
                self.abort_execution(txn)
                return ExecuteResponse(ExecuteStatus.CHECK_FAILED, detail=f"check of key {op.key!r} failed")
        return ExecuteResponse(ExecuteStatus.OK, tuple(values))

    def _end_read_only(self, txn: str) -> ExecuteResponse:
        execution = self.executions.get(txn)
        if execution is None:
            # Strict 2PL needs the read locks held until the commit point; without them another
            # transaction may have overwritten what this one read, so it must not commit.
            return ExecuteResponse(
                ExecuteStatus.ABORTED, detail=f"{self.name} lost the read locks of {txn} (restart or idle timeout)"
            )
        assert not execution.writes, f"{txn} wrote on {self.name}, which its coordinator calls read-only"
        self.drop(txn)
        return ExecuteResponse(ExecuteStatus.OK)

    async def _lock(self, txn: str, key: str, mode: LockMode) -> bool:
        loop = asyncio.get_running_loop()
        grant = self.locks.acquire(txn, key, mode, begin_ms_of(txn), _now_ms())
        if grant is Grant.WAITING:
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
        return grant is Grant.GRANTED

    def _expire_waiters(self) -> None:
        expired, granted = self.locks.expire(_now_ms())
        self._wake(expired, Grant.ABORT)
        self._wake(granted, Grant.GRANTED)

    def _wake(self, waiters: list[Waiter], grant: Grant) -> None:
        for waiter in waiters:
            future = self._waiters.get((waiter.txn, waiter.key))
            if future is not None and not future.done():
                future.set_result(grant)

    def take_redo(self, txn: str) -> bytes | None:
        """At prepare: the redo of what `txn` wrote here (None if its execution state is gone)."""
        execution = self.executions.get(txn)
        return None if execution is None else redo_codec.encode(execution.writes)

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

    def retake_locks(self, txn: str, redo: bytes, prepared: bool) -> None:
        """Recovery: lock what an unfinished record will write, before anyone else can."""
        self.locks.register(txn, begin_ms_of(txn))
        for key in redo_codec.decode(redo):
            self.locks.retake(txn, key)
        if prepared:
            self.locks.mark_prepared(txn)

    def release(self, txn: str) -> None:
        self.executions.pop(txn, None)
        self._release_locks(txn)

    def _release_locks(self, txn: str) -> None:
        # Every release must wake the waiters it grants: a grant nobody hears of would hold the
        # key for a request that never learns it got it.
        self._wake(self.locks.release(txn), Grant.GRANTED)

    async def apply(self, txn: str, redo: bytes, backoff_ms_min: int) -> bool:
        """Apply a committed redo; True once it is in storage."""
        writes = redo_codec.decode(redo)
        delay_ms = backoff_ms_min
        for attempt in range(APPLY_ATTEMPT_COUNT_MAX):
            try:
                applied_now = await self.store.apply_redo(self.name, txn, writes)
                break
            except StorageUnavailable as error:
                if attempt == 0 or attempt % 20 == 0:
                    log.warning("apply of %s on %s: storage unavailable (%s), retrying", txn, self.name, error,
                                extra={"txn": txn})
                await asyncio.sleep(delay_ms / 1000)
                delay_ms = min(delay_ms * 2, APPLY_BACKOFF_MS_MAX)
        else:
            log.error("apply of %s on %s gave up after %d attempts; recovery will apply it",
                      txn, self.name, APPLY_ATTEMPT_COUNT_MAX, extra={"txn": txn})
            return False
        if log.isEnabledFor(logging.DEBUG):  # the write list is built only when someone reads it
            shown = {key: None if value is None else value[:16] for key, value in writes.items()}
            log.debug("apply of %s on %s: %s, writes %s", txn, self.name,
                      "applied" if applied_now else "applied before", shown, extra={"txn": txn})
        if applied_now:
            # Only now: a redo applied before (a duplicate COMMIT of a finished transaction) is
            # older than what later transactions wrote, and must not reach the cache either.
            for key, value in writes.items():
                self._cache_put(key, value)
        return True

    async def read_committed(self, key: str) -> bytes | None:
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        value = (await self.store.read_data(self.name, [key]))[key]
        self._cache_put(key, value)
        return value

    def _cache_put(self, key: str, value: bytes | None) -> None:
        self._cache[key] = value
        self._cache.move_to_end(key)
        while len(self._cache) > CACHE_KEY_COUNT_MAX:
            self._cache.popitem(last=False)


def _validate_op(op: Op) -> None:
    if not isinstance(op.kind, OpKind):
        raise ValidationError(f"unknown op {op.kind!r}")
    validate_data_key(op.key)
    if op.kind is OpKind.PUT and op.value is None:
        raise ValidationError(f"put of {op.key!r} needs a value")
    if op.kind in (OpKind.GET, OpKind.DELETE) and op.value is not None:
        raise ValidationError(f"{op.kind} of {op.key!r} takes no value")
    if op.value is not None and len(op.value) > DATA_VALUE_BYTES_MAX:
        raise ValidationError(f"value of {op.key!r} is {len(op.value)} bytes, the limit is {DATA_VALUE_BYTES_MAX}")


def _now_ms() -> int:
    return int(time.monotonic() * 1000)
