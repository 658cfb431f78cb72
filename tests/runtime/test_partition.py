"""PartitionRuntime, the execution phase's I/O around the core's rules: every release it makes
wakes the lock waiters the release granted, an idle sweep's included."""

from __future__ import annotations

import asyncio
import time

from cornus.protocol import txn_ids
from cornus.protocol.config import Protocol
from cornus.protocol.execution import BUFFERED_BYTES_MAX
from cornus.protocol.locks import Policy
from cornus.runtime import redo as redo_codec
from cornus.runtime.keys import partition_of
from cornus.runtime.partition import PartitionRuntime
from cornus.runtime.wire import ExecuteRequest, ExecuteStatus, Op, OpKind
from storage_adapters.contract import DATA_VALUE_BYTES_MAX
from tests.unused_store import UnusedStore

# Long enough that a waiter nobody wakes is still waiting when the test gives up on it.
TIMEOUT_MS_LOCK_WAIT = 30_000
TIMEOUT_S_GRANT = 2.0


async def test_an_idle_sweep_wakes_the_waiter_its_release_granted() -> None:
    partition = PartitionRuntime("p0", UnusedStore(timeout_ms_call=1000), Policy.WAIT_DIE, TIMEOUT_MS_LOCK_WAIT, 100,
                                 partition_count=1)
    now_ms = int(time.time() * 1000)
    # WAIT_DIE lets the older transaction wait for the younger one's lock.
    older = txn_ids.new_txn_id(now_ms - 1000, "n0", "aaaaaa", 1, Protocol.CORNUS)
    younger = txn_ids.new_txn_id(now_ms, "n0", "bbbbbb", 2, Protocol.CORNUS)
    put = (Op(OpKind.PUT, "k", b"v"),)
    first = await partition.execute(ExecuteRequest(younger, "p0", "n0", put))
    assert first.status is ExecuteStatus.OK
    waiting = asyncio.create_task(partition.execute(ExecuteRequest(older, "p0", "n0", put)))
    await asyncio.sleep(0.05)
    assert not waiting.done(), "the older transaction should be waiting for the lock"
    partition.executions[younger].last_active_ms -= 10_000  # its coordinator went quiet
    assert partition.sweep_idle(5_000, lambda txn: False) == 1
    granted = await asyncio.wait_for(waiting, TIMEOUT_S_GRANT)
    assert granted.status is ExecuteStatus.OK
    assert partition.locks.holders("k") == {older: partition.locks.holders("k")[older]}


async def test_a_lock_request_whose_caller_gave_up_is_never_granted() -> None:
    """A request waiting for a lock is cancelled when its caller's deadline passes (found by
    review): it stayed queued, and the lock went to nobody at the holder's release, held until
    the idle sweep, a minute later."""
    partition = PartitionRuntime("p0", UnusedStore(timeout_ms_call=1000), Policy.WAIT_DIE, TIMEOUT_MS_LOCK_WAIT, 100,
                                 partition_count=1)
    now_ms = int(time.time() * 1000)
    older = txn_ids.new_txn_id(now_ms - 1000, "n0", "aaaaaa", 1, Protocol.CORNUS)
    younger = txn_ids.new_txn_id(now_ms, "n0", "bbbbbb", 2, Protocol.CORNUS)
    put = (Op(OpKind.PUT, "k", b"v"),)
    assert (await partition.execute(ExecuteRequest(younger, "p0", "n0", put))).status is ExecuteStatus.OK
    waiting = asyncio.create_task(partition.execute(ExecuteRequest(older, "p0", "n0", put)))
    await asyncio.sleep(0.05)
    waiting.cancel()  # the transport's deadline for the request
    await asyncio.gather(waiting, return_exceptions=True)
    partition.release(younger)
    assert partition.locks.holders("k") == {}, "the lock went to a request nobody waits for"


