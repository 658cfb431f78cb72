"""A DynamoDB table with replicas in other regions kept eventually consistent is refused at open:
each region checks a condition on its own copy, so two nodes writing in two regions could both win
one LogOnce. Both kinds of global table: the current one (2019.11.21), whose replicas DescribeTable
lists, and the legacy one (2017.11.29), whose regions only DescribeGlobalTable names. Against the
suite's moto server, which has no global tables: the service's answers are injected before the
request leaves."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from storage_adapters import dynamodb as dynamodb_module
from storage_adapters.dynamodb import DynamoDbStore
from storage_adapters.errors import StorageError, StorageUnavailable
from storage_adapters.factory import open_store
from tests.conftest import Services
from tests.storage.conftest import config_for, drop_dynamodb_table
from tests.storage.test_dynamodb_conflicts import _Answer

pytestmark = pytest.mark.services

OTHER_REGION = "eu-west-1"
Handler = Callable[..., tuple[_Answer, dict[str, Any]] | None]


@pytest.fixture
async def table(services: Services, run_id: str, tmp_path: Any) -> AsyncIterator[str]:
    """A table of the test's own, as the adapter makes it (TTL on), dropped afterwards."""
    config = config_for("dynamodb", services, f"{run_id}-{uuid.uuid4().hex[:8]}", str(tmp_path))
    store = await open_store(config)
    await store.close()
    try:
        yield config.dynamodb_table
    finally:
        await drop_dynamodb_table(config)


def answering(answers: dict[str, Handler], sent: list[str]) -> type[DynamoDbStore]:
    """A DynamoDbStore whose requests of each operation in `answers` its handler answers (None:
    the service does); `sent` gets every operation's name, in order."""

    def record(model: Any, **_: Any) -> None:
        sent.append(model.name)

    class Answered(DynamoDbStore):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            events = self._client.meta.events
            events.register_first("before-call.dynamodb.*", record)
            for operation, answer in answers.items():
                events.register(f"before-call.dynamodb.{operation}", answer)

    return Answered


def described_with_a_replica(table: str) -> Handler:
    def answer(model: Any, **_: Any) -> tuple[_Answer, dict[str, Any]]:
        description = {"TableName": table, "TableStatus": "ACTIVE", "Replicas": [{"RegionName": OTHER_REGION}]}
        return _Answer(200), {"Table": description, "ResponseMetadata": {"HTTPStatusCode": 200}}

    return answer


def global_table_of(table: str, *regions: str) -> Handler:
    def answer(model: Any, **_: Any) -> tuple[_Answer, dict[str, Any]]:
        description = {
            "GlobalTableName": table,
            "GlobalTableStatus": "ACTIVE",
            "ReplicationGroup": [{"RegionName": region} for region in regions],
        }
        return _Answer(200), {"GlobalTableDescription": description, "ResponseMetadata": {"HTTPStatusCode": 200}}

    return answer


def no_global_table(model: Any, **_: Any) -> tuple[_Answer, dict[str, Any]]:
    return _Answer(400), {"Error": {"Code": "GlobalTableNotFoundException", "Message": "Global table not found"},
                          "ResponseMetadata": {"HTTPStatusCode": 400}}


@pytest.mark.parametrize("create_table", [False, True])
async def test_a_table_with_a_replica_is_refused_whatever_create_table_says(
    services: Services, table: str, create_table: bool,
) -> None:
    """Found by audit (2026-11-28, second): the replica check ran only inside the DescribeTable that
    `open` makes to create a missing table, so with create_table=False no DescribeTable was made
    and a global table kept eventually consistent was accepted. Now one DescribeTable is made at
    every open, and the check with it."""
    sent: list[str] = []
    with pytest.raises(StorageError, match="MultiRegionConsistency STRONG"):
        await answering({"DescribeTable": described_with_a_replica(table)}, sent).open(
            table, endpoint_url=services.dynamodb_endpoint, create_table=create_table)
    assert sent.count("DescribeTable") == 1, sent


@pytest.mark.parametrize("create_table", [False, True])
async def test_a_legacy_global_table_is_refused(services: Services, table: str, create_table: bool) -> None:
    """Found by audit (2026-11-28, second): a legacy global table (version 2017.11.29) in two regions
    was accepted, as DescribeTable lists no replicas of it; only DescribeGlobalTable names its
    regions. Its conditional writes are checked in one region each, as a current one's are."""
    sent: list[str] = []
    answers = {"DescribeGlobalTable": global_table_of(table, "us-east-1", OTHER_REGION)}
    with pytest.raises(StorageError, match=f"in regions {OTHER_REGION}, us-east-1,"):  # named sorted
        await answering(answers, sent).open(table, endpoint_url=services.dynamodb_endpoint, create_table=create_table)
    assert sent.count("DescribeTable") == 1 and sent.count("DescribeGlobalTable") == 1, sent


@pytest.mark.parametrize("one_region", [False, True], ids=["absent", "one-region"])
async def test_a_table_in_one_region_opens(services: Services, table: str, one_region: bool) -> None:
    """What real DynamoDB answers of a table in no legacy global table (GlobalTableNotFoundException),
    or in one of this region alone, is no reason to refuse it."""
    sent: list[str] = []
    answer = global_table_of(table, "us-east-1") if one_region else no_global_table
    store = await answering({"DescribeGlobalTable": answer}, sent).open(
        table, endpoint_url=services.dynamodb_endpoint, create_table=False)
    await store.close()
    assert sent.count("DescribeGlobalTable") == 1, sent


async def test_an_emulator_without_global_tables_is_not_one_but_aws_is_asked_until_it_answers(
    services: Services, table: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """moto has no DescribeGlobalTable: it answers it with a bare HTTP 500 page, which on a local
    endpoint (an emulator, of one region) says that the table is in no global table. From any
    other endpoint (DynamoDB itself) a 500 is the service failing: open is attempted again, and
    then fails as unavailable, never taking the table as checked."""
    sent: list[str] = []
    store = await answering({}, sent).open(table, endpoint_url=services.dynamodb_endpoint, create_table=False)
    await store.close()
    assert sent.count("DescribeGlobalTable") == 1, sent
    sent.clear()
    monkeypatch.setattr(dynamodb_module, "_is_local", lambda endpoint_url: False)
    monkeypatch.setattr(dynamodb_module, "OPEN_CALL_BACKOFF_MS", 1)
    with pytest.raises(StorageUnavailable, match="DescribeGlobalTable"):
        await answering({}, sent).open(
            table, endpoint_url=services.dynamodb_endpoint, create_table=False,
            aws_access_key_id="testing", aws_secret_access_key="testing")
    assert sent.count("DescribeGlobalTable") == dynamodb_module.OPEN_CALL_ATTEMPT_COUNT_MAX, sent


async def test_a_missing_table_this_store_may_not_create_is_refused_at_open(services: Services) -> None:
    """With create_table=False the DescribeTable that `open` now makes finds a missing table: open
    says so, rather than every later call failing on it."""
    with pytest.raises(StorageError, match="does not exist"):
        await DynamoDbStore.open(
            f"missing-{uuid.uuid4().hex[:12]}", endpoint_url=services.dynamodb_endpoint, create_table=False)
