"""A machine's timers count the time its process was suspended, before it hears any storage
answer that came after the suspend.

Found by audit (2026-11-27): timers ran on the event loop's clock, which stops while a machine is
suspended (a kernel suspend or hibernation: what moves CLOCK_BOOTTIME ahead of CLOCK_MONOTONIC).
A coordinator-log coordinator suspended with its redo write in its socket buffer heard the write
answered on resume, its 200 ms redo window (REDO_DURABLE_MS_MAX) not yet run out on that clock,
and committed: but the redo landed long after the window in real time, possibly after a
recovering node's scan, which rebuilt the partition without the vote it holds.
"""

from __future__ import annotations

import asyncio

import pytest

from cornus.protocol.config import REDO_DURABLE_MS_MAX, Protocol
from cornus.protocol.coordinator_base import CoordPhase
from cornus.protocol.effects import Timer
from cornus.runtime import clocks
from cornus.runtime.outcome import OutcomeStatus
from cornus.runtime.wire import Op, OpKind
from storage_adapters.contract import LogId, TxnState
from tests.runtime.faults import local_cluster

pytestmark = pytest.mark.timeout(60)

# Past the redo window. Only the runner's suspend watch sees it (clocks.boot_ns, moved below):
# ownership and identity read the clock through the names they imported.
SUSPEND_MS = 600
# Polls for what the test waits on: 2 s at most, well short of the 5 s grace the suspend cuts.
POLL_S = 0.01
POLL_COUNT_MAX = 200
# Transactions tried until one's redo window is still open when the suspend comes.
ATTEMPT_COUNT_MAX = 3


async def test_a_redo_answered_after_a_suspend_past_its_window_does_not_commit(tmp_path, monkeypatch):
    assert REDO_DURABLE_MS_MAX < SUSPEND_MS
    async with local_cluster(tmp_path, node_count=1, partition_count=2, protocol=Protocol.COORDINATOR_LOG,
                             protocol_config={"timeout_ms_votes": 5_000}) as cluster:
        node, faults = cluster.node("n0"), cluster.faults["n0"]
        redo_log = LogId.coordinator("n0")
        machines = node.core.coordinator.machines
        for attempt in range(ATTEMPT_COUNT_MAX):
            gate = faults.hold("log", where=lambda a: a["log"] == redo_log and a["state"] is TxnState.VOTE_YES)
            ops = [Op(OpKind.PUT, cluster.key_in("p0", f"a{attempt}"), b"1"),
                   Op(OpKind.PUT, cluster.key_in("p1", f"b{attempt}"), b"2")]
            executing = asyncio.create_task(node.execute(ops))
            for _ in range(POLL_COUNT_MAX):  # both votes in, the redo write held in flight
                if any(len(machine.votes_yes) == 2 for machine in machines.values()):
                    break
                await asyncio.sleep(POLL_S)
            txn = next(txn for txn, machine in machines.items() if len(machine.votes_yes) == 2)
            if Timer("n0", txn, "redo-window") in node.runner.timers:
                break  # its window still open on the loop's clock: what the test needs
            # A machine this slow let the window run out on its own: nothing to show with it.
            faults.heal("log")
            await executing
        else:
            pytest.fail(f"the redo window ran out before the suspend in {ATTEMPT_COUNT_MAX} attempts")
        # The machine is suspended: the boot clock runs on, the loop's does not.
        real_boot_ns = clocks.boot_ns
        monkeypatch.setattr(clocks, "boot_ns", lambda: real_boot_ns() + SUSPEND_MS * 1_000_000)
        gate.set()  # resumed: the write lands and is answered
        outcome = await executing
        assert outcome.status is OutcomeStatus.ABORTED, outcome
        assert "not durable" in outcome.detail, outcome


async def test_after_a_suspend_the_timers_run_earlier_by_its_length_and_transactions_go_on(tmp_path, monkeypatch):
    """A suspend while a transaction waits out its collection's grace: the grace counts it (the
    records go a suspend's length sooner on the loop's clock), and the node goes on committing."""
    async with local_cluster(tmp_path, node_count=1, partition_count=2,
                             protocol_config={"gc_grace_ms": 5_000}) as cluster:
        node = cluster.node("n0")
        ops = [Op(OpKind.PUT, cluster.key_in("p0"), b"1"), Op(OpKind.PUT, cluster.key_in("p1"), b"2")]
        committed = await node.execute(ops)
        assert committed.status is OutcomeStatus.COMMITTED, committed
        machines = node.core.coordinator.machines
        for _ in range(POLL_COUNT_MAX):  # the decision delivered and acknowledged: its grace began
            if machines[committed.txn].phase is CoordPhase.GC_WAIT:
                break
            await asyncio.sleep(POLL_S)
        assert machines[committed.txn].phase is CoordPhase.GC_WAIT
        assert await cluster.record("p1", committed.txn) is not None  # its grace is 5 s
        real_boot_ns = clocks.boot_ns
        monkeypatch.setattr(clocks, "boot_ns", lambda: real_boot_ns() + 5_000_000_000)  # a 5 s suspend
        after = await node.execute([Op(OpKind.PUT, cluster.key_in("p0"), b"3")])
        assert after.status is OutcomeStatus.COMMITTED, after
        assert node.counters["suspends_caught_up"] == 1
        for _ in range(POLL_COUNT_MAX):  # collected at once, not 5 s of the loop's clock from now
            if await cluster.record("p1", committed.txn) is None:
                break
            await asyncio.sleep(POLL_S)
        assert await cluster.record("p1", committed.txn) is None
