"""The workload definitions without a cluster: each program is run against an in-memory key-value
store that executes transactions one at a time (so every one commits), then the workload's own
invariant check must pass; and the same check must catch a store someone tampered with. Also the
shape of what each workload draws: YCSB's request count, read fraction, remote probability,
read-only percentage and Zipfian skew; key placement; knob validation."""

from __future__ import annotations

import collections
import random
from collections.abc import Sequence

import pytest

from cornus.runtime.keys import partition_of
from loadtests.workloads import WORKLOAD_KEY_COUNT_MAX, last_writes, make_workload
from loadtests.workloads.base import Commit, Execute, Read, Reply, Txn, Workload, WorkloadError, Write, Zipf
from loadtests.workloads.last_writes import LastWrites


class MemoryStore:
    """Runs a transaction program to its end against a dict: the serial execution every
    workload's invariants must hold under."""

    def __init__(self, data: dict[str, str]) -> None:
        self.data = dict(data)

    def run(self, txn: Txn) -> Reply:
        program = txn.program()
        request = next(program)
        pending: dict[str, str | None] = {}
        while True:
            if isinstance(request, Execute):
                reads = {}
                for op in request.ops:
                    if op["op"] == "get":
                        reads[op["key"]] = self.data.get(op["key"])
                    else:
                        self.data[op["key"]] = op["value"]
                reply = Reply("committed", values=reads)
            elif isinstance(request, Read):
                reply = Reply("active", values={key: self.data.get(key) for key in request.keys})
            elif isinstance(request, Write):
                pending.update(request.writes)
                reply = Reply("active")
            else:
                assert isinstance(request, Commit)
                for key, value in pending.items():
                    if value is None:
                        self.data.pop(key, None)
                    else:
                        self.data[key] = value
                reply = Reply("committed")
            try:
                request = program.send(reply)
            except StopIteration:
                assert reply.committed, "a program returns only after its final request"
                return reply

    def read(self, keys: Sequence[str]) -> dict[str, str | None]:
        return {key: self.data.get(key) for key in keys}


def _run(workload: Workload, count: int, clients: int = 4) -> MemoryStore:
    store = MemoryStore(workload.initial_data())
    rng = random.Random(7)
    for index in range(count):
        store.run(workload.next_txn(rng, index % clients))
    return store


@pytest.mark.parametrize(("name", "knobs"), [
    ("ycsb", {}), ("tpcc", {"warehouses": 4}), ("bank", {"audit_clients": 1}), ("uniform", {}),
])
def test_serial_runs_keep_every_invariant(name, knobs):
    workload = make_workload(name, 3, knobs)
    store = _run(workload, 300)
    assert workload.check(store.read) == []


def test_tpcc_check_catches_a_lost_payment_and_a_lost_order():
    workload = make_workload("tpcc", 2, {"warehouses": 2})
    store = _run(workload, 200)
    warehouse = workload.warehouse_key(0)
    ytd, tax = store.data[warehouse].split("|")
    store.data[warehouse] = f"{int(ytd) + 1}|{tax}"
    district = workload.district_key(1, 3)
    d_ytd, d_tax, next_order = store.data[district].split("|")
    store.data[district] = f"{d_ytd}|{d_tax}|{int(next_order) + 1}"
    violations = workload.check(store.read)
    assert any("warehouse 0" in v and "condition 1" in v for v in violations), violations
    assert any("district 1.3" in v for v in violations), violations


def test_bank_check_catches_money_created():
    workload = make_workload("bank", 3)
    store = _run(workload, 50)
    store.data[workload.accounts[5]] = str(int(store.data[workload.accounts[5]]) + 1)
    assert workload.check(store.read) == [f"the balances add up to {workload.total + 1}, not {workload.total}"]


def _written_keys(workload: Workload, store: MemoryStore) -> list[str]:
    """Keys a run's committed writes changed (their value is no longer the loaded one)."""
    initial = workload.initial_data()
    return sorted(key for key, value in store.data.items() if value != initial[key])


