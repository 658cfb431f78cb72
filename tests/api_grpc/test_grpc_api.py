"""The public gRPC API on a real 3-node cluster: outcomes as REST gives them, bad input refused with
the right status code and nothing changed, reflection, and the example client."""

from __future__ import annotations

import secrets
import subprocess
import sys
import time
import uuid
from collections.abc import Callable

import grpc
import pytest
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from cornus.protocol.config import Protocol
from cornus.protocol.txn_ids import client_txn_id
from services.public_api._generated import public_pb2 as pb
from services.public_api._generated import public_pb2_grpc
from storage_adapters.contract import DATA_KEY_BYTES_MAX, DATA_VALUE_BYTES_MAX, REDO_BYTES_MAX
from tests.api_grpc.conftest import TIMEOUT_S_CALL, get, put, read_back
from tests.cluster.harness import Cluster, keys_on, unknown_txn_id

Stubs = dict[str, public_pb2_grpc.CornusStub]
# RuntimeLimits.op_count_max, which the cluster runs with.
OP_COUNT_MAX = 1_000


def test_execute_commits_across_partitions_and_status_agrees(cluster: Cluster, stubs: Stubs) -> None:
    keys = [keys_on(f"p{i}", 6, 1, prefix="exec")[0] for i in range(6)]  # every node a participant
    # Bytes that are not UTF-8: gRPC carries values as bytes, unlike REST.
    values = {key: f"v-{key}".encode() + b"\xff\x00" for key in keys}
    outcome = stubs["n0"].Execute(
        pb.ExecuteRequest(ops=[put(k, v) for k, v in values.items()] + [get("exec-never-written")]),
        timeout=TIMEOUT_S_CALL,
    )
    assert outcome.outcome == pb.OUTCOME_COMMITTED, outcome
    assert outcome.reason == pb.ABORT_REASON_UNSPECIFIED and not outcome.retryable
    assert [(r.key, r.HasField("value")) for r in outcome.reads] == [("exec-never-written", False)]
    assert outcome.timing_ms["total"] > 0
    assert read_back(stubs["n1"], keys) == values
    status = stubs["n2"].Status(pb.TxnRequest(txn=outcome.txn), timeout=TIMEOUT_S_CALL)
    assert status.outcome == pb.OUTCOME_COMMITTED and status.txn == outcome.txn


@pytest.mark.parametrize("protocol", ["cornus", "2pc", "coordinator-log"])
def test_protocol_is_chosen_per_transaction(stubs: Stubs, protocol: str) -> None:
    keys = [keys_on(f"p{i}", 6, 1, prefix=f"proto-{protocol}-")[0] for i in range(3)]
    outcome = stubs["n0"].Execute(pb.ExecuteRequest(ops=[put(k, protocol.encode()) for k in keys], protocol=protocol),
                                  timeout=TIMEOUT_S_CALL)
    assert outcome.outcome == pb.OUTCOME_COMMITTED, outcome
    tag = {"cornus": "cornus", "2pc": "2pc", "coordinator-log": "clog"}[protocol]
    assert outcome.txn.endswith("." + tag), outcome.txn  # the id names the protocol it ran
    txn = stubs["n1"].Begin(pb.BeginRequest(protocol=protocol), timeout=TIMEOUT_S_CALL).txn
    assert txn.endswith("." + tag), txn
    stubs["n1"].Write(pb.WriteRequest(txn=txn, writes=[pb.Write(key=keys[0], value=b"again")]), timeout=TIMEOUT_S_CALL)
    assert stubs["n1"].Commit(pb.TxnRequest(txn=txn), timeout=TIMEOUT_S_CALL).outcome == pb.OUTCOME_COMMITTED
    assert read_back(stubs["n2"], keys) == {keys[0]: b"again", keys[1]: protocol.encode(), keys[2]: protocol.encode()}


