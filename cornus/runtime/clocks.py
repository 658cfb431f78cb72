"""The clock that leases and the identity window count on: it counts the time a machine spent
suspended (found by review: CLOCK_MONOTONIC stops during a suspend or a hibernation, and a node
resumed from one found its lease still good long after another node had taken its partitions,
and ran its expired timers as their owner). And `SuspendWatch`, which tells how long a suspend
was, for what runs on the event loop's clock (which stops too) to catch up."""

from __future__ import annotations

import time

LEASE_CLOCK = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)


# A suspend shorter than this goes unseen: the two clocks are read one after the other, a few
# microseconds apart, and well below it every window the protocol keeps has its clock slack.
SUSPEND_MS_MIN = 10


def now_ms() -> int:
    return time.clock_gettime_ns(LEASE_CLOCK) // 1_000_000


def boot_ns() -> int:
    """The lease clock in nanoseconds (now_ms's, unrounded)."""
    return time.clock_gettime_ns(LEASE_CLOCK)


class SuspendWatch:
    """The time the machine spent suspended, as how much further the lease clock ran than
    CLOCK_MONOTONIC: both run at the same rate otherwise (both are slewed by NTP, neither is
    stepped), so their difference, the offset, moves only across a suspend."""

    def __init__(self) -> None:
        # The offset as of the last suspend seen (`seen`).
        self.seen_ms = self.offset_ms()

    @staticmethod
    def offset_ms() -> float:
        # boot_ns looked up in the module on each call, so a test can suspend the machine by moving it.
        return (boot_ns() - time.monotonic_ns()) / 1e6

    def unseen_ms(self, offset_ms: float) -> float:
        """The suspend since the last one seen, at `offset_ms` (0 below SUSPEND_MS_MIN)."""
        suspended_ms = offset_ms - self.seen_ms
        return suspended_ms if suspended_ms >= SUSPEND_MS_MIN else 0.0
