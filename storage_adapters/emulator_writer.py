"""The emulator's single writer: one process per SQLite file runs the writes of every node process
that shares the file, so the writes of all of them go in one batch, one transaction, one fsync.

Why a process of its own: when each node process wrote the file itself, the processes took turns
at SQLite's write lock (about 3 ms of waiting per batch at 8 clients), and each process's writer
thread, holding that lock, waited for the GIL its event loop held at every SQLite call (a 0.3 ms
commit took 0.9 ms). This process has no event loop beside it, and no other writer to wait for.

How it is found: it listens on an abstract Unix socket named after the file's real path
(`socket_address`), admits only processes of its own user (SO_PEERCRED), and says hello to each
one. A store that finds nobody there starts one (`spawn_command`); of writers started together,
the one that takes the exclusive `flock` on `<file>.writer-lock` serves and the others leave. It
leaves `IDLE_MS_MAX` after its last client did.

The wire: frames of a 4-byte big-endian length and a pickle (only the same user's processes can
connect, in both directions). A request is (call id, deadline, write name, arguments), the
deadline in `time.monotonic()` seconds, a clock all processes of the machine share; the answer is
(call id, ok, result or error). A write whose deadline has passed when its turn comes is refused
unwritten, so no write lands after its caller was told it failed. Every request gets an answer.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import pickle
import selectors
import socket
import sqlite3
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from storage_adapters import emulator_sql
from storage_adapters.errors import StorageUnavailable

logger = logging.getLogger("cornus.emulator_writer")

SOCKET_NAME_PREFIX = b"\0cornus-emulator-writer-"
_LENGTH = struct.Struct(">I")
# A frame carries one call: at most a partition's redo (storage_adapters/contract.py bounds it
# well below this) or a batch of deletes; anything larger is a broken peer.
FRAME_BYTES_MAX = 16 * 1024 * 1024
# Writes in one SQLite transaction: large enough to amortise the fsync, small enough that one
# transaction never holds the write lock for long.
BATCH_COUNT_MAX = 256
# A node that restarts within this finds the writer still running, so a crash test or a rolling
# restart does not pay a process start.
IDLE_MS_MAX = 2_000
# One client per node process sharing the file.
CLIENT_COUNT_MAX = 256
# Answers waiting for a client that does not read: past this it is dropped (a stopped process).
CLIENT_OUT_BYTES_MAX = 64 * 1024 * 1024
RECV_BYTES_MAX = 1024 * 1024
# A writer started beside another one waits this long for the lock while the other one either
# serves (then this one leaves) or exits (then this one serves).
LOCK_WAIT_MS_MAX = 5_000
LOCK_POLL_MS = 10
# After a writer killed with -9, its socket name may outlive its lock for a moment.
BIND_WAIT_MS_MAX = 1_000


def socket_address(path: Path) -> bytes:
    """The abstract socket name of the writer of the SQLite file at `path` (resolved, so every
    process that names the file differently still finds the same writer)."""
    digest = hashlib.sha256(str(Path(path).resolve()).encode()).hexdigest()[:32]
    return SOCKET_NAME_PREFIX + digest.encode()


def spawn_command(path: Path, timeout_ms_call: int) -> list[str]:
    return [sys.executable, "-m", "storage_adapters.emulator_writer", str(path), str(timeout_ms_call)]


def encode_frame(message: Any) -> bytes:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    assert len(payload) <= FRAME_BYTES_MAX, f"frame of {len(payload)} bytes"
    return _LENGTH.pack(len(payload)) + payload


class FrameError(Exception):
    """The peer sent a frame no writer or store sends: the connection is dropped."""


class FrameReader:
    """Splits a byte stream into the messages of its frames."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Any]:
        self._buffer += data
        messages = []
        start = 0
        buffer = self._buffer
        while len(buffer) - start >= _LENGTH.size:
            (length,) = _LENGTH.unpack_from(buffer, start)
            if length > FRAME_BYTES_MAX:
                raise FrameError(f"frame of {length} bytes (at most {FRAME_BYTES_MAX})")
            end = start + _LENGTH.size + length
            if end > len(buffer):
                break
            messages.append(pickle.loads(buffer[start + _LENGTH.size:end]))
            start = end
        del buffer[:start]
        return messages


def peer_uid(sock: socket.socket) -> int:
    _pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return uid


# --- the writer process -------------------------------------------------------------------------