@pytest.mark.parametrize("name", ["ycsb", "uniform"])
def test_the_last_write_check_catches_a_lost_a_corrupted_and_a_vanished_commit(name):
    workload = make_workload(name, 3, {"rows_per_partition": 50} if name == "ycsb" else {})
    store = _run(workload, 200)
    lost, corrupted, vanished = _written_keys(workload, store)[:3]
    store.data[lost] = workload.initial_data()[lost]  # as if the commit never reached storage
    store.data[corrupted] = store.data[corrupted][:-1] + "?"
    del store.data[vanished]
    violations = workload.check(store.read)
    assert len(violations) == 3, violations
    assert any(f"key {lost} holds '{'y' if name == 'ycsb' else 'x'}" in v for v in violations), violations
    assert any(f"key {corrupted} holds" in v for v in violations), violations
    assert any(f"key {vanished} holds nothing" in v for v in violations), violations


def test_the_last_write_check_catches_an_abort_that_left_its_value():
    workload = make_workload("ycsb", 2, {"rows_per_partition": 50, "read_fraction": 0, "requests_per_txn": 3})
    store = MemoryStore(workload.initial_data())
    rng = random.Random(1)
    for _ in range(20):
        store.run(workload.next_txn(rng, 0))
    txn = workload.next_txn(rng, 0)
    program = txn.program()
    ops = next(program).ops
    for op in ops:
        store.data[op["key"]] = op["value"]  # applied, yet the client is told it aborted
    with pytest.raises(StopIteration):
        program.send(Reply("aborted", "conflict", True))
    assert len(workload.check(store.read)) == len(ops)


def test_writes_that_overlapped_may_end_either_way_but_an_overwritten_one_may_not():
    tracker = LastWrites("init")

    def holds(value: str) -> list[str]:
        return tracker.check(lambda keys: dict.fromkeys(keys, value))

    # Replies arrive in any order: c (4..5) started after a (0..2) and b (1..3) ended.
    tracker.record({"k": "c"}, "committed", 4.0, 5.0)
    tracker.record({"k": "a"}, "committed", 0.0, 2.0)
    tracker.record({"k": "b"}, "committed", 1.0, 3.0)
    assert holds("c") == []
    assert holds("a") and holds("b") and holds("init")
    tracker.record({"k": "d"}, "committed", 4.5, 6.0)  # overlapped c: either may be last
    assert holds("c") == [] and holds("d") == []
    tracker.record({"k": "e"}, "aborted", 7.0, 8.0)
    assert holds("e") and holds("d") == []


def test_a_write_whose_outcome_is_unknown_leaves_its_key_unchecked_and_the_keys_tracked_are_bounded(monkeypatch):
    monkeypatch.setattr(last_writes, "CHECKED_KEY_COUNT_MAX", 3)
    tracker = LastWrites("init")
    tracker.record({"k0": "a", "k1": "a"}, "committed", 0.0, 1.0)
    tracker.record({"k1": "b"}, "unknown", 2.0, 3.0)
    tracker.record({"k2": "c", "k3": "c", "k4": "c"}, "committed", 2.0, 3.0)
    read: list[str] = []
    assert tracker.check(lambda keys: read.extend(keys) or {"k0": "a", "k2": "c"}) == []
    assert sorted(read) == ["k0", "k2"] and tracker.unchecked_keys == 1 and tracker.untracked_writes == 2


def test_keys_land_on_the_partition_their_workload_chose():
    ycsb = make_workload("ycsb", 4)
    for partition in range(4):
        assert partition_of(ycsb.row_key(17, partition), 4) == f"p{partition}"
    tpcc = make_workload("tpcc", 3, {"warehouses": 5})
    for warehouse in range(5):
        assert partition_of(tpcc.stock_key(warehouse, 9), 3) == f"p{warehouse % 3}"


