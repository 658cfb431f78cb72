"""Node identities in a simulated World (cornus.sim.world): the takes, checks and renewals of each
node's identity record, a second process of a coordinator (Twin) and what deposes it, the parked
process's vacancy watch, and the window that admits a node's unfenced writes."""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

from cornus.protocol import txn_ids
from cornus.protocol.config import (
    identity_window_admits,
)
from cornus.protocol.effects import (
    TAKE_IDENTITY_ROUND_COUNT_MAX,
    CheckIdentity,
    ListIdentities,
    StorageCall,
    TakeIdentity,
)
from cornus.protocol.events import (
    IdentitiesListed,
    IdentityChecked,
    IdentityTaken,
    StorageUnreachable,
    answer,
)
from cornus.protocol.identity_watch import Observed, VacancyWatch
from cornus.protocol.txn_ids import begin_ms_of
from cornus.sim.execution_phase import TIMEOUT_MS_EXECUTE
from cornus.sim.partition_moves import TAKE_RETRY_MS
from cornus.sim.process import Node
from cornus.sim.schedule import CLOCK_SLACK_MS, FAULTS_END_MS, Twin
from cornus.sim.steps import (
    STEP_CONFIRM,
    STEP_EXECUTE,
    STEP_IDENTITY_ARRIVE,
    STEP_RESEND,
    STEP_RESTART,
    STEP_RETURN,
    STEP_TWIN_END,
    STEP_WATCH,
    STEP_WATCH_LANDS,
    STEP_WATCHED,
)
from storage_adapters.contract import IDENTITY_PREFIX, identity_name, is_identity


@dataclass(slots=True)
class ParkedProcess:
    """A process a later take of its node's identity deposed: what it watches, and what it does."""

    watch: VacancyWatch
    restarts: bool  # the node's newest process: its exit on a vacancy is restarted at once
    ends_ms: int | None  # a Twin's first process: its pod is gone then, the watch with it
    identity_taken_ms: int | None = None  # when it had taken the identity, by its node's clock


