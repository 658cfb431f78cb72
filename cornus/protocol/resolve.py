"""Manual resolve of one transaction from storage (the admin API), as a pure machine: any node can
run it, it needs only storage, and it decides by the same rules as the protocol.

One round, never retried by itself:
1. Read the transaction's record in every candidate partition's log.
2. A decision found in any of them is the outcome, and nothing is written. (A record may be
   missing because garbage collection has begun: it deletes only after every participant holds
   the decision, so the records left say it. Writing into the emptied slots would put an ABORT
   beside a COMMIT.)
3. Only VOTE_YES found: no participant has acknowledged a decision, so nothing is collected yet.
   Cornus runs termination (`Termination`, the one owner of the decision rule) over every
   participant's log, right away. The VOTE_YES seen means that participant had not acknowledged
   a decision when the read was served, so garbage collection cannot delete anything until a
   grace period after that; the writes must land before it ends. They are issued only while the
   round's window is open (the least grace any node may run with minus one storage deadline and
   the slack, so one deadline, counted from the first read) and land within a deadline plus the
   slack. A round that cannot finish in its window, or whose storage does not answer, reports "in
   doubt" instead of retrying later, when that bound would no longer hold. 2PC and
   coordinator-log may be decided only by their coordinator, whose log is read instead; and read
   too when no partition's log holds a record (a coordinator-log participant keeps none before it
   learns the decision).

Before its first write, unless forced: a resolve is for a transaction whose coordinator is gone.
One its coordinator's node still runs (`refusal_while_running`) finishes there by itself, and
termination would abort it where nothing voted yet: legal, and a surprise to the client whose
healthy transaction it was (found by review). So the round asks that node first (`AskCoordinator`,
answered by `CoordinatorAnswered`; a node that does not answer is taken for gone, which is what a
resolve is for), and writes only if the window is still open when the answer comes: the question
takes time, a suspend of the asking machine included. A resolve that only reads a decision writes
nothing, and is never refused.

The driver's part, the same in the runtime and the simulator: it starts the window when it meets
the `StartTimer`, on a clock that counts a suspend, and sends a write only before the window ends,
with that end as the write's deadline (a write held up past it, by a suspend between this machine's
effect and its sending, could land after the records were collected).
"""

from __future__ import annotations

from dataclasses import dataclass

from cornus.protocol import txn_ids
from cornus.protocol.backoff import Backoff, JitterSource
from cornus.protocol.config import Protocol, ProtocolConfig, gc_grace_ms_min
from cornus.protocol.effects import Effect, LogOnce, ReadRecord, StartTimer, Timer
from cornus.protocol.events import Event, LogReturned, RecordRead, StorageUnreachable, TimerFired
from cornus.protocol.status import Known
from cornus.protocol.termination import Termination, decision_among
from storage_adapters.contract import LogId, LogKind, Record, RecordBody, TxnState

# The owner of a resolve's storage calls. '~' cannot appear in a partition or node id.
RESOLVE = "~resolve"


@dataclass(frozen=True, slots=True)
class AskCoordinator:
    """Ask the node of `coordinator` what it runs of `txn`, from its memory alone (it must not wait
    on its storage to answer); answered by CoordinatorAnswered within the peer request deadline,
    NOTHING if it does not answer."""

    txn: str
    coordinator: str


@dataclass(frozen=True, slots=True)
class CoordinatorAnswered:
    txn: str
    known: Known


def refusal_while_running(txn: str, coordinator: str, known: Known) -> str | None:
    """Why a resolve without force must not run, given what the transaction's coordinator's node
    says of it (`known`, as its status answer has it; NOTHING when it did not answer); None: run
    it. ACTIVE: its operations run there. IN_DOUBT: its commit runs there, or a partition of that
    node runs it, which finishes it by termination itself. A node that knows an outcome, or
    nothing (a new process, or none answered), leaves the transaction to the resolve."""
    what = {Known.ACTIVE: "its operations run there", Known.IN_DOUBT: "its commit or a participant runs there"}
    if known not in what:
        return None
    return (f"{txn} is running at its coordinator {coordinator} ({what[known]}), which finishes it by itself; "
            "resolve is for a transaction whose coordinator is gone. Wait for it, or resolve with force: "
            "termination runs anyway and aborts it where a participant has not voted yet")


