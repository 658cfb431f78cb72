"""A fenced redo too big for one DynamoDB transaction reads its record and its partition's ownership
item together (TransactGetItems) before it writes any chunk. Every fenced write of that partition
checks the ownership item and every lease renewal writes it, so on a busy partition DynamoDB
cancels that read for a TransactionConflict (tests against the suite's moto server, which serves
one request at a time and so never answers it: the answers are injected before the request
leaves, by tests/storage/test_dynamodb_conflicts.py's `conflicts`)."""

from __future__ import annotations

import pytest

from storage_adapters import dynamodb as dynamodb_module
from storage_adapters.contract import LogId, TxnState
from storage_adapters.dynamodb import DynamoDbStore
from storage_adapters.errors import StorageUnavailable
from tests.storage.test_conformance import body
from tests.storage.test_dynamodb_conflicts import conflicts
from tests.storage.test_ownership import take_first

pytestmark = pytest.mark.services

# More writes than one transaction holds (dynamodb.TRANSACT_ITEM_COUNT_MAX items, the fence's
# check and the marker among them), so the redo goes in chunks, behind the pre-read.
LARGE_REDO_KEY_COUNT = 150
assert LARGE_REDO_KEY_COUNT > dynamodb_module.TRANSACT_ITEM_COUNT_MAX


def large_redo(ns: str) -> dict[str, bytes | None]:
    return {f"{ns}-k{i:03}": f"v{i}".encode() for i in range(LARGE_REDO_KEY_COUNT)}


async def test_a_large_redo_s_ownership_read_that_met_a_transaction_is_tried_again(
    dynamodb: DynamoDbStore, ns: str,
) -> None:
    """Found by audit (2026-11-28, second): the pre-read of a redo too big for one transaction (a
    TransactGetItems of the record and `own#<partition>`) was sent once, and DynamoDB cancels it
    with a TransactionConflict whenever a fenced write's check or a lease renewal holds the
    ownership item: the apply was reported unavailable at once, so an apply of more than ~98
    keys on a busy partition could fail again and again. It is tried again, as writes are, a
    bounded number of times."""
    fence = (await take_first(dynamodb, ns)).fence()
    log = LogId.partition(ns)
    assert (await dynamodb.log_once(log, "t1", TxnState.VOTE_YES, body(ns), fence=fence)).created
    writes = large_redo(ns)
    with conflicts(dynamodb, "TransactGetItems", 2) as sent:
        assert await dynamodb.apply_redo(ns, "t1", writes, fence=fence)
    assert sent.count("TransactGetItems") == 3, sent
    assert await dynamodb.read_data(ns, list(writes)) == writes
    record = await dynamodb.read(log, "t1")
    assert record is not None and record.state is TxnState.COMMIT and record.applied


async def test_a_large_redo_s_ownership_read_gives_up_after_its_bound(dynamodb: DynamoDbStore, ns: str) -> None:
    """Found by audit (2026-11-28, second): the retried pre-read (see above) is bounded as writes
    are: CONFLICT_RETRY_COUNT_MAX retries, then unavailable, with nothing written."""
    fence = (await take_first(dynamodb, ns)).fence()
    log = LogId.partition(ns)
    assert (await dynamodb.log_once(log, "t1", TxnState.VOTE_YES, body(ns), fence=fence)).created
    writes = large_redo(ns)
    attempt_count_max = dynamodb_module.CONFLICT_RETRY_COUNT_MAX + 1
    with conflicts(dynamodb, "TransactGetItems", attempt_count_max) as sent, pytest.raises(StorageUnavailable):
        await dynamodb.apply_redo(ns, "t1", writes, fence=fence)
    assert sent.count("TransactGetItems") == attempt_count_max, sent
    assert "TransactWriteItems" not in sent, sent
    assert set((await dynamodb.read_data(ns, list(writes))).values()) == {None}
    record = await dynamodb.read(log, "t1")
    assert record is not None and record.state is TxnState.VOTE_YES and not record.applied
