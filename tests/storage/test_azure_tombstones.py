"""Decision tombstones on Azure Blob, as stored: what the lifecycle rules of the Terraform module
(terraform/modules/azure) are handed to drop them by (the blob index tags `cornus-tombstone` = `1`
and `cornus-tombstone-days` = the keep in days, on tombstones and on nothing else) and the expiry
each carries, and a keep's conditional put, which must judge a record changed between its read
and its write rather than overwrite it. Azurite has no lifecycle management, so the conformance
suite cannot see any of this: these tests read the blobs with the SDK, beside the store, in the
container it uses (tests/storage/test_azure_lifecycle.py runs the module's rules over them)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from azure.storage.blob.aio import BlobServiceClient, ContainerClient

from storage_adapters import azure_blob
from storage_adapters.contract import LogId, RecordBody, Tombstone, TxnState
from storage_adapters.errors import DecisionFlipRefused, StorageError, StorageUnavailable
from storage_adapters.factory import StoreConfig, open_store
from tests.conftest import Services
from tests.storage.conftest import config_for
from tests.storage.test_conformance import body

VOTE, COMMIT, ABORT = TxnState.VOTE_YES, TxnState.COMMIT, TxnState.ABORT
# What the Terraform module's lifecycle rule filters on, spelled out here as main.tf spells it:
# the adapter's constants must agree with it, not define it.
TAG = "cornus-tombstone"
TAG_VALUE = "1"
DAYS_TAG = "cornus-tombstone-days"
KEEP_MS = 3_600_000
KEEP_MS_AGAIN = 60_000
# A day, in the unit of keep_ms: the lifecycle rules count whole days.
DAY_MS = 86_400_000
# A keep that is no whole number of days: its tombstone is tagged with the days rounded up.
KEEP_MS_DAYS = 3 * DAY_MS + 1
# A tombstone's tags, kept under a day (KEEP_MS, KEEP_MS_AGAIN) or KEEP_MS_DAYS.
TAGS_OF_A_DAY = {TAG: TAG_VALUE, DAYS_TAG: "1"}
TAGS_OF_FOUR_DAYS = {TAG: TAG_VALUE, DAYS_TAG: "4"}
# The lifecycle rule's filter, as a Find Blobs by Tags expression (Azurite answers it).
TAG_FILTER = f"\"{TAG}\" = '{TAG_VALUE}'"


@pytest.fixture
def config(services: Services, run_id: str, tmp_path: Path) -> StoreConfig:
    return config_for("azure_blob", services, run_id, str(tmp_path))


@pytest.fixture(params=["coalesced", "alone"])
async def store(request: pytest.FixtureRequest, config: StoreConfig) -> AsyncIterator[azure_blob.AzureBlobStore]:
    """The store, with a tick's deletes joined into `_delete_many` (as always on Azure) or each sent
    to `_delete` alone (the lone path, which the template takes where a backend coalesces none)."""
    opened = await open_store(config)
    assert isinstance(opened, azure_blob.AzureBlobStore)
    opened.coalesces_deletes = request.param == "coalesced"
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture
async def container(services: Services, config: StoreConfig) -> AsyncIterator[ContainerClient]:
    """The store's container, through a client of its own."""
    service = BlobServiceClient.from_connection_string(services.azure_connection_string, retry_total=0)
    try:
        yield service.get_container_client(config.azure_container)
    finally:
        await service.close()


async def _tags_and_metadata(container: ContainerClient, log: LogId, txn: str) -> tuple[dict[str, str], dict[str, str]]:
    blob = container.get_blob_client(azure_blob._record_name(log, txn))
    return await blob.get_blob_tags(), (await blob.get_blob_properties()).metadata


async def _selected_by_the_rule(container: ContainerClient, log: LogId) -> set[str]:
    """The txn ids of `log` whose blobs the lifecycle rule's filter selects."""
    prefix = azure_blob._record_prefix(log)
    return {
        azure_blob._txn_of(prefix, blob.name)
        async for blob in container.find_blobs_by_tags(TAG_FILTER)
        if blob.name.startswith(prefix)
    }


def _expiry_within(metadata: dict[str, str], before_ms: int, after_ms: int, keep_ms: int) -> None:
    expires_ms = int(metadata[azure_blob.TOMBSTONE_EXPIRY_METADATA])
    assert before_ms + keep_ms <= expires_ms <= after_ms + keep_ms, (before_ms, expires_ms, after_ms)


def _now_ms() -> int:
    return int(time.time() * 1000)


