"""The emulator's writer process (storage_adapters/emulator_writer.py): every store on a file
shares one; a write whose deadline passes while the writer waits is refused and never lands late;
a writer killed with -9 costs only the calls in flight, and the next call starts a new one; a
writer leaves after its last client; a second writer started beside a serving one leaves."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from storage_adapters import emulator_writer
from storage_adapters.contract import LogId, RecordBody, TxnState
from storage_adapters.emulator import EmulatorStore
from storage_adapters.errors import StorageUnavailable

TIMEOUT_MS_CALL = 1_000
# What a deadline may overrun by on a loaded 2-core machine; a hang would blow far past it.
DEADLINE_SLACK_S = 3.0
# How long a process may take to go away after it was told to (or chose to).
EXIT_WAIT_S = emulator_writer.IDLE_MS_MAX / 1000 + 10.0
POLL_S = 0.02
LOG = LogId.partition("p0")
BODY = RecordBody(("p0",), "n0", b"")


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[EmulatorStore]:
    opened = await EmulatorStore.open(tmp_path / "cornus.db", timeout_ms_call=TIMEOUT_MS_CALL)
    yield opened
    await opened.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for our purposes; the writer's parent is init, which reaps it.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(") ", 1)[1][0] != "Z"


async def _wait_gone(pid: int) -> None:
    async with asyncio.timeout(EXIT_WAIT_S):
        while _alive(pid):  # noqa: ASYNC110 - another process's exit has no event here
            await asyncio.sleep(POLL_S)


async def test_stores_on_one_file_share_one_writer(store: EmulatorStore, tmp_path: Path) -> None:
    other = await EmulatorStore.open(tmp_path / "cornus.db", timeout_ms_call=TIMEOUT_MS_CALL)
    try:
        assert store.writer_pid is not None and store.writer_pid == other.writer_pid
        assert (await other.log_once(LOG, "t1", TxnState.VOTE_YES, BODY)).created
        # Answered means committed: the other store's reader sees it at once.
        assert (await store.read(LOG, "t1")) is not None
    finally:
        await other.close()


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


async def test_a_killed_writer_costs_the_calls_in_flight_and_the_next_call_starts_another(
    store: EmulatorStore,
) -> None:
    first = store.writer_pid
    assert first is not None
    racers = [asyncio.ensure_future(store.log_once(LOG, f"t{i}", TxnState.VOTE_YES, BODY)) for i in range(200)]
    await asyncio.sleep(0)  # the calls are on their way
    os.kill(first, signal.SIGKILL)
    outcomes = await asyncio.gather(*racers, return_exceptions=True)
    assert all(isinstance(o, StorageUnavailable) or o.created for o in outcomes), outcomes  # type: ignore[union-attr]
    await _wait_gone(first)
    # Whatever landed before the kill is there exactly once; a repeat of every call finds it.
    again = [await store.log_once(LOG, f"t{i}", TxnState.ABORT, BODY) for i in range(200)]
    for before, after in zip(outcomes, again, strict=True):
        if isinstance(before, StorageUnavailable):
            assert after.state in (TxnState.VOTE_YES, TxnState.ABORT)  # it may or may not have landed
        else:
            assert not after.created and after.state is TxnState.VOTE_YES
    assert store.writer_pid not in (None, first)


async def test_the_writer_leaves_after_its_last_client(tmp_path: Path) -> None:
    store = await EmulatorStore.open(tmp_path / "cornus.db", timeout_ms_call=TIMEOUT_MS_CALL)
    pid = store.writer_pid
    assert pid is not None
    await store.close()
    await _wait_gone(pid)


async def test_a_writer_started_beside_a_serving_one_leaves(store: EmulatorStore) -> None:
    serving = store.writer_pid
    assert serving is not None
    # Run its first process in the foreground, then find the forked one by its command line.
    command = emulator_writer.spawn_command(store.path, TIMEOUT_MS_CALL)
    first = await asyncio.create_subprocess_exec(*command)
    assert await asyncio.wait_for(first.wait(), 30) == 0
    async with asyncio.timeout(EXIT_WAIT_S):
        while [pid for pid in _writers_of(store.path) if pid != serving]:  # noqa: ASYNC110
            await asyncio.sleep(POLL_S)
    assert _alive(serving)
    assert (await store.log_once(LOG, "t1", TxnState.VOTE_YES, BODY)).created


def _writers_of(path: Path) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                args = cmdline.read().split(b"\0")
        except OSError:
            continue
        if b"storage_adapters.emulator_writer" in args and str(path).encode() in args and _alive(int(entry)):
            found.append(int(entry))
    return found
