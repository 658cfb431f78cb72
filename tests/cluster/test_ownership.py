"""Partition ownership on real node processes: one writer per partition whatever the nodes'
configurations say, a dead owner's partitions taken over after its lease, a paused owner's late
writes refused by storage, and the node set changed from 3 to 4 and back under the bank workload."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.cluster.harness import Cluster, keys_on, running_cluster
from tests.cluster.test_bank import ACCOUNT_COUNT, BALANCE_START, settled_state, start_transfers
from tests.conftest import Services
from tests.storage import servers
from tests.worker import free_port

HTTP_TIMEOUT_S = 10.0
# A deposit conflicts with the other (NO_WAIT locks) and is retried; far more than two need.
DEPOSIT_ATTEMPT_COUNT_MAX = 50
READ_TIMEOUT_S = 30.0
TAKEOVER_TIMEOUT_S = 30.0
PARTITIONS = 6
# A short storage deadline: every restart waits one (plus the vote timeout and the slack) before
# it recovers, and the scale change restarts every node twice.
FAST_STORAGE = {"timeout_ms_call": "1000"}


def _own_everything(cluster: Cluster, partition_count: int) -> None:
    """Every node's configuration says it owns every partition: configurations out of step, as
    during a rollout, or a pod replaced while the old one still runs."""
    for node_id, node in cluster.nodes.items():
        node.config_path = cluster.directory / f"{node_id}.toml"
        owners = "".join(f'p{index} = "{node_id}"\n' for index in range(partition_count))
        node.config_path.write_text(f"[partition_owners]\n{owners}")


def _begin_and_read(client: httpx.Client, url: str, key: str) -> tuple[str, int] | None:
    begin = client.post(f"{url}/v1/txn")
    if begin.status_code != 201:
        return None
    txn = begin.json()["txn"]
    read = client.post(f"{url}/v1/txn/{txn}/read", json={"keys": [key]})
    if read.status_code != 200:
        return None
    return txn, int(read.json()["values"][key])


def _write_and_commit(client: httpx.Client, url: str, txn: str, key: str, value: int) -> bool:
    if client.post(f"{url}/v1/txn/{txn}/write", json={"writes": {key: str(value)}}).status_code != 200:
        return False
    commit = client.post(f"{url}/v1/txn/{txn}/commit")
    return commit.status_code == 200 and commit.json().get("outcome") == "committed"


def _deposit(client: httpx.Client, url: str, key: str, amount: int) -> None:
    for _ in range(DEPOSIT_ATTEMPT_COUNT_MAX):
        started = _begin_and_read(client, url, key)
        if started is not None and _write_and_commit(client, url, started[0], key, started[1] + amount):
            return
        time.sleep(0.05)
    raise AssertionError(f"a deposit of {amount} through {url} did not commit in {DEPOSIT_ATTEMPT_COUNT_MAX} tries")


def test_two_nodes_configured_to_own_a_partition_never_both_serve_it(storage: dict[str, str]) -> None:
    """Both nodes' configurations own p0. Two deposits start at once, one through each node, and
    both read the balance before either writes: with two owners each reads 100 from its own
    cache and storage, both commit, and one deposit is lost (120, not 130); afterwards each node
    keeps serving its own cached balance. With one owner the second writer conflicts, retries on
    the new balance, and both nodes read 130."""
    with running_cluster("cornus", storage, node_count=2, partition_count=2) as cluster:
        _own_everything(cluster, 2)
        cluster.start_all()
        (key,) = keys_on("p0", 2, 1, prefix="balance")
        assert cluster.execute("n0", [{"op": "put", "key": key, "value": "100"}]).status_code == 200
        with httpx.Client(timeout=HTTP_TIMEOUT_S) as client:
            first = _begin_and_read(client, cluster.nodes["n0"].url, key)
            second = _begin_and_read(client, cluster.nodes["n1"].url, key)
            # Both have read; now both write and commit. A loser conflicted with the other's read
            # lock and was aborted: it deposits again once the other is done.
            lost = []
            for amount, node_id, started in ((10, "n0", first), (20, "n1", second)):
                url = cluster.nodes[node_id].url
                if started is None or not _write_and_commit(client, url, started[0], key, started[1] + amount):
                    lost.append((amount, url))
            for amount, url in lost:
                _deposit(client, url, key, amount)
        for node_id in cluster.nodes:
            assert cluster.read(node_id, [key], READ_TIMEOUT_S) == {key: "130"}, f"{node_id} reads a lost deposit"
        owners = {p["partition"]: p["owner"] for p in cluster.get("n0", "/v1/partitions").json()["partitions"]}
        assert set(owners) == {"p0", "p1"} and set(owners.values()) <= {"n0", "n1"}


def _owners(cluster: Cluster, asked: str) -> dict[str, tuple[str, int]]:
    rows = cluster.get(asked, "/v1/partitions").json()["partitions"]
    return {row["partition"]: (row["owner"], row["epoch"]) for row in rows}


def _wait_owner(cluster: Cluster, asked: str, partition: str, owners: set[str]) -> tuple[float, int]:
    """Wait until one of `owners` holds `partition` and serves it; (seconds waited, its epoch)."""
    started = time.monotonic()
    while time.monotonic() - started < TAKEOVER_TIMEOUT_S:
        owner, epoch = _owners(cluster, asked)[partition]
        if owner in owners and partition in cluster.get(owner, "/readyz").json()["serving"]:
            return time.monotonic() - started, epoch
        time.sleep(0.05)
    raise AssertionError(f"{partition} not taken by {owners} within {TAKEOVER_TIMEOUT_S} s: {_owners(cluster, asked)}")


def _keys() -> list[str]:
    # p1 is n1's, p2 is n2's (round-robin over sorted node ids); n0 only coordinates.
    return [keys_on("p1", PARTITIONS, 1, prefix="x")[0], keys_on("p2", PARTITIONS, 1, prefix="y")[0]]


def _events(cluster: Cluster, node_id: str) -> dict[str, float]:
    found: dict[str, float] = {}
    for line in cluster.get(node_id, "/metrics").text.splitlines():
        if line.startswith('cornus_node_events_total{event="'):
            name, _, value = line.removeprefix('cornus_node_events_total{event="').partition('"} ')
            found[name] = float(value)
    return found


# The rest run on one backend each: what differs per backend (the fence check inside storage) has
# its own conformance tests on all four, and the suite's time is bounded.
@pytest.mark.parametrize("storage", ["emulator"], indirect=True)
def test_a_killed_owner_s_partition_is_taken_over_and_its_log_recovered(storage: dict[str, str]) -> None:
    """n1 dies (kill -9) right after logging its yes vote and is not restarted: once its lease
    runs out another node takes p1 in a new epoch, recovers the vote from p1's log, and the
    transaction ends atomic; p1 serves new transactions from its new owner."""
    keys = _keys()
    with running_cluster("cornus", storage, partition_count=PARTITIONS) as cluster:
        cluster.start_all({"n1": "participant.after_log_vote"})
        try:
            response = cluster.execute("n0", [{"op": "put", "key": key, "value": "new"} for key in keys])
            acknowledged = response.status_code == 200 and response.json()["outcome"] == "committed"
        except httpx.HTTPError:
            acknowledged = False
        assert cluster.wait_exit("n1") == -9, "the failpoint must have killed n1"
        waited_s, epoch = _wait_owner(cluster, "n0", "p1", {"n0", "n2"})
        print(f"p1 taken over {waited_s * 1000:.0f} ms after the kill was seen, in epoch {epoch}")
        assert epoch >= 2  # a take whose answer came late is not used, and the next one bumps again
        values = cluster.read("n2", keys, READ_TIMEOUT_S)
        assert set(values.values()) in ({"new"}, {None}), f"not atomic: {values}"
        assert not acknowledged or set(values.values()) == {"new"}, f"an acknowledged commit is missing: {values}"
        after = cluster.execute("n0", [{"op": "put", "key": key, "value": "after"} for key in keys])
        assert after.status_code == 200 and after.json()["outcome"] == "committed", after.text


@pytest.mark.parametrize("storage", ["redis"], indirect=True)
def test_a_paused_owner_s_late_write_is_refused_by_storage(storage: dict[str, str]) -> None:
    """n1 pauses (as SIGSTOP) between taking the fence for its vote and sending it, and stays
    paused past its lease; another node takes p1. Resumed (SIGCONT), n1 sends the vote with its
    old epoch: storage refuses it, and n1 says it was deposed. (n1 is p1's preferred owner, so
    it asks for p1 back afterwards and gets it by hand-over, in a new epoch.)"""
    keys = _keys()
    with running_cluster("cornus", storage, partition_count=PARTITIONS) as cluster:
        cluster.start_all({"n1": "owner.before_fenced_write:stop"})
        response = cluster.execute("n0", [{"op": "put", "key": key, "value": "new"} for key in keys])
        # n1 never voted: the coordinator's termination logged ABORT in p1's log for it.
        assert response.status_code == 409 and response.json()["outcome"] == "aborted", response.text
        _wait_owner(cluster, "n0", "p1", {"n0", "n2"})
        process = cluster.nodes["n1"].process
        assert process is not None
        os.kill(process.pid, signal.SIGCONT)
        deadline = time.monotonic() + READ_TIMEOUT_S
        while cluster.get("n1", "/readyz").json()["fenced_writes"] < 1:
            assert time.monotonic() < deadline, f"n1's late vote was not refused: {_events(cluster, 'n1')}"
            time.sleep(0.05)
        ready = cluster.get("n1", "/readyz").json()
        assert ready["deposed"] >= 1, ready
        # Logs are written by the node's writer thread, a moment after the event.
        while "ownership stop partition=p1 epoch=1 node=n1" not in cluster.log("n1"):
            assert time.monotonic() < deadline, cluster.log("n1")
            time.sleep(0.05)
        assert cluster.read("n1", keys, READ_TIMEOUT_S) == dict.fromkeys(keys), "the aborted write is visible"
        # Written once p1 is back: during the hand-over a request meets "does not own p1", a
        # retryable abort, not what this test is about.
        _wait_owner(cluster, "n1", "p1", {"n1"})
        after = cluster.execute("n1", [{"op": "put", "key": key, "value": "after"} for key in keys])
        assert after.status_code == 200 and after.json()["outcome"] == "committed", after.text


def _peers(cluster: Cluster, node_ids: list[str]) -> str:
    return ",".join(f"{n}=127.0.0.1:{cluster.nodes[n].peer_port}" for n in node_ids)


def _roll(cluster: Cluster, members: list[str], to_restart: list[str]) -> None:
    """Restart `to_restart` one at a time (SIGTERM: they release their partitions) with `members`
    as their peers."""
    for node_id in to_restart:
        node = cluster.nodes[node_id]
        if node.alive:
            assert node.process is not None
            node.process.send_signal(signal.SIGTERM)
            node.process.wait(30)
        node.env["CORNUS_PEERS"] = _peers(cluster, members)
        cluster.start(node_id)


def _wait_placed(cluster: Cluster, members: list[str]) -> float:
    """`cornus rebalance --expect-peers` (as the chart's hook runs it) until every one of `members`
    runs with exactly them and every partition is held by its preferred node among them, then
    `cornus partitions` shows it so; the seconds it took."""
    started = time.monotonic()
    url = cluster.nodes[members[0]].url
    cli = [sys.executable, "-m", "services.cli"]
    member_urls = ",".join(f"{node}={cluster.nodes[node].url}" for node in members)
    waited = subprocess.run([*cli, "rebalance", "--expect-peers", _peers(cluster, members), "--member-urls",
                             member_urls, "--timeout-s", str(TAKEOVER_TIMEOUT_S)],
                            capture_output=True, text=True, timeout=TAKEOVER_TIMEOUT_S + 30, check=False)
    assert waited.returncode == 0, f"rebalance: {waited.stdout}{waited.stderr}"
    took_s = time.monotonic() - started
    shown = subprocess.run([*cli, "partitions", "--url", url, "--json"],
                           capture_output=True, text=True, timeout=30, check=True)
    preferred = {f"p{i}": sorted(members)[i % len(members)] for i in range(PARTITIONS)}
    rows = json.loads(shown.stdout)
    assert {row["partition"]: row["owner"] for row in rows} == preferred, shown.stdout
    assert all(row["preferred"] == row["owner"] and row["epoch"] >= 1 for row in rows), shown.stdout
    return took_s


@pytest.mark.parametrize("storage", ["emulator"], indirect=True)
def test_scale_from_three_nodes_to_four_and_back_under_the_bank_workload(storage: dict[str, str]) -> None:
    """The node set changes as the StatefulSet controller changes it (podManagementPolicy
    Parallel, docs/deploy.md "Scaling"). Up: n3 starts with the new set and is ready, then the old
    nodes restart one by one with it, highest ordinal first. Down: n3 is stopped and, without
    waiting for it, the remaining nodes restart one by one with the smaller set, highest first.
    Partitions move by hand-over only. Transfers run throughout; afterwards no money was created or
    lost and every acknowledged transfer is visible."""
    three, four = ["n0", "n1", "n2"], ["n0", "n1", "n2", "n3"]
    with running_cluster("cornus", {**storage, **FAST_STORAGE}, node_count=4, partition_count=PARTITIONS) as cluster:
        for node_id in three:
            cluster.nodes[node_id].env["CORNUS_PEERS"] = _peers(cluster, three)
            cluster.start(node_id, wait=False)
        for node_id in three:
            cluster.wait_ready(node_id)
        stop, tally, clients = start_transfers(cluster)
        try:
            up_s = _wait_placed(cluster, three)
            cluster.nodes["n3"].env["CORNUS_PEERS"] = _peers(cluster, four)
            cluster.start("n3")
            _roll(cluster, four, three[::-1])
            up_s = _wait_placed(cluster, four)
            time.sleep(1.0)  # transfers on four nodes
            surplus = cluster.nodes["n3"].process
            assert surplus is not None
            surplus.send_signal(signal.SIGTERM)
            _roll(cluster, three, three[::-1])
            surplus.wait(30)
            down_s = _wait_placed(cluster, three)
            time.sleep(1.0)  # transfers on three nodes again
        finally:
            stop.set()
            for thread in clients:
                thread.join(120)
        assert not any(thread.is_alive() for thread in clients)
        del cluster.nodes["n3"]  # stopped for good: the checks below ask only the three
        balances, markers = settled_state(cluster, tally, READ_TIMEOUT_S)
        total = sum(int(value) for value in balances.values())  # type: ignore[arg-type]
        print(f"scale 3->4->3: {len(tally.committed)} committed, {tally.aborted} aborted, {tally.unknown} unknown, "
              f"{tally.failed_before_commit} failed before commit; placed in {up_s:.1f} s up, {down_s:.1f} s down")
        assert len(tally.committed) > 20, "too few transfers committed to mean anything"
        assert total == ACCOUNT_COUNT * BALANCE_START, f"money was created or lost: {balances}"
        missing = [marker for marker, value in markers.items() if value != "done"]
        assert not missing, f"acknowledged transfers are not visible: {missing}"


def test_a_node_started_while_its_storage_is_down_waits_for_it(services: Services, tmp_path: Path) -> None:
    """A node (re)started inside a storage outage keeps trying, and serves once storage is back,
    instead of exiting at the first refused connection."""
    port = free_port()
    storage = {"backend": "redis", "redis_url": f"redis://127.0.0.1:{port}/0", "timeout_ms_call": "1000"}
    with running_cluster("cornus", storage, node_count=1, partition_count=2) as cluster:
        cluster.start("n0", wait=False)
        deadline = time.monotonic() + READ_TIMEOUT_S
        while "storage is unreachable at start" not in cluster.log("n0"):
            assert cluster.nodes["n0"].alive, cluster.log("n0")
            assert time.monotonic() < deadline, cluster.log("n0")
            time.sleep(0.05)
        server = servers.start_redis(services, tmp_path, port=port)
        try:
            cluster.wait_ready("n0")
            response = cluster.execute("n0", [{"op": "put", "key": "k", "value": "v"}])
            assert response.status_code == 200, response.text
        finally:
            server.kill()
