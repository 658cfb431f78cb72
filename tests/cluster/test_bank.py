"""The bank workload: concurrent clients transfer money between accounts spread over every
partition while nodes are killed with SIGKILL and restarted. Afterwards the total is unchanged and
every transfer a client was told committed is visible. The "mixed" run picks each transfer's
protocol at random, so transactions of all three protocols share locks, logs and recovery."""

from __future__ import annotations

import random
import sys
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field

import httpx
import pytest

from storage_adapters.contract import TxnState
from tests.cluster.bank_checks import (
    ABORTED,
    COMMITTED,
    FAILED,
    MARKER_VALUE,
    NOTHING_RAN,
    RECORDS_ABORT,
    RECORDS_COMMIT,
    RECORDS_IN_DOUBT,
    RECORDS_NONE,
    STATUS_ABORTED,
    STATUS_COMMITTED,
    STATUS_NOT_FOUND,
    UNKNOWN,
    Transfer,
    check_storage_matches_api,
    check_transfers,
    read_records,
    read_stored,
    records_verdict,
    stored_total,
)
from tests.cluster.conftest import extra_backends, for_backend
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
    aborted: int = 0  # told aborted (409) or nothing ran (503)
    failed_before_commit: int = 0
    transfers: list[Transfer] = field(default_factory=list)  # every transfer, as its client was told
    errors: list[str] = field(default_factory=list)  # client threads that died: thread and traceback
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, transfer: Transfer) -> None:
        with self.lock:
            self.transfers.append(transfer)
            if transfer.told == COMMITTED:
                self.committed.append(transfer.marker)
            elif transfer.told == UNKNOWN:
                self.unknown += 1
            elif transfer.told in (ABORTED, NOTHING_RAN):
                self.aborted += 1
            else:
                self.failed_before_commit += 1


def _accounts() -> list[str]:
    return [f"acct{i}" for i in range(ACCOUNT_COUNT)]


def _body_field(response: httpx.Response, name: str) -> object:
    """Field `name` of a JSON object body (None for any other body)."""
    try:
        body = response.json()
    except ValueError:
        return None
    return body.get(name) if isinstance(body, dict) else None


def _transfer(
    client: httpx.Client, url: str, source: str, target: str, *, amount: int, marker: str, protocol: str | None
) -> tuple[str | None, str, str]:
    """One interactive transfer: its txn (None if begin never answered), what the client was told
    (bank_checks.TOLD) and, when that is not plain, what the commit answered."""
    txn = None
    try:
        begin = client.post(f"{url}/v1/txn", json=None if protocol is None else {"protocol": protocol})
        if begin.status_code != 201:
            return None, FAILED, f"begin answered {begin.status_code}"
        txn = begin.json()["txn"]
        read = client.post(f"{url}/v1/txn/{txn}/read", json={"keys": [source, target]})
        if read.status_code != 200:
            return txn, FAILED, f"read answered {read.status_code}"
        values = read.json()["values"]
        writes = {source: str(int(values[source]) - amount), target: str(int(values[target]) + amount),
                  marker: MARKER_VALUE}
        write = client.post(f"{url}/v1/txn/{txn}/write", json={"writes": writes})
        if write.status_code != 200:
            return txn, FAILED, f"write answered {write.status_code}"
    except httpx.HTTPError as error:
        return txn, FAILED, f"before commit: {type(error).__name__}"
    try:
        commit = client.post(f"{url}/v1/txn/{txn}/commit")
    except httpx.HTTPError as error:
        return txn, UNKNOWN, f"commit: {type(error).__name__}"  # it may have reached the coordinator
    outcome = _body_field(commit, "outcome")
    if commit.status_code == 200 and outcome == "committed":
        return txn, COMMITTED, ""
    if commit.status_code == 409 and outcome == "aborted":
        return txn, ABORTED, ""
    if commit.status_code == 503:
        return txn, NOTHING_RAN, commit.text[:200]
    return txn, UNKNOWN, f"commit answered {commit.status_code}: {commit.text[:200]}"


