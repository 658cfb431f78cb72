"""Exactly-once one-shots through the SDK while the coordinating node is killed mid-commit.

A transfer-like logical operation (read a counter, then one one-shot: check the counter still
holds what was read, write it plus one, and write a marker key of the operation) runs through
`CornusClient` as its documented contract asks of a caller: `execute` runs it under an id the SDK
chose; an UNKNOWN outcome is settled by asking `status(txn)` until it says COMMITTED (done), or
ABORTED or "not known" (NotFound: it never committed, so it is run again, under a new id). The node
coordinating the first attempt is killed at a coordinator failpoint, and restarted while the
caller asks. At the end the operation must have taken effect exactly once: the counter is 1, the
marker is there, and of every id the caller sent, exactly one has a COMMIT in storage, and it is
the one the caller was finally told committed: read through the API on every node and directly
from storage (the data and the transaction's records in the participants' logs).

Where the contract leaves the outcome open for good (the status call, and a resolve by hand,
still say UNKNOWN: a coordinator killed before prepare, restarted, leaves nothing that tells of
its transaction), what it promises is asserted instead: the caller never runs it again, and
nothing of it is committed, through the API or in storage.

The SDK itself does not re-run an UNKNOWN one-shot (execute returns it, with the id to ask
about): the asking and the re-running are the caller's part of the contract, done here as its
docstrings (CornusClient.status, Outcome/OutcomeUnknown) say.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from dataclasses import dataclass, field

import httpx
import pytest

from cornus.runtime.keys import partition_of
from services.client import (
    ClientConfig,
    CornusClient,
    CornusError,
    NotFound,
    Op,
    Status,
    TransactionFailed,
    Unavailable,
)
from storage_adapters.contract import LogId, Record, TxnState
from storage_adapters.factory import StoreConfig, open_store
from tests.cluster.harness import Cluster, keys_on, running_cluster

PARTITIONS = 6
# As tests/cluster/test_crashes.py: short protocol timeouts, records kept past the test's end.
SETTINGS = {"timeout_ms_txn_idle": 1500, "gc_grace_ms": 60_000}
FAST_STORAGE = {"timeout_ms_call": "1000"}
# One id per execute (no retry inside the SDK), so that every id the caller sent is known and its
# records can be read; the caller's loop does the retrying.
WRITER_CONFIG = ClientConfig(retry_count_max=0, backoff_ms_min=10, backoff_ms_max=100)
READER_CONFIG = ClientConfig(retry_count_max=4, backoff_ms_min=10, backoff_ms_max=100)
OPERATION_TIMEOUT_S = 25.0
POLL_S = 0.1
# How long the caller takes UNKNOWN from the status call before it resolves by hand.
UNKNOWN_BEFORE_RESOLVE_S = 4.0
UNKNOWN_AFTER_RESOLVE_S = 1.0

# (backend, protocol, failpoint on the coordinator, what the first attempt must come to: True
# committed, False not committed, None not committed or left UNKNOWN for good). Cornus
# after_votes: every vote is yes, so Cornus's rule commits it though the caller hears nothing;
# before_prepare: no participant ever votes, nothing commits, but nothing is left to tell of it
# either, and the contract lets the status call answer UNKNOWN for ever ("never take that for
# never happened"): the caller then must not run it again, and storage must show nothing
# committed; 2PC after_votes: no decision was logged, its restarted coordinator presumes abort.
CASES = [
    ("redis", "cornus", "coordinator.after_votes", True),
    ("redis", "cornus", "coordinator.before_prepare", None),
    ("emulator", "2pc", "coordinator.after_votes", False),
]


@dataclass
class Attempt:
    txn: str
    node_url: str
    told: list[str] = field(default_factory=list)  # what the SDK said of it, in order
    committed: bool | None = None  # the caller's conclusion (None: never settled)


@dataclass
class Run:
    attempts: list[Attempt] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    done: bool = False
    error: BaseException | None = None


def _read_counter(reader: CornusClient, counter: str, deadline: float, run: Run) -> int:
    while True:
        try:
            value = reader.get(counter)
            return int(value or 0)
        except (TransactionFailed, Unavailable) as error:
            # Locked by an unfinished transaction, or a partition between owners: ask again.
            run.log.append(f"read of the counter failed: {error}"[:300])
        assert time.monotonic() < deadline, f"the counter could not be read: {run.log[-3:]}"
        time.sleep(POLL_S)


def _settle(writer: CornusClient, attempt: Attempt, deadline: float) -> bool | None:
    """Ask the status call about an UNKNOWN attempt until it says committed or not. The contract
    lets it answer UNKNOWN for ever ("never take that for never happened"): past
    UNKNOWN_BEFORE_RESOLVE_S of it, the caller runs termination by hand (`resolve`, which any node
    runs from storage, and which may write ABORT where nothing voted), once, and asks again for
    UNKNOWN_AFTER_RESOLVE_S: None if it still says UNKNOWN then (the caller must not run it again)."""
    unknown_since: float | None = None
    resolved = False
    while time.monotonic() < deadline:
        try:
            outcome = writer.status(attempt.txn)
        except NotFound as error:
            attempt.told.append(f"status: not known ({error.detail[:120]})")
            return False
        except Unavailable as error:
            attempt.told.append(f"status: no node answered ({error.outcome.detail[:120]})")
        else:
            said = f"status: {outcome.status.value} {outcome.detail[:100]}".rstrip()
            if not attempt.told or attempt.told[-1] != said:
                attempt.told.append(said)
            if outcome.status is Status.COMMITTED:
                return True
            if outcome.status is Status.ABORTED:
                return False
            if outcome.status is Status.UNKNOWN:
                unknown_since = unknown_since or time.monotonic()
                if not resolved and time.monotonic() - unknown_since > UNKNOWN_BEFORE_RESOLVE_S:
                    resolved = True
                    unknown_since = time.monotonic()
                    try:
                        by_hand = writer.resolve(attempt.txn)
                        attempt.told.append(f"resolve: {by_hand.status.value} {by_hand.detail[:100]}".rstrip())
                    except CornusError as error:
                        attempt.told.append(f"resolve: {error!r}"[:200])
                elif resolved and time.monotonic() - unknown_since > UNKNOWN_AFTER_RESOLVE_S:
                    return None
        time.sleep(POLL_S)
    raise AssertionError(f"{attempt.txn} never settled: {attempt.told[-6:]}")


def _run_exactly_once(writer: CornusClient, reader: CornusClient, *, counter: str, marker: str, op_id: str,
                      run: Run) -> None:
    deadline = time.monotonic() + OPERATION_TIMEOUT_S
    try:
        while True:
            assert time.monotonic() < deadline, f"the operation did not finish: {run.log[-5:]}"
            seen = _read_counter(reader, counter, deadline, run)
            ops = [Op.check(counter, None if seen == 0 else str(seen)), Op.put(counter, str(seen + 1)),
                   Op.put(marker, op_id)]
            outcome = writer.execute(ops)
            attempt = Attempt(outcome.txn, outcome.node_url)
            attempt.told.append(f"execute: {outcome.status.value} {outcome.reason or ''} {outcome.detail[:160]}")
            run.attempts.append(attempt)
            run.log.append(f"attempt {outcome.txn or '(no id)'} on {outcome.node_url} read {seen}: "
                           f"{outcome.status.value}")
            if outcome.status is Status.COMMITTED:
                attempt.committed = True
                break
            if outcome.status is Status.UNKNOWN:
                assert outcome.txn, f"an UNKNOWN outcome without an id to ask about: {outcome}"
                attempt.committed = _settle(writer, attempt, deadline)
                if attempt.committed is None:
                    break  # UNKNOWN for good: never run again (it may have committed, says the contract)
                if attempt.committed:
                    break
            else:
                # ABORTED or UNAVAILABLE: the node said nothing committed.
                attempt.committed = False
            time.sleep(POLL_S)
        run.done = True
    except BaseException as error:  # handed to the test's thread
        run.error = error


Records = dict[str, dict[str, Record | None]]


async def _from_storage(storage: dict[str, str], keys: list[str],
                        logs_by_txn: dict[str, list[LogId]]) -> tuple[dict[str, bytes | None], Records]:
    config = StoreConfig(**{k: (int(v) if k == "timeout_ms_call" else v) for k, v in storage.items()})
    store = await open_store(config)
    try:
        data: dict[str, bytes | None] = {}
        for key in keys:
            data.update(await store.read_data(partition_of(key, PARTITIONS), [key]))
        records = {txn: {log.key: await store.read(log, txn) for log in logs} for txn, logs in logs_by_txn.items()}
        return data, records
    finally:
        await store.close()


def _coordinator_of(txn: str) -> str:
    return txn.split(".")[1]  # <begin ms>.<node>.<token>.<counter>.<tag>


@pytest.mark.parametrize(("storage", "protocol", "failpoint", "first_commits"), CASES, indirect=["storage"])
def test_a_one_shot_runs_exactly_once_through_a_coordinator_crash(
    protocol: str, failpoint: str, first_commits: bool, storage: dict[str, str],
) -> None:
    storage = {**storage, **FAST_STORAGE}
    op_id = f"op-{secrets.token_hex(6)}"
    # The counter on p1 (n1), the marker on p2 (n2): n0 owns neither and coordinates the first attempt.
    counter = keys_on("p1", PARTITIONS, 1, prefix="counter-")[0]
    marker = keys_on("p2", PARTITIONS, 1, prefix=f"marker-{op_id}-")[0]
    with running_cluster(protocol, storage, partition_count=PARTITIONS, settings=SETTINGS) as cluster:
        cluster.start_all({"n0": failpoint})
        urls = [cluster.nodes[n].url for n in ("n0", "n1", "n2")]
        run = Run()
        # The writer's first execute goes to its first URL, n0 (round-robin); reads go to n1 and
        # n2 only, so that nothing but the attempt under test reaches n0's failpoint.
        with CornusClient(urls, config=WRITER_CONFIG) as writer, \
                CornusClient(urls[1:], config=READER_CONFIG) as reader:
            assert reader.get(counter) is None and reader.get(marker) is None
            driver = threading.Thread(target=_run_exactly_once, args=(writer, reader), daemon=True,
                                      kwargs={"counter": counter, "marker": marker, "op_id": op_id, "run": run})
            driver.start()
            assert cluster.wait_exit("n0", timeout_s=15) == -9, "the failpoint must have killed the coordinator"
            cluster.start("n0")  # without the failpoint; the caller keeps asking meanwhile
            driver.join(OPERATION_TIMEOUT_S + 5)
            assert not driver.is_alive(), f"the caller is stuck: {run.log[-5:]}"
            evidence = "; ".join(f"{a.txn} on {a.node_url}: {' | '.join(a.told)}" for a in run.attempts)
            if run.error is not None:
                raise AssertionError(f"the caller failed: {run.error!r}; attempts: {evidence}") from run.error
            assert run.done

            first = run.attempts[0]
            assert first.node_url == urls[0] and _coordinator_of(first.txn) == "n0", evidence
            assert first.told[0].startswith("execute: unknown"), f"the killed coordinator answered: {evidence}"
            if first_commits is None:
                assert first.committed is not True, f"nothing can commit before prepare: {evidence}"
            else:
                assert first.committed is first_commits, f"the protocol fixes this crash's outcome: {evidence}"
            left_unknown = first.committed is None
            print(f"{protocol} {failpoint}: {evidence}")
            committed_told = [a for a in run.attempts if a.committed]
            if left_unknown:
                # The contract's ambiguous end: UNKNOWN, never run again under another id.
                assert run.attempts == [first] and not committed_told, f"re-run while in doubt: {evidence}"
                expected = {counter: None, marker: None}
            else:
                assert len(committed_told) == 1 and committed_told[0] is run.attempts[-1], evidence
                if first.committed:
                    assert len(run.attempts) == 1, f"re-run after a commit: {evidence}"
                else:
                    assert len(run.attempts) >= 2, evidence
                expected = {counter: "1", marker: op_id}

            # Through the API: the SDK, and every node.
            assert {counter: reader.get(counter), marker: reader.get(marker)} == expected, evidence
            with CornusClient(urls, config=READER_CONFIG) as everyone:
                for _ in urls:
                    assert {counter: everyone.get(counter), marker: everyone.get(marker)} == expected, evidence
            for node_id in cluster.nodes:
                assert cluster.read(node_id, [counter, marker]) == expected, (node_id, evidence)
            _wait_settled(cluster)

        # Directly from storage: the data, and every attempt's records.
        logs_by_txn = {}
        for attempt in run.attempts:
            logs = [LogId.partition("p1"), LogId.partition("p2")]
            if protocol != "cornus":
                logs.append(LogId.coordinator(_coordinator_of(attempt.txn)))
            logs_by_txn[attempt.txn] = logs
        data, records = asyncio.run(_from_storage(storage, [counter, marker], logs_by_txn))
        shown = {txn: {k: None if r is None else (r.state.value, r.applied) for k, r in by_log.items()}
                 for txn, by_log in records.items()}
        evidence += f"; records {shown}; data {data}"
        assert data == {k: None if v is None else v.encode() for k, v in expected.items()}, evidence
        committed_stored = [txn for txn, by_log in records.items()
                            if any(r is not None and r.state is TxnState.COMMIT for r in by_log.values())]
        assert committed_stored == [a.txn for a in committed_told], (
            f"committed in storage: {committed_stored}; {evidence}")
        for attempt in committed_told:
            for log in ("p1", "p2"):
                record = records[attempt.txn][LogId.partition(log).key]
                assert record is not None and record.state is TxnState.COMMIT and record.applied, evidence
        for txn, by_log in records.items():
            for log in ("p1", "p2"):
                record = by_log[LogId.partition(log).key]
                # A participant's record left undecided would be a transaction nobody resolves.
                assert record is None or record.state.is_decision, f"{txn} undecided in {log}: {evidence}"


def _wait_settled(cluster: Cluster, timeout_s: float = 10.0) -> None:
    """No participant machine left on any node: every record is decided."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            rows = [row for node_id in cluster.nodes for row in cluster.get(node_id, "/v1/admin/transactions").json()]
        except (httpx.HTTPError, ValueError):
            rows = [{"role": "participant"}]
        if not any(row["role"] == "participant" for row in rows):
            return
        assert time.monotonic() < deadline, f"participants did not settle: {rows}"
        time.sleep(0.05)
