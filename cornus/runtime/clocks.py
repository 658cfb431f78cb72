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


class SuspendWatch:
    """How much further the lease clock ran than CLOCK_MONOTONIC since the suspend last seen:
    the time the machine was suspended. Both clocks run at the same rate otherwise (both are
    slewed by NTP, neither is stepped), so the difference moves only across a suspend."""

    def __init__(self) -> None:
        self._offset_ms = self._offset_now_ms()

    @staticmethod
    def _offset_now_ms() -> float:
        # Looked up in the module on each call, so a test can suspend the machine by moving now_ms.
        return now_ms() - time.monotonic() * 1000

    def suspended_ms(self, *, seen: bool = True) -> float:
        """The suspend since the last one seen, in ms (0 when none, or one under SUSPEND_MS_MIN);
        with `seen` False it is told again next time."""
        offset_ms = self._offset_now_ms()
        suspended_ms = offset_ms - self._offset_ms
        if suspended_ms < SUSPEND_MS_MIN:
            return 0.0
        if seen:
            self._offset_ms = offset_ms
        return suspended_ms
