"""The LogStore contract: the only thing Cornus asks of a storage service.

Every backend (emulator, redis, azure_blob, dynamodb) implements `LogStore`. The protocol core
imports the value types from here (never a backend), and the node runtime calls the async methods.

One record per (log, txn). A log is either a partition's log or a coordinator's log (the latter is
used by 2PC and coordinator-log for decisions and, in coordinator-log, every participant's redo).

Transitions a record may make, and which call may make them:

    absent   --log_once(s)/log(s)-->  s            (s in VOTE_YES, COMMIT, ABORT)
    VOTE_YES --log(COMMIT|ABORT)--->  decision
    VOTE_YES --apply_redo---------->  COMMIT, applied   (the participant's own commit: see apply_redo)
    COMMIT   --apply_redo---------->  COMMIT, applied
    s        --log(s)-------------->  s            (idempotent rewrite of the same state)
    COMMIT  <-/-> ABORT, decision -/-> VOTE_YES    (refused with DecisionFlipRefused, nothing written)

`log_once` never changes an existing record: it returns what is stored. That single compare-and-swap
is the whole of Cornus's requirement on storage, and every backend does it in ONE round trip.

Recovery reads a log's unfinished records in pages keyed by txn id: each page starts strictly after
the last txn id of the one before, so records that stay unfinished (all of them, until recovery
resolves them) cannot hold later ones back. Txn ids are ASCII, so every backend's native order
(SQLite BINARY, Redis lex, DynamoDB bytes) is plain string order.

Ownership. Each partition has exactly one writer, its owner, named by an ownership record that
`write_owner` changes by compare-and-swap in one round trip (as `log_once` does records):

    absent --write_owner(None, epoch 1)--> owned by n, epoch 1, version 1
    (e, v) --write_owner((e, v), (e, v+1))--> renewed, hand-off asked, or released (owner "")
    (e, v) --write_owner((e, v), (e+1, v+1))--> taken by another node: a new epoch

Every write a partition owner makes for its partition (`log_once`, `log`, `delete` on the
partition's log, `apply_redo` on its data) may carry a `Fence` (owner, epoch). The backend checks
the ownership record in the SAME round trip as the write and refuses with `Fenced`, writing
nothing, unless the record still names that owner and epoch. So a deposed owner's late write
(its lease clock wrong, its process paused, its request slow) cannot land after a new owner has
taken the partition, whatever the clocks say. Writes without a fence (a terminator's
LogOnce(ABORT) on another partition's log, a coordinator's own log) are the protocol's and stay
allowed. Azure Blob has no condition that spans two blobs; its adapter says how it fences.

What is done once, here, for every backend. `LogStore`'s public methods are a template: they
validate the arguments (ValidationError before any I/O), bound the call by the store's deadline
(StorageUnavailable past it) and map the backend's errors, then call the backend's protected
method of the same name (`_log_once`, ...), which does the I/O and nothing else. Garbage
collection's deletes of one event-loop tick are joined into batches for the backends that can
carry several in one request (`coalesces_deletes`); each caller still gets its own answer, its
own Fenced and its own deadline.
"""

from __future__ import annotations

import abc
import asyncio
import enum
import re
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

from storage_adapters.errors import DecisionFlipRefused, StorageError, StorageUnavailable, ValidationError

# Limits. They are what every backend can hold in one request (DynamoDB items top out at 400 KB,
# so a record with its redo must stay well below that), and they bound what a bad caller can make
# us allocate.
TXN_ID_LENGTH_MAX = 128
LOG_NAME_LENGTH_MAX = 64
NODE_ID_LENGTH_MAX = 64
PARTICIPANT_COUNT_MAX = 256
REDO_BYTES_MAX = 128 * 1024
DATA_KEY_BYTES_MAX = 512
DATA_VALUE_BYTES_MAX = 64 * 1024
DATA_BATCH_COUNT_MAX = 1024
SCAN_PAGE_COUNT_MAX = 1000
# Rounds one scan page may take where a backend reads its index (or listing) and then the records
# in separate requests: only a record finished or deleted between the two makes another round
# necessary, to refill the page from further on, so running out means the log churns too fast.
SCAN_ROUND_COUNT_MAX = 8
# Ownership records one `read_owners` call may return: the runtime's partition count limit.
OWNER_READ_COUNT_MAX = 4096
# A lease longer than this would leave a dead owner's partitions unserved for minutes.
OWNER_LEASE_MS_MAX = 600_000
# Deletes one coalesced backend request may carry. A Redis script blocks the server for everyone
# while it runs (about 3 us per record deleted, so ~0.4 ms at this size), an Azure batch takes at
# most 256, and past a few dozen the per-request cost is already spread thin: garbage collection
# gains little from bigger batches and other clients' latency would pay for them.
DELETE_BATCH_COUNT_MAX = 128