async def test_the_writes_a_partition_buffers_are_bounded_in_bytes() -> None:
    """Each transaction's writes to a partition stay within one redo record (the coordinator's
    check), but nothing bounded their sum over the many transactions a partition serves at once
    (thousands per coordinator): memory grew with every one until their decisions."""
    partition = PartitionRuntime("p0", UnusedStore(timeout_ms_call=1000), Policy.NO_WAIT, TIMEOUT_MS_LOCK_WAIT, 100,
                                 partition_count=1)
    now_ms = int(time.time() * 1000)
    value = b"v" * DATA_VALUE_BYTES_MAX
    per_request = 1  # one value per transaction: within a redo record, as the coordinator checks
    admitted = 0
    refused = None
    for index in range(2 * BUFFERED_BYTES_MAX // (per_request * DATA_VALUE_BYTES_MAX)):
        txn = txn_ids.new_txn_id(now_ms, "n0", "aaaaaa", index + 1, Protocol.CORNUS)
        ops = tuple(Op(OpKind.PUT, f"k{index}.{i}", value) for i in range(per_request))
        response = await partition.execute(ExecuteRequest(txn, "p0", "n0", ops))
        if response.status is not ExecuteStatus.OK:
            refused = (txn, response)
            break
        admitted += 1
    assert refused is not None, f"{admitted} transactions of {per_request * DATA_VALUE_BYTES_MAX} bytes each buffered"
    txn, response = refused
    # Refused as retryable, and it holds nothing: its locks went, and it may run again later.
    assert response.status is ExecuteStatus.UNAVAILABLE and "buffered" in response.detail, response
    assert admitted * per_request * DATA_VALUE_BYTES_MAX <= BUFFERED_BYTES_MAX
    assert not partition.locks.holds_any(txn) and txn not in partition.executions
    assert partition.state.buffered_bytes <= BUFFERED_BYTES_MAX
    # The bytes go with the executions: once one ends, another fits.
    first = txn_ids.new_txn_id(now_ms, "n0", "aaaaaa", 1, Protocol.CORNUS)
    partition.release(first)
    # Refused is aborted here (the coordinator retries with a new transaction).
    refused_again = await partition.execute(ExecuteRequest(txn, "p0", "n0", ops))
    assert refused_again.status is ExecuteStatus.ABORTED, refused_again
    retry = txn_ids.new_txn_id(now_ms, "n0", "bbbbbb", 1, Protocol.CORNUS)
    again = await partition.execute(ExecuteRequest(retry, "p0", "n0", tuple(
        Op(OpKind.PUT, f"again{i}", value) for i in range(per_request))))
    assert again.status is ExecuteStatus.OK, again
    for index in range(admitted):
        partition.release(txn_ids.new_txn_id(now_ms, "n0", "aaaaaa", index + 1, Protocol.CORNUS))
    partition.release(retry)
    assert partition.state.buffered_bytes == 0


async def test_a_key_written_again_counts_once_against_the_budget() -> None:
    """Found by review: every write of every request was counted, though the execution keeps one
    value per key, so one transaction overwriting one 64 KiB key 1,022 times (within the
    coordinator's checks) was refused, and took the partition's whole budget until then."""
    partition = PartitionRuntime("p0", UnusedStore(timeout_ms_call=1000), Policy.NO_WAIT, TIMEOUT_MS_LOCK_WAIT, 100,
                                 partition_count=1)
    txn = txn_ids.new_txn_id(int(time.time() * 1000), "n0", "aaaaaa", 1, Protocol.CORNUS)
    value = b"v" * DATA_VALUE_BYTES_MAX
    for index in range(1_100):
        request = ExecuteRequest(txn, "p0", "n0", (Op(OpKind.PUT, "k", value), Op(OpKind.PUT, "k", b"small")),
                                 continued=index > 0)
        response = await partition.execute(request)
        assert response.status is ExecuteStatus.OK, (index, response)
    assert partition.executions[txn].writes == {"k": b"small"}
    assert partition.state.buffered_bytes == partition.state.write_bytes("k", b"small")
    partition.release(txn)
    assert partition.state.buffered_bytes == 0


async def test_an_owner_refuses_a_key_its_partition_count_places_elsewhere_and_locks_nothing() -> None:
    """The second line behind the cluster record (tests/cluster/test_cluster_record.py): nodes
    that disagree on partition_count would store and lock one key under two partitions. An owner
    refuses an operation on a key its own count places in another partition, naming both, before
    it takes a lock or buffers a write (it was tested on real processes until the record made
    such a cluster unable to start)."""
    partition = PartitionRuntime("p1", UnusedStore(timeout_ms_call=1000), Policy.NO_WAIT, TIMEOUT_MS_LOCK_WAIT, 100,
                                 partition_count=4)
    elsewhere = next(key for key in (f"k{index}" for index in range(1000)) if partition_of(key, 4) != "p1")
    txn = txn_ids.new_txn_id(int(time.time() * 1000), "n0", "aaaaaa", 1, Protocol.CORNUS)
    for op in (Op(OpKind.PUT, elsewhere, b"v"), Op(OpKind.GET, elsewhere)):
        answer = await partition.execute(ExecuteRequest(txn, "p1", "n0", (op,)))
        assert answer.status is ExecuteStatus.INVALID, answer
        assert "disagree on partition_count" in answer.detail and partition_of(elsewhere, 4) in answer.detail
    assert partition.locks.holders(elsewhere) == {} and txn not in partition.executions


async def test_a_request_reading_past_read_bytes_max_is_refused_and_leaves_its_transaction_consistent(
        monkeypatch) -> None:
    """An owner refuses, as INVALID, a request whose values read would pass READ_BYTES_MAX (its
    answer would not fit a peer message). A one-shot's request, which carries its prepare, is
    remembered as aborted, so no copy of it (a client-chosen id sent to a second process of its
    coordinator's node) can begin it again and vote; an interactive first request leaves nothing,
    so the corrected one starts afresh; a continued one leaves the earlier requests' writes."""
    import cornus.runtime.partition as partition_module

    values_max = 4
    monkeypatch.setattr(partition_module, "_OP_COUNT_READS_ALWAYS_FIT", 1)
    value_bytes = partition_module.READ_VALUE_OVERHEAD_BYTES + 1
    monkeypatch.setattr(partition_module, "READ_BYTES_MAX", values_max * value_bytes)
    partition = PartitionRuntime("p0", UnusedStore(timeout_ms_call=1000), Policy.NO_WAIT, TIMEOUT_MS_LOCK_WAIT, 100,
                                 partition_count=1)
    now_ms = int(time.time() * 1000)
    keys = [f"k{i}" for i in range(values_max + 1)]
    for index, key in enumerate(keys):
        partition.state.cache_redo(redo_codec.encode({key: b"v"}))  # warm: no storage read
        assert partition.state.cached(key) == (True, b"v"), index
    gets = tuple(Op(OpKind.GET, key) for key in keys)
    fits = gets[:values_max]

    one_shot = txn_ids.new_txn_id(now_ms, "n0", "aaaaaa", 1, Protocol.CORNUS)
    refused = await partition.execute(ExecuteRequest(one_shot, "p0", "n0", gets, participants=("p0",)))
    assert refused.status is ExecuteStatus.INVALID and "read fewer keys" in refused.detail, refused
    again = await partition.execute(ExecuteRequest(one_shot, "p0", "n0", fits, participants=("p0",)))
    assert again.status is ExecuteStatus.ABORTED, again
    assert partition.locks.holders(keys[0]) == {}

    first = txn_ids.new_txn_id(now_ms, "n0", "bbbbbb", 2, Protocol.CORNUS)
    refused = await partition.execute(ExecuteRequest(first, "p0", "n0", gets))
    assert refused.status is ExecuteStatus.INVALID, refused
    assert first not in partition.executions and partition.locks.holders(keys[0]) == {}
    corrected = await partition.execute(ExecuteRequest(first, "p0", "n0", fits))
    assert corrected.status is ExecuteStatus.OK and corrected.values == (b"v",) * values_max, corrected

    continued = txn_ids.new_txn_id(now_ms, "n0", "cccccc", 3, Protocol.CORNUS)
    put = (Op(OpKind.PUT, "w", b"x"),)
    assert (await partition.execute(ExecuteRequest(continued, "p0", "n0", put))).status is ExecuteStatus.OK
    held_bytes = partition.state.buffered_bytes
    refused = await partition.execute(ExecuteRequest(continued, "p0", "n0", (*put, *gets), continued=True))
    assert refused.status is ExecuteStatus.INVALID, refused
    assert partition.executions[continued].writes == {"w": b"x"}
    assert partition.state.buffered_bytes == held_bytes, "the refused request's reservation stayed"


async def test_a_first_request_refused_for_its_reads_after_another_request_joined_it_aborts_its_transaction(
        monkeypatch) -> None:
    """Two calls of one interactive transaction sent at once: the first begins the execution and
    waits for a storage read; the second (a continued request) joins it and reads, under locks the
    execution holds. Withdrawing the first then would drop the second's locks and the coordinator,
    told "invalid", would count the partition untouched and commit without it: the transaction is
    aborted instead (ABORTED, which its coordinator does not take for "nothing ran")."""
    import cornus.runtime.partition as partition_module

    monkeypatch.setattr(partition_module, "_OP_COUNT_READS_ALWAYS_FIT", 1)
    monkeypatch.setattr(partition_module, "READ_BYTES_MAX", 2 * (partition_module.READ_VALUE_OVERHEAD_BYTES + 1))
    read_may_end = asyncio.Event()

    class SlowStore(UnusedStore):
        async def read_data(self, partition: str, keys: list[str]) -> dict[str, bytes | None]:
            await read_may_end.wait()
            return dict.fromkeys(keys, b"v")

    partition = PartitionRuntime("p0", SlowStore(timeout_ms_call=1000), Policy.NO_WAIT, TIMEOUT_MS_LOCK_WAIT, 100,
                                 partition_count=1)
    partition.state.cache_redo(redo_codec.encode({"seen": b"s"}))
    txn = txn_ids.new_txn_id(int(time.time() * 1000), "n0", "aaaaaa", 1, Protocol.CORNUS)
    gets = tuple(Op(OpKind.GET, f"k{i}") for i in range(3))
    first = asyncio.create_task(partition.execute(ExecuteRequest(txn, "p0", "n0", gets)))
    await asyncio.sleep(0.01)  # it waits for its storage read
    joined = await partition.execute(ExecuteRequest(txn, "p0", "n0", (Op(OpKind.GET, "seen"),), continued=True))
    assert joined.status is ExecuteStatus.OK and joined.values == (b"s",)
    read_may_end.set()
    refused = await first
    assert refused.status is ExecuteStatus.ABORTED and "read fewer keys" in refused.detail, refused
    assert txn not in partition.executions and partition.locks.holders("seen") == {}
    again = await partition.execute(ExecuteRequest(txn, "p0", "n0", (Op(OpKind.GET, "seen"),), continued=True))
    assert again.status is ExecuteStatus.ABORTED, "the transaction began again"
