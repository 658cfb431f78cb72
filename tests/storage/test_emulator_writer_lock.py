"""The emulator's writer flock (storage_adapters/emulator.py): writers of several processes take
turns through it; a writer that holds it too long costs the others' writes their deadline, never
their reads (a separate reader thread), and a write whose caller gave up while it waited for the
lock is dropped, never written late."""

from __future__ import annotations

import fcntl
import os
import time

from storage_adapters.contract import LogId, RecordBody, TxnState
from storage_adapters.emulator import EmulatorStore
from storage_adapters.errors import StorageUnavailable

TIMEOUT_MS_CALL = 500
DEADLINE_SLACK_S = 3.0


async def test_a_held_writer_lock_costs_a_write_its_deadline_then_writes_go_on(tmp_path) -> None:
    path = tmp_path / "cornus.db"
    store = await EmulatorStore.open(path, timeout_ms_call=TIMEOUT_MS_CALL)
    log = LogId.partition("p0")
    body = RecordBody(("p0",), "n0", b"")
    # Another open file description, as another process would have: flock refuses it too.
    holder = os.open(f"{path}.writer-lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        started = time.monotonic()
        try:
            await store.log_once(log, "t1.cornus", TxnState.VOTE_YES, body)
            raise AssertionError("a write went through while another writer held the lock")
        except StorageUnavailable:
            pass
        assert time.monotonic() - started < TIMEOUT_MS_CALL / 1000 + DEADLINE_SLACK_S
        # Reads take no writer lock and do not queue behind the waiting write (one queued there
        # would miss its own deadline: the lock is released only below).
        assert await store.read(log, "t1.cornus") is None
        fcntl.flock(holder, fcntl.LOCK_UN)
        # The refused write did not land once the lock was free: this one creates the record.
        result = await store.log_once(log, "t1.cornus", TxnState.VOTE_YES, body)
        assert result.created
    finally:
        os.close(holder)
        await store.close()
