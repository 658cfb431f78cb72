"""A Redis whose durability is its replicas (ElastiCache, Azure Cache: no fsync per write, and
replication is asynchronous) loses a write it acknowledged when its primary dies before the write
reached a replica and the replica is promoted. `redis_durability = "replicas:N"` answers a write
only once N replicas have it (WAIT after the write, on the same connection), and refuses a server
that has fewer. Real redis-servers: a primary and its replica, whose replication stream goes
through a proxy that can cut it, so a write can be on the primary and on no replica."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from storage_adapters.contract import LogId, Ownership, RecordBody, Tombstone, TxnState
from storage_adapters.errors import StorageError, StorageUnavailable, ValidationError
from storage_adapters.factory import StoreConfig, open_store
from storage_adapters.redis_store import RedisStore
from storage_adapters.resp_pipe import RespAddress, RespPipe
from storage_adapters.store import LogStore
from tests.conftest import Services
from tests.storage import servers

# A write the replicas never acknowledge fails within it: long enough for a loaded machine.
TIMEOUT_MS_CALL = 4_000
LINK_TIMEOUT_S = 30.0
BODY = RecordBody(("p0",), "node-0", b"redo")
LOG = LogId.partition("p0")


@dataclass
class Pair:
    primary: servers.ServerProcess
    replica: servers.ServerProcess
    link: servers.HoldingProxy  # the replica's connection to its primary goes through it
    primary_url: str

    async def promote(self) -> LogStore:
        """The primary dies, its replica takes over (what a failover does): a store over it."""
        self.primary.kill()
        self.link.close()
        client = aioredis.Redis(port=self.replica.port)
        await client.replicaof("NO", "ONE")
        await client.aclose()
        return await open_store(StoreConfig(backend="redis", redis_url=f"redis://127.0.0.1:{self.replica.port}/0",
                                            timeout_ms_call=TIMEOUT_MS_CALL, redis_durability="none"))


async def _until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + LINK_TIMEOUT_S
    while not await check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def replicated(services: Services, tmp_path: Path, unix_socket: bool = False) -> AsyncIterator[Pair]:
    (tmp_path / "primary").mkdir()
    (tmp_path / "replica").mkdir()
    socket_path = tmp_path / "primary.sock"
    # No append-only file on either: the replicas are the durability here, as on the managed
    # services. No delay before the full sync's transfer, which otherwise waits 5 s for others.
    primary = servers.start_redis(services, tmp_path / "primary", None, "--appendonly", "no",
                                  "--repl-diskless-sync-delay", "0",
                                  *(("--unixsocket", str(socket_path)) if unix_socket else ()))
    link = await servers.HoldingProxy(primary.port, lambda _: False, 0).start()
    replica = servers.start_redis(services, tmp_path / "replica", None, "--appendonly", "no",
                                  "--replicaof", "127.0.0.1", str(link.port))
    url = f"unix://{socket_path}?db=0" if unix_socket else f"redis://127.0.0.1:{primary.port}/0"
    primary_client, replica_client = aioredis.Redis(port=primary.port), aioredis.Redis(port=replica.port)
    try:
        async def linked() -> bool:
            # Online at the primary too, as the store's check at open counts a replica (found by a
            # loaded CI run: the replica's link was up, the primary's "slave0" not online yet, and
            # a store opened with replicas:1 then was refused).
            replication = await replica_client.info("replication")
            at_primary = await primary_client.info("replication")
            replica_0 = at_primary.get("slave0")
            return (replication.get("master_link_status") == "up" and at_primary.get("connected_slaves") == 1
                    and isinstance(replica_0, dict) and replica_0.get("state") == "online")

        await _until(linked, "the replica never synced with its primary")
        yield Pair(primary, replica, link, url)
    finally:
        await primary_client.aclose()
        await replica_client.aclose()
        link.close()
        primary.kill()
        replica.kill()


async def _open(url: str, durability: str) -> RedisStore:
    store = await open_store(StoreConfig(backend="redis", redis_url=url, timeout_ms_call=TIMEOUT_MS_CALL,
                                         redis_durability=durability))
    assert isinstance(store, RedisStore)
    return store


async def _on_replica(pair: Pair, store: LogStore, txn: str) -> None:
    """Wait until the replica has `txn`'s record, the last write before the stream is cut."""
    client = aioredis.Redis(port=pair.replica.port)
    try:
        async def arrived() -> bool:
            return bool(await client.keys(f"cxtxn:*:{txn}"))

        await _until(arrived, f"{txn} never reached the replica")
    finally:
        await client.aclose()


