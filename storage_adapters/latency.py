"""Injected storage latency: wrap any LogStore so each call takes a sampled delay, about half of it
(a short trip out) before the call leaves and the rest before its answer comes back.

Used to imitate cloud storage on loopback (Azure Blob ~10 ms, Azure Cache for Redis ~2 ms) and to
compare protocols at the latencies of the paper's experiments. One sample per contract call: the
contract's calls are single round trips on the hot path (`log_once` always is), so one delay per
call models one trip to remote storage.

Specs (milliseconds): `fixed:2`, `uniform:8:18`, `lognormal:10:30` (median 10, 99th percentile 30),
each one distribution for every call; or one of those followed by `;CALL=SPEC` parts, which give
the calls they name (LogStore method names, CALL_NAMES) a distribution of their own, e.g.
`fixed:1.96;log=fixed:1.84` (what loadtests.bench.profiles makes of the paper's measurements: a
plain write is faster than a conditional one).

The loops' timers have a grain of whole milliseconds (uvloop's and the default loop's alike), so a
single delay is off by up to about a millisecond; what each overshoots or falls short is carried
into the next, so that the mean delay is the sample's mean (`_TimerWait`).
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from storage_adapters.contract import (
    IDENTITY_PAGE_COUNT_MAX,
    SCAN_PAGE_COUNT_MAX,
    Fence,
    LogId,
    LogOnceResult,
    Ownership,
    OwnerWriteResult,
    Record,
    RecordBody,
    ScanPage,
    Tombstone,
    TxnState,
)
from storage_adapters.errors import StorageError, StorageUnavailable, ValidationError
from storage_adapters.store import DelegatingStore, LogStore

T = TypeVar("T")

# A sampled delay never exceeds this: a lognormal tail must not stall a benchmark for minutes.
DELAY_MS_MAX = 10_000
# The part of a delay before the call leaves: about half (to the timers' whole ms), at most this.
# Garbage collection counts on a call landing within its deadline plus the clock slack (1 s by
# default) of being made; the trip out must stay well inside that slack.
TRIP_OUT_MS_MAX = 100
# A trip out that overslept its delay by more than this was held up by a stall of the node: the
# call is lost (StorageUnavailable) rather than sent after a check made before the stall. Far
# above a busy loop's lag (which must not fail calls real storage would serve), and with the trip
# out itself still within half the default clock slack.
TRIP_OUT_MS_LATE_MAX = 400
# The grain of the loops' timers: uvloop rounds a timer to whole ms (and fires it ~0.15 ms late),
# the default loop's epoll waits whole ms rounded up. What one wait may be off by, about, and the
# most `_TimerWait` carries into the next.
TIMER_GRAIN_MS = 1.0
# Between the parts of a `;CALL=SPEC` spec: not `,`, which separates a sweep's values (`--sweep
# latency=A,B`, loadtests.bench.sweep).
CALL_SPEC_SEPARATOR = ";"
# The calls a `;CALL=SPEC` part may name: the LogStore methods the wrapper delays.
CALL_NAMES = (
    "log_once", "log", "read", "scan_unfinished_page", "scan_finished_page", "read_data", "apply_redo", "delete",
    "read_owners", "write_owner", "list_identities",
)
_Z_99 = 2.3263478740408408  # the standard normal's 99th percentile


@dataclass(frozen=True, slots=True)
class LatencyDistribution:
    kind: str
    a_ms: float
    b_ms: float = 0.0

    def sampler(self, rng: random.Random) -> Callable[[], float]:
        """A function returning one delay in ms per call."""
        if self.kind == "fixed":
            return lambda: self.a_ms
        if self.kind == "uniform":
            return lambda: rng.uniform(self.a_ms, self.b_ms)
        assert self.kind == "lognormal"
        mu = math.log(self.a_ms)
        sigma = (math.log(self.b_ms) - mu) / _Z_99
        return lambda: min(rng.lognormvariate(mu, sigma), DELAY_MS_MAX)

    def for_call(self, call: str) -> LatencyDistribution:
        """The distribution of `call`'s delays: this one, for every call."""
        return self


@dataclass(frozen=True, slots=True)
class CallLatencies:
    """A distribution per kind of call (a `;CALL=SPEC` spec): `by_call`'s for the calls it names,
    sorted by name (so two spellings of one spec compare equal), `default`'s for the others."""

    default: LatencyDistribution
    by_call: tuple[tuple[str, LatencyDistribution], ...]

    def for_call(self, call: str) -> LatencyDistribution:
        """The distribution of `call`'s delays (`call` a LogStore method name, CALL_NAMES)."""
        return dict(self.by_call).get(call, self.default)


