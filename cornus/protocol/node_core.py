"""Everything one node decides, with no I/O: its coordinator host, a participant host per owned
partition, recovery at start and the readiness rule. The runtime's node is a loop around it (as
etcd's raft `node.go` is around `rawnode.go`), and the simulator drives the very same object.

    core = NodeCore(...)
    effects = core.start()                # take the node's identity, then recovery's first step
    effects = core.handle(event)          # every event, from the runtime or the simulator

A node first takes its identity (`TakeIdentity`): storage then refuses the coordinator-log writes
of any earlier process of the node that still runs (a pod replaced while its process lived on), so
the recovery that follows sees every one that landed, and none lands after it.

Until recovery has rebuilt every unfinished transaction, "I do not know it" is not an answer the
node may give: a coordinator would presume ABORT for a logged COMMIT, and a participant would
acknowledge a decision whose record recovery has not seen yet. Messages for unknown transactions
are dropped meanwhile; their senders repeat (decisions are resent, queries re-asked).

Partitions come and go with ownership (cornus.protocol.ownership): one taken after start gets a
recovery of its own (`add_partition`), under the same rule until it finishes; one lost is dropped
with its machines (`drop_partition`), since its next owner recovers them from its log.

Given a `SweepConfig` (the runtime's unless its sweep_interval_ms is 0), the core
also runs a Sweeper (cornus.protocol.sweeper) per recovered partition it holds and one for its own
coordinator log, started once their recovery finished and dropped with the partition; their calls
and timers are owned by `sweeper_owner(log)`, which `partition_of` maps to the partition, so the
lease gates apply to them as to the partition's host. All of them draw on one SweepBudget (the
node's storage calls for sweeping, `SweepConfig.calls_per_s_max` a second), whose timer is the
node's own (`SWEEP_BUDGET`).
"""

from __future__ import annotations

import collections
import enum
from collections.abc import Callable, Iterable

from cornus.protocol import txn_ids
from cornus.protocol.backoff import Backoff, JitterSource
from cornus.protocol.config import ProtocolConfig
from cornus.protocol.effects import Effect, RecoveryFinished, RetakeLocks, StartTimer, TakeIdentity, Timer
from cornus.protocol.events import (
    IDENTITY,
    DeleteReturned,
    Event,
    FinishedScanned,
    IdentityTaken,
    MessageReceived,
    RecordRead,
    Recovered,
    StorageUnreachable,
    TimerFired,
)
from cornus.protocol.hosts import CoordinatorFactory, CoordinatorHost, ParticipantFactory, PartitionHost, ProtocolOf
from cornus.protocol.messages import Decision, Message, Prepare, ReleaseReadOnly
from cornus.protocol.participant_base import Phase
from cornus.protocol.recovery import RECOVERY, Recovery
from cornus.protocol.sweeper import (
    SWEEP,
    SWEEP_BUDGET,
    SweepBudget,
    SweepConfig,
    Sweeper,
    sweep_age_problem,
    sweeper_owner,
)
from storage_adapters.contract import LogId, LogKind, TxnState


class ExecuteRefusal(enum.Enum):
    NOT_READY = "not_ready"  # the partition's recovery is not done
    COMMITTING = "committing"  # a machine runs the transaction here: its execution phase is over


def recovery_owner(partition: str) -> str:
    """The owner name of the recovery of a partition taken after start."""
    return f"{RECOVERY}:{partition}"


