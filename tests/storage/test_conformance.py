"""The LogStore conformance suite: every backend, against its real service, must pass all of it."""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing
import time
from collections.abc import Awaitable, Callable, Iterable
from itertools import product
from typing import Any

import pytest
import redis

from storage_adapters.contract import (
    CLUSTER_RECORD_TXN,
    DATA_BATCH_COUNT_MAX,
    DATA_KEY_BYTES_MAX,
    DATA_VALUE_BYTES_MAX,
    PARTICIPANT_COUNT_MAX,
    REDO_BYTES_MAX,
    SCAN_PAGE_COUNT_MAX,
    TXN_ID_LENGTH_MAX,
    Fence,
    LogId,
    LogKind,
    Record,
    RecordBody,
    TxnState,
)
from storage_adapters.errors import DecisionFlipRefused, InvariantViolation, ValidationError
from storage_adapters.factory import StoreConfig, open_store
from storage_adapters.store import LogStore
from tests.worker import redis_db_cluster

VOTE, COMMIT, ABORT = TxnState.VOTE_YES, TxnState.COMMIT, TxnState.ABORT


def body(*participants: str, coordinator: str = "node-0", redo: bytes = b"redo") -> RecordBody:
    return RecordBody(tuple(participants), coordinator, redo)


async def each_variant(
    ns: str,
    variants: Iterable[tuple[Any, ...]],
    check: Callable[..., Awaitable[None]],
    *,
    concurrently: bool = False,
) -> None:
    """Run `check(variant_ns, *variant)` for every variant, each in a namespace of its own: `ns`
    and the variant's index, fixed-width, so that no variant's names extend another's.

    Why not a parametrized case each: a case paid opening a store against its real service (an
    emulator's writer process, a moto or Azurite client) for a few small calls, and the suite is
    bound by its workers' time. One test per backend running every variant keeps each variant's
    checks as they were; a failure names its variant (a note under the error).

    In turn by default, as each case ran alone: where calls of one tick go to storage together
    (the emulator's transactions, Redis's scripts, Azure's batches), variants run at once would
    take other paths than one alone. `concurrently` is for checks that mostly wait out a clock."""

    async def named(index: int, variant: tuple[Any, ...]) -> None:
        try:
            await check(f"{ns}-{index:02}", *variant)
        except BaseException as failure:  # an assert, pytest.raises' "DID NOT RAISE", a storage error
            failure.add_note(f"in variant {index} ({', '.join(map(repr, variant))})")
            raise

    if not concurrently:
        for index, variant in enumerate(variants):
            await named(index, variant)
        return
    results = await asyncio.gather(
        *(named(index, variant) for index, variant in enumerate(variants)), return_exceptions=True
    )
    failures = [result for result in results if isinstance(result, BaseException)]
    if failures:
        for other in failures[1:]:
            failures[0].add_note(f"also failed {'; '.join(getattr(other, '__notes__', []))}: {other!r}")
        raise failures[0]


# --- log_once -------------------------------------------------------------------------------------


async def test_log_once_creates_absent_record_in_every_state(store: LogStore, ns: str) -> None:
    async def check(ns: str, state: TxnState) -> None:
        log = LogId.partition(f"{ns}-p0")
        result = await store.log_once(log, "txn-1", state, body(f"{ns}-p0", f"{ns}-p1"))
        assert (result.state, result.created) == (state, True)
        record = await store.read(log, "txn-1")
        assert record is not None
        assert (record.log, record.txn, record.state, record.applied) == (log, "txn-1", state, False)
        assert record.body == body(f"{ns}-p0", f"{ns}-p1")
        assert abs(record.created_at_ms - time.time() * 1000) < 10 * 60 * 1000

    await each_variant(ns, product(TxnState), check)