# Ids end up in Redis keys, blob names and DynamoDB keys; a conservative alphabet keeps them
# unambiguous in all three (no '/', no braces that would break Redis hash tags).
_ID_PATTERN = re.compile(r"^[A-Za-z0-9_.:-]+$")

T = TypeVar("T")


class TxnState(enum.StrEnum):
    VOTE_YES = "VOTE_YES"
    COMMIT = "COMMIT"
    ABORT = "ABORT"

    @property
    def is_decision(self) -> bool:
        return self is not TxnState.VOTE_YES


class LogKind(enum.StrEnum):
    PARTITION = "p"
    COORDINATOR = "c"


def validate_id(value: object, what: str, length_max: int) -> str:
    """Return `value` if it is a usable id, else raise ValidationError naming `what`."""
    if not isinstance(value, str):
        raise ValidationError(f"{what} must be a string, got {type(value).__name__}")
    if not value:
        raise ValidationError(f"{what} must not be empty")
    if len(value) > length_max:
        raise ValidationError(f"{what} is {len(value)} characters, the limit is {length_max}")
    if not _ID_PATTERN.match(value):
        raise ValidationError(f"{what} {value!r} may only hold letters, digits and '_.:-'")
    return value


@dataclass(frozen=True, slots=True)
class LogId:
    """Which log a record lives in: a partition's log or a coordinator node's log."""

    kind: LogKind
    name: str

    def __post_init__(self) -> None:
        if not isinstance(self.kind, LogKind):
            raise ValidationError(f"log kind must be a LogKind, got {self.kind!r}")
        validate_id(self.name, "log name", LOG_NAME_LENGTH_MAX)

    @classmethod
    def partition(cls, name: str) -> LogId:
        return cls(LogKind.PARTITION, name)

    @classmethod
    def coordinator(cls, name: str) -> LogId:
        return cls(LogKind.COORDINATOR, name)

    @property
    def key(self) -> str:
        """A stable string form, usable inside every backend's key space."""
        return f"{self.kind.value}.{self.name}"


@dataclass(frozen=True, slots=True)
class RecordBody:
    """What a vote carries: the full participant list (so any participant can run termination
    against the right logs), the coordinator, and the opaque redo to apply on COMMIT."""

    participants: tuple[str, ...] = ()
    coordinator: str = ""
    redo: bytes = b""

    def __post_init__(self) -> None:
        if not isinstance(self.participants, tuple):
            raise ValidationError("participants must be a tuple of partition names")
        if len(self.participants) > PARTICIPANT_COUNT_MAX:
            raise ValidationError(
                f"{len(self.participants)} participants, the limit is {PARTICIPANT_COUNT_MAX}"
            )
        for participant in self.participants:
            validate_id(participant, "participant", LOG_NAME_LENGTH_MAX)
        if len(set(self.participants)) != len(self.participants):
            raise ValidationError("participants must not repeat")
        if self.coordinator:
            validate_id(self.coordinator, "coordinator", NODE_ID_LENGTH_MAX)
        if not isinstance(self.redo, bytes):
            raise ValidationError(f"redo must be bytes, got {type(self.redo).__name__}")
        if len(self.redo) > REDO_BYTES_MAX:
            raise ValidationError(f"redo is {len(self.redo)} bytes, the limit is {REDO_BYTES_MAX}")


