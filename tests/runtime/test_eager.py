"""cornus/runtime/eager.py: a coroutine run to its first wait in the caller's step, and a task only
if it waits, that then behaves as if it had been a task all along; and a LogStore call made from
such a step (no current task) is still bounded by its deadline."""

from __future__ import annotations

import asyncio
import contextvars
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from cornus.runtime import eager
from storage_adapters.contract import LogId, RecordBody, TxnState
from storage_adapters.emulator import EmulatorStore
from storage_adapters.errors import StorageUnavailable
from storage_adapters.factory import StoreConfig, open_store
from storage_adapters.store import LogStore
from tests.conftest import Services

_VAR: contextvars.ContextVar[str] = contextvars.ContextVar("test_eager", default="unset")
WAIT_S = 5.0


async def _outside_any_task(start: Callable[[], asyncio.Future[Any]]) -> asyncio.Future[Any]:
    """`start()` called from a plain loop callback, as a transport's data_received is: no task."""
    loop = asyncio.get_running_loop()
    started: asyncio.Future[asyncio.Future[Any]] = loop.create_future()

    def callback() -> None:
        assert asyncio.current_task() is None
        started.set_result(start())

    loop.call_soon(callback)
    return await started


async def test_a_coroutine_that_never_waits_finishes_without_a_task() -> None:
    async def quick() -> int:
        assert asyncio.current_task() is None
        return 42

    async def fails() -> None:
        raise ValueError("no")

    loop = asyncio.get_running_loop()
    done = await _outside_any_task(lambda: eager.start(loop, quick()))
    assert done.done() and not isinstance(done, asyncio.Task) and done.result() == 42
    failed = await _outside_any_task(lambda: eager.start(loop, fails()))
    assert isinstance(failed.exception(), ValueError)


async def test_one_that_waits_goes_on_in_a_task_with_its_own_context() -> None:
    loop = asyncio.get_running_loop()
    gate: asyncio.Future[int] = loop.create_future()
    seen: list[str] = []

    async def waits() -> int:
        token = _VAR.set("mine")
        try:
            value = await gate
            seen.append(_VAR.get())
            assert asyncio.current_task() is not None
            return value + 1
        finally:
            _VAR.reset(token)  # in its task: a token of the context the step ran in

    running = await _outside_any_task(lambda: eager.start(loop, waits()))
    assert isinstance(running, asyncio.Task) and not running.done()
    assert _VAR.get() == "unset"  # what it set stayed in its own context
    gate.set_result(1)
    async with asyncio.timeout(WAIT_S):
        assert await running == 2
    assert seen == ["mine"]


@pytest.mark.parametrize("when", ["before its first step", "while it waits"])
async def test_a_task_cancelled_unwinds_the_coroutine_and_cancels_what_it_waits_on(when: str) -> None:
    loop = asyncio.get_running_loop()
    gate: asyncio.Future[int] = loop.create_future()
    unwound: list[bool] = []

    async def waits() -> int:
        try:
            return await gate
        finally:
            unwound.append(True)

    running = await _outside_any_task(lambda: eager.start(loop, waits()))
    if when == "while it waits":
        await asyncio.sleep(0.01)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        async with asyncio.timeout(WAIT_S):
            await running
    assert unwound == [True] and gate.cancelled() and running.cancelled()


async def test_a_future_one_of_them_waits_on_may_be_awaited_by_others_in_the_same_step() -> None:
    loop = asyncio.get_running_loop()
    shared: asyncio.Future[int] = loop.create_future()

    async def waits() -> int:
        return await shared

    # A future's `await` marks it as waited on until the waiting task's step ends; a coroutine
    # started eagerly must not leave it marked, or the next awaiter is refused ("await wasn't
    # used with future").
    both = await _outside_any_task(lambda: asyncio.gather(eager.start(loop, waits()), eager.start(loop, waits())))
    plain = asyncio.ensure_future(waits())
    shared.set_result(3)
    async with asyncio.timeout(WAIT_S):
        assert await both == [3, 3]
        assert await plain == 3


