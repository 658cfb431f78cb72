"""Participant of the blocking protocols: 2PC (presumed abort, Log(VOTE_YES)) and coordinator-log
(votes without logging; the coordinator holds the redo). Both end an uncertain transaction only by
cooperative termination: asking the coordinator and the other participants until someone knows."""

from __future__ import annotations

from cornus.protocol.effects import CancelTimer, Effect, LocksPrepared, Log, StartTimer
from cornus.protocol.messages import Decision, DecisionAnswer, DecisionQuery, Prepare
from cornus.protocol.participant_base import ParticipantBase, Phase
from storage_adapters.contract import RecordBody, TxnState

__all__ = ["CoordinatorLogParticipant", "TwoPhaseParticipant"]


class TwoPhaseParticipant(ParticipantBase):
    logs_vote = True
    _own_call: Log | None = None
    _heard: TxnState | None = None

    def _on_message(self, sender: str, message: object) -> list[Effect]:
        if isinstance(message, Prepare):
            return self._on_prepare(message)
        if isinstance(message, Decision):
            return self._on_decision(message.decision)
        if isinstance(message, DecisionAnswer):
            if message.decision is None or self.phase is not Phase.VOTED:
                return []
            return self._decide(message.decision)
        if isinstance(message, DecisionQuery):
            return self._on_query(message)
        return []

    def _on_prepare(self, prepare: Prepare) -> list[Effect]:
        if self.phase is not Phase.WORKING:
            return []
        assert self.partition in prepare.participants, "prepare sent to a non-participant"
        self.participants, self.coordinator = prepare.participants, prepare.coordinator
        effects: list[Effect] = [CancelTimer(self._timer("prepare"))]
        if not self.vote_yes:
            return effects + self._abort_unilaterally()
        # Our locks go only at the decision from here on (see CornusParticipant._on_prepare).
        effects.append(LocksPrepared(self.partition, self.txn))
        if self.logs_vote:
            self.phase = Phase.VOTING
            self._own_call = Log(self.partition, self.log, self.txn, TxnState.VOTE_YES, self._body())
            return [*effects, self._own_call]
        return effects + self._voted()

    def _voted(self) -> list[Effect]:
        self.phase = Phase.VOTED
        if self._heard is not None:
            return self._decide(self._heard)
        return [*self._vote(True), StartTimer(self._timer("decision"), self.config.timeout_ms_decision)]

    def _abort_unilaterally(self) -> list[Effect]:
        # Presumed abort: no record needed, since we never voted yes nobody can commit.
        self._learned(TxnState.ABORT)
        self.phase = Phase.DONE
        return self._vote(False) + self._release()

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

    def _on_query(self, query: DecisionQuery) -> list[Effect]:
        effects: list[Effect] = []
        if self.phase is Phase.WORKING:
            # Not voted yet: abort now, so the asker can stop waiting.
            effects = [CancelTimer(self._timer("prepare")), *self._abort_unilaterally()]
        known = self.decision if self.phase in (Phase.DECIDING, Phase.APPLYING, Phase.DONE) else None
        return [*effects, self._send(query.sender, DecisionAnswer(self.txn, self.partition, known))]

    def _decide(self, decision: TxnState) -> list[Effect]:
        assert self.phase is Phase.VOTED
        self._learned(decision)
        effects: list[Effect] = [CancelTimer(self._timer("decision"))]
        if decision is TxnState.ABORT and not self.logs_vote:
            # Coordinator-log participants keep no record of an abort (absence means abort).
            self.phase = Phase.DONE
            return effects + self._release()
        if decision is TxnState.COMMIT and self.logs_vote:
            # 2PC: our record holds our VOTE_YES, so the apply records the COMMIT with the data.
            # (Coordinator-log has no record of ours yet, so it logs the COMMIT with the redo.)
            return effects + self._commit_over_vote()
        self.phase = Phase.DECIDING
        # Coordinator-log: our first record is the decision, with the redo recovery must apply.
        body = None if self.logs_vote else RecordBody(self.participants, self.coordinator, self.redo)
        self._own_call = Log(self.partition, self.log, self.txn, decision, body)
        return [*effects, self._own_call]

    def _on_own_log(self, state: TxnState) -> list[Effect]:
        if self.phase is Phase.VOTING:
            assert state is TxnState.VOTE_YES, f"our vote came back as {state}"
            return self._voted()
        return self._decision_durable(state)

    def _on_timer(self, kind: str) -> list[Effect]:
        if kind == "prepare":
            return self._abort_unilaterally() if self.phase is Phase.WORKING else []
        if kind == "retry":
            assert self._own_call is not None and self.phase in (Phase.VOTING, Phase.DECIDING)
            return [self._own_call]
        assert kind == "decision", kind
        return self._uncertain() if self.phase is Phase.VOTED else []

    def _uncertain(self) -> list[Effect]:
        # Blocking by design: until the coordinator or a participant that knows answers, we ask
        # again after a capped backoff.
        query = DecisionQuery(self.txn, self.partition)
        asked = [self.coordinator, *(p for p in self.participants if p != self.partition)]
        sends: list[Effect] = [self._send(to, query) for to in asked if to]
        return [*sends, StartTimer(self._timer("decision"), self._backoff.next_delay_ms())]


class CoordinatorLogParticipant(TwoPhaseParticipant):
    logs_vote = False
