"""Conformance of partition ownership and fencing: every backend, against its real service.

What Azure Blob cannot promise (a fenced write whose check passed may still land late, see its
module docstring) is not tested here: these tests check what every backend does promise, that a
write whose fence does not hold when it is checked is refused and writes nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from itertools import product
from typing import Any

import pytest

from storage_adapters.contract import (
    OWNER_LEASE_MS_MAX,
    OWNER_READ_COUNT_MAX,
    Fence,
    LogId,
    Ownership,
    RecordBody,
    TxnState,
    identity_name,
)
from storage_adapters.errors import Fenced, ValidationError
from storage_adapters.store import LogStore
from tests.storage.test_conformance import each_variant

VOTE, COMMIT, ABORT = TxnState.VOTE_YES, TxnState.COMMIT, TxnState.ABORT
# No test here waits a lease out, and on Azure a fenced write's signature expires with the lease
# it checked (storage_adapters.azure_signing): a 10 s lease failed a large redo on a loaded CI box
# whose Azurite stalled past it (2026-11-28). A lease longer than any test's own timeout.
LEASE_MS = 120_000
# Callers racing for one ownership record: enough that several land at once on every backend.
RACE_CALLER_COUNT = 16
# Writes in one large redo: past DynamoDB's 100 items per transaction, so it takes several.
LARGE_REDO_WRITE_COUNT = 250


def own(
    partition: str, owner: str, epoch: int, version: int, *, lease_ms: int = LEASE_MS, wanted_by: str = ""
) -> Ownership:
    return Ownership(partition, owner, epoch, version, lease_ms, wanted_by)


def body(partition: str) -> RecordBody:
    return RecordBody((partition,), "node-0", b"redo")


async def take_first(store: LogStore, partition: str, owner: str = "n1") -> Ownership:
    first = own(partition, owner, 1, 1)
    result = await store.write_owner(None, first)
    assert result.written and result.stored == first
    return first


async def written(store: LogStore, expected: Ownership, new: Ownership) -> Ownership:
    result = await store.write_owner(expected, new)
    assert result.written and result.stored == new, result
    return new


# --- write_owner ----------------------------------------------------------------------------------


async def test_first_write_owner_creates_the_record(store: LogStore, ns: str) -> None:
    first = await take_first(store, ns)
    assert await store.read_owners([ns]) == {ns: first}


async def test_first_write_owner_loses_to_an_existing_record(store: LogStore, ns: str) -> None:
    first = await take_first(store, ns)
    result = await store.write_owner(None, own(ns, "n2", 1, 1))
    assert (result.stored, result.written) == (first, False)
    assert await store.read_owners([ns]) == {ns: first}


async def test_concurrent_first_writes_have_one_winner_and_all_see_it(store: LogStore, ns: str) -> None:
    results = await asyncio.gather(
        *(store.write_owner(None, own(ns, f"n{i}", 1, 1)) for i in range(RACE_CALLER_COUNT))
    )
    winners = [result.stored for result in results if result.written]
    assert len(winners) == 1, winners
    assert {result.stored for result in results} == {winners[0]}, "every loser is told the winner"
    assert await store.read_owners([ns]) == {ns: winners[0]}


async def test_renewal_wins_and_a_stale_expected_loses(store: LogStore, ns: str) -> None:
    first = await take_first(store, ns)
    renewed = await written(store, first, own(ns, "n1", 1, 2))
    # Someone still holding version 1 (a slow renewal, a would-be taker) loses and learns version 2.
    for stale_new in (own(ns, "n1", 1, 2, lease_ms=LEASE_MS + 1), own(ns, "n2", 2, 2)):
        result = await store.write_owner(first, stale_new)
        assert (result.stored, result.written) == (renewed, False)
    assert await store.read_owners([ns]) == {ns: renewed}
    # Renewing again from what is stored works, however often.
    current = renewed
    for version in range(3, 6):
        current = await written(store, current, own(ns, "n1", 1, version))
    assert await store.read_owners([ns]) == {ns: current}


async def test_concurrent_renewals_from_one_version_have_one_winner(store: LogStore, ns: str) -> None:
    first = await take_first(store, ns)
    candidates = [own(ns, "n1", 1, 2, lease_ms=LEASE_MS + i) for i in range(RACE_CALLER_COUNT)]
    results = await asyncio.gather(*(store.write_owner(first, candidate) for candidate in candidates))
    winners = [result.stored for result in results if result.written]
    assert len(winners) == 1, winners
    assert {result.stored for result in results} == {winners[0]}
    assert await store.read_owners([ns]) == {ns: winners[0]}


async def test_write_owner_to_an_absent_record_with_expected_loses(store: LogStore, ns: str) -> None:
    result = await store.write_owner(own(ns, "n1", 1, 1), own(ns, "n1", 1, 2))
    assert (result.stored, result.written) == (None, False)
    assert await store.read_owners([ns]) == {}


async def test_take_in_a_new_epoch_and_hand_off_fields_round_trip(store: LogStore, ns: str) -> None:
    first = await take_first(store, ns)
    asked = await written(store, first, own(ns, "n1", 1, 2, wanted_by="n2"))
    assert (await store.read_owners([ns]))[ns].wanted_by == "n2"
    taken = await written(store, asked, own(ns, "n2", 2, 3, lease_ms=OWNER_LEASE_MS_MAX))
    assert await store.read_owners([ns]) == {ns: taken}
    # The old owner's renewal from what it last knew loses to the take.
    result = await store.write_owner(asked, own(ns, "n1", 1, 3))
    assert (result.stored, result.written) == (taken, False)


async def test_release_then_take(store: LogStore, ns: str) -> None:
    first = await take_first(store, ns)
    released = await written(store, first, own(ns, "", 1, 2))
    assert await store.read_owners([ns]) == {ns: released}
    taken = await written(store, released, own(ns, "n2", 2, 3))
    assert await store.read_owners([ns]) == {ns: taken}


def _bad_owner_writes(ns: str) -> list[tuple[str, Any, Any]]:
    current = own(ns, "n1", 3, 7)
    return [
        ("first not epoch 1", None, own(ns, "n1", 2, 1)),
        ("first not version 1", None, own(ns, "n1", 1, 2)),
        ("version kept", current, own(ns, "n1", 3, 7)),
        ("version skipped", current, own(ns, "n1", 3, 9)),
        ("version lowered", current, own(ns, "n1", 3, 6)),
        ("epoch skipped", current, own(ns, "n2", 5, 8)),
        ("epoch lowered", current, own(ns, "n1", 2, 8)),
        ("taken without a new epoch", current, own(ns, "n2", 3, 8)),
        ("another partition", current, own(ns + "x", "n1", 3, 8)),
        ("expected not an Ownership", (ns, "n1", 3, 7), own(ns, "n1", 3, 8)),
        ("new not an Ownership", current, None),
        ("new as dict", None, {"partition": ns, "owner": "n1", "epoch": 1, "version": 1}),
    ]


async def test_bad_owner_writes_are_refused_and_write_nothing(store: LogStore, ns: str) -> None:
    # Set up a stored record that each bad write would match, so a write that slipped past
    # validation would show.
    current = await take_first(store, ns)
    for version in range(2, 8):
        current = await written(store, current, own(ns, "n1", current.epoch + (version % 3 == 0), version))
    assert (current.epoch, current.version) == (3, 7)
    for label, expected, new in _bad_owner_writes(ns):
        with pytest.raises(ValidationError):
            await store.write_owner(expected, new)
            pytest.fail(f"{label}: accepted")
    assert await store.read_owners([ns, ns + "x"]) == {ns: current}


@pytest.mark.parametrize(
    "fields",
    [
        {"partition": "a/b"},
        {"owner": "node 1"},
        {"wanted_by": "{n}"},
        {"epoch": 0},
        {"version": 0},
        {"epoch": True},
        {"lease_ms": 0},
        {"lease_ms": OWNER_LEASE_MS_MAX + 1},
    ],
)
def test_bad_ownership_records_cannot_be_built(fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        Ownership(**{"partition": "p", "owner": "n1", "epoch": 1, "version": 1, "lease_ms": LEASE_MS, **fields})


@pytest.mark.parametrize(
    "fields", [{"partition": "a/b"}, {"owner": ""}, {"owner": "node 1"}, {"epoch": 0}, {"epoch": "1"}]
)
def test_bad_fences_cannot_be_built(fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        Fence(**{"partition": "p", "owner": "n1", "epoch": 1, **fields})


# --- read_owners ----------------------------------------------------------------------------------


async def test_read_owners_returns_only_existing_records(store: LogStore, ns: str) -> None:
    partitions = [f"{ns}-{i:03}" for i in range(LARGE_REDO_WRITE_COUNT)]
    owned = partitions[::7]
    records = await asyncio.gather(*(take_first(store, partition, f"n{i}") for i, partition in enumerate(owned)))
    expected = dict(zip(owned, records, strict=True))
    assert await store.read_owners(partitions) == expected
    assert await store.read_owners([*partitions[:3], partitions[0]]) == {partitions[0]: expected[partitions[0]]}
    assert await store.read_owners([ns + "-none"]) == {}
    assert await store.read_owners([]) == {}


async def test_read_owners_finds_every_name_shape(store: LogStore, ns: str) -> None:
    # Names that end in '.', and names that are prefixes of others: where a backend's blob names or
    # key prefixes could part from the partition names.
    names = [ns, f"{ns}.", f"{ns}..", f"{ns}.a", f"{ns}a.", f"{ns}-x", f"{ns}_y", f"{ns}:z"]
    owned = {name: await take_first(store, name) for name in names}
    # Enough names that a backend may list rather than read one by one.
    padding = [f"{ns}-pad{i}" for i in range(2 * len(names) * len(names))]
    assert await store.read_owners([*names, *padding]) == owned
    assert await store.read_owners([*names[1:], *padding]) == {name: owned[name] for name in names[1:]}
    assert await store.read_owners([*padding, names[2]]) == {names[2]: owned[names[2]]}
    assert await store.read_owners(names[:2]) == {name: owned[name] for name in names[:2]}


async def test_read_owners_takes_the_limit(store: LogStore, ns: str) -> None:
    partitions = [f"{ns}-{i}" for i in range(OWNER_READ_COUNT_MAX)]
    first = await take_first(store, partitions[-1])
    assert await store.read_owners(partitions) == {partitions[-1]: first}


BAD_READ_OWNERS_INPUTS = (
    "p1",
    b"p1",
    None,
    ["ok", "a/b"],
    ["ok", ""],
    ["ok", 7],
    [f"p{i}" for i in range(OWNER_READ_COUNT_MAX + 1)],
)


async def test_read_owners_refuses_every_bad_input(store: LogStore, ns: str) -> None:
    async def check(_: str, partitions: object) -> None:
        with pytest.raises(ValidationError):
            await store.read_owners(partitions)  # type: ignore[arg-type]

    await each_variant(ns, product(BAD_READ_OWNERS_INPUTS), check)


# --- fenced writes --------------------------------------------------------------------------------

# How a fence of n1 at some epoch can fail to hold: what storage holds, and the fence tried.
FENCE_FAILURES = ["absent", "wrong owner", "older epoch", "newer epoch", "released"]


async def arrange_failing_fence(store: LogStore, partition: str, case: str) -> tuple[Fence, Ownership | None]:
    """Store an ownership record (or none) that refuses the fence returned, and return it too."""
    if case == "absent":
        return Fence(partition, "n1", 1), None
    if case == "wrong owner":
        return Fence(partition, "n1", 1), await take_first(store, partition, "n2")
    first = await take_first(store, partition, "n1")
    if case == "older epoch":
        return Fence(partition, "n1", 1), await written(store, first, own(partition, "n1", 2, 2))
    if case == "newer epoch":
        return Fence(partition, "n1", 2), first
    assert case == "released"
    return Fence(partition, "n1", 1), await written(store, first, own(partition, "", 1, 2))


async def expect_fenced(call: Awaitable[Any], fence: Fence, stored: Ownership | None) -> None:
    with pytest.raises(Fenced) as refused:
        await call
    assert (refused.value.fence, refused.value.stored) == (fence, stored)


async def test_fenced_writes_with_the_owners_fence_succeed(store: LogStore, ns: str) -> None:
    log = LogId.partition(ns)
    fence = (await take_first(store, ns)).fence()
    assert (await store.log_once(log, "t1", VOTE, body(ns), fence)).created
    # A loser of log_once whose fence holds is told the stored state, as without a fence.
    result = await store.log_once(log, "t1", ABORT, body(ns), fence)
    assert (result.state, result.created) == (VOTE, False)
    assert await store.log(log, "t1", COMMIT, None, fence) is COMMIT
    assert await store.log(log, "t1", COMMIT, None, fence) is COMMIT
    assert await store.log(log, "t2", ABORT, body(ns), fence) is ABORT
    assert await store.apply_redo(ns, "t1", {"k": b"v", "gone": None}, fence) is True
    assert await store.apply_redo(ns, "t1", {"k": b"v", "gone": None}, fence) is False
    assert await store.read_data(ns, ["k", "gone"]) == {"k": b"v", "gone": None}
    record = await store.read(log, "t1")
    assert record is not None and record.state is COMMIT and record.applied and record.body == body(ns)
    # The owner's apply over its own VOTE_YES commits the record in the same fenced call.
    assert (await store.log_once(log, "t3", VOTE, body(ns), fence)).created
    assert await store.apply_redo(ns, "t3", {"k3": b"v3"}, fence) is True
    assert await store.apply_redo(ns, "t3", {"k3": b"again"}, fence) is False
    assert await store.read_data(ns, ["k3"]) == {"k3": b"v3"}
    voted = await store.read(log, "t3")
    assert voted is not None and (voted.state, voted.applied) == (COMMIT, True)
    assert await store.delete(log, "t1", fence) is True
    assert await store.delete(log, "t1", fence) is False
    assert await store.read(log, "t1") is None
    assert (await store.read(log, "t2")).state is ABORT  # type: ignore[union-attr]


async def test_fenced_writes_follow_renewals_and_the_new_epoch(store: LogStore, ns: str) -> None:
    log = LogId.partition(ns)
    first = await take_first(store, ns)
    # A renewal keeps the epoch, so the owner's fence still holds.
    renewed = await written(store, first, own(ns, "n1", 1, 2, wanted_by="n2"))
    assert (await store.log_once(log, "t1", VOTE, body(ns), first.fence())).created
    taken = await written(store, renewed, own(ns, "n2", 2, 3))
    await expect_fenced(store.log(log, "t1", ABORT, None, first.fence()), first.fence(), taken)
    assert await store.log(log, "t1", ABORT, None, taken.fence()) is ABORT


async def test_fenced_log_once_is_refused_and_writes_nothing_however_the_fence_fails(
    store: LogStore, ns: str
) -> None:
    async def check(ns: str, case: str) -> None:
        log = LogId.partition(ns)
        fence, stored = await arrange_failing_fence(store, ns, case)
        await expect_fenced(store.log_once(log, "t", VOTE, body(ns), fence), fence, stored)
        assert await store.read(log, "t") is None
        assert await store.scan_unfinished(log) == []

    await each_variant(ns, product(FENCE_FAILURES), check)


async def test_fenced_log_once_on_an_existing_record_is_refused_however_the_fence_fails(
    store: LogStore, ns: str
) -> None:
    async def check(ns: str, case: str) -> None:
        log = LogId.partition(ns)
        fence, stored = await arrange_failing_fence(store, ns, case)
        await store.log_once(log, "t", COMMIT, body(ns))
        before = await store.read(log, "t")
        await expect_fenced(store.log_once(log, "t", ABORT, body(ns), fence), fence, stored)
        assert await store.read(log, "t") == before

    await each_variant(ns, product(FENCE_FAILURES), check)


async def test_fenced_log_is_refused_and_writes_nothing_however_the_fence_fails(store: LogStore, ns: str) -> None:
    async def check(ns: str, case: str) -> None:
        log = LogId.partition(ns)
        fence, stored = await arrange_failing_fence(store, ns, case)
        await store.log_once(log, "voted", VOTE, body(ns))
        before = await store.read(log, "voted")
        await expect_fenced(
            store.log(log, "voted", COMMIT, RecordBody((ns,), "intruder", b"x"), fence), fence, stored
        )
        await expect_fenced(store.log(log, "voted", COMMIT, None, fence), fence, stored)
        await expect_fenced(store.log(log, "absent", ABORT, None, fence), fence, stored)
        # A fence refused wins over a transition refused: the deposed writer learns it is deposed.
        await store.log_once(log, "aborted", ABORT, body(ns))
        await expect_fenced(store.log(log, "aborted", COMMIT, None, fence), fence, stored)
        assert await store.read(log, "voted") == before
        assert await store.read(log, "absent") is None
        assert (await store.read(log, "aborted")).state is ABORT  # type: ignore[union-attr]

    await each_variant(ns, product(FENCE_FAILURES), check)


async def test_fenced_delete_is_refused_and_deletes_nothing_however_the_fence_fails(
    store: LogStore, ns: str
) -> None:
    async def check(ns: str, case: str) -> None:
        log = LogId.partition(ns)
        fence, stored = await arrange_failing_fence(store, ns, case)
        await store.log_once(log, "t", ABORT, body(ns))
        before = await store.read(log, "t")
        await expect_fenced(store.delete(log, "t", fence), fence, stored)
        await expect_fenced(store.delete(log, "absent", fence), fence, stored)
        assert await store.read(log, "t") == before

    await each_variant(ns, product(FENCE_FAILURES), check)


async def test_fenced_apply_redo_of_any_size_over_a_vote_or_commit_is_refused_and_writes_nothing(
    store: LogStore, ns: str
) -> None:
    """However the fence fails, a redo of a few writes or of several DynamoDB transactions' worth,
    over the owner's vote or its commit."""

    async def check(ns: str, case: str, write_count: int, state: TxnState) -> None:
        log = LogId.partition(ns)
        fence, stored = await arrange_failing_fence(store, ns, case)
        await store.log_once(log, "t", state, body(ns))
        writes: dict[str, bytes | None] = {f"k{i:03}": b"new" for i in range(write_count)}
        # A key the redo deletes must survive too.
        await store.log_once(log, "setup", COMMIT, body(ns))
        await store.apply_redo(ns, "setup", {"k000": b"old"})
        writes["k000"] = None
        await expect_fenced(store.apply_redo(ns, "t", writes, fence), fence, stored)
        data = await store.read_data(ns, list(writes))
        assert data == {key: b"old" if key == "k000" else None for key in writes}
        refused = await store.read(log, "t")
        assert refused is not None and (refused.state, refused.applied) == (state, False)
        # Refused however the record stands: an applied record does not let a deposed owner through.
        await store.apply_redo(ns, "t", {"k000": b"applied"})
        await expect_fenced(store.apply_redo(ns, "t", writes, fence), fence, stored)
        assert await store.read_data(ns, ["k000"]) == {"k000": b"applied"}

    await each_variant(ns, product(FENCE_FAILURES, [2, LARGE_REDO_WRITE_COUNT], [VOTE, COMMIT]), check)


