"""Regression tests for bugs an audit reproduced in the node runtime. Each drives real in-process
nodes (tests/runtime/faults.py) over the emulator store and states what a user may rely on; each
failed on the code it was written against, for the reason its docstring names."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest

from cornus.protocol import txn_ids
from cornus.protocol.config import Protocol
from cornus.protocol.locks import LockMode, Policy
from cornus.protocol.messages import Decision, DecisionAnswer, DecisionQuery, Prepare
from cornus.runtime import admin as admin_module
from cornus.runtime import coordination
from cornus.runtime import partition as partition_runtime
from cornus.runtime.config import NodeConfig, load_node_config
from cornus.runtime.coordination import TxnAborted
from cornus.runtime.node import Node
from cornus.runtime.outcome import AbortReason, NodeOverloaded, OutcomeStatus, TxnWrongState
from cornus.runtime.ownership import now_ms as lease_clock_ms
from cornus.runtime.transport import PeerUnavailable
from cornus.runtime.wire import ExecuteRequest, ExecuteStatus, Op, OpKind, Routed
from services.api.metrics import Metrics
from services.api.rest import build_app
from services.node_rpc.transport import MessageTooLarge
from storage_adapters.contract import (
    DATA_KEY_BYTES_MAX,
    PARTICIPANT_COUNT_MAX,
    REDO_BYTES_MAX,
    LogId,
    RecordBody,
    TxnState,
)
from storage_adapters.errors import ValidationError
from storage_adapters.factory import StoreConfig
from tests.runtime.faults import (
    CLOCK_SLACK_MS,
    PROTOCOL_DEFAULTS,
    STORAGE_TIMEOUT_MS,
    LocalCluster,
    commit_told_unknown,
    commit_writes,
    eventually,
    holds,
    is_tombstone,
    keys_in,
    local_cluster,
    puts,
    read_through,
    records_collected,
    redo_of,
    txn_id,
    wait_collected,
    wait_until,
)

# A backstop only: every wait below has its own, shorter deadline.
pytestmark = pytest.mark.timeout(60)

# How long a refusal "at the edge" may take: it needs no protocol round, let alone a timeout.
REFUSAL_S = 3.0


async def _refused(attempt: Callable[[], Awaitable[object]], what: str) -> ValidationError:
    """The ValidationError `attempt` raises within REFUSAL_S; fails the test otherwise."""
    result: object = None
    try:
        async with asyncio.timeout(REFUSAL_S):
            result = await attempt()
    except ValidationError as error:
        return error
    except TimeoutError:
        result = TimeoutError
    if result is TimeoutError:
        pytest.fail(f"{what}: neither refused nor finished within {REFUSAL_S} s (it hangs)")
    pytest.fail(f"{what}: not refused, it returned {result!r}")


async def _nothing_changed(cluster: LocalCluster, keys: list[str], what: str) -> None:
    """None of `keys` was written, and none is still locked: transactions writing them commit."""
    written = {key: value for key in keys if (value := await cluster.value(key)) is not None}
    assert not written, f"{what} was refused, yet it wrote {sorted(written)[:5]}..."
    node = cluster.node()
    for start in range(0, len(keys), PARTICIPANT_COUNT_MAX // 2):
        chunk = keys[start : start + PARTICIPANT_COUNT_MAX // 2]
        async with asyncio.timeout(5):
            outcome = await node.execute(puts(dict.fromkeys(chunk, b"later")))
        assert outcome.status is OutcomeStatus.COMMITTED, (
            f"{what} was refused, but a later transaction on its keys does not commit (locks left behind): {outcome}"
        )


# === 1. recovery pages ============================================================================


async def test_recovery_sees_every_page_of_unfinished_records(tmp_path):
    """Recovery must page through all unfinished records of an owned partition. It read only the
    first page (its scan has no cursor), leaving the rest in doubt and locked forever."""
    txn_count = 9
    async with local_cluster(tmp_path, partition_count=2, protocol_config={"scan_page_count_max": 2}) as cluster:
        # A node that crashed after every participant voted yes, before any decision: Cornus
        # VOTE_YES records in both of its partitions, for more transactions than one page holds.
        expected: dict[str, bytes] = {}
        txns = []
        for index in range(txn_count):
            txn = txn_id("n0", index + 1, Protocol.CORNUS)
            txns.append(txn)
            for partition, key in keys_in(2, ["p0", "p1"], prefix=f"t{index}-").items():
                value = f"{txn}:{partition}".encode()
                expected[key] = value
                body = RecordBody(("p0", "p1"), "n0", redo_of({key: value}))
                await cluster.real_store.log_once(LogId.partition(partition), txn, TxnState.VOTE_YES, body)
        await cluster.restart("n0")

        async def unresolved() -> list[str]:
            return [key for key, value in expected.items() if await cluster.value(key) != value]

        async def all_applied() -> bool:
            return not await unresolved()

        async def report() -> str:
            states = {txn: [(r.state.value, r.applied) if (r := await cluster.record(p, txn)) else None
                            for p in ("p0", "p1")] for txn in txns}
            left = [txn for txn, per in states.items() if per != [("COMMIT", True)] * 2]
            return (f"{len(left)} of {txn_count} transactions left unresolved after recovery "
                    f"(page size 2): {[(txn, states[txn]) for txn in left]}")

        if not await eventually(all_applied, 5):
            pytest.fail(await report())


# === 2. a committed redo is never given up =========================================================


async def test_apply_never_gives_up_on_a_committed_redo(tmp_path, monkeypatch):
    """While storage refuses the data write of a committed transaction, the participant must keep
    trying, keep its locks and keep the COMMIT record. It gave up after a retry budget, released,
    acked, and GC deleted the record: once storage healed, nothing applied it; the commit was lost."""
    budget = 3
    # Shrink the runtime's retry budget, if it still has one (raising=False: the fix may drop it).
    monkeypatch.setattr(partition_runtime, "APPLY_ATTEMPT_COUNT_MAX", budget, raising=False)
    monkeypatch.setattr(partition_runtime, "APPLY_BACKOFF_MS_MAX", 20, raising=False)
    async with local_cluster(tmp_path, partition_count=2) as cluster:
        node, faults = cluster.node(), cluster.faults["n0"]
        keys = keys_in(2, ["p0", "p1"])
        writes = {key: f"committed-{partition}".encode() for partition, key in keys.items()}
        txn = node.begin()
        await node.run_ops(txn, puts(writes))
        faults.fail("apply_redo", count=None, where=lambda args: args["txn"] == txn)
        outcome = await node.commit(txn)
        assert outcome.status is OutcomeStatus.COMMITTED, outcome

        # The outage outlasts the retry budget and the GC grace period.
        started = time.monotonic()
        gc_grace_s = PROTOCOL_DEFAULTS["gc_grace_ms"] / 1000

        async def outage_long_enough() -> bool:
            if faults.calls_of("delete", txn=txn):
                return True  # GC ran already: no use waiting longer
            retried = all(len(faults.calls_of("apply_redo", "failed", partition=p, txn=txn)) > budget for p in keys)
            return retried and time.monotonic() - started > gc_grace_s + 0.5

        await wait_until(outage_long_enough, 5, "the apply was neither retried past the budget nor given up")
        faults.heal()

        async def applied() -> bool:
            return all([await cluster.value(key) == value for key, value in writes.items()])

        problems = []
        if not await eventually(applied, 5):
            stored = {key: await cluster.value(key) for key in writes}
            problems.append(f"the committed writes never reached storage after it healed: storage holds {stored}")
        for partition in keys:
            applies = faults.calls_of("apply_redo", "ok", partition=partition, txn=txn)
            deletes = faults.calls_of("delete", "ok", log=LogId.partition(partition), txn=txn)
            if deletes and (not applies or deletes[0].seq < applies[0].seq):
                failed = len(faults.calls_of("apply_redo", "failed", partition=partition, txn=txn))
                problems.append(f"the COMMIT record of {txn} in {partition} was garbage-collected before its redo "
                                f"was applied (after {failed} failed applies)")
        assert not problems, "; ".join(problems)


# === 3. cache after an apply that timed out but landed ==========================================


async def test_cache_is_fresh_after_an_apply_that_timed_out_but_landed(tmp_path):
    """The owner caches committed data. An apply that landed but reported a timeout is retried, and
    the retry says "applied before": the cache must still end up with the new value. It kept the
    old one, so reads through the owner returned data from before the commit."""
    async with local_cluster(tmp_path, partition_count=1) as cluster:
        node, faults = cluster.node(), cluster.faults["n0"]
        key = "k"
        await commit_writes(node, {key: b"old"})
        assert await read_through(node, key) == b"old"

        txn = node.begin()
        await node.run_ops(txn, puts({key: b"new"}))
        faults.land_then_fail("apply_redo", where=lambda args: args["txn"] == txn)
        assert (await node.commit(txn)).status is OutcomeStatus.COMMITTED

        async def landed() -> bool:
            return await cluster.value(key) == b"new"

        await wait_until(landed, 5, "the committed write never reached storage")
        seen = await read_through(node, key)
        assert seen == b"new", (
            f"a read through the owner returns {seen!r} after the commit of b'new' (storage holds b'new'): "
            "its cache missed an apply that timed out but landed"
        )


# === 4. a late duplicate COMMIT in coordinator-log ===============================================


async def test_late_duplicate_commit_does_not_reapply_old_redo(tmp_path):
    """A coordinator-log COMMIT that arrives after its transaction was collected must change
    nothing. The participant took it for a vote it had forgotten: it logged a fresh COMMIT and
    applied the old redo over a later transaction's write."""
    async with local_cluster(tmp_path, partition_count=1) as cluster:
        node = cluster.node()
        key = "k"
        partition = cluster.partition_of(key)
        first = await commit_writes(node, {key: b"1"}, Protocol.COORDINATOR_LOG)

        async def collected() -> bool:
            return (await records_collected(cluster, first.txn, [partition])
                    and await cluster.coordinator_record("n0", first.txn) is None)

        await wait_until(collected, 5, f"the records of {first.txn} were never garbage-collected")
        await commit_writes(node, {key: b"2"}, Protocol.COORDINATOR_LOG)

        async def second_applied() -> bool:
            return await cluster.value(key) == b"2"

        await wait_until(second_applied, 5, "the second write never reached storage")

        # Decisions carried the coordinator-log redo when this bug was found; they no longer do, and
        # a late COMMIT must change nothing either way.
        late = Decision(first.txn, TxnState.COMMIT)
        node.on_message("n0", Routed("n0", partition, late))

        async def unchanged() -> bool:
            return await cluster.value(key) == b"2" and is_tombstone(await cluster.record(partition, first.txn))

        async def report() -> str:
            record = await cluster.record(partition, first.txn)
            return (f"after a late duplicate COMMIT of collected {first.txn}: {key} = {await cluster.value(key)!r} "
                    f"(the later transaction wrote b'2'); its record in {partition}: "
                    f"{None if record is None else (record.state.value, 'applied' if record.applied else 'unapplied')}")

        if not await holds(unchanged, 1.0):
            pytest.fail(await report())


