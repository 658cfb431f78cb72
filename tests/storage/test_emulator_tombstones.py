"""The emulator's decision tombstones beyond the conformance suite (tests/storage/test_tombstones.py):
what a tombstone row holds (its wall-clock expiry, the record's created_at_ms); the writer's own
refusal of a keep no store sends, per delete of a batch; the purge, in bounded rounds that follow
each other while expired ones remain, that never waits for another program's write lock, never
touches a row without an expiry, and reads only its index; and a file made before tombstones
(without the expiry column), which the writer upgrades, also when several processes open it at
once, while a node's reader leaves it as it is."""

from __future__ import annotations

import asyncio
import multiprocessing
import socket
import sqlite3
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from storage_adapters import emulator_sql, emulator_writer
from storage_adapters.contract import LogId, RecordBody, Tombstone, TxnState
from storage_adapters.emulator import EmulatorStore
from storage_adapters.errors import DecisionFlipRefused, InvariantViolation, ValidationError
from tests.storage.test_emulator_batch import BODY, BODY_WIRE, LOG, VOTE_YES

TIMEOUT_MS_CALL = 10_000
VOTE, COMMIT, ABORT = TxnState.VOTE_YES, TxnState.COMMIT, TxnState.ABORT
KEEP_MS_LONG = 600_000
# How long the real writer may take past its first purge round to purge a backlog on a loaded
# 2-core machine: rounds follow each other TOMBSTONE_PURGE_BACKLOG_MS apart, while one interval
# per round would take seconds for the backlog below.
PURGE_WAIT_S = emulator_writer.TOMBSTONE_PURGE_INTERVAL_MS / 1000 + 10.0
POLL_S = 0.05

# The schema as emulator_sql.py made files before tombstones (git show a8f093b:storage_adapters/emulator_sql.py).
OLD_SCHEMA = """
CREATE TABLE IF NOT EXISTS txn_log (
    log TEXT NOT NULL,
    txn TEXT NOT NULL,
    state TEXT NOT NULL,
    participants TEXT NOT NULL,
    coordinator TEXT NOT NULL,
    redo BLOB NOT NULL,
    applied INTEGER NOT NULL,
    created_at_ms INTEGER NOT NULL,
    PRIMARY KEY (log, txn)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS txn_log_unfinished ON txn_log (log)
    WHERE state = 'VOTE_YES' OR (state = 'COMMIT' AND applied = 0);
CREATE TABLE IF NOT EXISTS ownership (
    partition TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    version INTEGER NOT NULL,
    lease_ms INTEGER NOT NULL,
    wanted_by TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS data (
    partition TEXT NOT NULL,
    key TEXT NOT NULL,
    value BLOB NOT NULL,
    PRIMARY KEY (partition, key)
) WITHOUT ROWID;
"""
OLD_CREATED_AT_MS = 1_700_000_000_000