class Resolver:
    def __init__(self, txn: str, partitions: tuple[str, ...], config: ProtocolConfig, jitter: JitterSource, *,
                 force: bool = False) -> None:
        assert partitions, "resolve needs the partitions to look in"
        self.txn = txn
        self.protocol = txn_ids.protocol_of(txn)
        self.partitions = partitions
        self.force = force
        self.outcome: TxnState | None = None
        self.detail = ""
        self.done = False
        self.refusal: str | None = None  # why it wrote nothing: its coordinator runs it (not forced)
        self.wrote = False  # whether this resolve logged anything (Cornus termination)
        self._backoff = Backoff(config.backoff_ms_min, config.backoff_ms_max, jitter)
        self._reads_waiting: set[ReadRecord] = set()
        self._found: list[Record] = []
        self._unreachable: list[str] = []
        self._termination: Termination | None = None
        self._asked: RecordBody | None = None  # the body termination will carry, while the question is out
        # Counted on the least grace any node may collect after (gc_grace_ms_min), not this
        # node's: the coordinator's configuration may differ during a rolling change (found by
        # audit: counted on a longer grace of its own, a resolve's ABORT could land in the slot of
        # a record the coordinator had collected, beside its COMMIT tombstone).
        # That least grace is two deadlines and the slack, so the window is one deadline.
        self._window_ms = gc_grace_ms_min(config.storage_deadline_ms, config.clock_slack_ms) - (
            config.storage_deadline_ms + config.clock_slack_ms)
        assert self._window_ms == config.storage_deadline_ms, "the least grace is no longer two deadlines and the slack"
        self._window_open = True

    @property
    def found_records(self) -> bool:
        """Whether any partition's log held a record of the transaction."""
        return any(record.log.kind is LogKind.PARTITION for record in self._found)

    @property
    def window_ms(self) -> int:
        """How long after its start the round may still send a write (the driver's part above)."""
        return self._window_ms

    def start(self) -> list[Effect]:
        if self.protocol is None:
            return self._finish(None, "the id names no protocol, so no rule can decide it")
        reads = [ReadRecord(RESOLVE, LogId.partition(p), self.txn) for p in self.partitions]
        self._reads_waiting = set(reads)
        return [StartTimer(Timer(RESOLVE, self.txn, "window"), self._window_ms), *reads]

    def handle(self, event: Event | CoordinatorAnswered) -> list[Effect | AskCoordinator]:
        assert not self.done, f"{type(event).__name__} after the resolve finished"
        if isinstance(event, TimerFired):
            assert event.timer.kind == "window", event.timer
            self._window_open = False
            return []
        if isinstance(event, CoordinatorAnswered):
            return self._on_answer(event)
        if isinstance(event, RecordRead):
            return self._on_read(event)
        assert isinstance(event, LogReturned) and self._termination is not None, type(event).__name__
        result = event.result
        assert isinstance(event.call, LogOnce) and not isinstance(result, TxnState)
        self._termination.on_result(event.call, result)
        if self._termination.outcome is not None:
            return self._finish(self._termination.outcome, "termination over the participants' logs")
        if not self._termination.waiting:
            return self._finish(None, "in doubt: storage did not answer for every participant; try again")
        return []

    def _on_answer(self, event: CoordinatorAnswered) -> list[Effect | AskCoordinator]:
        body = self._asked
        assert body is not None and event.txn == self.txn, f"an answer to no question of {self.txn}: {event}"
        self._asked = None
        refusal = refusal_while_running(self.txn, txn_ids.coordinator_of(self.txn), event.known)
        if refusal is not None:
            self.refusal = refusal
            return self._finish(None, refusal)
        if not self._window_open:
            return self._finish(None, "in doubt: the window to write closed while the coordinator was asked; try again")
        return self._terminate(body)

    def _terminate(self, body: RecordBody) -> list[Effect | AskCoordinator]:
        self.wrote = True
        logs = tuple(LogId.partition(p) for p in body.participants)
        timer = Timer(RESOLVE, self.txn, "termination")  # never started: one round only
        self._termination = Termination(RESOLVE, self.txn, logs, body, backoff=self._backoff, timer=timer)
        return list(self._termination.start())

    def _on_read(self, event: RecordRead) -> list[Effect | AskCoordinator]:
        self._reads_waiting.remove(event.call)
        if isinstance(event.result, StorageUnreachable):
            self._unreachable.append(event.call.log.key)
        elif event.result is not None:
            self._found.append(event.result)
        if self._reads_waiting:
            return []
        if self._unreachable:
            return self._finish(None, f"storage did not answer for {', '.join(sorted(self._unreachable))}")
        partition_records = [r for r in self._found if r.log.kind is LogKind.PARTITION]
        if event.call.log.kind is LogKind.COORDINATOR:
            # The blocking protocols' last word: their coordinator's log.
            stored = event.result if isinstance(event.result, Record) else None
            if stored is not None and stored.state in (TxnState.COMMIT, TxnState.ABORT):
                return self._finish(stored.state, f"the coordinator's log holds {stored.state.value}")
            if partition_records:
                return self._finish(None, "in doubt: participants voted, and only the coordinator can decide")
            if stored is None:
                return self._finish(None, "no record of this transaction in any partition's log or its "
                                          "coordinator's")
            return self._finish(None, "in doubt: its coordinator's log holds its redo record and no decision; "
                                      "only the coordinator can decide")
        decision = decision_among(r.state for r in partition_records)
        if decision is not None:
            return self._finish(decision, "a participant's record holds the decision")
        coordinator = txn_ids.coordinator_of(self.txn)
        if not partition_records and self.protocol is not Protocol.CORNUS and coordinator:
            # A coordinator-log participant keeps no record until it learns the decision, and a
            # 2PC one none before its vote, while the coordinator's log may hold one (found by
            # audit: reported "no record" for a COMMIT logged by a coordinator that crashed before
            # telling anyone).
            return self._read_coordinator_log(coordinator)
        if not partition_records:
            return self._finish(None, "no record of this transaction in any partition's log")
        # The participants and coordinator a termination's ABORTs carry; not the record's redo,
        # which is that partition's data (participant_cornus: found by audit, 2026-11-28).
        found = partition_records[0].body
        body = RecordBody(found.participants, found.coordinator)
        if self.protocol is Protocol.CORNUS:
            if not self._window_open:
                return self._finish(None, "in doubt: the reads took too long to write safely now; try again")
            if self.force:
                return self._terminate(body)
            self._asked = body
            return [AskCoordinator(self.txn, txn_ids.coordinator_of(self.txn))]
        if not body.coordinator:
            return self._finish(None, "in doubt: the records name no coordinator")
        return self._read_coordinator_log(body.coordinator)

    def _read_coordinator_log(self, coordinator: str) -> list[Effect | AskCoordinator]:
        read = ReadRecord(RESOLVE, LogId.coordinator(coordinator), self.txn)
        self._reads_waiting = {read}
        return [read]

    def _finish(self, outcome: TxnState | None, detail: str) -> list[Effect | AskCoordinator]:
        self.outcome, self.detail, self.done = outcome, detail, True
        return []