# === 5. resolve after a partial GC ================================================================


async def test_resolve_after_partial_gc_reports_commit_and_writes_nothing(tmp_path):
    """GC deletes a committed transaction's records one by one. Resolving it in between must report
    COMMIT (a COMMIT record remains) and write nothing. Resolve ran LogOnce(ABORT) on every
    participant, created an ABORT in the emptied slot beside the COMMIT, and reported aborted."""
    # No GC by the node itself here: the test plays a GC that stopped half-way.
    no_gc = {"gc_grace_ms": 60_000}
    async with local_cluster(tmp_path, node_count=2, partition_count=2, protocol_config=no_gc) as cluster:
        keys = keys_in(2, ["p0", "p1"])
        outcome = await commit_writes(cluster.node("n0"), {keys["p0"]: b"a", keys["p1"]: b"b"})
        txn = outcome.txn

        async def both_applied() -> bool:
            records = [await cluster.record(p, txn) for p in ("p0", "p1")]
            return all(r is not None and r.state is TxnState.COMMIT and r.applied for r in records)

        await wait_until(both_applied, 5, "the participants never applied the commit")
        # GC deletes the partition records in participant order: p0 first.
        await cluster.real_store.delete(LogId.partition("p0"), txn)

        resolved = await cluster.node("n1").resolve(txn)
        record = await cluster.record("p0", txn)
        problems = []
        if resolved.status is not OutcomeStatus.COMMITTED:
            problems.append(f"resolve reports {resolved.status.value} ({resolved.detail}) for a committed transaction")
        if record is not None:
            problems.append(f"resolve wrote {record.state.value} into the collected record slot of p0")
        assert not problems, "; ".join(problems)


async def test_a_resolve_suspended_between_its_reads_and_writes_writes_nothing(tmp_path, monkeypatch):
    """Found by review: the resolve's write window (gc_grace_ms less a deadline and the slack) ran
    on the event loop's clock, which stops while the machine is suspended: a resolve suspended
    between its reads and its LogOnce(ABORT)s wrote them after the window, when the records could
    have been collected (an ABORT beside a returned COMMIT). The window runs on the lease clock
    now (CLOCK_BOOTTIME), which counts the suspend; here that clock jumps a grace ahead once the
    resolve has started, as after a suspend during its reads."""
    protocol = {"gc_grace_ms": 60_000}
    async with local_cluster(tmp_path, node_count=2, partition_count=2, protocol_config=protocol) as cluster:
        txn = txn_ids.new_txn_id(int(time.time() * 1000) - 1_000, "n0", "susp01", 1, Protocol.CORNUS)
        body = RecordBody(("p0", "p1"), "n0", b"")
        await cluster.real_store.log_once(LogId.partition("p0"), txn, TxnState.VOTE_YES, body)
        started: list[int] = []
        real_now_ms = lease_clock_ms

        def suspended_after_start() -> int:
            started.append(1)
            return real_now_ms() + (protocol["gc_grace_ms"] if len(started) > 1 else 0)

        monkeypatch.setattr(admin_module, "now_ms", suspended_after_start, raising=False)
        resolved = await cluster.node("n1").resolve(txn)
        written = await cluster.record("p1", txn)
        assert written is None, f"the resolve wrote {written.state.value} after its window closed"
        assert resolved.status is OutcomeStatus.UNKNOWN, resolved


async def test_a_resolve_suspended_while_it_asks_the_coordinator_writes_nothing(tmp_path, monkeypatch):
    """Found by review: the question to the coordinator (before the first write) awaits after the
    writes' deadline was fixed in the loop's clock, which a suspend stops: a suspend during the
    question sent the writes after the window (on the lease clock) had closed. The window is read
    again after the question; here the lease clock jumps a grace ahead while it is asked."""
    protocol = {"gc_grace_ms": 60_000}
    async with local_cluster(tmp_path, node_count=2, partition_count=2, protocol_config=protocol) as cluster:
        txn = txn_ids.new_txn_id(int(time.time() * 1000) - 1_000, "n0", "susp02", 1, Protocol.CORNUS)
        await cluster.real_store.log_once(LogId.partition("p0"), txn, TxnState.VOTE_YES,
                                          RecordBody(("p0", "p1"), "n0", b""))
        node = cluster.node("n1")
        jumped = {"ms": 0}
        monkeypatch.setattr(admin_module, "now_ms", lambda: lease_clock_ms() + jumped["ms"], raising=False)
        real_question = node.admin._coordinator_knows

        async def suspended_question(asked: str) -> Any:
            jumped["ms"] = protocol["gc_grace_ms"]
            return await real_question(asked)

        monkeypatch.setattr(node.admin, "_coordinator_knows", suspended_question)
        resolved = await node.resolve(txn)
        written = await cluster.record("p1", txn)
        assert written is None, f"the resolve wrote {written.state.value} after its window closed"
        assert resolved.status is OutcomeStatus.UNKNOWN, resolved


async def test_a_resolve_stalled_between_its_window_check_and_its_writes_writes_nothing(tmp_path, monkeypatch):
    """Found by review: a resolve checked its write window once a round and then wrote with fresh
    storage deadlines, so a stall between the check and the writes still wrote after the window
    (when the records could have been collected). The writes' deadline is the window's end now,
    and storage (the emulator's writer here) refuses them past it. The test clusters' window is
    gc_grace_ms less a deadline and the slack: 500 ms; the stall is longer."""
    async with local_cluster(tmp_path, node_count=2, partition_count=2) as cluster:
        node = cluster.node("n1")
        window_ms = node.config.protocol_config.gc_grace_ms - STORAGE_TIMEOUT_MS - CLOCK_SLACK_MS
        txn = txn_ids.new_txn_id(int(time.time() * 1000) - 1_000, "n0", "stal01", 1, Protocol.CORNUS)
        await cluster.real_store.log_once(LogId.partition("p0"), txn, TxnState.VOTE_YES,
                                          RecordBody(("p0", "p1"), "n0", b""))
        real_log_once = node.admin.store.log_once

        async def stalled_log_once(*args: Any, **kwargs: Any) -> Any:
            time.sleep(2 * window_ms / 1000)  # the node stalls as the write leaves  # noqa: ASYNC251
            return await real_log_once(*args, **kwargs)

        monkeypatch.setattr(node.admin.store, "log_once", stalled_log_once)
        resolved = await node.resolve(txn)
        written = await cluster.record("p1", txn)
        assert written is None, f"the resolve wrote {written.state.value} after its window closed"
        assert resolved.status is OutcomeStatus.UNKNOWN, resolved


# === 6. too many participants ======================================================================


