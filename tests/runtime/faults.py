"""Plumbing for runtime regression tests: a LogStore wrapper that injects storage faults, an
in-process cluster of real `Node`s over `LocalNetwork` and one emulator file, and polling helpers.

Every assumption the regression tests make about the runtime lives here, so a refactor of the
runtime changes this module, not the tests:

- a node is `cornus.runtime.node.Node(config, store, transport)`, started with `await start()`
  (ready after recovery) and stopped with `await stop()`;
- its configuration is a `NodeConfig` with `ProtocolConfig` and `RuntimeLimits` fields;
- keys map to partitions with `cornus.runtime.keys.partition_of`;
- a participant's redo is `cornus.runtime.redo.encode(writes)`;
- nodes talk through `LocalNetwork`, and a protocol message is delivered as
  `node.on_message(sender_node, Routed(source_host, dest_host, message))`;
- an impossible state makes the runtime call `os._exit`, which would end the whole pytest
  process: inside `local_cluster` it is intercepted and reported as a test failure instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cornus.protocol import txn_ids
from cornus.protocol.config import Protocol, ProtocolConfig
from cornus.protocol.locks import Policy
from cornus.protocol.ownership import OwnershipConfig
from cornus.runtime import redo as redo_codec
from cornus.runtime.config import NodeConfig, RuntimeLimits
from cornus.runtime.keys import partition_of
from cornus.runtime.local_transport import LocalNetwork
from cornus.runtime.node import Node
from cornus.runtime.outcome import Outcome, OutcomeStatus
from cornus.runtime.wire import ExecuteRequest, Op, OpKind, PeerRequest, PeerResponse
from storage_adapters.contract import (
    IDENTITY_PAGE_COUNT_MAX,
    SCAN_PAGE_COUNT_MAX,
    Fence,
    LogId,
    LogOnceResult,
    Ownership,
    OwnerWriteResult,
    Record,
    RecordBody,
    ScanPage,
    Tombstone,
    TxnState,
)
from storage_adapters.errors import StorageUnavailable
from storage_adapters.factory import StoreConfig, open_store
from storage_adapters.store import DelegatingStore, LogStore

# Storage call deadline of test clusters: small, so recovery's wait for in-flight calls is short,
# but well above what a SQLite commit on this machine takes.
STORAGE_TIMEOUT_MS = 500
# How late past its deadline a call may land here (one process, one SQLite file: little).
CLOCK_SLACK_MS = 100
# Leases of test clusters: short, so a node that restarts after a crash waits little for its own
# old leases to run out.
OWNERSHIP_DEFAULTS: dict[str, int] = {
    "lease_ms": 1_000,
    "renew_interval_ms": 200,
    "clock_slack_ms": CLOCK_SLACK_MS,
    "failover_delay_ms": 1_000,
    "drain_ms_max": 1_000,
}
# Protocol timers of test clusters (ProtocolConfig fields). gc_grace_ms is the least the rule allows
# (twice the storage deadline plus the slack), as DESIGN section 4 requires.
PROTOCOL_DEFAULTS: dict[str, int] = {
    "timeout_ms_prepare": 400,
    "timeout_ms_votes": 200,
    "timeout_ms_decision": 200,
    "timeout_ms_resend": 100,
    "backoff_ms_min": 10,
    "backoff_ms_max": 200,
    "storage_deadline_ms": STORAGE_TIMEOUT_MS,
    "clock_slack_ms": CLOCK_SLACK_MS,
    "gc_grace_ms": 2 * STORAGE_TIMEOUT_MS + CLOCK_SLACK_MS,
}
LIMIT_DEFAULTS: dict[str, int] = {
    "timeout_ms_peer_request": 2_000,
    "timeout_ms_lock_wait": 500,
    # A test's storage is thrown away after it: a stop need not wait out the collections.
    "timeout_ms_stop_collect": 0,
}
POLL_INTERVAL_S = 0.02


# === a LogStore that fails on demand ===============================================================


class Fault(enum.Enum):
    FAIL = "fail"  # raise StorageUnavailable without calling the store
    LAND_THEN_FAIL = "land_then_fail"  # call the store, then raise StorageUnavailable ("timed out but landed")
    HOLD = "hold"  # wait for the gate to open, then call the store


@dataclass(slots=True)
class _Armed:
    fault: Fault
    remaining: int | None  # None: until healed
    where: Callable[[dict[str, Any]], bool] | None
    gate: asyncio.Event | None = None


@dataclass(frozen=True, slots=True)
class Call:
    """One call that reached the wrapper: its arguments by name, and how it ended."""

    seq: int  # completion order
    method: str
    args: dict[str, Any]
    outcome: str  # "ok", "failed" (injected), "landed_then_failed" (injected), "error" (from the store)
    result: Any = None


class FaultyStore(DelegatingStore):
    """Delegates to `inner`; per method, can fail the next N calls (or all until `heal`), perform a
    call and then report it failed, or hold calls until released. `where` narrows a fault to calls
    whose arguments match (e.g. `lambda a: a["txn"] == txn`). Every call is recorded in `calls`."""

    METHODS = (
        "log_once", "log", "read", "scan_unfinished", "read_data", "apply_redo", "delete", "read_owners", "write_owner",
        "list_identities",
    )

    def __init__(self, inner: LogStore, name: str = "") -> None:
        super().__init__(inner)
        self.name = name
        self.backend_name = f"faulty({inner.backend_name})"
        self.calls: list[Call] = []
        self._armed: dict[str, list[_Armed]] = {method: [] for method in self.METHODS}
        self._seq = itertools.count()

    # --- arming ----------------------------------------------------------------------------------

    def fail(self, method: str, count: int | None = 1, where: Callable[[dict[str, Any]], bool] | None = None) -> None:
        """The next `count` matching calls (None: every one until `heal`) raise StorageUnavailable."""
        self._arm(method, _Armed(Fault.FAIL, count, where))

    def land_then_fail(
        self, method: str, count: int | None = 1, where: Callable[[dict[str, Any]], bool] | None = None
    ) -> None:
        """The next `count` matching calls take effect, then raise StorageUnavailable."""
        self._arm(method, _Armed(Fault.LAND_THEN_FAIL, count, where))

    def hold(self, method: str, where: Callable[[dict[str, Any]], bool] | None = None) -> asyncio.Event:
        """Matching calls wait until the returned event is set (then they run normally)."""
        gate = asyncio.Event()
        self._arm(method, _Armed(Fault.HOLD, None, where, gate))
        return gate

    def heal(self, method: str | None = None) -> None:
        """Disarm every fault (of `method`, or of all methods) and open every hold."""
        for name in (method,) if method else self.METHODS:
            for armed in self._armed[name]:
                if armed.gate is not None:
                    armed.gate.set()
            self._armed[name].clear()

    def _arm(self, method: str, armed: _Armed) -> None:
        assert method in self.METHODS, f"unknown store method {method!r}"
        self._armed[method].append(armed)

    # --- inspection ------------------------------------------------------------------------------

    def calls_of(self, method: str, outcome: str | None = None, **match: Any) -> list[Call]:
        return [
            call
            for call in self.calls
            if call.method == method
            and (outcome is None or call.outcome == outcome)
            and all(call.args.get(name) == value for name, value in match.items())
        ]

    # --- the wrapper -----------------------------------------------------------------------------

    def _take(self, method: str, args: dict[str, Any]) -> _Armed | None:
        for armed in self._armed[method]:
            if armed.where is not None and not armed.where(args):
                continue
            if armed.remaining is not None:
                armed.remaining -= 1
                if armed.remaining <= 0:
                    self._armed[method].remove(armed)
            return armed
        return None

    def _record(self, method: str, args: dict[str, Any], outcome: str, result: Any = None) -> None:
        self.calls.append(Call(next(self._seq), method, args, outcome, result))

    async def _run(self, method: str, args: dict[str, Any], call: Callable[[], Awaitable[Any]]) -> Any:
        armed = self._take(method, args)
        if armed is not None and armed.fault is Fault.HOLD:
            assert armed.gate is not None
            await armed.gate.wait()
        if armed is not None and armed.fault is Fault.FAIL:
            self._record(method, args, "failed")
            raise StorageUnavailable(f"injected fault: {method} unavailable")
        try:
            result = await call()
        except Exception as error:
            self._record(method, args, "error", error)
            raise
        if armed is not None and armed.fault is Fault.LAND_THEN_FAIL:
            self._record(method, args, "landed_then_failed", result)
            raise StorageUnavailable(f"injected fault: {method} timed out (but it took effect)")
        self._record(method, args, "ok", result)
        return result

    async def log_once(
        self, log: LogId, txn: str, state: TxnState, body: RecordBody, fence: Fence | None = None
    ) -> LogOnceResult:
        args = {"log": log, "txn": txn, "state": state, "body": body, "fence": fence}
        return await self._run("log_once", args, lambda: self.inner.log_once(log, txn, state, body, fence))

    async def log(
        self, log: LogId, txn: str, state: TxnState, body: RecordBody | None = None, fence: Fence | None = None
    ) -> TxnState:
        args = {"log": log, "txn": txn, "state": state, "body": body, "fence": fence}
        return await self._run("log", args, lambda: self.inner.log(log, txn, state, body, fence))

    async def read(self, log: LogId, txn: str) -> Record | None:
        return await self._run("read", {"log": log, "txn": txn}, lambda: self.inner.read(log, txn))

    async def scan_unfinished_page(self, log: LogId, limit: int = SCAN_PAGE_COUNT_MAX, after: str = "") -> ScanPage:
        args = {"log": log, "limit": limit, "after": after}
        return await self._run("scan_unfinished", args, lambda: self.inner.scan_unfinished_page(log, limit, after))

    async def scan_finished_page(self, log: LogId, limit: int = SCAN_PAGE_COUNT_MAX, after: str = "") -> ScanPage:
        args = {"log": log, "limit": limit, "after": after}
        return await self._run("scan_finished", args, lambda: self.inner.scan_finished_page(log, limit, after))

    async def read_data(self, partition: str, keys: Sequence[str]) -> dict[str, bytes | None]:
        args = {"partition": partition, "keys": tuple(keys)}
        return await self._run("read_data", args, lambda: self.inner.read_data(partition, keys))

    async def apply_redo(
        self, partition: str, txn: str, writes: Mapping[str, bytes | None], fence: Fence | None = None
    ) -> bool:
        args = {"partition": partition, "txn": txn, "writes": dict(writes), "fence": fence}
        return await self._run("apply_redo", args, lambda: self.inner.apply_redo(partition, txn, writes, fence))

    async def delete(
        self, log: LogId, txn: str, fence: Fence | None = None, keep: Tombstone | None = None,
    ) -> bool:
        args = {"log": log, "txn": txn, "fence": fence, "keep": keep}
        return await self._run("delete", args, lambda: self.inner.delete(log, txn, fence, keep))

    async def read_owners(self, partitions: Sequence[str]) -> dict[str, Ownership]:
        args = {"partitions": tuple(partitions)}
        return await self._run("read_owners", args, lambda: self.inner.read_owners(partitions))

    async def write_owner(self, expected: Ownership | None, new: Ownership) -> OwnerWriteResult:
        args = {"expected": expected, "new": new}
        return await self._run("write_owner", args, lambda: self.inner.write_owner(expected, new))

    async def list_identities(self, after: str = "", limit: int = IDENTITY_PAGE_COUNT_MAX) -> list[str]:
        args = {"after": after, "limit": limit}
        return await self._run("list_identities", args, lambda: self.inner.list_identities(after, limit))

    async def close(self) -> None:
        """The wrapped store belongs to the cluster, which closes it once."""

    def __getattr__(self, name: str) -> Any:
        # Methods a later contract adds reach the real store unchanged.
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


# === an in-process cluster =========================================================================


class NodeExited(Exception):
    """The runtime asked to end the process (an impossible state): reported, not obeyed."""


@dataclass
class LocalCluster:
    """`node_count` nodes n0.. over one emulator file; node i owns partitions round-robin. Each node
    reaches storage through its own FaultyStore (`faults[node_id]`); `store` is the real store,
    for the test to read and write records directly."""

    tmp_path: Path
    node_count: int = 1
    partition_count: int = 2
    protocol: Protocol = Protocol.CORNUS
    protocols: dict[str, Protocol] = field(default_factory=dict)  # per-node default protocol
    protocol_config: dict[str, int] = field(default_factory=dict)
    limits: dict[str, int] = field(default_factory=dict)
    ownership: dict[str, int] = field(default_factory=dict)
    storage_timeout_ms: int = STORAGE_TIMEOUT_MS
    lock_policy: Policy = Policy.NO_WAIT

    network: LocalNetwork = field(default_factory=LocalNetwork)
    store: LogStore | None = None
    faults: dict[str, FaultyStore] = field(default_factory=dict)
    nodes: dict[str, Node] = field(default_factory=dict)
    exits: list[int] = field(default_factory=list)

    @property
    def node_ids(self) -> list[str]:
        return [f"n{index}" for index in range(self.node_count)]

    @property
    def storage(self) -> StoreConfig:
        return StoreConfig(
            backend="emulator", emulator_path=str(self.tmp_path / "cornus.db"), timeout_ms_call=self.storage_timeout_ms
        )

    def config(self, node_id: str) -> NodeConfig:
        return NodeConfig(
            node_id=node_id,
            peers={node: f"127.0.0.1:{7100 + index}" for index, node in enumerate(self.node_ids)},
            protocol=self.protocols.get(node_id, self.protocol),
            partition_count=self.partition_count,
            storage=self.storage,
            protocol_config=ProtocolConfig(
                **{**PROTOCOL_DEFAULTS, **self.protocol_config, "storage_deadline_ms": self.storage_timeout_ms}
            ),
            limits=RuntimeLimits(**{**LIMIT_DEFAULTS, **self.limits}),
            ownership=OwnershipConfig(**{**OWNERSHIP_DEFAULTS, **self.ownership}),
            lock_policy=self.lock_policy,
        )

    async def open(self) -> None:
        self.store = await open_store(self.storage)
        for node_id in self.node_ids:
            self.faults[node_id] = FaultyStore(self.store, node_id)

    async def start(self, node_id: str | None = None, wait_ready: bool = True) -> None:
        """Start one node (or every node not running), over the same store as before."""
        for name in [node_id] if node_id else [n for n in self.node_ids if n not in self.nodes]:
            assert name not in self.nodes, f"{name} is already running"
            node = Node(self.config(name), self.faults[name], self.network.transport(name))
            self.nodes[name] = node
        names = [node_id] if node_id else list(self.nodes)
        await asyncio.gather(*(self.nodes[name].start(wait_ready=wait_ready) for name in names
                               if not self.nodes[name].ready))

    async def stop(self, node_id: str) -> None:
        node = self.nodes.pop(node_id)
        await node.stop()

    async def restart(self, node_id: str) -> None:
        await self.stop(node_id)
        await self.start(node_id)

    def node(self, node_id: str = "n0") -> Node:
        return self.nodes[node_id]

    def owner_of(self, partition: str) -> str:
        """The partition's preferred owner, which holds it once the cluster is ready."""
        return self.config(self.node_ids[0]).preferred_owner(partition)

    @property
    def partitions(self) -> tuple[str, ...]:
        return tuple(f"p{index}" for index in range(self.partition_count))

    def partition_of(self, key: str) -> str:
        return partition_of(key, self.partition_count)

    def key_in(self, partition: str, prefix: str = "k") -> str:
        return keys_in(self.partition_count, [partition], prefix)[partition]

    # --- storage, read directly ------------------------------------------------------------------

    @property
    def real_store(self) -> LogStore:
        assert self.store is not None, "the cluster is not open"
        return self.store

    async def record(self, partition: str, txn: str) -> Record | None:
        return await self.real_store.read(LogId.partition(partition), txn)

    async def coordinator_record(self, node_id: str, txn: str) -> Record | None:
        return await self.real_store.read(LogId.coordinator(node_id), txn)

    async def value(self, key: str) -> bytes | None:
        """The committed value of `key` in storage (not through any node's cache)."""
        return (await self.real_store.read_data(self.partition_of(key), [key]))[key]

    async def close(self) -> None:
        for node_id in list(self.nodes):
            with contextlib.suppress(Exception):
                await self.stop(node_id)
        if self.store is not None:
            await self.store.close()