def parse_latency(spec: str) -> LatencyDistribution | CallLatencies:
    """Parse `fixed:MS`, `uniform:LO:HI` or `lognormal:P50:P99` (one distribution for every call),
    or one of those followed by `;CALL=SPEC` parts (`fixed:1.96;log=fixed:1.84`: 1.84 ms for
    `log`, 1.96 for every other call); raise ValidationError otherwise."""
    parts = [part.strip() for part in spec.split(CALL_SPEC_SEPARATOR)]
    if len(parts) == 1 and "=" not in spec:
        return _parse_distribution(spec)
    default: LatencyDistribution | None = None
    by_call: dict[str, LatencyDistribution] = {}
    for part in parts:
        call, named, one = (text.strip() for text in part.partition("="))
        if not named:
            if default is not None:
                raise ValidationError(f"latency {spec!r}: one part without CALL= (for every other call), "
                                      f"not {part!r} too")
            default = _parse_distribution(part)
        elif call not in CALL_NAMES:
            raise ValidationError(f"latency {spec!r}: {call!r} is no call; one of {', '.join(CALL_NAMES)}")
        elif call in by_call:
            raise ValidationError(f"latency {spec!r}: {call} given twice")
        else:
            by_call[call] = _parse_distribution(one)
    if default is None:
        raise ValidationError(f"latency {spec!r}: a part without CALL= must give the other calls' delays")
    return CallLatencies(default, tuple(sorted(by_call.items())))


def _parse_distribution(spec: str) -> LatencyDistribution:
    """Parse `fixed:MS`, `uniform:LO:HI` or `lognormal:P50:P99`; raise ValidationError otherwise."""
    kind, _, rest = spec.partition(":")
    try:
        numbers = [float(part) for part in rest.split(":")] if rest else []
    except ValueError:
        raise ValidationError(f"latency {spec!r}: numbers expected after the kind") from None
    if any(not math.isfinite(n) or n < 0 or n > DELAY_MS_MAX for n in numbers):
        raise ValidationError(f"latency {spec!r}: each value must be within 0..{DELAY_MS_MAX} ms")
    if kind == "fixed" and len(numbers) == 1:
        return LatencyDistribution("fixed", numbers[0])
    if kind == "uniform" and len(numbers) == 2 and numbers[0] <= numbers[1]:
        return LatencyDistribution("uniform", numbers[0], numbers[1])
    if kind == "lognormal" and len(numbers) == 2 and 0 < numbers[0] < numbers[1]:
        return LatencyDistribution("lognormal", numbers[0], numbers[1])
    raise ValidationError(
        f"latency {spec!r}: expected fixed:MS, uniform:LO:HI (LO<=HI) or lognormal:P50:P99 (0<P50<P99)"
    )


