"""When a starting node reports ready. The core decides when recovery is done (every unfinished
transaction has its machine and its locks again, `RecoveryFinished`); the node then gives those
transactions a bounded while to resolve, so that the first requests after a restart meet few of
their locks, and reports ready. Requests for its partitions are refused (retryable) until then."""

from __future__ import annotations

import asyncio
import collections
import logging
import time

from cornus.protocol.effects import RecoveryFinished
from cornus.protocol.node_core import NodeCore

log = logging.getLogger("cornus.node")

# Recovery waits at most this long for the transactions it found to be resolved before the node
# reports ready anyway (they stay locked and keep resolving; 2PC ones may block on a coordinator).
TIMEOUT_MS_RECOVERY_RESOLVE = 5_000
RESOLVE_POLL_MS = 10


class Readiness:
    def __init__(self, core: NodeCore, counters: collections.Counter[str]) -> None:
        self.core = core
        self.counters = counters
        self.ready = False
        self._ready_event = asyncio.Event()
        self._waiter: asyncio.Task[None] | None = None

    def recovered(self, effect: RecoveryFinished) -> None:
        self.counters["recovered"] += effect.transaction_count
        self._waiter = asyncio.get_running_loop().create_task(self._settle(), name="cornus-readiness")

    async def wait(self) -> None:
        await self._ready_event.wait()

    def stop(self) -> None:
        if self._waiter is not None:
            self._waiter.cancel()

    def _unresolved(self, recovered: list[tuple[str, str]]) -> int:
        unresolved = 0
        for host_name, txn in recovered:
            host = self.core.host(host_name)
            unresolved += host is not None and txn in host.machines
        return unresolved

    async def _settle(self) -> None:
        result = self.core.recovery.result
        assert result is not None
        recovered = [(record.log.name, record.txn) for record in result.records]
        deadline = time.monotonic() + TIMEOUT_MS_RECOVERY_RESOLVE / 1000
        # Polling, at startup only and for a few seconds at most: the machines finish inside the
        # pure core, which has no hook to signal it.
        while self._unresolved(recovered) and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(RESOLVE_POLL_MS / 1000)
        log.info("%s recovered %d transactions, %d still unresolved", self.core.node, len(recovered),
                 self._unresolved(recovered))
        self.ready = True
        self._ready_event.set()
