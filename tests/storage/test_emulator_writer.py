"""The emulator's writer process (storage_adapters/emulator_writer.py) over its life: every store on
a file shares one; a write never lands after its caller was told it failed, also when finding the
writer took most of the deadline; a writer killed with -9 costs only the calls in flight, and the
next call starts a new one; a writer leaves after its last client, and at once when a writer
already serves; a writer on a deleted file takes no new store's writes; a short call deadline
still starts a writer, and callers that give up start one writer, not one each, as do stores
that open a fresh file together; an exited writer
is reaped by the node that started it, even one that is PID 1 (a subreaper here)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from storage_adapters import emulator, emulator_writer
from storage_adapters.contract import LogId, LogOnceResult, RecordBody, TxnState
from storage_adapters.emulator import EmulatorStore
from storage_adapters.errors import StorageUnavailable
from tests.storage.writer_helpers import EXIT_WAIT_S, alive, wait_gone, writers_of

TIMEOUT_MS_CALL = 1_000
# What a deadline may overrun by on a loaded 2-core machine; a hang would blow far past it.
DEADLINE_SLACK_S = 3.0
LOG = LogId.partition("p0")
# Stores that open one fresh file at once, as a cluster's nodes do.
TOGETHER_STORE_COUNT = 3
BODY = RecordBody(("p0",), "n0", b"")
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[EmulatorStore]:
    opened = await EmulatorStore.open(tmp_path / "cornus.db", timeout_ms_call=TIMEOUT_MS_CALL)
    yield opened
    await opened.close()


async def test_stores_on_one_file_share_one_writer(store: EmulatorStore, tmp_path: Path) -> None:
    other = await EmulatorStore.open(tmp_path / "cornus.db", timeout_ms_call=TIMEOUT_MS_CALL)
    try:
        assert store.writer_pid is not None and store.writer_pid == other.writer_pid
        assert (await other.log_once(LOG, "t1", TxnState.VOTE_YES, BODY)).created
        # Answered means committed: the other store's reader sees it at once.
        assert (await store.read(LOG, "t1")) is not None
    finally:
        await other.close()


async def test_writes_stay_visible_to_readers_after_another_process_closed_its_store(tmp_path: Path) -> None:
    """The writer kept a descriptor of the database of its own beside SQLite's, to check the
    file's identity, and closed it after SQLite had opened the file: closing any descriptor of a
    file drops every POSIX lock the process holds on it, SQLite's shared lock among them. The
    next process to close its last connection then took itself for the file's last user,
    checkpointed and deleted the write-ahead log under the serving writer, whose commits from
    then on went to the deleted log: every other process read the file as it was (found on a
    cluster stopped and started again at once: each node read its partitions' ownership records
    as released, took them, and lost them to its own stale reads, never to be ready)."""
    path = tmp_path / "cornus.db"
    first = textwrap.dedent(f"""
        import asyncio
        from storage_adapters.emulator import EmulatorStore
        from storage_adapters.contract import LogId, RecordBody, TxnState
        async def main():
            store = await EmulatorStore.open({str(path)!r}, timeout_ms_call={TIMEOUT_MS_CALL})
            await store.log_once(LogId.partition("p0"), "t0", TxnState.VOTE_YES, RecordBody(("p0",), "n0", b""))
            await store.close()
        asyncio.run(main())
    """)
    process = await asyncio.create_subprocess_exec(sys.executable, "-c", first, cwd=REPO_ROOT)
    assert await asyncio.wait_for(process.wait(), 60) == 0
    # Within the writer's idle time (it serves on with no client for IDLE_MS_MAX): this store's
    # writes go to the writer the other process started.
    store = await EmulatorStore.open(path, timeout_ms_call=TIMEOUT_MS_CALL)
    try:
        assert (await store.read(LOG, "t0")) is not None
        assert (await store.log_once(LOG, "t1", TxnState.VOTE_YES, BODY)).created
        assert (await store.read(LOG, "t1")) is not None, "the store's own answered write is not read back"
        with contextlib.closing(sqlite3.connect(path)) as conn:
            assert conn.execute("SELECT count(*) FROM txn_log").fetchone() == (2,)
    finally:
        await store.close()


async def test_stores_opening_a_fresh_file_together_start_one_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A cluster's nodes start together on a new file: each found nobody listening and started a
    writer of its own (a Python start, some 0.2 s of CPU each), and all but one left at once."""
    started: list[object] = []
    spawn_command = emulator_writer.spawn_command

    def counted(*args: object) -> list[str]:
        started.append(args)
        return spawn_command(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(emulator_writer, "spawn_command", counted)
    path = tmp_path / "cornus.db"
    stores = await asyncio.gather(*(EmulatorStore.open(path, timeout_ms_call=TIMEOUT_MS_CALL)
                                    for _ in range(TOGETHER_STORE_COUNT)))
    try:
        assert len({store.writer_pid for store in stores}) == 1
        assert len(started) == 1, f"{len(started)} writers started"
    finally:
        for store in stores:
            await store.close()


def test_a_start_lock_that_cannot_be_taken_keeps_no_descriptor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a filesystem without flock (ENOLCK), each try to start a writer, every SPAWN_INTERVAL_MS,
    kept the lock file's descriptor open (found by review)."""
    def no_locks(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, "no locks available")

    monkeypatch.setattr(emulator_writer.fcntl, "flock", no_locks)
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(3):
        with pytest.raises(OSError):
            emulator_writer.lock_start(tmp_path / "cornus.db")
    assert len(os.listdir("/proc/self/fd")) == before


async def test_a_write_past_its_deadline_while_the_file_is_locked_never_lands(
    store: EmulatorStore, tmp_path: Path,
) -> None:
    # Another program holds SQLite's write lock: the writer waits for it, the caller gives up.
    holder = sqlite3.connect(tmp_path / "cornus.db", isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        started = time.monotonic()
        with pytest.raises(StorageUnavailable):
            await store.log_once(LOG, "t1", TxnState.VOTE_YES, BODY)
        assert time.monotonic() - started < TIMEOUT_MS_CALL / 1000 + DEADLINE_SLACK_S
        # Reads take no write lock: they go on.
        assert await store.read(LOG, "t1") is None
        holder.execute("ROLLBACK")
        # The refused write did not land once the lock was free: this one creates the record.
        assert (await store.log_once(LOG, "t1", TxnState.ABORT, BODY)).created
        assert (await store.read(LOG, "t1")).state is TxnState.ABORT  # type: ignore[union-attr]
    finally:
        holder.close()


# Finding the writer again takes this much of the caller's deadline (the test holds the writer
# lock, as a writer that is leaving would); then the file stays locked past the deadline, and is
# freed this long after it: a write the writer still held, with a deadline counted from after the
# reconnect, would land then.
SLOW_TIMEOUT_MS_CALL = 3_000
RECONNECT_S = 1.0
FREED_AFTER_DEADLINE_S = 0.5
# Long enough for a write released with the lock to land, were it going to.
LANDING_WAIT_S = 0.5


async def test_a_write_whose_caller_gave_up_during_a_slow_reconnect_never_lands_late(tmp_path: Path) -> None:
    path = tmp_path / "cornus.db"
    store = await EmulatorStore.open(path, timeout_ms_call=SLOW_TIMEOUT_MS_CALL)
    lock = os.open(f"{path}{emulator_writer.LOCK_SUFFIX}", os.O_RDWR)
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        first = store.writer_pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        await wait_gone(first)
        fcntl.flock(lock, fcntl.LOCK_EX)
        # A writer that waits for the lock, started now so that it has imported its code by the
        # time the lock frees (the store starts one too; one of them serves, the other leaves).
        waiting = await asyncio.create_subprocess_exec(
            *emulator_writer.spawn_command(path), env=emulator_writer.spawn_environment(), cwd="/",
        )
        holder.execute("BEGIN IMMEDIATE")
        started = time.monotonic()
        call = asyncio.ensure_future(store.log_once(LOG, "t1", TxnState.VOTE_YES, BODY))
        await asyncio.sleep(RECONNECT_S)
        fcntl.flock(lock, fcntl.LOCK_UN)  # a writer may serve now
        with pytest.raises(StorageUnavailable):
            await call
        told_s = time.monotonic() - started
        assert told_s < SLOW_TIMEOUT_MS_CALL / 1000 + DEADLINE_SLACK_S
        assert store.writer_pid not in (None, first), "the call found the new writer, and sent its write"
        await asyncio.sleep(max(0.0, SLOW_TIMEOUT_MS_CALL / 1000 + FREED_AFTER_DEADLINE_S - told_s))
        holder.execute("ROLLBACK")
        await asyncio.sleep(LANDING_WAIT_S)
        # Nothing landed after the caller's deadline: the record is not there.
        assert await store.read(LOG, "t1") is None
    finally:
        holder.close()
        os.close(lock)
        await store.close()
    await asyncio.wait_for(waiting.wait(), EXIT_WAIT_S)


# Calls answered before the kill, so it lands among calls in a steady stream.
ANSWERED_BEFORE_KILL = 50
CALL_COUNT_MAX = 5_000


async def test_a_killed_writer_costs_only_the_calls_in_flight_and_the_next_call_starts_another(
    store: EmulatorStore,
) -> None:
    first = store.writer_pid
    assert first is not None
    outcomes: dict[int, LogOnceResult | StorageUnavailable] = {}

    async def one(index: int) -> None:
        try:
            outcomes[index] = await store.log_once(LOG, f"t{index}", TxnState.VOTE_YES, BODY)
        except StorageUnavailable as error:
            outcomes[index] = error

    calls = []
    while len(outcomes) < ANSWERED_BEFORE_KILL:
        assert len(calls) < CALL_COUNT_MAX, "the writer answers nothing"
        calls.append(asyncio.ensure_future(one(len(calls))))
        await asyncio.sleep(0)  # one call per loop iteration: a stream, not one batch
    in_flight = [index for index in range(len(calls)) if index not in outcomes]
    assert in_flight, "the kill must find calls in flight"
    os.kill(first, signal.SIGKILL)
    await asyncio.gather(*calls)
    # Answered before the kill: committed, or (a loaded CI machine starved the writer past the 1 s
    # deadline once, 2026-11-28) out of time, which the kill had no part in.
    before = [outcomes[index] for index in range(len(calls)) if index not in in_flight]
    assert all(isinstance(outcome, LogOnceResult) or _out_of_time(outcome) for outcome in before), before
    assert any(isinstance(outcomes[index], StorageUnavailable) for index in in_flight), "the kill cost no call"
    await wait_gone(first)
    # Every answered call's record is there, once; a call in flight landed once or not at all, and
    # a repeat finds which.
    for index in range(len(calls)):
        again = await store.log_once(LOG, f"t{index}", TxnState.ABORT, BODY)
        if isinstance(outcomes[index], StorageUnavailable):
            assert (again.state, again.created) in ((TxnState.VOTE_YES, False), (TxnState.ABORT, True))
        else:
            assert (again.state, again.created) == (TxnState.VOTE_YES, False)
    assert store.writer_pid not in (None, first)


def _out_of_time(outcome: object) -> bool:
    """Whether a call failed by its deadline: the store's own, or its turn at the writer's."""
    return isinstance(outcome, StorageUnavailable) and any(
        words in str(outcome) for words in ("did not answer within", "deadline"))


async def test_the_writer_leaves_after_its_last_client(tmp_path: Path) -> None:
    store = await EmulatorStore.open(tmp_path / "cornus.db", timeout_ms_call=TIMEOUT_MS_CALL)
    pid = store.writer_pid
    assert pid is not None
    await store.close()
    await wait_gone(pid)


async def test_a_writer_started_beside_a_serving_one_leaves_at_once(store: EmulatorStore) -> None:
    serving = store.writer_pid
    assert serving is not None
    started = time.monotonic()
    second = await asyncio.create_subprocess_exec(
        *emulator_writer.spawn_command(store.path), env=emulator_writer.spawn_environment(), cwd="/",
    )
    # It sees the serving one at its first look, so it is gone long before it would give up
    # waiting for the lock (a Python start is the most of it).
    assert await asyncio.wait_for(second.wait(), emulator_writer.LOCK_WAIT_MS_MAX / 1000) == 0
    assert time.monotonic() - started < emulator_writer.LOCK_WAIT_MS_MAX / 1000 / 2
    assert writers_of(store.path) == [serving]
    assert (await store.log_once(LOG, "t1", TxnState.VOTE_YES, BODY)).created


async def test_a_writer_on_a_deleted_file_takes_no_new_stores_writes(tmp_path: Path) -> None:
    path = tmp_path / "cornus.db"
    before = await EmulatorStore.open(path, timeout_ms_call=TIMEOUT_MS_CALL)
    old = before.writer_pid
    assert old is not None
    try:
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{path}{suffix}")
        after = await EmulatorStore.open(path, timeout_ms_call=TIMEOUT_MS_CALL)
        try:
            assert after.writer_pid not in (None, old)
            assert (await after.log_once(LOG, "t1", TxnState.VOTE_YES, BODY)).created
            assert (await after.read(LOG, "t1")) is not None, "the write landed in the file that is there"
            await wait_gone(old)  # the old writer left: its file is gone
        finally:
            await after.close()
    finally:
        await before.close()


async def test_a_store_whose_file_was_replaced_under_it_fails_every_call(tmp_path: Path) -> None:
    """Found by audit (2026-11-27): a store open on a file that was replaced (deleted, restored
    from a backup) went on with its reads on the old file, which its reader thread keeps open,
    and its writes, once its writer left, on the new one: a write it reported landed read back as
    absent, committed data read stale. A store serves the file it opened or none: every call is
    unavailable from then on (the node's readiness fails, and a restart opens the file there)."""
    path = tmp_path / "cornus.db"
    before = await EmulatorStore.open(path, timeout_ms_call=TIMEOUT_MS_CALL)
    try:
        assert (await before.log_once(LOG, "t0", TxnState.VOTE_YES, BODY)).created
        old = before.writer_pid
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{path}{suffix}")
        after = await EmulatorStore.open(path, timeout_ms_call=TIMEOUT_MS_CALL)
        try:
            assert old is not None
            await wait_gone(old)  # the old writer left: its file is gone
            with pytest.raises(StorageUnavailable, match="replaced"):
                await before.log_once(LOG, "t1", TxnState.VOTE_YES, BODY)
            with pytest.raises(StorageUnavailable, match="replaced"):
                await before.read(LOG, "t0")
            assert (await after.read(LOG, "t1")) is None, "the store wrote into the file it does not read"
        finally:
            await after.close()
    finally:
        await before.close()


async def test_a_short_call_deadline_still_starts_a_writer(tmp_path: Path) -> None:
    # Shorter than a Python start: the writer's start has a budget of its own.
    store = await EmulatorStore.open(tmp_path / "cornus.db", timeout_ms_call=20)
    try:
        assert store.writer_pid is not None
    finally:
        await store.close()


SLOW_START_S = 0.3
GIVING_UP_S = 3 * emulator.SPAWN_INTERVAL_MS / 1000
GIVING_UP_CALL_COUNT_MAX = 1_000


async def test_callers_that_give_up_while_no_writer_is_up_start_one_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = tmp_path / "cornus.db"
    store = await EmulatorStore.open(path, timeout_ms_call=100)
    starts = []
    start_writer = emulator._start_writer

    def counted(*args: object) -> object:
        starts.append(time.monotonic())
        # A loaded machine: the start outlasts the deadline of the call that asked for it, which
        # must not make a later call start another beside it.
        time.sleep(SLOW_START_S)
        return start_writer(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(emulator, "_start_writer", counted)
    lock = os.open(f"{path}{emulator_writer.LOCK_SUFFIX}", os.O_RDWR)
    try:
        first = store.writer_pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        await wait_gone(first)
        fcntl.flock(lock, fcntl.LOCK_EX)  # the writer started waits: storage stays down
        # Calls that give up, for longer than SPAWN_INTERVAL_MS: only a start nobody remembered
        # would be repeated.
        giving_up_until = time.monotonic() + GIVING_UP_S
        for index in range(GIVING_UP_CALL_COUNT_MAX):
            if time.monotonic() > giving_up_until:
                break
            with pytest.raises(StorageUnavailable):
                await store.log_once(LOG, f"t{index}", TxnState.VOTE_YES, BODY)
        assert len(starts) == 1, f"{len(starts)} writers started"
        fcntl.flock(lock, fcntl.LOCK_UN)
        async with asyncio.timeout(EXIT_WAIT_S):
            while True:
                with contextlib.suppress(StorageUnavailable):
                    await store.log_once(LOG, "t-up", TxnState.VOTE_YES, BODY)
                    break
        assert len(starts) == 1, "the writer started while storage was down is the one that serves"
    finally:
        os.close(lock)
        await store.close()


# Runs as PID 1 of a container would: a subreaper, to which a detached writer would be orphaned,
# and which then would have to reap it. Exits 0 once the writer it started is gone and reaped.
_SUBREAPER_NODE = textwrap.dedent("""
    import asyncio, ctypes, sys, time
    from storage_adapters.emulator import EmulatorStore
    PR_SET_CHILD_SUBREAPER = 36
    assert ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0

    async def main() -> int:
        store = await EmulatorStore.open(sys.argv[1])
        pid = store.writer_pid
        await store.close()
        return pid

    pid = asyncio.run(main())
    deadline = time.monotonic() + float(sys.argv[2])
    state = "?"
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                state = stat.read().rsplit(") ", 1)[1][0]
        except (FileNotFoundError, ProcessLookupError):  # gone (ESRCH: reaped while read)
            sys.exit(0)
        time.sleep(0.02)
    print(f"writer {pid} is still there, state {state}")
    sys.exit(1)
""")


def test_an_exited_writer_is_reaped_by_the_node_that_started_it(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _SUBREAPER_NODE, str(tmp_path / "cornus.db"), str(EXIT_WAIT_S)],
        cwd=tmp_path, env=emulator_writer.spawn_environment(), capture_output=True, text=True,
        timeout=EXIT_WAIT_S + 30, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


async def test_the_writer_runs_its_starters_code_not_the_working_directorys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A `storage_adapters` in the node's working directory, which `python -m` would run first.
    impostor = tmp_path / "cwd" / "storage_adapters"
    impostor.mkdir(parents=True)
    (impostor / "__init__.py").write_text("")
    ran = tmp_path / "impostor-ran"
    (impostor / "emulator_writer.py").write_text(f"open({str(ran)!r}, 'w').close()\n")
    monkeypatch.chdir(impostor.parent)
    store = await EmulatorStore.open(tmp_path / "cornus.db", timeout_ms_call=TIMEOUT_MS_CALL)
    try:
        assert (await store.log_once(LOG, "t1", TxnState.VOTE_YES, BODY)).created
    finally:
        await store.close()
    assert not ran.exists()


def test_a_writer_log_past_its_bound_is_started_afresh(tmp_path: Path) -> None:
    path = tmp_path / "cornus.db"
    log = Path(f"{path}{emulator_writer.LOG_SUFFIX}")
    log.write_bytes(b"x" * (emulator_writer.WRITER_LOG_BYTES_MAX + 1))

    async def open_and_close() -> None:
        store = await EmulatorStore.open(path, timeout_ms_call=TIMEOUT_MS_CALL)
        await store.close()

    asyncio.run(open_and_close())
    assert log.stat().st_size < emulator_writer.WRITER_LOG_BYTES_MAX


async def test_connections_that_ask_nothing_do_not_keep_an_idle_writer(tmp_path: Path) -> None:
    """Found by audit (2026-11-28): every accepted connection restarted the writer's idle clock.
    Nodes upgraded to other code refuse a writer running the old code and poll it (each connection
    reads its hello and leaves), about every 50 ms: the old writer never saw 2 s without a client,
    never left, and the new nodes never started one of their own. A connection that sends no
    request now leaves the idle clock where it was."""
    store = await EmulatorStore.open(tmp_path / "cornus.db", timeout_ms_call=TIMEOUT_MS_CALL)
    pid = store.writer_pid
    assert pid is not None
    await store.close()
    socket_path = f"{tmp_path / 'cornus.db'}{emulator_writer.SOCKET_SUFFIX}"
    deadline_s = time.monotonic() + emulator_writer.IDLE_MS_MAX / 1000 + EXIT_WAIT_S
    while time.monotonic() < deadline_s:
        with contextlib.suppress(OSError):  # gone already: refused, or no socket
            _, writer = await asyncio.open_unix_connection(socket_path)
            writer.close()
        if not alive(pid):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the writer {pid} still runs, kept by connections that asked nothing")


async def test_a_store_past_the_writer_s_client_limit_is_told_so_and_starts_no_writer(
        store: EmulatorStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by audit (2026-11-28, second): a writer serving CLIENT_COUNT_MAX stores closed the
    next one's connection without a word, which that store took for a writer leaving: it started
    a writer every SPAWN_INTERVAL_MS (a Python start each), which found the lock held and left, for
    as long as the store lived, and every call of it failed with "no writer". The writer says it
    is full; the store starts none, and its error names the limit."""
    path = tmp_path / "cornus.db"
    others: list[socket.socket] = []
    try:
        with emulator_writer.socket_address(path) as address:
            for _ in range(emulator_writer.CLIENT_COUNT_MAX - 1):  # the fixture's store is one
                other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                other.connect(address)
                others.append(other)
        starts: list[Path] = []
        spawn = EmulatorStore._spawn_writer

        async def counted(self: EmulatorStore) -> None:
            starts.append(self.path)
            await spawn(self)

        monkeypatch.setattr(EmulatorStore, "_spawn_writer", counted)
        monkeypatch.setattr(emulator_writer, "WRITER_START_MS_MAX", 2_000)
        with pytest.raises(StorageUnavailable, match="limit"):
            await EmulatorStore.open(path, timeout_ms_call=TIMEOUT_MS_CALL)
        assert starts == []
        assert writers_of(path) == [store.writer_pid]
    finally:
        for other in others:
            other.close()
