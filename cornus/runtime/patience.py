"""A node's start-up storage calls, tried again while storage is unavailable: a node that starts
while its storage cannot be reached (a network blip, storage restarting, a node restarted in the
middle of a partition) waits for it, with capped backoff, up to a deadline, and then gives up and
exits for its supervisor. A node without storage can do nothing, but exiting at the first refused
connection turns every short outage into a restart loop."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from storage_adapters.errors import StorageUnavailable

log = logging.getLogger("cornus.node")

T = TypeVar("T")

# How long a node's start waits for its storage, all its calls together (opening the store,
# reading the cluster record): the chart's startup probe allows more.
STORAGE_WAIT_TIMEOUT_S = 60.0
BACKOFF_S_MIN = 0.1
BACKOFF_S_MAX = 2.0


def start_deadline_s() -> float:
    """The time.monotonic() past which a start that begins now stops waiting for storage."""
    return time.monotonic() + STORAGE_WAIT_TIMEOUT_S


async def patiently(call: Callable[[], Awaitable[T]], what: str, deadline_s: float) -> T:
    """`call()`, tried again while it raises StorageUnavailable, until `deadline_s`
    (time.monotonic()); each failure is logged as `what` (StorageUnavailable past the deadline)."""
    delay_s = BACKOFF_S_MIN
    while True:
        try:
            return await call()
        except StorageUnavailable as error:
            if time.monotonic() + delay_s > deadline_s:
                raise
            log.warning("%s (%s); trying again in %.1f s", what, error, delay_s)
            await asyncio.sleep(delay_s)
            delay_s = min(2 * delay_s, BACKOFF_S_MAX)
