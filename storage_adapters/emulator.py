"""The embedded default backend: a SQLite file in WAL mode, shared safely by many processes.

No server to install. Writes and reads take different paths:
- Every write of every process that shares the file goes to the file's single writer process
  (storage_adapters/emulator_writer.py), over a Unix socket beside the file; a store starts one
  (as its child) when it finds none, within a start budget of its own. The writer runs everything
  waiting in ONE SQLite transaction (group commit: the fsync at commit is this backend's cost,
  and one fsync makes the whole batch durable), each call under its own savepoint, so each gets
  exactly the answer it would get alone and a refused call writes nothing. A write carries the
  deadline its caller is held to, fixed when the call started (LogStore's `call_deadline`): the
  writer refuses it past that, so it lands no later than its deadline plus one batch's COMMIT.
- Reads run in the store's own reader thread with its own connection (WAL lets readers run beside
  the writer), also batched per transaction. A write is committed before it is answered, so a
  read that follows it sees it.
The nodes `list_identities` lists are the ownership table's rows named with the identity prefix
(their identity records), read as one range of that table's key: no registry beside them.
A tombstone (`delete` with keep) is a row with an expiry, which the writer's purge deletes once
the expiry has come, a bounded round at a time between batches (emulator_writer.py).
The SQL of each call is in storage_adapters/emulator_sql.py. A write travels to the writer in
its wire form, plain values (emulator_sql.py's module docstring says why), made here from the
validated arguments, and its answer becomes the contract's object again here, by lookup where it
can (`_STATES`, `_LOG_ONCE_RESULTS`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import queue
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from storage_adapters import emulator_sql, emulator_writer
from storage_adapters.contract import (
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
)
from storage_adapters.errors import StorageError, StorageUnavailable
from storage_adapters.store import DeleteRequest, LogStore, call_deadline, whole_page

# Reads waiting for the reader thread, and writes waiting for the writer's answer; past this the
# store answers StorageUnavailable at once instead of letting an overloaded caller queue without
# bound.
QUEUE_COUNT_MAX = 10_000
# Reads folded into one SQLite read transaction.
BATCH_COUNT_MAX = 256
TIMEOUT_MS_CALL_DEFAULT = 5_000
# How much earlier than its caller's timer a write's deadline at the writer is. The timer fires
# once the loop's clock reaches the deadline, and that clock never runs ahead of time.monotonic(),
# the writer's (asserted in `_write`); but uvloop rounds a timer's delay to whole milliseconds, so
# its timer may fire up to half a millisecond before the deadline.
WRITE_DEADLINE_MARGIN_MS = 2
# Finding the writer: a fresh one takes a Python start (about 0.2 s) before it listens.
CONNECT_POLL_MS_MIN = 2
CONNECT_POLL_MS_MAX = 50
# Attempts of one search for the writer: at CONNECT_POLL_MS_MAX apiece, past any caller's
# patience (open's is emulator_writer.WRITER_START_MS_MAX).
CONNECT_ATTEMPT_COUNT_MAX = 1_000
# A store starts a writer again no sooner than this after its last start, and only once the one
# it started has exited (it found another one serving, or failed: see its log) or has had
# WRITER_START_MS_MAX to come up: however many callers wait, one store starts one writer at a time.
SPAWN_INTERVAL_MS = 500
# Requests the link's transport may hold unsent (the writer reads none: it is stopped, or
# overloaded) before calls fail at once with StorageUnavailable instead of queueing memory. Room
# for the largest legal request beside the others.
LINK_OUT_BYTES_MAX = 2 * emulator_writer.FRAME_BYTES_MAX

# A TxnState's wire form (its value) and back: a dict lookup, where `.value` and TxnState(value)
# are Python-level calls, paid by every write.
_STATE_VALUES: dict[TxnState, str] = {state: state.value for state in TxnState}
_STATES: dict[str, TxnState] = {state.value: state for state in TxnState}
# Every answer log_once can give, by its wire form (state value, created): LogOnceResult is
# immutable, so one of each serves every call, unbuilt.
_LOG_ONCE_RESULTS: dict[tuple[str, bool], LogOnceResult] = {
    (state.value, created): LogOnceResult(state, created) for state in TxnState for created in (False, True)
}


@dataclass(slots=True)
class _Read:
    """One queued read: `run` executes on the reader thread inside the batch's read transaction."""

    run: Callable[[Any], Any]
    future: asyncio.Future[Any]
    loop: asyncio.AbstractEventLoop


