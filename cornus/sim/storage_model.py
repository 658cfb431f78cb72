"""In-memory model of the LogStore contract (log_once, log refusing decision flips, read, paged
scans of unfinished and of finished records, apply of a redo to the data and to its vote, delete,
tombstones that expire), plus the history
the invariant checker needs. It records a violation instead of raising, so a run reports everything
it broke."""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field

from cornus.sim import redo
from storage_adapters.contract import (
    LogId,
    LogKind,
    LogOnceResult,
    Record,
    RecordBody,
    ScanPage,
    Tombstone,
    TxnState,
    check_tombstone,
    validate_tombstone,
)
from storage_adapters.errors import InvariantViolation


def _log_of(key: str) -> LogId:
    kind, _, name = key.partition(".")
    return LogId.partition(name) if kind == LogKind.PARTITION.value else LogId.coordinator(name)


class WriteRefused(Exception):
    """`log` was asked to flip a decision (or turn one back into a vote); nothing was written."""


@dataclass(slots=True)
class StoredRecord:
    state: TxnState
    body: RecordBody
    applied: bool = False
    # A tombstone's end, in the simulator's clock (None: not a tombstone).
    expires_at_ms: int | None = None
    # When the record was created, by the clock of the call that created it as it left (as
    # DynamoDB and Azure stamp it: a call that lands late carries an older time than its landing);
    # a tombstone over a record keeps the record's.
    created_at_ms: int = 0


