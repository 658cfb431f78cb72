"""One chaos run, start to end: Toxiproxy and its proxies, the nodes, the workloads and the storage
auditor, the fault phase, the quiet phase, the final reads, the checks. Whatever happens (the end,
an error, Ctrl-C) every fault is undone and every process this run started is stopped."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import re
import secrets
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis

from cornus.runtime.config import NodeConfig
from loadtests.bench import cloud
from loadtests.chaos import checks
from loadtests.chaos.audit import Auditor
from loadtests.chaos.cluster import ChaosCluster, StorageTarget, azure_blob_endpoint
from loadtests.chaos.faults import FAULT_KINDS, Injector, ScheduleShape, make_schedule
from loadtests.chaos.ownership import check_ownership
from loadtests.chaos.toxiproxy import Toxiproxy, toxiproxy_binary
from loadtests.chaos.workloads import BankWorkload, InFlight, RegisterWorkload, read_keys
from storage_adapters.factory import StoreConfig
from tests.worker import free_port

# Node settings of a chaos run unless overridden: the cluster tests' clock slack (one machine,
# killed processes take their calls with them) and an idle timeout that frees the locks of an
# interactive transfer whose client went away within a few seconds.
# timeout_ms_stop_collect 0: the run's storage is thrown away after, so the nodes' final stop
# need not wait out the collection of their last transactions.
DEFAULT_SETTINGS: dict[str, int] = {"clock_slack_ms": 250, "timeout_ms_txn_idle": 3_000, "timeout_ms_stop_collect": 0}
POLL_S = 0.1
WORKLOAD_JOIN_S = 30.0
AUDIT_FINAL_TIMEOUT_S = 120.0
SETUP_TIMEOUT_S = 60.0
FINAL_READ_TIMEOUT_S = 60.0
HTTP_TIMEOUT_S = 5.0
MONITOR_INTERVAL_S = 0.5
FAULT_COUNT_MAX = 100_000
BOOT_TIMEOUT_S = 60.0
MONITOR_SAMPLE_COUNT_MAX = 1_000_000
# The chaos CLI's backend names, and StoreConfig's name of each.
BACKENDS = {"redis": "redis", "emulator": "emulator", "azure": "azure_blob", "dynamodb": "dynamodb"}
# An Azure container name (3-63 lowercase letters, digits and single hyphens, starting with a letter
# or digit) is also a valid DynamoDB table name: one rule for both.
_CLOUD_NAME = re.compile(r"^[a-z0-9](?:[a-z0-9]|-(?=[a-z0-9])){2,62}$")


@dataclass(frozen=True, slots=True)
class RunOptions:
    backend: str
    duration_s: float
    seed: int
    nodes: int = 3
    partitions: int = 6
    protocol: str = "cornus"  # or "2pc", "coordinator-log", "mixed" (each transaction picks one)
    redis_url: str = ""  # the real server; nodes reach it through their proxies
    flush_redis: bool = False
    # Azure Blob: a connection string with an http BlobEndpoint (Azurite); DynamoDB: an endpoint URL
    # (moto) and region. Nodes reach either through their proxies, the auditor directly.
    azure_connection_string: str = ""
    dynamodb_endpoint: str = ""
    dynamodb_region: str = "us-east-1"
    # The run's own container or table ("": chaos-s<seed>-<UTC time>-<random>); refused if it exists.
    storage_name: str = ""
    keep_storage: bool = False  # leave the container or table after the run (else it is deleted)
    workdir: Path | None = None
    toxiproxy_bin: str = ""
    kinds: tuple[str, ...] = FAULT_KINDS
    fault_count_max: int | None = None  # None: as many as the mean gap fits in the duration
    concurrency_max: int = 3
    process_concurrency_max: int = 1
    gap_s_mean: float = 0.8
    fault_s_min: float = 0.5
    fault_s_max: float = 3.0
    process_fault_s_min: float = 1.0
    process_fault_s_max: float = 12.0
    warmup_s: float = 1.0
    bank_clients: int = 4
    accounts_per_partition: int = 2
    register_writers: int = 2
    register_readers: int = 2
    registers_per_partition: int = 1
    settings: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_SETTINGS))
    storage_timeout_ms_call: int = 2_000
    in_doubt_deadline_s: float | None = None  # None: 2 x termination_timeout_ms(config)
    settle_timeout_s: float = 60.0
    ready_timeout_s: float = 60.0
    audit_interval_s: float = 1.0
    require_ownership: bool = False
    verbose: bool = True

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, not {self.backend!r}")
        if self.backend == "redis" and not self.redis_url:
            raise ValueError("the redis backend needs redis_url (the real server)")
        if self.backend == "azure" and not self.azure_connection_string:
            raise ValueError("the azure backend needs azure_connection_string (e.g. Azurite's, scripts/services.sh)")
        if self.backend == "dynamodb" and not self.dynamodb_endpoint:
            raise ValueError("the dynamodb backend needs dynamodb_endpoint (e.g. the moto server, scripts/services.sh)")
        if self.storage_name and not _CLOUD_NAME.match(self.storage_name):
            raise ValueError(f"storage_name {self.storage_name!r}: 3-63 lowercase letters, digits and single hyphens")
        if not 0 < self.duration_s <= 24 * 3600:
            raise ValueError("duration_s must be in (0, 86400]")
        if not 1 <= self.nodes <= 16:
            raise ValueError("nodes must be in 1..16")
        if not 1 <= self.partitions <= 256:
            raise ValueError("partitions must be in 1..256")
        unknown = set(self.kinds) - set(FAULT_KINDS)
        if unknown:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: {', '.join(FAULT_KINDS)}")
        if self.fault_count_max is not None and not 0 <= self.fault_count_max <= FAULT_COUNT_MAX:
            raise ValueError(f"fault_count_max must be in 0..{FAULT_COUNT_MAX}")
        if not (self.gap_s_mean > 0 and 0 < self.fault_s_min <= self.fault_s_max
                and 0 < self.process_fault_s_min <= self.process_fault_s_max):
            raise ValueError("the mean fault gap and fault lengths must be positive, min <= max")
        if self.protocol not in ("cornus", "2pc", "coordinator-log", "mixed"):
            raise ValueError(f"protocol {self.protocol!r}")

    @property
    def fault_count(self) -> int:
        if self.fault_count_max is not None:
            return self.fault_count_max
        return int(self.duration_s / self.gap_s_mean) + 1

    def to_json(self) -> dict[str, Any]:
        values = dataclasses.asdict(self)
        values["workdir"] = str(self.workdir) if self.workdir else None
        if self.azure_connection_string:
            # The account key stays out of the JSON (a file others may read); the endpoint is enough.
            values["azure_connection_string"] = "BlobEndpoint=" + azure_blob_endpoint(self.azure_connection_string)
        values["kinds"] = list(self.kinds)
        return values


def termination_timeout_ms(config: NodeConfig) -> tuple[int, str]:
    """How long after the faults stop a participant may legitimately stay in doubt. ProtocolConfig
    has no single "termination timeout": a yes-voter waits `timeout_ms_decision` before it starts
    termination, whose storage calls take up to `storage_deadline_ms` each; a node restarted as the
    faults end first waits `recovery_settle_ms` before its recovery even reads its logs (until then
    it is not ready and its in-doubt count says nothing); and with lease-based ownership it must
    first wait out its previous life's leases (`lease_ms` + the ownership clock slack) before it
    holds its partitions again and can recover them. Their sum is the bound used."""
    c = config.protocol_config
    value = c.recovery_settle_ms + c.timeout_ms_decision + c.storage_deadline_ms
    basis = (f"recovery_settle_ms {c.recovery_settle_ms} + timeout_ms_decision {c.timeout_ms_decision} + "
             f"storage_deadline_ms {c.storage_deadline_ms}")
    ownership = getattr(config, "ownership", None)
    lease_ms = getattr(ownership, "lease_ms", None)
    slack_ms = getattr(ownership, "clock_slack_ms", None)
    if isinstance(lease_ms, int) and isinstance(slack_ms, int):
        value += lease_ms + slack_ms
        basis = f"lease_ms {lease_ms} + ownership clock_slack_ms {slack_ms} + {basis}"
    return value, basis


class InDoubtMonitor:
    """Samples every node's in-doubt count (/readyz) from its own thread through the whole run, so
    the summary can say whether check (d) had anything to wait for."""

    def __init__(self, cluster: ChaosCluster, interval_s: float) -> None:
        self.cluster = cluster
        self.interval_s = interval_s
        self.stop = threading.Event()
        self.max_total = 0
        self.max_per_node: dict[str, int] = {}
        self.sample_count = 0
        # Ownership counters /readyz reports (deposed, fenced_writes: they only grow within one life
        # of a node), the largest seen per node and life; summed at the end.
        self.ownership: dict[str, dict[str, int]] = {}
        self._thread = threading.Thread(target=self._run, name="in-doubt-monitor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self.stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        with httpx.Client(timeout=HTTP_TIMEOUT_S) as http:
            for _ in range(MONITOR_SAMPLE_COUNT_MAX):
                if self.stop.wait(self.interval_s):
                    return
                bodies: dict[str, dict[str, Any]] = {}
                poll = self.cluster.readyz(http, bodies)
                for node, body in bodies.items():
                    life = f"{node}#{self.cluster.nodes[node].start_count}"
                    seen = self.ownership.setdefault(life, {})
                    for name in ("deposed", "fenced_writes"):
                        if isinstance(body.get(name), int):
                            seen[name] = max(seen.get(name, 0), body[name])
                counts = {node: value[1] for node, value in poll.items() if value is not None}
                self.sample_count += 1
                self.max_total = max(self.max_total, sum(counts.values()))
                for node, count in counts.items():
                    self.max_per_node[node] = max(self.max_per_node.get(node, 0), count)


def _prepare_redis(url: str, flush: bool) -> None:
    client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
    try:
        if flush:
            client.flushdb()
        elif client.dbsize():
            raise ValueError(f"{url} is not empty: the audit would read other runs' records; pass --flush-redis "
                             "(it empties that database) or choose an empty database")
    finally:
        client.close()


def _run_storage_name(seed: int) -> str:
    """A container or table name no other run has: the seed, the UTC time and random bits."""
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M%S")
    return f"chaos-s{abs(seed)}-{stamp}-{secrets.token_hex(3)}"


def _cloud_storage(options: RunOptions, summary: dict[str, Any], cleanup: contextlib.ExitStack,
                   say: Callable[[str], None]) -> StorageTarget:
    """The run's own Azure container or DynamoDB table: named, refused if it already exists (another
    run's records would confuse the audit), and deleted when the run ends unless kept. The nodes
    create it (their adapter does, at open); the delete is registered first, so it comes after every
    process of the run has stopped."""
    backend = BACKENDS[options.backend]
    name = options.storage_name or _run_storage_name(options.seed)
    if backend == "azure_blob":
        storage = StorageTarget(backend, azure_connection_string=options.azure_connection_string, name=name,
                                timeout_ms_call=options.storage_timeout_ms_call)
    else:
        storage = StorageTarget(backend, dynamodb_endpoint=options.dynamodb_endpoint,
                                dynamodb_region=options.dynamodb_region, name=name,
                                timeout_ms_call=options.storage_timeout_ms_call)
    config = StoreConfig(backend=backend, **storage.direct_location())
    kind = "container" if backend == "azure_blob" else "table"
    if cloud.exists(config, name):
        raise ValueError(f"{backend} {kind} {name} exists already: a run needs one of its own (the audit would read "
                         "its records too); choose another --storage-name or leave it out")
    summary["storage"] = {"backend": backend, kind: name, "kept": options.keep_storage}

    def release() -> None:
        if options.keep_storage:
            say(f"chaos: kept {backend} {kind} {name}")
            return
        try:
            cloud.delete(config, name)
        except Exception as error:  # any SDK or network error: said, the run's result stands
            summary["storage"]["delete_error"] = f"{type(error).__name__}: {error}"
            say(f"chaos: could not delete {backend} {kind} {name} ({type(error).__name__}: {error}); delete it "
                "yourself")

    cleanup.callback(release)
    return storage


def run(options: RunOptions, port: Callable[[], int] = free_port) -> dict[str, Any]:
    """Run it all; the summary (also on error, with "error" set). Never leaves a process behind."""
    say: Callable[[str], None] = (lambda line: print(line, file=sys.stderr, flush=True)) if options.verbose \
        else (lambda line: None)
    workdir = options.workdir or Path(tempfile.mkdtemp(prefix="cornus-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"config": options.to_json(), "workdir": str(workdir), "error": None}
    summary["config"]["workdir"] = str(workdir)
    started = time.monotonic()
    try:
        with contextlib.ExitStack() as cleanup:
            try:
                _run(options, port, workdir, summary, cleanup=cleanup, say=say)
            except (Exception, KeyboardInterrupt) as error:
                summary["error"] = f"{type(error).__name__}: {error}"
                say(f"chaos: run failed: {summary['error']}; cleaning up (logs in {workdir})")
            finally:
                say("chaos: stopping every process this run started")
    except Exception as error:
        # A cleanup step failed (ExitStack still ran the others): said with the run's own error, not
        # raised past it, which lost the whole summary, the reason the run failed among it.
        failed = f"cleanup failed: {type(error).__name__}: {error}"
        summary["error"] = f"{summary['error']}; {failed}" if summary["error"] else failed
    summary.setdefault("timings", {})["total_s"] = round(time.monotonic() - started, 2)
    summary["passed"] = summary["error"] is None and all(
        c["violations"] == 0 and (c["status"] != checks.NO_OWNERSHIP_LINES or not options.require_ownership)
        for c in summary.get("checks", [])) and bool(summary.get("checks"))
    return summary


def _run(options: RunOptions, port: Callable[[], int], workdir: Path, summary: dict[str, Any], *,
         cleanup: contextlib.ExitStack, say: Callable[[str], None]) -> None:
    if options.backend == "redis":
        _prepare_redis(options.redis_url, options.flush_redis)
        storage = StorageTarget("redis", redis_url=options.redis_url, timeout_ms_call=options.storage_timeout_ms_call)
    elif options.backend == "emulator":
        storage = StorageTarget("emulator", emulator_path=str(workdir / "cluster.db"),
                                timeout_ms_call=options.storage_timeout_ms_call)
    else:
        storage = _cloud_storage(options, summary, cleanup, say)
    if storage.proxied:
        summary["storage_faults"] = (f"node->storage links proxied (one proxy per node, to {storage.backend} at "
                                     f"{storage.upstream})")
    else:
        summary["storage_faults"] = ("none: the emulator is a local SQLite file with no storage link to proxy; "
                                     "only node-node and process faults are injected")
    binary = toxiproxy_binary(options.toxiproxy_bin)
    toxiproxy = Toxiproxy(binary, port(), options.seed, workdir / "toxiproxy.log")
    toxiproxy.start()
    cleanup.callback(toxiproxy.stop)
    summary["toxiproxy"] = {"binary": binary, "version": toxiproxy.version(), "api": toxiproxy.url}

    cluster = ChaosCluster(node_count=options.nodes, partition_count=options.partitions, protocol=options.protocol,
                           storage=storage, settings=options.settings, workdir=workdir, port=port, toxiproxy=toxiproxy)
    summary["harness_anomalies"] = cluster.anomalies  # the same list: what the cleanup finds is in it too
    cluster.create_proxies()
    stop_ms: list[int] = []
    cleanup.callback(lambda: stop_ms.append(cluster.stop_all()))
    cluster.start_all()
    if not cluster.wait_ready(options.ready_timeout_s):
        raise RuntimeError(f"the cluster was not ready within {options.ready_timeout_s:g} s (logs in {workdir})")
    term_ms, basis = termination_timeout_ms(cluster.config)
    deadline_s = options.in_doubt_deadline_s if options.in_doubt_deadline_s is not None else 2 * term_ms / 1000
    if options.in_doubt_deadline_s is not None:
        basis += f"; overridden by --in-doubt-deadline-s {options.in_doubt_deadline_s:g}"

    schedule = make_schedule(options.seed, ScheduleShape(
        duration_s=options.duration_s, nodes=tuple(cluster.nodes), peer_links=tuple(cluster.link_names(storage=False)),
        storage_links=tuple(cluster.link_names(storage=True)), kinds=options.kinds,
        count_max=options.fault_count, concurrency_max=options.concurrency_max,
        process_concurrency_max=options.process_concurrency_max, gap_s_mean=options.gap_s_mean,
        fault_s_min=options.fault_s_min, fault_s_max=options.fault_s_max,
        process_fault_s_min=options.process_fault_s_min, process_fault_s_max=options.process_fault_s_max,
        warmup_s=options.warmup_s))
    summary["schedule"] = [fault.to_json() for fault in schedule]

    in_flight = InFlight()
    prefix = f"s{options.seed}-"
    bank = BankWorkload(cluster.running_urls, options.seed, options.protocol, in_flight, prefix=prefix,
                        partition_count=options.partitions, accounts_per_partition=options.accounts_per_partition,
                        clients=options.bank_clients)
    register = RegisterWorkload(cluster.running_urls, options.seed, options.protocol, in_flight, prefix=prefix,
                                partition_count=options.partitions, keys_per_partition=options.registers_per_partition,
                                writers=options.register_writers, readers=options.register_readers,
                                node_ids={node.url: node_id for node_id, node in cluster.nodes.items()})
    http = cleanup.enter_context(httpx.Client(timeout=HTTP_TIMEOUT_S))
    bank.setup(http, SETUP_TIMEOUT_S)

    # The auditor goes straight to storage, never through a proxy, with a deadline of its own.
    # From the environment the nodes inherit too (CORNUS_STORAGE_REDIS_DURABILITY among it), then these.
    store_config = StoreConfig.from_env(backend=storage.backend, timeout_ms_call=max(5_000, storage.timeout_ms_call),
                                        **storage.direct_location())
    auditor = Auditor(store_config, options.audit_interval_s)
    auditor.start()
    cleanup.callback(auditor.stop)

    monitor = InDoubtMonitor(cluster, MONITOR_INTERVAL_S)
    monitor.start()
    cleanup.callback(monitor.close)
    injector = Injector(cluster, schedule, workdir / "faults.log", say)
    cleanup.callback(injector.close)
    for workload in (bank, register):
        cleanup.callback(workload.stop.set)
        workload.start()

    # --- fault phase ---
    say(f"chaos: {len(schedule)} faults over {options.duration_s:g} s (seed {options.seed}); logs in {workdir}")
    fault_started = time.monotonic()
    never = threading.Event()
    try:
        injector.run(never, until_s=options.duration_s)
    finally:
        injector.heal_all()
    healed = time.monotonic()
    bank.stop.set()
    register.stop.set()
    # The deadline's clock starts once every node process answers again: a node restarted as the
    # faults end spends seconds importing Python before its first protocol timer even starts, and
    # that boot time (reported) is the machine's, not the protocol's.
    booted = _wait_alive(cluster, http, BOOT_TIMEOUT_S)
    faults_stopped = time.monotonic()
    summary["timings"] = {"fault_phase_s": round(healed - fault_started, 2),
                          "restart_boot_s": round(faults_stopped - healed, 2)}
    if not booted:
        say(f"chaos: some node did not answer /healthz within {BOOT_TIMEOUT_S:g} s of the heal")
    say("chaos: faults over; quiet phase")

    # --- quiet phase: the workloads stop, every in-doubt transaction must resolve in time ---
    resolved_after: float | None = None
    last_poll: dict[str, tuple[bool, int] | None] = {}
    first_poll: dict[str, tuple[bool, int] | None] | None = None
    for _ in range(int(deadline_s / POLL_S) + 100):
        injector.watch()
        last_poll = cluster.readyz(http)
        first_poll = last_poll if first_poll is None else first_poll
        now = time.monotonic()
        if all(v is not None and v[0] and v[1] == 0 for v in last_poll.values()) and in_flight.count == 0:
            resolved_after = now - faults_stopped
            break
        if now - faults_stopped > deadline_s:
            break
        time.sleep(POLL_S)
    if resolved_after is not None and resolved_after > deadline_s:
        resolved_after = None
    joined = bank.join(WORKLOAD_JOIN_S) and register.join(WORKLOAD_JOIN_S)
    if not joined:
        raise RuntimeError(f"workload threads did not stop within {WORKLOAD_JOIN_S:g} s")
    injector.watch()
    if not cluster.wait_ready(options.ready_timeout_s):
        raise RuntimeError("a node was not ready after the faults (its log tail is above)")
    settled, leftovers = _settle(cluster, http, options.settle_timeout_s)
    summary["timings"]["quiet_phase_s"] = round(time.monotonic() - faults_stopped, 2)

    # --- what the clients can see now ---
    balances = read_keys(http, cluster.running_urls, bank.accounts, FINAL_READ_TIMEOUT_S)
    markers = read_keys(http, cluster.running_urls, [t.marker for t in bank.transfers], FINAL_READ_TIMEOUT_S)
    finals = read_keys(http, cluster.running_urls, register.keys, FINAL_READ_TIMEOUT_S)
    if not auditor.final(AUDIT_FINAL_TIMEOUT_S):
        raise RuntimeError(f"the final storage audit did not finish within {AUDIT_FINAL_TIMEOUT_S:g} s")

    # --- the nodes stop; their logs are complete now ---
    cleanup.pop_all().close()  # stops workloads, auditor, nodes, toxiproxy (in reverse order)
    run_end_ms = stop_ms[-1] if stop_ms else int(time.time() * 1000)
    exits = {node_id: node.member.process.returncode for node_id, node in cluster.nodes.items()
             if node.member.process is not None and node.member.process.returncode is not None}
    ownership = check_ownership(cluster.log_paths(), {n: node.kill_times_ms for n, node in cluster.nodes.items()},
                                run_end_ms)

    wait = checks.InDoubtWait(deadline_s, resolved_after, last_poll, settled, leftovers, term_ms, basis,
                              at_faults_end=first_poll or {}, max_total=monitor.max_total,
                              max_per_node=monitor.max_per_node, sample_count=monitor.sample_count,
                              boot_s=summary["timings"]["restart_boot_s"])
    results = [
        checks.check_bank_total(balances, bank.total_expected),
        checks.check_acknowledged_visible(bank.transfers, markers, register.ops, finals),
        checks.check_no_stale_read(register.ops),
        checks.check_decided_one_way(auditor.state, bank.transfers, register.ops, markers, finals),
        checks.check_in_doubt(wait, auditor.state),
        checks.check_single_owner(ownership, monitor.ownership),
        checks.check_no_crash(injector.report.crashes, exits),
    ]
    summary["checks"] = [result.to_json() for result in results]
    summary["faults_injected"] = dict(injector.report.applied)
    summary["fault_errors"] = injector.report.errors
    summary["workloads"] = {"bank transfers": bank.tally.to_json(), "register writes": register.write_tally.to_json(),
                            "register reads": register.read_tally.to_json()}
    summary["workload_errors"] = bank.errors + register.errors
    summary["kills_ms"] = {n: node.kill_times_ms for n, node in cluster.nodes.items()}
    # Every register operation, for a second look at a stale read (the checks keep 20 examples).
    with (workdir / "register_ops.jsonl").open("w", encoding="utf-8") as out:
        for op in register.ops:
            out.write(json.dumps(op.to_json(), separators=(",", ":")) + "\n")


def _wait_alive(cluster: ChaosCluster, http: httpx.Client, timeout_s: float) -> bool:
    """Wait (bounded) until every node answers /healthz: its process is up and serving HTTP."""
    deadline = time.monotonic() + timeout_s
    waiting = set(cluster.nodes)
    while waiting and time.monotonic() < deadline:
        for node_id in sorted(waiting):
            with contextlib.suppress(httpx.HTTPError):
                if http.get(f"{cluster.nodes[node_id].url}/healthz", timeout=1.0).status_code == 200:
                    waiting.discard(node_id)
        if waiting:
            time.sleep(POLL_S)
    return not waiting


def _settle(cluster: ChaosCluster, http: httpx.Client, timeout_s: float) -> tuple[bool, list[Any]]:
    """Wait (bounded) until no node lists a transaction, so the final reads meet no lock."""
    deadline = time.monotonic() + timeout_s
    busy: list[Any] = []
    while time.monotonic() < deadline:
        busy = []
        for node_id, node in cluster.nodes.items():
            try:
                rows = http.get(f"{node.url}/v1/admin/transactions").json()
            except (httpx.HTTPError, ValueError):
                rows = [{"node": node_id, "error": "no answer"}]
            busy += [{"node": node_id, **row} for row in rows]
        if not busy:
            return True, []
        time.sleep(POLL_S)
    return False, busy[:20]
