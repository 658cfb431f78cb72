"""What the status call remembers for a caller that was told UNKNOWN (found by review): the
outcome of such a commit is kept apart from ordinary traffic's, which cannot evict it, and a reply
that lands in the very tick the commit's deadline fired is kept too."""

from __future__ import annotations

import asyncio
import time

import pytest

from cornus.protocol import txn_ids
from cornus.protocol.config import Protocol
from cornus.protocol.effects import Reply
from cornus.protocol.status import kept_floor_ms, kept_window_ms
from cornus.runtime import coordination
from cornus.runtime.coordination import Coordination
from cornus.runtime.outcome import OutcomeStatus, TxnWrongState
from cornus.runtime.wire import ExecuteRequest, ExecuteStatus, Op, OpKind, StatusRequest
from storage_adapters.contract import LogId, Record, TxnState
from tests.runtime.faults import commit_told_unknown, keys_in, local_cluster, puts, wait_collected, wait_until

pytestmark = pytest.mark.timeout(60)


async def test_a_reply_landing_in_the_deadline_tick_is_kept_for_status(tmp_path, monkeypatch):
    """The commit deadline's timer settles the reply future with None; the machine's Reply comes
    in the same loop iteration, before the waiting commit resumes, and was dropped: after garbage
    collection the status call knew nothing of a committed transaction."""
    monkeypatch.setattr(coordination, "TIMEOUT_MS_COMMIT", 300)
    async with local_cluster(tmp_path, partition_count=2) as cluster:
        node = cluster.node()
        keys = keys_in(2, ["p0", "p1"])
        writes = {keys["p0"]: b"a", keys["p1"]: b"b"}
        txn = node.begin()
        await node.run_ops(txn, puts(writes))
        held: list[Reply] = []
        real_on_reply = node.runner.on_reply

        def on_reply(effect: Reply) -> None:
            if effect.txn == txn:
                held.append(effect)  # it arrives with the deadline instead
                return
            real_on_reply(effect)

        node.runner.on_reply = on_reply
        real_no_reply = coordination._no_reply

        def no_reply_then_reply(reply):  # the timer's callback, then the reply's, in one tick
            real_no_reply(reply)
            for effect in held:
                real_on_reply(effect)
            held.clear()

        monkeypatch.setattr(coordination, "_no_reply", no_reply_then_reply)
        outcome = await node.commit(txn)
        assert outcome.status is OutcomeStatus.UNKNOWN, outcome
        await wait_collected(cluster, node, txn, ("p0", "p1"))
        assert {k: await cluster.value(k) for k in writes} == writes  # it committed
        status = await node.resolve_status(txn)
        assert status is not None and status.status is OutcomeStatus.COMMITTED, status


async def _told_unknown_then_decided(cluster, node) -> tuple[dict[str, bytes], str]:
    """A commit over p0 and p1 whose caller was told UNKNOWN, once its coordinator knows the outcome."""
    keys = keys_in(2, ["p0", "p1"])
    writes = {keys["p0"]: b"a", keys["p1"]: b"b"}
    txn = await commit_told_unknown(cluster, node, writes)

    async def decided() -> bool:
        known = node.status(txn)
        return known is not None and known.status is not OutcomeStatus.UNKNOWN

    await wait_until(decided, 10, "outcome never known")
    return writes, txn


async def test_the_outcome_of_a_commit_reported_unknown_survives_other_traffic(tmp_path, monkeypatch):
    """Its outcome went into the FIFO every transaction's outcome goes into (100,000 entries:
    tens of seconds of traffic); once evicted and collected, the status call said "no such
    transaction" for a commit whose caller it had sent there."""
    monkeypatch.setattr(coordination, "TIMEOUT_MS_COMMIT", 100)
    monkeypatch.setattr(coordination, "OUTCOME_REMEMBERED_COUNT_MAX", 5)
    async with local_cluster(tmp_path, partition_count=2) as cluster:
        node = cluster.node()
        writes, txn = await _told_unknown_then_decided(cluster, node)
        for i in range(10):  # ordinary traffic, twice the bound
            other = keys_in(2, ["p0"], prefix=f"o{i}")["p0"]
            assert (await node.execute(puts({other: b"x"}))).status is OutcomeStatus.COMMITTED
        await wait_collected(cluster, node, txn, ("p0", "p1"))
        values = {k: await cluster.value(k) for k in writes}
        status = await node.resolve_status(txn)
        assert status is not None, f"storage holds {values}; status call: no such transaction"
        expected = OutcomeStatus.COMMITTED if values == writes else OutcomeStatus.ABORTED
        assert status.status is expected, (status, values)


