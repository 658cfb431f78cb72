"""What the DynamoDB adapter hands the table's Time To Live, which the conformance tests
(test_tombstones.py) cannot see: a tombstone item's `expires_at` (a Number of epoch seconds, the
unit TTL reads; milliseconds would keep it for millennia) and no body left behind; the round trips
a keep costs; the fenced keep's second round where no record was, and its bound; the emulator
that ignores ReturnValuesOnConditionCheckFailure; and the TTL that `open` checks, and enables on a
table it may manage or warns of. Against the suite's moto server, the item read raw by a client of
its own."""

from __future__ import annotations

import contextlib
import logging
import math
import time
import uuid
from collections.abc import Iterator
from itertools import product
from typing import Any

import botocore.exceptions
import botocore.session
import pytest

from storage_adapters.contract import (
    Fence,
    LogId,
    LogKind,
    RecordBody,
    Tombstone,
    TxnState,
    identity_name,
)
from storage_adapters.dynamodb import (
    OPEN_CALL_ATTEMPT_COUNT_MAX,
    TOMBSTONE_ROUND_COUNT_MAX,
    DynamoDbStore,
    _record_key,
)
from storage_adapters.errors import DecisionFlipRefused, InvariantViolation, StorageUnavailable
from tests.conftest import Services
from tests.storage.test_conformance import body, each_variant
from tests.storage.test_ownership import take_first
from tests.storage.test_tombstones import TXN_LOG_KINDS

pytestmark = pytest.mark.services

VOTE, COMMIT, ABORT = TxnState.VOTE_YES, TxnState.COMMIT, TxnState.ABORT
# Not whole seconds, so that an expiry rounded down (the tombstone gone early) shows.
KEEP_MS = 90_500
# What a record item holds besides its key and what a tombstone keeps.
BODY_ATTRIBUTES = {"participants", "coordinator", "redo"}
TOMBSTONE_ATTRIBUTES = {"pk", "sk", "state", "applied", "created_at_ms", "expires_at"}


@pytest.fixture
def raw(services: Services) -> Iterator[Any]:
    """A plain (synchronous) client of the same moto account and region as the stores."""
    client = botocore.session.get_session().create_client(
        "dynamodb", endpoint_url=services.dynamodb_endpoint, region_name="us-east-1",
        aws_access_key_id="testing", aws_secret_access_key="testing",
    )
    yield client
    client.close()


@contextlib.contextmanager
def requests_of(store: DynamoDbStore) -> Iterator[list[str]]:
    """The names of the operations `store` sends inside the block, one per round trip."""
    sent: list[str] = []

    def record(model: Any, **_: Any) -> None:
        sent.append(model.name)

    events = store._client.meta.events  # type: ignore[attr-defined]
    events.register("before-call.dynamodb.*", record)
    try:
        yield sent
    finally:
        events.unregister("before-call.dynamodb.*", record)


@contextlib.contextmanager
def return_values_on_failure(store: DynamoDbStore, returned: bool) -> Iterator[None]:
    """Inside the block, unless `returned`, make the store's requests look, to the adapter, as
    served by an emulator that ignores ReturnValuesOnConditionCheckFailure: a failed condition
    then comes back without the item."""

    def strip(params: dict[str, Any], **_: Any) -> None:
        for request in [next(iter(item.values())) for item in params.get("TransactItems", [])] or [params]:
            request.pop("ReturnValuesOnConditionCheckFailure", None)

    if returned:
        yield
        return
    events = store._client.meta.events  # type: ignore[attr-defined]
    events.register("before-parameter-build.dynamodb.*", strip)
    try:
        yield
    finally:
        events.unregister("before-parameter-build.dynamodb.*", strip)


def raw_item(raw: Any, store: DynamoDbStore, log: LogId, txn: str) -> dict[str, Any] | None:
    key = {"pk": {"S": "txn#" + log.key}, "sk": {"S": txn}}
    return raw.get_item(TableName=store._table, Key=key, ConsistentRead=True).get("Item")  # type: ignore[attr-defined]


