"""The chaos checks and schedule on made-up histories: each check must see the violation it exists
for (a check that cannot fail proves nothing), and the schedule must keep its bounds."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtests.chaos import checks
from loadtests.chaos.audit import GONE, AuditState
from loadtests.chaos.faults import PROCESS_KINDS, ScheduleShape, make_schedule
from loadtests.chaos.ownership import check_ownership
from loadtests.chaos.workloads import RegisterOp, Transfer


def _write(key: str, value: int, start: float, end: float, result: str = "committed") -> RegisterOp:
    return RegisterOp("write", key, value, start, end, result, f"w{value}")


def _read(key: str, value: int | None, start: float, end: float) -> RegisterOp:
    return RegisterOp("read", key, value, start, end, "committed", f"r{start}")


def test_stale_read_is_found_and_a_concurrent_read_is_not() -> None:
    ops = [_write("k", 1, 0.0, 1.0), _write("k", 2, 2.0, 3.0),
           _read("k", 1, 2.5, 2.6),  # concurrent with write 2: either value is fine
           _read("k", 1, 3.5, 3.6),  # write 2 was acknowledged before it began: stale
           _read("k", 3, 3.7, 3.8)]  # no write of 3 ever began
    result = checks.check_no_stale_read(ops)
    assert result.violations == 2
    assert {example["kind"] for example in result.examples} == {"stale", "from the future"}


def test_lost_acknowledged_write_and_visible_aborted_write_are_found() -> None:
    ops = [_write("k", 1, 0.0, 1.0), _write("k", 2, 2.0, 3.0, result="aborted")]
    lost = checks.check_acknowledged_visible([], {}, ops, {"k": None})
    assert lost.violations == 1
    audit = AuditState()
    audit.seen(("p.p0", "w1"), "COMMIT")
    two_ways = checks.check_decided_one_way(audit, [], ops, {}, {"k": "2"})
    assert [example["kind"] for example in two_ways.examples] == ["final value is a write told aborted"]


def test_a_transaction_decided_two_ways_in_storage_is_found() -> None:
    audit = AuditState()
    audit.seen(("p.p0", "t1"), "VOTE_YES")
    audit.seen(("p.p0", "t1"), "COMMIT")
    audit.seen(("p.p0", "t1"), GONE)
    audit.seen(("p.p0", "t1"), "ABORT")  # recreated after collection, the other way
    audit.seen(("p.p1", "t2"), "ABORT")
    transfers = [Transfer("t2", "m2", "committed"), Transfer("t3", "m3", "aborted")]
    result = checks.check_decided_one_way(audit, transfers, [], {"m2": "done", "m3": "done"}, {})
    kinds = sorted(example["kind"] for example in result.examples)
    assert kinds == ["COMMIT and ABORT in storage", "bank transfer told aborted, its marker is visible",
                     "client told committed, ABORT in storage"]


def test_overlapping_owners_are_found_and_a_kill_ends_an_interval(tmp_path: Path) -> None:
    n0, n1 = tmp_path / "n0.log", tmp_path / "n1.log"
    # n0 serves p0 from 1000; it is killed at 1500 with no stop line; n1 takes p0 at 1600: no
    # overlap. n1 serves p1 until 3000 while n0 serves p1 from 2500: overlap.
    n0.write_text('{"msg": "ownership serve partition=p0 epoch=1 node=n0 at_unix_ms=1000"}\n'
                  "ownership serve partition=p1 epoch=2 node=n0 at_unix_ms=2500\n")
    n1.write_text("ownership serve partition=p0 epoch=2 node=n1 at_unix_ms=1600\n"
                  "ownership serve partition=p1 epoch=1 node=n1 at_unix_ms=1700\n"
                  "ownership stop partition=p1 epoch=1 node=n1 until_unix_ms=3000 reason=released\n")
    found = check_ownership({"n0": n0, "n1": n1}, {"n0": [1500]}, run_end_ms=5000)
    assert found.line_count == 5
    assert [(a.partition, b.partition) for a, b in found.overlaps] == [("p1", "p1")]
    result = checks.check_single_owner(found)
    assert result.violations == 1 and result.status == checks.FAIL


def test_no_ownership_lines_is_not_a_pass(tmp_path: Path) -> None:
    (tmp_path / "n0.log").write_text("nothing about ownership here\n")
    result = checks.check_single_owner(check_ownership({"n0": tmp_path / "n0.log"}, {}, run_end_ms=1))
    assert result.violations == 0 and result.status == checks.NO_OWNERSHIP_LINES


@pytest.mark.parametrize("seed", range(20))
def test_schedule_is_seeded_and_bounded(seed: int) -> None:
    shape = ScheduleShape(duration_s=30.0, nodes=("n0", "n1", "n2"), peer_links=("n0-n1", "n1-n0", "n1-n2"),
                          storage_links=("n0-storage",), count_max=25, concurrency_max=3, process_concurrency_max=1)
    schedule = make_schedule(seed, shape)
    assert schedule == make_schedule(seed, shape)
    assert 0 < len(schedule) <= shape.count_max
    for fault in schedule:
        assert shape.warmup_s <= fault.start_s < fault.end_s <= shape.duration_s
        active = [f for f in schedule if f.start_s <= fault.start_s < f.end_s]
        assert len(active) <= shape.concurrency_max
        assert sum(f.kind in PROCESS_KINDS for f in active) <= shape.process_concurrency_max
        disabled = [p for f in active if f.kind == "partition" for p in f.proxies]
        assert len(disabled) == len(set(disabled)), "two partitions must not share a proxy at once"