# The check after a refusal (_nothing_changed) commits PARTICIPANT_COUNT_MAX // 2 partitions per
# transaction through one SQLite file; on a loaded CI machine that execution alone outlasted the
# 200 ms vote timeout of test clusters, and termination rightly aborted it. A longer vote timeout
# leaves a lock left behind (refused after timeout_ms_lock_wait) as the only way that check fails.
# Not longer still: a restarted or starting node waits out recovery_settle_ms, which includes it.
WIDE_TXN_PROTOCOL: dict[str, int] = {"timeout_ms_prepare": 4_000, "timeout_ms_votes": 2_000}
# One node holds 300 partitions: leases of a few renewals' length, as the cluster default (1 s,
# renewed every 200 ms) lapsed under a loaded CI run and the later transaction found p155 unowned.
WIDE_TXN_OWNERSHIP: dict[str, int] = {"lease_ms": 4_000, "renew_interval_ms": 500}


def _keys_over_participant_limit(partition_count: int) -> list[str]:
    partitions = [f"p{index}" for index in range(PARTICIPANT_COUNT_MAX + 1)]
    return list(keys_in(partition_count, partitions).values())


async def test_transaction_over_too_many_partitions_is_refused_at_the_edge(tmp_path):
    """A transaction writing more partitions than a record can list (PARTICIPANT_COUNT_MAX) must be
    refused at once, naming the limit, and change nothing. It hung in VOTING (every participant
    failed to build its vote record) until the commit deadline, with its locks held."""
    async with local_cluster(tmp_path, partition_count=300, protocol_config=WIDE_TXN_PROTOCOL,
                             ownership=WIDE_TXN_OWNERSHIP) as cluster:
        node = cluster.node()
        keys = _keys_over_participant_limit(300)
        txn = node.begin()

        async def run_and_commit() -> object:
            await node.run_ops(txn, puts(dict.fromkeys(keys, b"v")))
            return await node.commit(txn)

        what = f"a transaction writing {len(keys)} partitions"
        error = await _refused(run_and_commit, what)
        assert str(PARTICIPANT_COUNT_MAX) in str(error), f"the refusal does not name the limit: {error}"
        await _nothing_changed(cluster, keys, what)


async def test_transaction_over_too_many_partitions_is_refused_at_the_edge_over_rest(tmp_path):
    """The same through the REST API: a 4xx naming the limit, promptly, and nothing changed."""
    async with local_cluster(tmp_path, partition_count=300, protocol_config=WIDE_TXN_PROTOCOL,
                             ownership=WIDE_TXN_OWNERSHIP) as cluster:
        keys = _keys_over_participant_limit(300)
        app = build_app(cluster.node(), Metrics())
        body = {"ops": [{"op": "put", "key": key, "value": "v"} for key in keys]}
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://cornus") as client:
            response = None
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(REFUSAL_S):
                    response = await client.post("/v1/execute", json=body)
        if response is None:
            pytest.fail(f"POST /v1/execute writing {len(keys)} partitions: no answer within {REFUSAL_S} s (it hangs)")
        assert 400 <= response.status_code < 500, (
            f"POST /v1/execute writing {len(keys)} partitions: {response.status_code} {response.text}"
        )
        assert str(PARTICIPANT_COUNT_MAX) in response.text, f"the refusal does not name the limit: {response.text}"
        await _nothing_changed(cluster, keys, f"a REST transaction writing {len(keys)} partitions")


# === 7. GC grace against the storage deadline =====================================================


def test_gc_grace_shorter_than_the_storage_deadline_is_refused_at_config_load():
    """A storage call may land until its deadline; GC that deletes records sooner lets a late
    LogOnce(ABORT) recreate one beside a returned COMMIT (DESIGN 4). Such a config must not load;
    it loaded."""
    settings = {"node_id": "n0", "peers": "n0=127.0.0.1:7100", "partition_count": 2, "storage_timeout_ms_call": 5_000}
    load_node_config(environ={}, overrides={**settings, "gc_grace_ms": 60_000})  # a sane one loads
    try:
        config = load_node_config(environ={}, overrides={**settings, "gc_grace_ms": 1_000})
    except ValidationError as error:
        message = str(error)
    else:
        pytest.fail(f"loaded gc_grace_ms={config.protocol_config.gc_grace_ms} with storage "
                    f"timeout_ms_call={config.storage.timeout_ms_call}")
    assert "gc_grace_ms" in message and "timeout_ms_call" in message, f"the error must name both settings: {message}"


# === 8. untagged transaction ids ==================================================================


async def test_untagged_txn_id_is_handled_alike_on_every_node(tmp_path):
    """An id without a protocol tag (from an older build) must mean one protocol on every node.
    Each node took its own default protocol, so a Cornus-default and a 2PC-default node disagreed,
    and a 2PC DecisionQuery for such a txn tripped an assert in the Cornus node's coordinator."""
    protocols = {"n0": Protocol.CORNUS, "n1": Protocol.TWO_PC}
    async with local_cluster(tmp_path, node_count=2, partition_count=2, protocols=protocols) as cluster:
        untagged = txn_id("n0", 1, None)
        problems = []
        seen = {node_id: cluster.node(node_id).protocol_of(untagged) for node_id in protocols}
        if len(set(seen.values())) != 1:
            problems.append(f"nodes disagree on the protocol of untagged {untagged}: {seen}")
        node = cluster.node("n0")
        try:
            # A 2PC participant (p1, on n1) asks n0's coordinator about a transaction n0 never saw.
            node.on_message("n1", Routed("p1", "n0", DecisionQuery(untagged, "p1")))
        except Exception as error:
            problems.append(f"n0 crashed on a DecisionQuery for unknown untagged {untagged}: {error!r}")
        outcome = await node.execute(puts({cluster.key_in("p1"): b"v"}))
        if outcome.status is not OutcomeStatus.COMMITTED:
            problems.append(f"n0 no longer commits afterwards: {outcome}")
        assert not problems, "; ".join(problems)


# === 9. coordinator-log redo bundle ===============================================================


async def test_coordinator_log_redo_bundle_over_the_record_limit_is_refused_at_the_edge(tmp_path):
    """Coordinator-log logs every participant's redo in ONE coordinator record. Redos that each fit
    REDO_BYTES_MAX can together exceed it: the transaction must be refused before it takes effect,
    naming the limit, and change nothing."""
    async with local_cluster(tmp_path, partition_count=2) as cluster:
        node = cluster.node()
        value = b"x" * 60_000
        keys = [*keys_in(2, ["p0", "p1"], "a").values(), *keys_in(2, ["p0", "p1"], "b").values()]
        writes = dict.fromkeys(keys, value)
        per_partition = {
            p: len(redo_of({k: v for k, v in writes.items() if cluster.partition_of(k) == p})) for p in ("p0", "p1")
        }
        assert all(size <= REDO_BYTES_MAX for size in per_partition.values())
        assert sum(per_partition.values()) > REDO_BYTES_MAX
        txn = node.begin(Protocol.COORDINATOR_LOG)

        async def run_and_commit() -> object:
            await node.run_ops(txn, puts(writes))
            return await node.commit(txn)

        what = f"a coordinator-log transaction whose redos take {per_partition} bytes"
        error = await _refused(run_and_commit, what)
        assert str(REDO_BYTES_MAX) in str(error), f"the refusal does not name the limit: {error}"
        await _nothing_changed(cluster, keys, what)


# === the owner's cache across a lost and regained partition ========================================


async def test_cache_is_not_served_after_the_partition_moved_away_and_back(tmp_path):
    """The owner serves reads from memory because it is the only writer of its partition. Once it
    loses the partition, another node may write; when it gets the partition back, what it cached
    before is stale and must never be served. (`cornus bench` now loads every key first so that
    nearly every read is a cache hit: this is the case that makes a hit wrong.)"""
    async with local_cluster(tmp_path, node_count=2, partition_count=1) as cluster:
        assert cluster.owner_of("p0") == "n0"
        n0, n1 = cluster.node("n0"), cluster.node("n1")
        key = cluster.key_in("p0")
        await commit_writes(n0, {key: b"old"})
        assert await read_through(n0, key) == b"old"  # cached by n0

        # n0 stays up but cannot renew its lease: it is deposed, and n1 takes the partition.
        cluster.faults["n0"].fail("write_owner", count=None)

        async def n1_serves() -> bool:
            return "p0" in n1.serving and "p0" not in n0.serving

        await wait_until(n1_serves, 20, "n1 never took p0 from the deposed n0")
        await commit_writes(n1, {key: b"new"})

        async def applied() -> bool:
            return await cluster.value(key) == b"new"

        await wait_until(applied, 10, "n1's commit of b'new' never reached storage")

        # n0 heals; as p0's preferred owner it asks for it back and n1 hands it over.
        cluster.faults["n0"].heal("write_owner")

        async def n0_serves_again() -> bool:
            return "p0" in n0.serving and "p0" not in n1.serving

        await wait_until(n0_serves_again, 20, "p0 never came back to its preferred owner n0")
        seen = await read_through(n0, key)
        assert seen == b"new", f"n0 served {seen!r} from before it lost p0; storage holds b'new'"


