"""The execution phase of a simulated World (cornus.sim.world): the runtime's I/O around the core's
execution state (cornus.protocol.execution), as the owners of the partitions run a transaction's
requests: locks, reads through the owner's cache, slow reads, one-shots and their carried prepare,
and the answers the owners give."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeGuard

from cornus.protocol import status
from cornus.protocol.events import (
    CommitRequested,
    ExecuteFailed,
)
from cornus.protocol.execution import Execution, Refusal
from cornus.protocol.locks import Grant, LockMode, Waiter
from cornus.protocol.messages import Prepare
from cornus.protocol.node_core import ExecuteRefusal
from cornus.protocol.owner_answer import ExecuteStatus, refuses
from cornus.protocol.txn_ids import begin_ms_of
from cornus.sim import redo
from cornus.sim.process import Node
from cornus.sim.schedule import CLOCK_SLACK_MS, FAULTS_END_MS
from cornus.sim.steps import (
    STEP_COMMIT,
    STEP_EXECUTE_ANSWER,
    STEP_EXECUTE_DEADLINE,
    STEP_EXECUTE_PREPARED,
    STEP_EXECUTE_WRITES,
    STEP_IDLE,
    STEP_LOCK_EXPIRY,
    STEP_LOCK_GRANTED,
    STEP_READ_LANDED,
)

# How long a coordinator waits for the answer to a one-shot's request before it reports the
# partition's execution as failed without an answer (the runtime's peer request deadline).
TIMEOUT_MS_EXECUTE = 200

# How long an execution that never reached prepare keeps its locks before the owner drops it (the
# runtime's idle timeout).
EXECUTION_IDLE_MS = 600

# An owner's failed answers, as the world says them, and the status the runtime answers each with
# (Node.on_request, PartitionRuntime.execute), which the core's rule reads (owner_answer.refuses).
ALREADY_COMMITTING = "already committing"
ABORTED_HERE = "aborted here already"
ABORTED_WHILE_WAITING = "dropped while it waited"  # the coordinator aborted it while it waited
_STATUS_OF_ANSWER = {
    ALREADY_COMMITTING: ExecuteStatus.ABORTED,
    ABORTED_HERE: ExecuteStatus.ABORTED,
    ABORTED_WHILE_WAITING: ExecuteStatus.ABORTED,
    # Dropped while its storage read was out (an abort, an idle timeout): ABORTED in the runtime,
    # where the world took it for a refusal until the rule was shared (found by audit).
    "aborted while reading": ExecuteStatus.ABORTED,
    "not ready": ExecuteStatus.NOT_READY,
    "arrived past its deadline": ExecuteStatus.UNAVAILABLE,
    "waited past its deadline": ExecuteStatus.UNAVAILABLE,
    "conflict": ExecuteStatus.CONFLICT,
    "lock wait timed out": ExecuteStatus.CONFLICT,
    "aborted while waiting": ExecuteStatus.CONFLICT,  # its locks released under it: the runtime's CONFLICT
    "the partition was lost": ExecuteStatus.NOT_OWNER,
    "no node holds it": ExecuteStatus.NOT_OWNER,  # the coordinator's own answer (Coordination._start_prepared)
    "check failed": ExecuteStatus.CHECK_FAILED,
}



@dataclass(frozen=True, slots=True)
class CarriedRequest:
    """A one-shot's request to one partition: its write (the key, the version the caller expects
    there) or, on a partition it only reads, its read (`expected` None), and its prepare, from the
    coordinator's incarnation that sent it."""

    txn: str
    partition: str
    key: str
    expected: int | None
    participants: tuple[str, ...]
    incarnation: int
    # The partition's owner when sent, and its incarnation: a restart or a move loses the request.
    owner: str
    owner_incarnation: int


