"""PartitionRuntime, the execution phase's I/O around the core's rules: every release it makes
wakes the lock waiters the release granted, an idle sweep's included."""

from __future__ import annotations

import asyncio
import time

from cornus.protocol import txn_ids
from cornus.protocol.config import Protocol
from cornus.protocol.locks import Policy
from cornus.runtime.partition import PartitionRuntime
from cornus.runtime.wire import ExecuteRequest, ExecuteStatus, Op, OpKind
from tests.unused_store import UnusedStore

# Long enough that a waiter nobody wakes is still waiting when the test gives up on it.
TIMEOUT_MS_LOCK_WAIT = 30_000
TIMEOUT_S_GRANT = 2.0


async def test_an_idle_sweep_wakes_the_waiter_its_release_granted() -> None:
    partition = PartitionRuntime("p0", UnusedStore(timeout_ms_call=1000), Policy.WAIT_DIE, TIMEOUT_MS_LOCK_WAIT, 100)
    now_ms = int(time.time() * 1000)
    # WAIT_DIE lets the older transaction wait for the younger one's lock.
    older = txn_ids.new_txn_id(now_ms - 1000, "n0", "aaaaaa", 1, Protocol.CORNUS)
    younger = txn_ids.new_txn_id(now_ms, "n0", "bbbbbb", 2, Protocol.CORNUS)
    put = (Op(OpKind.PUT, "k", b"v"),)
    first = await partition.execute(ExecuteRequest(younger, "p0", "n0", put))
    assert first.status is ExecuteStatus.OK
    waiting = asyncio.create_task(partition.execute(ExecuteRequest(older, "p0", "n0", put)))
    await asyncio.sleep(0.05)
    assert not waiting.done(), "the older transaction should be waiting for the lock"
    partition.executions[younger].last_active_ms -= 10_000  # its coordinator went quiet
    assert partition.sweep_idle(5_000, lambda txn: False) == 1
    granted = await asyncio.wait_for(waiting, TIMEOUT_S_GRANT)
    assert granted.status is ExecuteStatus.OK
    assert partition.locks.holders("k") == {older: partition.locks.holders("k")[older]}


async def test_a_lock_request_whose_caller_gave_up_is_never_granted() -> None:
    """A request waiting for a lock is cancelled when its caller's deadline passes (found by
    review): it stayed queued, and the lock went to nobody at the holder's release, held until
    the idle sweep, a minute later."""
    partition = PartitionRuntime("p0", UnusedStore(timeout_ms_call=1000), Policy.WAIT_DIE, TIMEOUT_MS_LOCK_WAIT, 100)
    now_ms = int(time.time() * 1000)
    older = txn_ids.new_txn_id(now_ms - 1000, "n0", "aaaaaa", 1, Protocol.CORNUS)
    younger = txn_ids.new_txn_id(now_ms, "n0", "bbbbbb", 2, Protocol.CORNUS)
    put = (Op(OpKind.PUT, "k", b"v"),)
    assert (await partition.execute(ExecuteRequest(younger, "p0", "n0", put))).status is ExecuteStatus.OK
    waiting = asyncio.create_task(partition.execute(ExecuteRequest(older, "p0", "n0", put)))
    await asyncio.sleep(0.05)
    waiting.cancel()  # the transport's deadline for the request
    await asyncio.gather(waiting, return_exceptions=True)
    partition.release(younger)
    assert partition.locks.holders("k") == {}, "the lock went to a request nobody waits for"