async def test_only_tombstones_carry_the_tag_the_lifecycle_rule_deletes_by(
    store: azure_blob.AzureBlobStore, container: ContainerClient, ns: str
) -> None:
    assert (azure_blob.TOMBSTONE_TAG, azure_blob.TOMBSTONE_TAG_VALUE, azure_blob.TOMBSTONE_DAYS_TAG) == (
        TAG, TAG_VALUE, DAYS_TAG)
    log = LogId.partition(ns)
    await store.log_once(log, "voted", VOTE, body(ns))
    await store.log_once(log, "aborted", ABORT, body(ns))
    await store.log_once(log, "kept", VOTE, body(ns))
    assert await store.apply_redo(ns, "kept", {"k": b"v"})
    for txn, state, applied in (("voted", VOTE, "false"), ("aborted", ABORT, "false"), ("kept", COMMIT, "true")):
        assert await _tags_and_metadata(container, log, txn) == ({}, {"state": state, "applied": applied}), txn

    before_ms = _now_ms()
    assert await store.delete(log, "kept", keep=Tombstone(COMMIT, KEEP_MS)) is True
    assert await store.delete(log, "absent", keep=Tombstone(ABORT, KEEP_MS)) is False
    after_ms = _now_ms()
    for txn, state, applied in (("kept", COMMIT, "true"), ("absent", ABORT, "false")):
        tags, metadata = await _tags_and_metadata(container, log, txn)
        assert tags == TAGS_OF_A_DAY, txn
        assert (metadata["state"], metadata["applied"]) == (state, applied), txn
        _expiry_within(metadata, before_ms, after_ms, KEEP_MS)
    assert await _selected_by_the_rule(container, log) == {"kept", "absent"}

    # Keeping again sets the expiry anew.
    before_ms = _now_ms()
    assert await store.delete(log, "kept", keep=Tombstone(COMMIT, KEEP_MS_AGAIN)) is True
    after_ms = _now_ms()
    tags, metadata = await _tags_and_metadata(container, log, "kept")
    assert tags == TAGS_OF_A_DAY
    _expiry_within(metadata, before_ms, after_ms, KEEP_MS_AGAIN)

    # A plain delete removes a tombstone like any record.
    assert await store.delete(log, "absent") is True
    assert await _selected_by_the_rule(container, log) == {"kept"}


@pytest.mark.parametrize("decision", [COMMIT, ABORT])
async def test_a_log_over_a_tombstone_leaves_it_a_tombstone_the_rule_still_drops(
    store: azure_blob.AzureBlobStore, container: ContainerClient, ns: str, decision: TxnState
) -> None:
    """A `log` of the tombstone's own decision over it (a late decision, carrying the vote's body)
    is an idempotent rewrite on every backend, and the tombstone stays one: Redis keeps the key's
    expiry, the emulator the row's, DynamoDB the item's expires_at. Here it is a Put Blob, which
    replaces the blob's tags with those it carries: it must carry the tombstone's tag and expiry
    again, or the lifecycle rule never drops the blob (found by review: it carried none)."""
    log = LogId.partition(ns)
    await store.log_once(log, "t", VOTE, body(ns))
    if decision is COMMIT:
        assert await store.apply_redo(ns, "t", {"k": b"v"})
    # Longer than a day: the rewrite must carry the days of the keep, read from the tombstone.
    assert await store.delete(log, "t", keep=Tombstone(decision, KEEP_MS_DAYS)) is True
    kept_tags, kept_metadata = await _tags_and_metadata(container, log, "t")
    assert kept_tags == TAGS_OF_FOUR_DAYS

    assert await store.log(log, "t", decision, body(ns)) is decision
    record = await store.read(log, "t")
    assert record is not None and (record.state, record.applied, record.body) == (
        decision, decision is COMMIT, body(ns))
    assert await _tags_and_metadata(container, log, "t") == (kept_tags, kept_metadata)
    assert await _selected_by_the_rule(container, log) == {"t"}
    # Nor does a refused flip, or an apply over a COMMIT tombstone, touch it.
    with pytest.raises(DecisionFlipRefused):
        await store.log(log, "t", ABORT if decision is COMMIT else COMMIT, body(ns))
    if decision is COMMIT:
        assert await store.apply_redo(ns, "t", {"k": b"w"}) is False
    assert await _tags_and_metadata(container, log, "t") == (kept_tags, kept_metadata)
    assert (await store.read_data(ns, ["k"])) == {"k": b"v" if decision is COMMIT else None}


@pytest.mark.parametrize("decision", [COMMIT, ABORT])
async def test_a_coordinators_tombstone_is_tagged_and_stays_so_under_a_late_log(
    store: azure_blob.AzureBlobStore, container: ContainerClient, ns: str, decision: TxnState
) -> None:
    """A coordinator's own record (never applied, as no data is written from its log) becomes a
    tombstone the lifecycle rule drops, as a partition's does; its own late `log` of the decision
    (which Azure may take long after its deadline) leaves it tagged, finished, with its expiry."""
    log = LogId.coordinator(ns)
    coordinator_body = body("p0", "p1", coordinator=ns)
    assert await store.log(log, "t", VOTE, coordinator_body) is VOTE
    assert await store.log(log, "t", decision) is decision
    assert await _tags_and_metadata(container, log, "t") == ({}, {"state": decision, "applied": "false"})
    before_ms = _now_ms()
    assert await store.delete(log, "t", keep=Tombstone(decision, KEEP_MS)) is True
    after_ms = _now_ms()
    applied = "true" if decision is COMMIT else "false"
    kept_tags, kept_metadata = await _tags_and_metadata(container, log, "t")
    assert kept_tags == TAGS_OF_A_DAY
    assert (kept_metadata["state"], kept_metadata["applied"]) == (decision, applied)
    _expiry_within(kept_metadata, before_ms, after_ms, KEEP_MS)
    assert await _selected_by_the_rule(container, log) == {"t"}

    assert await store.log(log, "t", decision, coordinator_body) is decision
    record = await store.read(log, "t")
    assert record is not None and (record.state, record.applied) == (decision, decision is COMMIT), record
    assert await store.scan_unfinished(log) == []
    assert await _tags_and_metadata(container, log, "t") == (kept_tags, kept_metadata)
    assert await _selected_by_the_rule(container, log) == {"t"}


