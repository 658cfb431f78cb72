"""DynamoDB's TransactionConflict (tests against the suite's moto server, which serves one request
at a time and so never answers it: the answers are injected before the request leaves). Every
fenced write is a transaction that checks its partition's ownership item, so concurrent fenced
writes of one partition meet there, and a lease renewal's PutItem meets them too; DynamoDB then
cancels (or refuses) the call, writing nothing."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from storage_adapters import dynamodb as dynamodb_module
from storage_adapters import store as store_module
from storage_adapters.contract import LogId, TxnState
from storage_adapters.dynamodb import DynamoDbStore
from storage_adapters.errors import StorageError, StorageUnavailable
from tests.storage.test_conformance import body
from tests.storage.test_ownership import take_first

pytestmark = pytest.mark.services


@dataclass
class _Answer:
    status_code: int = 400


@contextlib.contextmanager
def conflicts(store: DynamoDbStore, operation: str, count: int) -> Iterator[list[str]]:
    """The next `count` requests of `operation` answered as DynamoDB answers one that met another
    transaction on an item; the operations sent meanwhile, in order."""
    sent: list[str] = []

    def answer(model: Any, **_: Any) -> tuple[_Answer, dict[str, Any]] | None:
        sent.append(model.name)
        if model.name != operation or sent.count(operation) > count:
            return None
        if operation in ("TransactWriteItems", "TransactGetItems"):
            # A transaction is cancelled, with a reason per item (here: a 2-item one, its first
            # item held); a single-item call is refused.
            return _Answer(), {"Error": {"Code": "TransactionCanceledException", "Message": "cancelled"},
                               "CancellationReasons": [{"Code": "TransactionConflict"}, {"Code": "None"}],
                               "ResponseMetadata": {"HTTPStatusCode": 400}}
        return _Answer(), {"Error": {"Code": "TransactionConflictException", "Message": "conflict"},
                           "ResponseMetadata": {"HTTPStatusCode": 400}}

    events = store._client.meta.events  # type: ignore[attr-defined]
    events.register_first(f"before-call.dynamodb.{operation}", answer)
    try:
        yield sent
    finally:
        events.unregister(f"before-call.dynamodb.{operation}", answer)


async def test_a_fenced_write_that_met_another_transaction_is_tried_again(dynamodb: DynamoDbStore, ns: str) -> None:
    """Found by audit (2026-11-27): a fenced write cancelled for a TransactionConflict (nothing
    written) was reported unavailable at once, so under concurrency most fenced writes of a busy
    partition failed on DynamoDB. It is tried again, a bounded number of times."""
    fence = (await take_first(dynamodb, ns)).fence()
    log = LogId.partition(ns)
    with conflicts(dynamodb, "TransactWriteItems", 2) as sent:
        result = await dynamodb.log_once(log, "t1", TxnState.VOTE_YES, body(ns), fence=fence)
    assert result.created and sent.count("TransactWriteItems") == 3, sent
    with conflicts(dynamodb, "TransactWriteItems", dynamodb_module.CONFLICT_RETRY_COUNT_MAX + 1) as sent, \
            pytest.raises(StorageUnavailable):
        await dynamodb.log_once(log, "t2", TxnState.VOTE_YES, body(ns), fence=fence)
    assert sent.count("TransactWriteItems") == dynamodb_module.CONFLICT_RETRY_COUNT_MAX + 1, sent
    assert await dynamodb.read(log, "t2") is None


async def test_a_renewal_that_met_a_fenced_write_is_tried_again(dynamodb: DynamoDbStore, ns: str) -> None:
    """A lease renewal's PutItem refused with TransactionConflictException (a fenced write's check
    held the ownership item) failed the renewal, and enough of them the lease."""
    taken = await take_first(dynamodb, ns)
    renewed = type(taken)(taken.partition, taken.owner, taken.epoch, taken.version + 1, taken.lease_ms)
    with conflicts(dynamodb, "PutItem", 2) as sent:
        result = await dynamodb.write_owner(taken, renewed)
    assert result.written and sent.count("PutItem") == 3, sent


@pytest.mark.parametrize(("consistency", "refused"), [(None, True), ("EVENTUAL", True), ("STRONG", False)])
async def test_a_global_table_kept_eventually_consistent_is_refused(
    dynamodb: DynamoDbStore, consistency: str | None, refused: bool,
) -> None:
    """Found by audit (2026-11-27): a global table's regions check conditions each on its own copy,
    so LogOnce would not be once across them; such a table is refused at open, by name."""
    table = {"TableName": dynamodb._table, "TableStatus": "ACTIVE", "Replicas": [{"RegionName": "eu-west-1"}]}
    if consistency is not None:
        table["MultiRegionConsistency"] = consistency

    def describe(model: Any, **_: Any) -> tuple[_Answer, dict[str, Any]]:
        return _Answer(200), {"Table": table, "ResponseMetadata": {"HTTPStatusCode": 200}}

    events = dynamodb._client.meta.events  # type: ignore[attr-defined]
    events.register_first("before-call.dynamodb.DescribeTable", describe)
    try:
        if refused:
            with pytest.raises(StorageError, match="MultiRegionConsistency STRONG"):
                await dynamodb._describe_or_create_table()
        else:
            assert await dynamodb._describe_or_create_table() == ("ACTIVE", False)
    finally:
        events.unregister("before-call.dynamodb.DescribeTable", describe)


async def test_a_retry_after_a_suspend_past_the_call_s_deadline_is_not_sent(
    dynamodb: DynamoDbStore, ns: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by audit (2026-11-27): the call's deadline was checked before its first request only,
    and the template's timer runs on the event loop's clock, which a suspend stops. A machine
    suspended in the pause before a retry sent it on resume, long past the deadline in real time
    (DynamoDB takes no deadline of ours), where garbage collection's grace counts on no call of
    the node landing. Each attempt is checked against the deadline on the boot clock."""
    fence = (await take_first(dynamodb, ns)).fence()
    real_boot_clock_s = store_module.boot_clock_s
    with conflicts(dynamodb, "TransactWriteItems", 1) as sent:
        def suspended_in_the_pause(model: Any, **_: Any) -> None:
            # After the first attempt's conflict, before the second leaves: an hour suspended.
            if sent.count("TransactWriteItems") == 1:
                monkeypatch.setattr(store_module, "boot_clock_s", lambda: real_boot_clock_s() + 3_600)

        events = dynamodb._client.meta.events  # type: ignore[attr-defined]
        events.register("after-call.dynamodb.TransactWriteItems", suspended_in_the_pause)
        try:
            with pytest.raises(StorageUnavailable):
                await dynamodb.log_once(LogId.partition(ns), "t1", TxnState.VOTE_YES, body(ns), fence=fence)
        finally:
            events.unregister("after-call.dynamodb.TransactWriteItems", suspended_in_the_pause)
    assert sent.count("TransactWriteItems") == 1, sent
    monkeypatch.setattr(store_module, "boot_clock_s", real_boot_clock_s)
    assert await dynamodb.read(LogId.partition(ns), "t1") is None
