"""Per-node routing: one host per partition (participant side) and one per coordinator node. A
host owns the machines of its transactions, routes events to them by transaction id, and answers
for transactions it does not know (after a crash, or after a machine finished).

A host runs one protocol for every transaction, or, given `protocol_of`, the protocol each
transaction names: transactions of different protocols then share the host, each with its own
kind of machine (the runtime lets callers pick the protocol per transaction)."""

from __future__ import annotations

from collections.abc import Callable

from cornus.protocol.backoff import JitterSource
from cornus.protocol.config import Protocol, ProtocolConfig
from cornus.protocol.coordinator_base import CoordinatorBase
from cornus.protocol.coordinator_blocking import CoordinatorLogCoordinator, TwoPhaseCoordinator
from cornus.protocol.coordinator_cornus import CornusCoordinator
from cornus.protocol.effects import Effect, ReleaseLocks, Send
from cornus.protocol.events import (
    CommitRequested,
    Event,
    Executed,
    LogReturned,
    MessageReceived,
    Recovered,
    TimerFired,
)
from cornus.protocol.messages import (
    Decision,
    DecisionAck,
    DecisionAnswer,
    DecisionQuery,
    Message,
    Prepare,
    ReleaseReadOnly,
    Vote,
)
from cornus.protocol.participant_base import ParticipantBase
from cornus.protocol.participant_blocking import CoordinatorLogParticipant, TwoPhaseParticipant
from cornus.protocol.participant_cornus import CornusParticipant
from storage_adapters.contract import TxnState

ProtocolOf = Callable[[str], Protocol]
ParticipantFactory = Callable[[str, str, ProtocolConfig, JitterSource], ParticipantBase]
CoordinatorFactory = Callable[[str, str, ProtocolConfig, JitterSource], CoordinatorBase]

PARTICIPANTS: dict[Protocol, ParticipantFactory] = {
    Protocol.CORNUS: CornusParticipant,
    Protocol.TWO_PC: TwoPhaseParticipant,
    Protocol.COORDINATOR_LOG: CoordinatorLogParticipant,
}
COORDINATORS: dict[Protocol, CoordinatorFactory] = {
    Protocol.CORNUS: CornusCoordinator,
    Protocol.TWO_PC: TwoPhaseCoordinator,
    Protocol.COORDINATOR_LOG: CoordinatorLogCoordinator,
}


def _txn_of(event: Event) -> str:
    if isinstance(event, MessageReceived):
        return event.message.txn
    if isinstance(event, LogReturned):
        return event.call.txn
    if isinstance(event, TimerFired):
        # Timer names are "<owner>/<txn>/<kind>"; ids cannot hold '/'.
        parts = event.name.split("/")
        assert len(parts) == 3, f"malformed timer name {event.name!r}"
        return parts[1]
    if isinstance(event, Recovered):
        return event.record.txn
    assert isinstance(event, CommitRequested | Executed)
    return event.txn


class PartitionHost:
    """The participant side of one partition."""

    def __init__(
        self,
        partition: str,
        protocol: Protocol,
        config: ProtocolConfig,
        jitter: JitterSource,
        *,
        factory: ParticipantFactory | None = None,
        protocol_of: ProtocolOf | None = None,
    ) -> None:
        assert factory is None or protocol_of is None, "a custom factory runs one protocol"
        self.partition = partition
        self.protocol = protocol
        self.config = config
        self.jitter = jitter
        self.factory = factory
        self.protocol_of = protocol_of
        self.machines: dict[str, ParticipantBase] = {}

    def protocol_for(self, txn: str) -> Protocol:
        return self.protocol if self.protocol_of is None else self.protocol_of(txn)

    def handle(self, event: Event) -> list[Effect]:
        txn = _txn_of(event)
        if isinstance(event, Executed | Recovered):
            assert txn not in self.machines, f"{self.partition} already runs {txn}"
            factory = self.factory or PARTICIPANTS[self.protocol_for(txn)]
            self.machines[txn] = factory(self.partition, txn, self.config, self.jitter)
        if isinstance(event, MessageReceived) and isinstance(event.message, ReleaseReadOnly):
            # A partition only read takes no part in commit: no machine, no log.
            assert event.message.partition == self.partition
            return [ReleaseLocks(self.partition, txn)]
        machine = self.machines.get(txn)
        if machine is not None:
            return machine.handle(event)
        if isinstance(event, MessageReceived):
            return self._unknown(event.sender, event.message)
        return []  # a timer or log answer of a machine that no longer exists

    def _unknown(self, sender: str, message: Message) -> list[Effect]:
        """We hold no machine for the transaction: we never executed it, lost it in a crash
        before any vote of ours was durable (recovery would have rebuilt the machine otherwise),
        or finished it and forgot."""
        txn = message.txn
        if isinstance(message, Prepare):
            # Our execution state is gone, so we cannot vote yes.
            return [Send(sender, Vote(txn, self.partition, yes=False))]
        if isinstance(message, Decision):
            if self.protocol_for(txn) is Protocol.COORDINATOR_LOG and message.decision is TxnState.COMMIT:
                # We may have voted yes with nothing logged; the decision carries our redo.
                machine = CoordinatorLogParticipant.orphan(self.partition, txn, sender, self.config, self.jitter)
                self.machines[txn] = machine
                return machine.handle(MessageReceived(sender, message))
            # Cornus/2PC: no record means we never voted yes, so the decision is ABORT (or we
            # applied COMMIT and our record is durable); nothing to write either way.
            return [Send(sender, DecisionAck(txn, self.partition, message.decision))]
        if isinstance(message, DecisionQuery):
            # "Unknown" does NOT mean "never voted yes": we may have committed, applied and
            # restarted (recovery skips finished records). Presuming ABORT here let a 2PC
            # participant abort beside a returned COMMIT (found by the simulator), so we say
            # we do not know and the asker keeps asking the coordinator.
            return [Send(message.sender, DecisionAnswer(txn, self.partition, None))]
        return []


class CoordinatorHost:
    """The coordinator side of one node."""

    def __init__(
        self,
        node: str,
        protocol: Protocol,
        config: ProtocolConfig,
        jitter: JitterSource,
        *,
        factory: CoordinatorFactory | None = None,
        protocol_of: ProtocolOf | None = None,
    ) -> None:
        assert factory is None or protocol_of is None, "a custom factory runs one protocol"
        self.node = node
        self.protocol = protocol
        self.config = config
        self.jitter = jitter
        self.factory = factory
        self.protocol_of = protocol_of
        self.machines: dict[str, CoordinatorBase] = {}

    def protocol_for(self, txn: str) -> Protocol:
        return self.protocol if self.protocol_of is None else self.protocol_of(txn)

    def handle(self, event: Event) -> list[Effect]:
        txn = _txn_of(event)
        if isinstance(event, CommitRequested | Recovered):
            assert txn not in self.machines, f"{self.node} already coordinates {txn}"
            factory = self.factory or COORDINATORS[self.protocol_for(txn)]
            self.machines[txn] = factory(self.node, txn, self.config, self.jitter)
        machine = self.machines.get(txn)
        if machine is not None:
            return machine.handle(event)
        if isinstance(event, MessageReceived) and isinstance(event.message, DecisionQuery):
            # Presumed abort: no machine and no record (recovery would have rebuilt it) means
            # COMMIT was never logged, so it never will be.
            assert self.protocol_for(txn) is not Protocol.CORNUS, "Cornus participants never query"
            query = event.message
            return [Send(query.sender, DecisionAnswer(txn, self.node, TxnState.ABORT))]
        return []