async def test_calls_on_a_transaction_whose_commit_was_told_unknown_say_so_not_no_such_transaction(
        tmp_path, monkeypatch):
    """A commit that outlived its deadline was answered UNKNOWN and forgotten as a transaction of
    this node: a commit or abort sent again (a gRPC client whose own deadline came first), before
    or after the decision, heard "no transaction ... on n0", NOT_FOUND over gRPC, which a client
    may take for "never existed" and run again (found by review)."""
    monkeypatch.setattr(coordination, "TIMEOUT_MS_COMMIT", 200)
    async with local_cluster(tmp_path, partition_count=2) as cluster:
        node = cluster.node()
        keys = keys_in(2, ["p0", "p1"])
        txn = await commit_told_unknown(cluster, node, {keys["p0"]: b"a", keys["p1"]: b"b"})
        for call in (node.commit, node.abort):
            with pytest.raises(TxnWrongState, match="ask its status"):
                await call(txn)
        with pytest.raises(TxnWrongState, match="ask its status"):
            await node.run_ops(txn, puts({keys["p0"]: b"c"}))

        async def decided() -> bool:
            known = node.status(txn)
            return known is not None and known.status is not OutcomeStatus.UNKNOWN

        await wait_until(decided, 10, "the transaction told unknown was never decided")
        with pytest.raises(TxnWrongState, match="committed"):
            await node.abort(txn)


async def test_the_outcome_of_a_commit_reported_unknown_survives_collection_and_a_coordinator_restart(
    tmp_path, monkeypatch
):
    """Found by review (2026-11-26): a caller told UNKNOWN is sent to the status call; once garbage
    collection deleted every record and the coordinator restarted (its memory of the outcome
    gone), the status call answers "no such transaction" for a transaction that committed, and a
    caller that takes that for "never happened" runs it again. Garbage collection now leaves the
    decision's tombstone in the first participant's log (DESIGN section 4), which the status call
    reads."""
    monkeypatch.setattr(coordination, "TIMEOUT_MS_COMMIT", 100)
    async with local_cluster(tmp_path, partition_count=2) as cluster:
        node = cluster.node()
        writes, txn = await _told_unknown_then_decided(cluster, node)
        await wait_collected(cluster, node, txn, ("p0", "p1"))
        assert {key: await cluster.value(key) for key in writes} == writes  # it committed
        await cluster.restart("n0")
        status = await cluster.node().resolve_status(txn)
        assert status is not None and status.status is OutcomeStatus.COMMITTED, status


async def test_an_id_nobody_knows_is_unknown_once_its_tombstone_could_have_expired(tmp_path):
    """Found by review: with its records collected and its coordinator restarted, a committed
    transaction was "not known to this cluster", which a caller takes for "never happened" and
    runs again. A transaction that voted leaves a record, then its decision's tombstone, for
    gc_grace_ms + outcome_keep_ms: the status call says "not known" only within that time (less
    the clock slack), and UNKNOWN after."""
    async with local_cluster(tmp_path, partition_count=2) as cluster:
        node = cluster.node()
        config = node.config.protocol_config
        now_ms = int(time.time() * 1000)
        young = txn_ids.new_txn_id(now_ms, "n0", "abcdef", 4, Protocol.CORNUS)
        status = await node.resolve_status(young)  # a request of it may still be on its way
        assert status is not None and status.status is OutcomeStatus.UNKNOWN, status
        fresh = txn_ids.new_txn_id(now_ms - 60_000, "n9", "abcdef", 1, Protocol.CORNUS)
        assert await node.resolve_status(fresh) is None
        kept_ms = config.gc_grace_ms + config.outcome_keep_ms - config.clock_slack_ms
        # Past its grace (and any request's deadline): only its tombstone could be left.
        collected = txn_ids.new_txn_id(now_ms - 120_000, "n9", "abcdef", 2, Protocol.CORNUS)
        assert config.gc_grace_ms + config.clock_slack_ms < 120_000
        assert await node.resolve_status(collected) is None  # its tombstone would be there
        old = txn_ids.new_txn_id(now_ms - kept_ms - 1, "n9", "abcdef", 3, Protocol.CORNUS)
        status = await node.resolve_status(old)
        assert status is not None and status.status is OutcomeStatus.UNKNOWN, status
        assert "outcome_keep_ms" in status.detail, status