async def test_without_waiting_a_failover_loses_an_acknowledged_vote(services: Services, tmp_path: Path) -> None:
    """What `replicas:N` is for, shown on what opens today (durability none): the harness can
    lose a write, so the test below can fail."""
    async with replicated(services, tmp_path) as pair:
        store = await _open(pair.primary_url, "none")
        await store.log_once(LOG, "txn-a", TxnState.VOTE_YES, BODY)
        await _on_replica(pair, store, "txn-a")
        pair.link.cutting = True
        acknowledged = await store.log_once(LOG, "txn-b", TxnState.VOTE_YES, BODY)
        assert acknowledged.created
        await store.close()
        promoted = await pair.promote()
        try:
            assert (await promoted.read(LOG, "txn-a")) is not None
            assert (await promoted.read(LOG, "txn-b")) is None, "the acknowledged vote was lost"
        finally:
            await promoted.close()


@pytest.mark.parametrize("unix_socket", [False, True], ids=["pipelined", "redis-py"])
async def test_with_replicas_every_acknowledged_write_survives_a_failover(
    services: Services, tmp_path: Path, unix_socket: bool,
) -> None:
    """Each kind of write (a vote, a decision, an apply, a delete, an ownership write) is answered
    only once the replica has it: with the stream cut, each fails (outcome unknown, as after a
    timeout) instead, and whatever was answered before is on the promoted replica. Over a TCP URL
    the hot scripts go through the store's own pipelined connection; over a Unix socket (as over
    TLS) through redis-py: both paths are checked."""
    async with replicated(services, tmp_path, unix_socket) as pair:
        store = await _open(pair.primary_url, "replicas:1")
        owner = Ownership("p0", "node-0", 1, 1, 10_000, "")
        try:
            # Redis lost its scripts (a restart, SCRIPT FLUSH): each call that meets NOSCRIPT is sent
            # again, and answered after the WAIT that follows it.
            primary_client = aioredis.Redis(port=pair.primary.port)
            await primary_client.script_flush()
            await primary_client.aclose()
            # Concurrent: one tick's writes share a WAIT on the pipelined connection.
            await asyncio.gather(*(store.log_once(LOG, f"txn-{index}", TxnState.VOTE_YES, BODY)
                                   for index in range(20)))
            assert (store._pipe is None) == unix_socket
            if store._pipe is not None:
                assert 1 <= store._pipe.wait_count < 5, store._pipe.wait_count
            await store.log(LOG, "txn-0", TxnState.COMMIT)
            await store.apply_redo("p0", "txn-0", {"k": b"v"})
            await store.delete(LOG, "txn-1", keep=Tombstone(TxnState.ABORT, 60_000))
            assert (await store.write_owner(None, owner)).written
            pair.link.cutting = True
            started_s = time.monotonic()
            late = await asyncio.gather(
                store.log_once(LOG, "txn-late", TxnState.VOTE_YES, BODY),
                store.log(LOG, "txn-2", TxnState.ABORT),
                store.apply_redo("p0", "txn-3", {"k": b"late"}),
                store.delete(LOG, "txn-4"),
                store.write_owner(owner, Ownership("p0", "node-1", 2, 2, 10_000, "")),
                return_exceptions=True,
            )
            # None answered: each failed as unavailable (its outcome unknown). The first says
            # why; one queued behind another's WAIT may run out of its deadline first.
            assert all(isinstance(outcome, StorageUnavailable) for outcome in late), late
            assert "replicas" in str(late[0]), late[0]
            assert time.monotonic() - started_s < 2 * TIMEOUT_MS_CALL / 1000, "within their deadlines"
        finally:
            await store.close()
        promoted = await pair.promote()
        try:
            for index in range(20):
                record = await promoted.read(LOG, f"txn-{index}")
                assert record is not None or index == 1, f"txn-{index}'s acknowledged vote was lost"
            committed = await promoted.read(LOG, "txn-0")
            assert committed is not None and committed.state is TxnState.COMMIT and committed.applied
            assert (await promoted.read_data("p0", ["k"])) == {"k": b"v"}
            tombstone = await promoted.read(LOG, "txn-1")
            assert tombstone is not None and tombstone.state is TxnState.ABORT
            assert (await promoted.read_owners(["p0"]))["p0"] == owner
        finally:
            await promoted.close()


