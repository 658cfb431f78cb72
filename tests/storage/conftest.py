"""Fixtures that open each of the four backends against its real service, isolated per test."""

from __future__ import annotations

import dataclasses
import re
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest

from storage_adapters.dynamodb import DynamoDbStore
from storage_adapters.factory import BACKENDS, StoreConfig, open_store
from storage_adapters.store import LogStore
from tests.conftest import Services

# Per-call deadline in the suite: long enough for a loaded 2-core CI box (Azurite, one Node.js
# thread, once took over 5 s to answer a burst of 64 concurrent calls while the suite's other
# workers ran node processes), short enough that a hang shows up as a failure quickly.
TIMEOUT_MS_CALL_TEST = 10_000
# moto copies the whole table for every TransactWriteItems (a correctness double, not a performance
# one), and the suite's table grows over the run: a redo of 250 writes, applied in chunks of
# transactions, took about 5 s late in a run and once over 10 s on a loaded CI box. Its calls get
# more time; a real hang still fails well within the test's own timeout.
TIMEOUT_MS_CALL_MOTO = 30_000
# Azurite (in memory, one Node.js thread) stopped answering every worker for about 13 s once, late
# in a CI run on a loaded box (2026-11-27: three tests failed on 10 s deadlines at once). Its calls
# get moto's time too; a real hang still fails within the test's own timeout.
TIMEOUT_MS_CALL_AZURITE = 30_000


@pytest.fixture(scope="session")
def run_id() -> str:
    return uuid.uuid4().hex[:10]


def config_for(backend: str, services: Services, run_id: str, tmp_dir: str) -> StoreConfig:
    if backend == "emulator":
        return StoreConfig(
            backend="emulator", emulator_path=f"{tmp_dir}/cornus.db", timeout_ms_call=TIMEOUT_MS_CALL_TEST
        )
    if backend == "redis":
        return StoreConfig(backend="redis", redis_url=services.redis_url, timeout_ms_call=TIMEOUT_MS_CALL_TEST)
    if backend == "azure_blob":
        return StoreConfig(
            backend="azure_blob",
            azure_connection_string=services.azure_connection_string,
            azure_container=f"conformance-{run_id}",
            timeout_ms_call=TIMEOUT_MS_CALL_AZURITE,
        )
    assert backend == "dynamodb"
    return StoreConfig(
        backend="dynamodb",
        dynamodb_endpoint=services.dynamodb_endpoint,
        dynamodb_table=f"conformance-{run_id}",
        timeout_ms_call=TIMEOUT_MS_CALL_MOTO,
    )


@pytest.fixture(params=BACKENDS)
async def store_config(
    request: pytest.FixtureRequest, services: Services, run_id: str, tmp_path
) -> AsyncIterator[StoreConfig]:
    """The backend's config, with a DynamoDB table or Azure container of the test's own, dropped
    after it. moto copies a whole table for every TransactWriteItems (once for each item it
    carries), so one table a worker shared, growing over the run, made each later transaction
    slower: this directory's DynamoDB tests cost moto 41 s of CPU at 3 workers, 18 s with a table
    each. Azurite's listings and lookups likewise cost less in a small container (13 s, 9 s)."""
    config = config_for(request.param, services, run_id, str(tmp_path))
    own = uuid.uuid4().hex[:8]
    if config.backend == "dynamodb":
        config = dataclasses.replace(config, dynamodb_table=f"{config.dynamodb_table}-{own}")
    elif config.backend == "azure_blob":
        config = dataclasses.replace(config, azure_container=f"{config.azure_container}-{own}")
    yield config
    if config.backend == "dynamodb":
        await drop_dynamodb_table(config)
    elif config.backend == "azure_blob":
        store = await open_store(config)
        try:
            await store.delete_container()  # type: ignore[attr-defined]
        finally:
            await store.close()


async def drop_dynamodb_table(config: StoreConfig) -> None:
    """Drop a test's own DynamoDB table (opening it creates it where the test never did)."""
    store = await open_store(config)
    try:
        await store.delete_table()  # type: ignore[attr-defined]
    finally:
        await store.close()


_EXPRESSIONS = ("UpdateExpression", "ConditionExpression", "ProjectionExpression", "KeyConditionExpression",
                "FilterExpression")


def _unused_expression_attributes(request: Mapping[str, Any]) -> list[str]:
    """The ExpressionAttributeNames and Values a DynamoDB request (or one item of a transaction)
    declares but none of its expressions uses: real DynamoDB refuses such a request with a
    ValidationException, moto lets values through."""
    text = " ".join(str(request.get(name, "")) for name in _EXPRESSIONS)
    declared = [*request.get("ExpressionAttributeNames", {}), *request.get("ExpressionAttributeValues", {})]
    return [name for name in declared if not re.search(re.escape(name) + r"(?![A-Za-z0-9_])", text)]


def refuse_what_dynamodb_refuses(store: LogStore) -> None:
    """Make the DynamoDB store's requests fail as real DynamoDB would fail them, where moto is
    more lenient (found by review: a chunked apply's ConditionCheck kept a value only the marker's
    SET used, and real DynamoDB refused every redo too big for one transaction)."""
    client = store._client  # type: ignore[attr-defined]

    def check(params: dict[str, Any], **_: Any) -> None:
        items = [next(iter(item.values())) for item in params.get("TransactItems", [])] or [params]
        for item in items:
            unused = _unused_expression_attributes(item)
            assert not unused, f"DynamoDB refuses unused expression attributes {unused}: {item}"

    client.meta.events.register("before-parameter-build.dynamodb.*", check)


@pytest.fixture
async def dynamodb(services: Services, run_id: str, tmp_path: Any) -> AsyncIterator[DynamoDbStore]:
    """A DynamoDB store on a table of its own, refusing what DynamoDB refuses and moto accepts."""
    config = config_for("dynamodb", services, f"{run_id}-{uuid.uuid4().hex[:8]}", str(tmp_path))
    store = await open_store(config)
    assert isinstance(store, DynamoDbStore)
    refuse_what_dynamodb_refuses(store)
    try:
        yield store
    finally:
        await store.close()
        await drop_dynamodb_table(config)


@pytest.fixture
async def store(store_config: StoreConfig) -> AsyncIterator[LogStore]:
    opened = await open_store(store_config)
    if store_config.backend == "dynamodb":
        refuse_what_dynamodb_refuses(opened)
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture
def ns() -> str:
    """A unique name prefix, so tests sharing one Redis/Azurite/moto never see each other's records."""
    return "t" + uuid.uuid4().hex[:12]
