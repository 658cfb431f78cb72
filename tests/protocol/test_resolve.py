"""The manual resolve's machine (cornus.protocol.resolve): before its first write, a resolve that
is not forced asks the transaction's coordinator's node what it runs, and writes only if that
node runs nothing of it and the window is still open when the answer comes. Until 2026-11-27
these rules lived in the runtime's driver (admin.py), where the simulator never ran them."""

from __future__ import annotations

import random

from cornus.protocol.config import ProtocolConfig, gc_grace_ms_min
from cornus.protocol.effects import LogOnce, ReadRecord, StartTimer
from cornus.protocol.events import RecordRead, TimerFired
from cornus.protocol.resolve import AskCoordinator, CoordinatorAnswered, Resolver
from cornus.protocol.status import Known
from storage_adapters.contract import LogId, Record, RecordBody, TxnState

TXN = "1700000000000.c0.n0.7.cornus"
PARTITIONS = ("p0", "p1")
BODY = RecordBody(PARTITIONS, "c0", b"")


def _voted_in_p0_only(force: bool = False) -> tuple[Resolver, list[object], StartTimer]:
    """A resolve whose reads found p0's yes vote and nothing in p1: it must write (termination)."""
    resolver = Resolver(TXN, PARTITIONS, ProtocolConfig(), random.Random(1), force=force)
    effects = resolver.start()
    window = next(e for e in effects if isinstance(e, StartTimer))
    reads = [e for e in effects if isinstance(e, ReadRecord)]
    out: list[object] = []
    for read in reads:
        found = Record(read.log, TXN, TxnState.VOTE_YES, BODY) if read.log.name == "p0" else None
        out += resolver.handle(RecordRead(read, found))
    return resolver, out, window


def test_a_resolve_asks_the_coordinator_before_it_writes() -> None:
    resolver, effects, _ = _voted_in_p0_only()
    assert effects == [AskCoordinator(TXN, "c0")]
    assert not resolver.done and not resolver.wrote


def test_a_resolve_whose_coordinator_runs_the_transaction_writes_nothing() -> None:
    for known in (Known.ACTIVE, Known.IN_DOUBT):
        resolver, _, _ = _voted_in_p0_only()
        assert resolver.handle(CoordinatorAnswered(TXN, known)) == []
        assert resolver.done and not resolver.wrote and resolver.outcome is None
        assert resolver.refusal is not None and "running at its coordinator c0" in resolver.refusal


def test_a_resolve_whose_coordinator_is_gone_runs_termination() -> None:
    for known in (Known.NOTHING, Known.ABORTED, Known.COMMITTED):
        resolver, _, _ = _voted_in_p0_only()
        writes = resolver.handle(CoordinatorAnswered(TXN, known))
        assert {(w.log, w.state) for w in writes if isinstance(w, LogOnce)} == {
            (LogId.partition("p0"), TxnState.ABORT), (LogId.partition("p1"), TxnState.ABORT)}
        assert resolver.wrote and resolver.refusal is None


def test_a_window_that_closed_while_the_coordinator_was_asked_writes_nothing() -> None:
    """The question takes time (a slow peer, the asking machine suspended): the records may be
    collected by the time the answer comes, so the round ends in doubt rather than write."""
    resolver, _, window = _voted_in_p0_only()
    assert resolver.handle(TimerFired(window.timer)) == []
    assert resolver.handle(CoordinatorAnswered(TXN, Known.NOTHING)) == []
    assert resolver.done and not resolver.wrote and "window to write closed" in resolver.detail


def test_a_forced_resolve_asks_nobody() -> None:
    resolver, effects, _ = _voted_in_p0_only(force=True)
    assert effects and all(isinstance(e, LogOnce) for e in effects)
    assert resolver.wrote


def test_a_resolve_s_write_window_counts_on_the_least_grace_any_node_may_have() -> None:
    """Found by audit (2026-11-27): the window in which a resolve may still send its termination
    write was counted on the resolving node's own gc_grace_ms. Its coordinator, configured with a
    shorter grace during a rolling change, could collect the records first, and the resolve's
    ABORT landed in an emptied slot beside the COMMIT tombstone. The window counts on the least
    grace the rule allows, whatever this node's."""
    config = ProtocolConfig(gc_grace_ms=60_000)
    resolver = Resolver("5.c0.x.1.cornus", ("p0",), config, random.Random(1))
    least_ms = gc_grace_ms_min(config.storage_deadline_ms, config.clock_slack_ms)
    assert resolver.window_ms == least_ms - config.storage_deadline_ms - config.clock_slack_ms


def _resolved_from_the_coordinator_log(protocol: str, partition_state: TxnState | None,
                                       coordinator_state: TxnState | None) -> Resolver:
    """A resolve of a blocking protocol's transaction whose partitions' logs hold
    `partition_state` (None: nothing) and whose coordinator's log holds `coordinator_state`."""
    txn = f"1700000000000.c0.n0.7.{protocol}"
    resolver = Resolver(txn, PARTITIONS, ProtocolConfig(), random.Random(1))
    reads = [e for e in resolver.start() if isinstance(e, ReadRecord)]
    more: list[object] = []
    for read in reads:
        found = None if partition_state is None else Record(read.log, txn, partition_state, BODY)
        more += resolver.handle(RecordRead(read, found))
    if resolver.done:
        return resolver
    (read,) = more
    assert isinstance(read, ReadRecord) and read.log == LogId.coordinator("c0"), more
    found = None if coordinator_state is None else Record(read.log, txn, coordinator_state, BODY)
    assert resolver.handle(RecordRead(read, found)) == []
    assert resolver.done and not resolver.wrote
    return resolver


def test_a_blocking_protocol_s_decision_in_its_coordinator_s_log_alone_is_the_outcome() -> None:
    """Found by audit (2026-11-27): a resolve read the coordinator's log only when a participant's
    yes vote was found. A coordinator-log participant keeps no record until it learns the
    decision, so a transaction whose coordinator logged COMMIT and then crashed, before any
    participant heard it, was reported "no record of this transaction": an operator would take
    a committed transaction for one that never ran. And an ABORT in that log was "in doubt"."""
    for protocol in ("clog", "2pc"):
        committed = _resolved_from_the_coordinator_log(protocol, None, TxnState.COMMIT)
        assert committed.outcome is TxnState.COMMIT and "coordinator's log holds COMMIT" in committed.detail
        aborted = _resolved_from_the_coordinator_log(protocol, None, TxnState.ABORT)
        assert aborted.outcome is TxnState.ABORT and "coordinator's log holds ABORT" in aborted.detail
        unknown = _resolved_from_the_coordinator_log(protocol, None, None)
        assert unknown.outcome is None and "no record of this transaction" in unknown.detail
        voted = _resolved_from_the_coordinator_log(protocol, TxnState.VOTE_YES, TxnState.ABORT)
        assert voted.outcome is TxnState.ABORT, voted.detail
    # Only the coordinator-log's redo record, no decision: in doubt, as with a yes vote; and no
    # partition held a record (the admin API then asks the nodes' memory).
    redo = _resolved_from_the_coordinator_log("clog", None, TxnState.VOTE_YES)
    assert redo.outcome is None and "redo record and no decision" in redo.detail and not redo.found_records
    # An id that names no coordinator (one this runtime did not make) has no log to read.
    stray = Resolver("x.2pc", PARTITIONS, ProtocolConfig(), random.Random(1))
    for read in [e for e in stray.start() if isinstance(e, ReadRecord)]:
        assert stray.handle(RecordRead(read, None)) == []
    assert stray.done and stray.outcome is None and "no record" in stray.detail
