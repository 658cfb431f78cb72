"""What every coordinator machine shares: confirming the partitions only read, announcing a
decision, resending it until every participant acknowledges, and garbage collection after a grace
period that outlives every storage call still in flight (DESIGN section 4)."""

from __future__ import annotations

import enum

from cornus.protocol import txn_ids
from cornus.protocol.backoff import Backoff, JitterSource
from cornus.protocol.config import ProtocolConfig
from cornus.protocol.effects import (
    CancelTimer,
    Decided,
    DeleteRecord,
    Effect,
    Log,
    LogOnce,
    Reply,
    Send,
    StartTimer,
    Timer,
)
from cornus.protocol.events import (
    CommitRequested,
    DeleteReturned,
    Event,
    ExecuteFailed,
    LogReturned,
    MessageReceived,
    StorageUnreachable,
    TimerFired,
)
from cornus.protocol.messages import Decision, DecisionAck, Prepare, ReadOnlyReleased, ReleaseReadOnly, Vote
from storage_adapters.contract import PARTICIPANT_COUNT_MAX, LogId, Tombstone, TxnState


class CoordPhase(enum.Enum):
    VALIDATING = "validating"  # asking the partitions only read whether they still hold their locks
    COLLECTING = "collecting"  # prepares sent, waiting for votes (or terminating, in Cornus)
    DECIDED = "decided"  # outcome known and announced; waiting for acks
    GC_WAIT = "gc_wait"  # all acked; waiting out the grace period
    COLLECTING_GARBAGE = "collecting_garbage"  # deleting the records
    ABORTING = "aborting"  # aborted before any vote: telling the partitions until each acknowledges
    DONE = "done"


# How many times an abort before any vote is sent again to a partition that does not acknowledge
# it, each after the resend backoff: past that (a partition whose owner is gone), its owner's idle
# timeout drops the execution, as it would have after a single send.
ABORT_RESEND_COUNT_MAX = 8

