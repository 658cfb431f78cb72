"""The properties every run must keep, judged from a finished World."""

from __future__ import annotations

from cornus.protocol.config import Protocol
from cornus.sim.world import TXN, World
from storage_adapters.contract import TxnState


def final_outcome(world: World, partition: str) -> TxnState:
    """What the participant ends with: its record's decision, or the decision its record held when
    collected; no record at all means it never voted yes (presumed abort)."""
    log = world.logs[partition]
    state = world.storage.state(log, TXN)
    if state is None:
        state = world.storage.deleted.get((log, TXN), TxnState.ABORT)
    return state


def check(world: World) -> list[str]:
    """Every violated invariant of the run, as readable sentences (empty when all hold)."""
    outcome = world.outcome
    violations = list(outcome.violations)
    protocol = world.protocol

    # Agreement: every decision anyone ever took or stored, and every reply, is the same.
    seen: set[TxnState] = set(world.storage.decisions_seen) | set(outcome.replies)
    seen |= outcome.coordinator_decisions
    for decisions in outcome.machine_decisions.values():
        seen |= decisions
    if len(seen) > 1:
        violations.append(f"agreement: both COMMIT and ABORT were decided ({sorted(seen)})")

    # Validity: COMMIT only if every participant voted yes (and, where votes are logged, its log
    # held VOTE_YES).
    if TxnState.COMMIT in seen:
        if not all(world.schedule.votes):
            violations.append("validity: COMMIT although a participant voted no")
        if protocol is not Protocol.COORDINATOR_LOG:
            unvoted = [p for p in world.partitions if world.logs[p] not in world.storage.voted_yes]
            if unvoted:
                violations.append(f"validity: COMMIT but no VOTE_YES was ever logged by {unvoted}")

    if len(set(outcome.replies)) > 1:
        violations.append(f"the caller was told different outcomes: {outcome.replies}")

    # Liveness: once faults stop, every participant decides within the bound.
    if outcome.undecided_at_liveness_check:
        violations.append(f"liveness: undecided {world.liveness_bound_ms()} ms after faults ended: "
                          f"{outcome.undecided_at_liveness_check}")

    # Durability of the acknowledgement: what the caller heard is what every participant ends with.
    finals = {p: final_outcome(world, p) for p in world.partitions}
    for reply in outcome.replies:
        wrong = {p: s for p, s in finals.items() if s is not reply}
        if wrong:
            violations.append(f"durability: caller told {reply}, participants end with {wrong}")
    for p, state in finals.items():
        if state is TxnState.COMMIT and p not in outcome.applied:
            violations.append(f"{p} ends COMMIT but never applied its redo")
        if state is not TxnState.COMMIT and p in outcome.applied:
            violations.append(f"{p} applied its redo but ends {state}")
    unreleased = set(world.read_only) - outcome.released_read_only
    quiet = world.schedule.loss_probability == 0 and not world.schedule.crashes
    if outcome.replies and unreleased and quiet:
        violations.append("a read-only partition was never released")
    return violations