async def test_log_once_never_changes_existing_record_whatever_either_state(store: LogStore, ns: str) -> None:
    async def check(ns: str, first: TxnState, second: TxnState) -> None:
        log = LogId.partition(ns)
        await store.log_once(log, "t", first, body(ns, redo=b"first"))
        result = await store.log_once(log, "t", second, body(ns, coordinator="other", redo=b"second"))
        assert (result.state, result.created) == (first, False)
        record = await store.read(log, "t")
        assert record is not None and record.state is first and record.body == body(ns, redo=b"first")

    await each_variant(ns, product(TxnState, TxnState), check)


async def test_logs_are_separate_namespaces(store: LogStore, ns: str) -> None:
    partition, coordinator = LogId.partition(ns), LogId.coordinator(ns)
    await store.log_once(partition, "t", VOTE, body())
    assert (await store.log_once(coordinator, "t", ABORT, body())).created
    assert (await store.log_once(LogId.partition(ns + "x"), "t", ABORT, body())).created
    assert (await store.read(partition, "t")).state is VOTE  # type: ignore[union-attr]
    assert (await store.read(coordinator, "t")).state is ABORT  # type: ignore[union-attr]


async def test_empty_and_binary_bodies_round_trip(store: LogStore, ns: str) -> None:
    log = LogId.partition(ns)
    await store.log_once(log, "empty", VOTE, RecordBody())
    assert (await store.read(log, "empty")).body == RecordBody()  # type: ignore[union-attr]
    redo = bytes(range(256)) * 4
    await store.log_once(log, "binary", VOTE, body(ns, redo=redo))
    assert (await store.read(log, "binary")).body.redo == redo  # type: ignore[union-attr]


async def test_read_absent_is_none(store: LogStore, ns: str) -> None:
    assert await store.read(LogId.partition(ns), "nothing") is None


# --- log ------------------------------------------------------------------------------------------


async def test_log_creates_absent_record_in_every_state(store: LogStore, ns: str) -> None:
    async def check(ns: str, state: TxnState) -> None:
        log = LogId.coordinator(ns)
        assert await store.log(log, "t", state, body(ns)) is state
        record = await store.read(log, "t")
        assert record is not None and record.state is state and record.body == body(ns)

    await each_variant(ns, product(TxnState), check)


async def test_log_without_body_creates_empty_body(store: LogStore, ns: str) -> None:
    log = LogId.coordinator(ns)
    await store.log(log, "t", ABORT)
    assert (await store.read(log, "t")).body == RecordBody()  # type: ignore[union-attr]


async def test_log_moves_vote_to_either_decision_keeping_body(store: LogStore, ns: str) -> None:
    async def check(ns: str, decision: TxnState) -> None:
        log = LogId.partition(ns)
        await store.log(log, "t", VOTE, body(ns, redo=b"keep me"))
        assert await store.log(log, "t", decision) is decision
        record = await store.read(log, "t")
        assert record is not None and record.state is decision and record.body.redo == b"keep me"

    await each_variant(ns, product([COMMIT, ABORT]), check)


async def test_log_with_body_replaces_body(store: LogStore, ns: str) -> None:
    log = LogId.partition(ns)
    await store.log(log, "t", VOTE, body(ns, redo=b"old"))
    await store.log(log, "t", COMMIT, body(ns, redo=b"new"))
    assert (await store.read(log, "t")).body.redo == b"new"  # type: ignore[union-attr]


async def test_log_same_state_is_idempotent_in_every_state(store: LogStore, ns: str) -> None:
    async def check(ns: str, state: TxnState) -> None:
        log = LogId.partition(ns)
        await store.log(log, "t", state, body(ns))
        assert await store.log(log, "t", state) is state
        assert (await store.read(log, "t")).state is state  # type: ignore[union-attr]

    await each_variant(ns, product(TxnState), check)


