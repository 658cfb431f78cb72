"""The clock that leases and the identity window count on: it counts the time a machine spent
suspended (found by review: CLOCK_MONOTONIC stops during a suspend or a hibernation, and a node
resumed from one found its lease still good long after another node had taken its partitions,
and ran its expired timers as their owner).

How long a suspend was, for what runs on the event loop's clock (which stops too) to catch up
(timers.TimerTable.catch_up_after_suspend): `boot_ns() - time.monotonic_ns()`, the offset of this
clock from CLOCK_MONOTONIC. Both run at the same rate otherwise (both are slewed by NTP, neither
is stepped), so the offset moves only across a suspend, by its length."""

from __future__ import annotations

import time

LEASE_CLOCK = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)


# A suspend shorter than this goes unseen: the two clocks are read one after the other, a few
# microseconds apart, and well below it every window the protocol keeps has its clock slack.
SUSPEND_NS_MIN = 10_000_000


def now_ms() -> int:
    return time.clock_gettime_ns(LEASE_CLOCK) // 1_000_000


def boot_ns() -> int:
    """The lease clock in nanoseconds (now_ms's, unrounded)."""
    return time.clock_gettime_ns(LEASE_CLOCK)
