"""The Redis store's finished index (`cxtxn:{<log>}:~finished`, storage_adapters/redis_store.py),
which `scan_finished_page` reads: after every transition a record is a member exactly when it is
finished (a partition's ABORT or applied COMMIT, a coordinator's ABORT) and not a tombstone, on the
pipelined connection and through redis-py, fenced or not; and a scan skips and prunes the members
a path that did not keep the index in step left behind. The conformance of the scan itself, on
every backend, is tests/storage/test_scan_finished.py."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
from redis.crc import key_slot

from storage_adapters import redis_store
from storage_adapters.contract import SCAN_ROUND_COUNT_MAX, Fence, LogId, Ownership, RecordBody, Tombstone, TxnState
from storage_adapters.errors import DecisionFlipRefused
from storage_adapters.redis_store import RedisStore
from tests.conftest import Services
from tests.storage.conftest import TIMEOUT_MS_CALL_TEST

VOTE, COMMIT, ABORT = TxnState.VOTE_YES, TxnState.COMMIT, TxnState.ABORT
KEEP_MS = 600_000
# A walk of a log is followed for at most this many pages.
PAGE_COUNT_MAX = 50


def _body(ns: str) -> RecordBody:
    return RecordBody((ns,), "node-0", b"redo")


@pytest.fixture(params=["pipe", "redis-py"])
async def store(request: pytest.FixtureRequest, services: Services) -> AsyncIterator[RedisStore]:
    """A Redis store whose scripts go over its pipelined connection, or through redis-py (what a
    TLS or Unix-socket URL gets): two paths that build the same KEYS."""
    opened = await RedisStore.open(services.redis_url, timeout_ms_call=TIMEOUT_MS_CALL_TEST)
    if request.param == "redis-py":
        if opened._pipe is not None:
            await opened._pipe.close()
        opened._pipe = None
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture
async def client(services: Services) -> AsyncIterator[aioredis.Redis]:
    connection = aioredis.Redis.from_url(services.redis_url, socket_timeout=5)
    try:
        yield connection
    finally:
        await connection.aclose()


async def _indexes(client: aioredis.Redis, log: LogId, txn: str) -> tuple[bool, bool]:
    """Whether `txn` is in `log`'s (finished, unfinished) index."""
    finished = await client.zscore(redis_store._finished_key(log), txn)
    unfinished = await client.zscore(redis_store._index_key(log), txn)
    return finished is not None, unfinished is not None


async def _finished_txns(store: RedisStore, log: LogId, limit: int = 100) -> list[str]:
    txns: list[str] = []
    after = ""
    for _ in range(PAGE_COUNT_MAX):
        page = await store.scan_finished_page(log, limit, after)
        txns += [record.txn for record in page.records]
        if page.resume_after is None:
            return txns
        after = page.resume_after
    pytest.fail(f"the finished scan of {log.key} did not end within {PAGE_COUNT_MAX} pages")


async def _fence(store: RedisStore, partition: str) -> Fence:
    owner = Ownership(partition, "n1", 1, 1, 10_000)
    assert (await store.write_owner(None, owner)).written
    return owner.fence()


@pytest.mark.parametrize("fenced", [False, True])
async def test_a_commit_joins_the_index_once_applied_and_leaves_it_as_a_tombstone(
    store: RedisStore, client: aioredis.Redis, ns: str, fenced: bool
) -> None:
    log = LogId.partition(ns)
    fence = await _fence(store, ns) if fenced else None
    await store.log_once(log, "c", VOTE, _body(ns), fence)
    assert await _indexes(client, log, "c") == (False, True)
    await store.log(log, "c", COMMIT, fence=fence)
    assert await _indexes(client, log, "c") == (False, True), "a COMMIT not applied is unfinished"
    assert await store.apply_redo(ns, "c", {"k": b"v"}, fence)
    assert await _indexes(client, log, "c") == (True, False)
    assert not await store.apply_redo(ns, "c", {"k": b"v"}, fence)  # applied before: nothing moves
    assert await _indexes(client, log, "c") == (True, False)
    assert await store.log(log, "c", COMMIT, fence=fence) is COMMIT  # its own decision again
    assert await _indexes(client, log, "c") == (True, False)
    assert await _finished_txns(store, log) == ["c"]
    assert await store.delete(log, "c", fence, keep=Tombstone(COMMIT, KEEP_MS))
    assert await _indexes(client, log, "c") == (False, False)
    # A rewrite of a tombstone's own decision keeps its expiry: still a tombstone, still out.
    assert await store.log(log, "c", COMMIT, _body(ns), fence) is COMMIT
    assert await _indexes(client, log, "c") == (False, False)
    assert await _finished_txns(store, log) == []


async def test_the_finished_index_shares_its_log_s_slot(store: RedisStore, client: aioredis.Redis, ns: str) -> None:
    """Beside `~unfinished`, in the slot of the log's records: every script that keeps it runs on
    Redis Cluster."""
    for log in (LogId.partition(ns), LogId.coordinator(ns)):
        await store.log_once(log, "a", ABORT, _body(ns))
        finished_key = redis_store._finished_key(log)
        assert finished_key == f"cxtxn:{{{log.key}}}:~finished"
        assert await client.exists(finished_key)
        assert key_slot(finished_key.encode()) == key_slot(redis_store._record_key(log, "a").encode())


async def test_a_vote_applied_at_once_joins_the_index(store: RedisStore, client: aioredis.Redis, ns: str) -> None:
    """The participant's one-step COMMIT (apply_redo over its own VOTE_YES): the hot path."""
    log = LogId.partition(ns)
    await store.log_once(log, "v", VOTE, _body(ns))
    assert await store.apply_redo(ns, "v", {"k": b"v"})
    assert await _indexes(client, log, "v") == (True, False)