def _client_loop(cluster: Cluster, index: int, stop: threading.Event, tally: Tally, mixed: bool) -> None:
    """CLIENT_COUNT of these run at once; one that dies of an exception records it for the test
    to fail with (a thread that merely ended would pass the liveness check)."""
    try:
        _transfer_until_stopped(cluster, index, stop, tally, mixed)
    except BaseException:
        with tally.lock:
            tally.errors.append(f"client {index}:\n{traceback.format_exc()}")
        raise


def _transfer_until_stopped(cluster: Cluster, index: int, stop: threading.Event, tally: Tally, mixed: bool) -> None:
    rng = random.Random(index)
    accounts = _accounts()
    with httpx.Client(timeout=HTTP_TIMEOUT_S) as client:
        serial = 0
        while not stop.is_set():
            node_id = rng.choice(sorted(cluster.nodes))
            source, target = rng.sample(accounts, 2)
            serial += 1
            marker = f"xfer-{index}-{serial}"
            protocol = rng.choice(PROTOCOLS) if mixed else None
            txn, told, detail = _transfer(client, cluster.nodes[node_id].url, source, target,
                                          amount=rng.randint(1, 20), marker=marker, protocol=protocol)
            tally.add(Transfer(marker, txn, told, node_id, protocol, detail))
            if told == FAILED:
                time.sleep(0.05)  # the node is probably down: do not spin on it


def raise_client_errors(tally: Tally) -> None:
    """Fail with the exception any client thread died of."""
    assert not tally.errors, "client threads died:\n" + "\n".join(tally.errors)


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


def _statuses(cluster: Cluster, txns: list[str], timeout_s: float = 30.0) -> dict[str, str]:
    """What the status call answers for each of `txns` once nothing is in flight: committed,
    aborted, not-found, or (after `timeout_s` of in-doubt answers) what it last said."""
    statuses: dict[str, str] = {}
    node_ids = sorted(cluster.nodes)
    for index, txn in enumerate(txns):
        deadline = time.monotonic() + timeout_s
        while True:
            response = cluster.get(node_ids[index % len(node_ids)], f"/v1/txn/{txn}")
            outcome = _body_field(response, "outcome")
            if response.status_code == 200 and outcome == "committed":
                statuses[txn] = STATUS_COMMITTED
            elif response.status_code == 409 and outcome == "aborted":
                statuses[txn] = STATUS_ABORTED
            elif response.status_code == 404:
                statuses[txn] = STATUS_NOT_FOUND
            elif response.status_code == 202 and _body_field(response, "retryable") is False:
                statuses[txn] = f"202 {response.text[:300]}"  # it cannot tell: the records must
            elif time.monotonic() < deadline:
                time.sleep(0.1)  # 202 in doubt, 503 recovering, 200 active
                continue
            else:
                statuses[txn] = f"{response.status_code} {response.text[:200]}"
            break
    return statuses


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
# three): the suite's time is bounded, and the backend changes no protocol rule. Azure Blob and
# DynamoDB, when CORNUS_EXTRA_BACKENDS asks for them, get the emulator's cases: they apply a commit
# in several requests, which kills during the workload land between.
BANK_CASES = [*(("emulator", p) for p in [*PROTOCOLS, MIXED]), ("redis", "cornus"), ("redis", MIXED),
              *((b, p) for b in extra_backends() for p in [*PROTOCOLS, MIXED])]


