"""When recovered transactions count as settled. The core decides when a recovery is done (every
unfinished transaction it found has its machine and its locks again, `RecoveryFinished`); the node
then gives those transactions a bounded while to resolve, so that the first requests after a
restart, or after a partition is taken, meet few of their locks. The node reports ready once the
recovery at start has settled, and serves a partition it took once that partition's has."""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable

from cornus.protocol.coordinator_base import CoordinatorBase
from cornus.protocol.effects import RecoveryFinished
from cornus.protocol.node_core import NodeCore

log = logging.getLogger("cornus.node")

# Recovery waits at most this long for the transactions it found to be resolved before the node
# reports ready anyway (they stay locked and keep resolving; 2PC ones may block on a coordinator).
TIMEOUT_MS_RECOVERY_RESOLVE = 5_000
RESOLVE_POLL_MS = 10


class Readiness:
    """`settled(effect)` is called once each recovery's transactions resolved, or its wait ran out."""

    def __init__(self, core: NodeCore, counters: collections.Counter[str]) -> None:
        self.core = core
        self.counters = counters
        self.ready = False
        self.settled: Callable[[RecoveryFinished], None] = lambda effect: None
        self._waiters: set[asyncio.Task[None]] = set()

    def recovered(self, effect: RecoveryFinished) -> None:
        self.counters["recovered"] += effect.transaction_count
        task = asyncio.get_running_loop().create_task(self._settle(effect), name="cornus-readiness")
        self._waiters.add(task)
        task.add_done_callback(self._waiters.discard)

    def stop(self) -> None:
        for task in list(self._waiters):
            task.cancel()

    def _unresolved(self, recovered: tuple[tuple[str, str], ...]) -> int:
        """Recovered transactions whose machine has work left. A coordinator whose decision every
        participant acknowledged only waits out the records' grace period (gc_grace_ms, longer
        than the wait here) before deleting them: it holds no lock, and counts as resolved."""
        unresolved = 0
        for host_name, txn in recovered:
            host = self.core.host(host_name)
            machine = None if host is None else host.machines.get(txn)
            unresolved += machine is not None and not (isinstance(machine, CoordinatorBase) and machine.delivered)
        return unresolved

    async def _settle(self, effect: RecoveryFinished) -> None:
        deadline = time.monotonic() + TIMEOUT_MS_RECOVERY_RESOLVE / 1000
        # Polling, for a few seconds at most after a recovery: the machines finish inside the pure
        # core, which has no hook to signal it.
        while self._unresolved(effect.transactions) and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(RESOLVE_POLL_MS / 1000)
        what = "its coordinator log" if effect.node else ", ".join(effect.partitions)
        log.info("%s recovered %d transactions of %s, %d still unresolved", self.core.node,
                 effect.transaction_count, what, self._unresolved(effect.transactions))
        if effect.node:
            self.ready = True
        self.settled(effect)
