"""The Redis store's pipelined connection (storage_adapters/resp_pipe.py) against a real Redis: the
script calls of one event-loop tick go out in one write, and every caller still gets exactly its
own answer; LogOnce stays a compare-and-swap whatever the batching; NOSCRIPT, a lost connection
and a silent server each end as the caller expects."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from storage_adapters import redis_store
from storage_adapters.contract import LogId, Ownership, RecordBody, TxnState
from storage_adapters.errors import DecisionFlipRefused, Fenced, StorageUnavailable
from storage_adapters.redis_store import CONNECTION_COUNT_MAX, RedisStore
from storage_adapters.resp_pipe import RespAddress, RespPipe, _Protocol
from tests.conftest import Services
from tests.storage.conftest import TIMEOUT_MS_CALL_TEST
from tests.storage.servers import HoldingProxy, resp_time_reply
from tests.worker import free_port, redis_db_bench

RACER_COUNT = 60
DELETES_PER_LOG = 20
# Well past the connection pool, so a pool that refused instead of waiting would fail calls.
BURST_COUNT = 5 * CONNECTION_COUNT_MAX
SILENT_TIMEOUT_MS = 500
# For a stand-in that answers: long enough that only its answer ends a call.
ANSWERED_TIMEOUT_MS = 10_000
DEADLINE_SLACK_S = 3.0


def body(partition: str) -> RecordBody:
    return RecordBody((partition,), "node-0", b"redo")


@pytest.fixture
async def stores(services: Services) -> AsyncIterator[tuple[RedisStore, RedisStore]]:
    first = await RedisStore.open(services.redis_url, timeout_ms_call=TIMEOUT_MS_CALL_TEST)
    second = await RedisStore.open(services.redis_url, timeout_ms_call=TIMEOUT_MS_CALL_TEST)
    try:
        yield first, second
    finally:
        await first.close()
        await second.close()


@pytest.mark.parametrize("fenced", [False, True])
async def test_racing_log_once_creates_exactly_one_record(
    stores: tuple[RedisStore, RedisStore], ns: str, fenced: bool
) -> None:
    """Racers on one record from two stores, all pipelined (and, fenced, a third of them with a
    stale fence), with coalesced deletes of other records of the log in the same ticks: exactly
    one racer creates the record, every admitted racer is told what it stored, and no stale
    racer writes."""
    first, second = stores
    log = LogId.partition(f"{ns}-p")
    txn = f"{ns}.t"
    current = stale = None
    if fenced:
        old = Ownership(log.name, "n1", 1, 1, 10_000)
        assert (await first.write_owner(None, old)).written
        taken = Ownership(log.name, "n2", 2, 2, 10_000)
        assert (await first.write_owner(old, taken)).written
        current, stale = taken.fence(), old.fence()
    await asyncio.gather(*(first.log_once(log, f"{ns}.old{index}", TxnState.ABORT, body(log.name))
                           for index in range(RACER_COUNT // 4)))
    assert first._pipe is not None
    writes_before = first._pipe.write_count
    states = [TxnState.VOTE_YES if index % 2 else TxnState.ABORT for index in range(RACER_COUNT)]
    fences = [stale if fenced and index % 3 == 0 else current for index in range(RACER_COUNT)]
    racers = [
        (first if index % 2 else second).log_once(log, txn, state, body(log.name), fences[index])
        for index, state in enumerate(states)
    ]
    deletes = [(second if index % 2 else first).delete(log, f"{ns}.old{index}", current)
               for index in range(RACER_COUNT // 4)]
    results = await asyncio.gather(*racers, *deletes, return_exceptions=True)
    results, deleted = results[:RACER_COUNT], results[RACER_COUNT:]
    assert deleted == [True] * len(deletes), deleted
    admitted = [result for result, fence in zip(results, fences, strict=True) if fence is None or fence == current]
    refused = [result for result, fence in zip(results, fences, strict=True) if fenced and fence == stale]
    assert all(isinstance(result, Fenced) and result.fence == stale for result in refused), refused
    created = [result for result in admitted if result.created]
    assert len(created) == 1, results
    assert {result.state for result in admitted} == {created[0].state}
    record = await first.read(log, txn)
    assert record is not None and record.state is created[0].state
    # The racers of one store went in fewer socket writes than calls: they were batched.
    assert first._pipe.write_count - writes_before < RACER_COUNT // 2


async def test_a_ticks_deletes_go_in_one_script_per_log(stores: tuple[RedisStore, RedisStore], ns: str) -> None:
    store, _ = stores
    logs = [LogId.partition(f"{ns}-p{index}") for index in range(3)] + [LogId.coordinator(f"{ns}-c")]
    await asyncio.gather(*(store.log_once(log, f"{ns}.t{index}", TxnState.ABORT, body(log.name))
                           for log in logs for index in range(0, DELETES_PER_LOG, 2)))
    owner = Ownership(logs[0].name, "n1", 1, 1, 10_000)
    assert (await store.write_owner(None, owner)).written
    assert store._pipe is not None
    calls_before, writes_before = store._pipe.call_count, store._pipe.write_count
    deleted = await asyncio.gather(*(
        store.delete(log, f"{ns}.t{index}", owner.fence() if log == logs[0] and index % 3 else None)
        for log in logs for index in range(DELETES_PER_LOG)
    ))
    assert deleted == [index % 2 == 0 for _ in logs for index in range(DELETES_PER_LOG)]
    # One script call per log, where there was one per delete; and one socket write for all.
    assert store._pipe.call_count - calls_before == len(logs)
    assert store._pipe.write_count - writes_before <= 2  # one more if Redis had to load the script
    for log in logs:
        assert await store.scan_unfinished(log) == []
        assert await store.read(log, f"{ns}.t0") is None


async def test_each_caller_of_a_batch_gets_its_own_answer(stores: tuple[RedisStore, RedisStore], ns: str) -> None:
    store, _ = stores
    partition = f"{ns}-p"
    log = LogId.partition(partition)
    await store.log(log, f"{ns}.committed", TxnState.COMMIT, body(partition))
    first_owner = Ownership(partition, "n1", 1, 1, 10_000, "")
    assert (await store.write_owner(None, first_owner)).written
    owner = Ownership(partition, "n2", 2, 2, 10_000, "")  # n2 took it: n1's fence is stale
    assert (await store.write_owner(first_owner, owner)).written
    stale = first_owner.fence()
    assert store._pipe is not None
    writes_before = store._pipe.write_count
    outcomes = await asyncio.gather(
        store.log_once(log, f"{ns}.first", TxnState.VOTE_YES, body(partition)),
        store.log(log, f"{ns}.committed", TxnState.ABORT),  # refused: a decision never flips
        store.log_once(log, f"{ns}.new", TxnState.VOTE_YES, body(partition), owner.fence()),
        store.log_once(log, f"{ns}.fenced", TxnState.VOTE_YES, body(partition), stale),  # refused: old epoch
        store.log(log, f"{ns}.decided", TxnState.COMMIT, body(partition)),
        return_exceptions=True,
    )
    # One write for the tick, and one more if Redis first had to load a script (NOSCRIPT).
    assert store._pipe.write_count - writes_before <= 2
    first, flipped, new, fenced, decided = outcomes
    assert not isinstance(first, BaseException) and first.created
    assert isinstance(flipped, DecisionFlipRefused)
    assert not isinstance(new, BaseException) and new.created
    assert isinstance(fenced, Fenced)
    assert decided is TxnState.COMMIT
    assert (await store.read(log, f"{ns}.committed")).state is TxnState.COMMIT  # type: ignore[union-attr]
    assert await store.read(log, f"{ns}.fenced") is None
    assert (await store.read(log, f"{ns}.decided")).state is TxnState.COMMIT  # type: ignore[union-attr]


async def test_a_batch_after_redis_lost_its_scripts(stores: tuple[RedisStore, RedisStore], ns: str,
                                                    services: Services) -> None:
    store, _ = stores
    log = LogId.partition(f"{ns}-p")
    admin = aioredis.Redis.from_url(services.redis_url)
    try:
        await admin.script_flush()
    finally:
        await admin.aclose()
    # Every call of the batch meets NOSCRIPT, loads its script and runs once more.
    deleted, *results = await asyncio.gather(store.delete(log, f"{ns}.absent"), *(
        store.log_once(log, f"{ns}.t{index}", TxnState.VOTE_YES, body(log.name)) for index in range(10)
    ))
    assert deleted is False
    assert all(result.created for result in results)
    for index in range(10):
        assert (await store.read(log, f"{ns}.t{index}")) is not None


async def test_a_burst_past_the_connection_pool_waits_instead_of_failing(
    stores: tuple[RedisStore, RedisStore], ns: str
) -> None:
    """Recovery once collected thousands of old records at once and every call beyond the pool
    failed with "Too many connections"; a burst now waits for connections within its deadline."""
    store, _ = stores
    log = LogId.partition(f"{ns}-p")
    records = await asyncio.gather(*(store.read(log, f"{ns}.absent{index}") for index in range(BURST_COUNT)))
    assert records == [None] * BURST_COUNT


async def test_every_caller_of_a_batch_hears_of_a_silent_redis_within_its_deadline() -> None:
    """A server that accepts connections and never answers: every caller, the one in flight and
    those queued behind it, gets StorageUnavailable at about its deadline."""
    port = free_port()
    accepted: list[asyncio.StreamWriter] = []

    async def silent(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)

    server = await asyncio.start_server(silent, "127.0.0.1", port)
    client = aioredis.Redis.from_url(f"redis://127.0.0.1:{port}/0", socket_timeout=SILENT_TIMEOUT_MS / 1000)
    # Built by hand: open() would wait for the PING this server never answers.
    store = RedisStore(client, SILENT_TIMEOUT_MS)
    store._pipe = RespPipe(RespAddress("127.0.0.1", port), SILENT_TIMEOUT_MS)
    log = LogId.partition("silent-p")
    started = time.monotonic()
    try:
        outcomes = await asyncio.gather(*(
            store.log_once(log, f"silent.t{index}", TxnState.VOTE_YES, body(log.name)) for index in range(5)
        ), *(store.delete(log, f"silent.d{index}") for index in range(5)), return_exceptions=True)
    finally:
        await store.close()
        for writer in accepted:
            writer.close()
        server.close()
    assert all(isinstance(outcome, StorageUnavailable) for outcome in outcomes), outcomes
    assert time.monotonic() - started < SILENT_TIMEOUT_MS / 1000 + DEADLINE_SLACK_S


async def test_a_lost_connection_fails_its_calls_and_the_next_call_reconnects(
    stores: tuple[RedisStore, RedisStore], ns: str, services: Services
) -> None:
    store, _ = stores
    log = LogId.partition(f"{ns}-p")
    await store.log_once(log, f"{ns}.before", TxnState.VOTE_YES, body(log.name))  # connected now
    assert store._pipe is not None and store._pipe._protocol is not None
    transport = store._pipe._protocol.transport
    assert transport is not None
    host, port = transport.get_extra_info("sockname")[:2]
    admin = aioredis.Redis.from_url(services.redis_url)
    try:
        # A script that keeps Redis busy for a while, so the kill lands while calls are pending.
        pending = [asyncio.create_task(store.log_once(log, f"{ns}.during{index}", TxnState.VOTE_YES,
                                                      body(log.name))) for index in range(5)]
        await asyncio.sleep(0)
        assert await admin.client_kill_filter(_type=None, addr=f"{host}:{port}") == 1
        outcomes = await asyncio.gather(*pending, return_exceptions=True)
    finally:
        await admin.aclose()
    # Each either ran before the kill or failed as unavailable (it may or may not have run).
    assert all(isinstance(outcome, StorageUnavailable) or outcome.created for outcome in outcomes), outcomes
    after = await store.log_once(log, f"{ns}.after", TxnState.VOTE_YES, body(log.name))
    assert after.created


async def test_a_connect_whose_select_never_came_back_leaves_no_call_behind(services: Services, ns: str) -> None:
    """The pipe connects, then selects its database. When the SELECT got no answer in time, the
    connect failed, but the calls queued on that half-open connection stayed in the reply queue:
    the next connection's replies went to them, one slot off (a caller told 'created' for another
    caller's write), and every later connect's SELECT reply went to the stale slot, so the pipe
    never came back. Here a proxy in front of the real Redis swallows the first connection."""
    database = redis_db_bench()  # this worker's, and not 0: the pipe sends a SELECT
    assert database != 0
    base_url = services.redis_url.rsplit("/", 1)[0]
    proxy = await HoldingProxy(int(base_url.rsplit(":", 1)[1]), lambda _: False, 0).start()
    proxy.swallowing = True
    proxy_port = proxy.port
    client = aioredis.Redis.from_url(f"redis://127.0.0.1:{proxy_port}/{database}")
    store = RedisStore(client, SILENT_TIMEOUT_MS)  # by hand: open() would PING through the proxy
    store._pipe = RespPipe(RespAddress("127.0.0.1", proxy_port, database), SILENT_TIMEOUT_MS)
    direct = aioredis.Redis.from_url(f"{base_url}/{database}")
    log = LogId.partition(f"{ns}-p")
    try:
        first = asyncio.ensure_future(store.log_once(log, f"{ns}.first", TxnState.VOTE_YES, body(log.name)))
        await asyncio.sleep(0.05)
        queued = asyncio.ensure_future(store.log_once(log, f"{ns}.queued", TxnState.VOTE_YES, body(log.name)))
        outcomes = await asyncio.gather(first, queued, return_exceptions=True)
        assert all(isinstance(outcome, StorageUnavailable) for outcome in outcomes), outcomes
        proxy.swallowing = False
        for index in range(3):
            txn = f"{ns}.after{index}"
            state = TxnState.VOTE_YES if index % 2 == 0 else TxnState.ABORT
            answer = await store.log_once(log, txn, state, body(log.name))
            stored = await direct.hget(f"cxtxn:{{{log.key}}}:{txn}", "state")
            assert answer.created and answer.state is state and stored == state.value.encode(), (answer, stored)
    finally:
        await store.close()
        await direct.aclose()
        proxy.close()


async def test_a_connection_gone_silent_is_dropped_and_the_next_call_reconnects(services: Services, ns: str) -> None:
    """A call timed out with nothing at all heard on the connection since it left (a failover left
    the old address dark, a hung proxy): the pipe kept the connection, and every later call timed
    out on it too, until the kernel gave up on the socket, some 15 minutes (found by review). Now
    the connection is dropped and the next call connects again. A proxy in front of the real
    Redis holds everything the first connection sends."""
    database = redis_db_bench()
    base_url = services.redis_url.rsplit("/", 1)[0]
    proxy = await HoldingProxy(int(base_url.rsplit(":", 1)[1]), lambda _: True, 60.0).start()
    client = aioredis.Redis.from_url(f"redis://127.0.0.1:{proxy.port}/{database}")
    store = RedisStore(client, SILENT_TIMEOUT_MS)  # by hand: open() would PING through the proxy
    store._pipe = RespPipe(RespAddress("127.0.0.1", proxy.port, database), SILENT_TIMEOUT_MS)
    log = LogId.partition(f"{ns}-p")
    try:
        assert (await store.log_once(log, f"{ns}.before", TxnState.VOTE_YES, body(log.name))).created
        proxy.holding = True
        with pytest.raises(StorageUnavailable):
            await store.log_once(log, f"{ns}.held", TxnState.VOTE_YES, body(log.name))
        proxy.holding = False
        after = await store.log_once(log, f"{ns}.after", TxnState.VOTE_YES, body(log.name))
        assert after.created and store._pipe.dropped_silent_count == 1
    finally:
        await store.close()
        proxy.close()


async def test_a_call_that_spent_its_deadline_connecting_keeps_the_fresh_connection() -> None:
    """Found by review: a call that connected first timed out with less than a deadline of
    silence on its connection (the connect took the rest), and the fresh connection was dropped
    with every call on it. Only a whole call timeout of silence (the pipe's, here its connect
    timeout) since a call left drops a connection."""
    loop = asyncio.get_running_loop()
    pipe = RespPipe(RespAddress("127.0.0.1", 1), timeout_ms_connect=1000)
    silence_s = 1.0
    aborted: list[bool] = []

    class _Transport:
        def abort(self) -> None:
            aborted.append(True)

    protocol = _Protocol(pipe)
    protocol.transport = _Transport()  # type: ignore[assignment]
    pipe._protocol = protocol
    protocol.heard_s = loop.time() - 2 * silence_s  # nothing heard since either call below left
    fresh: asyncio.Future[object] = loop.create_future()
    pipe._expire(fresh, protocol, loop.time() - 0.1)  # sent 0.1 s ago: the connect took the rest
    assert fresh.done() and not aborted and pipe._protocol is protocol
    silent: asyncio.Future[object] = loop.create_future()
    pipe._expire(silent, protocol, loop.time() - silence_s)  # a whole call timeout of silence
    assert silent.done() and aborted and pipe._protocol is None and pipe.dropped_silent_count == 1
    for future in (fresh, silent):
        assert isinstance(future.exception(), TimeoutError)


async def _answering_with(reply: bytes, port: int, select_reply: bytes = b"+OK\r\n",
                          commands: list[bytes] | None = None) -> asyncio.Server:
    """A server that speaks just enough RESP: OK to connection setup (`select_reply` to SELECT),
    `reply` to every script; it notes the commands it gets in `commands`."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                header = await reader.readline()
                if not header:
                    return
                assert header.startswith(b"*"), header
                words = []
                for _ in range(int(header[1:])):
                    size = int((await reader.readline())[1:])
                    words.append((await reader.readexactly(size + 2))[:-2])
                command = words[0].upper()
                if commands is not None:
                    commands.append(command)
                if command == b"SELECT":
                    await asyncio.sleep(0.1)  # a window in which the connection is up but not set up
                    writer.write(select_reply)
                elif command == b"TIME":
                    writer.write(resp_time_reply())
                elif command == b"PING":
                    writer.write(b"+PONG\r\n")
                elif command in (b"EVALSHA", b"EVAL"):
                    writer.write(reply)
                elif command == b"SCRIPT":
                    writer.write(b"$40\r\n" + b"0" * 40 + b"\r\n")
                else:  # SELECT, AUTH, CLIENT ...
                    writer.write(b"+OK\r\n")
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            return

    return await asyncio.start_server(serve, "127.0.0.1", port)