def make_old_file(path: Path) -> None:
    """A file as the previous version left it: WAL mode, its schema, a vote, an applied COMMIT
    with its data, and an ownership record, written as that version wrote them (no column names)."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        assert conn.execute("PRAGMA journal_mode = WAL").fetchone()[0] == "wal"
        conn.executescript(OLD_SCHEMA)
        for txn, state, applied in (("voted", VOTE_YES, 0), ("applied", "COMMIT", 1)):
            conn.execute(
                "INSERT INTO txn_log VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (LOG.key, txn, state, '["p0"]', "n0", b"redo", applied, OLD_CREATED_AT_MS),
            )
        conn.execute("INSERT INTO data VALUES ('p0', 'k', x'76')")
        conn.execute("INSERT INTO ownership VALUES ('p0', 'n0', 1, 1, 60000, '')")
    finally:
        conn.close()


def columns(path: Path) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return [row[1] for row in conn.execute("PRAGMA table_info(txn_log)")]
    finally:
        conn.close()


def rows(path: Path, where: str = "1", args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """(log, txn, state, applied, created_at_ms, expires_at_ms) of the rows `where` selects."""
    conn = sqlite3.connect(path)
    try:
        return conn.execute(
            f"SELECT log, txn, state, applied, created_at_ms, expires_at_ms FROM txn_log WHERE {where} ORDER BY txn",
            args,
        ).fetchall()
    finally:
        conn.close()


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[EmulatorStore]:
    opened = await EmulatorStore.open(tmp_path / "cornus.db", timeout_ms_call=TIMEOUT_MS_CALL)
    yield opened
    await opened.close()


# --- the tombstone row ----------------------------------------------------------------------------


async def test_a_tombstone_row_expires_keep_ms_after_it_was_written_by_the_wall_clock(store: EmulatorStore) -> None:
    await store.log_once(LOG, "t", VOTE, BODY)
    assert await store.apply_redo("p0", "t", {"k": b"v"})
    await store.log_once(LOG, "plain", ABORT, BODY)
    ((*_, created_at_ms, expiry),) = rows(store.path, "txn = 't'")
    assert expiry is None, "an ordinary record never expires"
    before_ms = int(time.time() * 1000)
    assert await store.delete(LOG, "t", keep=Tombstone(COMMIT, 5_000)) is True
    assert await store.delete(LOG, "new", keep=Tombstone(ABORT, 7_000)) is False
    after_ms = int(time.time() * 1000)
    new, plain, kept = rows(store.path)
    # The record's created_at_ms stays; a tombstone where nothing was is created now.
    assert kept[2:4] == ("COMMIT", 1) and kept[4] == created_at_ms, kept
    assert before_ms + 5_000 <= kept[5] <= after_ms + 5_000, (before_ms, kept, after_ms)
    assert new[2:4] == ("ABORT", 0) and before_ms <= new[4] <= after_ms, new
    assert new[5] == new[4] + 7_000, new
    assert plain[5] is None, plain
    # Keeping again sets the expiry anew: later here, or sooner.
    assert await store.delete(LOG, "t", keep=Tombstone(COMMIT, KEEP_MS_LONG)) is True
    assert rows(store.path, "txn = 't'")[0][5] >= before_ms + KEEP_MS_LONG
    assert await store.delete(LOG, "t", keep=Tombstone(COMMIT, 1)) is True
    assert rows(store.path, "txn = 't'")[0][5] <= int(time.time() * 1000) + 1


def test_the_writer_refuses_a_keep_no_store_sends_per_delete_of_a_batch(tmp_path: Path) -> None:
    """The store sends only a valid Tombstone's wire form; anything else would be stored as a
    bodiless vote, or an expiry the purge never reaches (text compares above every integer)."""
    conn = emulator_sql.connect(tmp_path / "cornus.db", TIMEOUT_MS_CALL)
    try:
        emulator_sql.log_once(conn, LOG.key, "aborted", TxnState.ABORT.value, BODY_WIRE, None)
        emulator_sql.log_once(conn, LOG.key, "voted", VOTE_YES, BODY_WIRE, None)
        emulator_sql.log_once(conn, LOG.key, "deleted", VOTE_YES, BODY_WIRE, None)
        outcomes = emulator_sql.delete_many(conn, [
            (LOG.key, "voted", None, (VOTE_YES, 1_000)),
            (LOG.key, "voted", None, ("COMMIT", "soon")),
            (LOG.key, "voted", None, ("ABORT", 0)),
            (LOG.key, "voted", None, ("ABORT", 1.5)),
            (LOG.key, "aborted", None, ("COMMIT", 1_000)),
            (LOG.key, "absent", None, ("ABORT", 1_000)),
            (LOG.key, "deleted", None, None),
        ])
        assert all(isinstance(outcome, ValidationError) for outcome in outcomes[:4]), outcomes
        assert isinstance(outcomes[4], DecisionFlipRefused), outcomes
        assert outcomes[5:] == [False, True], outcomes
        assert [row[1:4] for row in rows(tmp_path / "cornus.db")] == [
            ("aborted", "ABORT", 0), ("absent", "ABORT", 0), ("voted", VOTE_YES, 0),
        ]
        assert emulator_sql.read(conn, LOG, "voted").body == BODY  # type: ignore[union-attr]
    finally:
        conn.close()


def test_the_writer_keeps_a_coordinators_commit_never_applied_and_refuses_one_over_its_vote(tmp_path: Path) -> None:
    """The writer's own judgement (its shortcut, then the contract's rule) in a coordinator's log:
    a COMMIT tombstone over the COMMIT (never applied there) is a row with an expiry, finished;
    over the redo record (VOTE_YES) it is refused, and nothing of it written."""
    conn = emulator_sql.connect(tmp_path / "cornus.db", TIMEOUT_MS_CALL)
    log = LogId.coordinator("n0").key
    try:
        emulator_sql.log(conn, log, "committed", VOTE_YES, BODY_WIRE, None)
        emulator_sql.log(conn, log, "committed", COMMIT.value, None, None)
        emulator_sql.log(conn, log, "voted", VOTE_YES, BODY_WIRE, None)
        before_ms = int(time.time() * 1000)
        outcomes = emulator_sql.delete_many(conn, [
            (log, "committed", None, (COMMIT.value, 5_000)),
            (log, "voted", None, (COMMIT.value, 5_000)),
            (log, "absent", None, (COMMIT.value, 5_000)),
        ])
        after_ms = int(time.time() * 1000)
        assert outcomes[0] is True and outcomes[2] is False, outcomes
        assert isinstance(outcomes[1], InvariantViolation) and not isinstance(outcomes[1], DecisionFlipRefused)
        (absent, committed, voted) = rows(tmp_path / "cornus.db")
        for row in (absent, committed):
            assert row[2:4] == ("COMMIT", 1), row
            assert before_ms + 5_000 <= row[5] <= after_ms + 5_000, (before_ms, row, after_ms)
        assert voted[2:4] == (VOTE_YES, 0) and voted[5] is None, voted
        assert emulator_sql.scan_unfinished(conn, LogId.coordinator("n0"), 10, "") == ([
            emulator_sql.read(conn, LogId.coordinator("n0"), "voted")
        ], False)
    finally:
        conn.close()


# --- the purge ------------------------------------------------------------------------------------


# How long ago the tombstones a test wants purged expired: the purge's clock lags the wall clock
# by what the wall clock gained on the monotonic one since the process began (on purpose:
# emulator_sql._purge_now_ms), and in a test worker that lived minutes under NTP's slewing that
# was more than the millisecond these tests allowed (the fresh-clone suite: nothing purged).
EXPIRED_AGO_MS = 60_000


def insert_tombstones(conn: sqlite3.Connection, prefix: str, count: int, expires_at_ms: int | None) -> None:
    conn.execute("BEGIN")
    conn.executemany(
        "INSERT INTO txn_log (log, txn, state, participants, coordinator, redo, applied, created_at_ms, expires_at_ms) "
        "VALUES (?, ?, 'ABORT', '[]', '', x'', 0, 0, ?)",
        [(LOG.key, f"{prefix}{index:06d}", expires_at_ms) for index in range(count)],
    )
    conn.execute("COMMIT")


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[emulator_writer._Writer]:
    """The writer's serving loop on a file, without a process or clients around it."""
    conn = emulator_sql.connect(tmp_path / "cornus.db", TIMEOUT_MS_CALL)
    listener, other = socket.socketpair()
    files = emulator_writer._Files(tmp_path / "cornus.db", (0, 0), (0, 0), (0, 0))
    try:
        yield emulator_writer._Writer(conn, listener, files)
    finally:
        conn.close()
        listener.close()
        other.close()


