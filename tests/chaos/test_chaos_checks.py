"""The chaos checks and schedule on made-up histories: each check must see the violation it exists
for (a check that cannot fail proves nothing), and the schedule must keep its bounds."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from loadtests.chaos import audit as audit_module
from loadtests.chaos import checks
from loadtests.chaos.audit import GONE, Auditor, AuditState
from loadtests.chaos.faults import PROCESS_KINDS, ScheduleShape, make_schedule
from loadtests.chaos.ownership import check_ownership
from loadtests.chaos.workloads import InFlight, RegisterOp, RegisterWorkload, Transfer
from storage_adapters.contract import LogId, Record, TxnState
from storage_adapters.factory import StoreConfig


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


# --- client-unknown outcomes, reconciled with storage and the final state ---------------------------

def _committed(audit: AuditState, txn: str) -> None:
    audit.seen(("p.p0", txn), "VOTE_YES")
    audit.seen(("p.p0", txn), "COMMIT")


def _aborted(audit: AuditState, txn: str) -> None:
    audit.seen(("p.p1", txn), "ABORT")


def test_unknown_bank_transfers_are_reconciled_with_the_final_markers() -> None:
    audit = AuditState()
    for txn in ("lost", "kept"):
        _committed(audit, txn)
    _aborted(audit, "resurrected")
    audit.seen(("p.p2", "undecided"), "VOTE_YES")
    transfers = [Transfer("lost", "m-lost", "unknown"),  # COMMIT in storage, marker gone: lost
                 Transfer("kept", "m-kept", "unknown"),  # COMMIT, marker there: fine
                 Transfer("resurrected", "m-res", "unknown"),  # ABORT, marker there: violation
                 Transfer("ghost", "m-ghost", "unknown"),  # no record at all, marker there: violation
                 Transfer("gone", "m-gone", "unknown"),  # no record, no marker: fine
                 Transfer("undecided", "m-und", "unknown")]  # check (d)'s business
    markers = {"m-lost": None, "m-kept": "done", "m-res": "done", "m-ghost": "done", "m-gone": None, "m-und": None}
    result = checks.check_decided_one_way(audit, transfers, [], markers, {})
    assert sorted((example["kind"], example["txn"]) for example in result.examples) == [
        ("bank transfer told unknown, COMMIT in storage, its marker is missing", "lost"),
        ("bank transfer told unknown, aborted in storage, its marker is visible", "resurrected"),
        ("bank transfer told unknown, never logged in storage, its marker is visible", "ghost"),
    ]
    assert any("'committed': 2" in note and "'never logged': 2" in note for note in result.notes)


def test_unknown_register_writes_are_reconciled_with_reads_and_final_values() -> None:
    audit = AuditState()
    _committed(audit, "w-lost")
    _aborted(audit, "w-aborted")
    ops = [_write("a", 1, 0.0, 1.0), RegisterOp("write", "a", 2, 1.0, 2.0, "unknown", "w-lost"),
           RegisterOp("write", "b", 1, 0.0, 1.0, "unknown", "w-aborted"),
           RegisterOp("write", "c", 1, 0.0, 1.0, "unknown", "w-never"),
           RegisterOp("write", "d", 1, 0.0, 1.0, "unknown", "")]  # no id: counted, not reconciled
    ops += [_read("c", 1, 2.0, 2.1)]
    finals = {"a": "1", "b": "1", "c": None, "d": "1"}
    result = checks.check_decided_one_way(audit, [], ops, {}, finals)
    assert sorted(example["kind"] for example in result.examples) == [
        "read saw a write told unknown that storage says did not commit",
        "register write told unknown, COMMIT in storage, final value below it",
        "register write told unknown, aborted in storage, it is the final value",
    ]
    assert any("'no txn id': 1" in note for note in result.notes)


def test_an_auditor_error_is_a_violation() -> None:
    audit = AuditState()
    audit.errors.append("auditor stopped: RuntimeError: boom")
    result = checks.check_decided_one_way(audit, [], [], {}, {})
    assert result.violations == 1 and result.status == checks.FAIL


# --- the final storage state, after the quiet phase ----------------------------------------------------

def _wait() -> checks.InDoubtWait:
    return checks.InDoubtWait(deadline_s=10.0, resolved_after_s=1.0, last_poll={}, settled=True,
                              settle_leftovers=[], termination_timeout_ms=5000, deadline_basis="test")


def _final(audit: AuditState, key: tuple[str, str], state: str, *, applied: bool = True) -> None:
    audit.seen(key, state)
    audit.present[key] = state
    if state == "COMMIT" and not applied:
        audit.unapplied.add(key)


def test_final_state_flags_a_vote_left_on_a_committed_txn_and_an_unapplied_commit() -> None:
    audit = AuditState(final_done=True)
    _final(audit, ("p.p0", "t1"), "VOTE_YES")  # t1 decided COMMIT on p1, p0 never learned it
    _final(audit, ("p.p1", "t1"), "COMMIT")
    _final(audit, ("p.p2", "t2"), "COMMIT", applied=False)  # its redo never reached the data
    # Legitimate final states: a coordinator log's COMMIT is never applied; a tombstone reads applied;
    # a vote of an aborted txn awaits its GC; a coordinator's redo record with a COMMIT decision.
    _final(audit, ("c.n0", "t3"), "COMMIT", applied=False)
    _final(audit, ("p.p0", "t4"), "COMMIT")
    _final(audit, ("p.p1", "t5"), "VOTE_YES")
    _final(audit, ("p.p2", "t5"), "ABORT")
    _final(audit, ("c.n1", "t6"), "VOTE_YES")
    audit.seen(("c.n1", "t6"), "COMMIT")
    result = checks.check_in_doubt(_wait(), audit)
    assert sorted((example["kind"], example["txn"]) for example in result.examples) == [
        ("COMMIT in a partition log not applied, after the quiet phase", "t2"),
        ("VOTE_YES in a partition log of a transaction decided COMMIT, after the quiet phase", "t1"),
    ]


def test_final_state_needs_a_complete_final_snapshot() -> None:
    result = checks.check_in_doubt(_wait(), AuditState(final_done=False))
    assert [example["kind"] for example in result.examples] == [
        "no complete final storage snapshot: the final state below is not the quiet cluster's"]
    assert checks.check_in_doubt(_wait(), AuditState(final_done=True)).violations == 0


# --- the auditor ----------------------------------------------------------------------------------------

class _FakeStore:
    def __init__(self, records: dict[tuple[str, str], tuple[TxnState, bool]]) -> None:
        self.records = records

    async def read(self, log: LogId, txn: str) -> Record | None:
        found = self.records.get((f"{log.kind.value}.{log.name}", txn))
        return None if found is None else Record(log, txn, found[0], applied=found[1])

    async def close(self) -> None:
        return None


def test_auditor_records_which_commits_are_applied() -> None:
    records = {("p.p0", "t1"): (TxnState.COMMIT, False), ("p.p1", "t1"): (TxnState.COMMIT, True),
               ("c.n0", "t2"): (TxnState.VOTE_YES, False)}
    store = _FakeStore(records)
    auditor = Auditor(StoreConfig(backend="emulator", emulator_path="unused.db"), interval_s=1.0)
    auditor._enumerate = lambda: set(records)  # type: ignore[method-assign]
    assert asyncio.run(auditor._snapshot(store, full=False))  # type: ignore[arg-type]
    assert auditor.state.unapplied == {("p.p0", "t1")}
    records[("p.p0", "t1")] = (TxnState.COMMIT, True)  # applied since: read again, no longer listed
    assert asyncio.run(auditor._snapshot(store, full=False))  # type: ignore[arg-type]
    assert auditor.state.unapplied == set()


def test_a_dead_auditor_fails_the_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken(config: StoreConfig) -> None:
        raise RuntimeError("storage unreachable")

    monkeypatch.setattr(audit_module, "open_store", broken)
    auditor = Auditor(StoreConfig(backend="emulator", emulator_path="unused.db"), interval_s=0.01)
    auditor.start()
    auditor.final(5.0)
    assert not auditor.state.final_done
    assert checks.check_decided_one_way(auditor.state, [], [], {}, {}).violations == 1
    assert checks.check_in_doubt(_wait(), auditor.state).violations == 1


# --- the register writer names its transactions ------------------------------------------------------------

def test_a_register_write_whose_connection_broke_keeps_its_client_chosen_id() -> None:
    sent: list[dict[str, object]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        raise httpx.ReadTimeout("answer lost", request=request)

    workload = RegisterWorkload(lambda: ["http://n0"], 1, "cornus", InFlight(), prefix="x-", partition_count=1,
                                keys_per_partition=1, writers=1, readers=0, node_ids={"http://n0": "n0"})
    chosen = workload._client_txn("http://n0", None)
    assert chosen is not None and ".n0.c" in chosen and chosen.endswith(".1.cornus")
    with httpx.Client(transport=httpx.MockTransport(handler)) as http:
        txn, answer, _ = workload._execute(http, "http://n0", {"ops": [], "txn": chosen})
    assert (txn, answer.result) == (chosen, "unknown") and sent[0]["txn"] == chosen
    assert workload._client_txn("http://elsewhere", None) is None