def test_single_key_put_and_get_mirror_rest(cluster: Cluster, stubs: Stubs) -> None:
    put_outcome = stubs["n1"].Put(pb.PutRequest(key="single", value=b"one"), timeout=TIMEOUT_S_CALL)
    assert put_outcome.outcome == pb.OUTCOME_COMMITTED, put_outcome
    got = stubs["n2"].Get(pb.GetRequest(key="single"), timeout=TIMEOUT_S_CALL)
    assert got.outcome == pb.OUTCOME_COMMITTED
    assert [(r.key, r.value) for r in got.reads] == [("single", b"one")]
    rest = cluster.get("n0", "/v1/kv/single")
    assert rest.status_code == 200 and rest.json()["reads"] == {"single": "one"}, rest.text
    empty = stubs["n0"].Put(pb.PutRequest(key="single-empty", value=b""), timeout=TIMEOUT_S_CALL)
    assert empty.outcome == pb.OUTCOME_COMMITTED  # an empty value is a value, not a missing one
    assert read_back(stubs["n0"], ["single-empty"]) == {"single-empty": b""}


def test_interactive_read_write_commit(stubs: Stubs) -> None:
    keys = [keys_on(f"p{i}", 6, 1, prefix="inter")[0] for i in range(3)]
    assert stubs["n0"].Execute(pb.ExecuteRequest(ops=[put(k, b"old") for k in keys]),
                               timeout=TIMEOUT_S_CALL).outcome == pb.OUTCOME_COMMITTED
    txn = stubs["n2"].Begin(pb.BeginRequest(), timeout=TIMEOUT_S_CALL).txn
    read = stubs["n2"].Read(pb.ReadRequest(txn=txn, keys=[keys[0], "inter-absent"]), timeout=TIMEOUT_S_CALL)
    assert read.outcome.outcome == pb.OUTCOME_ACTIVE
    assert [(v.key, v.value if v.HasField("value") else None) for v in read.values] == [
        (keys[0], b"old"), ("inter-absent", None)
    ]
    written = stubs["n2"].Write(
        pb.WriteRequest(txn=txn, writes=[pb.Write(key=keys[0], value=b"new"), pb.Write(key=keys[1], delete=True)]),
        timeout=TIMEOUT_S_CALL,
    )
    assert written.txn == txn and written.outcome.outcome == pb.OUTCOME_ACTIVE
    assert stubs["n2"].Status(pb.TxnRequest(txn=txn), timeout=TIMEOUT_S_CALL).outcome == pb.OUTCOME_ACTIVE
    committed = stubs["n2"].Commit(pb.TxnRequest(txn=txn), timeout=TIMEOUT_S_CALL)
    assert committed.outcome == pb.OUTCOME_COMMITTED, committed
    assert read_back(stubs["n1"], keys) == {keys[0]: b"new", keys[1]: None, keys[2]: b"old"}
    assert stubs["n0"].Status(pb.TxnRequest(txn=txn), timeout=TIMEOUT_S_CALL).outcome == pb.OUTCOME_COMMITTED


def test_abort_then_commit_is_failed_precondition_and_changes_nothing(stubs: Stubs) -> None:
    assert stubs["n0"].Put(pb.PutRequest(key="aborted", value=b"base"),
                           timeout=TIMEOUT_S_CALL).outcome == pb.OUTCOME_COMMITTED
    txn = stubs["n1"].Begin(pb.BeginRequest(), timeout=TIMEOUT_S_CALL).txn
    stubs["n1"].Write(pb.WriteRequest(txn=txn, writes=[pb.Write(key="aborted", value=b"never")]),
                      timeout=TIMEOUT_S_CALL)
    aborted = stubs["n1"].Abort(pb.TxnRequest(txn=txn), timeout=TIMEOUT_S_CALL)
    assert aborted.outcome == pb.OUTCOME_ABORTED and aborted.reason == pb.ABORT_REASON_CLIENT
    assert not aborted.retryable
    with pytest.raises(grpc.RpcError) as refused:
        stubs["n1"].Commit(pb.TxnRequest(txn=txn), timeout=TIMEOUT_S_CALL)
    assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION, refused.value
    assert "already ended" in refused.value.details()
    assert read_back(stubs["n2"], ["aborted"]) == {"aborted": b"base"}
    assert stubs["n0"].Status(pb.TxnRequest(txn=txn), timeout=TIMEOUT_S_CALL).outcome == pb.OUTCOME_ABORTED


