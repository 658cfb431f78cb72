"""In-memory model of the LogStore contract: log_once, log (refusing decision flips), apply,
delete and scan_unfinished, plus the history the invariant checker needs."""

from __future__ import annotations

from dataclasses import dataclass, field

from storage_adapters.contract import LogId, LogKind, LogOnceResult, Record, RecordBody, TxnState


@dataclass(slots=True)
class StoredRecord:
    state: TxnState
    body: RecordBody
    applied: bool = False


@dataclass(slots=True)
class StorageModel:
    records: dict[tuple[LogId, str], StoredRecord] = field(default_factory=dict)
    # Last state of every deleted record, so the checker can still judge the participant.
    deleted: dict[tuple[LogId, str], TxnState] = field(default_factory=dict)
    # Every decision state any partition or coordinator log ever held, and every log that ever
    # held VOTE_YES.
    decisions_seen: set[TxnState] = field(default_factory=set)
    voted_yes: set[LogId] = field(default_factory=set)
    violations: list[str] = field(default_factory=list)

    def _created(self, log: LogId, txn: str, state: TxnState) -> None:
        if (log, txn) in self.deleted:
            self.violations.append(f"record {log.key}/{txn} recreated as {state} after garbage collection")
        self._saw(log, state)

    def _saw(self, log: LogId, state: TxnState) -> None:
        if state is TxnState.VOTE_YES:
            self.voted_yes.add(log)
        else:
            self.decisions_seen.add(state)

    def log_once(self, log: LogId, txn: str, state: TxnState, body: RecordBody) -> LogOnceResult:
        stored = self.records.get((log, txn))
        if stored is not None:
            return LogOnceResult(stored.state, created=False)
        self.records[(log, txn)] = StoredRecord(state, body)
        self._created(log, txn, state)
        return LogOnceResult(state, created=True)

    def log(self, log: LogId, txn: str, state: TxnState, body: RecordBody | None) -> TxnState:
        stored = self.records.get((log, txn))
        if stored is None:
            self.records[(log, txn)] = StoredRecord(state, body or RecordBody())
            self._created(log, txn, state)
            return state
        if stored.state is not TxnState.VOTE_YES and stored.state is not state:
            # The contract refuses this write; a correct protocol never asks for it.
            self.violations.append(f"log({state}) over {stored.state} refused for {log.key}/{txn}")
            return stored.state
        stored.state = state
        if body is not None:
            stored.body = body
        self._saw(log, state)
        return state

    def apply(self, log: LogId, txn: str) -> None:
        stored = self.records.get((log, txn))
        if stored is None or stored.state is not TxnState.COMMIT:
            state = None if stored is None else stored.state
            self.violations.append(f"redo applied to {log.key}/{txn} whose record is {state}")
            return
        stored.applied = True

    def delete(self, log: LogId, txn: str) -> None:
        stored = self.records.pop((log, txn), None)
        if stored is not None:
            # A coordinator-log redo record of an aborted transaction may go; a vote may not.
            if stored.state is TxnState.VOTE_YES and log.kind is LogKind.PARTITION:
                self.violations.append(f"garbage collection deleted undecided record {log.key}/{txn}")
            self.deleted[(log, txn)] = stored.state

    def state(self, log: LogId, txn: str) -> TxnState | None:
        stored = self.records.get((log, txn))
        return None if stored is None else stored.state

    def scan_unfinished(self, log: LogId) -> list[Record]:
        found = []
        for (record_log, txn), stored in sorted(self.records.items(), key=lambda item: item[0][1]):
            if record_log != log:
                continue
            unfinished = stored.state is TxnState.VOTE_YES or (
                stored.state is TxnState.COMMIT and not stored.applied
            )
            if unfinished:
                found.append(Record(log, txn, stored.state, stored.body, stored.applied))
        return found