# === an idle transaction's abort against its commit ================================================


@pytest.mark.parametrize("protocol", [Protocol.CORNUS, Protocol.TWO_PC])
async def test_an_idle_sweep_racing_a_commit_never_reports_aborted_for_committed_writes(tmp_path, protocol):
    """The idle sweep decides to abort a transaction whose client went quiet, and the abort runs in
    a task of its own, a step later. A commit that ran in between used to go ahead too: the abort
    then dropped the participants' executions (their locks with them) while they voted, reported
    ABORTED, and the writes committed; commit() waited out its deadline. The sweep's decision must
    hold from the moment it is made: the racing commit finds the transaction over."""
    async with local_cluster(tmp_path, node_count=2, partition_count=2) as cluster:
        keys = keys_in(2, ["p0", "p1"])
        node = cluster.node("n0")
        txn = node.begin(protocol)
        await node.run_ops(txn, puts({key: b"new" for key in keys.values()}))
        node.coordination.txns[txn].last_active_s -= 10_000  # idle right up to the timeout
        commit = asyncio.ensure_future(node.commit(txn))  # its step is queued first...
        node.coordination.sweep_idle()  # ...then the sweep spawns the abort

        async def ended() -> bool:
            known = node.status(txn)
            return known is not None and known.status in (OutcomeStatus.ABORTED, OutcomeStatus.COMMITTED)

        await wait_until(ended, 5, "the transaction never ended")
        status = node.status(txn)
        assert status is not None
        values = [await read_through(cluster.node("n1"), key) for key in keys.values()]
        if status.status is OutcomeStatus.ABORTED:
            assert values == [None, None], f"reported {status}, yet storage holds {values}"
        else:
            assert values == [b"new", b"new"], (status, values)
        done, _ = await asyncio.wait({commit}, timeout=5)
        assert done, "commit() did not return: its reply went nowhere"
        if status.status is OutcomeStatus.ABORTED:
            assert isinstance(commit.exception(), TxnWrongState), commit
        else:
            assert commit.result().status is OutcomeStatus.COMMITTED, commit
        # Nothing left locked either way.
        later = await node.execute(puts({key: b"later" for key in keys.values()}), protocol)
        assert later.status is OutcomeStatus.COMMITTED, later


async def test_an_abort_request_leaves_a_voting_participant_s_locks_alone(tmp_path):
    """A request to drop a transaction's execution is the coordinator's before commit, when no
    partition voted. Once a partition's machine runs the transaction, its locks are the machine's
    until the decision: a late or wrong drop must be refused, not release them while it votes."""
    async with local_cluster(tmp_path, node_count=2, partition_count=2) as cluster:
        keys = keys_in(2, ["p0", "p1"])
        coordinator, owner = cluster.node("n0"), cluster.node(cluster.owner_of("p1"))
        assert owner is not coordinator
        txn = coordinator.begin(Protocol.CORNUS)
        await coordinator.run_ops(txn, puts({key: b"new" for key in keys.values()}))
        gate = cluster.faults[owner.node_id].hold(
            "log_once", where=lambda args: args["txn"] == txn and args["log"] == LogId.partition("p1"))
        commit = asyncio.ensure_future(coordinator.commit(txn))

        async def voting() -> bool:
            return txn in owner.core.partitions["p1"].machines

        await wait_until(voting, 5, "p1 never started voting")
        response = await owner.on_request("n0", ExecuteRequest(txn, "p1", "n0", (), abort=True))
        assert response.status is ExecuteStatus.ABORTED, response
        assert owner.partitions["p1"].locks.holders(keys["p1"]) == {txn: LockMode.EXCLUSIVE}
        gate.set()
        outcome = await commit
        assert outcome.status is OutcomeStatus.COMMITTED, outcome
        assert [await read_through(owner, key) for key in keys.values()] == [b"new", b"new"]


# === the owner's cache against a late storage read ================================================


async def test_a_late_read_of_an_aborted_transaction_never_fills_the_cache(tmp_path):
    """The owner fills its cache with what a transaction reads from storage, which is safe while the
    transaction's lock keeps every writer off the key. A one-shot refused on another partition is
    aborted, and its locks released, while its read may still be on its way: that answer used to go
    into the cache over the value a later transaction committed meanwhile, and was served from there
    (a CHECK against it then committed over the newer write)."""
    async with local_cluster(tmp_path, partition_count=2) as cluster:
        keys = keys_in(2, ["p0", "p1"])
        ka, kb = keys["p0"], keys["p1"]
        await commit_writes(cluster.node(), {ka: b"v1"})
        await cluster.restart("n0")  # nothing cached
        node = cluster.node()
        holder = node.begin()
        await node.run_ops(holder, puts({kb: b"held"}))  # a one-shot writing kb is refused (NO_WAIT)
        faulty = cluster.faults["n0"]
        real_read = faulty.read_data
        answer_late, reading = asyncio.Event(), asyncio.Event()

        async def read_answered_late(partition: str, read_keys: list[str]) -> dict[str, bytes | None]:
            found = await real_read(partition, read_keys)  # read now...
            if ka in read_keys and not answer_late.is_set():
                reading.set()
                await answer_late.wait()  # ...answered after the transaction is over
            return found

        faulty.read_data = read_answered_late  # type: ignore[method-assign]
        one_shot = asyncio.ensure_future(node.execute([Op(OpKind.GET, ka), Op(OpKind.PUT, kb, b"a")]))
        await asyncio.wait_for(reading.wait(), 5)
        refused = await one_shot
        assert refused.status is OutcomeStatus.ABORTED, refused
        later = await node.execute(puts({ka: b"v2"}))
        assert later.status is OutcomeStatus.COMMITTED, later

        async def applied() -> bool:
            return await cluster.value(ka) == b"v2"

        await wait_until(applied, 5, "the later write never reached storage")
        answer_late.set()
        await asyncio.sleep(0.05)  # the late answer lands
        await node.abort(holder)
        assert await read_through(node, ka) == b"v2"
        stale_check = await node.execute([Op(OpKind.CHECK, ka, b"v1"), Op(OpKind.PUT, ka, b"v1+1")])
        assert stale_check.status is OutcomeStatus.ABORTED, stale_check


# === a deposed owner that stalled ==================================================================


class _Stalled:
    """Stands in for a node on the in-memory network: while `frozen`, its inbound messages are
    lost, as a stalled process's would wait unread past everyone's deadlines."""

    def __init__(self, node: object) -> None:
        self.node = node
        self.frozen = False

    def on_message(self, sender: str, message: Routed) -> None:
        if not self.frozen:
            self.node.on_message(sender, message)  # type: ignore[attr-defined]

    async def on_request(self, sender: str, request: object) -> object:
        return await self.node.on_request(sender, request)  # type: ignore[attr-defined]


async def test_a_deposed_owner_s_timer_after_a_stall_writes_nothing(tmp_path):
    """Only messages and requests checked the lease before reaching a partition's machine; a timer
    did not, and a participant's termination writes LogOnce(ABORT) to the other partitions' logs,
    which carry no fence. A node that stalled past its lease (a VM pause) ran its expired timers
    before its ownership tick dropped the partition: its participant terminated a transaction the
    new owner had committed and the coordinator had collected, and re-created a record saying
    ABORT. A partition's machine must act only while its node holds the lease."""
    async with local_cluster(tmp_path, node_count=2, partition_count=2) as cluster:
        assert cluster.owner_of("p0") == "n0" and cluster.owner_of("p1") == "n1"
        n0, n1 = cluster.node("n0"), cluster.node("n1")
        keys = keys_in(2, ["p0", "p1"])
        txn = n1.begin(Protocol.CORNUS)
        await n1.run_ops(txn, puts({key: b"new" for key in keys.values()}))
        gate = cluster.faults["n0"].hold(
            "log_once", where=lambda args: args["txn"] == txn and args["log"] == LogId.partition("p0"))
        commit = asyncio.ensure_future(n1.commit(txn))

        async def voting() -> bool:
            return txn in n0.core.partitions["p0"].machines

        await wait_until(voting, 5, "p0 never started voting")
        # n0 stalls: no ownership ticks, its timers wait, what is sent to it is lost.
        stalled = _Stalled(n0)
        cluster.network.handlers["n0"] = stalled  # type: ignore[assignment]
        stalled.frozen = True
        assert n0.ownership._ticker is not None
        n0.ownership._ticker.cancel()
        expired: list[object] = []
        n0.runner._fire = expired.append  # type: ignore[method-assign]
        gate.set()  # its vote was on its way before the stall
        outcome = await commit
        assert outcome.status is OutcomeStatus.COMMITTED, outcome

        async def collected() -> bool:
            return "p0" in n1.serving and await records_collected(cluster, txn, ["p0", "p1"])

        await wait_until(collected, 20, "n1 never took p0, or the records were never collected")
        assert expired, "n0's participant had no timer waiting"
        # n0 resumes: its expired timers run first, as the event loop runs them, then its ticker.
        del n0.runner._fire
        for timer in expired:
            n0.runner._fire(timer)  # type: ignore[arg-type]
        n0.ownership.start()
        stalled.frozen = False
        await asyncio.sleep(0.5)
        assert await cluster.record("p1", txn) is None, "the deposed owner wrote a record of a collected txn"
        assert (await n0.resolve(txn)).status is not OutcomeStatus.ABORTED
        assert [await cluster.value(key) for key in keys.values()] == [b"new", b"new"]


