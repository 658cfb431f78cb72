"""One-shot transactions whose requests carry the prepare (CommitRequested.prepare_sent): real
`Node`s over the in-memory transport and one emulator file. The protocol side of these rules is
explored by the simulator (cornus/sim/world.py, one-shot plans); these check the runtime does what
the core says: no separate Prepare on the wire, a refusal aborts at once with its reason, a request
that got no answer ends through termination, and an ABORT that overtook the request refuses it."""

from __future__ import annotations

import asyncio
import secrets
import time
from types import SimpleNamespace

import pytest

from cornus.protocol import redo_bundle
from cornus.protocol.config import Protocol
from cornus.protocol.effects import ApplyRedo
from cornus.protocol.locks import Policy
from cornus.protocol.messages import Decision, Prepare, ReleaseReadOnly
from cornus.protocol.txn_ids import client_txn_id, new_txn_id
from cornus.runtime import coordination
from cornus.runtime import redo as redo_codec
from cornus.runtime.local_transport import LocalTransport
from cornus.runtime.node import Node
from cornus.runtime.outcome import AbortReason, OutcomeStatus
from cornus.runtime.transport import PeerUnavailable
from cornus.runtime.wire import ExecuteRequest, ExecuteStatus, Op, OpKind, Routed
from storage_adapters.contract import REDO_BYTES_MAX, LogId, TxnState
from storage_adapters.errors import StorageUnavailable
from tests.runtime.faults import (
    Call,
    FaultyStore,
    LocalCluster,
    gets,
    keys_in,
    local_cluster,
    puts,
    read_through,
    txn_id,
    wait_until,
)

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("protocol", list(Protocol))
async def test_each_partition_gets_one_request_that_carries_its_prepare(tmp_path, monkeypatch, protocol):
    sent: list[object] = []
    requests: list[ExecuteRequest] = []
    real_send, real_request = LocalTransport.send, LocalTransport.request

    def send(self: LocalTransport, to_node: str, message: Routed, may_wait: bool = False) -> None:
        sent.append(message.message)
        real_send(self, to_node, message, may_wait)

    async def request(self: LocalTransport, to_node: str, request: ExecuteRequest, timeout_ms: int) -> object:
        requests.append(request)
        return await real_request(self, to_node, request, timeout_ms)

    monkeypatch.setattr(LocalTransport, "send", send)
    monkeypatch.setattr(LocalTransport, "request", request)
    async with local_cluster(tmp_path, node_count=3, partition_count=3) as cluster:
        keys = keys_in(3, ["p0", "p1", "p2"])
        node = cluster.node("n1")
        first = await node.execute(puts({key: b"old" for key in keys.values()}), protocol)
        assert first.status is OutcomeStatus.COMMITTED, first
        requests.clear()
        sent.clear()
        ops = [*gets(list(keys.values())), *puts({key: b"new" for key in keys.values()})]
        outcome = await node.execute(ops, protocol)
        assert outcome.status is OutcomeStatus.COMMITTED, outcome
        assert outcome.reads == tuple((key, b"old") for key in keys.values())
        assert sorted(r.partition for r in requests) == ["p0", "p1", "p2"]
        assert all(r.participants == ("p0", "p1", "p2") for r in requests), requests
        assert not [m for m in sent if isinstance(m, Prepare)], "a prepare went out beside the requests"
        for key in keys.values():
            assert await read_through(cluster.node("n0"), key) == b"new"


