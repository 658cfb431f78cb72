"""`cornus storage-backfill-finished-index` (services/cli.py), end to end against the suite's real
Redis: its report and exit codes, a dry run, a Redis that does not answer (exit 1 at once, one
line), and bad input refused before anything is opened (exit 2). What the backfill indexes, record
by record, is tests/storage/test_redis_backfill_finished_index.py's."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest
import redis
import redis.asyncio

from services import cli
from storage_adapters import redis_store
from storage_adapters.contract import LogId, RecordBody, TxnState
from storage_adapters.redis_store import RedisStore
from tests.conftest import Services
from tests.worker import free_port, redis_db_cluster

# The interpreter's start and a few round trips; a run against nothing listening must not wait for
# a deadline either (the connection is refused at once).
RUN_TIMEOUT_S = 30.0
UNREACHABLE_RUN_S_MAX = 10.0
COMMAND = "storage-backfill-finished-index"


def _cornus(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "services.cli", COMMAND, *args], capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S, check=False)


@pytest.fixture
def own_url(services: Services) -> str:
    """This worker's cluster database, emptied first: the walk covers a whole database."""
    url = services.redis_url.rsplit("/", 1)[0] + f"/{redis_db_cluster()}"
    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        client.flushdb()
    finally:
        client.close()
    return url


async def _finished_records_left_out(url: str) -> None:
    """Two ABORTs and a vote in p0, the ABORTs left out of the index (an earlier version's)."""
    store = await RedisStore.open(url, timeout_ms_call=10_000)
    try:
        log = LogId.partition("p0")
        for txn, state in (("a1", TxnState.ABORT), ("a2", TxnState.ABORT), ("v1", TxnState.VOTE_YES)):
            await store.log_once(log, txn, state, RecordBody(("p0",), "n0", b"redo"))
        client = redis.asyncio.Redis.from_url(url, socket_timeout=5)
        try:
            await client.delete(redis_store._finished_key(log))
        finally:
            await client.aclose()
    finally:
        await store.close()


def _members(url: str) -> list[str]:
    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        return [member.decode() for member in client.zrange(redis_store._finished_key(LogId.partition("p0")), 0, -1)]
    finally:
        client.close()


def test_a_dry_run_then_a_run_then_a_re_run(own_url: str) -> None:
    asyncio.run(_finished_records_left_out(own_url))
    dry = _cornus("--redis-url", own_url, "--dry-run")
    assert dry.returncode == 0, f"exit {dry.returncode}:\n{dry.stdout}{dry.stderr}"
    assert "dry run" in dry.stdout and "would index: 2" in dry.stdout, dry.stdout
    assert _members(own_url) == []
    done = _cornus("--redis-url", own_url, "--scan-count", "2")
    assert done.returncode == 0, f"exit {done.returncode}:\n{done.stdout}{done.stderr}"
    for line in ("keys walked: 3", "indexed: 2", "already indexed: 0", "skipped, not finished: 1",
                 "skipped, tombstone: 0", "skipped, other: 0", "the walk reached the end of the keyspace"):
        assert line in done.stdout, done.stdout
    assert _members(own_url) == ["a1", "a2"]
    again = _cornus("--redis-url", own_url)
    assert again.returncode == 0 and "indexed: 0" in again.stdout and "already indexed: 2" in again.stdout, again


def test_an_unreachable_redis_fails_at_once_with_one_line() -> None:
    started = time.monotonic()
    done = _cornus("--redis-url", f"redis://127.0.0.1:{free_port()}/0")
    assert done.returncode == 1, f"exit {done.returncode}:\n{done.stdout}{done.stderr}"
    assert time.monotonic() - started < UNREACHABLE_RUN_S_MAX
    assert done.stderr.startswith("cornus: storage error:") and done.stderr.count("\n") == 1, done.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--redis-url", "http://127.0.0.1:6379/0"], "schemes"),
        (["--redis-url", "redis://127.0.0.1:6379/zero"], "database"),
        (["--key-count-max", "0"], "key_count_max"),
        (["--scan-count", "-1"], "scan_count"),
        (["--cursor", "-5"], "cursor"),
        (["--backend", "dynamodb"], "only the redis backend"),
        (["--backend", "emulator"], "only the redis backend"),
    ],
)
def test_bad_input_is_refused_before_anything_is_opened(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Exit 2, with the reason; nothing is opened (the store's open would be an error of its own)."""

    async def refuse_to_open(*_: object, **__: object) -> RedisStore:
        raise AssertionError("opened despite bad input")

    monkeypatch.setattr(RedisStore, "open", refuse_to_open)
    argv = [COMMAND, *args] if "--redis-url" in args else [COMMAND, "--redis-url", "redis://127.0.0.1:1/0", *args]
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_the_help_names_the_store_s_bounds(capsys: pytest.CaptureFixture[str]) -> None:
    """The parser names them without importing the Redis store (every command would pay for it)."""
    with pytest.raises(SystemExit) as exited:
        cli.main([COMMAND, "--help"])
    assert exited.value.code == 0
    shown = " ".join(capsys.readouterr().out.split())
    for value in (redis_store.BACKFILL_KEY_COUNT_DEFAULT, redis_store.BACKFILL_SCAN_COUNT_DEFAULT,
                  redis_store.BACKFILL_SCAN_COUNT_MAX):
        assert f"{value:,}" in shown, shown
