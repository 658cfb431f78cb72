"""What every coordinator machine shares: announcing a decision, resending it until every
participant acknowledges, and garbage collection after a grace period (DESIGN section 4)."""

from __future__ import annotations

import enum

from cornus.protocol.backoff import Backoff, JitterSource
from cornus.protocol.config import ProtocolConfig
from cornus.protocol.effects import (
    CancelTimer,
    DeleteRecord,
    Effect,
    Log,
    LogOnce,
    Reply,
    Send,
    StartTimer,
)
from cornus.protocol.events import CommitRequested, Event, LogReturned, MessageReceived, TimerFired
from cornus.protocol.messages import Decision, DecisionAck, Prepare, ReleaseReadOnly, Vote
from storage_adapters.contract import LogId, TxnState


class CoordPhase(enum.Enum):
    COLLECTING = "collecting"  # prepares sent, waiting for votes (or terminating, in Cornus)
    DECIDED = "decided"  # outcome known and announced; waiting for acks
    GC_WAIT = "gc_wait"  # all acked; deleting records after the grace period
    DONE = "done"


class CoordinatorBase:
    """One transaction's coordinator. Subclasses implement the vote and decision logic."""

    # Whether this protocol keeps a record in the coordinator's own log (GC deletes it too).
    uses_coordinator_log = False

    def __init__(self, node: str, txn: str, config: ProtocolConfig, jitter: JitterSource) -> None:
        self.node = node
        self.txn = txn
        self.config = config
        self.coordinator_log = LogId.coordinator(node)
        self.phase = CoordPhase.COLLECTING
        self.participants: tuple[str, ...] = ()
        self.redo_by_partition: dict[str, bytes] = {}
        self.votes_yes: set[str] = set()
        self.decision: TxnState | None = None
        self.replied = False
        self.acked: set[str] = set()
        self.calls_in_flight = 0
        self._backoff = Backoff(config.backoff_ms_min, config.backoff_ms_max, jitter)
        self._resend_backoff = Backoff(config.timeout_ms_resend, config.backoff_ms_max, jitter)

    def handle(self, event: Event) -> list[Effect]:
        if isinstance(event, LogReturned):
            assert self.calls_in_flight > 0, "a log call returned that this machine never made"
            self.calls_in_flight -= 1
        effects = self._dispatch(event)
        for effect in effects:
            if isinstance(effect, LogOnce | Log):
                self.calls_in_flight += 1
        if self.phase is CoordPhase.DECIDED and self.calls_in_flight == 0 and self.acked >= set(self.participants):
            # Every participant holds the decision durably and none of our calls can still land:
            # nothing will read these records again. The grace period outlives in-flight messages.
            self.phase = CoordPhase.GC_WAIT
            effects += [CancelTimer(self._timer("resend")), StartTimer(self._timer("gc"), self.config.gc_grace_ms)]
        return effects

    def _dispatch(self, event: Event) -> list[Effect]:
        if isinstance(event, CommitRequested):
            return self._start(event)
        if isinstance(event, MessageReceived) and isinstance(event.message, DecisionAck):
            return self._on_ack(event.message)
        if isinstance(event, MessageReceived) and isinstance(event.message, Vote):
            return self._on_vote(event.message)
        if isinstance(event, TimerFired):
            kind = event.name.rsplit("/", 1)[1]
            if kind == "resend":
                return self._resend() if self.phase is CoordPhase.DECIDED else []
            if kind == "gc":
                return self._collect_garbage()
            return self._on_timer(kind)
        return self._handle(event)

    # -- shared steps -------------------------------------------------------------------------
    def _start(self, request: CommitRequested) -> list[Effect]:
        assert self.phase is CoordPhase.COLLECTING and not self.participants, "commit requested twice"
        assert request.txn == self.txn
        self.redo_by_partition = dict(request.writes)
        self.participants = tuple(sorted(self.redo_by_partition))
        assert len(self.participants) == len(request.writes), "a partition written twice"
        assert not set(self.participants) & set(request.reads), "read-only partitions must not write"
        effects: list[Effect] = [Send(p, ReleaseReadOnly(self.txn, p)) for p in request.reads]
        if not self.participants:
            # Wholly read-only: nothing to make atomic, skip both phases.
            self.decision, self.replied, self.phase = TxnState.COMMIT, True, CoordPhase.DONE
            return [*effects, Reply(self.txn, TxnState.COMMIT)]
        effects += [Send(p, self._prepare_message(p)) for p in self.participants]
        effects.append(StartTimer(self._timer("votes"), self.config.timeout_ms_votes))
        return effects + self._started()

    def _prepare_message(self, participant: str) -> Prepare:
        return Prepare(self.txn, self.participants, self.node)

    def _announce(self, decision: TxnState, reply: bool = True) -> list[Effect]:
        assert decision.is_decision
        assert self.phase is CoordPhase.COLLECTING, f"announcing in phase {self.phase}"
        assert self.decision in (None, decision)
        if decision is TxnState.COMMIT:
            assert self.votes_yes <= set(self.participants)
        self.decision = decision
        self.phase = CoordPhase.DECIDED
        effects: list[Effect] = [CancelTimer(self._timer("votes"))]
        if reply and not self.replied:
            self.replied = True
            effects.append(Reply(self.txn, decision))
        effects += [Send(p, self._decision_message(p)) for p in self.participants if p not in self.acked]
        effects.append(StartTimer(self._timer("resend"), self._resend_backoff.next_delay_ms()))
        return effects

    def _decision_message(self, participant: str) -> Decision:
        assert self.decision is not None
        return Decision(self.txn, self.decision)

    def _resend(self) -> list[Effect]:
        unacked = [p for p in self.participants if p not in self.acked]
        effects: list[Effect] = [Send(p, self._decision_message(p)) for p in unacked]
        return [*effects, StartTimer(self._timer("resend"), self._resend_backoff.next_delay_ms())]

    def _on_ack(self, ack: DecisionAck) -> list[Effect]:
        if ack.partition not in self.participants:
            return []
        self.acked.add(ack.partition)
        if self.decision is not None:
            assert ack.decision is self.decision, (
                f"{ack.partition} durably holds {ack.decision}, coordinator decided {self.decision}"
            )
            return []
        if self.phase is CoordPhase.COLLECTING and self._may_adopt(ack.decision):
            # A durable decision at a participant is the transaction's outcome.
            return self._announce(ack.decision)
        return []

    def _collect_garbage(self) -> list[Effect]:
        if self.phase is not CoordPhase.GC_WAIT:
            return []
        self.phase = CoordPhase.DONE
        effects: list[Effect] = []
        if self.uses_coordinator_log:
            # Our own record goes first (the runtime deletes in list order): while it exists a
            # restart of ours resends its decision, and a participant whose record is already gone
            # would take a resent COMMIT for a new transaction and apply an old redo again.
            effects.append(DeleteRecord(self.coordinator_log, self.txn))
        effects += [DeleteRecord(LogId.partition(p), self.txn) for p in self.participants]
        return effects

    def _timer(self, kind: str) -> str:
        return f"{self.node}/{self.txn}/{kind}"

    # -- for subclasses -----------------------------------------------------------------------
    def _started(self) -> list[Effect]:
        return []

    def _may_adopt(self, decision: TxnState) -> bool:
        return True

    def _on_vote(self, vote: Vote) -> list[Effect]:
        raise NotImplementedError

    def _on_timer(self, kind: str) -> list[Effect]:
        raise NotImplementedError

    def _handle(self, event: Event) -> list[Effect]:
        raise NotImplementedError
