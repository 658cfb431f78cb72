"""The coordinator's side of a client-chosen one-shot id (Coordination.begin): an id sent to an
earlier run of the node is refused after a restart, and a one-shot refused for its input leaves
its id free for the corrected request."""

from __future__ import annotations

import asyncio
import secrets
import time

import pytest

from cornus.protocol.config import Protocol
from cornus.protocol.messages import Decision
from cornus.protocol.txn_ids import client_txn_id
from cornus.runtime.node import TxnAborted
from cornus.runtime.outcome import AbortReason, NodeOverloaded, Outcome, OutcomeStatus
from cornus.runtime.wire import Op, OpKind
from storage_adapters.contract import LogId, RecordBody, TxnState
from storage_adapters.errors import ValidationError
from tests.runtime.faults import DroppingMessages, local_cluster, wait_until

pytestmark = pytest.mark.timeout(60)
# Longer than a restart of a node of the local cluster takes (about 2 s on a loaded machine).
RESTART_MS_MAX = 8_000


def _new_id(node: str = "n0", age_ms: int = 5) -> str:
    return client_txn_id(int(time.time() * 1000) - age_ms, node, secrets.token_hex(16), Protocol.CORNUS)


async def test_an_id_sent_before_a_restart_is_refused_and_a_refused_input_frees_its_id(tmp_path):
    async with local_cluster(tmp_path, partition_count=2) as cluster:
        node = cluster.node()
        coordination = node.coordination
        # As if this run of the coordinator had started just now, after a first run got the id.
        sent_before = _new_id(age_ms=20)
        coordination.started_unix_ms = int(time.time() * 1000) - 10
        # An earlier delivery of the same request may have run it: unknown, not "nothing ran".
        _assert_in_doubt(await node.execute([Op(OpKind.PUT, "k1", b"v")], client_txn=sent_before),
                         "not after this node's coordinator started")
        assert not coordination.txns and coordination.known(sent_before) is None
        assert await cluster.value("k1") is None

        txn = _new_id()
        with pytest.raises(ValidationError):
            await node.execute([Op(OpKind.GET, "k1", b"a get takes no value")], client_txn=txn)
        assert coordination.known(txn) is None  # refused before anything left: nothing to remember
        outcome = await node.execute([Op(OpKind.PUT, "k1", b"v")], client_txn=txn)
        assert outcome.status is OutcomeStatus.COMMITTED and outcome.txn == txn, outcome
        # An earlier delivery of the same request may have run it: unknown, not "nothing ran".
        _assert_in_doubt(await node.execute([Op(OpKind.PUT, "k1", b"w")], client_txn=txn), "already known")
        # Applied after the reply (Cornus answers once every vote is in), and never as "w".
        await wait_until(lambda: _is(cluster, "k1", b"v"), 5, "the commit was not applied")


def _assert_in_doubt(outcome: Outcome, words: str) -> None:
    """Found by audit (2026-11-27): a refusal of a one-shot's own id that an earlier delivery of
    the same request may have run (it ran here already, began before this process) was raised as
    "nothing ran"; a client behind a proxy that delivers a POST twice ran the transaction again."""
    assert outcome.status is OutcomeStatus.UNKNOWN and words in outcome.detail, outcome


async def _is(cluster, key: str, value: bytes) -> bool:
    return await cluster.value(key) == value


async def test_a_one_shot_run_as_begin_ops_and_abort_frees_its_refused_id_too(tmp_path):
    """Found by the helper that built client ids: the public gRPC API runs a one-shot as begin,
    run_ops and commit, and aborted one whose input was refused as any other, so the corrected
    request under the same id was refused as "already known" (FAILED_PRECONDITION), while REST's
    execute accepted it. An abort for refused input frees the id, as execute does."""
    async with local_cluster(tmp_path, partition_count=2) as cluster:
        node = cluster.node()
        txn = node.begin(None, _new_id())
        with pytest.raises(ValidationError):
            await node.run_ops(txn, [Op(OpKind.GET, "k1", b"a get takes no value")])
        await node.abort(txn, input_refused=True)
        assert node.coordination.known(txn) is None
        outcome = await node.execute([Op(OpKind.PUT, "k1", b"v")], client_txn=txn)
        assert outcome.status is OutcomeStatus.COMMITTED and outcome.txn == txn, outcome
        # Any other abort is remembered: the id names one transaction, run once.
        other = node.begin(None, _new_id())
        await node.abort(other)
        # An earlier delivery of the same request may have run it: unknown, not "nothing ran".
        _assert_in_doubt(await node.execute([Op(OpKind.PUT, "k1", b"w")], client_txn=other), "already known")


