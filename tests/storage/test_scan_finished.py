"""`LogStore.scan_finished_page` on each of the four backends, against its real service: the
finished records that are not tombstones (a partition's ABORT or applied COMMIT, a coordinator's
ABORT), without their redo, in ascending order, page after page, whatever the log holds beside
them. What a collector of the records a crash left behind reads (docs/sweeper-design.md)."""

from __future__ import annotations

import asyncio

import pytest

from storage_adapters.contract import LogId, Record, RecordBody, ScanPage, Tombstone, TxnState
from storage_adapters.errors import ValidationError
from storage_adapters.store import LogStore

VOTE, COMMIT, ABORT = TxnState.VOTE_YES, TxnState.COMMIT, TxnState.ABORT
# A walk of a log is followed for at most this many pages (a backend may return short ones).
PAGE_COUNT_MAX = 200
KEEP_MS = 600_000


def _body(ns: str) -> RecordBody:
    return RecordBody((ns, ns + "b"), "node-0", b"a redo the scan leaves out")


async def _walk(store: LogStore, log: LogId, limit: int, after: str = "") -> list[ScanPage]:
    """Every page from `after` on, each asked with the cursor the one before gave."""
    pages: list[ScanPage] = []
    for _ in range(PAGE_COUNT_MAX):
        page = await store.scan_finished_page(log, limit, after)
        assert len(page.records) <= limit
        assert all(record.txn > after for record in page.records), (after, page)
        pages.append(page)
        if page.resume_after is None:
            return pages
        assert page.resume_after > after, f"a page after {after!r} resumes at {page.resume_after!r}"
        after = page.resume_after
    pytest.fail(f"the finished scan of {log.key} did not end within {PAGE_COUNT_MAX} pages")


def _txns(pages: list[ScanPage]) -> list[str]:
    return [record.txn for page in pages for record in page.records]


async def _partition_log_of_every_kind(store: LogStore, ns: str) -> tuple[LogId, dict[str, TxnState]]:
    """A partition log holding each kind of record; returns it and the finished ones expected."""
    log = LogId.partition(ns)
    expected: dict[str, TxnState] = {}
    writes = []
    for i in range(20):
        txn = f"t{i:02}"
        kind = i % 5
        state = (VOTE, COMMIT, ABORT, COMMIT, ABORT)[kind]
        writes.append(store.log_once(log, txn, state, _body(ns)))
        if kind in (2, 3):  # an ABORT, and a COMMIT applied below
            expected[txn] = state
    await asyncio.gather(*writes)
    await asyncio.gather(*(store.apply_redo(ns, f"t{i:02}", {f"k{i}": b"v"}) for i in range(3, 20, 5)))
    # Kind 4 becomes a tombstone: finished, and already collected.
    await asyncio.gather(*(store.delete(log, f"t{i:02}", keep=Tombstone(ABORT, KEEP_MS)) for i in range(4, 20, 5)))
    # A tombstone where a COMMIT was applied, and a record deleted outright.
    assert await store.delete(log, "t03", keep=Tombstone(COMMIT, KEEP_MS))
    del expected["t03"]
    assert await store.delete(log, "t02")
    del expected["t02"]
    return log, expected


async def test_only_finished_records_that_are_not_tombstones_come_back_without_their_redo(
    store: LogStore, ns: str
) -> None:
    log, expected = await _partition_log_of_every_kind(store, ns)
    await store.log_once(LogId.partition(ns + "other"), "t12", ABORT, _body(ns))  # another log's
    pages = await _walk(store, log, 100)
    records: list[Record] = [record for page in pages for record in page.records]
    assert [record.txn for record in records] == sorted(expected)
    for record in records:
        assert record.log == log and record.state is expected[record.txn], record
        assert record.applied is (record.state is COMMIT), record
        assert record.body == RecordBody((ns, ns + "b"), "node-0", b""), record
        assert record.created_at_ms > 0, record


async def test_a_coordinator_log_gives_its_aborts_never_its_commits(store: LogStore, ns: str) -> None:
    log = LogId.coordinator(ns)
    states = (VOTE, COMMIT, ABORT)
    await asyncio.gather(*(store.log_once(log, f"c{i}", state, _body(ns)) for i, state in enumerate(states)))
    await store.log(log, "c0", COMMIT)
    assert _txns(await _walk(store, log, 10)) == ["c2"]


@pytest.mark.parametrize("limit", [1, 3, 7])
async def test_pages_follow_one_another_to_the_log_s_end(store: LogStore, ns: str, limit: int) -> None:
    log, expected = await _partition_log_of_every_kind(store, ns)
    # Ids whose backend key order could part from plain string order.
    await asyncio.gather(*(store.log_once(log, txn, ABORT, _body(ns)) for txn in ("k.", "k..", "k.a", "T07", "t05.")))
    wanted = sorted([*expected, "k.", "k..", "k.a", "T07", "t05."])
    pages = await _walk(store, log, limit)
    assert _txns(pages) == wanted
    # A cursor need not name a record.
    assert _txns(await _walk(store, log, limit, after="t05-")) == [txn for txn in wanted if txn > "t05-"]


async def test_records_collected_between_pages_are_not_returned_later(store: LogStore, ns: str) -> None:
    log = LogId.partition(ns)
    await asyncio.gather(*(store.log_once(log, f"r{i:02}", ABORT, _body(ns)) for i in range(8)))
    first = await store.scan_finished_page(log, 3)
    assert [record.txn for record in first.records] == ["r00", "r01", "r02"]
    assert first.resume_after is not None
    await store.delete(log, "r04", keep=Tombstone(ABORT, KEEP_MS))
    assert await store.delete(log, "r05")
    await store.log_once(log, "r06a", VOTE, _body(ns))
    assert _txns(await _walk(store, log, 3, first.resume_after)) == ["r03", "r06", "r07"]


async def test_a_log_of_many_tombstones_is_walked_to_the_finished_records_past_them(store: LogStore, ns: str) -> None:
    log = LogId.partition(ns)
    await asyncio.gather(*(store.log_once(log, f"a{i:03}", ABORT, _body(ns)) for i in range(60)))
    await asyncio.gather(*(store.delete(log, f"a{i:03}", keep=Tombstone(ABORT, KEEP_MS)) for i in range(58)))
    assert _txns(await _walk(store, log, 1)) == ["a058", "a059"]


async def test_the_cluster_log_and_bad_arguments_are_refused(store: LogStore, ns: str) -> None:
    for call in (
        store.scan_finished_page(LogId.cluster()),
        store.scan_finished_page(LogId.partition(ns), 0),
        store.scan_finished_page(LogId.partition(ns), 10, 5),  # type: ignore[arg-type]
    ):
        with pytest.raises(ValidationError):
            await call
