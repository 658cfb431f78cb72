"""What happens to the core: requests, messages, answered storage calls, fired timers.

Every event knows its transaction (`txn`; "" for node-wide events such as a recovery scan) and
which host it is for (`host`): the node core routes on those two and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass

from cornus.protocol.effects import (
    ApplyRedo,
    DeleteRecord,
    ListIdentities,
    Log,
    LogCall,
    LogOnce,
    ReadRecord,
    ScanFinished,
    ScanLog,
    StorageCall,
    Timer,
)
from cornus.protocol.messages import Message
from storage_adapters.contract import LogKind, LogOnceResult, Record, ScanPage, TxnState


@dataclass(frozen=True, slots=True)
class StorageUnreachable:
    """A storage call failed with StorageUnavailable: it may or may not have taken effect."""

    reason: str = ""


@dataclass(frozen=True, slots=True)
class CommitRequested:
    """The caller asks the coordinator `node` to commit. `writes` maps each written partition to its
    redo (the coordinator needs it only for coordinator-log); `reads` are partitions only read.

    `prepare_sent`: a one-shot transaction whose runtime sent each participant its Prepare inside
    the request that carries its operations (one message and one round trip fewer per partition),
    at the same time as this request. The machine then sends no Prepare of its own and hears of an
    execution that failed through `ExecuteFailed`. Only without partitions in `reads`: a partition
    a one-shot only reads is a participant like the others (paper 3.5), in `writes` with a redo
    that writes nothing; a partition in `reads` confirms and releases its read locks before anyone
    votes (a Cornus transaction is committed the moment every vote is logged), which needs the
    whole execution phase done first."""

    node: str
    txn: str
    writes: tuple[tuple[str, bytes], ...]
    reads: tuple[str, ...] = ()
    prepare_sent: bool = False

    @property
    def host(self) -> str:
        return self.node


@dataclass(frozen=True, slots=True)
class ExecuteFailed:
    """A one-shot's request to `partition`, which carried the prepare (CommitRequested.prepare_sent),
    did not execute. `refused`: the partition's owner answered that it did not run it; the prepare
    travelled only inside that request and no machine ever resends it, so no vote of that
    partition can exist, now or later. Not refused: no answer came (a lost connection, a
    deadline), and the partition may have executed and voted yes."""

    node: str
    txn: str
    partition: str
    refused: bool
    detail: str = ""

    @property
    def host(self) -> str:
        return self.node


@dataclass(frozen=True, slots=True)
class Executed:
    """The execution phase ended on a partition, which still holds the transaction's locks: a writer
    with its redo and its mind made up about its vote (a runtime votes no when, e.g., validation
    failed), or a partition the transaction only read (`read_only`, no redo)."""

    txn: str
    partition: str
    coordinator: str
    redo: bytes
    vote_yes: bool = True
    read_only: bool = False

    @property
    def host(self) -> str:
        return self.partition


@dataclass(frozen=True, slots=True)
class MessageReceived:
    sender: str
    to: str
    message: Message

    @property
    def txn(self) -> str:
        return self.message.txn

    @property
    def host(self) -> str:
        return self.to


class _Answer:
    """An answer to a storage call: it belongs to the call's transaction and goes back to the host
    (or recovery, or resolve) that made the call."""

    __slots__ = ()
    call: StorageCall

    @property
    def txn(self) -> str:
        return self.call.txn  # type: ignore[union-attr]

    @property
    def host(self) -> str:
        return self.call.owner


@dataclass(frozen=True, slots=True)
class LogReturned(_Answer):
    """The answer to `call`: a LogOnceResult for LogOnce, the stored state for Log."""

    call: LogCall
    result: LogOnceResult | TxnState | StorageUnreachable


@dataclass(frozen=True, slots=True)
class ApplyReturned(_Answer):
    """The answer to an ApplyRedo: True if this call applied it, False if it was applied before
    (both mean the redo is in storage), or StorageUnreachable (it may have landed)."""

    call: ApplyRedo
    result: bool | StorageUnreachable


@dataclass(frozen=True, slots=True)
class DeleteReturned(_Answer):
    call: DeleteRecord
    result: bool | StorageUnreachable


@dataclass(frozen=True, slots=True)
class RecordRead(_Answer):
    call: ReadRecord
    result: Record | StorageUnreachable | None


class _LogAnswer(_Answer):
    """An answer to a call about a whole log or the node (a scan, a listing): it belongs to no
    transaction."""

    __slots__ = ()

    @property
    def txn(self) -> str:
        return ""


@dataclass(frozen=True, slots=True)
class ScanReturned(_LogAnswer):
    call: ScanLog
    result: ScanPage | StorageUnreachable


@dataclass(frozen=True, slots=True)
class FinishedScanned(_LogAnswer):
    """The answer to ScanFinished, with the wall clock (ms) of the node as the call left: every
    record the page holds was written before then."""

    call: ScanFinished  # type: ignore[assignment]
    result: ScanPage | StorageUnreachable
    sent_ms: int


@dataclass(frozen=True, slots=True)
class IdentitiesListed(_LogAnswer):
    """The answer to ListIdentities: node ids, ascending, or StorageUnreachable."""

    call: ListIdentities  # type: ignore[assignment]
    result: tuple[str, ...] | StorageUnreachable


@dataclass(frozen=True, slots=True)
class TimerFired:
    timer: Timer

    @property
    def txn(self) -> str:
        return self.timer.txn

    @property
    def host(self) -> str:
        return self.timer.owner


@dataclass(frozen=True, slots=True)
class Recovered:
    """At node start, one transaction recovery found unfinished: a record of an owned partition's
    log, of this node's coordinator log, or a coordinator-log vote rebuilt from a coordinator's
    redo (a record that storage never held in the partition's log)."""

    record: Record

    @property
    def txn(self) -> str:
        return self.record.txn

    @property
    def host(self) -> str:
        # A coordinator's log is named after its node, which is the coordinator host's name.
        return self.record.log.name

    @property
    def coordinator_side(self) -> bool:
        return self.record.log.kind is LogKind.COORDINATOR



# The owner of the identity take's timers and answer. '~' cannot appear in a partition or node id,
# so it never names a host.
IDENTITY = "~identity"


@dataclass(frozen=True, slots=True)
class IdentityTaken:
    """The answer to TakeIdentity: the epoch this process holds the node's identity in."""

    epoch: int | StorageUnreachable

    @property
    def txn(self) -> str:
        return ""

    @property
    def host(self) -> str:
        return IDENTITY


@dataclass(frozen=True, slots=True)
class IdentityChecked:
    """The answer to CheckIdentity: whether the record still names this process's epoch."""

    node: str
    held: bool | StorageUnreachable

    @property
    def txn(self) -> str:
        return ""

    @property
    def host(self) -> str:
        return self.node

Event = (
    CommitRequested | ExecuteFailed | Executed | MessageReceived | LogReturned | ApplyReturned | DeleteReturned
    | RecordRead | ScanReturned | FinishedScanned | IdentitiesListed | TimerFired | Recovered | IdentityTaken
    | IdentityChecked
)

# Answers to storage calls, and the state a plain Log answers with.
StorageResult = LogOnceResult | TxnState | bool | Record | None | ScanPage | StorageUnreachable


def answer(call: StorageCall, result: StorageResult) -> Event:
    """The event that answers a storage call with what storage returned (or StorageUnreachable)."""
    if isinstance(call, LogOnce | Log):
        return LogReturned(call, result)  # type: ignore[arg-type]
    if isinstance(call, ApplyRedo):
        return ApplyReturned(call, result)  # type: ignore[arg-type]
    if isinstance(call, DeleteRecord):
        return DeleteReturned(call, result)  # type: ignore[arg-type]
    if isinstance(call, ReadRecord):
        return RecordRead(call, result)  # type: ignore[arg-type]
    return ScanReturned(call, result)  # type: ignore[arg-type]