@pytest.mark.parametrize("protocol", list(Protocol))
async def test_a_partition_a_one_shot_only_reads_votes_with_the_others(tmp_path, monkeypatch, protocol):
    """Paper 3.5: it votes in parallel with the partitions that write, instead of confirming its
    read locks in a round trip of its own before anyone may vote; its redo names the key it read,
    so a restart of its owner locks it again (the next test)."""
    sent: list[object] = []
    requests: list[ExecuteRequest] = []
    real_send, real_request = LocalTransport.send, LocalTransport.request

    def send(self: LocalTransport, to_node: str, message: Routed, may_wait: bool = False) -> None:
        sent.append(message.message)
        real_send(self, to_node, message, may_wait)

    async def request(self: LocalTransport, to_node: str, request: ExecuteRequest, timeout_ms: int) -> object:
        requests.append(request)
        return await real_request(self, to_node, request, timeout_ms)

    monkeypatch.setattr(LocalTransport, "send", send)
    monkeypatch.setattr(LocalTransport, "request", request)
    async with local_cluster(tmp_path, node_count=2, partition_count=2) as cluster:
        keys = keys_in(2, ["p0", "p1"])
        first = await cluster.node().execute(puts({keys["p0"]: b"old"}), protocol)
        assert first.status is OutcomeStatus.COMMITTED, first
        requests.clear()
        sent.clear()
        outcome = await cluster.node().execute([Op(OpKind.GET, keys["p0"]), Op(OpKind.PUT, keys["p1"], b"v")],
                                               protocol)
        assert outcome.status is OutcomeStatus.COMMITTED, outcome
        assert outcome.reads == ((keys["p0"], b"old"),)
        assert sorted(r.partition for r in requests) == ["p0", "p1"]
        assert all(r.participants == ("p0", "p1") for r in requests), requests
        assert not [m for m in sent if isinstance(m, Prepare | ReleaseReadOnly)], sent
        # The read partition's redo names its key, read only; committing it applies nothing.
        owner = cluster.faults[cluster.owner_of("p0")]
        await wait_until(lambda: _applied(owner, "p0", outcome.txn), 5, "p0 never applied its (empty) redo")
        [applied] = await _applied(owner, "p0", outcome.txn)
        assert applied.args["writes"] == {}
        if protocol is Protocol.COORDINATOR_LOG:
            logged = cluster.faults["n0"].calls_of("log", txn=outcome.txn, log=LogId.coordinator("n0"))
            bundles = [redo_bundle.decode(c.args["body"].redo) for c in logged if c.args["body"] is not None]
            assert [redo_codec.lock_keys(b["p0"]) for b in bundles if "p0" in b] == [([], [keys["p0"]])]
        else:
            votes = [c for c in owner.calls_of("log_once" if protocol is Protocol.CORNUS else "log", txn=outcome.txn)
                     if c.args["state"] is TxnState.VOTE_YES]
            assert [redo_codec.lock_keys(c.args["body"].redo) for c in votes] == [([], [keys["p0"]])], votes
        assert await read_through(cluster.node("n1"), keys["p1"]) == b"v"


async def _applied(store: FaultyStore, partition: str, txn: str) -> list[Call]:
    return [c for c in store.calls_of("apply_redo", "ok", txn=txn) if c.args["partition"] == partition]


async def test_a_restart_after_a_one_shot_vote_locks_what_it_read_again(tmp_path):
    """A one-shot's partition votes before the transaction took its last lock elsewhere, so the
    keys it only read must stay locked until the decision, across a restart of its owner too:
    else another transaction could overwrite what it read, commit, and be seen by the rest of
    the one-shot, which would then commit as if it ran before that transaction."""
    async with local_cluster(tmp_path, node_count=2, partition_count=2) as cluster:
        keys = keys_in(2, ["p0", "p1"])
        reader, writer = cluster.owner_of("p0"), cluster.owner_of("p1")
        first = await cluster.node(writer).execute(puts({keys["p0"]: b"old"}))
        assert first.status is OutcomeStatus.COMMITTED, first
        # Nothing can decide the one-shot while every write to p1's log waits: not p1's vote, not
        # a termination's ABORT, from either node.
        gates = [cluster.faults[node].hold("log_once", where=lambda args: args["log"] == LogId.partition("p1"))
                 for node in cluster.node_ids]
        one_shot = asyncio.ensure_future(
            cluster.node(writer).execute([Op(OpKind.GET, keys["p0"]), Op(OpKind.PUT, keys["p1"], b"v")])
        )

        async def voted() -> bool:
            calls = cluster.faults[reader].calls_of("log_once", "ok")
            return any(c.args["log"] == LogId.partition("p0") and c.args["state"] is TxnState.VOTE_YES
                       and c.args["txn"] != first.txn for c in calls)

        await wait_until(voted, 5, "p0 never voted")
        await cluster.restart(reader)
        blocked = await cluster.node(reader).execute(puts({keys["p0"]: b"overwritten"}))
        assert blocked.status is OutcomeStatus.ABORTED, blocked
        assert await cluster.value(keys["p0"]) == b"old"
        shared = await cluster.node(reader).execute(gets([keys["p0"]]))
        assert shared.status is OutcomeStatus.COMMITTED and shared.reads == ((keys["p0"], b"old"),), shared
        for gate in gates:
            gate.set()
        outcome = await one_shot
        # p1's vote and a termination's ABORT were both waiting: either may land first.
        assert outcome.status in (OutcomeStatus.COMMITTED, OutcomeStatus.ABORTED), outcome

        async def overwritten() -> bool:
            later = await cluster.node(reader).execute(puts({keys["p0"]: b"later"}))
            return later.status is OutcomeStatus.COMMITTED

        await wait_until(overwritten, 5, "p0's key stayed locked after the decision")


