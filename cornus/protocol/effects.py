"""What the core asks its runtime (or the simulator) to do. Frozen values, mapped 1:1 onto actions.

Ordering contract: the runtime starts effects in list order; sends, storage calls and timers may
then proceed concurrently. Every storage call (`LogOnce`, `Log`, `ApplyRedo`, `DeleteRecord`,
`ReadRecord`, `ScanLog`, `ListIdentities`) is answered by exactly one result event naming the call
(events.py), unless the node crashes; a call that timed out is answered `StorageUnreachable` and
may still land later, up to the storage deadline plus the clock slack (ProtocolConfig). Lock effects
(`ReleaseLocks`, `RetakeLocks`, `LocksPrepared`) and `CacheRedo` take effect before the next
effect starts. Storage calls name their `owner`, the host (partition or coordinator node) or the
recovery that made them: their answer goes back there.
"""

from __future__ import annotations

from dataclasses import dataclass

from cornus.protocol.messages import Message
from storage_adapters.contract import LogId, RecordBody, Tombstone, TxnState


@dataclass(frozen=True, slots=True)
class Timer:
    """A named timer of one host: `owner` is the host (partition or node), `txn` the transaction
    ("" for node-wide timers such as recovery's), `kind` what it is for."""

    owner: str
    txn: str
    kind: str


@dataclass(frozen=True, slots=True)
class Send:
    source: str
    to: str
    message: Message


@dataclass(frozen=True, slots=True)
class LogOnce:
    owner: str
    log: LogId
    txn: str
    state: TxnState
    body: RecordBody


@dataclass(frozen=True, slots=True)
class Log:
    """`body` None keeps the stored body (a decision over a vote)."""

    owner: str
    log: LogId
    txn: str
    state: TxnState
    body: RecordBody | None = None


@dataclass(frozen=True, slots=True)
class ApplyRedo:
    """Write a committed redo into the partition's data and mark its record COMMIT and applied.
    The record may still hold the participant's own VOTE_YES: the apply then records the COMMIT in
    the same storage call, so a participant that learns COMMIT needs no Log(COMMIT) before it (see
    LogStore.apply_redo for why that is safe). Answered by ApplyReturned; the participant holds
    the locks of the redo until it succeeds, and acks the decision only after."""

    owner: str
    partition: str
    txn: str
    redo: bytes

    @property
    def log(self) -> LogId:
        """The log whose record the apply marks."""
        return LogId.partition(self.partition)


@dataclass(frozen=True, slots=True)
class DeleteRecord:
    """Garbage collection of a finished transaction's record; answered by DeleteReturned. With
    `keep`, the record's tombstone stays in its place (storage_adapters.contract.Tombstone)."""

    owner: str
    log: LogId
    txn: str
    keep: Tombstone | None = None


@dataclass(frozen=True, slots=True)
class ReadRecord:
    """Read one record (recovery, resolve); answered by RecordRead."""

    owner: str
    log: LogId
    txn: str


@dataclass(frozen=True, slots=True)
class ScanLog:
    """One page of a log's unfinished records whose txn sorts after `after`; answered by
    ScanReturned with a ScanPage, whose `resume_after` (None at the log's end) is where the next
    page starts: a page may stop short of `limit`, even empty, where storage walks finished records
    (LogStore.scan_unfinished_page)."""

    owner: str
    log: LogId
    after: str
    limit: int


@dataclass(frozen=True, slots=True)
class ScanFinished:
    """One page of a log's finished records that are not tombstones, whose txn sorts after
    `after` (LogStore.scan_finished_page), for a sweeper (cornus.protocol.sweeper); answered by
    FinishedScanned, which tells the wall clock (ms) at which the call left: the sweeper judges
    the records' age by it, since the core reads no clock."""

    owner: str
    log: LogId
    after: str
    limit: int


@dataclass(frozen=True, slots=True)
class ListIdentities:
    """One page of the ids of the nodes that ever took an identity in storage, sorted, strictly
    after `after`; answered by IdentitiesListed. A page shorter than `limit` is the last. Recovery
    reads it to find every coordinator log, not only those of the nodes it was configured with
    (a node added by a rollout that this process's configuration predates)."""

    owner: str
    after: str
    limit: int


StorageCall = LogOnce | Log | ApplyRedo | DeleteRecord | ReadRecord | ScanLog
LogCall = LogOnce | Log


@dataclass(frozen=True, slots=True)
class Reply:
    """The outcome for the transaction's caller. At most one per transaction and coordinator.
    `reason` says why an ABORT was chosen, for the caller and the logs."""

    txn: str
    outcome: TxnState
    reason: str = ""


@dataclass(frozen=True, slots=True)
class StartTimer:
    """(Re)start the timer; starting a running timer restarts it."""

    timer: Timer
    duration_ms: int


@dataclass(frozen=True, slots=True)
class CancelTimer:
    timer: Timer


