"""Cornus coordinator (Algorithm 1, lines 1-10): reply on all VOTE_YES without logging anything,
send decisions asynchronously, and on a vote timeout terminate through the participants' logs,
for at most coordinator_terminate_ms_max (then give up: the participants terminate by themselves)."""

from __future__ import annotations

from cornus.protocol import txn_ids
from cornus.protocol.coordinator_base import CoordinatorBase, CoordPhase
from cornus.protocol.effects import CancelTimer, Effect, StartTimer, TerminationEnded, TerminationStarted
from cornus.protocol.events import Event, ExecuteFailed, LogReturned, StorageUnreachable
from cornus.protocol.messages import Vote
from cornus.protocol.termination import Termination
from storage_adapters.contract import LogId, LogOnceResult, RecordBody, TxnState


class CornusCoordinator(CoordinatorBase):
    termination: Termination | None = None

    def _on_vote(self, vote: Vote) -> list[Effect]:
        if vote.partition not in self.participants or self.phase is not CoordPhase.COLLECTING:
            return []
        if vote.unknown:
            # The participant may have voted yes, terminated and forgotten (a late copy of our
            # prepare reached it): only its log can tell, so ask the logs now rather than wait.
            return [] if self.termination is not None else self._terminate()
        if not vote.yes:
            return self._announce(TxnState.ABORT, reason=f"{vote.partition} voted no")
        self.votes_yes.add(vote.partition)
        if self.votes_yes == set(self.participants):
            return self._announce(TxnState.COMMIT)
        return []

    def _on_execution_failed(self, failed: ExecuteFailed) -> list[Effect]:
        if failed.refused and not txn_ids.is_client_chosen(self.txn):
            # That partition never voted and never will, so no log can ever hold all VOTE_YES:
            # abort without asking any log, as on a no vote. Not for an id the client chose: it
            # may run at another process of this node too (a pod replaced while its process ran
            # on, the client sending it again), whose request the owner may have voted for and
            # finished, and a refusal of ours says nothing of that vote (found while modelling
            # that in the simulator: ABORTED answered for a transaction the other committed).
            return self._announce(TxnState.ABORT, reason=f"{failed.partition}: {failed.detail}")
        if failed.partition in self.votes_yes:
            return []  # its answer was lost, but its vote came: nothing is missing
        # It may have voted yes: only its log can tell, so ask the logs now, not at the vote timeout.
        return [] if self.termination is not None else self._terminate()

    def _on_timer(self, kind: str) -> list[Effect]:
        if self.phase is not CoordPhase.COLLECTING:
            return []
        if kind == "votes":
            return [] if self.termination is not None else self._terminate()
        if kind == "terminate-limit":
            return self._give_up()
        assert kind == "termination", kind
        assert self.termination is not None
        return self.termination.on_timer()

    def _terminate(self) -> list[Effect]:
        """Paper case "participant fails": ask the logs of those we did not hear yes from; a yes
        vote we received is a VOTE_YES in that participant's log already."""
        silent = tuple(LogId.partition(p) for p in self.participants if p not in self.votes_yes)
        body = RecordBody(self.participants, self.node)
        self.termination = Termination(
            self.node, self.txn, silent, body, backoff=self._backoff, timer=self._timer("termination")
        )
        limit = StartTimer(self._timer("terminate-limit"), self.config.coordinator_terminate_ms_max)
        effects: list[Effect] = [TerminationStarted(self.txn, self.node), limit, *self.termination.start()]
        assert self.termination.outcome is None, "a vote is missing, so some log is asked"
        return effects

    def _give_up(self) -> list[Effect]:
        """Stop asking the logs, undecided: every participant that voted yes terminates by itself,
        one that did not aborts at its prepare timeout, and the caller heard UNKNOWN at its commit
        deadline (the status call reads the records). Answers of calls still in flight are not
        acted on (the phase is no longer COLLECTING), and the machine ends once they are in.
        DONE, as after a decision's collection: nothing is left for this coordinator to do."""
        assert self.termination is not None and self.termination.outcome is None and self.decision is None
        self.phase = CoordPhase.DONE
        return [CancelTimer(self._timer("termination")), CancelTimer(self._timer("votes")),
                TerminationEnded(self.txn, self.node, None)]

    def _handle(self, event: Event) -> list[Effect]:
        if not isinstance(event, LogReturned):
            return []
        assert self.termination is not None, "Cornus coordinators log only through termination"
        if self.phase is not CoordPhase.COLLECTING:
            return []  # decided already: the answer changes nothing
        result = event.result
        assert isinstance(result, LogOnceResult | StorageUnreachable)
        effects = self.termination.on_result(event.call, result)  # type: ignore[arg-type]
        outcome = self.termination.outcome
        if outcome is not None:
            reason = "" if outcome is TxnState.COMMIT else "votes missing; termination found the transaction aborted"
            effects += self._announce(outcome, reason=reason)
        return effects

    def _announce(self, decision: TxnState, reply: bool = True, reason: str = "") -> list[Effect]:
        effects = super()._announce(decision, reply, reason)
        if self.termination is not None:
            # However the outcome came (termination, a late vote, a participant's ack), the
            # termination this coordinator started is over, and its limit with it.
            effects[:0] = [TerminationEnded(self.txn, self.node, decision), CancelTimer(self._timer("terminate-limit"))]
        return effects
