"""What every participant machine shares: identity, phases, in-flight call accounting and acks."""

from __future__ import annotations

import enum

from cornus.protocol.backoff import Backoff, JitterSource
from cornus.protocol.config import ProtocolConfig
from cornus.protocol.effects import Effect, Log, LogOnce, ReleaseLocks, Send
from cornus.protocol.events import Event, LogReturned
from cornus.protocol.messages import DecisionAck, Vote
from storage_adapters.contract import LogId, RecordBody, TxnState


class Phase(enum.Enum):
    WORKING = "working"  # executed, waiting for prepare
    VOTING = "voting"  # own VOTE_YES write in flight
    VOTED = "voted"  # voted yes, decision unknown: the only phase that may terminate
    DECIDING = "deciding"  # decision known, own record of it not durable yet
    DONE = "done"  # decision durable (or presumed), locks released


class ParticipantBase:
    """One partition's part in one transaction. Subclasses implement `_handle`."""

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
        self._backoff = Backoff(config.backoff_ms_min, config.backoff_ms_max, jitter)
        self._ack_sent = False
        self._locks_released = False

    # -- public -------------------------------------------------------------------------------
    @property
    def decided_durably(self) -> bool:
        return self.phase is Phase.DONE

    def handle(self, event: Event) -> list[Effect]:
        if isinstance(event, LogReturned):
            assert self.calls_in_flight > 0, "a log call returned that this machine never made"
            self.calls_in_flight -= 1
        effects = self._handle(event)
        for effect in effects:
            if isinstance(effect, LogOnce | Log):
                self.calls_in_flight += 1
        self._check_invariants()
        if self.phase is Phase.DONE and not self._ack_sent and self.calls_in_flight == 0 and self.coordinator:
            # Acking only with no call in flight: the coordinator deletes records after all acks,
            # and a late LogOnce(ABORT) of ours must not recreate a deleted record.
            self._ack_sent = True
            assert self.decision is not None
            effects.append(Send(self.coordinator, DecisionAck(self.txn, self.partition, self.decision)))
        return effects

    # -- for subclasses -----------------------------------------------------------------------
    def _handle(self, event: Event) -> list[Effect]:
        raise NotImplementedError

    def _timer(self, kind: str) -> str:
        return f"{self.partition}/{self.txn}/{kind}"

    def _body(self) -> RecordBody:
        return RecordBody(self.participants, self.coordinator, self.redo)

    def _vote(self, yes: bool) -> list[Effect]:
        if not self.coordinator:
            return []
        return [Send(self.coordinator, Vote(self.txn, self.partition, yes))]

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

    def _check_invariants(self) -> None:
        if self.phase in (Phase.DECIDING, Phase.DONE):
            assert self.decision is not None
        else:
            assert self.decision is None or self.phase is Phase.VOTING
        if self.decision is TxnState.COMMIT:
            assert self.vote_yes, "committed although this participant voted no"
