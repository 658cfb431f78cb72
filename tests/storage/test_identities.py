"""`LogStore.list_identities`, on every backend against its real service: the nodes that ever took
an identity in a storage, which coordinator-log recovery scans the logs of (a node added by a
rollout is missed by a node whose configuration predates it, and its coordinator log may hold the
only copy of some yes votes).

Most checks run on storage of their own (`fresh`: an emulator file, this worker's Redis databases,
emptied first, a container, a table), since the listing covers the whole storage and the shared
conformance storage holds every other test's identities; several checks in turn on one such
storage, where they do not disturb each other (see "what is listed"). One test runs on the shared
storage (`store`), where the other tests' records are, and looks only at its own nodes: their ids
share the test's unique prefix, so they list together, right after the prefix itself.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from itertools import product
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from services.api.metrics import InstrumentedStore, Metrics
from storage_adapters import emulator_sql
from storage_adapters.contract import (
    IDENTITY_PAGE_COUNT_MAX,
    NODE_ID_LENGTH_MAX,
    LogId,
    Ownership,
    RecordBody,
    TxnState,
    identity_name,
)
from storage_adapters.errors import StorageUnavailable, ValidationError
from storage_adapters.factory import BACKENDS, open_store
from storage_adapters.latency import LatencyInjectingStore, parse_latency
from storage_adapters.store import DelegatingStore, LogStore
from tests.conftest import Services
from tests.runtime.faults import FaultyStore
from tests.storage.conftest import config_for, refuse_what_dynamodb_refuses
from tests.storage.test_conformance import each_variant
from tests.worker import redis_db_bench

LEASE_MS = 10_000
# Pages one listing walk may take before the test calls it endless.
WALK_PAGE_COUNT_MAX = 100
# Node ids where a backend's own order or key mapping could part from plain string order: upper
# case below lower, ids ending in '.' (Azure stores those as '.~', which lists after 'a.b') and
# their extensions, ':' and the other punctuation the id alphabet allows, and an id as long as
# allowed.
TRICKY_NODES = (
    "n1", "n10", "n2", "N3", "a.", "a..", "a..z", "a.b", "a-b", "a:b", "a_b", "node:x", "z" * NODE_ID_LENGTH_MAX,
)
# Partition names around the identities' prefix "node:" in byte order (':' is 0x3A): none is listed.
PARTITIONS_NEAR_THE_PREFIX = ("node", "node-1", "node.1", "node9", "nodeA", "node_1", "nodd", "nodf", "n1")

Opener = Callable[[], Awaitable[LogStore]]


def identity(node: str, epoch: int = 1, version: int = 1, owner: str | None = None) -> Ownership:
    return Ownership(identity_name(node), node if owner is None else owner, epoch, version, LEASE_MS)


async def take(store: LogStore, node: str) -> Ownership:
    """Take `node`'s identity for the first time."""
    first = identity(node)
    result = await store.write_owner(None, first)
    assert result.written and result.stored == first, result
    return first


async def walk(store: LogStore, limit: int, after: str = "") -> list[list[str]]:
    """Every page of the listing from `after`, `limit` at a time, up to the first short page."""
    pages: list[list[str]] = []
    for _ in range(WALK_PAGE_COUNT_MAX):
        page = await store.list_identities(after, limit)
        assert len(page) <= limit, (after, limit, page)
        pages.append(page)
        if len(page) < limit:
            return pages
        after = page[-1]
    pytest.fail(f"the listing did not end within {WALK_PAGE_COUNT_MAX} pages")


@pytest.fixture(params=BACKENDS)
async def fresh(request: pytest.FixtureRequest, services: Services, tmp_path: Path) -> AsyncIterator[Opener]:
    """Opens stores, each on storage nobody else uses (at most two per test on Redis: this
    worker's first two bench databases, emptied first); all closed and dropped at the end."""
    backend: str = request.param
    opened: list[LogStore] = []
    redis_dbs = iter(range(redis_db_bench(), redis_db_bench() + 2))

    async def open_fresh() -> LogStore:
        config = config_for(backend, services, f"ids-{uuid.uuid4().hex[:10]}", str(tmp_path))
        if backend == "emulator":
            config = replace(config, emulator_path=str(tmp_path / f"ids-{len(opened)}.db"))
        elif backend == "redis":
            url = f"{services.redis_url.rsplit('/', 1)[0]}/{next(redis_dbs)}"
            client = aioredis.Redis.from_url(url, socket_timeout=5)
            try:
                await client.flushdb()  # another test of this worker may have used it
            finally:
                await client.aclose()
            config = replace(config, redis_url=url)
        store = await open_store(config)
        opened.append(store)
        if backend == "dynamodb":
            refuse_what_dynamodb_refuses(store)
        return store

    try:
        yield open_fresh
    finally:
        for store in opened:
            try:
                if backend == "azure_blob":
                    await store.delete_container()  # type: ignore[attr-defined]
                elif backend == "dynamodb":
                    await store.delete_table()  # type: ignore[attr-defined]
                elif backend == "redis":
                    await store._client.flushdb()  # type: ignore[attr-defined]
            finally:
                await store.close()


