"""The execution phase of one partition, without I/O: strict two-phase locks, the writes each
transaction buffers until its prepare, the transactions refused for good, and the owner's cache of
committed data. The runtime (cornus.runtime.partition) does the waiting and the storage reads
around it; the simulator (cornus.sim.world) drives the same object, so the rules below are the
ones it explores:

- a transaction aborted here is remembered, so a request of it still on its way never starts it
  again, and a continued request whose execution state is gone (the owner restarted) is refused;
- a storage read fills the cache only while the execution that asked for it is still the current
  one: its locks kept every writer off those keys until then, and once they are dropped (an
  abort, an idle timeout) a writer may have committed a newer value that the answer predates;
- an idle execution is dropped only while no machine runs its transaction: from prepare on, its
  locks are the machine's until the decision;
- an owner counts idleness per partition (since the transaction's last request there), its
  coordinator per transaction (since its client's last call): so the coordinator of an active
  transaction refreshes each partition its requests last reached long ago (`refresh_due`), and
  only a transaction whose coordinator is gone, or gave it up, idles out;
- committed redo enters the cache (`cache_redo`) while its keys are still locked by it, so the
  cache never holds a value older than storage's.

Values are opaque to this module (bytes in the runtime, integers in the simulator); the redo
codec turns the buffered writes into the bytes a vote logs, and back.
"""

from __future__ import annotations

import collections
import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from cornus.protocol.events import Executed
from cornus.protocol.locks import Grant, LockMode, LockTable, Policy, Waiter
from cornus.protocol.owner_answer import ExecuteStatus
from cornus.protocol.txn_ids import begin_ms_of, is_client_chosen

V = TypeVar("V")

# Committed values kept in memory per partition; least recently used go first, past either bound.
# The bytes count each key and value and CACHE_ENTRY_BYTES Python spends around them: values go up
# to 64 KiB, so the key count alone let a partition's cache reach gigabytes (found by review).
CACHE_KEY_COUNT_MAX = 100_000
CACHE_BYTES_MAX = 32 * 1024 * 1024
CACHE_ENTRY_BYTES = 100
# Bytes of writes the executions of one partition buffer at once (keys, values and
# BUFFERED_ENTRY_BYTES around each): each transaction's stay within one redo record
# (REDO_BYTES_MAX, the coordinator checks), but the transactions a partition serves at once are
# bounded only by the coordinators' limits, thousands each. Past it a request is refused, as
# retryable as a lock conflict, until executions end: 512 of the largest fit.
BUFFERED_BYTES_MAX = 64 * 1024 * 1024
BUFFERED_ENTRY_BYTES = 100
# Transactions remembered as aborted here, so a late execute for one is refused, not restarted.
ABORTED_REMEMBERED_COUNT_MAX = 10_000
# An owner drops an execution no request touched for this many times its coordinator's idle
# timeout (timeout_ms_txn_idle): by then the coordinator has aborted the transaction (its client
# went quiet), or is gone, or has refreshed it (`refresh_due`).
EXECUTION_IDLE_FACTOR = 2
# The coordinator refreshes a partition its last request reached more than this part of its idle
# timeout ago (a divisor): the refresh then has the other 1.5 timeouts, less the sweeps' period
# and a round trip, to arrive before the owner's drop, and costs one empty request per partition
# per half timeout of a transaction that lasts that long, none for the rest.
REFRESH_DIVISOR = 2
# A refresh that got no answer (its owner down, the partition between owners) is tried again this
# part of the idle timeout later (a divisor), not at every sweep (found by review): some twelve
# tries still fit before the owner's drop, and an owner that is down costs a few requests per
# transaction, not one every sweep.
REFRESH_RETRY_DIVISOR = 8
# A refresh is due more than a whole idle timeout before the owner's drop, and its retries within it.
assert EXECUTION_IDLE_FACTOR >= 2 and REFRESH_DIVISOR >= 2 and REFRESH_RETRY_DIVISOR > REFRESH_DIVISOR


def execution_idle_ms(txn_idle_ms: int) -> int:
    """How long an owner keeps an execution no request touched, for a coordinator's idle timeout."""
    assert txn_idle_ms > 0, txn_idle_ms
    return EXECUTION_IDLE_FACTOR * txn_idle_ms


