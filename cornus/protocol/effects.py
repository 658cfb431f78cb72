"""What a protocol machine asks its runtime to do. Frozen values, mapped 1:1 onto runtime actions.

Ordering contract: the runtime starts effects in list order. Sends, log calls and timers may then
proceed concurrently, but an `ApplyRedo` must have completed before a `ReleaseLocks` that follows
it for the same transaction (otherwise a reader could see the old value after the lock is gone).
Every `LogOnce`/`Log` is answered by exactly one `LogReturned` event unless the node crashes.
"""

from __future__ import annotations

from dataclasses import dataclass

from cornus.protocol.messages import Message
from storage_adapters.contract import LogId, RecordBody, TxnState


@dataclass(frozen=True, slots=True)
class Send:
    to: str
    message: Message


@dataclass(frozen=True, slots=True)
class LogOnce:
    log: LogId
    txn: str
    state: TxnState
    body: RecordBody


@dataclass(frozen=True, slots=True)
class Log:
    """`body` None keeps the stored body (a decision over a vote)."""

    log: LogId
    txn: str
    state: TxnState
    body: RecordBody | None = None


@dataclass(frozen=True, slots=True)
class Reply:
    """The outcome for the transaction's caller. At most one per transaction and coordinator."""

    txn: str
    outcome: TxnState


@dataclass(frozen=True, slots=True)
class StartTimer:
    """(Re)start the named timer; starting a running timer restarts it."""

    name: str
    duration_ms: int


@dataclass(frozen=True, slots=True)
class CancelTimer:
    name: str


@dataclass(frozen=True, slots=True)
class ApplyRedo:
    partition: str
    txn: str
    redo: bytes


@dataclass(frozen=True, slots=True)
class ReleaseLocks:
    partition: str
    txn: str


@dataclass(frozen=True, slots=True)
class DeleteRecord:
    """Garbage collection of a finished transaction's record. The DeleteRecords of one effect list
    are carried out one after another, in list order."""

    log: LogId
    txn: str


LogCall = LogOnce | Log
Effect = Send | LogOnce | Log | Reply | StartTimer | CancelTimer | ApplyRedo | ReleaseLocks | DeleteRecord
