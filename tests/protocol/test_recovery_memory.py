"""What a partition's recovery keeps of the other coordinators' logs it scans: only the
coordinator-log votes of the partitions it recovers, and the 2PC COMMITs that decide their votes.

Found by audit (2026-11-28): every take of a partition scanned every coordinator's log and kept
every unfinished record it found, coordinator-log redo bundles and 2PC decisions of every partition
(a COMMIT stays unfinished until its collection, gc_grace_ms after the last acknowledgement), and a
node that fails over runs several such recoveries at once: hundreds of megabytes at a thousand
transactions a second. And a record whose id names no protocol (another build's) in any of those
logs crashed every node's take, though no partition of theirs could be in it.
"""

from __future__ import annotations

import random

from cornus.protocol import redo_bundle
from cornus.protocol.config import ProtocolConfig
from cornus.protocol.effects import ListIdentities, ReadRecord, ScanLog
from cornus.protocol.events import IdentitiesListed, RecordRead, ScanReturned, TimerFired
from cornus.protocol.recovery import Recovery
from cornus.protocol.txn_ids import protocol_of
from storage_adapters.contract import LogId, Record, RecordBody, ScanPage, TxnState


def _clog(txn: str, partitions: tuple[str, ...]) -> Record:
    bundle = redo_bundle.encode({p: b"x" * 1000 for p in partitions})
    return Record(LogId.coordinator("c1"), txn, TxnState.VOTE_YES, RecordBody(partitions, "c1", bundle))


def test_a_take_keeps_of_another_coordinators_log_only_what_decides_or_holds_its_partitions_votes() -> None:
    recovery = Recovery("c0", ("p0",), ("c0", "c1"), ProtocolConfig(), random.Random(1),
                        protocol_of=protocol_of, owner="~recovery.p0", coordinator_records=False)
    calls = recovery.handle(TimerFired(recovery.start()[0].timer))
    (foreign,) = [c for c in calls if isinstance(c, ScanLog) and c.log == LogId.coordinator("c1")]
    ours, theirs = _clog("1.c1.a.1.clog", ("p0", "p1")), _clog("1.c1.a.2.clog", ("p1", "p2"))
    decision = Record(LogId.coordinator("c1"), "1.c1.a.3.2pc", TxnState.COMMIT, RecordBody(("p0",), "c1"))
    other = Record(LogId.coordinator("c1"), "1.c1.a.5.2pc", TxnState.COMMIT, RecordBody(("p1", "p2"), "c1"))
    untagged = Record(LogId.coordinator("c1"), "1.c1.a.4", TxnState.VOTE_YES, RecordBody(("p0",), "c1"))
    page = ScanPage((ours, theirs, decision, untagged, other), None)
    recovery.handle(ScanReturned(foreign, page))  # no crash for the untagged one
    assert recovery._found[LogId.coordinator("c1")] == [ours, decision]


def _recover(records: list[Record]) -> Recovery:
    """A take of p0 by c0, run to its end over storage holding `records` (c0 and c1 listed)."""
    recovery = Recovery("c0", ("p0",), ("c0", "c1"), ProtocolConfig(), random.Random(1),
                        protocol_of=protocol_of, owner="~recovery.p0", coordinator_records=False)
    pending = list(recovery.handle(TimerFired(recovery.start()[0].timer)))
    while pending:
        call = pending.pop(0)
        if isinstance(call, ScanLog):
            page = ScanPage(tuple(r for r in records if r.log == call.log and r.txn > call.after), None)
            pending += recovery.handle(ScanReturned(call, page))
        elif isinstance(call, ListIdentities):
            pending += recovery.handle(IdentitiesListed(call, ("c0", "c1")))
        else:
            assert isinstance(call, ReadRecord), call
            found = [r for r in records if r.log == call.log and r.txn == call.txn]
            pending += recovery.handle(RecordRead(call, found[0] if found else None))
    assert recovery.result is not None
    return recovery


def test_a_vote_whose_coordinators_log_holds_the_commit_is_recovered_decided() -> None:
    """Found by audit (2026-11-28): recovery read the coordinator's COMMIT (a coordinator-log
    vote's step 3; a 2PC coordinator's log, scanned) and still rebuilt the vote to ask that
    coordinator, which, scaled away, never answered: the keys stayed locked for ever. The result
    names such votes decided (NodeCore._rebuild feeds them the COMMIT)."""
    clog = "1.c1.a.1.clog"
    redo_record = _clog(clog, ("p0", "p1"))
    clog_commit = Record(redo_record.log, clog, TxnState.COMMIT, redo_record.body)
    two_pc, open_2pc = "1.c1.a.2.2pc", "1.c1.a.3.2pc"
    votes = [Record(LogId.partition("p0"), txn, TxnState.VOTE_YES, RecordBody(("p0", "p1"), "c1", b"r"))
             for txn in (two_pc, open_2pc)]
    decision = Record(LogId.coordinator("c1"), two_pc, TxnState.COMMIT, RecordBody(("p0", "p1"), "c1"))
    result = _recover([clog_commit, decision, *votes]).result
    assert result is not None
    assert result.committed == {("p0", clog), ("p0", two_pc)}, result.committed
    assert {(r.log.name, r.txn, r.state) for r in result.records} == {
        ("p0", clog, TxnState.VOTE_YES), ("p0", two_pc, TxnState.VOTE_YES), ("p0", open_2pc, TxnState.VOTE_YES)}
    # Still open where the coordinator's log holds only the redo record: it asks, as before.
    assert _recover([redo_record]).result.committed == frozenset()
