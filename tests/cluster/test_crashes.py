"""kill -9 at every named failpoint, on real node processes.

Coordinator killed: under Cornus every participant decides without the coordinator coming back;
under 2PC and coordinator-log, participants that voted yes stay undecided until it restarts
(asserted: that is the protocol). Participant killed: after a restart its recovery resolves its
transactions. In every case the transaction ends atomic: all of its writes or none.

The protocol is chosen per transaction, so each case runs its transaction under the protocol it
tests on a cluster whose configured default is another one: recovery and the participants must
follow the transaction's protocol, not the node's.
"""

from __future__ import annotations

import time

import httpx
import pytest

from tests.cluster.harness import Cluster, keys_on, running_cluster

PROTOCOLS = ["cornus", "2pc", "coordinator-log"]
# The cluster default each case runs under: never the protocol of the transaction under test.
CLUSTER_DEFAULT = {"cornus": "2pc", "2pc": "coordinator-log", "coordinator-log": "cornus"}
COORDINATOR_FAILPOINTS = [
    "coordinator.before_prepare",
    "coordinator.after_prepare",
    "coordinator.after_votes",
    "coordinator.after_decision_log",
    "coordinator.after_reply",
]
PARTICIPANT_FAILPOINTS = [
    "participant.before_log_vote",
    "participant.after_log_vote",
    "participant.before_apply",
    "participant.after_apply",
]
# Failpoints on a path the protocol never takes: Cornus coordinators log nothing, and
# coordinator-log participants vote without logging.
NOT_ON_PATH = {
    ("cornus", "coordinator.after_decision_log"),
    ("coordinator-log", "participant.before_log_vote"),
    ("coordinator-log", "participant.after_log_vote"),
}
# Every case runs on the emulator; on Redis only Cornus's. What a crash exercises is the protocol
# and the runtime, whose storage calls are the same on every backend (each of which passes the
# conformance suite); the Redis cases keep a real network backend under the crash paths, and the
# suite within its time (each case starts a cluster and restarts a node).
BACKEND_PROTOCOLS = {"emulator": PROTOCOLS, "redis": ["cornus"]}
COORDINATOR_CASES = [
    (b, p, f) for b, ps in BACKEND_PROTOCOLS.items() for p in ps for f in COORDINATOR_FAILPOINTS
    if (p, f) not in NOT_ON_PATH
]
PARTICIPANT_CASES = [
    (b, p, f) for b, ps in BACKEND_PROTOCOLS.items() for p in ps for f in PARTICIPANT_FAILPOINTS
    if (p, f) not in NOT_ON_PATH
]
# Short protocol timeouts so a crash resolves quickly; idle executions time out after 2x this.
SETTINGS = {"timeout_ms_txn_idle": 1500}
RESOLVE_TIMEOUT_S = 20.0
# How long 2PC participants are watched to stay blocked while their coordinator is down.
BLOCKED_WATCH_S = 2.0
PARTITIONS = 6
# A short storage deadline, as test_ownership's scale test has: every start and restart waits one
# (plus the vote timeout and the clock slack) before it recovers; calls here take milliseconds
# (at most 25 ms of 4,800 in a bank run).
FAST_STORAGE = {"timeout_ms_call": "1000"}


def _keys() -> tuple[str, str]:
    # p1 is owned by n1 and p2 by n2 (round-robin over sorted node ids): n0 coordinates only.
    return keys_on("p1", PARTITIONS, 1, prefix="x")[0], keys_on("p2", PARTITIONS, 1, prefix="y")[0]


def _participant_txns(cluster: Cluster, node_ids: list[str]) -> dict[str, list[dict[str, object]]]:
    found: dict[str, list[dict[str, object]]] = {}
    for node_id in node_ids:
        if not cluster.nodes[node_id].alive:
            continue
        rows = cluster.get(node_id, "/v1/admin/transactions").json()
        found[node_id] = [row for row in rows if row["role"] == "participant"]
    return found


