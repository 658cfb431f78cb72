"""The built-in closed-loop driver: `clients` concurrent clients on one asyncio loop (uvloop), each
with a keep-alive HTTP/1.1 connection to every node, each running the workload's next transaction
as soon as its previous one ended, for a fixed time.

As in the paper's testbed, a client sends each transaction to its home node (the owner of the
transaction's home partition), and a transaction aborted for a retryable reason (a lock conflict
under NO_WAIT, a node still recovering) runs again, the same transaction, after a short random
pause, until it commits or the clock runs out; its latency runs from its first attempt to its
commit, so under contention it includes the time lost to aborts (the paper's Figure 7); that
time (from the first attempt's start to the last one's) is kept apart too, since the node's own
breakdown is the last attempt's only. Every attempt is counted, so the abort rate is aborted
attempts over attempts; an attempt belongs to the window (warm-up or measured) of the start of its
transaction, as a commit does.

The driver measures its own CPU time (this process's clock) so a reader can tell whether it, not
the cluster, was the bottleneck; and it runs the caller's `on_warmup` at the warm-up boundary, so
the caller can snapshot the nodes' counters there and charge to the measured commits only the work
done in the measured window.
"""

from __future__ import annotations

import asyncio
import functools
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

from loadtests.api.load import load_async, load_batches
from loadtests.bench.http import HttpConnection, run_program
from loadtests.workloads.base import Reply, Workload, one_shot

# Pause before running an aborted transaction again: uniform in [0, min(cap, base * 2^attempt)].
RETRY_PAUSE_MS_BASE = 0.5
RETRY_PAUSE_MS_MAX = 10.0
# Attempts of one transaction before the driver gives up on it (counted as not committed).
ATTEMPT_COUNT_MAX = 1_000
# After a failure the node is probably down: do not spin on it.
FAILURE_PAUSE_S = 0.01
# Program errors (a workload bug, or data that breaks its assumptions) kept for the report.
ERROR_COUNT_MAX = 5
# Distinct (outcome, reason) pairs of attempts that did not commit, counted for the report; the
# reasons are the API's short codes, but a node could send anything, so the rest go under "other".
NOT_COMMITTED_KIND_COUNT_MAX = 32
# Transactions kept for the latency figures. A run may last an hour at thousands of commits a
# second: a record each would grow without bound, so past this many a uniform sample of them is
# kept (reservoir sampling), whose averages and percentiles stand for all; counts stay exact.
TXN_RECORD_COUNT_MAX = 200_000
_RETRYABLE = ("aborted", "unavailable")


@dataclass(slots=True)
class TxnRecord:
    """One transaction, after its last attempt."""

    kind: str
    distributed: bool
    read_only: bool
    outcome: str
    reason: str
    attempts: int
    started_s: float  # since the run's start
    latency_ms: float  # first attempt's start to the last attempt's answer
    timing_ms: dict[str, float]  # the node's breakdown of the last attempt (execution, prepare, commit, total)
    # First attempt's start to the last attempt's start: the time lost to the aborted attempts and
    # the pauses between them, which no phase of timing_ms holds.
    retry_ms: float = 0.0


