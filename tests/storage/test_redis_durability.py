"""A Redis that would lose an acknowledged write on a crash is refused at open (found by review):
a vote or decision Redis acknowledged and then lost on a restart lets a terminator log ABORT after
COMMIT was returned. `appendonly yes` with `appendfsync always` is what Cornus needs (DESIGN.md,
section 3); `redis_durability = "none"` opens one anyway, for a benchmark or a Redis whose
durability comes from elsewhere, and says so in the log. Real redis-servers, one per case."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from storage_adapters.errors import StorageError, ValidationError
from storage_adapters.factory import StoreConfig, open_store
from tests.conftest import Services
from tests.storage import servers

TIMEOUT_MS_CALL = 5_000


async def _open(port: int, durability: str = "aof") -> None:
    store = await open_store(StoreConfig(backend="redis", redis_url=f"redis://127.0.0.1:{port}/0",
                                         timeout_ms_call=TIMEOUT_MS_CALL, redis_durability=durability))
    await store.close()


@pytest.mark.parametrize(("options", "named"), [
    (("--appendonly", "no"), "appendonly"),
    (("--appendonly", "yes", "--appendfsync", "everysec"), "appendfsync is everysec"),
    (("--appendonly", "yes", "--appendfsync", "no"), "appendfsync is no"),
])
async def test_a_redis_that_may_lose_acknowledged_writes_is_refused(
    services: Services, tmp_path: Path, options: tuple[str, ...], named: str,
) -> None:
    server = servers.start_redis(services, tmp_path, None, *options)
    try:
        with pytest.raises(StorageError, match=named) as refused:
            await _open(server.port)
        assert "redis_durability" in str(refused.value)  # the way out, named
    finally:
        server.kill()


async def test_a_redis_that_writes_its_log_before_it_answers_opens(services: Services, tmp_path: Path) -> None:
    server = servers.start_redis(services, tmp_path, None, "--appendonly", "yes", "--appendfsync", "always")
    try:
        await _open(server.port)
    finally:
        server.kill()


async def test_durability_none_opens_a_redis_without_a_log_and_says_so(
    services: Services, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    server = servers.start_redis(services, tmp_path, None, "--appendonly", "no")
    try:
        with caplog.at_level(logging.WARNING, logger="cornus.storage"):
            await _open(server.port, "none")
        assert any("redis_durability none" in record.getMessage() for record in caplog.records), caplog.text
    finally:
        server.kill()


def test_the_durability_setting_is_checked_and_read_from_the_environment() -> None:
    with pytest.raises(ValidationError, match="redis_durability"):
        StoreConfig(backend="redis", redis_durability="sometimes")
    environ = {"CORNUS_STORAGE_BACKEND": "redis", "CORNUS_STORAGE_REDIS_DURABILITY": "none"}
    assert StoreConfig.from_env(environ).redis_durability == "none"
    assert StoreConfig().redis_durability == "aof"
