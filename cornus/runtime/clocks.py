"""The clock that leases and the identity window count on: it counts the time a machine spent
suspended (found by review: CLOCK_MONOTONIC stops during a suspend or a hibernation, and a node
resumed from one found its lease still good long after another node had taken its partitions,
and ran its expired timers as their owner)."""

from __future__ import annotations

import time

LEASE_CLOCK = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)


def now_ms() -> int:
    return time.clock_gettime_ns(LEASE_CLOCK) // 1_000_000
