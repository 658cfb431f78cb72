"""A storage call run in a task of its own (storage_adapters/store.py `_in_a_task`, for code run
outside any task) and abandoned at its deadline may still end with an error of its I/O: that error
is retrieved, never logged by asyncio as "Task exception was never retrieved" after its caller had
long had its answer (found by the chaos tool's Azure runs, 2026-11-28)."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest

from storage_adapters.store import _in_a_task


async def test_an_error_an_abandoned_call_ends_with_is_retrieved() -> None:
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: reported.append(context))

    async def call() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            raise OSError("the socket's read failed as the deadline came") from None

    try:
        with pytest.raises(TimeoutError):
            await _in_a_task(loop, call(), loop.time() + 0.01)
        await asyncio.sleep(0.05)
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(previous)
    assert not reported, reported
