"""A release deferred behind a renewal in flight is written at a clean stop too (found by review):
the runtime dropped every ownership write once stopping, this one included, and stopped waiting
before it was made, so the next owner waited out the lease and the clock slack."""
from __future__ import annotations

import asyncio
import collections

import pytest

from cornus.protocol.ownership import OwnershipConfig, OwnershipMachine
from cornus.runtime.ownership import OwnershipRuntime
from storage_adapters.contract import Ownership, OwnerWriteResult

pytestmark = pytest.mark.timeout(30)


class Store:
    def __init__(self) -> None:
        self.records: dict[str, Ownership] = {}
        self.gate: asyncio.Event | None = None
        self.entered = asyncio.Event()
        self.writes: list[Ownership] = []

    async def read_owners(self, partitions):
        return {p: self.records[p] for p in partitions if p in self.records}

    async def write_owner(self, expected, new):
        if self.gate is not None and new.owner == "n0" and expected is not None and new.epoch == expected.epoch:
            self.entered.set()
            await self.gate.wait()  # a renewal, slow to answer
        self.writes.append(new)
        current = self.records.get(new.partition)
        if current != expected:
            return OwnerWriteResult(current, False)
        self.records[new.partition] = new
        return OwnerWriteResult(new, True)


async def test_a_release_deferred_behind_a_renewal_is_written_at_stop() -> None:
    store = Store()
    config = OwnershipConfig(lease_ms=1000, renew_interval_ms=100, clock_slack_ms=100, failover_delay_ms=1,
                             drain_ms_max=1000)
    machine = OwnershipMachine("n0", {"p0": "n0"}, config)
    runtime = OwnershipRuntime("n0", store, machine, collections.Counter(),
                               acquired=lambda ownership: None, lost=lambda lost: None, drain=lambda partition: None)
    runtime.start()
    for _ in range(100):
        if runtime.holds("p0"):
            break
        await asyncio.sleep(0.02)
    assert runtime.holds("p0")
    store.gate = asyncio.Event()
    await asyncio.wait_for(store.entered.wait(), 5)  # a renewal is in flight now
    stopping = asyncio.ensure_future(runtime.stop(2.0))
    await asyncio.sleep(0.05)
    store.gate.set()  # the renewal answers (landed)
    await stopping
    await asyncio.sleep(0.1)
    assert store.records["p0"].owner == "", f"release never written at stop: {store.records['p0']}"