async def test_log_refuses_every_decision_flip_and_writes_nothing(store: LogStore, ns: str) -> None:
    async def check(ns: str, stored: TxnState, wanted: TxnState) -> None:
        log = LogId.partition(ns)
        await store.log_once(log, "t", stored, body(ns, redo=b"original"))
        before = await store.read(log, "t")
        with pytest.raises(DecisionFlipRefused) as refused:
            await store.log(log, "t", wanted, body(ns, coordinator="intruder", redo=b"intruder"))
        assert (refused.value.stored, refused.value.wanted) == (stored, wanted)
        assert await store.read(log, "t") == before
        with pytest.raises(DecisionFlipRefused):
            await store.log(log, "t", wanted)
        assert await store.read(log, "t") == before

    await each_variant(ns, [(COMMIT, ABORT), (ABORT, COMMIT), (COMMIT, VOTE), (ABORT, VOTE)], check)


# --- scan, data, delete ---------------------------------------------------------------------------


async def test_scan_unfinished_lists_votes_and_unapplied_commits(store: LogStore, ns: str) -> None:
    log = LogId.partition(ns)
    await store.log_once(log, "vote", VOTE, body(ns))
    await store.log_once(log, "commit-unapplied", COMMIT, body(ns))
    await store.log_once(log, "commit-applied", COMMIT, body(ns))
    await store.apply_redo(ns, "commit-applied", {"k": b"v"})
    await store.log_once(log, "abort", ABORT, body(ns))
    await store.log_once(log, "vote-then-abort", VOTE, body(ns))
    await store.log(log, "vote-then-abort", ABORT)
    await store.log_once(LogId.partition(ns + "other"), "elsewhere", VOTE, body())
    await store.log_once(LogId.coordinator(ns), "coordinator-log", VOTE, body())

    found = {record.txn: record for record in await store.scan_unfinished(log)}
    assert set(found) == {"vote", "commit-unapplied"}
    assert found["vote"].state is VOTE and found["vote"].body == body(ns)
    assert found["commit-unapplied"].state is COMMIT and not found["commit-unapplied"].applied


async def test_scan_unfinished_respects_limit(store: LogStore, ns: str) -> None:
    log = LogId.partition(ns)
    await asyncio.gather(*(store.log_once(log, f"t{i:02}", VOTE, body()) for i in range(12)))
    page = await store.scan_unfinished(log, limit=5)
    assert len(page) == 5 and len({record.txn for record in page}) == 5
    assert len(await store.scan_unfinished(log)) == 12


# Pages a walk may take before the test calls it endless: far more than any test log holds.
SCAN_WALK_PAGE_COUNT_MAX = 200


async def _walk(store: LogStore, log: LogId, limit: int, after: str = "") -> list[list[Record]]:
    """Every page from `after` on, each read with the cursor the page before gives, as recovery does."""
    pages: list[list[Record]] = []
    for _ in range(SCAN_WALK_PAGE_COUNT_MAX):
        page = await store.scan_unfinished(log, limit, after)
        pages.append(page)
        if len(page) < limit:
            return pages
        after = page[-1].txn
    pytest.fail(f"scan of {log.key} did not end within {SCAN_WALK_PAGE_COUNT_MAX} pages")


async def test_scan_unfinished_pages_return_every_unfinished_record_once_in_order(store: LogStore, ns: str) -> None:
    log = LogId.partition(ns)
    unfinished: dict[str, TxnState] = {}
    to_apply: list[str] = []
    creates = []
    for i in range(24):
        txn = f"t{i:02}"
        state = (VOTE, COMMIT, ABORT, COMMIT)[i % 4]
        creates.append(store.log_once(log, txn, state, body(ns)))
        if i % 4 == 3:
            to_apply.append(txn)
        elif state is not ABORT:
            unfinished[txn] = state
    # Ids ending in '.' and their extensions, upper case below lower: where a backend's native key
    # order could part from plain string order.
    for txn in ["k.", "k..", "k..z", "k.a", "k.b", "T07", "t05.", "t05.x"]:
        creates.append(store.log_once(log, txn, VOTE, body(ns)))
        unfinished[txn] = VOTE
    creates.append(store.log_once(log, "k.c", ABORT, body(ns)))
    creates.append(store.log_once(LogId.partition(ns + "other"), "t00", VOTE, body()))
    await asyncio.gather(*creates)
    await asyncio.gather(*(store.apply_redo(ns, txn, {txn: b"v"}) for txn in to_apply))
    expected = sorted(unfinished)

    for limit in (1, 3, 5, len(expected), SCAN_PAGE_COUNT_MAX):
        pages = await _walk(store, log, limit)
        assert [[record.txn for record in page] for page in pages] == [
            expected[start : start + limit] for start in range(0, len(expected) + 1, limit)
        ], f"limit {limit}"
        for record in (record for page in pages for record in page):
            assert record.state is unfinished[record.txn] and not record.applied and record.body == body(ns)
    assert await store.scan_unfinished(log, 5, expected[-1]) == []