async def test_a_one_shot_s_requests_leave_before_its_machine_runs(tmp_path, monkeypatch):
    """The coordinator machine's CommitRequested step must not sit on the requests' round trips:
    they are flushed first, in the same step, so the machine still exists before any answer."""
    order: list[str] = []
    real_flush = LocalTransport.flush

    def flush(self: LocalTransport) -> None:
        order.append("flush")
        real_flush(self)

    monkeypatch.setattr(LocalTransport, "flush", flush)
    async with local_cluster(tmp_path, node_count=2, partition_count=2) as cluster:
        keys = keys_in(2, ["p0", "p1"])
        node = cluster.node("n0")
        real_feed = node.coordination.feed

        def feed(event: object) -> None:
            order.append(type(event).__name__)
            real_feed(event)

        node.coordination.feed = feed
        outcome = await node.execute(puts({keys["p0"]: b"a", keys["p1"]: b"b"}), Protocol.CORNUS)
        assert outcome.status is OutcomeStatus.COMMITTED, outcome
        assert order[:2] == ["flush", "CommitRequested"], order


@pytest.mark.parametrize("protocol", list(Protocol))
async def test_a_partition_nobody_holds_aborts_a_one_shot_once_its_machine_exists(tmp_path, protocol):
    """A request that fails before it is sent (no owner known) is answered within the step that
    sends the others, before the machine is fed: its failure must reach the machine after that."""
    # A long vote timeout, so that an abort decided by waiting it out cannot pass for one decided
    # from the failure.
    votes_ms = 2_000
    timers = {"timeout_ms_votes": votes_ms, "timeout_ms_prepare": votes_ms}
    async with local_cluster(tmp_path, node_count=2, partition_count=2, protocol_config=timers) as cluster:
        keys = keys_in(2, ["p0", "p1"])
        node = cluster.node("n0")
        owner_of = node.coordination.owner_of
        node.coordination.owner_of = lambda partition: None if partition == "p1" else owner_of(partition)
        started = asyncio.get_running_loop().time()
        outcome = await node.execute(puts({keys["p0"]: b"a", keys["p1"]: b"b"}), protocol)
        elapsed_ms = (asyncio.get_running_loop().time() - started) * 1000
        assert outcome.status is OutcomeStatus.ABORTED and outcome.reason is AbortReason.PEER_UNAVAILABLE, outcome
        assert "no node holds p1" in outcome.detail
        assert not node.timings.terminations_ms
        assert elapsed_ms < votes_ms / 2, elapsed_ms
        node.coordination.owner_of = owner_of
        again = await node.execute(puts({keys["p0"]: b"a2", keys["p1"]: b"b2"}), protocol)
        assert again.status is OutcomeStatus.COMMITTED, again


@pytest.mark.parametrize("protocol", list(Protocol))
async def test_a_refusal_aborts_at_once_with_its_reason(tmp_path, protocol):
    async with local_cluster(tmp_path, node_count=2, partition_count=2) as cluster:
        keys = keys_in(2, ["p0", "p1"])
        holder = cluster.node("n1")
        blocking = holder.begin(Protocol.CORNUS)
        await holder.run_ops(blocking, puts({keys["p1"]: b"held"}))  # p1's key is locked (NO_WAIT)
        node = cluster.node("n0")
        outcome = await node.execute(puts({keys["p0"]: b"a", keys["p1"]: b"b"}), protocol)
        assert outcome.status is OutcomeStatus.ABORTED and outcome.reason is AbortReason.CONFLICT, outcome
        assert outcome.retryable
        # Decided from the refusal: no termination was needed, and p0 let its lock go.
        assert not node.timings.terminations_ms
        await holder.abort(blocking)
        again = await node.execute(puts({keys["p0"]: b"a2", keys["p1"]: b"b2"}), protocol)
        assert again.status is OutcomeStatus.COMMITTED, again
        p1_record = await cluster.record("p1", outcome.txn)
        assert p1_record is None or p1_record.state is TxnState.ABORT