async def test_a_coordinator_restarted_since_an_id_began_is_not_counted_on_for_its_keep(tmp_path):
    """Found by review: a rollout that raised outcome_keep_ms made the status call count on the new
    keep for tombstones the coordinator's previous process had collected, and dropped, under the
    old one: "not known" of a committed transaction. Only the coordinator collects; one whose
    process started after the id began is counted for the floor (kept_floor_ms) only."""
    async with local_cluster(tmp_path, partition_count=2) as cluster:
        node = cluster.node()
        config = node.config.protocol_config
        now_ms = int(time.time() * 1000)
        # Past any request's deadline and the floor, within the configured keep.
        collected = txn_ids.new_txn_id(now_ms - 120_000, "n0", "abcdef", 1, Protocol.CORNUS)
        assert kept_floor_ms(config) < 120_000 < kept_window_ms(config)
        status = await node.resolve_status(collected)  # n0 started a moment ago
        assert status is not None and status.status is OutcomeStatus.UNKNOWN, status
        node.admin._since_ms = now_ms - 600_000  # as if n0's process had run since before it began
        assert await node.resolve_status(collected) is None


async def test_an_id_is_not_known_only_when_every_partition_s_records_were_read(tmp_path):
    """Found by review: the status call read the records of the partitions each node held, and
    said "not known" when none held the id's; with a partition between owners (its lease lapsed,
    nobody has taken it yet), a committed transaction whose records all lie there was "not known",
    which a caller takes for "never happened" and runs again."""
    async with local_cluster(tmp_path, partition_count=2) as cluster:
        node = cluster.node()
        fresh = txn_ids.new_txn_id(int(time.time() * 1000) - 60_000, "n9", "abcdef", 1, Protocol.CORNUS)
        assert await node.resolve_status(fresh) is None
        between_owners = node.partitions.pop("p1")  # what a lost lease leaves, until a take
        try:
            status = await node.resolve_status(fresh)
        finally:
            node.partitions["p1"] = between_owners
        assert status is not None and status.status is OutcomeStatus.UNKNOWN, status
        assert "p1" in status.detail, status


async def test_a_status_answer_names_only_the_partitions_whose_records_it_read(tmp_path):
    """Found by review: a node's status answer named the partitions it held when it answered, not
    those it had read; one it took while reading was claimed read, so a committed transaction
    whose only record (its decision's tombstone) lay there was "not known"."""
    async with local_cluster(tmp_path, node_count=2, partition_count=2) as cluster:
        n0 = cluster.node("n0")
        assert cluster.owner_of("p0") == "n0" and "p1" not in n0.partitions
        store = n0.admin.store
        original = store.read
        taken = cluster.node("n1").partitions["p1"]

        async def read_while_p1_is_taken(log: LogId, txn: str) -> Record | None:
            n0.partitions["p1"] = taken  # a take landing between the snapshot and the answer
            return await original(log, txn)

        store.read = read_while_p1_is_taken  # type: ignore[method-assign]
        try:
            answer = await n0.admin.status_response(StatusRequest("1.n0.abcdef.1.cornus"), ready=True)
        finally:
            del store.read
            n0.partitions.pop("p1")
        assert answer.partitions == ("p0",), answer


async def test_a_status_answer_claims_no_partition_still_recovering_as_read(tmp_path):
    """Found by audit (2026-11-27): a node's status answer counted a partition it had taken but
    was still recovering as read. Under coordinator-log a participant's yes vote lives only in its
    coordinator's redo record until recovery rebuilds it: during a takeover no machine and no
    record of it were anywhere here, and with its coordinator gone from the node set the status
    call could say "not known" of a transaction whose coordinator's log held COMMIT."""
    async with local_cluster(tmp_path, node_count=2, partition_count=2) as cluster:
        n0 = cluster.node("n0")
        assert set(n0.serving) == {"p0"}
        del n0.serving["p0"]  # taken, its recovery not settled yet
        try:
            answer = await n0.admin.status_response(StatusRequest("1.n0.abcdef.1.cornus"), ready=True)
        finally:
            n0.serving["p0"] = 1
        assert answer.partitions == (), answer