# === an abort beside the transaction's own operations ==============================================


async def test_an_abort_beside_running_operations_leaves_no_lock_and_no_false_success(tmp_path):
    """run_ops sends its requests from tasks of their own, and named the partitions it touches
    only from there: an abort() that ran first dropped nothing, reported ABORTED, and the request
    then took its lock anyway (held until the idle sweep, a minute) and run_ops reported success
    on the aborted transaction."""
    async with local_cluster(tmp_path, partition_count=2) as cluster:
        node = cluster.node()
        key = keys_in(2, ["p0"])["p0"]
        txn = node.begin()
        operations = asyncio.ensure_future(node.run_ops(txn, puts({key: b"w"})))
        aborted = await asyncio.ensure_future(node.abort(txn))
        assert aborted.status is OutcomeStatus.ABORTED, aborted
        done, _ = await asyncio.wait({operations}, timeout=5)
        assert done, "run_ops hung"
        assert isinstance(operations.exception(), TxnWrongState), operations
        later = await node.execute(puts({key: b"other"}))
        assert later.status is OutcomeStatus.COMMITTED, later


async def _older_waiting_for_younger(node: Node) -> tuple[str, str, str, asyncio.Future[list[bytes | None]]]:
    """Under WAIT_DIE: a younger transaction holds p0's key, and the older one's write waits for
    it; the key, both ids, and the older one's call, still waiting."""
    key = keys_in(2, ["p0"])["p0"]
    older = node.begin()
    await asyncio.sleep(0.01)  # WAIT_DIE orders by begin time
    younger = node.begin()
    await node.run_ops(younger, puts({key: b"young"}))
    waiting = asyncio.ensure_future(node.run_ops(older, puts({key: b"old"})))

    async def queued() -> bool:
        return bool(node.partitions["p0"]._waiters)

    await wait_until(queued, 5, "the older transaction never waited for the lock")
    return key, older, younger, waiting


async def test_an_abort_wakes_its_own_request_waiting_for_a_lock(tmp_path):
    """Under WAIT_DIE an older transaction's request waits for a younger one's lock. Dropping the
    older transaction (its client aborted) released its place in the queue but never answered its
    request, which hung until the peer request's deadline and then reported the peer unavailable."""
    async with local_cluster(tmp_path, partition_count=2, lock_policy=Policy.WAIT_DIE) as cluster:
        node = cluster.node()
        _, older, younger, waiting = await _older_waiting_for_younger(node)
        started = asyncio.get_running_loop().time()
        await node.abort(older)
        done, _ = await asyncio.wait({waiting}, timeout=1)
        assert done, "the aborted transaction's request still waits for the lock"
        assert not isinstance(waiting.exception(), asyncio.TimeoutError)
        assert asyncio.get_running_loop().time() - started < 1
        assert not node.partitions["p0"]._waiters
        await node.abort(younger)


# === a commit reported UNKNOWN, and the status call it sends the caller to ==========================


async def test_a_commit_reported_unknown_keeps_its_outcome_for_the_status_call(tmp_path, monkeypatch):
    """A commit whose outcome did not come within its deadline tells the caller to ask the status
    call. The outcome that came later went nowhere, so once the records were collected the status
    call answered 'no such transaction' for a committed one, which a client may take for 'never
    happened' and run again."""
    monkeypatch.setattr(coordination, "TIMEOUT_MS_COMMIT", 100)
    async with local_cluster(tmp_path, partition_count=2) as cluster:
        node = cluster.node()
        keys = keys_in(2, ["p0", "p1"])
        writes = {keys["p0"]: b"a", keys["p1"]: b"b"}
        txn = await commit_told_unknown(cluster, node, writes)
        await wait_collected(cluster, node, txn, ("p0", "p1"))
        # The held votes and the coordinator's termination race: either outcome may be the truth.
        values = {key: await cluster.value(key) for key in writes}
        status = await node.resolve_status(txn)
        assert status is not None, "the status call forgot a transaction it sent its caller to ask about"
        committed = values == writes
        assert committed or values == dict.fromkeys(writes), values
        assert status.status is (OutcomeStatus.COMMITTED if committed else OutcomeStatus.ABORTED), (status, values)


# === the status call while a node recovers =========================================================


class _DropDecisions:
    """Stands in for a node on the in-memory network: the decisions (and decision answers) about
    one transaction are lost on their way to it."""

    def __init__(self, node: object, txn: list[str]) -> None:
        self.node = node
        self.txn = txn

    def on_message(self, sender: str, message: Routed) -> None:
        inner = message.message
        if isinstance(inner, Decision | DecisionAnswer) and [inner.txn] == self.txn:
            return
        self.node.on_message(sender, message)  # type: ignore[attr-defined]

    async def on_request(self, sender: str, request: object) -> object:
        return await self.node.on_request(sender, request)  # type: ignore[attr-defined]


async def test_the_status_call_never_says_unknown_to_the_cluster_while_a_node_recovers(tmp_path):
    """Under coordinator-log a participant holds no record before the decision reaches it: the
    coordinator's log is where a committed transaction shows. While that coordinator restarts and
    recovers, the status call took the answers of the nodes it asked as complete and said 'no such
    transaction' for a committed one (404), which a client may take for 'never happened'."""
    async with local_cluster(tmp_path, node_count=3, partition_count=3, protocol=Protocol.COORDINATOR_LOG) as cluster:
        keys = keys_in(3, ["p0", "p1"])
        coordinator = cluster.node("n2")
        txn: list[str] = []
        for name in ("n0", "n1"):
            cluster.network.handlers[name] = _DropDecisions(cluster.node(name), txn)  # type: ignore[assignment]
        txn.append(coordinator.begin())
        await coordinator.run_ops(txn[0], puts({keys["p0"]: b"a", keys["p1"]: b"b"}))
        outcome = await coordinator.commit(txn[0])
        assert outcome.status is OutcomeStatus.COMMITTED, outcome
        await cluster.stop("n2")
        await cluster.start("n2", wait_ready=False)
        assert not cluster.node("n2").ready
        during = await cluster.node("n1").resolve_status(txn[0])
        assert during is not None, "the status call said no node knows a committed transaction"
        assert during.status in (OutcomeStatus.COMMITTED, OutcomeStatus.UNKNOWN), during


# === a coordinator's clean stop ====================================================================


async def test_a_clean_stop_waits_for_its_decisions_to_be_acknowledged(tmp_path):
    """Under coordinator-log a participant's yes vote lives only in its memory and in its
    coordinator's log. A coordinator stopped cleanly (SIGTERM: a scale-down, a rolling restart)
    used to exit with a COMMIT not yet delivered; once the participant restarted with a node set
    that no longer lists that coordinator, nothing recovered the vote, and a transaction reported
    COMMITTED was lost on that partition. A clean stop delivers its decisions first (bounded)."""
    async with local_cluster(tmp_path, node_count=3, partition_count=3, protocol=Protocol.COORDINATOR_LOG) as cluster:
        keys = keys_in(3, ["p0", "p1"])
        coordinator = cluster.node("n2")
        txn: list[str] = []
        handlers = {name: _DropDecisions(cluster.node(name), txn) for name in ("n0", "n1")}
        cluster.network.handlers.update(handlers)  # type: ignore[arg-type]
        txn.append(coordinator.begin())
        writes = {keys["p0"]: b"a", keys["p1"]: b"b"}
        await coordinator.run_ops(txn[0], puts(writes))
        outcome = await coordinator.commit(txn[0])
        assert outcome.status is OutcomeStatus.COMMITTED, outcome

        async def deliver_later() -> None:
            await asyncio.sleep(0.3)  # the network heals while the coordinator stops
            txn.clear()

        healing = asyncio.ensure_future(deliver_later())
        await cluster.stop("n2")
        await healing
        assert {key: await cluster.value(key) for key in writes} == writes


# === what a peer may send ==========================================================================


