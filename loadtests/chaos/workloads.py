"""The two workloads, run by client threads against the nodes' REST APIs while faults happen.

Bank: interactive transfers between accounts spread over every partition (a read of both, a write
of both plus a per-transfer marker key), so the total never changes and every acknowledged
transfer leaves its marker. Register: each key has one writer that writes 1, 2, 3, ... as one-shot
transactions, and readers read single keys; every operation is recorded with its start and end
time (monotonic clock) and result, for the stale-read and lost-write checks.

A result is what the client was told: `committed` (200), `aborted` (409 with an outcome),
`unavailable` (503: the API promises nothing committed), `unknown` (202, or the connection broke
after the request went out: it may have committed), `failed` (refused before commit: the request
never reached a node, the transaction was not found, a 4xx).
"""

from __future__ import annotations

import random
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx

from cornus.protocol.config import Protocol
from cornus.protocol.txn_ids import client_txn_id
from tests.cluster.harness import keys_on

PROTOCOLS = ("cornus", "2pc", "coordinator-log")
RESULTS = ("committed", "aborted", "unavailable", "unknown", "failed")
# A commit waits up to 10 s for its outcome before the node answers 202 (TIMEOUT_MS_COMMIT in
# cornus/runtime/coordination.py); the other calls answer from the node at once or not at all.
TIMEOUT_COMMIT = httpx.Timeout(15.0, connect=2.0)
TIMEOUT_CALL = httpx.Timeout(5.0, connect=2.0)
BALANCE_START = 100
AMOUNT_MAX = 20
# After a failure the node is probably down or paused: do not spin on it.
FAILURE_PAUSE_S = 0.05
# Bounds on what one client thread does in a run, far above what a 10-minute run reaches.
OPS_PER_THREAD_MAX = 5_000_000
KEYS_PER_READ_MAX = 500
FINAL_READ_PAUSE_S = 0.1


@dataclass(frozen=True, slots=True)
class Answer:
    """What the client was told (one of RESULTS), and why: the API's abort reason or error code, the
    HTTP status, or the exception; prefixed with the step of an interactive transaction."""

    result: str
    why: str


@dataclass(slots=True)
class Tally:
    attempted: int = 0
    results: Counter[str] = field(default_factory=Counter)
    whys: Counter[str] = field(default_factory=Counter)

    def add(self, answer: Answer) -> None:
        self.attempted += 1
        self.results[answer.result] += 1
        self.whys[f"{answer.result}: {answer.why}"] += 1

    def to_json(self) -> dict[str, Any]:
        return {"attempted": self.attempted, **{name: self.results[name] for name in RESULTS},
                "why": dict(self.whys.most_common())}


@dataclass(slots=True)
class InFlight:
    """Client operations under way: the quiet phase waits for them to end."""

    count: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    @contextmanager
    def track(self) -> Iterator[None]:
        with self.lock:
            self.count += 1
        try:
            yield
        finally:
            with self.lock:
                self.count -= 1


def classify(response: httpx.Response, step: str = "") -> Answer:
    try:
        body = response.json()
    except ValueError:
        body = {}
    body = body if isinstance(body, dict) else {}
    outcome = body.get("outcome")
    why = f"{step}{body.get('reason') or body.get('error') or response.status_code}"
    if response.status_code == 200 and outcome == "committed":
        return Answer("committed", f"{step}200")
    if response.status_code == 409 and outcome == "aborted":
        return Answer("aborted", why)
    if response.status_code == 503:
        return Answer("unavailable", why)
    if response.status_code == 202:
        return Answer("unknown", why)
    return Answer("failed", f"{why} ({response.status_code})")


def classify_error(error: httpx.HTTPError, step: str = "") -> Answer:
    """A request that never left (refused, or no connection in time) cannot have committed."""
    result = "failed" if isinstance(error, httpx.ConnectError | httpx.ConnectTimeout) else "unknown"
    return Answer(result, f"{step}{type(error).__name__}")


