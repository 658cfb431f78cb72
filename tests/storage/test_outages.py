"""A backend that stops answering mid-test gives StorageUnavailable inside the deadline, never a
hang, and the store works again once the backend is back.

Each network backend runs as a private server process that the test freezes (SIGSTOP: the kernel
still accepts connections, nothing answers, the worst case for deadlines) and kills (SIGKILL:
connections refused). The emulator's equivalent of a stuck server is another process that holds
the SQLite file's write lock and never lets go.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from storage_adapters.contract import LogId, RecordBody, TxnState
from storage_adapters.errors import StorageUnavailable
from storage_adapters.factory import StoreConfig, open_store
from storage_adapters.store import LogStore
from tests.conftest import Services
from tests.storage import servers

TIMEOUT_MS_CALL = 1_000
# What the deadline may overrun by on a loaded 2-core machine (event-loop and scheduling delays).
# A hang would blow far past it: the point is "bounded", not "fast".
SLACK_S = 3.0


async def _assert_unavailable_within_deadline(call: Callable[[], Awaitable[object]]) -> None:
    started = time.monotonic()
    with pytest.raises(StorageUnavailable):
        await call()
    elapsed = time.monotonic() - started
    assert elapsed < TIMEOUT_MS_CALL / 1000 + SLACK_S, f"StorageUnavailable after {elapsed:.2f} s"


async def _exercise_outage(store: LogStore, server: servers.ServerProcess, ns: str) -> None:
    log = LogId.partition(ns)
    assert (await store.log_once(log, "before", TxnState.VOTE_YES, RecordBody())).created

    server.freeze()
    try:
        await _assert_unavailable_within_deadline(
            lambda: store.log_once(log, "frozen", TxnState.VOTE_YES, RecordBody())
        )
        await _assert_unavailable_within_deadline(lambda: store.read(log, "before"))
        await _assert_unavailable_within_deadline(lambda: store.log(log, "before", TxnState.COMMIT))
    finally:
        server.thaw()

    # Back: the store reconnects by itself. The frozen log_once may or may not have landed (the
    # contract says a StorageUnavailable call is of unknown effect), so only read what is certain.
    record = await store.read(log, "before")
    assert record is not None and record.state in (TxnState.VOTE_YES, TxnState.COMMIT)
    assert (await store.log_once(log, "after", TxnState.ABORT, RecordBody())).created

    server.kill()
    await _assert_unavailable_within_deadline(lambda: store.log_once(log, "killed", TxnState.VOTE_YES, RecordBody()))
    await _assert_unavailable_within_deadline(lambda: store.read_data(ns, ["k"]))


async def test_redis_outage(services: Services, tmp_path: Path, ns: str) -> None:
    server = servers.start_redis(services, tmp_path)
    try:
        store = await open_store(
            StoreConfig(
                backend="redis", redis_url=f"redis://127.0.0.1:{server.port}/0", timeout_ms_call=TIMEOUT_MS_CALL
            )
        )
        try:
            await _exercise_outage(store, server, ns)
        finally:
            await store.close()
    finally:
        server.kill()


async def test_azure_blob_outage(services: Services, tmp_path: Path, ns: str) -> None:
    server = servers.start_azurite(services, tmp_path)
    try:
        store = await open_store(
            StoreConfig(
                backend="azure_blob",
                azure_connection_string=servers.azurite_connection_string(services, server.port),
                azure_container="outage",
                timeout_ms_call=TIMEOUT_MS_CALL,
            )
        )
        try:
            await _exercise_outage(store, server, ns)
        finally:
            await store.close()
    finally:
        server.kill()


async def test_dynamodb_outage(services: Services, ns: str) -> None:
    server = servers.start_moto(services)
    try:
        store = await open_store(
            StoreConfig(
                backend="dynamodb",
                dynamodb_endpoint=f"http://127.0.0.1:{server.port}",
                dynamodb_table="outage",
                timeout_ms_call=TIMEOUT_MS_CALL,
            )
        )
        try:
            await _exercise_outage(store, server, ns)
        finally:
            await store.close()
    finally:
        server.kill()


_HOLD_WRITE_LOCK = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
time.sleep(600)
"""


async def test_emulator_stuck_writer(tmp_path: Path, ns: str) -> None:
    path = tmp_path / "cornus.db"
    store = await open_store(StoreConfig(backend="emulator", emulator_path=str(path), timeout_ms_call=TIMEOUT_MS_CALL))
    try:
        log = LogId.partition(ns)
        assert (await store.log_once(log, "before", TxnState.VOTE_YES, RecordBody())).created
        holder = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _HOLD_WRITE_LOCK, str(path), stdout=asyncio.subprocess.PIPE
        )
        try:
            assert holder.stdout is not None
            assert (await asyncio.wait_for(holder.stdout.readline(), 30)).strip() == b"locked"
            await _assert_unavailable_within_deadline(
                lambda: store.log_once(log, "stuck", TxnState.VOTE_YES, RecordBody())
            )
            await _assert_unavailable_within_deadline(lambda: store.log(log, "before", TxnState.COMMIT))
        finally:
            holder.kill()
            await asyncio.wait_for(holder.wait(), 10)
        # The stuck writer died without committing, so nothing of its transaction remains.
        assert (await store.log_once(log, "after", TxnState.ABORT, RecordBody())).created
        assert (await store.read(log, "before")).state in (TxnState.VOTE_YES, TxnState.COMMIT)  # type: ignore[union-attr]
    finally:
        await store.close()