def test_purge_rounds_are_bounded_and_follow_each_other_while_expired_tombstones_remain(
    writer: emulator_writer._Writer,
) -> None:
    path, conn = writer.files.path, writer.conn
    count_max = emulator_writer.TOMBSTONE_PURGE_COUNT_MAX
    expired = 2 * count_max + 7
    now_ms = int(time.time() * 1000)
    insert_tombstones(conn, "expired", expired, now_ms - EXPIRED_AGO_MS)
    insert_tombstones(conn, "kept", 5, now_ms + KEEP_MS_LONG)
    # Ordinary records: no expiry, never purged, however old.
    emulator_sql.log_once(conn, LOG.key, "voted", VOTE_YES, BODY_WIRE, None)
    emulator_sql.log_once(conn, LOG.key, "aborted", TxnState.ABORT.value, BODY_WIRE, None)
    rounds = []
    remaining = expired
    while True:
        pause_ms = writer._purge()
        left = conn.execute("SELECT count(*) FROM txn_log WHERE txn LIKE 'expired%'").fetchone()[0]
        rounds.append((remaining - left, pause_ms))
        remaining = left
        if pause_ms == emulator_writer.TOMBSTONE_PURGE_INTERVAL_MS:
            break
        assert len(rounds) < 10, rounds
    backlog_ms, interval_ms = emulator_writer.TOMBSTONE_PURGE_BACKLOG_MS, emulator_writer.TOMBSTONE_PURGE_INTERVAL_MS
    assert rounds == [(count_max, backlog_ms), (count_max, backlog_ms), (7, interval_ms)]
    left = [row[1] for row in rows(path)]
    assert left == ["aborted", *(f"kept{index:06d}" for index in range(5)), "voted"], left


