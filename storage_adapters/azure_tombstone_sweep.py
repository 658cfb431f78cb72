"""Dropping the Azure backend's decision tombstones when their keep ends, as the other backends'
storage does (Redis key expiry, the emulator's sweep, DynamoDB's TTL).

Why. Azure Blob has no expiry per blob: the lifecycle rule that drops tombstones runs about once a
day and counts whole days (storage_adapters/azure_blob.py), so a busy log's listing holds a day or
more of them, and every recovery scan walks them all (in bounded pages, but millions of names:
minutes before a restarted node is ready). So the store that wrote a tombstone also deletes it once
its keep has passed, if the blob is still that tombstone (If-Match its ETag: a tombstone rewritten
since is left to the rule). The keep is all the contract promises (`Tombstone`), so nothing may
count on it lasting longer. What this process does not delete (it stopped, or more tombstones were
waiting than it keeps track of) the lifecycle rule still drops.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from storage_adapters.errors import StorageError

log = logging.getLogger("cornus.storage")

# Tombstones one store keeps track of until their keep ends: at 906 s of keep (Azure's least, for
# its 15-minute late window), 260 of them written a second. Past this a new one is left to the
# lifecycle rule.
SWEEP_PENDING_COUNT_MAX = 262_144
# How often the sweep looks for tombstones whose keep has ended, and how many it deletes a round,
# at most DELETE_CONCURRENCY_MAX at once: deletes beside the transactions' own calls, never a
# burst that would crowd them out.
SWEEP_INTERVAL_S = 5.0
SWEEP_ROUND_COUNT_MAX = 512
DELETE_CONCURRENCY_MAX = 8


class TombstoneSweep:
    """Tombstones written by one store, deleted by `delete(name, etag)` once their keep has passed
    (by this process's monotonic clock, from when the put was answered: later than the call that
    wrote it, from which the keep counts). `delete` raises StorageError for one it could not
    delete, which the next round tries again."""

    def __init__(self, delete: Callable[[str, str], Awaitable[None]]) -> None:
        self._delete = delete
        # (when its keep ends, blob name, its ETag), in the order written: one store writes every
        # tombstone with the same keep, so this is also the order they expire in.
        self._pending: collections.deque[tuple[float, str, str]] = collections.deque()
        self._task: asyncio.Task[None] | None = None
        self.deleted_count = 0
        self.dropped_count = 0  # left to the lifecycle rule: too many pending

    def remember(self, name: str, etag: str, keep_ms: int) -> None:
        if len(self._pending) >= SWEEP_PENDING_COUNT_MAX:
            self.dropped_count += 1
            return
        self._pending.append((time.monotonic() + keep_ms / 1000, name, etag))
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="cornus-azure-tombstone-sweep")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def sweep_once(self) -> int:
        """Delete the tombstones whose keep has ended, at most SWEEP_ROUND_COUNT_MAX; how many."""
        now = time.monotonic()
        due: list[tuple[float, str, str]] = []
        while self._pending and self._pending[0][0] <= now and len(due) < SWEEP_ROUND_COUNT_MAX:
            due.append(self._pending.popleft())
        semaphore = asyncio.Semaphore(DELETE_CONCURRENCY_MAX)

        async def delete(entry: tuple[float, str, str]) -> bool:
            async with semaphore:
                try:
                    await self._delete(entry[1], entry[2])
                except StorageError as error:
                    log.warning("azure tombstone %s not deleted (%s); tried again later", entry[1], error)
                    return False
                return True

        done = await asyncio.gather(*(delete(entry) for entry in due))
        # Not deleted: back in front, tried again next round (bounded like the rest).
        for entry, deleted in reversed(list(zip(due, done, strict=True))):
            if not deleted:
                self._pending.appendleft(entry)
        self.deleted_count += sum(done)
        return sum(done)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            await self.sweep_once()