async def test_answer_soon_answers_on_a_later_tick_and_keeps_the_deadline_and_the_callers_cancellation() -> None:
    loop = asyncio.get_running_loop()
    gate: asyncio.Future[int] = loop.create_future()
    cancelled: list[str] = []

    async def handler(name: str, wait: bool) -> str:
        if wait:
            try:
                await gate
            except asyncio.CancelledError:
                cancelled.append(name)
                raise
        assert asyncio.current_task() is None or wait
        return name

    def late() -> Exception:
        return TimeoutError("late")

    quick = eager.answer_soon(loop, lambda: handler("quick", False), WAIT_S, late)
    assert not quick.done()  # never answered inside the caller's step
    async with asyncio.timeout(WAIT_S):
        assert await quick == "quick"
    expired = eager.answer_soon(loop, lambda: handler("expired", True), 0.05, late)
    with pytest.raises(TimeoutError, match="late"):
        await expired
    given_up = eager.answer_soon(loop, lambda: handler("given up", True), WAIT_S, late)
    await asyncio.sleep(0.01)
    given_up.cancel()
    async with asyncio.timeout(WAIT_S):
        while len(cancelled) < 2:  # noqa: ASYNC110 - the handlers' cancellations have no event
            await asyncio.sleep(0.01)
    assert sorted(cancelled) == ["expired", "given up"]


async def _store_call_outside_any_task(store: LogStore, call: Callable[[], Awaitable[Any]]) -> Any:
    async def run() -> Any:
        return await call()

    loop = asyncio.get_running_loop()
    running = await _outside_any_task(lambda: eager.start(loop, run()))
    async with asyncio.timeout(WAIT_S):
        return await running


def _wait_for_of_python_3_12(monkeypatch: pytest.MonkeyPatch) -> None:
    """asyncio.wait_for as Python 3.12 and later have it: built on asyncio.timeout, which refuses
    to run outside a task (found by audit: this machine's 3.11 hid that every store call made
    outside a task, a peer request's cache miss among them, would fail there)."""
    real = asyncio.wait_for

    async def wait_for(awaitable: Any, timeout: float | None) -> Any:  # noqa: ASYNC109 - wait_for's own
        if asyncio.current_task() is None:
            if asyncio.iscoroutine(awaitable):
                awaitable.close()
            raise RuntimeError("Timeout should be used inside a task")
        return await real(awaitable, timeout)

    monkeypatch.setattr(asyncio, "wait_for", wait_for)


@pytest.mark.parametrize("python", ["3.11", "3.12"])
async def test_a_store_call_made_outside_any_task_works_and_keeps_its_deadline(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, python: str) -> None:
    if python == "3.12":
        _wait_for_of_python_3_12(monkeypatch)
    store = await EmulatorStore.open(tmp_path / "cornus.db", timeout_ms_call=300)
    try:
        log = LogId.partition("p0")
        body = RecordBody(("p0",), "n0", b"")
        result = await _store_call_outside_any_task(store, lambda: store.log_once(log, "t1", TxnState.VOTE_YES, body))
        assert result.created
        record = await _store_call_outside_any_task(store, lambda: store.read(log, "t1"))
        assert record is not None and record.state is TxnState.VOTE_YES

        async def never() -> None:
            await asyncio.Event().wait()

        # A backend call that never answers is cut off at the deadline, task or no task.
        with pytest.raises(StorageUnavailable, match="within 300 ms"):
            await _store_call_outside_any_task(store, lambda: store._bounded(never(), "read"))
    finally:
        await store.close()



async def test_a_redis_call_made_outside_any_task_connects_the_pipe_on_python_3_12_too(
        services: Services, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Redis pipe connects on the first call that needs it, which may run outside any task: its
    connect was bounded by asyncio.wait_for, which Python 3.12 refuses there (found by audit)."""
    _wait_for_of_python_3_12(monkeypatch)
    store = await open_store(StoreConfig(backend="redis", redis_url=services.redis_url, timeout_ms_call=2_000))
    try:
        pipe = store._pipe  # type: ignore[attr-defined]
        assert pipe is not None, "the hot calls go over the pipe"
        protocol = pipe._protocol
        if protocol is not None and protocol.transport is not None:
            protocol.transport.abort()  # the next call connects again
            for _ in range(100):
                if pipe._protocol is None:
                    break
                await asyncio.sleep(0.01)
        log = LogId.partition(f"p-eager-{secrets.token_hex(4)}")
        body = RecordBody((log.name,), "n0", b"")
        result = await _store_call_outside_any_task(store, lambda: store.log_once(log, "t1", TxnState.VOTE_YES, body))
        assert result.created
    finally:
        await store.close()