@dataclass(slots=True)
class DriverResult:
    records: list[TxnRecord] = field(default_factory=list)  # every transaction, or a uniform sample of them
    record_count: int = 0  # transactions ended, whether or not records keeps them
    # Committed transactions by (kind, distributed, read_only, started after warmup_s): exact.
    commits: Counter[tuple[str, bool, bool, bool]] = field(default_factory=Counter)
    # Attempts by (kind, their transaction started after warmup_s): exact.
    attempts: Counter[tuple[str, bool]] = field(default_factory=Counter)
    aborted_attempts: Counter[tuple[str, bool]] = field(default_factory=Counter)
    # Attempts that did not commit, by "outcome:reason" (aborted:conflict, unavailable:..., failed:...):
    # a run that commits little says why.
    not_committed: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    cpu_s: float = 0.0  # this process's CPU time over the run
    measured_cpu_s: float = 0.0  # the same from the warm-up boundary to the end (the measured window)
    warmup_s: float = 0.0  # the start of the run left out of the figures

    def count_not_committed(self, reply: Reply) -> None:
        kind = f"{reply.outcome}:{reply.reason or '-'}"
        if kind not in self.not_committed and len(self.not_committed) >= NOT_COMMITTED_KIND_COUNT_MAX:
            kind = "other"
        self.not_committed[kind] += 1

    def add(self, record: TxnRecord, rng: random.Random) -> None:
        """Count `record` and keep it, or past TXN_RECORD_COUNT_MAX keep it in place of a kept one
        with the odds that leave every transaction equally likely kept (Algorithm R)."""
        if record.outcome == "committed":
            self.commits[record.kind, record.distributed, record.read_only, record.started_s >= self.warmup_s] += 1
        self.record_count += 1
        if len(self.records) < TXN_RECORD_COUNT_MAX:
            self.records.append(record)
        else:
            slot = rng.randrange(self.record_count)
            if slot < len(self.records):
                self.records[slot] = record

    def committed(self, *, measured: bool | None = None, distributed: bool | None = None,
                  read_only: bool | None = None, kind: str | None = None) -> int:
        """Committed transactions that match every condition given (measured: started after warmup_s)."""
        return sum(count for (k, d, r, m), count in self.commits.items()
                   if (kind is None or k == kind) and (distributed is None or d == distributed)
                   and (read_only is None or r == read_only) and (measured is None or m == measured))

    def attempted(self, *, measured: bool | None = None, kind: str | None = None) -> int:
        """Attempts whose transaction matches every condition given (measured: started after warmup_s)."""
        return _count(self.attempts, measured, kind)

    def aborted(self, *, measured: bool | None = None, kind: str | None = None) -> int:
        """Aborted attempts whose transaction matches every condition given."""
        return _count(self.aborted_attempts, measured, kind)

    def kinds(self) -> list[str]:
        """Every kind of transaction attempted, by name."""
        return sorted({kind for kind, _ in self.attempts})


def _count(counts: Counter[tuple[str, bool]], measured: bool | None, kind: str | None) -> int:
    return sum(count for (k, m), count in counts.items()
               if (kind is None or k == kind) and (measured is None or m == measured))


def _retry_pause_s(rng: random.Random, attempt: int) -> float:
    return rng.uniform(0, min(RETRY_PAUSE_MS_MAX, RETRY_PAUSE_MS_BASE * 2 ** min(attempt, 16))) / 1000


async def run_clients(addresses: Sequence[tuple[str, int]], workload: Workload, *, seconds: float, clients: int,
                      home: Mapping[str, int] | None = None, seed: int = 0, warmup_s: float = 0.0,
                      on_warmup: Callable[[], Awaitable[None]] | None = None) -> DriverResult:
    """Run `clients` closed-loop clients for `seconds`. `home` maps a partition to the index in
    `addresses` of the node that owns it; a transaction whose home partition it does not name goes
    to a node picked at random. Transactions started in the first `warmup_s` are counted apart, and
    `on_warmup` is awaited once at that boundary, on this loop, while the clients run on."""
    result = DriverResult(warmup_s=warmup_s)
    sampler = random.Random(f"{seed}/records")
    started = time.monotonic()
    stop_at = started + seconds
    cpu_at_warmup: list[float] = []

    async def boundary() -> None:
        await asyncio.sleep(max(0.0, started + warmup_s - time.monotonic()))
        if on_warmup is not None:
            await on_warmup()
        # After the caller's snapshot, as the run's end is after its last one: the bench's own
        # scraping is charged to neither window.
        cpu_at_warmup.append(time.process_time())

    async def client(index: int) -> None:
        rng = random.Random(f"{seed}/{index}")
        connections = [HttpConnection(host, port) for host, port in addresses]
        try:
            while time.monotonic() < stop_at:
                txn = workload.next_txn(rng, index)
                target = home.get(txn.home) if home else None
                connection = connections[rng.randrange(len(connections)) if target is None else target]
                first = last = time.perf_counter()
                started_s = time.monotonic() - started
                measured = started_s >= warmup_s
                reply = Reply("failed", "not run")
                attempts = 0
                while attempts < ATTEMPT_COUNT_MAX:
                    attempts += 1
                    result.attempts[txn.kind, measured] += 1
                    if attempts > 1:
                        last = time.perf_counter()
                    try:
                        reply = await run_program(connection, txn.program())
                    except Exception as error:
                        # A workload program that raised: keep the first few for the report.
                        reply = Reply("failed", f"program error: {type(error).__name__}")
                        if len(result.errors) < ERROR_COUNT_MAX:
                            result.errors.append(f"{txn.kind}: {type(error).__name__}: {error}")
                    if reply.outcome == "aborted":
                        result.aborted_attempts[txn.kind, measured] += 1
                    if reply.outcome != "committed":
                        result.count_not_committed(reply)
                    if reply.outcome not in _RETRYABLE or not reply.retryable or time.monotonic() >= stop_at:
                        break
                    await asyncio.sleep(_retry_pause_s(rng, attempts))
                latency_ms = (time.perf_counter() - first) * 1000
                result.add(TxnRecord(txn.kind, txn.distributed, txn.read_only, reply.outcome, reply.reason, attempts,
                                     started_s, latency_ms, reply.timing_ms, retry_ms=(last - first) * 1000), sampler)
                if reply.outcome in ("failed", "unknown"):
                    await asyncio.sleep(FAILURE_PAUSE_S)
        finally:
            for connection in connections:
                connection.close()

    cpu_before = time.process_time()
    await asyncio.gather(boundary(), *(client(i) for i in range(clients)))
    cpu_after = time.process_time()
    result.cpu_s = cpu_after - cpu_before
    result.measured_cpu_s = cpu_after - cpu_at_warmup[0]
    result.wall_s = time.monotonic() - started
    return result