async def test_an_id_begun_before_the_process_took_the_identity_and_a_slack_is_refused(tmp_path):
    """A process of a node that a later one replaced may still run: it aborts a blocking-protocol
    one-shot it got, and reads the identity record after deciding before it tells anyone
    (TwoPhaseCoordinator._abort). The later process must find its own take in that read's past,
    so it runs a resent id only if it began a clock slack after the take, not merely after the
    process started (it takes the identity later, after a slow storage's retries even)."""
    async with local_cluster(tmp_path, partition_count=2) as cluster:
        node = cluster.node()
        coordination = node.coordination
        slack_ms = node.config.protocol_config.clock_slack_ms
        taken_ms = node.runner.identity.taken_unix_ms
        assert taken_ms is not None and taken_ms >= coordination.started_unix_ms
        now_ms = int(time.time() * 1000)
        # As if the take had returned just now, long after the process started.
        coordination.identity_taken_unix_ms = lambda: now_ms - slack_ms + 50
        within_slack = client_txn_id(now_ms - 10, "n0", secrets.token_hex(16), Protocol.CORNUS)
        # An earlier delivery of the same request may have run it: unknown, not "nothing ran".
        _assert_in_doubt(await node.execute([Op(OpKind.PUT, "k1", b"v")], client_txn=within_slack),
                         "not after this node's coordinator started")
        coordination.identity_taken_unix_ms = lambda: now_ms - slack_ms - 50
        after = client_txn_id(now_ms - 10, "n0", secrets.token_hex(16), Protocol.CORNUS)
        outcome = await node.execute([Op(OpKind.PUT, "k1", b"v")], client_txn=after)
        assert outcome.status is OutcomeStatus.COMMITTED, outcome


async def test_an_id_another_process_ran_is_in_doubt_not_aborted_on_the_begin_ops_commit_path(tmp_path):
    """Found by audit (2026-11-27): a one-shot run as begin, run_ops and commit (the public gRPC
    API's, and REST's when its redo outgrows a carried prepare) whose owner answered ABORTED ("this
    id ran here already": ENDED, or a machine commits it) was reported aborted and retryable, and
    remembered so for the status call. With a client-chosen id that answer means another process
    of this node, to which the client sent the id too (a pod replaced while the first ran on), may
    have committed it: the client, told "aborted", ran it again under a new id. It is in doubt."""
    async with local_cluster(tmp_path, partition_count=2) as cluster:
        node = cluster.node()
        coordination = node.coordination
        txn = _new_id(age_ms=20)
        first = node.begin(None, txn)
        await node.run_ops(first, [Op(OpKind.PUT, "k1", b"v")])
        assert (await node.commit(first)).status is OutcomeStatus.COMMITTED
        await wait_until(lambda: _is(cluster, "k1", b"v"), 5, "the commit was not applied")
        # The second process: it never ran the id (no memory, no machine), and began before it.
        coordination.outcomes.pop(txn)
        node.core.coordinator.machines.pop(txn, None)
        coordination.started_unix_ms = int(time.time() * 1000) - 1_000
        again = node.begin(None, txn)
        outcome = None
        try:
            await node.run_ops(again, [Op(OpKind.PUT, "k1", b"w")])
        except TxnAborted as aborted:
            outcome = aborted.outcome
        assert outcome is not None and outcome.status is OutcomeStatus.UNKNOWN, outcome
        known = coordination.known(txn)
        assert known is not None and known.status is OutcomeStatus.UNKNOWN, known
        # With the first process gone, whose machine would answer from memory, the status call
        # reads the records (found by audit: it said "under way" for ever, and read no record).
        status = await node.resolve_status(txn)
        assert status is not None and status.status is OutcomeStatus.COMMITTED, status
        assert await cluster.value("k1") == b"v"


