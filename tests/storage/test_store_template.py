"""The LogStore template (storage_adapters/contract.py) on every backend, against its real service:
bad arguments are refused by the base before the backend does any I/O, for every method; the
deletes of one event-loop tick are coalesced into batches where the backend can carry several in
one request, and every caller still gets its own answer, its own Fenced and its own deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest

from storage_adapters.contract import (
    IDENTITY_PAGE_COUNT_MAX,
    OWNER_READ_COUNT_MAX,
    SCAN_PAGE_COUNT_MAX,
    Fence,
    LogId,
    LogOnceResult,
    Ownership,
    RecordBody,
    TxnState,
)
from storage_adapters.errors import Fenced, StorageError, StorageUnavailable, ValidationError
from storage_adapters.store import (
    DELETE_BATCH_COUNT_MAX,
    CallDeadline,
    DeleteRequest,
    LogStore,
    boot_clock_s,
    call_deadline_at,
)
from tests.unused_store import UnusedStore

VOTE, COMMIT, ABORT = TxnState.VOTE_YES, TxnState.COMMIT, TxnState.ABORT
LEASE_MS = 10_000
# The backend steps the template may call; a test replaces them on one store to watch for I/O.
IO_STEPS = (
    "_log_once", "_log", "_read", "_scan_page", "_read_data", "_apply_redo", "_delete", "_delete_many",
    "_read_owners", "_write_owner", "_list_identities",
)


def body(partition: str) -> RecordBody:
    return RecordBody((partition,), "node-0", b"redo")


class _Reached(Exception):
    """A backend step was called: the template let the call through to I/O."""


def _trap_io(store: LogStore) -> list[str]:
    """Replace `store`'s backend steps with ones that record their name and raise _Reached."""
    reached: list[str] = []
    for name in IO_STEPS:

        async def step(*_args: object, name: str = name) -> Any:
            reached.append(name)
            raise _Reached(name)

        setattr(store, name, step)
    return reached


Call = Callable[[LogStore], Awaitable[Any]]


