"""The bank workload across a failover of a replicated Redis, as a managed Redis fails over: the
replica's copy of the stream stops, the primary dies, the replica is promoted and the address the
nodes use (the primary endpoint) now reaches it; a new replica joins it. With durability
`replicas:1` every transfer a client was told committed is still there afterwards and the total is
unchanged, in what the nodes answer and in what storage holds (read directly: a node answers a
committed value from its cache, which a loss in storage does not reach). With durability `none`
the same run loses acknowledged transfers in storage (the writes answered while the stream was cut
die with the primary), and a node may meet a vote that vanished and stop;
tests/storage/test_redis_replicas.py shows that loss at the store's level on every run."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis

from cornus.runtime.keys import partition_of
from storage_adapters.factory import StoreConfig, open_store
from tests.cluster.harness import running_cluster
from tests.cluster.test_bank import ACCOUNT_COUNT, BALANCE_START, settled_state, start_transfers
from tests.conftest import Services
from tests.storage import servers

LINK_TIMEOUT_S = 30.0
# Transfers before the cut, and while it lasts (writes wait for a replica that has stopped
# hearing); after the failover, until this many more have committed (the nodes take their
# partitions again first: the renewals they made during the cut died with the primary).
BEFORE_S = 2.0
CUT_S = 1.0
COMMITTED_AFTER_COUNT = 20
RECOVERY_TIMEOUT_S = 60.0


class _ProxyLoop:
    """The proxies' event loop, in a thread of its own: the cluster tests are synchronous."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.proxies: list[servers.HoldingProxy] = []

    def proxy(self, upstream_port: int) -> servers.HoldingProxy:
        start = servers.HoldingProxy(upstream_port, lambda _: False, 0).start()
        proxy = asyncio.run_coroutine_threadsafe(start, self.loop).result(10)
        self.proxies.append(proxy)
        return proxy

    def close(self) -> None:
        for proxy in self.proxies:
            self.loop.call_soon_threadsafe(proxy.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def _stored(port: int, keys: list[str], partition_count: int) -> dict[str, bytes | None]:
    """The values storage holds for `keys` (no node in between)."""
    async def read() -> dict[str, bytes | None]:
        store = await open_store(StoreConfig(backend="redis", redis_url=f"redis://127.0.0.1:{port}/0",
                                             redis_durability="none"))
        try:
            values: dict[str, bytes | None] = {}
            for key in keys:
                values.update(await store.read_data(partition_of(key, partition_count), [key]))
            return values
        finally:
            await store.close()

    return asyncio.run(read())


def _until_replicated(primary_port: int) -> None:
    client = redis.Redis(port=primary_port, socket_timeout=5)
    deadline = time.monotonic() + LINK_TIMEOUT_S
    try:
        while True:
            replication = client.info("replication")
            if replication.get("connected_slaves", 0) >= 1 and replication.get("slave0", {}).get("state") == "online":
                return
            assert time.monotonic() < deadline, f"no replica came online: {replication}"
            time.sleep(0.05)
    finally:
        client.close()


@contextmanager
def _redis_pair(services: Services, tmp_path: Path) -> Iterator[tuple[list[servers.ServerProcess], _ProxyLoop]]:
    for name in ("primary", "replica", "second-replica"):
        (tmp_path / name).mkdir()
    processes: list[servers.ServerProcess] = []
    proxies = _ProxyLoop()
    try:
        # No append-only files: the replicas are the durability, as on the managed services.
        processes.append(servers.start_redis(services, tmp_path / "primary", None, "--appendonly", "no",
                                             "--repl-diskless-sync-delay", "0"))
        yield processes, proxies
    finally:
        for process in processes:
            process.kill()
        proxies.close()


def test_bank_across_a_redis_failover_loses_no_acknowledged_transfer(services: Services, tmp_path: Path) -> None:
    with _redis_pair(services, tmp_path) as (processes, proxies):
        primary = processes[0]
        link = proxies.proxy(primary.port)  # the replica's replication stream passes here
        processes.append(servers.start_redis(services, tmp_path / "replica", None, "--appendonly", "no",
                                             "--repl-diskless-sync-delay", "0",
                                             "--replicaof", "127.0.0.1", str(link.port)))
        replica = processes[1]
        _until_replicated(primary.port)
        endpoint = proxies.proxy(primary.port)  # the primary endpoint: what the nodes are given
        storage = {"backend": "redis", "redis_url": f"redis://127.0.0.1:{endpoint.port}/0", "timeout_ms_call": "2000",
                   "redis_durability": "replicas:1"}
        with running_cluster("cornus", storage, settings={"timeout_ms_txn_idle": 1500}) as cluster:
            cluster.start_all()
            stop, tally, clients = start_transfers(cluster)
            try:
                time.sleep(BEFORE_S)
                committed_before_cut = len(tally.committed)
                link.cutting = True
                time.sleep(CUT_S)
                # The failover: the primary dies with whatever the replica never got, the replica takes
                # over at the same endpoint, and a new replica joins it.
                primary.kill()
                promoted = redis.Redis(port=replica.port, socket_timeout=5)
                promoted.replicaof("NO", "ONE")
                promoted.close()
                endpoint.upstream_port = replica.port
                processes.append(servers.start_redis(services, tmp_path / "second-replica", None,
                                                     "--appendonly", "no", "--replicaof", "127.0.0.1",
                                                     str(replica.port)))
                _until_replicated(replica.port)
                failed_over_s, committed_at_failover = time.monotonic(), len(tally.committed)
                while len(tally.committed) < committed_at_failover + COMMITTED_AFTER_COUNT:
                    assert time.monotonic() - failed_over_s < RECOVERY_TIMEOUT_S, (
                        "no transfers commit after the failover")
                    time.sleep(0.1)
                recovery_s = time.monotonic() - failed_over_s
            finally:
                stop.set()
                for thread in clients:
                    thread.join(120)
            assert not any(thread.is_alive() for thread in clients)

            for node_id in cluster.nodes:
                cluster.wait_ready(node_id)
            balances, markers = settled_state(cluster, tally)
            accounts = list(balances)
            stored = _stored(replica.port, [*accounts, *tally.committed], cluster.partition_count)
        total = sum(int(value) for value in balances.values())  # type: ignore[arg-type]
        print(f"{len(tally.committed)} committed ({committed_before_cut} before the cut), {tally.aborted} aborted, "
              f"{tally.unknown} unknown, {tally.failed_before_commit} failed before commit; commits again "
              f"{recovery_s:.1f} s after the failover; total {total}")
        assert committed_before_cut > 5, "too few transfers committed before the failover to mean anything"
        missing = [marker for marker, value in markers.items() if value != "done"]
        assert not missing, f"acknowledged transfers lost in the failover: {missing}"
        assert total == ACCOUNT_COUNT * BALANCE_START, f"money was created or lost: {balances}"
        missing_in_storage = [marker for marker in tally.committed if stored[marker] != b"done"]
        assert not missing_in_storage, f"acknowledged transfers lost in storage: {missing_in_storage}"
        assert {account: stored[account] for account in accounts} == {
            account: str(balance).encode() for account, balance in balances.items()}, "storage and nodes disagree"
