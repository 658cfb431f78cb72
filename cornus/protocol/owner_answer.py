"""An owner's answer to a request of the execution phase (a peer's ExecuteRequest), and the one
rule that reads it: whether it is a refusal, after which the coordinator may abort at once without
reading any log (coordinator_cornus.py), because the owner did not run the request and will never
vote for it. The runtime (cornus/runtime/coordination.py) and the simulator
(cornus/sim/execution_phase.py) both classify answers with `refuses`: each kept its own copy
before, and the copies drifted (found by audit: the simulator took "dropped while its read was
out" for a refusal; the runtime answers it ABORTED, which is none)."""

from __future__ import annotations

import enum


class ExecuteStatus(enum.StrEnum):
    OK = "ok"
    CONFLICT = "conflict"  # a lock was held by another txn: retryable
    CHECK_FAILED = "check_failed"  # a CHECK op saw another value: the txn must abort
    ABORTED = "aborted"  # the partition knows this txn already (it ended, or runs it): no refusal
    NOT_OWNER = "not_owner"  # the receiver does not own the partition
    NOT_READY = "not_ready"  # the receiver is still recovering: retryable
    INVALID = "invalid"  # bad request (ids, sizes): not retryable
    UNAVAILABLE = "unavailable"  # storage did not answer, or the request came past its deadline: retryable


def refuses(status: ExecuteStatus) -> bool:
    """Whether an owner that answered `status` did not run the request and never votes for it.
    OK is no refusal. Nor is ABORTED: the owner knows the transaction already (a machine runs it
    there, for an earlier request or an earlier process of the coordinator; or an abort overtook
    the request), so a vote of it may stand, and a Cornus coordinator must end the transaction
    through the logs (found by review: taken for a refusal, it decided ABORT beside an earlier
    process's COMMIT). Every other answer is given before the owner feeds a carried prepare to its
    machine (Node.on_request asserts it), so nothing of it can vote."""
    return status is not ExecuteStatus.OK and status is not ExecuteStatus.ABORTED


def in_doubt_for_a_client_id(status: ExecuteStatus) -> bool:
    """Whether an owner's answer `status` to a request of a client-chosen id, run as begin,
    operations and commit, leaves the transaction in doubt rather than aborted: ABORTED says the
    owner knows the id already (it ran there and ended, or a machine commits it), which another
    process of the coordinator's node, to which the client sent the id too, may have committed
    (found by audit: reported aborted and retryable, the client ran it again under a new id)."""
    return status is ExecuteStatus.ABORTED
