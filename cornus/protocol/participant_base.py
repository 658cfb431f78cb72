"""What every participant machine shares: identity, phases, recovery, applying a committed redo,
in-flight call accounting and the acknowledgement that lets the coordinator collect garbage."""

from __future__ import annotations

import enum

from cornus.protocol.backoff import Backoff, JitterSource
from cornus.protocol.config import ProtocolConfig
from cornus.protocol.effects import (
    ApplyRedo,
    CacheRedo,
    Effect,
    Log,
    LogOnce,
    ReleaseLocks,
    Send,
    StartTimer,
    Timer,
)
from cornus.protocol.events import (
    ApplyReturned,
    Event,
    Executed,
    LogReturned,
    MessageReceived,
    Recovered,
    StorageUnreachable,
    TimerFired,
)
from cornus.protocol.messages import DecisionAck, ReadOnlyReleased, ReleaseReadOnly, Vote
from storage_adapters.contract import LogId, Record, RecordBody, TxnState


class Phase(enum.Enum):
    WORKING = "working"  # executed, waiting for prepare
    VOTING = "voting"  # own VOTE_YES write in flight
    VOTED = "voted"  # voted yes, decision unknown: the only phase that may terminate
    DECIDING = "deciding"  # decision known, own record of it not durable yet
    # COMMIT known, redo not yet in the data: locks and record stay. Our record holds COMMIT, or
    # still our VOTE_YES, which the apply itself turns into COMMIT (`_commit_over_vote`).
    APPLYING = "applying"
    DONE = "done"  # decision durable (or presumed) and applied, locks released


