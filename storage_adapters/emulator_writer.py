"""The emulator's single writer: one process per SQLite file runs the writes of every node process
that shares the file, so the writes of all of them go in one batch, one transaction, one fsync.

Why a process of its own: when each node process wrote the file itself, the processes took turns
at SQLite's write lock (about 3 ms of waiting per batch at 8 clients), and each process's writer
thread, holding that lock, waited for the GIL its event loop held at every SQLite call (a 0.3 ms
commit took 0.9 ms). This process has no event loop beside it, and no other writer to wait for.

How it is found: it listens on a Unix socket beside the file, `<file>.writer.sock` (a pathname,
not an abstract name: processes in different network namespaces that share the file's directory,
containers on one volume, find the same writer, the socket's file mode admits only its user, and
the name goes with the directory the file is in). It admits only processes of its own user
(SO_PEERCRED) and greets each with a hello: its code version, its pid and the device and inode
of the file it has open. A store uses a writer only if both match its own code and what the path
names now (`hello_problem`), so a writer left running on a deleted or replaced file, or from
other code, never takes a store's writes. A store that finds nobody there starts one
(`spawn_command`) as its own child, and reaps it when it exits, unless another process is
starting one: a start holds the `flock` on `<file>.writer-starting`, from before the process is
started until the writer listens (the writer holds it, inherited, and closes it then), so the
nodes of a cluster that start together start one writer, not one each (each start is a Python
start, some 0.2 s of CPU). Of writers started together all the same (a start that outlived the
lock, a file shared across machines' processes with no common lock), the one that takes the
exclusive `flock` on `<file>.writer-lock` serves, and the others leave as soon as they see it
serve. It leaves IDLE_MS_MAX after its last client did, and within
FILE_CHECK_MS once the file, the lock file or the socket at the path are no longer the ones it
has (checked also whenever a client connects). While it serves it also deletes the tombstones
(LogStore.delete with keep) whose expiry has come, in bounded rounds on a timer of its own
(TOMBSTONE_PURGE_INTERVAL_MS); the expiry is wall-clock time in the file, so one that came while
no writer ran is purged by the next.

Where it runs: started by whichever store found none, it is that node process's child, in a
session of its own (a signal to the node's process group does not reach it) but in the node's
cgroup: its CPU and memory count against that node's limits, and a stop that kills the node's
whole cgroup (systemd's default, a container's end) kills the writer too; the other nodes then
start another one, costing only the writes in flight. The node reaps it when it exits, so a node
that is PID 1 of a container needs no init for it. It logs to `<file>.writer.log`, which a
store starting a writer empties once it has outgrown WRITER_LOG_BYTES_MAX.

The wire: frames of a 4-byte big-endian length and a pickle (only the same user's processes can
connect, in both directions; both sides run the same code, `CODE_VERSION`). A request is (call
id, deadline, write name, arguments), the deadline in `time.monotonic()` seconds, a clock all
processes of the machine share (and of one time namespace: containers share it unless made
otherwise); the answer is (call id, ok, result or error). The arguments and results are the
writes' wire form, plain values in tuples (storage_adapters/emulator_sql.py: a log_once is
(log key, txn, state value, (participants, coordinator, redo), (partition, owner, epoch) or None)
and answers (state value, created)), so neither side pickles or rebuilds the contract's
dataclasses for a write; only an error answer carries those (Fenced, DecisionFlipRefused). The
writer refuses a write whose deadline has passed when its turn comes, and starts its batch's
COMMIT only before the deadline of every write in it (storage_adapters/emulator_sql.py
`run_batch`), so a write lands no later than its deadline plus one batch's COMMIT. Every
well-formed request gets an answer; a malformed one (no finite deadline, no write of its name,
arguments that are not a tuple of that write's length) gets a ValidationError, a well-shaped one
whose values are wrong fails its own call with a StorageError, and a client whose frames do not
even decode is dropped. Nothing a client sends stops the writer serving the others.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import math
import os
import pickle
import selectors
import socket
import sqlite3
import stat
import struct
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from storage_adapters import emulator_sql
from storage_adapters.contract import (
    DATA_BATCH_COUNT_MAX,
    DATA_KEY_BYTES_MAX,
    DATA_VALUE_BYTES_MAX,
    LOG_NAME_LENGTH_MAX,
    PARTICIPANT_COUNT_MAX,
    REDO_BYTES_MAX,
)
from storage_adapters.errors import StorageError, ValidationError

logger = logging.getLogger("cornus.emulator_writer")

SOCKET_SUFFIX = ".writer.sock"
LOCK_SUFFIX = ".writer-lock"
STARTING_SUFFIX = ".writer-starting"
LOG_SUFFIX = ".writer.log"
# What a Unix socket's address may hold (sun_path less its terminating NUL): the socket is named
# through /proc/self/fd (`socket_address`), so only the file's name counts against it.
SOCKET_ADDRESS_BYTES_MAX = 107
# Bumped whenever the frames, the writes' wire form or the hello change shape. A hello is a tuple
# of plain values, so a store of any version can read it and see that the writer is not its own.
# 3: the writes' arguments and results travel as plain values, not the contract's objects.
# 4: the hello carries the writer's time.monotonic(), which the store compares with its own.
# 5: delete and each request of delete_many carry a tombstone's keep, (decision value, keep_ms) or None.
WIRE_VERSION = 5
# How far the writer's time.monotonic() may be outside the span in which the store connected and
# heard its hello. Both read one clock, unless they run in different time namespaces (containers
# made so): then every deadline a store sends would be judged by a clock that is not its own, and
# a write could land long after its caller was told it failed (found by review: assumed, never
# checked). Scheduling delays are milliseconds; namespaces differ by their boot times.
CLOCK_DIFFERENCE_MS_MAX = 1_000
# The files whose code both sides must share: the writer runs emulator_sql's writes by the names
# the store sends, on the wire form emulator_sql defines, and answers errors that carry the
# contract's types.
_VERSIONED_FILES = ("contract.py", "errors.py", "emulator.py", "emulator_sql.py", "emulator_writer.py")
_LENGTH = struct.Struct(">I")
# Per entry of a pickled mapping or tuple (opcodes and lengths of its key and value), and per
# frame (the call id, deadline, name, fence, the tuples around them): generous upper bounds.
_PICKLE_ENTRY_OVERHEAD_BYTES = 64
_PICKLE_FRAME_OVERHEAD_BYTES = 64 * 1024
# A frame carries one call; the largest legal one is an apply_redo of DATA_BATCH_COUNT_MAX keys
# with values of DATA_VALUE_BYTES_MAX (about 64.5 MiB), then a log with a full redo and
# participant list. A larger frame is a broken peer.
FRAME_BYTES_MAX = _PICKLE_FRAME_OVERHEAD_BYTES + max(
    DATA_BATCH_COUNT_MAX * (DATA_KEY_BYTES_MAX + DATA_VALUE_BYTES_MAX + _PICKLE_ENTRY_OVERHEAD_BYTES),
    REDO_BYTES_MAX + PARTICIPANT_COUNT_MAX * (LOG_NAME_LENGTH_MAX + _PICKLE_ENTRY_OVERHEAD_BYTES),
)
# Writes in one SQLite transaction: large enough to amortise the fsync, small enough that one
# transaction never holds the write lock for long.
BATCH_COUNT_MAX = 256
# A node that restarts within this finds the writer still running, so a crash test or a rolling
# restart does not pay a process start.
IDLE_MS_MAX = 2_000
# How often a writer checks that the file, the lock file and the socket at their paths are still
# the ones it has: a writer on a deleted or replaced file leaves within this (new clients are
# checked when they connect), so the stores' next writer serves the file that is there now.
FILE_CHECK_MS = 200
# One client per node process sharing the file.
CLIENT_COUNT_MAX = 256
# The first field of what a full writer answers instead of its hello (full_hello).
_FULL = "full"
# Answers waiting for a client that does not read: past this it is dropped (a stopped process).
# Answers are small (a state, a flag, an error), so this is many thousands of them.
CLIENT_OUT_BYTES_MAX = 64 * 1024 * 1024
RECV_BYTES_MAX = 1024 * 1024
# A writer started beside another one waits this long for the lock while the other one either
# serves (then this one leaves) or exits (then this one serves).
LOCK_WAIT_MS_MAX = 5_000
LOCK_POLL_MS = 10
# Starting a writer: a Python start and its imports (about 0.2 s, seconds on a loaded machine),
# then opening the file, which waits out other processes setting up a fresh one. Separate from
# the calls' deadline: a store's short call deadline must not keep a writer from ever starting.
WRITER_START_MS_MAX = 10_000
# A request's deadline further ahead than this is from a broken peer: it is factory.py's
# TIMEOUT_MS_CALL_MAX, the longest deadline a store may have (SQLite's busy wait follows it).
DEADLINE_AHEAD_MS_MAX = 600_000
# The writer's log holds its starts, exits and the clients it dropped; a file used for months
# must not grow without bound, so a writer starts it afresh past this.
WRITER_LOG_BYTES_MAX = 1024 * 1024
# The purge of expired tombstones (emulator_sql.purge_expired), the emulator's part of "dropped by
# storage": a round every TOMBSTONE_PURGE_INTERVAL_MS, whether or not writes arrive, between the
# client batches of the serving loop, in a transaction of its own. A round deletes at most
# TOMBSTONE_PURGE_COUNT_MAX rows, so it holds the loop up about as long as one client batch does
# (512 took 1 to 4 ms on an ext4 disk, its fsync most of it); while a round finds that many
# expired, the next follows TOMBSTONE_PURGE_BACKLOG_MS later, the client batches served in
# between: some 20,000 a second (garbage collection leaves one per participant and transaction)
# for at most a fifth of the loop's time.
TOMBSTONE_PURGE_INTERVAL_MS = 1_000
TOMBSTONE_PURGE_BACKLOG_MS = 20
TOMBSTONE_PURGE_COUNT_MAX = 512
# SO_PEERCRED's struct ucred: pid_t pid, uid_t uid, gid_t gid.
_UCRED = struct.Struct("iII")


def _code_version() -> str:
    digest = hashlib.sha256()
    package = Path(__file__).resolve().parent
    for name in _VERSIONED_FILES:
        digest.update((package / name).read_bytes())
    return f"{WIRE_VERSION}.{digest.hexdigest()[:16]}"


CODE_VERSION = _code_version()


@contextlib.contextmanager
def socket_address(path: Path) -> Iterator[str]:
    """The address of the writer socket of the SQLite file at `path`, `<file>.writer.sock`, for
    one connect or bind: named through an fd of the file's directory (/proc/self/fd/N/...), since
    a socket address holds at most SOCKET_ADDRESS_BYTES_MAX bytes and the file's path may be
    longer. ValidationError if the file's name alone is too long for it."""
    directory = os.open(Path(path).parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        address = f"/proc/self/fd/{directory}/{Path(path).name}{SOCKET_SUFFIX}"
        if len(address.encode()) > SOCKET_ADDRESS_BYTES_MAX:
            raise ValidationError(f"the name of {path} is too long for its writer's socket ({address!r})")
        yield address
    finally:
        os.close(directory)


def spawn_command(path: Path, starting_fd: int | None = None) -> list[str]:
    """The writer's command line. `-P`: not the working directory's `storage_adapters` first on
    the module path, which `-m` would otherwise put there, but the one its starter names in
    PYTHONPATH; `-s`: nor the user's site-packages. `starting_fd`: the inherited descriptor of
    the start's lock (`<file>.writer-starting`), which the writer closes once it listens."""
    command = [sys.executable, "-P", "-s", "-m", "storage_adapters.emulator_writer", str(Path(path).absolute())]
    return command if starting_fd is None else [*command, str(starting_fd)]


def lock_start(path: Path) -> int | None:
    """The descriptor of the start lock of `path`'s writer, held (pass it to the writer, then close
    it), or None when another process is starting a writer for it (it listens soon)."""
    fd = os.open(f"{path}{STARTING_SUFFIX}", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)  # a filesystem without flock, say: the caller hears it, and no descriptor is kept
        raise
    return fd


def spawn_environment() -> dict[str, str]:
    """The writer's environment: this process's, with the directory this package was imported
    from first on PYTHONPATH, so the writer runs the very code its starter runs."""
    package_root = str(Path(__file__).resolve().parent.parent)
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])))