class Identities:
    """World's methods for node identities; they share the World's state."""

    def _resend(self, twin: Twin) -> None:
        """The cut of a Twin's first process: the client of the one-shots it took sends them
        again, with their ids, to the second process (once that one is ready)."""
        if not self.nodes[twin.node].ready:
            # Sent now, and refused by a process still starting: "nothing ran" ends a client's
            # resends (it runs the transaction again under a new id); one in doubt is sent again.
            self._to_resend[twin.node] = [txn for txn in self._to_resend.get(twin.node, [])
                                          if not (self._lost(txn) and self._refused_as_nothing_ran(txn))]
            if self.now_ms + TAKE_RETRY_MS < twin.cut_end_ms:
                self._push(self.now_ms + TAKE_RETRY_MS, STEP_RESEND, twin)
            return
        for txn in self._to_resend.pop(twin.node, []):
            if self._lost(txn):
                self._push(self.now_ms + self.rng.randint(1, self.schedule.delay_ms_max), STEP_EXECUTE, txn)

    def _lost(self, txn: str) -> bool:
        """Whether the client of a one-shot the cut interrupted sends it again: it heard nothing (no
        reply, or, for half of them, one lost in the cut; not drawn from the RNG), and named the
        transaction, so it can send it again as it was."""
        lost = txn not in self.outcome.replies or zlib.crc32(f"{txn}/lost".encode()) % 2 == 0
        return lost and txn_ids.is_client_chosen(txn)

    def _refused_as_nothing_ran(self, txn: str) -> bool:
        """What a Twin's second process answers a one-shot under its client-chosen id that it
        refuses for its state (still starting, or full: `_refused_for_load`), as the runtime's
        Coordination.begin does: the id's checks first (a begin refused may have run, unless it is
        ahead of the clock), then the refusal; either in doubt while another process of the node
        may have run it (txn_ids.another_process_may_have_run: an earlier one, or a later one where
        this one's identity is stale). True, recorded, for "nothing ran": the invariants check that
        the transaction never commits."""
        name = self.plans[txn].coordinator
        second, now_ms, begin_ms = self.nodes[name], self.clock_ms(name), begin_ms_of(txn)
        after_ms = txn_ids.client_begins_after_ms(second.started_ms, second.identity_taken_ms, CLOCK_SLACK_MS)
        in_doubt = txn_ids.another_process_may_have_run(begin_ms, second.identity_taken_ms,
                                                        not self._identity_fresh(second), self.config)
        if txn_ids.client_begin_problem(begin_ms, now_ms, after_ms, TIMEOUT_MS_EXECUTE):
            nothing_ran = begin_ms > now_ms and not in_doubt
        else:
            nothing_ran = not in_doubt
        if nothing_ran:
            self.outcome.told_nothing_ran.setdefault(txn, self.now_ms)
        else:
            self.outcome.refused_starting_in_doubt += 1
        return nothing_ran

    def _refused_for_load(self, txn: str) -> None:
        """A proxy delivers a one-shot sent to the first process of a storage-cut Twin to the
        second one too (for half the ids; not drawn from the RNG), which refuses it for load (the
        runtime's Coordination._refuse_unserved: its transaction or write budget full): "nothing
        ran" past its predecessor's window, and its client runs the transaction again under a new
        id, so the first process must not have begun it (Twin.storage_only)."""
        second = self.nodes[self.plans[txn].coordinator]
        if second.alive and second.core is not None and zlib.crc32(f"{txn}/proxied".encode()) % 2 == 0:
            self._refused_as_nothing_ran(txn)

    def _identity_fresh(self, process: Node) -> bool:
        """txn_ids.identity_fresh_for_client_ids of `process`, now (its confirmations are on the
        world's clock, as its write window's are)."""
        return txn_ids.identity_fresh_for_client_ids(process.identity_confirmed_ms, self.now_ms, self.config)

    def _begins_client_txn(self, process: Node, txn: str) -> bool:
        """Whether `process` begins a one-shot under `txn`: as the runtime's Coordination.begin,
        not under a client-chosen id while its identity is stale (the refusal is in doubt, and the
        client asks the status call instead)."""
        if not txn_ids.is_client_chosen(txn) or self._identity_fresh(process):
            return True
        self.outcome.refused_identity_stale += 1
        return False

    def _delivered_to_deposed(self, txn: str) -> None:
        """A proxy delivers a one-shot sent to the node's newest process to a deposed one of the
        node too, still parked (for half of the client-chosen ids; not drawn from the RNG). That
        one refuses it, stopping, as the runtime's Coordination.begin does: in doubt while another
        process of the node may have run it (txn_ids.another_process_may_have_run), which, for a
        deposed one, is always; "nothing ran" otherwise, recorded for the invariants, which check
        that the transaction never commits (found by audit, 2026-11-28, second: the runtime said
        so, a 503, once past its own predecessor's window, and the SDK ran it again)."""
        if not txn_ids.is_client_chosen(txn) or zlib.crc32(f"{txn}/deposed".encode()) % 2:
            return
        name = self.plans[txn].coordinator
        begin_ms = begin_ms_of(txn)
        for (parked_name, _), parked in self.parked.items():
            if parked_name != name or (parked.ends_ms is not None and self.now_ms >= parked.ends_ms):
                continue
            if txn_ids.another_process_may_have_run(begin_ms, parked.identity_taken_ms, True, self.config):
                self.outcome.refused_deposed_in_doubt += 1
            else:
                self.outcome.told_nothing_ran.setdefault(txn, self.now_ms)

    def _accepts_again(self, txn: str) -> bool:
        """Whether the second process runs a one-shot its client sent again: as the runtime's
        check_client_txn, only while its begin is recent (the peer request timeout here) and a
        clock slack after the process took the node's identity (Coordination._check_client_txn)."""
        name = self.plans[txn].coordinator
        taken_ms = self.nodes[name].identity_taken_ms
        if taken_ms is None:
            return False
        after_ms = txn_ids.client_begins_after_ms(0, taken_ms, CLOCK_SLACK_MS)
        return not txn_ids.client_begin_problem(begin_ms_of(txn), self.clock_ms(name), after_ms, TIMEOUT_MS_EXECUTE)

    def _twin(self, twin: Twin) -> None:
        """A second process of `twin.node` starts (and recovers) while the first runs on."""
        first = self.nodes[twin.node]
        if not first.alive:
            return  # nothing runs on: the node's restart is an ordinary one
        if self.trace is not None:
            self.trace.append(f"{self.now_ms:6d} {twin.node:>3} SECOND PROCESS starts, the first runs on")
        self.twins[twin.node] = first
        second = Node(first.name, None, first.partitions, incarnation=first.incarnation + 1,
                      started_ms=self.clock_ms(first.name))
        second.reset_memory(self.lock_policy)
        self.nodes[twin.node] = second
        self._push(self.now_ms + twin.overlap_ms, STEP_TWIN_END, (twin.node, first.incarnation))
        self._twin_end_ms[twin.node] = self.now_ms + twin.overlap_ms
        self._start_core(second)

    def _twin_ends(self, name: str, incarnation: int) -> None:
        first = self.twins.get(name)
        if first is None or first.incarnation != incarnation:
            return  # it stopped already
        if self.trace is not None:
            self.trace.append(f"{self.now_ms:6d} {name:>3} FIRST PROCESS dies")
        del self.twins[name]
        first.alive = False
        first.core = None

    def _identity_legs_ms(self) -> tuple[int, int | None]:
        """How long an identity call takes to land, and then to answer (None: drawn when it
        lands, as every other call's is). In Schedule.slow_identity, half of them answer just
        before their deadline."""
        if self.schedule.slow_identity and self.rng.random() < 0.5:
            total_ms = self.deadline_ms - 1
            landing_ms = self.rng.randint(1, total_ms - 1)
            return landing_ms, total_ms - landing_ms
        return self.rng.randint(1, self.schedule.storage_ms_max), None

    def _identity_arrive(
        self, data: tuple[str, int, TakeIdentity | CheckIdentity, Any, int | None, int, int | None],
    ) -> None:
        """A read of the node's identity record lands, or a step of a take, which is what the
        runtime's is (cornus.runtime.identity.take): a read (`expected` None), then a
        compare-and-swap over what it read, a round trip later, which lands whether or not its
        process still lives and is refused if another take landed in between; then the next
        round, TAKE_IDENTITY_ROUND_COUNT_MAX at most."""
        name, incarnation, call, path, expected, round_count, answer_ms = data
        identity = identity_name(name)
        stored = self.epoch.get(identity, 0)
        result: IdentityTaken | IdentityChecked
        if isinstance(call, CheckIdentity):
            result = IdentityChecked(name, stored == call.epoch)
            if call.renew and stored == call.epoch:
                self.identity_version[identity] += 1
                self.identity_changed_ms[identity] = self.now_ms
        elif expected is None or stored != expected:
            if expected is not None and round_count >= TAKE_IDENTITY_ROUND_COUNT_MAX:
                result = IdentityTaken(StorageUnreachable(f"lost {TAKE_IDENTITY_ROUND_COUNT_MAX} races"))
            elif self.process(name, incarnation) is None and expected is not None:
                return  # a refused swap of a process that is gone: nobody takes the next round
            else:
                rounds = round_count + (expected is not None)
                # The read's answer, then the next call: one round trip, as the runtime's.
                latency, next_answer_ms = self._identity_legs_ms()
                if answer_ms is not None:
                    latency += answer_ms
                data = (name, incarnation, call, path, stored, rounds, next_answer_ms)
                self._push(self.now_ms + latency, STEP_IDENTITY_ARRIVE, data)
                return
        else:
            self.epoch[identity] = stored + 1
            self.identity_version[identity] = self.identity_version.get(identity, 0) + 1
            self.identity_changed_ms[identity] = self.now_ms
            result = IdentityTaken(stored + 1)
            process = self.process(name, incarnation)
            if process is not None:
                process.epochs[identity] = stored + 1
        if self.trace is not None:
            self.trace.append(f"{self.now_ms:6d} storage identity of {name}: {call} -> {result}")
        latency = self.rng.randint(1, self.schedule.storage_ms_max) if answer_ms is None else answer_ms
        self._push(self.now_ms + latency, STEP_RETURN, (name, incarnation, result, path, 0))

    def _depose(self, name: str, incarnation: int) -> None:
        """A process whose node's identity another process took after it: the runtime parks it (it
        acts no more), so a first process of a Twin ends here, as it would when its pod is gone.
        The newest process can be the one deposed too, when both take the identity at once and
        the older one's swap lands last: it parks, and watches the record (_watch) until the
        older one, which dies at the end of its overlap, stops renewing it; then it exits, and
        its restart takes the identity again. Its memory is lost meanwhile, as in a crash."""
        process = self.process(name, incarnation)
        if process is None:
            return
        self.outcome.deposed += 1
        if self.trace is not None:
            self.trace.append(f"{self.now_ms:6d} {name:>3} DEPOSED (incarnation {incarnation})")
        taken_ms = process.identity_taken_ms
        if self.twins.get(name) is process:
            # It acts no more; it watches the record until its pod is gone, and a vacancy it finds
            # meanwhile ends it too (its restart, by a kubelet the pod's deletion has not reached,
            # is not modelled: it would be one more process of the node, as a Twin is).
            self._twin_ends(name, incarnation)
            self._park(name, incarnation, restarts=False, ends_ms=self._twin_end_ms[name], identity_taken_ms=taken_ms)
            return
        self._unpark(lambda k: k[0] == name, None)
        process.alive = False
        process.incarnation += 1
        process.core = None
        process.reset_memory(self.lock_policy)
        self._park(name, process.incarnation, restarts=True, ends_ms=None, identity_taken_ms=taken_ms)

    def _park(self, name: str, incarnation: int, *, restarts: bool, ends_ms: int | None,
              identity_taken_ms: int | None) -> None:
        self.parked[(name, incarnation)] = ParkedProcess(VacancyWatch(self.config, self.now_ms), restarts, ends_ms,
                                                         identity_taken_ms)
        self._push(self.now_ms + self.config.identity_check_ms, STEP_WATCH, (name, incarnation))

    def _watch(self, name: str, incarnation: int) -> None:
        """A parked process sends a read of its node's identity record (_watch_lands, _watched)."""
        parked = self.parked.get((name, incarnation))
        if parked is None:
            return  # it crashed or exited meanwhile
        if parked.ends_ms is not None and self.now_ms >= parked.ends_ms:
            del self.parked[(name, incarnation)]  # its pod is gone
            return
        self._push(self.now_ms + self.config.identity_check_ms, STEP_WATCH, (name, incarnation))
        if 0 <= self.now_ms < FAULTS_END_MS and self.rng.random() < self.schedule.late_call_probability:
            unreachable = StorageUnreachable("the read outlived its deadline")
            self._push(self.now_ms + self.deadline_ms, STEP_WATCHED,
                       (name, incarnation, self.now_ms, unreachable, None))
            return
        landing_ms, answer_ms = self._identity_legs_ms()
        self._push(self.now_ms + landing_ms, STEP_WATCH_LANDS, (name, incarnation, self.now_ms, answer_ms))

    def _watch_lands(self, name: str, incarnation: int, sent_ms: int, answer_ms: int | None) -> None:
        """A parked process's read lands: storage serves it now, and its answer arrives later."""
        identity = identity_name(name)
        stored = (self.epoch[identity], self.identity_version[identity]) if identity in self.epoch else None
        # How long what it read had stood then: the watch's promise is checked against it.
        stood_ms = self.now_ms - self.identity_changed_ms.get(identity, -self.boot_ms)
        latency = self.rng.randint(1, self.schedule.storage_ms_max) if answer_ms is None else answer_ms
        self._push(self.now_ms + latency, STEP_WATCHED, (name, incarnation, sent_ms, stored, stood_ms))

    def _watched(self, name: str, incarnation: int, sent_ms: int, record: Observed, stood_ms: int | None) -> None:
        parked = self.parked.get((name, incarnation))
        if parked is None or not parked.watch.observed(sent_ms, self.now_ms, record):
            return
        # What the watch promises: the record it read last had stood unchanged for the whole wait
        # when storage served that read, by storage's own record of its changes.
        assert stood_ms is not None
        if stood_ms < self.config.identity_vacant_ms:
            self.outcome.violations.append(
                f"a parked process of {name} took its identity for vacant from a read of a record that had stood "
                f"{stood_ms} ms (the wait is {self.config.identity_vacant_ms} ms)")
        holder = self._identity_holder(name)
        # Judged for the holder of what the watch read: one whose take landed after that read (a
        # restart of the holder that had died) is no process the watch took for gone (found by
        # the explorer: mixed --twins seed 173, a false alarm).
        read_epoch = record[0] if isinstance(record, tuple) else None
        if holder is not None and holder.core is not None and holder.core.identity_epoch == read_epoch:
            failed_ms = self._identity_unreachable_ms.get((name, holder.incarnation))
            if failed_ms is None or failed_ms < self.now_ms - self.config.identity_vacant_ms - self.deadline_ms:
                self.outcome.violations.append(
                    f"a parked process of {name} took its identity for vacant while the process holding it lived "
                    f"and every renewal of its landed")
        if self.trace is not None:
            self.trace.append(f"{self.now_ms:6d} {name:>3} IDENTITY VACANT: the parked process exits")
        self.outcome.vacancy_exits += 1
        del self.parked[(name, incarnation)]
        if parked.restarts:
            self._push(self.now_ms + 1, STEP_RESTART, name)

    def _identity_holder(self, name: str) -> Node | None:
        """The live process of node `name` that holds its identity now, if one does."""
        stored = self.epoch.get(identity_name(name))
        for process in (self.nodes[name], self.twins.get(name)):
            if (process is not None and process.alive and process.core is not None
                    and process.core.identity_epoch == stored):
                return process
        return None

    def _identity_admits(self, process: Node) -> bool:
        return identity_window_admits(process.identity_confirmed_ms, self.now_ms, self.config.identity_write_window_ms)

    def _identity_confirmed(self, process: Node, left_ms: int) -> None:
        if process.identity_confirmed_ms is None or left_ms > process.identity_confirmed_ms:
            process.identity_confirmed_ms = left_ms

    def _confirm_step(self, data: tuple[str, int, StorageCall, Any, int, bool | None]) -> None:
        """The read of the identity record a write for the node waits for: it lands (`held`
        None: read now), then its answer reaches the process, which then writes (the call again,
        admitted now), stops (deposed), or hears the write unreachable (the read was)."""
        owner, incarnation, call, path, left_ms, held = data
        process = self.process(owner, incarnation)
        if process is None:
            return
        tenure = self._tenure(process, call.owner)
        if held is None:
            if self._storage_cut_off(process) or (
                    0 <= self.now_ms < FAULTS_END_MS and self.rng.random() < self.schedule.late_call_probability):
                unreachable = answer(call, StorageUnreachable("the identity read outlived its deadline"))
                self._push(left_ms + self.deadline_ms, STEP_RETURN, (owner, incarnation, unreachable, path, tenure))
                return
            identity = identity_name(owner)
            still = self.epoch.get(identity, 0) == process.epochs.get(identity)
            self._push(self.now_ms + self.rng.randint(1, self.schedule.storage_ms_max), STEP_CONFIRM,
                       (owner, incarnation, call, path, left_ms, still))
            return
        if not held:
            self._depose(owner, incarnation)
            return
        self._identity_confirmed(process, left_ms)
        self._call(owner, incarnation, call, path)

    def _cut_off(self, process: Node) -> bool:
        """Whether `process` is the first process of a cut Twin, within a cut of everything (its
        messages and replies are lost too)."""
        return self._twin_cut_off(process) and not self._twin_of[process.name].storage_only

    def _storage_cut_off(self, process: Node) -> bool:
        """Whether `process` is cut off from storage now: its storage calls go unanswered, whether
        or not its messages pass (a Twin's first process in its cut, Twin.storage_only; or a sweep
        schedule's StorageCut)."""
        return self._twin_cut_off(process) or (bool(self._storage_cut_of) and self._sweep_storage_cut_off(process))

    def _twin_cut_off(self, process: Node) -> bool:
        """Whether `process` is the first process of a cut Twin, within its cut."""
        if self.twins.get(process.name) is not process:
            return False
        twin = self._twin_of[process.name]
        return twin.cut_ms > 0 and twin.cut_start_ms <= self.now_ms < twin.cut_end_ms

    def _list_identities(self, node: Node, call: ListIdentities) -> None:
        """Which nodes ever took an identity: read as the call leaves (a node that takes one later
        starts after this recovery began, and no partition recovering here votes for it before the
        recovery ends), answered after a storage latency. A slow one answers "unreachable" at the
        deadline, and a read that lands late changes nothing."""
        tenure = self._tenure(node, call.owner)
        result: tuple[str, ...] | StorageUnreachable
        latency = self.rng.randint(1, self.schedule.storage_ms_max)
        if 0 <= self.now_ms < FAULTS_END_MS and self.rng.random() < self.schedule.late_call_probability:
            result, latency = StorageUnreachable("the listing outlived its deadline"), self.deadline_ms
        else:
            prefix = len(IDENTITY_PREFIX)
            listed = sorted(name[prefix:] for name in self.epoch if is_identity(name) and name[prefix:] > call.after)
            result = tuple(listed[: call.limit])
        self._push(self.now_ms + latency, STEP_RETURN,
                   (node.name, node.incarnation, IdentitiesListed(call, result), node.path, tenure))