@dataclass(frozen=True, slots=True)
class Record:
    """One stored record. `applied` is set once a COMMIT's redo is in the data (recovery re-applies
    committed records that lack it). `created_at_ms` is the storing side's wall clock."""

    log: LogId
    txn: str
    state: TxnState
    body: RecordBody = field(default_factory=RecordBody)
    applied: bool = False
    created_at_ms: int = 0


@dataclass(frozen=True, slots=True)
class LogOnceResult:
    """What `log_once` found or made: `state` is the record's state after the call, `created` is
    True for exactly the one caller whose write created the record."""

    state: TxnState
    created: bool


@dataclass(frozen=True, slots=True)
class Ownership:
    """A partition's ownership record. `owner` "" means released: free to take. `epoch` rises by
    one with every take and is what fences the owner's writes; `version` rises by one with every
    write of the record (take, renewal, hand-off request, release), so a node that watches the
    same (epoch, version) for longer than `lease_ms` plus clock slack, by its own clock, knows the
    owner has stopped renewing. `wanted_by` names a node that asks the owner to hand over."""

    partition: str
    owner: str
    epoch: int
    version: int
    lease_ms: int
    wanted_by: str = ""

    def __post_init__(self) -> None:
        validate_partition(self.partition)
        for what, value in (("owner", self.owner), ("wanted_by", self.wanted_by)):
            if value != "":
                validate_id(value, what, NODE_ID_LENGTH_MAX)
        for what, number in (("epoch", self.epoch), ("version", self.version), ("lease_ms", self.lease_ms)):
            if not isinstance(number, int) or isinstance(number, bool) or number < 1:
                raise ValidationError(f"{what} must be an integer >= 1, got {number!r}")
        if self.lease_ms > OWNER_LEASE_MS_MAX:
            raise ValidationError(f"lease_ms is {self.lease_ms}, the limit is {OWNER_LEASE_MS_MAX}")

    def fence(self) -> Fence:
        assert self.owner, f"{self.partition} is released: no owner to fence writes with"
        return Fence(self.partition, self.owner, self.epoch)


@dataclass(frozen=True, slots=True)
class Fence:
    """What a partition owner's write is conditioned on: storage refuses it (`Fenced`) unless the
    partition's ownership record names `owner` at `epoch`."""

    partition: str
    owner: str
    epoch: int

    def __post_init__(self) -> None:
        validate_partition(self.partition)
        validate_id(self.owner, "fence owner", NODE_ID_LENGTH_MAX)
        if not isinstance(self.epoch, int) or isinstance(self.epoch, bool) or self.epoch < 1:
            raise ValidationError(f"fence epoch must be an integer >= 1, got {self.epoch!r}")

    def admits(self, stored: Ownership | None) -> bool:
        return stored is not None and stored.owner == self.owner and stored.epoch == self.epoch


@dataclass(frozen=True, slots=True)
class OwnerWriteResult:
    """What `write_owner` found or made: `stored` is the record after the call (None: absent),
    `written` is True if this call's record is the one stored."""

    stored: Ownership | None
    written: bool


def validate_owner_write(expected: object, new: object) -> tuple[Ownership | None, Ownership]:
    """The transitions `write_owner` allows: the first record is epoch 1 version 1; every later
    one raises the version by one and keeps the epoch or raises it by one."""
    if expected is not None and not isinstance(expected, Ownership):
        raise ValidationError(f"expected must be an Ownership or None, got {type(expected).__name__}")
    if not isinstance(new, Ownership):
        raise ValidationError(f"new must be an Ownership, got {type(new).__name__}")
    if expected is None:
        if (new.epoch, new.version) != (1, 1):
            raise ValidationError(f"a first ownership record is epoch 1 version 1, got {new.epoch}/{new.version}")
        return expected, new
    if new.partition != expected.partition:
        raise ValidationError(f"ownership of {new.partition} cannot replace that of {expected.partition}")
    if new.version != expected.version + 1:
        raise ValidationError(f"version must rise by one: {expected.version} -> {new.version}")
    if new.epoch not in (expected.epoch, expected.epoch + 1):
        raise ValidationError(f"epoch may stay or rise by one: {expected.epoch} -> {new.epoch}")
    if new.epoch == expected.epoch and new.owner not in ("", expected.owner):
        raise ValidationError(f"{new.owner} may take {new.partition} from {expected.owner!r} only in a new epoch")
    return expected, new