def encode_frame(message: Any) -> bytes:
    """`message` as a frame; ValidationError (nothing sent) if it would exceed FRAME_BYTES_MAX."""
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    if len(payload) > FRAME_BYTES_MAX:
        raise ValidationError(f"an emulator request of {len(payload)} bytes, the limit is {FRAME_BYTES_MAX}")
    return _LENGTH.pack(len(payload)) + payload


class FrameError(Exception):
    """The peer sent a frame no writer or store sends: the connection is dropped."""


class FrameReader:
    """Splits a byte stream into the messages of its frames."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Any]:
        """The messages completed by `data`. Raises FrameError for an oversize frame, and
        whatever unpickling raises for a broken one: either way the stream is lost."""
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


def peer_credentials(raw: bytes) -> tuple[int, int, int]:
    """(pid, uid, gid) from SO_PEERCRED's answer."""
    pid, uid, gid = _UCRED.unpack(raw)
    return pid, uid, gid


def peer_uid(sock: socket.socket) -> int:
    return peer_credentials(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))[1]


def file_identity(status: os.stat_result) -> tuple[int, int]:
    return status.st_dev, status.st_ino


def full_hello() -> tuple[str, int, int]:
    """What a writer serving CLIENT_COUNT_MAX stores answers the next one instead of its hello."""
    return (_FULL, os.getpid(), CLIENT_COUNT_MAX)


