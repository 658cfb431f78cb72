"""Storage for cluster tests: the emulator (a SQLite file the node processes share) and Redis
(a database of the shared test server that each test empties first: one per xdist worker, since
workers run cluster tests at the same time and every cluster names its partitions p0..pN-1).

Azure Blob (Azurite) and DynamoDB (moto) too, for the crash and bank tests only when
CORNUS_EXTRA_BACKENDS asks for them (extra_backends): each test gets a container or table of its
own, dropped after it, since every cluster names its partitions alike and the services are shared."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
import redis

from storage_adapters.factory import AZURE_LEASE_MARGIN_MS, StoreConfig, open_store
from tests.conftest import Services
from tests.worker import redis_db_cluster

# Backends the crash and bank tests also run on when the variable names them (comma-separated),
# e.g. CORNUS_EXTRA_BACKENDS=azure,dynamodb: off by default, as the CI suite has no time left for
# them. They apply a commit in several requests (data first, record last), which only a kill
# between those requests exercises.
EXTRA_BACKENDS_ENV = "CORNUS_EXTRA_BACKENDS"
EXTRA_BACKENDS = ("azure", "dynamodb")
# Azurite and moto each serve every request on one thread (moto_serial.py: one at a time), shared
# by all the tests on the machine, and moto copied the whole table for every TransactWriteItems
# (until 2026-11-28: moto_serial.py backs up only the items a transaction names now): with three
# nodes and a bank workload on two loaded cores, their calls took over a second (the
# nodes logged "write_owner did not answer within 1000 ms"), so the timings the harness and the
# tests tune for SQLite and Redis lost live nodes their leases and aborted most transactions at
# the 200 ms vote timeout ("votes missing at the vote timeout": a vote is a storage write there).
# So on these backends: a 3 s call deadline (still short: a start or restart waits one), the
# production lease and renewal (a renewal may take up to the deadline; a quarter of the ownership
# traffic; Azure Blob also needs lease_ms >= renew_interval_ms + AZURE_LEASE_MARGIN_MS), a
# failover delay that still outlasts a restart that waits out that lease, and vote and decision
# timeouts of a few such calls.
EMULATED_CLOUD_BACKENDS = ("azure_blob", "dynamodb")
EMULATED_CLOUD_TIMEOUT_MS_CALL = 3_000
EMULATED_CLOUD_SETTINGS = {
    "lease_ms": 4_000,
    "renew_interval_ms": 1_000,
    "failover_delay_ms": 6_000,
    "timeout_ms_votes": 1_000,
    "timeout_ms_decision": 1_000,
    "timeout_ms_prepare": 2_000,
}
assert EMULATED_CLOUD_SETTINGS["lease_ms"] >= EMULATED_CLOUD_SETTINGS["renew_interval_ms"] + AZURE_LEASE_MARGIN_MS


def extra_backends() -> list[str]:
    """The backends CORNUS_EXTRA_BACKENDS names; a name it should not have fails the collection,
    rather than silently running none of the cases asked for."""
    names = [name.strip() for name in os.environ.get(EXTRA_BACKENDS_ENV, "").split(",") if name.strip()]
    unknown = sorted(set(names) - set(EXTRA_BACKENDS))
    if unknown:
        raise pytest.UsageError(f"{EXTRA_BACKENDS_ENV} names {unknown}; it takes {', '.join(EXTRA_BACKENDS)}")
    return names


def for_backend(storage: Mapping[str, str], settings: Mapping[str, int]) -> tuple[dict[str, str], dict[str, int]]:
    """The storage and cluster settings a test asks for, with what its backend needs on top: on
    Azurite and moto, EMULATED_CLOUD_SETTINGS and a deadline no shorter than theirs."""
    if storage["backend"] not in EMULATED_CLOUD_BACKENDS:
        return dict(storage), dict(settings)
    timeout_ms_call = max(int(storage["timeout_ms_call"]), EMULATED_CLOUD_TIMEOUT_MS_CALL)
    return {**storage, "timeout_ms_call": str(timeout_ms_call)}, {**settings, **EMULATED_CLOUD_SETTINGS}


def storage_for(backend: str, services: Services, tmp_path: Path) -> dict[str, str]:
    if backend == "emulator":
        return {"backend": "emulator", "emulator_path": str(tmp_path / "cluster.db"), "timeout_ms_call": "2000"}
    # A container or table of this test's own (xdist workers run cluster tests at once, and every
    # cluster names its partitions p0..pN-1); the nodes create it when they open the store.
    own = f"cluster-{uuid.uuid4().hex[:12]}"
    timeout_ms_call = str(EMULATED_CLOUD_TIMEOUT_MS_CALL)
    if backend == "azure":
        return {"backend": "azure_blob", "azure_connection_string": services.azure_connection_string,
                "azure_container": own, "timeout_ms_call": timeout_ms_call}
    if backend == "dynamodb":
        return {"backend": "dynamodb", "dynamodb_endpoint": services.dynamodb_endpoint, "dynamodb_table": own,
                "timeout_ms_call": timeout_ms_call}
    assert backend == "redis"
    db = redis_db_cluster()
    url = services.redis_url.rsplit("/", 1)[0] + f"/{db}"
    client = redis.Redis.from_url(services.redis_url, socket_timeout=5)
    try:
        database_count = int(client.config_get("databases")["databases"])
    except redis.ResponseError:
        database_count = None  # CONFIG refused (a managed server): SELECT below still fails loudly
    finally:
        client.close()
    if database_count is not None and db >= database_count:
        pytest.fail(f"this xdist worker needs Redis database {db}, the server has {database_count}: "
                    "run fewer workers or restart it with a larger --databases (scripts/services.sh)")
    client = redis.Redis.from_url(url, socket_timeout=5)
    client.flushdb()
    client.close()
    return {"backend": "redis", "redis_url": url, "timeout_ms_call": "2000"}


def drop_storage(storage: Mapping[str, str]) -> None:
    """Drop a test's own Azure container or DynamoDB table: Azurite and moto keep them in memory
    for as long as they run."""
    if storage["backend"] not in EMULATED_CLOUD_BACKENDS:
        return
    # The deadline of a teardown call, not the nodes' short one.
    config = StoreConfig(**{**storage, "timeout_ms_call": 30_000})  # type: ignore[arg-type]

    async def drop() -> None:
        store = await open_store(config)
        try:
            if config.backend == "azure_blob":
                await store.delete_container()  # type: ignore[attr-defined]
            else:
                await store.delete_table()  # type: ignore[attr-defined]
        finally:
            await store.close()

    asyncio.run(drop())


@pytest.fixture(params=["emulator", "redis"])
def storage(request: pytest.FixtureRequest, services: Services, tmp_path: Path) -> Iterator[dict[str, str]]:
    given = storage_for(request.param, services, tmp_path)
    yield given
    drop_storage(given)