# --- what is listed, and how pages and wrappers list it --------------------------------------------
# Making fresh storage is what these checks cost most (a table, a container, an emulator file and
# its writer process), so each backend makes as few as the checks allow: two tests, three storages.
# A check that compares the whole listing with its own nodes needs a storage where only the checks
# before it took identities; it runs after them, on nodes of its own that list after theirs.


async def test_a_fresh_storage_lists_nothing_then_every_node_once_in_order_from_any_cursor(fresh: Opener) -> None:
    store = await fresh()

    # Every node that took its identity is listed once, in order.
    assert await store.list_identities() == []
    await asyncio.gather(*(take(store, node) for node in TRICKY_NODES))
    assert await store.list_identities() == sorted(TRICKY_NODES)
    assert await store.list_identities("", IDENTITY_PAGE_COUNT_MAX) == sorted(TRICKY_NODES)

    # Pages list every node once, in order, from any cursor.
    expected = sorted(TRICKY_NODES)
    for limit in (1, 2, 3, 5, len(expected), IDENTITY_PAGE_COUNT_MAX):
        pages = await walk(store, limit)
        assert pages == [expected[start : start + limit] for start in range(0, len(expected) + 1, limit)], limit
    # A cursor need not name a node: the page starts at the first id above it.
    cursors = ["A", "a", "a.", "a.a", "a..y", "a.c", "m", "n1", "n11", "node:", "node:y", "zz", "0"]
    for after in cursors:
        above = [node for node in expected if node > after]
        assert await store.list_identities(after) == above, after
        assert await store.list_identities(after, 2) == above[:2], after
        assert [node for page in await walk(store, 2, after) for node in page] == above, after
    assert await store.list_identities(expected[-1]) == []


async def only_identities_are_listed_never_a_partitions_ownership_or_a_log(store: LogStore) -> Ownership:
    """On a storage nobody took an identity in: returns n1's take, the one identity it then holds."""
    for partition in PARTITIONS_NEAR_THE_PREFIX:
        first = Ownership(partition, "n1", 1, 1, LEASE_MS)
        assert (await store.write_owner(None, first)).written
        renewed = Ownership(partition, "n1", 1, 2, LEASE_MS)
        assert (await store.write_owner(first, renewed)).written
        assert (await store.write_owner(renewed, Ownership(partition, "n2", 2, 3, LEASE_MS))).written
    # A coordinator log's records, and a partition's records and data, of names like nodes'.
    body = RecordBody(("p1",), "ghost", b"redo")
    assert (await store.log_once(LogId.coordinator("ghost"), "t1", TxnState.COMMIT, body)).created
    assert (await store.log_once(LogId.partition("node"), "t1", TxnState.VOTE_YES, body)).created
    assert await store.apply_redo("node", "t1", {"node:k": b"v"})
    assert await store.list_identities() == []
    first = await take(store, "n1")
    assert await store.list_identities() == ["n1"]
    return first


async def renewals_add_nothing_and_a_node_taken_again_stays_listed_once(store: LogStore, first: Ownership) -> None:
    """From `first`, n1's first take, on a storage where n1 is the only identity."""
    renewed = identity("n1", 1, 2)
    assert (await store.write_owner(first, renewed)).written
    released = identity("n1", 1, 3, owner="")
    assert (await store.write_owner(renewed, released)).written
    again = identity("n1", 2, 4)  # the node's next process takes its name in a new epoch
    assert (await store.write_owner(released, again)).written
    assert (await store.write_owner(again, identity("n1", 3, 5))).written
    assert await store.list_identities() == ["n1"]
    # A take that loses (the record is there already) lists nothing new either.
    lost = await store.write_owner(None, identity("n1"))
    assert not lost.written
    assert await store.list_identities() == ["n1"]


