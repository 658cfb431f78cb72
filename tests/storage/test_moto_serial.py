"""scripts/moto_serial.py's TransactWriteItems, which backs up the items a transaction names rather
than moto's deep copy of every table it names: the same answers and the same tables as moto's own,
request by request, on two real servers side by side; and no table copied (in-process, where a
copy can be seen)."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import boto3
import pytest
from botocore.exceptions import ClientError

from tests.conftest import Services
from tests.storage.servers import ServerProcess
from tests.worker import free_port

HASH_TABLE = "items"  # a hash key only
RANGE_TABLE = "records"  # hash and range keys, as storage_adapters/dynamodb.py's table


def _client(port: int) -> Any:
    return boto3.client("dynamodb", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1",
                        aws_access_key_id="test", aws_secret_access_key="test")


def _create_tables(client: Any) -> None:
    client.create_table(TableName=HASH_TABLE, BillingMode="PAY_PER_REQUEST",
                        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
                        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}])
    client.create_table(TableName=RANGE_TABLE, BillingMode="PAY_PER_REQUEST",
                        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"},
                                   {"AttributeName": "sk", "KeyType": "RANGE"}],
                        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"},
                                              {"AttributeName": "sk", "AttributeType": "S"}])


def _put(table: str, pk: str, sk: str | None = None, value: str = "v", condition: str = "") -> dict[str, Any]:
    item = {"pk": {"S": pk}, "value": {"S": value}, **({"sk": {"S": sk}} if sk is not None else {})}
    return {"Put": {"TableName": table, "Item": item, **({"ConditionExpression": condition} if condition else {})}}


def _key(pk: str, sk: str | None = None) -> dict[str, Any]:
    return {"pk": {"S": pk}, **({"sk": {"S": sk}} if sk is not None else {})}


def _update(table: str, pk: str, sk: str | None = None, value: str = "new") -> dict[str, Any]:
    return {"Update": {"TableName": table, "Key": _key(pk, sk), "UpdateExpression": "SET #v = :v",
                       "ExpressionAttributeNames": {"#v": "value"},
                       "ExpressionAttributeValues": {":v": {"S": value}}}}


def _delete(table: str, pk: str, sk: str | None = None) -> dict[str, Any]:
    return {"Delete": {"TableName": table, "Key": _key(pk, sk)}}


def _absent(table: str, pk: str, sk: str | None = None) -> dict[str, Any]:
    """A ConditionCheck that fails when the item exists."""
    return {"ConditionCheck": {"TableName": table, "Key": _key(pk, sk),
                               "ConditionExpression": "attribute_not_exists(pk)"}}


# Each step: a TransactWriteItems request. The failing ones write before they fail (moto applies
# every item in turn, then rolls back), so a rollback that missed an item would show in the scans.
STEPS: list[list[dict[str, Any]]] = [
    [_put(HASH_TABLE, "a1"), _put(HASH_TABLE, "a2"), _put(RANGE_TABLE, "h1", "r1"), _put(RANGE_TABLE, "h1", "r2")],
    # Cancelled by its last item: an update in place, a new item, a delete, across both tables.
    [_update(HASH_TABLE, "a1"), _put(HASH_TABLE, "a3"), _delete(RANGE_TABLE, "h1", "r2"),
     _update(RANGE_TABLE, "h1", "r1"), _put(RANGE_TABLE, "h2", "r1"), _absent(HASH_TABLE, "a2")],
    # Cancelled by its first item: every later one still runs in moto before the rollback.
    [_absent(RANGE_TABLE, "h1", "r1"), _delete(HASH_TABLE, "a1"), _put(RANGE_TABLE, "h1", "r3")],
    # A put's own condition fails in the middle.
    [_put(HASH_TABLE, "a4"), _put(HASH_TABLE, "a2", condition="attribute_not_exists(pk)"), _delete(HASH_TABLE, "a1")],
    # One item twice: refused as invalid.
    [_put(HASH_TABLE, "a5"), _update(HASH_TABLE, "a5")],
    # Malformed after a valid item (a put without its range key): moto's own backup path.
    [_put(RANGE_TABLE, "h3", "r1"), {"Put": {"TableName": RANGE_TABLE, "Item": {"pk": {"S": "h3"}}}}],
    # A table that does not exist, after a valid item.
    [_put(HASH_TABLE, "a6"), _put("missing", "x")],
    # And what succeeds after all that.
    [_update(HASH_TABLE, "a1", value="last"), _delete(HASH_TABLE, "a2"), _put(RANGE_TABLE, "h1", "r4")],
]


def _answer(client: Any, items: list[dict[str, Any]]) -> tuple[str, str, tuple[str, ...]]:
    try:
        client.transact_write_items(TransactItems=items)
    except ClientError as error:
        reasons = tuple(reason.get("Code", "") for reason in error.response.get("CancellationReasons", []))
        return error.response["Error"]["Code"], error.response["Error"].get("Message", ""), reasons
    return "ok", "", ()


def _tables(client: Any) -> dict[str, list[dict[str, Any]]]:
    return {table: sorted(client.scan(TableName=table)["Items"], key=repr) for table in (HASH_TABLE, RANGE_TABLE)}


@pytest.fixture
def servers(services: Services) -> Iterator[tuple[Any, Any]]:
    """Two moto servers through the launcher the suite uses: its item backups, and moto's own."""
    launcher = services.get("CORNUS_MOTO_LAUNCHER")
    started: list[ServerProcess] = []
    try:
        for extra in ([], ["--whole-table-backups"]):
            port = free_port()
            started.append(ServerProcess([sys.executable, launcher, "-H", "127.0.0.1", "-p", str(port), *extra], port))
        yield _client(started[0].port), _client(started[1].port)
    finally:
        for server in started:
            server.kill()