async def test_fenced_large_apply_redo_with_the_owners_fence_applies_all(store: LogStore, ns: str) -> None:
    fence = (await take_first(store, ns)).fence()
    log = LogId.partition(ns)
    # A COMMIT record, then a VOTE_YES that the apply commits itself. Both redos write the same
    # keys, so the test leaves no more items than one redo: moto copies the whole table for every
    # transaction, and a bigger table slows every later test.
    for txn, state, fill in (("t", COMMIT, 0), ("v", VOTE, 1)):
        await store.log_once(log, txn, state, body(ns), fence)
        writes: dict[str, bytes | None] = {
            f"k{i:03}": bytes([(i + fill) % 256]) * 100 for i in range(LARGE_REDO_WRITE_COUNT)
        }
        assert await store.apply_redo(ns, txn, writes, fence) is True
        assert await store.read_data(ns, list(writes)) == writes
        record = await store.read(log, txn)
        assert record is not None and (record.state, record.applied) == (COMMIT, True), txn
        assert await store.apply_redo(ns, txn, writes, fence) is False


async def test_a_take_refuses_the_old_owners_next_writes(store: LogStore, ns: str) -> None:
    log = LogId.partition(ns)
    first = await take_first(store, ns)
    old = first.fence()
    await store.log_once(log, "t", VOTE, body(ns), old)
    taken = await written(store, first, own(ns, "n2", 2, 2))
    calls: list[Callable[[], Awaitable[Any]]] = [
        lambda: store.log_once(log, "t2", VOTE, body(ns), old),
        lambda: store.log(log, "t", COMMIT, None, old),
        lambda: store.delete(log, "t", old),
        lambda: store.apply_redo(ns, "t", {"k": b"v"}, old),
    ]
    for call in calls:
        await expect_fenced(call(), old, taken)
    assert (await store.read(log, "t")).state is VOTE  # type: ignore[union-attr]
    assert await store.read(log, "t2") is None