def test_conflict_is_an_aborted_outcome_not_an_error(stubs: Stubs) -> None:
    first = stubs["n0"].Begin(pb.BeginRequest(), timeout=TIMEOUT_S_CALL).txn
    stubs["n0"].Write(pb.WriteRequest(txn=first, writes=[pb.Write(key="contended", value=b"first")]),
                      timeout=TIMEOUT_S_CALL)
    second = stubs["n1"].Execute(pb.ExecuteRequest(ops=[put("contended", b"second")]), timeout=TIMEOUT_S_CALL)
    assert second.outcome == pb.OUTCOME_ABORTED and second.reason == pb.ABORT_REASON_CONFLICT, second
    assert second.retryable
    # An interactive read of the locked key aborts its own transaction, and says so in the body.
    reader = stubs["n2"].Begin(pb.BeginRequest(), timeout=TIMEOUT_S_CALL).txn
    read = stubs["n2"].Read(pb.ReadRequest(txn=reader, keys=["contended"]), timeout=TIMEOUT_S_CALL)
    assert read.outcome.outcome == pb.OUTCOME_ABORTED and read.outcome.reason == pb.ABORT_REASON_CONFLICT
    assert not read.values
    assert stubs["n0"].Commit(pb.TxnRequest(txn=first), timeout=TIMEOUT_S_CALL).outcome == pb.OUTCOME_COMMITTED
    assert read_back(stubs["n2"], ["contended"]) == {"contended": b"first"}


def test_failed_check_aborts_and_writes_nothing(stubs: Stubs) -> None:
    assert stubs["n0"].Put(pb.PutRequest(key="checked", value=b"base"),
                           timeout=TIMEOUT_S_CALL).outcome == pb.OUTCOME_COMMITTED
    outcome = stubs["n1"].Execute(
        pb.ExecuteRequest(ops=[put("checked", b"no"), pb.Op(kind=pb.OP_KIND_CHECK, key="checked-other")]),
        timeout=TIMEOUT_S_CALL,
    )
    assert outcome.outcome == pb.OUTCOME_COMMITTED  # a check without a value: the key must be absent
    outcome = stubs["n1"].Execute(
        pb.ExecuteRequest(ops=[put("checked", b"no2"), pb.Op(kind=pb.OP_KIND_CHECK, key="checked", value=b"base")]),
        timeout=TIMEOUT_S_CALL,
    )
    assert outcome.outcome == pb.OUTCOME_ABORTED and outcome.reason == pb.ABORT_REASON_CHECK_FAILED, outcome
    assert not outcome.retryable
    assert read_back(stubs["n2"], ["checked"]) == {"checked": b"no"}


# --- bad input: each refused with its status code, and nothing changed ---------------------------

Stub = public_pb2_grpc.CornusStub
BadCall = Callable[[Stub, str, str], object]  # (stub, a key holding b"base", an open txn) -> the call
INVALID, NOT_FOUND = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND
T = TIMEOUT_S_CALL


def _execute(make_ops: Callable[[str], list[pb.Op]], protocol: str = "") -> BadCall:
    return lambda stub, key, txn: stub.Execute(pb.ExecuteRequest(ops=make_ops(key), protocol=protocol), timeout=T)


def _write(make_writes: Callable[[str], list[pb.Write]]) -> BadCall:
    return lambda stub, key, txn: stub.Write(pb.WriteRequest(txn=txn, writes=make_writes(key)), timeout=T)


