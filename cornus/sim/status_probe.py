"""The status call, asked of the simulated world at random moments and judged against what each
transaction became.

A caller that lost its answer asks the status call, and "not known" tells it the transaction
never committed, so it may run it again: the status call's verdict (cornus.protocol.status)
decides whether a transaction can commit twice. The runtime gathers every node's answer
(cornus/runtime/admin.py: what its coordinator knows, whether a participant runs the transaction
on a partition it holds, and the records of those partitions) and asks the verdict; the world
gathers the same answers from its own nodes, each at its own moment after the question, as a
real node's answer is made while others are still on their way, and asks the same verdict.

The probe only reads the world and draws from its own RNG: a schedule's run, and so every seed
the tests rely on, stays what it was.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cornus.protocol import status, txn_ids
from cornus.protocol.status import Known, NodeAnswer, StatusVerdict, Verdict
from storage_adapters.contract import LogId, TxnState

if TYPE_CHECKING:
    from cornus.sim.process import Node
    from cornus.sim.world import World

# Questions per schedule (StatusProbe.plan says where they aim). Each costs a few dictionary
# reads per node.
QUESTION_COUNT = 8
# And after each recovery of a node, about that many of the transactions it coordinates.
RECOVERY_QUESTION_COUNT_MAX = 2

# A step of a node's answer: (question index, node name, "start" | "read" | "end", partition read).
Step = tuple[int, str, str, str]


@dataclass(slots=True)
class _Answering:
    """A node's answer under way: the process answering, the partitions it held when it began,
    whether a participant ran the transaction there then, and the states its reads found."""

    incarnation: int
    held: tuple[str, ...]
    served: tuple[str, ...]  # of those held, the recovered ones: the answer reads only these
    runs_before: bool
    states: list[TxnState] = field(default_factory=list)
    gone: bool = False


@dataclass(slots=True)
class Question:
    txn: str
    at_ms: int  # by storage's clock, the world's
    asker: str = ""  # the node the caller asked: its clock judges (drawn when asked)
    asked_ms: int = 0  # by the asker's clock
    answers: dict[str, NodeAnswer | None] = field(default_factory=dict)
    answering: dict[str, _Answering] = field(default_factory=dict)  # answers under way, by node name
    verdict: StatusVerdict | None = None
    judged: bool = False  # every answer came and the verdict was asked


class StatusProbe:
    def __init__(self, seed: int) -> None:
        # Its own RNG: questions never change what the world's RNG draws.
        self.rng = random.Random(zlib.crc32(f"{seed}/status".encode()))
        self.questions: list[Question] = []

    def plan(self, world: World) -> list[tuple[int, int]]:
        """(when, question index) of this run's questions, each about a transaction that has begun,
        aimed at the edges its verdict turns on: soon after its begin (its requests and votes on
        their way, its coordinator perhaps crashed), just after a one-shot's requests can no longer
        run (`World.requests_ms`: "too recent" ends), just before its records' trace may be gone
        (`kept_window_ms`, less as long as answers may take: "not known" ends), or anywhere
        between its begin and that."""
        kept_ms = status.kept_window_ms(world.config)
        planned = []
        for index in range(QUESTION_COUNT):
            txn = self.rng.choice(world.txns)
            begin_ms = txn_ids.begin_ms_of(txn)
            aim = index % 4
            if aim == 0:
                at_ms = begin_ms + self.rng.randint(0, world.requests_ms)
            elif aim == 1:
                at_ms = begin_ms + world.requests_ms + self.rng.randint(0, world.schedule.delay_ms_max)
            elif aim == 2:
                at_ms = begin_ms + kept_ms - self.rng.randint(0, world.status_answer_ms_max)
            else:
                at_ms = begin_ms + self.rng.randint(0, kept_ms)
            self.questions.append(Question(txn, at_ms))
            planned.append((at_ms, index))
        for move in world.schedule.moves:
            # And one in each gap (Move.gap_ms), about a transaction on the partition nobody holds
            # then, which began before: no answer can read its records there (drawn only where
            # there are gaps, so that every other schedule's questions stay what they were).
            begun = [txn for txn in world.txns if txn_ids.begin_ms_of(txn) < move.at_ms
                     and move.partition in (p for p, _ in (*world.plans[txn].writes, *world.plans[txn].reads))]
            if move.gap_ms and begun:
                at_ms = move.at_ms + self.rng.randint(0, move.gap_ms // 2)
                self.questions.append(Question(self.rng.choice(begun), at_ms))
                planned.append((at_ms, len(self.questions) - 1))
        return planned

    def after_recovery(self, world: World, name: str) -> list[tuple[int, int]]:
        """(when, question index) of questions about the transactions node `name` coordinates that
        began before its recovery finished, less than their trace's keep ago (at most
        RECOVERY_QUESTION_COUNT_MAX): asked soon after, and not before a one-shot's requests can
        no longer run, when "not known" is first allowed."""
        kept_ms = status.kept_window_ms(world.config)
        begun = [txn for txn in world.txns
                 if world.plans[txn].coordinator == name
                 and world.now_ms - kept_ms <= txn_ids.begin_ms_of(txn) <= world.now_ms]
        planned = []
        for txn in self.rng.sample(begun, min(len(begun), RECOVERY_QUESTION_COUNT_MAX)):
            earliest_ms = max(world.now_ms, txn_ids.begin_ms_of(txn) + world.requests_ms)
            at_ms = earliest_ms + self.rng.randint(0, world.schedule.delay_ms_max)
            self.questions.append(Question(txn, at_ms))
            planned.append((at_ms, len(self.questions) - 1))
        return planned

    def ask(self, world: World, index: int) -> list[tuple[int, Step]]:
        """The caller asks question `index` of one node now, which asks every node: (when, step)
        of each node's first step (`step`), all done within the asker's wait (a peer request's
        deadline)."""
        question = self.questions[index]
        question.asker = self.rng.choice(sorted(world.nodes))
        question.asked_ms = world.clock_ms(question.asker)
        half_ms = world.status_answer_ms_max // 2
        return [(world.now_ms + self.rng.randint(0, half_ms), (index, name, "start", ""))
                for name in sorted(world.nodes)]

    def step(self, world: World, data: Step) -> list[tuple[int, Step]]:
        """One step of node `name`'s answer, as the runtime's status_response takes them: at its
        start, the partitions it holds and whether a participant runs the transaction there; then
        a read of each of those partitions' records, one after the other; at its end, what its
        coordinator knows and whether a participant runs it now. A process that dies meanwhile
        does not answer. The verdict is asked once every node has answered."""
        index, name, what, partition = data
        question = self.questions[index]
        if what == "start":
            node = world.nodes[name]
            first = world.twins.get(name)
            if first is not None and self.rng.random() < 0.5:
                node = first  # two processes answer to the node's name, as _deliver delivers
            if not node.alive or node.core is None:
                self._answered(world, question, name, None)
                return []
            held = held_partitions(node)
            served = tuple(p for p in held if node.core.partition_recovered(p))
            question.answering[name] = _Answering(node.incarnation, held, served,
                                                  _participating(node, question.txn, held))
            end_ms = world.now_ms + self.rng.randint(0, world.status_answer_ms_max // 2)
            reads = sorted(self.rng.randint(world.now_ms, end_ms) for _ in served)
            return [*((at_ms, (index, name, "read", p)) for at_ms, p in zip(reads, served, strict=True)),
                    (end_ms, (index, name, "end", ""))]
        answering = question.answering[name]
        node = world.process(name, answering.incarnation)
        if answering.gone or node is None or node.core is None:
            answering.gone = True  # its connection went with it: no answer
            if what == "end":
                self._answered(world, question, name, None)
            return []
        if what == "read":
            state = world.storage.state_at(LogId.partition(partition), question.txn, world.now_ms)
            if state is not None:
                answering.states.append(state)
            return []
        assert what == "end", what
        machine = node.core.coordinator.machines.get(question.txn)
        # The runtime's coordinator remembers a transaction whose operations it runs (its context);
        # the outcomes it answered it remembers too, but the world leaves those out: it must not
        # need them, since a restart forgets them.
        executing = world.executing.get(question.txn) == (node.name, node.incarnation)
        known = status.node_knows(
            remembered=Known.ACTIVE if executing else Known.NOTHING,
            coordinating=machine is not None, decision=None if machine is None else machine.decision,
            participating=answering.runs_before or _participating(node, question.txn, answering.held),
        )
        ready = node.ready and (node.name, node.incarnation) not in world.parked
        self._answered(world, question, name, NodeAnswer(
            ready, answering.served, tuple(answering.states), known, world.requests_ms,
            # Every process of the world runs one configuration, in force before any transaction
            # began (at 1 ms, the earliest begin: 0 would mean "not told"). A runtime node cannot
            # know its predecessor's, and counts on less: UNKNOWN more often, never less safe.
            status.kept_window_ms(world.config), 1, name))
        return []

    def _answered(self, world: World, question: Question, name: str, answer: NodeAnswer | None) -> None:
        question.answers[name] = answer
        if len(question.answers) < len(world.nodes):
            return
        answered_ms = world.clock_ms(question.asker)  # its clock after the last answer
        try:
            question.verdict = status.verdict(
                [question.answers[n] for n in sorted(question.answers)], world.partitions,
                txn_ids.begin_ms_of(question.txn), question.asked_ms, answered_ms,
                config=world.config, requests_ms=world.requests_ms, coordinator=txn_ids.coordinator_of(question.txn))
        except AssertionError as error:  # the runtime's status call would crash here: a violation
            world.outcome.violations.append(f"status call on {question.txn}: {error}")
            return
        question.judged = True
        world.outcome.status_questions += 1
        world.outcome.status_not_known += question.verdict is None

    def violations(self, committed: set[str], aborted: set[str], read_only: set[str]) -> list[str]:
        """Every answer the transaction's end contradicts: "not known" or "aborted" of one that
        committed, "committed" of one that did not. A wholly read-only transaction is exempt from
        "not known": it logs nothing anywhere (paper 3.5), so nothing can tell of it once it is
        over, and running it again changes nothing."""
        found = []
        for question in self.questions:
            if not question.judged:
                continue
            txn, said = question.txn, question.verdict
            told = "not known" if said is None else f"{said.verdict.value} ({said.detail})"
            asked = f"status call at {question.at_ms} ms ({question.asker}'s clock {question.asked_ms})"
            forgotten = said is None and txn not in read_only
            if txn in committed and (forgotten or (said is not None and said.verdict is Verdict.ABORTED)):
                found.append(f"{asked} said {txn} is {told}; it committed")
            elif said is not None and said.verdict is Verdict.COMMITTED and txn not in committed:
                found.append(f"{asked} said {txn} committed; it "
                             f"{'aborted' if txn in aborted else 'never decided'}")
        return found


def held_partitions(node: Node) -> tuple[str, ...]:
    """The partitions `node` holds now (the runtime's `tuple(self.partitions)`; none of one
    between owners): its status answer asks their machines and executions, and reads the records
    of those recovered (the runtime's served ones)."""
    assert node.core is not None
    return tuple(p for p in node.partitions if p in node.core.partitions)


def memory_knows(world: World, node: Node, txn: str) -> Known:
    """What `node` tells of `txn` from its memory alone (the runtime's memory-only status answer,
    Admin._knows, which a resolve asks the coordinator's node before it writes)."""
    assert node.core is not None
    machine = node.core.coordinator.machines.get(txn)
    return status.node_knows(
        remembered=Known.ACTIVE if world.executing.get(txn) == (node.name, node.incarnation) else Known.NOTHING,
        coordinating=machine is not None, decision=None if machine is None else machine.decision,
        participating=_participating(node, txn, held_partitions(node)),
    )


def _participating(node: Node, txn: str, held: tuple[str, ...]) -> bool:
    """Admin._runs_here: whether a partition `node` holds runs `txn` now (a machine, or an
    execution), among those it held when its answer began."""
    assert node.core is not None
    return any(
        txn in node.core.partitions[p].machines or txn in node.tables[p].executions
        for p in held if p in node.core.partitions and p in node.tables
    )