class Workload:
    """Client threads over `urls()` (the nodes running now), stopped by one event."""

    name = "workload"

    def __init__(self, urls: Callable[[], Sequence[str]], seed: int, protocol: str, in_flight: InFlight) -> None:
        self.urls = urls
        self.seed = seed
        self.protocol = protocol
        self.in_flight = in_flight
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.lock = threading.Lock()
        self.errors: list[str] = []

    def _protocol(self, rng: random.Random) -> str | None:
        return rng.choice(PROTOCOLS) if self.protocol == "mixed" else None

    def _url(self, rng: random.Random) -> str | None:
        urls = self.urls()
        return rng.choice(list(urls)) if urls else None

    def _spawn(self, name: str, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=self._guard, args=(target, *args), name=name, daemon=True)
        self.threads.append(thread)
        thread.start()

    def _guard(self, target: Callable[..., None], *args: object) -> None:
        # A bug in a client thread must show in the summary, not vanish with the thread.
        try:
            target(*args)
        except Exception as error:
            with self.lock:
                self.errors.append(f"{threading.current_thread().name}: {type(error).__name__}: {error}")

    def join(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in self.threads)


@dataclass(slots=True)
class Transfer:
    txn: str
    marker: str
    result: str


class BankWorkload(Workload):
    name = "bank"

    def __init__(self, urls: Callable[[], Sequence[str]], seed: int, protocol: str, in_flight: InFlight, *,
                 prefix: str, partition_count: int, accounts_per_partition: int, clients: int) -> None:
        super().__init__(urls, seed, protocol, in_flight)
        self.accounts = [key for index in range(partition_count)
                         for key in keys_on(f"p{index}", partition_count, accounts_per_partition,
                                            prefix=f"{prefix}acct{index}-")]
        self.prefix = prefix
        self.clients = clients
        self.tally = Tally()
        self.transfers: list[Transfer] = []

    @property
    def total_expected(self) -> int:
        return BALANCE_START * len(self.accounts)

    def setup(self, http: httpx.Client, deadline_s: float) -> None:
        write_keys(http, self.urls, {account: str(BALANCE_START) for account in self.accounts}, deadline_s)

    def start(self) -> None:
        for index in range(self.clients):
            self._spawn(f"bank-{index}", self._client, index)

    def _client(self, index: int) -> None:
        rng = random.Random(f"{self.seed}/bank/{index}")
        with httpx.Client(timeout=TIMEOUT_CALL) as http:
            for serial in range(1, OPS_PER_THREAD_MAX + 1):
                if self.stop.is_set():
                    return
                url = self._url(rng)
                if url is None:
                    self.stop.wait(FAILURE_PAUSE_S)
                    continue
                source, target = rng.sample(self.accounts, 2)
                marker = f"{self.prefix}xfer-{index}-{serial}"
                with self.in_flight.track():
                    txn, answer = self._transfer(http, url, source=source, target=target,
                                                 amount=rng.randint(1, AMOUNT_MAX), marker=marker,
                                                 protocol=self._protocol(rng))
                with self.lock:
                    self.tally.add(answer)
                    if txn:
                        self.transfers.append(Transfer(txn, marker, answer.result))
                if answer.result != "committed":
                    self.stop.wait(FAILURE_PAUSE_S)

    @staticmethod
    def _transfer(http: httpx.Client, url: str, *, source: str, target: str, amount: int, marker: str,
                  protocol: str | None) -> tuple[str, Answer]:
        """(txn id or "", what the client was told). A step before the commit that fails leaves
        nothing asked to commit: `failed`, unless the node says the transaction aborted."""
        txn = ""
        step = "begin "
        try:
            begin = http.post(f"{url}/v1/txn", json=None if protocol is None else {"protocol": protocol})
            if begin.status_code != 201:
                return txn, Answer("failed", f"{step}{begin.status_code}")
            txn = begin.json()["txn"]
            step = "read "
            read = http.post(f"{url}/v1/txn/{txn}/read", json={"keys": [source, target]})
            if read.status_code != 200:
                return txn, _before_commit(classify(read, step))
            values = read.json()["values"]
            if values[source] is None or values[target] is None:
                raise AssertionError(f"txn {txn} read an account as absent: {values}")
            writes = {source: str(int(values[source]) - amount), target: str(int(values[target]) + amount),
                      marker: "done"}
            step = "write "
            write = http.post(f"{url}/v1/txn/{txn}/write", json={"writes": writes})
            if write.status_code != 200:
                return txn, _before_commit(classify(write, step))
        except httpx.HTTPError as error:
            return txn, Answer("failed", f"{step}{type(error).__name__}")
        try:
            return txn, classify(http.post(f"{url}/v1/txn/{txn}/commit", timeout=TIMEOUT_COMMIT), "commit ")
        except httpx.HTTPError as error:
            return txn, classify_error(error, "commit ")


