"""The execution side of one partition a node owns, as I/O around the core's rules
(cornus.protocol.execution: locks, buffered writes, refusals, the owner's write-through cache):
it runs a request's operations, waits for a lock under WAIT_DIE, reads storage on a cache miss,
and applies committed redo when the machines' effects say so.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable

from cornus.protocol.events import Executed
from cornus.protocol.execution import BUFFERED_BYTES_MAX, Execution, PartitionExecutions, Refusal
from cornus.protocol.locks import Grant, LockMode, Policy, Waiter
from cornus.runtime import redo as redo_codec
from cornus.runtime.keys import partition_of
from cornus.runtime.wire import (
    READ_BYTES_MAX,
    READ_VALUE_OVERHEAD_BYTES,
    ExecuteRequest,
    ExecuteResponse,
    ExecuteStatus,
    Op,
    OpKind,
    validate_op,
)
from storage_adapters.contract import DATA_VALUE_BYTES_MAX, Fence
from storage_adapters.errors import StorageUnavailable, ValidationError
from storage_adapters.store import LogStore

log = logging.getLogger("cornus.partition")


_WRITES = (OpKind.PUT, OpKind.DELETE)
# A request of at most this many operations cannot read past READ_BYTES_MAX, so only a longer one
# (or one with a smaller budget of its own) pays for counting what it reads.
_OP_COUNT_READS_ALWAYS_FIT = READ_BYTES_MAX // (DATA_VALUE_BYTES_MAX + READ_VALUE_OVERHEAD_BYTES)
_READ_BYTES_ALWAYS_FIT = _OP_COUNT_READS_ALWAYS_FIT * (DATA_VALUE_BYTES_MAX + READ_VALUE_OVERHEAD_BYTES)


class PartitionRuntime:
    def __init__(
        self, name: str, store: LogStore, policy: Policy, timeout_ms_lock_wait: int, op_count_max: int,
        *, partition_count: int, counters: collections.Counter[str] | None = None, tenure_began_ms: int = 0,
        clock_slack_ms: int = 0,
    ) -> None:
        assert name[:1] == "p" and name[1:].isdigit() and int(name[1:]) < partition_count, (
            f"{name} is not one of p0..p{partition_count - 1}"
        )
        self.name = name
        # The node's count, which places every key: an operation on a key placed elsewhere is
        # refused (execute), since a peer that counts otherwise would store and lock it here
        # while every other node finds it in another partition.
        self.partition_count = partition_count
        # cache_hits and cache_misses: the node's counters, so metrics and `cornus bench` see them.
        self.counters: collections.Counter[str] = counters if counters is not None else collections.Counter()
        self.store = store
        self.state: PartitionExecutions[bytes] = PartitionExecutions(
            name, redo_codec, policy, timeout_ms_lock_wait, tenure_began_ms=tenure_began_ms,
            clock_slack_ms=clock_slack_ms,
        )
        # The core's own objects, never rebound: what admin listings and tests look at.
        self.locks = self.state.locks
        self.executions = self.state.executions
        self.timeout_ms_lock_wait = timeout_ms_lock_wait
        self.op_count_max = op_count_max
        self._waiters: dict[tuple[str, str], asyncio.Future[Grant]] = {}

    # --- execution phase ---------------------------------------------------------------------

    async def execute(self, request: ExecuteRequest) -> ExecuteResponse:
        assert request.partition == self.name
        txn = request.txn
        state = self.state
        if request.abort:
            # Remembered: a request of the transaction still on its way must not start it again.
            self.abort_execution(txn)
            return ExecuteResponse(ExecuteStatus.OK)
        if len(request.ops) > self.op_count_max:
            detail = f"{len(request.ops)} ops, the limit is {self.op_count_max}"
            return ExecuteResponse(ExecuteStatus.INVALID, detail=detail)
        try:
            for op in request.ops:
                validate_op(op)
        except ValidationError as error:
            return ExecuteResponse(ExecuteStatus.INVALID, detail=str(error))
        for op in request.ops:
            placed = partition_of(op.key, self.partition_count)
            if placed != self.name:
                detail = (f"key {op.key!r} is in {placed} of this node's {self.partition_count} partitions, not "
                          f"{self.name}: the nodes disagree on partition_count")
                return ExecuteResponse(ExecuteStatus.INVALID, detail=detail)
        now_ms = _now_ms()
        execution = state.begin(txn, request.coordinator, now_ms, continued=request.continued)
        if execution is Refusal.ABORTED:
            return ExecuteResponse(ExecuteStatus.ABORTED, detail=f"{txn} was aborted on {self.name}")
        if execution is Refusal.DUPLICATE:
            # ABORTED, no refusal: the transaction's other request may vote here (Refusal.DUPLICATE).
            return ExecuteResponse(ExecuteStatus.ABORTED, detail=f"{txn} is already executing on {self.name}")
        if execution is Refusal.ENDED:
            return ExecuteResponse(ExecuteStatus.ABORTED, detail=f"{txn} already ran on {self.name}, and ended")
        if execution is Refusal.BEFORE_TENURE:
            # As ENDED: its run under the partition's earlier owner may have voted here.
            return ExecuteResponse(ExecuteStatus.ABORTED, detail=(
                f"{txn} began before {self.name}'s current owner took it over, and may have run under the earlier one"))
        if execution is Refusal.STATE_LOST:
            return ExecuteResponse(
                ExecuteStatus.ABORTED, detail=f"{self.name} lost the execution state of {txn} (it restarted)"
            )
        assert isinstance(execution, Execution)
        # Reserved now, before any wait lets another request in; an execution that fails from here
        # on is released, and gives back its bytes with it.
        reserved = sum(state.write_bytes(op.key, op.value) for op in request.ops if op.kind in _WRITES)
        if not state.reserve(execution, reserved):
            detail = (f"{self.name} has {state.buffered_bytes} bytes of writes buffered, and this request's "
                      f"{reserved} would pass the limit of {BUFFERED_BYTES_MAX}")
            self.abort_execution(txn)
            self.counters["executions_refused_buffer_full"] += 1
            return ExecuteResponse(ExecuteStatus.UNAVAILABLE, detail=detail)
        response: ExecuteResponse | None = None
        try:
            response = await self._locked_execute(request, execution)
            return response
        finally:
            if response is None and state.is_current(txn, execution):
                # Cancelled (its caller's deadline: its coordinator aborts the transaction) or
                # failed while it read: its locks go now, as a cancelled lock wait's do (found by
                # audit, 2026-11-28: they stayed until the coordinator's abort came, or 60 s).
                self.abort_execution(txn)
            elif response is not None and response.status is ExecuteStatus.INVALID and state.is_current(txn, execution):
                state.unreserve(execution, reserved)  # refused before it wrote anything

    async def _locked_execute(self, request: ExecuteRequest, execution: Execution[bytes]) -> ExecuteResponse:
        """Lock, read and write; every answer but OK ends the execution (and its bytes)."""
        txn = request.txn
        state = self.state
        now_ms = _now_ms()
        for op in request.ops:
            mode = LockMode.EXCLUSIVE if op.kind is OpKind.PUT or op.kind is OpKind.DELETE else LockMode.SHARED
            grant = state.lock(txn, op.key, mode, now_ms)
            if grant is Grant.WAITING:  # a coroutine only for a wait: most locks are free
                grant = await self._wait_for_lock(txn, op.key)
                now_ms = _now_ms()
            if grant is not Grant.GRANTED:
                self.abort_execution(txn)
                detail = f"key {op.key!r} is locked by another transaction"
                return ExecuteResponse(ExecuteStatus.CONFLICT, detail=detail)
            if not state.is_current(txn, execution):
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
        if not state.is_current(txn, execution):
            self._release_locks(txn)
            return ExecuteResponse(ExecuteStatus.ABORTED, detail=f"{txn} was aborted on {self.name}")
        writes = execution.writes
        if len(request.ops) > _OP_COUNT_READS_ALWAYS_FIT or 0 < request.read_bytes_max < _READ_BYTES_ALWAYS_FIT:
            read_bytes = _read_bytes(request.ops, writes, committed)
            if read_bytes > _read_limit_bytes(request):
                return self._refuse_reads_too_large(request, execution, read_bytes)
        values: list[bytes | None] = []
        carried = bool(request.participants)
        for op in request.ops:
            if op.kind is OpKind.PUT or op.kind is OpKind.DELETE:
                state.buffer_write(execution, op.key, op.value if op.kind is OpKind.PUT else None)
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

    def _refuse_reads_too_large(
        self, request: ExecuteRequest, execution: Execution[bytes], read_bytes: int,
    ) -> ExecuteResponse:
        """Refuse a request whose answer would not fit a peer message (READ_BYTES_MAX), or that
        reads past the share of a one-shot's whole it carries (ExecuteRequest.read_bytes_max),
        before it wrote or voted, as the core's rule has it (PartitionExecutions.refuse_after_begin)."""
        status, granted = self.state.refuse_after_begin(
            request.txn, execution, carries_prepare=bool(request.participants), continued=request.continued)
        self._wake(granted, Grant.GRANTED)
        if status is ExecuteStatus.ABORTED or request.participants:
            self._wake_own_waiters(request.txn)  # as abort_execution does
        self.counters["executions_refused_reads_too_large"] += 1
        budget_bytes = _read_limit_bytes(request)
        detail = (f"the values read on {self.name} come to {read_bytes} bytes, the limit is {budget_bytes} "
                  "for this request to a partition (READ_BYTES_MAX, or a one-shot's share of what it may read "
                  "in all): read fewer keys at a time")
        return ExecuteResponse(status, detail=detail)

    async def _read_for(
        self, txn: str, execution: Execution[bytes], ops: tuple[Op, ...],
    ) -> dict[str, bytes | None]:
        """The committed value of every key `ops` read that the execution's own writes do not hold
        yet: from the cache, then one storage call for the misses."""
        writes = execution.writes
        committed: dict[str, bytes | None] = {}
        missing: dict[str, None] = {}  # ordered and unique
        cached = self.state.cached
        for op in ops:
            key = op.key
            if op.kind is OpKind.PUT or op.kind is OpKind.DELETE or key in writes or key in committed:
                continue
            hit, value = cached(key)
            if hit:
                committed[key] = value
            else:
                missing[key] = None
        self.counters["cache_hits"] += len(committed)
        if missing:
            self.counters["cache_misses"] += len(missing)
            found = await self.store.read_data(self.name, list(missing))
            self.state.read_landed(txn, execution, found)
            for key in missing:
                committed[key] = found[key]
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
        except asyncio.CancelledError:
            # The request's caller gave up on it (its deadline): its coordinator aborts the
            # transaction, and a queued request nobody waits for must never be granted the lock.
            self.abort_execution(txn)
            raise
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

    def ended_execution(self, txn: str, read_only: bool) -> Executed | None:
        """At prepare (or the release of a partition only read): the event that tells the machine
        what the execution left; None if its state is gone."""
        return self.state.ended(txn, read_only)

    def abort_execution(self, txn: str) -> None:
        """Abort before prepare: nobody can have voted for it here, so nothing is logged."""
        self._wake(self.state.abort(txn), Grant.GRANTED)
        self._wake_own_waiters(txn)

    def idle_since_ms(self, txn: str) -> int | None:
        execution = self.executions.get(txn)
        return None if execution is None else execution.last_active_ms

    # --- commit side -------------------------------------------------------------------------

    def retake_locks(self, txn: str, redo: bytes) -> None:
        self.state.retake_locks(txn, redo)

    def release(self, txn: str) -> None:
        self._release_locks(txn)

    def _release_locks(self, txn: str) -> None:
        # Every release must wake the waiters it grants: a grant nobody hears of would hold the
        # key for a request that never learns it got it.
        self._wake(self.state.release(txn), Grant.GRANTED)
        self._wake_own_waiters(txn)

    def _wake_own_waiters(self, txn: str) -> None:
        if self._waiters:
            # The transaction's own requests still queued for a lock (its release took them out of
            # the queue): refused now, not left waiting until their deadline.
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
        self.state.cache_redo(redo)

    def close(self) -> None:
        """The partition is lost: every request waiting for a lock here is refused, now."""
        for future in self._waiters.values():
            if not future.done():
                future.set_result(Grant.ABORT)
        self.state.close()

    def sweep_idle(self, idle_ms: int, busy: Callable[[str], bool]) -> int:
        """Drop executions idle longer than `idle_ms` that no machine owns (`busy`): their
        coordinator is gone or gave up. Returns how many were dropped."""
        dropped = 0
        for txn in self.state.idle(_now_ms(), idle_ms):
            granted = self.state.idle_out(txn, busy(txn))
            if granted is not None:
                self._wake(granted, Grant.GRANTED)
                self._wake_own_waiters(txn)
                dropped += 1
        return dropped


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


def _read_limit_bytes(request: ExecuteRequest) -> int:
    """What `request` may read: READ_BYTES_MAX, or less where it carries a smaller budget."""
    return min(READ_BYTES_MAX, request.read_bytes_max) if request.read_bytes_max > 0 else READ_BYTES_MAX


def _read_bytes(ops: tuple[Op, ...], writes: dict[str, bytes | None], committed: dict[str, bytes | None]) -> int:
    """What the GETs of `ops` answer, as READ_BYTES_MAX counts it: each sees the writes before it
    (the execution's, then the earlier operations of `ops`), else the committed value."""
    written: dict[str, bytes | None] = {}
    total = 0
    for op in ops:
        if op.kind is OpKind.PUT or op.kind is OpKind.DELETE:
            written[op.key] = op.value
        elif op.kind is OpKind.GET:
            key = op.key
            value = written[key] if key in written else writes[key] if key in writes else committed[key]
            total += READ_VALUE_OVERHEAD_BYTES + (0 if value is None else len(value))
    return total
