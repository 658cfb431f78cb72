"""What every driver shares (loadtests.api), without a cluster: what each REST answer means, the
calls a transaction program becomes (begin, requests, the abort of a transaction left open) and the
load phase. The built-in driver, the Locust REST users and the gRPC users all go through these, so
a rule pinned here holds for all three."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import pytest

from cornus.runtime.keys import partition_of
from loadtests.api import load as load_module
from loadtests.api.exchange import Abort, Begin, Call, Step, exchange, run, run_async
from loadtests.api.load import (
    LOAD_ATTEMPT_COUNT_MAX,
    LOAD_BATCH_KEY_COUNT_MAX,
    LoadError,
    load,
    load_async,
    load_batches,
)
from loadtests.api.replies import no_answer, rest_reply
from loadtests.api.rest import rest_call
from loadtests.workloads import make_workload
from loadtests.workloads.base import Commit, Execute, Program, Read, Reply, Write

EXECUTE = Call(Execute(({"op": "get", "key": "k"},)), "")
COMMIT = Call(Commit(), "t1")
READ = Call(Read(("k",)), "t1")


def _body(**fields: object) -> bytes:
    return json.dumps(fields).encode()


@pytest.mark.parametrize(("step", "status", "body", "expected"), [
    (EXECUTE, 200, _body(outcome="committed", retryable=False, reads={"k": "v"}, timing_ms={"prepare": 1.5}),
     Reply("committed", values={"k": "v"}, timing_ms={"prepare": 1.5})),
    (COMMIT, 409, _body(outcome="aborted", reason="conflict", retryable=True, detail="k is locked"),
     Reply("aborted", "conflict", retryable=True)),
    # Only an abort has a reason code; any other outcome says why in its detail.
    (EXECUTE, 503, _body(outcome="unavailable", reason=None, retryable=True, detail="owner of p1: timeout"),
     Reply("unavailable", "owner of p1: timeout", retryable=True)),
    (COMMIT, 202, _body(outcome="unknown", retryable=False), Reply("unknown")),
    (EXECUTE, 400, _body(error="invalid_request", detail="1001 operations"), Reply("failed", "invalid_request")),
    (COMMIT, 409, _body(error="wrong_state", detail="already aborted"), Reply("failed", "wrong_state")),
    (EXECUTE, 500, b"<html>oops</html>", Reply("failed", "500")),
    # Reads and timings of another shape than the API's are dropped, not trusted.
    (EXECUTE, 200, _body(outcome="committed", reads=["k"], timing_ms={"prepare": "slow"}), Reply("committed")),
    (READ, 200, _body(txn="t1", values={"k": None}), Reply("active", values={"k": None})),
    (READ, 409, _body(outcome="aborted", reason="conflict", retryable=True), Reply("aborted", "conflict", True)),
    (READ, 409, _body(error="wrong_state", detail="committing"), Reply("failed", "wrong_state")),
    (READ, 503, _body(error="storage_unavailable", detail="timeout"), Reply("failed", "storage_unavailable")),
    (Begin(), 201, _body(txn="t9"), Reply("active", txn="t9")),
    # A node that cannot begin now answers 503: nothing began, and trying again may succeed.
    (Begin(), 503, _body(error="unavailable", detail="overloaded"), Reply("unavailable", "unavailable", True)),
])
def test_each_rest_answer_means_what_the_api_documents(step, status, body, expected):
    assert rest_reply(step, status, body) == expected


def test_a_lost_answer_is_unknown_only_where_something_may_have_committed():
    assert no_answer(EXECUTE, "TimeoutError") == Reply("unknown", "TimeoutError")
    assert no_answer(COMMIT, "ConnectionResetError").outcome == "unknown"
    assert no_answer(READ, "TimeoutError").outcome == "failed"
    assert no_answer(Begin(), "ConnectionRefusedError").outcome == "failed"


def test_rest_calls_name_the_endpoint_not_the_transaction():
    assert rest_call(READ).path == "/v1/txn/t1/read" and rest_call(READ).name == "/v1/txn/[id]/read"
    assert json.loads(rest_call(READ).body) == {"keys": ["k"]}
    assert json.loads(rest_call(Call(Write({"k": None}), "t1")).body) == {"writes": {"k": None}}
    assert rest_call(Abort("t1")).promised == (200, 404, 409)


def _transfer(seen: list[Reply]) -> Callable[[], Program]:
    def program() -> Program:
        reply = yield Read(("a", "b"))
        seen.append(reply)
        yield Write({"a": "1", "b": "2"})
        seen.append((yield Commit()))

    return program


def _scripted(answers: dict[type, Reply]) -> tuple[list[Step], Callable[[Step], Reply]]:
    steps: list[Step] = []

    def call(step: Step) -> Reply:
        steps.append(step)
        kind = type(step.request) if isinstance(step, Call) else type(step)
        return answers.get(kind, Reply("active"))

    return steps, call


def test_an_interactive_transaction_begins_runs_and_commits_without_an_abort():
    seen: list[Reply] = []
    steps, call = _scripted({Begin: Reply("active", txn="t1"), Commit: Reply("committed")})
    assert run(_transfer(seen)(), call) == Reply("committed")
    assert steps == [Begin(), Call(Read(("a", "b")), "t1"), Call(Write({"a": "1", "b": "2"}), "t1"),
                     Call(Commit(), "t1")]
    assert seen[-1] == Reply("committed")  # the commit's reply reaches the program


def test_a_transaction_the_node_did_not_end_is_aborted_and_one_it_ended_is_not():
    # An error answer (here 409 wrong_state) leaves the transaction open at the node, holding its locks.
    steps, call = _scripted({Begin: Reply("active", txn="t1"), Read: Reply("failed", "wrong_state")})
    assert run(_transfer([])(), call).outcome == "failed"
    assert steps[-1] == Abort("t1")
    # No answer at all: the same.
    steps, call = _scripted({Begin: Reply("active", txn="t1"), Read: no_answer(READ, "TimeoutError")})
    run(_transfer([])(), call)
    assert steps[-1] == Abort("t1")
    # An abort is an outcome: the node ended it, nothing to free.
    steps, call = _scripted({Begin: Reply("active", txn="t1"), Read: Reply("aborted", "conflict", True)})
    assert run(_transfer([])(), call) == Reply("aborted", "conflict", True)
    assert not any(isinstance(step, Abort) for step in steps)


def test_a_commit_without_an_answer_is_unknown_and_not_aborted():
    steps, call = _scripted({Begin: Reply("active", txn="t1"), Commit: no_answer(COMMIT, "TimeoutError")})
    assert run(_transfer([])(), call).outcome == "unknown"
    assert not any(isinstance(step, Abort) for step in steps)


def test_a_program_that_raises_has_its_open_transaction_aborted_then_the_error_raised():
    def broken() -> Program:
        yield Read(("a",))
        raise ValueError("account missing")

    steps, call = _scripted({Begin: Reply("active", txn="t1")})
    with pytest.raises(ValueError, match="account missing"):
        run(broken(), call)
    assert steps[-1] == Abort("t1")


def test_a_failed_begin_ends_the_run_with_nothing_to_abort():
    steps, call = _scripted({Begin: Reply("unavailable", "unavailable", True)})
    assert run(_transfer([])(), call) == Reply("unavailable", "unavailable", True)
    assert steps == [Begin()]


async def test_the_async_runner_takes_the_same_steps():
    steps, call = _scripted({Begin: Reply("active", txn="t1"), Commit: Reply("committed")})

    async def async_call(step: Step) -> Reply:
        return call(step)

    assert await run_async(_transfer([])(), async_call) == Reply("committed")
    assert [type(step) for step in steps] == [Begin, Call, Call, Call]


def test_a_program_asking_after_its_commit_is_an_error():
    def greedy() -> Program:
        yield Execute(())
        yield Execute(())

    steps = exchange(greedy())
    assert next(steps) == Call(Execute(()), "")
    with pytest.raises(RuntimeError, match="after its transaction ended"):
        steps.send(Reply("committed"))


def test_load_batches_hold_one_partition_each_and_every_key_once():
    workload = make_workload("ycsb", 3, {"rows_per_partition": 450})
    batches = load_batches(workload)
    keys = [op["key"] for batch in batches for op in batch]
    assert sorted(keys) == sorted(workload.initial_data())
    for batch in batches:
        assert 0 < len(batch) <= LOAD_BATCH_KEY_COUNT_MAX
        assert len({partition_of(op["key"], 3) for op in batch}) == 1, batch[:3]
        assert all(op["op"] == "put" for op in batch)


def test_load_retries_a_batch_until_it_commits_and_gives_up_after_the_bound():
    answers = iter([Reply("aborted", "not_ready", True), no_answer(EXECUTE, "TimeoutError"), Reply("committed")])
    pauses: list[float] = []
    batch = ({"op": "put", "key": "k", "value": "v"},)
    assert load([batch], lambda ops: next(answers), sleep=pauses.append) == 1
    assert len(pauses) == 2 and all(0 <= pause <= load_module.LOAD_PAUSE_S_MAX for pause in pauses)
    calls = []
    with pytest.raises(LoadError, match=rf"did not commit in {LOAD_ATTEMPT_COUNT_MAX} attempts \(last: aborted"):
        load([batch], lambda ops: calls.append(ops) or Reply("aborted", "conflict", True), sleep=lambda s: None)
    assert len(calls) == LOAD_ATTEMPT_COUNT_MAX


async def test_load_async_spreads_the_batches_over_its_loaders(monkeypatch):
    monkeypatch.setattr(load_module, "LOAD_PAUSE_S_BASE", 0.0)
    workload = make_workload("bank", 2, {"accounts": 50})
    batches = load_batches(workload)
    used: list[int] = []

    def loader(index: int) -> Callable[[tuple[dict[str, str], ...]], object]:
        async def execute(ops: tuple[dict[str, str], ...]) -> Reply:
            used.append(index)
            await asyncio.sleep(0)
            return Reply("committed")

        return execute

    assert await load_async(batches, [loader(0), loader(1)]) == 50
    assert sorted(set(used)) == [0, 1]