def _calls(ns: str) -> dict[str, tuple[Call, list[Call]]]:
    """Per public method: one well-formed call, and calls that validation must refuse."""
    log, coordinator = LogId.partition(ns), LogId.coordinator(ns)
    first = Ownership(ns, "n1", 1, 1, LEASE_MS)
    fence, other_fence = Fence(ns, "n1", 1), Fence(ns + "x", "n1", 1)
    return {
        "log_once": (lambda s: s.log_once(log, "t", VOTE, body(ns), fence), [
            lambda s: s.log_once(log, "a/b", VOTE, body(ns)),
            lambda s: s.log_once(ns, "t", VOTE, body(ns)),  # type: ignore[arg-type]
            lambda s: s.log_once(log, "t", "VOTE_YES", body(ns)),  # type: ignore[arg-type]
            lambda s: s.log_once(log, "t", VOTE, {"redo": b""}),  # type: ignore[arg-type]
            lambda s: s.log_once(log, "t", VOTE, body(ns), other_fence),
            lambda s: s.log_once(coordinator, "t", VOTE, body(ns), fence),
        ]),
        "log": (lambda s: s.log(log, "t", COMMIT, None, fence), [
            lambda s: s.log(log, "", COMMIT),
            lambda s: s.log(log, "t", COMMIT, {"redo": b""}),  # type: ignore[arg-type]
            lambda s: s.log(log, "t", COMMIT, None, (ns, "n1", 1)),  # type: ignore[arg-type]
        ]),
        "read": (lambda s: s.read(log, "t"), [
            lambda s: s.read(log, "t" * 200),
            lambda s: s.read("p.x", "t"),  # type: ignore[arg-type]
        ]),
        "scan_unfinished": (lambda s: s.scan_unfinished(log, 10, "t"), [
            lambda s: s.scan_unfinished(log, 0),
            lambda s: s.scan_unfinished(log, True),  # type: ignore[arg-type]
            lambda s: s.scan_unfinished(log, SCAN_PAGE_COUNT_MAX + 1),
            lambda s: s.scan_unfinished(log, 10, "a{b}"),
        ]),
        "scan_unfinished_page": (lambda s: s.scan_unfinished_page(log, 10, "t"), [
            lambda s: s.scan_unfinished_page(log, 0),
            lambda s: s.scan_unfinished_page(log, 10, "a{b}"),
            lambda s: s.scan_unfinished_page("p.x", 10),  # type: ignore[arg-type]
        ]),
        "read_data": (lambda s: s.read_data(ns, ["k"]), [
            lambda s: s.read_data(ns, "k"),
            lambda s: s.read_data("p/x", ["k"]),
            lambda s: s.read_data(ns, [""]),
            # Found by audit (2026-11-27): a lone surrogate raised UnicodeEncodeError, not the
            # contract's ValidationError, from every backend.
            lambda s: s.read_data(ns, ["a\udc80"]),
        ]),
        "apply_redo": (lambda s: s.apply_redo(ns, "t", {"k": b"v"}, fence), [
            lambda s: s.apply_redo(ns, "t", {"k": "text"}),  # type: ignore[dict-item]
            lambda s: s.apply_redo(ns, "t", [("k", b"v")]),  # type: ignore[arg-type]
            lambda s: s.apply_redo(ns, "t", {"\ud800": b"v"}),
            lambda s: s.apply_redo(ns, "t", {"k": b"v"}, other_fence),
        ]),
        "delete": (lambda s: s.delete(log, "t", fence), [
            lambda s: s.delete(log, "bad txn"),
            lambda s: s.delete(log, "t", other_fence),
            lambda s: s.delete(coordinator, "t", fence),
        ]),
        "read_owners": (lambda s: s.read_owners([ns]), [
            lambda s: s.read_owners(ns),
            lambda s: s.read_owners(["p/x"]),
            lambda s: s.read_owners([f"p{i}" for i in range(OWNER_READ_COUNT_MAX + 1)]),
        ]),
        "write_owner": (lambda s: s.write_owner(None, first), [
            lambda s: s.write_owner(None, Ownership(ns, "n1", 1, 2, LEASE_MS)),
            lambda s: s.write_owner(first, Ownership(ns, "n2", 1, 2, LEASE_MS)),
            lambda s: s.write_owner((1, 1), first),  # type: ignore[arg-type]
        ]),
        "list_identities": (lambda s: s.list_identities(ns, 10), [
            lambda s: s.list_identities("", 0),
            lambda s: s.list_identities("", IDENTITY_PAGE_COUNT_MAX + 1),
            lambda s: s.list_identities("", True),  # type: ignore[arg-type]
            lambda s: s.list_identities("a/b"),
            lambda s: s.list_identities(None),  # type: ignore[arg-type]
        ]),
    }


# The public methods whose backend step is named otherwise: both scans are pages of `_scan_page`.
_STEP_OF = {"scan_unfinished": "scan_page", "scan_unfinished_page": "scan_page"}


async def test_bad_arguments_are_refused_by_the_base_before_any_io(store: LogStore, ns: str) -> None:
    reached = _trap_io(store)
    for method, (good, bads) in _calls(ns).items():
        for index, bad in enumerate(bads):
            with pytest.raises(ValidationError):
                await bad(store)
                pytest.fail(f"{method} bad call {index}: accepted")
            assert reached == [], f"{method} bad call {index} reached {reached}"
        # The same method with good arguments goes to the backend's I/O, so the trap is where
        # the template would do I/O, and the refusals above came before it.
        with pytest.raises(_Reached):
            await good(store)
        step = _STEP_OF.get(method, method)
        assert reached and reached[-1].removeprefix("_").startswith(step), (method, reached)
        reached.clear()


# --- coalesced deletes ----------------------------------------------------------------------------


def _record_batches(store: LogStore) -> list[int]:
    """The size of every `_delete_many` batch `store` sends from now on."""
    sizes: list[int] = []
    send = store._delete_many

    async def recorded(requests: Sequence[DeleteRequest]) -> list[bool | StorageError]:
        sizes.append(len(requests))
        return await send(requests)

    store._delete_many = recorded  # type: ignore[method-assign]
    return sizes