# --- a node's identity: the fence of its coordinator log -------------------------------------------


async def test_a_second_process_of_a_node_fences_the_first_ones_coordinator_log(store: LogStore, ns: str) -> None:
    node, log = ns, LogId.coordinator(ns)
    name = identity_name(node)
    first = await take_first(store, name, node)
    old = first.fence()
    assert (await store.log_once(log, "t", VOTE, body(ns), old)).created
    assert await store.log(log, "t", COMMIT, None, old) is COMMIT
    assert await store.log(log, "gone", ABORT, body(ns), old) is ABORT
    assert await store.delete(log, "gone", old) is True
    assert await store.read_owners([name, ns]) == {name: first}
    # The second process takes the node's name in a new epoch: the first one's writes, from then
    # on, are refused and write nothing, whatever they are.
    taken = await written(store, first, own(name, node, 2, 2))
    calls: list[Callable[[], Awaitable[Any]]] = [
        lambda: store.log_once(log, "t2", COMMIT, body(ns), old),
        lambda: store.log(log, "t3", COMMIT, body(ns), old),
        lambda: store.delete(log, "t", old),
    ]
    for call in calls:
        await expect_fenced(call(), old, taken)
    assert (await store.read(log, "t")).state is COMMIT  # type: ignore[union-attr]
    assert await store.read(log, "t2") is None and await store.read(log, "t3") is None
    assert await store.scan_unfinished(log) == [await store.read(log, "t")]
    # Concurrent deletes, coalesced into one request where the backend can: each its own answer.
    assert (await store.log_once(log, "t4", ABORT, body(ns))).created
    new = taken.fence()
    answers = await asyncio.gather(
        store.delete(log, "t", new), store.delete(log, "t4", old), store.delete(log, "absent", new),
        return_exceptions=True,
    )
    assert answers[0] is True and answers[2] is False, answers
    assert isinstance(answers[1], Fenced) and (answers[1].fence, answers[1].stored) == (old, taken)
    assert await store.read(log, "t") is None
    assert (await store.read(log, "t4")).state is ABORT  # type: ignore[union-attr]
    # Unfenced writes (an operator's resolve) stay allowed.
    assert (await store.log_once(log, "t5", ABORT, body(ns))).created


