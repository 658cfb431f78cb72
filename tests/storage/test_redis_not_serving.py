"""Redis's answers that say it did not run a command for a state of its own are retried, never
taken for a bug (which ends the node): as Redis 7 sends them, wrapped in a script's error as
Redis 6 (and MemoryDB 6.2) sends them, and the refusal of a connection past maxclients.

Found by audit (2026-11-28): only the first word was read, so a full Redis 6 under noeviction
("ERR Error running script ...: -OOM ...") or a demoted one (-READONLY) made every node exit on
its next write, and a new connection greeted with "max number of clients reached" handed that to
its first script's caller as a bug.
"""

from __future__ import annotations

import asyncio

import pytest
import redis.exceptions
from redis._parsers.base import BaseParser

from storage_adapters.errors import StorageUnavailable
from storage_adapters.redis_store import RedisStore
from storage_adapters.resp_pipe import RespAddress, RespPipe, ServerNotServing, not_serving
from tests.conftest import Services

TIMEOUT_MS = 5_000


@pytest.mark.parametrize("message", [
    "READONLY You can't write against a read only replica.",
    "OOM command not allowed when used memory > 'maxmemory'.",
    # Redis 6.2 and MemoryDB 6.2: the error a script's redis.call() met, inside the script's.
    "ERR Error running script (call to f_8ea5bb3c): @user_script:5: @user_script: 5: -READONLY You can't "
    "write against a read only replica.",
    "ERR Error running script (call to f_8ea5bb3c): @user_script:12: -OOM command not allowed when used memory "
    "> 'maxmemory'.",
    "ERR max number of clients reached",
])
def test_a_server_state_is_not_serving(message: str) -> None:
    assert not_serving(message)


@pytest.mark.parametrize("message", [
    "ERR wrong number of arguments for 'evalsha' command",
    "ERR Error running script (call to f_1): @user_script:3: Script attempted to access nonexistent global variable",
    "ERR Error running script (call to f_1): @user_script:2: -WRONGTYPE Operation against a key holding the wrong "
    "kind of value",
])
def test_a_bug_is_not_a_server_state(message: str) -> None:
    assert not not_serving(message)


async def test_a_connection_greeted_with_maxclients_fails_its_call_as_not_serving() -> None:
    """A server at maxclients writes its refusal as soon as it accepts, then closes. Here it comes
    after the client's first call left (as it may on a slow network), over a real socket: the
    call fails as retryable, not as an error of the call."""
    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1 << 16)  # the call the client sent
        writer.write(b"-ERR max number of clients reached\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(refuse, "127.0.0.1", 0)
    pipe = RespPipe(RespAddress("127.0.0.1", server.sockets[0].getsockname()[1]), TIMEOUT_MS)
    try:
        with pytest.raises(ServerNotServing, match="max number of clients"):
            await pipe.evalsha("0" * 40, "return 1", [], [], TIMEOUT_MS / 1000)
    finally:
        await pipe.close()
        server.close()


async def test_a_url_without_a_port_means_redis_s_default_port() -> None:
    """Found by audit (2026-11-28): "redis://host/0" (no port), which redis-py's own pool takes as
    port 6379, failed at open with a KeyError. Nothing of the suite listens on 6379: the open
    fails as the storage being unavailable there (or, on a machine with a Redis of its own on
    6379, opens it)."""
    try:
        store = await RedisStore.open("redis://127.0.0.1/15", timeout_ms_call=1_000)
    except StorageUnavailable as error:
        assert "6379" in str(error) or "onnect" in str(error), error
    else:
        await store.close()


@pytest.mark.parametrize("message", [
    "READONLY You can't write against a read only replica.",
    "OOM command not allowed when used memory > 'maxmemory'.",
    "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
    "ERR Error running script (call to f_8ea5bb3c): @user_script:5: -READONLY You can't write against a read only "
    "replica.",
    "NOREPLICAS Not enough good replicas to write.",
    "ERR max number of clients reached",
])
async def test_a_server_state_through_redis_py_is_unavailable(message: str, services: Services) -> None:
    """TLS (rediss://) and unix-socket stores run every script through redis-py, which makes its
    own exceptions of these replies, the code cut from their message (found by review: the
    message alone said nothing, and such a store's node exited on a full or demoted Redis)."""
    store = await RedisStore.open(services.redis_url, timeout_ms_call=TIMEOUT_MS)
    try:
        mapped = store._storage_error(BaseParser.parse_error(message), "test")
        assert isinstance(mapped, StorageUnavailable), (message, mapped)
    finally:
        await store.close()


async def test_a_pipe_closed_while_it_connects_keeps_no_connection() -> None:
    """Found by audit (2026-11-28): a connection that completed after close() had run was kept as
    the pipe's, open for as long as the process lived, and the call that started it was sent on
    it. A real socket server counts the connections it still holds."""
    open_count = 0

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal open_count
        open_count += 1
        while await reader.read(1 << 16):
            pass  # whatever the client sends, unanswered, until it closes
        open_count -= 1
        writer.close()

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    pipe = RespPipe(RespAddress("127.0.0.1", server.sockets[0].getsockname()[1]), TIMEOUT_MS)
    try:
        call = asyncio.create_task(pipe.evalsha("0" * 40, "return 1", [], [], TIMEOUT_MS / 1000))
        await asyncio.sleep(0)  # the call begins to connect
        await pipe.close()
        with pytest.raises(redis.exceptions.ConnectionError, match="closed"):
            await call
        async with asyncio.timeout(TIMEOUT_MS / 1000):
            while open_count:  # noqa: ASYNC110 (a plain counter of the server's, polled)
                await asyncio.sleep(0.01)
    finally:
        server.close()
