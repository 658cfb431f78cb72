"""The properties every run must keep, judged from a finished World.

Per transaction: agreement (one decision, whoever took it), validity (COMMIT only if every
participant voted yes and logged it), durability of what the caller heard, atomicity of the apply,
that a manual resolve tells the truth, and that the status call never says "not known" of a
transaction that commits (cornus.sim.status_probe). Across transactions: the data is what a serial order
of the committed transactions would have left (every increment counted once, every read seeing a
state that fits the order), and no record came back after garbage collection. And liveness: once
faults stop, everything decides, applies and unlocks within a bound.
"""

from __future__ import annotations

from cornus.protocol.config import Protocol
from cornus.sim.world import World
from storage_adapters.contract import LogId, TxnState


def final_outcome(world: World, txn: str, partition: str) -> TxnState:
    """What a participant ends with: its record's decision, or the decision its record held when
    collected; no record at all means it never voted yes (presumed abort)."""
    return world.storage.final_state(LogId.partition(partition), txn) or TxnState.ABORT


def check(world: World) -> list[str]:
    """Every violated invariant of the run, as readable sentences (empty when all hold)."""
    outcome = world.outcome
    violations = list(outcome.violations)
    committed: list[str] = []
    aborted: set[str] = set()
    for txn, plan in world.plans.items():
        seen = set(world.storage.decisions_seen.get(txn, set())) | set(outcome.replies.get(txn, []))
        seen |= outcome.decisions.get(txn, set())
        if seen == {TxnState.ABORT}:
            aborted.add(txn)
        if len(seen) > 1:
            violations.append(f"agreement: {txn} was both committed and aborted ({sorted(seen)})")
        if len(set(outcome.replies.get(txn, []))) > 1:
            violations.append(f"{txn}: the caller was told different outcomes: {outcome.replies[txn]}")
        finals = {p: final_outcome(world, txn, p) for p, _ in plan.writes}
        if TxnState.COMMIT in seen:
            committed.append(txn)
            if txn not in outcome.executed or not all(plan.vote_of.values()):
                violations.append(f"validity: {txn} committed although a participant never voted yes")
            if plan.protocol is not Protocol.COORDINATOR_LOG:
                unvoted = [p for p in finals if (LogId.partition(p), txn) not in world.storage.voted_yes]
                if unvoted:
                    violations.append(f"validity: {txn} committed but no VOTE_YES was ever logged by {unvoted}")
            wrong = {p: s for p, s in finals.items() if s is not TxnState.COMMIT}
            if wrong:
                violations.append(f"atomicity: {txn} committed, participants end with {wrong}")
            unapplied = [p for p in finals if (p, txn) not in outcome.applied]
            if unapplied:
                violations.append(f"durability: {txn} committed but {unapplied} never applied its redo")
        elif any(s is TxnState.COMMIT for s in finals.values()):
            violations.append(f"{txn}: a participant holds COMMIT of a transaction never decided so: {finals}")
        for reply in outcome.replies.get(txn, []):
            if reply is TxnState.COMMIT and txn not in committed:
                violations.append(f"durability: {txn}: the caller was told COMMIT, storage ends with {finals}")
        for resolved_txn, resolved, detail in outcome.resolves:
            if resolved_txn == txn and resolved is not None and seen and resolved not in seen:
                violations.append(f"resolve of {txn} said {resolved} ({detail}); the transaction is {sorted(seen)}")
    for txn, told_ms in outcome.told_nothing_ran.items():
        if txn in committed:
            violations.append(f"{txn}: a process of its coordinator still starting said at {told_ms} ms that it "
                              "never ran (its client runs it again under a new id); it committed")
    violations += _serializability(world, committed)
    read_only = {txn for txn, plan in world.plans.items() if not plan.writes}
    violations += world.probe.violations(set(committed), aborted, read_only)
    if outcome.undecided_at_liveness_check:
        violations.append(
            f"liveness: {world.liveness_bound_ms()} ms after faults ended: {outcome.undecided_at_liveness_check}"
        )
    return violations


def _serializability(world: World, committed: list[str]) -> list[str]:
    """Every write increments a key, so values are versions: a committed transaction that read
    version v of a key and wrote v+1 comes after the writer of v and before the writer of v+2; one
    that only read v comes before the writer of v+1. Two writers of one version (a lost update), a
    version written by nobody committed, or a cycle in that order, break serializability."""
    outcome = world.outcome
    writer: dict[tuple[tuple[str, str], int], str] = {}
    problems: list[str] = []
    for txn in committed:
        for key, version in outcome.writes.get(txn, {}).items():
            other = writer.setdefault((key, version), txn)
            if other != txn:
                problems.append(f"lost update: {txn} and {other} both wrote version {version} of {key}")
    for (partition, key), value in world.storage.data.items():
        versions = [v for (k, v) in writer if k == (partition, key)]
        if sorted(versions) != list(range(1, value + 1)):
            problems.append(
                f"data: {partition}/{key} holds {value}, committed writers made versions {sorted(versions)}"
            )
    for (key, version), txn in writer.items():
        if world.storage.data.get(key, 0) < version:
            problems.append(f"data: {key} lost version {version} that {txn} committed")
    edges: dict[str, set[str]] = {txn: set() for txn in committed}
    for txn in committed:
        for key, version in outcome.reads.get(txn, {}).items():
            before = writer.get((key, version))
            if before is not None and before != txn:
                edges[before].add(txn)
            after = writer.get((key, version + 1))
            if after is not None and after != txn:
                edges[txn].add(after)
    cycle = _find_cycle(edges)
    if cycle:
        problems.append(f"serializability: the committed transactions order in a cycle {' -> '.join(cycle)}")
    return problems


def _find_cycle(edges: dict[str, set[str]]) -> list[str]:
    state: dict[str, int] = {}  # 1 on the current path, 2 finished
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return []

    for node in sorted(edges):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return []