def hello_problem(hello: Any, path: Path, connected_s: tuple[float, float] | None = None) -> str | None:
    """Why a store must not use the writer that sent `hello` for the file at `path` (None: it
    may): it is full, runs other code, has another file than the one the path names now, or
    (given `connected_s`, the store's time.monotonic() when it began to connect and when the hello
    came) reads another clock."""
    if isinstance(hello, tuple) and len(hello) == 3 and hello[0] == _FULL:
        return f"the emulator writer (pid {hello[1]}) serves its limit of {hello[2]} stores (CLIENT_COUNT_MAX)"
    if not (isinstance(hello, tuple) and len(hello) == 5):
        return f"an emulator writer of another version sent hello {hello!r:.200}"
    version, pid, device, inode, clock_s = hello
    if version != CODE_VERSION:
        return f"the emulator writer (pid {pid}) runs code {version!r}, this store {CODE_VERSION!r}"
    if connected_s is not None:
        slack_s = CLOCK_DIFFERENCE_MS_MAX / 1000
        began_s, heard_s = connected_s
        if not began_s - slack_s <= clock_s <= heard_s + slack_s:
            return (f"the emulator writer (pid {pid}) reads time.monotonic() {clock_s - heard_s:+.1f} s from this "
                    "process's: another time namespace? Deadlines would be judged by another clock")
    try:
        here = file_identity(os.stat(path))
    except OSError as error:
        return f"{path} cannot be looked at: {error}"
    if here != (device, inode):
        return f"the emulator writer (pid {pid}) has another file open than the one at {path} now"
    return None


