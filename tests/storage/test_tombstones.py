"""Decision tombstones (`delete(..., keep=Tombstone(...))`), on every backend against its real
service: what garbage collection leaves in a record's place so that a transaction's outcome can
still be told after its records are collected (DESIGN section 4)."""

from __future__ import annotations

import asyncio
import time

import pytest

from storage_adapters.contract import (
    TOMBSTONE_KEEP_MS_MAX,
    LogId,
    LogOnceResult,
    Record,
    RecordBody,
    Tombstone,
    TxnState,
)
from storage_adapters.errors import DecisionFlipRefused, InvariantViolation, ValidationError
from storage_adapters.store import LogStore
from tests.storage.test_conformance import body
from tests.storage.test_ownership import FENCE_FAILURES, arrange_failing_fence, expect_fenced

VOTE, COMMIT, ABORT = TxnState.VOTE_YES, TxnState.COMMIT, TxnState.ABORT
KEEP_MS_LONG = 600_000
# How long a backend that drops its tombstones itself (at expiry, or in its next sweep) may take
# past keep_ms in the suite: a loaded 2-core CI box, and Redis's expiry, which is lazy until its
# active cycle (10 times a second) samples the key.
DROP_WAIT_S_MAX = 15.0
# A keep short enough to wait out most of in the suite, long enough that a wrong unit shows.
KEEP_MS_CHECKED = 2_000


def tombstone(decision: TxnState, keep_ms: int = KEEP_MS_LONG) -> Tombstone:
    return Tombstone(decision, keep_ms)


def shape(record: Record | None) -> tuple[TxnState, bool, RecordBody] | None:
    """What a tombstone is asked to keep; `created_at_ms` is the storing side's, not compared."""
    return None if record is None else (record.state, record.applied, record.body)


async def committed(store: LogStore, log: LogId, txn: str) -> None:
    await store.log_once(log, txn, VOTE, body(log.name))
    assert await store.apply_redo(log.name, txn, {"k": b"v"})


async def test_a_commit_tombstone_keeps_the_decision_and_drops_the_body(store: LogStore, ns: str) -> None:
    log = LogId.partition(ns)
    await committed(store, log, "t")
    assert await store.delete(log, "t", keep=tombstone(COMMIT)) is True
    assert shape(await store.read(log, "t")) == (COMMIT, True, RecordBody())
    assert await store.scan_unfinished(log) == []
    # A late terminator meets the decision, not an empty slot it could fill with ABORT.
    assert await store.log_once(log, "t", ABORT, body(ns)) == LogOnceResult(COMMIT, False)
    with pytest.raises(DecisionFlipRefused):
        await store.log(log, "t", ABORT)
    # Already applied: recovery repeating the apply writes nothing.
    assert await store.apply_redo(ns, "t", {"k": b"other"}) is False
    assert await store.read_data(ns, ["k"]) == {"k": b"v"}


@pytest.mark.parametrize("stored", [ABORT, VOTE])
async def test_an_abort_tombstone_over_an_abort_or_a_vote(store: LogStore, ns: str, stored: TxnState) -> None:
    log = LogId.partition(ns)
    await store.log_once(log, "t", stored, body(ns))
    assert await store.delete(log, "t", keep=tombstone(ABORT)) is True
    assert shape(await store.read(log, "t")) == (ABORT, False, RecordBody())
    assert await store.scan_unfinished(log) == []
    assert await store.log_once(log, "t", VOTE, body(ns)) == LogOnceResult(ABORT, False)


@pytest.mark.parametrize("decision", [COMMIT, ABORT])
async def test_a_tombstone_is_written_where_no_record_was(store: LogStore, ns: str, decision: TxnState) -> None:
    """A read-only voter's partition holds no record, nor does a coordinator-log participant's."""
    log = LogId.partition(ns)
    assert await store.delete(log, "t", keep=tombstone(decision)) is False
    assert shape(await store.read(log, "t")) == (decision, decision is COMMIT, RecordBody())
    assert await store.scan_unfinished(log) == []


async def test_a_tombstone_is_refused_in_a_coordinator_log(store: LogStore, ns: str) -> None:
    """Its COMMIT is never "applied", so nothing could tell a redo safe there; the status call
    reads partitions' logs, where garbage collection keeps tombstones."""
    log = LogId.coordinator(ns)
    await store.log(log, "t", COMMIT, body("p0", "p1", coordinator=ns))
    before = await store.read(log, "t")
    with pytest.raises(ValidationError):
        await store.delete(log, "t", keep=tombstone(COMMIT))
    assert await store.read(log, "t") == before


