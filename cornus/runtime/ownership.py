"""Carries out the ownership machine (cornus.protocol.ownership) on one node: ticks it on a clock
that counts suspended time, runs its storage calls, and tells the node what it acquired, lost or
must drain. It decides nothing; it also answers, from the machine, whether the node may serve a
partition now and with which fence, and from the last records read, which node to send a
partition's traffic to.

Every serve and stop is logged in one fixed form, for operators and for the chaos harness, which
checks from them that no partition was served by two nodes at once (wall-clock milliseconds). They
are written before the logging call returns (WRITTEN_AT_ONCE), not queued, so that a kill -9 right
after cannot lose one:

    ownership serve partition=p0 epoch=3 node=n0 at_unix_ms=...
    ownership stop partition=p0 epoch=3 node=n0 until_unix_ms=... reason=expired
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from cornus.protocol.ownership import (
    Acquired,
    Drain,
    Lost,
    LostReason,
    OwnershipEffect,
    OwnershipMachine,
    ReadOwners,
    WriteOwner,
)
from cornus.runtime.clocks import now_ms
from cornus.runtime.effect_runner import crash_if_failed, fatal
from storage_adapters.contract import Fence, Ownership
from storage_adapters.errors import StorageUnavailable
from storage_adapters.store import LogStore

log = logging.getLogger("cornus.ownership")
# Log record attributes that have services.api.logs write a line in the caller, not queue it.
WRITTEN_AT_ONCE = {"write_at_once": True}


def unix_ms_of(monotonic_ms: int) -> int:
    """A monotonic instant as wall-clock milliseconds (for logs read beside other nodes')."""
    return int(time.time() * 1000) - (now_ms() - monotonic_ms)


class OwnershipRuntime:
    """`acquired`, `lost` and `drain` are the node's hooks; `fatal` ends the process."""

    def __init__(
        self,
        node_id: str,
        store: LogStore,
        machine: OwnershipMachine,
        counters: collections.Counter[str],
        *,
        acquired: Callable[[Ownership], None],
        lost: Callable[[Lost], None],
        drain: Callable[[str], None],
    ) -> None:
        self.node_id = node_id
        self.store = store
        self.machine = machine
        self.counters = counters
        self._acquired = acquired
        self._lost = lost
        self._drain = drain
        # The records as last read or written: where to route a partition's traffic.
        self.records: dict[str, Ownership] = {}
        self.records_known = False  # a first read has answered
        self._tasks: set[asyncio.Task[None]] = set()
        self._ticker: asyncio.Task[None] | None = None
        self._stopped = False
        self._halted = False

    # --- what the node asks ------------------------------------------------------------------
    def holds(self, partition: str) -> bool:
        return self.machine.holds(partition, now_ms())

    def admits(self, partition: str) -> bool:
        return self.machine.admits(partition, now_ms())

    def admits_request(self, partition: str, *, continues_execution: bool) -> bool:
        return self.machine.admits_request(partition, now_ms(), continues_execution=continues_execution)

    def fence(self, partition: str) -> Fence | None:
        """The fence for a write to `partition`, or None if the lease is not good now: the write
        must not be made at all (storage would refuse it, or, on Azure, might not)."""
        if not self.holds(partition):
            self.check(partition)
            return None
        epoch = self.machine.epoch(partition)
        assert epoch is not None
        return Fence(partition, self.node_id, epoch)

    def owner_of(self, partition: str) -> str | None:
        """The node that holds `partition` as far as this one knows (None: nobody, or unknown)."""
        if self.machine.epoch(partition) is not None:
            return self.node_id
        record = self.records.get(partition)
        return record.owner if record is not None and record.owner else None

    def check(self, partition: str) -> None:
        """A lease that ran out is dropped at once, not at the next tick: the node is about to
        act on the partition."""
        if self.machine.epoch(partition) is not None and not self.holds(partition):
            self._apply(self.machine.tick(now_ms()))

    def fenced(self, partition: str, epoch: int) -> None:
        self.counters["ownership_fenced_writes"] += 1
        self._apply(self.machine.fenced(now_ms(), partition, epoch))

    def drained(self, partition: str) -> None:
        self._apply(self.machine.drained(now_ms(), partition))

    # --- lifecycle ---------------------------------------------------------------------------
    def quiesce(self) -> None:
        """Told to stop: keep what is held, take and ask for nothing more (OwnershipMachine.quiesce)."""
        self.machine.quiesce()

    def start(self) -> None:
        self._ticker = asyncio.get_running_loop().create_task(self._tick_forever(), name="cornus-ownership")
        self._ticker.add_done_callback(crash_if_failed)

    def halt(self) -> None:
        """Stop at once, writing nothing, ever again: no renewal, no release (a deposed node, whose
        partitions another process of the same node id may hold by now). Leases held run out."""
        self._stopped = self._halted = True
        if self._ticker is not None:
            self._ticker.cancel()
        for task in list(self._tasks):
            task.cancel()

    async def stop(self, timeout_s: float) -> None:
        """Release every partition held, waiting at most `timeout_s` for the releases to land (one
        that does not land expires instead)."""
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
        self._apply(self.machine.shutdown(now_ms()))
        self._stopped = True
        # Waited for until none is left: a renewal's answer may start the release deferred
        # behind it (OwnershipMachine._release_after_write).
        loop = asyncio.get_running_loop()
        deadline_s = loop.time() + timeout_s
        while self._tasks and loop.time() < deadline_s:
            await asyncio.wait(set(self._tasks), timeout=deadline_s - loop.time())
        for task in list(self._tasks):
            task.cancel()

    async def _tick_forever(self) -> None:
        # Half the renewal interval: a lease's end is noticed within that, and each poll starts
        # on time however long the previous one's answer took.
        interval_s = self.machine.config.renew_interval_ms / 2000
        while True:
            self._apply(self.machine.tick(now_ms()))
            await asyncio.sleep(interval_s)

    # --- effects -----------------------------------------------------------------------------
    def _apply(self, effects: list[OwnershipEffect]) -> None:
        for effect in effects:
            if isinstance(effect, ReadOwners):
                self._spawn(self._read(effect))
            elif isinstance(effect, WriteOwner):
                # Once stopped, only releases: a renewal or a take would hold what we leave. Once
                # halted, nothing.
                if not self._halted and (not self._stopped or effect.new.owner == ""):
                    self._spawn(self._write(effect))
            elif isinstance(effect, Acquired):
                self.counters["ownership_acquired"] += 1
                log.info("acquired %s in epoch %d; recovering its log", effect.ownership.partition,
                         effect.ownership.epoch)
                self._acquired(effect.ownership)
            elif isinstance(effect, Lost):
                self.counters[f"ownership_lost_{effect.reason}"] += 1
                level = logging.INFO if effect.reason in (LostReason.RELEASED, LostReason.SHUTDOWN) else logging.WARNING
                log.log(level, "ownership stop partition=%s epoch=%d node=%s until_unix_ms=%d reason=%s",
                        effect.partition, effect.epoch, self.node_id, unix_ms_of(effect.until_ms), effect.reason,
                        extra=WRITTEN_AT_ONCE)
                self._lost(effect)
            else:
                assert isinstance(effect, Drain), f"unexpected ownership effect {effect!r}"
                log.info("handing %s over: admitting no new transactions on it", effect.partition)
                self._drain(effect.partition)

    async def _read(self, call: ReadOwners) -> None:
        try:
            records: dict[str, Ownership] | None = await self.store.read_owners(call.partitions)
        except StorageUnavailable as error:
            self.counters["ownership_reads_failed"] += 1
            log.warning("reading ownership records: %s", error)
            records = None
        if records is not None:
            self.records = records
            self.records_known = True
        self._apply(self.machine.owners_read(now_ms(), records))

    async def _write(self, call: WriteOwner) -> None:
        try:
            result = await self.store.write_owner(call.expected, call.new)
        except StorageUnavailable as error:
            self.counters["ownership_writes_failed"] += 1
            log.warning("writing the ownership of %s: %s", call.new.partition, error)
            result = None
        if result is not None and result.stored is not None:
            self.records[call.new.partition] = result.stored
        self._apply(self.machine.owner_written(now_ms(), call, result))

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            fatal(f"ownership task failed: {task.exception()!r}")
