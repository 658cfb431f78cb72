"""Coordinators of the blocking protocols. 2PC (presumed abort): log COMMIT, then reply. Coordinator
log (paper 5.6): log every participant's redo in parallel with prepare, then log the decision and
reply. After a restart both resend logged decisions and abort what they never decided."""

from __future__ import annotations

from cornus.protocol import redo_bundle, txn_ids
from cornus.protocol.config import REDO_DURABLE_MS_MAX
from cornus.protocol.coordinator_base import CoordinatorBase, CoordPhase
from cornus.protocol.effects import CancelTimer, ConfirmIdentity, Effect, Log, StartTimer
from cornus.protocol.events import Event, ExecuteFailed, LogReturned, MessageReceived, Recovered, StorageUnreachable
from cornus.protocol.messages import DecisionAnswer, DecisionQuery, Vote
from storage_adapters.contract import LogOnceResult, Record, RecordBody, TxnState


class TwoPhaseCoordinator(CoordinatorBase):
    uses_coordinator_log = True
    logs_redo = False
    _commit_call: Log | None = None
    _redo_call: Log | None = None
    _redo_durable = True
    # An ABORT decided for a client-chosen id, waiting for the identity read (`_abort`).
    _abort_reason: str | None = None
    # Coordinator log: the redo record may exist (its write went out, or recovery found it), and
    # whether a write of it is unanswered; an ABORT is logged over it once none is (`_log_abort`).
    _redo_may_exist = False
    _redo_unanswered = False
    _abort_log_due = False

    def _started(self) -> list[Effect]:
        if not self.logs_redo:
            return []
        self._redo_durable = False
        bundle = redo_bundle.encode(self.redo_by_partition)
        self._redo_call = Log(
            self.node, self.coordinator_log, self.txn, TxnState.VOTE_YES,
            RecordBody(self.participants, self.node, bundle),
        )
        return self._write_redo()

    def _write_redo(self) -> list[Effect]:
        assert self._redo_call is not None and not self._redo_unanswered
        first = not self._redo_may_exist
        self._redo_may_exist = self._redo_unanswered = True
        if first and self.config.timeout_ms_votes > REDO_DURABLE_MS_MAX:
            # Else the vote timeout, which aborts a transaction not committing by then, ends the
            # redo's chance to commit in time.
            return [self._redo_call, StartTimer(self._timer("redo-window"), REDO_DURABLE_MS_MAX)]
        return [self._redo_call]

    def _announce(self, decision: TxnState, reply: bool = True, reason: str = "") -> list[Effect]:
        effects = super()._announce(decision, reply, reason)
        if self._redo_may_exist and self.config.timeout_ms_votes > REDO_DURABLE_MS_MAX:
            effects.append(CancelTimer(self._timer("redo-window")))
        if decision is TxnState.ABORT and self._redo_may_exist:
            self._abort_log_due = True
            effects += self._log_abort()
        return effects

    def _log_abort(self) -> list[Effect]:
        """Log ABORT over the redo record (found by audit: left VOTE_YES until its collection, a
        coordinator stopped for good within the grace period left it so for ever, and every later
        recovery of a participant's partition took it for an open yes vote, locking its keys and
        asking the gone coordinator). Only once no write of the redo is unanswered: two writes of
        one record in flight may land in either order, and the redo's landing on the ABORT would
        be refused as a decision flip. One attempt: collection, which waits for it, deletes the
        record (or leaves its ABORT tombstone) anyway; only a coordinator that stops for good
        before that depends on it. Presumed abort holds without it: nothing here may commit."""
        if not self._abort_log_due or self._redo_unanswered:
            return []
        self._abort_log_due = False
        body = RecordBody(self.participants, self.node)
        return [Log(self.node, self.coordinator_log, self.txn, TxnState.ABORT, body)]

    def _on_vote(self, vote: Vote) -> list[Effect]:
        if vote.partition not in self.participants or self.phase is not CoordPhase.COLLECTING:
            return []
        if self._commit_call is not None:
            return []  # every vote was yes already
        if vote.unknown or not vote.yes:
            # A 2PC or coordinator-log participant learns the decision only through us, so one
            # that no longer knows the transaction never voted yes while we are collecting.
            return self._abort(f"{vote.partition} voted no")
        self.votes_yes.add(vote.partition)
        return self._maybe_commit()

    def _on_execution_failed(self, failed: ExecuteFailed) -> list[Effect]:
        if self._commit_call is not None:
            # Every vote was yes (its answer was lost, its vote was not): COMMIT is being logged.
            # A refusal then is of a client-chosen id whose vote came from another process's
            # request (CoordinatorBase._on_execute_failed).
            assert not failed.refused or txn_ids.is_client_chosen(self.txn), failed
            return []
        # Presumed abort: until COMMIT is logged, ABORT is ours to choose, whatever that
        # partition did; a participant that voted yes learns it from us.
        return self._abort(f"{failed.partition}: {failed.detail}")

    def _maybe_commit(self) -> list[Effect]:
        if (self.votes_yes != set(self.participants) or not self._redo_durable or self._commit_call
                or self._abort_reason is not None):
            return []
        body = None if self.logs_redo else RecordBody(self.participants, self.node)
        self._commit_call = Log(self.node, self.coordinator_log, self.txn, TxnState.COMMIT, body)
        return [*self._settle(TxnState.COMMIT), CancelTimer(self._timer("votes")), self._commit_call]

    def _abort(self, reason: str) -> list[Effect]:
        """Decide ABORT, which presumed abort records nowhere. For an id the client chose, only
        once a read of the node's identity record made after this decision found it ours: the
        client may have sent the id to a later process of this node too (a pod replaced while
        this one ran on), which accepts only ids begun after it took the identity, so that read
        finds its take; else it may commit the transaction while ours, heard later, aborts it
        at a participant (found by the simulator's cut twins). Until then nothing commits here."""
        if not txn_ids.is_client_chosen(self.txn):
            return self._announce(TxnState.ABORT, reason=reason)
        if self._abort_reason is not None:
            return []  # decided already; the read is on its way
        self._abort_reason = reason
        return [CancelTimer(self._timer("votes")), ConfirmIdentity(self.node, self.txn)]

    def abort_confirmed(self) -> list[Effect]:
        """The identity read `_abort` waited for found the identity this process's."""
        assert self._abort_reason is not None and self._commit_call is None, self.txn
        if self.phase is not CoordPhase.COLLECTING:
            return []  # a participant's ABORT acknowledgement decided it meanwhile
        # Called by the host, not through `handle`: the ABORT's write over the redo is counted here.
        return self._counted(self._announce(TxnState.ABORT, reason=self._abort_reason))

    def _may_adopt(self, decision: TxnState) -> bool:
        """Not once COMMIT is being logged: only that write's result decides then. An ABORT then
        is a participant's that a later process of this node told ABORT: it presumes so only after
        a read of the identity record found its own take (CoordinatorHost._unknown), which fences
        this process's COMMIT, refused wherever it lands (and landed nowhere before, or that
        process's recovery would have found it and resent COMMIT). So this process was deposed
        without knowing, cut off from storage alone, and its COMMIT's refusal or its next identity
        check will tell it (found by the simulator's storage cuts, 2026-11-28, third: an assertion
        here crashed the process)."""
        return self._commit_call is None

    def _on_timer(self, kind: str) -> list[Effect]:
        if self.phase is not CoordPhase.COLLECTING:
            return []
        if kind == "votes":
            # 2PC cannot terminate through the participants' logs: not hearing means abort.
            if self._commit_call is not None:
                return []
            return self._abort("votes missing at the vote timeout")
        if kind == "redo-window":
            # A redo not durable by now may land after a recovering node's scan (REDO_DURABLE_MS_MAX):
            # it may not commit, even if a write of it is still unanswered, and no write of it
            # leaves (the ABORT decided here ends the retries below).
            if self._redo_durable or self._commit_call is not None:
                return []
            return self._abort(f"the redo record was not durable {REDO_DURABLE_MS_MAX} ms after the commit began")
        assert kind == "retry", kind
        if self._commit_call is not None:
            return [self._commit_call]
        assert self._redo_call is not None and not self._redo_durable
        if self._abort_reason is not None:
            # ABORT decided (its identity read is out): the redo can commit nothing, and a write of
            # it landing after the window would only hold a recovering node's locks (found by review).
            return []
        return self._write_redo()

    def _handle(self, event: Event) -> list[Effect]:
        if isinstance(event, Recovered):
            return self._recover(event.record)
        if isinstance(event, MessageReceived) and isinstance(event.message, DecisionQuery):
            return self._on_query(event.message)
        if not isinstance(event, LogReturned):
            return []
        call, result = event.call, event.result
        if self._redo_call is not None and call == self._redo_call:
            self._redo_unanswered = False
        if self.phase is not CoordPhase.COLLECTING:
            # E.g. the redo write of a transaction that aborted meanwhile, whose ABORT may now go.
            return self._log_abort()
        if isinstance(result, StorageUnreachable):
            return [StartTimer(self._timer("retry"), self._backoff.next_delay_ms())]
        self._backoff.reset()
        state = result.state if isinstance(result, LogOnceResult) else result
        if self._redo_call is not None and call == self._redo_call:
            assert state is TxnState.VOTE_YES
            self._redo_durable = True
            return self._maybe_commit()
        assert call == self._commit_call and state is TxnState.COMMIT, f"{call} returned {state}"
        return self._announce(TxnState.COMMIT)

    def _on_query(self, query: DecisionQuery) -> list[Effect]:
        effects: list[Effect] = []
        if self.phase is CoordPhase.COLLECTING and self._commit_call is None:
            # Undecided and COMMIT not being logged: abort now rather than keep the asker waiting.
            effects = self._abort(f"{query.sender} asked before every vote was in")
        known = None if self.phase in (CoordPhase.VALIDATING, CoordPhase.COLLECTING) else self.decision
        return [*effects, self._send(query.sender, DecisionAnswer(self.txn, self.node, known))]

    def _recover(self, record: Record) -> list[Effect]:
        assert self.phase is CoordPhase.COLLECTING and not self.participants
        assert record.log == self.coordinator_log
        self.participants = record.body.participants
        if self.logs_redo:
            self.redo_by_partition = redo_bundle.decode(record.body.redo)
        # The caller of the crashed incarnation is gone: no reply, only the participants learn.
        self.replied = True
        if record.state is TxnState.COMMIT:
            self.votes_yes = set(self.participants)
            return self._announce(TxnState.COMMIT, reply=False)
        # Logged redo but no decision: never replied COMMIT, so abort (presumed abort).
        assert record.state is TxnState.VOTE_YES
        self._redo_may_exist = True
        return self._announce(TxnState.ABORT, reply=False)


class CoordinatorLogCoordinator(TwoPhaseCoordinator):
    logs_redo = True