async def test_keeping_again_and_then_deleting(store: LogStore, ns: str) -> None:
    log = LogId.partition(ns)
    await committed(store, log, "t")
    assert await store.delete(log, "t", keep=tombstone(COMMIT)) is True
    assert await store.delete(log, "t", keep=tombstone(COMMIT, 1_000)) is True
    assert shape(await store.read(log, "t")) == (COMMIT, True, RecordBody())
    assert await store.delete(log, "t") is True
    assert await store.read(log, "t") is None


async def test_refused_tombstones_write_nothing(store: LogStore, ns: str) -> None:
    log = LogId.partition(ns)
    await store.log_once(log, "voted", VOTE, body(ns))
    await store.log_once(log, "aborted", ABORT, body(ns))
    await store.log_once(log, "unapplied", COMMIT, body(ns))
    await committed(store, log, "applied")
    before = {txn: await store.read(log, txn) for txn in ("voted", "aborted", "unapplied", "applied")}
    unfinished = await store.scan_unfinished(log)
    # A committed redo is never given up: no COMMIT tombstone over a vote or an unapplied COMMIT.
    for txn in ("voted", "unapplied"):
        with pytest.raises(InvariantViolation) as refused:
            await store.delete(log, txn, keep=tombstone(COMMIT))
        assert not isinstance(refused.value, DecisionFlipRefused), refused.value
    for txn, decision in (("aborted", COMMIT), ("applied", ABORT), ("unapplied", ABORT)):
        with pytest.raises(DecisionFlipRefused):
            await store.delete(log, txn, keep=tombstone(decision))
    assert {txn: await store.read(log, txn) for txn in before} == before
    assert await store.scan_unfinished(log) == unfinished


@pytest.mark.parametrize("bad", ["COMMIT", 600_000, (COMMIT, 600_000)])
async def test_a_keep_that_is_not_a_tombstone_is_refused(store: LogStore, ns: str, bad: object) -> None:
    log = LogId.partition(ns)
    await store.log_once(log, "t", ABORT, body(ns))
    before = await store.read(log, "t")
    with pytest.raises(ValidationError):
        await store.delete(log, "t", keep=bad)  # type: ignore[arg-type]
    assert await store.read(log, "t") == before