@pytest.mark.parametrize("reply", [
    b"-LOADING Redis is loading the dataset in memory\r\n",
    b"-READONLY You can't write against a read only replica.\r\n",
    b"-MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.\r\n",
    b"-BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSCRIPT.\r\n",
    b"-OOM command not allowed when used memory > 'maxmemory'.\r\n",
    b"-NOREPLICAS Not enough good replicas to write.\r\n",
    # Found by audit (2026-11-27): a failed background save (a full disk, a fork refused) makes
    # Redis refuse every write this way, with its default stop-writes-on-bgsave-error.
    b"-MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk.\r\n",
], ids=lambda reply: reply.split()[0][1:].decode())
async def test_a_server_that_cannot_run_scripts_now_is_unavailable_not_a_crash(reply: bytes) -> None:
    """Found by review: every error reply on the pipe became a bare ResponseError, which the node
    takes for an impossible state and exits on (os._exit(70)): a Redis restarting (LOADING, with
    the AOF persistence the deployment guide asks for) or a replica after a failover (READONLY)
    made every node that wrote crash-loop. These replies mean the script did not run."""
    port = free_port()
    server = await _answering_with(reply, port)
    # durability none: the stand-in speaks only what this test needs (no INFO to check it by).
    # The stand-in answers every script at once, so the deadline is never what ends a call here; a
    # short one failed this test on a loaded CI machine (the set-up alone takes 100 ms, see above).
    store = await RedisStore.open(f"redis://127.0.0.1:{port}/0", timeout_ms_call=ANSWERED_TIMEOUT_MS,
                                  durability="none")
    log = LogId.partition("refusing-p")
    try:
        outcomes = await asyncio.gather(
            store.log_once(log, "refusing.t1", TxnState.VOTE_YES, body(log.name)),
            store.log(log, "refusing.t2", TxnState.COMMIT, body(log.name)),
            store.delete(log, "refusing.t3"),
            return_exceptions=True,
        )
    finally:
        await store.close()
        server.close()
    assert all(isinstance(outcome, StorageUnavailable) for outcome in outcomes), outcomes
    assert reply.split()[0][1:].decode() in str(outcomes[0]), outcomes[0]


