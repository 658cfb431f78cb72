"""Dropping the Azure backend's decision tombstones when their keep ends, as the other backends'
storage does (Redis key expiry, the emulator's sweep, DynamoDB's TTL).

Why. Azure Blob has no expiry per blob: the lifecycle rule that drops tombstones runs about once a
day and counts whole days (storage_adapters/azure_blob.py), so a busy log's listing holds a day or
more of them, and every recovery scan walks them all (in bounded pages, but millions of names:
minutes before a restarted node is ready). So the store that wrote a tombstone also deletes it once
its keep has passed, if the blob is still that tombstone (If-Match its ETag: a tombstone rewritten
since is a new entry, or left to the rule). The keep is all the contract promises (`Tombstone`), so
nothing may count on it lasting longer. What this process does not delete (it stopped, a delete
kept failing, more tombstones were waiting than it keeps track of) the lifecycle rule still drops.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import heapq
import itertools
import logging
import time
from collections.abc import Awaitable, Callable

log = logging.getLogger("cornus.storage")

# Tombstones one store keeps track of until their keep ends: at 906 s of keep (Azure's least, for
# its 15-minute late window), 290 of them written a second; about 250 bytes each. Past this a new
# one is left to the lifecycle rule.
SWEEP_PENDING_COUNT_MAX = 262_144
# How often the sweep looks for tombstones whose keep has ended; how many it deletes a round, at
# most DELETE_CONCURRENCY_MAX at once (beside the transactions' own calls, never a burst that
# crowds them out); and how many rounds it runs back to back while more are due: up to about 800
# deletes a second, more than the pending bound's rate.
SWEEP_INTERVAL_S = 5.0
SWEEP_ROUND_COUNT_MAX = 512
SWEEP_ROUNDS_PER_INTERVAL_MAX = 8
DELETE_CONCURRENCY_MAX = 8
# Tries one tombstone's delete gets before it is left to the lifecycle rule (a delete Azure keeps
# refusing must not take a round's places for ever).
DELETE_ATTEMPT_COUNT_MAX = 3


class TombstoneSweep:
    """Tombstones written by one store, deleted by `delete(name, etag)` once their keep has passed
    (by this process's monotonic clock, from when the put was answered: later than the call that
    wrote it, from which the keep counts). `delete` raises for one it could not delete, which a
    later round tries again, up to DELETE_ATTEMPT_COUNT_MAX times."""

    def __init__(self, delete: Callable[[str, str], Awaitable[bool]]) -> None:
        self._delete = delete  # whether it deleted the blob (not rewritten since, nor gone)
        # (when its keep ends, order, blob name, its ETag, attempts so far): a heap, since keeps
        # differ (a rewritten tombstone comes back with its whole keep again).
        self._pending: list[tuple[float, int, str, str, int]] = []
        self._order = itertools.count()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.deleted_count = 0
        self.dropped_count = 0  # left to the lifecycle rule: too many pending, or too many failures

    def remember(self, name: str, etag: str, keep_ms: int) -> None:
        if self._closed or len(self._pending) >= SWEEP_PENDING_COUNT_MAX:
            self.dropped_count += 1
            return
        heapq.heappush(self._pending, (time.monotonic() + keep_ms / 1000, next(self._order), name, etag, 0))
        if self._task is None:
            # In a context of its own: the first `remember` runs inside a storage call, whose
            # deadline and signing window (context variables) every delete would otherwise carry
            # for good (found by review: past that call's deadline no delete could succeed).
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="cornus-azure-tombstone-sweep", context=contextvars.Context()
            )

    async def close(self) -> None:
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def sweep_once(self) -> int:
        """Delete the tombstones whose keep has ended, at most SWEEP_ROUND_COUNT_MAX; how many."""
        now = time.monotonic()
        due: list[tuple[float, int, str, str, int]] = []
        while self._pending and self._pending[0][0] <= now and len(due) < SWEEP_ROUND_COUNT_MAX:
            due.append(heapq.heappop(self._pending))
        semaphore = asyncio.Semaphore(DELETE_CONCURRENCY_MAX)

        async def delete(entry: tuple[float, int, str, str, int]) -> BaseException | bool:
            async with semaphore:
                try:
                    return await self._delete(entry[2], entry[3])
                except Exception as error:  # any: one failure must not end the sweep
                    return error

        answers = await asyncio.gather(*(delete(entry) for entry in due))
        failed = [(entry, error) for entry, error in zip(due, answers, strict=True)
                  if isinstance(error, BaseException)]
        for (due_at, order, name, etag, attempts), _ in failed:
            if attempts + 1 < DELETE_ATTEMPT_COUNT_MAX:
                heapq.heappush(self._pending, (due_at, order, name, etag, attempts + 1))
            else:
                self.dropped_count += 1
        if failed:
            # One line a round, not one a blob: a failing Azure fails them all.
            log.warning("azure tombstone sweep: %d of %d deletes failed (the first: %s: %r); tried again later, "
                        "at most %d times each", len(failed), len(due), failed[0][0][2], failed[0][1],
                        DELETE_ATTEMPT_COUNT_MAX)
        # Only what it deleted: a blob rewritten since (its newer ETag is queued too) or gone counted
        # too, and a sweep falling behind looked healthy (found by audit, 2026-11-28).
        deleted = sum(answer is True for answer in answers)
        self.deleted_count += deleted
        return deleted

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            for _ in range(SWEEP_ROUNDS_PER_INTERVAL_MAX):
                if await self.sweep_once() < SWEEP_ROUND_COUNT_MAX:
                    break
