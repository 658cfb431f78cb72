"""Redis group commit (storage_adapters/redis_batch.py) against a real Redis: calls that queue
behind a round trip in flight go out as one pipeline, and every caller still gets exactly its
own answer; LogOnce stays a compare-and-swap whatever the batching."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from storage_adapters.contract import LogId, Ownership, RecordBody, TxnState
from storage_adapters.errors import DecisionFlipRefused, Fenced, StorageUnavailable
from storage_adapters.redis_store import CONNECTION_COUNT_MAX, RedisStore
from tests.conftest import Services
from tests.storage.conftest import TIMEOUT_MS_CALL_TEST
from tests.worker import free_port

RACER_COUNT = 60
# Well past the connection pool, so a pool that refused instead of waiting would fail calls.
BURST_COUNT = 5 * CONNECTION_COUNT_MAX
SILENT_TIMEOUT_MS = 500
DEADLINE_SLACK_S = 3.0


def body(partition: str) -> RecordBody:
    return RecordBody((partition,), "node-0", b"redo")


@pytest.fixture
async def stores(services: Services) -> AsyncIterator[tuple[RedisStore, RedisStore]]:
    first = await RedisStore.open(services.redis_url, timeout_ms_call=TIMEOUT_MS_CALL_TEST)
    second = await RedisStore.open(services.redis_url, timeout_ms_call=TIMEOUT_MS_CALL_TEST)
    try:
        yield first, second
    finally:
        await first.close()
        await second.close()


async def test_racing_log_once_creates_exactly_one_record(stores: tuple[RedisStore, RedisStore], ns: str) -> None:
    first, second = stores
    log = LogId.partition(f"{ns}-p")
    txn = f"{ns}.t"
    trips_before = first._batcher.round_trip_count
    states = [TxnState.VOTE_YES if index % 2 else TxnState.ABORT for index in range(RACER_COUNT)]
    results = await asyncio.gather(*(
        (first if index % 2 else second).log_once(log, txn, state, body(log.name))
        for index, state in enumerate(states)
    ))
    created = [result for result in results if result.created]
    assert len(created) == 1, results
    assert {result.state for result in results} == {created[0].state}
    record = await first.read(log, txn)
    assert record is not None and record.state is created[0].state
    # The racers of one store went in fewer round trips than calls: they were batched.
    assert first._batcher.round_trip_count - trips_before < RACER_COUNT // 2


async def test_each_caller_of_a_batch_gets_its_own_answer(stores: tuple[RedisStore, RedisStore], ns: str) -> None:
    store, _ = stores
    partition = f"{ns}-p"
    log = LogId.partition(partition)
    await store.log(log, f"{ns}.committed", TxnState.COMMIT, body(partition))
    first_owner = Ownership(partition, "n1", 1, 1, 10_000, "")
    assert (await store.write_owner(None, first_owner)).written
    owner = Ownership(partition, "n2", 2, 2, 10_000, "")  # n2 took it: n1's fence is stale
    assert (await store.write_owner(first_owner, owner)).written
    stale = first_owner.fence()
    trips_before = store._batcher.round_trip_count
    outcomes = await asyncio.gather(
        store.log_once(log, f"{ns}.first", TxnState.VOTE_YES, body(partition)),  # goes alone
        store.log(log, f"{ns}.committed", TxnState.ABORT),  # refused: a decision never flips
        store.log_once(log, f"{ns}.new", TxnState.VOTE_YES, body(partition), owner.fence()),
        store.log_once(log, f"{ns}.fenced", TxnState.VOTE_YES, body(partition), stale),  # refused: old epoch
        store.log(log, f"{ns}.decided", TxnState.COMMIT, body(partition)),
        return_exceptions=True,
    )
    assert store._batcher.round_trip_count - trips_before == 2  # the first alone, the rest in one pipeline
    first, flipped, new, fenced, decided = outcomes
    assert not isinstance(first, BaseException) and first.created
    assert isinstance(flipped, DecisionFlipRefused)
    assert not isinstance(new, BaseException) and new.created
    assert isinstance(fenced, Fenced)
    assert decided is TxnState.COMMIT
    assert (await store.read(log, f"{ns}.committed")).state is TxnState.COMMIT  # type: ignore[union-attr]
    assert await store.read(log, f"{ns}.fenced") is None
    assert (await store.read(log, f"{ns}.decided")).state is TxnState.COMMIT  # type: ignore[union-attr]


async def test_a_batch_after_redis_lost_its_scripts(stores: tuple[RedisStore, RedisStore], ns: str,
                                                    services: Services) -> None:
    store, _ = stores
    log = LogId.partition(f"{ns}-p")
    admin = aioredis.Redis.from_url(services.redis_url)
    try:
        await admin.script_flush()
    finally:
        await admin.aclose()
    trips_before = store._batcher.round_trip_count
    # The call that goes alone reloads only its own script (delete); the log_once calls queued
    # behind it meet NOSCRIPT inside the pipeline.
    deleted, *results = await asyncio.gather(store.delete(log, f"{ns}.absent"), *(
        store.log_once(log, f"{ns}.t{index}", TxnState.VOTE_YES, body(log.name)) for index in range(10)
    ))
    assert deleted is False
    assert all(result.created for result in results)
    assert store._batcher.round_trip_count - trips_before == 2
    for index in range(10):
        assert (await store.read(log, f"{ns}.t{index}")) is not None


async def test_a_burst_past_the_connection_pool_waits_instead_of_failing(
    stores: tuple[RedisStore, RedisStore], ns: str
) -> None:
    """Recovery once collected thousands of old records at once and every call beyond the pool
    failed with "Too many connections"; a burst now waits for connections within its deadline."""
    store, _ = stores
    log = LogId.partition(f"{ns}-p")
    records = await asyncio.gather(*(store.read(log, f"{ns}.absent{index}") for index in range(BURST_COUNT)))
    assert records == [None] * BURST_COUNT


async def test_every_caller_of_a_batch_hears_of_a_silent_redis_within_its_deadline() -> None:
    """A server that accepts connections and never answers: every caller, the one in flight and
    those queued behind it, gets StorageUnavailable at about its deadline."""
    port = free_port()
    accepted: list[asyncio.StreamWriter] = []

    async def silent(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)

    server = await asyncio.start_server(silent, "127.0.0.1", port)
    client = aioredis.Redis.from_url(f"redis://127.0.0.1:{port}/0", socket_timeout=SILENT_TIMEOUT_MS / 1000)
    store = RedisStore(client, SILENT_TIMEOUT_MS)
    log = LogId.partition("silent-p")
    started = time.monotonic()
    try:
        outcomes = await asyncio.gather(*(
            store.log_once(log, f"silent.t{index}", TxnState.VOTE_YES, body(log.name)) for index in range(5)
        ), return_exceptions=True)
    finally:
        await store.close()
        for writer in accepted:
            writer.close()
        server.close()
    assert all(isinstance(outcome, StorageUnavailable) for outcome in outcomes), outcomes
    assert time.monotonic() - started < SILENT_TIMEOUT_MS / 1000 + DEADLINE_SLACK_S
