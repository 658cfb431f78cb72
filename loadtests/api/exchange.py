"""One transaction program (loadtests.workloads.base) run as the calls a node needs: a begin
before the first Read or Write of an interactive transaction, each request, and an abort when the
program leaves a transaction open that the node did not end. `exchange(program)` yields those
steps and receives the transport's Reply to each; `run` and `run_async` drive it over a
synchronous call (Locust, where gevent makes the waits cooperative) or an asynchronous one (the
built-in driver). The transport only translates a step into its call and the answer into a Reply
(loadtests.api.replies): when a transaction ended, what a lost answer means and when to abort are
decided here, once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass

from loadtests.workloads.base import Commit, Execute, Program, Reply, Request

# The outcomes a node answers with; "failed" (an error answer, or none) and "active" are not one.
NODE_OUTCOMES = ("committed", "aborted", "unavailable", "unknown")


@dataclass(frozen=True, slots=True)
class Begin:
    """Begin an interactive transaction; the reply is `active` with its id in `txn`."""


@dataclass(frozen=True, slots=True)
class Call:
    """One request of the program; `txn` is "" for a one-shot Execute."""

    request: Request
    txn: str

    @property
    def final(self) -> bool:
        """Execute and Commit end the transaction, whatever their answer."""
        return isinstance(self.request, Execute | Commit)


@dataclass(frozen=True, slots=True)
class Abort:
    """Abort a transaction the program left open; its reply is not looked at."""

    txn: str


Step = Begin | Call | Abort
Exchange = Generator[Step, Reply, Reply]


def node_ended(reply: Reply) -> bool:
    """Whether the node ended the transaction with this reply: it answered with an outcome. An
    error answer or none (`failed`) leaves it open there, holding its locks until aborted."""
    return reply.outcome in NODE_OUTCOMES


class _Open:
    """The transaction the exchange has begun and not seen end."""

    txn = ""


def exchange(program: Program) -> Exchange:
    """The steps of one run of `program`; returns the last reply (Execute's or Commit's, or the
    one that ended the transaction early). An exception of the program propagates, after the
    abort of a transaction it left open."""
    opened = _Open()
    try:
        reply = yield from _steps(program, opened)
    except Exception:
        if opened.txn:
            yield Abort(opened.txn)
        raise
    finally:
        program.close()
    if opened.txn:
        yield Abort(opened.txn)
    return reply


def _steps(program: Program, opened: _Open) -> Exchange:
    request = next(program)
    while True:
        if not isinstance(request, Execute) and not opened.txn:
            began = yield Begin()
            if began.outcome != "active" or not began.txn:
                return began
            opened.txn = began.txn
        step = Call(request, "" if isinstance(request, Execute) else opened.txn)
        reply = yield step
        if step.final:
            # Ended whatever the answer: a commit whose answer was lost may still be deciding,
            # and an abort sent now could not change that outcome, only confuse it.
            opened.txn = ""
            try:
                program.send(reply)
            except StopIteration:
                return reply
            raise RuntimeError("a workload program made a request after its transaction ended")
        if reply.outcome != "active":
            if node_ended(reply):
                opened.txn = ""
            return reply
        request = program.send(reply)


def run(program: Program, call: Callable[[Step], Reply]) -> Reply:
    """Run `program` to its end over a synchronous `call` (which turns transport errors into
    replies, loadtests.api.replies.no_answer)."""
    steps = exchange(program)
    try:
        step = next(steps)
        while True:
            step = steps.send(call(step))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


async def run_async(program: Program, call: Callable[[Step], Awaitable[Reply]]) -> Reply:
    """`run` over an asynchronous `call`."""
    steps = exchange(program)
    try:
        step = next(steps)
        while True:
            step = steps.send(await call(step))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
