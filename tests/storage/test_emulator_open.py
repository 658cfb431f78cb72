"""Several processes opening one fresh emulator file at the same moment all succeed.

A cluster's nodes start together on a new file; SQLite refuses some of the lock upgrades of that
first setup without waiting, which once failed a node's start in CI ("database is locked").
"""

from __future__ import annotations

import asyncio
import multiprocessing
from pathlib import Path
from typing import Any

from storage_adapters.contract import LogId, RecordBody, TxnState
from storage_adapters.emulator import EmulatorStore

OPENER_COUNT = 6
ROUND_COUNT = 40


def _open_and_write(path: str, index: int, barrier: Any, results: Any) -> None:
    async def main() -> str:
        try:
            store = await EmulatorStore.open(path)
        except Exception as error:  # the failure is the result this test reports
            return repr(error)
        try:
            await store.log_once(LogId.partition("p"), f"t{index}", TxnState.VOTE_YES, RecordBody((), "c", b""))
        finally:
            await store.close()
        return "ok"

    barrier.wait(30)
    results.put(asyncio.run(main()))


def test_processes_opening_a_fresh_file_together_all_succeed(tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    failures = []
    for round_index in range(ROUND_COUNT):
        path = str(tmp_path / f"round-{round_index}.db")
        barrier = context.Barrier(OPENER_COUNT)
        results = context.Queue()
        processes = [
            context.Process(target=_open_and_write, args=(path, index, barrier, results))
            for index in range(OPENER_COUNT)
        ]
        for process in processes:
            process.start()
        outcomes = [results.get(True, 60) for _ in processes]
        for process in processes:
            process.join(30)
            assert process.exitcode == 0
        failures += [outcome for outcome in outcomes if outcome != "ok"]

        async def count(path: str = path) -> int:
            store = await EmulatorStore.open(path)
            try:
                return len(await store.scan_unfinished(LogId.partition("p"), limit=100))
            finally:
                await store.close()

        assert asyncio.run(count()) == OPENER_COUNT, "every opener's write is in the file"
    assert failures == []
