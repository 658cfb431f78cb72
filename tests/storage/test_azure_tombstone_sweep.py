"""The Azure store's sweep of its own tombstones (storage_adapters/azure_tombstone_sweep.py), with a
recording delete in place of Azure: nothing before its keep ends, a failed delete tried again a
bounded number of times, a bounded number pending, and deletes free of the storage call that
started the sweep. Against Azurite, tests/storage/test_tombstones.py waits for the drop."""

from __future__ import annotations

import asyncio

import pytest

from storage_adapters import azure_signing, azure_tombstone_sweep
from storage_adapters.azure_tombstone_sweep import TombstoneSweep
from storage_adapters.errors import StorageUnavailable
from storage_adapters.store import CallDeadline, call_deadline_at, call_deadline_if_set


async def test_a_tombstone_is_deleted_once_its_keep_has_passed_and_a_failed_delete_again() -> None:
    deleted: list[tuple[str, str]] = []
    failing = {"b"}

    async def delete(name: str, etag: str) -> bool:
        if name in failing:
            raise StorageUnavailable("azure_blob delete: no answer")
        deleted.append((name, etag))
        return True

    sweep = TombstoneSweep(delete)
    try:
        sweep.remember("a", "e1", 0)
        sweep.remember("b", "e2", 0)
        sweep.remember("c", "e3", 60_000)
        assert await sweep.sweep_once() == 1
        assert deleted == [("a", "e1")]  # "c" keeps for a minute yet; "b" failed
        failing.clear()
        assert await sweep.sweep_once() == 1
        assert deleted == [("a", "e1"), ("b", "e2")]
        assert sweep.deleted_count == 2
    finally:
        await sweep.close()


async def test_a_delete_that_keeps_failing_is_left_to_the_lifecycle_rule() -> None:
    async def delete(name: str, etag: str) -> bool:
        raise RuntimeError("Session is closed")  # not even a StorageError: the sweep goes on

    sweep = TombstoneSweep(delete)
    try:
        sweep.remember("a", "e", 0)
        for _ in range(azure_tombstone_sweep.DELETE_ATTEMPT_COUNT_MAX):
            assert await sweep.sweep_once() == 0
        assert sweep.dropped_count == 1
        assert await sweep.sweep_once() == 0 and sweep.dropped_count == 1  # tried no more
    finally:
        await sweep.close()


async def test_the_sweep_runs_free_of_the_storage_call_that_started_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first tombstone is remembered inside a storage call, whose deadline and signing window
    are context variables: inherited by the sweep, every later delete carried that call's
    deadline, long past (found by review: no delete could succeed after it)."""
    monkeypatch.setattr(azure_tombstone_sweep, "SWEEP_INTERVAL_S", 0.01)
    seen: list[object] = []

    async def delete(name: str, etag: str) -> bool:
        seen.append((call_deadline_if_set(), azure_signing._window.get()))
        return True

    sweep = TombstoneSweep(delete)
    try:
        with call_deadline_at(CallDeadline.after(0.001)), azure_signing.signing_window():
            sweep.remember("a", "e", 0)
        for _ in range(100):
            if seen:
                break
            await asyncio.sleep(0.01)
        assert seen == [(None, None)]
    finally:
        await sweep.close()


async def test_past_the_bound_a_tombstone_is_left_to_the_lifecycle_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(azure_tombstone_sweep, "SWEEP_PENDING_COUNT_MAX", 2)

    async def delete(name: str, etag: str) -> bool:
        await asyncio.sleep(0)
        return True

    sweep = TombstoneSweep(delete)
    try:
        for name in "abc":
            sweep.remember(name, "e", 0)
        assert sweep.dropped_count == 1
        assert await sweep.sweep_once() == 2
    finally:
        await sweep.close()