def test_ycsb_draws_the_paper_shape():
    workload = make_workload("ycsb", 4, {"rows_per_partition": 100_000})
    rng = random.Random(3)
    txns = [workload.next_txn(rng, client=1) for _ in range(4000)]
    programs = [next(txn.program()) for txn in txns]
    ops = [op for request in programs for op in request.ops]
    # 16 requests, less a duplicate key now and then (dropped, as Sundial does).
    assert sum(len(request.ops) == 16 for request in programs) > 0.99 * len(programs)
    reads = sum(op["op"] == "get" for op in ops) / len(ops)
    assert 0.47 < reads < 0.53
    remote = sum(partition_of(op["key"], 4) != "p1" for op in ops) / len(ops)
    assert 0.04 < remote < 0.06
    distributed = sum(txn.distributed for txn in txns) / len(txns)
    assert abs(distributed - (1 - 0.95 ** 16)) < 0.04
    assert all(txn.home == "p1" for txn in txns)


def test_ycsb_read_only_percentage_and_read_fraction():
    rng = random.Random(5)
    workload = make_workload("ycsb", 2, {"read_only_perc": 30})
    share = sum(workload.next_txn(rng, 0).read_only for _ in range(3000)) / 3000
    assert 0.27 < share < 0.33
    everything_read = make_workload("ycsb", 2, {"read_fraction": 1})
    assert all(everything_read.next_txn(rng, 0).read_only for _ in range(100))


def test_zipf_skews_toward_the_first_ranks():
    rng = random.Random(11)
    # One generator each (as a workload keeps one): building one sums 1,000 powers, and a
    # generator built per draw made this test 40 million of them (20 s of a loaded CI run).
    uniform_ranks, skewed_ranks = Zipf(1000, 0.0), Zipf(1000, 0.99)
    uniform = collections.Counter(uniform_ranks.next(rng) for _ in range(20_000))
    skewed = collections.Counter(skewed_ranks.next(rng) for _ in range(20_000))
    assert max(uniform.values()) < 60
    assert skewed[0] > 0.1 * 20_000 and skewed[0] > skewed[1] > skewed[10]
    assert all(0 <= rank < 1000 for rank in skewed)


@pytest.mark.parametrize(("name", "knobs", "message"), [
    ("ycsb", {"theta": 1.0}, "theta must be a number in [0, 0.99]"),
    ("ycsb", {"read_fraction": "half"}, "read_fraction must be a number"),
    ("ycsb", {"requests_per_txn": 0}, "requests_per_txn must be an integer in 1..64"),
    ("tpcc", {"warehouses": 0}, "warehouses must be an integer in 1..256"),
    ("bank", {"accounts": 5000, "audit_clients": 1}, "accounts must be at most 1000"),
    ("bank", {"shards": 3}, "bank has no knob shards"),
    ("nosuch", {}, "no workload 'nosuch'"),
])
def test_bad_knobs_are_refused_by_name(name, knobs, message):
    with pytest.raises(WorkloadError, match=message.replace("[", r"\[").replace("]", r"\]")):
        make_workload(name, 2, knobs)


@pytest.mark.parametrize(("name", "partitions", "knobs"), [
    ("ycsb", 3, {"rows_per_partition": 70}), ("tpcc", 2, {"warehouses": 3, "items": 40, "customers": 4}),
    ("bank", 4, {"accounts": 33}), ("uniform", 2, {}),
])
def test_a_workload_knows_its_key_count_without_building_its_data(name, partitions, knobs):
    workload = make_workload(name, partitions, knobs)
    assert workload.data_size().keys == len(workload.initial_data())


@pytest.mark.parametrize(("name", "partitions", "knobs", "message"), [
    ("ycsb", 2, {"rows_per_partition": 500_001}, "ycsb would load 1,000,002 keys (500,001 rows_per_partition x 2"),
    ("tpcc", 16, {"items": 100_000}, "tpcc would load 3,204,976 keys (100,000 items x 16 partitions + 16 warehouses"),
])
def test_a_workload_of_more_keys_than_the_bound_is_refused_naming_what_makes_them(name, partitions, knobs, message):
    with pytest.raises(WorkloadError) as refused:
        make_workload(name, partitions, knobs)
    assert message in str(refused.value) and f"at most {WORKLOAD_KEY_COUNT_MAX:,}" in str(refused.value)
    knobs = {"rows_per_partition": WORKLOAD_KEY_COUNT_MAX // 2} if name == "ycsb" else {"items": 100_000}
    make_workload(name, 2, knobs)  # at the bound, or under it: accepted
