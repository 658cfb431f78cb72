"""A storage request still on the network when its caller's deadline passes may land later, after
the caller retried and after other transactions went on; storage, not the client, must refuse
what would then undo their writes. Against the real servers, through a proxy that holds the
request (tests/storage/servers.py HoldingProxy)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import uuid
from collections.abc import AsyncIterator

import pytest

from cornus.protocol.config import Protocol
from cornus.protocol.effects import DeleteRecord, Effect
from cornus.sim.schedule import Schedule
from cornus.sim.world import World
from storage_adapters.contract import LogId, LogKind, Ownership, RecordBody, TxnState, identity_name
from storage_adapters.errors import StorageUnavailable
from storage_adapters.factory import StoreConfig, open_store
from storage_adapters.redis_store import RedisStore
from storage_adapters.store import LogStore
from tests.conftest import Services
from tests.storage.conftest import refuse_what_dynamodb_refuses
from tests.storage.servers import HoldingProxy, azurite_behind
from tests.worker import redis_db_bench

pytestmark = [pytest.mark.services, pytest.mark.timeout(120)]

# Past moto's slowest calls under the suite's load, and a hold past the deadline.
DEADLINE_MS = 2_000
HOLD_S = 3.5
DEADLINE_MS_CHECKS = 10_000
# More keys than one DynamoDB transaction carries: the redo goes in chunks.
CHUNKED_KEY_COUNT = 150
# A coordinator's identity lease: it outlives the test.
IDENTITY_LEASE_MS = 60_000


async def test_a_late_chunk_of_a_dynamodb_apply_never_undoes_a_later_write(services: Services) -> None:
    """A redo too big for one DynamoDB transaction goes in chunks, and only the last carried the
    record's condition: a chunk of a timed-out attempt that landed after the retry applied the redo
    and a later transaction wrote the same keys put the old values back."""
    port = int(services.dynamodb_endpoint.rsplit(":", 1)[1])
    proxy = await HoldingProxy(port, lambda chunk: b"TransactWriteItems" in chunk, HOLD_S).start()
    table = f"late-{uuid.uuid4().hex[:10]}"
    store = await open_store(StoreConfig(backend="dynamodb", dynamodb_endpoint=f"http://127.0.0.1:{proxy.port}",
                                         dynamodb_table=table, timeout_ms_call=DEADLINE_MS))
    # Checks and clean-up straight to the server, with a deadline nothing here is about.
    direct = await open_store(StoreConfig(backend="dynamodb", dynamodb_endpoint=services.dynamodb_endpoint,
                                          dynamodb_table=table, timeout_ms_call=DEADLINE_MS_CHECKS))
    refuse_what_dynamodb_refuses(store)
    partition = "late"
    log = LogId.partition(partition)
    first = {f"k{index:03d}": b"first" for index in range(CHUNKED_KEY_COUNT)}
    try:
        await store.log_once(log, "t1", TxnState.VOTE_YES, RecordBody((partition,), "n1", b"redo"))
        proxy.holding = True
        with pytest.raises(StorageUnavailable):
            await store.apply_redo(partition, "t1", first)
        proxy.holding = False
        applied = False
        for _ in range(5):  # as the participant retries an apply: until it lands (moto is slow under load)
            try:
                applied = await store.apply_redo(partition, "t1", first)
                break
            except StorageUnavailable:
                await asyncio.sleep(HOLD_S / 2)
        assert applied or (await direct.read(log, "t1")).applied  # type: ignore[union-attr]
        await store.log_once(log, "t2", TxnState.VOTE_YES, RecordBody((partition,), "n1", b"redo"))
        assert await store.apply_redo(partition, "t2", {"k000": b"second"})
        await asyncio.sleep(HOLD_S + 0.5)  # the held chunk has reached the server by now
        assert proxy.held_count >= 1
        assert await direct.read_data(partition, ["k000"]) == {"k000": b"second"}
    finally:
        await store.close()
        proxy.close()
        await direct.delete_table()  # type: ignore[attr-defined]
        await direct.close()


def _holds_azure_data_writes(chunk: bytes) -> bool:
    request_line = chunk.split(b"\r\n", 1)[0]
    return (chunk.startswith(b"PUT ") or chunk.startswith(b"DELETE ")) and b"/data/" in request_line


@pytest.mark.parametrize("later", [b"second", None], ids=["later-put", "later-delete"])
async def test_a_late_data_write_of_an_azure_apply_never_undoes_a_later_write(
    services: Services, later: bytes | None
) -> None:
    """Azure writes a redo's data blobs one by one, unconditionally, then marks the record applied:
    a data write of an attempt that timed out, landing after the retry applied the redo and a later
    transaction wrote (or deleted) the same key, put the old value back."""
    proxy, through_proxy = await azurite_behind(services.azure_connection_string, _holds_azure_data_writes, HOLD_S)
    container = f"late-{uuid.uuid4().hex[:10]}"
    store = await open_store(StoreConfig(backend="azure_blob", azure_connection_string=through_proxy,
                                         azure_container=container, timeout_ms_call=DEADLINE_MS))
    direct = await open_store(StoreConfig(backend="azure_blob", azure_container=container,
                                          azure_connection_string=services.azure_connection_string,
                                          timeout_ms_call=DEADLINE_MS_CHECKS))
    partition = "late"
    log = LogId.partition(partition)
    try:
        await store.log_once(log, "t1", TxnState.VOTE_YES, RecordBody((partition,), "n1", b"redo"))
        proxy.holding = True
        with pytest.raises(StorageUnavailable):
            await store.apply_redo(partition, "t1", {"k": b"first"})
        proxy.holding = False
        applied = False
        for _ in range(5):  # as the participant retries an apply: until it lands
            try:
                applied = await store.apply_redo(partition, "t1", {"k": b"first"})
                break
            except StorageUnavailable:
                await asyncio.sleep(HOLD_S / 2)
        assert applied or (await direct.read(log, "t1")).applied  # type: ignore[union-attr]
        await store.log_once(log, "t2", TxnState.VOTE_YES, RecordBody((partition,), "n1", b"redo"))
        for _ in range(5):
            try:
                assert await store.apply_redo(partition, "t2", {"k": later})
                break
            except StorageUnavailable:
                await asyncio.sleep(HOLD_S / 2)
        await asyncio.sleep(HOLD_S + 0.5)  # every held write has reached the server by now
        assert proxy.held_count >= 1
        assert await direct.read_data(partition, ["k"]) == {"k": later}
    finally:
        await store.close()
        proxy.close()
        await direct.delete_container()  # type: ignore[attr-defined]
        await direct.close()


async def test_a_redis_write_that_arrives_past_its_deadline_is_refused(services: Services) -> None:
    """A write still on its way when its caller's deadline passes must not land later: the
    garbage collection grace counts on calls landing within their deadline (plus the clock slack),
    and a vote landing after its transaction was collected would re-create its record. Redis
    runs the call whenever it arrives, so the script itself refuses it past the deadline."""
    log = LogId.partition(f"late-{uuid.uuid4().hex[:8]}")
    async with _redis_behind_a_holding_proxy(services) as (proxy, store, checks):
        proxy.holding = True
        with pytest.raises(StorageUnavailable):
            await store.log_once(log, "t1", TxnState.VOTE_YES, RecordBody((log.name,), "n1", b"redo"))
        proxy.holding = False
        await asyncio.sleep(2.0)  # the held call has reached Redis by now
        assert proxy.held_count >= 1
        assert await checks.read(log, "t1") is None, "a call that timed out landed later"
        after = await store.log_once(log, "t2", TxnState.VOTE_YES, RecordBody((log.name,), "n1", b"redo"))
        assert after.created  # and calls in time still land


async def test_a_redis_ownership_write_that_arrives_past_its_deadline_is_refused(services: Services) -> None:
    """Found by audit (2026-11-27): ownership and identity writes carried no deadline Redis checks.
    A take that its node was told failed, still on its way, landed later: the record named a node
    that did not serve the partition (everyone waited out its lease), or an identity take deposed
    the live process of that node. The script refuses it past its deadline, as every other write."""
    partition = f"late-{uuid.uuid4().hex[:8]}"
    async with _redis_behind_a_holding_proxy(services) as (proxy, store, checks):
        proxy.holding = True
        with pytest.raises(StorageUnavailable):
            await store.write_owner(None, Ownership(partition, "n1", 1, 1, 4_000))
        proxy.holding = False
        await asyncio.sleep(2.0)  # the held call has reached Redis by now
        assert proxy.held_count >= 1
        assert await checks.read_owners([partition]) == {}, "a take that timed out landed later"
        taken = await store.write_owner(None, Ownership(partition, "n1", 1, 1, 4_000))
        assert taken.written  # and takes in time still land


@contextlib.asynccontextmanager
async def _redis_behind_a_holding_proxy(
        services: Services) -> AsyncIterator[tuple[HoldingProxy, RedisStore, RedisStore]]:
    """A store whose scripts (EVALSHA) a proxy can hold past their 500 ms deadline, and a store
    straight to the same database to check what landed."""
    base_url = services.redis_url.rsplit("/", 1)[0]
    port = int(base_url.rsplit(":", 1)[1])
    database = redis_db_bench()
    proxy = await HoldingProxy(port, lambda chunk: b"EVALSHA" in chunk, 1.5).start()
    store = await RedisStore.open(f"redis://127.0.0.1:{proxy.port}/{database}", timeout_ms_call=500)
    checks = await RedisStore.open(f"{base_url}/{database}", timeout_ms_call=DEADLINE_MS_CHECKS)
    try:
        yield proxy, store, checks
    finally:
        await store.close()
        await checks.close()
        proxy.close()


async def test_a_redis_clock_stepped_forward_fails_one_write_says_why_and_measures_again(
    services: Services, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis judges a call's deadline by its own clock, and the store states deadlines in it with
    the offset it measured against the node's boot clock (redis_store.CLOCK_OFFSET_REFRESH_S), which
    no step of the node's clocks moves. Redis's clock stepped forward by more than a call deadline
    after that makes the next write late in Redis's eyes: it fails, that is said naming the
    clocks, and the offset is measured again, so the write after works. (The step is made by
    moving the measured offset an hour back, where the step would have left it behind Redis's.)"""
    base_url = services.redis_url.rsplit("/", 1)[0]
    store = await RedisStore.open(f"{base_url}/{redis_db_bench()}", timeout_ms_call=DEADLINE_MS)
    log = LogId.partition(f"skew-{uuid.uuid4().hex[:8]}")
    body = RecordBody((log.name,), "n1", b"redo")
    try:
        # Connected first: a new connection measures the clock as it is set up, which would undo
        # the step made below (redis_store._ConnectionCheck).
        assert (await store.log_once(log, "t0", TxnState.VOTE_YES, body)).created
        measured_ms = store._clock_offset_ms
        store._clock_offset_ms = measured_ms - 3_600_000
        with caplog.at_level(logging.ERROR, logger="cornus.storage.redis"), pytest.raises(StorageUnavailable):
            await store.log_once(log, "t1", TxnState.VOTE_YES, body)
        assert "a clock was stepped" in caplog.text, caplog.text
        for _ in range(100):  # the offset is measured again in the background
            if store._clock_measuring is None and abs(store._clock_offset_ms - measured_ms) < 1_000:
                break
            await asyncio.sleep(0.01)
        assert await store.log_once(log, "t2", TxnState.VOTE_YES, body) is not None
    finally:
        await store.close()


