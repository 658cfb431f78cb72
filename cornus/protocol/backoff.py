"""Bounded exponential backoff with jitter from an injected random source.

The jitter source is passed in (never the global `random`), so a simulator run is a pure function
of its seed.
"""

from __future__ import annotations

from typing import Protocol


class JitterSource(Protocol):
    def random(self) -> float: ...


class Backoff:
    """Delays for successive retries: min * 2^attempt, capped at max, with "equal jitter" (a
    uniformly drawn upper half) so the delay never collapses to zero."""

    __slots__ = ("_attempt", "_jitter", "backoff_ms_max", "backoff_ms_min")

    def __init__(self, backoff_ms_min: int, backoff_ms_max: int, jitter: JitterSource) -> None:
        assert 0 < backoff_ms_min <= backoff_ms_max
        self.backoff_ms_min = backoff_ms_min
        self.backoff_ms_max = backoff_ms_max
        self._jitter = jitter
        self._attempt = 0

    def next_delay_ms(self) -> int:
        # The exponent is capped too, so a transaction in doubt for days cannot overflow anything.
        ceiling = min(self.backoff_ms_max, self.backoff_ms_min << min(self._attempt, 30))
        self._attempt += 1
        half = ceiling // 2
        delay = half + int(self._jitter.random() * (ceiling - half + 1))
        delay = max(1, min(delay, ceiling))
        assert 1 <= delay <= self.backoff_ms_max
        return delay

    def reset(self) -> None:
        self._attempt = 0
