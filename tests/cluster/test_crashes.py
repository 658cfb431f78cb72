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

import asyncio
import secrets
import time
from dataclasses import dataclass

import httpx
import pytest

from cornus.protocol.config import Protocol
from cornus.protocol.txn_ids import PROTOCOL_TAGS
from storage_adapters.contract import LogId, Record, TxnState
from storage_adapters.factory import StoreConfig, open_store
from tests.cluster.conftest import extra_backends, for_backend
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
# suite within its time (each case starts a cluster and restarts a node). Azure Blob and DynamoDB,
# when CORNUS_EXTRA_BACKENDS asks for them, get every protocol: they apply a commit in several
# requests (data first, record last), whose crash paths differ by protocol (which log holds the
# decision, who applies it on recovery), and nothing else kills a node between those requests.
BACKEND_PROTOCOLS = {"emulator": PROTOCOLS, "redis": ["cornus"], **dict.fromkeys(extra_backends(), PROTOCOLS)}
COORDINATOR_CASES = [
    (b, p, f) for b, ps in BACKEND_PROTOCOLS.items() for p in ps for f in COORDINATOR_FAILPOINTS
    if (p, f) not in NOT_ON_PATH
]
PARTICIPANT_CASES = [
    (b, p, f) for b, ps in BACKEND_PROTOCOLS.items() for p in ps for f in PARTICIPANT_FAILPOINTS
    if (p, f) not in NOT_ON_PATH
]
# Short protocol timeouts so a crash resolves quickly; idle executions time out after 2x this.
# Records are kept (not collected) for longer than a case runs, so that it reads every
# participant's record of the transaction, not the decision's tombstone alone.
SETTINGS = {"timeout_ms_txn_idle": 1500, "gc_grace_ms": 60_000}
RESOLVE_TIMEOUT_S = 20.0
# How long 2PC participants are watched to stay blocked while their coordinator is down.
BLOCKED_WATCH_S = 2.0
PARTITIONS = 6
# A short storage deadline, as test_ownership's scale test has: every start and restart waits one
# (plus the vote timeout and the clock slack) before it recovers; calls here take milliseconds
# (at most 25 ms of 4,800 in a bank run).
FAST_STORAGE = {"timeout_ms_call": "1000"}

# What the caller of the crashing request was told.
TOLD_COMMITTED = "committed"  # 200: all of it is in
TOLD_ABORTED = "aborted"  # 409: none of it is, ever
TOLD_NOTHING_RAN = "nothing-ran"  # 503: nothing was committed
TOLD_UNKNOWN = "unknown"  # 202, or the connection broke: either may be
VALUE_WHEN_TOLD = {TOLD_COMMITTED: "new", TOLD_ABORTED: "old", TOLD_NOTHING_RAN: "old"}
# A client-chosen id is refused (400, nothing ran) if it begins too close to the node's start.
CLIENT_ID_ATTEMPTS = 20

# The outcome the protocol fixes at a failpoint, whatever the timing ("new": committed, "old":
# aborted). Left out: where it depends on timing (coordinator.after_prepare: a prepare may or may
# not have left before the kill; participant.after_log_vote: the other participant's vote races
# the terminations).
OUTCOME_FIXED_AT_COORDINATOR_KILL = {
    # Nothing has left the coordinator (the one-shot's prepare rides with its execution), so no
    # participant ever votes yes.
    **{(p, "coordinator.before_prepare"): "old" for p in PROTOCOLS},
    # Every vote was yes: Cornus's rule commits it (every log holds VOTE_YES); the blocking
    # protocols had logged no decision, and a restarted coordinator presumes abort.
    ("cornus", "coordinator.after_votes"): "new",
    ("2pc", "coordinator.after_votes"): "old",
    ("coordinator-log", "coordinator.after_votes"): "old",
    # The COMMIT is in the coordinator's log: its restart resends it.
    ("2pc", "coordinator.after_decision_log"): "new",
    ("coordinator-log", "coordinator.after_decision_log"): "new",
    # The caller was told COMMIT.
    **{(p, "coordinator.after_reply"): "new" for p in PROTOCOLS},
}
OUTCOME_FIXED_AT_PARTICIPANT_KILL = {
    # Its yes vote was never logged, and its restart lost the execution: it can only be aborted.
    ("cornus", "participant.before_log_vote"): "old",
    ("2pc", "participant.before_log_vote"): "old",
    # Only a COMMIT is applied: the decision was made.
    **{(p, "participant.before_apply"): "new" for p in PROTOCOLS},
    **{(p, "participant.after_apply"): "new" for p in PROTOCOLS},
}


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