BAD_INPUT: dict[str, tuple[BadCall, grpc.StatusCode, str]] = {
    "empty key": (_execute(lambda k: [put(k, b"bad"), put("", b"bad")]), INVALID, "key must not be empty"),
    "oversized key": (_execute(lambda k: [put(k, b"bad"), put("k" * (DATA_KEY_BYTES_MAX + 1), b"bad")]),
                      INVALID, f"is {DATA_KEY_BYTES_MAX + 1} bytes, the limit is {DATA_KEY_BYTES_MAX}"),
    "oversized value": (_execute(lambda k: [put(k, b"x" * (DATA_VALUE_BYTES_MAX + 1))]),
                        INVALID, f"is {DATA_VALUE_BYTES_MAX + 1} bytes, the limit is {DATA_VALUE_BYTES_MAX}"),
    "too many ops": (_execute(lambda k: [put(k, b"bad")] + [put(f"many{i}", b"bad") for i in range(OP_COUNT_MAX)]),
                     INVALID, f"{OP_COUNT_MAX + 1} operations, the limit is {OP_COUNT_MAX}"),
    "no ops": (_execute(lambda k: []), INVALID, "no operations"),
    # Each redo fits its partition's record; all of them together do not fit the one coordinator
    # record coordinator-log keeps them in (and the same writes fit cornus or 2pc).
    "coordinator-log redo bundle over one record": (
        _execute(lambda k: [put(k, b"bad")] + [put(keys_on(f"p{i}", 6, 1, prefix="bundle")[0], b"x" * 60_000)
                                               for i in range(3)], protocol="coordinator-log"),
        INVALID, "in one coordinator record, which would take"),
    "writes over one redo record": (
        _execute(lambda k: [put(k, b"bad")] + [put(key, b"x" * DATA_VALUE_BYTES_MAX)
                                               for key in keys_on("p0", 6, 3, prefix="redo")]),
        INVALID, f"{REDO_BYTES_MAX} bytes (REDO_BYTES_MAX)"),
    "execute put without value": (_execute(lambda k: [pb.Op(kind=pb.OP_KIND_PUT, key=k)]),
                                  INVALID, "a put op needs a value"),
    "get with value": (_execute(lambda k: [put(k, b"bad"), pb.Op(kind=pb.OP_KIND_GET, key=k, value=b"x")]),
                       INVALID, "a get op takes no value"),
    "unspecified op kind": (_execute(lambda k: [put(k, b"bad"), pb.Op(key=k, value=b"bad")]),
                            INVALID, "kind 0 is not one of"),
    "unknown protocol": (_execute(lambda k: [put(k, b"bad")], protocol="paxos"),
                         INVALID, "protocol 'paxos' is not one of"),
    "put rpc without value": (lambda stub, key, txn: stub.Put(pb.PutRequest(key=key), timeout=T),
                              INVALID, "a put needs a value"),
    "write without value or delete": (_write(lambda k: [pb.Write(key=k)]), INVALID, "needs a value or delete=true"),
    "write of one key twice": (_write(lambda k: [pb.Write(key=k, value=b"a"), pb.Write(key=k, delete=True)]),
                               INVALID, "is written twice"),
    "write of an oversized value": (_write(lambda k: [pb.Write(key=k, value=b"x" * (DATA_VALUE_BYTES_MAX + 1))]),
                                    INVALID, f"the limit is {DATA_VALUE_BYTES_MAX}"),
    "read of no keys": (lambda stub, key, txn: stub.Read(pb.ReadRequest(txn=txn), timeout=T), INVALID, "no keys"),
    "malformed txn id": (lambda stub, key, txn: stub.Commit(pb.TxnRequest(txn="bad id/"), timeout=T),
                         INVALID, "is not a letter or digit, then"),
    # REST refuses both (422); the status call over gRPC said "never known" (NOT_FOUND) of a
    # committed transaction's id sent with a line's newline (found by review).
    "txn id with a trailing newline": (
        lambda stub, key, txn: stub.Status(pb.TxnRequest(txn=f"{txn}\n"), timeout=T), INVALID, "is not a letter"),
    "txn id that starts with an underscore": (
        lambda stub, key, txn: stub.Commit(pb.TxnRequest(txn=f"_{txn}"), timeout=T), INVALID, "is not a letter"),
    "empty txn id": (lambda stub, key, txn: stub.Status(pb.TxnRequest(), timeout=T), INVALID, "txn must not be empty"),
    "write in an unknown txn": (
        lambda stub, key, txn: stub.Write(
            pb.WriteRequest(txn="1.n9.000000.1", writes=[pb.Write(key=key, value=b"bad")]), timeout=T),
        NOT_FOUND, "no transaction 1.n9.000000.1"),
    "commit of an unknown txn": (lambda stub, key, txn: stub.Commit(pb.TxnRequest(txn="1.n9.000000.2"), timeout=T),
                                 NOT_FOUND, "no transaction 1.n9.000000.2"),
    "status of an unknown txn": (lambda stub, key, txn: stub.Status(pb.TxnRequest(txn=unknown_txn_id()), timeout=T),
                                 NOT_FOUND, "known to this cluster"),
}


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_is_refused_and_changes_nothing(stubs: Stubs, case: str) -> None:
    call, code, message = BAD_INPUT[case]
    key = "bad-" + case.replace(" ", "-")
    stub = stubs["n1"]
    assert stub.Put(pb.PutRequest(key=key, value=b"base"), timeout=TIMEOUT_S_CALL).outcome == pb.OUTCOME_COMMITTED
    txn = stub.Begin(pb.BeginRequest(), timeout=TIMEOUT_S_CALL).txn
    with pytest.raises(grpc.RpcError) as refused:
        call(stub, key, txn)
    assert refused.value.code() is code, refused.value
    assert message in refused.value.details(), refused.value.details()
    # The refused call left the open transaction as it was: still active, with nothing buffered.
    committed = stub.Commit(pb.TxnRequest(txn=txn), timeout=TIMEOUT_S_CALL)
    assert committed.outcome == pb.OUTCOME_COMMITTED, committed
    assert read_back(stubs["n2"], [key, "many0", f"many{OP_COUNT_MAX - 1}"]) == {
        key: b"base", "many0": None, f"many{OP_COUNT_MAX - 1}": None
    }


