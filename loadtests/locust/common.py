"""What the Locust files share: the REST user class that runs the workloads of
loadtests.workloads (the same definitions `cornus bench` runs), the settings, and the reporting.
How a transaction runs as calls, what an answer means and the load phase are loadtests.api's,
shared with the built-in driver and the gRPC users (grpc_users.py).

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
- CORNUS_ADMIN_TOKEN: the nodes' admin token, where they have one (that question takes it);
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

from loadtests.api.exchange import Step, run  # noqa: E402
from loadtests.api.load import Ops, load, load_batches  # noqa: E402
from loadtests.api.replies import no_answer, rest_reply  # noqa: E402
from loadtests.api.rest import JSON_HEADERS, rest_call  # noqa: E402
from loadtests.workloads import make_workload  # noqa: E402
from loadtests.workloads.base import Program, Reply, Workload, one_shot, parse_knobs  # noqa: E402

# Deadline of one call; a commit waits up to 10 s for its outcome before the node answers 202.
TIMEOUT_S_CALL = 15.0


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
    token = os.environ.get("CORNUS_ADMIN_TOKEN")
    answer = requests.get(f"{rest_url.rstrip('/')}/v1/partitions", timeout=TIMEOUT_S_CALL,
                          headers={"Authorization": f"Bearer {token}"} if token else None)
    answer.raise_for_status()
    return len(answer.json()["partitions"])


def drive(program: Program, call: Callable[[Step], Reply]) -> Reply:
    """Run one transaction program to its end over `call` (loadtests.api.exchange). Synchronous:
    under Locust, gevent makes the waits cooperative."""
    return run(program, call)


def report(environment: Any, kind: str, started: float, reply: Reply) -> None:
    """One TXN request per transaction: failed exactly when it did not commit."""
    exception = None if reply.committed else TxnNotCommitted(f"{reply.outcome}: {reply.reason or '-'}")
    environment.events.request.fire(request_type="TXN", name=kind, response_time=(time.perf_counter() - started) * 1000,
                                    response_length=0, exception=exception, context={})


def load_workload(workload_name: str, partition_count: int, execute: Callable[[Ops], Reply]) -> int:
    """The load phase (loadtests.api.load) of the named workload, each batch committed by
    `execute`. Returns how many keys were written."""
    return load(load_batches(workload_for(workload_name, partition_count)), execute)


def executor(call: Callable[[Step], Reply]) -> Callable[[Ops], Reply]:
    """Run one one-shot transaction of `ops` over `call`."""
    return lambda ops: drive(one_shot(ops)(), call)


# === REST ========================================================================================


class RestCalls:
    """A transaction's calls over Locust's HTTP client (one session per user), each reported to
    Locust under its endpoint: failed only on an answer the API does not promise, or none."""

    def __init__(self, client: Any, base: str) -> None:
        self.client = client
        self.base = base.rstrip("/")

    def __call__(self, step: Step) -> Reply:
        call = rest_call(step)
        with self.client.post(f"{self.base}{call.path}", data=call.body, headers=JSON_HEADERS, name=call.name,
                              catch_response=True, timeout=TIMEOUT_S_CALL) as response:
            if response.status_code == 0:  # Locust's way of saying no answer came
                response.failure(f"no answer: {response.error!r}")
                return no_answer(step, type(response.error).__name__)
            if response.status_code in call.promised:
                response.success()
            else:
                response.failure(f"HTTP {response.status_code}: {response.text[:200]}")
            return rest_reply(step, response.status_code, response.content)


class PlainRestCalls:
    """The same calls over a plain requests session, reported nowhere (the load phase runs before
    the test and is not part of its statistics)."""

    def __init__(self, session: requests.Session, base: str) -> None:
        self.session = session
        self.base = base.rstrip("/")

    def __call__(self, step: Step) -> Reply:
        call = rest_call(step)
        try:
            answer = self.session.post(f"{self.base}{call.path}", data=call.body, headers=JSON_HEADERS,
                                       timeout=TIMEOUT_S_CALL)
        except requests.RequestException as error:
            return no_answer(step, type(error).__name__)
        return rest_reply(step, answer.status_code, answer.content)


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
    """The load phase over the REST API. Returns how many keys were written."""
    with requests.Session() as session:
        return load_workload(workload_name, partition_count_from(rest_url),
                             executor(PlainRestCalls(session, rest_url)))


def loads_here(environment: Any) -> bool:
    """Whether this Locust process loads the workload's data at test start: not when CORNUS_LOAD=0
    or no host is given, and only the master of a distributed run (it loads once for all)."""
    if os.environ.get("CORNUS_LOAD", "1") == "0" or environment.host is None:
        return False
    return type(environment.runner).__name__ != "WorkerRunner"


def install_rest_load(workload_name: str) -> None:
    """Load the workload's data when the test starts (CORNUS_LOAD=0 skips it)."""

    @events.test_start.add_listener
    def _load(environment: Any, **_: Any) -> None:
        if not loads_here(environment):
            return
        started = time.monotonic()
        count = load_over_rest(environment.host, workload_name)
        print(f"cornus: loaded {count} keys of {workload_name} in {time.monotonic() - started:.1f} s", flush=True)


__all__ = ["CornusHttpUser", "StopUser", "User", "drive", "install_rest_load", "report", "workload_for"]