async def test_concurrent_deletes_each_get_their_own_answer_and_fence(store: LogStore, ns: str) -> None:
    log, other, coordinator = LogId.partition(ns), LogId.partition(ns + "-b"), LogId.coordinator(ns)
    first = Ownership(ns, "n1", 1, 1, LEASE_MS)
    assert (await store.write_owner(None, first)).written
    taken = Ownership(ns, "n2", 2, 2, LEASE_MS)  # n2 took the partition: n1's fence is stale
    assert (await store.write_owner(first, taken)).written
    current, stale = taken.fence(), first.fence()
    await asyncio.gather(
        *(store.log_once(log, f"t{index}", ABORT, body(ns)) for index in range(5)),
        store.log_once(other, "u", COMMIT, body(ns)),
        store.log_once(coordinator, "c", COMMIT, body(ns)),
    )
    batches = _record_batches(store) if store.coalesces_deletes else []
    calls: list[tuple[str, Awaitable[bool]]] = [
        ("unfenced", store.delete(log, "t0")),
        ("fenced", store.delete(log, "t1", current)),
        ("stale fence", store.delete(log, "t2", stale)),
        ("absent", store.delete(log, "absent")),
        ("absent, fenced", store.delete(log, "absent", current)),
        ("absent, stale fence", store.delete(log, "absent2", stale)),
        ("other partition", store.delete(other, "u")),
        ("stale fence again", store.delete(log, "t3", stale)),
        ("coordinator log", store.delete(coordinator, "c")),
        ("fenced, last", store.delete(log, "t4", current)),
    ]
    outcomes = dict(zip(
        [label for label, _ in calls], await asyncio.gather(*(call for _, call in calls), return_exceptions=True),
        strict=True,
    ))
    for label in ("unfenced", "fenced", "other partition", "coordinator log", "fenced, last"):
        assert outcomes[label] is True, (label, outcomes[label])
    for label in ("absent", "absent, fenced"):
        assert outcomes[label] is False, (label, outcomes[label])
    for label in ("stale fence", "absent, stale fence", "stale fence again"):
        refused = outcomes[label]
        assert isinstance(refused, Fenced), (label, refused)
        assert (refused.fence, refused.stored) == (stale, taken), label
    # Only the refused ones' records are left.
    assert await store.read(log, "t2") is not None and await store.read(log, "t3") is not None
    for log_of, txn in ((log, "t0"), (log, "t1"), (log, "t4"), (other, "u"), (coordinator, "c")):
        assert await store.read(log_of, txn) is None, txn
    if store.coalesces_deletes:
        assert batches == [len(calls)], f"one batch of all {len(calls)} deletes expected, sent {batches}"


async def test_a_burst_past_the_batch_bound_goes_in_bounded_batches(store: LogStore, ns: str) -> None:
    log = LogId.partition(ns)
    count = DELETE_BATCH_COUNT_MAX + 2
    await asyncio.gather(*(store.log_once(log, f"t{index:03}", ABORT, body(ns)) for index in range(0, count, 2)))
    batches = _record_batches(store) if store.coalesces_deletes else []
    deleted = await asyncio.gather(*(store.delete(log, f"t{index:03}") for index in range(count)))
    assert deleted == [index % 2 == 0 for index in range(count)]
    assert await store.scan_unfinished(log) == []
    assert await store.read(log, "t000") is None
    if store.coalesces_deletes:
        assert sorted(batches) == [2, DELETE_BATCH_COUNT_MAX], batches


async def test_a_delete_cancelled_before_its_batch_left_is_not_sent(store: LogStore, ns: str) -> None:
    log = LogId.partition(ns)
    await store.log_once(log, "kept", ABORT, body(ns))
    await store.log_once(log, "gone", ABORT, body(ns))
    kept = asyncio.create_task(store.delete(log, "kept"))
    gone = asyncio.create_task(store.delete(log, "gone"))
    await asyncio.sleep(0)  # both are waiting for their batch, which leaves on the next turn
    kept.cancel()
    assert await gone is True
    with pytest.raises(asyncio.CancelledError):
        await kept
    if store.coalesces_deletes:
        # Not sent at all: a delete whose caller gave up must not land later.
        assert await store.read(log, "kept") is not None


# --- the template without a service: deadlines ------------------------------------------------------

DEADLINE_MS = 300
# What a deadline may overrun by on a loaded 2-core machine (event-loop and scheduling delays).
SLACK_S = 1.0


