"""Partition moves in a simulated World (cornus.sim.world): an owner's lease ending (at once, or
noticed late: Move.lapse_ms), the gap while nobody holds the partition, the next owner's take, and
the worst moments a move may wait for (Move.after)."""

from __future__ import annotations

import zlib

from cornus.protocol.events import (
    Event,
)
from cornus.protocol.execution import PartitionExecutions
from cornus.protocol.node_core import recovery_owner
from cornus.protocol.sweeper import sweeper_owner
from cornus.sim import redo
from cornus.sim.process import Node
from cornus.sim.schedule import CLOCK_SLACK_MS, FAULTS_END_MS, Move
from cornus.sim.steps import (
    STEP_LAPSE_END,
    STEP_MOVE,
    STEP_TAKE,
)
from storage_adapters.contract import LogId, TxnState

# How often the node a partition moves to tries its take again while it is down or recovering, at
# the end of a Move's gap (the runtime's ownership tick, which runs once the node is up).
TAKE_RETRY_MS = 10


class PartitionMoves:
    """World's methods for partition moves; they share the World's state."""

    # -- partition moves -------------------------------------------------------------------------------
    def _move(self, move: Move) -> None:
        """The partition's owner lost its lease: it drops the partition (its machines, timers and
        executions; calls in flight still land, fenced ones refused once it is taken), at once or,
        with `move.lapse_ms`, once it notices (`_lapse_ends`), and the node `move.to` takes it
        (`_take`) at once or, after a gap, `move.gap_ms` later."""
        old, new = self.owner_of(move.partition), self.nodes[move.to]
        waiting = not self._moved_before(move) or (
            bool(move.after) and (old is None or not self._worst_moment(move, old)))
        if waiting and self.now_ms + 1 + move.gap_ms <= FAULTS_END_MS:
            # After the partition's earlier moves, which may have waited past this one's time, and
            # for its moment through an earlier move's gap (found by review).
            self._push(self.now_ms + 1, STEP_MOVE, move)
            return
        self._moves_done.add(move)
        if old is None:
            return  # nobody holds it (the gap of an earlier move, its take held up): no lease to lapse
        if not move.gap_ms and not new.ready:
            return  # a node that is down or recovering takes nothing
        partition = move.partition
        old.partitions = tuple(p for p in old.partitions if p != partition)
        self._unpark(lambda k: k[0] == old.name and k[2] == partition, "the partition was lost")
        if move.lapse_ms and old.alive and old.core is not None:
            old.lapsed[partition] = []
            self._push(self.now_ms + move.lapse_ms, STEP_LAPSE_END, (old.name, old.incarnation, partition))
        else:
            self._drop(old, partition)
        if move.gap_ms:
            if self.trace is not None:
                self.trace.append(f"{self.now_ms:6d} DROP {partition} by {old.name}: nobody holds it for "
                                  f"{move.gap_ms} ms")
            self.owner[partition] = None
            self._push(self.now_ms + move.gap_ms, STEP_TAKE, move)
            return
        self._take(move, old.name)

    def _tenure_table(self, node: Node, partition: str) -> PartitionExecutions[int]:
        """The execution state of `node`'s tenure of `partition` that begins now (a move's, or a
        restart's), as the runtime's Node._acquired makes it: it minds client ids begun before."""
        # At least 1 (0 minds nothing): a clock behind storage's reads below 0 in a run's first ms.
        began_ms = max(1, self.clock_ms(node.name))
        return PartitionExecutions(partition, redo, self.lock_policy, tenure_began_ms=began_ms,
                                   clock_slack_ms=CLOCK_SLACK_MS)

    def _moved_before(self, move: Move) -> bool:
        """Whether every move of the partition listed before `move` has had its turn (ran, or found
        nothing to move)."""
        earlier = self.schedule.moves[: self.schedule.moves.index(move)]
        return all(m in self._moves_done for m in earlier if m.partition == move.partition)

    def _worst_moment(self, move: Move, old: Node) -> bool:
        """Whether now is the moment a Move's `after` waits for."""
        if move.after == "vote":
            page = self.storage.scan_unfinished(LogId.partition(move.partition), "", len(self.txns) + 1)
            return any(record.state is TxnState.VOTE_YES for record in page.records)
        if move.after == "read":
            return self._slow_reads_out[move.partition] > 0
        # A moment while a scan is out, any one: the last page's answer is what finishes the
        # recovery (not drawn from `rng`, whose draws the rest of the run keeps).
        assert move.after == "scan", move
        moment = zlib.crc32(f"{self.schedule.seed}/{self.now_ms}".encode())
        return bool(old.scans_out[move.partition]) and moment % 3 == 0

    def _drop(self, node: Node, partition: str) -> None:
        """`node` drops `partition`'s host: its machines, timers and executions go; answers to its
        calls still in flight are dropped (`_tenure`)."""
        node.tables.pop(partition, None)
        node.epochs.pop(partition, None)
        node.lapsed.pop(partition, None)
        node.scans_out.pop(partition, None)
        node.tenures[partition] = node.tenures.get(partition, 0) + 1
        if node.alive and node.core is not None:
            node.core.drop_partition(partition)
            # The runtime cancels the timers of a dropped host's machines, of its recovery and of
            # its sweeper.
            owners = (partition, recovery_owner(partition), sweeper_owner(LogId.partition(partition)))
            for timer in [t for t in node.timers if t.owner in owners]:
                del node.timers[timer]

    def _lapsed(self, node: Node, host: str) -> list[tuple[Event, frozenset[tuple[int, int]]]] | None:
        """The answers held for `host` if it is the host of a partition whose lease lapsed here."""
        if not node.lapsed or node.core is None:
            return None
        partition = node.core.partition_of(host)
        return None if partition is None else node.lapsed.get(partition)

    def _lapse_ends(self, name: str, incarnation: int, partition: str) -> None:
        """The node notices the lease it lost: as a process back from a stall, it first runs what
        its host heard meanwhile (the runtime's loop runs the I/O that piled up before the
        ownership tick), which may do only what a host without a lease may; then it drops it."""
        node = self.process(name, incarnation)
        if node is None or partition not in node.lapsed:
            return
        if self.trace is not None:
            self.trace.append(f"{self.now_ms:6d} {name:>3} notices its lease on {partition} ended")
        held = node.lapsed[partition]
        while held and node.alive and node.incarnation == incarnation:
            event, path = held.pop(0)
            self._feed(node, event, path)
        if node.alive and node.incarnation == incarnation:
            self._drop(node, partition)

    def _take(self, move: Move, old: str = "nobody") -> None:
        """The node `move.to` takes the partition in a higher epoch, so that storage refuses its
        old owner's fenced writes from now on, and recovers its log before serving it; one that is
        down or recovering at the end of a gap takes it once it is ready."""
        partition, new = move.partition, self.nodes[move.to]
        if not new.ready:
            self._push(self.now_ms + TAKE_RETRY_MS, STEP_TAKE, move)
            return
        if partition in new.lapsed:
            # Its lease lapsed here and it takes the partition again: it noticed the lapse first.
            self._lapse_ends(new.name, new.incarnation, partition)
            if not new.ready:
                self._push(self.now_ms + TAKE_RETRY_MS, STEP_TAKE, move)
                return
        self.epoch[partition] += 1
        self.owner[partition] = new.name
        new.partitions = (*new.partitions, partition)
        new.tables[partition] = self._tenure_table(new, partition)
        new.epochs[partition] = self.epoch[partition]
        if self.trace is not None:
            self.trace.append(f"{self.now_ms:6d} MOVE {partition} from {old} to {new.name}")
        assert new.core is not None
        for effect in new.core.add_partition(partition):
            self._execute(new, effect)
            if not new.alive:
                return

