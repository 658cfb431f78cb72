"""Sweepers in a simulated World (cornus.sim.world): the configuration a sweep schedule runs them
with, their scans, the oracle every tombstone one writes is checked against, the faults that leave
records behind for them (coordinators killed within the grace for good, coordinators cut off from
storage for long, late copies), and the check, at a sweep schedule's end, that what those left
was collected (docs/sweeper-design.md, step 6).

The oracle, at each sweeper tombstone as it lands in storage, for the transaction and the log it
collects (the sweeper's rule must make each hold, given its age and its keep):
- a COMMIT: no partition's log holds a VOTE_YES of it (that participant may still terminate, and
  read this log), and a coordinator-log transaction's coordinator record is gone, ABORT or a
  tombstone (its own collection, and recovery, read it first);
- no Cornus coordinator machine of any live process still decides it (terminating, it writes ABORT
  into empty slots; a blocking protocol's coordinator writes only its own log, fenced by its
  node's identity); this log's partition runs no participant machine of it that is undecided
  (on another process: the sweeper's own skips what its host runs), nor, for a COMMIT, does any
  partition one that does not know the outcome (it would terminate over this log); no execution
  of it on the partition, no request of it on its way there or waiting for a lock there that
  could still run and vote;
- every write of it to this log still in flight that storage will take (not one whose fence
  moved on) lands before the tombstone expires;
- the tombstone stays as long as the status call counts on a record of a transaction that voted
  (status.kept_window_ms after its begin): the sweeper cannot know whether another one stays.
A coordinator machine that holds the decision and only collects (same decision, its holder
first) is allowed: counted as `beside_collection`. An ABORT is swept whatever the other
participants hold (an emptied ABORT slot can only be filled with ABORT again).
"""

from __future__ import annotations

import collections
import random
from typing import Any

from cornus.protocol import status, txn_ids
from cornus.protocol.config import Protocol, ProtocolConfig
from cornus.protocol.coordinator_base import CoordPhase
from cornus.protocol.effects import ApplyRedo, DeleteRecord, Log, LogOnce, ScanFinished, StorageCall
from cornus.protocol.participant_base import ParticipantBase
from cornus.protocol.sweeper import SWEEP, SweepConfig, sweep_age_ms_min, tombstone_keep_ms
from cornus.sim.execution_phase import TIMEOUT_MS_EXECUTE, CarriedRequest
from cornus.sim.process import Node
from cornus.sim.schedule import CLOCK_SLACK_MS, Abandon, Schedule
from cornus.sim.steps import STEP_ABANDON, STEP_EXECUTE_PREPARED
from storage_adapters.contract import LogId, LogKind, ScanPage, TxnState

# Where a sweep schedule's storage walks finished records (Schedule.short_scans), how many of the
# sweepers' scan pages stop short.
SWEEP_SHORT_SCAN_PROBABILITY = 0.5
_UNDECIDED = frozenset({CoordPhase.VALIDATING, CoordPhase.COLLECTING})


def sweep_config_for(schedule: Schedule, config: ProtocolConfig, timeout_ms_request: int) -> SweepConfig | None:
    """What a sweep schedule's nodes sweep with: the youngest age the configuration allows, so that
    sweeps come as early as the rule lets them."""
    if not schedule.sweep_interval_ms:
        return None
    return SweepConfig(age_ms=sweep_age_ms_min(config, timeout_ms_request), interval_ms=schedule.sweep_interval_ms,
                       timeout_ms_request=timeout_ms_request, page_count_max=schedule.sweep_page_count_max,
                       pages_per_pass_max=schedule.sweep_pages_per_pass_max,
                       calls_per_s_max=schedule.sweep_calls_per_s_max)


def is_sweep_owner(owner: str) -> bool:
    return owner.startswith(SWEEP)


def _written(call: LogOnce | Log | ApplyRedo) -> str:
    return f"{type(call).__name__}({call.state.value})" if isinstance(call, LogOnce | Log) else "ApplyRedo"


