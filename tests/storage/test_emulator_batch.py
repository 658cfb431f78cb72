"""The emulator's group commit (storage_adapters/emulator.py): calls queued together run in one
SQLite transaction, and each still gets the answer it would get alone: a refused call in a batch
writes nothing, and the others land."""

from __future__ import annotations

import asyncio
import fcntl
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from storage_adapters.contract import Fence, LogId, RecordBody, TxnState
from storage_adapters.emulator import EmulatorStore
from storage_adapters.errors import Fenced

TIMEOUT_MS_CALL = 5_000
QUEUE_WAIT_S = 5.0
LOG = LogId.partition("p0")
BODY = RecordBody(("p0",), "n0", b"")


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[EmulatorStore]:
    opened = await EmulatorStore.open(tmp_path / "cornus.db", timeout_ms_call=TIMEOUT_MS_CALL)
    yield opened
    await opened.close()


async def _in_one_batch(store: EmulatorStore, *calls: Callable[[], Any]) -> list[Any]:
    """Run `calls` as one batch of the writer: while another process holds the writer lock, a
    first write takes the worker (it waits for the lock with it), and `calls` queue behind it;
    once the lock is free the worker runs them together."""
    holder = os.open(f"{store.path}.writer-lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        first = asyncio.ensure_future(store.log_once(LOG, "t0.cornus", TxnState.VOTE_YES, BODY))
        lane = store._lanes[True]
        async with asyncio.timeout(QUEUE_WAIT_S):
            while not first_taken(lane):  # noqa: ASYNC110 - a queue, no event
                await asyncio.sleep(0.005)
        batch = [asyncio.ensure_future(call()) for call in calls]
        async with asyncio.timeout(QUEUE_WAIT_S):
            while lane.queue.qsize() < len(calls):  # noqa: ASYNC110 - a queue, no event
                await asyncio.sleep(0.005)
        fcntl.flock(holder, fcntl.LOCK_UN)
        assert (await first).created
        return await asyncio.gather(*batch, return_exceptions=True)
    finally:
        os.close(holder)


def first_taken(lane: Any) -> bool:
    """The worker took the first call: something was queued and the queue is empty again (the
    worker never calls task_done, so unfinished_tasks counts every call queued)."""
    return lane.queue.unfinished_tasks > 0 and lane.queue.qsize() == 0


async def test_a_refused_call_in_a_batch_writes_nothing_and_the_others_land(store: EmulatorStore) -> None:
    fence = Fence("p0", "n0", 1)  # no ownership record exists, so storage refuses it
    outcomes = await _in_one_batch(
        store,
        lambda: store.log_once(LOG, "t1.cornus", TxnState.VOTE_YES, BODY),
        lambda: store.log_once(LOG, "t2.cornus", TxnState.VOTE_YES, BODY, fence),
        lambda: store.log_once(LOG, "t3.cornus", TxnState.VOTE_YES, BODY),
    )
    assert outcomes[0].created and outcomes[2].created, outcomes
    assert isinstance(outcomes[1], Fenced), outcomes
    assert await store.read(LOG, "t2.cornus") is None
    assert (await store.read(LOG, "t1.cornus")) is not None and (await store.read(LOG, "t3.cornus")) is not None