@contextlib.asynccontextmanager
async def local_cluster(tmp_path: Path, **options: Any) -> AsyncIterator[LocalCluster]:
    """An opened LocalCluster with every node started and ready; stopped and closed on exit. A node
    that asked to exit the process makes the test fail (after its own failure, if any)."""
    cluster = LocalCluster(tmp_path, **options)
    real_exit = os._exit

    def intercepted_exit(code: int) -> None:
        cluster.exits.append(code)
        raise NodeExited(code)

    os._exit = intercepted_exit  # type: ignore[assignment]
    try:
        await cluster.open()
        await cluster.start()
        yield cluster
    finally:
        try:
            await cluster.close()
        finally:
            os._exit = real_exit
    assert not cluster.exits, (
        f"a node called os._exit{tuple(cluster.exits)}: the runtime hit an impossible state (see the CRITICAL log)"
    )


class HoldingAnswers:
    """A node's inbound handler (put in `LocalCluster.network.handlers`): it runs every execute
    request (so the owner locks, and votes where the request carries its prepare) but holds each
    answer, but an abort's, until `release` is set."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.release = asyncio.Event()
        self.held_count = 0

    def on_message(self, sender: str, message: Any) -> None:
        self.inner.on_message(sender, message)

    async def on_request(self, sender: str, request: PeerRequest) -> PeerResponse:
        response = await self.inner.on_request(sender, request)
        if isinstance(request, ExecuteRequest) and not request.abort:
            self.held_count += 1
            await self.release.wait()
        return response


class DroppingMessages:
    """A node's inbound handler (put in `LocalCluster.network.handlers`) that drops every message
    of the given kinds sent to it (a Decision, say: a link that loses it)."""

    def __init__(self, inner: Any, *kinds: type) -> None:
        self.inner = inner
        self.kinds = kinds

    def on_message(self, sender: str, message: Any) -> None:
        if not isinstance(getattr(message, "message", None), self.kinds):
            self.inner.on_message(sender, message)

    async def on_request(self, sender: str, request: PeerRequest) -> PeerResponse:
        return await self.inner.on_request(sender, request)


# === transactions and records ======================================================================


def keys_in(partition_count: int, partitions: Sequence[str], prefix: str = "k") -> dict[str, str]:
    """One key per partition named, each hashing to its partition."""
    wanted = set(partitions)
    found: dict[str, str] = {}
    for index in itertools.count():
        key = f"{prefix}{index}"
        partition = partition_of(key, partition_count)
        if partition in wanted and partition not in found:
            found[partition] = key
            if len(found) == len(wanted):
                return found
    raise AssertionError("unreachable")


def puts(writes: Mapping[str, bytes]) -> list[Op]:
    return [Op(OpKind.PUT, key, value) for key, value in writes.items()]


def gets(keys: Sequence[str]) -> list[Op]:
    return [Op(OpKind.GET, key) for key in keys]


def redo_of(writes: Mapping[str, bytes | None]) -> bytes:
    """A participant's redo for `writes`, as the runtime logs and ships it."""
    return redo_codec.encode(writes)


