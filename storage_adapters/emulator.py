"""The embedded default backend: a SQLite file in WAL mode, shared safely by many processes.

No server to install. Writes and reads take different paths:
- Every write of every process that shares the file goes to the file's single writer process
  (storage_adapters/emulator_writer.py), which a store starts when it finds none. It runs
  everything waiting in ONE SQLite transaction (group commit: the fsync at commit is this
  backend's cost, and one fsync makes the whole batch durable), each call under its own
  savepoint, so each gets exactly the answer it would get alone and a refused call writes nothing.
- Reads run in the store's own reader thread with its own connection (WAL lets readers run beside
  the writer), also batched per transaction. A write is committed before it is answered, so a
  read that follows it sees it.
The SQL of each call is in storage_adapters/emulator_sql.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import queue
import socket
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
    TxnState,
)
from storage_adapters.errors import StorageError, StorageUnavailable
from storage_adapters.store import DeleteRequest, LogStore

# Reads waiting for the reader thread, and writes waiting for the writer's answer; past this the
# store answers StorageUnavailable at once instead of letting an overloaded caller queue without
# bound.
QUEUE_COUNT_MAX = 10_000
# Reads folded into one SQLite read transaction.
BATCH_COUNT_MAX = 256
TIMEOUT_MS_CALL_DEFAULT = 5_000
# Finding the writer: a fresh one takes a Python start (about 0.1 s) before it listens.
CONNECT_POLL_MS_MIN = 2
CONNECT_POLL_MS_MAX = 50
CONNECT_ATTEMPT_COUNT_MAX = 1_000
# Starting a writer again when the one started has not come up (it found another one leaving).
SPAWN_INTERVAL_MS = 500


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
        self.hello: asyncio.Future[int] = loop.create_future()
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self.lost: StorageUnavailable | None = None
        self._reader = emulator_writer.FrameReader()
        self._out: list[bytes] = []
        self._ids = itertools.count(1)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's Unix transport does not derive from asyncio.Transport; it has the same methods.
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            messages = self._reader.feed(data)
        except Exception as error:  # a writer that sends garbage is as good as gone
            self._fail(StorageUnavailable(f"emulator writer sent a broken frame: {error}"))
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
        self._fail(StorageUnavailable(f"emulator writer connection lost: {exc or 'closed'}"))

    def _fail(self, error: StorageUnavailable) -> None:
        if self.lost is None:
            self.lost = error
        if self.transport is not None:
            self.transport.abort()
        for future in (self.hello, *self.pending.values()):
            if not future.done():
                future.set_exception(error)
        self.pending.clear()

    def call(self, name: str, args: tuple[Any, ...], deadline_s: float) -> asyncio.Future[Any]:
        if self.lost is not None:
            raise self.lost
        if len(self.pending) >= QUEUE_COUNT_MAX:
            raise StorageUnavailable(f"{QUEUE_COUNT_MAX} emulator writes waiting for the writer")
        call_id = next(self._ids)
        future = self.loop.create_future()
        self.pending[call_id] = future
        self._out.append(emulator_writer.encode_frame((call_id, deadline_s, name, args)))
        if len(self._out) == 1:
            self.loop.call_soon(self._flush)
        return future

    def _flush(self) -> None:
        if self.transport is not None and self.lost is None:
            self.transport.write(b"".join(self._out))
        self._out.clear()

    def close(self) -> None:
        self._fail(StorageUnavailable("store is closed"))


class EmulatorStore(LogStore):
    """LogStore over a SQLite file. Open with `await EmulatorStore.open(path)`; one event loop
    uses it (the one that opened it)."""

    backend_name = "emulator"
    # The writer already commits a whole batch in one transaction, but each call still pays its
    # own frame, future, savepoint and deadline: one call for a tick's deletes took CPU per
    # delete from ~26 us to ~15 us (waves of 50: scripts/bench_store_batches.py).
    coalesces_deletes = True

    def __init__(self, path: Path, timeout_ms_call: int, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(timeout_ms_call)
        self.path = path
        self._loop = loop
        self._closed = False
        self._reads: queue.Queue[_Read | None] = queue.Queue(maxsize=QUEUE_COUNT_MAX)
        self._reader_ready = threading.Event()
        self._reader_error: BaseException | None = None
        self._reader = threading.Thread(
            target=self._read_forever, daemon=True, name=f"cornus-sqlite-reader-{path.name}"
        )
        self._link: _WriterLink | None = None
        self._connecting: asyncio.Lock = asyncio.Lock()

    @classmethod
    async def open(cls, path: str | Path, *, timeout_ms_call: int = TIMEOUT_MS_CALL_DEFAULT) -> EmulatorStore:
        store = cls(Path(path), timeout_ms_call, asyncio.get_running_loop())
        deadline = time.monotonic() + timeout_ms_call / 1000
        store._reader.start()
        try:
            ready = await asyncio.to_thread(store._reader_ready.wait, max(0.0, deadline - time.monotonic()))
            if not ready or store._reader_error is not None:
                raise StorageUnavailable(f"cannot open SQLite file {path}: {store._reader_error or 'timed out'}")
            # The writer is found (or started) now, so a node's first write pays no process start.
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                await store._writer_link()
        except BaseException as error:
            await store.close()
            if isinstance(error, TimeoutError):
                raise StorageUnavailable(f"cannot open SQLite file {path}: no writer within {timeout_ms_call} ms "
                                         f"(see {path}.writer.log)") from None
            raise
        return store

    @property
    def writer_pid(self) -> int | None:
        """The process id of the writer this store is connected to (None before it said hello)."""
        link = self._link
        if link is None or not link.hello.done() or link.hello.exception() is not None:
            return None
        return link.hello.result()

    # --- reads: the reader thread ---------------------------------------------------------------

    def _read_forever(self) -> None:
        try:
            conn = emulator_sql.connect(self.path, self.timeout_ms_call)
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
                if live:
                    results = emulator_sql.run_batch(conn, [read.run for read in live], writes=False)
                    _settle_all(live, results)
        finally:
            conn.close()

    async def _read_call(self, run: Callable[[Any], Any]) -> Any:
        if self._closed:
            raise StorageUnavailable("store is closed")
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
        assert asyncio.get_running_loop() is self._loop, "an EmulatorStore serves the loop that opened it"
        link = self._link
        if link is None or link.lost is not None:
            link = await self._writer_link()
        # The writer refuses the write once this deadline has passed, so a write never lands after
        # the template told its caller that it failed.
        return await link.call(name, args, time.monotonic() + self._timeout_s)

    async def _writer_link(self) -> _WriterLink:
        """The link to a writer that said hello, connecting (and starting a writer) if needed.
        Bounded by the caller's deadline (the template's, or open's)."""
        async with self._connecting:
            if self._link is not None and self._link.lost is None:
                return self._link
            address = emulator_writer.socket_address(self.path)
            spawned_at = -float("inf")
            poll_ms = CONNECT_POLL_MS_MIN
            for _attempt in range(CONNECT_ATTEMPT_COUNT_MAX):
                if self._closed:
                    raise StorageUnavailable("store is closed")
                link = await self._try_connect(address)
                if link is not None:
                    self._link = link
                    return link
                if time.monotonic() - spawned_at > SPAWN_INTERVAL_MS / 1000:
                    await asyncio.to_thread(_spawn_writer, self.path, self.timeout_ms_call)
                    spawned_at = time.monotonic()
                await asyncio.sleep(poll_ms / 1000)
                poll_ms = min(poll_ms * 2, CONNECT_POLL_MS_MAX)
            raise StorageUnavailable(f"no emulator writer for {self.path} after {CONNECT_ATTEMPT_COUNT_MAX} attempts")

    async def _try_connect(self, address: bytes) -> _WriterLink | None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await self._loop.sock_connect(sock, address)
            # Only this user's writer is trusted with the pickles it answers (abstract names
            # have no file permissions).
            if emulator_writer.peer_uid(sock) != os.getuid():
                raise StorageUnavailable(f"the emulator writer socket of {self.path} belongs to another user")
            _transport, link = await self._loop.create_unix_connection(lambda: _WriterLink(self._loop), sock=sock)
        except OSError:
            sock.close()
            return None  # nobody listens: the caller starts a writer
        try:
            await link.hello
        except StorageUnavailable:
            return None  # that writer was leaving (idle) as this one connected
        return link

    # --- the contract's calls -------------------------------------------------------------------

    async def _log_once(
        self, log: LogId, txn: str, state: TxnState, body: RecordBody, fence: Fence | None
    ) -> LogOnceResult:
        return await self._write("log_once", log, txn, state, body, fence)

    async def _log(
        self, log: LogId, txn: str, state: TxnState, body: RecordBody | None, fence: Fence | None
    ) -> TxnState:
        return await self._write("log", log, txn, state, body, fence)

    async def _apply_redo(
        self, partition: str, txn: str, writes: dict[str, bytes | None], fence: Fence | None
    ) -> bool:
        return await self._write("apply_redo", partition, txn, writes, fence)

    async def _delete(self, log: LogId, txn: str, fence: Fence | None) -> bool:
        return await self._write("delete", log, txn, fence)

    async def _delete_many(self, requests: Sequence[DeleteRequest]) -> list[bool | StorageError]:
        return await self._write("delete_many", [tuple(request) for request in requests])

    async def _write_owner(self, expected: Ownership | None, new: Ownership) -> OwnerWriteResult:
        return await self._write("write_owner", expected, new)

    async def _read(self, log: LogId, txn: str) -> Record | None:
        return await self._read_call(lambda conn: emulator_sql.read(conn, log, txn))

    async def _scan_unfinished(self, log: LogId, limit: int, after: str) -> list[Record]:
        return await self._read_call(lambda conn: emulator_sql.scan_unfinished(conn, log, limit, after))

    async def _read_data(self, partition: str, keys: tuple[str, ...]) -> dict[str, bytes | None]:
        return await self._read_call(lambda conn: emulator_sql.read_data(conn, partition, keys))

    async def _read_owners(self, partitions: tuple[str, ...]) -> dict[str, Ownership]:
        return await self._read_call(lambda conn: emulator_sql.read_owners(conn, partitions))

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


def _spawn_writer(path: Path, timeout_ms_call: int) -> None:
    """Start a writer for `path` and wait for its first process, which forks the writer and exits
    at once (so no zombie stays in this process when the writer leaves)."""
    command = emulator_writer.spawn_command(path, timeout_ms_call)
    package_root = str(Path(emulator_writer.__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])))
    with open(f"{path}.writer.log", "ab") as log_file:
        # Its own session: a signal to this node's process group does not reach the writer that
        # the other nodes share.
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file, start_new_session=True, env=env,
        )
    try:
        process.wait(timeout_ms_call / 1000)
    except subprocess.TimeoutExpired:
        process.kill()  # a first process that never forked serves nobody
        process.wait()


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