async def test_a_redis_with_fewer_replicas_than_asked_is_refused(services: Services, tmp_path: Path) -> None:
    async with replicated(services, tmp_path) as pair:
        with pytest.raises(StorageUnavailable, match=r"1 replica\(s\) in sync.*replicas:2"):
            await _open(pair.primary_url, "replicas:2")
        # A replica is not the primary: its writes are refused anyway, said at open.
        with pytest.raises(StorageError, match="not a primary"):
            await _open(f"redis://127.0.0.1:{pair.replica.port}/0", "replicas:1")
        store = await _open(pair.primary_url, "replicas:1")
        await store.close()


@pytest.mark.parametrize("value", ["replicas", "replicas:0", "replicas:x", "replicas:10", "replicas:-1", "aof:1",
                                   "replicas:01", "replicas:\u00b2", "replicas:\u0663", " replicas:1"])
def test_the_replica_count_is_checked(value: str) -> None:
    with pytest.raises(ValidationError, match="redis_durability"):
        StoreConfig(backend="redis", redis_durability=value)
    with pytest.raises(ValidationError, match="redis_durability must be a string"):  # a TOML number
        StoreConfig(backend="redis", redis_durability=2)  # type: ignore[arg-type]
    assert StoreConfig(backend="redis", redis_durability="replicas:2").redis_durability == "replicas:2"