class _Client:
    """One connected store: its unparsed input and its unsent answers."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reader = FrameReader()
        self.out = bytearray()
        self.gone = False


class _Writer:
    def __init__(self, conn: sqlite3.Connection, listener: socket.socket) -> None:
        self.conn = conn
        self.listener = listener
        self.selector = selectors.DefaultSelector()
        self.selector.register(listener, selectors.EVENT_READ, None)
        self.clients: dict[socket.socket, _Client] = {}
        self.idle_since: float | None = time.monotonic()  # None while a client is connected

    def serve(self) -> None:
        while True:
            timeout_s = None
            if self.idle_since is not None:
                timeout_s = self.idle_since + IDLE_MS_MAX / 1000 - time.monotonic()
                if timeout_s <= 0:
                    return
            requests: list[tuple[_Client, Any]] = []
            for key, mask in self.selector.select(timeout_s):
                if key.data is None:
                    self._accept()
                    continue
                client: _Client = key.data
                if mask & selectors.EVENT_WRITE:
                    self._send(client, b"")
                if mask & selectors.EVENT_READ and not client.gone:
                    requests += [(client, message) for message in self._receive(client)]
            for start in range(0, len(requests), BATCH_COUNT_MAX):
                self._run(requests[start:start + BATCH_COUNT_MAX])

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except BlockingIOError:
                return
            # Only this user's processes may write the file (and read the pickles it answers).
            if peer_uid(sock) != os.getuid() or len(self.clients) >= CLIENT_COUNT_MAX:
                sock.close()
                continue
            sock.setblocking(False)
            client = _Client(sock)
            self.clients[sock] = client
            self.selector.register(sock, selectors.EVENT_READ, client)
            self.idle_since = None
            self._send(client, encode_frame((0, True, os.getpid())))  # hello: served from now on

    def _receive(self, client: _Client) -> list[Any]:
        try:
            data = client.sock.recv(RECV_BYTES_MAX)
        except BlockingIOError:
            return []
        except OSError:
            data = b""
        if not data:
            self._drop(client)
            return []
        try:
            return client.reader.feed(data)
        except (FrameError, pickle.UnpicklingError, EOFError, ValueError) as error:
            logger.error("dropping a client that sent a broken frame: %s", error)
            self._drop(client)
            return []

    def _run(self, requests: list[tuple[_Client, Any]]) -> None:
        calls = [self._bind(message) for _client, message in requests]
        # SQLite waits for a foreign writer's lock (another program on the file) no longer than
        # the batch's most patient caller would.
        now = time.monotonic()
        wait_ms = max(1, int(max(_deadline(message) - now for _client, message in requests) * 1000))
        self.conn.execute(f"PRAGMA busy_timeout = {wait_ms}")
        results = emulator_sql.run_batch(self.conn, calls, writes=True)
        answers: dict[_Client, list[bytes]] = {}
        for (client, message), (ok, value) in zip(requests, results, strict=True):
            answers.setdefault(client, []).append(encode_frame((message[0], ok, value)))
        for client, frames in answers.items():
            if not client.gone:
                self._send(client, b"".join(frames))

    @staticmethod
    def _bind(message: Any) -> Callable[[sqlite3.Connection], Any]:
        call_id, deadline_s, name, args = message
        assert isinstance(call_id, int) and call_id > 0, call_id
        write = emulator_sql.WRITES[name]

        def run(conn: sqlite3.Connection) -> Any:
            # Checked when its turn comes, inside the write lock: a caller that gave up by now is
            # refused, and nothing lands after it was told the write failed.
            if time.monotonic() > deadline_s:
                raise StorageUnavailable(f"{name} waited past its deadline for the emulator's writer")
            return write(conn, *args)

        return run

    def _send(self, client: _Client, data: bytes) -> None:
        if client.gone:
            return
        was_waiting = bool(client.out)
        client.out += data
        try:
            sent = client.sock.send(client.out)
        except BlockingIOError:
            sent = 0
        except OSError:
            self._drop(client)
            return
        del client.out[:sent]
        if len(client.out) > CLIENT_OUT_BYTES_MAX:
            logger.error("dropping a client that reads no answers (%d bytes waiting)", len(client.out))
            self._drop(client)
        elif bool(client.out) != was_waiting:
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if client.out else 0)
            self.selector.modify(client.sock, events, client)

    def _drop(self, client: _Client) -> None:
        if client.gone:
            return
        client.gone = True
        self.selector.unregister(client.sock)
        client.sock.close()
        del self.clients[client.sock]
        if not self.clients:
            self.idle_since = time.monotonic()


def _deadline(message: Any) -> float:
    return float(message[1])


def _take_lock(path: Path, address: bytes) -> int | None:
    """The writer lock's fd, or None when another writer serves the file."""
    fd = os.open(f"{path}.writer-lock", os.O_RDWR | os.O_CREAT, 0o600)
    deadline = time.monotonic() + LOCK_WAIT_MS_MAX / 1000
    while time.monotonic() < deadline:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            pass
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(address)
            os.close(fd)
            return None  # the holder serves
        except OSError:
            pass  # the holder is leaving: its lock frees soon
        finally:
            probe.close()
        time.sleep(LOCK_POLL_MS / 1000)
    os.close(fd)
    raise TimeoutError(f"{path}.writer-lock held for {LOCK_WAIT_MS_MAX} ms by a writer that does not serve")


def _listen(address: bytes) -> socket.socket:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    deadline = time.monotonic() + BIND_WAIT_MS_MAX / 1000
    while True:
        try:
            listener.bind(address)
            break
        except OSError:
            if time.monotonic() > deadline:
                listener.close()
                raise
            time.sleep(LOCK_POLL_MS / 1000)
    listener.listen(CLIENT_COUNT_MAX)
    listener.setblocking(False)
    return listener


def main(argv: list[str]) -> int:
    path, timeout_ms_call = Path(argv[0]), int(argv[1])
    # Detach: the store that started this waits only for this first process, so no zombie is
    # left in a node that outlives its writer.
    if os.fork() > 0:
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s writer %(process)d %(levelname)s %(message)s")
    address = socket_address(path)
    lock_fd = _take_lock(path, address)
    if lock_fd is None:
        return 0
    conn = emulator_sql.connect(path, timeout_ms_call)
    listener = _listen(address)
    logger.info("serving %s", path)
    try:
        _Writer(conn, listener).serve()
    finally:
        # The name goes before the lock, so a writer that takes the lock can bind it.
        listener.close()
        conn.close()
        os.close(lock_fd)
    logger.info("no client for %d ms: leaving", IDLE_MS_MAX)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
