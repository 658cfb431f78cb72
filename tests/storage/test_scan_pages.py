"""A scan page stops after a bounded walk, however many finished records lie before the unfinished
ones, and says where the next page starts (`scan_unfinished_page`, `ScanPage.resume_after`).

Azure's listing and DynamoDB's filtered query walk every record of a log, tombstones included, to
find the unfinished ones. One call walked them all: a log of many tombstones (Azure keeps them a
day or more, until the lifecycle rule drops them; DynamoDB 15 minutes) outlived the call's
deadline on every retry, and the node's recovery never finished (found by review). Here the walk
bound is lowered, so a few records show what millions would."""

from __future__ import annotations

import pytest

from storage_adapters import azure_blob, contract, dynamodb
from storage_adapters.contract import LogId, RecordBody, ScanPage, TxnState
from storage_adapters.store import LogStore

pytestmark = pytest.mark.services

# Records the lowered bounds let one page walk.
WALK_COUNT = 4
FINISHED_COUNT = 13
LIMIT = 10


@pytest.fixture(autouse=True)
def short_walks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(azure_blob, "SCAN_WALK_NAME_COUNT_MAX", WALK_COUNT)
    monkeypatch.setattr(dynamodb, "SCAN_WALK_ITEM_COUNT_MAX", WALK_COUNT)


async def _pages(store: LogStore, log: LogId) -> list[ScanPage]:
    pages: list[ScanPage] = []
    after = ""
    for _ in range(FINISHED_COUNT + 10):
        page = await store.scan_unfinished_page(log, LIMIT, after)
        pages.append(page)
        if page.resume_after is None:
            return pages
        assert page.resume_after > after, "a page that goes on moves its cursor"
        after = page.resume_after
    raise AssertionError(f"the scan never ended: {pages}")


async def test_pages_walk_a_bounded_number_of_records_and_resume_where_they_stopped(
        store: LogStore, ns: str) -> None:
    log = LogId.partition(ns)
    body = RecordBody((ns,), "n1", b"redo")
    # Finished records first and between, as a busy log's tombstones lie before its open votes.
    unfinished = [f"t{index:02d}" for index in (FINISHED_COUNT, FINISHED_COUNT + 3, FINISHED_COUNT + 5)]
    for index in range(FINISHED_COUNT + 6):
        txn = f"t{index:02d}"
        await store.log_once(log, txn, TxnState.VOTE_YES if txn in unfinished else TxnState.ABORT, body)
    pages = await _pages(store, log)
    found = [record.txn for page in pages for record in page.records]
    assert found == unfinished, pages
    if store.backend_name in ("azure_blob", "dynamodb"):
        # No page walked more than the bound: the finished records before the first vote took
        # several pages, some with no record at all.
        assert len(pages) >= (FINISHED_COUNT + 6) // WALK_COUNT, pages
        assert any(not page.records and page.resume_after is not None for page in pages), pages
    else:
        # An index holds only unfinished records: one page, the last.
        assert len(pages) == 1, pages
    # The whole-page form follows the pages itself.
    assert [record.txn for record in await store.scan_unfinished(log, LIMIT)] == unfinished
    assert [record.txn for record in await store.scan_unfinished(log, 2)] == unfinished[:2]


async def test_a_page_that_stops_at_its_walk_bound_keeps_the_ids_azure_lists_late(
        store: LogStore, ns: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Azure names an id ending in '.' with '~' appended, which lists after the ids it prefixes
    (`a.~` after `a.a`): a walk that stops at `a.a` must still return `a.`, which it has not listed."""
    monkeypatch.setattr(azure_blob, "SCAN_WALK_NAME_COUNT_MAX", 1)
    monkeypatch.setattr(dynamodb, "SCAN_WALK_ITEM_COUNT_MAX", 1)
    log = LogId.partition(ns)
    body = RecordBody((ns,), "n1", b"redo")
    await store.log_once(log, "a.", TxnState.VOTE_YES, body)
    await store.log_once(log, "a.a", TxnState.ABORT, body)
    await store.log_once(log, "a.b", TxnState.VOTE_YES, body)
    pages = await _pages(store, log)
    assert [record.txn for page in pages for record in page.records] == ["a.", "a.b"], pages


async def test_a_page_holds_a_bounded_number_of_bytes_and_the_next_resumes_after_it(
        store: LogStore, ns: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by audit (2026-11-27): a page held up to SCAN_PAGE_COUNT_MAX records whatever their
    size, about 128 MiB of large redo records at once (175 MB on Azure), and a node recovers its
    partitions side by side. With a bound of one byte each page holds one record; the scan still
    returns each once, in order. (DynamoDB's are bounded by its own responses: SCAN_QUERY_PAGE_COUNT_MAX
    of 1 MB at most.)"""
    monkeypatch.setattr(contract, "SCAN_PAGE_BYTES_MAX", 1)
    monkeypatch.setattr(azure_blob, "SCAN_PAGE_BYTES_MAX", 1)
    log = LogId.partition(ns)
    body = RecordBody((ns,), "n1", b"r" * 1024)
    unfinished = ["t01", "t03", "t04"]
    for txn in ("t00", "t01", "t02", "t03", "t04", "t05"):
        await store.log_once(log, txn, TxnState.VOTE_YES if txn in unfinished else TxnState.ABORT, body)
    pages = await _pages(store, log)
    assert [record.txn for page in pages for record in page.records] == unfinished, pages
    if store.backend_name != "dynamodb":
        assert all(len(page.records) <= 1 for page in pages), pages