@pytest.mark.parametrize("stored", [VOTE, None], ids=["vote", "absent"])
async def test_a_keep_judges_a_record_changed_between_its_read_and_its_put(
    store: azure_blob.AzureBlobStore, container: ContainerClient, config: StoreConfig, ns: str,
    stored: TxnState | None,
) -> None:
    """Another writer decides COMMIT after the keep read the record (a vote, or no record yet):
    the ABORT tombstone's put, conditional on what was read, must lose, and the keep read again and
    refuse over the COMMIT, rather than overwrite the decision with the other one."""
    log = LogId.partition(ns)
    if stored is not None:
        await store.log_once(log, "t", stored, body(ns))
    other = await open_store(config)
    read = store._get
    raced: list[str] = []

    async def read_then_commit_elsewhere(read_log: LogId, txn: str) -> azure_blob._Stored | None:
        found = await read(read_log, txn)
        if read_log == log and txn == "t" and not raced:
            raced.append(txn)
            await other.log(log, "t", COMMIT, body(ns))
        return found

    store._get = read_then_commit_elsewhere  # type: ignore[method-assign]  (this test's store only)
    try:
        with pytest.raises(DecisionFlipRefused):
            await store.delete(log, "t", keep=Tombstone(ABORT, KEEP_MS))
    finally:
        await other.close()
    assert raced == ["t"]
    record = await store.read(log, "t")
    assert record is not None and (record.state, record.applied, record.body) == (COMMIT, False, body(ns))
    assert record.body != RecordBody()
    assert await _tags_and_metadata(container, log, "t") == ({}, {"state": COMMIT, "applied": "false"})




async def test_the_sweep_counts_only_the_tombstones_it_deleted(store: azure_blob.AzureBlobStore, ns: str) -> None:
    """Found by audit (2026-11-28, second): the sweep counted as deleted every delete it sent,
    also one refused because the tombstone was rewritten since (its newer ETag is queued too) or
    already gone: one blob counted twice, or a blob still there counted once, and a sweep falling
    behind looked healthy in `tombstones_swept`."""
    log, txn = LogId.partition(f"{ns}p"), "t1"
    assert (await store.log_once(log, txn, ABORT, body(f"{ns}p"))).created
    assert await store.delete(log, txn, keep=Tombstone(ABORT, 1))
    await store.log(log, txn, ABORT, body(f"{ns}p"))  # a late write of its own decision, over it
    await asyncio.sleep(0.05)  # both keeps have passed
    sweep = store._tombstone_sweep
    assert await sweep.sweep_once() == 1
    assert sweep.deleted_count == 1
    assert await store.read(log, txn) is None


async def test_a_data_write_refused_for_good_is_no_lost_race(
        store: azure_blob.AzureBlobStore, ns: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by audit (2026-11-28, second): an apply's data put took every 409 or 412 for a lost
    ETag race and answered "unavailable", so a refusal for good (a container under an
    immutability policy: 409 BlobImmutableDueToPolicy) was retried for ever, its keys locked and
    the logs saying "unavailable" instead of naming the refusal, as the record path already did
    (`_lost_race`)."""
    from azure.core.exceptions import ResourceExistsError
    from azure.storage.blob.aio import BlobClient

    upload = BlobClient.upload_blob

    async def refused(self: BlobClient, *args: object, **kwargs: object) -> object:
        if self.blob_name.startswith(azure_blob._data_name(ns, "k").rsplit("/", 1)[0]):
            error = ResourceExistsError(message="This operation is not permitted as the blob is immutable.")
            error.status_code, error.error_code = 409, "BlobImmutableDueToPolicy"  # as the SDK's, from the answer
            raise error
        return await upload(self, *args, **kwargs)

    await store.log_once(LogId.partition(ns), "t", VOTE, body(ns))
    monkeypatch.setattr(BlobClient, "upload_blob", refused)
    with pytest.raises(StorageError) as raised:
        await store.apply_redo(ns, "t", {"k": b"v"})
    assert not isinstance(raised.value, StorageUnavailable), raised.value
    assert "BlobImmutableDueToPolicy" in str(raised.value), raised.value
