"""Locust users for the public gRPC API (services/public_api/public.proto), one per workload:

    locust -f loadtests/locust/grpc_users.py YcsbGrpcUser --host 127.0.0.1:18406 \\
        --headless -u 8 -r 8 -t 30s --csv out
    CORNUS_WORKLOAD_KNOBS=warehouses=4 locust -f loadtests/locust/grpc_users.py TpccGrpcUser --host ...

--host is a node's public gRPC address (grpc_api_listen; `grpc://` in front is accepted). The gRPC
API has no partition listing: set CORNUS_PARTITIONS to the cluster's partition count (the keys are
placed by it), or CORNUS_REST_URL to a node's REST URL to ask it. The load phase runs over gRPC
(CORNUS_LOAD=0 skips it). Transactions report as in common.py: one `TXN` request each, failed
exactly when it did not commit; every call as type `gRPC`, failed only on an error status.
"""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path
from typing import Any, ClassVar

# Locust puts this file's directory on sys.path, not the repository's: a checkout need not be
# installed to run it.
if str(Path(__file__).resolve().parents[2]) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

# gRPC's own threads must cooperate with gevent's loop, before any channel exists.
import grpc
import grpc.experimental.gevent as grpc_gevent

from cornus.runtime.keys import partition_of
from loadtests.locust.common import (
    TIMEOUT_S_CALL,
    User,
    _Shared,
    drive,
    events,
    partition_count_from,
    report,
    task,
    workload_for,
)
from loadtests.workloads.base import Commit, Execute, Read, Reply, Request, Write

grpc_gevent.init_gevent()

import services.public_api  # noqa: E402, F401 - builds the generated code before it is imported below
from services.public_api._generated import public_pb2 as pb  # noqa: E402
from services.public_api._generated import public_pb2_grpc  # noqa: E402

_OUTCOMES = {pb.OUTCOME_COMMITTED: "committed", pb.OUTCOME_ABORTED: "aborted", pb.OUTCOME_UNAVAILABLE: "unavailable",
             pb.OUTCOME_UNKNOWN: "unknown", pb.OUTCOME_ACTIVE: "active"}
_KINDS = {"get": pb.OP_KIND_GET, "put": pb.OP_KIND_PUT, "delete": pb.OP_KIND_DELETE}
LOAD_KEYS_PER_REQUEST = 200
LOAD_ATTEMPT_COUNT_MAX = 20


def _target(host: str) -> str:
    return host.removeprefix("grpc://").rstrip("/")


def _reply(outcome: Any) -> Reply:
    reason = "" if outcome.reason == pb.ABORT_REASON_UNSPECIFIED else \
        pb.AbortReason.Name(outcome.reason).removeprefix("ABORT_REASON_").lower()
    return Reply(_OUTCOMES.get(outcome.outcome, "failed"), reason or outcome.detail, outcome.retryable,
                 _values(outcome.reads), dict(outcome.timing_ms))


def _values(pairs: Any) -> dict[str, str | None]:
    return {kv.key: kv.value.decode("utf-8", "replace") if kv.HasField("value") else None for kv in pairs}


class GrpcCalls:
    """A transaction's calls over one channel, each reported to Locust as a `gRPC` request."""

    def __init__(self, stub: Any, environment: Any) -> None:
        self.stub = stub
        self.environment = environment

    def _call(self, name: str, method: Any, message: Any) -> Any:
        started = time.perf_counter()
        try:
            answer = method(message, timeout=TIMEOUT_S_CALL)
        except grpc.RpcError as error:
            self.environment.events.request.fire(request_type="gRPC", name=name,
                                                 response_time=(time.perf_counter() - started) * 1000,
                                                 response_length=0, exception=error, context={})
            return None
        self.environment.events.request.fire(request_type="gRPC", name=name,
                                             response_time=(time.perf_counter() - started) * 1000,
                                             response_length=answer.ByteSize(), exception=None, context={})
        return answer

    def __call__(self, request: Request, txn: str) -> tuple[Reply, str]:
        if isinstance(request, Execute):
            ops = [pb.Op(kind=_KINDS[op["op"]], key=op["key"],
                         value=op["value"].encode() if "value" in op else None) for op in request.ops]
            answer = self._call("Execute", self.stub.Execute, pb.ExecuteRequest(ops=ops))
            return (_reply(answer) if answer is not None else Reply("unknown", "rpc error")), ""
        if not txn:
            began = self._call("Begin", self.stub.Begin, pb.BeginRequest())
            if began is None:
                return Reply("failed", "begin rpc error"), ""
            txn = began.txn
        if isinstance(request, Commit):
            answer = self._call("Commit", self.stub.Commit, pb.TxnRequest(txn=txn))
            return (_reply(answer) if answer is not None else Reply("unknown", "rpc error")), ""
        if isinstance(request, Read):
            answer = self._call("Read", self.stub.Read, pb.ReadRequest(txn=txn, keys=list(request.keys)))
            if answer is None:
                return Reply("failed", "rpc error"), txn
            if answer.outcome.outcome != pb.OUTCOME_ACTIVE:
                return _reply(answer.outcome), ""
            return Reply("active", values=_values(answer.values)), txn
        assert isinstance(request, Write)
        writes = [pb.Write(key=key, delete=True) if value is None else pb.Write(key=key, value=value.encode())
                  for key, value in request.writes.items()]
        answer = self._call("Write", self.stub.Write, pb.WriteRequest(txn=txn, writes=writes))
        if answer is None:
            return Reply("failed", "rpc error"), txn
        if answer.outcome.outcome != pb.OUTCOME_ACTIVE:
            return _reply(answer.outcome), ""
        return Reply("active"), txn

    def abort(self, txn: str) -> None:
        self._call("Abort", self.stub.Abort, pb.TxnRequest(txn=txn))