async def test_a_request_that_got_no_answer_ends_through_the_logs(tmp_path):
    """The owner of p1 is unreachable: it may have voted, so Cornus asks p1's log at once
    (LogOnce(ABORT)) instead of waiting for the vote timeout."""
    async with local_cluster(tmp_path, node_count=2, partition_count=2) as cluster:
        keys = keys_in(2, ["p0", "p1"])
        node = cluster.node("n0")
        cluster.network.down.add("n1")
        outcome = await node.execute(puts({keys["p0"]: b"a", keys["p1"]: b"b"}), Protocol.CORNUS)
        assert outcome.status is OutcomeStatus.ABORTED, outcome
        assert node.timings.terminations_ms, "the coordinator terminated"
        record = await cluster.record("p1", outcome.txn)
        assert record is not None and record.state is TxnState.ABORT


async def test_an_abort_that_overtook_the_request_refuses_it(tmp_path):
    """The coordinator aborted (another partition refused) and its ABORT reached p1 before p1 ran
    the request that carries p1's prepare: p1 acknowledged an ABORT it knew nothing of, which lets
    the coordinator collect the records, so the request must not run and vote after it."""
    async with local_cluster(tmp_path, node_count=2, partition_count=2) as cluster:
        keys = keys_in(2, ["p0", "p1"])
        owner = cluster.node(cluster.owner_of("p1"))
        txn = txn_id("n0", 1, Protocol.CORNUS)
        owner.on_message("n0", Routed("n0", "p1", Decision(txn, TxnState.ABORT)))
        request = ExecuteRequest(txn, "p1", "n0", tuple(puts({keys["p1"]: b"late"})), participants=("p0", "p1"))
        response = await owner.on_request("n0", request)
        assert response.status is ExecuteStatus.ABORTED, response
        assert txn not in owner.core.partitions["p1"].machines
        assert await cluster.record("p1", txn) is None, "the refused request logged a vote"
        # The key is free again: nothing of the refused request holds it.
        outcome = await owner.execute(puts({keys["p1"]: b"next"}))
        assert outcome.status is OutcomeStatus.COMMITTED, outcome


async def test_a_malformed_carried_prepare_is_refused_and_changes_nothing(tmp_path):
    async with local_cluster(tmp_path, node_count=1, partition_count=2) as cluster:
        node = cluster.node()
        key = keys_in(2, ["p0"])["p0"]
        for counter, participants in enumerate((("p1",), ("p1", "p0"), ("p0", "p0"))):
            txn = txn_id("n0", counter + 1, Protocol.CORNUS)
            request = ExecuteRequest(txn, "p0", "n0", tuple(puts({key: b"x"})), participants=participants)
            response = await node.on_request("n0", request)
            assert response.status is ExecuteStatus.INVALID, (participants, response)
            assert txn not in node.core.partitions["p0"].machines
        outcome = await node.execute(puts({key: b"y"}))
        assert outcome.status is OutcomeStatus.COMMITTED, outcome


