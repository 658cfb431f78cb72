"""Fixtures that open each of the four backends against its real service, isolated per test."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

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
            timeout_ms_call=TIMEOUT_MS_CALL_TEST,
        )
    assert backend == "dynamodb"
    return StoreConfig(
        backend="dynamodb",
        dynamodb_endpoint=services.dynamodb_endpoint,
        dynamodb_table=f"conformance-{run_id}",
        timeout_ms_call=TIMEOUT_MS_CALL_MOTO,
    )


@pytest.fixture(params=BACKENDS)
def store_config(request: pytest.FixtureRequest, services: Services, run_id: str, tmp_path) -> StoreConfig:
    return config_for(request.param, services, run_id, str(tmp_path))


@pytest.fixture
async def store(store_config: StoreConfig) -> AsyncIterator[LogStore]:
    opened = await open_store(store_config)
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture
def ns() -> str:
    """A unique name prefix, so tests sharing one Redis/Azurite/moto never see each other's records."""
    return "t" + uuid.uuid4().hex[:12]