@dataclass(frozen=True)
class Told:
    """What the caller of the crashing request heard, and the transaction's id (None: not known)."""

    what: str
    txn: str | None
    answer: str


def _client_txn(node_id: str, protocol: str) -> str:
    """A one-shot id chosen by the client (cornus.protocol.txn_ids), so that the transaction's
    records can be found even when the coordinator dies before it answers."""
    tag = PROTOCOL_TAGS[Protocol(protocol)]
    return f"{int(time.time() * 1000)}.{node_id}.c{secrets.token_hex(8)}.1.{tag}"


def _execute_until_crash(
    cluster: Cluster, node_id: str, keys: tuple[str, str], protocol: str, *, client_chosen_id: bool = False
) -> Told:
    """Run the transaction on `node_id` (under an id of the client's choosing, if asked: the
    coordinator may die before it answers with its own); what its caller was told."""
    body: dict[str, object] = {"ops": [{"op": "put", "key": key, "value": "new"} for key in keys],
                               "protocol": protocol}
    txn = None
    for _ in range(CLIENT_ID_ATTEMPTS):
        if client_chosen_id:
            txn = body["txn"] = _client_txn(node_id, protocol)
        try:
            response = cluster.post(node_id, "/v1/execute", body)
        except httpx.HTTPError as error:
            return Told(TOLD_UNKNOWN, txn, f"{type(error).__name__}: {error}")
        # Refused before anything ran (a begin too close to the node's identity take): another id.
        if not (response.status_code == 400 and response.json().get("error") == "txn_begin_refused"):
            break
        time.sleep(0.1)
    answer = f"{response.status_code} {response.text}"
    try:
        said = response.json()
    except ValueError:
        said = {}
    txn = said.get("txn") or txn
    if response.status_code == 200:
        assert said.get("outcome") == "committed", answer
        return Told(TOLD_COMMITTED, txn, answer)
    told = {409: TOLD_ABORTED, 503: TOLD_NOTHING_RAN, 202: TOLD_UNKNOWN}.get(response.status_code)
    assert told is not None, f"an answer the crashing request cannot get: {answer}"
    return Told(told, txn, answer)


async def _read_records(storage: dict[str, str], txn: str, logs: list[LogId]) -> dict[str, Record | None]:
    config = StoreConfig(**{k: (int(v) if k == "timeout_ms_call" else v) for k, v in storage.items()})
    store = await open_store(config)
    try:
        return {log.key: await store.read(log, txn) for log in logs}
    finally:
        await store.close()


def _assert_outcome(
    cluster: Cluster, storage: dict[str, str], told: Told, *, protocol: str, coordinator: str, readers: list[str],
    keys: tuple[str, str], fixed: str | None,
) -> None:
    """After recovery: the data is all old or all new, agrees with what the caller was told, with
    what the transaction's records in storage decided, and with the outcome the protocol fixes."""
    for reader in readers:
        values = cluster.read(reader, list(keys))
        assert set(values.values()) in ({"new"}, {"old"}), f"not atomic (read on {reader}): {values}; {told}"
    value = next(iter(values.values()))
    if told.what in VALUE_WHEN_TOLD:
        assert value == VALUE_WHEN_TOLD[told.what], f"the caller was told {told.what}, the data is {value!r}: {told}"

    # Every log the transaction may have a record in: its participants' and, under the blocking
    # protocols, its coordinator's.
    logs = [LogId.partition("p1"), LogId.partition("p2")]
    if protocol != "cornus":
        logs.append(LogId.coordinator(coordinator))
    assert told.txn is not None, f"the transaction's id is not known: {told}"
    records = asyncio.run(_read_records(storage, told.txn, logs))
    shown = {key: None if r is None else (r.state.value, r.applied) for key, r in records.items()}
    evidence = f"txn {told.txn}, records {shown}, data {value!r}, caller told {told.what} ({told.answer})"
    decisions = {r.state for r in records.values() if r is not None and r.state.is_decision}
    assert len(decisions) <= 1, f"COMMIT in one log and ABORT in another: {evidence}"
    for log in logs[:2]:
        record = records[log.key]
        # A participant left VOTE_YES after it settled would be a transaction nobody resolves.
        assert record is None or record.state.is_decision, f"{log.key} still undecided after recovery: {evidence}"
    if TxnState.COMMIT in decisions:
        assert value == "new", f"the records decided COMMIT, the data is old: {evidence}"
        for log in logs:
            record = records[log.key]
            assert record is not None and record.state is TxnState.COMMIT, f"{log.key} lacks the COMMIT: {evidence}"
            if log in logs[:2]:
                assert record.applied, f"{log.key}'s COMMIT is not marked applied: {evidence}"
    else:
        # No decision recorded anywhere is an abort (presumed abort; a coordinator-log
        # participant records no abort).
        assert value == "old", f"no COMMIT in any log, yet the data is new: {evidence}"
    if fixed is not None:
        assert value == fixed, f"the protocol fixes this crash's outcome as {fixed!r}: {evidence}"