async def test_a_commit_whose_answer_was_lost_sends_the_caller_to_the_status_call(tmp_path, monkeypatch):
    """p1 ran its request and voted yes, but its answer (with what it read) was lost: the
    transaction commits (p1's vote reaches the coordinator, or its termination finds the vote in
    p1's log). The caller must not be handed
    values nobody read: it hears "unknown" and is sent to the status call, which says committed."""
    real_request = LocalTransport.request
    clusters: list[LocalCluster] = []

    async def lose_p1_answer(self: LocalTransport, to_node: str, request: ExecuteRequest, timeout_ms: int) -> object:
        response = await real_request(self, to_node, request, timeout_ms)
        if isinstance(request, ExecuteRequest) and request.partition == "p1" and request.participants:
            # Lost only once p1's vote is durable, so the coordinator's termination finds it
            # (before that, its LogOnce(ABORT) could win and abort, which is also correct).
            async def voted() -> bool:
                return await clusters[0].record("p1", request.txn) is not None

            await wait_until(voted, 10, "p1 never logged its vote")
            raise PeerUnavailable("the answer was lost")
        return response

    monkeypatch.setattr(LocalTransport, "request", lose_p1_answer)
    async with local_cluster(tmp_path, node_count=2, partition_count=2) as cluster:
        clusters.append(cluster)
        keys = keys_in(2, ["p0", "p1"])
        node = cluster.node("n0")
        outcome = await node.execute([*puts({keys["p0"]: b"a", keys["p1"]: b"b"}), *gets([keys["p1"]])])
        assert outcome.status is OutcomeStatus.UNKNOWN and not outcome.reads, outcome
        assert "committed" in outcome.detail and "p1" in outcome.detail, outcome.detail
        status = node.status(outcome.txn)
        assert status is not None and status.status is OutcomeStatus.COMMITTED, status
        assert await read_through(cluster.node("n1"), keys["p1"]) == b"b"


async def test_an_apply_of_a_partition_dropped_before_it_left_is_not_sent(tmp_path):
    """The lease still held when the apply was started, but the partition's runtime was dropped
    before the write left (the node stopping, a lease lost): it counts as a write not sent, which
    a dropped write's bookkeeping ignores. It was a KeyError, which the runtime took as fatal."""
    async with local_cluster(tmp_path, node_count=1, partition_count=1) as cluster:
        node = cluster.node()
        fence = node.ownership.fence("p0")
        assert fence is not None
        runtime = node.partitions.pop("p0")
        try:
            with pytest.raises(StorageUnavailable, match="dropped before its apply"):
                await node.runner._apply(ApplyRedo("p0", "p0", txn_id("n0", 1, Protocol.CORNUS), b""), fence)
        finally:
            node.partitions["p0"] = runtime


async def test_a_one_shot_request_cancelled_at_shutdown_is_not_a_fatal_error(monkeypatch):
    """A one-shot that aborted early leaves its other requests running; when the process then
    stops, the event loop cancels them. That is shutdown, not a failed request: it must not end
    the process with exit 70 (it did, through the requests' done callback). A real failure still
    is fatal, and a peer that did not answer is an answer (UNAVAILABLE, not a refusal)."""
    fatal_messages: list[str] = []
    monkeypatch.setattr(coordination, "fatal", fatal_messages.append)
    loop = asyncio.get_running_loop()
    started: list[asyncio.Future[object]] = []

    def start_request(to_node: str, request: object, timeout_ms: int) -> asyncio.Future[object]:
        started.append(loop.create_future())
        return started[-1]

    limits = SimpleNamespace(timeout_ms_peer_request=1_000)
    node = SimpleNamespace(owner_of=lambda partition: "n1", transport=SimpleNamespace(start_request=start_request),
                           config=SimpleNamespace(limits=limits))
    answers: list[tuple[str, ExecuteStatus, bool]] = []

    def answered(partition: str, response: object, refused: bool) -> None:
        answers.append((partition, response.status, refused))  # type: ignore[attr-defined]

    request = ExecuteRequest("t1", "p1", "n0", ())
    for _ in range(3):
        coordination.Coordination._start_prepared(node, request, answered)  # type: ignore[arg-type]
    cancelled, failed, unanswered = started
    cancelled.cancel()
    failed.set_exception(RuntimeError("boom"))
    unanswered.set_exception(PeerUnavailable("no response within 1000 ms"))
    await asyncio.sleep(0)  # the done callbacks run
    assert fatal_messages == ["a one-shot's request failed: RuntimeError('boom')"], fatal_messages
    assert answers == [("p1", ExecuteStatus.UNAVAILABLE, False)], answers


