"""What a workload is, independent of the driver that runs it.

A transaction is a small program (a generator) that yields requests and receives the node's
replies: `Execute` (a one-shot transaction), or `Read` and `Write` inside an interactive
transaction, then `Commit`. The built-in driver (loadtests.bench.driver) sends them over raw
HTTP/1.1, the Locust users (loadtests.locust) over Locust's HTTP client or the public gRPC API; the
program neither knows nor cares. A program's Read may decide what it writes (TPC-C's NewOrder reads
the district's next order id and writes the order under it), which is why programs are generators
and not lists of operations.

Protocol of a program:
- the first request of an interactive transaction begins it (the driver sends the begin call);
- a Read or Write reply that is not `active` (the transaction aborted or failed) ends the program
  at once (the driver closes the generator: no code after that yield runs);
- the reply of Execute or Commit, whatever it is, is sent into the program, which then returns;
  code after it may keep score of committed work for the workload's end-of-run check.

Placement: a workload decides which partition holds each of its rows (YCSB round-robin, TPC-C by
warehouse), and the cluster hashes keys to partitions (cornus.runtime.keys). `pinned_key` bridges
the two: it appends the smallest suffix that makes a row's key hash to the partition chosen for it.
This module imports nothing that Locust's gevent patching could trip over (no redis, no boto3).
"""

from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cornus.runtime.keys import partition_of
from storage_adapters.errors import ValidationError

# What a reply says happened; "active" only answers Read and Write of a transaction still running.
OUTCOMES = ("committed", "aborted", "unavailable", "unknown", "failed", "active")
# Keys tried per row before giving up on pinning it (a partition is hit once per `count` tries on
# average; 64 partitions fail to be hit in 10,000 tries with probability below 1e-68).
PIN_ATTEMPT_COUNT_MAX = 10_000
# The node refuses requests of more operations than its op_count_max (default 1000); reads of the
# end-of-run checks go in batches of this many keys.
CHECK_BATCH_KEY_COUNT_MAX = 500


class WorkloadError(ValidationError):
    """A knob value the workload cannot run with; the message names the knob and its range (a
    ValidationError, so the CLI reports it as bad input, exit 2)."""


@dataclass(frozen=True, slots=True)
class Execute:
    """A one-shot transaction: REST-shaped ops (`{"op": "get"|"put"|"delete", "key", "value"}`)."""

    ops: tuple[dict[str, str], ...]


@dataclass(frozen=True, slots=True)
class Read:
    keys: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Write:
    writes: Mapping[str, str | None]


@dataclass(frozen=True, slots=True)
class Commit:
    pass


Request = Execute | Read | Write | Commit


@dataclass(slots=True)
class Reply:
    outcome: str  # one of OUTCOMES
    reason: str = ""  # the API's abort reason or error code, or the transport's exception
    retryable: bool = False
    values: dict[str, str | None] = field(default_factory=dict)  # reads of Read and Execute
    timing_ms: dict[str, float] = field(default_factory=dict)  # the node's commit-path breakdown
    txn: str = ""  # the id a begin answered with (loadtests.api.exchange)

    @property
    def committed(self) -> bool:
        return self.outcome == "committed"


Program = Generator[Request, Reply, None]


@dataclass(frozen=True, slots=True)
class Txn:
    """One transaction as the workload drew it. `program()` makes a fresh run of it, so a driver
    can run the very same transaction again after a retryable abort."""

    kind: str  # e.g. "ycsb", "new_order", "payment", "transfer", "audit"
    home: str  # the partition whose owner should coordinate it (the paper's home node)
    partitions: frozenset[str]  # every partition it touches
    read_only: bool
    program: Callable[[], Program]

    @property
    def distributed(self) -> bool:
        """The paper's distributed transaction: it touches more than one partition."""
        return len(self.partitions) > 1


def one_shot(ops: Sequence[dict[str, str]]) -> Callable[[], Program]:
    frozen = tuple(ops)

    def program() -> Program:
        yield Execute(frozen)

    return program


class KeyPinner:
    """Keys that hash to the partition a workload chose for them, remembered once found."""

    def __init__(self, partition_count: int) -> None:
        assert partition_count > 0
        self.partition_count = partition_count
        self._keys: dict[tuple[str, int], str] = {}

    def key(self, row: str, partition: int) -> str:
        found = self._keys.get((row, partition))
        if found is not None:
            return found
        target = f"p{partition}"
        for suffix in range(PIN_ATTEMPT_COUNT_MAX):
            key = f"{row}~{suffix}"
            if partition_of(key, self.partition_count) == target:
                self._keys[(row, partition)] = key
                return key
        raise RuntimeError(f"no key for row {row} hashes to {target} in {PIN_ATTEMPT_COUNT_MAX} tries")


