"""The emulator's group commit (storage_adapters/emulator_sql.py `run_batch`): calls run together
in one SQLite transaction, and each still gets the answer it would get alone: a refused call in a
batch writes nothing, and the others land; a call past its deadline at its turn is refused, and a
batch that would commit past a deadline of one of its writes writes nothing at all; a call that
raises what no call should still gets an answer."""

from __future__ import annotations

import asyncio
import selectors
import socket
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from storage_adapters import emulator_sql, emulator_writer
from storage_adapters.contract import Fence, LogId, RecordBody, TxnState
from storage_adapters.emulator import EmulatorStore
from storage_adapters.errors import Fenced, StorageError, StorageUnavailable

TIMEOUT_MS_CALL = 5_000
# A call that takes this long makes its batch overrun a deadline set at half of it.
OVERRUN_S = 0.2
LOG = LogId.partition("p0")
BODY = RecordBody(("p0",), "n0", b"")
# The writes' wire form of the above, as the store sends them to the writer.
VOTE_YES = TxnState.VOTE_YES.value
BODY_WIRE = emulator_sql.body_wire(BODY)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[EmulatorStore]:
    opened = await EmulatorStore.open(tmp_path / "cornus.db", timeout_ms_call=TIMEOUT_MS_CALL)
    yield opened
    await opened.close()


def test_a_refused_call_in_one_transaction_writes_nothing_and_the_others_land(tmp_path: Path) -> None:
    conn = emulator_sql.connect(tmp_path / "cornus.db", TIMEOUT_MS_CALL)
    try:
        fence = Fence("p0", "n0", 1)  # no ownership record exists, so storage refuses it
        fence_wire = emulator_sql.fence_wire(fence)
        writes = {"k1": b"v1"}

        def apply_then_refuse(c: object) -> bool:
            # A call that writes, then is refused: its savepoint must undo the write too.
            emulator_sql.log(c, LOG.key, "t2.cornus", VOTE_YES, BODY_WIRE, None)  # type: ignore[arg-type]
            return emulator_sql.apply_redo(c, "p0", "t2.cornus", writes, fence_wire)  # type: ignore[arg-type]

        results = emulator_sql.run_batch(conn, [
            lambda c: emulator_sql.log_once(c, LOG.key, "t1.cornus", VOTE_YES, BODY_WIRE, None),
            apply_then_refuse,
            lambda c: emulator_sql.log_once(c, LOG.key, "t3.cornus", VOTE_YES, BODY_WIRE, None),
        ], writes=True)
        assert results[0] == (True, (VOTE_YES, True)) and results[2] == (True, (VOTE_YES, True)), results
        assert results[1][0] is False and isinstance(results[1][1], Fenced), results
        # The refusal carries the contract's objects, as the caller reads them.
        assert results[1][1].fence == fence and results[1][1].stored is None, results
        assert emulator_sql.read(conn, LOG, "t2.cornus") is None
        assert emulator_sql.read_data(conn, "p0", ("k1",)) == {"k1": None}
        assert emulator_sql.read(conn, LOG, "t1.cornus") is not None
        assert emulator_sql.read(conn, LOG, "t3.cornus") is not None
    finally:
        conn.close()


async def test_calls_sent_together_each_get_their_own_answer(store: EmulatorStore) -> None:
    fence = Fence("p0", "n0", 1)
    # Issued in one loop iteration, they leave in one socket write and reach the writer together.
    outcomes = await asyncio.gather(
        store.log_once(LOG, "t1.cornus", TxnState.VOTE_YES, BODY),
        store.log_once(LOG, "t2.cornus", TxnState.VOTE_YES, BODY, fence),
        store.log_once(LOG, "t1.cornus", TxnState.ABORT, BODY),
        store.log_once(LOG, "t3.cornus", TxnState.VOTE_YES, BODY),
        return_exceptions=True,
    )
    assert outcomes[0].created and outcomes[3].created, outcomes  # type: ignore[union-attr]
    assert isinstance(outcomes[1], Fenced), outcomes
    # The second LogOnce of t1 found the first one's vote: exactly once.
    assert not outcomes[2].created and outcomes[2].state is TxnState.VOTE_YES, outcomes  # type: ignore[union-attr]
    assert await store.read(LOG, "t2.cornus") is None