# Validation runs before any I/O, in the contract's base, so one storage per backend checks them
# all (a case each would set up 64 storages for the same code path).
BAD_ARGUMENTS = (
    ("", 0), ("", -1), ("", IDENTITY_PAGE_COUNT_MAX + 1), ("", True), ("", "3"), ("", 2.0), ("", None),
    (None, 3), (7, 3), (b"n1", 3), (["n1"], 3), ("a/b", 3), ("a{b}", 3), ("a b", 3), ("~", 3),
    ("x" * (NODE_ID_LENGTH_MAX + 1), 3),
)


async def bad_arguments_are_refused_and_change_nothing(store: LogStore) -> None:
    """On a storage where n1 is the only identity."""
    for after, limit in BAD_ARGUMENTS:
        with pytest.raises(ValidationError):
            await store.list_identities(after, limit)  # type: ignore[arg-type]
    assert await store.list_identities() == ["n1"]


async def wrapping_stores_forward_the_listing(inner: LogStore) -> None:
    """On a storage where n1 is the only identity: each store that wraps another."""

    async def check(_: str, wrapper: str) -> None:  # no namespace: each lists the storage's n1
        wrapped: DelegatingStore
        if wrapper == "latency":
            wrapped = LatencyInjectingStore(inner, parse_latency("fixed:1"))
        elif wrapper == "instrumented":
            metrics = Metrics()
            wrapped = InstrumentedStore(inner, metrics)
        else:
            wrapped = FaultyStore(inner)
        assert await wrapped.list_identities() == ["n1"]
        assert await wrapped.list_identities("n1", 1) == []
        with pytest.raises(ValidationError):
            await wrapped.list_identities("", 0)
        if isinstance(wrapped, InstrumentedStore):
            labels = {"backend": inner.backend_name, "call": "list_identities"}
            assert metrics.registry.get_sample_value("cornus_storage_call_seconds_count", labels) == 3
            errors = {**labels, "error": "ValidationError"}
            assert metrics.registry.get_sample_value("cornus_storage_errors_total", errors) == 1
        if isinstance(wrapped, FaultyStore):
            wrapped.fail("list_identities")
            with pytest.raises(StorageUnavailable):
                await wrapped.list_identities()
            assert [call.outcome for call in wrapped.calls_of("list_identities")] == ["ok", "ok", "error", "failed"]
            assert await wrapped.list_identities() == ["n1"]

    await each_variant("n1", product(["latency", "instrumented", "faulty"]), check)


async def each_storage_lists_only_its_own_identities(one: LogStore, other: LogStore) -> None:
    """`one` holds n1's identity only, `other` is fresh."""
    await take(other, "n2")
    assert await one.list_identities() == ["n1"]
    assert await other.list_identities() == ["n2"]


async def concurrent_takes_of_one_node_and_of_many_are_each_listed_once(
    store: LogStore, earlier: list[str], prefix: str
) -> list[str]:
    """After `earlier`, every identity the storage holds, which list before `prefix`: returns the
    nodes it took."""
    races = await asyncio.gather(
        *(store.write_owner(None, identity(f"{prefix}n0", owner=f"p{i}")) for i in range(8))
    )
    assert sum(result.written for result in races) == 1
    nodes = [f"{prefix}n{i:02}" for i in range(1, 25)]
    await asyncio.gather(*(take(store, node) for node in nodes))
    assert await store.list_identities() == [*earlier, f"{prefix}n0", *nodes]
    return [f"{prefix}n0", *nodes]


async def a_large_listing_pages_through_every_node(store: LogStore, earlier: list[str], prefix: str) -> None:
    """After `earlier`, every identity the storage holds, which list before `prefix`."""
    nodes = sorted(f"{prefix}node-{i:03}" for i in range(120))
    await asyncio.gather(*(take(store, node) for node in nodes))
    assert await store.list_identities() == [*earlier, *nodes]
    # Walked from past the earlier nodes: the pages of these 120 alone, as on a storage of their own
    # (at 120, a full page and then an empty one). Walks from the start are the fresh storage's test's.
    for limit in (7, 50, 120):
        assert [node for page in await walk(store, limit, earlier[-1]) for node in page] == nodes, limit
    assert await store.list_identities(f"{prefix}node-099", 5) == nodes[100:105]


async def test_only_identities_are_listed_each_once_through_renewals_races_pages_and_wrappers(
    fresh: Opener,
) -> None:
    """The listing checks that need no storage of their own, in turn on one (and, where a check
    compares two storages, a second): each where the ones before it left exactly the identities it
    expects. They need the listing to be the storage's, so they cannot share the shared one."""
    store = await fresh()
    first = await only_identities_are_listed_never_a_partitions_ownership_or_a_log(store)
    # n1 is now the only identity; these take no other.
    await renewals_add_nothing_and_a_node_taken_again_stays_listed_once(store, first)
    await bad_arguments_are_refused_and_change_nothing(store)
    await wrapping_stores_forward_the_listing(store)
    await each_storage_lists_only_its_own_identities(store, await fresh())
    # These take nodes of their own, each listing after every node taken here before it.
    races = await concurrent_takes_of_one_node_and_of_many_are_each_listed_once(store, ["n1"], "race-")
    await a_large_listing_pages_through_every_node(store, ["n1", *races], "scale-")