async def committed(store: DynamoDbStore, log: LogId, txn: str) -> None:
    await store.log_once(log, txn, VOTE, body(log.name))
    assert await store.apply_redo(log.name, txn, {"k": b"v"})


async def decided(store: DynamoDbStore, log: LogId, txn: str, fence: Fence | None) -> None:
    """A COMMIT that may be kept: applied in a partition's log; in a coordinator's, as 2PC leaves
    it (never applied: no data is written from a coordinator's log)."""
    if log.kind is LogKind.PARTITION:
        await committed(store, log, txn)
    else:
        assert await store.log(log, txn, COMMIT, body("p0", "p1", coordinator=log.name), fence) is COMMIT


def identity_of(log: LogId) -> str:
    """The name of the ownership record whose fence guards `log`."""
    return identity_name(log.name) if log.kind is LogKind.COORDINATOR else log.name


# Each test below checks all its variants in turn on one store and one raw client. A case each
# spent most of its time in those fixtures, not in its few calls: opening the store (a client,
# then DescribeTable and DescribeTimeToLive, queued at the one moto server every worker shares,
# which serves a request at a time) and making the raw client; some 3 s on a loaded CI box.


async def test_a_tombstone_item_expires_at_epoch_seconds_and_holds_no_body(
    dynamodb: DynamoDbStore, raw: Any, ns: str
) -> None:
    """In both kinds of log, fenced or not, over a record or where none was."""

    async def check(ns: str, present: bool, fenced: bool, kind: LogKind) -> None:
        log = LogId(kind, ns)
        fence = (await take_first(dynamodb, identity_of(log), ns)).fence() if fenced else None
        if present:
            await decided(dynamodb, log, "t", fence)
            assert set(raw_item(raw, dynamodb, log, "t") or {}) >= BODY_ATTRIBUTES
        with requests_of(dynamodb) as sent:
            before_s = time.time()
            assert await dynamodb.delete(log, "t", fence, keep=Tombstone(COMMIT, KEEP_MS)) is present
            after_s = time.time()
        item = raw_item(raw, dynamodb, log, "t")
        assert item is not None and set(item) == TOMBSTONE_ATTRIBUTES, item
        assert (item["state"], item["applied"]) == ({"S": "COMMIT"}, {"BOOL": True})
        # A Number (TTL ignores any other type), of seconds, never before the keep ends.
        assert set(item["expires_at"]) == {"N"}, item["expires_at"]
        expires_at = int(item["expires_at"]["N"])
        assert before_s + KEEP_MS / 1000 <= expires_at <= math.ceil(after_s + KEEP_MS / 1000), (before_s, expires_at)
        # One round trip: an UpdateItem, or one transaction behind the fence; a transaction cannot
        # tell whether there was a record, so where there was none it takes a second, conditioned
        # on that.
        if not fenced:
            assert sent == ["UpdateItem"]
        else:
            assert sent == ["TransactWriteItems"] * (1 if present else 2)
        # Keeping again sets the expiry anew, from this call.
        before_s = time.time()
        assert await dynamodb.delete(log, "t", fence, keep=Tombstone(COMMIT, 2_000)) is True
        again = raw_item(raw, dynamodb, log, "t")
        assert again is not None and before_s + 2 <= int(again["expires_at"]["N"]) <= math.ceil(time.time() + 2)
        assert again["created_at_ms"] == item["created_at_ms"]

    await each_variant(ns, product([True, False], [False, True], TXN_LOG_KINDS), check)


