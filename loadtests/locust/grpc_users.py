"""Locust users for the public gRPC API (services/public_api/public.proto), one per workload:

    locust -f loadtests/locust/grpc_users.py YcsbGrpcUser --host 127.0.0.1:18406 \\
        --headless -u 8 -r 8 -t 30s --csv out
    CORNUS_WORKLOAD_KNOBS=warehouses=4 locust -f loadtests/locust/grpc_users.py TpccGrpcUser --host ...

--host is a node's public gRPC address (grpc_api_listen; `grpc://` in front is accepted). The gRPC
API has no partition listing: set CORNUS_PARTITIONS to the cluster's partition count (the keys are
placed by it), or CORNUS_REST_URL to a node's REST URL to ask it. The load phase runs over gRPC
(CORNUS_LOAD=0 skips it; loadtests.api.load, as every driver's). Transactions run and report as in
common.py: one `TXN` request each, failed exactly when it did not commit; every call as type
`gRPC`, failed only on an error status.
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

from loadtests.api.exchange import Abort, Begin, Call, Step
from loadtests.api.replies import no_answer, outcome_reply
from loadtests.locust.common import (
    TIMEOUT_S_CALL,
    User,
    _Shared,
    drive,
    events,
    executor,
    load_workload,
    loads_here,
    partition_count_from,
    report,
    task,
    workload_for,
)
from loadtests.workloads.base import Commit, Execute, Read, Reply

grpc_gevent.init_gevent()

import services.public_api  # noqa: E402, F401 - builds the generated code before it is imported below
from services.public_api._generated import public_pb2 as pb  # noqa: E402
from services.public_api._generated import public_pb2_grpc  # noqa: E402

_OUTCOMES = {pb.OUTCOME_COMMITTED: "committed", pb.OUTCOME_ABORTED: "aborted", pb.OUTCOME_UNAVAILABLE: "unavailable",
             pb.OUTCOME_UNKNOWN: "unknown"}
_KINDS = {"get": pb.OP_KIND_GET, "put": pb.OP_KIND_PUT, "delete": pb.OP_KIND_DELETE}
# Statuses only the node sends, for a call it refused without changing anything (public.proto);
# any other error status may come from the transport itself (UNAVAILABLE, DEADLINE_EXCEEDED), so
# the call's answer is as good as lost.
_REFUSED = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION)


def _target(host: str) -> str:
    return host.removeprefix("grpc://").rstrip("/")


def _reply(outcome: Any) -> Reply:
    """A TxnOutcome message as a Reply; ACTIVE (a Read or Write that did not end the
    transaction) is for the caller to handle."""
    reason = "" if outcome.reason == pb.ABORT_REASON_UNSPECIFIED else \
        pb.AbortReason.Name(outcome.reason).removeprefix("ABORT_REASON_").lower()
    return outcome_reply(_OUTCOMES.get(outcome.outcome, str(outcome.outcome)), reason, outcome.detail,
                         outcome.retryable, reads=_values(outcome.reads), timing_ms=dict(outcome.timing_ms))


def _values(pairs: Any) -> dict[str, str | None]:
    return {kv.key: kv.value.decode("utf-8", "replace") if kv.HasField("value") else None for kv in pairs}


class GrpcCalls:
    """A transaction's steps (loadtests.api.exchange) over one channel, each reported to Locust as
    a `gRPC` request, failed only on an error status."""

    def __init__(self, stub: Any, environment: Any | None) -> None:
        self.stub = stub
        self.environment = environment  # None: report nothing (the load phase)

    def _call(self, name: str, method: Any, message: Any) -> Any:
        """The answer, or the RpcError."""
        started = time.perf_counter()
        try:
            answer = method(message, timeout=TIMEOUT_S_CALL)
        except grpc.RpcError as error:
            self._report(name, started, 0, error)
            return error
        self._report(name, started, answer.ByteSize(), None)
        return answer

    def _report(self, name: str, started: float, length: int, error: Exception | None) -> None:
        if self.environment is not None:
            self.environment.events.request.fire(request_type="gRPC", name=name,
                                                 response_time=(time.perf_counter() - started) * 1000,
                                                 response_length=length, exception=error, context={})

    def __call__(self, step: Step) -> Reply:
        name, method, message = self._message(step)
        answer = self._call(name, method, message)
        if isinstance(answer, grpc.RpcError):
            code = answer.code() if isinstance(answer, grpc.Call) else None
            if code in _REFUSED:
                return Reply("failed", code.name.lower())
            if isinstance(step, Begin) and code == grpc.StatusCode.UNAVAILABLE:
                return Reply("unavailable", "unavailable", retryable=True)  # as REST's 503: nothing began
            return no_answer(step, f"rpc {code.name.lower() if code else 'error'}")
        if isinstance(step, Begin):
            return Reply("active", txn=answer.txn)
        if isinstance(step, Call) and not step.final:
            if answer.outcome.outcome == pb.OUTCOME_ACTIVE:
                return Reply("active", values=_values(getattr(answer, "values", ())))
            return _reply(answer.outcome)
        return _reply(answer)

    def _message(self, step: Step) -> tuple[str, Any, Any]:
        if isinstance(step, Begin):
            return "Begin", self.stub.Begin, pb.BeginRequest()
        if isinstance(step, Abort):
            return "Abort", self.stub.Abort, pb.TxnRequest(txn=step.txn)
        request = step.request
        if isinstance(request, Execute):
            ops = [pb.Op(kind=_KINDS[op["op"]], key=op["key"],
                         value=op["value"].encode() if "value" in op else None) for op in request.ops]
            return "Execute", self.stub.Execute, pb.ExecuteRequest(ops=ops)
        if isinstance(request, Commit):
            return "Commit", self.stub.Commit, pb.TxnRequest(txn=step.txn)
        if isinstance(request, Read):
            return "Read", self.stub.Read, pb.ReadRequest(txn=step.txn, keys=list(request.keys))
        writes = [pb.Write(key=key, delete=True) if value is None else pb.Write(key=key, value=value.encode())
                  for key, value in request.writes.items()]
        return "Write", self.stub.Write, pb.WriteRequest(txn=step.txn, writes=writes)


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
    """The load phase (loadtests.api.load) over the public gRPC API. Returns how many keys were
    written."""
    with grpc.insecure_channel(target) as channel:
        calls = GrpcCalls(public_pb2_grpc.CornusStub(channel), None)
        return load_workload(workload_name, _partition_count(), executor(calls))


@events.test_start.add_listener
def _load(environment: Any, **_: Any) -> None:
    if not loads_here(environment):
        return
    chosen = [cls for cls in environment.user_classes if issubclass(cls, CornusGrpcUser)]
    for name in dict.fromkeys(cls.workload_name for cls in chosen):
        started = time.monotonic()
        count = load_over_grpc(_target(environment.host), name)
        print(f"cornus: loaded {count} keys of {name} over gRPC in {time.monotonic() - started:.1f} s", flush=True)