class Zipf:
    """Zipfian ranks in 0..n-1 with skew `theta` in [0, 1), by the method of Gray et al., "Quickly
    generating billion-record synthetic databases" (SIGMOD 1994), as YCSB and the paper's Sundial
    testbed draw keys; theta 0 is uniform."""

    def __init__(self, n: int, theta: float) -> None:
        if n < 2:
            raise WorkloadError(f"a Zipfian range needs at least 2 items, got {n}")
        if not 0 <= theta < 1:
            raise WorkloadError(f"theta must be in [0, 1), got {theta}")
        self.n = n
        self.theta = theta
        self.zeta_n = sum(1.0 / (i ** theta) for i in range(1, n + 1))
        zeta_2 = 1.0 + 0.5 ** theta
        self.alpha = 1.0 / (1.0 - theta)
        self.eta = (1.0 - (2.0 / n) ** (1.0 - theta)) / (1.0 - zeta_2 / self.zeta_n)
        self.half_pow_theta = 0.5 ** theta

    def next(self, rng: random.Random) -> int:
        if self.theta == 0:
            return rng.randrange(self.n)
        u = rng.random()
        uz = u * self.zeta_n
        if uz < 1.0:
            return 0
        if uz < 1.0 + self.half_pow_theta:
            return 1
        return min(self.n - 1, int(self.n * (self.eta * u - self.eta + 1.0) ** self.alpha))


@dataclass(frozen=True, slots=True)
class DataSize:
    keys: int
    formula: str  # what makes that many, in the knobs' names: "10,000 rows_per_partition x 3 partitions"


class Workload(ABC):
    """One benchmark workload over a cluster of `partition_count` partitions. Drivers call
    `initial_data` once (the load phase), `next_txn` for every transaction, and `check` at the end.
    Instances are shared by every client of one driver process (asyncio tasks or gevent
    greenlets: cooperative, so the counters need no lock)."""

    name = "workload"

    def __init__(self, partition_count: int) -> None:
        if partition_count < 1:
            raise WorkloadError(f"a workload needs at least one partition, got {partition_count}")
        self.partition_count = partition_count
        self.pinner = KeyPinner(partition_count)

    @abstractmethod
    def initial_data(self) -> dict[str, str]:
        """Every key the run expects to exist, with its first value (loaded before the clock starts)."""

    @abstractmethod
    def data_size(self) -> DataSize:
        """How many keys initial_data() holds, and what makes that many, without building it."""

    @abstractmethod
    def next_txn(self, rng: random.Random, client: int) -> Txn:
        """The next transaction of client number `client` (clients are numbered from 0)."""

    def check(self, read: Callable[[Sequence[str]], dict[str, str | None]]) -> list[str]:
        """Violations of the workload's invariants after the run (empty: none); `read` returns the
        committed values of the keys it is given."""
        return []

    def describe(self) -> dict[str, Any]:
        """The knobs this instance runs with, for the report."""
        return {}

    def home_partition(self, client: int) -> int:
        return client % self.partition_count


def read_in_batches(read: Callable[[Sequence[str]], dict[str, str | None]],
                    keys: Sequence[str]) -> dict[str, str | None]:
    values: dict[str, str | None] = {}
    for start in range(0, len(keys), CHECK_BATCH_KEY_COUNT_MAX):
        values.update(read(keys[start:start + CHECK_BATCH_KEY_COUNT_MAX]))
    return values


def parse_knobs(text: str) -> dict[str, str]:
    """`name=value,name=value` -> a dict (for knobs given as one string, e.g. by Locust's
    environment variable); empty text is no knobs."""
    knobs: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise WorkloadError(f"knob {item!r}: expected NAME=VALUE")
        knobs[name.strip()] = value.strip()
    return knobs


def knob_float(knobs: Mapping[str, object], name: str, default: float, low: float, high: float) -> float:
    """A finite number within [low, high], with an error that names the knob."""
    raw = knobs.get(name, default)
    try:
        value = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise WorkloadError(f"{name} must be a number in [{low:g}, {high:g}], got {raw!r}") from None
    if not math.isfinite(value) or not low <= value <= high:
        raise WorkloadError(f"{name} must be a number in [{low:g}, {high:g}], got {raw!r}")
    return value


def knob_int(knobs: Mapping[str, object], name: str, default: int, low: int, high: int) -> int:
    raw = knobs.get(name, default)
    if isinstance(raw, bool):
        raise WorkloadError(f"{name} must be an integer in {low}..{high}, got {raw!r}")
    try:
        value = int(raw)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise WorkloadError(f"{name} must be an integer in {low}..{high}, got {raw!r}") from None
    if isinstance(raw, float) and raw != value:
        raise WorkloadError(f"{name} must be an integer in {low}..{high}, got {raw!r}")
    if not low <= value <= high:
        raise WorkloadError(f"{name} must be an integer in {low}..{high}, got {raw!r}")
    return value


def refuse_unknown(knobs: Mapping[str, object], known: set[str], workload: str) -> None:
    unknown = sorted(set(knobs) - known)
    if unknown:
        raise WorkloadError(f"{workload} has no knob {', '.join(unknown)}; its knobs: {', '.join(sorted(known))}")