async def test_an_abort_tombstone_over_a_vote_leaves_the_decision_alone(
    dynamodb: DynamoDbStore, raw: Any, ns: str
) -> None:
    log = LogId.partition(ns)
    await dynamodb.log_once(log, "t", VOTE, RecordBody((ns, "other"), "n1", b"x" * 1000))
    created = (await dynamodb.read(log, "t")).created_at_ms  # type: ignore[union-attr]
    assert await dynamodb.delete(log, "t", keep=Tombstone(ABORT, KEEP_MS)) is True
    item = raw_item(raw, dynamodb, log, "t")
    assert item is not None and set(item) == TOMBSTONE_ATTRIBUTES, item
    assert (item["state"], item["applied"]) == ({"S": "ABORT"}, {"BOOL": False})
    # The record's creation time stays its own.
    assert int(item["created_at_ms"]["N"]) == created
    # A plain delete removes the tombstone like any record.
    assert await dynamodb.delete(log, "t") is True
    assert raw_item(raw, dynamodb, log, "t") is None


async def test_keeps_with_the_fence_holding_answer_as_without(dynamodb: DynamoDbStore, raw: Any, ns: str) -> None:
    """A transaction's conditions are not an UpdateItem's: each answer and refusal of a fenced keep,
    also where a failed condition comes back without the stored item."""

    async def check(ns: str, fenced: bool, returned: bool) -> None:
        with return_values_on_failure(dynamodb, returned):
            log = LogId.partition(ns)
            fence = (await take_first(dynamodb, ns)).fence() if fenced else None
            await dynamodb.log_once(log, "voted", VOTE, body(ns))
            await dynamodb.log_once(log, "aborted", ABORT, body(ns))
            await dynamodb.log_once(log, "unapplied", COMMIT, body(ns))
            await committed(dynamodb, log, "applied")
            before = {txn: raw_item(raw, dynamodb, log, txn) for txn in ("voted", "aborted", "unapplied", "applied")}
            for txn in ("voted", "unapplied"):
                with pytest.raises(InvariantViolation) as refused:
                    await dynamodb.delete(log, txn, fence, keep=Tombstone(COMMIT, KEEP_MS))
                assert not isinstance(refused.value, DecisionFlipRefused), refused.value
            for txn, decision in (("aborted", COMMIT), ("applied", ABORT), ("unapplied", ABORT)):
                with pytest.raises(DecisionFlipRefused):
                    await dynamodb.delete(log, txn, fence, keep=Tombstone(decision, KEEP_MS))
            assert {txn: raw_item(raw, dynamodb, log, txn) for txn in before} == before
            assert await dynamodb.delete(log, "applied", fence, keep=Tombstone(COMMIT, KEEP_MS)) is True
            assert await dynamodb.delete(log, "voted", fence, keep=Tombstone(ABORT, KEEP_MS)) is True
            assert await dynamodb.delete(log, "absent", fence, keep=Tombstone(ABORT, KEEP_MS)) is False
            for txn, state in (("applied", "COMMIT"), ("voted", "ABORT"), ("absent", "ABORT")):
                item = raw_item(raw, dynamodb, log, txn)
                assert item is not None and set(item) == TOMBSTONE_ATTRIBUTES and item["state"]["S"] == state, item

    # Fenced or not; with the stored item returned on a failed condition, and without it.
    await each_variant(ns, product([False, True], [True, False]), check)


