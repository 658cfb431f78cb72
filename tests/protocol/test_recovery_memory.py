"""What a partition's recovery keeps of the other coordinators' logs it scans: only the
coordinator-log votes of the partitions it recovers.

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
from cornus.protocol.effects import ScanLog
from cornus.protocol.events import ScanReturned, TimerFired
from cornus.protocol.recovery import Recovery
from cornus.protocol.txn_ids import protocol_of
from storage_adapters.contract import LogId, Record, RecordBody, ScanPage, TxnState


def _clog(txn: str, partitions: tuple[str, ...]) -> Record:
    bundle = redo_bundle.encode({p: b"x" * 1000 for p in partitions})
    return Record(LogId.coordinator("c1"), txn, TxnState.VOTE_YES, RecordBody(partitions, "c1", bundle))


def test_a_take_keeps_of_another_coordinators_log_only_the_votes_of_its_partitions() -> None:
    recovery = Recovery("c0", ("p0",), ("c0", "c1"), ProtocolConfig(), random.Random(1),
                        protocol_of=protocol_of, owner="~recovery.p0", coordinator_records=False)
    calls = recovery.handle(TimerFired(recovery.start()[0].timer))
    (foreign,) = [c for c in calls if isinstance(c, ScanLog) and c.log == LogId.coordinator("c1")]
    ours, theirs = _clog("1.c1.a.1.clog", ("p0", "p1")), _clog("1.c1.a.2.clog", ("p1", "p2"))
    decision = Record(LogId.coordinator("c1"), "1.c1.a.3.2pc", TxnState.COMMIT, RecordBody(("p0",), "c1"))
    untagged = Record(LogId.coordinator("c1"), "1.c1.a.4", TxnState.VOTE_YES, RecordBody(("p0",), "c1"))
    page = ScanPage((ours, theirs, decision, untagged), None)
    recovery.handle(ScanReturned(foreign, page))  # no crash for the untagged one
    assert recovery._found[LogId.coordinator("c1")] == [ours]