class _WriterLink(asyncio.Protocol):
    """This process's connection to the file's writer, on one event loop: requests out, answers
    settled by call id. Requests of one loop iteration leave in one socket write."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.hello: asyncio.Future[Any] = loop.create_future()
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self.lost: str | None = None  # why the link is gone
        self.paused = False  # the transport holds more than LINK_OUT_BYTES_MAX unsent
        self._reader = emulator_writer.FrameReader()
        self._out: list[bytes] = []
        self._ids = itertools.count(1)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's Unix transport does not derive from asyncio.Transport; it has the same methods.
        self.transport = transport  # type: ignore[assignment]
        self.transport.set_write_buffer_limits(high=LINK_OUT_BYTES_MAX)  # type: ignore[union-attr]

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False

    def data_received(self, data: bytes) -> None:
        try:
            messages = self._reader.feed(data)
        except Exception as error:  # a writer that sends garbage is as good as gone
            self._fail(f"emulator writer sent a broken frame: {error!r}")
            return
        for call_id, ok, value in messages:
            if call_id == 0:
                if not self.hello.done():
                    self.hello.set_result(value)
                continue
            future = self.pending.pop(call_id, None)
            if future is None or future.done():
                continue  # its caller gave up (deadline)
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(f"emulator writer connection lost: {exc or 'closed'}")

    def _fail(self, reason: str) -> None:
        if self.lost is None:
            self.lost = reason
        if self.transport is not None:
            self.transport.abort()
        # One exception per caller: one raised in several would collect all their tracebacks.
        for future in (self.hello, *self.pending.values()):
            if not future.done():
                future.set_exception(StorageUnavailable(reason))
        self.pending.clear()

    def call(self, name: str, args: tuple[Any, ...], deadline_s: float) -> asyncio.Future[Any]:
        """Send one write; its answer settles the future. Raises at once (nothing sent, nothing
        registered) when the link is gone, the writer reads nothing, or the request is too large."""
        if self.lost is not None:
            raise StorageUnavailable(self.lost)
        if self.paused:
            raise StorageUnavailable(f"the emulator writer reads no requests ({LINK_OUT_BYTES_MAX} bytes unsent)")
        if len(self.pending) >= QUEUE_COUNT_MAX:
            raise StorageUnavailable(f"{QUEUE_COUNT_MAX} emulator writes waiting for the writer")
        call_id = next(self._ids)
        frame = emulator_writer.encode_frame((call_id, deadline_s, name, args))  # ValidationError: too large
        future = self.loop.create_future()
        self.pending[call_id] = future
        self._out.append(frame)
        if len(self._out) == 1:
            self.loop.call_soon(self._flush)
        return future

    def _flush(self) -> None:
        if self.transport is not None and self.lost is None:
            self.transport.write(b"".join(self._out))
        self._out.clear()

    def close(self) -> None:
        self._fail("store is closed")


class EmulatorStore(LogStore):
    """LogStore over a SQLite file. Open with `await EmulatorStore.open(path)`; one event loop
    uses it (the one that opened it: its writes are asserted to come from that loop). The file
    is not to be replaced under an open store: its reader keeps reading the file it opened."""

    backend_name = "emulator"
    # The writer already commits a whole batch in one transaction, but each call still pays its
    # own frame, future, savepoint and deadline: one call for a tick's deletes took CPU per
    # delete from ~26 us to ~15 us (waves of 50: scripts/bench_store_batches.py).
    coalesces_deletes = True
    # The file's writer purges expired tombstones every emulator_writer.TOMBSTONE_PURGE_INTERVAL_MS.
    drops_tombstones_at_expiry = True

    def __init__(self, path: Path, timeout_ms_call: int, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(timeout_ms_call)
        self.path = path
        self._loop = loop
        self._closed = False
        self._reads: queue.Queue[_Read | None] = queue.Queue(maxsize=QUEUE_COUNT_MAX)
        self._reader_ready = threading.Event()
        self._reader_error: BaseException | None = None
        # The file the reader opened (device, inode): the one file this store serves. Set once the
        # path names another (replaced under the open store), and every call fails from then on.
        self._file: tuple[int, int] | None = None
        self._replaced: str = ""
        self._reader = threading.Thread(
            target=self._read_forever, daemon=True, name=f"cornus-sqlite-reader-{path.name}"
        )
        self._link: _WriterLink | None = None
        self._connecting: asyncio.Lock = asyncio.Lock()
        # The writer this store started last, and when: kept across calls, so callers that give
        # up one after another while no writer is up do not each start one.
        self._spawned: subprocess.Popen[bytes] | None = None
        # A start under way (its process is only known when the thread that starts it returns).
        self._spawning: asyncio.Future[subprocess.Popen[bytes] | None] | None = None
        self._spawned_at = -float("inf")
        # Why the last search for a writer found none to use (for open's error).
        self._no_writer_because = "nobody listens"

    @classmethod
    async def open(cls, path: str | Path, *, timeout_ms_call: int = TIMEOUT_MS_CALL_DEFAULT) -> EmulatorStore:
        store = cls(Path(path), timeout_ms_call, asyncio.get_running_loop())
        # Opening is a start, not a call: it has the start's budget, however short the calls'
        # deadline (a thread start and SQLite's setup of a fresh file, then a writer's start).
        start_s = emulator_writer.WRITER_START_MS_MAX / 1000
        store._reader.start()
        try:
            ready = await asyncio.to_thread(store._reader_ready.wait, start_s)
            if not ready or store._reader_error is not None:
                raise StorageUnavailable(f"cannot open SQLite file {path}: {store._reader_error or 'timed out'}")
            # The writer is found (or started) now, so a node's first write pays no process start.
            async with asyncio.timeout(start_s):
                await store._writer_link()
        except BaseException as error:
            await store.close()
            if isinstance(error, TimeoutError):
                raise StorageUnavailable(
                    f"cannot open SQLite file {path}: no writer within {emulator_writer.WRITER_START_MS_MAX} ms "
                    f"({store._no_writer_because}; see {path}{emulator_writer.LOG_SUFFIX})"
                ) from None
            raise
        return store

    @property
    def writer_pid(self) -> int | None:
        """The process id of the writer this store is connected to (None while it is not)."""
        link = self._link
        if link is None or link.lost is not None or not link.hello.done() or link.hello.exception() is not None:
            return None
        return int(link.hello.result()[1])

    # --- reads: the reader thread ---------------------------------------------------------------

    def _read_forever(self) -> None:
        try:
            # upgrade=False: a file of an earlier version is the writer's to upgrade (see connect).
            conn = emulator_sql.connect(self.path, emulator_writer.WRITER_START_MS_MAX, upgrade=False)
            conn.execute(f"PRAGMA busy_timeout = {self.timeout_ms_call}")  # a read waits no longer than its caller
            # The file is open now (connect reads it), so what the path names after is that file,
            # unless it was replaced in between: then the first read batch says so.
            self._file = emulator_writer.file_identity(os.stat(self.path))
        except BaseException as error:
            self._reader_error = error
            self._reader_ready.set()
            return
        self._reader_ready.set()
        try:
            while True:
                first = self._reads.get()
                if first is None:
                    return
                batch = [first]
                while len(batch) < BATCH_COUNT_MAX:
                    try:
                        more = self._reads.get_nowait()
                    except queue.Empty:
                        break
                    if more is None:
                        self._reads.put(None)  # finish this batch, then stop
                        break
                    batch.append(more)
                # A caller that gave up (deadline) is skipped: its answer would be discarded.
                live = [read for read in batch if not read.future.cancelled()]
                if live and not self._still_the_file():
                    _settle_all(live, [(False, StorageUnavailable(self._replaced))] * len(live))
                elif live:
                    results = emulator_sql.run_batch(conn, [read.run for read in live], writes=False)
                    _settle_all(live, results)
        finally:
            conn.close()

    def _still_the_file(self) -> bool:
        """Whether the path still names the file this store opened (one stat: a read batch's
        check). Once not, never again (found by audit: a store on a replaced file read the old
        file and wrote the new one, and a write it reported landed read back as absent)."""
        if self._replaced:
            return False
        try:
            here = emulator_writer.file_identity(os.stat(self.path))
        except OSError as error:
            here = None
            why = f"{self.path} cannot be looked at ({error.strerror or error})"
        else:
            why = f"{self.path} was replaced under this open store"
        if here == self._file:
            return True
        self._replaced = f"{why}: restart the node to open the file there now"
        return False

    async def _read_call(self, run: Callable[[Any], Any]) -> Any:
        if self._closed:
            raise StorageUnavailable("store is closed")
        if self._replaced:
            raise StorageUnavailable(self._replaced)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        try:
            self._reads.put_nowait(_Read(run, future, loop))
        except queue.Full:
            raise StorageUnavailable(f"SQLite read queue is full ({QUEUE_COUNT_MAX} calls waiting)") from None
        # The template's deadline bounds the wait; when it passes, the wait's cancellation cancels
        # the future, and the reader skips a cancelled call.
        return await future

    # --- writes: the file's writer process ------------------------------------------------------

    async def _write(self, name: str, *args: Any) -> Any:
        if self._closed:
            raise StorageUnavailable("store is closed")
        if self._replaced:
            raise StorageUnavailable(self._replaced)
        assert asyncio.get_running_loop() is self._loop, "an EmulatorStore serves the loop that opened it"
        # The writer refuses the write past this deadline, fixed before any await (finding the
        # writer may take a while): the template's own, so no write lands after its caller was
        # told that it failed, but by one batch's COMMIT (emulator_sql.run_batch). The writer
        # compares it with its time.monotonic(): the loop's clock must be that clock, or lag it.
        deadline_s = call_deadline() - WRITE_DEADLINE_MARGIN_MS / 1000
        assert self._loop.time() <= time.monotonic(), "the event loop's clock runs ahead of time.monotonic()"
        link = self._link
        if link is None or link.lost is not None:
            link = await self._writer_link()
        return await link.call(name, args, deadline_s)

    async def _writer_link(self) -> _WriterLink:
        """The link to a writer that said hello and serves this file, connecting (and starting a
        writer) if needed. Bounded by the caller's deadline (the template's, or open's)."""
        async with self._connecting:
            if self._link is not None and self._link.lost is None:
                return self._link
            poll_ms = CONNECT_POLL_MS_MIN
            for _attempt in range(CONNECT_ATTEMPT_COUNT_MAX):
                if self._closed:
                    raise StorageUnavailable("store is closed")
                link, anyone_there = await self._try_connect()
                if link is not None:
                    self._link = link
                    return link
                if not anyone_there:
                    # A writer that answers but must not be used (another file, another version)
                    # keeps the lock: one started now would only see it and leave.
                    await self._spawn_writer()
                await asyncio.sleep(poll_ms / 1000)
                poll_ms = min(poll_ms * 2, CONNECT_POLL_MS_MAX)
            raise StorageUnavailable(f"no emulator writer for {self.path} after {CONNECT_ATTEMPT_COUNT_MAX} attempts")

    async def _try_connect(self) -> tuple[_WriterLink | None, bool]:
        """(a link to the file's writer once it said hello, whether a writer answered). No link
        when nobody listens, or the writer was leaving, or serves another file or runs other code
        (`emulator_writer.hello_problem`). Whatever it opened is closed unless it is returned,
        also when the caller gives up (cancellation) half way."""
        link: _WriterLink | None = None
        kept = False
        try:
            try:
                # The loop makes and owns the socket, so it also closes it when the connect fails
                # or is cancelled half way; once there is a link, closing the link closes it.
                began_s = time.monotonic()
                with emulator_writer.socket_address(self.path) as address:
                    _transport, link = await self._loop.create_unix_connection(lambda: _WriterLink(self._loop), address)
            except OSError as error:
                self._no_writer_because = f"nobody listens ({error.strerror or error})"
                return None, False  # the caller starts a writer
            # Only this user's writer is trusted with the pickles it answers.
            peer = link.transport.get_extra_info("socket")  # type: ignore[union-attr]
            if emulator_writer.peer_uid(peer) != os.getuid():
                raise StorageUnavailable(f"the emulator writer socket of {self.path} belongs to another user")
            try:
                hello = await link.hello
            except StorageUnavailable:
                self._no_writer_because = "the writer was leaving"
                return None, False  # it was leaving (idle, or its file replaced) as this one connected
            problem = emulator_writer.hello_problem(hello, self.path, (began_s, time.monotonic()))
            if problem is not None:
                self._no_writer_because = problem
                return None, True
            if not self._still_the_file():
                # A writer of the file the path names now, which is not the one this store reads.
                raise StorageUnavailable(self._replaced)
            if self._closed:  # closed while this connected: close() did not see this link
                raise StorageUnavailable("store is closed")
            kept = True
            return link, True
        finally:
            if link is not None and not kept:
                link.close()

    async def _spawn_writer(self) -> None:
        """Start a writer for the file, unless this store started one that may still come up."""
        now = time.monotonic()
        if self._spawning is not None and not self._spawning.done():
            return  # a start is under way
        spawned = self._spawned
        starting = spawned is not None and spawned.returncode is None
        if starting and now - self._spawned_at < emulator_writer.WRITER_START_MS_MAX / 1000:
            return
        if now - self._spawned_at < SPAWN_INTERVAL_MS / 1000:
            return
        self._spawned_at = now
        # The process is kept even when the caller gives up (its deadline) while the thread starts
        # it: a start that nobody remembered would be repeated SPAWN_INTERVAL_MS later, beside it.
        spawning = self._spawning = asyncio.ensure_future(asyncio.to_thread(_start_writer, self.path))
        spawning.add_done_callback(self._spawn_done)
        await asyncio.shield(spawning)

    def _spawn_done(self, spawning: asyncio.Future[subprocess.Popen[bytes] | None]) -> None:
        if spawning.cancelled():
            return
        error = spawning.exception()
        if error is None:
            self._spawned = spawning.result()  # None: another process starts it
        else:  # said by the next call that finds no writer, even if this one's caller gave up
            self._no_writer_because = f"starting a writer failed: {type(error).__name__}: {error}"

    # --- the contract's calls -------------------------------------------------------------------

    async def _log_once(
        self, log: LogId, txn: str, state: TxnState, body: RecordBody, fence: Fence | None
    ) -> LogOnceResult:
        answer = await self._write(
            "log_once", log.key, txn, _STATE_VALUES[state], emulator_sql.body_wire(body), emulator_sql.fence_wire(fence)
        )
        return _LOG_ONCE_RESULTS[answer]

    async def _log(
        self, log: LogId, txn: str, state: TxnState, body: RecordBody | None, fence: Fence | None
    ) -> TxnState:
        body_wire = None if body is None else emulator_sql.body_wire(body)
        written = await self._write(
            "log", log.key, txn, _STATE_VALUES[state], body_wire, emulator_sql.fence_wire(fence)
        )
        return _STATES[written]

    async def _apply_redo(
        self, partition: str, txn: str, writes: dict[str, bytes | None], fence: Fence | None
    ) -> bool:
        # `writes` is the template's validated copy: a dict of str and bytes, its own wire form.
        return await self._write("apply_redo", partition, txn, writes, emulator_sql.fence_wire(fence))

    async def _delete(self, log: LogId, txn: str, fence: Fence | None, keep: Tombstone | None) -> bool:
        return await self._write(
            "delete", log.key, txn, emulator_sql.fence_wire(fence), emulator_sql.tombstone_wire(keep)
        )

    async def _delete_many(self, requests: Sequence[DeleteRequest]) -> list[bool | StorageError]:
        wire = tuple(
            (log.key, txn, emulator_sql.fence_wire(fence), emulator_sql.tombstone_wire(keep))
            for log, txn, fence, keep in requests
        )
        return await self._write("delete_many", wire)

    async def _write_owner(self, expected: Ownership | None, new: Ownership) -> OwnerWriteResult:
        stored, written = await self._write(
            "write_owner", emulator_sql.ownership_wire(expected), emulator_sql.ownership_wire(new)
        )
        if written:
            return OwnerWriteResult(new, written=True)
        return OwnerWriteResult(None if stored is None else Ownership(*stored), written=False)

    async def _read(self, log: LogId, txn: str) -> Record | None:
        return await self._read_call(lambda conn: emulator_sql.read(conn, log, txn))

    async def _scan_page(self, log: LogId, limit: int, after: str) -> ScanPage:
        records, full = await self._read_call(lambda conn: emulator_sql.scan_unfinished(conn, log, limit, after))
        return whole_page(records, limit, cut=full)

    async def _scan_finished_page(self, log: LogId, limit: int, after: str) -> ScanPage:
        records, resume_after = await self._read_call(
            lambda conn: emulator_sql.scan_finished(conn, log, limit, after))
        return ScanPage(tuple(records), resume_after)

    async def _read_data(self, partition: str, keys: tuple[str, ...]) -> dict[str, bytes | None]:
        return await self._read_call(lambda conn: emulator_sql.read_data(conn, partition, keys))

    async def _read_owners(self, partitions: tuple[str, ...]) -> dict[str, Ownership]:
        return await self._read_call(lambda conn: emulator_sql.read_owners(conn, partitions))

    async def _list_identities(self, after: str, limit: int) -> list[str]:
        # A read like any other: the identity records are rows of the ownership table (no
        # registry of its own, see emulator_sql.list_identities), and a take is committed before
        # it is answered, so a listing that follows it sees it.
        return await self._read_call(lambda conn: emulator_sql.list_identities(conn, after, limit))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._link is not None:
            self._link.close()
        if self._reader.is_alive():
            # put() may block only if the queue is full; the reader is draining it, so it frees.
            await asyncio.to_thread(self._reads.put, None)
            await asyncio.to_thread(self._reader.join, self.timeout_ms_call / 1000)