async def test_an_identity_fence_guards_only_its_nodes_coordinator_log(store: LogStore, ns: str) -> None:
    identity = (await take_first(store, identity_name(ns), ns)).fence()
    partition_fence = (await take_first(store, ns, ns)).fence()
    coordinator, partition = LogId.coordinator(ns), LogId.partition(ns)
    others = Fence(identity_name(ns + "x"), ns, 1)
    calls: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
        ("partition fence, coordinator log", lambda: store.log_once(coordinator, "t", VOTE, body(ns), partition_fence)),
        ("identity fence, partition log", lambda: store.log_once(partition, "t", VOTE, body(ns), identity)),
        ("identity fence, partition data", lambda: store.apply_redo(ns, "t", {"k": b"v"}, identity)),
        ("another node's identity", lambda: store.log(coordinator, "t", VOTE, body(ns), others)),
        ("another node's identity, delete", lambda: store.delete(coordinator, "t", others)),
    ]
    for label, call in calls:
        with pytest.raises(ValidationError):
            await call()
            pytest.fail(f"{label}: accepted")
    assert await store.read(coordinator, "t") is None and await store.read(partition, "t") is None
    for bad in ("node:x", "node:"):
        with pytest.raises(ValidationError):
            LogId.partition(bad)
    with pytest.raises(ValidationError):
        await store.read_owners(["node:"])