async def test_no_call_is_sent_before_the_connection_s_database_is_selected() -> None:
    """Found by review: calls made while a connection was being set up were sent right behind its
    SELECT, so a SELECT refused (a server restarted with fewer databases, an ACL change) left them
    to run in database 0, another tenant's, while their callers were told "unavailable"."""
    port = free_port()
    commands: list[bytes] = []
    server = await _answering_with(b":1\r\n", port, b"-ERR DB index is out of range\r\n", commands)
    client = aioredis.Redis.from_url(f"redis://127.0.0.1:{port}/5")
    store = RedisStore(client, SILENT_TIMEOUT_MS)  # by hand: open()'s PING would select and fail
    store._pipe = RespPipe(RespAddress("127.0.0.1", port, 5), SILENT_TIMEOUT_MS)
    log = LogId.partition("unselected-p")
    try:
        first = asyncio.create_task(store.log_once(log, "unselected.t0", TxnState.VOTE_YES, body(log.name)))
        async with asyncio.timeout(SILENT_TIMEOUT_MS / 1000):
            while store._pipe._protocol is None:  # noqa: ASYNC110 - the connection has no event for it
                await asyncio.sleep(0.001)
        # Connected, its SELECT not answered yet: these calls come in that window.
        outcomes = await asyncio.gather(first, *(
            store.log_once(log, f"unselected.t{index}", TxnState.VOTE_YES, body(log.name)) for index in range(1, 5)
        ), return_exceptions=True)
    finally:
        await store.close()
        server.close()
    assert all(isinstance(outcome, StorageUnavailable) for outcome in outcomes), outcomes
    assert b"SELECT" in commands and b"EVALSHA" not in commands, commands


