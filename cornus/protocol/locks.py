"""Strict two-phase locking for one partition: shared/exclusive locks, upgrade, NO_WAIT (the
paper's setting, default) or WAIT_DIE, bounded waits, and release of everything at the decision.

Pure: the caller passes the time (`now_ms`) and gets back who was granted or must abort.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class LockMode(enum.Enum):
    SHARED = "S"
    EXCLUSIVE = "X"


class Policy(enum.Enum):
    NO_WAIT = "no_wait"
    WAIT_DIE = "wait_die"


class Grant(enum.Enum):
    GRANTED = "granted"
    WAITING = "waiting"
    ABORT = "abort"  # retryable conflict


@dataclass(frozen=True, slots=True)
class Waiter:
    txn: str
    key: str
    mode: LockMode
    timestamp: int  # WAIT_DIE age: smaller is older
    deadline_ms: int


@dataclass(slots=True)
class _Entry:
    holders: dict[str, LockMode] = field(default_factory=dict)
    waiters: list[Waiter] = field(default_factory=list)


def _compatible(entry: _Entry, txn: str, mode: LockMode) -> bool:
    others = [m for t, m in entry.holders.items() if t != txn]
    if not others:
        return True
    return mode is LockMode.SHARED and all(m is LockMode.SHARED for m in others)


class LockTable:
    def __init__(self, policy: Policy = Policy.NO_WAIT, timeout_ms_wait: int = 100) -> None:
        assert timeout_ms_wait > 0
        self.policy = policy
        self.timeout_ms_wait = timeout_ms_wait
        self._entries: dict[str, _Entry] = {}
        self._held: dict[str, set[str]] = {}
        # Keys each transaction waits on, and keys anyone waits on: release and expiry touch only
        # those, never every locked key (they run once per transaction, on the hot path).
        self._waiting: dict[str, set[str]] = {}
        self._keys_waited: set[str] = set()
        # Holders that voted yes: their locks go at the decision, which Cornus sends right after
        # replying, so a conflicting request waits (bounded) instead of aborting (DESIGN 4).
        self._prepared: set[str] = set()
        self._timestamps: dict[str, int] = {}

    def acquire(self, txn: str, key: str, mode: LockMode, timestamp: int, now_ms: int) -> Grant:
        # A transaction keeps its first timestamp (its age) for WAIT_DIE across all its requests.
        self._timestamps.setdefault(txn, timestamp)
        entry = self._entries.setdefault(key, _Entry())
        held = entry.holders.get(txn)
        if held is LockMode.EXCLUSIVE or held is mode:
            return Grant.GRANTED
        # Waiters queue strictly behind one another, except an upgrade by a sole holder.
        queue_ok = not entry.waiters or (held is not None and len(entry.holders) == 1)
        if queue_ok and _compatible(entry, txn, mode):
            entry.holders[txn] = mode  # also the upgrade S -> X
            self._held.setdefault(txn, set()).add(key)
            return Grant.GRANTED
        blockers = [t for t in entry.holders if t != txn]
        # WAIT_DIE: an older requester waits for younger holders; a younger one dies.
        waits = self.policy is Policy.WAIT_DIE and all(
            self._timestamps[txn] < self._timestamps[t] for t in blockers
        )
        if blockers and all(t in self._prepared for t in blockers):
            waits = True
        if not waits:
            return Grant.ABORT
        assert key not in self._waiting.get(txn, ()), f"{txn} already waits for {key!r}"
        entry.waiters.append(Waiter(txn, key, mode, timestamp, now_ms + self.timeout_ms_wait))
        self._waiting.setdefault(txn, set()).add(key)
        self._keys_waited.add(key)
        return Grant.WAITING

    def register(self, txn: str, timestamp: int) -> None:
        """Record a transaction's WAIT_DIE age (its first start time) before it locks anything."""
        self._timestamps[txn] = timestamp

    def mark_prepared(self, txn: str) -> None:
        self._prepared.add(txn)

    def retake(self, txn: str, key: str, mode: LockMode = LockMode.EXCLUSIVE) -> None:
        """Recovery only: hold `key` for `txn` in `mode` even beside another recovered holder.
        Two recovered transactions may name one key (coordinator-log recovers from the
        coordinators' logs, which still hold aborted transactions' redo until garbage collection);
        at most one of them can commit, and both block everyone else until decided. A key a
        transaction only read is retaken shared: it kept others from writing it before the
        restart, and must until the decision (a one-shot's partition votes before the
        transaction's last lock is taken elsewhere)."""
        entry = self._entries.setdefault(key, _Entry())
        assert not entry.waiters, "recovery relocks before anyone can wait"
        if entry.holders.get(txn) is not LockMode.EXCLUSIVE:
            entry.holders[txn] = mode
        self._held.setdefault(txn, set()).add(key)

    def holds_any(self, txn: str) -> bool:
        return bool(self._held.get(txn))

    def holders(self, key: str) -> dict[str, LockMode]:
        entry = self._entries.get(key)
        return dict(entry.holders) if entry else {}

    def release(self, txn: str) -> list[Waiter]:
        """Release every lock of `txn` (at its decision) and return the waiters now granted."""
        self._prepared.discard(txn)
        self._timestamps.pop(txn, None)
        touched = self._held.pop(txn, set()) | self._waiting.pop(txn, set())
        granted: list[Waiter] = []
        for key in sorted(touched):
            entry = self._entries[key]
            entry.holders.pop(txn, None)
            # A waiter leaving the head of a queue may unblock the ones behind it, too.
            entry.waiters = [w for w in entry.waiters if w.txn != txn]
            granted += self._grant_waiters(key, entry)
        return granted

    def expire(self, now_ms: int) -> tuple[list[Waiter], list[Waiter]]:
        """Waiters whose bounded wait ran out (they must abort, retryable), and the waiters that
        queued behind them and are granted now that they left."""
        expired: list[Waiter] = []
        granted: list[Waiter] = []
        for key in sorted(self._keys_waited):
            entry = self._entries[key]
            gone = [w for w in entry.waiters if w.deadline_ms <= now_ms]
            if not gone:
                continue
            entry.waiters = [w for w in entry.waiters if w.deadline_ms > now_ms]
            for waiter in gone:
                self._waiting[waiter.txn].discard(key)
            expired += gone
            granted += self._grant_waiters(key, entry)
        return expired, granted

    def _grant_waiters(self, key: str, entry: _Entry) -> list[Waiter]:
        granted = []
        while entry.waiters and _compatible(entry, entry.waiters[0].txn, entry.waiters[0].mode):
            waiter = entry.waiters.pop(0)
            entry.holders[waiter.txn] = waiter.mode
            self._held.setdefault(waiter.txn, set()).add(key)
            self._waiting[waiter.txn].discard(key)
            granted.append(waiter)
        if not entry.waiters:
            self._keys_waited.discard(key)
        if not entry.holders:
            assert not entry.waiters, f"waiters on {key} with no holder to wait for"
            del self._entries[key]
        return granted