async def test_scan_unfinished_pages_survive_records_finished_or_deleted_between_pages(
    store: LogStore, ns: str
) -> None:
    log = LogId.partition(ns)
    await asyncio.gather(*(store.log_once(log, f"r{i:02}", VOTE, body(ns)) for i in range(12)))
    first = await store.scan_unfinished(log, 4)
    assert [record.txn for record in first] == ["r00", "r01", "r02", "r03"]

    await store.log(log, "r01", ABORT)  # finished behind the cursor
    assert await store.delete(log, "r03")  # the cursor's own record is gone
    await store.log(log, "r05", ABORT)  # finished ahead of it
    await store.log(log, "r06", COMMIT)
    await store.apply_redo(ns, "r06", {"k": b"v"})
    assert await store.delete(log, "r07")
    await store.log_once(log, "r04a", VOTE, body(ns))  # new, ahead of the cursor
    await store.log_once(log, "r00a", VOTE, body(ns))  # new, behind it: the next pass finds it

    rest = await _walk(store, log, 4, after=first[-1].txn)
    assert [[record.txn for record in page] for page in rest] == [["r04", "r04a", "r08", "r09"], ["r10", "r11"]]
    # A cursor need not name a record.
    assert [record.txn for record in await store.scan_unfinished(log, 4, "r08x")] == ["r09", "r10", "r11"]
    assert [record.txn for record in await store.scan_unfinished(log, 3)] == ["r00", "r00a", "r02"]


BAD_SCAN_CURSORS = (7, None, b"r00", ["r00"], "bad txn", "a/b", "a{b}", "~unfinished", "r" * (TXN_ID_LENGTH_MAX + 1))


async def test_scan_unfinished_refuses_every_bad_cursor_and_changes_nothing(store: LogStore, ns: str) -> None:
    async def check(ns: str, after: object) -> None:
        log = LogId.partition(ns)
        await store.log_once(log, "r00", VOTE, body(ns))
        await store.log_once(log, "r01", COMMIT, body(ns))
        before = await store.scan_unfinished(log)
        with pytest.raises(ValidationError):
            await store.scan_unfinished(log, 4, after)  # type: ignore[arg-type]
        assert await store.scan_unfinished(log) == before
        assert [record.txn for record in before] == ["r00", "r01"]

    await each_variant(ns, product(BAD_SCAN_CURSORS), check)


async def test_apply_redo_writes_data_and_marks_applied(store: LogStore, ns: str) -> None:
    await store.log_once(LogId.partition(ns), "t1", COMMIT, body(ns))
    writes = {"alpha": b"1", "b\u00e9ta/with spaces": bytes(range(256)), "gone": None}
    assert await store.apply_redo(ns, "t1", writes) is True
    assert await store.apply_redo(ns, "t1", writes) is False  # recovery may repeat it: nothing written
    assert await store.read_data(ns, ["alpha", "b\u00e9ta/with spaces", "gone", "never"]) == {
        "alpha": b"1", "b\u00e9ta/with spaces": bytes(range(256)), "gone": None, "never": None
    }
    assert (await store.read(LogId.partition(ns), "t1")).applied  # type: ignore[union-attr]
    assert await store.read_data(ns + "other", ["alpha"]) == {"alpha": None}

    await store.log_once(LogId.partition(ns), "t2", COMMIT, body(ns))
    await store.apply_redo(ns, "t2", {"alpha": None, "gone": b"back"})
    assert await store.read_data(ns, ["alpha", "gone"]) == {"alpha": None, "gone": b"back"}

    # Recovery repeating t1's apply after t2 wrote the same keys must not undo t2.
    assert await store.apply_redo(ns, "t1", writes) is False
    assert await store.read_data(ns, ["alpha", "gone"]) == {"alpha": None, "gone": b"back"}


