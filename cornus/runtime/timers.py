"""The core's timers on the event loop, for one node: start, cancel, drop a host's, and catch up
after the machine was suspended.

Why a catch-up: the event loop's clock stops while the machine is suspended, and the protocol's
windows are real time. Found by audit (2026-11-27): a coordinator-log coordinator resumed from a
suspend heard its redo write answered before its 200 ms window (REDO_DURABLE_MS_MAX) ran out on
the loop's clock, and committed a redo that had landed long after it in real time. The node
catches up before every event it feeds its core or its partitions (`catch_up_after_suspend`).
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable

from cornus.protocol.effects import Timer
from cornus.runtime import clocks


class TimerTable:
    """Timers by name, each with the clocks' offset (cornus.runtime.clocks) when it started; at
    most one per name (starting one again replaces it). `fire` is called with a timer when it is
    due; the table has forgotten it by then."""

    def __init__(self, fire: Callable[[Timer], None], counters: collections.Counter[str]) -> None:
        self._fire = fire
        self._counters = counters
        self._entries: dict[Timer, tuple[asyncio.TimerHandle, int]] = {}
        # The clocks' offset as of the last suspend caught up on. Read on every event the node
        # takes in: written out where it is read, with no call of its own.
        self._suspend_seen_ns = clocks.boot_ns() - time.monotonic_ns()

    def __contains__(self, timer: Timer) -> bool:
        return timer in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def handle(self, timer: Timer) -> asyncio.TimerHandle:
        """`timer`'s loop handle (for tests: when it is due)."""
        return self._entries[timer][0]

    def start(self, loop: asyncio.AbstractEventLoop, timer: Timer, duration_ms: int) -> None:
        old = self._entries.pop(timer, None)
        if old is not None:
            old[0].cancel()
        # With the offset now: a suspend before it, not seen yet (one in the middle of an effect
        # list), must not move it earlier. Not caught up here: the timers that suspend made
        # overdue would fire in the middle of the list, between one step's effects.
        self._entries[timer] = (loop.call_later(duration_ms / 1000, self._due, timer),
                                clocks.boot_ns() - time.monotonic_ns())

    def cancel(self, timer: Timer) -> None:
        entry = self._entries.pop(timer, None)
        if entry is not None:
            entry[0].cancel()

    def cancel_owned(self, owners: set[str]) -> None:
        """Cancel the timers of these hosts."""
        for timer in [timer for timer in self._entries if timer.owner in owners]:
            self._entries.pop(timer)[0].cancel()

    def clear(self) -> None:
        for handle, _ in self._entries.values():
            handle.cancel()
        self._entries.clear()

    def catch_up_after_suspend(self, running_loop: Callable[[], asyncio.AbstractEventLoop]) -> None:
        """After a suspend, every timer is moved earlier by its length, and those it made overdue
        fire now, in the order they were due: before whatever event comes next, as they would
        have without the suspend. A timer moves by the part of the suspend that came after it
        started (by the offset it started with): one started after a suspend not yet seen, or
        between two, keeps the time it was given. `running_loop` is asked only after a suspend:
        this runs before every event a node takes in, some fifteen a transaction."""
        offset_ns = clocks.boot_ns() - time.monotonic_ns()
        if offset_ns - self._suspend_seen_ns < clocks.SUSPEND_NS_MIN:
            return
        loop = running_loop()
        seen_ns, self._suspend_seen_ns = self._suspend_seen_ns, offset_ns
        self._counters["suspends_caught_up"] += 1
        now_s = loop.time()
        overdue: list[tuple[float, Timer, tuple[asyncio.TimerHandle, int]]] = []
        for timer, entry in list(self._entries.items()):
            handle, started_ns = entry
            moved_ns = offset_ns - max(started_ns, seen_ns)
            if moved_ns < clocks.SUSPEND_NS_MIN:
                continue  # it started after the suspend
            handle.cancel()
            due_s = handle.when() - moved_ns / 1e9
            if due_s <= now_s:
                overdue.append((due_s, timer, entry))  # left in place, cancelled, until it fires below
            else:
                self._entries[timer] = (loop.call_at(due_s, self._due, timer), offset_ns)
        overdue.sort(key=lambda item: item[0])
        for _, timer, entry in overdue:
            # Unless what fired before it cancelled or restarted it (its entry is gone or new).
            if self._entries.get(timer) is entry:
                self._due(timer)

    def _due(self, timer: Timer) -> None:
        self._entries.pop(timer, None)
        self._fire(timer)