async def test_a_committed_one_shot_whose_request_was_cancelled_unanswered_still_answers(tmp_path):
    """After the COMMIT decision the coordinator waits for every owner's answer (the values it
    read). A request whose future was cancelled instead of answered (the transport closing) is
    never answered, and that wait had no bound of its own (found by review): it is bounded by the
    requests' deadline now, and the missing answer counts as lost (UNKNOWN, "committed, but")."""
    async with local_cluster(tmp_path, node_count=2, partition_count=2) as cluster:
        node = cluster.node("n0")
        keys = keys_in(2, ["p0", "p1"])
        transport = node.coordination.transport
        real_start = transport.start_request

        def start_request(to_node: str, request: ExecuteRequest, timeout_ms: int) -> asyncio.Future[object]:
            sent = real_start(to_node, request, timeout_ms)
            if request.partition != "p1":
                return sent
            cancelled: asyncio.Future[object] = asyncio.get_running_loop().create_future()
            cancelled.cancel()  # sent, and it runs and votes there; its answer never comes here
            return cancelled

        transport.start_request = start_request  # type: ignore[method-assign]
        bound_s = node.config.limits.timeout_ms_peer_request / 1000 + 5
        async with asyncio.timeout(bound_s):
            outcome = await node.execute(puts({keys["p0"]: b"a", keys["p1"]: b"b"}))
        assert outcome.status is OutcomeStatus.UNKNOWN and "committed, but" in outcome.detail, outcome


async def test_a_one_shot_whose_reads_would_outgrow_the_record_runs_in_two_steps(tmp_path, monkeypatch):
    """Its writes fit a record, but not with the keys it only read, which a one-shot's vote names:
    it runs its operations first and commits after (where a vote names no read), not refused."""
    requests: list[ExecuteRequest] = []
    real_request = LocalTransport.request

    async def request(self: LocalTransport, to_node: str, request: ExecuteRequest, timeout_ms: int) -> object:
        requests.append(request)
        return await real_request(self, to_node, request, timeout_ms)

    monkeypatch.setattr(LocalTransport, "request", request)
    async with local_cluster(tmp_path, node_count=1, partition_count=1) as cluster:
        written = {f"w{index}": b"x" * 60_000 for index in range(2)}
        read = [f"r{index:03d}" + "k" * 400 for index in range(30)]
        assert redo_codec.encoded_size(written) <= REDO_BYTES_MAX < len(redo_codec.encode(written, read))
        outcome = await cluster.node().execute([*gets(read), *puts(written)])
        assert outcome.status is OutcomeStatus.COMMITTED, outcome
        assert outcome.reads == tuple((key, None) for key in read)
        assert requests and not any(r.participants for r in requests), requests
        assert await read_through(cluster.node(), "w1") == written["w1"]


async def test_an_owner_already_committing_the_transaction_is_not_taken_for_a_refusal(tmp_path):
    """Found by review: with two processes of one node alive (a force-deleted pod beside its
    replacement), a client that sent a one-shot again with the same id reached the second process,
    and the owners, already running the first process's requests, answered "already committing".
    The second coordinator took that for refusals and decided ABORT at once, without reading a
    log, and its ABORT reached participants that had voted yes for a transaction the first process
    committed. Played here by the requests of an earlier process of n0, sent straight to the owner:
    an owner's ABORTED answer to a one-shot may stand beside its vote, so the coordinator ends the
    transaction through the logs, and finds the votes."""
    slow_decision = {"timeout_ms_decision": 10_000}  # the participants wait for a decision
    async with local_cluster(tmp_path, node_count=2, partition_count=4, protocol_config=slow_decision) as cluster:
        remote = [p for p in cluster.partitions if cluster.owner_of(p) == "n1"][:2]
        assert len(remote) == 2
        owner, node = cluster.node("n1"), cluster.node("n0")
        keys = keys_in(4, remote)
        txn = client_txn_id(int(time.time() * 1000) - 50, "n0", secrets.token_hex(16), Protocol.CORNUS)
        by_partition = {p: puts({keys[p]: b"first"}) for p in remote}
        for partition, ops in by_partition.items():
            request = ExecuteRequest(txn, partition, "n0", tuple(ops), participants=tuple(sorted(remote)),
                                     deadline_unix_ms=int(time.time() * 1000) + 2_000)
            assert (await owner.on_request("n0", request)).status is ExecuteStatus.OK

        async def voted() -> bool:
            records = [await cluster.record(p, txn) for p in remote]
            return all(r is not None and r.state is TxnState.VOTE_YES for r in records)

        await wait_until(voted, 5, "the first process's requests never voted")
        outcome = await node.execute([op for ops in by_partition.values() for op in ops], Protocol.CORNUS,
                                     client_txn=txn)
        assert outcome.status is not OutcomeStatus.ABORTED, outcome

        async def applied() -> bool:
            records = [await cluster.record(p, txn) for p in remote]
            return all(r is not None and r.state is TxnState.COMMIT and r.applied for r in records)

        await wait_until(applied, 5, "the votes of the transaction were not committed and applied")