@pytest.mark.parametrize(
    "fields",
    [(VOTE, 1_000), ("COMMIT", 1_000), (COMMIT, 0), (COMMIT, -1), (COMMIT, TOMBSTONE_KEEP_MS_MAX + 1),
     (COMMIT, True), (COMMIT, 1.5)],
)
def test_bad_tombstones_cannot_be_built(fields: tuple[object, object]) -> None:
    with pytest.raises(ValidationError):
        Tombstone(*fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("case", FENCE_FAILURES)
async def test_a_fenced_tombstone_is_refused_and_writes_nothing(store: LogStore, ns: str, case: str) -> None:
    log = LogId.partition(ns)
    fence, stored = await arrange_failing_fence(store, ns, case)
    await store.log_once(log, "t", ABORT, body(ns))
    before = await store.read(log, "t")
    await expect_fenced(store.delete(log, "t", fence, keep=tombstone(ABORT)), fence, stored)
    await expect_fenced(store.delete(log, "absent", fence, keep=tombstone(ABORT)), fence, stored)
    assert await store.read(log, "t") == before
    assert await store.read(log, "absent") is None


async def test_tombstones_and_deletes_of_one_tick_each_get_their_own_answer(store: LogStore, ns: str) -> None:
    """Where deletes of one tick go to storage together, the keeps among them too: each caller
    still gets its own answer and its own refusal."""
    log, other = LogId.partition(ns), LogId.partition(ns + "b")
    await committed(store, log, "kept")
    await store.log_once(log, "deleted", ABORT, body(ns))
    await store.log_once(log, "refused", VOTE, body(ns))
    await store.log_once(other, "kept", ABORT, body(ns))
    # Plain deletes of several records (and one absent), so that a backend's many-record request
    # (Azure's Blob Batch) carries them beside the keeps.
    await store.log_once(other, "deleted", ABORT, body(ns))
    answers = await asyncio.gather(
        store.delete(log, "kept", keep=tombstone(COMMIT)),
        store.delete(log, "deleted"),
        store.delete(log, "refused", keep=tombstone(COMMIT)),
        store.delete(log, "absent", keep=tombstone(ABORT)),
        store.delete(other, "kept", keep=tombstone(ABORT)),
        store.delete(other, "deleted"),
        store.delete(other, "absent"),
        return_exceptions=True,
    )
    assert answers[:2] == [True, True] and answers[3:] == [False, True, True, False], answers
    assert isinstance(answers[2], InvariantViolation), answers[2]
    assert shape(await store.read(log, "kept")) == (COMMIT, True, RecordBody())
    assert await store.read(log, "deleted") is None and await store.read(other, "deleted") is None
    assert (await store.read(log, "refused")).state is VOTE  # type: ignore[union-attr]
    assert shape(await store.read(log, "absent")) == (ABORT, False, RecordBody())
    assert shape(await store.read(other, "kept")) == (ABORT, False, RecordBody())


async def test_a_tombstone_is_kept_at_least_keep_ms(store: LogStore, ns: str) -> None:
    """Found by review: nothing checked the lower bound, and a backend that counted keep_ms in the
    wrong unit (seconds read as milliseconds) would drop tombstones a thousand times too soon."""
    if not store.drops_tombstones_at_expiry:
        # Nothing drops them within a test there, so this could not fail: their own tests check
        # the expiry they hand storage (test_dynamodb_tombstones.py, test_azure_tombstones.py).
        pytest.skip("storage drops these tombstones days after expiry")
    log = LogId.partition(ns)
    await committed(store, log, "t")
    assert await store.delete(log, "t", keep=tombstone(COMMIT, KEEP_MS_CHECKED)) is True
    await asyncio.sleep(KEEP_MS_CHECKED * 0.75 / 1000)
    assert shape(await store.read(log, "t")) == (COMMIT, True, RecordBody())


async def test_a_tombstone_is_dropped_after_keep_ms(store: LogStore, ns: str) -> None:
    """Storage must not keep tombstones forever: Redis drops one at its expiry and the emulator's
    writer in its next purge; DynamoDB's table TTL and an Azure lifecycle rule do it within days
    (what each backend hands them is checked in its own tests), so here only the first two."""
    if not store.drops_tombstones_at_expiry:
        assert store.backend_name in ("dynamodb", "azure_blob"), store.backend_name
        pytest.skip("storage drops these tombstones days after expiry; their own tests check what it is handed")
    log = LogId.partition(ns)
    await committed(store, log, "t")
    assert await store.delete(log, "t", keep=tombstone(COMMIT, 300)) is True
    assert shape(await store.read(log, "t")) == (COMMIT, True, RecordBody())
    deadline = time.monotonic() + DROP_WAIT_S_MAX
    while await store.read(log, "t") is not None:
        assert time.monotonic() < deadline, "the tombstone outlived its keep_ms by the whole wait"
        await asyncio.sleep(0.05)
    # Gone means gone: a new LogOnce creates the record again (as after a delete).
    assert await store.log_once(log, "t", ABORT, body(ns)) == LogOnceResult(ABORT, True)


async def test_a_log_of_the_decision_over_its_tombstone_leaves_a_tombstone(store: LogStore, ns: str) -> None:
    """A late `log` of the tombstone's own decision (a decision carrying the vote's body) is an
    idempotent rewrite: it succeeds, and what it leaves is still the tombstone, which storage
    drops as it would have (Redis keeps the key's expiry, the emulator the row's, DynamoDB the
    item's expires_at, Azure the blob's tag: test_azure_tombstones.py). Else a collected record
    would come back for good."""
    log = LogId.partition(ns)
    await committed(store, log, "t")
    assert await store.delete(log, "t", keep=tombstone(COMMIT, KEEP_MS_CHECKED)) is True
    assert await store.log(log, "t", COMMIT, body(ns)) is COMMIT
    assert shape(await store.read(log, "t")) == (COMMIT, True, body(ns))
    if not store.drops_tombstones_at_expiry:
        pytest.skip("storage drops these tombstones days after expiry; their own tests check what it is handed")
    deadline = time.monotonic() + KEEP_MS_CHECKED / 1000 + DROP_WAIT_S_MAX
    while await store.read(log, "t") is not None:
        assert time.monotonic() < deadline, "the rewritten tombstone outlived its keep_ms by the whole wait"
        await asyncio.sleep(0.05)
