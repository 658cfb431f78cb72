"""Coroutines run to their first wait in the caller's step, with a task made only if they wait:
Python 3.12's eager tasks, for 3.11.

A peer's request that the owner serves from its cache and its lock table never waits, and a task
for it costs a task object, a weak-set entry, a scheduled step and a tick of latency on the
transaction's critical path. Started here, such a request is answered within the step that read
it; one that does wait (a lock held, a cache miss) continues in a task, from exactly where it
stopped, as if it had been one all along (results, exceptions and cancellation alike).

What runs before its first wait runs in no task, so it must not need one: `asyncio.timeout`,
`asyncio.current_task`, and `asyncio.wait_for` since Python 3.12 there would find none (LogStore
bounds its calls made so in a task of their own under `asyncio.wait`, and the Redis pipe connects
so too), and a deadline is the caller's to keep,
with a timer that cancels the task if one is made (`answer_soon` does both for a request).
"""

from __future__ import annotations

import asyncio
import collections.abc
import contextvars
import functools
from collections.abc import Callable, Coroutine
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
            # The task's first step: hand it the future the coroutine is waiting on, marked as a
            # future's own `await` marks it (start() unmarked it meanwhile). A task only ever
            # sends None first.
            assert value is None, value
            self._yielded = _STARTED
            if asyncio.isfuture(yielded):
                yielded._asyncio_future_blocking = True
            return yielded
        return self._coroutine.send(value)

    def throw(self, *error: Any) -> Any:
        yielded = self._yielded
        if yielded is not _STARTED:
            # Before the first step (a task cancelled at once): the coroutine is at its wait, and
            # must unwind from there (its finally blocks) rather than be dropped half run; and the
            # future it waits on is cancelled with it, as a task cancels the future it waits on.
            self._yielded = _STARTED
            if asyncio.isfuture(yielded):
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
    if asyncio.isfuture(yielded):
        # `await future` marked it as being waited on, which a task clears in the same step; until
        # the continuation's first step, another coroutine awaiting it would be refused.
        yielded._asyncio_future_blocking = False
    # Named after the coroutine: the continuation itself has no name to show in the task's repr.
    name = getattr(coroutine, "__qualname__", None)
    return loop.create_task(_Continuation(coroutine, yielded), name=name, context=context)  # type: ignore[arg-type]


def answer_soon(
    loop: asyncio.AbstractEventLoop,
    handle: Callable[[], Coroutine[Any, Any, T]],
    timeout_s: float,
    timed_out: Callable[[], BaseException],
) -> asyncio.Future[T]:
    """The future of `handle()`'s result, handled on a later tick (never inside the caller's step,
    as a request from afar would be) and by `start`. Past `timeout_s` the future fails with
    `timed_out()` and the handler, if it waits, is cancelled; so it is if the caller cancels."""
    answer: asyncio.Future[T] = loop.create_future()
    expiry = loop.call_later(timeout_s, _expire, answer, timed_out)
    answer.add_done_callback(functools.partial(_cancel_timer, expiry))
    loop.call_soon(_handle_now, loop, handle, answer)
    return answer


def _handle_now(loop: asyncio.AbstractEventLoop, handle: Callable[[], Coroutine[Any, Any, T]],
                answer: asyncio.Future[T]) -> None:
    if answer.done():
        return  # its caller gave up first
    handled = start(loop, handle())
    if handled.done():
        _settle(answer, handled)
        return
    handled.add_done_callback(functools.partial(_settle, answer))
    # A deadline passed or a caller that gave up ends the handler.
    answer.add_done_callback(functools.partial(_cancel_unless_done, handled))


def _settle(answer: asyncio.Future[T], handled: asyncio.Future[T]) -> None:
    """`answer` ends as `handled` did, unless it already ended (then `handled`'s exception is
    only retrieved, so that asyncio does not report it as lost)."""
    if handled.cancelled():
        if not answer.done():
            answer.cancel()
        return
    error = handled.exception()
    if answer.done():
        return
    if error is None:
        answer.set_result(handled.result())
    else:
        answer.set_exception(error)


def _expire(answer: asyncio.Future[Any], timed_out: Callable[[], BaseException]) -> None:
    if not answer.done():
        answer.set_exception(timed_out())


def _cancel_timer(timer: asyncio.TimerHandle, _: asyncio.Future[Any]) -> None:
    timer.cancel()


def _cancel_unless_done(handled: asyncio.Future[Any], _: asyncio.Future[Any]) -> None:
    if not handled.done():
        handled.cancel()