class _SilentStore(UnusedStore):
    """A backend whose deletes never answer, and that says it coalesces them."""

    backend_name = "silent"
    coalesces_deletes = True

    def __init__(self) -> None:
        super().__init__(DEADLINE_MS)
        self.batches: list[list[str]] = []

    async def _delete_many(self, requests: Sequence[DeleteRequest]) -> list[bool | StorageError]:
        self.batches.append([request.txn for request in requests])
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def _log_once(self, log: LogId, txn: str, state: TxnState, body: RecordBody,
                        fence: Fence | None) -> LogOnceResult:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_each_coalesced_delete_times_out_at_its_own_deadline() -> None:
    store = _SilentStore()
    log = LogId.partition("p")

    async def timed_delete(txn: str) -> float:
        started = time.monotonic()
        with pytest.raises(StorageUnavailable, match="did not answer within"):
            await store.delete(log, txn)
        return time.monotonic() - started

    early = [asyncio.create_task(timed_delete(f"early{index}")) for index in range(3)]
    await asyncio.sleep(DEADLINE_MS / 2000)  # a later tick: a batch of its own, a deadline of its own
    late = asyncio.create_task(timed_delete("late"))
    waited = await asyncio.gather(*early, late)
    assert store.batches == [["early0", "early1", "early2"], ["late"]]
    for elapsed in waited:
        assert DEADLINE_MS / 1000 <= elapsed + 0.01 < DEADLINE_MS / 1000 + SLACK_S, waited
    # The batches' own requests were bounded too: nothing is left running.
    await asyncio.sleep(0)
    assert not store._delete_batches


async def test_a_call_that_does_not_answer_is_unavailable_at_the_deadline() -> None:
    store = _SilentStore()
    started = time.monotonic()
    with pytest.raises(StorageUnavailable, match="silent log_once did not answer within 300 ms"):
        await store.log_once(LogId.partition("p"), "t", VOTE, body("p"))
    assert time.monotonic() - started < DEADLINE_MS / 1000 + SLACK_S


class _EagerStore(UnusedStore):
    """A backend that sends its request before it first waits (a client library writing to a
    pooled connection does), and answers at once."""

    backend_name = "eager"
    coalesces_deletes = True

    def __init__(self) -> None:
        super().__init__(DEADLINE_MS)
        self.sent: list[str] = []

    async def _log_once(self, log: LogId, txn: str, state: TxnState, body: RecordBody,
                        fence: Fence | None) -> LogOnceResult:
        self.sent.append(txn)
        return LogOnceResult(state, created=True)

    async def _delete_many(self, requests: Sequence[DeleteRequest]) -> list[bool | StorageError]:
        self.sent.extend(request.txn for request in requests)
        return [True] * len(requests)


@pytest.mark.parametrize("call", ["log_once", "delete"])
async def test_a_call_whose_deadline_passed_before_it_started_never_reaches_the_backend(call: str) -> None:
    """Found by audit (2026-11-27): the template started the backend's call whatever was left of a
    deadline fixed earlier (call_deadline_at: a lease gate's, before a stall or a suspend), and
    counted on its timer to cancel the call at its first wait. botocore on a pooled connection
    sent a whole conditional PutItem before that; DynamoDB checks no deadline of ours, so a write
    its caller was told had failed landed."""
    store = _EagerStore()
    log = LogId.partition("p")
    passed = CallDeadline(asyncio.get_running_loop().time() - 0.001, boot_clock_s() - 0.001)
    with call_deadline_at(passed), pytest.raises(StorageUnavailable, match="deadline passed"):
        if call == "log_once":
            await store.log_once(log, "t", VOTE, body("p"))
        else:
            await store.delete(log, "t")
    assert store.sent == []


async def test_each_coalesced_delete_that_fails_raises_an_exception_of_its_own() -> None:
    """Found by audit (2026-11-28, second): a coalesced request that failed handed one exception
    object to every caller in it (up to DELETE_BATCH_COUNT_MAX); each raise added its frames to
    that one traceback, which kept them all alive. Each caller gets its own, as the emulator's and
    Redis's failures give."""

    class Failing(_SilentStore):
        async def _delete_many(self, requests: Sequence[DeleteRequest]) -> list[bool | StorageError]:
            self.batches.append([request.txn for request in requests])
            raise StorageUnavailable("the backend did not take the request")

    store = Failing()
    log = LogId.partition("p")

    async def failed(txn: str) -> BaseException:
        with pytest.raises(StorageUnavailable) as raised:
            await store.delete(log, txn)
        return raised.value

    errors = await asyncio.gather(*(failed(f"t{index}") for index in range(3)))
    assert store.batches == [["t0", "t1", "t2"]]
    assert len({id(error) for error in errors}) == 3
    assert len({str(error) for error in errors}) == 1
