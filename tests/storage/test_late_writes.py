"""A storage request still on the network when its caller's deadline passes may land later, after
the caller retried and after other transactions went on; storage, not the client, must refuse
what would then undo their writes. Against the real servers, through a proxy that holds the
request (tests/storage/servers.py HoldingProxy)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from storage_adapters.contract import LogId, RecordBody, TxnState
from storage_adapters.errors import StorageUnavailable
from storage_adapters.factory import StoreConfig, open_store
from tests.conftest import Services
from tests.storage.servers import HoldingProxy

pytestmark = [pytest.mark.services, pytest.mark.timeout(120)]

# Past moto's slowest calls under the suite's load, and a hold past the deadline.
DEADLINE_MS = 2_000
HOLD_S = 3.5
DEADLINE_MS_CHECKS = 10_000
# More keys than one DynamoDB transaction carries: the redo goes in chunks.
CHUNKED_KEY_COUNT = 150


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
    partition = "late"
    log = LogId.partition(partition)
    first = {f"k{index:03d}": b"first" for index in range(CHUNKED_KEY_COUNT)}
    try:
        await store.log_once(log, "t1", TxnState.VOTE_YES, RecordBody((partition,), "n1", b"redo"))
        proxy.holding = True
        with pytest.raises(StorageUnavailable):
            await store.apply_redo(partition, "t1", first)
        proxy.holding = False
        assert await store.apply_redo(partition, "t1", first)  # the retry
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
