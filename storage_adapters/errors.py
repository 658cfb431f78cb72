"""Typed errors of the LogStore contract, so callers can tell retryable from fatal."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from storage_adapters.contract import LogId, TxnState


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
