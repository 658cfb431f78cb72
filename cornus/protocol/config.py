"""Which protocol runs, and every timeout and limit the protocol machines obey."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Protocol(enum.StrEnum):
    CORNUS = "cornus"
    TWO_PC = "2pc"
    COORDINATOR_LOG = "coordinator-log"


@dataclass(frozen=True, slots=True)
class ProtocolConfig:
    """Timeouts are in milliseconds of the runtime's (or simulator's) clock."""

    # A participant that hears nothing about its transaction for this long aborts it unilaterally:
    # it has not voted, so nobody can have committed.
    timeout_ms_prepare: int = 400
    # The coordinator waits this long for votes before it terminates (Cornus) or aborts (2PC, CL).
    timeout_ms_votes: int = 200
    # A participant that voted yes waits this long for the decision before it terminates.
    timeout_ms_decision: int = 200
    # The coordinator resends the decision to participants that have not acknowledged it.
    timeout_ms_resend: int = 100
    # Retries against unreachable storage (and repeated termination queries) back off
    # exponentially from the minimum to the cap, with jitter so that participants of one
    # transaction do not hammer storage in lockstep.
    backoff_ms_min: int = 10
    backoff_ms_max: int = 320
    # Records are deleted this long after every participant acknowledged a durable decision, so
    # that no message or storage call still in flight can recreate a deleted record. It must
    # exceed the longest message delay and storage call deadline of the deployment.
    gc_grace_ms: int = 1000

    def __post_init__(self) -> None:
        for name in (
            "timeout_ms_prepare",
            "timeout_ms_votes",
            "timeout_ms_decision",
            "timeout_ms_resend",
            "backoff_ms_min",
            "backoff_ms_max",
            "gc_grace_ms",
        ):
            value = getattr(self, name)
            assert isinstance(value, int), f"{name} must be an int"
            assert value > 0, f"{name} must be positive, got {value}"
        assert self.backoff_ms_min <= self.backoff_ms_max