def _collection_of_a_two_partition_commit(late_write_window_ms: int, protocol: Protocol = Protocol.CORNUS,
                                         ) -> list[DeleteRecord]:
    """The record deletions and tombstones the core's garbage collection issues, in order, for a
    transaction of `protocol` committed on p0 and p1 (the simulator runs the real machines), on
    storage whose calls may land `late_write_window_ms` late."""
    schedule = dataclasses.replace(Schedule.single(protocol, (True, True)), late_window_ms=late_write_window_ms)
    collection: list[DeleteRecord] = []

    def note(world: World, name: str, effect: Effect) -> None:
        if isinstance(effect, DeleteRecord):
            collection.append(effect)

    World(schedule, hook=note).run()
    return collection


async def _stores_behind_a_holding_proxy(backend: str, services: Services, table: str) -> tuple[
        HoldingProxy, LogStore, LogStore]:
    """A store whose writes of records go through a proxy that holds them while told to (DEADLINE_MS
    for its calls), and one straight to the server for what the test checks."""
    if backend == "dynamodb":
        port = int(services.dynamodb_endpoint.rsplit(":", 1)[1])
        proxy = await HoldingProxy(port, lambda c: b"PutItem" in c or b"TransactWriteItems" in c, HOLD_S).start()

        def dynamodb(endpoint: str, timeout_ms: int) -> StoreConfig:
            return StoreConfig(backend="dynamodb", dynamodb_endpoint=endpoint, dynamodb_table=table,
                               timeout_ms_call=timeout_ms)
        return (proxy, await open_store(dynamodb(f"http://127.0.0.1:{proxy.port}", DEADLINE_MS)),
                await open_store(dynamodb(services.dynamodb_endpoint, DEADLINE_MS_CHECKS)))
    connection = services.azure_connection_string
    proxy, through_proxy = await azurite_behind(
        connection, lambda c: c.startswith(b"PUT ") and b"/txn/" in c.split(b"\r\n", 1)[0], HOLD_S)

    def azure(connection_string: str, timeout_ms: int) -> StoreConfig:
        return StoreConfig(backend="azure_blob", azure_connection_string=connection_string, azure_container=table,
                           timeout_ms_call=timeout_ms)
    return (proxy, await open_store(azure(through_proxy, DEADLINE_MS)),
            await open_store(azure(connection, DEADLINE_MS_CHECKS)))