_DELIVERED = frozenset({CoordPhase.GC_WAIT, CoordPhase.COLLECTING_GARBAGE, CoordPhase.DONE})


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
        self.reads: tuple[str, ...] = ()
        self.reads_confirmed: set[str] = set()
        self.redo_by_partition: dict[str, bytes] = {}
        self.votes_yes: set[str] = set()
        self.decision: TxnState | None = None
        self.replied = False
        self.acked: set[str] = set()
        self.calls_in_flight = 0
        self._backoff = Backoff(config.backoff_ms_min, config.backoff_ms_max, jitter)
        self._resend_backoff = Backoff(config.timeout_ms_resend, config.backoff_ms_max, jitter)
        # The runtime carried the prepares with a one-shot's operations (CommitRequested).
        self.prepare_sent = False
        self._deletes_waiting: set[DeleteRecord] = set()
        self._delete_attempts = 0
        self._settled = False
        self._grace_ms_acked = 0  # the longest DecisionAck.grace_ms_min heard
        self._abort_unacked: set[str] = set()  # ABORTING: the partitions not acknowledging yet
        self._abort_resend_count = 0

    @property
    def finished(self) -> bool:
        return self.phase is CoordPhase.DONE and self.calls_in_flight == 0

    @property
    def delivered(self) -> bool:
        """Decided and acknowledged by every participant: only its records' collection is left,
        which holds no lock and decides nothing (the grace period, then the deletes)."""
        return self.phase in _DELIVERED

    def handle(self, event: Event) -> list[Effect]:
        if isinstance(event, LogReturned | DeleteReturned):
            assert self.calls_in_flight > 0, "a storage call returned that this machine never made"
            self.calls_in_flight -= 1
        effects = self._counted(self._dispatch(event))
        if self.phase is CoordPhase.DECIDED and self.calls_in_flight == 0 and self.acked >= set(self.participants):
            # Every participant holds the decision durably and none of our calls is unanswered.
            # Calls that timed out may still land: the grace period outlives them (config.py).
            self.phase = CoordPhase.GC_WAIT
            grace_ms = max(self.config.gc_grace_ms, self._grace_ms_acked)
            effects += [CancelTimer(self._timer("resend")), StartTimer(self._timer("gc"), grace_ms)]
        return effects

    def _counted(self, effects: list[Effect]) -> list[Effect]:
        """`effects`, with their storage calls counted in flight: what every step that may make
        one passes its effects through (`handle`, and a host's direct calls of a machine)."""
        for effect in effects:
            if isinstance(effect, LogOnce | Log | DeleteRecord):
                self.calls_in_flight += 1
        return effects

    def _dispatch(self, event: Event) -> list[Effect]:
        if isinstance(event, CommitRequested):
            return self._start(event)
        if isinstance(event, DeleteReturned):
            return self._on_deleted(event)
        if isinstance(event, ExecuteFailed):
            return self._on_execute_failed(event)
        if isinstance(event, MessageReceived):
            message = event.message
            if isinstance(message, DecisionAck):
                return self._on_ack(message)
            if isinstance(message, Vote):
                return self._on_vote(message)
            if isinstance(message, ReadOnlyReleased):
                return self._on_read_only_released(message)
        if isinstance(event, TimerFired):
            kind = event.timer.kind
            if kind == "resend":
                if self.phase is CoordPhase.ABORTING:
                    return self._resend_abort()
                return self._resend() if self.phase is CoordPhase.DECIDED else []
            if kind == "gc":
                return self._collect_garbage()
            if kind == "gc-retry":
                return self._delete_again()
            if kind == "votes" and self.phase is CoordPhase.VALIDATING:
                return self._abort_before_prepare("read-only partitions did not confirm their read locks in time")
            return self._on_timer(kind)
        return self._handle(event)

    # -- start: read-only partitions first, then prepare ----------------------------------------
    def _start(self, request: CommitRequested) -> list[Effect]:
        assert self.phase is CoordPhase.COLLECTING and not self.participants, "commit requested twice"
        assert request.txn == self.txn and request.node == self.node
        self.redo_by_partition = dict(request.writes)
        self.participants = tuple(sorted(self.redo_by_partition))
        self.reads = tuple(sorted(request.reads))
        assert len(self.participants) == len(request.writes), "a partition written twice"
        assert not set(self.participants) & set(self.reads), "read-only partitions must not write"
        # The runtime refuses larger transactions at its edge; a record could not hold the list.
        assert len(self.participants) <= PARTICIPANT_COUNT_MAX, f"{len(self.participants)} participants"
        assert not (request.prepare_sent and (self.reads or not self.participants)), (
            "prepares carried with the operations need every partition to be a participant"
        )
        self.prepare_sent = request.prepare_sent
        if self.reads:
            # Strict 2PL keeps read locks until the commit point. A partition that restarted or
            # idled the execution out has lost them, and what was read there may have changed, so
            # every read-only partition confirms (and releases) before anyone votes: once a Cornus
            # participant logged its vote, only the participants' logs decide.
            self.phase = CoordPhase.VALIDATING
            sends: list[Effect] = [self._send(p, ReleaseReadOnly(self.txn, p)) for p in self.reads]
            return [*sends, StartTimer(self._timer("votes"), self.config.timeout_ms_votes)]
        return self._prepare()

    def _on_read_only_released(self, answer: ReadOnlyReleased) -> list[Effect]:
        if self.phase is not CoordPhase.VALIDATING or answer.partition not in self.reads:
            return []
        if not answer.held:
            return self._abort_before_prepare(f"{answer.partition} lost the read locks (restart or idle timeout)")
        self.reads_confirmed.add(answer.partition)
        if self.reads_confirmed != set(self.reads):
            return []
        self.phase = CoordPhase.COLLECTING
        return [CancelTimer(self._timer("votes")), *self._prepare()]

    def _prepare(self) -> list[Effect]:
        assert self.phase is CoordPhase.COLLECTING
        if not self.participants:
            # Wholly read-only: nothing to make atomic, skip both phases.
            self.decision, self.replied, self.phase = TxnState.COMMIT, True, CoordPhase.DONE
            return [*self._settle(TxnState.COMMIT), Reply(self.txn, TxnState.COMMIT)]
        effects: list[Effect] = []
        if not self.prepare_sent:
            effects = [self._send(p, self._prepare_message(p)) for p in self.participants]
        effects.append(StartTimer(self._timer("votes"), self.config.timeout_ms_votes))
        return effects + self._started()

    def _on_execute_failed(self, failed: ExecuteFailed) -> list[Effect]:
        assert self.prepare_sent, f"{failed.txn}: an execution failure reported for a prepare the machine sent"
        if failed.partition not in self.participants or self.phase is not CoordPhase.COLLECTING:
            return []  # decided already (e.g. another partition refused first)
        if failed.refused and failed.partition in self.votes_yes:
            # A refusal means no vote of that partition can exist (ExecuteFailed), so none arrived;
            # unless the client chose the id and sent it to another process of this node too,
            # whose request voted there, and whose vote reached us (found by review).
            assert txn_ids.is_client_chosen(self.txn), f"{failed.partition} refused but voted"
            return []
        return self._on_execution_failed(failed)

    def _abort_before_prepare(self, reason: str) -> list[Effect]:
        """Nobody was asked to vote, so nothing is logged anywhere: tell the callers and the
        partitions (which drop their execution state), and forget the transaction."""
        assert self.phase is CoordPhase.VALIDATING
        self.decision, self.replied, self.phase = TxnState.ABORT, True, CoordPhase.DONE
        unconfirmed = [p for p in (*self.participants, *self.reads) if p not in self.reads_confirmed]
        effects: list[Effect] = [
            CancelTimer(self._timer("votes")),
            *self._settle(TxnState.ABORT),
            Reply(self.txn, TxnState.ABORT, reason),
            *(self._send(p, Decision(self.txn, TxnState.ABORT)) for p in unconfirmed),
        ]
        if not unconfirmed:
            return effects
        # Told once, a Decision lost on the way (a full queue, a reset link) left that partition's
        # execution, locks and all, until its owner idled it out, a minute by default (found by
        # audit, 2026-11-28): told again until each acknowledges, as every partition does, with a
        # machine or without (PartitionHost._unknown).
        self.phase = CoordPhase.ABORTING
        self._abort_unacked = set(unconfirmed)
        return [*effects, StartTimer(self._timer("resend"), self._resend_backoff.next_delay_ms())]

    def _resend_abort(self) -> list[Effect]:
        assert self.phase is CoordPhase.ABORTING and self._abort_unacked
        self._abort_resend_count += 1
        if self._abort_resend_count > ABORT_RESEND_COUNT_MAX:
            self.phase = CoordPhase.DONE  # left to the owners' idle timeout
            return []
        sends: list[Effect] = [self._send(p, Decision(self.txn, TxnState.ABORT)) for p in sorted(self._abort_unacked)]
        return [*sends, StartTimer(self._timer("resend"), self._resend_backoff.next_delay_ms())]

    def _prepare_message(self, participant: str) -> Prepare:
        return Prepare(self.txn, self.participants, self.node)

    # -- the decision ----------------------------------------------------------------------------
    def _settle(self, outcome: TxnState) -> list[Effect]:
        """Mark the moment this coordinator's outcome is settled (once): the votes are in, or a
        termination or a participant told it. What follows is the commit phase."""
        if self._settled:
            return []
        self._settled = True
        return [Decided(self.txn, outcome)]

    def _announce(self, decision: TxnState, reply: bool = True, reason: str = "") -> list[Effect]:
        """Tell the caller (unless this is a restarted coordinator, whose caller is gone) and the
        participants, until each acknowledges."""
        assert decision.is_decision
        assert self.phase is CoordPhase.COLLECTING, f"announcing in phase {self.phase}"
        assert self.decision in (None, decision)
        if decision is TxnState.COMMIT:
            assert self.votes_yes <= set(self.participants)
        self.decision = decision
        self.phase = CoordPhase.DECIDED
        effects: list[Effect] = [*self._settle(decision)] if reply else []
        effects.append(CancelTimer(self._timer("votes")))
        if reply and not self.replied:
            self.replied = True
            effects.append(Reply(self.txn, decision, reason))
        effects += [self._send(p, self._decision_message(p)) for p in self.participants if p not in self.acked]
        effects.append(StartTimer(self._timer("resend"), self._resend_backoff.next_delay_ms()))
        return effects

    def _decision_message(self, participant: str) -> Decision:
        assert self.decision is not None
        return Decision(self.txn, self.decision)

    def _resend(self) -> list[Effect]:
        unacked = [p for p in self.participants if p not in self.acked]
        effects: list[Effect] = [self._send(p, self._decision_message(p)) for p in unacked]
        return [*effects, StartTimer(self._timer("resend"), self._resend_backoff.next_delay_ms())]

    def _on_ack(self, ack: DecisionAck) -> list[Effect]:
        if self.phase is CoordPhase.ABORTING:
            assert ack.decision is TxnState.ABORT, f"{ack.partition} holds {ack.decision} of an abort before any vote"
            self._abort_unacked.discard(ack.partition)
            if self._abort_unacked:
                return []
            self.phase = CoordPhase.DONE
            return [CancelTimer(self._timer("resend"))]
        if ack.partition not in self.participants:
            return []
        if (self.decision is None and ack.decision is TxnState.ABORT and self.phase is CoordPhase.COLLECTING
                and not self._may_adopt(ack.decision)):
            return []  # another process's ABORT, nothing this one's collection may count (_may_adopt)
        self.acked.add(ack.partition)
        # Collection waits out the longest grace a participant's calls need (found by audit: a
        # participant with a longer storage deadline, during a rolling change of it, could land
        # a timed-out vote write in a slot this coordinator had emptied after its own grace).
        self._grace_ms_acked = max(self._grace_ms_acked, ack.grace_ms_min)
        if self.decision is not None:
            assert ack.decision is self.decision, (
                f"{ack.partition} durably holds {ack.decision}, coordinator decided {self.decision}"
            )
            return []
        if self.phase is CoordPhase.COLLECTING and self._may_adopt(ack.decision):
            # A durable decision at a participant is the transaction's outcome.
            return self._announce(ack.decision)
        return []

    # -- garbage collection ----------------------------------------------------------------------
    def _collect_garbage(self) -> list[Effect]:
        if self.phase is not CoordPhase.GC_WAIT:
            return []
        self.phase = CoordPhase.COLLECTING_GARBAGE
        if self.uses_coordinator_log:
            # Our own record goes first and alone: while it exists a restart of ours resends its
            # decision, which participants whose records are gone would take for a new transaction.
            # Where storage takes calls late it becomes a tombstone, as the participants' records
            # do (_delete_participants): a decision or redo write of ours that timed out long ago
            # could still land, and in an empty slot it would recreate the record, whose redo a
            # coordinator-log participant's recovery then takes for an open yes vote and applies
            # again over later commits. A tombstone reads as finished, and a late write onto it
            # leaves it so (storage_adapters.contract). An ABORT's too (a write in place of a
            # delete): a late redo record left in its place would be a VOTE_YES every recovery
            # of its participants asks about again.
            assert self.decision is not None
            keep = Tombstone(self.decision, self.config.outcome_keep_ms) if self.config.late_write_window_ms else None
            return self._delete({DeleteRecord(self.node, self.coordinator_log, self.txn, keep)})
        return self._keep_outcome()

    def _keep_outcome(self) -> list[Effect]:
        """The first participant's record becomes the decision's tombstone, alone and before any
        other participant's record goes: the status call then still finds the outcome (DESIGN 4),
        and if the tombstone cannot be written, nothing more is deleted (the records tell it)."""
        assert self.decision is not None
        keep = Tombstone(self.decision, self.config.outcome_keep_ms)
        return self._delete({DeleteRecord(self.node, LogId.partition(self._outcome_holder), self.txn, keep)})

    @property
    def _outcome_holder(self) -> str:
        return min(self.participants)

    def _delete_participants(self) -> list[Effect]:
        """The other participants' records go once the holder's tombstone is written. Deleted
        where storage refuses late calls (the grace outlived every call in flight); kept as
        tombstones where it does not (`late_write_window_ms`): there a vote or a termination's
        ABORT that timed out long ago could still land, and in a gap it would create a record, a
        vote that recovery takes for undecided and whose old redo it applies again after the
        COMMIT it finds, or an ABORT beside the COMMIT. A COMMIT tombstone over a record whose redo
        is not applied is refused by storage as a bug (check_tombstone); none is, since every
        participant acknowledges the decision only once its apply returned."""
        assert self.decision is not None
        holder = self._outcome_holder
        keep = Tombstone(self.decision, self.config.outcome_keep_ms) if self.config.late_write_window_ms else None
        deletes = {DeleteRecord(self.node, LogId.partition(p), self.txn, keep)
                   for p in self.participants if p != holder}
        if not deletes:
            self.phase = CoordPhase.DONE
            return []
        return self._delete(deletes)

    def _delete(self, deletes: set[DeleteRecord]) -> list[Effect]:
        self._deletes_waiting = set(deletes)
        self._delete_attempts = 1
        return sorted(deletes, key=lambda call: call.log.key)  # type: ignore[return-value]

    def _on_deleted(self, event: DeleteReturned) -> list[Effect]:
        assert self.phase is CoordPhase.COLLECTING_GARBAGE and event.call in self._deletes_waiting
        if isinstance(event.result, StorageUnreachable):
            if self.calls_in_flight == 0:
                return self._retry_deletes()
            return []
        self._deletes_waiting.discard(event.call)
        if self.calls_in_flight:
            return []
        if self._deletes_waiting:
            return self._retry_deletes()
        if event.call.log == self.coordinator_log:
            return self._keep_outcome()
        if event.call.log == LogId.partition(self._outcome_holder) and event.call.keep is not None:
            return self._delete_participants()
        self.phase = CoordPhase.DONE
        return []

    def _retry_deletes(self) -> list[Effect]:
        if self._delete_attempts >= self.config.gc_attempt_count_max:
            # Left behind: decided records that recovery skips and resolve reads correctly. Not
            # skipping ahead, though: partition records stay while the coordinator's record does.
            self.phase = CoordPhase.DONE
            return []
        return [StartTimer(self._timer("gc-retry"), self._backoff.next_delay_ms())]

    def _delete_again(self) -> list[Effect]:
        assert self.phase is CoordPhase.COLLECTING_GARBAGE and self._deletes_waiting
        self._delete_attempts += 1
        return sorted(self._deletes_waiting, key=lambda call: call.log.key)  # type: ignore[return-value]

    # -- helpers -----------------------------------------------------------------------------------
    def _timer(self, kind: str) -> Timer:
        return Timer(self.node, self.txn, kind)

    def _send(self, to: str, message: object) -> Send:
        return Send(self.node, to, message)  # type: ignore[arg-type]

    # -- for subclasses -----------------------------------------------------------------------
    def _started(self) -> list[Effect]:
        return []

    def _may_adopt(self, decision: TxnState) -> bool:
        return True

    def _on_vote(self, vote: Vote) -> list[Effect]:
        raise NotImplementedError

    def _on_execution_failed(self, failed: ExecuteFailed) -> list[Effect]:
        """A one-shot's execution failed on a participant, which carried its prepare."""
        raise NotImplementedError

    def _on_timer(self, kind: str) -> list[Effect]:
        raise NotImplementedError

    def _handle(self, event: Event) -> list[Effect]:
        raise NotImplementedError