async def test_a_coordinators_keeps_answer_by_its_logs_rule(dynamodb: DynamoDbStore, raw: Any, ns: str) -> None:
    """In a coordinator's log the condition lets a COMMIT tombstone cover a COMMIT never applied
    (as every one there is) and still refuses it over a vote: unfenced (one UpdateItem) and behind
    the identity's fence (a transaction, and a second one where no record was). Each also where a
    failed condition comes back without the stored item."""

    async def check(ns: str, fenced: bool, returned: bool) -> None:
        with return_values_on_failure(dynamodb, returned):
            log = LogId.coordinator(ns)
            fence = (await take_first(dynamodb, identity_name(ns), ns)).fence() if fenced else None
            coordinator_body = body("p0", "p1", coordinator=ns)
            assert await dynamodb.log(log, "voted", VOTE, coordinator_body, fence) is VOTE
            assert await dynamodb.log(log, "committed", COMMIT, coordinator_body, fence) is COMMIT
            assert await dynamodb.log(log, "aborted", ABORT, coordinator_body, fence) is ABORT
            before = {txn: raw_item(raw, dynamodb, log, txn) for txn in ("voted", "committed", "aborted")}
            with pytest.raises(InvariantViolation) as refused:
                await dynamodb.delete(log, "voted", fence, keep=Tombstone(COMMIT, KEEP_MS))
            assert not isinstance(refused.value, DecisionFlipRefused), refused.value
            for txn, decision in (("committed", ABORT), ("aborted", COMMIT)):
                with pytest.raises(DecisionFlipRefused):
                    await dynamodb.delete(log, txn, fence, keep=Tombstone(decision, KEEP_MS))
            assert {txn: raw_item(raw, dynamodb, log, txn) for txn in before} == before
            assert await dynamodb.delete(log, "committed", fence, keep=Tombstone(COMMIT, KEEP_MS)) is True
            assert await dynamodb.delete(log, "voted", fence, keep=Tombstone(ABORT, KEEP_MS)) is True
            assert await dynamodb.delete(log, "absent", fence, keep=Tombstone(COMMIT, KEEP_MS)) is False
            for txn, state, applied in (
                ("committed", "COMMIT", True), ("voted", "ABORT", False), ("absent", "COMMIT", True)
            ):
                item = raw_item(raw, dynamodb, log, txn)
                assert item is not None and set(item) == TOMBSTONE_ATTRIBUTES, item
                assert (item["state"], item["applied"]) == ({"S": state}, {"BOOL": applied}), item
            assert await dynamodb.scan_unfinished(log) == []

    await each_variant(ns, product([False, True], [True, False]), check)


def record_arrives_between_rounds(store: DynamoDbStore, log: LogId, txn: str, flips: int) -> list[int]:
    """Before each of the next `flips` transactions after the first, a late LogOnce(VOTE_YES)
    creates the record (before the absence's round) or a plain delete removes it again (before the
    record's round): what may meet a fenced keep between its rounds. Returns the transaction count."""
    transact = store._transact
    count: list[int] = []

    async def racing(items: list[dict[str, Any]]) -> None:
        count.append(1)
        if 2 <= len(count) <= flips + 1:
            if len(count) % 2 == 0:
                assert (await store.log_once(log, txn, VOTE, body(log.name))).created
            else:
                assert await store.delete(log, txn) is True
        await transact(items)

    store._transact = racing  # type: ignore[method-assign]
    return count


async def test_a_fenced_keep_meets_the_record_a_late_log_once_created(dynamodb: DynamoDbStore, ns: str) -> None:
    log = LogId.partition(ns)
    fence = (await take_first(dynamodb, ns)).fence()
    count = record_arrives_between_rounds(dynamodb, log, "t", 1)
    # Absent at the first round, a vote at the second: an ABORT tombstone over it, in a third.
    assert await dynamodb.delete(log, "t", fence, keep=Tombstone(ABORT, KEEP_MS)) is True
    assert len(count) == 3
    record = await dynamodb.read(log, "t")
    assert record is not None and (record.state, record.applied, record.body) == (ABORT, False, RecordBody())
    # A COMMIT tombstone is refused over the vote, found the same way, and writes nothing.
    count = record_arrives_between_rounds(dynamodb, log, "u", 1)
    with pytest.raises(InvariantViolation):
        await dynamodb.delete(log, "u", fence, keep=Tombstone(COMMIT, KEEP_MS))
    assert len(count) == 2
    assert (await dynamodb.read(log, "u")).state is VOTE  # type: ignore[union-attr]


