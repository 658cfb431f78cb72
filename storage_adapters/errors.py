"""Typed errors of the LogStore contract, so callers can tell retryable from fatal."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from storage_adapters.contract import Fence, LogId, Ownership, TxnState


class StorageError(Exception):
    """Base of every error a LogStore raises on purpose."""


class StorageUnavailable(StorageError):
    """The backend did not answer within the deadline or refused the connection. Retryable: the
    call may or may not have taken effect, so the caller must read back or repeat an idempotent
    call (every LogStore call is idempotent)."""


class ValidationError(StorageError, ValueError):
    """A bad argument (id, size, type). Raised before any I/O: nothing was written."""


class InvariantViolation(StorageError):
    """Storage holds, or a caller asked for, a state the protocol says cannot happen."""


class DecisionFlipRefused(InvariantViolation):
    """`log` was asked to turn COMMIT into ABORT (or back) or a decision into a vote. Nothing was
    written; `stored` is what the record holds."""

    def __init__(self, log: LogId, txn: str, stored: TxnState, wanted: TxnState) -> None:
        super().__init__(f"refused to overwrite {stored} with {wanted} for txn {txn!r} in log {log.key}")
        self.log = log
        self.txn = txn
        self.stored = stored
        self.wanted = wanted

    def __reduce__(self) -> tuple[type, tuple[LogId, str, TxnState, TxnState]]:
        # Pickled by the emulator's writer process (its answers cross a socket): rebuilt from the
        # fields, since the default would call __init__ with the message alone.
        return type(self), (self.log, self.txn, self.stored, self.wanted)


class Fenced(StorageError):
    """A partition owner's write carried a fence (its node id and epoch) that the partition's
    ownership record no longer matches: another node took the partition, or this one released it.
    Nothing was written; `stored` is the ownership record found (None if there is none). Not
    retryable: the writer is deposed and must stop writing for the partition."""

    def __init__(self, fence: Fence, stored: Ownership | None) -> None:
        found = "no ownership record" if stored is None else f"owner {stored.owner or '(none)'!r} epoch {stored.epoch}"
        super().__init__(
            f"write to {fence.partition} by {fence.owner!r} at epoch {fence.epoch} refused: storage holds {found}"
        )
        self.fence = fence
        self.stored = stored

    def __reduce__(self) -> tuple[type, tuple[Fence, Ownership | None]]:
        return type(self), (self.fence, self.stored)  # as DecisionFlipRefused.__reduce__