def _wait_settled(cluster: Cluster, node_ids: list[str], timeout_s: float = RESOLVE_TIMEOUT_S) -> float:
    """Wait until no participant machine is left on `node_ids`; the seconds it took."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if not any(_participant_txns(cluster, node_ids).values()):
            return time.monotonic() - started
        time.sleep(0.02)
    raise AssertionError(f"participants did not settle: {_participant_txns(cluster, node_ids)}")


def _voted(cluster: Cluster, node_ids: list[str]) -> bool:
    return any(row["phase"] == "voted" for rows in _participant_txns(cluster, node_ids).values() for row in rows)


def _assert_atomic(cluster: Cluster, reader: str, keys: tuple[str, str], acknowledged: bool) -> str:
    values = cluster.read(reader, list(keys))
    assert set(values.values()) in ({"new"}, {"old"}), f"not atomic: {values}"
    if acknowledged:
        assert set(values.values()) == {"new"}, f"an acknowledged commit is missing: {values}"
    return next(iter(values.values()))  # type: ignore[return-value]


def _execute_until_crash(cluster: Cluster, node_id: str, keys: tuple[str, str], protocol: str) -> bool:
    """Run the transaction on `node_id`; True if the caller was told it committed."""
    try:
        response = cluster.execute(node_id, [{"op": "put", "key": key, "value": "new"} for key in keys], protocol)
    except httpx.HTTPError:
        return False
    return response.status_code == 200 and response.json()["outcome"] == "committed"


@pytest.mark.parametrize(("storage", "protocol", "failpoint"), COORDINATOR_CASES, indirect=["storage"])
def test_coordinator_killed(protocol: str, failpoint: str, storage: dict[str, str]) -> None:
    keys = _keys()
    with running_cluster(CLUSTER_DEFAULT[protocol], {**storage, **FAST_STORAGE}, settings=SETTINGS) as cluster:
        # n0 is armed from the start: the setup transaction, coordinated by n1 over p1 and p2,
        # never touches it, so its failpoint fires on the transaction under test alone.
        cluster.start_all({"n0": failpoint})
        assert cluster.execute("n1", [{"op": "put", "key": k, "value": "old"} for k in keys]).status_code == 200

        acknowledged = _execute_until_crash(cluster, "n0", keys, protocol)
        assert cluster.wait_exit("n0") == -9, "the failpoint must have killed the coordinator"
        participants = ["n1", "n2"]
        if protocol == "cornus":
            settle_s = _wait_settled(cluster, participants)  # the coordinator stays dead
            print(f"{protocol} {failpoint}: participants settled {settle_s * 1000:.0f} ms after the kill")
        else:
            if _voted(cluster, participants):
                time.sleep(BLOCKED_WATCH_S)
                assert _voted(cluster, participants), "2PC participants decided without their coordinator"
            cluster.start("n0")
            _wait_settled(cluster, participants)
        _assert_atomic(cluster, "n1", keys, acknowledged)
        if protocol == "cornus" and failpoint == "coordinator.after_reply":
            assert acknowledged, "after_reply dies only after the caller got the reply"


@pytest.mark.parametrize(("storage", "protocol", "failpoint"), PARTICIPANT_CASES, indirect=["storage"])
def test_participant_killed_and_recovered(protocol: str, failpoint: str, storage: dict[str, str]) -> None:
    keys = _keys()
    # n1 is armed from the start, to die at the failpoint's hit by the transaction under test: the
    # setup transaction before it (the cluster's default protocol, over p1 of n1 and p2 of n2)
    # passes the failpoint once on n1, unless that protocol never takes it.
    setup_hits = 0 if (CLUSTER_DEFAULT[protocol], failpoint) in NOT_ON_PATH else 1
    with running_cluster(CLUSTER_DEFAULT[protocol], {**storage, **FAST_STORAGE}, settings=SETTINGS) as cluster:
        cluster.start_all({"n1": f"{failpoint}@{setup_hits + 1}"})
        assert cluster.execute("n0", [{"op": "put", "key": k, "value": "old"} for k in keys]).status_code == 200
        _wait_settled(cluster, ["n1", "n2"])
        assert cluster.nodes["n1"].alive, "the setup transaction alone must not reach the armed hit"

        acknowledged = _execute_until_crash(cluster, "n0", keys, protocol)
        assert cluster.wait_exit("n1") == -9, "the failpoint must have killed the participant"
        cluster.start("n1")  # recovery runs before it reports ready
        _wait_settled(cluster, ["n1", "n2"])
        _assert_atomic(cluster, "n2", keys, acknowledged)
        # The partition works again: a new transaction on the recovered node's keys commits.
        after = cluster.execute("n2", [{"op": "put", "key": k, "value": "after"} for k in keys])
        assert after.status_code == 200, after.text


@pytest.mark.parametrize("wholly_read_only", [False, True], ids=["read-and-write", "read-only"])
def test_reads_on_a_restarted_partition_abort_the_transaction(wholly_read_only: bool, storage: dict[str, str]) -> None:
    """A partition only read takes no part in the vote, but its read locks must hold until the
    commit: here its owner restarts between the read and the commit, so the locks are gone and
    another transaction overwrites the value read. Committing would expose a stale read."""
    read_key, write_key = _keys()  # read on p1 (n1), write on p2 (n2); n0 coordinates
    # The transaction must outlive n1's restart (recovery waits out the storage deadline first).
    with running_cluster("cornus", {**storage, **FAST_STORAGE}, settings={"timeout_ms_txn_idle": 30_000}) as cluster:
        cluster.start_all()
        setup = [{"op": "put", "key": k, "value": "old"} for k in (read_key, write_key)]
        assert cluster.execute("n0", setup).status_code == 200
        txn = cluster.post("n0", "/v1/txn").json()["txn"]
        read = cluster.post("n0", f"/v1/txn/{txn}/read", {"keys": [read_key]})
        assert read.json()["values"] == {read_key: "old"}, read.text
        if not wholly_read_only:
            assert cluster.post("n0", f"/v1/txn/{txn}/write", {"writes": {write_key: "new"}}).status_code == 200

        cluster.kill("n1")
        cluster.start("n1")
        # Retried while retryable: p1 may still be on its way back to n1 (another node took it
        # while n1 was down, and hands it over), and is served by neither meanwhile.
        overwrite = cluster.execute_retrying("n2", [{"op": "put", "key": read_key, "value": "changed"}])
        assert overwrite.status_code == 200, f"the restarted partition no longer holds the read lock: {overwrite.text}"

        commit = cluster.post("n0", f"/v1/txn/{txn}/commit")
        assert commit.status_code == 409, commit.text
        assert commit.json()["reason"] == "voted_no" and commit.json()["retryable"] is True, commit.text
        assert "lost the read locks" in commit.json()["detail"], commit.text
        assert cluster.read("n0", [read_key, write_key]) == {read_key: "changed", write_key: "old"}
        # Nothing is left locked: the next transaction on both keys commits.
        after = cluster.execute("n0", [{"op": "put", "key": k, "value": "after"} for k in (read_key, write_key)])
        assert after.status_code == 200, after.text