async def test_on_shared_storage_a_tests_nodes_list_together_after_its_prefix(store: LogStore, ns: str) -> None:
    nodes = [f"{ns}-{i}" for i in range(5)] + [f"{ns}.", f"{ns}.a"]
    partition = Ownership(f"{ns}-p", "n1", 1, 1, LEASE_MS)
    assert (await store.write_owner(None, partition)).written
    await asyncio.gather(*(take(store, node) for node in nodes))
    page = await store.list_identities(ns, len(nodes) + 1)
    mine = sorted(nodes)
    assert page[: len(mine)] == mine
    assert all(not node.startswith(ns) for node in page[len(mine) :]), page
    assert await store.list_identities(mine[2], 2) == mine[3:5]


# --- how each backend finds them ------------------------------------------------------------------


def test_the_emulator_reads_a_range_of_the_ownership_key_not_the_table(tmp_path: Path) -> None:
    """A listing's cost is its page, not the number of partitions' ownership records."""
    conn = emulator_sql.connect(tmp_path / "cornus.db", 5_000)
    try:
        plan = conn.execute(f"EXPLAIN QUERY PLAN {emulator_sql.LIST_IDENTITIES}", ("node:", "node;", 3)).fetchall()
    finally:
        conn.close()
    details = [row[-1] for row in plan]
    assert any(detail.startswith("SEARCH ownership USING PRIMARY KEY (partition>? AND partition<?)")
               for detail in details), details
    assert not any(detail.startswith("SCAN") for detail in details), details


@pytest.mark.parametrize("fresh", ["redis", "dynamodb"], indirect=True)
async def test_a_take_registers_its_node_before_it_lands_and_renewals_register_nothing(
    fresh: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis and DynamoDB keep a registry beside the identity records: a take writes its node there
    first, in a request of its own, so a take that fails after it still lists its node (harmless),
    and none succeeds unlisted; a renewal or release (the same epoch) writes nothing there."""
    store = await fresh()
    client = store._client  # type: ignore[attr-defined]
    registered: list[str] = []
    failing: list[str] = []
    if store.backend_name == "redis":
        zadd, run_script = client.zadd, store._script  # type: ignore[attr-defined]
        owner_script = store._write_owner_script  # type: ignore[attr-defined]

        async def counted_zadd(key: str, mapping: dict[str, int]) -> int:
            registered.extend(mapping)
            return await zadd(key, mapping)

        async def script(called: object, keys: list[str], args: list[object]) -> object:
            if failing and called is owner_script:
                raise StorageUnavailable("injected: the take's own request failed")
            return await run_script(called, keys, args)

        monkeypatch.setattr(client, "zadd", counted_zadd)
        monkeypatch.setattr(store, "_script", script)
    else:
        put_item = client.put_item

        async def counted_put_item(**request: dict[str, dict[str, str]]) -> object:
            if request["Item"]["pk"]["S"] == "reg#identities":
                registered.append(request["Item"]["sk"]["S"])
            elif failing:
                raise StorageUnavailable("injected: the take's own request failed")
            return await put_item(**request)

        monkeypatch.setattr(client, "put_item", counted_put_item)
    first = await take(store, "n1")
    assert registered == ["n1"]
    renewed = identity("n1", 1, 2)
    assert (await store.write_owner(first, renewed)).written
    released = identity("n1", 1, 3, owner="")
    assert (await store.write_owner(renewed, released)).written
    partition = Ownership("p1", "n1", 1, 1, LEASE_MS)
    assert (await store.write_owner(None, partition)).written
    assert (await store.write_owner(partition, Ownership("p1", "n2", 2, 2, LEASE_MS))).written
    assert registered == ["n1"], "a renewal, a release or a partition's take wrote the registry"
    assert (await store.write_owner(released, identity("n1", 2, 4))).written
    assert registered == ["n1", "n1"]
    failing.append("yes")
    with pytest.raises(StorageUnavailable):
        await store.write_owner(None, identity("n2"))
    assert registered == ["n1", "n1", "n2"]
    assert await store.read_owners([identity_name("n2")]) == {}
    assert await store.list_identities() == ["n1", "n2"]
