"""gRPC answers to calls whose commit may still happen (found by review). public.proto says an
error status changed nothing, except where it names the transaction to ask Status about: a
one-shot (Execute, Put, Get) names it in the initial metadata `cornus-txn` before it runs, and a
call still running when the server stops answers OUTCOME_UNKNOWN itself instead of leaving grpc's
own UNAVAILABLE ("Cancelling all calls") to a commit that then commits."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

import services.public_api  # noqa: F401 - builds the generated code before it is imported below
from cornus.protocol.config import Protocol
from cornus.protocol.txn_ids import client_txn_id
from cornus.runtime import coordination
from cornus.runtime.node import Node
from cornus.runtime.outcome import Outcome, OutcomeStatus
from services.public_api import TXN_METADATA_KEY, example
from services.public_api import server as grpc_server_module
from services.public_api._generated import public_pb2 as pb
from services.public_api._generated import public_pb2_grpc
from services.public_api.server import PublicGrpcServer
from storage_adapters.contract import TxnState
from tests.runtime.faults import LocalCluster, keys_in, local_cluster, wait_until

pytestmark = pytest.mark.timeout(60)


@dataclass
class _Served:
    """A 2-partition in-process cluster whose node n0 serves the public gRPC API, with a stub."""

    cluster: LocalCluster
    node: Node
    api: PublicGrpcServer
    port: int
    stub: public_pb2_grpc.CornusStub
    keys: list[str]
    stopping: asyncio.Future[None] | None = None

    def hold_everything_but_commits(self) -> None:
        """n0's votes, and a termination's ABORT, wait: a commit outlives its caller's deadline."""
        self.cluster.faults["n0"].hold("log_once", where=lambda a: a["state"] is not TxnState.COMMIT)

    def stop(self) -> asyncio.Future[None]:
        self.stopping = asyncio.ensure_future(self.api.stop())
        return self.stopping


@contextlib.asynccontextmanager
async def _served(tmp_path: Path) -> AsyncIterator[_Served]:
    async with local_cluster(tmp_path, partition_count=2) as cluster:
        node = cluster.node()
        api = PublicGrpcServer(node, "127.0.0.1:0")
        port = await api.start()
        keys = list(keys_in(2, ["p0", "p1"]).values())
        served = None
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                served = _Served(cluster, node, api, port, public_pb2_grpc.CornusStub(channel), keys)
                yield served
        finally:
            cluster.faults["n0"].heal()  # opens every hold
            if served is None or served.stopping is None:
                await api.stop()
            else:
                await served.stopping


async def _decided(node: Node, txn: str) -> Outcome:
    async def decided() -> bool:
        known = await node.resolve_status(txn)
        return known is not None and known.status in (OutcomeStatus.COMMITTED, OutcomeStatus.ABORTED)

    await wait_until(decided, 20, f"{txn} never decided")
    outcome = await node.resolve_status(txn)
    assert outcome is not None
    return outcome


async def test_an_execute_past_its_deadline_names_its_transaction_for_status(tmp_path):
    """Its deadline passed while its commit ran: the caller got DEADLINE_EXCEEDED and no
    transaction id, and the commit went on and committed."""
    async with _served(tmp_path) as served:
        served.hold_everything_but_commits()
        ops = [pb.Op(kind=pb.OP_KIND_PUT, key=k, value=b"v") for k in served.keys]
        call = served.stub.Execute(pb.ExecuteRequest(ops=ops), timeout=0.5)
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await call
        assert error.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        txn = dict(await call.initial_metadata()).get(TXN_METADATA_KEY, "")
        assert txn, "the caller was not told which transaction to ask Status about"
        served.cluster.faults["n0"].heal()
        outcome = await _decided(served.node, txn)
        expected = [b"v", b"v"] if outcome.status is OutcomeStatus.COMMITTED else [None, None]

        async def applied() -> bool:
            # The status call tells the decision from the logs; the participants apply it a moment
            # later (the fresh-clone suite read storage in between once).
            return [await served.cluster.value(k) for k in served.keys] == expected

        await wait_until(applied, 10, lambda: f"{txn} is {outcome.status}, and storage does not say so")


