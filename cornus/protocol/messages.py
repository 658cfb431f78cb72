"""Node-to-node protocol messages. One-way: every request/response pairing is the machines' job.

Messages name partitions (participants) and coordinator node ids; the runtime maps a partition to
the node that owns it.
"""

from __future__ import annotations

from dataclasses import dataclass

from storage_adapters.contract import TxnState


@dataclass(frozen=True, slots=True)
class Prepare:
    """Vote request. Carries the FULL participant list, so a participant can run termination
    against every other participant's log (the paper's artifact sent only the receiver itself)."""

    txn: str
    participants: tuple[str, ...]
    coordinator: str


@dataclass(frozen=True, slots=True)
class ReleaseReadOnly:
    """To a partition the transaction only read, before any prepare: confirm that the read locks
    are still held (a restart or an idle timeout loses them, and then what was read may have
    changed since) and release them; the partition takes no other part in the commit."""

    txn: str
    partition: str


@dataclass(frozen=True, slots=True)
class ReadOnlyReleased:
    """The answer to ReleaseReadOnly: `held` False means the locks were lost, so the transaction
    must abort."""

    txn: str
    partition: str
    held: bool


@dataclass(frozen=True, slots=True)
class Vote:
    """`unknown`: the partition holds nothing of the transaction (never executed it, lost it in a
    crash, or voted yes, finished and forgot it), so it cannot vote yes now, but cannot say either
    that it never did: a Cornus participant may have decided by termination without the
    coordinator. Only the participant's log can tell. When set, `yes` means nothing."""

    txn: str
    partition: str
    yes: bool
    unknown: bool = False


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome. It carries no redo, in any protocol: a coordinator-log participant that
    crashed after voting gets its redo back from the coordinator's log at recovery, with its
    locks, before it serves anything (recovery.py); applying a redo that arrives in a message,
    without those locks, could overwrite newer data."""

    txn: str
    decision: TxnState


@dataclass(frozen=True, slots=True)
class DecisionAck:
    """The participant has durably recorded the decision (or needs no record: presumed abort) and
    has no storage call in flight for the transaction, so its record may be garbage collected,
    once `grace_ms_min` has passed: the least grace after which no call of its can still land
    (gc_grace_ms_min of its own configuration; the coordinator's may differ during a rolling
    change of the storage deadline). 0: not told (an older node's), the coordinator's own."""

    txn: str
    partition: str
    decision: TxnState
    grace_ms_min: int = 0


@dataclass(frozen=True, slots=True)
class DecisionQuery:
    """Cooperative termination (2PC, coordinator-log): "do you know the outcome?"."""

    txn: str
    sender: str


@dataclass(frozen=True, slots=True)
class DecisionAnswer:
    """`decision` None means "I do not know either"."""

    txn: str
    sender: str
    decision: TxnState | None


Message = (
    Prepare | ReleaseReadOnly | ReadOnlyReleased | Vote | Decision | DecisionAck | DecisionQuery | DecisionAnswer
)