async def test_a_second_delivery_to_an_overloaded_node_hears_it_ran_not_overloaded(tmp_path, monkeypatch):
    """Found by review (2026-11-27): the node's load was checked before the id, so a second
    delivery of a committed one-shot to a node at its limit of transactions heard "overloaded,
    retry" (nothing ran), and the SDK ran it again under another id. The id is checked first."""
    async with local_cluster(tmp_path, partition_count=2) as cluster:
        node = cluster.node()
        txn = _new_id()
        outcome = await node.execute([Op(OpKind.PUT, "k1", b"v")], client_txn=txn)
        assert outcome.status is OutcomeStatus.COMMITTED, outcome
        monkeypatch.setattr(node.coordination, "ready", lambda: False)  # as a node recovering, or full
        _assert_in_doubt(await node.execute([Op(OpKind.PUT, "k1", b"w")], client_txn=txn), "already known")


async def test_an_id_refused_for_load_while_an_earlier_process_may_run_is_in_doubt(tmp_path, monkeypatch):
    """Found by audit (2026-11-28): a process of the node that has not taken its identity yet (a
    pod replaced while the old one ran on) refused a client-chosen id as "still recovering", a
    503 that says nothing ran, though the old process may have run the id (a proxy delivered the
    request to both); the SDK ran it again under a new id. Until an earlier process must have seen
    the take (txn_ids.predecessor_may_have_run), such a refusal is in doubt; after, a plain 503."""
    async with local_cluster(tmp_path, partition_count=2) as cluster:
        node = cluster.node()
        coordination = node.coordination
        config = node.config.protocol_config
        monkeypatch.setattr(coordination, "ready", lambda: False)
        monkeypatch.setattr(coordination, "identity_taken_unix_ms", lambda: None)
        _assert_in_doubt(await node.execute([Op(OpKind.PUT, "k1", b"v")], client_txn=_new_id()), "still recovering")
        now_ms = int(time.time() * 1000)
        window_ms = config.identity_check_ms + 2 * config.storage_deadline_ms + config.clock_slack_ms
        monkeypatch.setattr(coordination, "identity_taken_unix_ms", lambda: now_ms - window_ms + 500)
        _assert_in_doubt(await node.execute([Op(OpKind.PUT, "k1", b"v")], client_txn=_new_id()), "still recovering")
        monkeypatch.setattr(coordination, "identity_taken_unix_ms", lambda: now_ms - window_ms - 500)
        with pytest.raises(NodeOverloaded, match="still recovering"):
            await node.execute([Op(OpKind.PUT, "k1", b"v")], client_txn=_new_id())
        with pytest.raises(NodeOverloaded, match="still recovering"):  # an id of the node's own: nothing ran
            await node.execute([Op(OpKind.PUT, "k1", b"v")])
        assert not coordination.txns
        assert await cluster.value("k1") is None


async def test_an_id_begun_ahead_of_the_clock_while_an_earlier_process_may_run_is_in_doubt(tmp_path, monkeypatch):
    """Found by audit (2026-11-28): an id whose begin is ahead of the node's clock was refused as
    "nothing ran" (such a begin was ahead at any earlier delivery too), but an earlier process of
    the node on another host, whose clock runs ahead within the slack, may have run it. While one
    may still run (txn_ids.predecessor_may_have_run), it is in doubt; after, the refusal stands."""
    async with local_cluster(tmp_path, partition_count=2) as cluster:
        node = cluster.node()
        coordination = node.coordination
        config = node.config.protocol_config
        now_ms = int(time.time() * 1000)
        ahead = client_txn_id(now_ms + 500, "n0", secrets.token_hex(16), Protocol.CORNUS)
        monkeypatch.setattr(coordination, "identity_taken_unix_ms", lambda: now_ms - 1_000)
        _assert_in_doubt(await node.execute([Op(OpKind.PUT, "k1", b"v")], client_txn=ahead), "ahead of this node")
        window_ms = config.identity_check_ms + 2 * config.storage_deadline_ms + config.clock_slack_ms
        monkeypatch.setattr(coordination, "identity_taken_unix_ms", lambda: now_ms - window_ms - 1_000)
        with pytest.raises(ValidationError, match="ahead of this node"):
            await node.execute([Op(OpKind.PUT, "k1", b"v")], client_txn=ahead)
        assert not coordination.txns
        assert await cluster.value("k1") is None


