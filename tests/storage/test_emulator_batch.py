"""The emulator's group commit (storage_adapters/emulator_sql.py `run_batch`): calls run together
in one SQLite transaction, and each still gets the answer it would get alone: a refused call in a
batch writes nothing, and the others land."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from storage_adapters import emulator_sql
from storage_adapters.contract import Fence, LogId, RecordBody, TxnState
from storage_adapters.emulator import EmulatorStore
from storage_adapters.errors import Fenced

TIMEOUT_MS_CALL = 5_000
LOG = LogId.partition("p0")
BODY = RecordBody(("p0",), "n0", b"")


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[EmulatorStore]:
    opened = await EmulatorStore.open(tmp_path / "cornus.db", timeout_ms_call=TIMEOUT_MS_CALL)
    yield opened
    await opened.close()


def test_a_refused_call_in_one_transaction_writes_nothing_and_the_others_land(tmp_path: Path) -> None:
    conn = emulator_sql.connect(tmp_path / "cornus.db", TIMEOUT_MS_CALL)
    try:
        fence = Fence("p0", "n0", 1)  # no ownership record exists, so storage refuses it
        writes = {"k1": b"v1"}

        def apply_then_refuse(c: object) -> bool:
            # A call that writes, then is refused: its savepoint must undo the write too.
            emulator_sql.log(c, LOG, "t2.cornus", TxnState.VOTE_YES, BODY, None)  # type: ignore[arg-type]
            return emulator_sql.apply_redo(c, "p0", "t2.cornus", writes, fence)  # type: ignore[arg-type]

        results = emulator_sql.run_batch(conn, [
            lambda c: emulator_sql.log_once(c, LOG, "t1.cornus", TxnState.VOTE_YES, BODY, None),
            apply_then_refuse,
            lambda c: emulator_sql.log_once(c, LOG, "t3.cornus", TxnState.VOTE_YES, BODY, None),
        ], writes=True)
        assert [ok for ok, _ in results] == [True, False, True], results
        assert isinstance(results[1][1], Fenced), results
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