async def test_apply_redo_on_a_vote_records_the_commit_with_the_data(store: LogStore, ns: str) -> None:
    # A participant that learns COMMIT applies straight over its VOTE_YES: one call decides its
    # record and writes the data, instead of Log(COMMIT) and then the apply. (A redo too big for
    # one DynamoDB transaction is applied over a vote in test_ownership.py's large fenced apply.)
    log = LogId.partition(ns)
    await store.log_once(log, "t", VOTE, body(ns, ns + "-b"))
    await store.log_once(log, "other", VOTE, body(ns))
    await store.log_once(log, "old", COMMIT, body(ns))
    await store.apply_redo(ns, "old", {"k000": b"old"})
    writes: dict[str, bytes | None] = {"k000": None, "k001": b"one", "k\u00e9 2": bytes(range(256))}

    assert await store.apply_redo(ns, "t", writes) is True
    record = await store.read(log, "t")
    assert record is not None
    assert (record.state, record.applied, record.body) == (COMMIT, True, body(ns, ns + "-b"))
    assert await store.read_data(ns, list(writes)) == writes
    assert [record.txn for record in await store.scan_unfinished(log)] == ["other"]

    # A repeat (recovery, or a retry after a timeout that landed) writes nothing.
    assert await store.apply_redo(ns, "t", {"k000": b"again", "k001": None}) is False
    assert await store.read_data(ns, list(writes)) == writes
    # The record is a real COMMIT: an idempotent Log(COMMIT) keeps it applied, an ABORT is refused.
    assert await store.log(log, "t", COMMIT) is COMMIT
    with pytest.raises(DecisionFlipRefused):
        await store.log(log, "t", ABORT)
    assert await store.read(log, "t") == record
    assert (await store.read(log, "other")).state is VOTE  # type: ignore[union-attr]


async def test_apply_redo_requires_a_vote_or_commit_and_writes_nothing(store: LogStore, ns: str) -> None:
    async def check(ns: str, state: TxnState | None) -> None:
        log = LogId.partition(ns)
        if state is not None:
            await store.log_once(log, "t", state, body(ns))
        before = await store.read(log, "t")
        with pytest.raises(InvariantViolation):
            await store.apply_redo(ns, "t", {"k": b"v"})
        assert await store.read_data(ns, ["k"]) == {"k": None}
        assert await store.read(log, "t") == before
        assert await store.scan_unfinished(log) == []

    await each_variant(ns, product([None, ABORT]), check)


async def test_delete_removes_record(store: LogStore, ns: str) -> None:
    log = LogId.partition(ns)
    await store.log_once(log, "t", VOTE, body(ns))
    assert await store.delete(log, "t") is True
    assert await store.read(log, "t") is None
    assert await store.scan_unfinished(log) == []
    assert await store.delete(log, "t") is False


# --- bad input ------------------------------------------------------------------------------------


