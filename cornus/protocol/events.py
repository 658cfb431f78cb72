"""What happens to a protocol machine: requests, messages, returned log calls, fired timers."""

from __future__ import annotations

from dataclasses import dataclass

from cornus.protocol.effects import LogCall
from cornus.protocol.messages import Message
from storage_adapters.contract import LogOnceResult, Record, TxnState


@dataclass(frozen=True, slots=True)
class StorageUnreachable:
    """A log call failed with StorageUnavailable: it may or may not have taken effect."""

    reason: str = ""


@dataclass(frozen=True, slots=True)
class CommitRequested:
    """The caller asks the coordinator to commit. `writes` maps each written partition to its redo
    (the coordinator needs it only for coordinator-log); `reads` are partitions only read."""

    txn: str
    writes: tuple[tuple[str, bytes], ...]
    reads: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Executed:
    """The execution phase finished on a partition: it holds the locks and the redo, and has made
    up its mind about its vote (a runtime votes no when, e.g., validation failed)."""

    txn: str
    partition: str
    coordinator: str
    redo: bytes
    vote_yes: bool = True


@dataclass(frozen=True, slots=True)
class MessageReceived:
    sender: str
    message: Message


@dataclass(frozen=True, slots=True)
class LogReturned:
    """The answer to `call`: a LogOnceResult for LogOnce, the stored state for Log."""

    call: LogCall
    result: LogOnceResult | TxnState | StorageUnreachable


@dataclass(frozen=True, slots=True)
class TimerFired:
    name: str


@dataclass(frozen=True, slots=True)
class Recovered:
    """At node start, one record that recovery's scan found unfinished in a log the node owns."""

    record: Record


Event = CommitRequested | Executed | MessageReceived | LogReturned | TimerFired | Recovered