@pytest.mark.parametrize("fenced", [False, True])
async def test_an_abort_joins_the_index_and_leaves_it_as_a_tombstone(
    store: RedisStore, client: aioredis.Redis, ns: str, fenced: bool
) -> None:
    log = LogId.partition(ns)
    fence = await _fence(store, ns) if fenced else None
    await store.log_once(log, "a", VOTE, _body(ns), fence)
    await store.log(log, "a", ABORT, fence=fence)
    assert await _indexes(client, log, "a") == (True, False)
    # A terminator's LogOnce(ABORT) into an empty slot, and one that finds the ABORT.
    assert (await store.log_once(log, "b", ABORT, _body(ns), fence)).created
    assert not (await store.log_once(log, "a", ABORT, _body(ns), fence)).created
    assert await _indexes(client, log, "b") == (True, False)
    assert await _finished_txns(store, log) == ["a", "b"]
    await store.delete(log, "a", fence, keep=Tombstone(ABORT, KEEP_MS))
    assert await _indexes(client, log, "a") == (False, False)
    # A tombstone where there was no record is never indexed either.
    assert not await store.delete(log, "z", fence, keep=Tombstone(ABORT, KEEP_MS))
    assert await _indexes(client, log, "z") == (False, False)
    assert await _finished_txns(store, log) == ["b"]


async def test_a_refused_tombstone_leaves_the_index_as_it_was(
    store: RedisStore, client: aioredis.Redis, ns: str
) -> None:
    log = LogId.partition(ns)
    await store.log_once(log, "a", ABORT, _body(ns))
    with pytest.raises(DecisionFlipRefused):
        await store.delete(log, "a", keep=Tombstone(COMMIT, KEEP_MS))
    assert await _indexes(client, log, "a") == (True, False)


@pytest.mark.parametrize("state", [VOTE, ABORT, COMMIT])
async def test_a_plain_delete_leaves_both_indexes(
    store: RedisStore, client: aioredis.Redis, ns: str, state: TxnState
) -> None:
    log = LogId.partition(ns)
    await store.log_once(log, "d", state, _body(ns))
    if state is COMMIT:
        await store.apply_redo(ns, "d", {"k": b"v"})
    assert await _indexes(client, log, "d") == (state is not VOTE, state is VOTE)
    assert await store.delete(log, "d")
    assert await _indexes(client, log, "d") == (False, False)


async def test_a_coordinator_log_indexes_its_aborts_and_never_its_commits(
    store: RedisStore, client: aioredis.Redis, ns: str
) -> None:
    log = LogId.coordinator(ns)
    await store.log_once(log, "c", VOTE, _body(ns))
    await store.log(log, "c", COMMIT)
    await store.log(log, "a", ABORT, _body(ns))  # a `log` that creates the record
    assert await _indexes(client, log, "c") == (False, True)
    assert await _indexes(client, log, "a") == (True, False)
    # A COMMIT tombstone over a COMMIT never applied reads applied, yet has an expiry: out.
    await store.delete(log, "c", keep=Tombstone(COMMIT, KEEP_MS))
    assert await _indexes(client, log, "c") == (False, False)
    assert await _finished_txns(store, log) == ["a"]


async def test_a_scan_skips_and_prunes_members_a_path_left_stale(
    store: RedisStore, client: aioredis.Redis, ns: str
) -> None:
    """Members whose record is gone (deleted by a script that knew no finished index), a
    tombstone or unfinished: left out of the page, which is refilled past them, and pruned; the
    records that are finished stay."""
    log = LogId.partition(ns)
    for txn in ("f1", "f2", "f3"):
        await store.log_once(log, txn, ABORT, _body(ns))
    await store.log_once(log, "v", VOTE, _body(ns))
    await store.log_once(log, "t", ABORT, _body(ns))
    finished_key = redis_store._finished_key(log)
    await client.delete(redis_store._record_key(log, "f2"))  # gone behind the index's back
    await client.pexpire(redis_store._record_key(log, "t"), KEEP_MS)  # a tombstone so
    await client.zadd(finished_key, {"e0": 0, "v": 0})  # no record; and one unfinished
    page = await store.scan_finished_page(log, 2)
    assert [record.txn for record in page.records] == ["f1", "f3"]
    assert page.resume_after == "f3"
    assert await _finished_txns(store, log) == ["f1", "f3"]
    members = [member.decode() for member in await client.zrange(finished_key, 0, -1)]
    assert members == ["f1", "f3"]


async def test_more_stale_members_than_a_page_s_rounds_give_a_short_page_that_moves_on(
    store: RedisStore, client: aioredis.Redis, ns: str
) -> None:
    log = LogId.partition(ns)
    await store.log_once(log, "z", ABORT, _body(ns))
    finished_key = redis_store._finished_key(log)
    stale = {f"e{i:02}": 0 for i in range(SCAN_ROUND_COUNT_MAX + 1)}
    await client.zadd(finished_key, stale)
    page = await store.scan_finished_page(log, 1)
    assert page.records == () and page.resume_after == f"e{SCAN_ROUND_COUNT_MAX - 1:02}"
    assert await _finished_txns(store, log, 1) == ["z"]
    assert [member.decode() for member in await client.zrange(finished_key, 0, -1)] == ["z"]


async def test_a_member_re_created_before_its_prune_keeps_its_place(
    store: RedisStore, client: aioredis.Redis, ns: str
) -> None:
    """The prune reads each record again: one finished since the scan read it gone stays."""
    log = LogId.partition(ns)
    await store.log_once(log, "r", ABORT, _body(ns))
    await store._prune_finished(log, ["r"])
    assert await _indexes(client, log, "r") == (True, False)