@pytest.mark.parametrize("backend", ["dynamodb", "azure_blob"])
async def test_a_vote_that_lands_after_collection_meets_a_tombstone(services: Services, backend: str) -> None:
    """DynamoDB and Azure Blob check no deadline: a vote whose caller timed out (and wrote it again)
    can land after its transaction was collected. Collection deleted every record but the first
    participant's, so the late vote created p1's record again, a VOTE_YES that recovery took for
    undecided: it found p0's COMMIT tombstone and applied the old redo over later commits (found
    by review, 2026-11-26). The collection run here is the core's, for a window this backend's
    configuration gives (LATE_WRITE_WINDOW_MS); it must leave a tombstone in p1."""
    window_ms = StoreConfig(backend=backend, azure_connection_string="x").late_write_window_ms
    assert window_ms > 0
    collection = _collection_of_a_two_partition_commit(window_ms)
    table = f"latevote-{uuid.uuid4().hex[:10]}"
    proxy, store, direct = await _stores_behind_a_holding_proxy(backend, services, table)
    txn = "1.n9.t.1.cornus"
    body = RecordBody(("p0", "p1"), "n9", b"redo")
    try:
        await direct.log_once(LogId.partition("p0"), txn, TxnState.VOTE_YES, body)
        proxy.holding = True
        with pytest.raises(StorageUnavailable):
            await store.log_once(LogId.partition("p1"), txn, TxnState.VOTE_YES, body)  # held past its deadline
        proxy.holding = False
        assert (await direct.log_once(LogId.partition("p1"), txn, TxnState.VOTE_YES, body)).created  # the retry
        for partition in ("p0", "p1"):
            await direct.apply_redo(partition, txn, {"k": b"t1"})
        for call in collection:
            await direct.delete(call.log, txn, keep=call.keep)
        await asyncio.sleep(HOLD_S + 1.0)  # the held vote has reached the server by now
        assert proxy.held_count >= 1
        assert await direct.scan_unfinished(LogId.partition("p1")) == [], "a late vote recreated a collected record"
        assert (await direct.log_once(LogId.partition("p1"), txn, TxnState.ABORT, body)).state is TxnState.COMMIT
    finally:
        await store.close()
        proxy.close()
        await (direct.delete_table() if backend == "dynamodb" else direct.delete_container())  # type: ignore[attr-defined]
        await direct.close()