def test_a_request_that_does_not_parse_is_invalid_argument(cluster: Cluster) -> None:
    """Protobuf refuses a string field that is not UTF-8 as it parses the request, before any
    servicer runs: grpc answered that with UNKNOWN ("Exception deserializing request!"), a code
    clients may take for "maybe it ran". Now INVALID_ARGUMENT, naming the request type."""
    key = "utf8-bad-k"
    op = pb.Op(kind=pb.OP_KIND_PUT, key=key, value=b"bad").SerializeToString()
    raw_op = op.replace(key.encode(), b"utf8-bad-\xff")
    assert len(raw_op) == len(op) < 128
    raw_request = b"\x0a" + bytes([len(raw_op)]) + raw_op  # ExecuteRequest.ops, field 1, one Op
    with grpc.insecure_channel(cluster.nodes["n1"].grpc_target) as channel:
        execute = channel.unary_unary(f"/{pb.DESCRIPTOR.services_by_name['Cornus'].full_name}/Execute")
        with pytest.raises(grpc.RpcError) as refused:
            execute(raw_request, timeout=T)
    assert refused.value.code() is INVALID, refused.value
    assert "not a valid ExecuteRequest" in refused.value.details(), refused.value.details()


# --- reflection and the example client ------------------------------------------------------------


def test_reflection_lists_and_describes_the_service(cluster: Cluster) -> None:
    with grpc.insecure_channel(cluster.nodes["n0"].grpc_target) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        services = set(database.get_services())
        assert {"cornus.public.v1.Cornus", "grpc.health.v1.Health"} <= services, services
        described = database.FindFileContainingSymbol("cornus.public.v1.Cornus")
    assert described.package == "cornus.public.v1"
    (service,) = [s for s in described.service if s.name == "Cornus"]
    assert [m.name for m in service.method] == [
        "Execute", "Begin", "Read", "Write", "Commit", "Abort", "Status", "Get", "Put"
    ]