# === load phase and end-of-run reads ==============================================================

# Loaders of the load phase at once: enough to keep every node of a bench cluster busy.
LOAD_CONCURRENCY = 8
# An end-of-run read conflicts only with transactions still finishing, but on slow storage a
# partition's lease may have lapsed as the run ended (a renewal that outlasted its deadline), and
# it is served again only once taken again: after lease_ms + clock_slack_ms + failover_delay_ms,
# about 10 s by default. So the read retries for longer than that, with pauses of up to
# READ_PAUSE_MS_MAX, and at most READ_ATTEMPT_COUNT_MAX times.
READ_DEADLINE_S = 30.0
READ_PAUSE_MS_MAX = 250.0
READ_ATTEMPT_COUNT_MAX = 400


async def load_data(addresses: Sequence[tuple[str, int]], workload: Workload) -> int:
    """The load phase (loadtests.api.load) of `workload` over the nodes at `addresses`, with
    LOAD_CONCURRENCY loaders spread over them. Returns how many keys were written."""
    connections = [HttpConnection(*addresses[index % len(addresses)]) for index in range(LOAD_CONCURRENCY)]
    try:
        return await load_async(load_batches(workload),
                                [functools.partial(_one_shot, connection) for connection in connections])
    finally:
        for connection in connections:
            connection.close()


async def _one_shot(connection: HttpConnection, ops: tuple[dict[str, str], ...]) -> Reply:
    return await run_program(connection, one_shot(ops)())


async def read_keys(address: tuple[str, int], keys: Sequence[str]) -> dict[str, str | None]:
    """The committed values of `keys`, in one read-only transaction, retried while it conflicts
    with transactions still finishing (the end-of-run check reads after the clients stopped)."""
    connection = HttpConnection(*address)
    rng = random.Random(0)
    try:
        ops = tuple({"op": "get", "key": key} for key in keys)
        reply = Reply("failed", "not run")
        deadline = time.monotonic() + READ_DEADLINE_S
        for attempt in range(READ_ATTEMPT_COUNT_MAX):
            reply = await _one_shot(connection, ops)
            if reply.committed:
                return dict(reply.values)
            pause_s = rng.uniform(0, min(READ_PAUSE_MS_MAX, RETRY_PAUSE_MS_BASE * 2 ** min(attempt + 4, 16))) / 1000
            if time.monotonic() + pause_s > deadline:
                break
            await asyncio.sleep(pause_s)
        raise RuntimeError(f"end-of-run read of {len(keys)} keys did not commit within {READ_DEADLINE_S:g} s "
                           f"(last: {reply.outcome} {reply.reason})")
    finally:
        connection.close()
