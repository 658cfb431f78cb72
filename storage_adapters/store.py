"""`LogStore`, the storage contract's interface (storage_adapters/contract.py says what each
call must do), as a template that every backend fills in: the public methods validate their
arguments, bound each call by the store's deadline, map the backend's errors and coalesce the
deletes of one event-loop tick, once, here; a backend implements only its I/O. Apart from the
value types of contract.py because this needs asyncio, and the protocol core, which imports
those, must not."""

from __future__ import annotations

import abc
import asyncio
import contextlib
import contextvars
import copy
import dataclasses
import inspect
import time
from collections.abc import Awaitable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar

from storage_adapters.contract import (
    IDENTITY_PAGE_COUNT_MAX,
    SCAN_CALL_COUNT_MAX,
    SCAN_PAGE_COUNT_MAX,
    Fence,
    LogId,
    LogOnceResult,
    Ownership,
    OwnerWriteResult,
    Record,
    RecordBody,
    ScanPage,
    Tombstone,
    TxnState,
    validate_body,
    validate_data_keys,
    validate_fence,
    validate_identity_after,
    validate_identity_limit,
    validate_log,
    validate_log_fence,
    validate_not_cluster_log,
    validate_owner_partitions,
    validate_owner_write,
    validate_partition,
    validate_scan_after,
    validate_scan_limit,
    validate_state,
    validate_tombstone,
    validate_txn,
    validate_writes,
)
from storage_adapters.errors import InvariantViolation, StorageError, StorageUnavailable

# Deletes one coalesced backend request may carry. A Redis script blocks the server for everyone
# while it runs (about 3 us per record deleted, so ~0.4 ms at this size), and past a few dozen the
# per-request cost is already spread thin: garbage collection
# gains little from bigger batches and other clients' latency would pay for them.
DELETE_BATCH_COUNT_MAX = 128

T = TypeVar("T")


# The clock a suspend of the machine advances (a paused VM, a frozen container), which the event
# loop's does not: Linux's CLOCK_BOOTTIME, else the monotonic clock (the leases' clock too,
# cornus.runtime.clocks, which this layer may not import).
_BOOT_CLOCK = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)


def boot_clock_s() -> float:
    """Seconds on the boot clock: never stepped (as the wall clock is by NTP), and counting the
    time a suspend took (as the event loop's clock does not)."""
    return time.clock_gettime_ns(_BOOT_CLOCK) / 1e9


async def _in_a_task(loop: asyncio.AbstractEventLoop, call: Awaitable[T], ends_s: float) -> T:
    """`call`'s result, run in a task of its own, cancelled at `ends_s` (TimeoutError): for code run
    eagerly, outside any task (cornus.runtime.eager: a peer's request served in the step that read
    it). asyncio.timeout needs a task to cancel, and so do the client libraries' own timeouts; so
    does asyncio.wait_for since Python 3.12 (found by audit: every call made so would fail there).
    The task inherits the deadline's context."""
    task = loop.create_task(call)  # type: ignore[arg-type]
    try:
        done, _ = await asyncio.wait((task,), timeout=max(0.0, ends_s - loop.time()))
    except asyncio.CancelledError:
        _abandon(task)  # its caller gave up: so does the call, as wait_for would
        raise
    if not done:
        _abandon(task)
        raise TimeoutError
    return task.result()


def _abandon(task: asyncio.Task[Any]) -> None:
    """Cancel `task`, whose caller no longer waits for it: an error it still ends with (one its
    I/O raised as the deadline came) is retrieved here, not logged as "never retrieved" (found by
    the chaos tool's Azure runs, 2026-11-28: a read's timeout there, its caller long answered)."""
    task.cancel()
    task.add_done_callback(lambda done: done.cancelled() or done.exception())