def _bad_calls(ns: str) -> list[tuple[str, str, tuple[Any, ...]]]:
    log = LogId.partition(ns)
    ok = body(ns)
    return [
        ("empty txn", "log_once", (log, "", VOTE, ok)),
        ("txn with slash", "log_once", (log, "a/b", VOTE, ok)),
        ("txn with brace", "log", (log, "a{b}", VOTE, ok)),
        ("txn with a trailing newline", "log_once", (log, "t\n", VOTE, ok)),
        ("txn too long", "log_once", (log, "t" * (TXN_ID_LENGTH_MAX + 1), VOTE, ok)),
        ("txn not a string", "log_once", (log, 42, VOTE, ok)),
        ("state as string", "log_once", (log, "t", "COMMIT", ok)),
        ("log as string", "log_once", (ns, "t", VOTE, ok)),
        ("body as dict", "log_once", (log, "t", VOTE, {"redo": b""})),
        ("log body as dict", "log", (log, "t", VOTE, {"redo": b""})),
        ("bad scan limit", "scan_unfinished", (log, 0)),
        ("huge scan limit", "scan_unfinished", (log, SCAN_PAGE_COUNT_MAX + 1)),
        ("bad scan cursor", "scan_unfinished", (log, SCAN_PAGE_COUNT_MAX, "a/b")),
        ("empty data key", "read_data", (ns, [""])),
        ("keys as string", "read_data", (ns, "abc")),
        ("data key too long", "read_data", (ns, ["k" * (DATA_KEY_BYTES_MAX + 1)])),
        ("bad partition", "read_data", ("p/../x", ["k"])),
        ("value not bytes", "apply_redo", (ns, "t", {"k": "text"})),
        ("value too big", "apply_redo", (ns, "t", {"k": b"v" * (DATA_VALUE_BYTES_MAX + 1)})),
        ("too many writes", "apply_redo", (ns, "t", {f"k{i}": b"v" for i in range(DATA_BATCH_COUNT_MAX + 1)})),
        ("writes as list", "apply_redo", (ns, "t", [("k", b"v")])),
        ("delete bad txn", "delete", (log, "bad txn")),
    ]


def _bad_bodies(ns: str) -> list[tuple[str, dict[str, Any]]]:
    return [
        ("redo too big", {"redo": b"x" * (REDO_BYTES_MAX + 1)}),
        ("redo not bytes", {"redo": "text"}),
        ("too many participants", {"participants": tuple(f"p{i}" for i in range(PARTICIPANT_COUNT_MAX + 1))}),
        ("repeated participant", {"participants": (ns, ns)}),
        ("participants as list", {"participants": [ns]}),
        ("bad coordinator", {"coordinator": "node 1"}),
    ]


# --- the cluster record -----------------------------------------------------------------------


async def test_the_cluster_record_is_written_once_read_back_and_never_scanned_deleted_or_fenced(
    store_config: StoreConfig,
) -> None:
    """One record per storage, so this test needs storage of its own: Redis a database emptied
    first (the other backends' fixtures give each test its own file, container or table)."""
    if store_config.backend == "redis":
        url = store_config.redis_url.rsplit("/", 1)[0] + f"/{redis_db_cluster()}"
        client = redis.Redis.from_url(url, socket_timeout=5)
        client.flushdb()
        client.close()
        store_config = dataclasses.replace(store_config, redis_url=url)
    store = await open_store(store_config)
    try:
        log = LogId.cluster()
        results = await asyncio.gather(*(
            store.log_once(log, CLUSTER_RECORD_TXN, COMMIT, RecordBody(redo=f"claim-{i}".encode())) for i in range(16)
        ))
        winners = [i for i, result in enumerate(results) if result.created]
        assert len(winners) == 1 and {result.state for result in results} == {COMMIT}, results
        stored = await store.read(log, CLUSTER_RECORD_TXN)
        assert stored is not None and stored.state is COMMIT and stored.body.redo == f"claim-{winners[0]}".encode()
        with pytest.raises(ValidationError, match="cluster log"):
            await store.scan_unfinished_page(log)
        with pytest.raises(ValidationError, match="cluster log"):
            await store.delete(log, CLUSTER_RECORD_TXN)
        with pytest.raises(ValidationError, match="no fence"):
            await store.log_once(log, CLUSTER_RECORD_TXN, COMMIT, RecordBody(), fence=Fence("p0", "n0", 1))
        with pytest.raises(ValidationError, match="cluster log is named"):
            LogId(LogKind.CLUSTER, "p0")
        assert await store.read(log, CLUSTER_RECORD_TXN) == stored
    finally:
        await store.close()