def validate_fence(fence: object, partition: str) -> Fence | None:
    """A write's fence must be for the partition written (None: an unfenced write)."""
    if fence is None:
        return None
    if not isinstance(fence, Fence):
        raise ValidationError(f"fence must be a Fence, got {type(fence).__name__}")
    if fence.partition != partition:
        raise ValidationError(f"a fence for {fence.partition} cannot guard a write to {partition}")
    return fence


def validate_log_fence(fence: object, log: LogId) -> Fence | None:
    if fence is not None and log.kind is not LogKind.PARTITION:
        raise ValidationError(f"only a partition's log is fenced, not {log.key}")
    return validate_fence(fence, log.name)


def validate_owner_partitions(partitions: object) -> tuple[str, ...]:
    if isinstance(partitions, str | bytes) or not isinstance(partitions, Sequence):
        raise ValidationError("partitions must be a sequence of partition names")
    if len(partitions) > OWNER_READ_COUNT_MAX:
        raise ValidationError(f"{len(partitions)} partitions in one call, the limit is {OWNER_READ_COUNT_MAX}")
    return tuple(dict.fromkeys(validate_partition(p) for p in partitions))


def validate_txn(txn: object) -> str:
    return validate_id(txn, "txn id", TXN_ID_LENGTH_MAX)


def validate_state(state: object) -> TxnState:
    if not isinstance(state, TxnState):
        raise ValidationError(f"state must be a TxnState, got {state!r}")
    return state


def validate_log(log: object) -> LogId:
    if not isinstance(log, LogId):
        raise ValidationError(f"log must be a LogId, got {type(log).__name__}")
    return log


def validate_body(body: object) -> RecordBody:
    if not isinstance(body, RecordBody):
        raise ValidationError(f"body must be a RecordBody, got {type(body).__name__}")
    return body


def validate_partition(partition: object) -> str:
    return validate_id(partition, "partition", LOG_NAME_LENGTH_MAX)


def validate_scan_after(after: object) -> str:
    """A scan cursor: "" (from the start) or a txn id."""
    if isinstance(after, str) and not after:
        return after
    return validate_txn(after)


def is_unfinished(state: TxnState, applied: bool) -> bool:
    """Whether a record still needs recovery's work: undecided, or committed with its redo not in
    the data yet."""
    return state is TxnState.VOTE_YES or (state is TxnState.COMMIT and not applied)


def validate_scan_limit(limit: object) -> int:
    if not isinstance(limit, int) or isinstance(limit, bool):
        raise ValidationError(f"limit must be an int, got {type(limit).__name__}")
    if not 1 <= limit <= SCAN_PAGE_COUNT_MAX:
        raise ValidationError(f"limit is {limit}, it must be in 1..{SCAN_PAGE_COUNT_MAX}")
    return limit


def validate_data_key(key: object) -> str:
    if not isinstance(key, str):
        raise ValidationError(f"data key must be a string, got {type(key).__name__}")
    if not key:
        raise ValidationError("data key must not be empty")
    size = len(key.encode("utf-8"))
    if size > DATA_KEY_BYTES_MAX:
        raise ValidationError(f"data key is {size} bytes, the limit is {DATA_KEY_BYTES_MAX}")
    return key


def validate_data_keys(keys: object) -> tuple[str, ...]:
    if isinstance(keys, str | bytes) or not isinstance(keys, Sequence):
        raise ValidationError("keys must be a sequence of strings")
    if len(keys) > DATA_BATCH_COUNT_MAX:
        raise ValidationError(f"{len(keys)} keys in one call, the limit is {DATA_BATCH_COUNT_MAX}")
    return tuple(validate_data_key(key) for key in keys)