@dataclasses.dataclass(frozen=True, slots=True)
class CallDeadline:
    """A call's deadline in the loop's clock, and the same moment in the boot clock, both fixed
    when it was set: what is left of it is the lesser of the two, so that a suspend since (which
    stops the loop's clock) counts (found by a read-only audit: a write whose deadline a lease
    gate had fixed, sent after a suspend, kept its whole deadline after it, and the backends
    turned that into the deadline the server checks)."""

    loop_s: float
    boot_s: float

    @classmethod
    def after(cls, seconds: float) -> CallDeadline:
        """`seconds` from now, fixed now: fix it when the condition it rests on is checked, not
        later, or a suspend in between is not counted."""
        return cls(asyncio.get_running_loop().time() + seconds, boot_clock_s() + seconds)

    def loop_time(self) -> float:
        """The deadline in the loop's clock now: earlier than set by any suspend since."""
        now_s = asyncio.get_running_loop().time()
        return now_s + self.left_s(now_s)

    def left_s(self, now_s: float) -> float:
        """What is left of it at `now_s` (the loop's clock, read by the caller): the lesser of the
        two clocks' reckonings; 0 or less once it has passed."""
        return min(self.loop_s - now_s, self.boot_s - boot_clock_s())


# The deadline of the call that the running task is inside: the moment the template's timer tells
# the caller that the call failed. Set by `_bounded` around a backend's protected method, so a
# backend whose I/O may still land after its caller stopped waiting (the emulator's writer
# process) can bound that I/O by the very deadline the caller is held to, fixed when the call
# started, before any await.
_call_deadline: contextvars.ContextVar[CallDeadline] = contextvars.ContextVar("cornus_storage_call_deadline")


def raise_if_call_deadline_passed(what: str) -> None:
    """TimeoutError (StorageUnavailable to the caller) if the running call's deadline has passed,
    counting a suspend (CallDeadline.left_s): for a backend that sends a call's requests one after
    another (retries, chunks) to the server that checks no deadline of ours. The template's timer
    would cancel it, but runs on the loop's clock, which a suspend stops (found by audit
    (2026-11-27): a DynamoDB retry left an hour past its deadline after a suspend in its pause)."""
    deadline = _call_deadline.get(None)
    if deadline is not None and deadline.left_s(asyncio.get_running_loop().time()) <= 0:
        raise TimeoutError(f"{what}: the call's deadline passed before its next request")


def call_deadline() -> float:
    """The `loop.time()` at which the caller of the running storage call is told that it failed.
    Only inside a backend's protected method under the template's own timer (not one of
    `_calls_bounded_by_io`)."""
    return _call_deadline.get().loop_time()


@contextlib.contextmanager
def call_deadline_at(deadline: CallDeadline | None) -> Iterator[None]:
    """Bound the storage calls made inside the block by `deadline` (None: no bound beyond their
    own): for a caller that decided to make a call under a condition that held only when it
    checked it (a lease), fixing the deadline then (CallDeadline.after, which counts a
    suspend of the machine from then on), so that a stall between the check and the call cannot
    push the call's deadline later. Only around the call itself: reset on leaving,
    so that nothing the caller does afterwards (feeding the answer to the core, which starts other
    calls and timers in this context) inherits a bound that is not its own (found by review)."""
    if deadline is None:
        yield
        return
    token = _call_deadline.set(deadline)
    try:
        yield
    finally:
        _call_deadline.reset(token)


def call_deadline_if_set() -> float | None:
    """`call_deadline()` where the template fixed one, for a call bounded by its own I/O too (a
    batch of coalesced deletes, bounded by its earliest caller's deadline); None elsewhere."""
    fixed = _call_deadline.get(None)
    return None if fixed is None else fixed.loop_time()


def whole_page(records: Sequence[Record], limit: int, *, cut: bool = False) -> ScanPage:
    """The page of a backend whose scan walks only unfinished records (an index): it stops short of
    `limit` only at the log's end, or where `cut` at SCAN_PAGE_BYTES_MAX (contract.PageBytes)."""
    return ScanPage(tuple(records), records[-1].txn if len(records) == limit or cut else None)


class DeleteRequest(NamedTuple):
    """One caller's `delete`, validated, as a backend's `_delete_many` gets it in a batch."""

    log: LogId
    txn: str
    fence: Fence | None
    keep: Tombstone | None = None


def _expire(future: asyncio.Future[Any]) -> None:
    if not future.done():
        future.set_exception(TimeoutError())


