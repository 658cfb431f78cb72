"""Recovery at node start, as a pure machine: which logs to scan, page by page, and what the
records found mean. The runtime (or the simulator) only carries out its scans and reads.

1. Wait `recovery_settle_ms`: storage calls of the previous life, and the coordinator-log redo
   writes that could still commit a yes vote of ours, land within it (ProtocolConfig).
2. Scan every page of: each owned partition's log, this node's coordinator log, and every
   coordinator's log (coordinator-log participants log nothing before the decision, so their yes
   votes live only in the coordinators' redo records). A page says where the next one starts (its
   `resume_after`; None: the log's end), which may be past its last record or, where storage walks
   tombstones, a page of none (a scan without a cursor would see the first page again and again,
   since its records stay unfinished until resolved). "Every
   coordinator" is every node that ever took an identity in storage (listed, page by page), not
   only the configured ones: a node added by a rollout this process's configuration predates may
   hold the only copy of our yes votes, and a node writes no coordinator-log record before its
   identity is taken.
3. For each coordinator-log redo naming an owned partition that its own log did not bring back,
   read the partition's record, then the coordinator's again: decided means finished; absent, with
   the coordinator's record still there, means a yes vote that may still commit (or an abort that
   left no record), rebuilt as a VOTE_YES record that asks the coordinator.
4. Result: the records to rebuild machines from, and the keys to lock again first.

Storage that cannot be reached is retried after a capped backoff, forever: a node that skipped
recovery could answer "unknown" for a transaction it voted yes on. It is not ready meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cornus.protocol import redo_bundle
from cornus.protocol.backoff import Backoff, JitterSource
from cornus.protocol.config import Protocol, ProtocolConfig
from cornus.protocol.effects import Effect, ListIdentities, ReadRecord, ScanLog, StartTimer, Timer
from cornus.protocol.events import (
    Event,
    IdentitiesListed,
    RecordRead,
    ScanReturned,
    StorageUnreachable,
    TimerFired,
)
from storage_adapters.contract import IDENTITY_PAGE_COUNT_MAX, LogId, LogKind, Record, RecordBody, ScanPage, TxnState

# The owner of recovery's storage calls and timers. '~' cannot appear in a partition or node id,
# so it never names a host.
RECOVERY = "~recovery"

ProtocolOf = Callable[[str], "Protocol | None"]

# Recovery's steps after the settle wait: scans, then reads of possible coordinator-log votes in
# the partitions' own logs, then in the coordinators' logs.
_SCANS, _OWN_READS, _COORDINATOR_READS = range(3)

_Call = ScanLog | ReadRecord | ListIdentities


@dataclass(frozen=True, slots=True)
class RecoveryResult:
    """`records` in the order their machines are rebuilt: owned partitions' records (from their
    logs, or rebuilt coordinator-log votes), then this node's coordinator records."""

    records: tuple[Record, ...]
    # (partition, txn) of the 2PC and coordinator-log votes among `records` whose coordinator's
    # log holds its COMMIT: decided, whether or not that coordinator ever answers again.
    committed: frozenset[tuple[str, str]] = frozenset()

    @property
    def partition_records(self) -> tuple[Record, ...]:
        return tuple(r for r in self.records if r.log.kind is LogKind.PARTITION)