# --- fence validation -----------------------------------------------------------------------------


async def test_fence_for_another_partition_or_a_coordinator_log_is_refused(store: LogStore, ns: str) -> None:
    log, other = LogId.partition(ns), ns + "other"
    await take_first(store, ns)
    await take_first(store, other)
    wrong = Fence(other, "n1", 1)  # holds for `other`, so only validation can refuse it
    right = Fence(ns, "n1", 1)
    coordinator = LogId.coordinator(ns)
    await store.log_once(log, "c", COMMIT, body(ns))
    calls: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
        ("log_once, other partition", lambda: store.log_once(log, "t", VOTE, body(ns), wrong)),
        ("log, other partition", lambda: store.log(log, "t", VOTE, body(ns), wrong)),
        ("delete, other partition", lambda: store.delete(log, "c", wrong)),
        ("apply_redo, other partition", lambda: store.apply_redo(ns, "c", {"k": b"v"}, wrong)),
        ("log_once, coordinator log", lambda: store.log_once(coordinator, "t", VOTE, body(ns), right)),
        ("log, coordinator log", lambda: store.log(coordinator, "t", VOTE, body(ns), right)),
        ("delete, coordinator log", lambda: store.delete(coordinator, "t", right)),
        ("log_once, fence as tuple", lambda: store.log_once(log, "t", VOTE, body(ns), (ns, "n1", 1))),
        ("apply_redo, fence as ownership", lambda: store.apply_redo(ns, "c", {"k": b"v"}, own(ns, "n1", 1, 1))),
    ]
    await store.log_once(coordinator, "t", VOTE, body(ns))
    before = await store.read(coordinator, "t")
    for label, call in calls:
        with pytest.raises(ValidationError):
            await call()
            pytest.fail(f"{label}: accepted")
    assert await store.read(log, "t") is None
    assert await store.read(coordinator, "t") == before
    assert (await store.read(log, "c")).applied is False  # type: ignore[union-attr]
    assert await store.read_data(ns, ["k"]) == {"k": None}


# --- unfenced writes ------------------------------------------------------------------------------


async def test_unfenced_writes_work_whatever_the_ownership(store: LogStore, ns: str) -> None:
    async def check(ns: str, case: str) -> None:
        # A terminator's LogOnce(ABORT) on another partition's log carries no fence and must land.
        await arrange_failing_fence(store, ns, case)
        log = LogId.partition(ns)
        assert (await store.log_once(log, "t", VOTE, body(ns))).created
        assert await store.log(log, "t", COMMIT) is COMMIT
        assert await store.apply_redo(ns, "t", {"k": b"v"}) is True
        assert await store.read_data(ns, ["k"]) == {"k": b"v"}
        assert await store.delete(log, "t") is True
        coordinator = LogId.coordinator(ns)
        assert (await store.log_once(coordinator, "t", ABORT, body(ns))).created
        assert await store.delete(coordinator, "t") is True

    await each_variant(ns, product(["absent", "wrong owner", "released"]), check)