class _WaitingDelete(NamedTuple):
    """A caller's delete waiting for the end of its tick, with its own deadline."""

    request: DeleteRequest
    future: asyncio.Future[bool]
    deadline: CallDeadline


class LogStore(abc.ABC):
    """The storage contract. Every method has a deadline (the store's `timeout_ms_call`) and raises
    StorageUnavailable when the backend does not answer within it; ValidationError (before any
    I/O) for bad arguments; DecisionFlipRefused for a refused `log`.

    A template: the public methods validate their arguments, bound the call by the deadline and
    map the backend's errors, once, here; a backend implements the protected methods of the same
    names (`_log_once`, ...), which get validated arguments and do only the I/O, and
    `_storage_error`, its error mapping. Deletes issued in one event-loop tick are joined here
    into `_delete_many` batches where the backend says it can carry several in one request
    (`coalesces_deletes`). A store that wraps another (`DelegatingStore`) forwards whole calls
    instead, so the inner store's template does all of that, once.

    A call's deadline is fixed when it starts, before its first await, and `call_deadline()`
    tells it to the backend's protected method: a backend whose I/O could land after its caller
    gave up (a request queued in another process) sends it along, so storage refuses the request
    past the very moment its caller is told that it failed."""

    backend_name: str = "abstract"
    # Calls (by method name) that the backend's I/O layer already bounds by timeout_ms_call with
    # a timer of its own, raising TimeoutError: the base adds no second timer to those. Redis's
    # pipelined scripts are: a bare timer per call there, where asyncio.timeout costs ~3 us.
    # Their protected methods get no `call_deadline()`.
    _calls_bounded_by_io: frozenset[str] = frozenset()
    # Whether `_delete_many` carries several records in fewer requests than one each: then the
    # deletes of a tick are batched, else each goes to `_delete` alone, as cheaply as any call.
    coalesces_deletes: bool = False
    # Whether storage itself drops a tombstone soon after its keep_ms (Redis's key expiry, the
    # emulator's purge), or leaves it to a service-side rule that takes days (DynamoDB's table
    # TTL, an Azure lifecycle rule): the suite waits for the drop only where it is prompt.
    drops_tombstones_at_expiry: bool = False

    def __init__(self, timeout_ms_call: int) -> None:
        assert timeout_ms_call > 0, timeout_ms_call
        self.timeout_ms_call = timeout_ms_call
        self._timeout_s = timeout_ms_call / 1000
        # Deletes waiting for the end of their tick, per event loop: a batch is one loop's. (The
        # template serves any loop; a backend may allow only one, as the emulator does.)
        self._deletes_waiting: dict[asyncio.AbstractEventLoop, list[_WaitingDelete]] = {}
        # Batches in flight: the event loop keeps only weak references to tasks.
        self._delete_batches: set[asyncio.Task[None]] = set()

    # --- the template ------------------------------------------------------------------------

    async def _bounded(self, call: Awaitable[T], what: str, deadline: CallDeadline | None = None) -> T:
        """`call`'s result within the call deadline (`deadline`, or timeout_ms_call from now);
        TimeoutError (ours or the I/O layer's) as StorageUnavailable, the backend's own errors as
        `_storage_error` maps them. The deadline is fixed here, before `call` first runs, and
        `call_deadline()` tells it to the backend. A call whose deadline has passed already is
        never started: a backend may send its request before it first waits, which is when the
        timer could cancel it (found by audit: botocore sent a whole PutItem so, and DynamoDB
        checks no deadline of ours)."""
        try:
            if what in self._calls_bounded_by_io:
                if deadline is None:
                    return await call
                self._refuse_if_passed(deadline, what, call)
                # An earlier deadline than the I/O's own (a batch bounded by its earliest caller's):
                # told to the backend, whose I/O then ends by it too (found by review: a coalesced
                # delete's script kept a deadline fixed when the batch ran, up to a stalled tick
                # past its caller's).
                token = _call_deadline.set(deadline)
                try:
                    return await call
                finally:
                    _call_deadline.reset(token)
            loop = asyncio.get_running_loop()
            if deadline is None:
                fixed = _call_deadline.get(None)  # by the caller (call_deadline_at), or an outer call
                if fixed is not None and fixed.loop_time() < loop.time() + self._timeout_s:
                    deadline = fixed
                else:
                    deadline = CallDeadline.after(self._timeout_s)
            ends_s = self._refuse_if_passed(deadline, what, call)  # the loop's clock, for its timers
            token = _call_deadline.set(deadline)
            try:
                if asyncio.current_task(loop) is None:  # the loop passed: one getpid call fewer
                    return await _in_a_task(loop, call, ends_s)
                async with asyncio.timeout_at(ends_s):
                    return await call
            finally:
                _call_deadline.reset(token)
        except TimeoutError as error:
            raise StorageUnavailable(
                f"{self.backend_name} {what} did not answer within {self.timeout_ms_call} ms",
            ) from error
        except StorageError:
            raise
        except Exception as error:
            mapped = self._storage_error(error, what)
            if mapped is None:
                raise
            raise mapped from error

    def _refuse_if_passed(self, deadline: CallDeadline, what: str, call: Awaitable[object] | None = None) -> float:
        """`deadline` in the loop's clock; StorageUnavailable, with `call` never started, if it
        has passed."""
        now_s = asyncio.get_running_loop().time()  # read once: this is every storage call's path
        left_s = deadline.left_s(now_s)
        if left_s > 0:
            return now_s + left_s
        if inspect.iscoroutine(call):
            call.close()  # never started: closed, so that nothing warns it was never awaited
        raise StorageUnavailable(f"{self.backend_name} {what}: the call's deadline passed before it was sent")

    def _storage_error(self, error: Exception, what: str) -> StorageError | None:
        """The contract's error for a backend's exception (a transport failure is
        StorageUnavailable), or None to let it through unchanged. TimeoutError never gets here."""
        return None

    async def log_once(
        self, log: LogId, txn: str, state: TxnState, body: RecordBody, fence: Fence | None = None,
    ) -> LogOnceResult:
        """Create the record with `state` if it is absent; return what is stored now. One round trip.
        With a fence, raise Fenced (writing nothing) unless the fence holds."""
        validate_log(log)
        validate_txn(txn)
        validate_state(state)
        validate_body(body)
        validate_log_fence(fence, log)
        return await self._bounded(self._log_once(log, txn, state, body, fence), "log_once")

    async def log(
        self, log: LogId, txn: str, state: TxnState, body: RecordBody | None = None, fence: Fence | None = None,
    ) -> TxnState:
        """Plain write: create, or move VOTE_YES to a decision, or rewrite the same state. `body`
        None keeps the stored body. Refuses COMMIT<->ABORT and decision->VOTE_YES; Fenced as
        `log_once`."""
        validate_log(log)
        validate_txn(txn)
        validate_state(state)
        if body is not None:
            validate_body(body)
        validate_log_fence(fence, log)
        return await self._bounded(self._log(log, txn, state, body, fence), "log")

    async def read(self, log: LogId, txn: str) -> Record | None:
        """The stored record, or None."""
        validate_log(log)
        validate_txn(txn)
        return await self._bounded(self._read(log, txn), "read")

    async def scan_unfinished_page(
        self, log: LogId, limit: int = SCAN_PAGE_COUNT_MAX, after: str = "",
    ) -> ScanPage:
        """Up to `limit` records of `log` that still need work (VOTE_YES, or COMMIT not applied), whose
        txn id sorts strictly after `after` ("" = from the start), in ascending txn-id order, and
        where the next page starts (`ScanPage.resume_after`, None at the log's end). One call,
        within its deadline however many finished records the log holds: a backend that walks
        them to find unfinished ones (Azure's listing, DynamoDB's filtered query) stops after a
        bounded walk and says where it stopped, so its page may hold fewer than `limit` records,
        even none, and still not be the last (found by review: one call walked every tombstone,
        and a log of many outlived its deadline on every retry: the node never got ready). Each
        record is as read during the call: one finished or deleted meanwhile is left out and the
        page refilled from further on. `after` need not name an existing record."""
        validate_not_cluster_log(validate_log(log), "scan_unfinished")
        validate_scan_limit(limit)
        validate_scan_after(after)
        return await self._bounded(self._scan_page(log, limit, after), "scan_unfinished")

    async def scan_finished_page(
        self, log: LogId, limit: int = SCAN_PAGE_COUNT_MAX, after: str = "",
    ) -> ScanPage:
        """Up to `limit` records of `log` that are finished and are not tombstones (an ABORT, or a
        COMMIT whose redo is applied: a coordinator's COMMIT is never applied, so never one),
        whose txn id sorts strictly after `after`, in ascending txn-id order, each without its
        redo (an empty `body.redo`: what a collector needs is the state, `applied`,
        `created_at_ms` and the participants), and where the next page starts, bounded as
        `scan_unfinished_page`'s walk is (a page may hold fewer than `limit`, even none, and not
        be the last). What a collector of the records a crash left behind reads
        (docs/sweeper-design.md): a hint, not a snapshot; it reads again what it acts on."""
        validate_not_cluster_log(validate_log(log), "scan_finished")
        validate_scan_limit(limit)
        validate_scan_after(after)
        return await self._bounded(self._scan_finished_page(log, limit, after), "scan_finished")

    async def scan_unfinished(self, log: LogId, limit: int = SCAN_PAGE_COUNT_MAX, after: str = "") -> list[Record]:
        """The records of `scan_unfinished_page`, pages followed until `limit` are found or the log
        ends: a list with fewer than `limit` records is the last one; to read on, pass its last txn
        id as `after`. Each page call has its own deadline (at most SCAN_CALL_COUNT_MAX of them),
        so this suits tools and tests; recovery asks for pages itself."""
        validate_scan_limit(limit)
        records: list[Record] = []
        for _ in range(SCAN_CALL_COUNT_MAX):
            page = await self.scan_unfinished_page(log, limit - len(records), after)
            records.extend(page.records)
            if page.resume_after is None or len(records) == limit:
                return records
            if page.resume_after <= after:
                raise InvariantViolation(f"a scan page of {log.key} after {after!r} resumes at {page.resume_after!r}")
            after = page.resume_after
        raise StorageUnavailable(f"scan of {log.key}: {SCAN_CALL_COUNT_MAX} pages, and the log goes on")

    async def read_data(self, partition: str, keys: Sequence[str]) -> dict[str, bytes | None]:
        """Committed values of `keys` in `partition` (None for absent keys)."""
        validate_partition(partition)
        checked = validate_data_keys(keys)
        return await self._bounded(self._read_data(partition, checked), "read_data")

    async def apply_redo(
        self, partition: str, txn: str, writes: Mapping[str, bytes | None], fence: Fence | None = None,
    ) -> bool:
        """Apply a committed redo to the data and mark the partition's record COMMIT and applied,
        atomically where the backend allows.

        The record must be VOTE_YES or COMMIT. A VOTE_YES record becomes COMMIT in the same step
        as the data is written, so a participant that learns COMMIT records its decision and
        applies in ONE call instead of `log(COMMIT)` and then this. That is safe because only the
        participant itself ever moves its own record from VOTE_YES to a decision (a terminator
        only does log_once(ABORT), which never overwrites a record), and it applies only once it
        knows the decision is COMMIT. Until the call lands the record still says VOTE_YES, which
        every termination reads as a yes vote, and all voted yes, so nothing can decide ABORT. A
        crash before it lands leaves VOTE_YES: recovery finds the record unfinished, resolves it
        to COMMIT and applies then. Where a backend cannot make the two one atomic step (Azure
        Blob; a DynamoDB redo too big for one transaction) it writes the data first and the record,
        COMMIT and applied, last, so a crash in between leaves VOTE_YES (or an unapplied COMMIT)
        and recovery applies the same redo again over it, which is harmless while its keys stay
        locked.

        An ABORT or absent record is an InvariantViolation: raised, nothing written. A record
        already marked applied is left alone and nothing is written: re-writing an old redo could
        undo a later transaction's writes to the same keys. So recovery may repeat the call
        safely. True if this call applied the redo, False if it was applied before (an earlier
        attempt landed: one that timed out, or one before a restart). A caller caching data
        caches it either way while it holds the keys' locks: no other transaction wrote them since.
        With a fence, raise Fenced unless the fence holds: writing nothing where it fails at the
        start; where a backend applies in several requests and finds the fence gone between them
        (DynamoDB's chunks, Azure's chunks), some data is in and the record is as it was, as after
        a crash mid-apply, which the next owner's recovery applies again."""
        validate_partition(partition)
        validate_txn(txn)
        checked = validate_writes(writes)
        validate_fence(fence, partition)
        return await self._bounded(self._apply_redo(partition, txn, checked, fence), "apply_redo")

    async def delete(
        self, log: LogId, txn: str, fence: Fence | None = None, keep: Tombstone | None = None,
    ) -> bool:
        """Remove the record (garbage collection); True if it existed. Fenced as `log_once`.

        With `keep`, leave its tombstone in the record's place instead (see `Tombstone`), in a
        partition's log or a coordinator's: written even where no record was (the answer is then
        False), and refused, writing nothing, over the other decision (DecisionFlipRefused), a
        COMMIT one over a vote, or, in a partition's log, over a COMMIT not applied
        (InvariantViolation; `check_tombstone`).

        Where the backend `coalesces_deletes`, the deletes of one event-loop tick go to storage
        together, at most DELETE_BATCH_COUNT_MAX per request, and each caller still gets its own
        answer, its own Fenced and its own deadline (counted from its call)."""
        validate_not_cluster_log(validate_log(log), "delete")
        validate_txn(txn)
        validate_log_fence(fence, log)
        validate_tombstone(keep, log)
        if not self.coalesces_deletes:
            return await self._bounded(self._delete(log, txn, fence, keep), "delete")
        deadline = CallDeadline.after(self._timeout_s)
        fixed = _call_deadline.get(None)  # by the caller (call_deadline_at), or an outer call
        if fixed is not None and fixed.loop_time() < deadline.loop_time():
            deadline = fixed
            self._refuse_if_passed(deadline, "delete")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bool] = loop.create_future()
        waiting = self._deletes_waiting.get(loop)
        if waiting is None:
            waiting = self._deletes_waiting[loop] = []
            loop.call_soon(self._flush_deletes, loop)
        waiting.append(_WaitingDelete(DeleteRequest(log, txn, fence, keep), future, deadline))
        # A bare timer per caller (the batch's request is bounded by the earliest of its callers'
        # deadlines): a caller's deadline counts from its own call, and costs a heap entry rather
        # than a timeout context.
        expiry = loop.call_at(deadline.loop_s, _expire, future)
        try:
            return await future
        except TimeoutError as error:
            raise StorageUnavailable(
                f"{self.backend_name} delete did not answer within {self.timeout_ms_call} ms",
            ) from error
        finally:
            expiry.cancel()

    def _flush_deletes(self, loop: asyncio.AbstractEventLoop) -> None:
        waiting = self._deletes_waiting.pop(loop)
        # A caller that gave up (cancelled) before its batch left is not sent at all.
        live = [entry for entry in waiting if not entry.future.done()]
        for start in range(0, len(live), DELETE_BATCH_COUNT_MAX):
            task = loop.create_task(self._delete_batch(live[start : start + DELETE_BATCH_COUNT_MAX]))
            self._delete_batches.add(task)
            task.add_done_callback(self._delete_batches.discard)

    async def _delete_batch(self, batch: list[_WaitingDelete]) -> None:
        assert 0 < len(batch) <= DELETE_BATCH_COUNT_MAX
        # The earliest caller's deadline bounds the request: no delete of it may land after its
        # caller was told that it failed.
        deadline = min((entry.deadline for entry in batch), key=CallDeadline.loop_time)
        try:
            outcomes = await self._bounded(self._delete_many([entry.request for entry in batch]), "delete", deadline)
        except Exception as error:
            # The whole request failed (unavailable, or of unknown effect): so did every delete in
            # it. One exception each: one raised by every caller would collect all their tracebacks
            # (found by audit, 2026-11-28).
            for entry in batch:
                if not entry.future.done():
                    entry.future.set_exception(copy.copy(error))
            return
        except asyncio.CancelledError:
            # The loop is shutting down: the callers were not cancelled, so they hear of it as an
            # answer that never came, rather than as a cancellation of their own.
            for entry in batch:
                if not entry.future.done():
                    entry.future.set_exception(StorageUnavailable(f"{self.backend_name} delete: batch cancelled"))
            raise
        assert len(outcomes) == len(batch), f"{len(batch)} deletes answered {len(outcomes)} times"
        for (_, future, _), outcome in zip(batch, outcomes, strict=True):
            if future.done():  # its caller's deadline passed first
                continue
            if isinstance(outcome, bool):
                future.set_result(outcome)
            else:
                future.set_exception(outcome)

    async def read_owners(self, partitions: Sequence[str]) -> dict[str, Ownership]:
        """The ownership records of `partitions` that exist (absent ones are left out)."""
        checked = validate_owner_partitions(partitions)
        return await self._bounded(self._read_owners(checked), "read_owners")

    async def write_owner(self, expected: Ownership | None, new: Ownership) -> OwnerWriteResult:
        """Store `new` if the partition's record is still `expected` (same epoch and version; None:
        no record). One round trip; returns the record stored after the call either way."""
        expected, new = validate_owner_write(expected, new)
        return await self._bounded(self._write_owner(expected, new), "write_owner")

    async def list_identities(self, after: str = "", limit: int = IDENTITY_PAGE_COUNT_MAX) -> list[str]:
        """The ids of the nodes that took an identity in this storage (the node ids, not their
        records' `identity_name`s), ascending in string order (node ids are ASCII, so that is
        every backend's byte order), those strictly after `after` ("" = from the start; it need
        not name a node), at most `limit`. A page shorter than `limit` is the last one; to read
        the next, pass the last id of this one as `after`.

        A node is listed once its identity was first taken (on some backends from just before the
        take lands, so a take that failed may list its node too) and stays listed forever: identity
        records are never deleted, and a listed node with no record is harmless to recovery, which
        scans its coordinator log and finds it empty. Partitions' ownership records are never
        listed. A bounded number of round trips on every backend, whatever else storage holds."""
        validate_identity_after(after)
        validate_identity_limit(limit)
        return await self._bounded(self._list_identities(after, limit), "list_identities")

    def housekeeping_counts(self) -> Mapping[str, int]:
        """Counters (they only grow) of the work a store does on its own, in the background, by
        name; what an operator watches to see it keep up. None on most backends."""
        return {}

    @abc.abstractmethod
    async def close(self) -> None:
        """Release connections. The store is unusable afterwards."""

    async def __aenter__(self) -> LogStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # --- what a backend implements: its I/O, given validated arguments, under the deadline -----

    @abc.abstractmethod
    async def _log_once(
        self, log: LogId, txn: str, state: TxnState, body: RecordBody, fence: Fence | None,
    ) -> LogOnceResult: ...

    @abc.abstractmethod
    async def _log(
        self, log: LogId, txn: str, state: TxnState, body: RecordBody | None, fence: Fence | None,
    ) -> TxnState: ...

    @abc.abstractmethod
    async def _read(self, log: LogId, txn: str) -> Record | None: ...

    @abc.abstractmethod
    async def _scan_page(self, log: LogId, limit: int, after: str) -> ScanPage: ...

    @abc.abstractmethod
    async def _scan_finished_page(self, log: LogId, limit: int, after: str) -> ScanPage: ...

    @abc.abstractmethod
    async def _read_data(self, partition: str, keys: tuple[str, ...]) -> dict[str, bytes | None]: ...

    @abc.abstractmethod
    async def _apply_redo(
        self, partition: str, txn: str, writes: dict[str, bytes | None], fence: Fence | None,
    ) -> bool: ...

    @abc.abstractmethod
    async def _delete(self, log: LogId, txn: str, fence: Fence | None, keep: Tombstone | None) -> bool: ...

    async def _delete_many(self, requests: Sequence[DeleteRequest]) -> list[bool | StorageError]:
        """Each request's answer, in order: whether its record existed, or its own error (Fenced);
        raise only when the whole request failed. At most DELETE_BATCH_COUNT_MAX requests. Called
        only where the backend `coalesces_deletes`, which then implements it."""
        raise NotImplementedError(f"{type(self).__name__} coalesces deletes, so it must implement _delete_many")

    @abc.abstractmethod
    async def _read_owners(self, partitions: tuple[str, ...]) -> dict[str, Ownership]: ...

    @abc.abstractmethod
    async def _write_owner(self, expected: Ownership | None, new: Ownership) -> OwnerWriteResult: ...

    @abc.abstractmethod
    async def _list_identities(self, after: str, limit: int) -> list[str]: ...