def refresh_unanswered_ms(previous_ms: int, sent_ms: int, txn_idle_ms: int) -> int:
    """What to count as the last request's time on a partition whose refresh, sent at `sent_ms`,
    got no answer (its last request before that left at `previous_ms`): a time that makes it due
    again (`refresh_due`) one retry (1/REFRESH_RETRY_DIVISOR of the idle timeout) after the send."""
    assert txn_idle_ms > 0 and previous_ms <= sent_ms, (txn_idle_ms, previous_ms, sent_ms)
    return max(previous_ms, sent_ms + txn_idle_ms // REFRESH_RETRY_DIVISOR - txn_idle_ms // REFRESH_DIVISOR)


def refresh_due(requested_ms: Mapping[str, int], now_ms: int, txn_idle_ms: int) -> list[str]:
    """The partitions whose executions the coordinator of an active transaction refreshes now:
    those its last request (`requested_ms`, when it left) reached more than 1/REFRESH_DIVISOR of
    the idle timeout ago. Its client may work elsewhere for as long as it likes without going
    idle, while the owners count only their own requests (found by review: an execution dropped
    behind a busy client's back aborted its commit)."""
    assert txn_idle_ms > 0, txn_idle_ms
    refresh_ms = txn_idle_ms // REFRESH_DIVISOR
    return [partition for partition, sent_ms in requested_ms.items() if now_ms - sent_ms > refresh_ms]


class RedoCodec(Protocol[V]):
    """How a partition's buffered writes (and a one-shot's keys only read) become a redo."""

    def encode(self, writes: Mapping[str, V | None], reads: Iterable[str] = ()) -> bytes: ...

    def decode(self, redo: bytes) -> dict[str, V | None]: ...

    def lock_keys(self, redo: bytes) -> tuple[list[str], list[str]]: ...

    def value_bytes(self, value: V | None) -> int: ...


class Refusal(enum.Enum):
    """Why a request of a transaction may not execute here."""

    ABORTED = "aborted"  # aborted here before: nothing of it may run again
    STATE_LOST = "state_lost"  # a continued request, but its earlier operations are gone
    DUPLICATE = "duplicate"  # a first request of a transaction that runs here already
    ENDED = "ended"  # a first request of a client-chosen id whose run here ended (ReleaseLocks)
    # A first request of a client-chosen id begun before this tenure of the partition: its run
    # under an earlier tenure, whose memory of ended ids this one lacks, may have ended here.
    BEFORE_TENURE = "before_tenure"


@dataclass(slots=True)
class Execution(Generic[V]):
    """A transaction's state on this partition between its first operation and its prepare."""

    coordinator: str
    last_active_ms: int
    writes: dict[str, V | None] = field(default_factory=dict)
    # Keys a one-shot's request only read, in order: its vote comes before the transaction's last
    # lock elsewhere, so its redo names them for recovery to lock again.
    reads: dict[str, None] = field(default_factory=dict)
    # What it counts against the partition's BUFFERED_BYTES_MAX, given back at its end: what its
    # writes take (a key written again counts once, at its last value), and what requests still
    # running reserved for the writes they have not made yet.
    buffered_bytes: int = 0
    # A request of the transaction other than the one that began it ran in it (concurrent calls
    # of an interactive transaction): what the execution holds is no longer one request's.
    joined: bool = False


class PartitionExecutions(Generic[V]):
    def __init__(
        self, name: str, codec: RedoCodec[V], policy: Policy = Policy.NO_WAIT, timeout_ms_lock_wait: int = 100,
        *, cache_key_count_max: int = CACHE_KEY_COUNT_MAX, cache_bytes_max: int = CACHE_BYTES_MAX,
        aborted_remembered_count_max: int = ABORTED_REMEMBERED_COUNT_MAX,
        buffered_bytes_max: int = BUFFERED_BYTES_MAX, tenure_began_ms: int = 0, clock_slack_ms: int = 0,
    ) -> None:
        assert cache_key_count_max >= 1 and cache_bytes_max >= 1 and aborted_remembered_count_max >= 1
        assert buffered_bytes_max >= 1
        self.name = name
        self.codec = codec
        self.locks = LockTable(policy, timeout_ms_lock_wait)
        self.executions: dict[str, Execution[V]] = {}
        self._cache_key_count_max = cache_key_count_max
        self._cache_bytes_max = cache_bytes_max
        self.cache_bytes = 0
        self._buffered_bytes_max = buffered_bytes_max
        self.buffered_bytes = 0
        self._aborted_count_max = aborted_remembered_count_max
        self._aborted: collections.OrderedDict[str, None] = collections.OrderedDict()
        # Client-chosen ids whose execution here ended, as many as aborted ones: 10,000 covers the
        # one-shot request window (begin + peer request timeout + 2 slacks, 4 s by default) at
        # 2,500 such transactions a second per partition; past the window, requests are refused
        # by their deadline anyway.
        self._ended: collections.OrderedDict[str, None] = collections.OrderedDict()
        # When this tenure of the partition began, by this node's clock (0: no earlier tenure's
        # runs to mind, as in a unit test), and the slack two nodes' clocks may differ by.
        assert tenure_began_ms >= 0 and clock_slack_ms >= 0
        self._tenure_began_ms = tenure_began_ms
        self._clock_slack_ms = clock_slack_ms
        self._cache: collections.OrderedDict[str, V | None] = collections.OrderedDict()

    # --- the execution phase -------------------------------------------------------------------
    def begin(self, txn: str, coordinator: str, now_ms: int, *, continued: bool = False) -> Execution[V] | Refusal:
        """The execution a request of `txn` runs in (a new one for its first request), or why it
        may not run."""
        if txn in self._aborted:
            return Refusal.ABORTED
        if txn in self._ended:
            # Its run here voted, was decided and let go; another process of its coordinator's
            # node, to which the client sent the id too, asks again (found by review: run again,
            # its vote met the decision in the log, and the owner crashed on it).
            return Refusal.ENDED
        execution = self.executions.get(txn)
        if execution is None and not continued and self._ran_before_tenure_maybe(txn):
            return Refusal.BEFORE_TENURE
        if execution is None:
            # Locks without an execution are a recovered transaction's, and its machine answers
            # for it: callers send no request of a transaction a machine runs here.
            assert not self.locks.holds_any(txn), f"{txn} holds locks on {self.name} without an execution"
            if continued:
                self._remember_aborted(txn)
                return Refusal.STATE_LOST
            execution = self.executions[txn] = Execution(coordinator, now_ms)
            self.locks.register(txn, begin_ms_of(txn))
        elif not continued:
            # A second first request of one transaction: only a client that sent a one-shot's id
            # to two processes of its coordinator's node makes one (a pod replaced while its
            # process ran on). The first request may still wait for a lock here: this one must
            # not queue beside it (found by the simulator: the lock table's waits broke), nor run
            # the operations twice. Its coordinator hears that the transaction runs here, and may
            # have voted: it ends the transaction through the logs.
            return Refusal.DUPLICATE
        else:
            execution.joined = True
        execution.last_active_ms = now_ms
        return execution

    def _ran_before_tenure_maybe(self, txn: str) -> bool:
        """Whether a first request of `txn` may be a second run of a client-chosen id whose first
        run here, under an earlier tenure of the partition (before a move, a restart or a lease
        retaken), voted, was decided and ended: `_ended` remembers only this tenure's. The client
        sends such an id to two processes of its coordinator's node (a pod replaced while its
        process ran on), and the second run's vote met the decision in the log, which crashed
        the owner (found by audit, 2026-11-28, third). Its first run's request reached the earlier
        owner before this tenure began, so its begin is before that by the clocks the slack
        covers (the begin's, the earlier owner's, ours); a begin after it never ran before here.
        Its coordinator hears ABORTED, no refusal, and ends the transaction through the logs."""
        # The begin first: one int compare settles every request begun in this tenure, which is
        # nearly all of them, before the id's form is matched.
        if not self._tenure_began_ms or begin_ms_of(txn) > self._tenure_began_ms + 2 * self._clock_slack_ms:
            return False
        return is_client_chosen(txn)

    def lock(self, txn: str, key: str, mode: LockMode, now_ms: int) -> Grant:
        assert txn in self.executions, f"{txn} locks {key!r} on {self.name} outside an execution"
        return self.locks.acquire(txn, key, mode, begin_ms_of(txn), now_ms)

    def is_current(self, txn: str, execution: Execution[V]) -> bool:
        """Whether `execution` still runs (and so still holds its locks): false once dropped, also
        when a later request of the same transaction started a new one."""
        return self.executions.get(txn) is execution

    def cached(self, key: str) -> tuple[bool, V | None]:
        """(True, value) on a hit, (False, None) on a miss."""
        cache = self._cache
        if key not in cache:
            return False, None
        cache.move_to_end(key)
        return True, cache[key]

    def read_landed(self, txn: str, execution: Execution[V], found: Mapping[str, V | None]) -> None:
        """A storage read asked for by `execution` answered. Its values are the committed ones only
        while the execution's locks kept every writer off those keys."""
        if self.is_current(txn, execution):
            for key, value in found.items():
                self._cache_put(key, value)

    def write_bytes(self, key: str, value: V | None) -> int:
        """What one buffered write takes, as BUFFERED_BYTES_MAX counts it."""
        return BUFFERED_ENTRY_BYTES + len(key) + self.codec.value_bytes(value)

    def reserve(self, execution: Execution[V], write_bytes: int) -> bool:
        """Reserve `write_bytes` for writes a request of `execution` is about to make (the sum of
        their `write_bytes`), before its first wait lets another request in; False, nothing
        reserved, if they would take the partition past BUFFERED_BYTES_MAX."""
        assert write_bytes >= 0
        if self.buffered_bytes + write_bytes > self._buffered_bytes_max:
            return False
        execution.buffered_bytes += write_bytes
        self.buffered_bytes += write_bytes
        return True

    def buffer_write(self, execution: Execution[V], key: str, value: V | None) -> None:
        """Make one write `reserve` counted (a key written before gives back what its earlier
        value took, so the count stays what the writes take)."""
        writes = execution.writes
        released = self.write_bytes(key, writes[key]) if key in writes else 0
        writes[key] = value
        execution.buffered_bytes -= released
        self.buffered_bytes -= released
        assert execution.buffered_bytes >= 0 and self.buffered_bytes >= 0, (execution.buffered_bytes, released)

    def unreserve(self, execution: Execution[V], write_bytes: int) -> None:
        """A request ended without making writes it reserved `write_bytes` for (while its
        execution runs on: an execution that ended gave back everything)."""
        assert 0 <= write_bytes <= execution.buffered_bytes, (write_bytes, execution.buffered_bytes)
        execution.buffered_bytes -= write_bytes
        self.buffered_bytes -= write_bytes

    def ended(self, txn: str, read_only: bool) -> Executed | None:
        """At prepare (or the release of a partition only read): what the machine learns of the
        execution, None if its state is gone. The execution stays until the machine releases it,
        with its locks."""
        execution = self.executions.get(txn)
        if execution is None:
            return None
        writes = execution.writes
        reads = [key for key in execution.reads if key not in writes]
        redo = self.codec.encode(writes, reads) if writes or reads else b""
        assert not (read_only and redo), f"{txn} wrote on {self.name}, which its coordinator read only"
        return Executed(txn, self.name, execution.coordinator, redo, read_only=read_only)

    def abort(self, txn: str) -> list[Waiter]:
        """Abort before prepare: nobody can have voted for it here, so nothing is logged; it is
        remembered, so that no request of it starts it again. Returns the waiters now granted."""
        self._remember_aborted(txn)
        return self.release(txn)

    def refuse_after_begin(
        self, txn: str, execution: Execution[V], *, carries_prepare: bool, continued: bool,
    ) -> tuple[ExecuteStatus, list[Waiter]]:
        """A request of `txn` refused after it began, before it wrote or voted (what it read is too
        large to answer): the owner's answer, and the lock waiters granted by what goes. INVALID
        (the client's input, which changed nothing the transaction keeps) where that can be:
        a one-shot's request, which carries its prepare, ends the transaction here, remembered as
        aborted, so that no copy of it (a client-chosen id sent to a second process of its
        coordinator's node) begins it again and votes; a continued request leaves the earlier ones
        standing, and the locks it took stay to the transaction's end (strict two-phase locking
        allows more); a first one is withdrawn, its coordinator counting the partition untouched.
        ABORTED where another request of the transaction (a concurrent call of its client) ran in
        the execution meanwhile: withdrawn, its locks would go while its coordinator, told
        "invalid", commits without the partition."""
        if carries_prepare:
            return ExecuteStatus.INVALID, self.abort(txn)
        if continued:
            return ExecuteStatus.INVALID, []
        if execution.joined:
            return ExecuteStatus.ABORTED, self.abort(txn)
        return ExecuteStatus.INVALID, self.withdraw(txn, execution)

    def withdraw(self, txn: str, execution: Execution[V]) -> list[Waiter]:
        """A first request of `txn` refused after it began (what it read is too large to answer)
        made nothing the transaction keeps: its execution goes as if it never began, remembered
        neither as aborted nor as ended, since its coordinator, told "invalid", may send the
        corrected request as a first one. Returns the waiters its locks' release granted."""
        assert self.executions.get(txn) is execution, f"{txn} withdrawn on {self.name} outside its execution"
        assert not execution.joined, f"{txn} withdrawn on {self.name} under another request of it"
        assert not execution.writes and not execution.reads, f"{txn} withdrawn on {self.name} after it ran"
        del self.executions[txn]
        self.buffered_bytes -= execution.buffered_bytes
        assert self.buffered_bytes >= 0, (self.name, self.buffered_bytes)
        return self.locks.release(txn)

    def _remember_aborted(self, txn: str) -> None:
        self._aborted[txn] = None
        while len(self._aborted) > self._aborted_count_max:
            self._aborted.popitem(last=False)

    def release(self, txn: str) -> list[Waiter]:
        """The execution ends and its locks go; returns the lock waiters granted by the release."""
        if is_client_chosen(txn):
            self._ended[txn] = None
            while len(self._ended) > self._aborted_count_max:
                self._ended.popitem(last=False)
        execution = self.executions.pop(txn, None)
        if execution is not None:
            self.buffered_bytes -= execution.buffered_bytes
            assert self.buffered_bytes >= 0, (self.name, self.buffered_bytes)
        return self.locks.release(txn)

    def idle_out(self, txn: str, busy: bool) -> list[Waiter] | None:
        """Drop the execution of `txn` as idle, unless a machine runs it (`busy`): None if kept,
        else the lock waiters its release granted."""
        if busy or txn not in self.executions:
            return None
        return self.abort(txn)

    def idle(self, now_ms: int, idle_ms: int) -> list[str]:
        """The executions no request touched for longer than `idle_ms`."""
        return [txn for txn, e in self.executions.items() if now_ms - e.last_active_ms > idle_ms]

    def close(self) -> None:
        """The partition is lost: every execution goes (the new owner starts from storage)."""
        self.executions.clear()
        self.buffered_bytes = 0

    # --- the commit side (the machines' effects) ------------------------------------------------
    def retake_locks(self, txn: str, redo: bytes) -> None:
        """Recovery: lock what an unfinished record will write (and what a one-shot read), before
        anyone else can. It voted yes (or committed), so its locks go at the decision."""
        self.locks.register(txn, begin_ms_of(txn))
        written, read = self.codec.lock_keys(redo)
        for key in written:
            self.locks.retake(txn, key)
        for key in read:
            self.locks.retake(txn, key, LockMode.SHARED)
        self.locks.mark_prepared(txn)

    def cache_redo(self, redo: bytes) -> None:
        """The machine says this redo is in storage and its keys are still locked by it."""
        for key, value in self.codec.decode(redo).items():
            self._cache_put(key, value)

    def forget_cache(self) -> None:
        self._cache.clear()
        self.cache_bytes = 0

    def _cache_put(self, key: str, value: V | None) -> None:
        cache = self._cache
        if key in cache:
            self.cache_bytes -= self._entry_bytes(key, cache.pop(key))
        cache[key] = value
        self.cache_bytes += self._entry_bytes(key, value)
        while len(cache) > self._cache_key_count_max or self.cache_bytes > self._cache_bytes_max:
            evicted_key, evicted = cache.popitem(last=False)
            self.cache_bytes -= self._entry_bytes(evicted_key, evicted)
        assert self.cache_bytes >= 0 and (cache or self.cache_bytes == 0), self.cache_bytes

    def _entry_bytes(self, key: str, value: V | None) -> int:
        return CACHE_ENTRY_BYTES + len(key) + self.codec.value_bytes(value)