@dataclass(frozen=True, slots=True)
class ReleaseLocks:
    """Drop the transaction's locks and execution state on the partition. `refuse_later`: and
    refuse any execution of it from now on (bounded memory, as the runtime's), because a one-shot's
    request that carries its prepare may still be on its way, or running, and must not vote after
    the partition acknowledged the ABORT it knew nothing of."""

    partition: str
    txn: str
    refuse_later: bool = False


@dataclass(frozen=True, slots=True)
class LocksPrepared:
    """The transaction voted yes here: its locks go at the decision, so a conflicting request
    waits for it (bounded) instead of aborting (DESIGN 4)."""

    partition: str
    txn: str


@dataclass(frozen=True, slots=True)
class RetakeLocks:
    """Recovery: hold exclusively every key `redo` writes, before anyone else can, for a
    transaction that voted yes (or committed) and has not finished."""

    partition: str
    txn: str
    redo: bytes


@dataclass(frozen=True, slots=True)
class CacheRedo:
    """The redo is in storage and its keys are still locked by the transaction: it is the newest
    committed data of those keys, so the owner's cache may hold it."""

    partition: str
    txn: str
    redo: bytes


@dataclass(frozen=True, slots=True)
class Decided:
    """A coordinator has what decides the outcome: every vote (2PC and coordinator-log then log
    their decision, which a crash before it lands still turns into an abort), or a termination or
    a participant's durable decision. What follows is the commit phase. For timing and
    failpoints; it asks for no action."""

    txn: str
    outcome: TxnState


@dataclass(frozen=True, slots=True)
class TerminationStarted:
    """`where` (a partition or a coordinator node) began the termination protocol."""

    txn: str
    where: str


@dataclass(frozen=True, slots=True)
class TerminationEnded:
    """`where` ended its termination with `outcome`; None: it gave up undecided (a Cornus
    coordinator past ProtocolConfig.coordinator_terminate_ms_max)."""

    txn: str
    where: str
    outcome: TxnState | None


@dataclass(frozen=True, slots=True)
class RecoveryFinished:
    """Every unfinished transaction a recovery found has its machine and its locks again: the
    hosts it covered may answer for transactions they do not know from now on. `node` is True for
    the recovery at start (this node's coordinator, and the partitions it held from the start);
    `partitions` are the partitions it covered (a partition taken later has a recovery of its own)."""

    transaction_count: int
    partitions: tuple[str, ...] = ()
    node: bool = True
    # (host, txn) of every transaction rebuilt, for the runtime to watch them resolve.
    transactions: tuple[tuple[str, str], ...] = ()


# Rounds of read, then compare-and-swap over what was read, one take of an identity makes at most:
# each lost only to another process of the same node taking it at the same moment. Past them the
# take answers unreachable, and the core takes again after a backoff.
TAKE_IDENTITY_ROUND_COUNT_MAX = 8


@dataclass(frozen=True, slots=True)
class TakeIdentity:
    """Take the node's identity record (storage_adapters.contract.identity_name) in a new epoch, by
    compare-and-swap over what is stored (TAKE_IDENTITY_ROUND_COUNT_MAX rounds at most); answer
    with `IdentityTaken`. From then on storage refuses the coordinator-log writes of every
    earlier process of the node (they carry older fences), so recovery, which starts only after
    it, sees every one that landed."""

    node: str


@dataclass(frozen=True, slots=True)
class CheckIdentity:
    """Read the node's identity record; answer with `IdentityChecked`: whether it still names the
    node at `epoch`, this process's. With `renew`, write it again instead (the same epoch, the next
    version), which answers the same question: a process of the node that an earlier take parked
    watches for these renewals, and takes the record for vacant when they stop
    (cornus.protocol.identity_watch)."""

    node: str
    epoch: int
    renew: bool = False


@dataclass(frozen=True, slots=True)
class ConfirmIdentity:
    """A blocking protocol's coordinator decided ABORT for `txn`, an id the client chose, without
    a record: before anyone hears it, a read of the node's identity record made after now must
    find it this process's (a later process of the node may run the same id, and commit it).
    Between a machine and its CoordinatorHost, which answers with the machine's
    `abort_confirmed()`; it never reaches the runtime."""

    node: str
    txn: str


@dataclass(frozen=True, slots=True)
class Deposed:
    """Another process of this node took its identity after this one: this one must stop acting at
    once, since it could presume ABORT for a transaction of the other's. The runtime parks it,
    and it watches the record (cornus.protocol.identity_watch) in case the other process is gone."""

    node: str
    epoch: int


Effect = (
    Send | LogOnce | Log | ApplyRedo | DeleteRecord | ReadRecord | ScanLog | ScanFinished | ListIdentities | Reply
    | StartTimer | CancelTimer | ReleaseLocks | LocksPrepared | RetakeLocks | CacheRedo | Decided | TerminationStarted
    | TerminationEnded | RecoveryFinished | TakeIdentity | CheckIdentity | ConfirmIdentity | Deposed
)
