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
from cornus.protocol.effects import (
    CheckIdentity,
    ConfirmIdentity,
    Deposed,
    Effect,
    ReleaseLocks,
    Send,
    StartTimer,
    Timer,
)
from cornus.protocol.events import (
    CommitRequested,
    Event,
    Executed,
    IdentityChecked,
    MessageReceived,
    Recovered,
    StorageUnreachable,
    TimerFired,
)
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

# Presumed-abort answers one identity check may owe at once: each is a query about a transaction
# this node does not know, which only a crash, a late duplicate or a stray peer produces, and an
# asker whose query is dropped asks again.
PRESUMPTIONS_WAITING_COUNT_MAX = 4096
# The timer of the periodic identity read (ProtocolConfig.identity_check_ms).
IDENTITY_CHECK_TIMER = "identity_check"
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
            ack = DecisionAck(txn, self.partition, message.decision, self.config.grace_ms_min)
            return [*effects, self._send(sender, ack)]
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
        # The epoch this process holds the node's identity in (0: not taken yet; NodeCore sets it
        # before recovery, so before any query is answered).
        self.identity_epoch = 0
        # Presumed-abort answers owed, (txn, asker): those the identity check in flight covers,
        # and those that came after it left, which only the next check may cover.
        self._presumptions_checking: set[tuple[str, str]] = set()
        self._presumptions_waiting: set[tuple[str, str]] = set()
        # ABORTs of client-chosen ids waiting for an identity read (ConfirmIdentity), as the
        # presumptions: those the check in flight covers, those that came after it left, and
        # those whose read went unanswered, which wait for the next periodic check (asking again
        # at once would spin while storage is away).
        self._aborts_checking: set[str] = set()
        self._aborts_waiting: set[str] = set()
        self._aborts_unchecked: set[str] = set()
        self._check_in_flight = False
        self._renewal_owed = False

    def identity_taken(self, epoch: int) -> list[Effect]:
        """This process holds the node's identity at `epoch` from now on: check it periodically."""
        assert self.identity_epoch == 0 and epoch >= 1, (self.identity_epoch, epoch)
        self.identity_epoch = epoch
        return [StartTimer(Timer(self.node, "", IDENTITY_CHECK_TIMER), self.config.identity_check_ms)]

    def handle(self, event: Event) -> list[Effect]:
        if isinstance(event, IdentityChecked):
            return self._identity_checked(event)
        if isinstance(event, TimerFired) and event.timer.kind == IDENTITY_CHECK_TIMER:
            timer = StartTimer(event.timer, self.config.identity_check_ms)
            return [timer, *self._check_identity(periodic=True)]
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
        return self._confirmations(effects)

    def _confirmations(self, effects: list[Effect]) -> list[Effect]:
        """The machines' ConfirmIdentity effects, taken out and turned into an identity check."""
        confirm = [effect for effect in effects if isinstance(effect, ConfirmIdentity)]
        if not confirm:
            return effects
        for effect in confirm:
            assert effect.node == self.node and effect.txn in self.machines, effect
            self._aborts_waiting.add(effect.txn)
        return [effect for effect in effects if not isinstance(effect, ConfirmIdentity)] + self._check_identity()

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
        # was never logged by this process, nor landed from an earlier one (recovery ran after
        # this process took the node's identity, which refuses their later writes). But a LATER
        # process of this node (a pod replaced while this one lived on) may coordinate it, and
        # this one would not know: so the answer waits for a read of the identity record made
        # after the query came, which finds that process's take if there is one (it took the
        # identity before it started any transaction of its own).
        assert self.identity_epoch > 0, "a query answered before the node's identity was taken"
        if len(self._presumptions_waiting) >= PRESUMPTIONS_WAITING_COUNT_MAX:
            self.counters["presumptions_dropped"] += 1
            return []  # the asker asks again
        self._presumptions_waiting.add((message.txn, message.sender))
        return self._check_identity()

    def _check_identity(self, *, periodic: bool = False) -> list[Effect]:
        # The periodic one renews the record, so that a process of this node parked by an earlier
        # take knows this one lives; a renewal that lands answers the presumptions as a read does.
        # A tick while a check is in flight owes its renewal to the next check: under a stream of
        # presumptions every tick could find one in flight, and renewals would stop.
        self._renewal_owed |= periodic
        if periodic:
            self._aborts_waiting |= self._aborts_unchecked
            self._aborts_unchecked.clear()
        if self._check_in_flight or not (self._presumptions_waiting or self._renewal_owed or self._aborts_waiting):
            return []
        self._presumptions_checking, self._presumptions_waiting = self._presumptions_waiting, set()
        self._aborts_checking, self._aborts_waiting = self._aborts_waiting, set()
        self._check_in_flight = True
        renew, self._renewal_owed = self._renewal_owed, False
        return [CheckIdentity(self.node, self.identity_epoch, renew=renew)]

    def _identity_checked(self, event: IdentityChecked) -> list[Effect]:
        assert self._check_in_flight, "an identity check nobody asked for"
        self._check_in_flight = False
        checked, self._presumptions_checking = self._presumptions_checking, set()
        aborts, self._aborts_checking = self._aborts_checking, set()
        if isinstance(event.held, StorageUnreachable):
            self.counters["presumptions_unchecked"] += 1
            self._aborts_unchecked |= aborts
            return self._check_identity()  # the askers ask again; those waiting get a check now
        if not event.held:
            return [Deposed(self.node, self.identity_epoch)]
        effects: list[Effect] = [
            Send(self.node, asker, DecisionAnswer(txn, self.node, TxnState.ABORT))
            for txn, asker in sorted(checked)
            # One started meanwhile (its id came in a query before its commit request) answers.
            if txn not in self.machines
        ]
        for txn in sorted(aborts):
            machine = self.machines.get(txn)
            if machine is None:
                continue  # a participant's acknowledgement decided it, and it was collected since
            assert isinstance(machine, TwoPhaseCoordinator), (txn, machine)
            effects += machine.abort_confirmed()
            if machine.finished:
                del self.machines[txn]
        return effects + self._check_identity()