class ParticipantBase:
    """One partition's part in one transaction. Subclasses implement `_on_message`,
    `_on_own_log`, `_on_timer` and `_uncertain`."""

    def __init__(self, partition: str, txn: str, config: ProtocolConfig, jitter: JitterSource) -> None:
        self.partition = partition
        self.txn = txn
        self.config = config
        self.log = LogId.partition(partition)
        self.phase = Phase.WORKING
        self.participants: tuple[str, ...] = ()
        self.coordinator = ""
        self.redo = b""
        self.vote_yes = True
        self.decision: TxnState | None = None
        self.calls_in_flight = 0
        self.apply_attempts = 0
        self._backoff = Backoff(config.backoff_ms_min, config.backoff_ms_max, jitter)
        self._ack_sent = False
        self._locks_released = False

    # -- public -------------------------------------------------------------------------------
    @property
    def decided_durably(self) -> bool:
        return self.phase is Phase.DONE

    @property
    def finished(self) -> bool:
        """Nothing left to do or to wait for: the host may forget this machine. Until the locks are
        released a duplicate decision must meet the machine (which ignores it) rather than the
        unknown-transaction path."""
        return (
            self.phase is Phase.DONE
            and self.calls_in_flight == 0
            and self._locks_released
            and (self._ack_sent or not self.coordinator)
        )

    def handle(self, event: Event) -> list[Effect]:
        if isinstance(event, LogReturned | ApplyReturned):
            assert self.calls_in_flight > 0, "a storage call returned that this machine never made"
            self.calls_in_flight -= 1
        effects = self._dispatch(event)
        for effect in effects:
            if isinstance(effect, LogOnce | Log | ApplyRedo):
                self.calls_in_flight += 1
        self._check_invariants()
        if self.phase is Phase.DONE and not self._ack_sent and self.calls_in_flight == 0 and self.coordinator:
            # Acking only with no call in flight: the coordinator deletes records after all acks,
            # and a late LogOnce(ABORT) of ours must not recreate a deleted record.
            self._ack_sent = True
            assert self.decision is not None
            effects.append(self._send(self.coordinator, DecisionAck(self.txn, self.partition, self.decision,
                                                                    self.config.grace_ms_min)))
        return effects

    def _dispatch(self, event: Event) -> list[Effect]:
        if isinstance(event, Executed):
            assert self.phase is Phase.WORKING and not self.coordinator, "executed twice"
            assert not event.read_only
            self.coordinator, self.redo, self.vote_yes = event.coordinator, event.redo, event.vote_yes
            return [StartTimer(self._timer("prepare"), self.config.timeout_ms_prepare)]
        if isinstance(event, Recovered):
            return self._recover(event.record)
        if isinstance(event, MessageReceived):
            return self._on_message(event.sender, event.message)
        if isinstance(event, ApplyReturned):
            return self._on_applied(event.result)
        if isinstance(event, LogReturned):
            return self._on_log_returned(event)
        assert isinstance(event, TimerFired), f"{type(event).__name__} reached a participant"
        kind = event.timer.kind
        if kind == "apply":
            assert self.phase is Phase.APPLYING
            return [self._apply()]
        return self._on_timer(kind)

    # -- shared steps -------------------------------------------------------------------------
    def _timer(self, kind: str) -> Timer:
        return Timer(self.partition, self.txn, kind)

    def _send(self, to: str, message: object) -> Send:
        return Send(self.partition, to, message)  # type: ignore[arg-type]

    def _body(self) -> RecordBody:
        return RecordBody(self.participants, self.coordinator, self.redo)

    def _vote(self, yes: bool) -> list[Effect]:
        if not self.coordinator:
            return []
        return [self._send(self.coordinator, Vote(self.txn, self.partition, yes))]

    def _release(self) -> list[Effect]:
        if self._locks_released:
            return []
        self._locks_released = True
        return [ReleaseLocks(self.partition, self.txn)]

    def _learned(self, decision: TxnState) -> None:
        assert decision.is_decision
        assert self.decision in (None, decision), (
            f"{self.partition} told {decision} for {self.txn} after deciding {self.decision}"
        )
        self.decision = decision

    def _redelivered_decision(self) -> None:
        """The coordinator resent a decision we already hold durably: our ack was lost."""
        if self.phase is Phase.DONE:
            self._ack_sent = False

    def _on_log_returned(self, event: LogReturned) -> list[Effect]:
        call, result = event.call, event.result
        if call.log != self.log:
            return self._on_other_log(event)
        if isinstance(result, StorageUnreachable):
            return [StartTimer(self._timer("retry"), self._backoff.next_delay_ms())]
        self._backoff.reset()
        return self._on_own_log(result if isinstance(result, TxnState) else result.state)

    def _commit_over_vote(self) -> list[Effect]:
        """COMMIT is known and our own record holds our VOTE_YES: apply at once. The apply turns
        the record into COMMIT in the same storage call (LogStore.apply_redo), which saves the
        Log(COMMIT) round trip before it. Safe because only we ever move our record from VOTE_YES
        to a decision (a terminator only does LogOnce(ABORT), which never overwrites it), and we
        do it only for a COMMIT; until the apply lands our VOTE_YES reads as a yes vote to every
        termination, and all voted yes, so nothing can decide ABORT. A crash first leaves the
        VOTE_YES, which recovery resolves (to COMMIT) before it applies. We ack, which lets the
        coordinator collect the records, only once the apply has returned (`handle`)."""
        assert self.phase is Phase.VOTED and self.decision is TxnState.COMMIT
        self.phase = Phase.APPLYING
        return [self._apply()]

    def _decision_durable(self, state: TxnState) -> list[Effect]:
        """Our own record holds the decision: apply a COMMIT before anything is released."""
        assert self.phase is Phase.DECIDING, f"own decision record answered in phase {self.phase}"
        assert state is self.decision, f"own record holds {state}, decision is {self.decision}"
        if state is TxnState.COMMIT:
            self.phase = Phase.APPLYING
            return [self._apply()]
        self.phase = Phase.DONE
        return self._release()

    def _apply(self) -> ApplyRedo:
        self.apply_attempts += 1
        return ApplyRedo(self.partition, self.partition, self.txn, self.redo)

    def _on_applied(self, result: bool | StorageUnreachable) -> list[Effect]:
        assert self.phase is Phase.APPLYING, f"apply answered in phase {self.phase}"
        if isinstance(result, StorageUnreachable):
            # Never given up: the redo of a COMMIT must reach the data, and until it does the record
            # stays (no ack, so no garbage collection) and so do the locks (no reader sees the old
            # value). The node reports the transaction as applying meanwhile.
            return [StartTimer(self._timer("apply"), self._backoff.next_delay_ms())]
        self._backoff.reset()
        self.phase = Phase.DONE
        # Applied now or by an earlier attempt that timed out but landed: either way the redo is
        # in storage and our locks kept everyone else off its keys, so it is the newest data.
        return [CacheRedo(self.partition, self.txn, self.redo), *self._release()]

    def _recover(self, record: Record) -> list[Effect]:
        assert self.phase is Phase.WORKING and record.log == self.log
        self.participants, self.coordinator = record.body.participants, record.body.coordinator
        self.redo = record.body.redo
        if record.state is TxnState.VOTE_YES:
            # Paper 3.4, participant cases 3-4: voted yes, outcome unknown.
            self.phase = Phase.VOTED
            return self._uncertain()
        # Recovery brings back only undecided records and COMMITs not yet applied.
        assert record.state is TxnState.COMMIT and not record.applied, f"recovered {record.state} {record.applied}"
        self._learned(TxnState.COMMIT)
        self.phase = Phase.APPLYING
        return [self._apply()]

    def _check_invariants(self) -> None:
        if self.phase in (Phase.DECIDING, Phase.APPLYING, Phase.DONE):
            assert self.decision is not None
        else:
            assert self.decision is None or self.phase is Phase.VOTING
        if self.phase is Phase.APPLYING:
            assert self.decision is TxnState.COMMIT and not self._locks_released
        if self.decision is TxnState.COMMIT:
            assert self.vote_yes, "committed although this participant voted no"

    # -- for subclasses -----------------------------------------------------------------------
    def _on_message(self, sender: str, message: object) -> list[Effect]:
        raise NotImplementedError

    def _on_own_log(self, state: TxnState) -> list[Effect]:
        raise NotImplementedError

    def _on_other_log(self, event: LogReturned) -> list[Effect]:
        raise AssertionError(f"{type(self).__name__} writes only its own log, not {event.call.log.key}")

    def _on_timer(self, kind: str) -> list[Effect]:
        raise NotImplementedError

    def _uncertain(self) -> list[Effect]:
        """Voted yes and the decision is overdue: find it out (termination or queries)."""
        raise NotImplementedError


class ReadOnlyParticipant:
    """A partition the transaction only read. It holds shared locks until the coordinator's
    ReleaseReadOnly confirms them; a partition that lost them has no machine and answers no."""

    def __init__(self, partition: str, txn: str, coordinator: str) -> None:
        self.partition = partition
        self.txn = txn
        self.coordinator = coordinator
        self.phase = Phase.WORKING
        self.decision: TxnState | None = None
        self.participants: tuple[str, ...] = ()
        self.calls_in_flight = 0

    @property
    def finished(self) -> bool:
        return self.phase is Phase.DONE

    def handle(self, event: Event) -> list[Effect]:
        if not isinstance(event, MessageReceived):
            return []
        message = event.message
        if isinstance(message, ReleaseReadOnly) and self.phase is Phase.WORKING:
            self.phase = Phase.DONE
            answer = ReadOnlyReleased(self.txn, self.partition, held=True)
            return [ReleaseLocks(self.partition, self.txn), Send(self.partition, event.sender, answer)]
        return []