async def test_a_misaddressed_or_malformed_peer_message_is_dropped_not_fatal(tmp_path):
    """A node's core asserts what its machines are told, and an assertion ends the process: a peer
    message addressed to one of the node's internal hosts (its recovery), or a prepare that leaves
    out the partition it is sent to, killed the node that received it (found by sending them)."""
    async with local_cluster(tmp_path, node_count=2, partition_count=2) as cluster:
        node = cluster.node("n1")
        txn = txn_id("n0", 1, Protocol.CORNUS)
        node.on_message("n0", Routed("n0", "~recovery", Decision(txn, TxnState.ABORT)))
        node.on_message("n0", Routed("n0", "~recovery:p1", Decision(txn, TxnState.ABORT)))
        node.on_message("n0", Routed("n0", "n0", Decision(txn, TxnState.ABORT)))  # another node's host
        owned, other = ("p1", "p0") if cluster.owner_of("p1") == "n1" else ("p0", "p1")
        node.on_message("n0", Routed("n0", owned, Prepare(txn, (other,), "n0")))
        await asyncio.sleep(0.05)
        assert node.counters["peer_messages_refused"] == 4, dict(node.counters)
        outcome = await node.execute(puts({cluster.key_in(owned): b"still here"}))
        assert outcome.status is OutcomeStatus.COMMITTED, outcome


# === limits a config may set =======================================================================


@pytest.mark.parametrize(("name", "value"), [
    ("timeout_ms_peer_request", 400_000),  # past what the transport carries: every transaction failed
    ("timeout_ms_txn_idle", 10**12),  # an abandoned transaction's locks, held for ever
    ("timeout_ms_lock_wait", 10**12),
    ("txn_count_max", 10**12),
    ("timeout_ms_resend", 10**18),
    ("timeout_ms_prepare", 10**15),
])
def test_a_limit_past_its_bound_is_refused_at_config_load(name: str, value: int):
    """Every limit had a floor and no ceiling (found by review): a peer request timeout above what
    the node-to-node transport carries loaded, and then every transaction failed with a 500; huge
    timers loaded too."""
    settings = {"node_id": "n0", "peers": "n0=127.0.0.1:7100", "partition_count": 2}
    with pytest.raises(ValidationError, match=name):
        load_node_config(environ={}, overrides={**settings, name: value})


def test_outcome_keep_ms_takes_up_to_a_week_and_no_more():
    """The tombstones' keep is counted by storage, not a timer of ours: it may pass the timers'
    hour, up to the contract's week (TOMBSTONE_KEEP_MS_MAX), and is refused past it."""
    settings = {"node_id": "n0", "peers": "n0=127.0.0.1:7100", "partition_count": 2}
    week_ms = 7 * 24 * 3600 * 1000
    config = load_node_config(environ={"CORNUS_OUTCOME_KEEP_MS": str(week_ms)}, overrides=settings)
    assert config.protocol_config.outcome_keep_ms == week_ms
    for bad in (week_ms + 1, 0):
        with pytest.raises(ValidationError, match="outcome_keep_ms"):
            load_node_config(environ={}, overrides={**settings, "outcome_keep_ms": bad})



def test_outcome_keep_ms_under_the_floor_the_status_call_counts_on_is_refused():
    """The status call counts on every coordinator having kept its outcomes at least
    OUTCOME_KEEP_MS_FLOOR (cornus.protocol.status.kept_floor_ms: what it knows of a coordinator
    restarted since a transaction began); a node configured with less would make its "not known"
    wrong, so it is refused at start, naming the floor. The floor itself is taken."""
    from cornus.protocol.config import OUTCOME_KEEP_MS_FLOOR

    settings = {"node_id": "n0", "peers": "n0=127.0.0.1:7100", "partition_count": 2}
    config = load_node_config(environ={}, overrides={**settings, "outcome_keep_ms": OUTCOME_KEEP_MS_FLOOR})
    assert config.protocol_config.outcome_keep_ms == OUTCOME_KEEP_MS_FLOOR
    with pytest.raises(ValidationError, match=rf"outcome_keep_ms.*at least {OUTCOME_KEEP_MS_FLOOR}"):
        load_node_config(environ={}, overrides={**settings, "outcome_keep_ms": OUTCOME_KEEP_MS_FLOOR - 1})


def test_an_azure_node_takes_any_outcome_keep_up_to_a_week():
    """Azure's lifecycle rules follow each tombstone's own keep (it is tagged with its days, and
    the Terraform module has a rule for each: tests/storage/test_azure_lifecycle.py), so a node
    need not know any rule's days: every keep the other backends take is taken. (Before, the one
    rule's days were a setting of the node's that had to match the module's variable, and
    lowering the variable dropped tombstones early, found by review.)"""
    day_ms = 86_400_000
    settings = {"node_id": "n0", "peers": "n0=127.0.0.1:7100", "partition_count": 2,
                "storage_backend": "azure_blob", "storage_azure_connection_string": "UseDevelopmentStorage=true"}
    for keep_ms in (day_ms + 1, 7 * day_ms):
        config = load_node_config(environ={}, overrides={**settings, "outcome_keep_ms": keep_ms})
        assert config.protocol_config.outcome_keep_ms == keep_ms
    with pytest.raises(ValidationError, match="outcome_keep_ms"):
        load_node_config(environ={}, overrides={**settings, "outcome_keep_ms": 7 * day_ms + 1})


@pytest.mark.parametrize("backend", ["dynamodb", "azure_blob"])
def test_outcome_keep_ms_outlives_a_late_request_where_storage_takes_them(backend: str):
    """DynamoDB and Azure Blob may take a request up to 15 minutes after it was signed
    (LATE_WRITE_WINDOW_MS): garbage collection leaves tombstones in every participant's log there,
    and they must outlive such a request (found by review: a late vote recreated a collected
    record). Unset, the keep is lengthened to fit; set shorter, it is refused at start. Redis and
    the emulator refuse late calls themselves, and keep the default ten minutes."""
    settings = {"node_id": "n0", "peers": "n0=127.0.0.1:7100", "partition_count": 2,
                "storage_backend": backend, "storage_azure_connection_string": "UseDevelopmentStorage=true"}
    config = load_node_config(environ={}, overrides=settings).protocol_config
    assert config.late_write_window_ms == 900_000
    assert config.outcome_keep_ms == 5_000 + 1_000 + 900_000  # deadline + slack + window
    with pytest.raises(ValidationError, match=r"outcome_keep_ms.*late vote"):
        load_node_config(environ={}, overrides={**settings, "outcome_keep_ms": 905_999})
    with pytest.raises(ValidationError, match="late_write_window_ms"):
        load_node_config(environ={}, overrides={**settings, "late_write_window_ms": 1})
    redis = load_node_config(environ={}, overrides={**settings, "storage_backend": "redis"}).protocol_config
    assert (redis.late_write_window_ms, redis.outcome_keep_ms) == (0, 600_000)


def test_a_hand_built_config_keeps_its_backends_late_window():
    """Built by hand over DynamoDB with the core's default (no late window), collection would leave
    gaps a late vote could fill: the NodeConfig refuses it."""
    with pytest.raises(ValidationError, match="late_write_window_ms"):
        NodeConfig(node_id="n0", peers={"n0": "127.0.0.1:1"}, partition_count=1,
                   storage=StoreConfig(backend="dynamodb"))


def test_an_azure_sas_connection_string_is_refused():
    """A SAS of the user's may land until it expires, past any tombstone's keep: with the account
    key the node signs each request itself, for that request's deadline (azure_signing)."""
    with pytest.raises(ValidationError, match="SharedAccessSignature"):
        StoreConfig(backend="azure_blob", azure_connection_string="BlobEndpoint=https://a;SharedAccessSignature=sv=1")

async def test_a_call_refused_by_one_owner_whose_other_answer_was_lost_aborts(tmp_path, monkeypatch):
    """Found by review: run_ops kept the transaction usable (ValidationError: "nothing happened")
    when its first failed partition answered INVALID and every partition failed, whatever the
    others' failures were; a request whose answer was lost (it ran) left its buffered write in the
    owner's execution, and it committed with the transaction's next call. Only a call refused
    everywhere (INVALID from every partition) ran nowhere."""
    # The owners refuse what this coordinator lets through (limits that differ in a rollout).
    monkeypatch.setattr(coordination, "validate_op", lambda op: None)
    async with local_cluster(tmp_path, node_count=2, partition_count=2) as cluster:
        n0 = cluster.node("n0")
        # A key one byte too long, on p0: its owner refuses the request, running nothing.
        refused = cluster.key_in("p0", "x" * DATA_KEY_BYTES_MAX)
        phantom, real = cluster.key_in("p1", "k"), cluster.key_in("p1", "z")
        transport = n0.coordination.transport
        request = transport.request
        lost: list[object] = []

        async def losing_p1_s_answer(to_node: str, message: object, timeout_ms: int) -> object:
            response = await request(to_node, message, timeout_ms)
            if isinstance(message, ExecuteRequest) and message.partition == "p1" and not lost:
                lost.append(response)  # it ran there; its answer is lost on the way back
                raise PeerUnavailable("link lost")
            return response

        transport.request = losing_p1_s_answer  # type: ignore[method-assign]
        txn = n0.begin()
        with pytest.raises(TxnAborted):
            await n0.run_ops(txn, [Op(OpKind.PUT, refused, b"x"), Op(OpKind.PUT, phantom, b"phantom")])
        assert lost, "p1's request never ran"
        with pytest.raises(TxnWrongState):
            await n0.run_ops(txn, [Op(OpKind.PUT, real, b"real")])
        await asyncio.sleep(0.3)
        assert await cluster.value(phantom) is None


