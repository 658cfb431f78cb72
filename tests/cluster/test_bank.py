"""The bank workload: concurrent clients transfer money between accounts spread over every
partition while nodes are killed with SIGKILL and restarted. Afterwards the total is unchanged and
every transfer a client was told committed is visible. The "mixed" run picks each transfer's
protocol at random, so transactions of all three protocols share locks, logs and recovery."""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field

import httpx
import pytest

from tests.cluster.harness import Cluster, running_cluster

ACCOUNT_COUNT = 12
BALANCE_START = 100
CLIENT_COUNT = 4
# Kill/restart cycles the workload runs through: counted rather than timed, so a loaded machine
# (slower restarts) cannot quietly run fewer; 3 is what the former fixed 20 s workload got.
KILL_COUNT = 3
# Every node up between a restart and the next kill (and after the last restart), so transfers
# also run on a whole cluster, the recovered node included.
ALL_UP_S = 1.5
DOWN_S = 1.0
WORKLOAD_TIMEOUT_S = 180.0
HTTP_TIMEOUT_S = 10.0
SETTLE_TIMEOUT_S = 60.0
SETTINGS = {"timeout_ms_txn_idle": 1500}
# A short storage deadline, as test_ownership's scale test has: every start and restart waits one
# (plus the vote timeout and the clock slack) before it recovers; calls here take milliseconds
# (at most 25 ms of 4,800 in a bank run).
FAST_STORAGE = {"timeout_ms_call": "1000"}
PROTOCOLS = ["cornus", "2pc", "coordinator-log"]
MIXED = "mixed"


@dataclass
class Tally:
    committed: list[str] = field(default_factory=list)  # marker keys of acknowledged transfers
    unknown: int = 0
    aborted: int = 0
    failed_before_commit: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def _accounts() -> list[str]:
    return [f"acct{i}" for i in range(ACCOUNT_COUNT)]


def _transfer(
    client: httpx.Client, url: str, source: str, target: str, *, amount: int, marker: str, protocol: str | None
) -> str:
    """One interactive transfer; 'committed', 'aborted', 'unknown' or 'failed' (never reached commit)."""
    begin = client.post(f"{url}/v1/txn", json=None if protocol is None else {"protocol": protocol})
    if begin.status_code != 201:
        return "failed"
    txn = begin.json()["txn"]
    read = client.post(f"{url}/v1/txn/{txn}/read", json={"keys": [source, target]})
    if read.status_code != 200:
        return "failed"
    values = read.json()["values"]
    writes = {source: str(int(values[source]) - amount), target: str(int(values[target]) + amount), marker: "done"}
    if client.post(f"{url}/v1/txn/{txn}/write", json={"writes": writes}).status_code != 200:
        return "failed"
    try:
        commit = client.post(f"{url}/v1/txn/{txn}/commit")
    except httpx.HTTPError:
        return "unknown"  # the request may have reached the coordinator before it died
    outcome = commit.json().get("outcome")
    return outcome if outcome in ("committed", "aborted") else "unknown"


def _client_loop(cluster: Cluster, index: int, stop: threading.Event, tally: Tally, mixed: bool) -> None:
    rng = random.Random(index)
    accounts = _accounts()
    with httpx.Client(timeout=HTTP_TIMEOUT_S) as client:
        serial = 0
        while not stop.is_set():
            node = cluster.nodes[rng.choice(sorted(cluster.nodes))]
            source, target = rng.sample(accounts, 2)
            serial += 1
            marker = f"xfer-{index}-{serial}"
            protocol = rng.choice(PROTOCOLS) if mixed else None
            try:
                result = _transfer(
                    client, node.url, source, target, amount=rng.randint(1, 20), marker=marker, protocol=protocol
                )
            except httpx.HTTPError:
                result = "failed"
            with tally.lock:
                if result == "committed":
                    tally.committed.append(marker)
                elif result == "unknown":
                    tally.unknown += 1
                elif result == "aborted":
                    tally.aborted += 1
                else:
                    tally.failed_before_commit += 1
            if result == "failed":
                time.sleep(0.05)  # the node is probably down: do not spin on it


