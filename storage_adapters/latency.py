"""Injected storage latency: wrap any LogStore so each call takes a sampled delay, half of it (a
short trip out) before the call leaves and the rest before its answer comes back.

Used to imitate cloud storage on loopback (Azure Blob ~10 ms, Azure Cache for Redis ~2 ms) and to
compare protocols at the latencies of the paper's experiments. One sample per contract call: the
contract's calls are single round trips on the hot path (`log_once` always is), so one delay per
call models one trip to remote storage.

Specs (milliseconds): `fixed:2`, `uniform:8:18`, `lognormal:10:30` (median 10, 99th percentile 30).
"""

from __future__ import annotations

import asyncio
import math
import random
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
# The part of a delay before the call leaves: half, at most this. Garbage collection counts on a
# call landing within its deadline plus the clock slack (1 s by default) of being made; the trip
# out must stay well inside that slack.
TRIP_OUT_MS_MAX = 100
# A trip out that overslept its delay by more than this was held up by a stall of the node: the
# call is lost (StorageUnavailable) rather than sent after a check made before the stall. Far
# above a busy loop's lag (which must not fail calls real storage would serve), and with the trip
# out itself still within half the default clock slack.
TRIP_OUT_MS_LATE_MAX = 400
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


def parse_latency(spec: str) -> LatencyDistribution:
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
    """A LogStore that delays every call by a sample of `distribution`, as a trip to remote
    storage and back: half of it (at most TRIP_OUT_MS_MAX) before the call leaves, the rest on
    the answer's side. Found by review: with all of it before the call, a call went out long after
    the effect runner's lease check and got its storage deadline only then, so a deposed owner's
    unfenced write could land past the bound garbage collection counts on. The trip out is now
    short next to the clock slack that bound allows, and a call whose trip out took longer than
    its delay (the node stalled meanwhile) is lost, as a network would lose it, never sent late.
    Bad input is refused by the inner store, as without the wrapper."""

    def __init__(self, inner: LogStore, distribution: LatencyDistribution, seed: int | None = None) -> None:
        super().__init__(inner)
        self.distribution = distribution
        self._sample_ms = distribution.sampler(random.Random(seed))

    async def _answered(self, call: Callable[[], Awaitable[T]]) -> T:
        delay_ms = self._sample_ms()
        assert 0 <= delay_ms <= DELAY_MS_MAX
        out_ms = min(delay_ms / 2, TRIP_OUT_MS_MAX)
        if out_ms > 0:
            loop = asyncio.get_running_loop()
            started = loop.time()
            await asyncio.sleep(out_ms / 1000)
            late_ms = (loop.time() - started) * 1000 - out_ms
            if late_ms > TRIP_OUT_MS_LATE_MAX:
                raise StorageUnavailable(f"injected latency: the call's trip out took {late_ms:.0f} ms more than "
                                         "its delay (the node stalled): lost, not sent late")
        try:
            result = await call()
        except ValidationError:
            raise
        except StorageError:
            await self._back(delay_ms - out_ms)  # an error comes back from remote storage too
            raise
        await self._back(delay_ms - out_ms)
        return result

    @staticmethod
    async def _back(back_ms: float) -> None:
        if back_ms > 0:
            await asyncio.sleep(back_ms / 1000)

    async def log_once(
        self, log: LogId, txn: str, state: TxnState, body: RecordBody, fence: Fence | None = None
    ) -> LogOnceResult:
        return await self._answered(lambda: self.inner.log_once(log, txn, state, body, fence))

    async def log(
        self, log: LogId, txn: str, state: TxnState, body: RecordBody | None = None, fence: Fence | None = None
    ) -> TxnState:
        return await self._answered(lambda: self.inner.log(log, txn, state, body, fence))

    async def read(self, log: LogId, txn: str) -> Record | None:
        return await self._answered(lambda: self.inner.read(log, txn))

    async def scan_unfinished_page(self, log: LogId, limit: int = SCAN_PAGE_COUNT_MAX, after: str = "") -> ScanPage:
        return await self._answered(lambda: self.inner.scan_unfinished_page(log, limit, after))

    async def read_data(self, partition: str, keys: Sequence[str]) -> dict[str, bytes | None]:
        return await self._answered(lambda: self.inner.read_data(partition, keys))

    async def apply_redo(
        self, partition: str, txn: str, writes: Mapping[str, bytes | None], fence: Fence | None = None
    ) -> bool:
        return await self._answered(lambda: self.inner.apply_redo(partition, txn, writes, fence))

    async def delete(
        self, log: LogId, txn: str, fence: Fence | None = None, keep: Tombstone | None = None,
    ) -> bool:
        return await self._answered(lambda: self.inner.delete(log, txn, fence, keep))

    async def read_owners(self, partitions: Sequence[str]) -> dict[str, Ownership]:
        return await self._answered(lambda: self.inner.read_owners(partitions))

    async def write_owner(self, expected: Ownership | None, new: Ownership) -> OwnerWriteResult:
        return await self._answered(lambda: self.inner.write_owner(expected, new))

    async def list_identities(self, after: str = "", limit: int = IDENTITY_PAGE_COUNT_MAX) -> list[str]:
        return await self._answered(lambda: self.inner.list_identities(after, limit))