async def test_bad_input_is_refused_and_changes_nothing(store: LogStore, ns: str) -> None:
    log = LogId.partition(ns)
    await store.log_once(log, "t", COMMIT, body(ns, redo=b"before"))
    before = await store.read(log, "t")
    for label, method, args in _bad_calls(ns):
        with pytest.raises(ValidationError):
            await getattr(store, method)(*args)
            pytest.fail(f"{label}: accepted")
    for label, fields in _bad_bodies(ns):
        with pytest.raises(ValidationError):
            RecordBody(**fields)
            pytest.fail(f"{label}: accepted")
    for bad_log_name in ["", "a/b", "x" * 65, "{tag}", "p\n"]:
        with pytest.raises(ValidationError):
            LogId.partition(bad_log_name)
    assert await store.read(log, "t") == before
    assert await store.scan_unfinished(log) == [before]
    assert await store.read_data(ns, ["k", "k0"]) == {"k": None, "k0": None}


# --- races ----------------------------------------------------------------------------------------

RACE_PROCESS_COUNT = 4
RACE_CALLERS_PER_PROCESS = 12  # 48 callers in all, across processes
RACE_RECORD_COUNT = 3


def _race_process(config: StoreConfig, log: LogId, process_index: int, barrier: Any, results: Any) -> None:
    async def main() -> list[tuple[str, int, str, bool]]:
        store = await open_store(config)
        try:
            # Connect first, then wait for every process, so the calls land as close together as
            # possible and connection setup does not serialise them.
            await store.read(log, "warm-up")
            await asyncio.to_thread(barrier.wait, 60)

            async def one(txn: str, caller: int) -> tuple[str, int, str, bool]:
                state = ABORT if caller % 2 else VOTE
                result = await store.log_once(log, txn, state, RecordBody((), f"caller-{caller}", b""))
                return txn, caller, result.state.value, result.created

            calls = []
            for txn_index in range(RACE_RECORD_COUNT):
                for local in range(RACE_CALLERS_PER_PROCESS):
                    calls.append(one(f"race-{txn_index}", process_index * RACE_CALLERS_PER_PROCESS + local))
            return await asyncio.gather(*calls)
        finally:
            await store.close()

    results.put(asyncio.run(main()))


async def test_concurrent_log_once_across_processes_has_one_winner(store_config: StoreConfig, ns: str) -> None:
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(RACE_PROCESS_COUNT)
    results = context.Queue()
    log = LogId.partition(ns)
    processes = [
        context.Process(target=_race_process, args=(store_config, log, index, barrier, results))
        for index in range(RACE_PROCESS_COUNT)
    ]
    for process in processes:
        process.start()
    outcomes = [row for _ in processes for row in await asyncio.to_thread(results.get, True, 120)]
    for process in processes:
        process.join(30)
        assert process.exitcode == 0

    store = await open_store(store_config)
    try:
        for txn_index in range(RACE_RECORD_COUNT):
            txn = f"race-{txn_index}"
            rows = [row for row in outcomes if row[0] == txn]
            assert len(rows) == RACE_PROCESS_COUNT * RACE_CALLERS_PER_PROCESS
            winners = [caller for _, caller, _, created in rows if created]
            assert len(winners) == 1, f"{txn}: winners {winners}"
            stored = await store.read(log, txn)
            assert stored is not None
            assert stored.body.coordinator == f"caller-{winners[0]}"
            assert stored.state is (ABORT if winners[0] % 2 else VOTE)
            assert {state for _, _, state, _ in rows} == {stored.state.value}, "every caller is told the winner"
    finally:
        await store.close()


async def test_concurrent_log_once_in_one_process_has_one_winner(store: LogStore, ns: str) -> None:
    log = LogId.partition(ns)
    states = [ABORT if i % 3 == 0 else VOTE for i in range(64)]
    results = await asyncio.gather(
        *(store.log_once(log, "t", state, RecordBody((), f"c{i}", b"")) for i, state in enumerate(states))
    )
    winners = [i for i, result in enumerate(results) if result.created]
    assert len(winners) == 1
    assert {result.state for result in results} == {states[winners[0]]}
