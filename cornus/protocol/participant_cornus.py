"""Cornus participant (Algorithm 1, lines 11-25): LogOnce(VOTE_YES), then wait for the decision or
end the transaction itself through `Termination` against every other participant's log."""

from __future__ import annotations

from cornus.protocol.effects import ApplyRedo, CancelTimer, Effect, Log, LogOnce, StartTimer
from cornus.protocol.events import (
    Event,
    Executed,
    LogReturned,
    MessageReceived,
    Recovered,
    StorageUnreachable,
    TimerFired,
)
from cornus.protocol.messages import Decision, Prepare
from cornus.protocol.participant_base import ParticipantBase, Phase
from cornus.protocol.termination import Termination
from storage_adapters.contract import LogId, LogOnceResult, Record, TxnState


class CornusParticipant(ParticipantBase):
    termination: Termination | None = None
    _own_call: LogOnce | Log | None = None
    _heard: TxnState | None = None  # a decision that arrived while our vote was in flight

    def _handle(self, event: Event) -> list[Effect]:
        if isinstance(event, Executed):
            assert self.phase is Phase.WORKING and not self.coordinator, "executed twice"
            self.coordinator, self.redo, self.vote_yes = event.coordinator, event.redo, event.vote_yes
            return [StartTimer(self._timer("prepare"), self.config.timeout_ms_prepare)]
        if isinstance(event, Recovered):
            return self._recover(event.record)
        if isinstance(event, MessageReceived):
            if isinstance(event.message, Prepare):
                return self._on_prepare(event.message)
            if isinstance(event.message, Decision):
                return self._on_decision(event.message.decision)
            return []  # Cornus needs no queries or answers
        if isinstance(event, LogReturned):
            return self._on_log_returned(event)
        assert isinstance(event, TimerFired)
        return self._on_timer(event.name.rsplit("/", 1)[1])

    def _on_prepare(self, prepare: Prepare) -> list[Effect]:
        if self.phase is not Phase.WORKING:
            return []  # a duplicate: our vote (or abort) is already under way
        assert self.partition in prepare.participants, "prepare sent to a non-participant"
        self.participants, self.coordinator = prepare.participants, prepare.coordinator
        effects: list[Effect] = [CancelTimer(self._timer("prepare"))]
        if not self.vote_yes:
            return effects + self._abort_unilaterally()
        self.phase = Phase.VOTING
        self._own_call = LogOnce(self.log, self.txn, TxnState.VOTE_YES, self._body())
        return [*effects, self._own_call]

    def _abort_unilaterally(self) -> list[Effect]:
        # LogOnce, not Log: if a terminator got there first it already wrote ABORT, which is fine;
        # it can never find anything else, since only we write VOTE_YES to our log.
        self._learned(TxnState.ABORT)
        self.phase = Phase.DECIDING
        self._own_call = LogOnce(self.log, self.txn, TxnState.ABORT, self._body())
        return [self._own_call, *self._vote(False), *self._release()]

    def _on_decision(self, decision: TxnState) -> list[Effect]:
        if self.phase is Phase.WORKING:
            assert decision is TxnState.ABORT, "COMMIT reached a participant that never voted"
            return [CancelTimer(self._timer("prepare")), *self._abort_unilaterally()]
        if self.phase is Phase.VOTING:
            assert self._heard in (None, decision)
            self._heard = decision
            return []
        if self.phase is Phase.VOTED:
            return self._decide(decision)
        self._learned(decision)
        self._redelivered_decision()
        return []

    def _decide(self, decision: TxnState) -> list[Effect]:
        assert self.phase is Phase.VOTED
        self._learned(decision)
        self.phase = Phase.DECIDING
        self._own_call = Log(self.log, self.txn, decision)
        return [
            CancelTimer(self._timer("decision")),
            CancelTimer(self._timer("termination")),
            self._own_call,
        ]

    def _on_log_returned(self, event: LogReturned) -> list[Effect]:
        call, result = event.call, event.result
        if call.log != self.log:
            assert isinstance(call, LogOnce) and not isinstance(result, TxnState)
            if self.termination is None or self.phase is not Phase.VOTED:
                return []  # the decision is known locally: termination answers no longer matter
            effects = self.termination.on_result(call, result)
            if self.termination.outcome is not None:
                effects += self._decide(self.termination.outcome)
            return effects
        if isinstance(result, StorageUnreachable):
            return [StartTimer(self._timer("retry"), self._backoff.next_delay_ms())]
        self._backoff.reset()
        state = result.state if isinstance(result, LogOnceResult) else result
        if self.phase is Phase.VOTING:
            return self._on_vote_logged(state)
        assert self.phase is Phase.DECIDING, f"own log answered in phase {self.phase}"
        assert state is self.decision, f"own record holds {state}, decision is {self.decision}"
        self.phase = Phase.DONE
        effects: list[Effect] = []
        if state is TxnState.COMMIT:
            effects.append(ApplyRedo(self.partition, self.txn, self.redo))
        return effects + self._release()

    def _on_vote_logged(self, state: TxnState) -> list[Effect]:
        assert state is not TxnState.COMMIT, "COMMIT in our log before our vote returned"
        if state is TxnState.ABORT:
            # A terminator aborted on our behalf (paper line 16): the record already says ABORT.
            self._learned(TxnState.ABORT)
            self.phase = Phase.DONE
            return self._vote(False) + self._release()
        self.phase = Phase.VOTED
        if self._heard is not None:
            return self._decide(self._heard)
        return [*self._vote(True), StartTimer(self._timer("decision"), self.config.timeout_ms_decision)]

    def _on_timer(self, kind: str) -> list[Effect]:
        if kind == "prepare":
            return self._abort_unilaterally() if self.phase is Phase.WORKING else []
        if kind == "retry":
            assert self._own_call is not None and self.phase in (Phase.VOTING, Phase.DECIDING)
            return [self._own_call]
        if kind == "decision":
            return self._start_termination() if self.phase is Phase.VOTED else []
        assert kind == "termination", kind
        if self.termination is None or self.phase is not Phase.VOTED:
            return []
        return self.termination.on_timer()

    def _start_termination(self) -> list[Effect]:
        others = tuple(LogId.partition(p) for p in self.participants if p != self.partition)
        self.termination = Termination(self.txn, others, self._body(), self._backoff, self._timer("termination"))
        effects = self.termination.start()
        if self.termination.outcome is not None:
            effects += self._decide(self.termination.outcome)
        return effects

    def _recover(self, record: Record) -> list[Effect]:
        assert self.phase is Phase.WORKING and record.log == self.log
        self.participants, self.coordinator = record.body.participants, record.body.coordinator
        self.redo = record.body.redo
        if record.state is TxnState.VOTE_YES:
            # Paper 3.4, participant cases 3-4: learn the outcome by termination.
            self.phase = Phase.VOTED
            return self._start_termination()
        self._learned(record.state)
        self.phase = Phase.DONE
        if record.state is TxnState.COMMIT and not record.applied:
            return [ApplyRedo(self.partition, self.txn, self.redo), *self._release()]
        return self._release()
