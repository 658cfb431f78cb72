"""Latency injection, configuration, the storage-bench CLI, and Redis specifics (NOSCRIPT, key layout)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.crc import key_slot

from storage_adapters.contract import LogId, RecordBody, TxnState
from storage_adapters.errors import ValidationError
from storage_adapters.factory import StoreConfig, open_store
from storage_adapters.latency import LatencyDistribution, LatencyInjectingStore, parse_latency
from tests.conftest import Services


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("fixed:2", LatencyDistribution("fixed", 2.0)),
        ("uniform:8:18", LatencyDistribution("uniform", 8.0, 18.0)),
        ("lognormal:10:30", LatencyDistribution("lognormal", 10.0, 30.0)),
    ],
)
def test_parse_latency(spec: str, expected: LatencyDistribution) -> None:
    assert parse_latency(spec) == expected


@pytest.mark.parametrize(
    "spec", ["", "bogus", "fixed", "fixed:x", "fixed:-1", "fixed:nan", "uniform:9:1", "lognormal:30:10",
             "lognormal:0:5", "fixed:1:2", "fixed:99999999"]
)
def test_parse_latency_refuses_bad_specs(spec: str) -> None:
    with pytest.raises(ValidationError):
        parse_latency(spec)


def test_lognormal_sampler_matches_its_percentiles() -> None:
    import random

    sample = parse_latency("lognormal:10:30").sampler(random.Random(7))
    values = sorted(sample() for _ in range(20_000))
    assert 9.5 < values[len(values) // 2] < 10.5
    assert 27 < values[int(len(values) * 0.99)] < 33


async def test_latency_wrapper_delays_every_call_and_keeps_semantics(tmp_path: Path) -> None:
    inner = await open_store(StoreConfig(emulator_path=str(tmp_path / "l.db")))
    store = LatencyInjectingStore(inner, parse_latency("fixed:30"), seed=1)
    try:
        log = LogId.partition("lat")
        started = time.monotonic()
        results = await asyncio.gather(*(store.log_once(log, "t", TxnState.VOTE_YES, RecordBody()) for _ in range(4)))
        # Sleeps never end early, so this lower bound is exact, not a timing guess.
        assert time.monotonic() - started >= 0.030
        assert sum(result.created for result in results) == 1
        with pytest.raises(ValidationError):
            await store.log_once(log, "bad id", TxnState.VOTE_YES, RecordBody())
        assert store.backend_name == "emulator"
    finally:
        await store.close()


def test_store_config_from_env() -> None:
    config = StoreConfig.from_env(
        {"CORNUS_STORAGE_BACKEND": "redis", "CORNUS_STORAGE_REDIS_URL": "redis://h:1/2",
         "CORNUS_STORAGE_TIMEOUT_MS_CALL": "250"},
        latency="fixed:1",
    )
    assert (config.backend, config.redis_url, config.timeout_ms_call, config.latency) == (
        "redis", "redis://h:1/2", 250, "fixed:1"
    )
    for bad in ({"CORNUS_STORAGE_BACKEND": "mysql"}, {"CORNUS_STORAGE_TIMEOUT_MS_CALL": "soon"},
                {"CORNUS_STORAGE_TIMEOUT_MS_CALL": "0"}, {"CORNUS_STORAGE_BACKEND": "azure_blob"},
                # Found by audit (2026-11-27): these passed the configuration, and failed only
                # once the store opened (its file, table or container made by then), or with a
                # traceback: "²" is a digit to str.isdigit, not to int.
                {"CORNUS_STORAGE_TIMEOUT_MS_CALL": "²"}, {"CORNUS_STORAGE_LATENCY": "bogus"}):
        with pytest.raises(ValidationError):
            StoreConfig.from_env(bad)
    for field, value in (("latency", 5), ("emulator_path", 5), ("redis_url", None), ("azure_container", 1)):
        with pytest.raises(ValidationError, match=field):
            StoreConfig(**{field: value})  # a TOML file's wrong type


def _cornus(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "services.cli", *args], check=False, capture_output=True, text=True, timeout=120,
        env={**os.environ, **(env or {})},
    )


def test_storage_bench_cli_prints_figures(tmp_path: Path) -> None:
    done = _cornus("storage-bench", "--ops", "100", "--concurrency", "8", "--latency", "fixed:1",
                   "--emulator-path", str(tmp_path / "b.db"))
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith("emulator")]
    assert [(row[1], row[2], row[3]) for row in rows] == [("fixed:1", "1", "100"), ("fixed:1", "8", "100")]
    p50, p99, ops_per_s = (float(value) for value in rows[0][4:7])
    assert 1.0 <= p50 <= p99 and ops_per_s > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--latency", "bogus"], "latency 'bogus'"),
        (["--ops", "0"], "--ops must be"),
        (["--concurrency", "5000"], "--concurrency must be"),
        (["--backend", "mysql"], "invalid choice"),
        (["--timeout-ms-call", "-5"], "timeout_ms_call"),
    ],
)
def test_storage_bench_cli_refuses_bad_input(tmp_path: Path, args: list[str], message: str) -> None:
    done = _cornus("storage-bench", "--emulator-path", str(tmp_path / "never.db"), *args)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert not (tmp_path / "never.db").exists()


async def test_redis_recovers_from_flushed_script_cache(services: Services, ns: str) -> None:
    store = await open_store(StoreConfig(backend="redis", redis_url=services.redis_url))
    client = aioredis.Redis.from_url(services.redis_url, socket_timeout=5)
    try:
        log = LogId.partition(ns)
        assert (await store.log_once(log, "a", TxnState.VOTE_YES, RecordBody())).created
        await client.script_flush()  # what a Redis restart or failover does to EVALSHA
        assert (await store.log_once(log, "b", TxnState.VOTE_YES, RecordBody())).created
        assert await store.log(log, "a", TxnState.COMMIT) is TxnState.COMMIT
    finally:
        await client.aclose()
        await store.close()


async def test_redis_key_layout_uses_hash_tags_and_separate_prefixes(services: Services, ns: str) -> None:
    store = await open_store(StoreConfig(backend="redis", redis_url=services.redis_url))
    client = aioredis.Redis.from_url(services.redis_url, socket_timeout=5, decode_responses=True)
    try:
        await store.log_once(LogId.partition(ns), "t1", TxnState.COMMIT, RecordBody())
        await store.apply_redo(ns, "t1", {"key": b"v"})
        await store.log_once(LogId.partition(ns), "t2", TxnState.VOTE_YES, RecordBody())
        keys = sorted([key async for key in client.scan_iter(match=f"*{ns}*", count=1000)])
        # t1, an applied COMMIT, is in the finished index (scan_finished_page), t2 in the unfinished one.
        assert keys == sorted([f"cxtxn:{{p.{ns}}}:t1", f"cxtxn:{{p.{ns}}}:t2", f"cxtxn:{{p.{ns}}}:~unfinished",
                               f"cxtxn:{{p.{ns}}}:~finished", f"cxdata:{{p.{ns}}}:key"])
        # One hash slot for a partition's records and data, so the scripts work on Redis Cluster.
        assert len({key_slot(key.encode()) for key in keys}) == 1
    finally:
        await client.aclose()
        await store.close()
