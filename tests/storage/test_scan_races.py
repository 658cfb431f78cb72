"""Scan pages stay full when records finish between a backend's two steps of one page (index or
listing first, records second). The conformance suite cannot hit that window; these tests build it
by writing the first step's view directly, so it disagrees with the records as a race would."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from storage_adapters import azure_blob, redis_store
from storage_adapters.contract import SCAN_ROUND_COUNT_MAX, LogId, RecordBody, TxnState
from storage_adapters.errors import StorageUnavailable
from storage_adapters.factory import open_store
from storage_adapters.store import LogStore
from tests.conftest import Services
from tests.storage.conftest import config_for


async def _page_txns(store: LogStore, log: LogId, limit: int, after: str = "") -> list[str]:
    return [record.txn for record in await store.scan_unfinished(log, limit, after)]


async def test_redis_scan_refills_past_records_gone_or_finished_after_the_index_read(
    services: Services, run_id: str, tmp_path: Path, ns: str
) -> None:
    store = await open_store(config_for("redis", services, run_id, str(tmp_path)))
    client = aioredis.Redis.from_url(services.redis_url, socket_timeout=5)
    log = LogId.partition(ns)
    try:
        for i in range(6):
            await store.log_once(log, f"r{i:02}", TxnState.VOTE_YES, RecordBody())
        # Index members without a record: deleted after the index was read. A record whose hash
        # says ABORT while the index still holds it: finished after the index was read.
        await client.zadd(redis_store._index_key(log), {"r00a": 0, "r01a": 0, "r02a": 0})
        await client.hset(redis_store._record_key(log, "r04"), "state", TxnState.ABORT.value)
        assert await _page_txns(store, log, 3) == ["r00", "r01", "r02"]
        assert await _page_txns(store, log, 3, "r02") == ["r03", "r05"]

        # More vanished members ahead than the round bound lets one page step over.
        gone = {f"a{i:02}": 0 for i in range(SCAN_ROUND_COUNT_MAX + 1)}
        await client.zadd(redis_store._index_key(log), gone)
        with pytest.raises(StorageUnavailable):
            await store.scan_unfinished(log, 1)
    finally:
        await client.aclose()
        await store.close()


async def test_azure_scan_refills_past_records_finished_after_the_listing(
    services: Services, run_id: str, tmp_path: Path, ns: str
) -> None:
    store = await open_store(config_for("azure_blob", services, run_id, str(tmp_path)))
    assert isinstance(store, azure_blob.AzureBlobStore)
    log = LogId.partition(ns)
    try:
        for i in range(6):
            await store.log_once(log, f"r{i:02}", TxnState.VOTE_YES, RecordBody())
        # The listing's metadata still says VOTE_YES, the blob itself ABORT: finished after the
        # listing was read.
        for txn in ("r01", "r03"):
            record = await store.read(log, txn)
            assert record is not None
            content, _ = azure_blob._encode_record(dataclasses.replace(record, state=TxnState.ABORT))
            stale = {"state": TxnState.VOTE_YES.value, "applied": "false"}
            blob = store._container.get_blob_client(azure_blob._record_name(log, txn))
            await blob.upload_blob(content, overwrite=True, metadata=stale)
        assert await _page_txns(store, log, 2) == ["r00", "r02"]
        assert await _page_txns(store, log, 2, "r02") == ["r04", "r05"]
        assert await _page_txns(store, log, 2, "r05") == []
    finally:
        await store.close()
