"""The execution phase's rules in the core (cornus.protocol.execution), one at a time; the
simulator explores them together (test_simulator_finds_old_bugs.py, test 9)."""

from __future__ import annotations

from cornus.protocol.execution import (
    REFRESH_DIVISOR,
    REFRESH_RETRY_DIVISOR,
    Execution,
    PartitionExecutions,
    Refusal,
    execution_idle_ms,
    refresh_due,
    refresh_unanswered_ms,
)
from cornus.protocol.locks import Grant, LockMode, Policy
from cornus.protocol.txn_ids import Protocol, client_txn_id, is_client_chosen
from cornus.runtime import redo as runtime_redo
from cornus.sim import redo

T1, T2 = "1.c0.sim.0.cornus", "2.c0.sim.1.cornus"


def _table() -> PartitionExecutions[int]:
    return PartitionExecutions("p0", redo)


def _begin(table: PartitionExecutions[int], txn: str, now_ms: int = 0, continued: bool = False) -> Execution[int]:
    execution = table.begin(txn, "c0", now_ms, continued=continued)
    assert isinstance(execution, Execution)
    return execution


def test_a_read_fills_the_cache_only_while_its_execution_is_current() -> None:
    table = _table()
    stale = _begin(table, T1)
    table.abort(T1)  # dropped while its read was out
    table.read_landed(T1, stale, {"k0": 1})
    assert table.cached("k0") == (False, None)
    current = _begin(table, T2)
    table.read_landed(T2, current, {"k0": 2})
    assert table.cached("k0") == (True, 2)


def test_an_aborted_transaction_never_starts_again_and_lost_state_is_refused() -> None:
    table = _table()
    _begin(table, T1)
    table.abort(T1)
    assert table.begin(T1, "c0", 1) is Refusal.ABORTED
    assert table.begin(T2, "c0", 1, continued=True) is Refusal.STATE_LOST
    assert table.begin(T2, "c0", 2) is Refusal.ABORTED  # the refusal is remembered


def test_an_idle_execution_goes_only_when_no_machine_runs_it() -> None:
    table = _table()
    _begin(table, T1, now_ms=0)
    assert table.lock(T1, "k0", LockMode.EXCLUSIVE, 0) is Grant.GRANTED
    assert table.idle(100, 50) == [T1]
    assert table.idle_out(T1, busy=True) is None
    assert table.locks.holds_any(T1)
    assert table.idle_out(T1, busy=False) == []
    assert not table.locks.holds_any(T1) and T1 not in table.executions
    # Its coordinator's refresh (a continued request) never starts it again.
    assert table.begin(T1, "c0", 101, continued=True) is Refusal.ABORTED


def test_a_coordinator_refreshes_partitions_its_requests_left_long_before_their_owners_drop() -> None:
    assert execution_idle_ms(1_000) == 2_000
    requested_ms = {"p0": 0, "p1": 500, "p2": 900}
    assert refresh_due(requested_ms, 500, 1_000) == []  # none older than half the timeout
    assert refresh_due(requested_ms, 501, 1_000) == ["p0"]
    assert refresh_due(requested_ms, 1_401, 1_000) == ["p0", "p1", "p2"]
    # Due more than a whole idle timeout before the owner's drop: room for the sweeps and a round trip.
    assert execution_idle_ms(1_000) - 1_000 > 1_000 // REFRESH_DIVISOR