async def test_a_second_request_of_a_one_shot_waiting_for_a_lock_is_answered_that_it_runs_here(tmp_path):
    """Found by the simulator: a client that sent a one-shot's id to two processes of its
    coordinator's node (a pod replaced while its process ran on) had both requests reach the
    owner. The second joined the first's execution, which waited for a lock, and waited for the
    same key again; the lock table cannot hold two waits of one transaction on one key, and the
    release that granted them raised. The owner now answers the second that the transaction runs
    there (ABORTED: no refusal, so its coordinator ends it through the logs), and the first goes
    on."""
    async with local_cluster(tmp_path, node_count=2, partition_count=2, lock_policy=Policy.WAIT_DIE) as cluster:
        partition = next(p for p in cluster.partitions if cluster.owner_of(p) == "n1")
        owner, key = cluster.node("n1"), keys_in(2, [partition])[partition]
        now_ms = int(time.time() * 1000)
        older = client_txn_id(now_ms - 100, "n0", secrets.token_hex(16), Protocol.CORNUS)
        younger = new_txn_id(now_ms, "n0", "abc123", 1, Protocol.CORNUS)
        held = await owner.on_request("n0", ExecuteRequest(younger, partition, "n0", tuple(puts({key: b"young"}))))
        assert held.status is ExecuteStatus.OK, held

        def one_shot() -> ExecuteRequest:
            return ExecuteRequest(older, partition, "n0", tuple(puts({key: b"old"})), participants=(partition,),
                                  deadline_unix_ms=int(time.time() * 1000) + 2_000)

        first = asyncio.create_task(owner.on_request("n0", one_shot()))
        await wait_until(lambda: _waiting(owner, partition, older), 5, "the older one-shot never waited for the lock")
        second = await owner.on_request("n0", one_shot())
        assert second.status is ExecuteStatus.ABORTED and "already executing" in second.detail, second
        dropped = await owner.on_request("n0", ExecuteRequest(younger, partition, "n0", (), abort=True))
        assert dropped.status is ExecuteStatus.OK, dropped
        assert (await asyncio.wait_for(first, 5)).status is ExecuteStatus.OK


async def _waiting(node, partition: str, txn: str) -> bool:
    return txn in node.partitions[partition].state.locks._waiting


async def test_a_refusal_of_a_client_chosen_id_does_not_abort_what_another_process_committed(tmp_path):
    """Found while modelling a node's second process in the simulator: a client-chosen id may run
    at two processes of its coordinator's node (a pod replaced while its process ran on, the
    client sending it again). The owner voted for one process's request, the transaction
    committed and its machine there finished, and then refused the other process's request (a
    lock another transaction held): that process took the refusal for "never voted" and answered
    ABORTED for a committed transaction. A refusal of a client-chosen id now ends the transaction
    through the logs, which tell COMMIT. Played here by the other process's request sent straight
    to the owner."""
    async with local_cluster(tmp_path, node_count=2, partition_count=2) as cluster:
        owner, node, partition, key, txn = await _committed_by_another_process(cluster)
        other = new_txn_id(int(time.time() * 1000), "n0", "abc123", 1, Protocol.CORNUS)
        held = await owner.on_request("n0", ExecuteRequest(other, partition, "n0", tuple(puts({key: b"w"}))))
        assert held.status is ExecuteStatus.OK, held  # the lock the second request is refused on
        outcome = await node.execute(puts({key: b"v"}), Protocol.CORNUS, client_txn=txn)
        # Committed; what this process's request would have read there is not known.
        assert outcome.status is OutcomeStatus.UNKNOWN and outcome.detail.startswith("committed"), outcome