async def test_a_fenced_keep_gives_up_on_a_record_that_keeps_coming_and_going(
    dynamodb: DynamoDbStore, ns: str
) -> None:
    log = LogId.partition(ns)
    fence: Fence = (await take_first(dynamodb, ns)).fence()
    count = record_arrives_between_rounds(dynamodb, log, "t", TOMBSTONE_ROUND_COUNT_MAX)
    with pytest.raises(StorageUnavailable, match="came and went"):
        await dynamodb.delete(log, "t", fence, keep=Tombstone(ABORT, KEEP_MS))
    assert len(count) == TOMBSTONE_ROUND_COUNT_MAX
    # Nothing of the keep was written: the record is the late LogOnce's vote.
    record = await dynamodb.read(log, "t")
    assert record is not None and record.state is VOTE and record.body == body(ns)


def make_table(raw: Any, table: str) -> None:
    """A table as the adapter makes it, made by someone else (an operator): no TTL."""
    raw.create_table(
        TableName=table, BillingMode="PAY_PER_REQUEST",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        AttributeDefinitions=[{"AttributeName": name, "AttributeType": "S"} for name in ("pk", "sk")],
    )


def ttl_of(raw: Any, table: str) -> tuple[str | None, str | None]:
    ttl = raw.describe_time_to_live(TableName=table)["TimeToLiveDescription"]
    return ttl.get("TimeToLiveStatus"), ttl.get("AttributeName")


@pytest.fixture
def tables(raw: Any) -> Iterator[list[str]]:
    """Names for tables of this test's own (the TTL is per table), deleted afterwards."""
    names = [f"ttl-{uuid.uuid4().hex[:12]}-{i}" for i in range(3)]
    yield names
    for name in names:
        with contextlib.suppress(raw.exceptions.ResourceNotFoundException):
            raw.delete_table(TableName=name)


class _Answer:
    """What a `before-call` handler hands botocore instead of the service's answer: an HTTP error."""

    status_code = 400


def refusing(operation: str, code: str, count: int, sent: list[str]) -> type[DynamoDbStore]:
    """A DynamoDbStore whose first `count` calls of `operation` (every one: -1) the service answers
    with error `code`; `sent` gets the operation's name at each call, answered or not."""

    def answer(**_: Any) -> tuple[_Answer, dict[str, Any]] | None:
        sent.append(operation)
        if count < 0 or len(sent) <= count:
            return _Answer(), {"Error": {"Code": code, "Message": f"{code} (injected by the test)"}}
        return None

    class Refusing(DynamoDbStore):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._client.meta.events.register(f"before-call.dynamodb.{operation}", answer)

    return Refusing


def ttl_warnings(caplog: pytest.LogCaptureFixture, table: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "cornus.storage.dynamodb" and r.levelno == logging.WARNING and table in r.getMessage()]