class Sweeps:
    """World's methods for sweepers; they share the World's state."""

    def _init_sweeps(self, timeout_ms_request: int) -> None:
        self.sweep = sweep_config_for(self.schedule, self.config, timeout_ms_request)
        # Every draw a sweep makes (its calls' latencies, outages, late landings, short pages) and
        # the sweep schedules' faults make, from a generator of their own: a sweep schedule's other
        # draws are its base schedule's, and no other schedule draws from it.
        self._sweep_rng = random.Random(f"{self.schedule.seed}/sweeps")
        self._cores: list[Any] = []  # every core this world made, for their sweepers' counters
        # What the oracle counted (tombstones beside a coordinator's own collection, abandons the
        # world refused because something would have waited on the node for ever).
        self.sweep_stats: collections.Counter[str] = collections.Counter()
        self.sweep_counters: collections.Counter[str] = collections.Counter()
        # Writes of a transaction to a log in flight (answered or landing late), by (log, txn):
        # when each lands, what it writes, and the fence it carries (a partition or identity, and
        # its epoch; storage refuses it if that moved on). A sweeper's tombstone must outlast each
        # one storage will take.
        self._writes_out: dict[tuple[LogId, str], collections.Counter[tuple[int, str, str | None, int]]] = {}
        self.abandoned: set[str] = set()
        self._abandons = {self.txns[abandon.txn_index]: abandon for abandon in self.schedule.abandons}
        self._storage_cut_of = {cut.node: cut for cut in self.schedule.storage_cuts}
        self.tombstone_keep_ms = tombstone_keep_ms(self.config)

    def _sweeps_end_ms(self) -> int:
        """A sweep schedule runs past the last records' age and keep, and a few passes more: sweeps
        happen, their tombstones expire, and late copies arrive after both."""
        assert self.sweep is not None
        interval_ms = self.sweep.interval_ms
        return (self.liveness_check_ms + max(self.sweep.age_ms + self.tombstone_keep_ms, self.schedule.late_copy_ms)
                + 4 * (interval_ms + self._sweep_budget_round_ms()) + self.schedule.delay_ms_max)

    def _sweep_budget_round_ms(self) -> int:
        """How long a node's sweep budget may hold a pass back at most: the calls of one pass over
        every log a node may sweep (any partition, moves given, and its own coordinator log) with
        every record of the world in it (a scan page each at worst, and the last; for each record,
        a read of each other participant's record and of its coordinator's, and its tombstone),
        paid at the budget's rate."""
        assert self.sweep is not None
        records = sum(len(plan.writes) + 1 for plan in self.schedule.txns)
        participants_max = max((len(plan.writes) for plan in self.schedule.txns), default=0)
        calls = len(self.partitions) + 1 + records * (1 + participants_max + 1)
        return -(-calls * 1000 // self.sweep.calls_per_s_max)

    # -- calls ---------------------------------------------------------------------------------------
    def _track_write(self, call: StorageCall, landing_ms: int, fenced: str | None, epoch: int) -> None:
        if isinstance(call, LogOnce | Log | ApplyRedo) and not is_sweep_owner(call.owner):
            key = (landing_ms, _written(call), fenced, epoch)
            self._writes_out.setdefault((call.log, call.txn), collections.Counter())[key] += 1

    def _write_landed(self, call: StorageCall, fenced: str | None, epoch: int) -> None:
        if isinstance(call, LogOnce | Log | ApplyRedo) and not is_sweep_owner(call.owner):
            out = self._writes_out.get((call.log, call.txn))
            key = (self.now_ms, _written(call), fenced, epoch)
            if out is not None and out[key] > 0:
                out[key] -= 1
                if not out[key]:
                    del out[key]

    def _scan_finished(self, call: ScanFinished) -> ScanPage:
        page = self.storage.scan_finished(call.log, call.after, call.limit)
        if self.schedule.short_scans and self._sweep_rng.random() < SWEEP_SHORT_SCAN_PROBABILITY:
            return self.storage.stopped_short(call.log, call.after, page, self._sweep_rng)
        return page

    # -- the oracle ------------------------------------------------------------------------------------
    def _check_sweeper_write(self, call: DeleteRecord) -> None:
        """A sweeper's tombstone lands: what the module's docstring lists must hold."""
        assert call.keep is not None, f"a sweeper deleted {call.log.key}/{call.txn} without a tombstone"
        self.sweep_stats["tombstones_landed"] += 1
        txn, log, decision = call.txn, call.log, call.keep.decision
        problems: list[str] = []
        if decision is TxnState.COMMIT:
            voted = [p for p in self.partitions
                     if self.storage.state_at(LogId.partition(p), txn, self.now_ms) is TxnState.VOTE_YES]
            if voted:
                problems.append(f"{voted} still hold VOTE_YES")
            if txn_ids.protocol_of(txn) is Protocol.COORDINATOR_LOG:
                coordinator_log = LogId.coordinator(txn_ids.coordinator_of(txn))
                stored = self.storage.records.get((coordinator_log, txn))
                if stored is not None and stored.expires_at_ms is None and stored.state is not TxnState.ABORT:
                    problems.append(f"its coordinator's record in {coordinator_log.key} is a live {stored.state}")
        problems += self._still_running(txn, log, decision)
        out = self._writes_out.get((log, txn), {})
        late = sorted((landing_ms, written) for landing_ms, written, fenced, epoch in out
                      if landing_ms >= self.now_ms + call.keep.keep_ms
                      and (fenced is None or epoch >= self.epoch.get(fenced, 0)))  # else storage refuses it
        if late:
            problems.append(f"a write of it ({late[-1][1]}) lands at {late[-1][0]} ms, after the tombstone's keep of "
                            f"{call.keep.keep_ms} ms")
        begin_ms = txn_ids.begin_ms_of(txn)
        expires_ms, known_until_ms = self.now_ms + call.keep.keep_ms, begin_ms + status.kept_window_ms(self.config)
        if begin_ms and expires_ms < known_until_ms:
            problems.append(f"the tombstone expires at {expires_ms} ms, before the status call may say 'not known' "
                            f"({known_until_ms} ms)")
        if problems:
            self.outcome.violations.append(
                f"sweeper tombstone {decision} of {log.key}/{txn} at {self.now_ms} ms while {'; '.join(problems)}")

    def _still_running(self, txn: str, log: LogId, decision: TxnState) -> list[str]:
        """What of the transaction may still write it, or decide it, on any live process."""
        problems: list[str] = []
        partition = log.name if log.kind is LogKind.PARTITION else None
        cornus = txn_ids.protocol_of(txn) is Protocol.CORNUS
        for process in (*self.nodes.values(), *self.twins.values()):
            if not process.alive or process.core is None or (process.name, process.incarnation) in self.parked:
                continue
            machine = process.core.coordinator.machines.get(txn)
            if machine is not None and machine.phase not in _UNDECIDED:
                self.sweep_stats["beside_collection"] += 1
            elif machine is not None and cornus:
                problems.append(f"{process.name}'s coordinator still decides it ({machine.phase.value})")
            elif machine is not None:
                # A blocking protocol's coordinator writes only its own log (fenced by its node's
                # identity) and never a participant's: one still deciding (a process cut off from
                # storage, logging its decision or reading its identity before an ABORT) writes
                # nothing here. Its log's own sweeper skips what it runs.
                self.sweep_stats["beside_blocking_coordinator"] += 1
            for name, host in process.core.partitions.items():
                if self._lapsed(process, name) is not None:
                    continue  # its lease ended: it writes nothing more (ownership.without_lease_may)
                participant = host.machines.get(txn)
                if not isinstance(participant, ParticipantBase):
                    continue
                if name == partition and not participant.decided_durably:
                    # This log's own participant (another process's: the sweeper's own skips
                    # what its host runs) may still write it.
                    problems.append(f"{name}'s participant on {process.name} is {participant.phase.value}")
                elif decision is TxnState.COMMIT and participant.decision is None:
                    # Another participant that does not know the outcome may terminate, and read
                    # this log (one that knows it, applying, writes only its own).
                    problems.append(f"{name}'s participant on {process.name} is {participant.phase.value}")
            holds = partition is not None and partition in process.core.partitions
            if holds and self._lapsed(process, partition) is None:
                table = process.tables.get(partition)
                if table is not None and txn in table.executions:
                    problems.append(f"an execution of it on {partition} at {process.name} may still vote")
        if partition is not None:
            problems += self._requests_on_their_way(txn, partition)
        return problems

    def _requests_on_their_way(self, txn: str, partition: str) -> list[str]:
        """A one-shot's request to `partition` still travelling that its owner would run (one that
        arrives past its deadline is refused there), or one waiting for a lock there."""
        begin_ms = txn_ids.begin_ms_of(txn)
        runs_until_ms = begin_ms + TIMEOUT_MS_EXECUTE + 2 * CLOCK_SLACK_MS
        for at_ms, _, kind, data in self._queue:
            runs = not self.schedule.request_deadlines or at_ms <= runs_until_ms
            if (kind == STEP_EXECUTE_PREPARED and isinstance(data, CarriedRequest) and data.txn == txn
                    and data.partition == partition and runs):
                return [f"a request of it reaches {partition} at {at_ms} ms"]
        if any(key[2] == partition and key[3] == txn for key in self._lock_waiters):
            return [f"a request of it waits for a lock on {partition}"]
        return []

    # -- faults ----------------------------------------------------------------------------------------
    def _gc_timer_started(self, node: Node, txn: str) -> None:
        """A coordinator begins the grace before collecting `txn`: an Abandon of it kills the node
        within that grace, for good."""
        abandon = self._abandons.pop(txn, None)
        if abandon is not None and self.nodes[node.name] is node:
            after_ms = min(abandon.after_ms, self.config.gc_grace_ms - 1)
            self._push(self.now_ms + after_ms, STEP_ABANDON, (node.name, node.incarnation, abandon))

    def _abandon(self, data: tuple[str, int, Abandon]) -> None:
        name, incarnation, _ = data
        node = self.nodes[name]
        if not node.alive or node.incarnation != incarnation or node.core is None:
            return
        waits = self._would_wait_for(node)
        if waits:
            # A blocking protocol's participant would wait for this coordinator for ever: not
            # the case the sweepers are for, and the liveness check would report it.
            self.sweep_stats["abandons_refused"] += 1
            return
        if self.trace is not None:
            self.trace.append(f"{self.now_ms:6d} {name:>3} KILLED for good")
        self.sweep_stats["abandons"] += 1
        self.abandoned.add(name)
        self._unpark(lambda k: k[0] == name, None)
        node.alive = False
        node.incarnation += 1
        node.core = None
        node.reset_memory(self.lock_policy)

    def _would_wait_for(self, node: Node) -> str:
        """What would wait for `node` for ever if it died now ("" if nothing): a machine of its
        coordinator still deciding or announcing a blocking protocol's transaction, a participant
        of one anywhere whose decision only the node can give (a yes vote in a log, a machine
        undecided), or a coordinator-log redo record of its own that a participant's recovery
        would rebuild a vote from."""
        assert node.core is not None
        for txn, machine in node.core.coordinator.machines.items():
            if txn_ids.protocol_of(txn) is not Protocol.CORNUS and not machine.delivered:
                return f"its coordinator runs {txn}"
        for txn, plan in self.plans.items():
            if plan.coordinator != node.name or plan.protocol is Protocol.CORNUS:
                continue
            if self.storage.state(LogId.coordinator(node.name), txn) is TxnState.VOTE_YES:
                return f"its log holds a redo record of {txn}"
            for partition in self.partitions:
                if self.storage.state(LogId.partition(partition), txn) is TxnState.VOTE_YES:
                    return f"{partition} holds a yes vote of {txn}"
            for process in self.nodes.values():
                for host in (process.core.partitions.values() if process.core is not None else ()):
                    participant = host.machines.get(txn)
                    if isinstance(participant, ParticipantBase) and not participant.decided_durably:
                        return f"a participant of {txn} is undecided"
        return ""

    def _sweep_storage_cut_off(self, process: Node) -> bool:
        cut = self._storage_cut_of.get(process.name)
        return (cut is not None and self.nodes[process.name] is process
                and cut.start_ms <= self.now_ms < cut.end_ms)

    # -- the end ---------------------------------------------------------------------------------------
    def _sweeps_at_end(self) -> None:
        """Every sweeper's counts, and the leak check: a finished record old enough that passes of
        its log's sweeper have run since it could collect it is gone (a tombstone, or expired),
        unless the rule leaves it for a reason the record's transaction still gives."""
        assert self.sweep is not None
        for core in self._cores:
            self.sweep_counters.update(core.sweep_counters)
        old_ms = (self.end_ms - self.sweep.age_ms - 2 * CLOCK_SLACK_MS
                  - 3 * (self.sweep.interval_ms + self._sweep_budget_round_ms()) - 200)
        for (log, txn), stored in list(self.storage.records.items()):
            if stored.expires_at_ms is not None or stored.created_at_ms > old_ms:
                continue
            finished = stored.state is TxnState.ABORT or (stored.state is TxnState.COMMIT and stored.applied)
            if not finished or not self._swept_by_someone(log):
                continue
            left = self._why_left(log, txn, stored.state)
            if left:
                self.sweep_stats[f"left_{left}"] += 1
                continue
            self.outcome.violations.append(
                f"leak: {log.key}/{txn} ({stored.state}, created at {stored.created_at_ms} ms) was never collected "
                f"by {self.end_ms} ms")

    def _swept_by_someone(self, log: LogId) -> bool:
        """Whether a sweeper of `log` runs now (its holder, or its node, is up and recovered)."""
        if log.kind is LogKind.PARTITION:
            holder = self.owner_of(log.name) if log.name in self._partition_set else None
            return holder is not None and holder.ready and holder.core is not None and holder.core.sweeps(log)
        node = self.nodes.get(log.name)
        return node is not None and node.ready and log.name not in self.abandoned

    def _why_left(self, log: LogId, txn: str, state: TxnState) -> str:
        """Why the rule leaves a finished record for good ("" if it must not): a COMMIT whose
        coordinator-log coordinator's record stays (its node never came back: left for a
        `retire-node` command), or one beside another participant's yes vote or ABORT (which the
        liveness and agreement checks report)."""
        if state is not TxnState.COMMIT:
            return ""
        states = {self.storage.state(LogId.partition(p), txn) for p in self.partitions}
        if TxnState.VOTE_YES in states or TxnState.ABORT in states:
            return "beside_a_vote_or_abort"
        if txn_ids.protocol_of(txn) is Protocol.COORDINATOR_LOG:
            coordinator_log = LogId.coordinator(txn_ids.coordinator_of(txn))
            stored = self.storage.records.get((coordinator_log, txn))
            if stored is not None and stored.expires_at_ms is None and stored.state is not TxnState.ABORT:
                return "coordinator_record"
        return ""
