"""A call's deadline fixed before the machine was suspended is not pushed later by the suspend.

A caller that decided to write under a condition that held when it checked (a lease gate, the
identity window, a resolve's window) fixes the write's deadline then (call_deadline_at). The
deadline is in the event loop's clock, which stops while the machine is suspended (a paused VM, a
frozen container), and the backends turned "what is left of it" into the deadline the server
checks by its own clock: a suspend between the check and the sending left the whole deadline
after it, and the write landed after the condition's end (found by a read-only audit,
2026-11-27). What is left is now counted on the boot clock too, which a suspend advances."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import AsyncIterator

import pytest

from storage_adapters.contract import LogId, RecordBody, TxnState
from storage_adapters.errors import StorageUnavailable
from storage_adapters.factory import open_store
from storage_adapters.store import CallDeadline, LogStore, call_deadline_at
from tests.conftest import Services
from tests.storage.conftest import config_for

pytestmark = pytest.mark.services

# Longer than the deadline fixed below: the suspend outlives it.
SUSPEND_S = 30.0
DEADLINE_S = 2.0


@pytest.fixture(params=["emulator", "redis", "azure_blob", "dynamodb"])
async def deadline_store(request: pytest.FixtureRequest, services: Services, run_id: str,
                         tmp_path: object) -> AsyncIterator[LogStore]:
    """A store of each backend, and an Azure container of its own. DynamoDB checks no deadline
    of ours: a call whose deadline passed before it left must not leave at all (found by audit,
    2026-11-27: the template started it, and botocore sent a whole PutItem on a pooled
    connection before the timeout cancelled it; signed then, it was no late write to Amazon)."""
    config = config_for(request.param, services, run_id, str(tmp_path))
    if config.backend == "azure_blob":
        config = dataclasses.replace(config, azure_container=f"{config.azure_container}-{uuid.uuid4().hex[:8]}")
    store = await open_store(config)
    try:
        yield store
    finally:
        if config.backend == "azure_blob":
            await store.delete_container()  # type: ignore[attr-defined]
        await store.close()


async def test_a_write_whose_deadline_passed_during_a_suspend_is_never_sent(
    deadline_store: LogStore, ns: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = deadline_store
    log, txn = LogId.partition(f"{ns}p"), f"{ns}t"
    await store.read(log, "warm-up")  # a first answer (Azure learns its clock from it)
    with call_deadline_at(CallDeadline.after(DEADLINE_S)):
        real = time.clock_gettime_ns

        def after_a_suspend(clock: int) -> int:
            # CLOCK_BOOTTIME went on while the machine slept; CLOCK_MONOTONIC (the loop's) did not.
            boottime = getattr(time, "CLOCK_BOOTTIME", None)
            return real(clock) + (int(SUSPEND_S * 1e9) if clock == boottime else 0)

        monkeypatch.setattr(time, "clock_gettime_ns", after_a_suspend)
        started = time.monotonic()
        with pytest.raises(StorageUnavailable):
            await store.log_once(log, txn, TxnState.VOTE_YES, RecordBody((log.name,), "n1", b""))
    monkeypatch.undo()
    assert time.monotonic() - started < DEADLINE_S, "refused at once, not at the deadline"
    assert await store.read(log, txn) is None, "the write landed after its deadline had passed in the suspend"
