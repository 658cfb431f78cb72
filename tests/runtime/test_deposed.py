"""A node whose identity a later process took parks (cornus.runtime.node): in process, what the
real-process test (tests/cluster/test_second_process.py) cannot time."""

from __future__ import annotations

import asyncio
import secrets
import time

import pytest

from cornus.protocol.config import Protocol
from cornus.protocol.effects import RecoveryFinished
from cornus.protocol.txn_ids import client_txn_id
from cornus.runtime import identity
from cornus.runtime.wire import ExecuteRequest, ExecuteResponse, ExecuteStatus, Op, OpKind
from storage_adapters.contract import LogId, Tombstone, TxnState
from tests.runtime.faults import FaultyStore, keys_in, local_cluster, puts, wait_until

pytestmark = pytest.mark.timeout(60)


async def test_a_recovery_settling_after_the_node_was_deposed_serves_nothing(tmp_path) -> None:
    """Found by review: a recovery still waiting for its transactions to resolve (up to 5 s) when
    the node was deposed then served its partitions again, and logged it."""
    async with local_cluster(tmp_path, node_count=1, partition_count=2) as cluster:
        node = cluster.node()
        partition = sorted(node.serving)[0]
        node._deposed("a later process took the identity")
        await asyncio.sleep(0)
        assert not node.serving and not node.ready
        # What Readiness._settle calls once its wait ends.
        node.readiness.settled(RecoveryFinished(0, (partition,), node=False))
        assert partition not in node.serving, f"the deposed node serves {partition} again"


async def test_a_renewal_keeps_the_identity_and_fails_once_another_process_took_it(tmp_path) -> None:
    async with local_cluster(tmp_path, node_count=1, partition_count=1) as cluster:
        store = cluster.node().store
        taken = await identity.take(store, "n9")  # a node id no process of the cluster runs
        renewed = await identity.renew(store, taken)
        assert renewed is not None and (renewed.epoch, renewed.version) == (taken.epoch, taken.version + 1)
        # A renewal that timed out and landed all the same: the next one, swapping from the record
        # its process last knew, is refused, finds the record still its own, and renews from it.
        again = await identity.renew(store, taken)
        assert again is not None and (again.epoch, again.version) == (taken.epoch, taken.version + 2)
        later = await identity.take(store, "n9")
        assert later.epoch == taken.epoch + 1
        assert await identity.renew(store, again) is None
        assert await identity.renew(store, later) is not None


async def test_an_execution_that_waited_past_its_lease_is_answered_not_owner(tmp_path, monkeypatch) -> None:
    """Found by review: a request checked the lease once, before it waited (for a lock held by a
    voted transaction); woken after the lease lapsed (a stall or a suspend, before the ownership
    tick noticed), it answered from the partition's cache while another node may own the partition
    by then: a read-only transaction across partitions could see half of one the new owner
    committed. The lease is checked again after the wait."""
    async with local_cluster(tmp_path, node_count=1, partition_count=1) as cluster:
        node = cluster.node()
        partition = node.partitions["p0"]
        leased = True
        # The lease as the node asks it of a request (Ownership.admits_request, the core's rule).
        monkeypatch.setattr(node.ownership, "admits_request", lambda name, **kwargs: leased)

        async def waiting_past_the_lease(request: ExecuteRequest) -> ExecuteResponse:
            nonlocal leased
            await asyncio.sleep(0)  # the lock wait, during which the lease lapses
            leased = False
            return ExecuteResponse(ExecuteStatus.OK, values=(b"cached",))

        monkeypatch.setattr(partition, "execute", waiting_past_the_lease)
        response = await node.on_request("n0", ExecuteRequest("1.n0.abc.1.cornus", "p0", "n0", (Op(OpKind.GET, "k"),)))
        assert response.status is ExecuteStatus.NOT_OWNER, response


async def test_a_node_deposed_while_it_stops_watches_nothing_after_the_stop(tmp_path) -> None:
    """Found by review: deposed during its stop (while it released its partitions), a node began
    to watch its identity after stop() had returned, polling a closed store until the loop ended."""
    async with local_cluster(tmp_path, node_count=1, partition_count=1) as cluster:
        node = cluster.node()
        halted = asyncio.Event()

        async def halt() -> None:
            halted.set()

        node.parking.stopping()  # what Node.stop does first
        node.parking.park(halt)
        await node.parking.stop()
        assert halted.is_set() and node.parking._watching is None


async def test_a_process_cut_off_past_collection_never_writes_into_the_collected_transaction(tmp_path) -> None:
    """Found by review: two processes of n0 alive (a force-deleted pod beside its replacement).
    The first coordinates a Cornus one-shot, then is cut off from the network and storage; its
    termination's LogOnce(ABORT) keeps failing and is retried. Meanwhile the transaction commits
    (here its participants end it themselves; in the review the client's resend of its id reached
    the second process), and the second process, which coordinates it too, collects it: one
    participant's record becomes a tombstone, the other's is deleted. The first process comes
    back, and its next retry, before its next identity check, created an ABORT record in the
    deleted slot beside the other's COMMIT: the status call then crashes on the split decision,
    and once the tombstone expires says ABORTED for good. A coordinator's writes that storage
    cannot fence must go only while a recent check confirmed the identity."""
    async with local_cluster(tmp_path, node_count=2, partition_count=4) as cluster:
        first, faults = cluster.node("n0"), cluster.faults["n0"]
        remote = [p for p in cluster.partitions if cluster.owner_of(p) == "n1"][:2]
        assert len(remote) == 2
        txn = client_txn_id(int(time.time() * 1000), "n0", secrets.token_hex(16), Protocol.CORNUS)
        keys = keys_in(4, remote)
        votes = cluster.faults["n1"].hold("log_once", where=lambda a: a["txn"] == txn)
        for method in FaultyStore.METHODS:
            faults.fail(method, None)  # the first process is cut off from storage from here on
        execute = asyncio.create_task(
            first.execute(puts({keys[p]: b"v" for p in remote}), Protocol.CORNUS, client_txn=txn))
        participants = [cluster.node("n1").core.host(p) for p in remote]
        await wait_until(lambda: _true(all(txn in host.machines for host in participants)), 5,
                         "the one-shot's requests never reached their owner")
        cluster.network.down.add("n0")  # and from the network: the votes never reach it
        votes.set()

        async def committed() -> bool:
            records = [await cluster.record(p, txn) for p in remote]
            return all(r is not None and r.state is TxnState.COMMIT and r.applied for r in records)

        await wait_until(committed, 10, "the participants never ended the transaction themselves")
        # The second process of n0: it takes the identity, coordinates the transaction (its
        # participants commit it) and collects it, as garbage collection does on this backend.
        await identity.take(cluster.real_store, "n0")
        store = cluster.real_store
        assert await store.delete(LogId.partition(remote[0]), txn, keep=Tombstone(TxnState.COMMIT, 60_000))
        assert await store.delete(LogId.partition(remote[1]), txn)

        cluster.network.down.discard("n0")
        faults.heal()
        await wait_until(lambda: _true(first.deposed), 10, "the first process never learnt it was deposed")
        assert await cluster.record(remote[1], txn) is None, "a write of the deposed process re-created the record"
        landed = [c for c in faults.calls_of("log_once") if c.args["txn"] == txn and c.outcome == "ok"]
        assert not landed, f"the deposed process's termination wrote: {landed}"
        execute.cancel()


async def _true(value: bool) -> bool:
    return value

