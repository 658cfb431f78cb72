"""A Redis that may evict keys is refused at open (found by review, 2026-11-26): votes and
records have no TTL, decision tombstones do, and under memory pressure an `allkeys-*` policy
drops votes (a committed transaction's atomicity) and a `volatile-*` one drops tombstones first
(the status call then says "not known" of a committed transaction)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import redis

from storage_adapters.errors import StorageError
from storage_adapters.factory import StoreConfig, open_store
from tests.conftest import Services
from tests.storage import servers

TIMEOUT_MS_CALL = 5_000


async def _open(port: int, credentials: str = "") -> None:
    store = await open_store(StoreConfig(
        backend="redis", redis_url=f"redis://{credentials}127.0.0.1:{port}/0", timeout_ms_call=TIMEOUT_MS_CALL))
    await store.close()


@pytest.mark.parametrize("policy", ["volatile-lru", "allkeys-lru", "volatile-ttl", "allkeys-random"])
async def test_a_redis_that_evicts_under_a_memory_limit_is_refused(
    services: Services, tmp_path: Path, policy: str
) -> None:
    server = servers.start_redis(services, tmp_path, None, "--maxmemory", "64mb", "--maxmemory-policy", policy)
    try:
        with pytest.raises(StorageError, match=f"maxmemory-policy is {policy}.*noeviction"):
            await _open(server.port)
    finally:
        server.kill()


@pytest.mark.parametrize(("options"), [
    ("--maxmemory", "64mb", "--maxmemory-policy", "noeviction"),
    ("--maxmemory", "0", "--maxmemory-policy", "allkeys-lru"),  # no limit: nothing is ever evicted
])
async def test_a_redis_that_never_evicts_is_opened(
    services: Services, tmp_path: Path, options: tuple[str, ...]
) -> None:
    server = servers.start_redis(services, tmp_path, None, *options)
    try:
        await _open(server.port)
    finally:
        server.kill()


async def test_a_user_not_allowed_info_opens_with_a_warning(
    services: Services, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A least-privilege ACL (paper section 4.1) may deny INFO: the check is skipped, loudly."""
    server = servers.start_redis(services, tmp_path, None, "--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru")
    try:
        admin = redis.Redis(host="127.0.0.1", port=server.port)
        admin.execute_command("ACL", "SETUSER", "cornus", "on", ">secret", "~*", "+@all", "-info")
        admin.close()
        with caplog.at_level(logging.WARNING, logger="cornus.storage.redis"):
            await _open(server.port, "cornus:secret@")
        warnings = [record.getMessage() for record in caplog.records if "maxmemory-policy" in record.getMessage()]
        assert warnings, caplog.records
        assert not any("secret" in warning for warning in warnings), warnings  # the URL's password
    finally:
        server.kill()