def validate_writes(writes: object) -> dict[str, bytes | None]:
    """A redo's writes: key -> new value, or None to delete the key."""
    if not isinstance(writes, Mapping):
        raise ValidationError("writes must be a mapping of key -> bytes or None")
    if len(writes) > DATA_BATCH_COUNT_MAX:
        raise ValidationError(f"{len(writes)} writes in one redo, the limit is {DATA_BATCH_COUNT_MAX}")
    checked: dict[str, bytes | None] = {}
    for key, value in writes.items():
        validate_data_key(key)
        if value is not None:
            if not isinstance(value, bytes):
                raise ValidationError(f"value of {key!r} must be bytes or None")
            if len(value) > DATA_VALUE_BYTES_MAX:
                raise ValidationError(
                    f"value of {key!r} is {len(value)} bytes, the limit is {DATA_VALUE_BYTES_MAX}"
                )
        checked[key] = value
    return checked


def check_log_transition(log: LogId, txn: str, stored: TxnState | None, wanted: TxnState) -> None:
    """Raise DecisionFlipRefused unless `log(wanted)` may overwrite `stored`."""
    if stored is None or stored is TxnState.VOTE_YES or stored is wanted:
        return
    raise DecisionFlipRefused(log, txn, stored, wanted)


class DeleteRequest(NamedTuple):
    """One caller's `delete`, validated, as a backend's `_delete_many` gets it in a batch."""

    log: LogId
    txn: str
    fence: Fence | None


