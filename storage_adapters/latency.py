"""Injected storage latency: wrap any LogStore so each call's answer waits a sampled delay.

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
    SCAN_PAGE_COUNT_MAX,
    Fence,
    LogId,
    LogOnceResult,
    Ownership,
    OwnerWriteResult,
    Record,
    RecordBody,
    TxnState,
)
from storage_adapters.errors import StorageError, ValidationError
from storage_adapters.store import DelegatingStore, LogStore

T = TypeVar("T")

# A sampled delay never exceeds this: a lognormal tail must not stall a benchmark for minutes.
DELAY_MS_MAX = 10_000
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
    """A LogStore whose every answer comes a sample of `distribution` after the inner store gave
    it: the call itself leaves at once, so the lease check the effect runner makes as a write
    leaves, and the deadline storage holds the write to, are those of the call without the
    wrapper; the delay stands for the trip to remote storage and back, all of it on the answer's
    side (found by review: delayed before it left, a deposed owner's unfenced write went out
    after its lease ended, and a call landed up to the delay past its deadline). Bad input is
    refused at once, as without the wrapper: it never leaves the node."""

    def __init__(self, inner: LogStore, distribution: LatencyDistribution, seed: int | None = None) -> None:
        super().__init__(inner)
        self.distribution = distribution
        self._sample_ms = distribution.sampler(random.Random(seed))

    async def _delay(self) -> None:
        delay_ms = self._sample_ms()
        assert 0 <= delay_ms <= DELAY_MS_MAX
        if delay_ms > 0:
            await asyncio.sleep(delay_ms / 1000)

    async def _answered(self, call: Awaitable[T]) -> T:
        try:
            result = await call
        except ValidationError:
            raise
        except StorageError:
            await self._delay()  # an error comes back from remote storage too
            raise
        await self._delay()
        return result

    async def log_once(
        self, log: LogId, txn: str, state: TxnState, body: RecordBody, fence: Fence | None = None
    ) -> LogOnceResult:
        return await self._answered(self.inner.log_once(log, txn, state, body, fence))

    async def log(
        self, log: LogId, txn: str, state: TxnState, body: RecordBody | None = None, fence: Fence | None = None
    ) -> TxnState:
        return await self._answered(self.inner.log(log, txn, state, body, fence))

    async def read(self, log: LogId, txn: str) -> Record | None:
        return await self._answered(self.inner.read(log, txn))

    async def scan_unfinished(self, log: LogId, limit: int = SCAN_PAGE_COUNT_MAX, after: str = "") -> list[Record]:
        return await self._answered(self.inner.scan_unfinished(log, limit, after))

    async def read_data(self, partition: str, keys: Sequence[str]) -> dict[str, bytes | None]:
        return await self._answered(self.inner.read_data(partition, keys))

    async def apply_redo(
        self, partition: str, txn: str, writes: Mapping[str, bytes | None], fence: Fence | None = None
    ) -> bool:
        return await self._answered(self.inner.apply_redo(partition, txn, writes, fence))

    async def delete(self, log: LogId, txn: str, fence: Fence | None = None) -> bool:
        return await self._answered(self.inner.delete(log, txn, fence))

    async def read_owners(self, partitions: Sequence[str]) -> dict[str, Ownership]:
        return await self._answered(self.inner.read_owners(partitions))

    async def write_owner(self, expected: Ownership | None, new: Ownership) -> OwnerWriteResult:
        return await self._answered(self.inner.write_owner(expected, new))
