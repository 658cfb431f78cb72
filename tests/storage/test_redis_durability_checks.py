"""What the Redis store checks of its server beyond its settings at open (second audit of
2026-11-28): that the data it found at open is still there whenever it connects again (a server
restarted empty answers every write as if nothing had ever been written), that a short deadline
never takes a busy server's connection for a dead one, and that a new connection's writes state
their deadlines in the clock of the server they reach. Real redis-servers, one per test."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from storage_adapters.contract import LogId, Ownership, RecordBody, TxnState
from storage_adapters.errors import InvariantViolation, StorageError, StorageUnavailable
from storage_adapters.factory import StoreConfig, open_store
from storage_adapters.redis_store import RedisStore
from storage_adapters.store import CallDeadline, call_deadline_at
from tests.conftest import Services
from tests.storage import servers
from tests.storage.test_redis_batching import script_deadlines

TIMEOUT_MS_CALL = 2_000
# How long the busy script holds Redis: several times the short call's deadline, well within
# the long one's.
BUSY_MS = 300
SHORT_DEADLINE_MS = 50
# How long a test waits for the pipe to see its connection closed by a server that shut down.
LOST_TIMEOUT_S = 10.0
# A clock offset far past any call's deadline: what a failover to a server whose clock differs
# by that much leaves a store measured against the old one with.
OFFSET_ERROR_MS = 60_000
BODY = RecordBody(("p0",), "node-0", b"redo")
LOG = LogId.partition("p0")

# Holds Redis for ARGV[1] microseconds by its own clock (TIME is not frozen inside a script).
_BUSY_SCRIPT = """
local t = redis.call('TIME')
local started = t[1] * 1000000 + t[2]
repeat
  t = redis.call('TIME')
until t[1] * 1000000 + t[2] - started >= tonumber(ARGV[1])
return 1
"""


async def _open(url: str, durability: str) -> RedisStore:
    store = await open_store(StoreConfig(backend="redis", redis_url=url, timeout_ms_call=TIMEOUT_MS_CALL,
                                         redis_durability=durability))
    assert isinstance(store, RedisStore)
    return store


async def _until_pipe_lost(store: RedisStore) -> None:
    """Wait for the store's pipelined connection to see the server close it: a call made before
    the event loop heard of it would be written to the dead socket and fail as unavailable, which
    is right, but not the call this test is about."""
    pipe = store._pipe
    assert pipe is not None
    async with asyncio.timeout(LOST_TIMEOUT_S):
        while pipe._protocol is not None:  # noqa: ASYNC110 - the connection has no event for it
            await asyncio.sleep(0.01)


@pytest.mark.parametrize("unix_socket", [False, True], ids=["pipelined", "redis-py"])
async def test_a_redis_restarted_empty_fails_every_later_call_and_is_written_nothing(
    services: Services, tmp_path: Path, unix_socket: bool,
) -> None:
    """Found by audit (2026-11-28, second): a Redis without persistence (no append-only file, no
    snapshots) that its supervisor restarted came back empty, and the store went on writing to
    it: a participant's LogOnce(ABORT) found an empty slot where the VOTE_YES of a transaction
    already committed had been, and created an ABORT next to a COMMIT a client was told of. The
    open-time checks cannot see it (with durability "replicas:N" they never look at persistence,
    and a replica resyncs to its empty primary). The store now checks, on every new connection
    before any call goes out on it, that the mark it found at open is still there; a server that
    lost it lost its data, and every call from then on fails with InvariantViolation, which stops
    the node, and writes nothing. Over a TCP URL the pipelined connection checks; over a Unix
    socket (as over TLS) redis-py's connections do."""
    socket_path = tmp_path / "redis.sock"
    options = ("--appendonly", "no", *(("--unixsocket", str(socket_path)) if unix_socket else ()))
    server = servers.start_redis(services, tmp_path, None, *options)
    url = f"unix://{socket_path}?db=0" if unix_socket else f"redis://127.0.0.1:{server.port}/0"
    store = await _open(url, "none")
    try:
        assert (await store.log_once(LOG, "txn-a", TxnState.VOTE_YES, BODY)).created
        admin = aioredis.Redis(port=server.port)
        await admin.shutdown(nosave=True)
        await admin.aclose()
        server.process.wait(timeout=LOST_TIMEOUT_S)
        server.kill()
        server = servers.start_redis(services, tmp_path, server.port, *options)
        if not unix_socket:
            await _until_pipe_lost(store)
        with pytest.raises(InvariantViolation, match="lost its data"):
            await store.log_once(LOG, "txn-a", TxnState.ABORT, BODY)
        # Every later call, reads and ownership writes too, each over either kind of connection.
        with pytest.raises(InvariantViolation, match="lost its data"):
            await store.read(LOG, "txn-a")
        with pytest.raises(InvariantViolation, match="lost its data"):
            await store.write_owner(None, Ownership("p0", "node-0", 1, 1, 10_000, ""))
        with pytest.raises(InvariantViolation, match="lost its data"):
            await store.log(LOG, "txn-b", TxnState.ABORT, BODY)
        admin = aioredis.Redis(port=server.port)
        try:
            assert await admin.dbsize() == 0, await admin.keys("*")
        finally:
            await admin.aclose()
    finally:
        await store.close()
        server.kill()