def test_a_call_past_its_deadline_at_its_turn_is_refused_and_a_batch_that_overran_a_deadline_writes_nothing(
    tmp_path: Path,
) -> None:
    conn = emulator_sql.connect(tmp_path / "cornus.db", TIMEOUT_MS_CALL)
    try:
        now = time.monotonic()

        def log_once(txn: str) -> Callable[[object], object]:
            return lambda c: emulator_sql.log_once(c, LOG.key, txn, VOTE_YES, BODY_WIRE, None)  # type: ignore[arg-type]

        # Its deadline passed before its turn: refused, and the others land.
        results = emulator_sql.run_batch(
            conn, [log_once("t1.cornus"), log_once("t2.cornus")], writes=True, deadlines=[now + 60, now - 1],
        )
        assert [ok for ok, _ in results] == [True, False], results
        assert isinstance(results[1][1], StorageUnavailable)
        assert emulator_sql.read(conn, LOG, "t2.cornus") is None

        def slow(c: object) -> object:
            time.sleep(OVERRUN_S)  # the batch runs past the first call's deadline
            return log_once("t4.cornus")(c)

        # The first call was on time at its turn, but the batch would commit after its deadline:
        # nothing of the batch is written, and every call hears so.
        results = emulator_sql.run_batch(
            conn, [log_once("t3.cornus"), slow], writes=True, deadlines=[now + OVERRUN_S / 2, now + 60],
        )
        assert [ok for ok, _ in results] == [False, False], results
        assert all(isinstance(error, StorageUnavailable) for _, error in results)
        assert results[0][1] is not results[1][1]
        assert emulator_sql.read(conn, LOG, "t3.cornus") is None
        assert emulator_sql.read(conn, LOG, "t4.cornus") is None
    finally:
        conn.close()


def test_a_call_that_raises_an_unexpected_error_writes_nothing_and_is_answered_with_a_storage_error(
    tmp_path: Path,
) -> None:
    conn = emulator_sql.connect(tmp_path / "cornus.db", TIMEOUT_MS_CALL)
    try:
        def broken(c: object) -> object:
            emulator_sql.log_once(c, LOG.key, "t1.cornus", VOTE_YES, BODY_WIRE, None)  # type: ignore[arg-type]
            raise KeyError("a bug")

        results = emulator_sql.run_batch(conn, [
            broken, lambda c: emulator_sql.log_once(c, LOG.key, "t2.cornus", VOTE_YES, BODY_WIRE, None),
        ], writes=True)
        assert [ok for ok, _ in results] == [False, True], results
        assert type(results[0][1]) is StorageError and "KeyError" in str(results[0][1])
        assert emulator_sql.read(conn, LOG, "t1.cornus") is None
        assert emulator_sql.read(conn, LOG, "t2.cornus") is not None
    finally:
        conn.close()


def test_a_client_dropped_while_one_batch_is_answered_has_nothing_of_the_next_batch_run(tmp_path: Path) -> None:
    """Found by review: clients gone were left out once, before the pass's requests were cut into
    batches, so a client dropped while the first batch's answers went out (its socket broken, or
    too many answers unread) still had its writes in the next batch run, unanswered."""
    conn = sqlite3.connect(tmp_path / "w.db")
    listener, _other = socket.socketpair()
    files = emulator_writer._Files(tmp_path / "w.db", (0, 0), (0, 0), (0, 0))
    writer = emulator_writer._Writer(conn, listener, files)
    ours, theirs = socket.socketpair()
    theirs.close()  # answering it fails: the writer drops it at its first answer
    ours.setblocking(False)
    client = emulator_writer._Client(ours)
    writer.clients[ours] = client
    writer.selector.register(ours, selectors.EVENT_READ, client)
    ran: list[int] = []
    deadline_s = time.monotonic() + 60
    requests = [
        emulator_writer._Request(client, index, deadline_s, lambda _conn, index=index: ran.append(index), ())
        for index in range(emulator_writer.BATCH_COUNT_MAX + 10)
    ]
    writer._run_all(requests)
    assert client.gone
    assert ran == list(range(emulator_writer.BATCH_COUNT_MAX)), f"ran {len(ran)} writes of a dropped client"