async def test_a_commit_told_unknown_whose_votes_are_still_on_their_way_is_never_not_known(tmp_path, monkeypatch):
    """Found by review: storage writes stalled past the commit deadline, the caller was told
    UNKNOWN and asked status; the coordinator's machine was alive but undecided, its memory of the
    UNKNOWN answer read as "nothing", and no record had landed yet, so the status call said "no
    such transaction", which the SDK documents as "it never committed"; the caller ran it again,
    and then the votes landed and it committed too. Until it is decided it is UNKNOWN."""
    monkeypatch.setattr(coordination, "TIMEOUT_MS_COMMIT", 300)
    async with local_cluster(tmp_path, partition_count=2) as cluster:
        node = cluster.node()
        keys = keys_in(2, ["p0", "p1"])
        writes = {keys["p0"]: b"a", keys["p1"]: b"b"}
        gate = cluster.faults["n0"].hold("log_once")  # the votes' writes stall; reads answer
        try:
            txn = node.begin()
            await node.run_ops(txn, puts(writes))
            assert (await node.commit(txn)).status is OutcomeStatus.UNKNOWN
            status = await node.resolve_status(txn)
            assert status is not None and status.status is OutcomeStatus.UNKNOWN, status
        finally:
            gate.set()
            cluster.faults["n0"].heal()

        async def committed() -> bool:
            status = await node.resolve_status(txn)
            return status is not None and status.status is OutcomeStatus.COMMITTED

        await wait_until(committed, 10, "never committed")


async def test_a_vote_on_its_way_after_its_coordinator_restarted_is_never_not_known(tmp_path, monkeypatch):
    """The same, once the coordinator restarted (its memory gone): the participant whose vote is
    on its way runs the transaction's machine, and says so."""
    monkeypatch.setattr(coordination, "TIMEOUT_MS_COMMIT", 300)
    async with local_cluster(tmp_path, node_count=2, partition_count=2) as cluster:
        assert cluster.owner_of("p1") == "n1"
        writes = {cluster.key_in("p1", "a"): b"a", cluster.key_in("p1", "b"): b"b"}
        # Every LogOnce stalls: the vote's, and the coordinator's termination's (an ABORT).
        gates = [cluster.faults[node].hold("log_once") for node in ("n0", "n1")]
        try:
            node = cluster.node("n0")
            txn = node.begin()
            await node.run_ops(txn, puts(writes))
            assert (await node.commit(txn)).status is OutcomeStatus.UNKNOWN
            await cluster.restart("n0")
            status = await cluster.node("n0").resolve_status(txn)
            assert status is not None and status.status is OutcomeStatus.UNKNOWN, status
        finally:
            for gate in gates:
                gate.set()
            for node in ("n0", "n1"):
                cluster.faults[node].heal()


async def test_an_execution_whose_coordinator_restarted_is_never_not_known(tmp_path, monkeypatch):
    """Found while moving the verdict into the core: an interactive transaction's coordinator
    restarted (its memory gone) after its operations ran on a partition and, maybe, after its
    Prepare left; no machine and no record yet, so the status call said "not known", though the
    Prepare could still arrive, its participant vote yes, and termination commit. The execution the
    partition holds says it may."""
    async with local_cluster(tmp_path, node_count=2, partition_count=2) as cluster:
        assert cluster.owner_of("p1") == "n1"
        node = cluster.node("n0")
        txn = node.begin()
        await node.run_ops(txn, puts({cluster.key_in("p1", "a"): b"a"}))
        # A crash: its memory goes, and with it the aborts a clean stop sends (abort_open).
        monkeypatch.setattr(Coordination, "abort_open", lambda self: 0)
        await cluster.restart("n0")
        assert txn in cluster.node("n1").partitions["p1"].executions
        status = await cluster.node("n0").resolve_status(txn)
        assert status is not None and status.status is OutcomeStatus.UNKNOWN, status


async def test_the_too_recent_window_is_judged_by_the_clock_before_the_answers_came(tmp_path):
    """Found by review: the window was judged by the clock read after every node had answered; a
    slow answer let it close between the owner's "nothing" and the verdict, while the owner still
    ran a one-shot's request that arrived in that gap, which voted yes and committed."""
    async with local_cluster(tmp_path, node_count=2, partition_count=2) as cluster:
        runs, asks = cluster.node("n1"), cluster.node("n0")
        assert cluster.owner_of("p1") == "n1"
        limits, config = runs.config.limits, runs.config.protocol_config
        # A one-shot of a previous life of n0: its owner runs it until begin + T + slack.
        accepted_until_ms = limits.timeout_ms_peer_request + config.clock_slack_ms
        begin_ms = int(time.time() * 1000) - accepted_until_ms + 250
        txn = f"{begin_ms}.n0.dead00.1.cornus"
        key = cluster.key_in("p1", "late")
        answer = asks.admin.status_response

        async def slow_answer(request: StatusRequest, ready: bool) -> object:
            await asyncio.sleep(0.9)  # many partitions on slow storage
            return await answer(request, ready)

        asks.admin.status_response = slow_answer  # type: ignore[method-assign]
        status = asyncio.ensure_future(asks.resolve_status(txn))
        await asyncio.sleep(0.2)  # n1 answered "nothing" by now
        late = ExecuteRequest(txn, "p1", "n0", (Op(OpKind.PUT, key, b"late"),), participants=("p1",),
                              deadline_unix_ms=begin_ms + limits.timeout_ms_peer_request)
        assert (await runs.on_request("n0", late)).status is ExecuteStatus.OK  # in time
        found = await status
        assert found is not None and found.status is OutcomeStatus.UNKNOWN, found


