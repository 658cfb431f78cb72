"""What a node tells operators and peers about transactions: the outcome of one (from its own memory,
its peers', or the records in storage), the listing of what is in flight or in doubt here, the
status answer to a peer, the manual resolve (the core's `Resolver`, run against storage), and who
owns which partition (the ownership records in storage)."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass

from cornus.protocol import txn_ids
from cornus.protocol.effects import LogOnce, ReadRecord, StartTimer, Timer
from cornus.protocol.events import Event, StorageUnreachable, TimerFired, answer
from cornus.protocol.node_core import NodeCore
from cornus.protocol.resolve import AskCoordinator, CoordinatorAnswered, Resolver
from cornus.protocol.status import (
    Known,
    NodeAnswer,
    kept_window_ms,
    memory_is_outcome,
    node_knows,
    requests_window_ms,
    verdict,
)
from cornus.runtime.config import NodeConfig
from cornus.runtime.coordination import Coordination
from cornus.runtime.outcome import AbortReason, Outcome, OutcomeStatus, TxnWrongState
from cornus.runtime.ownership import now_ms
from cornus.runtime.partition import PartitionRuntime
from cornus.runtime.transport import Transport
from cornus.runtime.wire import StatusRequest, StatusResponse
from storage_adapters.contract import LogId, Record, TxnState
from storage_adapters.errors import StorageUnavailable, ValidationError
from storage_adapters.store import CallDeadline, LogStore, call_deadline_at

# Storage calls one manual resolve, or one node's answer to the status call, keeps in flight (each
# reads the transaction's record in every partition).
RESOLVE_CALLS_IN_FLIGHT_MAX = 256


@dataclass(frozen=True, slots=True)
class TxnInfo:
    txn: str
    role: str  # "coordinator" or "participant"
    where: str  # node id (coordinator) or partition (participant)
    phase: str
    protocol: str
    partitions: tuple[str, ...]
    idle_ms: int


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """One partition's ownership record as stored now (owner "" and epoch 0: never taken; owner ""
    otherwise: released), the node this node's configuration prefers for it, and whether this
    node serves it."""

    partition: str
    owner: str
    epoch: int
    version: int
    lease_ms: int
    wanted_by: str
    preferred: str
    served_here: bool


class Admin:
    def __init__(
        self,
        config: NodeConfig,
        *,
        core: NodeCore,
        store: LogStore,
        transport: Transport,
        coordination: Coordination,
        partitions: Mapping[str, PartitionRuntime],
        serving: Mapping[str, int],
    ) -> None:
        self.serving = serving
        self.config = config
        self.node_id = config.node_id
        self.core = core
        self.store = store
        self.transport = transport
        self.coordination = coordination
        self.partitions = partitions
        # When this process's configuration took effect (it is read once, at start): the status
        # call counts on this node's windows only for transactions that began after it.
        self._since_ms = int(time.time() * 1000)

    # -- outcomes ----------------------------------------------------------------------------------
    def status(self, txn: str) -> Outcome | None:
        """What this node knows of a transaction it coordinated (None: nothing)."""
        known = self.coordination.known(txn)
        if known is not None and known.status is not OutcomeStatus.UNKNOWN:
            return known
        machine = self.core.coordinator.machines.get(txn)
        if machine is not None and machine.decision is not None:
            if machine.decision is TxnState.COMMIT:
                return Outcome(txn, OutcomeStatus.COMMITTED)
            return Outcome(txn, OutcomeStatus.ABORTED, AbortReason.VOTED_NO)
        if machine is not None and known is None:
            # Its commit runs here, undecided: no record need have landed yet, so "nothing" would
            # let the status call say "no such transaction" of one about to commit.
            return Outcome(txn, OutcomeStatus.UNKNOWN, detail="in doubt: its commit is under way")
        return known

    async def resolve_status(self, txn: str) -> Outcome | None:
        """The true outcome of any transaction the cluster still knows: its coordinator's memory,
        else the participants' records (the decision any of them holds is the outcome; VOTE_YES
        alone means in doubt), among them the decision's tombstone that garbage collection leaves
        in the first participant's log for outcome_keep_ms. None if no node knows it and none can
        have forgotten it: within gc_grace_ms + outcome_keep_ms (less the clock slack) of its
        begin, a transaction that voted has a record or a tombstone, so it never committed.
        UNKNOWN after that: its tombstone may have expired, and "not known" could then be a
        committed transaction, which a caller must not run again."""
        known = self.status(txn)
        if known is not None and memory_is_outcome(Known.of(known.status.value), txn_ids.is_client_chosen(txn)):
            return known
        # In doubt here (a commit told UNKNOWN, a client-chosen id another process may have run)
        # is no answer: the records may hold the decision, which no machine here will bring
        # (found by audit: "under way" for ever, and no record read). This node's own answer
        # below says in doubt, so the verdict never says "not known" of it.
        # Before the answers are gathered, not after: each tells of the moment it was made, and a
        # request may still have run at its owner until then (found by review: read after a slow
        # answer, the clock said "too late for any request" of one that ran after the owner's).
        asked_ms = int(time.time() * 1000)
        responses = await asyncio.gather(
            *(self.transport.request(node, StatusRequest(txn), self.config.limits.timeout_ms_peer_request)
              for node in self.config.peers),
            return_exceptions=True,
        )
        answers = [
            NodeAnswer(r.ready, r.partitions, tuple(state for _, state in r.txn_states), Known.of(r.txn_outcome),
                       r.requests_window_ms, r.kept_window_ms, r.config_since_unix_ms, r.node)
            if isinstance(r, StatusResponse) else None
            for r in responses
        ]
        # And after them: a node read its records as late as its answer came.
        answered_ms = max(asked_ms, int(time.time() * 1000))
        found = verdict(answers, self.config.partitions, txn_ids.begin_ms_of(txn), asked_ms, answered_ms,
                        config=self.config.protocol_config, requests_ms=self._requests_window_ms(),
                        coordinator=txn_ids.coordinator_of(txn))
        if found is None:
            return known  # never "not known" of what this node holds in doubt
        status = OutcomeStatus(found.verdict.value)
        return Outcome(txn, status, AbortReason.VOTED_NO if status is OutcomeStatus.ABORTED else None,
                       detail=found.detail)

    async def status_response(self, request: StatusRequest, ready: bool) -> StatusResponse:
        if request.memory_only:
            # What it knows of the transaction itself; no record read, so no partition named read.
            known = self._knows(request.txn, tuple(self.partitions)) if request.txn else Known.NOTHING
            return self._status(ready, (), (), known)
        states: list[tuple[str, TxnState]] = []
        # Partitions come and go while we read: the answer names those read, never one taken
        # since (found by review: claimed read, its tombstone, all a collected transaction has
        # left, went unseen, and the status call said "not known").
        # Only those served: one still recovering has not rebuilt its votes yet, and under
        # coordinator-log a vote lives only in its coordinator's redo record until then (found by
        # audit: claimed read meanwhile, "not known" of a transaction whose coordinator, gone from
        # the node set, had logged COMMIT).
        held = tuple(self.partitions)
        served = tuple(p for p in held if p in self.serving)
        # Before the reads as well as after: a participant running it now may have its vote
        # written, decide and drop its machine while the reads go on, and be in neither (found by
        # review). Once no request of it can run any more, what can still vote runs already. In
        # every partition held: a recovered machine runs before its partition is served.
        runs_before = bool(request.txn) and self._runs_here(request.txn, held)
        if request.txn:
            # Side by side: one after another, a few hundred partitions on cloud storage outlasted
            # the asker's wait for any node, and the status call said "unknown" of every
            # transaction the nodes no longer remembered (found by audit, 2026-11-28).
            limit = asyncio.Semaphore(RESOLVE_CALLS_IN_FLIGHT_MAX)

            async def read(partition: str) -> Record | None:
                async with limit:
                    return await self.store.read(LogId.partition(partition), request.txn)

            records = await asyncio.gather(*(read(partition) for partition in served))
            states = [(p, record.state) for p, record in zip(served, records, strict=True) if record is not None]
        known = self._knows(request.txn, held, runs_before) if request.txn else Known.NOTHING
        return self._status(ready, served, tuple(states), known)

    def _status(self, ready: bool, served: tuple[str, ...], states: tuple[tuple[str, TxnState], ...],
                known: Known) -> StatusResponse:
        return StatusResponse(
            node=self.node_id,
            ready=ready,
            partitions=served,
            txn_states=states,
            in_doubt_count=self.core.in_doubt_count(),
            txn_outcome=known.value,
            requests_window_ms=self._requests_window_ms(),
            kept_window_ms=kept_window_ms(self.config.protocol_config),
            config_since_unix_ms=self._since_ms,
        )

    def _knows(self, txn: str, served: tuple[str, ...], runs_before: bool = False) -> Known:
        """What this node tells of `txn` itself (cornus.protocol.status.node_knows)."""
        remembered = self.coordination.known(txn)
        machine = self.core.coordinator.machines.get(txn)
        return node_knows(
            remembered=Known.NOTHING if remembered is None else Known.of(remembered.status.value),
            coordinating=machine is not None, decision=None if machine is None else machine.decision,
            participating=runs_before or self._runs_here(txn, served),
        )

    async def _coordinator_knows(self, txn: str) -> tuple[str, Known]:
        """The transaction's coordinator, and what its node tells of the transaction: this node's
        own word, or its status answer; NOTHING when it does not answer (gone: what a resolve is
        for) or is no peer of this node's."""
        coordinator = txn_ids.coordinator_of(txn)
        if coordinator == self.node_id:
            return coordinator, self._knows(txn, tuple(self.partitions))
        if coordinator not in self.config.peers:
            return coordinator, Known.NOTHING
        try:
            response = await self.transport.request(coordinator, StatusRequest(txn, memory_only=True),
                                                    self.config.limits.timeout_ms_peer_request)
        except Exception:  # any: it did not answer, which is the case a resolve is for
            return coordinator, Known.NOTHING
        if not isinstance(response, StatusResponse):
            return coordinator, Known.NOTHING
        return coordinator, Known.of(response.txn_outcome)

    def _requests_window_ms(self) -> int:
        limits, protocol = self.config.limits, self.config.protocol_config
        return requests_window_ms(limits.timeout_ms_peer_request, protocol.clock_slack_ms)

    def _runs_here(self, txn: str, served: tuple[str, ...]) -> bool:
        """Whether a served partition runs `txn`: its machine (a vote's write may be on its way),
        or its execution (a Prepare may still arrive, be voted yes, and commit by termination:
        found while moving the verdict into the core)."""
        for partition in served:
            host, runtime = self.core.partitions.get(partition), self.partitions.get(partition)
            if (host is not None and txn in host.machines) or (runtime is not None and txn in runtime.executions):
                return True
        return False

    # -- ownership ---------------------------------------------------------------------------------
    async def partitions_info(self) -> list[PartitionInfo]:
        """Read from storage, not from this node's last poll: an operator wants what is true now."""
        records = await self.store.read_owners(self.config.partitions)
        preferred = self.config.placement()
        infos = []
        for partition in self.config.partitions:
            record = records.get(partition)
            owner, epoch, version, lease_ms, wanted_by = (
                ("", 0, 0, 0, "") if record is None
                else (record.owner, record.epoch, record.version, record.lease_ms, record.wanted_by)
            )
            infos.append(PartitionInfo(partition, owner, epoch, version, lease_ms, wanted_by,
                                       preferred[partition], partition in self.serving))
        return infos

    # -- the listing -------------------------------------------------------------------------------
    def transactions(self) -> list[TxnInfo]:
        """What is in flight here: transactions this node coordinates, and the participant side
        of every owned partition (phase "voted" is in doubt: voted yes, no decision known;
        "applying" is committed, its redo not in storage yet)."""
        now = time.monotonic()
        protocol_of = _protocol_name
        machines = self.core.coordinator.machines
        infos = [
            # A commit under way shows its machine's phase (an operator reads "collecting" or
            # "decided" of a blocking protocol as in doubt: services/client/types.py).
            TxnInfo(ctx.txn, "coordinator", self.node_id,
                    machines[ctx.txn].phase.value if ctx.txn in machines else ctx.state.value, ctx.protocol.value,
                    tuple(sorted(ctx.touched)), round((now - ctx.last_active_s) * 1000))
            for ctx in self.coordination.txns.values()
        ]
        for txn, machine in machines.items():
            # Decided and acknowledged everywhere, its records waiting out the grace: over.
            if txn not in self.coordination.txns and not machine.delivered:
                infos.append(TxnInfo(txn, "coordinator", self.node_id, machine.phase.value, protocol_of(txn),
                                     tuple(machine.participants), 0))
        for partition, host in self.core.partitions.items():
            runtime = self.partitions[partition]
            for txn in runtime.executions:
                if txn not in host.machines:
                    since_ms = runtime.idle_since_ms(txn)
                    idle_ms = 0 if since_ms is None else max(0, round(now * 1000) - since_ms)
                    infos.append(TxnInfo(txn, "participant", partition, "executing", protocol_of(txn), (), idle_ms))
            for txn, machine in host.machines.items():
                infos.append(TxnInfo(txn, "participant", partition, machine.phase.value, protocol_of(txn),
                                     tuple(machine.participants), 0))
        return infos

    # -- manual resolve ----------------------------------------------------------------------------
    async def resolve(self, txn: str, *, force: bool = False) -> Outcome:
        """Finish a transaction by hand from any node, reading storage directly (every node can),
        by the core's rules (cornus.protocol.resolve). ValidationError, and nothing read or
        written, for an id that names no protocol: no node made it, and no rule decides it.
        TxnWrongState, and nothing written, for one its coordinator's node still runs, unless
        `force` (cornus.protocol.resolve.refusal_while_running): asked before the first write, so a
        resolve that only reads a decision is never refused."""
        if txn_ids.protocol_of(txn) is None:
            raise ValidationError(f"{txn!r} names no protocol (the ids this cluster makes end in their protocol's "
                                  f"tag: {', '.join(sorted(txn_ids.PROTOCOL_TAGS.values()))}): nothing to resolve")
        pc = self.config.protocol_config
        resolver = Resolver(txn, self.config.partitions, pc, random.Random(), force=force)
        # The window runs on the lease clock, which counts a suspend of the machine (found by
        # review: on the event loop's clock, which stops then, a resolve suspended between its
        # reads and its writes wrote after the window, when the records could have been collected).
        window: tuple[Timer, int] | None = None  # the timer, and its end (ms, lease clock)
        limit = asyncio.Semaphore(RESOLVE_CALLS_IN_FLIGHT_MAX)

        async def call(effect: LogOnce | ReadRecord | AskCoordinator,
                       writes_deadline: CallDeadline | None) -> Event | CoordinatorAnswered:
            if isinstance(effect, AskCoordinator):
                return CoordinatorAnswered(txn, (await self._coordinator_knows(txn))[1])
            async with limit:
                try:
                    if isinstance(effect, ReadRecord):
                        return answer(effect, await self.store.read(effect.log, effect.txn))
                    with call_deadline_at(writes_deadline):
                        written = await self.store.log_once(effect.log, effect.txn, effect.state, effect.body)
                    return answer(effect, written)
                except StorageUnavailable as error:
                    return answer(effect, StorageUnreachable(str(error)))

        effects = resolver.start()
        while not resolver.done:
            calls: list[LogOnce | ReadRecord | AskCoordinator] = []
            for effect in effects:
                if isinstance(effect, StartTimer):
                    window = (effect.timer, now_ms() + effect.duration_ms)
                else:
                    assert isinstance(effect, LogOnce | ReadRecord | AskCoordinator), effect
                    calls.append(effect)
            # The core's driver rule (cornus.protocol.resolve): writes leave only before the
            # window's end, which is their deadline, fixed here as they leave (found by review:
            # fixed inside the store, a stall between this check and the writes gave them fresh
            # deadlines past the window; Redis and the emulator refuse them now).
            writes_deadline = None
            if any(isinstance(c, LogOnce) for c in calls):
                assert window is not None, "writes before the window started"
                left_ms = window[1] - now_ms()
                if left_ms <= 0:
                    return Outcome(txn, OutcomeStatus.UNKNOWN, detail="in doubt: the window to write closed before "
                                                                       "the writes left; try again")
                writes_deadline = CallDeadline.after(left_ms / 1000)
            events = await asyncio.gather(*(call(c, writes_deadline) for c in calls))
            effects = []
            if window is not None and window[1] <= now_ms() and not resolver.done:
                resolver.handle(TimerFired(window[0]))
                window = None  # told once
            for event in events:
                if resolver.done:
                    break  # answers a finished round no longer needs
                effects += resolver.handle(event)
            assert resolver.done or effects, "a resolve round asked for nothing and did not finish"
        if resolver.refusal is not None:
            raise TxnWrongState(resolver.refusal)
        detail = f"resolved from storage: {resolver.detail}"
        if resolver.outcome is TxnState.COMMIT:
            return Outcome(txn, OutcomeStatus.COMMITTED, detail=detail)
        if resolver.outcome is TxnState.ABORT:
            return Outcome(txn, OutcomeStatus.ABORTED, AbortReason.VOTED_NO, detail)
        if not resolver.found_records:
            # Nothing in storage: never voted anywhere, or finished and collected. Memory may know.
            known = await self.resolve_status(txn)
            if known is not None:
                return known
        return Outcome(txn, OutcomeStatus.UNKNOWN, detail=resolver.detail)


def _protocol_name(txn: str) -> str:
    protocol = txn_ids.protocol_of(txn)
    return protocol.value if protocol is not None else "unknown"