def _start_writer(path: Path) -> subprocess.Popen[bytes] | None:
    """Start a writer for `path` as this process's child, and a thread that reaps it when it exits
    (so no zombie stays, also where this process is PID 1 of a container and so would inherit
    and never reap a detached one). None when another process is starting one (its start lock,
    emulator_writer.lock_start): the caller connects to that one once it listens."""
    starting_fd = emulator_writer.lock_start(path)
    if starting_fd is None:
        return None
    try:
        return _spawn(path, starting_fd)
    finally:
        os.close(starting_fd)  # the writer holds the lock from here on (its inherited copy)


def _spawn(path: Path, starting_fd: int) -> subprocess.Popen[bytes]:
    # Its code is this process's: PYTHONPATH names this package's directory first, and `-P`
    # (spawn_command) keeps the working directory off the module path; that directory is the
    # root, so the writer holds no node's directory busy either.
    env = emulator_writer.spawn_environment()
    log_path = Path(f"{path}{emulator_writer.LOG_SUFFIX}")
    with contextlib.suppress(OSError):
        if log_path.stat().st_size > emulator_writer.WRITER_LOG_BYTES_MAX:
            log_path.write_bytes(b"")
    with open(log_path, "ab") as log_file:
        # Its own session: a signal to this node's process group does not reach the writer that
        # the other nodes share.
        process = subprocess.Popen(
            emulator_writer.spawn_command(path, starting_fd), stdin=subprocess.DEVNULL, stdout=log_file,
            stderr=log_file, start_new_session=True, env=env, cwd="/", pass_fds=(starting_fd,),
        )
    threading.Thread(target=process.wait, daemon=True, name=f"cornus-writer-reaper-{process.pid}").start()
    return process


def _settle_all(reads: list[_Read], results: list[tuple[bool, Any]]) -> None:
    # One wake-up of each caller's loop for the whole batch, not one per call.
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], bool, Any]]] = {}
    for read, (ok, value) in zip(reads, results, strict=True):
        by_loop.setdefault(read.loop, []).append((read.future, ok, value))
    for loop, settled in by_loop.items():
        with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits any more
            loop.call_soon_threadsafe(_settle_batch, settled)


def _settle_batch(settled: list[tuple[asyncio.Future[Any], bool, Any]]) -> None:
    for future, ok, value in settled:
        if future.done():  # the caller's deadline passed first
            continue
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)