async def test_the_example_client_names_the_transaction_to_ask_about(tmp_path, capsys):
    async with _served(tmp_path) as served:
        served.hold_everything_but_commits()
        keys = served.keys
        argv = ["--target", f"127.0.0.1:{served.port}", "--timeout-s", "0.5", "put", keys[0], "v", "put", keys[1], "v"]
        assert await asyncio.to_thread(example.main, argv) == 3  # the sync client, off the server's loop
        err = capsys.readouterr().err
        assert "DEADLINE_EXCEEDED" in err and "ask with --status " in err, err


async def test_a_commit_cut_by_the_server_s_stop_is_unknown_not_unavailable(tmp_path, monkeypatch):
    monkeypatch.setattr(grpc_server_module, "SHUTDOWN_GRACE_MS", 300)
    async with _served(tmp_path) as served:
        stub = served.stub
        txn = (await stub.Begin(pb.BeginRequest())).txn
        await stub.Write(pb.WriteRequest(txn=txn, writes=[pb.Write(key=k, value=b"v") for k in served.keys]))
        served.hold_everything_but_commits()
        commit = asyncio.ensure_future(stub.Commit(pb.TxnRequest(txn=txn), timeout=30))
        await asyncio.sleep(0.3)
        stopping = served.stop()
        answer = await commit  # an error status here fails the test
        assert answer.outcome == pb.OUTCOME_UNKNOWN and answer.txn == txn, answer
        served.cluster.faults["n0"].heal()
        await stopping
        await _decided(served.node, txn)


async def test_a_one_shot_the_server_s_stop_cuts_before_its_commit_never_commits(tmp_path, monkeypatch):
    """Answered before its commit started, it must not commit afterwards: the caller was told
    UNAVAILABLE, nothing changed."""
    monkeypatch.setattr(grpc_server_module, "SHUTDOWN_GRACE_MS", 300)
    async with _served(tmp_path) as served:
        # Hold the operations (the owners' data reads), so the stop comes before the commit.
        served.cluster.faults["n0"].hold("read_data")
        ops = [pb.Op(kind=pb.OP_KIND_GET, key=k) for k in served.keys]
        ops += [pb.Op(kind=pb.OP_KIND_PUT, key=k, value=b"v") for k in served.keys]
        execute = asyncio.ensure_future(served.stub.Execute(pb.ExecuteRequest(ops=ops), timeout=30))
        await asyncio.sleep(0.3)
        stopping = served.stop()
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await execute
        assert error.value.code() is grpc.StatusCode.UNAVAILABLE
        assert "nothing was committed" in (error.value.details() or "")
        served.cluster.faults["n0"].heal()
        await stopping
        await asyncio.sleep(1.0)
        assert [await served.cluster.value(k) for k in served.keys] == [None, None]


async def test_calls_on_an_open_transaction_are_served_while_the_node_is_not_ready(tmp_path, monkeypatch):
    """A node is not ready mid-life too (a preferred partition taken again after a lease ran out):
    REST served commit, abort, read and write of transactions already open then, and gRPC refused
    every call as UNAVAILABLE (found by review). gRPC leaves the gates to the node now, as REST
    does: the status call, whose verdict needs this node's partitions, still waits for ready."""
    async with _served(tmp_path) as served:
        txn = (await served.stub.Begin(pb.BeginRequest(), timeout=5)).txn
        monkeypatch.setattr(Node, "ready", property(lambda self: False))
        await served.stub.Write(pb.WriteRequest(txn=txn, writes=[pb.Write(key=served.keys[0], value=b"w")]), timeout=5)
        assert (await served.stub.Commit(pb.TxnRequest(txn=txn), timeout=5)).outcome == pb.OUTCOME_COMMITTED
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await served.stub.Status(pb.TxnRequest(txn=txn), timeout=5)
        assert refused.value.code() is grpc.StatusCode.UNAVAILABLE, refused.value