def test_example_client_executes_and_reports(cluster: Cluster) -> None:
    target = cluster.nodes["n2"].grpc_target
    command = [sys.executable, "-m", "services.public_api.example", "--target", target]
    done = subprocess.run([*command, "put", "example", "42", "get", "example-absent"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "outcome:   OUTCOME_COMMITTED" in done.stdout and "example-absent = (absent)" in done.stdout
    txn = done.stdout.splitlines()[0].removeprefix("txn:").strip()
    status = subprocess.run([*command, "--status", txn], capture_output=True, text=True, timeout=60, check=False)
    assert status.returncode == 0 and "OUTCOME_COMMITTED" in status.stdout, status
    refused = subprocess.run([*command, "put", "", "x"], capture_output=True, text=True, timeout=60, check=False)
    assert refused.returncode == 3 and "INVALID_ARGUMENT: key must not be empty" in refused.stderr, refused


def _client_id(node: str = "n0", begin_ms: int | None = None) -> str:
    # The nodes run on this machine: its clock is theirs, so a begin of a few ms ago is accepted.
    begin_ms = int(time.time() * 1000) - 5 if begin_ms is None else begin_ms
    return client_txn_id(begin_ms, node, secrets.token_hex(16), Protocol.CORNUS)


def test_execute_under_a_client_chosen_id_runs_once_and_status_knows_it(stubs: Stubs) -> None:
    key = f"cid-{uuid.uuid4().hex[:10]}"
    txn = _client_id()
    outcome = stubs["n0"].Execute(pb.ExecuteRequest(ops=[put(key, b"first")], txn=txn), timeout=TIMEOUT_S_CALL)
    assert outcome.outcome == pb.OUTCOME_COMMITTED and outcome.txn == txn, outcome
    for node in ("n0", "n2"):  # its coordinator, and a node that asks it
        status = stubs[node].Status(pb.TxnRequest(txn=txn), timeout=TIMEOUT_S_CALL)
        assert status.outcome == pb.OUTCOME_COMMITTED, (node, status)
    # The same id again (a proxy's second delivery, or a caller's mistake) runs nothing, and is
    # unknown rather than an error status, which would say "changed nothing" of the first.
    again = stubs["n0"].Execute(pb.ExecuteRequest(ops=[put(key, b"second")], txn=txn), timeout=TIMEOUT_S_CALL)
    assert again.outcome == pb.OUTCOME_UNKNOWN and again.txn == txn and "already known" in again.detail, again
    assert read_back(stubs["n0"], [key]) == {key: b"first"}


@pytest.mark.parametrize(("make", "words"), [
    # An earlier delivery of the call may have run these (the node the id names, behind a load
    # balancer; this node, before the id grew old): unknown, and nothing ran here.
    (lambda: _client_id(node="n1"), "must name the node it is sent to"),
    (lambda: _client_id(begin_ms=int(time.time() * 1000) - 5_000), "behind this node's clock"),
])
def test_a_client_chosen_id_an_earlier_delivery_may_have_run_is_unknown_and_runs_nothing(
    stubs: Stubs, make: Callable[[], str], words: str,
) -> None:
    key = f"cid-{uuid.uuid4().hex[:10]}"
    outcome = stubs["n0"].Execute(pb.ExecuteRequest(ops=[put(key, b"v")], txn=make()), timeout=TIMEOUT_S_CALL)
    assert outcome.outcome == pb.OUTCOME_UNKNOWN and words in outcome.detail, outcome
    assert read_back(stubs["n0"], [key]) == {key: None}


@pytest.mark.parametrize(("make", "words"), [
    (lambda: _client_id(begin_ms=int(time.time() * 1000) + 5_000), "ahead of this node's clock"),
    (lambda: _client_id().replace(".c", ".cXYZ", 1), "the token must be"),
    (lambda: _client_id().rsplit(".", 1)[0], "not a protocol tag"),
    (lambda: "a/b", "is not a letter or digit, then"),
])
def test_a_bad_client_chosen_id_is_invalid_argument_and_changes_nothing(
    stubs: Stubs, make: Callable[[], str], words: str,
) -> None:
    key = f"cid-{uuid.uuid4().hex[:10]}"
    with pytest.raises(grpc.RpcError) as refused:
        stubs["n0"].Execute(pb.ExecuteRequest(ops=[put(key, b"v")], txn=make()), timeout=TIMEOUT_S_CALL)
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT, refused.value
    assert words in (refused.value.details() or ""), refused.value.details()
    assert read_back(stubs["n0"], [key]) == {key: None}