async def test_a_participant_that_votes_and_forgets_during_the_reads_is_seen(tmp_path):
    """Found by review: a node's answer read its partitions' records first and looked for
    machines after; a participant whose vote landed, decided and dropped its machine between the
    two was in neither, and the status call said "not known" of a committed transaction."""
    async with local_cluster(tmp_path, node_count=1, partition_count=2) as cluster:
        node = cluster.node("n0")
        store = cluster.faults["n0"]
        first, second = sorted(node.partitions)
        limits, config = node.config.limits, node.config.protocol_config
        window_ms = limits.timeout_ms_peer_request + 2 * config.clock_slack_ms
        begin_ms = int(time.time() * 1000) - window_ms + 300
        txn = f"{begin_ms}.n0.dead00.1.cornus"  # a previous life of n0 coordinated it
        key = cluster.key_in(first, "late")
        vote_gate = store.hold("log_once", where=lambda a: a.get("txn") == txn)
        read_gate = store.hold("read", where=lambda a: a.get("txn") == txn and a.get("log") == LogId.partition(second))
        try:
            late = ExecuteRequest(txn, first, "n0", (Op(OpKind.PUT, key, b"late"),), participants=(first,),
                                  deadline_unix_ms=begin_ms + limits.timeout_ms_peer_request)
            assert (await node.on_request("n0", late)).status is ExecuteStatus.OK  # in time; its vote is slow
            await asyncio.sleep(0.4)  # the window has closed
            status = asyncio.ensure_future(node.resolve_status(txn))

            async def first_read() -> bool:
                return bool(store.calls_of("read", txn=txn, log=LogId.partition(first)))

            await wait_until(first_read, 5, "the status call never read the first partition")
            vote_gate.set()

            async def committed_and_forgotten() -> bool:
                record = await cluster.record(first, txn)
                return (record is not None and record.state is TxnState.COMMIT
                        and txn not in node.core.partitions[first].machines)

            await wait_until(committed_and_forgotten, 10, "the transaction never committed")
            read_gate.set()
            found = await status
            assert found is not None, "the status call said 'not known' of a committed transaction"
        finally:
            vote_gate.set()
            read_gate.set()
            store.heal()


async def test_status_and_resolve_calls_past_their_bound_are_refused_retryable(tmp_path, monkeypatch):
    """Found by audit (2026-11-27): each status or resolve call reads every partition's log or asks
    every peer, and a node took as many at once as its API takes requests (10,000), crowding out
    the commits beside them. Past STATUS_CALL_COUNT_MAX in flight they are refused as overloaded
    (REST 503, gRPC UNAVAILABLE: retry), and the count goes down as they end."""
    from cornus.runtime import node as node_module
    from cornus.runtime.outcome import NodeOverloaded

    monkeypatch.setattr(node_module, "STATUS_CALL_COUNT_MAX", 2)
    async with local_cluster(tmp_path, partition_count=2) as cluster:
        node = cluster.node()
        release = asyncio.Event()
        answered = node.admin.resolve_status

        async def held(txn: str) -> object:
            await release.wait()
            return await answered(txn)

        monkeypatch.setattr(node.admin, "resolve_status", held)
        unknown = txn_ids.client_txn_id(int(time.time() * 1000) - 60_000, "n0", "ab" * 16, Protocol.CORNUS)
        waiting = [asyncio.create_task(node.resolve_status(unknown)) for _ in range(2)]
        await asyncio.sleep(0)
        with pytest.raises(NodeOverloaded, match="status and resolve calls at once"):
            await node.resolve_status(unknown)
        with pytest.raises(NodeOverloaded):
            await node.resolve(unknown)
        release.set()
        await asyncio.gather(*waiting)
        assert node.counters["status_calls_refused"] == 2
        await node.resolve_status(unknown)  # room again
