"""An operation the owner refuses as invalid changes nothing (found by review): the partition was
named as touched all the same, so the transaction's next request there went as a continued one,
which the owner (holding no execution of it) refused as if it had restarted, and the transaction
aborted."""

from __future__ import annotations

import secrets
import time

import pytest

from cornus.protocol.config import Protocol
from cornus.protocol.txn_ids import client_txn_id
from cornus.runtime import coordination
from cornus.runtime.admission import one_shot_redo
from cornus.runtime.outcome import NodeOverloaded, OutcomeStatus
from cornus.runtime.wire import Op, OpKind
from storage_adapters.contract import DATA_VALUE_BYTES_MAX
from storage_adapters.errors import ValidationError
from tests.runtime.faults import keys_in, local_cluster, wait_until

pytestmark = pytest.mark.timeout(60)


async def test_an_operation_refused_as_invalid_leaves_the_transaction_usable(tmp_path):
    async with local_cluster(tmp_path, node_count=1, partition_count=2) as cluster:
        node = cluster.node()
        key = keys_in(2, ["p0"])["p0"]
        txn = node.begin()
        with pytest.raises(ValidationError):
            await node.run_ops(txn, [Op(OpKind.GET, key, b"a get carries no value")])
        await node.run_ops(txn, [Op(OpKind.PUT, key, b"1")])
        assert (await node.commit(txn)).status is OutcomeStatus.COMMITTED

        async def applied() -> bool:
            return await cluster.value(key) == b"1"

        await wait_until(applied, 10, "the commit was never applied")


async def test_the_writes_a_coordinator_holds_are_bounded_in_bytes(tmp_path, monkeypatch) -> None:
    """An interactive transaction's writes wait on its coordinator from its request to its commit
    (for the growth checks and coordinator-log's redo), each transaction's within
    txn_partition_count_max redo records, but their sum over thousands of open transactions was
    bounded by nothing: past the budget a request is refused as retryable, with nothing done."""
    monkeypatch.setattr(coordination, "WRITES_HELD_BYTES_MAX", 300_000)
    value = b"v" * DATA_VALUE_BYTES_MAX
    async with local_cluster(tmp_path, node_count=1, partition_count=2) as cluster:
        node = cluster.node()
        keys = keys_in(2, ["p0", "p1"])
        held = [node.begin() for _ in range(4)]
        for index, txn in enumerate(held[:-1]):
            await node.run_ops(txn, [Op(OpKind.PUT, f"{keys['p0']}.{index}", value)])
        last = held[-1]
        with pytest.raises(NodeOverloaded, match="bytes of writes"):
            await node.run_ops(last, [Op(OpKind.PUT, keys["p1"], value), Op(OpKind.PUT, keys["p0"], value)])
        # Nothing of it ran: the transaction is still open, and runs once another gave its bytes back.
        await node.abort(held[0])
        await node.run_ops(last, [Op(OpKind.PUT, keys["p1"], value)])
        assert (await node.commit(last)).status is OutcomeStatus.COMMITTED
        for txn in held[1:-1]:
            await node.abort(txn)
        assert node.coordination.writes_held_bytes == 0


async def test_a_key_written_again_is_held_once(tmp_path, monkeypatch) -> None:
    """Found by review: every write was counted against the held budget, though `touched` keeps
    one value per key: one transaction overwriting a key took the whole budget."""
    monkeypatch.setattr(coordination, "WRITES_HELD_BYTES_MAX", 300_000)  # room for 4 values
    value = b"v" * DATA_VALUE_BYTES_MAX
    async with local_cluster(tmp_path, node_count=1, partition_count=2) as cluster:
        node = cluster.node()
        key = keys_in(1, ["p0"])["p0"]
        txn = node.begin()
        for _ in range(8):
            await node.run_ops(txn, [Op(OpKind.PUT, key, value), Op(OpKind.PUT, key, value)])
        other = node.begin()
        await node.run_ops(other, [Op(OpKind.PUT, key + "x", value)])
        # One-shots count theirs too, while they run, and give them back.
        assert (await node.execute([Op(OpKind.PUT, key + "y", b"1"), Op(OpKind.PUT, key + "y", b"2")])).status \
            is OutcomeStatus.COMMITTED
        for open_txn in (txn, other):
            await node.abort(open_txn)
        assert node.coordination.writes_held_bytes == 0


async def test_a_one_shot_refused_for_room_on_its_run_first_path_ends_and_frees_its_id(tmp_path, monkeypatch):
    """A one-shot whose redo with the keys it reads outgrows a record runs its operations first
    and commits after; there a refusal for room (NodeOverloaded) left the transaction open,
    holding its slot until the idle sweep, and kept its client-chosen id taken, though nothing
    had run (found by review). While an earlier process of the node may have run the id, it is in
    doubt instead, and stays taken (found by audit, 2026-11-28, second)."""
    monkeypatch.setattr(coordination, "WRITES_HELD_BYTES_MAX", 100_000)
    async with local_cluster(tmp_path, node_count=1, partition_count=1) as cluster:
        node = cluster.node()
        value = b"v" * 60_000
        ops = [Op(OpKind.PUT, "w0", value), Op(OpKind.PUT, "w1", value)]
        ops += [Op(OpKind.GET, f"r{i:03}" + "k" * 480) for i in range(30)]  # their names outgrow the record
        assert one_shot_redo(Protocol.CORNUS, {"p0": ops}) is None, "the test's one-shot must run its ops first"
        in_doubt = client_txn_id(int(time.time() * 1000), "n0", secrets.token_hex(16), Protocol.CORNUS)
        outcome = await node.execute(ops, Protocol.CORNUS, in_doubt)  # the identity was taken just now
        assert outcome.status is OutcomeStatus.UNKNOWN and "writes" in outcome.detail, outcome
        assert node.coordination.txns == {} and node.coordination.known(in_doubt) is not None
        taken_ms = int(time.time() * 1000) - 600_000  # long ago: no earlier process runs
        monkeypatch.setattr(node.coordination, "identity_taken_unix_ms", lambda: taken_ms)
        txn = client_txn_id(int(time.time() * 1000), "n0", secrets.token_hex(16), Protocol.CORNUS)
        with pytest.raises(NodeOverloaded):
            await node.execute(ops, Protocol.CORNUS, txn)
        assert node.coordination.txns == {}, "the refused one-shot is still open"
        monkeypatch.setattr(coordination, "WRITES_HELD_BYTES_MAX", 1_000_000)
        assert (await node.execute(ops, Protocol.CORNUS, txn)).status is OutcomeStatus.COMMITTED
