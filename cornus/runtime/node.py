"""One Cornus node: the loop around the pure core (`cornus.protocol.node_core.NodeCore`), as etcd's
raft `node.go` is around `rawnode.go`. Every event (a message, an answered storage call, a fired
timer, a client's commit) goes into the core; every effect that comes out goes to the EffectRunner.

The parts, each in its own module: effect execution (effect_runner.py), the client transactions
this node coordinates (coordination.py), the partitions' execution phase, locks and cache
(partition.py), partition ownership (ownership.py), readiness after recovery (readiness.py), what
operators and peers ask about transactions (admin.py), a deposed process's parking (parking.py),
the storage's cluster record, checked before anything is taken (cluster_record.py), and what a
peer's request may say (wire.py). This module wires them and carries inbound traffic;
it is past 450 lines because the admission of a peer's request (`on_request`: its
deadline, ownership, readiness, the carried prepare) is the inbound traffic's own concern, and
every rule in it is a call into the core or into the parts above.

A partition is served here only while this node holds its lease: from the end of the recovery
that follows its take until the lease ends, it is handed over, or storage refuses a write of ours
(fenced). Then its machines, locks, cache and executions are dropped at once.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import random
import time
from collections.abc import Callable, Iterator, Sequence

from cornus.protocol import status, txn_ids
from cornus.protocol.cluster_record import ClusterRecord
from cornus.protocol.config import Protocol
from cornus.protocol.coordinator_base import CoordPhase
from cornus.protocol.effects import RecoveryFinished
from cornus.protocol.events import Event, MessageReceived
from cornus.protocol.execution import execution_idle_ms
from cornus.protocol.locks import Policy
from cornus.protocol.messages import Prepare, ReleaseReadOnly
from cornus.protocol.node_core import ExecuteRefusal, NodeCore, recovery_owner
from cornus.protocol.ownership import Lost, OwnershipMachine
from cornus.protocol.sweeper import sweeper_owner
from cornus.runtime import cluster_record, patience
from cornus.runtime.admin import Admin, PartitionInfo, TxnInfo
from cornus.runtime.config import NodeConfig
from cornus.runtime.coordination import Coordination, TxnAborted, one_shot_outcome
from cornus.runtime.effect_runner import EffectRunner, crash_if_failed, fatal
from cornus.runtime.failpoints import Failpoints
from cornus.runtime.outcome import NodeOverloaded, Outcome
from cornus.runtime.ownership import WRITTEN_AT_ONCE, OwnershipRuntime, unix_ms_of
from cornus.runtime.ownership import now_ms as monotonic_ms
from cornus.runtime.parking import Parking
from cornus.runtime.partition import PartitionRuntime
from cornus.runtime.readiness import Readiness
from cornus.runtime.timing import TimingLog
from cornus.runtime.transport import Transport
from cornus.runtime.wire import (
    ExecuteRequest,
    ExecuteResponse,
    ExecuteStatus,
    Op,
    PeerRequest,
    PeerResponse,
    Routed,
    StatusRequest,
    carried_prepare_problem,
    ids_problem,
    message_hosts,
    participants_problem,
)
from storage_adapters.contract import LogId, Ownership
from storage_adapters.errors import ValidationError
from storage_adapters.store import LogStore

__all__ = ["Node", "PartitionInfo", "TxnAborted", "TxnInfo", "one_shot_outcome"]

log = logging.getLogger("cornus.node")

# How often idle executions and transactions are looked for.
SWEEP_INTERVAL_MS = 200
# How often a readiness wait, or a hand-over waiting for its transactions to end, looks again.
POLL_MS = 20
# A clean stop waits at most this long for its partitions' releases to land; one that does not
# expires instead (the next owner waits out the lease).
TIMEOUT_MS_RELEASE = 2_000
# A clean stop first delivers the decisions of the transactions this node coordinates, for this
# long at most: under 2PC and coordinator-log a participant may hold its yes vote only in memory
# until then, and a node set without this node would never recover it from this node's log.
TIMEOUT_MS_DELIVER_DECISIONS = 5_000
# Status and resolve calls one node serves at once: each reads every partition's log or asks
# every peer, so thousands at once (the API takes 10,000 requests) would crowd out the commits
# they share storage and peers with (found by audit); past it they are refused, retryable.
STATUS_CALL_COUNT_MAX = 64
# Coordinator phases whose decision some participant may not have yet.
_UNDELIVERED = frozenset({CoordPhase.VALIDATING, CoordPhase.COLLECTING, CoordPhase.DECIDED, CoordPhase.ABORTING})


class Node:
    """Start with `await node.start()`; the node is ready once recovery has run."""

    def __init__(
        self,
        config: NodeConfig,
        store: LogStore,
        transport: Transport,
        failpoints: Failpoints | None = None,
        lock_policy: Policy | None = None,
    ) -> None:
        assert transport.node_id == config.node_id
        self.config = config
        self.node_id = config.node_id
        self.protocol = config.protocol
        self._clock_slack_ms = config.protocol_config.clock_slack_ms
        self.store = store
        self.transport = transport
        self.failpoints = failpoints or Failpoints({})
        self.timings = TimingLog()
        self.counters: collections.Counter[str] = collections.Counter()
        self._status_call_count = 0  # status and resolve calls in flight (STATUS_CALL_COUNT_MAX)
        # The configured policy unless a caller (a test) names one.
        self.lock_policy = config.lock_policy if lock_policy is None else lock_policy
        # The partitions this node holds now: taken and dropped as ownership says.
        self.partitions: dict[str, PartitionRuntime] = {}
        # Of those, the ones recovered and served; with the wall-clock time serving began.
        self.serving: dict[str, int] = {}
        self._partition_names = frozenset(config.partitions)
        jitter = random.Random(int.from_bytes(os.urandom(8), "big"))
        self.core = NodeCore(self.node_id, (), config.peers, config.protocol_config, jitter, sweep=config.sweep_config)
        preferred = config.placement()
        self.ownership = OwnershipRuntime(
            self.node_id, store, OwnershipMachine(self.node_id, preferred, config.ownership), self.counters,
            acquired=self._acquired, lost=self._lost, drain=self._drain,
        )
        self.runner = EffectRunner(
            self.node_id, store=store, transport=transport, partitions=self.partitions, route=self._route,
            fence_of=self.ownership.fence, failpoints=self.failpoints, timings=self.timings, counters=self.counters,
            identity_write_window_ms=config.protocol_config.identity_write_window_ms,
        )
        self.coordination = Coordination(
            config, transport, self.failpoints, self.timings, self.counters, owner_of=self._owner_of,
            spawn=self.runner.spawn,
        )
        self.readiness = Readiness(self.core, self.counters)
        self.admin = Admin(
            config, core=self.core, store=store, transport=transport, coordination=self.coordination,
            partitions=self.partitions, serving=self.serving,
        )
        self.runner.feed = self.coordination.feed = self._feed
        self.runner.may_act = self._may_act
        self.runner.acts_for_node = lambda host: self.core.partition_of(host) is None
        self.coordination.identity_taken_unix_ms = lambda: self.runner.identity.taken_unix_ms
        self.coordination.coordinates = lambda txn: txn in self.core.coordinator.machines
        self.coordination.identity_fresh = lambda: self.runner.identity.fresh_for_client_ids(config.protocol_config)
        self.runner.on_reply = self.coordination.on_reply
        self.runner.on_decided = self.coordination.on_decided
        self.runner.on_recovered = self.readiness.recovered
        self.readiness.settled = self._recovered
        self.runner.on_fenced = self.ownership.fenced
        self.runner.on_deposed = self._deposed
        # Parked once another process of this node took its identity (_deposed).
        self.parking = Parking(self.node_id, store, config.protocol_config)
        # Coordinating needs only this node's own recovery: where the partitions are is the
        # owners' business (a partition moving aborts the transactions that touch it, retryable).
        self.coordination.ready = lambda: self.readiness.ready and not self.deposed
        self._sweeper: asyncio.Task[None] | None = None
        self.cluster_claimed = False

    # === lifecycle =================================================================================

    @property
    def ready(self) -> bool:
        """Recovered, and every partition this node prefers is served by it or held by another
        node (which hands it over, or is its owner while configurations disagree)."""
        if self.deposed or not self.readiness.ready or not self.ownership.records_known:
            return False
        for partition in self.config.preferred_partitions:
            if partition in self.serving:
                continue
            record = self.ownership.records.get(partition)
            if record is None or record.owner in ("", self.node_id):
                return False
        return True

    async def claim_cluster(self, deadline_s: float) -> None:
        """Check the storage's cluster record against this node's configuration (writing it over
        empty storage), waiting for unreachable storage until `deadline_s` (time.monotonic()):
        ClusterMismatch if they differ. Before the node takes anything."""
        mine = ClusterRecord(self.config.cluster_id, self.config.partition_count)
        await cluster_record.claim(self.store, mine, self.node_id, deadline_s)
        self.cluster_claimed = True

    async def start(self, wait_ready: bool = True) -> None:
        if not self.cluster_claimed:
            await self.claim_cluster(patience.start_deadline_s())
        await self.transport.start(self)
        self._sweeper = asyncio.create_task(self._sweep_forever(), name="cornus-sweeper")
        self._sweeper.add_done_callback(crash_if_failed)
        self.runner.run(self.core.start())
        self.ownership.start()
        if wait_ready:
            await self.wait_ready()

    @property
    def deposed(self) -> bool:
        """Another process of this node took its identity: this one is parked (cornus.runtime.parking)."""
        return self.parking.parked

    def _deposed(self, why: str) -> None:
        """Another process of this node took its identity after this one: this one decides, writes
        and serves nothing from now on, and parks (cornus.runtime.parking)."""
        if self.deposed:
            return
        self.counters["deposed"] += 1
        log.error("node %s deposed: %s; it serves and writes nothing from now on, and waits to be stopped",
                  self.node_id, why)
        self.runner.stopped = True  # no event reaches the core, no effect leaves it, from here on
        self.readiness.stop()  # a recovery still settling serves nothing (found by review)
        self.serving.clear()
        self.coordination.abandon_replies()
        self.parking.park(self._halt)

    async def _halt(self) -> None:
        # No release of the partitions: the other process of this node may hold them by now.
        self.ownership.halt()
        await self.transport.close()  # peers reconnect to the node's current address
        await self.runner.stop()

    async def wait_ready(self) -> None:
        # Polled: readiness depends on ownership records, recoveries and peers alike, and a
        # restart that waits out its own old leases takes seconds, not milliseconds.
        while not self.ready:  # noqa: ASYNC110
            await asyncio.sleep(POLL_MS / 1000)

    def quiesce(self) -> None:
        """Told to stop (a signal), before the APIs wind down: take no more partitions."""
        self.ownership.quiesce()

    async def stop(self) -> None:
        self.ownership.quiesce()
        self.parking.stopping()
        if not self.deposed:
            await self._deliver_decisions(TIMEOUT_MS_DELIVER_DECISIONS / 1000)
        if not self.deposed:  # deposed meanwhile, perhaps: then it releases nothing
            await self.ownership.stop(TIMEOUT_MS_RELEASE / 1000)
            # After the release, so that the partitions' new owners serve meanwhile: the
            # collection's writes are the node's own, not a partition owner's.
            await self._finish_collections(self.config.limits.timeout_ms_stop_collect / 1000)
            await self.runner.stop()
        # Deposed (before the stop, or during it): it delivers and releases nothing more (another
        # process is this node now).
        await self.parking.stop()
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        self.readiness.stop()
        await self.transport.close()  # a second close (parking closed it) does nothing

    def undelivered_count(self) -> int:
        """Transactions this node coordinates whose decision some participant has not acknowledged."""
        return sum(machine.phase in _UNDELIVERED for machine in self.core.coordinator.machines.values())

    async def _deliver_decisions(self, timeout_s: float) -> None:
        """Start no transaction here any more, abort the interactive ones still open
        (Coordination.abort_open), and wait (at most `timeout_s`) until those aborts are done and
        every transaction it coordinates is decided and acknowledged by all its participants."""
        self.coordination.closing = True
        aborted = self.coordination.abort_open()
        if aborted:
            log.info("node %s aborts the %d interactive transactions still open on it", self.node_id, aborted)
        # And the open transactions' aborts, each a peer request, or the runner's stop cancels them.
        left = await self._wait_for_none(lambda: self.undelivered_count() + self.coordination.stop_aborts_running,
                                         timeout_s)
        if left:
            log.warning("node %s stops with %d coordinated transactions not acknowledged by every participant, "
                        "or open ones not aborted yet "
                        "(see cornus inspect before removing this node)", self.node_id, left)

    async def _wait_for_none(self, count: Callable[[], int], timeout_s: float) -> int:
        """Wait until `count()` is 0, `timeout_s` has passed or the runner stopped (deposed, too);
        what it is then. Polled: decisions and collections end through messages, resends, timers
        and storage calls alike."""
        loop = asyncio.get_running_loop()
        deadline_s = loop.time() + timeout_s
        while count() and loop.time() < deadline_s and not self.runner.stopped:  # noqa: ASYNC110
            await asyncio.sleep(POLL_MS / 1000)
        return count()

    def uncollected_count(self) -> int:
        """Transactions this node coordinates that every participant acknowledged and whose records
        are still to be collected (the grace period, then the deletes)."""
        return sum(machine.delivered for machine in self.core.coordinator.machines.values())

    async def _finish_collections(self, timeout_s: float) -> None:
        """Wait (at most `timeout_s`) until the transactions this node coordinates that are only
        waiting to be collected are collected: no later process of the node knows a Cornus
        transaction this one coordinated, so their records would stay in storage for ever (found
        by audit: every rolling restart left about a grace period's worth of them)."""
        left = await self._wait_for_none(self.uncollected_count, timeout_s)
        if left and not self.deposed and timeout_s > 0:  # 0: told not to wait (thrown-away storage)
            log.warning("node %s stops with the records of %d transactions it coordinated left uncollected "
                        "(timeout_ms_stop_collect %d ms is shorter than their grace period, or storage did not "
                        "answer); they stay in storage", self.node_id, left, self.config.limits.timeout_ms_stop_collect)

    # === ownership =================================================================================

    def _route(self, host: str) -> str | None:
        """The node a host's messages go to: a node is itself; a partition, its holder."""
        return host if host in self.config.peers else self._owner_of(host)

    def _owner_of(self, partition: str) -> str | None:
        owner = self.ownership.owner_of(partition)
        if owner is not None and owner not in self.config.peers:
            # Held by a node this one's configuration does not list (a node set changing, and
            # this node not restarted with the new one yet): unreachable from here until then.
            self.counters["owner_not_a_peer"] += 1
            return None
        return owner

    def _may_act(self, host: str) -> bool:
        """A partition's machines act (a timer, a write) only while this node's lease on it is
        good; asking drops a partition whose lease ran out at once, not at the next tick."""
        partition = self.core.partition_of(host)
        return partition is None or self.ownership.fence(partition) is not None

    def _acquired(self, ownership: Ownership) -> None:
        partition = ownership.partition
        limits = self.config.limits
        self.partitions[partition] = PartitionRuntime(
            partition, self.store, self.lock_policy, limits.timeout_ms_lock_wait, limits.op_count_max,
            partition_count=self.config.partition_count, counters=self.counters,
            tenure_began_ms=int(time.time() * 1000), clock_slack_ms=self._clock_slack_ms,
        )
        self.runner.run(self.core.add_partition(partition))

    def _recovered(self, effect: RecoveryFinished) -> None:
        """A recovery settled: serve the partitions it covered (those still held: the lease may
        have ended while its transactions resolved). A deposed node serves nothing."""
        if self.deposed:
            return
        for partition in effect.partitions:
            epoch = self.ownership.machine.epoch(partition)
            # By the lease, not the epoch alone, which stays set until the next tick drops it: a
            # "serve" line after the lease ended misled the chaos harness (found by audit).
            if epoch is None or not self.ownership.holds(partition) or not self.core.partition_recovered(partition):
                continue  # lost meanwhile (and maybe taken again, its new recovery not done)
            self.serving[partition] = at_unix_ms = unix_ms_of(monotonic_ms())
            log.info("ownership serve partition=%s epoch=%d node=%s at_unix_ms=%d", partition, epoch, self.node_id,
                     at_unix_ms, extra=WRITTEN_AT_ONCE)

    def _lost(self, lost: Lost) -> None:
        partition = lost.partition
        self.serving.pop(partition, None)
        if partition in self.core.partitions:
            self.core.drop_partition(partition)
        self.runner.cancel_owned({partition, recovery_owner(partition), sweeper_owner(LogId.partition(partition))})
        runtime = self.partitions.pop(partition, None)
        if runtime is not None:
            runtime.close()

    def _drain(self, partition: str) -> None:
        self.runner.spawn(self._drain_when_idle(partition))

    async def _drain_when_idle(self, partition: str) -> None:
        """Hand over once no transaction is in flight on the partition. The ownership machine
        releases it anyway after its drain_ms_max, so this loop ends by then."""
        while self.ownership.holds(partition):
            host = self.core.partitions.get(partition)
            runtime = self.partitions.get(partition)
            if host is not None and runtime is not None and not host.machines and not runtime.executions:
                self.ownership.drained(partition)
                return
            await asyncio.sleep(POLL_MS / 1000)

    def _feed(self, event: Event) -> None:
        if self.runner.stopped:
            return
        self.runner.catch_up_after_suspend()  # the timers a suspend made overdue come first
        self._step(event)

    def _step(self, event: Event) -> None:
        """`_feed` once the suspend check ran (on_message's own, a moment before)."""
        if self.runner.stopped:
            return
        try:
            self.runner.run(self.core.handle(event))
        except Exception as error:
            # Any: neither raises a failure a node may run on after (storage's and peers' come
            # back as events), and a step half done leaves a machine waiting for a timer or a
            # write never made. Raised here, a timer's or a peer message's would only be logged
            # by the event loop (found by audit: only an AssertionError ended the node).
            fatal(f"{type(event).__name__} for {event.txn or 'the node'}: {type(error).__name__}: {error}")

    # === inbound traffic ===========================================================================

    def on_message(self, sender: str, message: Routed) -> None:
        assert isinstance(message, Routed), f"expected a Routed message, got {type(message).__name__}"
        # Before anything reads the core's or a partition's state for it (found by review).
        self.runner.catch_up_after_suspend()
        inner = message.message
        if txn_ids.protocol_of(inner.txn) is None:
            # No machine may guess the protocol of an id that names none (nodes with different
            # defaults would guess differently), and no id we make lacks it.
            self.counters["untagged_messages"] += 1
            return
        problem = self._message_problem(message)
        if problem:
            # The core asserts what its machines are told, and an assertion ends the process: what
            # a peer sends is checked here, at the boundary, and a bad message is dropped.
            self.counters["peer_messages_refused"] += 1
            log.warning("dropped a message from %s: %s", sender, problem, extra={"txn": inner.txn})
            return
        if message.dest not in self.config.peers:
            self.ownership.check(message.dest)  # a lease that ran out drops the partition first
        partition = self.partitions.get(message.dest)
        if partition is not None and self.core.ends_execution(message.dest, inner):
            executed = partition.ended_execution(inner.txn, isinstance(inner, ReleaseReadOnly))
            if executed is not None:
                # The execution phase ends here: the machine learns what it left, and decides.
                self._step(executed)
        self._step(MessageReceived(message.source, message.dest, inner))

    def _message_problem(self, message: Routed) -> str:
        """What makes a peer's message one no machine here may be given ("" if nothing)."""
        dest, inner = message.dest, message.message
        if dest != self.node_id and dest not in self._partition_names:
            return f"addressed to {dest!r}, neither this node nor a partition"
        problem = ids_problem(inner.txn, (message.source, *message_hosts(inner)))
        if not problem and isinstance(inner, Prepare):
            problem = participants_problem(dest, inner.participants, self._partition_names)
        return problem

    async def on_request(self, sender: str, request: PeerRequest) -> PeerResponse:
        self.runner.catch_up_after_suspend()  # as on_message
        if isinstance(request, StatusRequest):
            return await self.admin.status_response(request, self.ready)
        assert isinstance(request, ExecuteRequest)
        problem = ids_problem(request.txn, (request.partition, request.coordinator))
        if problem:
            self.counters["peer_requests_refused"] += 1
            return ExecuteResponse(ExecuteStatus.INVALID, detail=problem)
        deadline_ms = (status.request_deadline_ms(request.deadline_unix_ms, txn_ids.begin_ms_of(request.txn),
                                                  self.config.limits.timeout_ms_peer_request)
                       if status.kept_to_one_shot_window(request.txn, bool(request.participants))
                       else request.deadline_unix_ms)
        if status.request_expired(deadline_ms, int(time.time() * 1000), self._clock_slack_ms):
            if (request.partition in self.core.partitions and not request.abort
                    and self.core.execute_refusal(request.partition, request.txn) is ExecuteRefusal.COMMITTING):
                # A machine runs it here: its vote may stand, so the answer is no refusal, late or
                # not (found by review: UNAVAILABLE, a refusal, told its coordinator this owner
                # would never vote; the simulator answered it as committing).
                return _already_committing(request.txn)
            # Its sender gave up long ago; the status call may since have said "not known".
            self.counters["requests_past_deadline"] += 1
            count = self.counters["requests_past_deadline"]
            if count & (count - 1) == 0:  # the 1st, 2nd, 4th, ...: seen, never a flood
                log.warning("refused %d requests that arrived past their deadline (%s from %s): a slow network, "
                            "or this node's clock ahead of the sender's by more than clock_slack_ms",
                            count, request.txn, sender, extra={"txn": request.txn})
            return ExecuteResponse(ExecuteStatus.UNAVAILABLE, detail=f"{request.txn} arrived past its deadline")
        self.ownership.check(request.partition)
        partition = self.partitions.get(request.partition)
        if partition is None or not (request.abort or self._admits(partition, request)):
            return ExecuteResponse(ExecuteStatus.NOT_OWNER, detail=f"{self.node_id} does not own {request.partition}")
        if txn_ids.protocol_of(request.txn) is None:
            return ExecuteResponse(ExecuteStatus.INVALID, detail=f"txn id {request.txn!r} names no protocol")
        refusal = self.core.execute_refusal(request.partition, request.txn, abort=request.abort)
        # A machine runs it: "already committing", which is no refusal, before the settle's
        # NOT_READY, which is one (the core's order; found by audit, 2026-11-28: its coordinator
        # heard "never votes here" of a vote that stands).
        if refusal is ExecuteRefusal.COMMITTING:
            return _already_committing(request.txn)
        if refusal is ExecuteRefusal.NOT_READY or (request.partition not in self.serving and not request.abort):
            return ExecuteResponse(ExecuteStatus.NOT_READY, detail=f"{self.node_id} is recovering {request.partition}")
        if request.participants:
            problem = carried_prepare_problem(request, self._partition_names)
            if problem:
                return ExecuteResponse(ExecuteStatus.INVALID, detail=problem)
        response = await partition.execute(request)
        if not request.abort and (self.partitions.get(request.partition) is not partition
                                  or not self._admits(partition, request)):
            # Lost while it waited (for a lock, or for storage): what it read may be stale by now,
            # with another node owning the partition (found by review: checked only before).
            if self.partitions.get(request.partition) is partition:
                # Still held, but draining: what the request ran goes with the refusal, or the
                # drain waits for its coordinator's abort to hand over (found by audit, 2026-11-28).
                partition.abort_execution(request.txn)
            return ExecuteResponse(ExecuteStatus.NOT_OWNER, detail=f"{self.node_id} lost {request.partition}")
        if (request.participants and response.status is ExecuteStatus.OK
                and status.request_expired(deadline_ms, int(time.time() * 1000), self._clock_slack_ms)):
            # It waited past its deadline (for a lock, for a read): its vote would leave after the
            # window the late-vote bound and the sweep age count on (status.late_vote_ms), which
            # ends where the check on arrival does (found by audit, 2026-11-28). Not voted yet,
            # so a refusal is still true.
            partition.abort_execution(request.txn)
            self.counters["requests_past_deadline"] += 1
            return ExecuteResponse(ExecuteStatus.UNAVAILABLE, detail=f"{request.txn} waited past its deadline")
        if request.participants and response.status is ExecuteStatus.OK:
            # The request carried its prepare: the execution phase ends here, as when a separate
            # Prepare arrives. A failed execution drops it, so this partition never votes.
            prepare = Prepare(request.txn, request.participants, request.coordinator)
            self.on_message(request.coordinator, Routed(request.coordinator, request.partition, prepare))
            # Its coordinator takes any answer but OK (and ABORTED, "known here already") for
            # "never votes here" and may abort at once without reading a log
            # (Coordination._start_prepared): so every refusal is returned above, before the
            # prepare, and none may follow it (found by audit: nothing said so).
            assert response.status is ExecuteStatus.OK, response
        return response

    def _admits(self, partition: PartitionRuntime, request: ExecuteRequest) -> bool:
        """The core's rule (OwnershipMachine.admits_request), a draining partition's included."""
        continues = request.continued and request.txn in partition.executions
        return self.ownership.admits_request(request.partition, continues_execution=continues)

    # === the client API (coordination) and operators' (admin) ======================================

    def begin(self, protocol: Protocol | None = None, client_txn: str | None = None) -> str:
        return self.coordination.begin(protocol, client_txn)

    def begin_one_shot(self, protocol: Protocol | None = None, client_txn: str | None = None) -> str | Outcome:
        return self.coordination.begin_one_shot(protocol, client_txn)

    async def run_ops(self, txn: str, ops: Sequence[Op], read_bytes_max: int = 0) -> list[bytes | None]:
        return await self.coordination.run_ops(txn, ops, read_bytes_max)

    def refuse_commit(self, txn: str, reason: str) -> None:
        self.coordination.refuse_commit(txn, reason)

    async def commit(self, txn: str) -> Outcome:
        return await self.coordination.commit(txn)

    async def abort(self, txn: str, *, input_refused: bool = False) -> Outcome:
        return await self.coordination.abort(txn, input_refused=input_refused)

    async def refuse_one_shot(self, txn: str, client_txn: str | None, refused: ValidationError | NodeOverloaded,
                              ) -> Outcome | None:
        return await self.coordination.refuse_one_shot(txn, client_txn, refused)

    async def execute(self, ops: Sequence[Op], protocol: Protocol | None = None,
                      client_txn: str | None = None) -> Outcome:
        return await self.coordination.execute(ops, protocol, client_txn)

    def status(self, txn: str) -> Outcome | None:
        return self.admin.status(txn)

    async def resolve_status(self, txn: str) -> Outcome | None:
        """The status call (Admin.resolve_status). NodeOverloaded (retryable: REST 503, gRPC
        UNAVAILABLE) while this node is not ready: recovering, it does not know yet what its logs
        hold, and the verdict would make its own answer "unknown" at best; refused, the caller
        asks another node (the SDK does) or again, as for any other call. Found by review: gRPC
        refused it, REST answered 202 "some nodes are still recovering", and the SDK handed that
        back as the outcome instead of asking a node that could tell."""
        if not self.ready:
            raise NodeOverloaded(f"{self.node_id} is still recovering")
        with self._status_call():
            return await self.admin.resolve_status(txn)

    async def resolve(self, txn: str, *, force: bool = False) -> Outcome:
        with self._status_call():
            return await self.admin.resolve(txn, force=force)

    @contextlib.contextmanager
    def _status_call(self) -> Iterator[None]:
        """Count a status or resolve call in flight; NodeOverloaded past STATUS_CALL_COUNT_MAX."""
        if self._status_call_count >= STATUS_CALL_COUNT_MAX:
            self.counters["status_calls_refused"] += 1
            raise NodeOverloaded(f"{self.node_id} serves {STATUS_CALL_COUNT_MAX} status and resolve calls at once; "
                                 "retry later")
        self._status_call_count += 1
        try:
            yield
        finally:
            self._status_call_count -= 1

    def transactions(self) -> list[TxnInfo]:
        return self.admin.transactions()

    async def partitions_info(self) -> list[PartitionInfo]:
        return await self.admin.partitions_info()

    def in_doubt_count(self) -> int:
        return self.core.in_doubt_count()

    def protocol_of(self, txn: str) -> Protocol | None:
        """The protocol a transaction runs: the one its id names, on every node alike."""
        return txn_ids.protocol_of(txn)

    @property
    def outcome_observers(self) -> list[Callable[[str, Outcome], None]]:
        return self.coordination.outcome_observers

    # === housekeeping ==============================================================================

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_MS / 1000)
            self.coordination.sweep_idle()
            # Executions outlive their coordinator's idle timeout by as much again: by then the
            # coordinator has aborted them, or lost them, or refreshed those of a transaction its
            # client keeps at work. One a machine owns is the machine's.
            idle_ms = execution_idle_ms(self.config.limits.timeout_ms_txn_idle)
            for name, partition in self.partitions.items():
                machines = self.core.partitions[name].machines
                self.counters["executions_idled_out"] += partition.sweep_idle(idle_ms, machines.__contains__)


def _already_committing(txn: str) -> ExecuteResponse:
    """An owner's answer to a request of a transaction its machine runs: ABORTED, which is no
    refusal (cornus.protocol.owner_answer.refuses): its vote may stand."""
    return ExecuteResponse(ExecuteStatus.ABORTED, detail=f"{txn} is already committing")
