"""Storage for cluster tests: the emulator (a SQLite file the node processes share) and Redis
(a database of the shared test server that each test empties first)."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from tests.conftest import Services

CLUSTER_REDIS_DB = 1  # the conformance suite uses db 0; cluster tests own this one


def storage_for(backend: str, services: Services, tmp_path: Path) -> dict[str, str]:
    if backend == "emulator":
        return {"backend": "emulator", "emulator_path": str(tmp_path / "cluster.db"), "timeout_ms_call": "2000"}
    assert backend == "redis"
    url = services.redis_url.rsplit("/", 1)[0] + f"/{CLUSTER_REDIS_DB}"
    client = redis.Redis.from_url(url, socket_timeout=5)
    client.flushdb()
    client.close()
    return {"backend": "redis", "redis_url": url, "timeout_ms_call": "2000"}


@pytest.fixture(params=["emulator", "redis"])
def storage(request: pytest.FixtureRequest, services: Services, tmp_path: Path) -> dict[str, str]:
    return storage_for(request.param, services, tmp_path)