def test_a_purge_round_never_waits_for_another_programs_write_lock(writer: emulator_writer._Writer) -> None:
    path = writer.files.path
    insert_tombstones(writer.conn, "expired", 3, int(time.time() * 1000) - EXPIRED_AGO_MS)
    # A batch before left a long busy_timeout (its most patient caller's).
    writer.conn.execute(f"PRAGMA busy_timeout = {TIMEOUT_MS_CALL}")
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        started = time.monotonic()
        assert writer._purge() == emulator_writer.TOMBSTONE_PURGE_INTERVAL_MS  # put off to the next interval
        assert time.monotonic() - started < TIMEOUT_MS_CALL / 1000 / 4
        holder.execute("ROLLBACK")
    finally:
        holder.close()
    assert writer._purge() == emulator_writer.TOMBSTONE_PURGE_INTERVAL_MS
    assert rows(path) == []


def test_the_purge_reads_only_the_expiry_index(tmp_path: Path) -> None:
    """A round's cost is the rows it deletes, not the size of the log."""
    conn = emulator_sql.connect(tmp_path / "cornus.db", TIMEOUT_MS_CALL)
    try:
        plan = conn.execute(f"EXPLAIN QUERY PLAN {emulator_sql.PURGE_EXPIRED}", (0, 1)).fetchall()
    finally:
        conn.close()
    details = [row[-1] for row in plan]
    assert any("COVERING INDEX txn_log_expiry" in detail for detail in details), details
    assert not any(detail.startswith("SCAN txn_log") for detail in details), details


async def test_the_writer_purges_a_backlog_past_one_round_and_leaves_the_rest(store: EmulatorStore) -> None:
    """Through the real writer, with no writes arriving meanwhile: all expired tombstones go, in
    rounds one after the other, while unexpired ones and ordinary records stay."""
    expired = 2 * emulator_writer.TOMBSTONE_PURGE_COUNT_MAX + 10
    await store.log_once(LOG, "voted", VOTE, BODY)
    await store.log_once(LOG, "aborted", ABORT, BODY)
    await store.log_once(LOG, "applied", VOTE, BODY)
    assert await store.apply_redo("p0", "applied", {"k": b"v"})
    await store.delete(LOG, "kept", keep=Tombstone(ABORT, KEEP_MS_LONG))
    answers = await asyncio.gather(*(
        store.delete(LOG, f"expired{index:06d}", keep=Tombstone(ABORT, 1)) for index in range(expired)
    ))
    assert answers == [False] * expired
    deadline = time.monotonic() + PURGE_WAIT_S
    while left := rows(store.path, "txn LIKE 'expired%'"):
        assert time.monotonic() < deadline, f"{len(left)} of {expired} expired tombstones left"
        await asyncio.sleep(POLL_S)
    assert [row[1:4] for row in rows(store.path)] == [
        ("aborted", "ABORT", 0), ("applied", "COMMIT", 1), ("kept", "ABORT", 0), ("voted", VOTE_YES, 0),
    ]
    assert (await store.read(LOG, "kept")).body == RecordBody()  # type: ignore[union-attr]


# --- a file made before tombstones -----------------------------------------------------------------