async def test_run_ops_refuses_a_bad_operation_before_any_request_leaves(tmp_path):
    """Found by review: execute checked every operation at the coordinator, run_ops left it to the
    owners; a bad operation must change nothing, and the transaction goes on."""
    async with local_cluster(tmp_path, node_count=2, partition_count=2) as cluster:
        n0 = cluster.node("n0")
        sent: list[object] = []
        transport = n0.coordination.transport
        request = transport.request

        async def counting(to_node: str, message: object, timeout_ms: int) -> object:
            sent.append(message)
            return await request(to_node, message, timeout_ms)

        transport.request = counting  # type: ignore[method-assign]
        txn = n0.begin()
        good = cluster.key_in("p1", "k")
        with pytest.raises(ValidationError):
            await n0.run_ops(txn, [Op(OpKind.PUT, good, b"v"), Op(OpKind.PUT, "", b"v")])
        with pytest.raises(ValidationError, match="not an operation"):
            await n0.run_ops(txn, [Op(OpKind.PUT, good, b"v"), {"op": "put"}])  # type: ignore[list-item]
        assert sent == [], sent
        await n0.run_ops(txn, [Op(OpKind.PUT, good, b"v")])
        assert (await n0.commit(txn)).status is OutcomeStatus.COMMITTED


async def test_a_second_call_of_a_transaction_while_one_runs_is_refused(tmp_path):
    """Found by review: two calls of one transaction that queued for the same lock shared one
    waiter slot; the second overwrote the first's, and one of them was never woken until its
    deadline aborted the transaction. A transaction takes one call at a time, as its commit does."""
    async with local_cluster(tmp_path, partition_count=2, lock_policy=Policy.WAIT_DIE) as cluster:
        node = cluster.node()
        key, older, younger, waiting = await _older_waiting_for_younger(node)
        with pytest.raises(TxnWrongState, match="one call at a time"):
            await node.run_ops(older, [Op(OpKind.GET, key)])
        await node.abort(younger)
        assert await waiting == [], "the first call, woken by the lock's release, ran"
        assert (await node.commit(older)).status is OutcomeStatus.COMMITTED


async def test_a_one_shot_request_past_its_deadline_runs_nothing(tmp_path):
    """Found while moving the status verdict into the core: the status call says "not known" of a
    transaction once no request of it can still run; a one-shot's request (which carries its
    prepare) that reaches its owner past its deadline, plus the slack, must then run nothing, or
    it could vote yes, and termination commit, after "not known" was said."""
    async with local_cluster(tmp_path, node_count=2, partition_count=2) as cluster:
        n1 = cluster.node("n1")
        key = cluster.key_in("p1", "late")
        config = n1.config.protocol_config
        begin_ms = int(time.time() * 1000) - 60_000
        txn = f"{begin_ms}.n0.abcdef.1.cornus"
        late = ExecuteRequest(txn, "p1", "n0", (Op(OpKind.PUT, key, b"late"),), participants=("p1",),
                              deadline_unix_ms=begin_ms + 2_000)
        response = await n1.on_request("n0", late)
        assert response.status is ExecuteStatus.UNAVAILABLE and "deadline" in response.detail, response
        assert n1.counters["requests_past_deadline"] == 1  # cornus_node_events, for clocks that disagree
        assert txn not in n1.partitions["p1"].executions
        assert txn not in n1.core.partitions["p1"].machines
        on_time = ExecuteRequest(f"{int(time.time() * 1000)}.n0.abcdef.2.cornus", "p1", "n0",
                                 (Op(OpKind.GET, key),), deadline_unix_ms=int(time.time() * 1000) + 2_000)
        assert (await n1.on_request("n0", on_time)).status is ExecuteStatus.OK
        assert config.clock_slack_ms < 60_000


async def test_a_one_shot_request_is_kept_to_the_owners_wait_too(tmp_path):
    """Found by audit: an owner kept a one-shot's request to the deadline it carried alone. A
    coordinator that carries none (an older version, during a rolling upgrade), or one whose
    configured wait is longer than the node asked for the status call, had its request run after
    that node had said "not known". The owner keeps it to its own wait from the begin as well."""
    async with local_cluster(tmp_path, node_count=2, partition_count=2) as cluster:
        n1 = cluster.node("n1")
        key = cluster.key_in("p1", "late")
        wait_ms = n1.config.limits.timeout_ms_peer_request
        begin_ms = int(time.time() * 1000) - wait_ms - 10_000
        for index, carried_ms in enumerate((0, begin_ms + 3_600_000)):  # none; an hour's wait
            txn = f"{begin_ms}.n0.abcdef.{index}.cornus"
            late = ExecuteRequest(txn, "p1", "n0", (Op(OpKind.PUT, key, b"late"),), participants=("p1",),
                                  deadline_unix_ms=carried_ms)
            response = await n1.on_request("n0", late)
            assert response.status is ExecuteStatus.UNAVAILABLE and "deadline" in response.detail, response
            assert txn not in n1.partitions["p1"].executions
            assert txn not in n1.core.partitions["p1"].machines
        assert n1.counters["requests_past_deadline"] == 2


async def test_a_grpc_one_shot_s_request_is_kept_to_the_one_shot_window_too(tmp_path):
    """Found by audit (2026-11-28, third): the public gRPC API runs a one-shot under a client-chosen
    id as begin, operations (run_ops: requests without a carried prepare, and no deadline) and
    commit. Such a request that travelled for seconds ran at any time, so a client's second send of
    the id to another process of the node could run it again after the partition moved (the
    audit's crash). An owner keeps a client-chosen id's request to the one-shot window whatever it
    carries."""
    async with local_cluster(tmp_path, node_count=2, partition_count=2) as cluster:
        n1 = cluster.node("n1")
        key = cluster.key_in("p1", "late")
        begin_ms = int(time.time() * 1000) - n1.config.limits.timeout_ms_peer_request - 10_000
        txn = txn_ids.client_txn_id(begin_ms, "n0", "0123456789abcdef", Protocol.CORNUS)
        late = ExecuteRequest(txn, "p1", "n0", (Op(OpKind.PUT, key, b"late"),))
        response = await n1.on_request("n0", late)
        assert response.status is ExecuteStatus.UNAVAILABLE and "deadline" in response.detail, response
        assert txn not in n1.partitions["p1"].executions
        # An interactive transaction's (an id the node made) keeps no such window: it may think.
        interactive = ExecuteRequest(f"{begin_ms}.n0.abcdef.1.cornus", "p1", "n0", (Op(OpKind.GET, key),))
        assert (await n1.on_request("n0", interactive)).status is ExecuteStatus.OK


@pytest.mark.parametrize(("one_shot", "where"), [(True, "wait"), (True, "send"), (False, "wait")],
                         ids=["execute", "execute-send", "commit"])
async def test_a_refusal_raised_after_the_prepare_left_is_reported_unknown_not_as_nothing_changed(
    tmp_path, monkeypatch, one_shot: bool, where: str,
):
    """Found by a read-only audit (2026-11-27): the API answers NodeOverloaded and
    StorageUnavailable with 503, which the SDK takes for "nothing committed" and retries under a
    new id. Nothing raises them once a commit's prepare has left today, but nothing stopped a
    later change from doing so, and then a transfer that committed would run twice. Past that
    point the coordinator now answers UNKNOWN (ask the status call) whatever is raised."""
    async with local_cluster(tmp_path, partition_count=2) as cluster:
        node = cluster.node("n0")
        keys = keys_in(2, ["p0", "p1"])

        async def refused_while_waiting(self: Any, ctx: Any) -> Any:
            raise NodeOverloaded("a refusal raised while the commit's votes were being written")

        if where == "wait":
            monkeypatch.setattr(coordination.Coordination, "_await_reply", refused_while_waiting)
        else:
            # Raised as the queued requests, each carrying its prepare, are sent (found by review:
            # the first version took "the machine was asked" for "a prepare left").
            def refused_while_sending() -> None:
                raise NodeOverloaded("a refusal raised while the requests were being sent")

            monkeypatch.setattr(node.coordination.transport, "flush", refused_while_sending)
        ops = [Op(OpKind.PUT, key, b"v") for key in keys.values()]
        if one_shot:
            outcome = await node.execute(ops)
        else:
            txn = node.begin()
            await node.run_ops(txn, ops)
            outcome = await node.commit(txn)
        assert outcome.status is OutcomeStatus.UNKNOWN, outcome