@pytest.mark.parametrize(("storage", "protocol", "failpoint"), COORDINATOR_CASES, indirect=["storage"])
def test_coordinator_killed(protocol: str, failpoint: str, storage: dict[str, str]) -> None:
    keys = _keys()
    storage, settings = for_backend({**storage, **FAST_STORAGE}, SETTINGS)
    with running_cluster(CLUSTER_DEFAULT[protocol], storage, settings=settings) as cluster:
        # n0 is armed from the start: the setup transaction, coordinated by n1 over p1 and p2,
        # never touches it, so its failpoint fires on the transaction under test alone.
        cluster.start_all({"n0": failpoint})
        assert cluster.execute("n1", [{"op": "put", "key": k, "value": "old"} for k in keys]).status_code == 200

        told = _execute_until_crash(cluster, "n0", keys, protocol, client_chosen_id=True)
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
        if failpoint == "coordinator.after_reply":
            assert told.what == TOLD_COMMITTED, f"after_reply dies only after the caller got the reply: {told}"
        _assert_outcome(cluster, storage, told, protocol=protocol, coordinator="n0", readers=["n1", "n2"],
                        keys=keys, fixed=OUTCOME_FIXED_AT_COORDINATOR_KILL.get((protocol, failpoint)))


@pytest.mark.parametrize(("storage", "protocol", "failpoint"), PARTICIPANT_CASES, indirect=["storage"])
def test_participant_killed_and_recovered(protocol: str, failpoint: str, storage: dict[str, str]) -> None:
    keys = _keys()
    # n1 is armed from the start, to die at the failpoint's hit by the transaction under test: the
    # setup transaction before it (the cluster's default protocol, over p1 of n1 and p2 of n2)
    # passes the failpoint once on n1, unless that protocol never takes it.
    setup_hits = 0 if (CLUSTER_DEFAULT[protocol], failpoint) in NOT_ON_PATH else 1
    storage, settings = for_backend({**storage, **FAST_STORAGE}, SETTINGS)
    with running_cluster(CLUSTER_DEFAULT[protocol], storage, settings=settings) as cluster:
        cluster.start_all({"n1": f"{failpoint}@{setup_hits + 1}"})
        assert cluster.execute("n0", [{"op": "put", "key": k, "value": "old"} for k in keys]).status_code == 200
        _wait_settled(cluster, ["n1", "n2"])
        assert cluster.nodes["n1"].alive, "the setup transaction alone must not reach the armed hit"

        # Under an id the coordinator (which lives) chooses and answers with.
        told = _execute_until_crash(cluster, "n0", keys, protocol)
        assert cluster.wait_exit("n1") == -9, "the failpoint must have killed the participant"
        cluster.start("n1")  # recovery runs before it reports ready
        _wait_settled(cluster, ["n1", "n2"])
        _assert_outcome(cluster, storage, told, protocol=protocol, coordinator="n0", readers=["n2", "n1"],
                        keys=keys, fixed=OUTCOME_FIXED_AT_PARTICIPANT_KILL.get((protocol, failpoint)))
        # The partition works again: a new transaction on the recovered node's keys commits, and
        # is what every node reads after it.
        after = cluster.execute("n2", [{"op": "put", "key": k, "value": "after"} for k in keys])
        assert after.status_code == 200, after.text
        for reader in ("n0", "n1", "n2"):
            values = cluster.read(reader, list(keys))
            assert values == dict.fromkeys(keys, "after"), f"{reader} reads {values} after the new commit"


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
