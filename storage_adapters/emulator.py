"""The embedded default backend: a SQLite file in WAL mode, shared safely by many processes.

No server to install. Each store has two worker threads, one for writes and one for reads, each
with its own connection and queue (WAL lets readers run beside the writer, so a read never waits
behind a write that waits for the write lock). A worker runs everything queued so far in ONE
SQLite transaction (group commit), because the fsync at commit is this backend's bottleneck and
one fsync can make a whole batch durable. Each
call still gets exactly the answer it would get alone: calls in a batch run one after another
inside the transaction, each under its own savepoint, so a refused call writes nothing.

Several processes may open the same file: `BEGIN IMMEDIATE` takes SQLite's write lock before any
read, so a `log_once` read-then-insert is atomic across processes too. Before it, a writer takes
an exclusive `flock` on `<file>.writer-lock`: SQLite's own wait for a busy lock sleeps 1, 2, 5,
10 ms between attempts, so processes taking turns at the write lock spent most of their time
asleep; the flock (blocking, so the thread waits without the GIL) hands the turn over as soon as
it is free. It only orders our own writers: a process that does not take it is still serialized
by SQLite's lock, only more slowly. A write whose caller's deadline passed while it waited for the
flock is dropped unwritten, so no write lands after its caller was told it failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from storage_adapters.contract import (
    Fence,
    LogId,
    LogKind,
    LogOnceResult,
    Ownership,
    OwnerWriteResult,
    Record,
    RecordBody,
    TxnState,
    check_log_transition,
)
from storage_adapters.errors import Fenced, InvariantViolation, StorageError, StorageUnavailable
from storage_adapters.store import DeleteRequest, LogStore

# Calls waiting for the worker thread; past this the store answers StorageUnavailable at once
# instead of letting an overloaded caller queue without bound.
QUEUE_COUNT_MAX = 10_000
# Calls folded into one SQLite transaction: large enough to amortise the fsync, small enough that
# one transaction never holds the cross-process write lock for long.
BATCH_COUNT_MAX = 256
TIMEOUT_MS_CALL_DEFAULT = 5_000
# Opening retries lock contention between processes that set up a fresh file at once.
OPEN_RETRY_COUNT_MAX = 64
OPEN_BACKOFF_MS_MIN = 5
OPEN_BACKOFF_MS_MAX = 200

_SCHEMA = """
CREATE TABLE IF NOT EXISTS txn_log (
    log TEXT NOT NULL,
    txn TEXT NOT NULL,
    state TEXT NOT NULL,
    participants TEXT NOT NULL,
    coordinator TEXT NOT NULL,
    redo BLOB NOT NULL,
    applied INTEGER NOT NULL,
    created_at_ms INTEGER NOT NULL,
    PRIMARY KEY (log, txn)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS txn_log_unfinished ON txn_log (log)
    WHERE state = 'VOTE_YES' OR (state = 'COMMIT' AND applied = 0);
CREATE TABLE IF NOT EXISTS ownership (
    partition TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    version INTEGER NOT NULL,
    lease_ms INTEGER NOT NULL,
    wanted_by TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS data (
    partition TEXT NOT NULL,
    key TEXT NOT NULL,
    value BLOB NOT NULL,
    PRIMARY KEY (partition, key)
) WITHOUT ROWID;
"""

_RECORD_COLUMNS = "log, txn, state, participants, coordinator, redo, applied, created_at_ms"


@dataclass(slots=True)
class _Call:
    """One queued call: `run` executes on the worker thread inside the batch transaction."""

    run: Callable[[sqlite3.Connection], Any]
    writes: bool
    future: asyncio.Future[Any]
    loop: asyncio.AbstractEventLoop
    deadline_s: float  # time.monotonic() past which its caller has given up


@dataclass
class _Lane:
    """A worker thread of the store, with its queue: one lane for writes, one for reads."""

    writes: bool
    queue: queue.Queue[_Call | None] = field(default_factory=lambda: queue.Queue(maxsize=QUEUE_COUNT_MAX))
    ready: threading.Event = field(default_factory=threading.Event)
    open_error: BaseException | None = None
    thread: threading.Thread | None = None


def _now_ms() -> int:
    return int(time.time() * 1000)


def _record_from_row(row: tuple[Any, ...]) -> Record:
    log_key, txn, state, participants, coordinator, redo, applied, created_at_ms = row
    kind, _, name = log_key.partition(".")
    return Record(
        log=LogId(LogKind(kind), name),
        txn=txn,
        state=TxnState(state),
        body=RecordBody(tuple(json.loads(participants)), coordinator, bytes(redo)),
        applied=bool(applied),
        created_at_ms=created_at_ms,
    )


def _is_lock_contention(error: sqlite3.OperationalError) -> bool:
    message = str(error).lower()
    return "locked" in message or "busy" in message


def _select_record(conn: sqlite3.Connection, log: LogId, txn: str) -> Record | None:
    row = conn.execute(
        f"SELECT {_RECORD_COLUMNS} FROM txn_log WHERE log = ? AND txn = ?", (log.key, txn)
    ).fetchone()
    return None if row is None else _record_from_row(row)


def _insert_record(conn: sqlite3.Connection, log: LogId, txn: str, state: TxnState, body: RecordBody) -> bool:
    cursor = conn.execute(
        "INSERT INTO txn_log VALUES (?, ?, ?, ?, ?, ?, 0, ?) ON CONFLICT (log, txn) DO NOTHING",
        (log.key, txn, state.value, json.dumps(body.participants), body.coordinator, body.redo, _now_ms()),
    )
    return cursor.rowcount == 1


def _select_owner(conn: sqlite3.Connection, partition: str) -> Ownership | None:
    row = conn.execute(
        "SELECT partition, owner, epoch, version, lease_ms, wanted_by FROM ownership WHERE partition = ?",
        (partition,),
    ).fetchone()
    return None if row is None else Ownership(*row)


def _check_fence(conn: sqlite3.Connection, fence: Fence | None) -> None:
    """Raise Fenced unless the fence holds. Every write runs under the write lock taken by
    BEGIN IMMEDIATE, so no take of the partition can slip between this read and the write."""
    if fence is None:
        return
    stored = _select_owner(conn, fence.partition)
    if not fence.admits(stored):
        raise Fenced(fence, stored)


class EmulatorStore(LogStore):
    """LogStore over a SQLite file. Open with `await EmulatorStore.open(path)`."""

    backend_name = "emulator"
    # The worker already commits a whole queue in one transaction, but each call still pays its
    # own queue hand-off, future, savepoint and deadline context: one call for a tick's deletes
    # took CPU per delete from ~26 us to ~15 us (waves of 50: scripts/bench_store_batches.py).
    coalesces_deletes = True

    def __init__(self, path: Path, timeout_ms_call: int) -> None:
        super().__init__(timeout_ms_call)
        self.path = path
        self._closed = False
        self._lanes = {writes: _Lane(writes) for writes in (True, False)}
        for lane in self._lanes.values():
            lane.thread = threading.Thread(target=self._worker, args=(lane,), daemon=True,
                                           name=f"cornus-sqlite-{'writer' if lane.writes else 'reader'}-{path.name}")
        self._lock_fd = -1  # the writer flock's file, opened by the writer

    @classmethod
    async def open(cls, path: str | Path, *, timeout_ms_call: int = TIMEOUT_MS_CALL_DEFAULT) -> EmulatorStore:
        store = cls(Path(path), timeout_ms_call)
        for lane in store._lanes.values():
            lane.thread.start()
        deadline = time.monotonic() + timeout_ms_call / 1000
        for lane in store._lanes.values():
            ready = await asyncio.to_thread(lane.ready.wait, max(0.0, deadline - time.monotonic()))
            if not ready or lane.open_error is not None:
                await store.close()
                raise StorageUnavailable(f"cannot open SQLite file {path}: {lane.open_error or 'timed out'}")
        return store

    # --- worker thread -------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        # Processes that open a fresh file together race to switch it to WAL and create the
        # schema. Some of those lock upgrades fail with "database is locked" at once, without
        # waiting on busy_timeout (SQLite refuses to wait where waiting could deadlock), so the
        # whole setup is retried with backoff until the open deadline.
        deadline = time.monotonic() + self.timeout_ms_call / 1000
        backoff_ms = OPEN_BACKOFF_MS_MIN
        for _attempt in range(OPEN_RETRY_COUNT_MAX):
            conn = sqlite3.connect(self.path, timeout=self.timeout_ms_call / 1000, isolation_level=None)
            try:
                self._set_up(conn)
                return conn
            except sqlite3.OperationalError as error:
                conn.close()
                if not _is_lock_contention(error) or time.monotonic() + backoff_ms / 1000 > deadline:
                    raise
            time.sleep(backoff_ms / 1000)
            backoff_ms = min(backoff_ms * 2, OPEN_BACKOFF_MS_MAX)
        raise sqlite3.OperationalError(f"database is locked after {OPEN_RETRY_COUNT_MAX} attempts")

    def _set_up(self, conn: sqlite3.Connection) -> None:
        # isolation_level=None: we issue BEGIN/COMMIT ourselves, so batching is explicit.
        conn.execute(f"PRAGMA busy_timeout = {int(self.timeout_ms_call)}")
        # Switching to WAL takes an exclusive lock, so only the first opener of a file does it;
        # WAL is persistent in the file, and later openers only read the mode.
        if conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            assert mode.lower() == "wal", f"SQLite refused WAL mode: {mode}"
        # FULL: in WAL mode NORMAL may lose the last commits on power loss, and an acknowledged
        # VOTE_YES must never be lost (a terminator could then log ABORT after a COMMIT reply).
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)  # IF NOT EXISTS: racing processes may all run it
            conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise

    def _worker(self, lane: _Lane) -> None:
        try:
            conn = self._connect()
            if lane.writes:
                self._lock_fd = os.open(f"{self.path}.writer-lock", os.O_RDWR | os.O_CREAT, 0o644)
        except BaseException as error:
            lane.open_error = error
            lane.ready.set()
            return
        lane.ready.set()
        try:
            while True:
                first = lane.queue.get()
                if first is None:
                    return
                batch = [first]
                while len(batch) < BATCH_COUNT_MAX:
                    try:
                        more = lane.queue.get_nowait()
                    except queue.Empty:
                        break
                    if more is None:
                        lane.queue.put(None)  # finish this batch, then stop
                        break
                    batch.append(more)
                self._run_batch(conn, batch, lane.writes)
        finally:
            conn.close()
            if lane.writes:
                os.close(self._lock_fd)

    def _run_batch(self, conn: sqlite3.Connection, batch: list[_Call], writes: bool) -> None:
        # A caller that gave up (deadline) is skipped, so a stale call never runs late.
        live = [call for call in batch if not call.future.cancelled()]
        if not live:
            return
        results: list[tuple[bool, Any]] = []
        if writes:
            # Blocking: the thread waits without the GIL and wakes as the lock frees (module doc).
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            now = time.monotonic()
            late = [call for call in live if now > call.deadline_s or call.future.cancelled()]
            if late:
                unavailable = StorageUnavailable(f"SQLite {self.path}: waited past the deadline for the write lock")
                self._settle_all(late, [(False, unavailable)] * len(late))
                late_ids = {id(call) for call in late}
                live = [call for call in live if id(call) not in late_ids]
            if not live:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
                return
        try:
            conn.execute("BEGIN IMMEDIATE" if writes else "BEGIN")
            for call in live:
                conn.execute("SAVEPOINT call")
                try:
                    results.append((True, call.run(conn)))
                    conn.execute("RELEASE call")
                except (StorageError, AssertionError) as error:
                    # A refused call writes nothing and is its caller's error alone; an assertion
                    # is a bug and goes to the caller too, so it crashes there loudly.
                    conn.execute("ROLLBACK TO call")
                    conn.execute("RELEASE call")
                    results.append((False, error))
            conn.execute("COMMIT")
        except sqlite3.Error as error:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            unavailable = StorageUnavailable(f"SQLite {self.path}: {error}")
            results = [(False, unavailable)] * len(live)
        finally:
            if writes:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        self._settle_all(live, results)

    @staticmethod
    def _settle_all(calls: list[_Call], results: list[tuple[bool, Any]]) -> None:
        # One wake-up of each caller's loop for the whole batch, not one per call.
        assert len(results) == len(calls)
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], bool, Any]]] = {}
        for call, (ok, value) in zip(calls, results, strict=True):
            by_loop.setdefault(call.loop, []).append((call.future, ok, value))
        for loop, settled in by_loop.items():
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits any more
                loop.call_soon_threadsafe(_settle_batch, settled)

    # --- asyncio side --------------------------------------------------------------------------

    async def _call(self, run: Callable[[sqlite3.Connection], Any], *, writes: bool) -> Any:
        if self._closed:
            raise StorageUnavailable("store is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        try:
            self._lanes[writes].queue.put_nowait(
                _Call(run, writes, future, loop, time.monotonic() + self._timeout_s)
            )
        except queue.Full:
            raise StorageUnavailable(f"SQLite queue is full ({QUEUE_COUNT_MAX} calls waiting)") from None
        # The template's deadline bounds the wait; when it passes, the wait's cancellation cancels
        # the future, and the worker skips a cancelled call rather than run it late.
        return await future

    async def _log_once(
        self, log: LogId, txn: str, state: TxnState, body: RecordBody, fence: Fence | None
    ) -> LogOnceResult:
        def run(conn: sqlite3.Connection) -> LogOnceResult:
            _check_fence(conn, fence)
            if _insert_record(conn, log, txn, state, body):
                return LogOnceResult(state, created=True)
            row = conn.execute("SELECT state FROM txn_log WHERE log = ? AND txn = ?", (log.key, txn)).fetchone()
            assert row is not None, "insert conflicted, so the record exists"
            return LogOnceResult(TxnState(row[0]), created=False)

        return await self._call(run, writes=True)

    async def _log(
        self, log: LogId, txn: str, state: TxnState, body: RecordBody | None, fence: Fence | None
    ) -> TxnState:
        def run(conn: sqlite3.Connection) -> TxnState:
            _check_fence(conn, fence)
            row = conn.execute("SELECT state FROM txn_log WHERE log = ? AND txn = ?", (log.key, txn)).fetchone()
            stored = None if row is None else TxnState(row[0])
            check_log_transition(log, txn, stored, state)
            if stored is None:
                created = _insert_record(conn, log, txn, state, body or RecordBody())
                assert created, "the write lock is held, so nobody created it since the read"
            elif body is None:
                conn.execute("UPDATE txn_log SET state = ? WHERE log = ? AND txn = ?", (state.value, log.key, txn))
            else:
                conn.execute(
                    "UPDATE txn_log SET state = ?, participants = ?, coordinator = ?, redo = ? "
                    "WHERE log = ? AND txn = ?",
                    (state.value, json.dumps(body.participants), body.coordinator, body.redo, log.key, txn),
                )
            return state

        return await self._call(run, writes=True)

    async def _read(self, log: LogId, txn: str) -> Record | None:
        return await self._call(lambda conn: _select_record(conn, log, txn), writes=False)

    async def _scan_unfinished(self, log: LogId, limit: int, after: str) -> list[Record]:
        def run(conn: sqlite3.Connection) -> list[Record]:
            # One statement, so the page is one snapshot; txn is TEXT with the BINARY collation, so
            # `>` and ORDER BY compare the ASCII ids bytewise, the contract's order.
            rows = conn.execute(
                f"SELECT {_RECORD_COLUMNS} FROM txn_log WHERE log = ? AND txn > ? "
                "AND (state = 'VOTE_YES' OR (state = 'COMMIT' AND applied = 0)) ORDER BY txn LIMIT ?",
                (log.key, after, limit),
            ).fetchall()
            return [_record_from_row(row) for row in rows]

        return await self._call(run, writes=False)

    async def _read_data(self, partition: str, keys: tuple[str, ...]) -> dict[str, bytes | None]:
        def run(conn: sqlite3.Connection) -> dict[str, bytes | None]:
            found: dict[str, bytes | None] = dict.fromkeys(keys)
            for key in keys:
                row = conn.execute(
                    "SELECT value FROM data WHERE partition = ? AND key = ?", (partition, key)
                ).fetchone()
                found[key] = None if row is None else bytes(row[0])
            return found

        return await self._call(run, writes=False)

    async def _apply_redo(
        self, partition: str, txn: str, writes: dict[str, bytes | None], fence: Fence | None
    ) -> bool:
        log = LogId.partition(partition)

        def run(conn: sqlite3.Connection) -> bool:
            _check_fence(conn, fence)
            row = conn.execute(
                "SELECT state, applied FROM txn_log WHERE log = ? AND txn = ?", (log.key, txn)
            ).fetchone()
            if row is None or row[0] not in (TxnState.VOTE_YES.value, TxnState.COMMIT.value):
                stored = "absent" if row is None else row[0]
                raise InvariantViolation(
                    f"apply_redo of txn {txn!r} on {partition!r}: record is {stored}, not VOTE_YES or COMMIT"
                )
            if row[1]:
                return False  # applied before: see the contract on why it must not be re-written
            for key, value in writes.items():
                if value is None:
                    conn.execute("DELETE FROM data WHERE partition = ? AND key = ?", (partition, key))
                else:
                    conn.execute(
                        "INSERT INTO data VALUES (?, ?, ?) ON CONFLICT (partition, key) DO UPDATE SET value = ?",
                        (partition, key, value, value),
                    )
            # A VOTE_YES becomes COMMIT here, in the transaction that writes the data (the
            # participant's own commit, see LogStore.apply_redo).
            conn.execute(
                "UPDATE txn_log SET state = ?, applied = 1 WHERE log = ? AND txn = ?",
                (TxnState.COMMIT.value, log.key, txn),
            )
            return True

        return await self._call(run, writes=True)

    async def _delete(self, log: LogId, txn: str, fence: Fence | None) -> bool:
        def run(conn: sqlite3.Connection) -> bool:
            _check_fence(conn, fence)
            return conn.execute("DELETE FROM txn_log WHERE log = ? AND txn = ?", (log.key, txn)).rowcount == 1

        return await self._call(run, writes=True)

    async def _delete_many(self, requests: Sequence[DeleteRequest]) -> list[bool | StorageError]:
        def run(conn: sqlite3.Connection) -> list[bool | StorageError]:
            outcomes: list[bool | StorageError] = []
            for request in requests:
                # The fence is checked before the delete, so a refused one has written nothing and
                # needs no savepoint of its own; the write lock keeps the check and delete atomic.
                try:
                    _check_fence(conn, request.fence)
                except Fenced as refused:
                    outcomes.append(refused)
                    continue
                deleted = conn.execute(
                    "DELETE FROM txn_log WHERE log = ? AND txn = ?", (request.log.key, request.txn)
                ).rowcount
                outcomes.append(deleted == 1)
            return outcomes

        return await self._call(run, writes=True)

    async def _read_owners(self, partitions: tuple[str, ...]) -> dict[str, Ownership]:
        def run(conn: sqlite3.Connection) -> dict[str, Ownership]:
            found = (_select_owner(conn, partition) for partition in partitions)
            return {record.partition: record for record in found if record is not None}

        return await self._call(run, writes=False)

    async def _write_owner(self, expected: Ownership | None, new: Ownership) -> OwnerWriteResult:
        def run(conn: sqlite3.Connection) -> OwnerWriteResult:
            stored = _select_owner(conn, new.partition)
            matches = (stored is None) if expected is None else (
                stored is not None and (stored.epoch, stored.version) == (expected.epoch, expected.version)
            )
            if not matches:
                return OwnerWriteResult(stored, written=False)
            conn.execute(
                "INSERT INTO ownership VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (partition) DO UPDATE SET "
                "owner = excluded.owner, epoch = excluded.epoch, version = excluded.version, "
                "lease_ms = excluded.lease_ms, wanted_by = excluded.wanted_by",
                (new.partition, new.owner, new.epoch, new.version, new.lease_ms, new.wanted_by),
            )
            return OwnerWriteResult(new, written=True)

        return await self._call(run, writes=True)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for lane in self._lanes.values():
            if lane.thread is not None and lane.thread.is_alive():
                # put() may block only if the queue is full; the worker is draining it, so it frees.
                await asyncio.to_thread(lane.queue.put, None)
                await asyncio.to_thread(lane.thread.join, self.timeout_ms_call / 1000)


def _settle_batch(settled: list[tuple[asyncio.Future[Any], bool, Any]]) -> None:
    for future, ok, value in settled:
        if future.done():  # the caller's deadline passed first
            continue
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)