def test_item_backups_answer_and_roll_back_as_moto_does(servers: tuple[Any, Any]) -> None:
    ours, moto = servers
    for client in servers:
        _create_tables(client)
    answers = []
    for index, items in enumerate(STEPS):
        answer = _answer(ours, items)
        assert answer == _answer(moto, items), f"step {index}"
        assert _tables(ours) == _tables(moto), f"the tables after step {index}"
        answers.append(answer[0])
    # The steps reach what they are for: commits, cancellations and refusals.
    assert answers[0] == answers[-1] == "ok"
    assert answers[1:4] == ["TransactionCanceledException"] * 3, answers
    assert answers[4] == "ValidationException", answers
    after = _tables(ours)
    assert {item["pk"]["S"]: item["value"]["S"] for item in after[HASH_TABLE]} == {"a1": "last"}
    assert sorted((item["pk"]["S"], item["sk"]["S"]) for item in after[RANGE_TABLE]) == [
        ("h1", "r1"), ("h1", "r2"), ("h1", "r4")]


@pytest.fixture
def moto_serial(monkeypatch: pytest.MonkeyPatch) -> Any:
    """scripts/moto_serial.py, loaded in this process, its patch undone after the test."""
    from moto.dynamodb import models

    path = Path(__file__).resolve().parents[2] / "scripts" / "moto_serial.py"
    spec = importlib.util.spec_from_file_location("moto_serial_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(models.DynamoDBBackend, "transact_write_items", models.DynamoDBBackend.transact_write_items)
    monkeypatch.setattr(models, "copy", models.copy)
    return module


def test_no_table_is_copied_but_for_a_malformed_request(moto_serial: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import moto
    from moto.dynamodb.models.table import Table

    moto_serial.patch_transactions()
    copied: list[str] = []
    deepcopy = moto_serial._copy_module.deepcopy

    def counted(value: Any, memo: dict[int, Any] | None = None) -> Any:
        result = deepcopy(value, memo)
        if isinstance(value, Table) and result is not value:
            copied.append(value.name)
        return result

    monkeypatch.setattr(moto_serial._copy_module, "deepcopy", counted)
    with moto.mock_aws():
        client = boto3.client("dynamodb", region_name="us-east-1", aws_access_key_id="test",
                              aws_secret_access_key="test")
        _create_tables(client)
        assert _answer(client, STEPS[0])[0] == "ok"
        assert _answer(client, STEPS[1])[0] == "TransactionCanceledException"
        assert copied == []
        assert _answer(client, STEPS[5])[0] != "ok"  # malformed: moto's own backup of the table it names
        assert set(copied) == {RANGE_TABLE}  # once for each of its items that names it


def test_expired_items_are_deleted_as_dynamodb_ttl_does(services: Services) -> None:
    """moto never deletes an item past its TTL; the launcher does (DynamoDB does, some time after
    expiry), so that a long run's tombstones do not pile up under every Query."""
    port = free_port()
    argv = [sys.executable, services.get("CORNUS_MOTO_LAUNCHER"), "-H", "127.0.0.1", "-p", str(port)]
    with mock.patch.dict(os.environ, {"CORNUS_MOTO_TTL_SWEEP_S": "0.2"}):
        server = ServerProcess(argv, port)
    try:
        client = _client(port)
        _create_tables(client)
        client.update_time_to_live(TableName=RANGE_TABLE,
                                   TimeToLiveSpecification={"Enabled": True, "AttributeName": "expires"})
        now_s = int(time.time())
        items = {("h1", "past"): {"N": str(now_s - 60)}, ("h1", "future"): {"N": str(now_s + 3_600)},
                 ("h2", "past"): {"N": str(now_s - 1)}, ("h2", "text"): {"S": str(now_s - 60)},
                 ("h3", "none"): None}
        for (pk, sk), expires in items.items():
            client.put_item(TableName=RANGE_TABLE, Item={"pk": {"S": pk}, "sk": {"S": sk},
                                                        **({"expires": expires} if expires else {})})
        # The same item in a table without TTL: kept.
        client.put_item(TableName=HASH_TABLE, Item={"pk": {"S": "x"}, "expires": {"N": str(now_s - 60)}})
        deadline = time.monotonic() + 10
        while True:
            left = sorted((item["pk"]["S"], item["sk"]["S"]) for item in client.scan(TableName=RANGE_TABLE)["Items"])
            if left == [("h1", "future"), ("h2", "text"), ("h3", "none")] or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert left == [("h1", "future"), ("h2", "text"), ("h3", "none")]  # a text attribute is no TTL
        assert len(client.scan(TableName=HASH_TABLE)["Items"]) == 1
        assert client.query(TableName=RANGE_TABLE, KeyConditionExpression="pk = :pk",
                            ExpressionAttributeValues={":pk": {"S": "h2"}})["Count"] == 1
    finally:
        server.kill()