async def test_a_redis_that_skips_fsync_while_it_rewrites_its_log_is_refused(
    services: Services, tmp_path: Path,
) -> None:
    """Found by audit (2026-11-28, second): with `no-appendfsync-on-rewrite yes` Redis does not
    fsync its append-only file while a rewrite (or a snapshot) runs in the background, even with
    appendfsync always: it answers writes that are not on disk, and a crash then loses them. The
    store opened such a server under durability "aof"; it refuses it now, naming the setting."""
    server = servers.start_redis(services, tmp_path, None, "--appendonly", "yes", "--appendfsync", "always",
                                 "--no-appendfsync-on-rewrite", "yes")
    try:
        with pytest.raises(StorageError, match="no-appendfsync-on-rewrite") as refused:
            await _open(f"redis://127.0.0.1:{server.port}/0", "aof")
        assert "redis_durability" in str(refused.value)  # the way out, named
    finally:
        server.kill()


async def test_a_short_deadline_never_drops_the_connection_of_a_busy_redis(
    services: Services, tmp_path: Path,
) -> None:
    """Found by audit (2026-11-28, second): without replicas, the silence the pipe allowed a
    connection was the timed-out call's own deadline, which can be tiny (a deadline fixed early
    by its caller, a batch bounded by its earliest caller's). A healthy Redis busy for a moment
    (an fsync, a fork, a slow script) got its whole connection dropped, and every call pending on
    it failed as unavailable. Now only a silence of the store's whole call timeout drops it,
    while each call still fails at its own deadline."""
    server = servers.start_redis(services, tmp_path)
    store = await _open(f"redis://127.0.0.1:{server.port}/0", "aof")
    admin = aioredis.Redis(port=server.port)
    try:
        assert (await store.log_once(LOG, "txn-connect", TxnState.VOTE_YES, BODY)).created  # the pipe connected
        pipe = store._pipe
        assert pipe is not None
        assert await admin.ping()  # connected: the script below starts at once
        busy = asyncio.ensure_future(admin.eval(_BUSY_SCRIPT, 0, BUSY_MS * 1000))
        await asyncio.sleep(BUSY_MS / 1000 / 6)  # the script runs: Redis answers nobody until it ends
        started_s = time.monotonic()
        long = asyncio.ensure_future(store.log_once(LOG, "txn-long", TxnState.VOTE_YES, BODY))
        with call_deadline_at(CallDeadline.after(SHORT_DEADLINE_MS / 1000)):
            short = asyncio.ensure_future(store.log_once(LOG, "txn-short", TxnState.VOTE_YES, BODY))
        outcomes = await asyncio.gather(long, short, return_exceptions=True)
        assert await busy == 1
        assert time.monotonic() - started_s < TIMEOUT_MS_CALL / 1000, "Redis was busy, not gone"
        assert not isinstance(outcomes[0], BaseException) and outcomes[0].created, outcomes
        assert isinstance(outcomes[1], StorageUnavailable) or outcomes[1].created, outcomes
        assert pipe.dropped_silent_count == 0
    finally:
        await admin.aclose()
        await store.close()
        server.kill()