class Recovery:
    def __init__(
        self,
        node: str,
        partitions: tuple[str, ...],
        coordinators: tuple[str, ...],
        config: ProtocolConfig,
        jitter: JitterSource,
        *,
        protocol_of: ProtocolOf,
        owner: str = RECOVERY,
        coordinator_records: bool = True,
    ) -> None:
        """`owner` names this recovery's calls and timers (a node runs one at start, and one for
        each partition it takes later). `coordinator_records`: whether this node's own
        coordinator log is recovered too (at start), or only the partitions' (a later take)."""
        assert node in coordinators, "every node coordinates, this one too"
        assert owner.startswith(RECOVERY), f"recovery owner {owner} must not name a host"
        assert partitions or coordinator_records, "a recovery of nothing"
        self.node = node
        self.owner = owner
        self.coordinator_records = coordinator_records
        self.partitions = partitions
        self._partition_set = frozenset(partitions)
        self.config = config
        self.protocol_of = protocol_of
        self.result: RecoveryResult | None = None
        self._backoff = Backoff(config.backoff_ms_min, config.backoff_ms_max, jitter)
        # Other coordinators' logs hold nothing for us but coordinator-log votes of our partitions:
        # without partitions, neither they nor the list of identities is read.
        self._lists_identities = bool(partitions)
        scanned = coordinators if partitions else (node,)
        self._logs = [
            *(LogId.partition(p) for p in partitions),
            *(LogId.coordinator(c) for c in scanned),
        ]
        self._found: dict[LogId, list[Record]] = {log: [] for log in self._logs}
        self._waiting: set[_Call] = set()
        self._failed: list[_Call] = []
        self._votes: dict[tuple[str, str], Record] = {}  # (partition, txn) -> rebuilt vote, if still open
        self._committed: set[str] = set()  # txns whose coordinator's record was read COMMIT (step 3)
        self._started = False
        self._step = _SCANS

    @property
    def done(self) -> bool:
        return self.result is not None

    def start(self) -> list[Effect]:
        return [StartTimer(self._timer("settle"), self.config.recovery_settle_ms)]

    def handle(self, event: Event) -> list[Effect]:
        assert not self.done, f"{type(event).__name__} after recovery finished"
        if isinstance(event, TimerFired):
            if event.timer.kind == "settle":
                assert not self._started
                self._started = True
                listing = [self._list_identities("")] if self._lists_identities else []
                return self._issue([*listing, *(self._scan(log, "") for log in self._logs)])
            assert event.timer.kind == "retry", event.timer
            failed, self._failed = self._failed, []
            return self._issue(failed)
        assert isinstance(event, ScanReturned | IdentitiesListed | RecordRead), f"{event!r} reached recovery"
        assert event.call in self._waiting, f"{self.owner}: an answer to a call never asked: {event.call}"
        self._waiting.remove(event.call)
        if isinstance(event.result, StorageUnreachable):
            self._failed.append(event.call)
            return self._after_answer()
        if isinstance(event, ScanReturned):
            self._backoff.reset()
            return self._issue(self._on_page(event.call, event.result)) + self._after_answer()
        if isinstance(event, IdentitiesListed):
            self._backoff.reset()
            return self._issue(self._on_identities(event.call, event.result)) + self._after_answer()
        self._on_vote_read(event.call, event.result)
        return self._after_answer()

    # -- steps -------------------------------------------------------------------------------------
    def _on_page(self, call: ScanLog, page: ScanPage) -> list[ScanLog]:
        assert len(page.records) <= call.limit, f"{len(page.records)} records in a page of {call.limit}"
        # A page that goes on moves its cursor forward, or recovery would ask for it forever.
        assert page.resume_after is None or page.resume_after > call.after, (
            f"a page of {call.log.key} after {call.after!r} resumes at {page.resume_after!r}"
        )
        previous = call.after
        # Another coordinator's log (ours too, on a later take) holds nothing for this recovery but
        # coordinator-log votes of its partitions: only those are kept (found by audit, 2026-11-28:
        # every take kept every coordinator's whole unfinished log, bundles and 2PC decisions of
        # all partitions, and a record no protocol names, there, crashed every node's take).
        votes_only = call.log.kind is LogKind.COORDINATOR and not (
            self.coordinator_records and call.log == LogId.coordinator(self.node))
        found = self._found[call.log]
        for record in page.records:
            assert record.log == call.log and record.txn > previous, "a page must ascend past its cursor"
            assert not record.state.is_decision or (record.state is TxnState.COMMIT and not record.applied), (
                f"scan returned a finished record {record.txn} ({record.state})"
            )
            previous = record.txn
            if votes_only:
                if self._names_ours(record) or self._commits_ours(record):
                    found.append(record)
                continue
            # An id without a protocol tag was made by an earlier build; no machine may guess it.
            assert self.protocol_of(record.txn) is not None, (
                f"{call.log.key} holds {record.txn}, whose id names no protocol: resolve it by hand"
            )
            found.append(record)
        if page.resume_after is None:
            return []
        return [self._scan(call.log, page.resume_after)]

    def _names_ours(self, record: Record) -> bool:
        """Whether a coordinator's record is a coordinator-log one whose redo names a partition
        this recovery recovers (the only kind that can hold a yes vote of ours)."""
        if self.protocol_of(record.txn) is not Protocol.COORDINATOR_LOG:
            return False
        return any(partition in self._partition_set for partition in redo_bundle.decode(record.body.redo))

    def _commits_ours(self, record: Record) -> bool:
        """Whether a coordinator's record is a 2PC COMMIT naming a partition this recovery
        recovers: a yes vote of ours found in its log is decided by it."""
        return (record.state is TxnState.COMMIT and self.protocol_of(record.txn) is Protocol.TWO_PC
                and not self._partition_set.isdisjoint(record.body.participants))

    def _on_identities(self, call: ListIdentities, page: tuple[str, ...]) -> list[ScanLog | ListIdentities]:
        """Step 2's list of coordinators: each listed node whose log is not scanned yet gets its
        scan; a full page asks for the next one."""
        assert self._step == _SCANS, "identities are listed before any vote is read"
        assert len(page) <= call.limit, f"{len(page)} identities in a page of {call.limit}"
        assert all(a < b for a, b in zip((call.after, *page), page, strict=False)), (
            f"a page of identities must ascend past its cursor: {page}"
        )
        calls: list[ScanLog | ListIdentities] = []
        for node in page:
            log = LogId.coordinator(node)
            if log not in self._found:
                self._logs.append(log)
                self._found[log] = []
                calls.append(self._scan(log, ""))
        if len(page) == call.limit:
            calls.append(self._list_identities(page[-1]))
        return calls

    def _on_vote_read(self, call: ReadRecord, record: Record | None) -> None:
        """Step 3, for the possible coordinator-log votes: first every partition's own record, then
        (once all of those are in) each coordinator's record again. Garbage collection deletes the
        coordinator's record first and the partitions' after it, so a coordinator record still
        there after our own record was found missing means nothing was collected yet: the vote may
        be open. Gone (or a tombstone, where storage takes calls late) means the transaction
        finished, and was collected, meanwhile; ABORT, that it never committed."""
        if call.log.kind is LogKind.PARTITION:
            if record is not None and record.state.is_decision:
                # Decided here already: an unapplied COMMIT came back through this partition's own
                # log; an applied one or an ABORT needs nothing.
                del self._votes[(call.log.name, call.txn)]
        elif record is None or record.applied or record.state is TxnState.ABORT:
            # Gone, or collected to its tombstone (a COMMIT tombstone reads as applied; a
            # coordinator's own COMMIT never is), or ABORT: no vote of ours is open.
            for key in [key for key in self._votes if key[1] == call.txn]:
                del self._votes[key]
        elif record.state is TxnState.COMMIT:
            # The coordinator's COMMIT (its collection deletes it before any participant's
            # record): the vote is decided. Rebuilt to ask the coordinator only, it waited for ever
            # for one that never came back (scaled away), its keys locked (found by audit,
            # 2026-11-28).
            self._committed.add(call.txn)

    def _after_answer(self) -> list[Effect]:
        if self._waiting:
            return []
        if self._failed:
            return [StartTimer(self._timer("retry"), self._backoff.next_delay_ms())]
        self._step += 1
        reads: list[ReadRecord] = []
        if self._step == _OWN_READS:
            reads = self._votes_to_check()
        elif self._step == _COORDINATOR_READS:
            coordinators = {txn: vote.body.coordinator for (_, txn), vote in self._votes.items()}
            reads = [ReadRecord(self.owner, LogId.coordinator(c), txn) for txn, c in sorted(coordinators.items())]
        if reads:
            return self._issue(reads)
        if self._step < _COORDINATOR_READS:
            return self._after_answer()
        self.result = self._assemble()
        return []

    def _votes_to_check(self) -> list[ReadRecord]:
        """Coordinator-log redo records naming owned partitions whose own logs did not bring the
        transaction back: each may hide a yes vote; reading the partition's record tells."""
        own = {(record.log.name, record.txn) for p in self.partitions for record in self._found[LogId.partition(p)]}
        reads: list[ReadRecord] = []
        for log in self._logs:
            if log.kind is not LogKind.COORDINATOR:
                continue
            for record in self._found[log]:
                if self.protocol_of(record.txn) is not Protocol.COORDINATOR_LOG:
                    continue  # a 2PC decision: its participants logged their votes themselves
                for partition, redo in redo_bundle.decode(record.body.redo).items():
                    if partition not in self._partition_set or (partition, record.txn) in own:
                        continue
                    vote = Record(
                        LogId.partition(partition), record.txn, TxnState.VOTE_YES,
                        RecordBody(record.body.participants, record.body.coordinator, redo),
                    )
                    self._votes[(partition, record.txn)] = vote
                    reads.append(ReadRecord(self.owner, vote.log, record.txn))
        return reads

    def _assemble(self) -> RecoveryResult:
        records: list[Record] = []
        for partition in self.partitions:
            records += self._found[LogId.partition(partition)]
            records += sorted(
                (vote for (p, _), vote in self._votes.items() if p == partition), key=lambda r: r.txn
            )
        if self.coordinator_records:
            records += self._found[LogId.coordinator(self.node)]
        # 2PC votes of ours whose coordinator's log, scanned, holds the COMMIT.
        committed_2pc = {record.txn for log in self._logs if log.kind is LogKind.COORDINATOR
                         for record in self._found[log] if self._commits_ours(record)}
        committed = frozenset(
            (record.log.name, record.txn) for record in records
            if record.log.kind is LogKind.PARTITION and record.state is TxnState.VOTE_YES
            and (record.txn in self._committed or record.txn in committed_2pc))
        return RecoveryResult(tuple(records), committed)

    def _scan(self, log: LogId, after: str) -> ScanLog:
        return ScanLog(self.owner, log, after, self.config.scan_page_count_max)

    def _list_identities(self, after: str) -> ListIdentities:
        # The scans' page size, so the simulator's small pages page the listing too.
        return ListIdentities(self.owner, after, min(self.config.scan_page_count_max, IDENTITY_PAGE_COUNT_MAX))

    def _issue(self, calls: Sequence[_Call]) -> list[Effect]:
        self._waiting.update(calls)
        return list(calls)

    def _timer(self, kind: str) -> Timer:
        return Timer(self.owner, "", kind)