def test_a_refresh_that_got_no_answer_is_due_again_a_retry_later_not_at_every_sweep() -> None:
    """Found by review: a refresh with no answer (its owner down) was due again at the next sweep,
    every 200 ms, for every transaction holding an execution there."""
    sent_ms = 600  # p0's last request left at 0; its refresh at 600 got no answer
    recorded_ms = refresh_unanswered_ms(0, sent_ms, 1_000)
    assert refresh_due({"p0": recorded_ms}, sent_ms + 1_000 // REFRESH_RETRY_DIVISOR, 1_000) == []
    assert refresh_due({"p0": recorded_ms}, sent_ms + 1_000 // REFRESH_RETRY_DIVISOR + 1, 1_000) == ["p0"]
    # Retried well before the owner's drop (2 000 ms after the last request that reached it).
    assert sent_ms + 1_000 // REFRESH_RETRY_DIVISOR < execution_idle_ms(1_000)


def test_the_end_of_an_execution_carries_its_writes_and_reads() -> None:
    table = _table()
    execution = _begin(table, T1)
    execution.writes["k0"] = 5
    execution.reads["k1"] = None
    executed = table.ended(T1, read_only=False)
    assert executed is not None and redo.decode(executed.redo) == {"k0": 5}
    assert redo.lock_keys(executed.redo) == (["k0"], ["k1"])
    assert T1 in table.executions  # kept, with its locks, until the machine releases it
    assert table.ended(T2, read_only=True) is None


def test_the_cache_keeps_to_its_bytes_evicting_the_least_recently_used() -> None:
    """Found by review: the cache was bounded by its key count only, and values go up to 64 KiB,
    so one partition's cache could reach gigabytes (4,000 values of 63 KiB: 262 MB in a node)."""
    value_bytes = 64 * 1024
    bytes_max = 5 * (value_bytes + 200)  # five entries, each with its key and overhead
    table = PartitionExecutions("p0", runtime_redo, cache_bytes_max=bytes_max)
    for index in range(20):
        table.cache_redo(runtime_redo.encode({f"k{index}": bytes(value_bytes)}))
        assert table.cache_bytes <= bytes_max
    assert table.cached("k19") == (True, bytes(value_bytes))
    assert table.cached("k0") == (False, None)
    table.cached("k15")  # used again: the oldest now is k16
    table.cache_redo(runtime_redo.encode({"k20": bytes(value_bytes)}))
    assert table.cached("k15")[0] and not table.cached("k16")[0]
    table.cache_redo(runtime_redo.encode({"k20": None}))  # a delete replaces the value, and its bytes
    assert table.cache_bytes <= bytes_max and table.cached("k20") == (True, None)
    table.forget_cache()
    assert table.cache_bytes == 0 and not table.cached("k19")[0]


def test_a_withdrawn_first_request_leaves_nothing_and_its_transaction_may_begin_again() -> None:
    """A first request refused after it began (its reads too large to answer) is withdrawn: its
    locks go, with the waiter they held granted, its reserved bytes come back, and nothing is
    remembered, so its coordinator's corrected request starts the transaction afresh. A client-
    chosen id too (release would remember it as ended)."""
    older = "0.c0.sim.9.cornus"  # WAIT_DIE lets only an older transaction wait
    for txn in (T1, client_txn_id(1, "c0", "ab" * 8, Protocol.CORNUS)):
        assert is_client_chosen(txn) is (txn != T1)
        table = PartitionExecutions("p0", redo, Policy.WAIT_DIE)
        execution = _begin(table, txn)
        assert table.reserve(execution, 100)
        assert table.lock(txn, "k0", LockMode.EXCLUSIVE, 0) is Grant.GRANTED
        _begin(table, older)
        assert table.lock(older, "k0", LockMode.SHARED, 0) is Grant.WAITING
        granted = table.withdraw(txn, execution)
        assert [waiter.txn for waiter in granted] == [older]
        assert txn not in table.executions and not table.locks.holds_any(txn)
        assert table.buffered_bytes == 0
        assert _begin(table, txn, now_ms=1) is not execution


def test_a_client_id_begun_before_the_tenure_may_have_run_under_the_earlier_one() -> None:
    """Found by audit (2026-11-28, third): a client-chosen id that ran and ended at a partition's
    earlier owner (or its earlier tenure) reached the new one from another process of its
    coordinator's node; `_ended` lives per tenure, so it ran again, and its vote met the decision.
    A first request of a client id begun before the tenure (plus two slacks) is refused now; one
    begun after, a node-made id, and a continued request are not."""
    table = PartitionExecutions("p0", redo, tenure_began_ms=10_000, clock_slack_ms=20)
    before = client_txn_id(10_040, "c0", "0123456789abcdef", Protocol.CORNUS)
    after = client_txn_id(10_041, "c0", "0123456789abcdef", Protocol.CORNUS)
    assert table.begin(before, "c0", 10_100) is Refusal.BEFORE_TENURE
    assert isinstance(table.begin(after, "c0", 10_100), Execution)
    assert isinstance(table.begin("9000.c0.a1b2c3.1.cornus", "c0", 10_100), Execution)
    # No tenure told (a unit test's table, or a first owner ever): nothing to mind.
    assert isinstance(PartitionExecutions("p0", redo).begin(before, "c0", 10_100), Execution)
