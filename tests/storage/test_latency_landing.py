"""Injected latency is mostly the answer's trip back (found by review): a call delayed by all of it
before it left was sent long after the effect runner's lease check had passed (a deposed owner's
unfenced write could leave after its lease ended) and got its storage deadline only then (landing
up to the delay past the bound garbage collection counts on)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from cornus.protocol.effects import LogOnce
from storage_adapters.contract import LogId, LogOnceResult, RecordBody, TxnState
from storage_adapters.emulator import EmulatorStore
from storage_adapters.latency import LatencyInjectingStore, parse_latency
from tests.runtime.test_effect_runner import PARTITION, TXN, _Harness


async def test_a_write_whose_trip_out_a_stall_held_up_is_lost_not_sent_late() -> None:
    """The lease is checked as the write's task starts; a node that stalls during the injected
    trip out must not send the write after the stall, when its lease may have ended."""
    harness = _Harness()
    held = harness.store
    harness.runner.store = LatencyInjectingStore(held, parse_latency("fixed:100"))  # 50 ms out
    harness.runner.may_act = lambda host: True
    harness.runner.run([LogOnce(PARTITION, LogId.partition("p1"), TXN, TxnState.ABORT, RecordBody())])
    await harness.settle()  # the lease check passed; the write is on its way out
    time.sleep(0.6)  # the node stalls (SIGSTOP, a starved CPU): nothing runs meanwhile  # noqa: ASYNC251
    await asyncio.sleep(0.3)
    assert not held.calls, "a write held up by a stall was sent after it, unchecked"
    assert len(harness.fed) == 1 and "lost" in str(harness.fed[0])


async def test_a_write_leaves_within_its_trip_out() -> None:
    harness = _Harness()
    held = harness.store
    harness.runner.store = LatencyInjectingStore(held, parse_latency("fixed:5000"))  # 100 ms out
    harness.runner.may_act = lambda host: True
    harness.runner.run([LogOnce(PARTITION, LogId.partition("p1"), TXN, TxnState.ABORT, RecordBody())])
    await asyncio.sleep(0.3)
    assert held.calls, "the write waits out most of the injected delay before it leaves"
    held.calls[-1].set_result(LogOnceResult(TxnState.ABORT, created=True))


async def test_a_call_lands_within_its_deadline_whatever_the_injected_delay(tmp_path: Path) -> None:
    inner = await EmulatorStore.open(tmp_path / "c.db", timeout_ms_call=200)
    store = LatencyInjectingStore(inner, parse_latency("fixed:1500"))
    try:
        made = time.monotonic()
        task = asyncio.ensure_future(store.log_once(LogId.partition("p1"), TXN, TxnState.ABORT, RecordBody()))
        await asyncio.sleep(0.4)  # past the deadline, well before the delay ends
        assert await inner.read(LogId.partition("p1"), TXN) is not None, "not landed within its deadline"
        assert (await task).created
        assert time.monotonic() - made >= 1.5  # the caller still waits the whole injected delay
    finally:
        await inner.close()