async def test_an_id_refused_by_a_deposed_process_is_in_doubt(tmp_path, monkeypatch):
    """Found by audit (2026-11-28, second): a process that a later one of its node deposed (a
    force-deleted pod that runs on) answered a client-chosen id it did not know with 503
    "stopping", nothing ran; but the later process holds the identity, and a proxy may have
    delivered the same request there first, where it committed. The SDK ran it again under a new
    id. Any refusal of a client-chosen id by a deposed process is in doubt, whatever its begin
    (an id of its own making still hears the plain refusal: no client can resend it)."""
    async with local_cluster(tmp_path, partition_count=2) as cluster:
        node = cluster.node()
        # Taken long ago, past the window in which an earlier process may still run.
        monkeypatch.setattr(node.coordination, "identity_taken_unix_ms", lambda: int(time.time() * 1000) - 600_000)
        node._deposed("a test took the identity")
        _assert_in_doubt(await node.execute([Op(OpKind.PUT, "k1", b"v")], client_txn=_new_id()), "stopping")
        ahead = client_txn_id(int(time.time() * 1000) + 500, "n0", secrets.token_hex(16), Protocol.CORNUS)
        _assert_in_doubt(await node.execute([Op(OpKind.PUT, "k1", b"v")], client_txn=ahead), "ahead of this node")
        with pytest.raises(NodeOverloaded, match="stopping"):
            await node.execute([Op(OpKind.PUT, "k1", b"v")])
        assert not node.coordination.txns
        assert await cluster.value("k1") is None


async def test_an_id_refused_for_the_writes_held_while_an_earlier_process_may_run_is_in_doubt(tmp_path, monkeypatch):
    """Found by audit (2026-11-28, second): the refusal for the writes a node holds (past
    WRITES_HELD_BYTES_MAX) said "nothing ran" of a client-chosen id an earlier process of the node
    may have run, as the refusals for load did before the predecessor rule reached them. In doubt
    while txn_ids.predecessor_may_have_run holds, and its id stays taken; after, a plain 503."""
    async with local_cluster(tmp_path, partition_count=2) as cluster:
        node = cluster.node()
        coordination = node.coordination
        monkeypatch.setattr("cornus.runtime.coordination.WRITES_HELD_BYTES_MAX", 0)
        now_ms = int(time.time() * 1000)
        monkeypatch.setattr(coordination, "identity_taken_unix_ms", lambda: now_ms - 2_000)
        txn = _new_id()
        _assert_in_doubt(await node.execute([Op(OpKind.PUT, "k1", b"v")], client_txn=txn), "writes")
        _assert_in_doubt(await node.execute([Op(OpKind.PUT, "k1", b"v")], client_txn=txn), "already known")
        config = node.config.protocol_config
        window_ms = config.identity_check_ms + 2 * config.storage_deadline_ms + config.clock_slack_ms
        monkeypatch.setattr(coordination, "identity_taken_unix_ms", lambda: now_ms - window_ms - 1_000)
        with pytest.raises(NodeOverloaded, match="writes"):
            await node.execute([Op(OpKind.PUT, "k1", b"v")], client_txn=_new_id())
        assert not coordination.txns
        assert await cluster.value("k1") is None


async def test_the_status_call_asks_the_records_of_a_client_chosen_id_its_coordinator_remembers_aborted(tmp_path):
    """Found by audit (2026-11-28, second): the status call answered a coordinator's memory of
    ABORTED (or ACTIVE) at once, reading no record, though the verdict ranks a COMMIT in the
    records above it (cornus.protocol.status): another process of the node, sent the same
    client-chosen id, may have committed it. For such an id the records are read; an id of the
    node's own making is this process's alone, and its memory stands."""
    async with local_cluster(tmp_path, partition_count=2) as cluster:
        node = cluster.node()
        coordination = node.coordination
        txn = _new_id()
        coordination._remember(Outcome(txn, OutcomeStatus.ABORTED, AbortReason.CLIENT, "as this process saw it"))
        await cluster.real_store.log_once(LogId.partition("p0"), txn, TxnState.COMMIT, RecordBody())
        status = await node.resolve_status(txn)
        assert status is not None and status.status is OutcomeStatus.COMMITTED, status
        own = node.begin()
        await node.abort(own)
        status = await node.resolve_status(own)
        assert status is not None and status.status is OutcomeStatus.ABORTED, status


