"""The async SDK end to end against the same real 3-node cluster: commit, read-your-writes, abort
on an exception, a conflict retried by run_transaction, status, bad input, and concurrent
transactions on one client."""

from __future__ import annotations

import asyncio
import http.server
import threading

import pytest

from services.client import (
    AsyncCornusClient,
    AsyncTransaction,
    ClientConfig,
    InvalidRequest,
    NotFound,
    Op,
    ServerError,
    Status,
    TransactionAborted,
    Unavailable,
    WrongState,
)
from tests.client.test_sync_client import _ProxyBeforeANode
from tests.cluster.harness import unknown_txn_id
from tests.worker import free_port

FAST = ClientConfig(backoff_ms_min=5, backoff_ms_max=50, retry_count_max=3)


async def test_commit_read_your_writes_and_status(urls: list[str], prefix: str) -> None:
    a, b = f"{prefix}a", f"{prefix}b"
    async with AsyncCornusClient(urls, config=FAST) as client:
        assert (await client.put(a, "1")).committed
        async with client.transaction() as txn:
            assert await txn.read([a, b]) == {a: "1", b: None}
            await txn.write({a: "2", b: "x"})
            assert await txn.read([a, b]) == {a: "2", b: "x"}
            active = await client.status(txn.txn, txn.node_url)
            assert active.status is Status.ACTIVE
        assert txn.outcome is not None and txn.outcome.committed
        for url in urls:
            assert (await client.status(txn.txn, url)).status is Status.COMMITTED
        outcome = await client.execute([Op.get(a), Op.get(b), Op.check(f"{prefix}absent", None)])
        assert outcome.committed and outcome.reads == {a: "2", b: "x"}
        assert await client.get(b) == "x"
        with pytest.raises(NotFound):
            await client.status(unknown_txn_id())


async def test_exception_in_transaction_aborts_it(urls: list[str], prefix: str) -> None:
    key = f"{prefix}k"
    async with AsyncCornusClient(urls, config=FAST) as client:
        await client.put(key, "before")
        with pytest.raises(RuntimeError, match="boom"):
            async with client.transaction() as txn:
                await txn.write({key: "never"})
                raise RuntimeError("boom")
        assert txn.outcome is not None and txn.outcome.status is Status.ABORTED
        assert (await client.status(txn.txn)).status is Status.ABORTED
        with pytest.raises(WrongState):
            await txn.commit()
        async with client.transaction() as after:
            assert await after.read([key]) == {key: "before"}
            await after.write({key: "after"})
        assert await client.get(key) == "after"


async def test_conflict_is_retried_by_run_transaction(urls: list[str], prefix: str) -> None:
    key = f"{prefix}counter"
    async with AsyncCornusClient(urls, config=FAST) as client:
        await client.put(key, "10")
        blocker = await client.begin()
        await blocker.write({key: "20"})
        calls: list[int] = []

        async def increment(txn: AsyncTransaction) -> int:
            calls.append(1)
            if len(calls) == 2:
                assert (await blocker.commit()).committed  # the first run met the lock
            value = int((await txn.read([key]))[key] or 0)
            await txn.write({key: str(value + 1)})
            return value + 1

        assert await client.run_transaction(increment) == 21
        assert len(calls) == 2
        assert await client.get(key) == "21"

        # Increments racing on one client: each one commits exactly once, retried as needed.
        racing = f"{prefix}racing"
        await client.put(racing, "0")

        async def bump(txn: AsyncTransaction) -> None:
            value = int((await txn.read([racing]))[racing] or 0)
            await txn.write({racing: str(value + 1)})

        patient = AsyncCornusClient(urls, config=ClientConfig(backoff_ms_min=5, backoff_ms_max=200,
                                                              retry_count_max=40))
        async with patient:
            await asyncio.gather(*(patient.run_transaction(bump) for _ in range(4)))
        assert await client.get(racing) == "4"

        blocker = await client.begin()
        await blocker.write({key: "30"})
        with pytest.raises(TransactionAborted) as aborted:
            await client.run_transaction(increment)
        assert aborted.value.retryable and aborted.value.outcome.reason == "conflict"
        await blocker.abort()
        assert await client.get(key) == "21"


async def test_bad_input_raises_typed_errors_and_changes_nothing(urls: list[str], prefix: str) -> None:
    key = f"{prefix}k"
    async with AsyncCornusClient(urls, config=FAST) as client:
        await client.put(key, "v0")
        with pytest.raises(InvalidRequest):
            await client.execute([Op.put(key, "v1"), Op.put("", "v")])
        with pytest.raises(InvalidRequest):
            await client.execute([Op.get(key)] * 1001)  # over the node's op_count_max
        async with client.transaction() as txn:
            with pytest.raises(InvalidRequest):
                await txn.read([key, ""])
            await txn.write({f"{prefix}other": "ok"})
        assert txn.outcome is not None and txn.outcome.committed
        assert await client.get(key) == "v0"


async def test_no_reachable_node_is_unavailable() -> None:
    async with AsyncCornusClient([f"http://127.0.0.1:{free_port()}"], config=FAST) as client:
        outcome = await client.execute([Op.put("k", "v")])
        assert outcome.status is Status.UNAVAILABLE and outcome.attempt_count == FAST.retry_count_max + 1
        with pytest.raises(Unavailable):
            await client.begin()


async def test_a_write_a_proxy_answered_503_leaves_the_transaction_only_to_abort() -> None:
    """The async client, as tests/client/test_sync_client.py's test of the same name."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ProxyBeforeANode)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        async with AsyncCornusClient([f"http://127.0.0.1:{server.server_address[1]}"], config=FAST) as client:
            txn = await client.begin()
            with pytest.raises(ServerError):
                await txn.write({"k": "v"})
            with pytest.raises(WrongState, match="abort it"):
                await txn.commit()
            with pytest.raises(Unavailable):
                await client.status(txn.txn)
        assert not any(line.endswith("/commit") for line in _ProxyBeforeANode.seen), _ProxyBeforeANode.seen
    finally:
        server.shutdown()
        server.server_close()