def _before_commit(answer: Answer) -> Answer:
    # Before the commit request nothing can have committed: an abort stays an abort (its records,
    # if any, must say ABORT), anything else is a failure, never `unknown`.
    return answer if answer.result == "aborted" else Answer("failed", answer.why)


@dataclass(slots=True)
class RegisterOp:
    kind: str  # "write" or "read"
    key: str
    value: int | None  # the value written, or read (None: the key was absent)
    start: float  # time.monotonic() at the request's start and at its answer
    end: float
    result: str
    txn: str

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "key": self.key, "value": self.value, "start": round(self.start, 4),
                "end": round(self.end, 4), "result": self.result, "txn": self.txn}


class RegisterWorkload(Workload):
    name = "register"

    def __init__(self, urls: Callable[[], Sequence[str]], seed: int, protocol: str, in_flight: InFlight, *,
                 prefix: str, partition_count: int, keys_per_partition: int, writers: int, readers: int,
                 node_ids: Mapping[str, str] | None = None) -> None:
        super().__init__(urls, seed, protocol, in_flight)
        # url -> node id: a writer names each write's txn id itself (a client-chosen id), so that a
        # write whose answer is lost (a broken connection) can still be looked up in storage.
        self.node_ids = dict(node_ids or {})
        self.keys = [key for index in range(partition_count)
                     for key in keys_on(f"p{index}", partition_count, keys_per_partition,
                                        prefix=f"{prefix}reg{index}-")]
        self.writers = max(1, min(writers, len(self.keys)))
        self.readers = readers
        self.write_tally = Tally()
        self.read_tally = Tally()
        self.ops: list[RegisterOp] = []

    def start(self) -> None:
        for index in range(self.writers):
            self._spawn(f"register-writer-{index}", self._writer, index)
        for index in range(self.readers):
            self._spawn(f"register-reader-{index}", self._reader, index)

    def _execute(self, http: httpx.Client, url: str, body: dict[str, Any]) -> tuple[str, Answer, dict[str, Any]]:
        """(txn id, what the client was told, the answer's body). The id is the body's "txn" (a
        client-chosen one) when the answer says none, so a lost answer still names its transaction."""
        chosen = str(body.get("txn", ""))
        try:
            response = http.post(f"{url}/v1/execute", json=body, timeout=TIMEOUT_COMMIT)
        except httpx.HTTPError as error:
            answer = classify_error(error)
            return (chosen if answer.result == "unknown" else ""), answer, {}
        try:
            parsed = response.json()
        except ValueError:
            parsed = {}
        parsed = parsed if isinstance(parsed, dict) else {}
        return str(parsed.get("txn", "") or chosen), classify(response), parsed

    def _client_txn(self, url: str, protocol: str | None) -> str | None:
        """A client-chosen id for a one-shot sent to `url` (None: its node is not known). Dated by
        this machine's clock, which the nodes share: never ahead of the node's when it arrives."""
        node = self.node_ids.get(url)
        if node is None:
            return None
        tag = Protocol(protocol or self.protocol)
        return client_txn_id(int(time.time() * 1000), node, secrets.token_hex(16), tag)

    def _record(self, op: RegisterOp, answer: Answer, tally: Tally) -> None:
        with self.lock:
            tally.add(answer)
            self.ops.append(op)

    def _writer(self, index: int) -> None:
        rng = random.Random(f"{self.seed}/register-writer/{index}")
        mine = self.keys[index::self.writers]
        # One writer per key, values strictly increasing: a value names the one write that wrote it.
        last = dict.fromkeys(mine, 0)
        with httpx.Client(timeout=TIMEOUT_CALL) as http:
            for _ in range(OPS_PER_THREAD_MAX):
                if self.stop.is_set():
                    return
                url = self._url(rng)
                if url is None:
                    self.stop.wait(FAILURE_PAUSE_S)
                    continue
                key = rng.choice(mine)
                last[key] += 1
                body: dict[str, Any] = {"ops": [{"op": "put", "key": key, "value": str(last[key])}]}
                protocol = self._protocol(rng)
                if protocol is not None:
                    body["protocol"] = protocol
                with self.in_flight.track():
                    chosen = self._client_txn(url, protocol)
                    if chosen is not None:
                        body["txn"] = chosen
                    start = time.monotonic()
                    txn, answer, _ = self._execute(http, url, body)
                    end = time.monotonic()
                self._record(RegisterOp("write", key, last[key], start, end, answer.result, txn), answer,
                             self.write_tally)
                if answer.result != "committed":
                    self.stop.wait(FAILURE_PAUSE_S)

    def _reader(self, index: int) -> None:
        rng = random.Random(f"{self.seed}/register-reader/{index}")
        with httpx.Client(timeout=TIMEOUT_CALL) as http:
            for _ in range(OPS_PER_THREAD_MAX):
                if self.stop.is_set():
                    return
                url = self._url(rng)
                if url is None:
                    self.stop.wait(FAILURE_PAUSE_S)
                    continue
                key = rng.choice(self.keys)
                body: dict[str, Any] = {"ops": [{"op": "get", "key": key}]}
                protocol = self._protocol(rng)
                if protocol is not None:
                    body["protocol"] = protocol
                with self.in_flight.track():
                    start = time.monotonic()
                    txn, answer, parsed = self._execute(http, url, body)
                    end = time.monotonic()
                value: int | None = None
                if answer.result == "committed":
                    raw = parsed.get("reads", {}).get(key)
                    value = None if raw is None else int(raw)
                self._record(RegisterOp("read", key, value, start, end, answer.result, txn), answer, self.read_tally)
                if answer.result != "committed":
                    self.stop.wait(FAILURE_PAUSE_S)


