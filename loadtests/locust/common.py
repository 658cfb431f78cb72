"""What the Locust files share: a user class per transport that runs the workloads of
loadtests.workloads (the same definitions `cornus bench` runs), the load phase, and the settings.

Every transaction is one Locust request of type `TXN` named after its kind (`ycsb`, `new_order`,
`payment`, `transfer`, `audit`): its response time is the whole transaction's, and it fails only
when the transaction did not commit, with the outcome in the error (`TxnNotCommitted('aborted: conflict')`,
`unavailable: ...`). The API calls inside it are reported too (type POST or gRPC), and count as
failures only when the node answered something the API does not promise (a 5xx, a malformed
answer): an abort is a normal answer. So a run's failures are its aborts and nothing else, unless
something is wrong.

Settings (environment variables, as Locust passes nothing else to a user class):
- CORNUS_WORKLOAD_KNOBS: the workload's knobs, `theta=0.9,read_fraction=0.5` (see each workload);
- CORNUS_PARTITIONS: the cluster's partition count (the HTTP users ask a node when unset);
- CORNUS_LOAD: `1` (default) loads the workload's data when the test starts, `0` skips it (the data
  of an earlier run of the same workload and knobs is still there);
- CORNUS_HOSTS: more REST URLs beside --host, comma-separated: each transaction goes to one at
  random, so every node coordinates.
Locust's gevent patching must come before redis or boto3 are imported (it fails otherwise); nothing
imported here imports either.
"""

from __future__ import annotations

import itertools
import os
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

# Run as `locust -f loadtests/locust/ycsb.py` from anywhere: Locust puts the file's own directory
# on sys.path, not the repository's, and a checkout need not be installed.
_REPO = Path(__file__).resolve().parents[2]
if str(_REPO) not in sys.path:
    sys.path.insert(0, str(_REPO))

import requests  # noqa: E402
from locust import HttpUser, User, events, task  # noqa: E402
from locust.exception import StopUser  # noqa: E402

from loadtests.workloads import make_workload  # noqa: E402
from loadtests.workloads.base import (  # noqa: E402
    Commit,
    Execute,
    Program,
    Read,
    Reply,
    Request,
    Workload,
    Write,
    parse_knobs,
)

# Deadline of one call; a commit waits up to 10 s for its outcome before the node answers 202.
TIMEOUT_S_CALL = 15.0
LOAD_KEYS_PER_REQUEST = 200
LOAD_ATTEMPT_COUNT_MAX = 20
_OUTCOME_STATUSES = (200, 202, 409, 503)