async def test_a_connection_that_only_short_calls_wait_on_is_still_dropped_once_silent_for_a_call_timeout(
    services: Services, tmp_path: Path,
) -> None:
    """The other side of the test above: a connection gone silent (a frozen server, an address
    gone dark) that only calls with short deadlines wait on is still dropped, once it has been
    silent for the store's whole call timeout, and the next call connects again."""
    server = servers.start_redis(services, tmp_path)
    store = await _open(f"redis://127.0.0.1:{server.port}/0", "aof")
    try:
        assert (await store.log_once(LOG, "txn-connect", TxnState.VOTE_YES, BODY)).created
        pipe = store._pipe
        assert pipe is not None
        server.freeze()
        try:
            with call_deadline_at(CallDeadline.after(SHORT_DEADLINE_MS / 1000)), \
                    pytest.raises(StorageUnavailable):
                await store.log_once(LOG, "txn-frozen", TxnState.VOTE_YES, BODY)
            assert pipe.dropped_silent_count == 0, "dropped after less than a call timeout of silence"
            await asyncio.sleep(TIMEOUT_MS_CALL / 1000 * 1.5)
            assert pipe.dropped_silent_count == 1 and pipe._protocol is None
        finally:
            server.thaw()
        assert (await store.log_once(LOG, "txn-after", TxnState.VOTE_YES, BODY)).created
    finally:
        await store.close()
        server.kill()


async def test_a_new_connection_measures_redis_s_clock_before_its_first_write(
    services: Services, tmp_path: Path,
) -> None:
    """Found by audit (2026-11-28, second): the offset to Redis's clock, which every write's
    deadline is stated in (Redis refuses a script past it), was measured at open and every 30 s,
    never when the store connected again, which is when it may reach another server (a failover
    behind one address) whose clock differs: the new connection's writes carried deadlines in the
    old server's clock, up to 30 s of them, and one that reached Redis late could land past its
    caller's deadline by the difference. A new pipelined connection measures the clock again
    before its first write goes out. Here the measured offset is made wrong by a minute (as a
    failover to a server a minute ahead would leave it) and the connection is closed."""
    server = servers.start_redis(services, tmp_path)
    store = await _open(f"redis://127.0.0.1:{server.port}/0", "aof")
    admin = aioredis.Redis(port=server.port)
    try:
        assert (await store.log_once(LOG, "txn-connect", TxnState.VOTE_YES, BODY)).created
        pipe = store._pipe
        assert pipe is not None and pipe._protocol is not None and pipe._protocol.transport is not None
        store._clock_offset_ms += OFFSET_ERROR_MS
        store._clock_measured_s = time.monotonic()  # fresh: the 30 s refresh stays away
        host, port = pipe._protocol.transport.get_extra_info("sockname")[:2]
        assert await admin.client_kill_filter(_type=None, addr=f"{host}:{port}") == 1
        await _until_pipe_lost(store)
        sent = script_deadlines(store)
        assert (await store.log_once(LOG, "txn-reconnected", TxnState.VOTE_YES, BODY)).created
        seconds, microseconds = await admin.time()
        redis_now_ms = seconds * 1000 + microseconds / 1000
        assert redis_now_ms < sent[0] <= redis_now_ms + TIMEOUT_MS_CALL, (sent, redis_now_ms)
    finally:
        await admin.aclose()
        await store.close()
        server.kill()
