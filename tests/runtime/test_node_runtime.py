"""The node runtime in process: real `Node`s over the in-memory transport and one emulator file
(tests/runtime/faults.py), one test per concern of the split runtime: the effect loop (every
protocol commits across nodes, storage answers and timers come back as events), read-only
validation, recovery and readiness, the limits at the edge, the admin listing and manual resolve."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from cornus.protocol.config import Protocol
from cornus.protocol.coordinator_base import CoordPhase
from cornus.protocol.effects import CancelTimer, StartTimer, Timer
from cornus.protocol.participant_base import Phase
from cornus.runtime.outcome import AbortReason, Outcome, OutcomeStatus, TxnWrongState
from cornus.runtime.wire import ExecuteRequest, ExecuteStatus, Op, OpKind
from services.api.metrics import Metrics
from services.api.rest import build_app
from storage_adapters.contract import LogId, RecordBody, TxnState
from storage_adapters.errors import ValidationError
from tests.runtime.faults import (
    LocalCluster,
    commit_writes,
    gets,
    holds,
    keys_in,
    local_cluster,
    puts,
    read_through,
    records_collected,
    redo_of,
    txn_id,
    wait_until,
)

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("protocol", list(Protocol))
async def test_every_protocol_commits_across_nodes_and_collects_its_records(tmp_path, protocol):
    async with local_cluster(tmp_path, node_count=3, partition_count=3) as cluster:
        keys = keys_in(3, ["p0", "p1", "p2"])
        outcome = await commit_writes(cluster.node("n1"), {key: b"v" for key in keys.values()}, protocol)
        for key in keys.values():
            assert await read_through(cluster.node("n2"), key) == b"v"

        async def collected() -> bool:
            return (await records_collected(cluster, outcome.txn, list(keys))
                    and await cluster.coordinator_record("n1", outcome.txn) is None)

        await wait_until(collected, 10, f"the records of {outcome.txn} were never collected")
        assert not cluster.node("n1").core.coordinator.machines, "the coordinator forgets a collected transaction"


async def test_storage_answers_and_timers_come_back_as_events(tmp_path):
    """A vote write that fails is retried after the machine's backoff timer: the runner turns the
    StorageUnavailable into an event and the fired timer into another."""
    async with local_cluster(tmp_path, node_count=1, partition_count=2) as cluster:
        node = cluster.node()
        key = cluster.key_in("p0")
        cluster.faults["n0"].fail("log_once", count=2, where=lambda args: args["state"] is TxnState.VOTE_YES)
        outcome = await node.execute(puts({key: b"v"}), Protocol.CORNUS)
        assert outcome.status is OutcomeStatus.COMMITTED, outcome
        failed = cluster.faults["n0"].calls_of("log_once", outcome="failed", txn=outcome.txn)
        assert len(failed) == 2, "both injected failures were met, and retried past"
        assert node.counters["storage_unavailable"] >= 2


async def test_a_timer_restarted_replaces_the_running_one(tmp_path):
    async with local_cluster(tmp_path, node_count=1, partition_count=1) as cluster:
        runner = cluster.node().runner
        fired: list[object] = []
        runner.feed = fired.append
        timer = Timer("p0", "t", "probe")
        runner.run([StartTimer(timer, 10_000), StartTimer(timer, 1)])
        await wait_until(_async(lambda: len(fired) == 1), 2, "the restarted timer never fired")
        runner.run([StartTimer(timer, 30), CancelTimer(timer)])
        assert await holds(_async(lambda: len(fired) == 1), 0.2), "a cancelled timer fired"


@pytest.mark.parametrize("protocol", list(Protocol))
async def test_reads_on_a_partition_that_restarted_abort_the_commit(tmp_path, protocol):
    """The read-only partition confirms its read locks at commit; one that restarted since the
    read has lost them, and the transaction must abort without any participant voting."""
    async with local_cluster(tmp_path, node_count=2, partition_count=2) as cluster:
        coordinator = cluster.node("n0")
        read_key, write_key = cluster.key_in("p1"), cluster.key_in("p0")  # p1 belongs to n1
        txn = coordinator.begin(protocol)
        assert await coordinator.run_ops(txn, gets([read_key])) == [None]
        await coordinator.run_ops(txn, puts({write_key: b"w"}))
        await cluster.restart("n1")
        outcome = await coordinator.commit(txn)
        assert outcome.status is OutcomeStatus.ABORTED and outcome.reason is AbortReason.VOTED_NO, outcome
        assert "lost the read locks" in outcome.detail
        assert await cluster.record("p0", txn) is None, "nobody may vote before the reads are confirmed"
        assert await read_through(coordinator, write_key) is None
        # And with nothing restarted, the same shape commits.
        again = coordinator.begin(protocol)
        await coordinator.run_ops(again, gets([read_key]))
        await coordinator.run_ops(again, puts({write_key: b"w"}))
        assert (await coordinator.commit(again)).status is OutcomeStatus.COMMITTED


async def test_recovery_relocks_and_finishes_before_ready(tmp_path):
    """Recovery rebuilds the machine of a voted transaction with its locks, before the node
    serves; the recovered transaction then resolves (Cornus: termination finds every vote)."""
    async with local_cluster(tmp_path, node_count=1, partition_count=2) as cluster:
        keys = keys_in(2, ["p0", "p1"])
        txn = txn_id("n9", 1, Protocol.CORNUS)
        for partition, key in keys.items():
            body = RecordBody(("p0", "p1"), "n9", redo_of({key: b"recovered"}))
            await cluster.real_store.log_once(LogId.partition(partition), txn, TxnState.VOTE_YES, body)
        await cluster.restart("n0")
        node = cluster.node()
        assert node.ready and node.counters["recovered"] == 2
        for key in keys.values():
            assert await cluster.value(key) == b"recovered"
            assert await read_through(node, key) == b"recovered"


async def test_applying_is_retried_with_the_locks_held_and_listed(tmp_path):
    async with local_cluster(tmp_path, node_count=1, partition_count=1) as cluster:
        node = cluster.node()
        key = cluster.key_in("p0")
        cluster.faults["n0"].fail("apply_redo", count=None)
        outcome = await node.execute(puts({key: b"v"}))
        assert outcome.status is OutcomeStatus.COMMITTED  # Cornus replies before the apply

        async def applying() -> bool:
            return any(i.phase == Phase.APPLYING.value for i in node.transactions())

        await wait_until(applying, 5, "the stuck apply is not listed as applying")
        blocked = await node.execute(gets([key]))
        assert blocked.status is OutcomeStatus.ABORTED and blocked.reason is AbortReason.CONFLICT, blocked
        cluster.faults["n0"].heal()
        assert await read_through(node, key) == b"v"


async def test_limits_are_refused_before_anything_runs(tmp_path):
    limits = {"txn_op_count_max": 8, "op_count_max": 8, "txn_partition_count_max": 2}
    async with local_cluster(tmp_path, node_count=1, partition_count=4, limits=limits) as cluster:
        node = cluster.node()
        keys = keys_in(4, ["p0", "p1", "p2"])
        with pytest.raises(ValidationError, match="txn_partition_count_max"):
            await node.execute(puts({key: b"v" for key in keys.values()}))
        txn = node.begin()
        await node.run_ops(txn, puts({keys["p0"]: b"1"}))
        with pytest.raises(ValidationError, match="txn_op_count_max"):
            await node.run_ops(txn, [Op(OpKind.PUT, keys["p0"], b"2")] * 8)
        # Refused, and nothing changed: the transaction goes on and commits what it had.
        assert (await node.commit(txn)).status is OutcomeStatus.COMMITTED
        assert await read_through(node, keys["p0"]) == b"1"


async def test_admin_listing_and_resolve_of_a_voted_transaction(tmp_path):
    """A Cornus transaction whose coordinator vanished after the votes: listed as voted (in
    doubt) on its partition until resolved; resolve from any node finishes it by termination."""
    async with local_cluster(tmp_path, node_count=2, partition_count=2,
                             protocol_config={"timeout_ms_decision": 60_000}) as cluster:
        txn = txn_id("n9", 7, Protocol.CORNUS)
        key = cluster.key_in("p1")
        body = RecordBody(("p0", "p1"), "n9", redo_of({key: b"r"}))
        await cluster.real_store.log_once(LogId.partition("p1"), txn, TxnState.VOTE_YES, body)
        await cluster.restart("n1")  # owns p1: recovery finds the vote and terminates at once
        outcome = await cluster.node("n0").resolve(txn)
        # p0 never voted: termination (recovery's or resolve's) logs ABORT there.
        assert outcome.status is OutcomeStatus.ABORTED, outcome
        assert (await cluster.record("p0", txn)).state is TxnState.ABORT  # type: ignore[union-attr]
        listed = {i.txn for i in cluster.node("n0").transactions()}
        assert txn not in listed
        assert not [m for m in cluster.node("n0").core.coordinator.machines.values() if m.phase is CoordPhase.DECIDED]


async def test_resolve_of_an_id_that_names_no_protocol_is_refused_and_reads_nothing(tmp_path):
    """An id without a protocol's tag names no transaction any node made: resolve answered 202
    "unknown" (and `cornus resolve` exit 1, "in doubt") instead of refusing the input (found by
    review)."""
    async with local_cluster(tmp_path, partition_count=2) as cluster:
        reads: list[object] = []
        real_read = cluster.real_store.read

        async def counted(*args: object, **kwargs: object) -> object:
            reads.append(args)
            return await real_read(*args, **kwargs)  # type: ignore[arg-type]

        cluster.real_store.read = counted  # type: ignore[method-assign]
        for bad in ("abc", "1717171717171.n0.a1b2c3.1", "1717171717171.n0.a1b2c3.1.paxos"):
            with pytest.raises(ValidationError, match="names no protocol"):
                await cluster.node().resolve(bad)
        assert reads == []


def _async(check):  # type: ignore[no-untyped-def]
    async def wrapped() -> bool:
        return bool(check())

    return wrapped


@contextlib.asynccontextmanager
async def _committing_with_a_vote_held(tmp_path: Any) -> AsyncIterator[
        tuple[LocalCluster, str, asyncio.Event, asyncio.Future[Outcome]]]:
    """Two nodes; n0 coordinates a Cornus commit over p0 (its own) and p1 (n1's), whose vote's
    write n1 holds until the event is set: p0 has voted, the commit waits for p1. Longer vote and
    decision timeouts: the coordinator's own termination would otherwise finish it within a test's
    first steps (a node's start waits one vote timeout)."""
    slow = {"timeout_ms_votes": 4_000, "timeout_ms_decision": 60_000}
    async with local_cluster(tmp_path, node_count=2, partition_count=2, protocol_config=slow) as cluster:
        keys = keys_in(2, ["p0", "p1"])
        coordinator = cluster.node("n0")
        txn = coordinator.begin(Protocol.CORNUS)
        await coordinator.run_ops(txn, puts({key: b"v" for key in keys.values()}))
        vote = cluster.faults["n1"].hold(
            "log_once", where=lambda args: args["log"] == LogId.partition("p1") and args["state"] is TxnState.VOTE_YES)
        commit = asyncio.ensure_future(coordinator.commit(txn))

        async def p0_voted() -> bool:
            return await cluster.record("p0", txn) is not None

        await wait_until(p0_voted, 5, "p0 never voted")
        try:
            yield cluster, txn, vote, commit
        finally:
            vote.set()
            await asyncio.wait_for(asyncio.shield(commit), 30)


@pytest.mark.parametrize("resolver", ["n0", "n1"], ids=["at-its-coordinator", "at-another-node"])
async def test_resolve_of_a_commit_running_at_its_coordinator_is_refused_unless_forced(tmp_path, resolver):
    """Found by review: resolve is for a transaction whose coordinator is gone, and it aborted a
    healthy commit as well: with one vote in storage and the other still on its way, termination
    logs ABORT where nothing voted yet (legal, and a surprise to the client whose transaction it
    was). Refused now, with the coordinator named and nothing written; `force` aborts it, and its
    commit says so. Through the REST API (409 wrong_state, then force=true) and the node's."""
    async with _committing_with_a_vote_held(tmp_path) as (cluster, txn, vote, commit):
        with pytest.raises(TxnWrongState, match="running at its coordinator n0"):
            await cluster.node(resolver).resolve(txn)
        app = build_app(cluster.node(resolver), Metrics())
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://cornus") as client:
            refused = await client.post(f"/v1/admin/resolve/{txn}")
            assert refused.status_code == 409 and refused.json()["error"] == "wrong_state", refused.text
            assert "running at its coordinator n0" in refused.json()["detail"], refused.text
            assert await cluster.record("p1", txn) is None, "the refused resolve wrote"
            forced = await client.post(f"/v1/admin/resolve/{txn}", params={"force": "true"})
        assert forced.status_code == 409 and forced.json()["outcome"] == "aborted", forced.text
        vote.set()
        assert (await commit).status is OutcomeStatus.ABORTED


async def test_resolve_asks_the_coordinator_what_it_runs_without_waiting_on_its_storage(tmp_path):
    """Found by review: the resolve's question to the coordinator's node was the full status call,
    which reads every partition that node serves before it answers. With that node's storage
    failing (here: its reads), the question failed, the resolve took the coordinator for gone, and
    aborted its healthy commit. The question is answered from memory now."""
    async with _committing_with_a_vote_held(tmp_path) as (cluster, txn, vote, commit):
        cluster.faults["n0"].fail("read", count=None)
        with pytest.raises(TxnWrongState, match="running at its coordinator n0"):
            await cluster.node("n1").resolve(txn)
        assert await cluster.record("p1", txn) is None, "the refused resolve wrote"
        cluster.faults["n0"].heal()
        vote.set()
        assert (await commit).status is OutcomeStatus.COMMITTED


async def test_resolve_of_a_transaction_whose_decision_is_logged_reads_it_even_while_its_coordinator_runs(tmp_path):
    """Found by review: the refusal came before the reads, so a resolve that would only have read
    a decision (here a terminator's ABORT in p1's log, while the coordinator still waits for p1's
    vote) was refused. The question is asked before the first write now."""
    async with _committing_with_a_vote_held(tmp_path) as (cluster, txn, vote, commit):
        body = (await cluster.record("p0", txn)).body  # type: ignore[union-attr]
        await cluster.real_store.log_once(LogId.partition("p1"), txn, TxnState.ABORT, body)
        resolved = await cluster.node("n1").resolve(txn)
        assert resolved.status is OutcomeStatus.ABORTED, resolved
        vote.set()
        assert (await commit).status is OutcomeStatus.ABORTED


async def test_a_request_past_its_deadline_for_a_transaction_committing_here_is_no_refusal(tmp_path):
    """Found by review: an owner checked a request's deadline before whether its machine already
    runs the transaction, and answered a late request of a committing transaction UNAVAILABLE,
    which its coordinator takes for a refusal (the owner never votes) where its vote stands; the
    simulator answers it as committing (ABORTED: no refusal), as owner_answer.refuses has it."""
    async with _committing_with_a_vote_held(tmp_path) as (cluster, txn, vote, commit):
        key = keys_in(2, ["p0"])["p0"]
        late = ExecuteRequest(txn, "p0", "n0", (Op(OpKind.GET, key),), deadline_unix_ms=1)
        answer = await cluster.node("n0").on_request("n0", late)
        assert answer.status is ExecuteStatus.ABORTED, answer
        vote.set()
        assert (await commit).status is OutcomeStatus.COMMITTED
