"""Cornus participant (Algorithm 1, lines 11-25): LogOnce(VOTE_YES), then wait for the decision or
end the transaction itself through `Termination` against every other participant's log."""

from __future__ import annotations

from cornus.protocol import txn_ids
from cornus.protocol.effects import (
    CancelTimer,
    Effect,
    LocksPrepared,
    Log,
    LogOnce,
    StartTimer,
    TerminationEnded,
    TerminationStarted,
)
from cornus.protocol.events import LogReturned
from cornus.protocol.messages import Decision, Prepare, Vote
from cornus.protocol.participant_base import ParticipantBase, Phase
from cornus.protocol.termination import Termination
from storage_adapters.contract import LogId, RecordBody, TxnState


class CornusParticipant(ParticipantBase):
    termination: Termination | None = None
    _own_call: LogOnce | Log | None = None
    _heard: TxnState | None = None  # a decision that arrived while our vote was in flight

    def _on_message(self, sender: str, message: object) -> list[Effect]:
        if isinstance(message, Prepare):
            return self._on_prepare(message)
        if isinstance(message, Decision):
            return self._on_decision(message.decision)
        return []  # Cornus needs no queries or answers

    def _on_prepare(self, prepare: Prepare) -> list[Effect]:
        if self.phase is not Phase.WORKING:
            return []  # a duplicate: our vote (or abort) is already under way
        assert self.partition in prepare.participants, "prepare sent to a non-participant"
        self.participants, self.coordinator = prepare.participants, prepare.coordinator
        effects: list[Effect] = [CancelTimer(self._timer("prepare"))]
        if not self.vote_yes:
            return effects + self._abort_unilaterally()
        self.phase = Phase.VOTING
        self._own_call = LogOnce(self.partition, self.log, self.txn, TxnState.VOTE_YES, self._body())
        # From our vote on, our locks go only at the decision, and we take no more: a request that
        # meets them may wait (bounded) without any risk of deadlock, rather than abort. Marked
        # now, not once the vote is durable: a one-shot's retry after an abort would otherwise
        # meet its own previous attempt's locks while that attempt's vote is still in flight.
        return [*effects, LocksPrepared(self.partition, self.txn), self._own_call]

    def _abort_unilaterally(self) -> list[Effect]:
        # LogOnce, not Log: if a terminator got there first it already wrote ABORT, which is fine;
        # it can never find anything else, since only we write VOTE_YES to our log.
        self._learned(TxnState.ABORT)
        self.phase = Phase.DECIDING
        self._own_call = LogOnce(self.partition, self.log, self.txn, TxnState.ABORT, self._body())
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
        effects: list[Effect] = [CancelTimer(self._timer("decision"))]
        if self.termination is not None:
            effects += [CancelTimer(self._timer("termination")), TerminationEnded(self.txn, self.partition, decision)]
        if decision is TxnState.COMMIT:
            # Our record holds our VOTE_YES: the apply records the COMMIT with the data.
            return effects + self._commit_over_vote()
        self.phase = Phase.DECIDING
        self._own_call = Log(self.partition, self.log, self.txn, decision)
        return [*effects, self._own_call]

    def _on_other_log(self, event: LogReturned) -> list[Effect]:
        call, result = event.call, event.result
        assert isinstance(call, LogOnce) and not isinstance(result, TxnState)
        if self.termination is None or self.phase is not Phase.VOTED:
            return []  # the decision is known locally: termination answers no longer matter
        effects = self.termination.on_result(call, result)
        if self.termination.outcome is not None:
            effects += self._decide(self.termination.outcome)
        return effects

    def _on_own_log(self, state: TxnState) -> list[Effect]:
        if self.phase is Phase.VOTING:
            return self._on_vote_logged(state)
        return self._decision_durable(state)

    def _on_vote_logged(self, state: TxnState) -> list[Effect]:
        if state is TxnState.COMMIT:
            # Our vote met the transaction's COMMIT: a second run here of a client-chosen id whose
            # first run voted, committed and ended here, its memory lost to this tenure or pushed
            # out (PartitionExecutions' BEFORE_TENURE and ENDED refuse the ones they can tell).
            # The COMMIT is the transaction's and was applied by the machine that logged it; this
            # run's redo is not the logged one and must not apply. Its coordinator, told we do
            # not know, ends it through the logs (found by audit, 2026-11-28, third: an assertion
            # here crashed the owner).
            assert txn_ids.is_client_chosen(self.txn), f"COMMIT in our log before our vote returned: {self.txn}"
            self._learned(TxnState.COMMIT)
            self.phase = Phase.DONE
            return [self._send(self.coordinator, Vote(self.txn, self.partition, False, unknown=True)), *self._release()]
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
            return self._uncertain() if self.phase is Phase.VOTED else []
        assert kind == "termination", kind
        if self.termination is None or self.phase is not Phase.VOTED:
            return []
        return self.termination.on_timer()

    def _uncertain(self) -> list[Effect]:
        assert self.phase is Phase.VOTED and self.termination is None
        others = tuple(LogId.partition(p) for p in self.participants if p != self.partition)
        # The ABORTs it may write in the others' logs carry the participants (so a recovery there
        # can run termination in turn), not this partition's redo: nothing applies an ABORT's, and
        # it copied up to REDO_BYTES_MAX of this partition's data into every other log (found by
        # audit, 2026-11-28).
        body = RecordBody(self.participants, self.coordinator)
        self.termination = Termination(
            self.partition, self.txn, others, body, backoff=self._backoff, timer=self._timer("termination")
        )
        effects: list[Effect] = [TerminationStarted(self.txn, self.partition), *self.termination.start()]
        if self.termination.outcome is not None:
            effects += self._decide(self.termination.outcome)
        return effects