async def test_open_enables_ttl_on_expires_at_on_every_table_it_may_manage(
    services: Services, raw: Any, tables: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    """A table the adapter may create (create_table, the default) is one it manages: it made TTL
    on expires_at only on a table it created, so an existing one without it (made by hand, or by
    an open whose TTL call failed) kept its tombstones forever (found by review). Now `open`
    checks the TTL of the table it finds, and enables it there too."""
    created, existing, _ = tables
    make_table(raw, existing)
    for table in (created, existing):
        store = await DynamoDbStore.open(table, endpoint_url=services.dynamodb_endpoint)
        await store.close()
        assert ttl_of(raw, table) == ("ENABLED", "expires_at"), table
        assert not ttl_warnings(caplog, table)
    # Found enabled, it is left alone: one DescribeTimeToLive, no UpdateTimeToLive.
    sent: list[str] = []
    store = await refusing("UpdateTimeToLive", "AccessDeniedException", -1, sent).open(
        existing, endpoint_url=services.dynamodb_endpoint)
    await store.close()
    assert sent == [] and not ttl_warnings(caplog, existing)


async def test_open_warns_once_where_tombstones_would_never_expire(
    services: Services, raw: Any, tables: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Where the store may not manage the table (create_table=False), or the TTL is on another
    attribute (a table has one TTL attribute, which is its owner's to move), `open` changes
    nothing and says once, clearly, that tombstones will never expire."""
    unmanaged, elsewhere, _ = tables
    make_table(raw, unmanaged)
    make_table(raw, elsewhere)
    raw.update_time_to_live(TableName=elsewhere, TimeToLiveSpecification={"Enabled": True, "AttributeName": "gone_at"})
    for table, create_table in ((unmanaged, False), (elsewhere, True)):
        before = ttl_of(raw, table)
        with caplog.at_level(logging.WARNING, logger="cornus.storage.dynamodb"):
            store = await DynamoDbStore.open(table, endpoint_url=services.dynamodb_endpoint, create_table=create_table)
        await store.close()
        assert ttl_of(raw, table) == before, table
        (warning,) = ttl_warnings(caplog, table)
        assert "expires_at" in warning and "never expire" in warning, warning


async def test_a_ttl_enable_that_failed_is_made_by_the_next_open(
    services: Services, raw: Any, tables: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Found by review: the TTL of a table the store created was enabled once, right after, and
    never again: if that call failed, open failed, and every later open found the table existing
    and left it without TTL. Now a refused enable is a warning (the table serves without it), and
    the next open enables it."""
    table, _, _ = tables
    sent: list[str] = []
    with caplog.at_level(logging.WARNING, logger="cornus.storage.dynamodb"):
        store = await refusing("UpdateTimeToLive", "AccessDeniedException", -1, sent).open(
            table, endpoint_url=services.dynamodb_endpoint)
    await store.close()
    # Refused for good (not retryable): asked once.
    assert sent == ["UpdateTimeToLive"]
    assert ttl_of(raw, table)[0] != "ENABLED"
    (warning,) = ttl_warnings(caplog, table)
    assert "AccessDeniedException" in warning and "never expire" in warning, warning
    store = await DynamoDbStore.open(table, endpoint_url=services.dynamodb_endpoint)
    await store.close()
    assert ttl_of(raw, table) == ("ENABLED", "expires_at")


@pytest.mark.parametrize("operation", ["DescribeTimeToLive", "UpdateTimeToLive"])
async def test_open_retries_its_ttl_calls_a_bounded_number_of_times(
    services: Services, raw: Any, tables: list[str], caplog: pytest.LogCaptureFixture, operation: str
) -> None:
    """Throttled (retryable), each TTL call is attempted again, at most OPEN_CALL_ATTEMPT_COUNT_MAX
    times, each under the call deadline; past that the table serves and open warns."""
    passing, throttled, _ = tables
    for table in (passing, throttled):
        make_table(raw, table)
    sent: list[str] = []
    store = await refusing(operation, "ThrottlingException", OPEN_CALL_ATTEMPT_COUNT_MAX - 1, sent).open(
        passing, endpoint_url=services.dynamodb_endpoint)
    await store.close()
    assert sent == [operation] * OPEN_CALL_ATTEMPT_COUNT_MAX
    assert ttl_of(raw, passing) == ("ENABLED", "expires_at")
    assert not ttl_warnings(caplog, passing)
    sent.clear()
    with caplog.at_level(logging.WARNING, logger="cornus.storage.dynamodb"):
        store = await refusing(operation, "ThrottlingException", -1, sent).open(
            throttled, endpoint_url=services.dynamodb_endpoint)
    await store.close()
    assert sent == [operation] * OPEN_CALL_ATTEMPT_COUNT_MAX
    assert ttl_of(raw, throttled)[0] != "ENABLED"
    (warning,) = ttl_warnings(caplog, throttled)
    assert "ThrottlingException" in warning, warning


async def test_the_wait_for_an_active_table_is_bounded_in_time_not_in_polls(
    dynamodb: DynamoDbStore, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by review: the wait for a table to become ACTIVE was bounded by a count of polls, and
    each poll may retry its call up to a deadline each: a slow control plane could stretch the
    minute to many. Here every poll takes 5.1 s (by a clock the test moves) and polls come every
    millisecond: the wait gives up once its minute has passed, after about a dozen polls (the old
    count would have made 60,000)."""
    from storage_adapters import dynamodb as dynamodb_module

    clock = {"s": 0.0}
    polls: list[str] = []

    async def slow_poll(call: Any, what: str) -> Any:
        if what == "create_table":
            return "CREATING", False
        polls.append(what)
        clock["s"] += 5.1  # a whole call deadline, with its retries
        return {"Table": {"TableStatus": "CREATING"}}

    monkeypatch.setattr(dynamodb_module, "TABLE_ACTIVE_POLL_MS", 1)
    monkeypatch.setattr(dynamodb_module, "time", type("Clock", (), {"monotonic": staticmethod(lambda: clock["s"])}))
    monkeypatch.setattr(dynamodb, "_open_call", slow_poll)
    with pytest.raises(StorageUnavailable, match="not ACTIVE"):
        await dynamodb._prepare_table()
    assert len(polls) <= dynamodb_module.TABLE_ACTIVE_WAIT_MS_MAX // 5_100 + 1, len(polls)


def test_a_tombstone_expiry_is_never_a_fraction_of_a_millisecond_early(monkeypatch: pytest.MonkeyPatch) -> None:
    """The expiry was counted from the clock cut to the millisecond: at 0.4 ms past a second, a
    two-second keep ended 0.4 ms before its time (seen as a flake of the test above)."""
    from storage_adapters import dynamodb as dynamodb_module

    monkeypatch.setattr(dynamodb_module, "time", type("Clock", (), {"time": staticmethod(lambda: 1_795_729_594.0004)}))
    assert dynamodb_module._expires_at_s(2_000) >= 1_795_729_594.0004 + 2


# -- a transaction cancelled for a conflict as well as a condition -----------------------------------
async def test_a_write_cancelled_for_a_conflict_on_its_fence_is_unavailable_whatever_its_record(
        dynamodb: DynamoDbStore, ns: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by audit (2026-11-27): a fenced write's transaction names a reason per item. With a
    take writing the ownership item at that moment, the fence's check is cancelled as a
    TransactionConflict, which says nothing of the fence, while the record's own condition failed:
    the adapter answered from the record alone. A `log` of COMMIT over an ABORT read as a flip
    (DecisionFlipRefused, on which a node exits), and a `log_once` as the record's state with the
    fence unchecked. Nothing was written: unavailable, to be tried again."""
    log, txn = LogId.partition(f"{ns}p"), f"{ns}t"
    taken = await take_first(dynamodb, log.name)
    assert (await dynamodb.log_once(log, txn, ABORT, body(log.name), taken.fence())).created
    stored = await dynamodb._get_item(_record_key(log, txn))
    assert stored is not None

    async def cancelled(**_: object) -> None:
        raise botocore.exceptions.ClientError({
            "Error": {"Code": "TransactionCanceledException", "Message": "Transaction cancelled"},
            "CancellationReasons": [{"Code": "TransactionConflict"},
                                    {"Code": "ConditionalCheckFailed", "Item": stored}],
            "ResponseMetadata": {"HTTPStatusCode": 400},
        }, "TransactWriteItems")

    monkeypatch.setattr(dynamodb._client, "transact_write_items", cancelled)
    with pytest.raises(StorageUnavailable, match="TransactionConflict"):
        await dynamodb.log(log, txn, COMMIT, body(log.name), taken.fence())
    with pytest.raises(StorageUnavailable, match="TransactionConflict"):
        await dynamodb.log_once(log, txn, VOTE, body(log.name), taken.fence())