class TxnNotCommitted(Exception):
    """What a transaction that did not commit reports to Locust: `aborted: conflict`, ..."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class _Shared:
    """One workload of each name per Locust process, made on first use (every user of the process
    shares it, as the built-in driver's clients do)."""

    workloads: ClassVar[dict[str, Workload]] = {}
    clients = itertools.count()


def workload_for(name: str, partition_count: int) -> Workload:
    if name not in _Shared.workloads:
        _Shared.workloads[name] = make_workload(name, partition_count,
                                                parse_knobs(os.environ.get("CORNUS_WORKLOAD_KNOBS", "")))
    return _Shared.workloads[name]


def partition_count_from(rest_url: str) -> int:
    configured = os.environ.get("CORNUS_PARTITIONS", "").strip()
    if configured:
        return int(configured)
    answer = requests.get(f"{rest_url.rstrip('/')}/v1/partitions", timeout=TIMEOUT_S_CALL)
    answer.raise_for_status()
    return len(answer.json()["partitions"])


def drive(program: Program, call: Callable[[Request, str], tuple[Reply, str]]) -> Reply:
    """Run one transaction program to its end. `call(request, txn)` performs one request inside
    transaction `txn` ("" before the first begins; the caller begins it) and returns the reply
    and the transaction id now. Synchronous: under Locust, gevent makes the waits cooperative."""
    txn = ""
    reply = Reply("failed", "no request")
    try:
        request = next(program)
        while True:
            reply, txn = call(request, txn)
            if isinstance(request, Execute | Commit):
                txn = ""
                try:
                    program.send(reply)
                except StopIteration:
                    return reply
                raise RuntimeError("a workload program made a request after its transaction ended")
            if reply.outcome != "active":
                txn = ""
                return reply
            request = program.send(reply)
    finally:
        program.close()
        if txn:
            call_abort = getattr(call, "abort", None)
            if call_abort is not None:
                call_abort(txn)


def report(environment: Any, kind: str, started: float, reply: Reply) -> None:
    """One TXN request per transaction: failed exactly when it did not commit."""
    exception = None if reply.committed else TxnNotCommitted(f"{reply.outcome}: {reply.reason or '-'}")
    environment.events.request.fire(request_type="TXN", name=kind, response_time=(time.perf_counter() - started) * 1000,
                                    response_length=0, exception=exception, context={})


# === REST ========================================================================================


def _json(response: Any) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _outcome(status: int, body: dict[str, Any]) -> Reply:
    outcome = body.get("outcome")
    if status not in _OUTCOME_STATUSES or outcome not in ("committed", "aborted", "unavailable", "unknown"):
        return Reply("failed", str(body.get("error") or status))
    return Reply(outcome, str(body.get("reason") or body.get("detail") or ""), bool(body.get("retryable")),
                 dict(body.get("reads") or {}), dict(body.get("timing_ms") or {}))


class RestCalls:
    """A transaction's calls over Locust's HTTP client (one session per user)."""

    def __init__(self, client: Any, base: str) -> None:
        self.client = client
        self.base = base.rstrip("/")

    def _post(self, path: str, name: str, body: Any, ok: tuple[int, ...]) -> tuple[int, dict[str, Any]]:
        with self.client.post(f"{self.base}{path}", json=body, name=name, catch_response=True,
                              timeout=TIMEOUT_S_CALL) as response:
            if response.status_code in ok:
                response.success()
            else:
                response.failure(f"HTTP {response.status_code}: {response.text[:200]}")
            return response.status_code, _json(response)

    def __call__(self, request: Request, txn: str) -> tuple[Reply, str]:
        if isinstance(request, Execute):
            status, body = self._post("/v1/execute", "/v1/execute", {"ops": list(request.ops)}, _OUTCOME_STATUSES)
            return _outcome(status, body), ""
        if not txn:
            status, body = self._post("/v1/txn", "/v1/txn (begin)", {}, (201, 503))
            txn = str(body.get("txn", "")) if status == 201 else ""
            if not txn:
                return Reply("unavailable" if status == 503 else "failed", f"begin {status}"), ""
        if isinstance(request, Commit):
            status, body = self._post(f"/v1/txn/{txn}/commit", "/v1/txn/[id]/commit", None, _OUTCOME_STATUSES)
            return _outcome(status, body), ""
        if isinstance(request, Read):
            status, body = self._post(f"/v1/txn/{txn}/read", "/v1/txn/[id]/read", {"keys": list(request.keys)},
                                      (200, 409))
        else:
            assert isinstance(request, Write)
            status, body = self._post(f"/v1/txn/{txn}/write", "/v1/txn/[id]/write",
                                      {"writes": dict(request.writes)}, (200, 409))
        if status == 200:
            return Reply("active", values=dict(body.get("values") or {})), txn
        return _outcome(status, body), ""

    def abort(self, txn: str) -> None:
        self._post(f"/v1/txn/{txn}/abort", "/v1/txn/[id]/abort", None, (200, 404, 409))


class CornusHttpUser(HttpUser):
    """Runs `workload_name` over the REST API of --host (and CORNUS_HOSTS)."""

    abstract = True
    workload_name: ClassVar[str] = ""

    def on_start(self) -> None:
        self.workload = workload_for(self.workload_name, partition_count_from(self.host))
        self.index = next(_Shared.clients)
        self.rng = random.Random(f"{os.getpid()}/{self.index}")
        extra = [url.strip() for url in os.environ.get("CORNUS_HOSTS", "").split(",") if url.strip()]
        self.calls = [RestCalls(self.client, url) for url in [self.host, *extra]]

    @task
    def transaction(self) -> None:
        txn = self.workload.next_txn(self.rng, self.index)
        started = time.perf_counter()
        reply = drive(txn.program(), self.rng.choice(self.calls))
        report(self.environment, txn.kind, started, reply)


def load_over_rest(rest_url: str, workload_name: str) -> int:
    """The load phase over the REST API: every key of the workload's data, in one-shot batches of
    one partition each. Returns how many keys were written."""
    from cornus.runtime.keys import partition_of

    workload = workload_for(workload_name, partition_count_from(rest_url))
    data = workload.initial_data()
    by_partition: dict[str, list[str]] = {}
    for key in data:
        by_partition.setdefault(partition_of(key, workload.partition_count), []).append(key)
    written = 0
    with requests.Session() as session:
        for keys in by_partition.values():
            for start in range(0, len(keys), LOAD_KEYS_PER_REQUEST):
                batch = keys[start:start + LOAD_KEYS_PER_REQUEST]
                ops = [{"op": "put", "key": key, "value": data[key]} for key in batch]
                for _ in range(LOAD_ATTEMPT_COUNT_MAX):
                    answer = session.post(f"{rest_url.rstrip('/')}/v1/execute", json={"ops": ops},
                                          timeout=TIMEOUT_S_CALL)
                    if answer.status_code == 200:
                        written += len(batch)
                        break
                    time.sleep(0.05)
                else:
                    raise RuntimeError(f"load: a batch of {len(batch)} keys did not commit (last {answer.status_code})")
    return written


def install_rest_load(workload_name: str) -> None:
    """Load the workload's data when the test starts (CORNUS_LOAD=0 skips it)."""

    @events.test_start.add_listener
    def _load(environment: Any, **_: Any) -> None:
        if os.environ.get("CORNUS_LOAD", "1") == "0" or environment.host is None:
            return
        if type(environment.runner).__name__ == "WorkerRunner":
            return  # the master loads, once
        started = time.monotonic()
        count = load_over_rest(environment.host, workload_name)
        print(f"cornus: loaded {count} keys of {workload_name} in {time.monotonic() - started:.1f} s", flush=True)


__all__ = ["CornusHttpUser", "StopUser", "User", "drive", "install_rest_load", "report", "workload_for"]