async def test_a_one_shot_refused_for_room_leaves_its_client_chosen_id_free(tmp_path, monkeypatch):
    """Refused before anything ran (no room for its writes on the coordinator: UNAVAILABLE, retry
    later), a one-shot's client-chosen id was kept as a transaction that ended, and the retry the
    answer asks for, with the same id, was refused as "already known" (found by review; REST
    frees it). Not while an earlier process of the node may have run the id (found by audit,
    2026-11-28, second: UNAVAILABLE, and the client ran it again under a new id): then
    OUTCOME_UNKNOWN, and the id stays known."""
    monkeypatch.setattr(coordination, "WRITES_HELD_BYTES_MAX", 1_000)
    async with _served(tmp_path) as served:
        now_ms = int(time.time() * 1000)
        ops = [pb.Op(kind=pb.OP_KIND_PUT, key=served.keys[0], value=b"v" * 5_000)]
        taken_just_now = client_txn_id(now_ms, served.node.node_id, secrets.token_hex(16), Protocol.CORNUS)
        request = pb.ExecuteRequest(txn=taken_just_now, ops=ops)
        in_doubt = await served.stub.Execute(request, timeout=5)
        assert in_doubt.outcome == pb.OUTCOME_UNKNOWN and "writes" in in_doubt.detail, in_doubt
        assert (await served.stub.Execute(request, timeout=5)).outcome == pb.OUTCOME_UNKNOWN  # "already known"
        # The node's identity was taken long before: no earlier process runs, and nothing ran.
        monkeypatch.setattr(served.node.coordination, "identity_taken_unix_ms", lambda: now_ms - 600_000)
        txn = client_txn_id(now_ms, served.node.node_id, secrets.token_hex(16), Protocol.CORNUS)
        request = pb.ExecuteRequest(txn=txn, ops=ops)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await served.stub.Execute(request, timeout=5)
        assert refused.value.code() is grpc.StatusCode.UNAVAILABLE, refused.value
        monkeypatch.setattr(coordination, "WRITES_HELD_BYTES_MAX", 10_000_000)
        assert (await served.stub.Execute(request, timeout=5)).outcome == pb.OUTCOME_COMMITTED


async def test_an_execute_whose_own_id_an_earlier_delivery_may_have_run_is_unknown_not_an_error(tmp_path):
    """Found by audit (2026-11-27): an Execute carrying its own txn that the node had already run
    was FAILED_PRECONDITION, and one whose id named another node (behind a load balancer) or began
    before the node's restart INVALID_ARGUMENT, both documented in public.proto as "changed
    nothing": a client behind a proxy that delivers a call twice ran its transaction again. Each
    is OUTCOME_UNKNOWN now, as REST's SDK concludes; a begin ahead of the node's clock, which no
    delivery could have run, is still INVALID_ARGUMENT."""
    async with _served(tmp_path) as served:
        node = served.node.node_id
        now_ms = int(time.time() * 1000)
        txn = client_txn_id(now_ms, node, secrets.token_hex(16), Protocol.CORNUS)
        request = pb.ExecuteRequest(txn=txn, ops=[pb.Op(kind=pb.OP_KIND_PUT, key=served.keys[0], value=b"v")])
        assert (await served.stub.Execute(request, timeout=5)).outcome == pb.OUTCOME_COMMITTED
        again = await served.stub.Execute(
            pb.ExecuteRequest(txn=txn, ops=[pb.Op(kind=pb.OP_KIND_PUT, key=served.keys[0], value=b"w")]),
            timeout=5)  # a second delivery of the id (its ops, if run, would write w)
        assert again.outcome == pb.OUTCOME_UNKNOWN and again.txn == txn, again
        # The calls below write another value, which must never land: none of them runs.
        other_ops = [pb.Op(kind=pb.OP_KIND_PUT, key=served.keys[0], value=b"w")]
        elsewhere = client_txn_id(now_ms, node + "x", secrets.token_hex(16), Protocol.CORNUS)
        other = await served.stub.Execute(pb.ExecuteRequest(txn=elsewhere, ops=other_ops), timeout=5)
        assert other.outcome == pb.OUTCOME_UNKNOWN and other.txn == elsewhere, other
        old = client_txn_id(now_ms - 60_000, node, secrets.token_hex(16), Protocol.CORNUS)
        late = await served.stub.Execute(pb.ExecuteRequest(txn=old, ops=other_ops), timeout=5)
        assert late.outcome == pb.OUTCOME_UNKNOWN and late.txn == old, late
        ahead = client_txn_id(now_ms + 60_000, node, secrets.token_hex(16), Protocol.CORNUS)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await served.stub.Execute(pb.ExecuteRequest(txn=ahead, ops=other_ops), timeout=5)
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT, refused.value
        # The first commit is applied after its reply (Cornus answers once the votes are in), and
        # nothing the later calls carried ever is.
        async def first_applied() -> bool:
            return await served.cluster.value(served.keys[0]) == b"v"

        await wait_until(first_applied, 5, "the first commit was not applied")