def txn_id(node: str, counter: int, protocol: Protocol | None, begin_ms: int | None = None) -> str:
    """A transaction id as a node would make it; `protocol` None: an untagged id (older builds)."""
    begin_ms = begin_ms or int(time.time() * 1000)
    if protocol is None:
        return f"{begin_ms}.{node}.000000.{counter}"
    return txn_ids.new_txn_id(begin_ms, node, "000000", counter, protocol)


async def commit_writes(node: Node, writes: Mapping[str, bytes], protocol: Protocol | None = None) -> Outcome:
    """A one-shot write transaction that must commit."""
    outcome = await node.execute(puts(writes), protocol)
    assert outcome.status is OutcomeStatus.COMMITTED, f"setup transaction did not commit: {outcome}"
    return outcome


async def commit_told_unknown(cluster: LocalCluster, node: Node, writes: Mapping[str, bytes]) -> str:
    """A commit of `writes` whose caller is told UNKNOWN (n0's votes held past the commit deadline,
    which the test makes short), its votes let go afterwards; its transaction id."""
    gate = cluster.faults["n0"].hold("log_once", where=lambda args: args["state"] is TxnState.VOTE_YES)
    txn = node.begin()
    await node.run_ops(txn, puts(writes))
    unknown = await node.commit(txn)
    assert unknown.status is OutcomeStatus.UNKNOWN, unknown
    gate.set()
    cluster.faults["n0"].heal()
    return txn


