"""The checks, each a count of violations (0 passes) with examples to start debugging from.

(a) bank total constant; (b) every acknowledged commit visible afterwards (bank markers, and each
register's final value at least its last acknowledged write) and no stale read (a read never
returns less than a write acknowledged before the read started, nor a value not yet written);
(c) no transaction decided two ways (storage records of all logs over the whole run agree, the
client's committed transactions are ABORT nowhere, its aborted/unavailable ones COMMIT nowhere and
their writes visible nowhere, its unknown-outcome ones (202, a lost answer) visible at the end if
COMMIT in storage and nowhere if ABORT or never logged; an auditor error fails it); (d) every
in-doubt transaction resolved within the deadline, and the final snapshot (after the quiet phase)
holds no partition-log VOTE_YES of a transaction decided COMMIT, nor an unapplied partition-log
COMMIT; (e)
no partition served by two owners at once; (f) no node exited without being killed.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from loadtests.chaos.audit import GONE, AuditState
from loadtests.chaos.faults import Crash
from loadtests.chaos.ownership import EXAMPLE_COUNT_MAX, OwnershipResult
from loadtests.chaos.workloads import RegisterOp, Transfer
from storage_adapters.contract import TxnState

PASS = "pass"
FAIL = "FAIL"
NO_OWNERSHIP_LINES = "no ownership lines"
NOT_ACKNOWLEDGED = ("aborted", "unavailable")  # the client was told: nothing committed
COMMIT = TxnState.COMMIT.value
ABORT = TxnState.ABORT.value
VOTE_YES = TxnState.VOTE_YES.value


@dataclass(slots=True)
class CheckResult:
    key: str
    name: str
    violations: int
    examples: list[Any] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    status: str = ""

    def __post_init__(self) -> None:
        if not self.status:
            self.status = PASS if self.violations == 0 else FAIL

    def add(self, example: Any) -> None:
        self.violations += 1
        self.status = FAIL
        if len(self.examples) < EXAMPLE_COUNT_MAX:
            self.examples.append(example)

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "name": self.name, "violations": self.violations, "status": self.status,
                "examples": self.examples, "notes": self.notes}


def check_bank_total(balances: Mapping[str, str | None], expected: int) -> CheckResult:
    result = CheckResult("a", "bank total balance constant", 0)
    absent = sorted(key for key, value in balances.items() if value is None)
    total = sum(int(value) for value in balances.values() if value is not None)
    if absent:
        result.add({"accounts_absent": absent})
    if total != expected:
        result.add({"total": total, "expected": expected, "balances": dict(balances)})
    result.notes.append(f"total {total}, expected {expected}, {len(balances)} accounts")
    return result


def check_acknowledged_visible(transfers: Sequence[Transfer], markers: Mapping[str, str | None],
                               ops: Sequence[RegisterOp], finals: Mapping[str, str | None]) -> CheckResult:
    result = CheckResult("b", "acknowledged commits visible afterwards", 0)
    committed = [t for t in transfers if t.result == "committed"]
    for transfer in committed:
        if markers.get(transfer.marker) != "done":
            result.add({"workload": "bank", "txn": transfer.txn, "marker": transfer.marker,
                        "read": markers.get(transfer.marker)})
    last_acked: dict[str, tuple[int, str]] = {}
    for op in ops:
        if (op.kind == "write" and op.result == "committed" and op.value is not None
                and op.value > last_acked.get(op.key, (0, ""))[0]):
            last_acked[op.key] = (op.value, op.txn)
    for key, (value, txn) in sorted(last_acked.items()):
        final = finals.get(key)
        final_value = 0 if final is None else int(final)
        if final_value < value:
            result.add({"workload": "register", "key": key, "final": final, "last_acknowledged": value, "txn": txn})
    result.notes.append(f"{len(committed)} committed transfers, {len(last_acked)} registers with acknowledged writes")
    return result


def check_no_stale_read(ops: Sequence[RegisterOp]) -> CheckResult:
    """Per key, the writes are one writer's 1, 2, 3, ...: a committed read that started after write
    v was acknowledged must return >= v, and may not return a value whose write had not started
    before the read ended."""
    result = CheckResult("b2", "no stale read (register)", 0)
    acked: dict[str, list[tuple[float, int]]] = {}
    started: dict[str, list[tuple[float, int]]] = {}
    for op in ops:
        if op.kind != "write" or op.value is None:
            continue
        started.setdefault(op.key, []).append((op.start, op.value))
        if op.result == "committed":
            acked.setdefault(op.key, []).append((op.end, op.value))
    index: dict[str, tuple[list[float], list[int]]] = {}
    for key, items in acked.items():
        items.sort()
        running, prefix = 0, []
        for _, value in items:
            running = max(running, value)
            prefix.append(running)
        index[key] = ([end for end, _ in items], prefix)
    started_index = {key: sorted(items) for key, items in started.items()}
    read_count = 0
    for op in ops:
        if op.kind != "read" or op.result != "committed":
            continue
        read_count += 1
        got = 0 if op.value is None else op.value
        ends, prefix = index.get(op.key, ([], []))
        position = bisect.bisect_left(ends, op.start)  # writes acknowledged strictly before the read began
        floor = prefix[position - 1] if position else 0
        if got < floor:
            result.add({"kind": "stale", "key": op.key, "read": op.value, "txn": op.txn,
                        "read_start": round(op.start, 4), "acknowledged_before": floor})
            continue
        begun = started_index.get(op.key, [])
        ceiling = max((value for start, value in begun if start <= op.end), default=0)
        if got > ceiling:
            result.add({"kind": "from the future", "key": op.key, "read": op.value, "txn": op.txn,
                        "read_end": round(op.end, 4), "largest_write_started": ceiling})
    result.notes.append(f"{read_count} committed reads checked")
    return result


def check_decided_one_way(audit: AuditState, transfers: Sequence[Transfer], ops: Sequence[RegisterOp],
                          markers: Mapping[str, str | None], finals: Mapping[str, str | None]) -> CheckResult:
    result = CheckResult("c", "no transaction decided two ways", 0)
    for txn, logs in sorted(audit.history.items()):
        if audit.decisions(txn) == {COMMIT, ABORT}:
            result.add({"kind": "COMMIT and ABORT in storage", "txn": txn, "records": logs})
    client: dict[str, str] = {}
    for transfer in transfers:
        client[transfer.txn] = transfer.result
    for op in ops:
        if op.txn:
            client[op.txn] = op.result
    seen_committed = 0
    for txn, told in client.items():
        decisions = audit.decisions(txn)
        if told == "committed":
            seen_committed += bool(audit.history.get(txn))
            if ABORT in decisions:
                result.add({"kind": "client told committed, ABORT in storage", "txn": txn,
                            "records": audit.history[txn]})
        elif told in NOT_ACKNOWLEDGED and COMMIT in decisions:
            result.add({"kind": f"client told {told}, COMMIT in storage", "txn": txn, "records": audit.history[txn]})
    unknown = _reconcile_unknown(result, audit, transfers=transfers, ops=ops, markers=markers, finals=finals)
    for transfer in transfers:
        if transfer.result in NOT_ACKNOWLEDGED and markers.get(transfer.marker) is not None:
            result.add({"kind": f"bank transfer told {transfer.result}, its marker is visible", "txn": transfer.txn,
                        "marker": transfer.marker})
    refused = {(op.key, op.value): op for op in ops
               if op.kind == "write" and op.result in NOT_ACKNOWLEDGED and op.value is not None}
    for op in ops:
        if op.kind == "read" and op.result == "committed" and (op.key, op.value) in refused:
            write = refused[(op.key, op.value)]
            result.add({"kind": f"read saw a write told {write.result}", "key": op.key, "value": op.value,
                        "write_txn": write.txn, "read_txn": op.txn})
    for key, final in finals.items():
        if final is not None and (key, int(final)) in refused:
            write = refused[(key, int(final))]
            result.add({"kind": f"final value is a write told {write.result}", "key": key, "value": final,
                        "write_txn": write.txn})
    committed_total = sum(1 for told in client.values() if told == "committed")
    resurrected = sum(1 for logs in audit.history.values() for states in logs.values() if GONE in states)
    record_total = sum(len(logs) for logs in audit.history.values())
    result.notes += [
        f"{len(audit.history)} txns / {record_total} records audited in {audit.snapshot_count} snapshots",
        f"{seen_committed} of {committed_total} client-committed txns have records in storage "
        "(a read-only or single-partition txn may log none)",
        f"client-unknown outcomes, by storage (each reconciled with the final state, but those with no txn "
        f"id): {unknown}",
        f"records collected and then recreated: {resurrected}",
    ]
    for error in audit.errors:
        # A dead or blind auditor covered only part of the run (and its final state is stale): the
        # checks above would pass on what it never saw.
        result.add({"kind": "auditor error: the audit does not cover the whole run", "error": error})
    if committed_total and not audit.history:
        result.add({"kind": "audit saw no record at all although txns committed: the backend key layout "
                             "may have changed (loadtests/chaos/audit.py)"})
    return result


def _storage_outcome(audit: AuditState, txn: str) -> str:
    """What storage says of `txn` over the whole run: "committed" (COMMIT somewhere, ABORT nowhere),
    "aborted" (ABORT only), "never logged" (no record in any log: no protocol commits a writing
    transaction without a durable record, a Cornus vote or a coordinator's decision, so it did not
    commit), "undecided" (records but no decision: check (d) judges those), "two ways"."""
    decisions = audit.decisions(txn)
    if decisions == {COMMIT}:
        return "committed"
    if decisions == {ABORT}:
        return "aborted"
    if decisions:
        return "two ways"
    return "undecided" if audit.history.get(txn) else "never logged"


def _counted_outcome(audit: AuditState, txn: str, counts: dict[str, int]) -> str | None:
    """`_storage_outcome` of `txn`, counted in `counts`; None (counted as such) for no txn id."""
    outcome = _storage_outcome(audit, txn) if txn else None
    counts["no txn id" if outcome is None else outcome] += 1
    return outcome


def _reconcile_unknown(result: CheckResult, audit: AuditState, *, transfers: Sequence[Transfer],
                       ops: Sequence[RegisterOp], markers: Mapping[str, str | None],
                       finals: Mapping[str, str | None]) -> dict[str, int]:
    """A transaction whose client was told nothing certain (202, a broken connection, a timeout)
    must still have gone one way everywhere: committed in storage => its writes are there at the
    end (a bank marker "done", a register's final value at least the value written); aborted or
    never logged => its writes are visible nowhere (no marker, no read or final value of it)."""
    counts = {"committed": 0, "aborted": 0, "never logged": 0, "undecided": 0, "two ways": 0, "no txn id": 0}
    for transfer in transfers:
        if transfer.result != "unknown":
            continue
        outcome = _counted_outcome(audit, transfer.txn, counts)
        if outcome is None:
            continue
        seen = markers.get(transfer.marker)
        if outcome == "committed" and seen != "done":
            result.add({"kind": "bank transfer told unknown, COMMIT in storage, its marker is missing",
                        "txn": transfer.txn, "marker": transfer.marker, "read": seen,
                        "records": audit.history.get(transfer.txn)})
        elif outcome in ("aborted", "never logged") and seen is not None:
            result.add({"kind": f"bank transfer told unknown, {outcome} in storage, its marker is visible",
                        "txn": transfer.txn, "marker": transfer.marker, "read": seen,
                        "records": audit.history.get(transfer.txn)})
    # One writer per key writing 1, 2, 3, ...: a value names its write, and a committed write v
    # leaves the key at v or above.
    not_committed: dict[tuple[str, int], RegisterOp] = {}
    for op in ops:
        if op.kind != "write" or op.result != "unknown" or op.value is None:
            continue
        outcome = _counted_outcome(audit, op.txn, counts)
        if outcome is None:
            continue
        final = finals.get(op.key)
        final_value = 0 if final is None else int(final)
        if outcome == "committed" and final_value < op.value:
            result.add({"kind": "register write told unknown, COMMIT in storage, final value below it",
                        "txn": op.txn, "key": op.key, "value": op.value, "final": final,
                        "records": audit.history.get(op.txn)})
        elif outcome in ("aborted", "never logged"):
            not_committed[(op.key, op.value)] = op
            if final_value == op.value:
                result.add({"kind": f"register write told unknown, {outcome} in storage, it is the final value",
                            "txn": op.txn, "key": op.key, "value": op.value, "records": audit.history.get(op.txn)})
    for op in ops:
        if op.kind == "read" and op.result == "committed" and op.value is not None \
                and (op.key, op.value) in not_committed:
            write = not_committed[(op.key, op.value)]
            result.add({"kind": "read saw a write told unknown that storage says did not commit", "key": op.key,
                        "value": op.value, "write_txn": write.txn, "read_txn": op.txn,
                        "records": audit.history.get(write.txn)})
    return counts


@dataclass(slots=True)
class InDoubtWait:
    deadline_s: float
    resolved_after_s: float | None  # from the end of the faults; None: not within the deadline
    last_poll: Mapping[str, tuple[bool, int] | None]
    settled: bool  # no transaction left on any node before the final reads
    settle_leftovers: list[Any]
    termination_timeout_ms: int
    deadline_basis: str
    # What there was to resolve: the first poll after the faults ended, and the run's peak.
    at_faults_end: Mapping[str, tuple[bool, int] | None] = field(default_factory=dict)
    max_total: int = 0
    max_per_node: Mapping[str, int] = field(default_factory=dict)
    sample_count: int = 0
    boot_s: float = 0.0  # from the heal until every node process answered: before the clock starts


def check_in_doubt(wait: InDoubtWait, audit: AuditState) -> CheckResult:
    result = CheckResult("d", f"in-doubt resolved within {wait.deadline_s:.1f} s", 0)
    if wait.resolved_after_s is None:
        result.add({"kind": "in doubt at the deadline", "per_node_ready_in_doubt": dict(wait.last_poll)})
    else:
        result.notes.append(f"every node ready with 0 in doubt {wait.resolved_after_s:.2f} s after the faults stopped")
    if not audit.final_done:
        result.add({"kind": "no complete final storage snapshot: the final state below is not the quiet cluster's",
                    "auditor_errors": audit.errors[:5]})
    # The final snapshot is taken after the quiet phase (every node ready with nothing in doubt, or
    # the deadline gone, which is a violation above) and after no node lists a transaction (its
    # commits applied): every record left now is final, and a partition's own log must agree.
    for (log, txn), state in sorted(audit.present.items()):
        if not log.startswith("p."):
            continue  # a coordinator log's COMMIT is never marked applied; its VOTE_YES is a redo record
        if state == VOTE_YES and COMMIT in audit.decisions(txn):
            result.add({"kind": "VOTE_YES in a partition log of a transaction decided COMMIT, after the quiet phase",
                        "txn": txn, "log": log, "records": audit.history.get(txn), "settled": wait.settled})
        elif state == COMMIT and (log, txn) in audit.unapplied:
            # A COMMIT tombstone reads as applied: this is a live COMMIT whose redo never reached the data.
            result.add({"kind": "COMMIT in a partition log not applied, after the quiet phase", "txn": txn,
                        "log": log, "records": audit.history.get(txn), "settled": wait.settled})
    presumed_abort: list[str] = []
    for (log, txn), state in sorted(audit.present.items()):
        if state != VOTE_YES or audit.decisions(txn):
            continue
        if log.startswith("c."):
            # A coordinator-log coordinator's redo record: it logs no ABORT (presumed abort), so this
            # is an aborted transaction's record waiting for its GC grace, not a participant in doubt.
            presumed_abort.append(txn)
            continue
        result.add({"kind": "VOTE_YES in a partition log, no decision anywhere, after the quiet phase", "txn": txn,
                    "log": log})
    if presumed_abort:
        result.notes.append(f"{len(presumed_abort)} coordinator redo records VOTE_YES with no decision (presumed "
                            f"abort, awaiting GC), e.g. {presumed_abort[:3]}")
    result.notes.append(
        f"(ready, in doubt) per node when the faults ended: {dict(wait.at_faults_end)}; peak in doubt during the "
        f"run {wait.max_total} (per node {dict(wait.max_per_node)}, {wait.sample_count} samples)")
    if not wait.settled:
        result.notes.append(f"transactions still listed by nodes when the final reads began: {wait.settle_leftovers}")
    result.notes.append(f"deadline = 2 x termination timeout {wait.termination_timeout_ms} ms ({wait.deadline_basis}), "
                        f"counted from when every node answered /healthz again, {wait.boot_s:.2f} s after the heal")
    return result


def check_single_owner(found: OwnershipResult, counters: Mapping[str, Mapping[str, int]] | None = None) -> CheckResult:
    result = CheckResult("e", "no partition served by two owners at once", 0)
    if counters:
        totals = {name: sum(c.get(name, 0) for c in counters.values()) for name in ("deposed", "fenced_writes")}
        if any(totals.values()):
            result.notes.append(f"nodes report (/readyz, summed over node lives) {totals}")
    for first, second in found.overlaps:
        result.add({"partition": first.partition, "intervals": [first.to_json(), second.to_json()]})
    if found.line_count == 0:
        result.status = NO_OWNERSHIP_LINES
        result.notes.append("no `ownership serve/stop` line in any node log: lease-based ownership is not "
                            "there yet, nothing was checked")
    else:
        result.notes.append(f"{found.line_count} ownership lines, {len(found.intervals)} intervals")
    if found.problems:
        result.notes.append(f"lines without a partner ({len(found.problems)}): {found.problems[:5]}")
    return result


def check_no_crash(crashes: Iterable[Crash], exits_at_stop: Mapping[str, int]) -> CheckResult:
    result = CheckResult("f", "no node exited without being killed", 0)
    for crash in crashes:
        result.add({"node": crash.node, "exit_code": crash.exit_code, "at_s": crash.at_s,
                    "log_tail": crash.log_tail[-1500:]})
    unclean = {node: code for node, code in exits_at_stop.items() if code not in (0, -15)}
    if unclean:
        result.notes.append(f"exit codes at the final stop that were not clean: {unclean}")
    return result