# --- the writer process -------------------------------------------------------------------------


class _Client:
    """One connected store: its unparsed input and its unsent answers."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reader = FrameReader()
        self.out = bytearray()
        self.gone = False


@dataclass(slots=True)
class _Request:
    client: _Client
    call_id: int
    deadline_s: float
    write: Callable[..., Any]  # emulator_sql.WRITES[name]
    args: tuple[Any, ...]  # its wire form, as many as the write takes

    def run(self, conn: sqlite3.Connection) -> Any:
        return self.write(conn, *self.args)


@dataclass(frozen=True, slots=True)
class _Files:
    """What this writer has open, by path, as (device, inode): it serves only while the paths
    still name them."""

    path: Path
    database: tuple[int, int]
    lock: tuple[int, int]
    socket: tuple[int, int]

    def unchanged(self) -> bool:
        try:
            return (
                file_identity(os.stat(self.path)) == self.database
                and file_identity(os.stat(f"{self.path}{LOCK_SUFFIX}")) == self.lock
                and file_identity(os.stat(f"{self.path}{SOCKET_SUFFIX}")) == self.socket
            )
        except OSError:
            return False

    def own_socket(self) -> bool:
        """Whether the socket file at the path is this writer's, as is the lock file whose lock it
        holds (so no other writer can have bound one there since)."""
        try:
            return (
                file_identity(os.stat(f"{self.path}{LOCK_SUFFIX}")) == self.lock
                and file_identity(os.stat(f"{self.path}{SOCKET_SUFFIX}")) == self.socket
            )
        except OSError:
            return False


class _Writer:
    def __init__(self, conn: sqlite3.Connection, listener: socket.socket, files: _Files) -> None:
        self.conn = conn
        self.listener = listener
        self.files = files
        self.selector = selectors.DefaultSelector()
        self.selector.register(listener, selectors.EVENT_READ, None)
        self.clients: dict[socket.socket, _Client] = {}
        self.idle_since: float | None = time.monotonic()  # None while a client is connected
        # When it last had no client that had sent a request, and whether one has since: a
        # connection that asks nothing (a node of other code reading the hello and leaving, which
        # it does every 50 ms while it waits for this writer to go) does not restart the idle
        # clock (found by audit, 2026-11-28: such polls kept an old writer for ever after an
        # upgrade, and the new nodes never started theirs). A writer of code from before this
        # still restarts it: nodes upgraded from such code need its writer gone first (every
        # node of the file stopped, or the writer's pid, which the refusal names, ended).
        self._idle_began = self.idle_since
        self._requested = False

    def serve(self) -> str:
        """Serve until there is no client for IDLE_MS_MAX or the files are no longer this
        writer's; why it stopped."""
        replaced = "its file, lock file or socket is no longer at its path"
        check_s = FILE_CHECK_MS / 1000
        next_check = time.monotonic() + check_s
        # Not at once: a fresh writer greets the stores waiting for it first.
        next_purge = time.monotonic() + TOMBSTONE_PURGE_INTERVAL_MS / 1000
        while True:
            now = time.monotonic()
            if now >= next_check:
                if not self.files.unchanged():
                    return replaced
                next_check = now + check_s
            if now >= next_purge:
                next_purge = now + self._purge() / 1000
                now = time.monotonic()
            # A round that outlasted the timers leaves a timeout <= 0: a select that only polls.
            timeout_s = min(next_check, next_purge) - now
            if self.idle_since is not None:
                idle_left_s = self.idle_since + IDLE_MS_MAX / 1000 - now
                if idle_left_s <= 0:
                    return f"no client for {IDLE_MS_MAX} ms"
                timeout_s = min(timeout_s, idle_left_s)
            requests: list[_Request] = []
            for key, mask in self.selector.select(timeout_s):
                if key.data is None:
                    if not self._accept():
                        return replaced
                    continue
                client: _Client = key.data
                if mask & selectors.EVENT_WRITE:
                    self._send(client, b"")
                if mask & selectors.EVENT_READ and not client.gone:
                    received = self._receive(client)
                    self._requested = self._requested or bool(received)
                    requests += received
            self._run_all(requests)

    def _run_all(self, requests: list[_Request]) -> None:
        """Run what one pass read, BATCH_COUNT_MAX to a transaction. A client dropped after it
        sent requests gets no answers, and its writes are not run: looked at before each batch,
        since sending one batch's answers can drop a client whose requests wait in the next
        (found by review)."""
        for start in range(0, len(requests), BATCH_COUNT_MAX):
            batch = [request for request in requests[start:start + BATCH_COUNT_MAX] if not request.client.gone]
            if batch:
                self._run(batch)

    def _purge(self) -> int:
        """One purge round of expired tombstones; milliseconds until the next."""
        # Never waits for another program's write lock (a batch before may have left a long
        # busy_timeout): the loop goes on serving, and the round is put off to the next interval.
        self.conn.execute("PRAGMA busy_timeout = 0")
        try:
            purged = emulator_sql.purge_expired(self.conn, TOMBSTONE_PURGE_COUNT_MAX)
        except sqlite3.Error as error:
            if not (isinstance(error, sqlite3.OperationalError) and emulator_sql.is_lock_contention(error)):
                logger.warning("tombstone purge put off: %s", error)
            return TOMBSTONE_PURGE_INTERVAL_MS
        if purged == TOMBSTONE_PURGE_COUNT_MAX:  # more may be expired: soon, not an interval later
            return TOMBSTONE_PURGE_BACKLOG_MS
        return TOMBSTONE_PURGE_INTERVAL_MS

    def _accept(self) -> bool:
        """Admit the connecting clients; False (admitting none) if the files are no longer this
        writer's, so a store never gets the hello of a writer on a replaced file."""
        unchanged = self.files.unchanged()
        while True:
            try:
                sock, _ = self.listener.accept()
            except BlockingIOError:
                return unchanged
            # Only this user's processes may write the file (and read the pickles it answers).
            if not unchanged or peer_uid(sock) != os.getuid():
                sock.close()
                continue
            if len(self.clients) >= CLIENT_COUNT_MAX:
                # Said, then closed: a close alone reads as a writer leaving, and the store would
                # start writers that find this one serving, one every SPAWN_INTERVAL_MS, for ever
                # (found by audit, 2026-11-28). The frame fits any socket buffer.
                with contextlib.suppress(OSError):
                    sock.setblocking(False)
                    sock.send(encode_frame((0, True, full_hello())))
                sock.close()
                continue
            sock.setblocking(False)
            client = _Client(sock)
            self.clients[sock] = client
            self.selector.register(sock, selectors.EVENT_READ, client)
            self.idle_since = None
            hello = (CODE_VERSION, os.getpid(), *self.files.database, time.monotonic())
            self._send(client, encode_frame((0, True, hello)))  # served from now on

    def _receive(self, client: _Client) -> list[_Request]:
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
            messages = client.reader.feed(data)
        except Exception as error:  # an oversize frame, or any unpickling error: the stream is lost
            logger.error("dropping a client that sent a broken frame: %r", error)
            self._drop(client)
            return []
        requests = []
        for message in messages:
            request = self._request(client, message)
            if client.gone:
                break
            if request is not None:
                requests.append(request)
        return requests

    def _request(self, client: _Client, message: Any) -> _Request | None:
        """The request `message` makes, or None: a malformed one is answered with a
        ValidationError, or its client dropped when it has no call id to answer."""
        if not (isinstance(message, tuple) and len(message) == 4 and type(message[0]) is int and message[0] > 0):
            logger.error("dropping a client that sent a request without a call id: %.200r", message)
            self._drop(client)
            return None
        call_id, deadline_s, name, args = message
        if type(deadline_s) is not float or not math.isfinite(deadline_s):
            problem = f"deadline {deadline_s!r:.50} is not a finite float"
        elif deadline_s > time.monotonic() + DEADLINE_AHEAD_MS_MAX / 1000:
            problem = f"deadline more than {DEADLINE_AHEAD_MS_MAX} ms ahead"
        elif not isinstance(name, str) or name not in emulator_sql.WRITES:
            problem = f"no write named {name!r:.80}"
        elif type(args) is not tuple:
            problem = f"arguments must be a tuple, got {type(args).__name__}"
        elif len(args) != emulator_sql.WRITE_ARG_COUNTS[name]:
            problem = f"{name} takes {emulator_sql.WRITE_ARG_COUNTS[name]} arguments, got {len(args)}"
        else:
            return _Request(client, call_id, deadline_s, emulator_sql.WRITES[name], args)
        logger.error("refusing a malformed request: %s", problem)
        self._send(client, self._answer(call_id, False, ValidationError(f"emulator writer: {problem}")))
        return None

    def _run(self, requests: list[_Request]) -> None:
        deadlines = [request.deadline_s for request in requests]
        # SQLite waits for a foreign writer's lock (another program on the file) no longer than
        # the batch's most patient caller would.
        wait_ms = max(1, int((max(deadlines) - time.monotonic()) * 1000))
        self.conn.execute(f"PRAGMA busy_timeout = {wait_ms}")
        calls = [request.run for request in requests]
        results = emulator_sql.run_batch(self.conn, calls, writes=True, deadlines=deadlines)
        answers: dict[_Client, list[bytes]] = {}
        for request, (ok, value) in zip(requests, results, strict=True):
            answers.setdefault(request.client, []).append(self._answer(request.call_id, ok, value))
        for client, frames in answers.items():
            if not client.gone:
                self._send(client, b"".join(frames))

    @staticmethod
    def _answer(call_id: int, ok: bool, value: Any) -> bytes:
        try:
            return encode_frame((call_id, ok, value))
        except Exception as error:  # an answer that does not pickle is still an answer
            logger.exception("call %d: its answer does not pickle", call_id)
            refused = StorageError(f"emulator writer: the answer does not pickle: {error!r}")
            return encode_frame((call_id, False, refused))

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
            if self._requested:
                self._idle_began, self._requested = time.monotonic(), False
            self.idle_since = self._idle_began