async def test_a_process_whose_identity_was_not_confirmed_lately_runs_no_client_chosen_id(tmp_path, monkeypatch):
    """Found by audit (2026-11-28, second): the rule that makes a later process's "nothing ran"
    true (txn_ids.predecessor_may_have_run) counts on an earlier process learning of the take
    within identity_check_ms and two storage deadlines, from a renewal refused. One cut off from
    storage alone hears no answer at all, never learns, and coordinated Cornus one-shots on (the
    coordinator writes nothing): a resend refused by the later process as "nothing ran" after the
    window ran again under a new id. A process begins a client-chosen id only while a read of its
    identity record confirmed it within that time (txn_ids.identity_fresh_for_client_ids); else
    the id is in doubt. An id of its own making needs none: no client sends it twice."""
    async with local_cluster(tmp_path, partition_count=2) as cluster:
        node = cluster.node()
        config = node.config.protocol_config
        identity = node.runner.identity
        stale_s = (config.identity_check_ms + 2 * config.storage_deadline_ms + 500) / 1000
        monkeypatch.setattr(identity, "_confirmed_at_s", identity._confirmed_at_s - stale_s)
        _assert_in_doubt(await node.execute([Op(OpKind.PUT, "k1", b"v")], client_txn=_new_id()), "confirmed")
        own = await node.execute([Op(OpKind.PUT, "k1", b"v")])
        assert own.status is OutcomeStatus.COMMITTED, own


async def test_a_resend_of_an_id_whose_commit_recovery_runs_is_in_doubt_not_a_crash(tmp_path, monkeypatch):
    """Found by audit (2026-11-28): the coordinator's memory of client-chosen ids (`known`) held
    what this process began, not the machines its recovery rebuilt from the coordinator log. A
    resend of such an id that passed the begin checks (a clock more than a slack apart from the
    process's that ran it first: outside the slack assumption, but a mistake of the clocks must
    not crash a node) began it again, and its commit met the running machine: the core's
    assertion ("already coordinates"), and the node exited. It is in doubt, as any id known here."""
    async with local_cluster(tmp_path, node_count=2, partition_count=2, protocol=Protocol.TWO_PC) as cluster:
        # Nobody acknowledges the recovered COMMIT, so its machine runs while the resend comes.
        cluster.network.handlers["n1"] = DroppingMessages(cluster.network.handlers["n1"], Decision)
        # Begun a little after the restart, by the clock of the process that ran it first.
        begin_ms = int(time.time() * 1000) + RESTART_MS_MAX
        txn = client_txn_id(begin_ms, "n0", secrets.token_hex(16), Protocol.TWO_PC)
        p1 = cluster.partitions[1]
        await cluster.real_store.log(LogId.coordinator("n0"), txn, TxnState.COMMIT, RecordBody((p1,), "n0"))
        await cluster.restart("n0")
        node = cluster.node()
        assert txn in node.core.coordinator.machines, "recovery did not rebuild the COMMIT's machine"
        wait_s = begin_ms / 1000 - time.time()
        assert wait_s > 0, f"the restart took more than {RESTART_MS_MAX} ms"
        await asyncio.sleep(wait_s)
        # The clock mistake: the id begins after this process's start and its take, by its clock.
        monkeypatch.setattr(node.coordination, "started_unix_ms", begin_ms - 10)
        monkeypatch.setattr(node.coordination, "identity_taken_unix_ms", lambda: begin_ms - 600_000)
        key = cluster.key_in(cluster.partitions[0])
        _assert_in_doubt(await node.execute([Op(OpKind.PUT, key, b"v")], client_txn=txn), "already known")
        assert txn in node.core.coordinator.machines
        assert await cluster.value(key) is None