def start_transfers(cluster: Cluster, mixed: bool = False) -> tuple[threading.Event, Tally, list[threading.Thread]]:
    """Fund the accounts, then start CLIENT_COUNT client threads transferring between them until
    the returned event is set."""
    setup = cluster.execute("n0", [{"op": "put", "key": a, "value": str(BALANCE_START)} for a in _accounts()])
    assert setup.status_code == 200, setup.text
    stop, tally = threading.Event(), Tally()
    clients = [threading.Thread(target=_client_loop, args=(cluster, index, stop, tally, mixed))
               for index in range(CLIENT_COUNT)]
    for thread in clients:
        thread.start()
    return stop, tally, clients


def settled_state(cluster: Cluster, tally: Tally, read_timeout_s: float = 30.0) -> tuple[
        dict[str, str | None], dict[str, str | None]]:
    """Once no transaction is in flight: the balances, and the marker of every transfer a client
    was told committed, as the nodes answer them."""
    _settle(cluster)
    balances = cluster.read("n0", _accounts(), read_timeout_s)
    markers: dict[str, str | None] = {}
    for start in range(0, len(tally.committed), 500):  # within the op limit of one request
        markers.update(cluster.read("n1", tally.committed[start : start + 500], read_timeout_s))
    return balances, markers


def _chaos(cluster: Cluster, kills: list[str], restarts: list[str]) -> None:
    rng = random.Random(7)
    for _ in range(KILL_COUNT):
        time.sleep(ALL_UP_S)
        victim = rng.choice(sorted(cluster.nodes))
        cluster.kill(victim)
        kills.append(victim)
        time.sleep(DOWN_S)
        cluster.start(victim)
        restarts.append(victim)
    time.sleep(ALL_UP_S)


def _settle(cluster: Cluster) -> None:
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while time.monotonic() < deadline:
        busy = [row for node_id in cluster.nodes for row in cluster.get(node_id, "/v1/admin/transactions").json()]
        if not busy:
            return
        time.sleep(0.1)
    raise AssertionError(f"transactions still in flight: {busy}")


# Every protocol alone on the emulator; on Redis, Cornus alone and the mixed run (which has all
# three): the suite's time is bounded, and the backend changes no protocol rule.
BANK_CASES = [*(("emulator", p) for p in [*PROTOCOLS, MIXED]), ("redis", "cornus"), ("redis", MIXED)]


@pytest.mark.parametrize(("storage", "protocol"), BANK_CASES, indirect=["storage"])
def test_bank_with_kills_and_restarts(protocol: str, storage: dict[str, str]) -> None:
    mixed = protocol == MIXED
    with running_cluster("cornus" if mixed else protocol, {**storage, **FAST_STORAGE}, settings=SETTINGS) as cluster:
        cluster.start_all()
        stop, tally, clients = start_transfers(cluster, mixed)
        kills: list[str] = []
        restarts: list[str] = []
        chaos = threading.Thread(target=_chaos, args=(cluster, kills, restarts))
        chaos.start()
        chaos.join(WORKLOAD_TIMEOUT_S)  # the workload lasts as long as the kills and restarts take
        stop.set()
        for thread in [chaos, *clients]:
            thread.join(120)
            assert not thread.is_alive()

        for node_id in cluster.nodes:
            cluster.wait_ready(node_id)
        balances, markers = settled_state(cluster, tally)
        total = sum(int(value) for value in balances.values())  # type: ignore[arg-type]
        print(f"{protocol}: {len(tally.committed)} committed, {tally.aborted} aborted, {tally.unknown} unknown, "
              f"{tally.failed_before_commit} failed before commit; kills {kills}; total {total}")
        assert len(kills) == len(restarts) == KILL_COUNT, f"kills {kills}, restarts {restarts}"
        assert len(tally.committed) > 20, "too few transfers committed to mean anything"
        assert total == ACCOUNT_COUNT * BALANCE_START, f"money was created or lost: {balances}"
        missing = [marker for marker, value in markers.items() if value != "done"]
        assert not missing, f"acknowledged transfers are not visible: {missing}"
