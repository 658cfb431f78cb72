"""Coroutines run to their first wait in the caller's step, with a task made only if they wait:
Python 3.12's eager tasks, for 3.11.

A peer's request that the owner serves from its cache and its lock table never waits, and a task
for it costs a task object, a weak-set entry, a scheduled step and a tick of latency on the
transaction's critical path. Started here, such a request is answered within the step that read
it; one that does wait (a lock held, a cache miss) continues in a task, from exactly where it
stopped, as if it had been one all along (results, exceptions and cancellation alike).

What runs before its first wait runs in no task, so it must not need one: `asyncio.timeout` and
`asyncio.current_task` there would find none (LogStore bounds such calls with a task of their
own), and a deadline is the caller's to keep, with a timer that cancels the task if one is made.
"""

from __future__ import annotations

import asyncio
import collections.abc
import contextvars
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_STARTED = object()  # _Continuation._yielded once the task took what the coroutine waits on


class _Continuation(collections.abc.Coroutine):  # type: ignore[type-arg]
    """A coroutine already run to its first wait, as a task's coroutine: the task's first step
    gets what that wait yielded (the future it waits on), and every later step, exception and
    close goes to the coroutine itself."""

    __slots__ = ("_coroutine", "_yielded")

    def __init__(self, coroutine: Coroutine[Any, Any, Any], yielded: Any) -> None:
        self._coroutine = coroutine
        self._yielded = yielded

    def send(self, value: Any) -> Any:
        yielded = self._yielded
        if yielded is not _STARTED:
            # The task's first step: hand it the future the coroutine is waiting on. A task only
            # ever sends None first.
            assert value is None, value
            self._yielded = _STARTED
            return yielded
        return self._coroutine.send(value)

    def throw(self, *error: Any) -> Any:
        yielded = self._yielded
        if yielded is not _STARTED:
            # Before the first step (a task cancelled at once): the coroutine is at its wait, and
            # must unwind from there (its finally blocks) rather than be dropped half run; and the
            # future it waits on is cancelled with it, as a task cancels the future it waits on.
            self._yielded = _STARTED
            if isinstance(yielded, asyncio.Future):
                yielded.cancel()
        return self._coroutine.throw(*error)

    def close(self) -> None:
        self._coroutine.close()

    def __await__(self) -> Any:
        raise TypeError("a continuation is run by a task, not awaited")


def start(loop: asyncio.AbstractEventLoop, coroutine: Coroutine[Any, Any, T]) -> asyncio.Future[T]:
    """Run `coroutine` now until it first waits. If it finished, a done future with its result
    (or exception); else the task that runs the rest. It runs in a copy of the caller's context,
    as a task would: a context variable it sets (and resets, maybe in its task) stays its own."""
    context = contextvars.copy_context()
    try:
        yielded = context.run(coroutine.send, None)
    except StopIteration as stop:
        future: asyncio.Future[T] = loop.create_future()
        future.set_result(stop.value)
        return future
    except asyncio.CancelledError:
        future = loop.create_future()
        future.cancel()
        return future
    except Exception as error:
        future = loop.create_future()
        future.set_exception(error)
        return future
    return loop.create_task(_Continuation(coroutine, yielded), context=context)  # type: ignore[arg-type]
