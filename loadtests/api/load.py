"""The load phase: every key of a workload's initial data written once before the clock starts
(the YCSB load, the TPC-C loader), so a measured run reads what the owners already hold. One
implementation for every driver: the built-in one loads over its raw HTTP with several loaders at
once (`load_async`), the Locust REST and gRPC users over theirs (`load`); each hands in how it
runs one one-shot transaction.

Each batch holds keys of one partition, so loading needs no commit protocol round, and is retried
(the same puts: idempotent) until it commits: right after start an owner may still be recovering
(`not_ready`), and a lost answer leaves a batch's outcome unknown.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Sequence

from cornus.runtime.keys import partition_of
from loadtests.workloads.base import Reply, Workload

Ops = tuple[dict[str, str], ...]

# Keys per load transaction: far under the node's op_count_max (1000), and enough that a load of
# tens of thousands of keys takes seconds.
LOAD_BATCH_KEY_COUNT_MAX = 200
# Attempts of one batch before the load gives up; with the pauses below that is several seconds,
# longer than an owner takes to finish recovering on the bench's storage deadline (2 s).
LOAD_ATTEMPT_COUNT_MAX = 20
# Pause before attempt n: uniform in [0, min(LOAD_PAUSE_S_MAX, LOAD_PAUSE_S_BASE * 2^n)], so
# concurrent loaders that collided do not collide again in step.
LOAD_PAUSE_S_BASE = 0.01
LOAD_PAUSE_S_MAX = 0.5


class LoadError(RuntimeError):
    """A batch did not commit within LOAD_ATTEMPT_COUNT_MAX attempts."""


def load_batches(workload: Workload) -> list[Ops]:
    """The workload's initial data as one-shot put batches, each within one partition."""
    data = workload.initial_data()
    by_partition: dict[str, list[str]] = {}
    for key in data:
        by_partition.setdefault(partition_of(key, workload.partition_count), []).append(key)
    return [tuple({"op": "put", "key": key, "value": data[key]} for key in keys[start:start + LOAD_BATCH_KEY_COUNT_MAX])
            for keys in by_partition.values() for start in range(0, len(keys), LOAD_BATCH_KEY_COUNT_MAX)]


def pause_s(rng: random.Random, attempt: int) -> float:
    return rng.uniform(0, min(LOAD_PAUSE_S_MAX, LOAD_PAUSE_S_BASE * 2 ** min(attempt, 16)))


def _failed(batch: Ops, reply: Reply) -> LoadError:
    return LoadError(f"load phase: a batch of {len(batch)} keys did not commit in {LOAD_ATTEMPT_COUNT_MAX} "
                     f"attempts (last: {reply.outcome} {reply.reason})")


def load(batches: Sequence[Ops], execute: Callable[[Ops], Reply], *, seed: int = 0,
         sleep: Callable[[float], None] = time.sleep) -> int:
    """Commit every batch with `execute` (one one-shot transaction, its Reply), one at a time.
    Returns how many keys were written; raises LoadError on a batch that never commits."""
    rng = random.Random(seed)
    written = 0
    for batch in batches:
        reply = Reply("failed", "not run")
        for attempt in range(LOAD_ATTEMPT_COUNT_MAX):
            reply = execute(batch)
            if reply.committed:
                written += len(batch)
                break
            sleep(pause_s(rng, attempt))
        else:
            raise _failed(batch, reply)
    return written


async def load_async(batches: Sequence[Ops], loaders: Sequence[Callable[[Ops], Awaitable[Reply]]]) -> int:
    """`load` with one concurrent loader per entry of `loaders` (each its own connection), taking
    batches from a shared queue."""
    queue = list(reversed(batches))

    async def loader(index: int, execute: Callable[[Ops], Awaitable[Reply]]) -> int:
        rng = random.Random(index)
        written = 0
        while queue:
            batch = queue.pop()
            reply = Reply("failed", "not run")
            for attempt in range(LOAD_ATTEMPT_COUNT_MAX):
                reply = await execute(batch)
                if reply.committed:
                    written += len(batch)
                    break
                await asyncio.sleep(pause_s(rng, attempt))
            else:
                raise _failed(batch, reply)
        return written

    counts = await asyncio.gather(*(loader(index, execute) for index, execute in enumerate(loaders)))
    return sum(counts)