def _retryable(response: httpx.Response) -> bool:
    if response.status_code == 503:
        return True
    if response.status_code == 409:
        try:
            return bool(response.json().get("retryable", False))
        except ValueError:
            return False
    return response.status_code == 202


def _execute_until(http: httpx.Client, urls: Callable[[], Sequence[str]], ops: list[dict[str, Any]],
                   deadline: float) -> httpx.Response:
    """Run one transaction until it commits, trying the running nodes in turn, retrying what the API
    calls retryable (locks of transactions still finishing, a node still recovering)."""
    last = ""
    for attempt in range(1_000_000):
        if time.monotonic() > deadline:
            break
        candidates = list(urls())
        if candidates:
            url = candidates[attempt % len(candidates)]
            try:
                response = http.post(f"{url}/v1/execute", json={"ops": ops}, timeout=TIMEOUT_COMMIT)
            except httpx.HTTPError as error:
                last = f"{url}: {type(error).__name__}"
            else:
                if response.status_code == 200:
                    return response
                last = f"{url}: {response.status_code} {response.text[:300]}"
                if not _retryable(response):
                    break
        time.sleep(FINAL_READ_PAUSE_S)
    raise RuntimeError(f"transaction of {len(ops)} ops did not commit in time; last answer {last}")


def write_keys(
    http: httpx.Client, urls: Callable[[], Sequence[str]], values: dict[str, str], deadline_s: float
) -> None:
    deadline = time.monotonic() + deadline_s
    ops = [{"op": "put", "key": key, "value": value} for key, value in values.items()]
    for start in range(0, len(ops), KEYS_PER_READ_MAX):
        _execute_until(http, urls, ops[start:start + KEYS_PER_READ_MAX], deadline)


def read_keys(http: httpx.Client, urls: Callable[[], Sequence[str]], keys: Sequence[str],
              deadline_s: float) -> dict[str, str | None]:
    """Committed values of `keys`, read in transactions of at most KEYS_PER_READ_MAX keys (within
    the node's op limit)."""
    deadline = time.monotonic() + deadline_s
    values: dict[str, str | None] = {}
    for start in range(0, len(keys), KEYS_PER_READ_MAX):
        batch = list(keys[start:start + KEYS_PER_READ_MAX])
        response = _execute_until(http, urls, [{"op": "get", "key": key} for key in batch], deadline)
        values.update(response.json()["reads"])
    return values
