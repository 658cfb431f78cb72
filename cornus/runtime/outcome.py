"""What a transaction ends with, as the runtime tells its callers (and the public API repeats).

Never "committed" unless it is: a commit whose outcome the coordinator cannot establish within its
deadline is UNKNOWN, and the status call gives the true outcome later.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from storage_adapters.errors import ValidationError


class OutcomeStatus(enum.StrEnum):
    COMMITTED = "committed"
    ABORTED = "aborted"
    UNAVAILABLE = "unavailable"  # storage or a peer did not answer; nothing was committed
    UNKNOWN = "unknown"  # the commit may or may not have happened: ask the status call
    ACTIVE = "active"  # status only: the transaction is still running


class AbortReason(enum.StrEnum):
    CONFLICT = "conflict"  # a lock was held: retry
    CHECK_FAILED = "check_failed"  # a check op saw another value
    VOTED_NO = "voted_no"  # a participant refused (its execution state was lost, or it timed out)
    CLIENT = "client"  # the caller aborted
    TIMEOUT = "timeout"  # idle past the limit
    NOT_READY = "not_ready"  # a partition owner is still recovering: retry
    PEER_UNAVAILABLE = "peer_unavailable"  # a partition owner did not answer during execution: retry


_RETRYABLE = {AbortReason.CONFLICT, AbortReason.NOT_READY, AbortReason.PEER_UNAVAILABLE, AbortReason.VOTED_NO}


@dataclass(frozen=True, slots=True)
class Outcome:
    txn: str
    status: OutcomeStatus
    reason: AbortReason | None = None
    detail: str = ""
    # Values read by a one-shot execute, in the order of its get ops.
    reads: tuple[tuple[str, bytes | None], ...] = ()
    timing_ms: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        assert (self.reason is not None) == (self.status is OutcomeStatus.ABORTED), (self.status, self.reason)

    @property
    def retryable(self) -> bool:
        if self.status is OutcomeStatus.ABORTED:
            return self.reason in _RETRYABLE
        return self.status is OutcomeStatus.UNAVAILABLE


class TxnError(Exception):
    """A call that the transaction's state does not allow; nothing changed."""


class TxnNotFound(TxnError):
    pass


class TxnWrongState(TxnError):
    pass


def may_have_run_outcome(txn: str, refused: Exception) -> Outcome:
    """The answer to a one-shot under the client-chosen id `txn` that `refused` (its `may_have_run`)
    says an earlier delivery of the same request may have run: unknown, never "nothing ran" (found
    by audit: a client behind a proxy that delivers a POST twice ran its transaction again)."""
    return Outcome(txn, OutcomeStatus.UNKNOWN,
                   detail=f"{refused}; an earlier delivery of this request may have run it: ask its status")


class ClientTxnKnown(TxnWrongState):
    """A client-chosen id this node already ran (or runs): a second delivery of the same request,
    whose outcome the status call tells."""

    may_have_run = True


class NodeOverloaded(TxnError):
    """Too many transactions in flight on this coordinator: retry later."""


class ClientTxnRefused(ValidationError):
    """A client-chosen transaction id this node refuses for its form (it names another node, say);
    nothing ran here. REST answers 400 `invalid_txn`, gRPC INVALID_ARGUMENT. `may_have_run`: an
    earlier delivery of the same request may have run it all the same (a proxy that sent it again:
    to another node, which the id names, or to this node before it restarted), so its outcome is
    unknown, not "nothing ran"; gRPC answers OUTCOME_UNKNOWN then, and REST's SDK concludes so."""

    def __init__(self, message: str, *, may_have_run: bool = False) -> None:
        super().__init__(message)
        self.may_have_run = may_have_run


class ClientTxnBeginRefused(ClientTxnRefused):
    """A client-chosen id whose begin time this node refuses (the client's clock runs ahead of the
    node's or too far behind, or the id was sent to an earlier run of this node); nothing ran here.
    Ahead of the clock, no delivery could have run it: the caller may run the same transaction
    under another id (REST answers 400 `txn_begin_refused`, and the SDK falls back to a
    server-chosen id). Otherwise an earlier delivery may have (`may_have_run`): unknown."""
