"""Storage for cluster tests: the emulator (a SQLite file the node processes share) and Redis
(a database of the shared test server that each test empties first: one per xdist worker, since
workers run cluster tests at the same time and every cluster names its partitions p0..pN-1)."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from tests.conftest import Services
from tests.worker import redis_db_cluster


def storage_for(backend: str, services: Services, tmp_path: Path) -> dict[str, str]:
    if backend == "emulator":
        return {"backend": "emulator", "emulator_path": str(tmp_path / "cluster.db"), "timeout_ms_call": "2000"}
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


@pytest.fixture(params=["emulator", "redis"])
def storage(request: pytest.FixtureRequest, services: Services, tmp_path: Path) -> dict[str, str]:
    return storage_for(request.param, services, tmp_path)