@dataclass(slots=True)
class StorageModel:
    records: dict[tuple[LogId, str], StoredRecord] = field(default_factory=dict)
    # Committed data: (partition, key) -> value (a version number: every write increments it).
    data: dict[tuple[str, str], int] = field(default_factory=dict)
    # Last state of every deleted record, so the checker can still judge the participant.
    deleted: dict[tuple[LogId, str], TxnState] = field(default_factory=dict)
    # Per transaction, every decision any log ever held; every (log, txn) that ever held VOTE_YES.
    decisions_seen: dict[str, set[TxnState]] = field(default_factory=dict)
    voted_yes: set[tuple[LogId, str]] = field(default_factory=set)
    # Transactions that ever had a tombstone: once it expired, deleting what is left loses nothing.
    tombstoned: set[str] = field(default_factory=set)
    # (expires_at_ms, log key, txn) of every tombstone written, soonest first (keys, not LogIds,
    # which do not order).
    expiries: list[tuple[int, str, str]] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)

    def _created(self, log: LogId, txn: str, state: TxnState) -> None:
        if (log, txn) in self.deleted:
            self.violations.append(f"record {log.key}/{txn} recreated as {state} after garbage collection")
        self._saw(log, txn, state)

    def _saw(self, log: LogId, txn: str, state: TxnState) -> None:
        if state is TxnState.VOTE_YES:
            self.voted_yes.add((log, txn))
        else:
            self.decisions_seen.setdefault(txn, set()).add(state)

    def log_once(self, log: LogId, txn: str, state: TxnState, body: RecordBody,
                 created_at_ms: int = 0) -> LogOnceResult:
        stored = self.records.get((log, txn))
        if stored is not None:
            return LogOnceResult(stored.state, created=False)
        self.records[(log, txn)] = StoredRecord(state, body, created_at_ms=created_at_ms)
        self._created(log, txn, state)
        return LogOnceResult(state, created=True)

    def log(self, log: LogId, txn: str, state: TxnState, body: RecordBody | None, created_at_ms: int = 0) -> TxnState:
        stored = self.records.get((log, txn))
        if stored is None:
            self.records[(log, txn)] = StoredRecord(state, body or RecordBody(), created_at_ms=created_at_ms)
            self._created(log, txn, state)
            return state
        if stored.state is not TxnState.VOTE_YES and stored.state is not state:
            # The contract refuses this write and writes nothing. A late landing of a call its
            # caller retried meets this harmlessly; an answered one would crash the runtime.
            raise WriteRefused(f"log({state}) over {stored.state} refused for {log.key}/{txn}")
        stored.state = state
        if body is not None:
            stored.body = body
        self._saw(log, txn, state)
        return state

    def read(self, log: LogId, txn: str) -> Record | None:
        stored = self.records.get((log, txn))
        if stored is None:
            return None
        return Record(log, txn, stored.state, stored.body, stored.applied, stored.created_at_ms)

    def apply(self, partition: str, txn: str, redo_bytes: bytes) -> bool:
        """The contract's apply_redo: data, COMMIT and the applied mark together; a record applied
        before is left alone (False). A VOTE_YES record is the participant's own, applied once it
        knows of the COMMIT: the apply is where its log records that decision, so the checker
        counts it as a COMMIT seen, and an apply over a vote of a transaction that aborted shows
        up as a disagreement."""
        log = LogId.partition(partition)
        stored = self.records.get((log, txn))
        if stored is None or stored.state is TxnState.ABORT:
            state = None if stored is None else stored.state
            self.violations.append(f"redo applied to {log.key}/{txn} whose record is {state}")
            return False
        if stored.applied:
            return False
        if stored.state is TxnState.VOTE_YES:
            stored.state = TxnState.COMMIT
            self._saw(log, txn, TxnState.COMMIT)
        for key, value in redo.decode(redo_bytes).items():
            self.data[(partition, key)] = value
        stored.applied = True
        return True

    def delete(self, log: LogId, txn: str) -> bool:
        stored = self.records.pop((log, txn), None)
        if stored is None:
            return False
        if log.kind is LogKind.PARTITION and stored.state.is_decision and txn not in self.tombstoned and not any(
            record_log.kind is LogKind.PARTITION and record_txn == txn for record_log, record_txn in self.records
        ):
            self.violations.append(
                f"garbage collection deleted {log.key}/{txn}, the last record of a {stored.state} "
                "transaction, and no tombstone keeps its outcome"
            )
        # A coordinator-log redo record of an aborted transaction may go; a vote may not.
        if stored.state is TxnState.VOTE_YES and log.kind is LogKind.PARTITION:
            self.violations.append(f"garbage collection deleted undecided record {log.key}/{txn}")
        if stored.state is TxnState.COMMIT and log.kind is LogKind.PARTITION and not stored.applied:
            self.violations.append(f"garbage collection deleted {log.key}/{txn}, a COMMIT never applied")
        self.deleted[(log, txn)] = stored.state
        return True

    def keep(self, log: LogId, txn: str, keep: Tombstone, now_ms: int, created_at_ms: int = 0) -> bool:
        """The contract's delete with a tombstone: refused (nothing written) as `check_tombstone`
        says; storage drops it at `expire`. Deleting the last record of a decided transaction
        without one would lose its outcome, which `delete` reports. A tombstone written again
        into a slot its earlier one left (a collection retried after its first try landed unheard,
        a slow coordinator's own collection after a sweeper's tombstone expired) holds every
        decision the transaction ever had: it brings back nothing a reader could take for more,
        so it is no record re-created; one of another decision is."""
        validate_tombstone(keep, log)
        stored = self.records.get((log, txn))
        try:
            check_tombstone(log, txn, None if stored is None else stored.state,
                            stored is not None and stored.applied, keep)
        except InvariantViolation as refused:
            raise WriteRefused(str(refused)) from refused
        if stored is None and not (txn in self.tombstoned and self.decisions_seen.get(txn, set()) <= {keep.decision}):
            self._created(log, txn, keep.decision)
        else:
            self._saw(log, txn, keep.decision)
        expires_at_ms = now_ms + keep.keep_ms
        created_ms = created_at_ms if stored is None else stored.created_at_ms
        self.records[(log, txn)] = StoredRecord(keep.decision, RecordBody(), keep.decision is TxnState.COMMIT,
                                                expires_at_ms, created_ms)
        heapq.heappush(self.expiries, (expires_at_ms, log.key, txn))
        self.tombstoned.add(txn)
        return stored is not None

    def expire(self, now_ms: int) -> None:
        """Storage drops the tombstones whose time has come (it may do so later, never sooner)."""
        while self.expiries and self.expiries[0][0] <= now_ms:
            expires_at_ms, log_key, txn = heapq.heappop(self.expiries)
            key = (_log_of(log_key), txn)
            stored = self.records.get(key)
            if stored is not None and stored.expires_at_ms == expires_at_ms:  # not re-kept or deleted since
                self.deleted[key] = self.records.pop(key).state

    def state(self, log: LogId, txn: str) -> TxnState | None:
        stored = self.records.get((log, txn))
        return None if stored is None else stored.state

    def state_at(self, log: LogId, txn: str, now_ms: int) -> TxnState | None:
        """What a read at `now_ms` finds, without purging: a tombstone past its time is gone then
        (storage may drop it as late as it likes, and a reader must cope with the earliest)."""
        stored = self.records.get((log, txn))
        if stored is None or (stored.expires_at_ms is not None and stored.expires_at_ms <= now_ms):
            return None
        return stored.state

    def final_state(self, log: LogId, txn: str) -> TxnState | None:
        """What the log ends with for the transaction, counting a collected record's last state."""
        state = self.state(log, txn)
        return self.deleted.get((log, txn)) if state is None else state

    def scan_unfinished(self, log: LogId, after: str, limit: int) -> ScanPage:
        """The page of a backend whose scan walks only unfinished records (an index)."""
        found = sorted(
            (txn, stored) for (record_log, txn), stored in self.records.items()
            if record_log == log and txn > after
            and (stored.state is TxnState.VOTE_YES or (stored.state is TxnState.COMMIT and not stored.applied))
        )
        records = tuple(Record(log, txn, stored.state, stored.body, stored.applied) for txn, stored in found[:limit])
        return ScanPage(records, records[-1].txn if len(records) == limit else None)

    def scan_finished(self, log: LogId, after: str, limit: int) -> ScanPage:
        """The contract's `scan_finished_page` on a backend that indexes finished records (Redis's
        `~finished` set, the emulator's query): ABORT, and COMMIT with its redo applied (so never a
        coordinator log's own COMMIT), not tombstones, without the redo."""
        found = sorted(
            (txn, stored) for (record_log, txn), stored in self.records.items()
            if record_log == log and txn > after and stored.expires_at_ms is None
            and (stored.state is TxnState.ABORT or (stored.state is TxnState.COMMIT and stored.applied))
        )
        records = tuple(
            Record(log, txn, stored.state, RecordBody(stored.body.participants, stored.body.coordinator),
                   stored.applied, stored.created_at_ms)
            for txn, stored in found[:limit]
        )
        return ScanPage(records, records[-1].txn if len(records) == limit else None)

    def stopped_short(self, log: LogId, after: str, page: ScanPage, rng: random.Random) -> ScanPage:
        """`page` as a backend that walks finished records may answer it (Azure's listing, DynamoDB's
        filtered query): its walk stopped at some stored record past `after`, unfinished or not,
        and the page holds the unfinished ones up to there and resumes there. Where the page was
        full, the walk stopped before its last record, or what lay past it would be skipped."""
        stops = [txn for (record_log, txn) in self.records if record_log == log and txn > after
                 and (page.resume_after is None or txn < page.records[-1].txn)]
        if not stops:
            return page
        stop = rng.choice(sorted(stops))
        return ScanPage(tuple(record for record in page.records if record.txn <= stop), stop)