def _take_lock(path: Path) -> int | None:
    """The writer lock's fd, or None when another writer serves the file."""
    fd = os.open(f"{path}{LOCK_SUFFIX}", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    deadline = time.monotonic() + LOCK_WAIT_MS_MAX / 1000
    while time.monotonic() < deadline:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            pass
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with socket_address(path) as address:
                probe.connect(address)
            os.close(fd)
            return None  # the holder serves
        except OSError:
            pass  # the holder is starting or leaving: its lock frees, or it serves, soon
        finally:
            probe.close()
        time.sleep(LOCK_POLL_MS / 1000)
    os.close(fd)
    raise TimeoutError(f"{path}{LOCK_SUFFIX} held for {LOCK_WAIT_MS_MAX} ms by a writer that does not serve")


def _listen(path: Path) -> tuple[socket.socket, tuple[int, int]]:
    """The listening socket at `<file>.writer.sock` and that socket file's identity. Called
    holding the writer lock: a socket file there is a former writer's, which is gone."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{path}{SOCKET_SUFFIX}")
        # Only this user may connect (a socket file's write permission): the mode is set at bind,
        # so no other user can connect in between.
        umask = os.umask(0o177)
        try:
            with socket_address(path) as address:
                listener.bind(address)
        finally:
            os.umask(umask)
        identity = file_identity(os.stat(f"{path}{SOCKET_SUFFIX}"))
        assert stat.S_ISSOCK(os.stat(f"{path}{SOCKET_SUFFIX}").st_mode)
        listener.listen(CLIENT_COUNT_MAX)
        listener.setblocking(False)
    except BaseException:
        listener.close()
        raise
    return listener, identity


def main(argv: list[str]) -> int:
    path = Path(argv[0])
    # The start's lock (lock_start), inherited: held until this writer listens, or leaves.
    starting_fd = int(argv[1]) if len(argv) > 1 else None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s writer %(process)d %(levelname)s %(message)s")
    lock_fd = _take_lock(path)
    if lock_fd is None:
        return 0
    try:
        # The file's identity is taken before SQLite opens it and checked after, so the
        # connection is on the file the hello names. The descriptor stays open until SQLite's
        # connection is closed: closing any descriptor of a file drops every POSIX lock this
        # process holds on it, SQLite's among them, and another process's last close then took
        # itself for the file's last user and deleted the write-ahead log under this writer,
        # whose commits from then on no other process could read (found on a cluster restarted
        # at once: its nodes read their own ownership writes as never made).
        database_fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            conn = emulator_sql.connect(path, WRITER_START_MS_MAX)
        except BaseException:
            os.close(database_fd)
            raise
        listener, socket_identity = _listen(path)
        if starting_fd is not None:
            os.close(starting_fd)  # a store that finds nobody listening from now on starts one
        files = _Files(path, file_identity(os.fstat(database_fd)), file_identity(os.fstat(lock_fd)), socket_identity)
        try:
            if not files.unchanged():
                logger.info("%s was replaced as this writer started: leaving", path)
                return 0
            logger.info("serving %s (code %s)", path, CODE_VERSION)
            why = _Writer(conn, listener, files).serve()
            logger.info("leaving: %s", why)
        finally:
            # The socket file goes while this writer still holds the lock, and only if it is
            # still this writer's: a writer that holds the lock at the path may have bound its own.
            with contextlib.suppress(OSError):
                if files.own_socket():
                    os.unlink(f"{path}{SOCKET_SUFFIX}")
            listener.close()
            conn.close()
            os.close(database_fd)  # only now: see where it was opened
    finally:
        os.close(lock_fd)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