class NodeCore:
    def __init__(
        self,
        node: str,
        partitions: Iterable[str],
        coordinators: Iterable[str],
        config: ProtocolConfig,
        jitter: JitterSource,
        *,
        protocol_of: ProtocolOf = txn_ids.protocol_of,
        participant_factory: ParticipantFactory | None = None,
        coordinator_factory: CoordinatorFactory | None = None,
        sweep: SweepConfig | None = None,
    ) -> None:
        self.node = node
        self.config = config
        if sweep is not None:
            problem = sweep_age_problem(sweep, config)
            assert not problem, problem
        # None: no sweeper runs, and the core emits no ScanFinished (sweep_interval_ms 0).
        self.sweep = sweep
        partitions = tuple(partitions)
        # Hosts are addressed by name; a node named like a partition would be ambiguous.
        assert node not in partitions, f"node id {node} collides with a partition name"
        self.jitter = jitter
        self.protocol_of = protocol_of
        self.participant_factory = participant_factory
        self.coordinators = tuple(sorted(coordinators))
        self.coordinator = CoordinatorHost(node, config, jitter, protocol_of, factory=coordinator_factory)
        self.partitions = {p: self._host(p) for p in partitions}
        self.recovery = Recovery(node, partitions, self.coordinators, config, jitter, protocol_of=protocol_of)
        # Partitions whose transactions are not all rebuilt yet, and the recoveries of those taken
        # after start, by owner name.
        self._recovering: set[str] = set(partitions)
        self._partition_recoveries: dict[str, Recovery] = {}
        self._dropped: set[str] = set()
        self._identity_backoff = Backoff(config.backoff_ms_min, config.backoff_ms_max, jitter)
        self.counters: collections.Counter[str] = collections.Counter()
        # The running sweepers, by owner name, and what all of this core's sweepers counted (a
        # dropped one's counts included): records swept, skipped by reason, calls unanswered.
        self._sweepers: dict[str, Sweeper] = {}
        self.sweep_counters: collections.Counter[str] = collections.Counter()
        # Shared by all of them: the node's rate of sweeper calls. While others wait, the page
        # out is looked at again each storage deadline (its calls' own), in case its sweeper left
        # with its partition and its answers never come.
        self.sweep_budget = None if sweep is None else SweepBudget(sweep.calls_per_s_max, config.storage_deadline_ms)

    @property
    def recovered(self) -> bool:
        return self.recovery.done

    @property
    def identity_epoch(self) -> int:
        """The epoch this process holds the node's identity in; 0 until it is taken."""
        return self.coordinator.identity_epoch

    def start(self) -> list[Effect]:
        return [TakeIdentity(self.node)]

    def _take_identity(self, event: Event) -> list[Effect]:
        assert self.identity_epoch == 0, f"{type(event).__name__} for {IDENTITY} after {self.node} took it"
        if isinstance(event, TimerFired):
            assert event.timer.kind == "retry", event.timer
            return [TakeIdentity(self.node)]
        assert isinstance(event, IdentityTaken), f"{type(event).__name__} for {IDENTITY}"
        if isinstance(event.epoch, StorageUnreachable):
            # Nothing may start before it: recovery could miss a COMMIT a running earlier process
            # logs after the scan. Retried after a capped backoff, as recovery is.
            return [StartTimer(Timer(IDENTITY, "", "retry"), self._identity_backoff.next_delay_ms())]
        return self.coordinator.identity_taken(event.epoch) + self.recovery.start()

    def partition_of(self, owner: str) -> str | None:
        """The partition a host acts for: a partition's own host, the recovery of a partition
        taken after start, or the sweeper of a partition's log; None for the node's own (its
        coordinator, its start recovery, its identity's take, its coordinator log's sweeper)."""
        if owner in (self.node, RECOVERY, IDENTITY):
            return None
        if owner.startswith(RECOVERY):
            return owner[len(RECOVERY) + 1 :]
        if owner == SWEEP_BUDGET:
            return None  # the node's, whichever partitions come and go
        if owner.startswith(SWEEP):
            # sweeper_owner(log): a partition log's sweeper acts for the partition; the node's own
            # coordinator log's for the node.
            kind, _, name = owner[len(SWEEP) + 1 :].partition(".")
            return name if kind == LogKind.PARTITION.value else None
        return owner

    def host(self, name: str) -> CoordinatorHost | PartitionHost | None:
        return self.coordinator if name == self.node else self.partitions.get(name)

    def partition_recovered(self, partition: str) -> bool:
        return partition in self.partitions and partition not in self._recovering

    def execute_refusal(self, partition: str, txn: str, *, abort: bool = False) -> ExecuteRefusal | None:
        """Why a request of `txn`'s execution phase (`abort`: its early end) may not run on
        `partition` now; None if it may."""
        assert partition in self.partitions, f"{partition} is not hosted"
        if not abort and not self.partition_recovered(partition):
            return ExecuteRefusal.NOT_READY  # a recovered vote's locks may not be taken yet
        if txn in self.partitions[partition].machines:
            # Its locks are the machine's until the decision, a drop included: a coordinator asks
            # for one only before anyone voted, so one that comes now is late or wrong.
            return ExecuteRefusal.COMMITTING
        return None

    def ends_execution(self, partition: str, message: Message) -> bool:
        """Whether `message`, addressed to `partition`, ends its transaction's execution phase there:
        a prepare (or the release of a partition only read) for a transaction no machine runs yet.
        Not while the partition recovers: its machines are not all rebuilt, and a recovered one
        would be shadowed by a second, fresh from the execution."""
        return (
            isinstance(message, Prepare | ReleaseReadOnly)
            and self.partition_recovered(partition)
            and message.txn not in self.partitions[partition].machines
        )

    def add_partition(self, partition: str) -> list[Effect]:
        """This node holds `partition` now: host it, and recover its log before it answers for
        transactions it does not know."""
        assert partition not in self.partitions, f"{partition} is hosted already"
        assert partition != self.node, f"partition {partition} is named like this node"
        self.partitions[partition] = self._host(partition)
        self._recovering.add(partition)
        self._dropped.discard(partition)
        owner = recovery_owner(partition)
        recovery = Recovery(
            self.node, (partition,), self.coordinators, self.config, self.jitter,
            protocol_of=self.protocol_of, owner=owner, coordinator_records=False,
        )
        self._partition_recoveries[owner] = recovery
        return recovery.start()

    def drop_partition(self, partition: str) -> None:
        """This node no longer holds `partition`: forget its machines and its recovery. Answers and
        timers of theirs that still arrive are dropped (the runtime cancels what it can)."""
        assert partition in self.partitions, f"{partition} is not hosted"
        del self.partitions[partition]
        self._recovering.discard(partition)
        self._partition_recoveries.pop(recovery_owner(partition), None)
        sweeper = self._sweepers.pop(sweeper_owner(LogId.partition(partition)), None)
        if sweeper is not None and sweeper.budget is not None:
            sweeper.budget.leave(sweeper)
        self._dropped.add(partition)

    def handle(self, event: Event | FinishedScanned) -> list[Effect]:
        name = event.host  # a property on most events: read once, every event comes through here
        if name == IDENTITY:
            return self._take_identity(event)
        if name == RECOVERY:
            effects = self.recovery.handle(event)
            if self.recovery.done:
                effects += self._rebuild(self.recovery, self.recovery.partitions, node=True)
            return effects
        if name.startswith(RECOVERY):
            recovery = self._partition_recoveries.get(name)
            if recovery is None:
                assert name[len(RECOVERY) + 1 :] in self._dropped, f"{name} never ran"
                self.counters["events_of_dropped_partitions"] += 1
                return []
            effects = recovery.handle(event)
            if recovery.done:
                del self._partition_recoveries[name]
                effects += self._rebuild(recovery, recovery.partitions, node=False)
            return effects
        if name.startswith(SWEEP):
            return self._sweep_event(name, event)
        assert not isinstance(event, FinishedScanned), event
        host = self.coordinator if name == self.node else self.partitions.get(name)
        if host is None:
            if isinstance(event, MessageReceived):
                self.counters["misrouted_messages"] += 1
                return []
            assert name in self._dropped, f"{type(event).__name__} for unknown host {name}"
            self.counters["events_of_dropped_partitions"] += 1
            return []
        recovering = name in self._recovering if host is not self.coordinator else not self.recovered
        if isinstance(event, MessageReceived) and recovering and event.txn not in host.machines:
            self.counters["messages_dropped_recovering"] += 1
            return []
        return host.handle(event)

    def _rebuild(self, recovery: Recovery, partitions: tuple[str, ...], *, node: bool) -> list[Effect]:
        """Locks first (no request may slip in before a recovered transaction holds its keys
        again), then a machine per recovered transaction."""
        result = recovery.result
        assert result is not None
        effects: list[Effect] = [
            RetakeLocks(record.log.name, record.txn, record.body.redo) for record in result.partition_records
        ]
        for record in result.records:
            effects += self.handle(Recovered(record))
            if (record.log.name, record.txn) in result.committed:
                # Its coordinator's log holds the COMMIT: decided now, as if it had said so.
                decision = Decision(record.txn, TxnState.COMMIT)
                effects += self.handle(MessageReceived(record.body.coordinator, record.log.name, decision))
        self._recovering.difference_update(partitions)
        transactions = tuple((record.log.name, record.txn) for record in result.records)
        effects.append(RecoveryFinished(len(result.records), partitions, node, transactions))
        if self.sweep is not None:
            # Only now: until its recovery finished, a partition's host does not know which
            # transactions it still runs, and its sweeper must skip those.
            for partition in partitions:
                host = self.partitions[partition]
                effects += self._start_sweeper(LogId.partition(partition), lambda txn, host=host: (
                    txn in host.machines or txn in self.coordinator.machines))
            if node:
                effects += self._start_sweeper(LogId.coordinator(self.node), self.coordinator.machines.__contains__)
        return effects

    # -- sweepers ---------------------------------------------------------------------------------
    def _start_sweeper(self, log: LogId, runs: Callable[[str], bool]) -> list[Effect]:
        assert self.sweep is not None
        owner = sweeper_owner(log)
        assert owner not in self._sweepers, f"{owner} runs already"
        sweeper = Sweeper(owner, log, self.config, self.sweep, self.jitter, runs=runs, counters=self.sweep_counters,
                          budget=self.sweep_budget)
        self._sweepers[owner] = sweeper
        return list(sweeper.start())

    def sweeps(self, log: LogId) -> bool:
        """Whether a sweeper of `log` runs here now."""
        return sweeper_owner(log) in self._sweepers

    def sweep_backlog_records(self) -> int:
        """Records older than the sweep age that the last pass of each log this node sweeps read
        and left (Sweeper.backlog_records): what an operator watches for sweeping that falls
        behind. A dropped partition's go with it (its next holder counts them)."""
        return sum(sweeper.backlog_records for sweeper in self._sweepers.values())

    def _sweep_event(self, name: str, event: Event | FinishedScanned) -> list[Effect]:
        if name == SWEEP_BUDGET:
            assert isinstance(event, TimerFired) and self.sweep_budget is not None, event
            return list(self.sweep_budget.fired())
        sweeper = self._sweepers.get(name)
        if sweeper is None:
            # A sweeper of a partition dropped since (taken again maybe, and recovering: its own
            # starts once that recovery is done). Its answers and timers go nowhere.
            partition = self.partition_of(name)
            assert partition is not None and (partition in self._dropped or partition in self._recovering), (
                f"{type(event).__name__} for {name}, which never ran")
            self.counters["events_of_dropped_partitions"] += 1
            return []
        assert isinstance(event, FinishedScanned | RecordRead | DeleteReturned | TimerFired), event
        return list(sweeper.handle(event))

    def _host(self, partition: str) -> PartitionHost:
        return PartitionHost(partition, self.config, self.jitter, self.protocol_of, factory=self.participant_factory)

    # -- what the node reports about itself ------------------------------------------------------
    def in_doubt_count(self) -> int:
        """Transactions this node's partitions voted yes on and have no decision for yet."""
        return sum(
            machine.phase is Phase.VOTED for host in self.partitions.values() for machine in host.machines.values()
        )

    def applying_count(self) -> int:
        """Committed transactions whose redo is not in storage yet (it is retried until it is)."""
        return sum(
            machine.phase is Phase.APPLYING for host in self.partitions.values() for machine in host.machines.values()
        )