def is_tombstone(record: Record | None, decision: TxnState = TxnState.COMMIT) -> bool:
    """Whether `record` is the tombstone of `decision` that collection leaves (DESIGN section 4)."""
    return (record is not None and record.state is decision and record.body == RecordBody()
            and record.applied is (decision is TxnState.COMMIT))


async def records_collected(cluster: LocalCluster, txn: str, partitions: Sequence[str],
                            decision: TxnState = TxnState.COMMIT) -> bool:
    """Whether the records of `txn` in `partitions` (all of its participants) are collected: each
    deleted, but the first participant's, which is its decision's tombstone."""
    holder = min(partitions)
    records = {partition: await cluster.record(partition, txn) for partition in partitions}
    return is_tombstone(records.pop(holder), decision) and all(r is None for r in records.values())


async def wait_collected(cluster: LocalCluster, node: Node, txn: str, partitions: Sequence[str]) -> None:
    """Until `txn` is collected: its coordinator's machine ends once its records are (see
    `records_collected`)."""

    async def collected() -> bool:
        return txn not in node.core.coordinator.machines and await records_collected(cluster, txn, partitions)

    await wait_until(collected, 20, f"the records of {txn} were never collected")


async def read_through(node: Node, key: str, timeout_s: float = 5.0) -> bytes | None:
    """`key` as a client reads it through `node` (retrying a retryable abort, e.g. a lock still held)."""
    last: Outcome | None = None

    async def attempt() -> bool:
        nonlocal last
        last = await node.execute(gets([key]))
        return last.status is OutcomeStatus.COMMITTED

    await wait_until(attempt, timeout_s, lambda: f"a read of {key!r} through {node.node_id} never committed: {last}")
    assert last is not None
    return dict(last.reads)[key]


# === waiting =======================================================================================


async def eventually(check: Callable[[], Awaitable[Any]], timeout_s: float) -> bool:
    """Poll `check` until it returns something truthy (True) or the deadline passes (False)."""
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(POLL_INTERVAL_S)
    return True


async def holds(check: Callable[[], Awaitable[Any]], duration_s: float) -> bool:
    """Poll `check` for `duration_s`: False as soon as it is falsy, True if it never was."""
    deadline = time.monotonic() + duration_s
    while await check():
        if time.monotonic() >= deadline:
            return True
        await asyncio.sleep(POLL_INTERVAL_S)
    return False


async def wait_until(check: Callable[[], Awaitable[Any]], timeout_s: float, message: str | Callable[[], str]) -> None:
    """Poll `check` until it returns something truthy; fail with `message` at the deadline."""
    if not await eventually(check, timeout_s):
        raise AssertionError(message() if callable(message) else message)
