"""Strict 2PL lock table: NO_WAIT, WAIT_DIE, shared/exclusive, upgrade, bounded wait, release."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cornus.protocol.locks import Grant, LockMode, LockTable, Policy, _compatible

S, X = LockMode.SHARED, LockMode.EXCLUSIVE


def test_shared_locks_are_compatible_exclusive_conflicts_no_wait() -> None:
    table = LockTable()
    assert table.acquire("a", "k", S, 1, 0) is Grant.GRANTED
    assert table.acquire("b", "k", S, 2, 0) is Grant.GRANTED
    assert table.acquire("c", "k", X, 3, 0) is Grant.ABORT
    assert table.holders("k") == {"a": S, "b": S}


def test_upgrade_of_sole_holder_and_refused_upgrade_with_other_reader() -> None:
    table = LockTable()
    assert table.acquire("a", "k", S, 1, 0) is Grant.GRANTED
    assert table.acquire("a", "k", X, 1, 0) is Grant.GRANTED
    assert table.holders("k") == {"a": X}
    assert table.acquire("a", "k", S, 1, 0) is Grant.GRANTED  # X covers S
    other = LockTable()
    other.acquire("a", "k", S, 1, 0)
    other.acquire("b", "k", S, 2, 0)
    assert other.acquire("a", "k", X, 1, 0) is Grant.ABORT


def test_wait_die_older_waits_younger_dies() -> None:
    table = LockTable(Policy.WAIT_DIE, timeout_ms_wait=50)
    table.register("old", 1)
    table.register("young", 9)
    assert table.acquire("mid", "k", X, 5, 0) is Grant.GRANTED
    assert table.acquire("young", "k", X, 9, 0) is Grant.ABORT
    assert table.acquire("old", "k", X, 1, 0) is Grant.WAITING
    granted = table.release("mid")
    assert [w.txn for w in granted] == ["old"]
    assert table.holders("k") == {"old": X}


def test_bounded_wait_expires() -> None:
    table = LockTable(Policy.WAIT_DIE, timeout_ms_wait=50)
    table.acquire("young", "k", X, 9, 0)
    assert table.acquire("old", "k", S, 1, 10) is Grant.WAITING
    assert table.expire(59) == ([], [])
    expired, granted = table.expire(60)
    assert [w.txn for w in expired] == ["old"] and granted == []
    assert table.release("young") == []


def test_prepared_holder_makes_no_wait_requests_wait() -> None:
    table = LockTable()
    table.acquire("a", "k", X, 1, 0)
    table.mark_prepared("a")
    assert table.acquire("b", "k", S, 2, 0) is Grant.WAITING
    assert [w.txn for w in table.release("a")] == ["b"]


def test_release_frees_everything_of_a_transaction() -> None:
    table = LockTable()
    for key in ("k1", "k2", "k3"):
        assert table.acquire("a", key, X, 1, 0) is Grant.GRANTED
    table.release("a")
    for key in ("k1", "k2", "k3"):
        assert table.holders(key) == {}
        assert table.acquire("b", key, X, 2, 0) is Grant.GRANTED


def test_a_waiter_that_leaves_the_head_unblocks_the_queue_behind_it() -> None:
    # "b" waits for X behind reader "a"; "c" (S) queues behind "b" though S fits "a": FIFO.
    table = LockTable(Policy.WAIT_DIE, timeout_ms_wait=50)
    table.acquire("a", "k", S, 9, 0)
    table.mark_prepared("a")
    assert table.acquire("b", "k", X, 5, 0) is Grant.WAITING
    assert table.acquire("c", "k", S, 3, 0) is Grant.WAITING
    assert [w.txn for w in table.release("b")] == ["c"]  # b gave up: c reads beside a
    assert table.holders("k") == {"a": S, "c": S}

    timed = LockTable(Policy.WAIT_DIE, timeout_ms_wait=50)
    timed.acquire("a", "k", S, 9, 0)
    timed.mark_prepared("a")
    timed.acquire("b", "k", X, 5, 0)
    timed.acquire("c", "k", S, 3, 40)
    expired, granted = timed.expire(50)  # b's wait ran out, c's not yet
    assert [w.txn for w in expired] == ["b"] and [w.txn for w in granted] == ["c"]


_TXNS = ["t0", "t1", "t2", "t3"]
_KEYS = ["k0", "k1", "k2"]
_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("acquire"), st.sampled_from(_TXNS), st.sampled_from(_KEYS), st.sampled_from([S, X])),
        st.tuples(st.just("prepare"), st.sampled_from(_TXNS)),
        st.tuples(st.just("release"), st.sampled_from(_TXNS)),
        st.tuples(st.just("expire"), st.integers(0, 5)),
    ),
    max_size=60,
)


@settings(max_examples=400, deadline=None)
@given(steps=_STEPS, policy=st.sampled_from(list(Policy)))
def test_random_schedules_keep_the_table_consistent(steps: list[tuple[object, ...]], policy: Policy) -> None:
    table = LockTable(policy, timeout_ms_wait=2)
    now_ms = 0
    waiting: set[tuple[str, str]] = set()
    for step in steps:
        if step[0] == "acquire":
            _, txn, key, mode = step
            if (txn, key) in waiting or any(t == txn for t, _ in waiting):
                continue  # a transaction blocks on one request at a time
            grant = table.acquire(txn, key, mode, _TXNS.index(txn), now_ms)  # type: ignore[arg-type]
            if grant is Grant.WAITING:
                waiting.add((txn, key))  # type: ignore[arg-type]
        elif step[0] == "prepare":
            table.mark_prepared(step[1])  # type: ignore[arg-type]
        elif step[0] == "release":
            granted = table.release(step[1])  # type: ignore[arg-type]
            waiting = {(t, k) for t, k in waiting if t != step[1]} - {(w.txn, w.key) for w in granted}
        else:
            now_ms += step[1]  # type: ignore[operator]
            expired, granted = table.expire(now_ms)
            waiting -= {(w.txn, w.key) for w in expired + granted}
        queued = {(w.txn, w.key) for entry in table._entries.values() for w in entry.waiters}
        assert queued == waiting, "every waiter is told when it is granted or expires, exactly once"
        for key, entry in table._entries.items():
            modes = list(entry.holders.values())
            assert entry.holders, f"{key}: an entry without holders must be gone"
            assert len(modes) == 1 or all(m is S for m in modes), f"{key}: incompatible holders {entry.holders}"
            if entry.waiters:
                head = entry.waiters[0]
                assert not _compatible(entry, head.txn, head.mode), f"{key}: a grantable waiter was left waiting"
        assert table._keys_waited == {k for k, e in table._entries.items() if e.waiters}


def test_a_retaken_read_is_shared_and_never_weakens_a_retaken_write() -> None:
    table = LockTable()
    table.retake("a", "k", S)
    assert table.acquire("b", "k", S, 2, 0) is Grant.GRANTED
    assert table.acquire("c", "k", X, 3, 0) is Grant.ABORT
    table.retake("d", "j")
    table.retake("d", "j", S)  # a redo naming a key both ways locks it as written
    assert table.holders("j") == {"d": X}