async def test_a_file_made_before_tombstones_opens_keeps_its_records_and_then_keeps_tombstones(
    tmp_path: Path,
) -> None:
    path = tmp_path / "cornus.db"
    make_old_file(path)
    assert "expires_at_ms" not in columns(path)
    store = await EmulatorStore.open(path, timeout_ms_call=TIMEOUT_MS_CALL)
    try:
        assert columns(path)[-1] == "expires_at_ms"
        voted, applied = await store.read(LOG, "voted"), await store.read(LOG, "applied")
        assert voted is not None and applied is not None
        assert (voted.state, voted.applied, voted.body, voted.created_at_ms) == (
            VOTE, False, RecordBody(("p0",), "n0", b"redo"), OLD_CREATED_AT_MS,
        )
        assert (applied.state, applied.applied) == (COMMIT, True)
        assert [record.txn for record in await store.scan_unfinished(LOG)] == ["voted"]
        assert await store.read_data("p0", ["k"]) == {"k": b"v"}
        assert (await store.read_owners(["p0"]))["p0"].owner == "n0"
        # New records, and tombstones over the old ones and where none was.
        assert (await store.log_once(LOG, "new", VOTE, BODY)).created
        assert await store.delete(LOG, "applied", keep=Tombstone(COMMIT, KEEP_MS_LONG)) is True
        assert await store.delete(LOG, "voted", keep=Tombstone(ABORT, KEEP_MS_LONG)) is True
        tombstone = await store.read(LOG, "applied")
        assert tombstone is not None
        assert (tombstone.state, tombstone.applied, tombstone.body, tombstone.created_at_ms) == (
            COMMIT, True, RecordBody(), OLD_CREATED_AT_MS,
        )
        assert [record.txn for record in await store.scan_unfinished(LOG)] == ["new"]
        # And they are purged once expired.
        assert await store.delete(LOG, "voted", keep=Tombstone(ABORT, 1)) is True
        deadline = time.monotonic() + PURGE_WAIT_S
        while await store.read(LOG, "voted") is not None:
            assert time.monotonic() < deadline, "the upgraded file's tombstone was never purged"
            await asyncio.sleep(POLL_S)
        assert await store.read(LOG, "applied") is not None
    finally:
        await store.close()


def test_a_nodes_reader_leaves_a_file_made_before_tombstones_as_it_is(tmp_path: Path) -> None:
    """Only the writer upgrades, holding the writer lock: a reader that did could change the file
    under a writer of the earlier version still serving it, whose inserts name no columns."""
    path = tmp_path / "cornus.db"
    make_old_file(path)
    before = columns(path)
    conn = emulator_sql.connect(path, TIMEOUT_MS_CALL, upgrade=False)
    try:
        assert emulator_sql.read(conn, LOG, "voted") is not None
    finally:
        conn.close()
    assert columns(path) == before
    conn = emulator_sql.connect(path, TIMEOUT_MS_CALL)
    conn.close()
    assert columns(path) == [*before, "expires_at_ms"]


UPGRADER_COUNT = 6
UPGRADE_ROUND_COUNT = 20


def _upgrade(path: str, barrier: Any, results: Any) -> None:
    barrier.wait(30)
    try:
        emulator_sql.connect(Path(path), TIMEOUT_MS_CALL).close()
    except Exception as error:  # the failure is the result this test reports
        results.put(repr(error))
        return
    results.put("ok")


def test_processes_opening_a_file_made_before_tombstones_together_all_upgrade_it_once(tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    failures = []
    for round_index in range(UPGRADE_ROUND_COUNT):
        path = tmp_path / f"round-{round_index}.db"
        make_old_file(path)
        barrier = context.Barrier(UPGRADER_COUNT)
        results = context.Queue()
        processes = [
            context.Process(target=_upgrade, args=(str(path), barrier, results)) for _ in range(UPGRADER_COUNT)
        ]
        for process in processes:
            process.start()
        failures += [outcome for outcome in (results.get(True, 60) for _ in processes) if outcome != "ok"]
        for process in processes:
            process.join(30)
            assert process.exitcode == 0
        assert columns(path).count("expires_at_ms") == 1
        assert [row[1] for row in rows(path)] == ["applied", "voted"]
    assert failures == []


def test_a_wall_clock_stepped_forward_purges_no_tombstone_early(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by review: the purge compared expiries with the wall clock as it read then, so a step
    forward (NTP, a VM resumed) dropped tombstones at once, and a late terminator's LogOnce(ABORT)
    then created ABORT beside the transaction's COMMIT. Within a writer's life the purge's clock
    advances no faster than its monotonic clock."""
    conn = emulator_sql.connect(tmp_path / "cornus.db", TIMEOUT_MS_CALL)
    try:
        emulator_sql.log_once(conn, LOG.key, "t", VOTE_YES, BODY_WIRE, None)
        assert emulator_sql.delete(conn, LOG.key, "t", None, ("ABORT", 3_600_000)) is True
        wall = time.time
        monkeypatch.setattr(emulator_sql.time, "time", lambda: wall() + 7_200)  # two hours ahead
        assert emulator_sql.purge_expired(conn, 10) == 0
        assert emulator_sql.read(conn, LOG, "t").state is TxnState.ABORT  # type: ignore[union-attr]
    finally:
        conn.close()
