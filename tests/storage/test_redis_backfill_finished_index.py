"""`RedisStore.backfill_finished_index`: the records finished before the finished index existed
(by scripts of an earlier version, which knew no such index) are indexed by a walk of the keyspace,
after which `scan_finished_page` finds exactly the finished records that are not tombstones; never
a vote, a COMMIT not applied, a coordinator's COMMIT, a tombstone, the cluster record or a hash
that is no record. Re-runs index nothing new, a dry run writes nothing, a bounded run resumes from
its cursor, and a record that changed between the walk and the script is judged as it is then.

Each test has a database of its own, emptied first (this worker's cluster database,
tests/worker.py): the walk covers a whole database, and exact counts need only this test's keys."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from storage_adapters import redis_store
from storage_adapters.contract import CLUSTER_RECORD_TXN, LogId, RecordBody, Tombstone, TxnState
from storage_adapters.errors import ValidationError
from storage_adapters.redis_store import FinishedBackfill, RedisStore
from tests.conftest import Services
from tests.storage.conftest import TIMEOUT_MS_CALL_TEST
from tests.worker import redis_db_cluster

VOTE, COMMIT, ABORT = TxnState.VOTE_YES, TxnState.COMMIT, TxnState.ABORT
KEEP_MS = 600_000
# Runs a resumed walk may take in the test that bounds each: far more than its records need.
RUN_COUNT_MAX = 100


@pytest.fixture
def own_url(services: Services) -> str:
    return services.redis_url.rsplit("/", 1)[0] + f"/{redis_db_cluster()}"


@pytest.fixture
async def client(own_url: str) -> AsyncIterator[aioredis.Redis]:
    connection = aioredis.Redis.from_url(own_url, socket_timeout=5)
    await connection.flushdb()
    try:
        yield connection
    finally:
        await connection.aclose()


@pytest.fixture
async def store(client: aioredis.Redis, own_url: str) -> AsyncIterator[RedisStore]:
    opened = await RedisStore.open(own_url, timeout_ms_call=TIMEOUT_MS_CALL_TEST)
    try:
        yield opened
    finally:
        await opened.close()


def _body() -> RecordBody:
    return RecordBody(("p0",), "n0", b"redo")


async def _finished(store: RedisStore, log: LogId) -> list[str]:
    page = await store.scan_finished_page(log, 100)
    assert page.resume_after is None, page
    return [record.txn for record in page.records]


async def _forget_the_index(client: aioredis.Redis, log: LogId, *txns: str) -> None:
    """What scripts of an earlier version leave: the records, without their members."""
    assert await client.zrem(redis_store._finished_key(log), *txns) == len(txns)


async def _records_of_every_kind(store: RedisStore, client: aioredis.Redis) -> tuple[LogId, LogId]:
    """A partition log and a coordinator log holding every kind of record, their finished ones left
    out of the index but one (`kept`); and the cluster record, and a hash that is no record."""
    part, coord = LogId.partition("p0"), LogId.coordinator("n0")
    await store.log_once(part, "abort", ABORT, _body())
    await store.log_once(part, "kept", ABORT, _body())
    await store.log_once(part, "vote", VOTE, _body())
    await store.log_once(part, "commit", VOTE, _body())
    await store.log(part, "commit", COMMIT)  # decided, not applied: unfinished
    await store.log_once(part, "applied", VOTE, _body())
    assert await store.apply_redo("p0", "applied", {"k": b"v"})
    await store.log_once(part, "tomb", ABORT, _body())
    assert await store.delete(part, "tomb", keep=Tombstone(ABORT, KEEP_MS))
    await store.log_once(coord, "c-abort", ABORT, _body())
    await store.log_once(coord, "c-commit", COMMIT, _body())  # a coordinator's COMMIT: never applied
    await store.log_once(LogId.cluster(), CLUSTER_RECORD_TXN, COMMIT, RecordBody(redo=b"claim"))
    await client.hset("cxtxn:{not a log}:x", "state", "ABORT")
    await _forget_the_index(client, part, "abort", "applied")
    await _forget_the_index(client, coord, "c-abort")
    assert await _finished(store, part) == ["kept"]
    assert await _finished(store, coord) == []
    return part, coord


async def test_the_backfill_indexes_exactly_the_finished_records_that_are_not_tombstones(
    store: RedisStore, client: aioredis.Redis
) -> None:
    part, coord = await _records_of_every_kind(store, client)
    report = await store.backfill_finished_index()
    assert report == FinishedBackfill(walked=10, indexed=3, already_indexed=1, unfinished=3, tombstones=1, other=2,
                                      resume_cursor=None), report
    assert report.skipped == 6
    assert await _finished(store, part) == ["abort", "applied", "kept"]
    assert await _finished(store, coord) == ["c-abort"]
    again = await store.backfill_finished_index(scan_count=1)
    assert (again.indexed, again.already_indexed, again.resume_cursor) == (0, 4, None), again
    members = [member.decode() for member in await client.zrange(redis_store._finished_key(part), 0, -1)]
    assert members == ["abort", "applied", "kept"], "nothing but finished records was ever added"


async def test_a_dry_run_counts_and_writes_nothing(store: RedisStore, client: aioredis.Redis) -> None:
    part, coord = await _records_of_every_kind(store, client)
    before = {key: await client.dump(key) for key in await client.keys("*")}
    report = await store.backfill_finished_index(dry_run=True)
    assert (report.walked, report.indexed, report.already_indexed) == (10, 3, 1), report
    assert {key: await client.dump(key) for key in await client.keys("*")} == before
    assert await _finished(store, part) == ["kept"]
    assert await _finished(store, coord) == []


async def test_a_bounded_run_says_where_to_resume_and_the_runs_add_up(
    store: RedisStore, client: aioredis.Redis
) -> None:
    log = LogId.partition("p1")
    txns = [f"a{i:02}" for i in range(40)]
    for txn in txns:
        await store.log_once(log, txn, ABORT, _body())
    await client.delete(redis_store._finished_key(log))
    cursor, indexed, run_count = 0, 0, 0
    while run_count < RUN_COUNT_MAX:
        report = await store.backfill_finished_index(cursor=cursor, key_count_max=4, scan_count=2)
        run_count += 1
        assert report.walked >= 4 or report.resume_cursor is None, report
        indexed += report.indexed
        if report.resume_cursor is None:
            break
        cursor = report.resume_cursor
    else:
        pytest.fail(f"the walk did not end within {RUN_COUNT_MAX} runs")
    assert run_count > 1, "each run stopped at its key_count_max"
    assert indexed == len(txns)  # a key a walk met twice is counted as indexed once
    assert await _finished(store, log) == txns


async def test_a_record_changed_since_the_walk_met_it_is_judged_as_it_is_now(
    store: RedisStore, client: aioredis.Redis
) -> None:
    """What the walk returned is read again inside the script: a record a node made a tombstone,
    deleted or wrote since is indexed only if it is finished and no tombstone then."""
    log = LogId.partition("p2")
    for txn in ("tomb", "gone", "late"):
        await store.log_once(log, txn, ABORT, _body())
    await store.log_once(log, "voted", VOTE, _body())
    await client.delete(redis_store._finished_key(log))
    keys = [redis_store._record_key(log, txn).encode() for txn in ("tomb", "gone", "late", "voted")]
    # The walk met these; then the nodes moved on.
    assert await store.delete(log, "tomb", keep=Tombstone(ABORT, KEEP_MS))
    assert await store.delete(log, "gone")
    assert await store.apply_redo("p2", "voted", {"k": b"v"})  # finished now, and indexed by it
    await client.zrem(redis_store._finished_key(log), "late")
    counts = await store._backfill_keys(keys, dry_run=False)
    assert counts == FinishedBackfill(walked=4, indexed=1, already_indexed=1, tombstones=1, other=1), counts
    assert await _finished(store, log) == ["late", "voted"]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"key_count_max": 0}, "key_count_max"),
        ({"key_count_max": redis_store.BACKFILL_KEY_COUNT_MAX + 1}, "key_count_max"),
        ({"scan_count": 0}, "scan_count"),
        ({"scan_count": redis_store.BACKFILL_SCAN_COUNT_MAX + 1}, "scan_count"),
        ({"cursor": -1}, "cursor"),
        ({"cursor": 2**64}, "cursor"),
        ({"cursor": "0"}, "cursor"),
    ],
)
async def test_bad_bounds_are_refused_before_anything_is_read_or_written(
    store: RedisStore, client: aioredis.Redis, arguments: dict[str, object], message: str
) -> None:
    log = LogId.partition("p3")
    await store.log_once(log, "a", ABORT, _body())
    await client.delete(redis_store._finished_key(log))
    with pytest.raises(ValidationError, match=message):
        await store.backfill_finished_index(**arguments)  # type: ignore[arg-type]
    assert await _finished(store, log) == []


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://127.0.0.1:6379/0", "(?i)scheme"),
        ("redis://127.0.0.1:port/0", "(?i)port"),
        ("redis://127.0.0.1:99999/0", "(?i)port"),
        ("redis://127.0.0.1:6379/zero", "database"),
        ("redis://127.0.0.1:6379/0?no_such_option=1", "no_such_option"),
    ],
)
def test_a_malformed_url_is_refused_without_its_credentials(url: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message) as refused:
        redis_store.validate_url(url.replace("//", "//user:secret@", 1))
    assert "secret" not in str(refused.value)


def test_well_formed_urls_pass() -> None:
    for url in ("redis://127.0.0.1:6379/0", "redis://h", "rediss://user:pw@h:6380/2?ssl_cert_reqs=none",
                "unix:///tmp/redis.sock?db=3", "redis://h/0?socket_keepalive=true"):
        redis_store.validate_url(url)
