"""Per-host routing: one host per partition (participant side) and one per coordinator node. A host
owns the machines of its transactions, builds each with the protocol its transaction id names,
answers for transactions it does not know (never executed, lost in a crash before any vote of ours
was durable, or finished and forgotten), and forgets machines once they have finished."""

from __future__ import annotations

import collections
from collections.abc import Callable

from cornus.protocol.backoff import JitterSource
from cornus.protocol.config import Protocol, ProtocolConfig
from cornus.protocol.coordinator_base import CoordinatorBase
from cornus.protocol.coordinator_blocking import CoordinatorLogCoordinator, TwoPhaseCoordinator
from cornus.protocol.coordinator_cornus import CornusCoordinator
from cornus.protocol.effects import Effect, ReleaseLocks, Send
from cornus.protocol.events import CommitRequested, Event, Executed, MessageReceived, Recovered
from cornus.protocol.messages import (
    Decision,
    DecisionAck,
    DecisionAnswer,
    DecisionQuery,
    Prepare,
    ReadOnlyReleased,
    ReleaseReadOnly,
    Vote,
)
from cornus.protocol.participant_base import ParticipantBase, ReadOnlyParticipant
from cornus.protocol.participant_blocking import CoordinatorLogParticipant, TwoPhaseParticipant
from cornus.protocol.participant_cornus import CornusParticipant
from storage_adapters.contract import TxnState

ProtocolOf = Callable[[str], "Protocol | None"]
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


def _protocol(protocol_of: ProtocolOf, txn: str) -> Protocol:
    protocol = protocol_of(txn)
    # Ids are checked where they enter (execution requests, recovery): none untagged gets here.
    assert protocol is not None, f"{txn} names no protocol"
    return protocol


class PartitionHost:
    """The participant side of one partition. `factory`, if given, builds every participant (tests
    and the simulator use it to try variants of a machine)."""

    def __init__(
        self,
        partition: str,
        config: ProtocolConfig,
        jitter: JitterSource,
        protocol_of: ProtocolOf,
        *,
        factory: ParticipantFactory | None = None,
    ) -> None:
        self.partition = partition
        self.config = config
        self.jitter = jitter
        self.protocol_of = protocol_of
        self.factory = factory
        self.machines: dict[str, ParticipantBase | ReadOnlyParticipant] = {}
        self.counters: collections.Counter[str] = collections.Counter()

    def handle(self, event: Event) -> list[Effect]:
        txn = event.txn
        if isinstance(event, Executed):
            assert event.partition == self.partition
            assert txn not in self.machines, f"{self.partition} already runs {txn}"
            if event.read_only:
                self.machines[txn] = ReadOnlyParticipant(self.partition, txn, event.coordinator)
            else:
                self.machines[txn] = self._participant(txn)
        elif isinstance(event, Recovered):
            assert txn not in self.machines, f"{self.partition} recovered {txn} twice"
            self.machines[txn] = self._participant(txn)
        machine = self.machines.get(txn)
        if machine is None:
            if isinstance(event, MessageReceived):
                return self._unknown(event.sender, event.message)
            return []  # a timer or storage answer of a machine that no longer exists
        effects = machine.handle(event)
        if machine.finished:
            del self.machines[txn]
        return effects

    def _participant(self, txn: str) -> ParticipantBase:
        factory = self.factory or PARTICIPANTS[_protocol(self.protocol_of, txn)]
        return factory(self.partition, txn, self.config, self.jitter)

    def _unknown(self, sender: str, message: object) -> list[Effect]:
        """No machine for the transaction: we never executed it, lost its execution in a crash
        before any vote of ours was durable (recovery rebuilds every machine that voted yes, from
        our log or a coordinator's redo record), or finished it and forgot."""
        self.counters["unknown_txn_messages"] += 1
        txn = message.txn  # type: ignore[attr-defined]
        if isinstance(message, Prepare):
            # Our execution state is gone, so we cannot vote yes; and we cannot say we never did:
            # this may be a late copy of a prepare we voted yes on, and finished.
            return [self._send(sender, Vote(txn, self.partition, yes=False, unknown=True))]
        if isinstance(message, ReleaseReadOnly):
            return [self._send(sender, ReadOnlyReleased(txn, self.partition, held=False))]
        if isinstance(message, Decision):
            # Never voted yes (the decision is ABORT: drop the execution state, if any, that the
            # coordinator gave up on) or finished before (our record holds the decision durably).
            # Either way nothing to write, and above all nothing to apply: a late COMMIT of a
            # finished transaction must not bring its old redo back over newer data. Or a one-shot's
            # request, which carries the prepare, is still running or on its way (the decision
            # overtook it): it must then find the transaction refused, since our ack lets the
            # coordinator collect the records, and a vote after that would outlive them.
            abort = message.decision is TxnState.ABORT
            effects: list[Effect] = [ReleaseLocks(self.partition, txn, refuse_later=True)] if abort else []
            return [*effects, self._send(sender, DecisionAck(txn, self.partition, message.decision))]
        if isinstance(message, DecisionQuery):
            # "Unknown" does NOT mean "never voted yes": we may have committed, applied and
            # forgotten. Presuming ABORT here let a 2PC participant abort beside a returned COMMIT
            # (found by the simulator), so we say we do not know; the asker keeps asking.
            return [self._send(message.sender, DecisionAnswer(txn, self.partition, None))]
        return []

    def _send(self, to: str, message: object) -> Send:
        return Send(self.partition, to, message)  # type: ignore[arg-type]


class CoordinatorHost:
    """The coordinator side of one node."""

    def __init__(
        self,
        node: str,
        config: ProtocolConfig,
        jitter: JitterSource,
        protocol_of: ProtocolOf,
        *,
        factory: CoordinatorFactory | None = None,
    ) -> None:
        self.node = node
        self.config = config
        self.jitter = jitter
        self.protocol_of = protocol_of
        self.factory = factory
        self.machines: dict[str, CoordinatorBase] = {}
        self.counters: collections.Counter[str] = collections.Counter()

    def handle(self, event: Event) -> list[Effect]:
        txn = event.txn
        if isinstance(event, CommitRequested | Recovered):
            assert txn not in self.machines, f"{self.node} already coordinates {txn}"
            factory = self.factory or COORDINATORS[_protocol(self.protocol_of, txn)]
            self.machines[txn] = factory(self.node, txn, self.config, self.jitter)
        machine = self.machines.get(txn)
        if machine is None:
            if isinstance(event, MessageReceived):
                return self._unknown(event.message)
            return []
        effects = machine.handle(event)
        if machine.finished:
            del self.machines[txn]
        return effects

    def _unknown(self, message: object) -> list[Effect]:
        self.counters["unknown_txn_messages"] += 1
        if not isinstance(message, DecisionQuery):
            return []  # a late vote, ack or answer: the transaction is over here
        if self.protocol_of(message.txn) not in (Protocol.TWO_PC, Protocol.COORDINATOR_LOG):
            # Cornus participants never ask a coordinator, and an id without a protocol tag names
            # no transaction of ours: a stray query gets no answer rather than a guess.
            self.counters["stray_queries"] += 1
            return []
        # Presumed abort: no machine and no record (recovery would have rebuilt it) means COMMIT
        # was never logged, so it never will be.
        answer = DecisionAnswer(message.txn, self.node, TxnState.ABORT)
        return [Send(self.node, message.sender, answer)]