@pytest.mark.parametrize(("storage", "protocol"), BANK_CASES, indirect=["storage"])
def test_bank_with_kills_and_restarts(protocol: str, storage: dict[str, str]) -> None:
    mixed = protocol == MIXED
    storage, settings = for_backend({**storage, **FAST_STORAGE}, SETTINGS)
    with running_cluster("cornus" if mixed else protocol, storage, settings=settings) as cluster:
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
        raise_client_errors(tally)

        for node_id in cluster.nodes:
            cluster.wait_ready(node_id)
        balances, markers = settled_state(cluster, tally)
        # Every transfer's marker as the nodes answer it, then every key as storage holds it
        # (no node in between: an owner answers from its write-through cache).
        all_markers = [transfer.marker for transfer in tally.transfers]
        answered: dict[str, str | None] = dict(balances)
        for start in range(0, len(all_markers), 500):  # within the op limit of one request
            answered.update(cluster.read("n2", all_markers[start : start + 500]))
        stored = read_stored(storage, [*balances, *all_markers], cluster.partition_count)
        unknown = [t.txn for t in tally.transfers if t.told == UNKNOWN and t.txn is not None]
        statuses = _statuses(cluster, unknown)
        records = read_records(storage, unknown, cluster.partition_count, cluster.nodes)
        total = sum(int(value) for value in balances.values())  # type: ignore[arg-type]
        told = Counter(transfer.told for transfer in tally.transfers)
        print(f"{protocol}: told {dict(told)}; unknown: status {dict(Counter(s[:40] for s in statuses.values()))}, "
              f"records {dict(Counter(records.values()))}; "
              f"kills {kills}; total {total}, in storage {stored_total(stored, balances)}")
        assert len(kills) == len(restarts) == KILL_COUNT, f"kills {kills}, restarts {restarts}"
        assert len(tally.committed) > 20, "too few transfers committed to mean anything"
        assert total == ACCOUNT_COUNT * BALANCE_START, f"money was created or lost: {balances}"
        missing = [marker for marker, value in markers.items() if value != MARKER_VALUE]
        assert not missing, f"acknowledged transfers are not visible: {missing}"
        disagree = check_storage_matches_api(answered, stored)
        assert not disagree, "storage and the nodes disagree:\n" + "\n".join(disagree)
        assert stored_total(stored, balances) == ACCOUNT_COUNT * BALANCE_START, f"money lost in storage: {stored}"
        wrong = check_transfers(tally.transfers, stored, statuses, records)
        assert not wrong, "transfers whose marker contradicts what their client was told:\n" + "\n".join(wrong)


# --- the checks themselves, on crafted bad states (no cluster) ---------------------------------

def test_storage_check_catches_a_value_the_cache_hides() -> None:
    api = {"acct0": "90", "acct1": "110", "xfer-0-1": "done", "xfer-0-2": None}
    assert check_storage_matches_api(api, {"acct0": b"90", "acct1": b"110", "xfer-0-1": b"done",
                                           "xfer-0-2": None}) == []
    problems = check_storage_matches_api(api, {"acct0": b"100", "acct1": b"110", "xfer-0-1": None})
    assert [p.split(":")[0] for p in problems] == ["acct0", "xfer-0-1", "xfer-0-2"], problems
    assert stored_total({"acct0": b"100", "acct1": b"110"}, ["acct0", "acct1"]) == 210
    with pytest.raises(AssertionError, match="missing in storage"):
        stored_total({"acct0": b"100"}, ["acct0", "acct1"])