def _partition_count() -> int:
    if os.environ.get("CORNUS_PARTITIONS", "").strip():
        return int(os.environ["CORNUS_PARTITIONS"])
    rest = os.environ.get("CORNUS_REST_URL", "").strip()
    if not rest:
        raise RuntimeError("the gRPC users need CORNUS_PARTITIONS (the partition count) or CORNUS_REST_URL")
    return partition_count_from(rest)


class CornusGrpcUser(User):
    abstract = True
    workload_name: ClassVar[str] = ""

    def on_start(self) -> None:
        self.workload = workload_for(self.workload_name, _partition_count())
        self.index = next(_Shared.clients)
        self.rng = random.Random(f"{os.getpid()}/{self.index}")
        self.channel = grpc.insecure_channel(_target(self.host))
        self.calls = GrpcCalls(public_pb2_grpc.CornusStub(self.channel), self.environment)

    def on_stop(self) -> None:
        self.channel.close()

    @task
    def transaction(self) -> None:
        txn = self.workload.next_txn(self.rng, self.index)
        started = time.perf_counter()
        reply = drive(txn.program(), self.calls)
        report(self.environment, txn.kind, started, reply)


class YcsbGrpcUser(CornusGrpcUser):
    workload_name = "ycsb"


class TpccGrpcUser(CornusGrpcUser):
    workload_name = "tpcc"


class BankGrpcUser(CornusGrpcUser):
    workload_name = "bank"


def load_over_grpc(target: str, workload_name: str) -> int:
    workload = workload_for(workload_name, _partition_count())
    data = workload.initial_data()
    keys = sorted(data, key=lambda key: partition_of(key, workload.partition_count))
    written = 0
    with grpc.insecure_channel(target) as channel:
        stub = public_pb2_grpc.CornusStub(channel)
        for start in range(0, len(keys), LOAD_KEYS_PER_REQUEST):
            batch = keys[start:start + LOAD_KEYS_PER_REQUEST]
            request = pb.ExecuteRequest(ops=[pb.Op(kind=pb.OP_KIND_PUT, key=key, value=data[key].encode())
                                             for key in batch])
            for _ in range(LOAD_ATTEMPT_COUNT_MAX):
                if stub.Execute(request, timeout=TIMEOUT_S_CALL).outcome == pb.OUTCOME_COMMITTED:
                    written += len(batch)
                    break
                time.sleep(0.05)
            else:
                raise RuntimeError(f"load: a batch of {len(batch)} keys did not commit")
    return written


@events.test_start.add_listener
def _load(environment: Any, **_: Any) -> None:
    if os.environ.get("CORNUS_LOAD", "1") == "0" or environment.host is None:
        return
    if type(environment.runner).__name__ == "WorkerRunner":
        return  # the master loads, once
    chosen = [cls for cls in environment.user_classes if issubclass(cls, CornusGrpcUser)]
    for name in dict.fromkeys(cls.workload_name for cls in chosen):
        started = time.monotonic()
        count = load_over_grpc(_target(environment.host), name)
        print(f"cornus: loaded {count} keys of {name} over gRPC in {time.monotonic() - started:.1f} s", flush=True)
