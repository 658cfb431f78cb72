"""Injected latency stands for the answer's trip back, not the call's trip out (found by review):
a call delayed before it left was sent after the effect runner's lease check had passed (a
deposed owner's unfenced write could leave after its lease ended) and got its storage deadline
only then (landing up to the delay past the deadline garbage collection counts on)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from cornus.protocol.effects import LogOnce
from storage_adapters.contract import LogId, LogOnceResult, RecordBody, TxnState
from storage_adapters.emulator import EmulatorStore
from storage_adapters.latency import LatencyInjectingStore, parse_latency
from tests.runtime.test_effect_runner import PARTITION, TXN, _Harness


async def test_a_write_leaves_as_the_lease_is_checked_not_after_the_injected_delay() -> None:
    harness = _Harness()
    held = harness.store
    harness.runner.store = LatencyInjectingStore(held, parse_latency("fixed:50"))
    harness.runner.may_act = lambda host: True
    harness.runner.run([LogOnce(PARTITION, LogId.partition("p1"), TXN, TxnState.ABORT, RecordBody())])
    await harness.settle()  # the task checked the lease; the write must have left with that check
    assert held.calls, "the write waits out the injected delay after the lease check, unchecked"
    held.calls[-1].set_result(LogOnceResult(TxnState.ABORT, created=True))
    await asyncio.sleep(0.1)  # the answer's injected trip back, then it is fed
    assert len(harness.fed) == 1


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