def test_transfer_check_catches_each_contradiction() -> None:
    done = MARKER_VALUE.encode()
    transfers = [
        Transfer("m-ok-committed", "t1", COMMITTED), Transfer("m-ok-aborted", "t2", ABORTED),
        Transfer("m-ok-503", "t3", NOTHING_RAN), Transfer("m-ok-failed", None, FAILED),
        Transfer("m-ok-unknown-c", "t5", UNKNOWN), Transfer("m-ok-unknown-a", "t6", UNKNOWN),
        Transfer("m-ok-unknown-404", "t7", UNKNOWN),
    ]
    stored = {"m-ok-committed": done, "m-ok-unknown-c": done}
    statuses = {"t5": STATUS_COMMITTED, "t6": STATUS_ABORTED, "t7": STATUS_NOT_FOUND}
    assert check_transfers(transfers, stored, statuses) == []
    bad = [
        Transfer("lost", "b1", COMMITTED), Transfer("ghost-409", "b2", ABORTED),
        Transfer("ghost-503", "b3", NOTHING_RAN),
        Transfer("ghost-failed", "b4", FAILED), Transfer("unknown-lost", "b5", UNKNOWN),
        Transfer("unknown-ghost", "b6", UNKNOWN), Transfer("unresolved", "b7", UNKNOWN),
        Transfer("garbage", "b8", COMMITTED),
    ]
    stored = {"ghost-409": done, "ghost-503": done, "ghost-failed": done, "unknown-ghost": done, "garbage": b"x"}
    statuses = {"b5": STATUS_COMMITTED, "b6": STATUS_ABORTED, "b7": "202 in doubt"}
    problems = check_transfers(bad, stored, statuses)
    assert len(problems) == len(bad), problems
    assert all(transfer.marker in problem for transfer, problem in zip(bad, problems, strict=True)), problems


def test_transfer_check_reconciles_an_unknown_outcome_with_the_records() -> None:
    done = MARKER_VALUE.encode()
    cannot_tell = "202 no node knows it and no record of it is left"
    assert records_verdict([]) == RECORDS_NONE
    assert records_verdict([TxnState.VOTE_YES, TxnState.COMMIT]) == RECORDS_COMMIT
    assert records_verdict([TxnState.VOTE_YES, TxnState.ABORT]) == RECORDS_ABORT
    assert records_verdict([TxnState.VOTE_YES]) == RECORDS_IN_DOUBT
    assert records_verdict([TxnState.COMMIT, TxnState.ABORT]).startswith("contradictory")
    good = [Transfer("c", "t1", UNKNOWN), Transfer("n", "t2", UNKNOWN), Transfer("a", "t3", UNKNOWN),
            Transfer("both", "t4", UNKNOWN)]
    records = {"t1": RECORDS_COMMIT, "t2": RECORDS_NONE, "t3": RECORDS_ABORT, "t4": RECORDS_COMMIT}
    statuses = {"t1": cannot_tell, "t2": cannot_tell, "t3": cannot_tell, "t4": STATUS_COMMITTED}
    assert check_transfers(good, {"c": done, "both": done}, statuses, records) == []
    bad = [Transfer("lost", "b1", UNKNOWN), Transfer("never-voted-yet-there", "b2", UNKNOWN),
           Transfer("disagree", "b3", UNKNOWN), Transfer("in-doubt", "b4", UNKNOWN),
           Transfer("contradictory", "b5", UNKNOWN)]
    records = {"b1": RECORDS_COMMIT, "b2": RECORDS_NONE, "b3": RECORDS_ABORT, "b4": RECORDS_IN_DOUBT,
               "b5": records_verdict([TxnState.COMMIT, TxnState.ABORT])}
    statuses = {"b1": cannot_tell, "b2": cannot_tell, "b3": STATUS_COMMITTED, "b4": cannot_tell, "b5": cannot_tell}
    problems = check_transfers(bad, {"never-voted-yet-there": done, "disagree": done}, statuses, records)
    assert len(problems) == len(bad), problems
    assert all(transfer.marker in problem for transfer, problem in zip(bad, problems, strict=True)), problems


def test_a_client_thread_that_dies_fails_the_test(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: object, **__: object) -> None:
        raise TypeError("'NoneType' object is not subscriptable")

    monkeypatch.setattr(sys.modules[__name__], "_transfer_until_stopped", broken)
    monkeypatch.setattr(threading, "excepthook", lambda _: None)  # the test reports it, not the hook
    tally = Tally()
    thread = threading.Thread(target=_client_loop, args=(None, 0, threading.Event(), tally, False))
    thread.start()
    thread.join(10)
    assert not thread.is_alive()  # what the liveness check alone saw: it passed
    with pytest.raises(AssertionError, match="TypeError: 'NoneType' object is not subscriptable"):
        raise_client_errors(tally)
