"""Strict 2PL lock table: NO_WAIT, WAIT_DIE, shared/exclusive, upgrade, bounded wait, release."""

from __future__ import annotations

from cornus.protocol.locks import Grant, LockMode, LockTable, Policy

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
    assert table.expire(59) == []
    assert [w.txn for w in table.expire(60)] == ["old"]
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
