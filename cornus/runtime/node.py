"""One Cornus node: it owns some partitions, can coordinate any transaction, and drives the pure
protocol machines (cornus.protocol) by executing their effects against real storage and peers.

Every effect maps to one action: Send -> transport, LogOnce/Log -> a storage task whose answer
comes back as LogReturned, StartTimer/CancelTimer -> the event loop, Reply -> the waiting caller,
ApplyRedo -> storage (awaited before a ReleaseLocks that follows it), DeleteRecord -> storage.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from cornus.protocol import redo_bundle
from cornus.protocol.config import Protocol
from cornus.protocol.coordinator_base import CoordPhase
from cornus.protocol.effects import (
    ApplyRedo,
    CancelTimer,
    DeleteRecord,
    Effect,
    Log,
    LogOnce,
    ReleaseLocks,
    Reply,
    Send,
    StartTimer,
)
from cornus.protocol.events import (
    CommitRequested,
    Event,
    Executed,
    LogReturned,
    MessageReceived,
    Recovered,
    StorageUnreachable,
    TimerFired,
)
from cornus.protocol.hosts import CoordinatorHost, PartitionHost
from cornus.protocol.locks import Policy
from cornus.protocol.messages import Decision, Prepare, Vote
from cornus.protocol.participant_base import Phase
from cornus.runtime import redo as redo_codec
from cornus.runtime import txn_ids
from cornus.runtime.config import NodeConfig
from cornus.runtime.failpoints import Failpoints
from cornus.runtime.keys import partition_of
from cornus.runtime.outcome import AbortReason, NodeOverloaded, Outcome, OutcomeStatus, TxnNotFound, TxnWrongState
from cornus.runtime.partition import PartitionRuntime
from cornus.runtime.timing import TimingLog, TxnTiming
from cornus.runtime.transport import PeerUnavailable, Transport
from cornus.runtime.wire import (
    ExecuteRequest,
    ExecuteResponse,
    ExecuteStatus,
    Op,
    OpKind,
    PeerRequest,
    PeerResponse,
    Routed,
    StatusRequest,
    StatusResponse,
)
from storage_adapters.contract import (
    DATA_BATCH_COUNT_MAX,
    REDO_BYTES_MAX,
    LogId,
    LogStore,
    Record,
    RecordBody,
    TxnState,
)
from storage_adapters.errors import InvariantViolation, StorageUnavailable, ValidationError

log = logging.getLogger("cornus.node")

# Outcomes remembered for the status call after a transaction left memory.
OUTCOME_REMEMBERED_COUNT_MAX = 100_000
# How often idle executions and transactions are looked for.
SWEEP_INTERVAL_MS = 200
# A commit waits at most this long for its outcome before it reports UNKNOWN. It covers the vote
# timeout, a termination round or two and a decision write.
TIMEOUT_MS_COMMIT = 10_000
# Recovery waits at most this long for the transactions it found to be resolved before the node
# reports ready anyway (they stay locked and keep resolving; 2PC ones may block on a coordinator).
TIMEOUT_MS_RECOVERY_RESOLVE = 5_000
DELETE_ATTEMPT_COUNT_MAX = 5
# How long the coordinator.after_reply failpoint lets the reply reach the caller before dying.
FAILPOINT_REPLY_FLUSH_S = 0.2


class TxnAborted(Exception):
    def __init__(self, outcome: Outcome) -> None:
        super().__init__(f"transaction {outcome.txn} aborted: {outcome.reason} {outcome.detail}")
        self.outcome = outcome


@dataclass(slots=True)
class CoordinatedTxn:
    txn: str
    protocol: Protocol
    timing: TxnTiming
    # partition -> its writes in order (empty dict: only read)
    touched: dict[str, dict[str, bytes | None]] = field(default_factory=dict)
    state: OutcomeStatus = OutcomeStatus.ACTIVE
    last_active_s: float = field(default_factory=time.monotonic)
    reply: asyncio.Future[TxnState] | None = None
    busy: int = 0  # operations in flight; an idle sweep must not abort under them


@dataclass(frozen=True, slots=True)
class TxnInfo:
    txn: str
    role: str  # "coordinator" or "participant"
    where: str  # node id (coordinator) or partition (participant)
    phase: str
    protocol: str
    partitions: tuple[str, ...]
    idle_ms: int


class Node:
    """Start with `await node.start()`; the node is ready once recovery has run."""

    def __init__(
        self,
        config: NodeConfig,
        store: LogStore,
        transport: Transport,
        failpoints: Failpoints | None = None,
        lock_policy: Policy = Policy.NO_WAIT,
    ) -> None:
        assert transport.node_id == config.node_id
        for node in config.peers:
            # Hosts are addressed by name; a node id that looked like a partition would be ambiguous.
            assert node not in config.partitions, f"node id {node} collides with a partition name"
        self.config = config
        self.node_id = config.node_id
        self.protocol = config.protocol
        self.store = store
        self.transport = transport
        self.failpoints = failpoints or Failpoints({})
        self.ready = False
        self.timings = TimingLog()
        self.counters: collections.Counter[str] = collections.Counter()
        jitter = random.Random(int.from_bytes(os.urandom(8), "big"))
        pc = config.protocol_config
        # Each transaction runs the protocol its id names (txn_ids): the hosts build the matching
        # machine per transaction, and self.protocol is only the default for callers naming none.
        self.coordinator = CoordinatorHost(self.node_id, self.protocol, pc, jitter, protocol_of=self.protocol_of)
        self.hosts: dict[str, PartitionHost] = {}
        self.partitions: dict[str, PartitionRuntime] = {}
        for partition in config.owned_partitions:
            self.hosts[partition] = PartitionHost(partition, self.protocol, pc, jitter, protocol_of=self.protocol_of)
            self.partitions[partition] = PartitionRuntime(
                partition, store, lock_policy, config.limits.timeout_ms_lock_wait, config.limits.op_count_max
            )
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._txns: dict[str, CoordinatedTxn] = {}
        self._outcomes: collections.OrderedDict[str, Outcome] = collections.OrderedDict()
        self._txn_counter = 0
        # (partition, txn) -> when its termination protocol began (perf_counter seconds).
        self._terminating: dict[tuple[str, str], float] = {}
        # Tells this life's transaction ids from a previous one's (the counter restarts at zero).
        self._incarnation = os.urandom(3).hex()
        self._sweeper: asyncio.Task[None] | None = None
        self._recovery: asyncio.Task[None] | None = None
        self._stopped = False
        # Called with (protocol, outcome) whenever a coordinated transaction ends: metrics hook in.
        self.outcome_observers: list[Callable[[str, Outcome], None]] = []

    # === lifecycle =================================================================================

    async def start(self, wait_ready: bool = True) -> None:
        await self.transport.start(self)
        self._sweeper = asyncio.create_task(self._sweep_forever(), name="cornus-sweeper")
        self._recovery = asyncio.create_task(self._recover(), name="cornus-recovery")
        # A recovery that fails must end the process loudly, not leave a node that is never ready.
        self._recovery.add_done_callback(self._task_done)
        if wait_ready:
            await self._recovery

    async def stop(self) -> None:
        self._stopped = True
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        tasks = [t for t in (self._sweeper, self._recovery, *self._tasks) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.transport.close()

    # === the protocol machines =====================================================================

    def protocol_of(self, txn: str) -> Protocol:
        """The protocol a transaction runs: the one its id names. Ids without a tag come from
        builds before the protocol was chosen per transaction, when every transaction ran the
        cluster's configured protocol; records of theirs may still wait for recovery."""
        return txn_ids.protocol_of(txn) or self.protocol

    def _host(self, name: str) -> CoordinatorHost | PartitionHost | None:
        return self.coordinator if name == self.node_id else self.hosts.get(name)

    def _feed(self, host_name: str, event: Event) -> None:
        if self._stopped:
            return
        host = self._host(host_name)
        assert host is not None, f"no host {host_name} on {self.node_id}"
        effects = host.handle(event)
        txn = _event_txn(event)
        if txn is not None and (host_name, txn) in self._terminating:
            machine = host.machines.get(txn)
            if machine is None or machine.phase is not Phase.VOTED:
                started = self._terminating.pop((host_name, txn))
                elapsed_ms = (time.perf_counter() - started) * 1000
                self.timings.terminations_ms.append(elapsed_ms)
                log.info("termination of %s on %s decided in %.2f ms", txn, host_name, elapsed_ms,
                         extra={"txn": txn})
        self._prune(host, event)
        decision_logged = isinstance(event, LogReturned) and event.call.state.is_decision
        if (
            host is self.coordinator
            and txn is not None
            and isinstance(event, MessageReceived | LogReturned)
            and not decision_logged
            and any(
                (isinstance(e, Log) and e.state.is_decision) or isinstance(e, Reply)
                or (isinstance(e, Send) and isinstance(e.message, Decision))
                for e in effects
            )
        ):
            # The outcome is settled by this event (the last vote, or the redo write that was all
            # coordinator-log still waited for): whatever follows is the commit phase.
            ctx = self._txns.get(txn)
            if ctx is not None and not ctx.timing.decided:
                ctx.timing.decided = time.perf_counter()  # the votes are in: prepare ends here
            self.failpoints.hit("coordinator.after_votes")
        self._execute(host_name, effects)

    def _prune(self, host: CoordinatorHost | PartitionHost, event: Event) -> None:
        """Forget finished machines: the hosts answer for unknown transactions correctly."""
        txn = _event_txn(event)
        if txn is None:
            return
        machine = host.machines.get(txn)
        if machine is None:
            return
        if isinstance(host, CoordinatorHost):
            if machine.phase is CoordPhase.DONE and machine.calls_in_flight == 0:  # type: ignore[union-attr]
                del host.machines[txn]
        else:
            self._prune_participant(host.partition, txn)

    def _prune_participant(self, partition: str, txn: str) -> None:
        """A participant machine goes only once its locks are released: until then its redo may
        still be on its way to storage, and a duplicate decision must meet the machine (which
        ignores it), not the unknown-transaction path, which would release the locks early and
        let a reader see the value from before the commit."""
        machine = self.hosts[partition].machines.get(txn)
        runtime = self.partitions[partition]
        if (
            machine is not None
            and machine.phase is Phase.DONE
            and machine.calls_in_flight == 0
            and txn not in runtime.executions
            and not runtime.locks.holds_any(txn)
        ):
            del self.hosts[partition].machines[txn]

    def _execute(self, host_name: str, effects: list[Effect]) -> None:
        deletes = [effect for effect in effects if isinstance(effect, DeleteRecord)]
        if deletes:
            self._spawn(self._delete_in_order(deletes))
            effects = [effect for effect in effects if not isinstance(effect, DeleteRecord)]
        for index, effect in enumerate(effects):
            if isinstance(effect, ApplyRedo) or (isinstance(effect, Reply) and self._armed("coordinator.after_reply")):
                # Everything after must wait for this one (locks are released only after the data
                # is in storage), so the rest of the list runs in a task.
                self._spawn(self._execute_from(host_name, effects[index:]))
                return
            self._execute_one(host_name, effect)

    async def _execute_from(self, host_name: str, effects: list[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, ApplyRedo):
                await self._apply(effect)
            elif isinstance(effect, Reply):
                self._execute_one(host_name, effect)
                if self._armed("coordinator.after_reply"):
                    await asyncio.sleep(FAILPOINT_REPLY_FLUSH_S)  # let the reply reach the caller
                    self.failpoints.hit("coordinator.after_reply")
            else:
                self._execute_one(host_name, effect)

    def _armed(self, name: str) -> bool:
        return self.failpoints.armed(name)

    def _execute_one(self, host_name: str, effect: Effect) -> None:
        if isinstance(effect, Send):
            self._send(host_name, effect)
        elif isinstance(effect, LogOnce | Log):
            if host_name in self.hosts and effect.log != LogId.partition(host_name):
                # A participant writing another partition's log is running termination.
                self._terminating.setdefault((host_name, effect.txn), time.perf_counter())
            if isinstance(effect.log, LogId) and effect.state is TxnState.VOTE_YES and host_name in self.hosts:
                self.failpoints.hit("participant.before_log_vote")
            self._spawn(self._log_call(host_name, effect))
        elif isinstance(effect, StartTimer):
            old = self._timers.pop(effect.name, None)
            if old is not None:
                old.cancel()
            loop = asyncio.get_running_loop()
            self._timers[effect.name] = loop.call_later(
                effect.duration_ms / 1000, self._timer_fired, host_name, effect.name
            )
        elif isinstance(effect, CancelTimer):
            handle = self._timers.pop(effect.name, None)
            if handle is not None:
                handle.cancel()
        elif isinstance(effect, Reply):
            self._on_reply(effect)
        elif isinstance(effect, ReleaseLocks):
            self.partitions[effect.partition].release(effect.txn)
            self._prune_participant(effect.partition, effect.txn)
        else:
            raise AssertionError(f"unexpected effect {effect!r} here")

    def _send(self, host_name: str, effect: Send) -> None:
        message = effect.message
        if host_name in self.hosts and isinstance(message, Vote) and message.yes:
            # A yes vote is durable: its locks go at the decision, so conflicting requests wait.
            self.partitions[host_name].locks.mark_prepared(message.txn)
        to_node = self.config.owner_of(effect.to) if effect.to in self.config.partitions else effect.to
        self.transport.send(to_node, Routed(host_name, effect.to, message))

    def _timer_fired(self, host_name: str, name: str) -> None:
        self._timers.pop(name, None)
        self._feed(host_name, TimerFired(name))

    async def _log_call(self, host_name: str, call: LogOnce | Log) -> None:
        try:
            if isinstance(call, LogOnce):
                result: object = await self.store.log_once(call.log, call.txn, call.state, call.body)
            else:
                result = await self.store.log(call.log, call.txn, call.state, call.body)
        except StorageUnavailable as error:
            self.counters["storage_unavailable"] += 1
            result = StorageUnreachable(str(error))
        except InvariantViolation as error:
            _fatal(f"storage refused {call!r}: {error}")
        if (
            host_name in self.hosts
            and call.log == LogId.partition(host_name)
            and call.state is TxnState.VOTE_YES
            and not isinstance(result, StorageUnreachable)
        ):
            self.failpoints.hit("participant.after_log_vote")
        if host_name == self.node_id and isinstance(call, Log) and call.state.is_decision:
            self.failpoints.hit("coordinator.after_decision_log")
        self._feed(host_name, LogReturned(call, result))  # type: ignore[arg-type]

    async def _apply(self, effect: ApplyRedo) -> None:
        self.failpoints.hit("participant.before_apply")
        partition = self.partitions[effect.partition]
        await partition.apply(effect.txn, effect.redo, self.config.protocol_config.backoff_ms_min)
        self.failpoints.hit("participant.after_apply")

    async def _delete_in_order(self, deletes: list[DeleteRecord]) -> None:
        """Garbage collection, in the order the machine gave (see DeleteRecord). A record that
        cannot be deleted stops the rest: leaving later ones behind is safe, skipping ahead not."""
        for effect in deletes:
            for attempt in range(DELETE_ATTEMPT_COUNT_MAX):
                try:
                    await self.store.delete(effect.log, effect.txn)
                    break
                except StorageUnavailable:
                    await asyncio.sleep(self.config.protocol_config.backoff_ms_max / 1000 * (attempt + 1))
            else:
                # Decided records left behind are harmless garbage: recovery skips them.
                log.warning("gave up deleting %s of %s", effect.log.key, effect.txn, extra={"txn": effect.txn})
                return

    def _spawn(self, coroutine: object) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            _fatal(f"runtime task failed: {task.exception()!r}")

    # === inbound traffic ===========================================================================

    def on_message(self, sender: str, message: Routed) -> None:
        assert isinstance(message, Routed), f"expected a Routed message, got {type(message).__name__}"
        host = self._host(message.dest)
        if host is None:
            self.counters["misrouted_messages"] += 1
            return
        inner = message.message
        if not self.ready and inner.txn not in host.machines:
            # Before recovery has rebuilt every unfinished transaction, "I do not know it" is not
            # an answer we may give: a coordinator would presume ABORT for a logged COMMIT, and a
            # participant would ack a decision whose record recovery has not yet seen. The sender
            # repeats (decisions are resent, queries re-asked) once we are ready.
            self.counters["messages_dropped_recovering"] += 1
            return
        if isinstance(host, PartitionHost) and isinstance(inner, Prepare) and inner.txn not in host.machines:
            partition = self.partitions[message.dest]
            redo = partition.take_redo(inner.txn)
            if redo is not None:
                # The execution phase ends here: the machine learns its redo and votes.
                self._feed(message.dest, Executed(inner.txn, message.dest, inner.coordinator, redo, True))
        elif isinstance(host, PartitionHost) and isinstance(inner, Decision) and inner.txn not in host.machines:
            # Decided without us ever preparing (an abort before prepare): drop execution state.
            self.partitions[message.dest].drop(inner.txn)
        self._feed(message.dest, MessageReceived(message.source, inner))

    async def on_request(self, sender: str, request: PeerRequest) -> PeerResponse:
        if isinstance(request, StatusRequest):
            return await self._status_response(request)
        assert isinstance(request, ExecuteRequest)
        partition = self.partitions.get(request.partition)
        if partition is None:
            return ExecuteResponse(ExecuteStatus.NOT_OWNER, detail=f"{self.node_id} does not own {request.partition}")
        if not self.ready and not request.abort:
            return ExecuteResponse(ExecuteStatus.NOT_READY, detail=f"{self.node_id} is recovering")
        if request.txn in self.hosts[request.partition].machines and not request.abort:
            return ExecuteResponse(ExecuteStatus.ABORTED, detail=f"{request.txn} is already committing")
        return await partition.execute(request)

    async def _status_response(self, request: StatusRequest) -> StatusResponse:
        states: list[tuple[str, TxnState]] = []
        if request.txn:
            for partition in self.partitions:
                record = await self.store.read(LogId.partition(partition), request.txn)
                if record is not None:
                    states.append((partition, record.state))
        known = self.status(request.txn) if request.txn else None
        return StatusResponse(
            node=self.node_id,
            ready=self.ready,
            partitions=tuple(self.partitions),
            txn_states=tuple(states),
            in_doubt_count=self.in_doubt_count(),
            txn_outcome="" if known is None else known.status.value,
        )

    def in_doubt_count(self) -> int:
        """Transactions this node's partitions voted yes on and have no decision for yet."""
        return sum(
            1
            for host in self.hosts.values()
            for machine in host.machines.values()
            if machine.phase is Phase.VOTED
        )

    # === recovery ==================================================================================

    async def _recover(self) -> None:
        # Calls a previous life of this node made may still land until their deadline passes;
        # scanning before then could miss a VOTE_YES that is about to appear.
        await asyncio.sleep(self.config.storage.timeout_ms_call / 1000)
        recovered: list[tuple[str, str]] = []
        for partition in self.partitions:
            for record in await self._scan_all(LogId.partition(partition)):
                self.partitions[partition].retake_locks(record.txn, record.body.redo, record.state is TxnState.VOTE_YES)
                recovered.append((partition, record.txn))
                self._feed(partition, Recovered(record))
        # Any protocol may have run here (it is chosen per transaction), so both coordinator-side
        # recoveries always run; under Cornus alone the coordinator logs are empty and cost a scan.
        recovered += await self._recover_unlogged_votes(set(recovered))
        for record in await self._scan_all(LogId.coordinator(self.node_id)):
            self._feed(self.node_id, Recovered(record))
        deadline = time.monotonic() + TIMEOUT_MS_RECOVERY_RESOLVE / 1000
        # Polling (only at startup, for a few seconds at most): machines finish inside the pure
        # hosts, which have no hook to signal an event.
        while time.monotonic() < deadline and any(txn in self.hosts[p].machines for p, txn in recovered):  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        unresolved = sum(txn in self.hosts[p].machines for p, txn in recovered)
        log.info("%s recovered %d transactions, %d still unresolved", self.node_id, len(recovered), unresolved)
        self.counters["recovered"] += len(recovered)
        self.ready = True

    async def _recover_unlogged_votes(self, known: set[tuple[str, str]]) -> list[tuple[str, str]]:
        """Coordinator-log participants vote without logging, so a restart forgets which
        transactions they voted yes on, and with it those transactions' locks: another transaction
        could then overwrite a key that a COMMIT still on its way will write (a lost update). The
        votes are recoverable from the coordinators' logs, which hold every participant's redo:
        relock each redo for an owned partition that is not finished there, and wait for its
        decision like a 2PC participant that logged its vote."""
        found: list[tuple[str, str]] = []
        for coordinator in self.config.peers:
            for record in await self._scan_all(LogId.coordinator(coordinator)):
                if self.protocol_of(record.txn) is not Protocol.COORDINATOR_LOG:
                    continue  # a 2PC decision: its participants logged their votes themselves
                bundle = redo_bundle.decode(record.body.redo)
                for partition, redo in bundle.items():
                    if partition not in self.partitions or (partition, record.txn) in known:
                        continue
                    own = await self._read_retrying(LogId.partition(partition), record.txn)
                    if own is not None and own.state.is_decision:
                        # Decided here already: an unapplied COMMIT came back through the scan of
                        # this partition's own log; an applied one or an ABORT needs nothing.
                        continue
                    vote = Record(LogId.partition(partition), record.txn, TxnState.VOTE_YES,
                                  RecordBody(record.body.participants, record.body.coordinator, redo))
                    self.partitions[partition].retake_locks(record.txn, redo, prepared=True)
                    found.append((partition, record.txn))
                    self._feed(partition, Recovered(vote))
        return found

    async def _read_retrying(self, log_id: LogId, txn: str) -> Record | None:
        delay_ms = self.config.protocol_config.backoff_ms_min
        while True:
            try:
                return await self.store.read(log_id, txn)
            except StorageUnavailable:
                # Like the scans: recovery cannot be skipped, and the node is not ready meanwhile.
                await asyncio.sleep(delay_ms / 1000)
                delay_ms = min(delay_ms * 2, self.config.protocol_config.backoff_ms_max)

    async def _scan_all(self, log_id: LogId) -> list[Record]:
        page_max = self.config.limits.recovery_page_count_max
        seen: dict[str, Record] = {}
        delay_ms = self.config.protocol_config.backoff_ms_min
        while True:
            try:
                page = await self.store.scan_unfinished(log_id, page_max)
            except StorageUnavailable as error:
                # Recovery cannot be skipped: a node that is not ready serves nothing, so retry.
                log.warning("recovery scan of %s: %s; retrying", log_id.key, error)
                await asyncio.sleep(delay_ms / 1000)
                delay_ms = min(delay_ms * 2, self.config.protocol_config.backoff_ms_max)
                continue
            fresh = [record for record in page if record.txn not in seen]
            seen.update((record.txn, record) for record in fresh)
            # A full page may hide more behind records that stay unfinished; a page with nothing
            # new means every unfinished record is already in hand.
            if len(page) < page_max or not fresh:
                return list(seen.values())

    # === coordinating transactions =================================================================

    def new_txn_id(self, protocol: Protocol) -> str:
        self._txn_counter += 1
        return txn_ids.new_txn_id(int(time.time() * 1000), self.node_id, self._incarnation, self._txn_counter, protocol)

    def begin(self, protocol: Protocol | None = None) -> str:
        if not self.ready:
            raise NodeOverloaded(f"{self.node_id} is still recovering")
        if len(self._txns) >= self.config.limits.txn_count_max:
            raise NodeOverloaded(f"{len(self._txns)} transactions in flight on {self.node_id}")
        protocol = protocol or self.protocol
        if not isinstance(protocol, Protocol):
            raise ValidationError(f"protocol must be one of {', '.join(p.value for p in Protocol)}, got {protocol!r}")
        txn = self.new_txn_id(protocol)
        self._txns[txn] = CoordinatedTxn(txn, protocol, TxnTiming(protocol.value))
        return txn

    def _active(self, txn: str) -> CoordinatedTxn:
        ctx = self._txns.get(txn)
        if ctx is None:
            if txn in self._outcomes:
                raise TxnWrongState(f"transaction {txn} already ended: {self._outcomes[txn].status}")
            raise TxnNotFound(f"no transaction {txn} on {self.node_id}")
        if ctx.state is not OutcomeStatus.ACTIVE:
            raise TxnWrongState(f"transaction {txn} is {ctx.state}, not active")
        return ctx

    async def run_ops(self, txn: str, ops: Sequence[Op]) -> list[bytes | None]:
        """Run operations of an interactive transaction; the values of its GETs, in order. Raises
        TxnAborted (the transaction is then over) or ValidationError (nothing happened)."""
        ctx = self._active(txn)
        by_partition: dict[str, list[Op]] = {}
        positions: list[tuple[str, int]] = []
        for op in ops:
            if not isinstance(op, Op) or not isinstance(op.kind, OpKind):
                raise ValidationError(f"not an operation: {op!r}")
            partition = partition_of(op.key, self.config.partition_count)
            group = by_partition.setdefault(partition, [])
            if op.kind is OpKind.GET:
                positions.append((partition, sum(o.kind is OpKind.GET for o in group)))
            group.append(op)
        for partition, group in by_partition.items():
            projected = dict(ctx.touched.get(partition, {}))
            projected.update((op.key, op.value) for op in group if op.kind in (OpKind.PUT, OpKind.DELETE))
            size = len(redo_codec.encode(projected))
            if size > REDO_BYTES_MAX or len(projected) > DATA_BATCH_COUNT_MAX:
                # Refused now, with nothing changed: at prepare it would only abort, and a retry
                # would fail the same way.
                raise ValidationError(
                    f"the writes of this transaction to partition {partition} would take {size} bytes and "
                    f"{len(projected)} keys; the limits are {REDO_BYTES_MAX} bytes and {DATA_BATCH_COUNT_MAX} keys"
                )
        ctx.busy += 1
        try:
            responses = await asyncio.gather(
                *(self._execute_on(ctx, partition, tuple(group)) for partition, group in by_partition.items())
            )
        finally:
            ctx.busy -= 1
            ctx.last_active_s = time.monotonic()
        values = dict(zip(by_partition, responses, strict=True))
        failed = [(p, r) for p, r in values.items() if r.status is not ExecuteStatus.OK]
        if failed:
            partition, response = failed[0]
            if response.status is ExecuteStatus.INVALID and len(failed) == len(values):
                raise ValidationError(response.detail)
            raise TxnAborted(await self._abort_for(ctx, response))
        for partition, group in by_partition.items():
            writes = ctx.touched.setdefault(partition, {})
            for op in group:
                if op.kind is OpKind.PUT or op.kind is OpKind.DELETE:
                    writes[op.key] = op.value
        return [values[partition].values[index] for partition, index in positions]

    async def _execute_on(self, ctx: CoordinatedTxn, partition: str, ops: tuple[Op, ...]) -> ExecuteResponse:
        continued = partition in ctx.touched
        ctx.touched.setdefault(partition, {})
        return await self._request_partition(ExecuteRequest(ctx.txn, partition, self.node_id, ops, continued=continued))

    async def _request_partition(self, request: ExecuteRequest) -> ExecuteResponse:
        try:
            response = await self.transport.request(
                self.config.owner_of(request.partition), request, self.config.limits.timeout_ms_peer_request
            )
        except PeerUnavailable as error:
            return ExecuteResponse(ExecuteStatus.UNAVAILABLE, detail=f"owner of {request.partition}: {error}")
        assert isinstance(response, ExecuteResponse)
        return response

    async def _abort_for(self, ctx: CoordinatedTxn, response: ExecuteResponse) -> Outcome:
        reason = {
            ExecuteStatus.CONFLICT: AbortReason.CONFLICT,
            ExecuteStatus.CHECK_FAILED: AbortReason.CHECK_FAILED,
            ExecuteStatus.NOT_READY: AbortReason.NOT_READY,
            ExecuteStatus.UNAVAILABLE: AbortReason.PEER_UNAVAILABLE,
            ExecuteStatus.NOT_OWNER: AbortReason.PEER_UNAVAILABLE,
            ExecuteStatus.INVALID: AbortReason.CHECK_FAILED,
        }.get(response.status, AbortReason.VOTED_NO)
        if response.status is ExecuteStatus.INVALID:
            reason = AbortReason.CLIENT
        return await self._abort(ctx, reason, response.detail)

    async def _abort(self, ctx: CoordinatedTxn, reason: AbortReason, detail: str) -> Outcome:
        """Abort before commit: no participant voted, so telling them to drop state is enough."""
        ctx.state = OutcomeStatus.ABORTED
        await asyncio.gather(
            *(self._drop_on(ctx.txn, partition) for partition in ctx.touched), return_exceptions=True
        )
        outcome = Outcome(ctx.txn, OutcomeStatus.ABORTED, reason, detail)
        self._finish(ctx, outcome)
        return outcome

    async def _drop_on(self, txn: str, partition: str) -> None:
        # Best effort: a participant that misses it times out its idle execution by itself.
        await self._request_partition(ExecuteRequest(txn, partition, self.node_id, (), abort=True))

    async def abort(self, txn: str) -> Outcome:
        return await self._abort(self._active(txn), AbortReason.CLIENT, "aborted by the caller")

    async def commit(self, txn: str) -> Outcome:
        ctx = self._active(txn)
        if ctx.busy:
            raise TxnWrongState(f"transaction {txn} still has operations running")
        ctx.state = OutcomeStatus.UNKNOWN  # until the machine replies
        ctx.timing.commit_requested = time.perf_counter()
        writes = tuple((p, redo_codec.encode(w)) for p, w in sorted(ctx.touched.items()) if w)
        reads = tuple(sorted(p for p, w in ctx.touched.items() if not w))
        ctx.timing.participant_count = len(writes)
        if reads:
            # Partitions only read take no part in the vote, but their read locks must have held
            # until now: a partition that restarted or idled the execution out has lost them, and
            # what was read there may since have changed. Each confirms and releases (before
            # anyone votes, so a refusal only needs the abort below); and before the reply, so the
            # caller's next request never meets its own finished transaction's locks.
            ended = await asyncio.gather(
                *(self._request_partition(ExecuteRequest(txn, p, self.node_id, (), end_read_only=True))
                  for p in reads)
            )
            refused = [response for response in ended if response.status is not ExecuteStatus.OK]
            if refused:
                return await self._abort_for(ctx, refused[0])
        ctx.reply = asyncio.get_running_loop().create_future()
        self.failpoints.hit("coordinator.before_prepare")
        # No read-only partitions for the machine: they were released above.
        self._feed(self.node_id, CommitRequested(txn, writes, ()))
        if writes:
            self.failpoints.hit("coordinator.after_prepare")
        try:
            async with asyncio.timeout(TIMEOUT_MS_COMMIT / 1000):
                decision = await ctx.reply
        except TimeoutError:
            outcome = Outcome(txn, OutcomeStatus.UNKNOWN, detail="no outcome within the commit deadline; ask status")
            self._finish(ctx, outcome, remember=False)
            return outcome
        status = OutcomeStatus.COMMITTED if decision is TxnState.COMMIT else OutcomeStatus.ABORTED
        reason = None if decision is TxnState.COMMIT else AbortReason.VOTED_NO
        outcome = Outcome(txn, status, reason)
        return self._finish(ctx, outcome)

    def _on_reply(self, effect: Reply) -> None:
        ctx = self._txns.get(effect.txn)
        if ctx is None or ctx.reply is None or ctx.reply.done():
            return  # the caller gave up (deadline); the status call still gives the outcome
        if not ctx.timing.decided:
            ctx.timing.decided = time.perf_counter()
        ctx.reply.set_result(effect.outcome)

    def _finish(self, ctx: CoordinatedTxn, outcome: Outcome, remember: bool = True) -> Outcome:
        ctx.state = outcome.status
        ctx.timing.replied = time.perf_counter()
        if ctx.timing.commit_requested:
            phases = self.timings.record(ctx.timing)
            outcome = Outcome(outcome.txn, outcome.status, outcome.reason, outcome.detail, outcome.reads, phases)
        self._txns.pop(ctx.txn, None)
        if remember:
            self._outcomes[ctx.txn] = outcome
            while len(self._outcomes) > OUTCOME_REMEMBERED_COUNT_MAX:
                self._outcomes.popitem(last=False)
        self.counters[f"outcome_{outcome.status}"] += 1
        if outcome.reason is not None:
            self.counters[f"abort_{outcome.reason}"] += 1
        for observer in self.outcome_observers:
            observer(ctx.protocol.value, outcome)
        return outcome

    async def execute(self, ops: Sequence[Op], protocol: Protocol | None = None) -> Outcome:
        """A one-shot transaction: one execute request per partition, then commit."""
        txn = self.begin(protocol)
        try:
            values = await self.run_ops(txn, ops)
        except TxnAborted as aborted:
            return aborted.outcome
        except ValidationError:
            await self._abort(self._txns[txn], AbortReason.CLIENT, "invalid request")
            raise
        outcome = await self.commit(txn)
        gets = [op.key for op in ops if op.kind is OpKind.GET]
        reads = tuple(zip(gets, values, strict=True)) if outcome.status is OutcomeStatus.COMMITTED else ()
        return Outcome(outcome.txn, outcome.status, outcome.reason, outcome.detail, reads, outcome.timing_ms)

    def status(self, txn: str) -> Outcome | None:
        """What this node knows of a transaction it coordinated (None: nothing)."""
        ctx = self._txns.get(txn)
        if ctx is not None:
            return Outcome(txn, OutcomeStatus.ACTIVE if ctx.state is OutcomeStatus.ACTIVE else OutcomeStatus.UNKNOWN)
        machine = self.coordinator.machines.get(txn)
        if machine is not None and machine.decision is not None:
            committed = machine.decision is TxnState.COMMIT
            return Outcome(txn, OutcomeStatus.COMMITTED if committed else OutcomeStatus.ABORTED,
                           None if committed else AbortReason.VOTED_NO)
        return self._outcomes.get(txn)

    async def resolve_status(self, txn: str) -> Outcome | None:
        """The true outcome of any transaction the cluster still knows: its coordinator's memory,
        else the participants' records (any COMMIT or ABORT is the outcome; only VOTE_YES means
        in doubt). None if no node knows it (never seen, or finished and forgotten)."""
        known = self.status(txn)
        if known is not None:
            return known
        responses = await asyncio.gather(
            *(self.transport.request(node, StatusRequest(txn), self.config.limits.timeout_ms_peer_request)
              for node in self.config.peers),
            return_exceptions=True,
        )
        outcomes = {r.txn_outcome for r in responses if isinstance(r, StatusResponse) and r.txn_outcome}
        states = {state for r in responses if isinstance(r, StatusResponse) for _, state in r.txn_states}
        for status in (OutcomeStatus.COMMITTED, OutcomeStatus.ABORTED, OutcomeStatus.ACTIVE):
            if status.value in outcomes:
                return Outcome(txn, status, AbortReason.VOTED_NO if status is OutcomeStatus.ABORTED else None)
        if TxnState.COMMIT in states:
            return Outcome(txn, OutcomeStatus.COMMITTED)
        if TxnState.ABORT in states:
            return Outcome(txn, OutcomeStatus.ABORTED, AbortReason.VOTED_NO)
        if states or outcomes:
            return Outcome(txn, OutcomeStatus.UNKNOWN, detail="in doubt: participants voted, no decision yet")
        if any(not isinstance(r, StatusResponse) for r in responses):
            return Outcome(txn, OutcomeStatus.UNKNOWN, detail="some nodes did not answer")
        return None

    def transactions(self) -> list[TxnInfo]:
        """What is in flight here: transactions this node coordinates, and the participant side
        of every owned partition (phase "voted" is in doubt: voted yes, no decision known)."""
        now = time.monotonic()
        infos = [
            TxnInfo(ctx.txn, "coordinator", self.node_id, ctx.state.value, ctx.protocol.value,
                    tuple(sorted(ctx.touched)), round((now - ctx.last_active_s) * 1000))
            for ctx in self._txns.values()
        ]
        for txn, machine in self.coordinator.machines.items():
            if txn not in self._txns:
                infos.append(TxnInfo(txn, "coordinator", self.node_id, machine.phase.value, self.protocol_of(txn).value,
                                     tuple(machine.participants), 0))
        for partition, host in self.hosts.items():
            runtime = self.partitions[partition]
            for txn in runtime.executions:
                if txn not in host.machines:
                    idle_ms = round((now - (runtime.idle_since(txn) or now)) * 1000)
                    infos.append(TxnInfo(txn, "participant", partition, "executing", self.protocol_of(txn).value, (),
                                         idle_ms))
            for txn, machine in host.machines.items():
                infos.append(TxnInfo(txn, "participant", partition, machine.phase.value, self.protocol_of(txn).value,
                                     tuple(machine.participants), 0))
        return infos

    async def resolve(self, txn: str) -> Outcome:
        """Finish a transaction by hand from any node, reading storage directly (every node can).
        Cornus: the termination protocol, LogOnce(ABORT) on every participant's log. 2PC and
        coordinator-log: only the coordinator's log may decide, so this reports what it holds."""
        records = await asyncio.gather(
            *(self.store.read(LogId.partition(p), txn) for p in self.config.partitions)
        )
        found = [record for record in records if record is not None]
        if not found:
            known = await self.resolve_status(txn)
            return known or Outcome(txn, OutcomeStatus.UNKNOWN, detail="no record of this transaction anywhere")
        participants = next((r.body.participants for r in found if r.body.participants), ())
        coordinator = next((r.body.coordinator for r in found if r.body.coordinator), "")
        protocol = self.protocol_of(txn)
        if protocol is not Protocol.CORNUS:
            decision = await self.store.read(LogId.coordinator(coordinator), txn) if coordinator else None
            states = {r.state for r in found} | ({decision.state} if decision else set())
        else:
            body = found[0].body
            results = await asyncio.gather(
                *(self.store.log_once(LogId.partition(p), txn, TxnState.ABORT, body) for p in participants)
            )
            states = {result.state for result in results}
        if TxnState.ABORT in states:
            return Outcome(txn, OutcomeStatus.ABORTED, AbortReason.VOTED_NO, "resolved from storage")
        if TxnState.COMMIT in states or (protocol is Protocol.CORNUS and states == {TxnState.VOTE_YES}):
            return Outcome(txn, OutcomeStatus.COMMITTED, detail="resolved from storage")
        return Outcome(txn, OutcomeStatus.UNKNOWN, detail="in doubt: only the coordinator can decide")

    # === housekeeping ==============================================================================

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_MS / 1000)
            self._sweep_idle()

    def _sweep_idle(self) -> None:
        now = time.monotonic()
        idle_s = self.config.limits.timeout_ms_txn_idle / 1000
        for ctx in list(self._txns.values()):
            if ctx.state is OutcomeStatus.ACTIVE and not ctx.busy and now - ctx.last_active_s > idle_s:
                self._spawn(self._abort(ctx, AbortReason.TIMEOUT, "idle past timeout_ms_txn_idle"))
        for name, partition in self.partitions.items():
            machines = self.hosts[name].machines
            for txn in list(partition.executions):
                since = partition.idle_since(txn)
                # A prepared transaction belongs to its machine; only pre-prepare state idles out.
                if since is not None and txn not in machines and now - since > idle_s * 2:
                    partition.abort_execution(txn)
                    self.counters["executions_idled_out"] += 1


def _event_txn(event: Event) -> str | None:
    if isinstance(event, MessageReceived):
        return event.message.txn
    if isinstance(event, LogReturned):
        return event.call.txn
    if isinstance(event, TimerFired):
        return event.name.split("/")[1]
    if isinstance(event, Recovered):
        return event.record.txn
    return event.txn


def _fatal(message: str) -> None:
    """An impossible state: crash loudly rather than run on with a broken invariant."""
    log.critical("FATAL: %s", message)
    os._exit(70)


def ops_for_writes(writes: Mapping[str, bytes | None]) -> list[Op]:
    return [Op(OpKind.DELETE, key) if value is None else Op(OpKind.PUT, key, value) for key, value in writes.items()]