async def test_a_call_with_a_short_deadline_behind_a_waiting_wait_does_not_drop_the_connection(
    services: Services, tmp_path: Path,
) -> None:
    """Found by review: Redis holds a connection's later commands while its WAIT waits, so a call
    sent behind one hears nothing for up to WAIT's timeout. A call whose deadline is shorter than
    that (a deadline cut short by its caller's) took the silence for a dead connection and dropped
    it, failing the writes before it that the replica was about to confirm."""
    async with replicated(services, tmp_path) as pair:
        client = aioredis.Redis(port=pair.primary.port)
        source = "return redis.call('SET', KEYS[1], ARGV[1])"
        sha = await client.script_load(source)
        await client.aclose()
        pipe = RespPipe(RespAddress("127.0.0.1", pair.primary.port), TIMEOUT_MS_CALL, 1, TIMEOUT_MS_CALL // 2)
        try:
            assert await pipe.evalsha(sha, source, ["warm"], ["1"], 1.0) == b"OK"
            # The replica's acknowledgements now reach the primary half a second late: writes
            # are replicated, and each WAIT waits about that long.
            pair.link.holds, pair.link.hold_s, pair.link.holding = (lambda _: True), 0.5, True
            first = asyncio.ensure_future(pipe.evalsha(sha, source, ["first"], ["1"], TIMEOUT_MS_CALL / 1000))
            await asyncio.sleep(0.05)  # its script answered; its WAIT waits
            with pytest.raises(TimeoutError):
                await pipe.evalsha(sha, source, ["short"], ["1"], 0.2)
            assert await first == b"OK"
            assert pipe.dropped_silent_count == 0
        finally:
            await pipe.close()


async def test_a_replica_still_syncing_does_not_count(services: Services, tmp_path: Path) -> None:
    """Found by review: INFO's connected_slaves counts a replica that has not received its first
    copy yet, which can acknowledge no write; the open passed and every write then failed."""
    (tmp_path / "primary").mkdir()
    (tmp_path / "replica").mkdir()
    # The first copy waits this long to leave (Redis's way to gather replicas for one transfer):
    # the replica is connected, and not in sync, all along.
    primary = servers.start_redis(services, tmp_path / "primary", None, "--appendonly", "no",
                                  "--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "30")
    replica = servers.start_redis(services, tmp_path / "replica", None, "--appendonly", "no",
                                  "--replicaof", "127.0.0.1", str(primary.port))
    client = aioredis.Redis(port=primary.port)
    try:
        async def connected() -> bool:
            return (await client.info("replication")).get("connected_slaves") == 1

        await _until(connected, "the replica never connected")
        with pytest.raises(StorageUnavailable, match="0 replica"):
            await _open(f"redis://127.0.0.1:{primary.port}/0", "replicas:1")
    finally:
        await client.aclose()
        primary.kill()
        replica.kill()


@pytest.mark.parametrize("unix_socket", [False, True], ids=["pipelined", "redis-py"])
async def test_with_replicas_a_read_answers_only_what_the_replicas_have(
    services: Services, tmp_path: Path, unix_socket: bool,
) -> None:
    """A record another connection wrote that no replica has yet (its writer still waits, or
    failed) is not read as there: a status call would report an outcome that a failover then
    loses (an ABORT that vanishes, and the transaction commits). Until 2026-11-27 reads waited
    for nothing and returned it."""
    async with replicated(services, tmp_path, unix_socket) as pair:
        writer = await _open(pair.primary_url, "none")
        reader = await _open(pair.primary_url, "replicas:1")
        try:
            await writer.log_once(LOG, "txn-a", TxnState.VOTE_YES, BODY)
            await _on_replica(pair, writer, "txn-a")
            assert (await reader.read(LOG, "txn-a")) is not None  # replicated: read as before
            pair.link.cutting = True
            await writer.log_once(LOG, "txn-b", TxnState.ABORT, BODY)  # on the primary only
            with pytest.raises(StorageUnavailable, match="replica"):
                await reader.read(LOG, "txn-b")
        finally:
            await writer.close()
            await reader.close()


@contextlib.asynccontextmanager
async def _marked_stores(pair: Pair) -> AsyncIterator[tuple[RedisStore, RedisStore, aioredis.Redis, str]]:
    """A store writing without waiting for replicas, one in durability "replicas:1", a client of
    the primary, and the key of LOG's read mark (which the found paths bump)."""
    plain = await _open(pair.primary_url, "none")
    replicated_store = await _open(pair.primary_url, "replicas:1")
    primary = aioredis.Redis(port=pair.primary.port)
    try:
        yield plain, replicated_store, primary, f"cxtxn:{{{LOG.key}}}:~read"
    finally:
        await primary.aclose()
        await plain.close()
        await replicated_store.close()


async def test_with_replicas_a_log_once_that_finds_a_record_answers_only_what_the_replicas_have(
    services: Services, tmp_path: Path,
) -> None:
    """Found by audit (2026-11-28): a log_once that found a record wrote nothing, so the WAIT after
    it covered only its connection's earlier writes, not the record it found. A Cornus
    coordinator's termination that finds every vote yes replies COMMIT with no write of its own,
    and a participant's retried vote that finds its own first write says yes: a failover then
    could lose the vote the answer rested on. The found path bumps the log's read mark, as a read
    does, so its WAIT covers what it found. (Redis often moves a connection's offset anyway, when
    a command of it flushes propagation queued by others, so the WAIT alone fails to show it: the
    mark is what the test checks, and then that the answer waits for the replicas.)"""
    async with replicated(services, tmp_path) as pair, _marked_stores(pair) as (writer, terminator, primary, mark):
        await writer.log_once(LOG, "txn-a", TxnState.VOTE_YES, BODY)
        await _on_replica(pair, writer, "txn-a")
        found = await terminator.log_once(LOG, "txn-a", TxnState.ABORT, BODY)  # replicated: as before
        assert found.state is TxnState.VOTE_YES and not found.created
        assert await primary.get(mark) == b"1", "the found path wrote nothing for its WAIT to cover"
        await writer.log_once(LOG, "txn-c", TxnState.VOTE_YES, BODY)  # not replicas mode: no mark
        assert await primary.get(mark) == b"1"
        pair.link.cutting = True
        await writer.log_once(LOG, "txn-b", TxnState.VOTE_YES, BODY)  # on the primary only
        with pytest.raises(StorageUnavailable, match="replica"):
            await terminator.log_once(LOG, "txn-b", TxnState.ABORT, BODY)


async def test_with_replicas_an_apply_that_finds_its_earlier_apply_answers_only_what_the_replicas_have(
    services: Services, tmp_path: Path,
) -> None:
    """Found by audit (2026-11-28): apply_redo's found path ("applied before": an earlier attempt
    landed, its answer lost or its WAIT timed out) wrote nothing, so its WAIT, on a connection
    that made no write since, covered nothing of the apply it found. The participant then took
    the redo for durable, cached it, released its locks and acknowledged; a failover to the
    lagging replica brought the record back to VOTE_YES, and garbage collection deleted the
    vote of a committed transaction. The found path bumps the log's read mark, as log_once's."""
    async with replicated(services, tmp_path) as pair, _marked_stores(pair) as (writer, participant, primary, mark):
        await writer.log_once(LOG, "txn-a", TxnState.VOTE_YES, BODY)
        await writer.apply_redo("p0", "txn-a", {"k": b"v"})
        await _on_replica(pair, writer, "txn-a")
        assert await participant.apply_redo("p0", "txn-a", {"k": b"v"}) is False  # applied before
        assert await primary.get(mark) == b"1", "the found path wrote nothing for its WAIT to cover"
        await writer.log_once(LOG, "txn-b", TxnState.VOTE_YES, BODY)
        await _on_replica(pair, writer, "txn-b")
        pair.link.cutting = True
        await writer.apply_redo("p0", "txn-b", {"k": b"w"})  # on the primary only
        with pytest.raises(StorageUnavailable, match="replica"):
            await participant.apply_redo("p0", "txn-b", {"k": b"w"})