@pytest.mark.parametrize("step_ms", [-2 * TIMEOUT_MS_CALL_TEST, 5_000], ids=["stepped-back", "stepped-forward"])
async def test_a_write_s_deadline_stays_in_redis_s_clock_when_the_node_s_clock_is_stepped_after_open(
        services: Services, ns: str, step_ms: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by audit (2026-11-27): the offset to Redis's clock was measured against the node's
    wall clock, at open and every 30 s, so NTP stepping that clock in between moved every deadline
    by the step in Redis's clock. Stepped forward, a write its caller was told had failed could
    land up to the step later (past the slack, a terminator's ABORT re-creating a collected
    record); stepped back, every write was refused as late. Deadlines count from the boot clock
    now, which no step moves."""
    store = await RedisStore.open(services.redis_url, timeout_ms_call=TIMEOUT_MS_CALL_TEST)
    wall = time.time
    monkeypatch.setattr(time, "time", lambda: wall() + step_ms / 1000)
    await _assert_a_write_s_deadline_is_in_redis_s_clock(store, f"{ns}.stepped")


def script_deadlines(store: RedisStore) -> list[int]:
    """The deadline (ms, Redis's clock) of every script the store sends from now on, in order."""
    pipe = store._pipe
    assert pipe is not None
    sent: list[int] = []
    evalsha = pipe.evalsha

    async def noting(sha: str, source: str, keys: list[str], args: list[object], timeout_s: float) -> object:
        sent.append(int(args[-1]))  # type: ignore[call-overload]
        return await evalsha(sha, source, keys, args, timeout_s)

    pipe.evalsha = noting  # type: ignore[method-assign]
    return sent


async def test_a_coalesced_delete_is_never_run_past_its_caller_s_deadline(
    stores: tuple[RedisStore, RedisStore], ns: str
) -> None:
    """Found by review: the delete batch's script took its deadline from when the batch ran, so a
    tick stalled between the delete and its batch let Redis run it up to that stall after its
    caller was told it failed. The caller's deadline is what the script gets now."""
    store, _ = stores
    log = LogId.partition(f"{ns}-p")
    await store.log_once(log, f"{ns}.gone", TxnState.VOTE_YES, body(log.name))
    sent = script_deadlines(store)
    caller_deadline_ms = (time.time() * 1000) + TIMEOUT_MS_CALL_TEST
    deleting = asyncio.ensure_future(store.delete(log, f"{ns}.gone"))
    await asyncio.sleep(0)  # the delete waits for its batch, which leaves on a later tick
    time.sleep(0.3)  # noqa: ASYNC251 - the stall under test: a tick that comes late
    assert await deleting is True
    assert len(sent) == 1 and sent[0] <= caller_deadline_ms + 5, (sent, caller_deadline_ms)


@pytest.mark.parametrize("skew_ms", [-15_000, 15_000], ids=["node-behind", "node-ahead"])
async def test_a_write_s_deadline_is_stated_in_redis_s_clock(services: Services, ns: str, skew_ms: int,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by review: the scripts compare the deadline with Redis's TIME, but the node stated it
    in its own clock. A node behind Redis had every write refused as LATE; a node ahead let a write
    that reached Redis late land up to the skew past its caller's deadline, and past the GC grace
    once the skew passed the slack. The store measures the offset and states deadlines in Redis's
    clock."""
    monkeypatch.setattr(redis_store, "_wall_ms", lambda: time.time() * 1000 + skew_ms)
    store = await RedisStore.open(services.redis_url, timeout_ms_call=TIMEOUT_MS_CALL_TEST)
    await _assert_a_write_s_deadline_is_in_redis_s_clock(store, f"{ns}.skewed")


async def _assert_a_write_s_deadline_is_in_redis_s_clock(store: RedisStore, txn: str) -> None:
    """A log_once through `store` (closed after) carries a deadline within its call's timeout of
    Redis's TIME, read just after."""
    sent = script_deadlines(store)
    log = LogId.partition(f"{txn.split('.', maxsplit=1)[0]}-p")
    try:
        assert await store.log_once(log, txn, TxnState.VOTE_YES, body(log.name)) is not None
        seconds, microseconds = await store._client.time()
    finally:
        await store.close()
    redis_now_ms = seconds * 1000 + microseconds / 1000
    assert redis_now_ms < sent[0] <= redis_now_ms + TIMEOUT_MS_CALL_TEST, (sent, redis_now_ms)


async def test_scans_and_identity_listings_use_no_command_of_redis_6_2(
        stores: tuple[RedisStore, RedisStore], ns: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by audit (2026-11-27): the recovery scan and the identity listing sent ZRANGE ...
    BYLEX LIMIT, which only Redis 6.2 and later know; an older server (a managed cache of version
    6, say) answered a syntax error, which ended every node at its first recovery. As Redis 6.0
    answers it here; the calls use ZRANGEBYLEX, which every Redis since 2.8.9 has."""
    store, _ = stores
    client = store._client  # type: ignore[attr-defined]
    real = client.execute_command

    async def redis_6_0(*args: Any, **options: Any) -> Any:
        if str(args[0]).upper() == "ZRANGE" and any(str(a).upper() == "BYLEX" for a in args[1:]):
            raise redis.exceptions.ResponseError("syntax error")
        return await real(*args, **options)

    monkeypatch.setattr(client, "execute_command", redis_6_0)
    log = LogId.partition(f"{ns}-scan")
    assert (await store.log_once(log, "t1", TxnState.VOTE_YES, body(log.name))).created
    page = await store.scan_unfinished_page(log)
    assert [record.txn for record in page.records] == ["t1"]
    assert isinstance(await store.list_identities(), list)