@pytest.mark.parametrize("one_shot", [True, False], ids=["execute", "interactive"])
async def test_a_request_too_large_for_the_peer_link_is_refused_not_fatal(tmp_path, monkeypatch, one_shot: bool):
    """Found by audit (2026-11-27): the peer transport fails a request whose encoding passes its
    message size (legal operations can: checks of large values count toward no limit of
    admission's) with MessageTooLarge, which the coordinator took for a bug and exited on
    (os._exit(70)), ending every transaction it coordinated; the interactive path let it escape.
    It was never sent, so never run: the transaction is refused as the client's, nothing changed."""
    async with local_cluster(tmp_path, node_count=2, partition_count=2) as cluster:
        node = cluster.node("n0")
        remote = next(p for p in cluster.partitions if cluster.owner_of(p) != "n0")
        local = next(p for p in cluster.partitions if cluster.owner_of(p) == "n0")
        keys = keys_in(2, [local, remote])
        transport = node.coordination.transport
        real_start, real_request = transport.start_request, transport.request

        def too_large(to_node: str) -> MessageTooLarge:  # the TCP transport's
            return MessageTooLarge(f"a request to {to_node} larger than the link's message size")

        def start_request(to_node: str, request: Any, timeout_ms: int) -> Any:
            if to_node == "n0":
                return real_start(to_node, request, timeout_ms)
            future = asyncio.get_running_loop().create_future()
            future.set_exception(too_large(to_node))
            return future

        async def request(to_node: str, request: Any, timeout_ms: int) -> Any:
            if to_node == "n0":
                return await real_request(to_node, request, timeout_ms)
            raise too_large(to_node)

        monkeypatch.setattr(transport, "start_request", start_request)
        monkeypatch.setattr(transport, "request", request)
        ops = [Op(OpKind.PUT, keys[local], b"v"), Op(OpKind.PUT, keys[remote], b"v")]
        if one_shot:
            with pytest.raises(ValidationError, match="message size"):
                await node.execute(ops)
        else:
            txn = node.begin()
            with pytest.raises(TxnAborted) as aborted:
                await node.run_ops(txn, ops)
            assert aborted.value.outcome.reason is AbortReason.CLIENT, aborted.value.outcome
        monkeypatch.undo()
        assert await read_through(node, keys[local]) is None, "a write of the refused transaction landed"


async def test_a_coordinator_log_abort_is_logged_over_its_redo_record(tmp_path):
    """Found by audit (2026-11-27): a coordinator-log transaction aborted after its redo record was
    written (here a participant's failed check) left that record VOTE_YES until its collection, 12 s
    later. A coordinator stopped for good within that time (a scale-down) left it so for ever, and
    every later recovery of a participant's partition took it for an open yes vote: it locked the
    keys again and asked the gone coordinator for a decision, for ever. The ABORT is logged over it."""
    # Collection (which deletes the record) well after the test's end, as in production.
    async with local_cluster(tmp_path, node_count=2, partition_count=2, protocol=Protocol.COORDINATOR_LOG,
                             protocol_config={"gc_grace_ms": 60_000}) as cluster:
        keys = keys_in(2, ["p0", "p1"])
        coordinator = cluster.node("n1")
        outcome = await coordinator.execute([Op(OpKind.PUT, keys["p0"], b"never"),
                                             Op(OpKind.CHECK, keys["p1"], b"not there")])
        assert outcome.status is OutcomeStatus.ABORTED and outcome.reason is AbortReason.CHECK_FAILED, outcome
        seen: list[TxnState | None] = []

        async def logged_abort() -> bool:
            record = await cluster.coordinator_record("n1", outcome.txn)
            seen.append(None if record is None else record.state)
            return record is not None and record.state is TxnState.ABORT

        await wait_until(logged_abort, 5, lambda: f"the redo record was left so: {seen[-3:]}")


async def test_an_unexpected_exception_in_a_step_of_the_core_ends_the_node(tmp_path, monkeypatch):
    """Found by audit (2026-11-27): only an AssertionError from the core's step ended the node.
    Any other exception, or one the effect runner raised half way through a step's effects, was
    logged by the event loop's handler (a timer's, a peer message's) and the node ran on with a
    machine that believed its timer armed or its write made: a transaction in doubt for ever,
    with its keys locked. An impossible state crashes loudly, whatever its exception."""
    from cornus.protocol.events import TimerFired

    async with local_cluster(tmp_path, node_count=1, partition_count=1) as cluster:
        node = cluster.node("n0")
        real_handle = node.core.handle

        def broken(event: Any) -> Any:
            if isinstance(event, TimerFired):
                raise KeyError("a bug")
            return real_handle(event)

        monkeypatch.setattr(node.core, "handle", broken)
        txn = node.begin()
        await node.run_ops(txn, [Op(OpKind.PUT, "k", b"v")])
        commit = asyncio.ensure_future(node.commit(txn))  # its machines start timers

        async def exited() -> bool:
            return bool(cluster.exits)

        await wait_until(exited, 10, "the node ran on after a broken step")
        assert cluster.exits[0] == 70, cluster.exits
        cluster.exits.clear()  # seen: the harness would take it for an unexpected exit
        monkeypatch.undo()
        commit.cancel()
        await asyncio.gather(commit, return_exceptions=True)


@pytest.mark.parametrize(("where", "value", "message"), [
    ("env", "n0=127.0.0.1:7100,n1=127.0.0.1:7101,n1=127.0.0.1:7102", "more than once"),
    ("env", "n0=127.0.0.1:7100,n1=127.0.0.1:7100", "same address"),
    ("file", 'peers = "n0=127.0.0.1:7100"', "peers"),
    ("file", "timeouts = 5", "timeouts"),
    ("file", 'partition_owners = "p0=n0"', "partition_owners"),
])
def test_a_peer_list_or_a_table_that_is_wrong_is_refused_by_name(tmp_path, where: str, value: str, message: str):
    """Found by audit (2026-11-27): a node named twice in CORNUS_PEERS kept its last address, two
    nodes at one address were taken, and a TOML value of the wrong type ended in a traceback
    (ValueError, TypeError) rather than the error that names it."""
    environ = {"CORNUS_NODE_ID": "n0", "CORNUS_PARTITION_COUNT": "2", "CORNUS_PEERS": "n0=127.0.0.1:7100"}
    path = None
    if where == "env":
        environ["CORNUS_PEERS"] = value
    else:
        path = tmp_path / "node.toml"
        path.write_text(value + "\n")
        if value.startswith("peers"):
            del environ["CORNUS_PEERS"]
    with pytest.raises(ValidationError, match=message):
        load_node_config(path, environ=environ)


def test_a_renew_interval_below_its_floor_is_refused():
    """Found by audit (2026-11-27): renew_interval_ms had no floor (1 ms loaded), and every node
    reads every partition's ownership record each interval."""
    settings = {"node_id": "n0", "peers": "n0=127.0.0.1:7100", "partition_count": 2}
    load_node_config(environ={}, overrides={**settings, "renew_interval_ms": 50})
    with pytest.raises(ValidationError, match="renew_interval_ms"):
        load_node_config(environ={}, overrides={**settings, "renew_interval_ms": 1})


@pytest.mark.parametrize("node", ["p1", "p0", "p4095"])
def test_a_node_named_as_a_partition_is_refused(node: str):
    """Found by audit (2026-11-28, second): a node id that is a partition's name was accepted.
    Node and partition names share one address space (a message's destination), so every node
    routed partition p1's protocol messages to node p1, whoever held the partition: a 2PC
    participant's DecisionQuery there heard the presumed ABORT of a coordinator with no machine for
    it, beside the real coordinator's COMMIT; and node p1 crashed on taking its own partition."""
    settings = {"node_id": "n0", "peers": f"n0=127.0.0.1:7100,{node}=127.0.0.1:7101", "partition_count": 2}
    with pytest.raises(ValidationError, match="partition"):
        load_node_config(environ={}, overrides=settings)
    load_node_config(environ={}, overrides={**settings, "peers": "n0=127.0.0.1:7100,p1x=127.0.0.1:7101"})


@pytest.mark.parametrize("settings", [{"backoff_ms_max": 50}, {"timeout_ms_resend": 500}])
def test_a_resend_interval_past_the_backoff_cap_is_refused(settings: dict[str, int]):
    """Found by audit (2026-11-28, second): a coordinator resends its decision with a backoff
    from timeout_ms_resend to backoff_ms_max, and Backoff asserts the first is no more than the
    second; the configuration only compared backoff_ms_min with the cap, so such a node loaded,
    became ready, and crashed on its first commit (every node of the cluster alike)."""
    base = {"node_id": "n0", "peers": "n0=127.0.0.1:7100", "partition_count": 2}
    with pytest.raises(ValidationError, match="timeout_ms_resend"):
        load_node_config(environ={}, overrides={**base, **settings})