class DelegatingStore(LogStore):
    """A store that wraps another (injected latency, metrics, fault injection) and forwards each
    call whole to `inner`, whose template validates and bounds it: once, not once per layer. A
    subclass overrides the public methods it adds something to."""

    def __init__(self, inner: LogStore) -> None:
        # No LogStore.__init__: the deadline and the delete batches are the inner store's.
        self.inner = inner
        self.backend_name = inner.backend_name
        self.drops_tombstones_at_expiry = inner.drops_tombstones_at_expiry
        self.timeout_ms_call = inner.timeout_ms_call  # the inner store's deadline, told to callers

    async def log_once(
        self, log: LogId, txn: str, state: TxnState, body: RecordBody, fence: Fence | None = None,
    ) -> LogOnceResult:
        return await self.inner.log_once(log, txn, state, body, fence)

    async def log(
        self, log: LogId, txn: str, state: TxnState, body: RecordBody | None = None, fence: Fence | None = None,
    ) -> TxnState:
        return await self.inner.log(log, txn, state, body, fence)

    async def read(self, log: LogId, txn: str) -> Record | None:
        return await self.inner.read(log, txn)

    async def scan_unfinished_page(
        self, log: LogId, limit: int = SCAN_PAGE_COUNT_MAX, after: str = "",
    ) -> ScanPage:
        return await self.inner.scan_unfinished_page(log, limit, after)

    async def scan_finished_page(
        self, log: LogId, limit: int = SCAN_PAGE_COUNT_MAX, after: str = "",
    ) -> ScanPage:
        return await self.inner.scan_finished_page(log, limit, after)

    async def read_data(self, partition: str, keys: Sequence[str]) -> dict[str, bytes | None]:
        return await self.inner.read_data(partition, keys)

    async def apply_redo(
        self, partition: str, txn: str, writes: Mapping[str, bytes | None], fence: Fence | None = None,
    ) -> bool:
        return await self.inner.apply_redo(partition, txn, writes, fence)

    async def delete(
        self, log: LogId, txn: str, fence: Fence | None = None, keep: Tombstone | None = None,
    ) -> bool:
        return await self.inner.delete(log, txn, fence, keep)

    async def read_owners(self, partitions: Sequence[str]) -> dict[str, Ownership]:
        return await self.inner.read_owners(partitions)

    async def write_owner(self, expected: Ownership | None, new: Ownership) -> OwnerWriteResult:
        return await self.inner.write_owner(expected, new)

    async def list_identities(self, after: str = "", limit: int = IDENTITY_PAGE_COUNT_MAX) -> list[str]:
        return await self.inner.list_identities(after, limit)

    def housekeeping_counts(self) -> Mapping[str, int]:
        return self.inner.housekeeping_counts()

    async def close(self) -> None:
        await self.inner.close()

    # The public methods above never reach these: the inner store's own do the I/O.
    async def _unreachable(self, *args: object) -> Any:
        raise AssertionError(f"{type(self).__name__} forwards whole calls to its inner store")

    _log_once = _log = _read = _scan_page = _scan_finished_page = _read_data = _unreachable
    _apply_redo = _delete = _read_owners = _write_owner = _list_identities = _unreachable