def _expire(future: asyncio.Future[Any]) -> None:
    if not future.done():
        future.set_exception(TimeoutError())


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
    instead, so the inner store's template does all of that, once."""

    backend_name: str = "abstract"
    # Calls (by method name) that the backend's I/O layer already bounds by timeout_ms_call with
    # a timer of its own, raising TimeoutError: the base adds no second timer to those. Redis's
    # pipelined scripts are: a bare timer per call there, where asyncio.timeout costs ~3 us.
    _calls_bounded_by_io: frozenset[str] = frozenset()
    # Whether `_delete_many` carries several records in fewer requests than one each: then the
    # deletes of a tick are batched, else each goes to `_delete` alone, as cheaply as any call.
    coalesces_deletes: bool = False

    def __init__(self, timeout_ms_call: int) -> None:
        assert timeout_ms_call > 0, timeout_ms_call
        self.timeout_ms_call = timeout_ms_call
        self._timeout_s = timeout_ms_call / 1000
        # Deletes waiting for the end of their tick, per event loop: a store may serve several
        # loops (the emulator settles each call on its caller's loop), and a batch is one loop's.
        self._deletes_waiting: dict[asyncio.AbstractEventLoop, list[tuple[DeleteRequest, asyncio.Future[bool]]]] = {}
        # Batches in flight: the event loop keeps only weak references to tasks.
        self._delete_batches: set[asyncio.Task[None]] = set()

    # --- the template ------------------------------------------------------------------------

    async def _bounded(self, call: Awaitable[T], what: str) -> T:
        """`call`'s result within the call deadline; TimeoutError (ours or the I/O layer's) as
        StorageUnavailable, the backend's own errors as `_storage_error` maps them."""
        try:
            if what in self._calls_bounded_by_io:
                return await call
            async with asyncio.timeout(self._timeout_s):
                return await call
        except TimeoutError as error:
            raise StorageUnavailable(
                f"{self.backend_name} {what} did not answer within {self.timeout_ms_call} ms"
            ) from error
        except StorageError:
            raise
        except Exception as error:
            mapped = self._storage_error(error, what)
            if mapped is None:
                raise
            raise mapped from error

    def _storage_error(self, error: Exception, what: str) -> StorageError | None:
        """The contract's error for a backend's exception (a transport failure is
        StorageUnavailable), or None to let it through unchanged. TimeoutError never gets here."""
        return None

    async def log_once(
        self, log: LogId, txn: str, state: TxnState, body: RecordBody, fence: Fence | None = None
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
        self, log: LogId, txn: str, state: TxnState, body: RecordBody | None = None, fence: Fence | None = None
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

    async def scan_unfinished(self, log: LogId, limit: int = SCAN_PAGE_COUNT_MAX, after: str = "") -> list[Record]:
        """Up to `limit` records of `log` that still need work (VOTE_YES, or COMMIT not applied), whose
        txn id sorts strictly after `after` ("" = from the start), in ascending txn-id order. A page
        with fewer than `limit` records is the last one; to read the next page pass the last txn id
        of this page as `after`. Each record is as read during the call: one finished or deleted
        meanwhile is left out and the page refilled from further on, so only the end makes a page
        short. `after` need not name an existing record."""
        validate_log(log)
        validate_scan_limit(limit)
        validate_scan_after(after)
        return await self._bounded(self._scan_unfinished(log, limit, after), "scan_unfinished")

    async def read_data(self, partition: str, keys: Sequence[str]) -> dict[str, bytes | None]:
        """Committed values of `keys` in `partition` (None for absent keys)."""
        validate_partition(partition)
        checked = validate_data_keys(keys)
        return await self._bounded(self._read_data(partition, checked), "read_data")

    async def apply_redo(
        self, partition: str, txn: str, writes: Mapping[str, bytes | None], fence: Fence | None = None
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
        safely. True if this call applied the redo, False if it was applied before (a caller
        caching data must not cache it then). With a fence, raise Fenced (writing nothing) unless
        the fence holds."""
        validate_partition(partition)
        validate_txn(txn)
        checked = validate_writes(writes)
        validate_fence(fence, partition)
        return await self._bounded(self._apply_redo(partition, txn, checked, fence), "apply_redo")

    async def delete(self, log: LogId, txn: str, fence: Fence | None = None) -> bool:
        """Remove the record (garbage collection); True if it existed. Fenced as `log_once`.

        Where the backend `coalesces_deletes`, the deletes of one event-loop tick go to storage
        together, at most DELETE_BATCH_COUNT_MAX per request, and each caller still gets its own
        answer, its own Fenced and its own deadline (counted from its call)."""
        validate_log(log)
        validate_txn(txn)
        validate_log_fence(fence, log)
        if not self.coalesces_deletes:
            return await self._bounded(self._delete(log, txn, fence), "delete")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bool] = loop.create_future()
        waiting = self._deletes_waiting.get(loop)
        if waiting is None:
            waiting = self._deletes_waiting[loop] = []
            loop.call_soon(self._flush_deletes, loop)
        waiting.append((DeleteRequest(log, txn, fence), future))
        # A bare timer per caller (the batch's request has its own bound as well): a caller's
        # deadline counts from its own call, and costs a heap entry rather than a timeout context.
        expiry = loop.call_at(loop.time() + self._timeout_s, _expire, future)
        try:
            return await future
        except TimeoutError as error:
            raise StorageUnavailable(
                f"{self.backend_name} delete did not answer within {self.timeout_ms_call} ms"
            ) from error
        finally:
            expiry.cancel()

    def _flush_deletes(self, loop: asyncio.AbstractEventLoop) -> None:
        waiting = self._deletes_waiting.pop(loop)
        # A caller that gave up (cancelled) before its batch left is not sent at all.
        live = [(request, future) for request, future in waiting if not future.done()]
        for start in range(0, len(live), DELETE_BATCH_COUNT_MAX):
            task = loop.create_task(self._delete_batch(live[start : start + DELETE_BATCH_COUNT_MAX]))
            self._delete_batches.add(task)
            task.add_done_callback(self._delete_batches.discard)

    async def _delete_batch(self, batch: list[tuple[DeleteRequest, asyncio.Future[bool]]]) -> None:
        assert 0 < len(batch) <= DELETE_BATCH_COUNT_MAX
        try:
            outcomes = await self._bounded(self._delete_many([request for request, _ in batch]), "delete")
        except Exception as error:
            # The whole request failed (unavailable, or of unknown effect): so did every delete in it.
            for _, future in batch:
                if not future.done():
                    future.set_exception(error)
            return
        except asyncio.CancelledError:
            # The loop is shutting down: the callers were not cancelled, so they hear of it as an
            # answer that never came, rather than as a cancellation of their own.
            for _, future in batch:
                if not future.done():
                    future.set_exception(StorageUnavailable(f"{self.backend_name} delete: batch cancelled"))
            raise
        assert len(outcomes) == len(batch), f"{len(batch)} deletes answered {len(outcomes)} times"
        for (_, future), outcome in zip(batch, outcomes, strict=True):
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
        self, log: LogId, txn: str, state: TxnState, body: RecordBody, fence: Fence | None
    ) -> LogOnceResult: ...

    @abc.abstractmethod
    async def _log(
        self, log: LogId, txn: str, state: TxnState, body: RecordBody | None, fence: Fence | None
    ) -> TxnState: ...

    @abc.abstractmethod
    async def _read(self, log: LogId, txn: str) -> Record | None: ...

    @abc.abstractmethod
    async def _scan_unfinished(self, log: LogId, limit: int, after: str) -> list[Record]: ...

    @abc.abstractmethod
    async def _read_data(self, partition: str, keys: tuple[str, ...]) -> dict[str, bytes | None]: ...

    @abc.abstractmethod
    async def _apply_redo(
        self, partition: str, txn: str, writes: dict[str, bytes | None], fence: Fence | None
    ) -> bool: ...

    @abc.abstractmethod
    async def _delete(self, log: LogId, txn: str, fence: Fence | None) -> bool: ...

    async def _delete_many(self, requests: Sequence[DeleteRequest]) -> list[bool | StorageError]:
        """Each request's answer, in order: whether its record existed, or its own error (Fenced);
        raise only when the whole request failed. At most DELETE_BATCH_COUNT_MAX requests. Called
        only where the backend `coalesces_deletes`, which then implements it."""
        raise NotImplementedError(f"{type(self).__name__} coalesces deletes, so it must implement _delete_many")

    @abc.abstractmethod
    async def _read_owners(self, partitions: tuple[str, ...]) -> dict[str, Ownership]: ...

    @abc.abstractmethod
    async def _write_owner(self, expected: Ownership | None, new: Ownership) -> OwnerWriteResult: ...


class DelegatingStore(LogStore):
    """A store that wraps another (injected latency, metrics, fault injection) and forwards each
    call whole to `inner`, whose template validates and bounds it: once, not once per layer. A
    subclass overrides the public methods it adds something to."""

    def __init__(self, inner: LogStore) -> None:
        # No LogStore.__init__: the deadline and the delete batches are the inner store's.
        self.inner = inner
        self.backend_name = inner.backend_name

    async def log_once(
        self, log: LogId, txn: str, state: TxnState, body: RecordBody, fence: Fence | None = None
    ) -> LogOnceResult:
        return await self.inner.log_once(log, txn, state, body, fence)

    async def log(
        self, log: LogId, txn: str, state: TxnState, body: RecordBody | None = None, fence: Fence | None = None
    ) -> TxnState:
        return await self.inner.log(log, txn, state, body, fence)

    async def read(self, log: LogId, txn: str) -> Record | None:
        return await self.inner.read(log, txn)

    async def scan_unfinished(self, log: LogId, limit: int = SCAN_PAGE_COUNT_MAX, after: str = "") -> list[Record]:
        return await self.inner.scan_unfinished(log, limit, after)

    async def read_data(self, partition: str, keys: Sequence[str]) -> dict[str, bytes | None]:
        return await self.inner.read_data(partition, keys)

    async def apply_redo(
        self, partition: str, txn: str, writes: Mapping[str, bytes | None], fence: Fence | None = None
    ) -> bool:
        return await self.inner.apply_redo(partition, txn, writes, fence)

    async def delete(self, log: LogId, txn: str, fence: Fence | None = None) -> bool:
        return await self.inner.delete(log, txn, fence)

    async def read_owners(self, partitions: Sequence[str]) -> dict[str, Ownership]:
        return await self.inner.read_owners(partitions)

    async def write_owner(self, expected: Ownership | None, new: Ownership) -> OwnerWriteResult:
        return await self.inner.write_owner(expected, new)

    async def close(self) -> None:
        await self.inner.close()

    # The public methods above never reach these: the inner store's own do the I/O.
    async def _unreachable(self, *args: object) -> Any:
        raise AssertionError(f"{type(self).__name__} forwards whole calls to its inner store")

    _log_once = _log = _read = _scan_unfinished = _read_data = _unreachable
    _apply_redo = _delete = _read_owners = _write_owner = _unreachable