class ExecutionPhase:
    """World's methods for the execution phase; they share the World's state."""

    # -- the execution phase (the runtime's I/O around the core's execution state) ---------------
    def _execute_txn(self, txn: str) -> None:
        """An interactive transaction's first requests: on each partition, lock its key (shared,
        NO_WAIT) and read it through the owner's cache; its writes follow in `_execute_writes`, as
        continued requests, a moment later. Any refusal aborts before commit, as the runtime's
        coordinator does when an execute request fails."""
        plan = self.plans[txn]
        first = self.twins.get(plan.coordinator)
        twin = self._twin_of.get(plan.coordinator)
        if (plan.one_shot and first is not None and first.ready and twin is not None and twin.storage_only
                and self.now_ms < twin.cut_end_ms and txn not in self._one_shot_sent):
            # Over the client's old connection, to the first process, whose storage does not
            # answer; a proxy may deliver it to the second too.
            self._refused_for_load(txn)
            if self._begins_client_txn(first, txn):
                self._start_one_shot(txn, first)
            return
        if (plan.one_shot and first is not None and first.ready and twin is not None and twin.cut_ms
                and self.now_ms < twin.cut_start_ms and txn not in self._one_shot_sent):
            # Over the client's old connection, to the first process; sent again at its cut.
            self._to_resend.setdefault(plan.coordinator, []).append(txn)
            if self._begins_client_txn(first, txn):
                self._start_one_shot(txn, first)
            return
        if not self.nodes[plan.coordinator].ready:
            return
        if txn in self._one_shot_sent and not self._accepts_again(txn):
            return  # its client is refused, and asks the status call instead
        if plan.one_shot:
            if self._begins_client_txn(self.nodes[plan.coordinator], txn):
                self._start_one_shot(txn, self.nodes[plan.coordinator])
            self._delivered_to_deposed(txn)
            return
        coordinator = self.nodes[plan.coordinator]
        self.executing[txn] = (coordinator.name, coordinator.incarnation)
        reads: dict[tuple[str, str], int] = {}
        for partition, key_index in (*plan.writes, *plan.reads):
            node = self.owner_of(partition)
            key = f"k{key_index}"
            if not self._serves(node, partition, txn):
                self._abort_execution(txn)
                return
            execution = self._begin_execution(node, partition, txn)
            table = node.tables[partition]
            if execution is None or table.lock(txn, key, LockMode.SHARED, self.now_ms) is not Grant.GRANTED:
                self._abort_execution(txn)
                return
            reads[(partition, key)] = self._read_committed(node, partition, key, txn, execution)
        self.outcome.reads[txn] = reads
        if not plan.writes:
            self._executed(txn, [])
            return
        think_ms = self.schedule.think_ms + self.rng.randint(1, self.schedule.delay_ms_max)
        self._push(self.now_ms + think_ms, STEP_EXECUTE_WRITES, txn)

    def _execute_writes(self, txn: str) -> None:
        """The writes of an interactive transaction: on each written partition a continued request
        that takes the key exclusive and buffers the next version. A partition whose owner
        restarted since the read has lost the execution, and with it the read lock: it refuses."""
        plan = self.plans[txn]
        if self._executing_process(txn) is None:
            # The coordinator is gone, or restarted and forgot it (its caller's next call is
            # refused): its executions idle out.
            self.executing.pop(txn, None)
            return
        writes: list[tuple[str, bytes]] = []
        self.outcome.writes[txn] = {}
        for partition, key_index in plan.writes:
            node = self.owner_of(partition)
            key = f"k{key_index}"
            if not self._serves(node, partition, txn):
                self._abort_execution(txn)
                return
            table = node.tables[partition]
            execution = table.begin(txn, plan.coordinator, self.now_ms, continued=True)
            granted = isinstance(execution, Execution) and table.lock(txn, key, LockMode.EXCLUSIVE, self.now_ms)
            if granted is not Grant.GRANTED:
                self._abort_execution(txn)
                return
            value = self.outcome.reads[txn][(partition, key)] + 1
            self.outcome.writes[txn][(partition, key)] = value
            execution.writes[key] = value
            writes.append((partition, redo.encode({key: value})))
        self._executed(txn, writes)

    def _executing_process(self, txn: str) -> Node | None:
        """The process that runs `txn`'s operations, while it lives and serves: the one that began
        it (the first process of a Twin too, until it is deposed)."""
        holder = self.executing.get(txn)
        node = None if holder is None else self.process(*holder)
        if node is None or not node.ready or (node.name, node.incarnation) in self.parked:
            return None
        return node

    def _executed(self, txn: str, writes: list[tuple[str, bytes]]) -> None:
        plan = self.plans[txn]
        self.outcome.executed.add(txn)
        self._push(self.now_ms + 1, STEP_COMMIT, (txn, tuple(writes), tuple(p for p, _ in plan.reads)))

    def _abort_execution(self, txn: str) -> None:
        """The coordinator's abort of an execution that failed somewhere: every live owner drops it."""
        plan = self.plans[txn]
        self.executing.pop(txn, None)
        for partition, _ in (*plan.writes, *plan.reads):
            node = self.owner_of(partition)
            if self._serves(node, partition, txn, abort=True):
                self._wake(node, partition, node.tables[partition].abort(txn), txn)

    def _serves(self, node: Node | None, partition: str, txn: str, *, abort: bool = False) -> TypeGuard[Node]:
        """Whether `node` runs a request of `txn`'s execution phase on `partition` now: it holds
        it, and the core's admission rule (NodeCore.execute_refusal, the runtime's too) allows.
        None (nobody holds the partition): the runtime's coordinator refuses it ("no node holds")."""
        return (node is not None and node.alive and node.core is not None and partition in node.core.partitions
                and partition not in node.lapsed and node.core.execute_refusal(partition, txn, abort=abort) is None)

    def _begin_execution(self, node: Node, partition: str, txn: str) -> Execution[int] | None:
        """The core's execution of `txn` on `partition` (None if refused), with its idle timeout."""
        execution = node.tables[partition].begin(txn, self.plans[txn].coordinator, self.now_ms)
        if isinstance(execution, Refusal):
            return None
        self._push(self.now_ms + EXECUTION_IDLE_MS + 1, STEP_IDLE, (node.name, node.incarnation, partition, txn))
        return execution

    def _start_one_shot(self, txn: str, coordinator: Node) -> None:
        """The runtime's one-shot with the prepares carried by the requests: the caller names each
        write's value (the version after the one it expects, read now through the owner's cache, as
        the caller's own earlier read would be served), the coordinator's machine starts at once,
        and each partition's request travels like any message (late, lost, or to a node that is
        down)."""
        plan = self.plans[txn]
        sent = self._one_shot_sent.get(txn)
        if sent is None:
            versions = {p: self._caller_read(p, f"k{k}") for p, k in plan.writes}
            redos = [(p, redo.encode({f"k{k}": versions[p] + 1})) for p, k in plan.writes]
            # A partition only read votes too (paper 3.5), and its redo names the key it read.
            redos += [(p, redo.encode({}, (f"k{k}",))) for p, k in plan.reads]
            expected: dict[str, int | None] = {**versions, **dict.fromkeys((p for p, _ in plan.reads), None)}
            writes = tuple(sorted(redos))
            self._one_shot_sent[txn] = (writes, expected)
            self.outcome.reads[txn], self.outcome.writes[txn] = {}, {}
            self.outcome.executed_on[txn] = set()
        else:
            writes, expected = sent  # sent again by its client: the same id and operations
        self._feed(coordinator, CommitRequested(coordinator.name, txn, writes, (), prepare_sent=True), coordinator.path)
        participants = tuple(p for p, _ in writes)
        for partition, key_index in (*plan.writes, *plan.reads):
            owner = self.owner_of(partition)
            if owner is None:
                # Nobody holds it (a Move's gap): the runtime's coordinator refuses the request
                # before sending it, and the machine hears so after it started.
                self._unanswered.add((txn, partition, coordinator.incarnation))
                self._push(self.now_ms, STEP_EXECUTE_ANSWER,
                           (txn, partition, coordinator.incarnation, "no node holds it"))
                continue
            sent = CarriedRequest(txn, partition, f"k{key_index}", expected[partition], participants,
                            coordinator.incarnation, owner.name, owner.incarnation)
            self._unanswered.add((txn, partition, coordinator.incarnation))
            self._push(self.now_ms + TIMEOUT_MS_EXECUTE, STEP_EXECUTE_DEADLINE,
                       (txn, partition, coordinator.incarnation))
            if self.rng.random() < self.schedule.loss_probability and 0 <= self.now_ms < FAULTS_END_MS:
                continue  # lost on the way: its deadline tells the coordinator
            delay_ms = self.rng.randint(1, self.schedule.delay_ms_max)
            # Drawn only when late requests are on: every other schedule's run stays what it was.
            late_p = self.schedule.late_request_probability
            if late_p and (self.rng.random() < late_p or plan.late):
                delay_ms += self.schedule.late_request_ms
            self._push(self.now_ms + delay_ms, STEP_EXECUTE_PREPARED, sent)
            copy_p = self.schedule.late_copy_probability
            if copy_p and self.schedule.request_deadlines and self._sweep_rng.random() < copy_p:
                # A copy of it arrives after its transaction was swept (Schedule.late_copy_ms, from
                # the sweeps' generator): past its deadline, which its owner keeps to. (An owner
                # that keeps none runs it whenever it comes: the age counts on the world's longest
                # request there, World.requests_ms.)
                self._push(self.now_ms + self.schedule.late_copy_ms + delay_ms, STEP_EXECUTE_PREPARED, sent)

    def _execute_prepared(self, carried: CarriedRequest) -> None:
        """A one-shot's request reaches the partition's owner: take the lock, read the key (from the
        cache, or storage, whose answer may take long), and go on in `_read_done`."""
        txn, partition, key, expected = carried.txn, carried.partition, carried.key, carried.expected
        incarnation = carried.incarnation
        node = self.nodes[carried.owner]
        if not node.alive or node.incarnation != carried.owner_incarnation:
            # Sent over a connection to a process that is gone: lost with it. A node that dropped
            # the partition since refuses it below (it hosts it no more).
            self._answer_execute(txn, partition, incarnation, None)
            return
        if partition in node.lapsed:
            # The runtime asks the lease first and drops what ran out (Node.on_request).
            self._answer_execute(txn, partition, incarnation, "the partition was lost")
            return
        if not self._serves(node, partition, txn):
            committing = (node.core is not None and partition in node.core.partitions
                          and node.core.execute_refusal(partition, txn) is ExecuteRefusal.COMMITTING)
            self._answer_execute(txn, partition, incarnation, ALREADY_COMMITTING if committing else "not ready")
            return
        if status.request_expired(self._deadline_ms(txn), self.clock_ms(node.name), CLOCK_SLACK_MS):
            self._answer_execute(txn, partition, incarnation, "arrived past its deadline")  # as Node.on_request
            return
        table = node.tables[partition]
        execution = self._begin_execution(node, partition, txn)
        if execution is None:
            self._answer_execute(txn, partition, incarnation, ABORTED_HERE)
            return
        mode = LockMode.SHARED if expected is None else LockMode.EXCLUSIVE
        grant = table.lock(txn, key, mode, self.now_ms)
        if grant is Grant.WAITING:
            # Behind a holder that voted (its locks go at the decision), or older under WAIT_DIE.
            self._lock_waiters[(node.name, node.incarnation, partition, txn, key)] = (carried, execution)
            self.outcome.lock_waits += 1
            expiry_ms = self.now_ms + table.locks.timeout_ms_wait + 1
            self._push(expiry_ms, STEP_LOCK_EXPIRY, (node.name, node.incarnation, partition))
            return
        if grant is not Grant.GRANTED:
            self._wake(node, partition, table.abort(txn), txn)
            self._answer_execute(txn, partition, incarnation, "conflict")
            return
        self._locked(carried, execution)

    def _deadline_ms(self, txn: str) -> int:
        """The deadline its owner keeps a one-shot's request to (0: none, where the schedule
        carries none)."""
        if not self.schedule.request_deadlines:
            return 0
        begin_ms = begin_ms_of(txn)
        return status.request_deadline_ms(begin_ms + TIMEOUT_MS_EXECUTE, begin_ms, TIMEOUT_MS_EXECUTE)

    def _lock_granted(self, name: str, incarnation: int, partition: str, txn: str, key: str) -> None:
        parked = self._lock_waiters.pop((name, incarnation, partition, txn, key), None)
        if parked is None:
            return  # its node restarted, or the wait ended otherwise
        carried, execution = parked
        node = self.nodes[name]
        table = node.tables.get(partition)
        if not node.alive or node.incarnation != incarnation or table is None:
            self._answer_execute(txn, partition, carried.incarnation, None)
            return
        if not table.is_current(txn, execution):
            # Dropped while it waited: not resurrected, and what the grant gave it goes back.
            self._wake(node, partition, table.release(txn), txn)
            self._answer_execute(txn, partition, carried.incarnation, ABORTED_WHILE_WAITING)
            return
        self._locked(carried, execution)

    def _lock_expiry(self, name: str, incarnation: int, partition: str) -> None:
        node = self.nodes[name]
        table = node.tables.get(partition)
        if not node.alive or node.incarnation != incarnation or table is None:
            return
        expired, granted = table.locks.expire(self.now_ms)
        for waiter in expired:
            parked = self._lock_waiters.pop((name, incarnation, partition, waiter.txn, waiter.key), None)
            if parked is not None:
                self._wake(node, partition, table.abort(waiter.txn), waiter.txn)
                self._answer_execute(waiter.txn, partition, parked[0].incarnation, "lock wait timed out")
        self._wake(node, partition, granted)

    def _wake(self, node: Node, partition: str, granted: list[Waiter], released: str = "") -> None:
        """Resume the requests a release granted, after the step that released (as the runtime's
        woken futures run on a later tick); and refuse the requests of the transaction whose
        locks went (`released`), which its release took out of the queue."""
        for waiter in granted:
            self._push(self.now_ms, STEP_LOCK_GRANTED, (node.name, node.incarnation, partition, waiter.txn, waiter.key))
        if released:
            self._unpark(lambda k: k[:4] == (node.name, node.incarnation, partition, released), "aborted while waiting")

    def _unpark(self, matches: Callable[[tuple[str, int, str, str, str]], bool], refusal: str | None) -> None:
        for parked_key in [k for k in self._lock_waiters if matches(k)]:
            carried, _ = self._lock_waiters.pop(parked_key)
            self._answer_execute(carried.txn, carried.partition, carried.incarnation, refusal)

    def _locked(self, carried: CarriedRequest, execution: Execution[int]) -> None:
        """The request holds its lock: read the key (from the cache, or storage, whose answer may
        take long), and go on in `_read_done`."""
        txn, partition, key = carried.txn, carried.partition, carried.key
        node = self.nodes[carried.owner]
        table = node.tables[partition]
        hit, value = table.cached(key)
        if hit:
            assert value is not None
            self._read_done(carried, execution, value)
            return
        found = self.storage.data.get((partition, key), 0)
        # A slow read answers late (drawn only when slow reads are on, so every other schedule's
        # run stays what it was): meanwhile the execution may be dropped and another transaction
        # commit a newer value, which this answer then predates.
        slow = self.schedule.slow_read_probability
        if slow and self.now_ms < FAULTS_END_MS and self.rng.random() < slow:
            self._slow_reads_out[partition] += 1
            self._push(self.now_ms + self.schedule.slow_read_ms, STEP_READ_LANDED, (carried, execution, found))
            return
        table.read_landed(txn, execution, {key: found})
        self._read_done(carried, execution, found)

    def _read_landed(self, carried: CarriedRequest, execution: Execution[int], found: int) -> None:
        self._slow_reads_out[carried.partition] -= 1
        node = self.nodes[carried.owner]
        if not node.alive or node.incarnation != carried.owner_incarnation:
            self._answer_execute(carried.txn, carried.partition, carried.incarnation, None)
            return
        if carried.partition not in node.tables or carried.partition in node.lapsed:
            # Lost while the read was out (dropped, or its lease ended): the runtime's check after
            # the execution (Node.on_request) answers NOT_OWNER, a refusal (found by audit: the
            # world answered nothing, or, once lapses were modelled, ran on as the owner).
            self.outcome.reads_out_when_lost += 1
            self._answer_execute(carried.txn, carried.partition, carried.incarnation, "the partition was lost")
            return
        table = node.tables[carried.partition]
        table.read_landed(carried.txn, execution, {carried.key: found})
        if not table.is_current(carried.txn, execution):
            # Dropped while the read was out (an abort, an idle timeout): not resurrected.
            self._answer_execute(carried.txn, carried.partition, carried.incarnation, "aborted while reading")
            return
        self._read_done(carried, execution, found)

    def _read_done(self, carried: CarriedRequest, execution: Execution[int], value: int) -> None:
        """Check the version the request expects, record the write, and hand the machine its
        execution and prepare; a failed check drops it."""
        txn, partition, key, expected = carried.txn, carried.partition, carried.key, carried.expected
        incarnation = carried.incarnation
        plan = self.plans[txn]
        node = self.nodes[carried.owner]
        # A failed check, then a request that waited past its deadline (a lock, a slow read), is
        # refused before its prepare, in Node.on_request's order (the check is the execution's).
        refusal = ""
        if expected is not None and value != expected:
            refusal = "check failed"
        elif status.request_expired(self._deadline_ms(txn), self.clock_ms(node.name), CLOCK_SLACK_MS):
            refusal = "waited past its deadline"
        if refusal:
            self._wake(node, partition, node.tables[partition].abort(txn), txn)
            self._answer_execute(txn, partition, incarnation, refusal)
            return
        if expected is None:
            # Only read: it votes yes, keeping the read lock until the decision.
            self.outcome.reads[txn][(partition, key)] = value
            execution.reads[key] = None
        else:
            self.outcome.reads[txn][(partition, key)] = expected
            self.outcome.writes[txn][(partition, key)] = expected + 1
            execution.writes[key] = expected + 1
        executed_on = self.outcome.executed_on[txn]
        executed_on.add(partition)
        if len(executed_on) == len(plan.writes) + len(plan.reads):
            self.outcome.executed.add(txn)
        self._deliver(partition, plan.coordinator, Prepare(txn, carried.participants, plan.coordinator), node.path)
        if node.alive:
            self._answer_execute(txn, partition, incarnation, "")

    def _answer_execute(self, txn: str, partition: str, incarnation: int, refusal: str | None) -> None:
        """The owner's answer leaves for the coordinator ("" executed; a reason: refused; None:
        none, the process is gone). It may be lost, or reach the coordinator after the request's
        deadline, which has told it "no answer" by then (`_execute_deadline`)."""
        if refusal is None or (self.rng.random() < self.schedule.loss_probability and self.now_ms < FAULTS_END_MS):
            return
        delay = self.rng.randint(1, self.schedule.delay_ms_max)
        self._push(self.now_ms + delay, STEP_EXECUTE_ANSWER, (txn, partition, incarnation, refusal))

    def _execute_answered(self, txn: str, partition: str, incarnation: int, refusal: str) -> None:
        key = (txn, partition, incarnation)
        if key not in self._unanswered:
            return  # its deadline passed: the coordinator heard "no answer", and listens no more
        self._unanswered.discard(key)
        if refusal:
            coordinator = self.process(self.plans[txn].coordinator, incarnation)
            if coordinator is not None and self._cut_off(coordinator):
                self._unanswered.add(key)  # lost on the way: its deadline tells the coordinator
                return
            if coordinator is not None:
                failed = ExecuteFailed(coordinator.name, txn, partition,
                                       refused=refuses(_STATUS_OF_ANSWER[refusal]), detail=refusal)
                self._feed(coordinator, failed, coordinator.path)

    def _execute_deadline(self, txn: str, partition: str, incarnation: int) -> None:
        key = (txn, partition, incarnation)
        if key not in self._unanswered:
            return
        self._unanswered.discard(key)
        coordinator = self.process(self.plans[txn].coordinator, incarnation)
        if coordinator is not None:
            failed = ExecuteFailed(coordinator.name, txn, partition, refused=False, detail="no answer")
            self._feed(coordinator, failed, coordinator.path)

    def _read_committed(self, node: Node, partition: str, key: str, txn: str, execution: Execution[int]) -> int:
        """The committed value of a key `txn` holds locked: from the cache, or storage at once."""
        table = node.tables[partition]
        hit, value = table.cached(key)
        if hit:
            assert value is not None
            return value
        found = self.storage.data.get((partition, key), 0)
        table.read_landed(txn, execution, {key: found})
        return found

    def _caller_read(self, partition: str, key: str) -> int:
        """What a caller reading `key` before its one-shot is told: the owner's cached value, else
        storage's (also when nobody holds the partition now: the caller read it before)."""
        owner = self.owner_of(partition)
        hit, value = owner.tables[partition].cached(key) if owner is not None else (False, None)
        if hit:
            assert value is not None
            return value
        return self.storage.data.get((partition, key), 0)

    def _drop_idle(self, node: Node, partition: str, txn: str) -> None:
        assert node.core is not None
        table = node.tables.get(partition)
        if table is None:
            return  # moved away: its executions went with it
        execution = table.executions.get(txn)
        if execution is None:
            return
        if txn in table.idle(self.now_ms, EXECUTION_IDLE_MS):
            granted = table.idle_out(txn, txn in node.core.partitions[partition].machines)
            if granted is not None:
                self._wake(node, partition, granted, txn)
        else:
            # Touched since (a continued request): the runtime's periodic sweep looks again later.
            again_ms = execution.last_active_ms + EXECUTION_IDLE_MS + 1
            self._push(again_ms, STEP_IDLE, (node.name, node.incarnation, partition, txn))