async def test_a_client_chosen_id_that_ran_and_ended_at_an_owner_is_not_run_there_again(tmp_path):
    """Found by review: the one-shot a client sent to two processes of its coordinator's node
    reached an owner again after its run there had voted, been decided and let go (nothing
    remembered it). The owner ran it afresh, and its vote met the decision in the log: the owner
    crashed on that as an impossible state. Now the owner answers that it ran and ended there
    (ABORTED, no refusal), and the coordinator learns the outcome from the logs."""
    async with local_cluster(tmp_path, node_count=2, partition_count=2) as cluster:
        _, node, _, key, txn = await _committed_by_another_process(cluster)
        outcome = await node.execute(puts({key: b"v"}), Protocol.CORNUS, client_txn=txn)
        assert outcome.status is OutcomeStatus.UNKNOWN and outcome.detail.startswith("committed"), outcome
        assert await cluster.value(key) == b"v"


async def _committed_by_another_process(cluster: LocalCluster) -> tuple[Node, Node, str, str, str]:
    """A Cornus one-shot with a client-chosen id that n1 ran for another process of n0 (its request
    sent straight to n1), voted on, committed itself and forgot: (n1, n0, its partition, its key,
    its id)."""
    partition = next(p for p in cluster.partitions if cluster.owner_of(p) == "n1")
    owner, node, key = cluster.node("n1"), cluster.node("n0"), keys_in(2, [partition])[partition]
    txn = client_txn_id(int(time.time() * 1000), "n0", secrets.token_hex(16), Protocol.CORNUS)
    request = ExecuteRequest(txn, partition, "n0", tuple(puts({key: b"v"})), participants=(partition,),
                             deadline_unix_ms=int(time.time() * 1000) + 2_000)
    assert (await owner.on_request("n0", request)).status is ExecuteStatus.OK

    async def committed_and_forgotten() -> bool:
        record = await cluster.record(partition, txn)
        running = txn in owner.core.host(partition).machines
        return record is not None and record.state is TxnState.COMMIT and record.applied and not running

    await wait_until(committed_and_forgotten, 5, "the participant never ended the transaction itself")
    return owner, node, partition, key, txn



async def test_a_one_shot_request_that_waited_past_its_deadline_for_a_lock_does_not_vote(tmp_path):
    """Found by audit (2026-11-28, sixth): an owner checked a one-shot's request against its
    deadline as it arrived only, then waited for a lock (up to timeout_ms_lock_wait) and a storage
    read before it fed the carried prepare: the vote could leave after the window that the late-vote
    bound (status.late_vote_ms) and the sweep age count on, which end at the deadline plus the
    slack. The owner checks the deadline again before the prepare, and refuses (no vote yet: a
    refusal is still true)."""
    async with local_cluster(tmp_path, node_count=2, partition_count=2, lock_policy=Policy.WAIT_DIE,
                             limits={"timeout_ms_lock_wait": 5_000}) as cluster:
        partition = next(p for p in cluster.partitions if cluster.owner_of(p) == "n1")
        owner, key = cluster.node("n1"), keys_in(2, [partition])[partition]
        slack_ms = owner.config.protocol_config.clock_slack_ms
        now_ms = int(time.time() * 1000)
        older = new_txn_id(now_ms - 100, "n0", "abc123", 1, Protocol.CORNUS)
        younger = new_txn_id(now_ms, "n0", "abc123", 2, Protocol.CORNUS)
        held = await owner.on_request("n0", ExecuteRequest(younger, partition, "n0", tuple(puts({key: b"young"}))))
        assert held.status is ExecuteStatus.OK, held
        deadline_ms = int(time.time() * 1000) + 100
        request = ExecuteRequest(older, partition, "n0", tuple(puts({key: b"old"})), participants=(partition,),
                                 deadline_unix_ms=deadline_ms)
        waiting = asyncio.create_task(owner.on_request("n0", request))
        await wait_until(lambda: _waiting(owner, partition, older), 5, "the older one-shot never waited for the lock")
        await asyncio.sleep((deadline_ms + slack_ms + 200) / 1000 - time.time())
        assert not waiting.done()
        released = await owner.on_request("n0", ExecuteRequest(younger, partition, "n0", (), abort=True))
        assert released.status is ExecuteStatus.OK, released
        answer = await asyncio.wait_for(waiting, 5)
        assert answer.status is ExecuteStatus.UNAVAILABLE and "deadline" in answer.detail, answer
        assert older not in owner.core.partitions[partition].machines  # it never voted
        assert older not in owner.partitions[partition].executions
        assert older not in owner.partitions[partition].state.locks.holders(key)
