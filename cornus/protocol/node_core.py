"""Everything one node decides, with no I/O: its coordinator host, a participant host per owned
partition, recovery at start and the readiness rule. The runtime's node is a loop around it (as
etcd's raft `node.go` is around `rawnode.go`), and the simulator drives the very same object.

    core = NodeCore(...)
    effects = core.start()                # recovery's first step
    effects = core.handle(event)          # every event, from the runtime or the simulator

Until recovery has rebuilt every unfinished transaction, "I do not know it" is not an answer the
node may give: a coordinator would presume ABORT for a logged COMMIT, and a participant would
acknowledge a decision whose record recovery has not seen yet. Messages for unknown transactions
are dropped meanwhile; their senders repeat (decisions are resent, queries re-asked).
"""

from __future__ import annotations

import collections
from collections.abc import Iterable

from cornus.protocol import txn_ids
from cornus.protocol.backoff import JitterSource
from cornus.protocol.config import ProtocolConfig
from cornus.protocol.effects import Effect, RecoveryFinished, RetakeLocks
from cornus.protocol.events import Event, MessageReceived, Recovered
from cornus.protocol.hosts import CoordinatorFactory, CoordinatorHost, ParticipantFactory, PartitionHost, ProtocolOf
from cornus.protocol.participant_base import Phase
from cornus.protocol.recovery import RECOVERY, Recovery


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
    ) -> None:
        self.node = node
        self.config = config
        partitions = tuple(partitions)
        # Hosts are addressed by name; a node named like a partition would be ambiguous.
        assert node not in partitions, f"node id {node} collides with a partition name"
        self.coordinator = CoordinatorHost(node, config, jitter, protocol_of, factory=coordinator_factory)
        self.partitions = {
            p: PartitionHost(p, config, jitter, protocol_of, factory=participant_factory) for p in partitions
        }
        self.recovery = Recovery(
            node, partitions, tuple(sorted(coordinators)), config, jitter, protocol_of=protocol_of
        )
        self.counters: collections.Counter[str] = collections.Counter()

    @property
    def recovered(self) -> bool:
        return self.recovery.done

    def start(self) -> list[Effect]:
        return self.recovery.start()

    def host(self, name: str) -> CoordinatorHost | PartitionHost | None:
        return self.coordinator if name == self.node else self.partitions.get(name)

    def handle(self, event: Event) -> list[Effect]:
        if event.host == RECOVERY:
            effects = self.recovery.handle(event)
            if self.recovery.done:
                effects += self._rebuild()
            return effects
        host = self.host(event.host)
        if host is None:
            assert isinstance(event, MessageReceived), f"{type(event).__name__} for unknown host {event.host}"
            self.counters["misrouted_messages"] += 1
            return []
        if isinstance(event, MessageReceived) and not self.recovered and event.txn not in host.machines:
            self.counters["messages_dropped_recovering"] += 1
            return []
        return host.handle(event)

    def _rebuild(self) -> list[Effect]:
        """Locks first (no request may slip in before a recovered transaction holds its keys
        again), then a machine per recovered transaction."""
        result = self.recovery.result
        assert result is not None
        effects: list[Effect] = [
            RetakeLocks(record.log.name, record.txn, record.body.redo) for record in result.partition_records
        ]
        for record in result.records:
            effects += self.handle(Recovered(record))
        effects.append(RecoveryFinished(len(result.records)))
        return effects

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