@pytest.mark.parametrize("backend", ["dynamodb", "azure_blob"])
async def test_a_coordinator_decision_that_lands_after_collection_meets_a_tombstone(
    services: Services, backend: str,
) -> None:
    """The same for a coordinator's own record (2PC, coordinator-log): collection deleted it
    outright, so a decision write of the coordinator's that timed out (and was written again)
    landed after collection and created the record again, an unfinished COMMIT with its redo: the
    coordinator's next recovery sent that decision again, and a coordinator-log participant's
    recovery took the redo for an open yes vote and applied it over later commits (found by
    review, 2026-11-26). The collection run here is the core's: it must leave a tombstone in the
    coordinator's log, which the late write meets and leaves finished (DynamoDB's update lands on
    it, keeping it applied; Azure's create-if-absent is refused by the blob that is there)."""
    window_ms = StoreConfig(backend=backend, azure_connection_string="x").late_write_window_ms
    collection = _collection_of_a_two_partition_commit(window_ms, Protocol.COORDINATOR_LOG)
    [log] = {call.log for call in collection if call.log.kind is LogKind.COORDINATOR}
    table = f"latedecision-{uuid.uuid4().hex[:10]}"
    proxy, store, direct = await _stores_behind_a_holding_proxy(backend, services, table)
    txn = f"1.{log.name}.t.1.clog"
    body = RecordBody(("p0", "p1"), log.name, b"redo")
    try:
        # The coordinator's writes to its own log carry its identity's fence, as a node's do.
        taken = await direct.write_owner(None, Ownership(identity_name(log.name), log.name, 1, 1, IDENTITY_LEASE_MS))
        assert taken.written and taken.stored is not None
        fence = taken.stored.fence()
        await direct.log(log, txn, TxnState.VOTE_YES, body, fence)  # the participants' redo
        proxy.holding = True
        with pytest.raises(StorageUnavailable):
            await store.log(log, txn, TxnState.COMMIT, body, fence)  # held past its deadline
        proxy.holding = False
        assert await direct.log(log, txn, TxnState.COMMIT, body, fence) is TxnState.COMMIT  # the retry
        for partition in ("p0", "p1"):  # each participant logs the decision and applies it
            await direct.log(LogId.partition(partition), txn, TxnState.COMMIT, body)
            await direct.apply_redo(partition, txn, {"k": b"t1"})
        for call in collection:
            await direct.delete(call.log, txn, fence if call.log == log else None, keep=call.keep)
        await asyncio.sleep(HOLD_S + 1.0)  # the held decision has reached the server by now
        assert proxy.held_count >= 1
        assert await direct.scan_unfinished(log) == [], "a late decision recreated a collected record"
        record = await direct.read(log, txn)
        assert record is not None and (record.state, record.applied) == (TxnState.COMMIT, True), record
    finally:
        await store.close()
        proxy.close()
        await (direct.delete_table() if backend == "dynamodb" else direct.delete_container())  # type: ignore[attr-defined]
        await direct.close()