class LatencyInjectingStore(DelegatingStore):
    """A LogStore that delays every call by a sample of its distribution (`distribution`'s for
    that call), as a trip to remote storage and back: about half of it (at most TRIP_OUT_MS_MAX)
    before the call leaves, the rest on the answer's side. Found by review: with all of it before
    the call, a call went out long after the effect runner's lease check and got its storage
    deadline only then, so a deposed owner's unfenced write could land past the bound garbage
    collection counts on. The trip out is now short next to the clock slack that bound allows, and
    a call whose trip out took longer than its delay (the node stalled meanwhile) is lost, as a
    network would lose it, never sent late. Bad input is refused by the inner store, as without
    the wrapper.

    Found by audit: both halves were asyncio.sleep calls, which uvloop rounds to whole
    milliseconds (`fixed:1` injected ~0 ms, `fixed:3` ~4.3, `fixed:5` ~4.35, single 0.98 ms halves
    0.02-4.7). Now the trip out takes the loop's timer nearest its half, and the answer's side
    waits (`_TimerWait`) for what is left of the whole delay after what the trip out took: each
    call within about a millisecond of its sample, their mean within a fraction of one."""

    def __init__(
        self, inner: LogStore, distribution: LatencyDistribution | CallLatencies, seed: int | None = None,
    ) -> None:
        super().__init__(inner)
        self.distribution = distribution
        rng = random.Random(seed)  # one for all calls: a seed gives the sequence it gave before
        self._samplers = {call: distribution.for_call(call).sampler(rng) for call in CALL_NAMES}
        self._back = _TimerWait()

    def sample_ms(self, call: str) -> float:
        """One delay in ms for `call` (a LogStore method name, CALL_NAMES), as the wrapper injects."""
        return self._samplers[call]()

    async def _answered(self, name: str, call: Callable[[], Awaitable[T]]) -> T:
        delay_ms = self.sample_ms(name)
        assert 0 <= delay_ms <= DELAY_MS_MAX
        out_ms = min(delay_ms / 2, TRIP_OUT_MS_MAX)
        out_took_ms = 0.0
        if out_ms > 0:
            # Timers have a grain of whole ms: the nearest one to the half, none (a yield) where it
            # would end past the whole delay. The answer's side makes up the difference, either way.
            timer_ms = math.floor(out_ms + 0.5)
            if timer_ms + TIMER_GRAIN_MS / 2 > delay_ms:
                timer_ms = 0
            started = time.monotonic()
            await asyncio.sleep(timer_ms / 1000)
            out_took_ms = (time.monotonic() - started) * 1000
            late_ms = out_took_ms - out_ms
            if late_ms > TRIP_OUT_MS_LATE_MAX:
                raise StorageUnavailable(f"injected latency: the call's trip out took {late_ms:.0f} ms more than "
                                         "its delay (the node stalled): lost, not sent late")
        back_ms = delay_ms - out_took_ms
        try:
            result = await call()
        except ValidationError:
            raise
        except StorageError:
            await self._back.wait(back_ms)  # an error comes back from remote storage too
            raise
        await self._back.wait(back_ms)
        return result

    async def log_once(
        self, log: LogId, txn: str, state: TxnState, body: RecordBody, fence: Fence | None = None
    ) -> LogOnceResult:
        return await self._answered("log_once", lambda: self.inner.log_once(log, txn, state, body, fence))

    async def log(
        self, log: LogId, txn: str, state: TxnState, body: RecordBody | None = None, fence: Fence | None = None
    ) -> TxnState:
        return await self._answered("log", lambda: self.inner.log(log, txn, state, body, fence))

    async def read(self, log: LogId, txn: str) -> Record | None:
        return await self._answered("read", lambda: self.inner.read(log, txn))

    async def scan_unfinished_page(self, log: LogId, limit: int = SCAN_PAGE_COUNT_MAX, after: str = "") -> ScanPage:
        return await self._answered("scan_unfinished_page", lambda: self.inner.scan_unfinished_page(log, limit, after))

    async def scan_finished_page(self, log: LogId, limit: int = SCAN_PAGE_COUNT_MAX, after: str = "") -> ScanPage:
        return await self._answered("scan_finished_page", lambda: self.inner.scan_finished_page(log, limit, after))

    async def read_data(self, partition: str, keys: Sequence[str]) -> dict[str, bytes | None]:
        return await self._answered("read_data", lambda: self.inner.read_data(partition, keys))

    async def apply_redo(
        self, partition: str, txn: str, writes: Mapping[str, bytes | None], fence: Fence | None = None
    ) -> bool:
        return await self._answered("apply_redo", lambda: self.inner.apply_redo(partition, txn, writes, fence))

    async def delete(
        self, log: LogId, txn: str, fence: Fence | None = None, keep: Tombstone | None = None,
    ) -> bool:
        return await self._answered("delete", lambda: self.inner.delete(log, txn, fence, keep))

    async def read_owners(self, partitions: Sequence[str]) -> dict[str, Ownership]:
        return await self._answered("read_owners", lambda: self.inner.read_owners(partitions))

    async def write_owner(self, expected: Ownership | None, new: Ownership) -> OwnerWriteResult:
        return await self._answered("write_owner", lambda: self.inner.write_owner(expected, new))

    async def list_identities(self, after: str = "", limit: int = IDENTITY_PAGE_COUNT_MAX) -> list[str]:
        return await self._answered("list_identities", lambda: self.inner.list_identities(after, limit))


class _TimerWait:
    """Waits on the loop's timers alone, whose grain is a whole millisecond (uvloop rounds a
    timer to whole ms, the default loop's epoll waits whole ms rounded up), so that each wait is
    off by up to about a millisecond, and carries what each wait overshot or fell short into the
    next: the mean wait is its asked mean, on either loop. At most TIMER_GRAIN_MS is carried, so
    that a loop late for its load (real processing delay, which the caller must see) is not
    taken back from later waits. Found by measurement (2026-11-28, third): waiting out the last
    millisecond by yielding to the loop instead cost the nodes 20-25% more CPU under
    `fixed:10.4`, and the cores they share, 1-3 ms on every storage call."""

    def __init__(self) -> None:
        self._owed_ms = 0.0  # what earlier waits overshot (above 0) or fell short (below), to even out

    async def wait(self, ms: float) -> None:
        """Wait about `ms`; a cancellation ends the wait at once."""
        asked_ms = ms - self._owed_ms
        started = time.monotonic()
        if asked_ms > 0:
            await asyncio.sleep(asked_ms / 1000)
        took_ms = (time.monotonic() - started) * 1000
        self._owed_ms = max(-TIMER_GRAIN_MS, min(TIMER_GRAIN_MS, self._owed_ms + took_ms - ms))
