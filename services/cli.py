"""The `cornus` command line. Subcommands:

  serve           run one node (config from --config FILE, CORNUS_* variables and flags)
  storage-bench   p50/p99 `log_once` latency and ops/s per storage backend
  storage-backfill-finished-index
                  Redis only: index the records finished before the finished index existed
  bench           compare the three commit protocols on a local cluster over your storage
  cluster up      a local multi-node cluster on the embedded emulator, in the foreground
  txn             run one one-shot transaction: put:KEY=VALUE get:KEY delete:KEY check:KEY[=VALUE]
  inspect         a node's in-flight and in-doubt transactions, or one transaction's status
  resolve         run termination for one transaction by hand
  partitions      who owns each partition: owner, epoch, lease, the preferred owner
  rebalance       wait until every partition is held by its preferred node (hand-overs are
                  automatic; run it after changing the node set, e.g. as a Helm post-upgrade hook)
  termination-bench
                  time Cornus termination after coordinator kills, on your storage
  healthcheck     exit 0 if a running `cornus serve` answers /healthz (the image's HEALTHCHECK)

Storage settings come from flags, else from `CORNUS_STORAGE_*` environment variables, else from
the config file (serve), else from the defaults (the embedded SQLite emulator in ./cornus.db;
Redis for storage-backfill-finished-index, which refuses any other backend).

Exit codes: 0 success (a transaction committed; a cluster stopped cleanly), 1 failure (aborted,
unknown, unavailable, unreachable, a node died), 2 bad input (nothing was changed); `bench` and
`termination-bench` stopped by Ctrl-C or SIGTERM clean up and exit 130 or 143 (128 plus the signal);
storage-backfill-finished-index stopped by Ctrl-C names the cursor to resume from and exits 130.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import dataclasses
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from cornus.protocol.config import Protocol
from cornus.runtime.config import NodeConfig
from services.client import (
    AsyncCornusClient,
    ClientConfig,
    CornusClient,
    CornusError,
    InvalidRequest,
    NotFound,
    Op,
    Outcome,
    PartitionInfo,
    PartitionListing,
    Status,
    TransactionFailed,
    TxnInfo,
)
from services.client._core import normalize_url, normalize_urls
from services.local_cluster import (
    CLUSTER_POLL_S,
    CLUSTER_TIMEOUT_S_READY,
    PORT_PICK_COUNT_MAX,
    ClusterNode,
    StopSignals,
    cluster_ports,
    dead_node,
    port_was_taken,
    report_dead,
    start_node,
    stop_nodes,
    wait_cluster_ready,
)
from storage_adapters.errors import StorageError, ValidationError
from storage_adapters.factory import BACKENDS, REDIS_DURABILITIES, StoreConfig, env_values

if TYPE_CHECKING:
    from storage_adapters.redis_store import FinishedBackfill


def _add_storage_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("storage (flags override CORNUS_STORAGE_* environment variables)")
    group.add_argument("--timeout-ms-call", type=int, help="deadline of every storage call")
    group.add_argument("--emulator-path", help="SQLite file of the emulator backend")
    group.add_argument("--redis-url", help="e.g. redis://127.0.0.1:6379/0")
    group.add_argument("--redis-durability", metavar="|".join(REDIS_DURABILITIES),
                       help="aof (default): refuse a Redis that answers writes before its append-only file has "
                            "them on disk; replicas:N: answer a write only once N replicas have it (WAIT; for a "
                            "managed Redis that replicates and fsyncs nothing per write); none: check nothing")
    group.add_argument("--azure-connection-string", help="Azure Storage connection string")
    group.add_argument("--azure-container", help="blob container for records and data")
    group.add_argument("--dynamodb-table", help="DynamoDB table (created if absent)")
    group.add_argument("--dynamodb-endpoint", help="endpoint URL, e.g. a local moto server")
    group.add_argument("--dynamodb-region", help="AWS region")
    group.add_argument("--latency", help="injected latency per call: fixed:MS, uniform:LO:HI or lognormal:P50:P99, "
                       "optionally followed by ;CALL=SPEC parts for named storage calls (fixed:1.96;log=fixed:1.84)")


def _add_flush_redis_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--flush-redis", action="store_true",
                        help="with --backend redis: empty the databases the runs use before each run")


def _check_redis_points(args: argparse.Namespace, storage: StoreConfig, partition_counts: Sequence[object]) -> None:
    """--flush-redis only on Redis, and needed there by runs of several partition counts: the runs
    reuse each protocol's database, which keeps the partition count of its first cluster
    (cornus.runtime.cluster_record), so a later run's nodes would refuse it."""
    if args.flush_redis and storage.backend != "redis":
        raise ValidationError("--flush-redis is for --backend redis")
    if storage.backend == "redis" and not args.flush_redis and len(set(partition_counts)) > 1:
        raise ValidationError("--sweep nodes over Redis changes the partition count at each point, and a database "
                              "keeps its first one: add --flush-redis (empties the run's databases before each point)")


def _add_keep_storage_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--keep-storage", action="store_true",
                        help="with --backend azure_blob or dynamodb: keep the container or table each run creates "
                             "(<name>-<protocol><point>); by default it is deleted when the run ends, and one that "
                             "existed before the run is always kept")


def _add_local_cluster_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of the commands that start their own local cluster over the chosen storage."""
    parser.add_argument("--backend", choices=BACKENDS, help="storage backend (default: emulator)")
    parser.add_argument("--set", action="append", metavar="NAME=VALUE",
                        help="a timeout or limit for every node (repeatable)")
    _add_storage_flags(parser)


def _store_config(args: argparse.Namespace, backend: str) -> StoreConfig:
    overrides = {
        name: getattr(args, name, None)
        for name in ("timeout_ms_call", "emulator_path", "redis_url", "redis_durability", "azure_connection_string",
                     "azure_container", "dynamodb_table", "dynamodb_endpoint", "dynamodb_region", "latency")
    }
    return StoreConfig.from_env(backend=backend, **overrides)


def _storage_bench(args: argparse.Namespace) -> int:
    from loadtests.bench.storage import CONCURRENCY_MAX, OPS_MAX, format_results, run_storage_bench

    if not 0 < args.ops <= OPS_MAX:
        raise ValidationError(f"--ops must be in 1..{OPS_MAX}")
    if not 0 < args.concurrency <= CONCURRENCY_MAX:
        raise ValidationError(f"--concurrency must be in 1..{CONCURRENCY_MAX}")
    backends = list(BACKENDS) if "all" in args.backend else list(dict.fromkeys(args.backend))
    configs = [_store_config(args, backend) for backend in backends]
    if configs[0].latency:  # validate before any backend is touched
        from storage_adapters.latency import parse_latency

        parse_latency(configs[0].latency)
    print(f"log_once: {args.ops} fresh records per run, 1 and {args.concurrency} concurrent callers", flush=True)
    results = asyncio.run(run_storage_bench(configs, args.ops, args.concurrency))
    print(format_results(results))
    return 0


# === storage-backfill-finished-index =============================================================

BACKFILL_COMMAND = "storage-backfill-finished-index"
# Record keys walked between two progress lines of a long run: each names the cursor to resume from.
BACKFILL_PROGRESS_KEY_COUNT = 100_000


def _backfill_backend(args: argparse.Namespace) -> str:
    """--backend; else redis where --redis-url is given; else CORNUS_STORAGE_BACKEND; else redis:
    the command exists for Redis alone, which is its default (the others' is the emulator)."""
    if args.backend:
        return str(args.backend)
    if args.redis_url:
        return "redis"
    return str(env_values(os.environ).get("backend", "redis"))


def _storage_backfill_finished_index(args: argparse.Namespace) -> int:
    from storage_adapters import redis_store

    backend = _backfill_backend(args)
    if backend != "redis":
        raise ValidationError(f"{BACKFILL_COMMAND} serves only the redis backend: {backend} needs no backfill (its "
                              "finished scan reads the records themselves; docs/sweeper-design.md)")
    # Every check before the store opens: opening writes the store's mark where there is none.
    storage = _store_config(args, backend)
    redis_store.validate_url(storage.redis_url)
    if args.key_count_max is None:
        args.key_count_max = redis_store.BACKFILL_KEY_COUNT_DEFAULT
    if args.scan_count is None:
        args.scan_count = redis_store.BACKFILL_SCAN_COUNT_DEFAULT
    redis_store.validate_backfill(args.cursor, args.key_count_max, args.scan_count)
    import redis.exceptions

    last = [redis_store.FinishedBackfill(resume_cursor=args.cursor)]
    try:
        report = asyncio.run(_backfill(storage, args, last))
    except KeyboardInterrupt:
        print(f"cornus: {BACKFILL_COMMAND} stopped by SIGINT after {last[0].walked} keys; run it again with "
              f"--cursor {last[0].resume_cursor or 0} to go on", file=sys.stderr, flush=True)
        return EXIT_CODE_SIGNAL_BASE + signal.SIGINT
    except redis.exceptions.RedisError as error:
        # What the store has no contract error for, e.g. a database the server does not have, or
        # a server older than SCAN's TYPE (6.0): one line all the same.
        return _run_failed(BACKFILL_COMMAND, error)
    verb = "would index" if args.dry_run else "indexed"
    print(f"keys walked: {report.walked}\n{verb}: {report.indexed}\nalready indexed: {report.already_indexed}\n"
          f"skipped, not finished: {report.unfinished}\nskipped, tombstone: {report.tombstones}\n"
          f"skipped, other: {report.other}")
    if report.resume_cursor is None:
        print("the walk reached the end of the keyspace")
    else:
        print(f"stopped at --key-count-max {args.key_count_max}: run again with --cursor {report.resume_cursor} "
              "to go on")
    return 0


async def _backfill(storage: StoreConfig, args: argparse.Namespace, last: list[FinishedBackfill]) -> FinishedBackfill:
    """The run, `last` kept at its counts after each batch (what an interrupted run reports)."""
    from storage_adapters.factory import open_store
    from storage_adapters.redis_store import RedisStore

    # No injected latency: it is a benchmark's setting, and this is no benchmark.
    store = await open_store(dataclasses.replace(storage, latency=""))
    assert isinstance(store, RedisStore), type(store)
    print(f"backfill of the finished index on redis {store.where}"
          + (" (dry run: nothing is written)" if args.dry_run else ""), flush=True)
    progress_at = [BACKFILL_PROGRESS_KEY_COUNT]

    def progress(report: FinishedBackfill) -> None:
        last[0] = report
        if report.resume_cursor is not None and report.walked >= progress_at[0]:
            progress_at[0] = report.walked + BACKFILL_PROGRESS_KEY_COUNT
            print(f"... {report.walked} keys walked, {report.indexed} indexed; to resume: --cursor "
                  f"{report.resume_cursor}", flush=True)

    try:
        report = await store.backfill_finished_index(
            cursor=args.cursor, key_count_max=args.key_count_max, scan_count=args.scan_count,
            dry_run=args.dry_run, on_batch=progress,
        )
    finally:
        await store.close()
    return report


def _serve(args: argparse.Namespace) -> int:
    import logging

    from cornus.runtime.config import load_node_config
    from services.serve import run

    config = load_node_config(args.config, overrides=_serve_overrides(args))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    run(config)
    return 0


def _serve_overrides(args: argparse.Namespace) -> dict[str, object]:
    """The settings `cornus serve`'s flags give, over its file and environment."""
    overrides: dict[str, object] = {
        "node_id": args.node_id, "cluster_id": args.cluster_id, "listen": args.listen, "api_listen": args.api_listen,
        "grpc_api_listen": args.grpc_api_listen, "peers": args.peers,
        "partition_count": args.partition_count, "protocol": args.protocol, "lock_policy": args.lock_policy,
        "peer_tls_cert_file": args.peer_tls_cert_file, "peer_tls_key_file": args.peer_tls_key_file,
        "peer_tls_ca_file": args.peer_tls_ca_file, "peer_tls_verify_hostname": args.peer_tls_verify_hostname,
    }
    for name in ("timeout_ms_call", "emulator_path", "redis_url", "redis_durability", "azure_connection_string",
                 "azure_container", "dynamodb_table", "dynamodb_endpoint", "dynamodb_region", "latency",
                 "backend"):
        overrides[f"storage_{name}"] = getattr(args, name, None)
    for item in args.set or []:
        name, sep, value = item.partition("=")
        if not sep:
            raise ValidationError(f"--set {item!r}: expected NAME=VALUE, e.g. timeout_ms_prepare=400")
        overrides[name.strip()] = value.strip()
    return overrides


# === healthcheck =================================================================================

# The image's node is its container's first process: the Dockerfile starts no init before it.
HEALTHCHECK_PID_DEFAULT = 1
# Below the Dockerfile HEALTHCHECK's --timeout (3 s), which also counts this command's start.
HEALTHCHECK_TIMEOUT_S = 2.0
# Docker's verdicts: 0 healthy, 1 unhealthy (it reserves 2, which main() gives bad input).
EXIT_CODE_HEALTHY = 0
EXIT_CODE_UNHEALTHY = 1


def _serve_process_config(pid: int) -> NodeConfig:
    """The configuration a running `cornus serve` (process `pid`) built, rebuilt as it did: from
    its command line, its environment and, for a relative --config, its working directory.
    ValidationError when it is none, or is gone."""
    from cornus.runtime.config import load_node_config

    proc = Path("/proc") / str(pid)
    try:
        argv = [os.fsdecode(item) for item in (proc / "cmdline").read_bytes().split(b"\0")[:-1]]
        if "serve" not in argv:
            # An init before the node (`docker run --init`): the node is its child.
            for child in (proc / "task" / str(pid) / "children").read_text().split():
                with contextlib.suppress(ValidationError):
                    return _serve_process_config(int(child))
            raise ValidationError(f"process {pid} is not `cornus serve`, nor is a child of it: {' '.join(argv)[:200]}")
        environ_items = (proc / "environ").read_bytes().split(b"\0")
        cwd = Path(os.readlink(proc / "cwd"))
    except OSError as error:
        raise ValidationError(f"process {pid}: {error.strerror or error}") from None
    # The interpreter and script (or -m services.cli) come first; the subcommand starts the rest.
    args = build_parser().parse_args(argv[argv.index("serve"):])
    environ = {}
    for item in environ_items:
        name, sep, value = os.fsdecode(item).partition("=")
        if sep:
            environ[name] = value
    path = None if args.config is None else cwd / args.config
    return load_node_config(path, environ=environ, overrides=_serve_overrides(args))


def _healthcheck_url(api_listen: str) -> str:
    """Where this machine reaches a REST API listening at `api_listen`: on loopback when it
    listens on every address."""
    host, _, port = api_listen.rpartition(":")
    host = host.strip("[]")
    host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/healthz"


def _healthcheck(args: argparse.Namespace) -> int:
    try:
        config = _serve_process_config(args.pid)
    except ValidationError as error:
        print(f"cornus healthcheck: {error}", file=sys.stderr)
        return EXIT_CODE_UNHEALTHY
    except SystemExit:
        # The node's own command line no longer parses (a `cornus` of another version): argparse
        # exits 2, which Docker reserves.
        return EXIT_CODE_UNHEALTHY
    if not config.api_listen:
        print(f"cornus healthcheck: process {args.pid} has no REST API (api_listen)", file=sys.stderr)
        return EXIT_CODE_UNHEALTHY
    url = _healthcheck_url(config.api_listen)
    try:
        response = httpx.get(url, timeout=args.timeout_s)
    except httpx.HTTPError as error:
        print(f"cornus healthcheck: {url}: {type(error).__name__}: {error}", file=sys.stderr)
        return EXIT_CODE_UNHEALTHY
    if response.status_code != httpx.codes.OK:
        print(f"cornus healthcheck: {url}: HTTP {response.status_code}", file=sys.stderr)
        return EXIT_CODE_UNHEALTHY
    return EXIT_CODE_HEALTHY


# === client commands: txn, inspect, resolve ======================================================

_OP_SYNTAX = "put:KEY=VALUE, get:KEY, delete:KEY, check:KEY=VALUE or check:KEY (the key must be absent)"


def parse_op(text: str) -> Op:
    """One OP argument of `cornus txn`. The kind ends at the first ':' and the key at the first '=',
    so values may hold both; keys may hold ':' but not '='."""
    kind, sep, rest = text.partition(":")
    if not sep or kind not in ("put", "get", "delete", "check"):
        raise ValidationError(f"operation {text!r}: expected {_OP_SYNTAX}")
    key, has_value, value = rest.partition("=")
    if not key:
        raise ValidationError(f"operation {text!r}: the key is empty")
    if kind == "put":
        if not has_value:
            raise ValidationError(f"operation {text!r}: put needs a value, put:KEY=VALUE")
        return Op.put(key, value)
    if kind == "check":
        return Op.check(key, value if has_value else None)
    if has_value:
        raise ValidationError(f"operation {text!r}: {kind} takes no value, {kind}:KEY")
    return Op.get(key) if kind == "get" else Op.delete(key)


def _client_config(args: argparse.Namespace) -> ClientConfig:
    try:
        return ClientConfig(timeout_ms_request=args.timeout_ms_request, retry_count_max=args.retry_count_max)
    except ValueError as error:
        raise ValidationError(str(error)) from error


def _print_outcome(outcome: Outcome, as_json: bool) -> None:
    if as_json:
        print(json.dumps(outcome.to_json(), indent=2, sort_keys=True))
        return
    headline = outcome.status.value
    if outcome.reason:
        headline += f": {outcome.reason} ({'retryable' if outcome.retryable else 'not retryable'})"
    elif outcome.retryable:
        headline += " (retryable)"
    print(f"{headline}  txn {outcome.txn or '-'}  via {outcome.node_url or '-'}  attempts {outcome.attempt_count}")
    if outcome.detail:
        print(f"  detail: {outcome.detail}")
    for key, value in outcome.reads.items():
        print(f"  {key} = {'(absent)' if value is None else json.dumps(value)}")
    for key, data in outcome.binary_reads.items():
        # Not text (written through gRPC): its exact bytes, never a lossy decoding of them.
        print(f"  {key} = (not UTF-8, {len(data)} bytes, base64) {base64.b64encode(data).decode('ascii')}")
    if outcome.timing_ms:
        print("  timing_ms: " + ", ".join(f"{name}={ms:.2f}" for name, ms in outcome.timing_ms.items()))


# `cornus txn`'s exit status when the outcome is unknown: a script must not take it for an abort
# and run the transaction again, which an exit status of 1 invited (found by audit).
EXIT_CODE_UNKNOWN = 3


def _txn(args: argparse.Namespace) -> int:
    # Everything is checked before the first request, so bad input changes nothing.
    ops = [parse_op(text) for text in args.ops]
    with CornusClient(args.url, config=_client_config(args)) as client:
        outcome = client.execute(ops, args.protocol)
    _print_outcome(outcome, args.json)
    if outcome.status is Status.UNKNOWN:
        return EXIT_CODE_UNKNOWN
    return 0 if outcome.committed else 1


def _inspect_urls(args: argparse.Namespace) -> list[str]:
    urls = [args.url] if args.url else []
    if args.all_nodes:
        urls += [url for url in args.all_nodes.split(",") if url.strip()]
    if not urls:
        raise ValidationError("give --url URL or --all-nodes URL,URL,...")
    return list(normalize_urls(urls))


def _admin_token() -> str | None:
    """The token the admin endpoints and the partition listing ask for where a node has one (its
    admin_token): from the environment only, since a command line is visible to every user of the
    machine."""
    return os.environ.get("CORNUS_ADMIN_TOKEN") or None


def _inspect(args: argparse.Namespace) -> int:
    urls = _inspect_urls(args)
    with CornusClient(urls, config=_client_config(args), admin_token=_admin_token()) as client:
        if args.txn:
            try:
                outcome = client.status(args.txn, urls[0] if len(urls) == 1 else None)
            except NotFound as error:
                print(f"cornus: {error.detail}", file=sys.stderr)
                return 1
            _print_outcome(outcome, args.json)
            return 0
        rows: list[TxnInfo] = []
        unreachable: list[str] = []
        for url in urls:
            try:
                rows.extend(client.transactions(url))
            except CornusError as error:
                # One dead node must not hide what the others hold: that is when in-doubt
                # transactions matter most.
                unreachable.append(url)
                print(f"cornus: {url}: {error}", file=sys.stderr)
    if args.json:
        print(json.dumps([dataclasses.asdict(row) for row in rows], indent=2))
    elif rows:
        print(format_table(
            ["NODE", "TXN", "ROLE", "WHERE", "PHASE", "PROTOCOL", "PARTITIONS", "IDLE_MS", "IN_DOUBT"],
            [[row.node_url, row.txn, row.role, row.where, row.phase, row.protocol, ",".join(row.partitions),
              str(row.idle_ms), "yes" if row.in_doubt else "no"] for row in rows],
        ))
    else:
        print(f"no in-flight or in-doubt transactions on {len(urls) - len(unreachable)} of {len(urls)} node(s)")
    return 1 if unreachable else 0


def _resolve(args: argparse.Namespace) -> int:
    with CornusClient(args.url, config=_client_config(args), admin_token=_admin_token()) as client:
        outcome = client.resolve(args.txn, args.url, force=args.force)
    _print_outcome(outcome, args.json)
    return 0 if outcome.status in (Status.COMMITTED, Status.ABORTED) else 1


def _partition_rows(rows: Sequence[PartitionInfo]) -> str:
    return format_table(
        ["PARTITION", "OWNER", "EPOCH", "LEASE_MS", "WANTED_BY", "PREFERRED", "PLACED"],
        [[row.partition, row.owner or ("(released)" if row.epoch else "(never taken)"), str(row.epoch),
          str(row.lease_ms), row.wanted_by or "-", row.preferred, "yes" if row.placed else "no"] for row in rows],
    )


def _partitions(args: argparse.Namespace) -> int:
    with CornusClient(args.url, config=_client_config(args), admin_token=_admin_token()) as client:
        rows = client.partitions(args.url)
    if args.json:
        print(json.dumps([dataclasses.asdict(row) for row in rows], indent=2))
    else:
        print(_partition_rows(rows))
    return 0


# Seconds between two looks at the partitions while waiting for placement, and the longest wait.
REBALANCE_POLL_S = 0.5
REBALANCE_TIMEOUT_S_MAX = 3600.0


def _rebalance(args: argparse.Namespace) -> int:
    """Wait for placement: the preferred nodes ask for their partitions, the holders drain and
    release them, and the preferred nodes take them; this only watches, and reports."""
    if not 0 < args.timeout_s <= REBALANCE_TIMEOUT_S_MAX:
        raise ValidationError(f"--timeout-s must be in (0, {REBALANCE_TIMEOUT_S_MAX}]")
    if args.expect_peers is not None or args.member_urls is not None:
        if args.expect_peers is None or args.member_urls is None:
            raise ValidationError("--expect-peers and --member-urls go together: the node set, and where each "
                                  "of its nodes answers")
        if args.url is not None:
            raise ValidationError("give either --url (trust that node's peer list) or --expect-peers with "
                                  "--member-urls, not both")
        expected, member_urls = _expected_membership(args.expect_peers, args.member_urls)
        return asyncio.run(_rebalance_expected(args, expected, member_urls))
    if args.url is None:
        raise ValidationError("give --url, or --expect-peers with --member-urls")
    deadline = time.monotonic() + args.timeout_s
    moving: list[str] = []
    with CornusClient(args.url, config=_client_config(args), admin_token=_admin_token()) as client:
        while True:
            rows = client.partitions(args.url)
            unplaced = [row for row in rows if not row.placed]
            now_moving = [f"{row.partition} {row.owner or '-'}->{row.preferred}" for row in unplaced]
            if now_moving != moving:
                moving = now_moving
                print(f"{len(rows) - len(unplaced)} of {len(rows)} partitions placed"
                      + (f"; moving: {', '.join(moving)}" if moving else ""), flush=True)
            if not unplaced:
                return 0
            if time.monotonic() >= deadline:
                print(f"cornus: not placed within {args.timeout_s} s:\n{_partition_rows(unplaced)}", file=sys.stderr)
                return 1
            time.sleep(REBALANCE_POLL_S)


def _expected_membership(raw_peers: str, raw_urls: str) -> tuple[dict[str, str], dict[str, str]]:
    """--expect-peers (CORNUS_PEERS's form, checked as a node checks its own) and --member-urls
    (NODE=URL for the same nodes)."""
    from cornus.runtime.config import parse_peers

    expected = parse_peers(raw_peers)
    member_urls: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in raw_urls.split(","))):
        node, sep, url = item.partition("=")
        if not sep:
            raise ValidationError(f"--member-urls entry {item!r} must be NODE=URL")
        if node.strip() in member_urls:
            raise ValidationError(f"--member-urls names {node.strip()} more than once")
        member_urls[node.strip()] = normalize_url(url.strip())
    if set(member_urls) != set(expected):
        raise ValidationError(
            f"--member-urls must name exactly the nodes of --expect-peers; missing: "
            f"{', '.join(sorted(set(expected) - set(member_urls))) or '-'}, unknown: "
            f"{', '.join(sorted(set(member_urls) - set(expected))) or '-'}"
        )
    return expected, member_urls


@dataclasses.dataclass(frozen=True, slots=True)
class _Placement:
    """What stands between a node set and its placement: nodes that do not answer or that run with
    another configuration, and partitions not yet served by their preferred node among the set."""

    waiting: list[str]
    unplaced: list[tuple[str, str, str]]  # (partition, owner as storage says, preferred)
    partition_count: int

    @property
    def done(self) -> bool:
        return self.partition_count > 0 and not self.waiting and not self.unplaced


def _placement(expected: dict[str, str], answers: dict[str, PartitionListing | str]) -> _Placement:
    """Judge placement from every expected node's own answer (a listing, or why it gave none): each
    must run with exactly `expected` as its peers, and each partition must be held, and served, by
    the preferred owner that the nodes' own placement rule gives among `expected`."""
    from cornus.protocol.ownership import placement

    waiting: list[str] = []
    agreed: dict[str, PartitionListing] = {}
    for node in sorted(expected):
        answer = answers[node]
        if isinstance(answer, str):
            waiting.append(f"{node}: no answer ({answer})")
        elif answer.node != node:
            waiting.append(f"{node}: {answer.node_url} answers as node {answer.node!r}")
        elif answer.peers != expected:
            if set(answer.peers) != set(expected):
                waiting.append(f"{node}: runs with the node set {','.join(sorted(answer.peers))}, "
                               f"not {','.join(sorted(expected))}")
            else:
                waiting.append(f"{node}: runs with other peer addresses ({_peer_text(answer.peers)})")
        else:
            agreed[node] = answer
    if not agreed:
        return _Placement(waiting, [], 0)
    first = agreed[min(agreed)]
    partitions = [row.partition for row in first.partitions]
    for node, listing in sorted(agreed.items()):
        if [row.partition for row in listing.partitions] != partitions:
            waiting.append(f"{node}: has {len(listing.partitions)} partitions, {first.node} has {len(partitions)}")
            del agreed[node]
        elif listing.partition_owners != first.partition_owners:
            waiting.append(f"{node}: prefers other owners (partition_owners) than {first.node}")
            del agreed[node]
    unplaced: list[tuple[str, str, str]] = []
    placed = placement(partitions, expected, first.partition_owners)
    for index, partition in enumerate(partitions):
        preferred = placed[partition]
        holder = agreed.get(preferred)
        # The preferred node's own answer says whether it serves the partition (took the lease and
        # recovered its log); without that answer, the record of any node tells who holds it.
        row = (holder or first).partitions[index]
        if row.owner != preferred or holder is None or not row.served_here:
            unplaced.append((partition, row.owner, preferred))
    return _Placement(waiting, unplaced, len(partitions))


def _progress_text(state: _Placement, node_count: int) -> str:
    moving = [f"{partition} {owner or '-'}->{preferred}" for partition, owner, preferred in state.unplaced]
    lines = [f"{node_count - len(state.waiting)} of {node_count} nodes run the expected node set; "
             f"{state.partition_count - len(state.unplaced)} of {state.partition_count or '?'} partitions placed"]
    lines += [f"  waiting for {line}" for line in state.waiting]
    if moving:
        lines.append(f"  moving: {', '.join(moving)}")
    return "\n".join(lines)


def _peer_text(peers: dict[str, str]) -> str:
    return ",".join(f"{node}={address}" for node, address in sorted(peers.items()))


async def _rebalance_expected(args: argparse.Namespace, expected: dict[str, str], member_urls: dict[str, str]) -> int:
    """Wait until every node of `expected` answers with that node set and every partition is served
    by its preferred node among them; report progress, and at the timeout everything missing."""
    deadline = time.monotonic() + args.timeout_s
    shown: tuple[list[str], list[tuple[str, str, str]]] | None = None
    async with AsyncCornusClient(list(member_urls.values()), config=_client_config(args),
                                 admin_token=_admin_token()) as client:

        async def ask(url: str) -> PartitionListing | str:
            try:
                # A bound on the whole request: the client's deadline is per phase (connect, read),
                # and a node that trickles its answer must not stretch a round past it.
                async with asyncio.timeout(args.timeout_ms_request / 1000):
                    return await client.partition_listing(url)
            except TimeoutError:
                return f"no answer within {args.timeout_ms_request} ms"
            except TransactionFailed as error:
                # Unreachable: its detail names the URL and the cause (no transaction is involved).
                return error.outcome.detail
            except CornusError as error:
                return str(error)

        while True:
            # Every node at once: a round takes one request deadline at most, whoever is down.
            answers = await asyncio.gather(*(ask(url) for url in member_urls.values()))
            state = _placement(expected, dict(zip(member_urls, answers, strict=True)))
            if (state.waiting, state.unplaced) != shown:
                shown = (state.waiting, state.unplaced)
                print(_progress_text(state, len(expected)), flush=True)
            if state.done:
                return 0
            if time.monotonic() >= deadline:
                lines = [f"cornus: not placed within {args.timeout_s:g} s among {','.join(sorted(expected))}:"]
                lines += [f"  node {line}" for line in state.waiting]
                if state.unplaced:
                    lines.append(format_table(["PARTITION", "OWNER", "PREFERRED"],
                                              [[p, o or "(none)", w] for p, o, w in state.unplaced]))
                elif not state.partition_count:
                    lines.append("  no node answered with the expected node set, so no partition can be judged")
                print("\n".join(lines), file=sys.stderr)
                return 1
            await asyncio.sleep(REBALANCE_POLL_S)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    assert all(len(row) == len(headers) for row in rows)
    widths = [max(len(cell) for cell in column) for column in zip(headers, *rows, strict=True)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
             for row in [headers, *rows]]
    return "\n".join(lines)


# === cluster up ===================================================================================


def _cluster_up(args: argparse.Namespace) -> int:
    from cornus.runtime.config import NODE_COUNT_MAX, PARTITION_COUNT_MAX, load_node_config

    if not 0 < args.nodes <= NODE_COUNT_MAX:
        raise ValidationError(f"--nodes must be in 1..{NODE_COUNT_MAX}")
    if not 0 < args.partitions <= PARTITION_COUNT_MAX:
        raise ValidationError(f"--partitions must be in 1..{PARTITION_COUNT_MAX}")
    if args.partitions < args.nodes:
        raise ValidationError(f"--partitions ({args.partitions}) must be at least --nodes ({args.nodes}), "
                              "or some nodes would own nothing")
    if not 0 < args.timeout_s_ready <= 3600:
        raise ValidationError("--timeout-s-ready must be in (0, 3600]")

    def configs() -> tuple[list[tuple[NodeConfig, int, int]], str]:
        """Each node's config on ports of its own, with its REST and peer ports, and the peers
        list: built and checked here, so a bad flag fails before anything is made or started."""
        ports = cluster_ports(args.nodes, args.base_port)
        peers = ",".join(f"n{i}=127.0.0.1:{peer}" for i, (_, peer, _) in enumerate(ports))
        return [(load_node_config(environ={}, overrides={
            "node_id": f"n{i}", "api_listen": f"127.0.0.1:{api}", "grpc_api_listen": f"127.0.0.1:{public}",
            "peers": peers, "protocol": args.protocol, "partition_count": args.partitions, **_set_overrides(args.set),
        }), api, peer) for i, (api, peer, public) in enumerate(ports)], peers

    def members(picked: list[tuple[NodeConfig, int, int]]) -> list[ClusterNode]:
        return [ClusterNode(config, api, peer, data_dir / f"{config.node_id}.log") for config, api, peer in picked]

    picked, peers = configs()
    made_data_dir = args.data_dir is None
    data_dir = Path(tempfile.mkdtemp(prefix="cornus-cluster-")) if made_data_dir else Path(args.data_dir)
    nodes = members(picked)
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ValidationError(f"--data-dir {data_dir}: {error.strerror}") from None
    db_path = data_dir / "cornus.db"

    stop = StopSignals()
    stop.install()
    failed = False
    try:
        for pick in range(1, PORT_PICK_COUNT_MAX + 1):
            for node in nodes:
                start_node(node, peers, ["--backend", "emulator", "--emulator-path", str(db_path)], args.set or [])
            failed = not wait_cluster_ready(nodes, stop, args.timeout_s_ready)
            # Ports the kernel picked are probed free and let go; another local cluster may bind one
            # before this node does (found by the suite, 2026-11-28: a parallel worker's cluster
            # took a REST port): start again on other ports, as cornus bench does. Ports the caller
            # chose (--base-port) are refused instead.
            retry = failed and args.base_port is None and not stop.event.is_set() and port_was_taken(nodes)
            if not retry or pick == PORT_PICK_COUNT_MAX:
                break
            stop_nodes(nodes, stop)
            picked, peers = configs()
            nodes = members(picked)
            print(f"cornus: a port was taken before its node bound it; starting again on other ports "
                  f"(pick {pick + 1} of {PORT_PICK_COUNT_MAX})", file=sys.stderr, flush=True)
        if not failed and not stop.event.is_set():
            _print_cluster(nodes, args, db_path)
            while not stop.event.wait(CLUSTER_POLL_S):
                dead = dead_node(nodes)
                if dead is not None:
                    report_dead(dead)
                    failed = True
                    break
    finally:
        if stop.event.is_set() and not failed:
            print(f"cornus: {stop.last}: stopping {len(nodes)} nodes", flush=True)
        clean = stop_nodes(nodes, stop)
        for node in nodes:
            if node.process is not None:
                print(f"cornus: node {node.config.node_id} (pid {node.process.pid}) stopped, "
                      f"exit code {node.process.returncode}", flush=True)
        if made_data_dir and not failed:
            shutil.rmtree(data_dir, ignore_errors=True)
        elif failed:
            print(f"cornus: data and node logs kept in {data_dir}", file=sys.stderr, flush=True)
    if failed:
        return 1
    print("cornus: cluster stopped" + ("" if clean else " (some nodes had to be killed)"), flush=True)
    return 0


def _set_overrides(items: Sequence[str] | None) -> dict[str, str]:
    from cornus.runtime.config import timeout_names_all

    # load_node_config files a name it does not know as a plain setting and ignores it, so a typo
    # would start a cluster without the intended limit: only the timeouts and limits a node takes
    # pass here, the two that are the storage's own excepted (found by audit: the ownership
    # timings were refused, and those two offered).
    known = timeout_names_all() - {"storage_deadline_ms", "late_write_window_ms"}
    overrides: dict[str, str] = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep:
            raise ValidationError(f"--set {item!r}: expected NAME=VALUE, e.g. timeout_ms_prepare=400")
        if name.strip() not in known:
            raise ValidationError(f"--set {item!r}: {name.strip()!r} is not one of {', '.join(sorted(known))}")
        overrides[name.strip()] = value.strip()
    return overrides


def _print_cluster(nodes: Sequence[ClusterNode], args: argparse.Namespace, db_path: Path) -> None:
    rows = []
    for node in nodes:
        assert node.process is not None
        rows.append([node.config.node_id, node.url, node.config.grpc_api_listen, node.config.listen,
                     ",".join(node.config.preferred_partitions), "yes", str(node.process.pid)])
    print(f"Cornus cluster up: {len(nodes)} nodes, {args.partitions} partitions, protocol {args.protocol}, "
          f"emulator storage {db_path}")
    print(format_table(["NODE", "REST URL", "PUBLIC gRPC", "PEER TCP", "PARTITIONS", "READY", "PID"], rows))
    print(f"logs: {db_path.parent}/<node>.log")
    print(f"try:  cornus txn --url {nodes[0].url} put:greeting=hello get:greeting")
    print("Ctrl-C or SIGTERM stops the cluster.", flush=True)


def _add_client_flags(parser: argparse.ArgumentParser) -> None:
    defaults = ClientConfig()
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.add_argument("--timeout-ms-request", type=int, default=defaults.timeout_ms_request,
                        help=f"deadline of each HTTP request (default {defaults.timeout_ms_request})")
    parser.add_argument("--retry-count-max", type=int, default=defaults.retry_count_max,
                        help=f"retries of a retryable outcome (default {defaults.retry_count_max})")


def _bench_storage(args: argparse.Namespace) -> tuple[StoreConfig, str]:
    """The storage the bench's nodes use, without its latency; and the latency as given (a profile
    such as azure-blob, or a spec), checked here, before any node starts."""
    from loadtests.bench.profiles import resolve_latency

    # A profile is no latency spec (StoreConfig refuses it): taken apart, the store built without.
    latency = args.latency if args.latency is not None else os.environ.get("CORNUS_STORAGE_LATENCY", "")
    resolve_latency(latency)
    without = argparse.Namespace(**{**vars(args), "latency": ""})
    storage = _store_config(without, args.backend or StoreConfig.from_env(latency="").backend)
    if args.timeout_ms_call is None and "CORNUS_STORAGE_TIMEOUT_MS_CALL" not in os.environ:
        # A starting node waits out one storage deadline before it serves (a call of its previous
        # life may still land): the production default would add seconds to every run.
        storage = dataclasses.replace(storage, timeout_ms_call=BENCH_TIMEOUT_MS_CALL)
    return storage, latency


# The bench's nodes all run on this machine: a storage deadline of 2 s is far above any call a
# loopback backend with an injected cloud latency takes, and clocks do not drift between them.
BENCH_TIMEOUT_MS_CALL = 2_000
BENCH_NODE_SETTINGS = {"clock_slack_ms": "250"}


def _bench_node_settings(args: argparse.Namespace, storage: StoreConfig) -> list[str]:
    from cornus.protocol.config import gc_grace_ms_min
    from cornus.runtime.config import load_node_config

    settings = {**BENCH_NODE_SETTINGS, **_set_overrides(args.set)}
    if "gc_grace_ms" not in settings and settings["clock_slack_ms"].isascii() and settings["clock_slack_ms"].isdigit():
        # The least grace the rule allows (2 storage deadlines and the slack; the production
        # default is 12 s): garbage collection, which follows each commit after it, then runs
        # inside a run of a few seconds and is measured with it (found by a review: 10 s runs
        # ended before any collection, and counted a quarter fewer storage calls than a steady
        # state makes).
        settings["gc_grace_ms"] = str(gc_grace_ms_min(storage.timeout_ms_call, int(settings["clock_slack_ms"])))
    # The nodes read their settings only once started: a bad value would start nodes that die at
    # once. Checked here as a node checks them (on this storage's deadline), before any start.
    # On the backend the nodes run on: its late window sets some of the rules (found by audit:
    # checked on the emulator's, a keep DynamoDB's nodes refuse passed, and they died at start).
    # A placeholder key where the backend needs one: the check opens nothing.
    load_node_config(environ={}, overrides={
        "node_id": "n0", "peers": "n0=127.0.0.1:1", "partition_count": 1,
        "storage_timeout_ms_call": storage.timeout_ms_call, "storage_backend": storage.backend,
        "storage_azure_connection_string": storage.azure_connection_string or "AccountKey=placeholder",
        **settings,
    })
    return [f"{name}={value}" for name, value in settings.items()]


def _storage_argv(storage: StoreConfig) -> list[str]:
    """The storage flags that hand `storage` on to `cornus serve` children (the connection string
    goes by _storage_environ)."""
    defaults = StoreConfig()
    argv = ["--backend", storage.backend]
    for name in ("timeout_ms_call", "redis_url", "redis_durability", "azure_container", "dynamodb_table",
                 "dynamodb_endpoint", "dynamodb_region", "latency"):
        value = getattr(storage, name)
        if value and value != getattr(defaults, name):
            argv += [f"--{name.replace('_', '-')}", str(value)]
    return argv


def _storage_environ(storage: StoreConfig) -> dict[str, str]:
    """The storage secrets for `cornus serve` children, by environment: any user of the machine can
    read a process's argv (ps), only its owner its environment."""
    if not storage.azure_connection_string:
        return {}
    return {"CORNUS_STORAGE_AZURE_CONNECTION_STRING": storage.azure_connection_string}


def _check_keep_storage(args: argparse.Namespace, storage: StoreConfig) -> None:
    if args.keep_storage and storage.backend not in ("azure_blob", "dynamodb"):
        raise ValidationError("--keep-storage is for --backend azure_blob or dynamodb (the runs' own containers "
                              "or tables); the emulator's files go with the run, Redis keeps its databases")


def _run_failed(command: str, error: Exception) -> int:
    """A run that failed once started (a cluster that did not start, a load phase that did not
    finish, a node that stopped answering): one line instead of a traceback, with where the
    nodes' logs were kept, if they were."""
    notes = "".join(f"; {note}" for note in getattr(error, "__notes__", []))
    print(f"cornus: {command} failed: {str(error) or type(error).__name__}{notes}", file=sys.stderr, flush=True)
    return 1


def _out_dir(args: argparse.Namespace) -> Path:
    from loadtests.bench.sweep import default_out_dir

    out = Path(args.out) if args.out else default_out_dir()
    # The files are written only after the first measurement: a path that cannot be a directory
    # is refused before anything starts. The nearest existing one decides.
    for path in (out, *out.parents):
        if path.exists():
            if not path.is_dir():
                raise ValidationError(f"--out {out}: {path} is not a directory")
            break
    return out


# The shell's convention for a command ended by a signal: it exits 128 plus the signal's number.
EXIT_CODE_SIGNAL_BASE = 128


def _sigterm_like_ctrl_c(command: str) -> Callable[[Callable[[argparse.Namespace], int]],
                                                   Callable[[argparse.Namespace], int]]:
    """A command that starts nodes and storage of its own, made to leave on SIGTERM (a CI job's
    timeout, a supervisor, `kill`) as on Ctrl-C: through its clean-up (its nodes stopped, its
    run's directory and container or table gone), which SIGTERM's default action skips, leaving
    them to a later run that takes the namespace for the user's. Either way it then exits 128
    plus the signal's number, with one line instead of a traceback."""
    def wrap(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        def run(args: argparse.Namespace) -> int:
            received: list[int] = []

            def interrupt(signum: int, frame: object) -> None:
                # Only the first: a repeated SIGTERM must not cut short the clean-up the first one
                # started (its waits are bounded; SIGKILL remains for the impatient).
                if not received:
                    received.append(signum)
                    raise KeyboardInterrupt(signal.Signals(signum).name)

            # Handlers are the main thread's to set (a caller in another thread keeps the default).
            owned = threading.current_thread() is threading.main_thread()
            previous = signal.signal(signal.SIGTERM, interrupt) if owned else None
            try:
                return handler(args)
            except KeyboardInterrupt:
                signum = received[0] if received else signal.SIGINT
                print(f"cornus: {command} stopped by {signal.Signals(signum).name}", file=sys.stderr, flush=True)
                return EXIT_CODE_SIGNAL_BASE + signum
            finally:
                if owned:
                    signal.signal(signal.SIGTERM, previous)
        return run
    return wrap


@_sigterm_like_ctrl_c("termination-bench")
def _termination_bench(args: argparse.Namespace) -> int:
    from loadtests.bench.plots import NO_MATPLOTLIB, matplotlib_missing, plot_termination
    from loadtests.bench.profiles import latency_label, resolve_latency
    from loadtests.bench.sweep import machine_description, write_csv
    from loadtests.bench.termination import (
        NODES_MAX,
        NODES_MIN,
        ROUNDS_MAX,
        format_terminations,
        run_termination_bench,
        sweep_row,
    )

    base, latency = _bench_storage(args)
    storage = dataclasses.replace(base, latency=resolve_latency(latency))
    _check_keep_storage(args, storage)
    node_counts = [args.nodes]
    if args.sweep:
        name, _, raw = args.sweep.partition("=")
        if name.strip() != "nodes" or not raw.strip():
            raise ValidationError(f"--sweep {args.sweep!r}: termination-bench sweeps nodes only, e.g. nodes=3,4,6,8")
        try:
            node_counts = [int(value) for value in raw.split(",") if value.strip()]
        except ValueError:
            raise ValidationError(f"--sweep {args.sweep!r}: node counts must be integers") from None
        if not node_counts:
            raise ValidationError(f"--sweep {args.sweep!r}: no node count, e.g. nodes=3,4,6,8")
    if not 0 < args.rounds <= ROUNDS_MAX:
        raise ValidationError(f"--rounds must be in 1..{ROUNDS_MAX}")
    for count in node_counts:
        if not NODES_MIN <= count <= NODES_MAX:
            raise ValidationError(f"--nodes must be in {NODES_MIN}..{NODES_MAX}, got {count}")
    _check_redis_points(args, storage, node_counts)  # one partition per node
    settings = _bench_node_settings(args, storage)
    out = _out_dir(args) if args.sweep or args.out else None
    summary_rows = []
    for point, count in enumerate(node_counts):
        print(f"cornus termination-bench: {count} nodes, {args.rounds} coordinator kills at coordinator.after_votes, "
              f"storage {storage.backend}, injected latency {latency_label(latency)}", flush=True)
        try:
            rows = run_termination_bench(storage, _storage_argv(storage), nodes=count, rounds=args.rounds,
                                         settings=settings, storage_environ=_storage_environ(storage),
                                         keep_storage=args.keep_storage, flush_redis=args.flush_redis,
                                         run_index=point)
        except (RuntimeError, httpx.HTTPError, subprocess.TimeoutExpired) as error:
            return _run_failed("termination-bench", error)
        print(format_terminations(rows), flush=True)
        summary_rows.append(sweep_row(count, rows))
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        files = [out / "termination.csv"]
        write_csv(summary_rows, files[0], list(summary_rows[0]))
        try:
            files.append(plot_termination(summary_rows, out / "termination.png",
                                          f"Cornus termination after coordinator failure, {storage.backend}, "
                                          f"latency {latency_label(latency)}"))
        except ImportError as error:
            if not matplotlib_missing(error):
                raise
            print(f"cornus termination-bench: {NO_MATPLOTLIB}", file=sys.stderr)
        print(f"{'nodes':>5} {'terminations':>12} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
        for row in summary_rows:
            # No p99 from fewer than 100 runs (loadtests.bench.termination): "-" then, not "nan".
            p99 = "-" if math.isnan(row["p99_ms"]) else f"{row['p99_ms']:.2f}"
            print(f"{row['nodes']:>5} {row['terminations']:>12} {row['p50_ms']:>8.2f} {p99:>8} {row['max_ms']:>8.2f}")
        print(f"machine: {machine_description()}")
        print("files: " + ", ".join(str(path) for path in files))
    return 0


# Workload knob flags of `cornus bench`: flag dest -> knob name (each workload refuses knobs it lacks).
_KNOB_FLAGS = ("theta", "read_fraction", "read_only_perc", "remote_fraction", "requests_per_txn",
               "rows_per_partition", "warehouses", "items", "accounts", "audit_clients", "partitions_per_txn",
               "ops_per_txn")


def _bench_knobs(args: argparse.Namespace) -> dict[str, str]:
    from loadtests.bench.sweep import knob_names

    known = knob_names(args.workload)
    knobs: dict[str, str] = {}
    for name in _KNOB_FLAGS:
        value = getattr(args, name)
        if value is None:
            continue
        if name not in known:
            raise ValidationError(f"--{name.replace('_', '-')} is not a knob of the {args.workload} workload "
                                  f"(its knobs: {', '.join(sorted(known))})")
        knobs[name] = str(value)
    for item in args.knob or []:
        name, sep, value = item.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or name not in known:
            raise ValidationError(f"--knob {item!r}: expected NAME=VALUE with NAME one of {', '.join(sorted(known))}")
        knobs[name] = value.strip()
    return knobs


@_sigterm_like_ctrl_c("bench")
def _bench(args: argparse.Namespace) -> int:
    from loadtests.bench.cluster import RunSettings
    from loadtests.bench.profiles import latency_label
    from loadtests.bench.sweep import (
        BenchPlan,
        command_line,
        parse_sweep,
        print_results,
        run_plan,
        validate_plan,
        write_outputs,
    )

    protocols = [Protocol(p) for p in (args.protocol or [p.value for p in Protocol])]
    storage, latency = _bench_storage(args)
    _check_keep_storage(args, storage)
    knobs = _bench_knobs(args)
    sweep_param, sweep_values = parse_sweep(args.sweep, args.workload) if args.sweep else ("", [])
    partitions = args.partitions if args.partitions is not None else args.nodes
    if sweep_param == "nodes" and args.partitions is not None:
        raise ValidationError("--sweep nodes runs one partition per node; leave --partitions out")
    _check_redis_points(args, storage, sweep_values if sweep_param == "nodes" else [])
    base = RunSettings(
        workload=args.workload, knobs=tuple(sorted(knobs.items())), nodes=args.nodes, partitions=partitions,
        clients=args.clients, seconds=args.seconds, route_to_owner=args.route == "owner",
        lock_policy=args.lock_policy.lower(),
        node_settings=tuple(_bench_node_settings(args, storage)),
    )
    out = _out_dir(args)
    plan = BenchPlan(protocols=protocols, storage=storage, storage_argv=_storage_argv, base=base,
                     storage_environ=_storage_environ(storage), latency=latency, sweep_param=sweep_param,
                     sweep_values=sweep_values, out_dir=out, flush_redis=args.flush_redis,
                     keep_storage=args.keep_storage, keep_logs=args.keep_logs, plots=not args.no_plots,
                     command=command_line(), trials=args.trials)
    validate_plan(plan)  # bad input is refused before the header says what will run
    what = f"sweep {sweep_param} over {', '.join(sweep_values)}" if sweep_param else "one point"
    if args.trials > 1:
        what += f", {args.trials} trials each (the median kept)"
    print(f"cornus bench: {args.workload} {dict(knobs) or '(defaults)'}, {args.nodes} nodes, {partitions} partitions, "
          f"{args.clients} clients, {args.seconds:g} s per run, {', '.join(p.value for p in protocols)}, {what}, "
          f"storage {storage.backend}, injected latency {latency_label(latency)}, lock policy {base.lock_policy}, "
          f"routed to the {args.route} node", flush=True)
    try:
        rows, results = run_plan(plan)
    except (RuntimeError, httpx.HTTPError, subprocess.TimeoutExpired) as error:
        return _run_failed("bench", error)
    print_results(rows, results)
    files = write_outputs(plan, rows, results)
    print("files: " + ", ".join(str(path) for path in files))
    bad = any(result.violations or result.driver.errors for result in results)
    return 1 if bad else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cornus", description="Cornus atomic commit middleware")
    commands = parser.add_subparsers(dest="command", required=True)

    bench = commands.add_parser("storage-bench", help="log_once p50/p99 latency and ops/s per backend")
    bench.add_argument(
        "--backend", action="append", choices=[*BACKENDS, "all"],
        help="backend to measure (repeatable; 'all' for every one); default: CORNUS_STORAGE_BACKEND or emulator",
    )
    bench.add_argument("--ops", type=int, default=2000, help="log_once calls per run (default 2000)")
    bench.add_argument("--concurrency", type=int, default=32, help="concurrent callers of the second run (default 32)")
    _add_storage_flags(bench)
    bench.set_defaults(handler=_storage_bench)

    backfill = commands.add_parser(
        BACKFILL_COMMAND, help="index the Redis records finished before the finished index existed",
        description="Redis only (the other backends need none). Walk the database (SCAN MATCH cxtxn:* TYPE hash, "
                    "Redis 6.0 or later) and add each record that is finished and no tombstone (an ABORT, or a "
                    "COMMIT applied: a coordinator log's ABORTs only) to its log's finished index "
                    "(cxtxn:{<log>}:~finished), which the nodes' scripts keep for what they write since the "
                    "index came, and scripts of an earlier version did not. Each record is read again in the "
                    "script that adds it, so it is safe while nodes run, and to run again. A run stops at "
                    "--key-count-max and says the cursor to resume from. Exit 0 done (or stopped at the bound), "
                    "1 storage unreachable or failing, 2 bad input (nothing opened). On a Redis Cluster, run it "
                    "against each primary.",
    )
    backfill.add_argument("--backend", choices=BACKENDS,
                          help="storage backend (default: redis, or CORNUS_STORAGE_BACKEND without --redis-url); "
                               "any but redis is refused")
    backfill.add_argument("--dry-run", action="store_true", help="count what would be indexed, write nothing")
    backfill.add_argument("--cursor", type=int, default=0,
                          help="SCAN cursor to resume from, as an earlier run printed it (default 0: the start)")
    # Defaults None, the store's applied by the handler: importing the Redis store (and redis-py)
    # to build the parser would slow every command, the image's healthcheck among them. The
    # numbers in the help are the store's (a test checks).
    backfill.add_argument("--key-count-max", type=int,
                          help="stop once this many record keys were walked (default 1,000,000)")
    backfill.add_argument("--scan-count", type=int,
                          help="keys each SCAN looks at, its COUNT (default 1,000, at most 10,000)")
    _add_storage_flags(backfill)
    backfill.set_defaults(handler=_storage_backfill_finished_index)

    serve = commands.add_parser("serve", help="run one node")
    serve.add_argument("--config", help="TOML config file (see cornus/runtime/config.py)")
    serve.add_argument("--node-id", help="this node's id, e.g. n0")
    serve.add_argument("--listen", help="peer transport address host:port (default: this node's peers entry)")
    serve.add_argument("--api-listen", help="REST API address host:port")
    serve.add_argument("--grpc-api-listen", help="public gRPC API address host:port (off when unset)")
    serve.add_argument("--peers", help="every node: n0=host:port,n1=host:port")
    serve.add_argument("--partition-count", type=int, help="number of partitions p0..pN-1")
    serve.add_argument("--cluster-id", help="which deployment this node belongs to (default: cornus); the storage "
                                            "records it with the partition count, and refuses a node set otherwise")
    serve.add_argument("--protocol", help="cornus, 2pc or coordinator-log: the default of transactions naming none")
    serve.add_argument("--lock-policy", help="no_wait (abort on a lock conflict, the default) or wait_die "
                                             "(an older transaction waits for younger holders)")
    serve.add_argument("--backend", choices=BACKENDS, help="storage backend")
    serve.add_argument("--peer-tls-cert-file", help="this node's certificate (PEM): mutual TLS on the peer port, "
                                                    "with --peer-tls-key-file and --peer-tls-ca-file")
    serve.add_argument("--peer-tls-key-file", help="the private key of --peer-tls-cert-file (PEM)")
    serve.add_argument("--peer-tls-ca-file", help="the cluster's CA (PEM): a peer must show a certificate it signed")
    serve.add_argument("--peer-tls-verify-hostname", choices=("true", "false"),
                       help="check that a peer's certificate names the host of its peers entry (default: true)")
    serve.add_argument("--set", action="append", metavar="NAME=VALUE",
                       help="a timeout or limit, e.g. timeout_ms_prepare=400 (repeatable)")
    _add_storage_flags(serve)
    serve.set_defaults(handler=_serve)

    healthcheck = commands.add_parser(
        "healthcheck", help="exit 0 if a running `cornus serve` answers /healthz (the image's HEALTHCHECK)",
        description="Read how the node process was started (its `cornus serve` arguments, its environment, its "
                    "working directory), build its configuration as it did (file, then CORNUS_* variables, then "
                    "flags), and ask its REST API's /healthz, on loopback when it listens on every address. "
                    "Exit 0 healthy, 1 not (or no such node).",
    )
    healthcheck.add_argument("--pid", type=int, default=HEALTHCHECK_PID_DEFAULT,
                             help=f"the node's process id (default {HEALTHCHECK_PID_DEFAULT}: in the image, the node "
                                  "is the container's first process)")
    healthcheck.add_argument("--timeout-s", type=float, default=HEALTHCHECK_TIMEOUT_S,
                             help=f"deadline of the request (default {HEALTHCHECK_TIMEOUT_S:g})")
    healthcheck.set_defaults(handler=_healthcheck)

    protocols = [protocol.value for protocol in Protocol]
    bench_cluster = commands.add_parser(
        "bench", help="compare the commit protocols on a local cluster over your storage (the paper's experiments)",
        description="For each protocol (and each point of --sweep): start a local cluster of `cornus serve` "
                    "processes on 127.0.0.1 over the chosen storage, load the workload's data, run it from "
                    "closed-loop clients, check its invariants, and print throughput, the latency of distributed "
                    "transactions (average, p99) and its breakdown (execution, prepare, commit), what each commit "
                    "cost (node and driver CPU, storage calls, peer messages), and the 2PC/Cornus and "
                    "coordinator-log/Cornus ratios. Writes results.csv, latency.png, breakdown.png, throughput.png "
                    "and summary.md to --out.",
    )
    bench_cluster.add_argument("--workload", choices=("ycsb", "tpcc", "bank", "uniform"), default="ycsb",
                               help="ycsb (the paper's, default), tpcc (NewOrder + Payment), bank (transfers and "
                                    "audits), uniform (every transaction distributed; docs/performance.md's)")
    bench_cluster.add_argument("--protocol", action="append", choices=protocols,
                               help="protocol to run (repeatable; default: all three)")
    bench_cluster.add_argument("--nodes", type=int, default=3, help="node processes (default 3)")
    bench_cluster.add_argument("--partitions", type=int,
                               help="partitions (default: one per node, as in the paper)")
    bench_cluster.add_argument("--seconds", type=float, default=10.0, help="run time per protocol and point "
                                                                          "(default 10; the first tenth, at most 2 s, "
                                                                          "is warm-up, left out of the figures)")
    bench_cluster.add_argument("--clients", type=int, default=8, help="concurrent closed-loop clients (default 8)")
    bench_cluster.add_argument(
        "--route", choices=("owner", "random"), default="owner",
        help="which node coordinates a transaction: the owner of its home partition, as the paper's clients "
             "send each transaction to its home node (default), or any node at random",
    )
    bench_cluster.add_argument("--lock-policy", default="no_wait",
                               choices=("no_wait", "wait_die", "NO_WAIT", "WAIT_DIE"),
                               help="the nodes' lock policy (default no_wait, the paper's)")
    bench_cluster.add_argument("--sweep", metavar="PARAM=V1,V2,...",
                               help="run every protocol at each value of one parameter: nodes, clients, latency, "
                                    "lock_policy, or a workload knob (theta, read_fraction, read_only_perc, "
                                    "warehouses, accounts, ...), e.g. nodes=2,4,6,8")
    bench_cluster.add_argument("--trials", type=int, default=1,
                               help="run each protocol at each point this many times, the protocols alternating, "
                                    "and keep the trial with the median dist avg (the paper kept the median of 5); "
                                    "every trial's figures go to the CSV and the summary (default 1, at most 9)")
    bench_cluster.add_argument("--out", help="directory for results.csv, the plots and summary.md "
                                             "(default bench-results/<date-time>)")
    bench_cluster.add_argument("--no-plots", action="store_true", help="write no PNG plots")
    bench_cluster.add_argument("--keep-logs", action="store_true",
                               help="copy every run's node logs into <out>/logs/<protocol>-<run>/ (by default only a "
                                    "failed run's are kept, in the directory its error names)")
    _add_flush_redis_flag(bench_cluster)
    _add_keep_storage_flag(bench_cluster)
    knobs = bench_cluster.add_argument_group("workload knobs (each belongs to one workload)")
    knobs.add_argument("--theta", type=float, help="ycsb: Zipfian skew in [0, 0.99] (default 0, uniform)")
    knobs.add_argument("--read-fraction", type=float, help="ycsb: probability a request reads (default 0.5)")
    knobs.add_argument("--read-only-perc", type=float,
                       help="ycsb: percentage of transactions that only read (default 0)")
    knobs.add_argument("--remote-fraction", type=float,
                       help="ycsb: probability a request goes to another partition (default 0.05)")
    knobs.add_argument("--requests-per-txn", type=int, help="ycsb: requests per transaction (default 16)")
    knobs.add_argument("--rows-per-partition", type=int, help="ycsb: rows per partition (default 10000)")
    knobs.add_argument("--warehouses", type=int, help="tpcc: warehouses (default: one per partition)")
    knobs.add_argument("--items", type=int, help="tpcc: items (default 1000)")
    knobs.add_argument("--accounts", type=int, help="bank: accounts (default 60)")
    knobs.add_argument("--audit-clients", type=int,
                       help="bank: clients that run audits (read every account) instead of transfers (default 0)")
    knobs.add_argument("--partitions-per-txn", type=int, help="uniform: partitions each transaction writes (default 2)")
    knobs.add_argument("--ops-per-txn", type=int, help="uniform: operations per transaction (default 8)")
    knobs.add_argument("--knob", action="append", metavar="NAME=VALUE",
                       help="any other knob of the workload, e.g. customers=30 or payment_perc=50 (repeatable)")
    _add_local_cluster_flags(bench_cluster)
    bench_cluster.set_defaults(handler=_bench)

    termination = commands.add_parser(
        "termination-bench", help="time Cornus termination after coordinator kills on your storage",
        description="Start a local Cornus cluster (one partition per node) over the chosen storage; ROUNDS times, "
                    "kill the coordinator (kill -9 semantics) once every vote is in, and print how long the "
                    "participants' termination protocol took, per participant node.",
    )
    termination.add_argument("--nodes", type=int, default=3,
                             help="node processes, the coordinator included (default 3)")
    termination.add_argument("--rounds", type=int, default=10, help="coordinator kills (default 10)")
    termination.add_argument("--sweep", metavar="nodes=N1,N2,...",
                             help="run at each node count and plot the time to terminate against it (Figure 8)")
    termination.add_argument("--out", help="directory for termination.csv and termination.png "
                                           "(default bench-results/<date-time>; written with --sweep or --out)")
    _add_flush_redis_flag(termination)
    _add_keep_storage_flag(termination)
    _add_local_cluster_flags(termination)
    termination.set_defaults(handler=_termination_bench)

    cluster = commands.add_parser("cluster", help="a local multi-node cluster")
    cluster_commands = cluster.add_subparsers(dest="cluster_command", required=True)
    up = cluster_commands.add_parser(
        "up", help="start a local cluster on the embedded emulator and stay in the foreground",
        description="Start NODES `cornus serve` processes on 127.0.0.1 sharing one SQLite emulator file, wait "
                    "until all are ready, print their addresses, and run until Ctrl-C or SIGTERM.",
    )
    up.add_argument("--nodes", type=int, default=3, help="node processes (default 3)")
    up.add_argument("--partitions", type=int, default=6, help="partitions p0..pN-1 (default 6)")
    up.add_argument("--protocol", choices=protocols, default=Protocol.CORNUS.value,
                    help="the default of transactions naming none (default cornus)")
    up.add_argument("--base-port", type=int,
                    help="node i serves REST on BASE+i and the peer transport on BASE+NODES+i (default: free ports)")
    up.add_argument("--data-dir", help="directory of the emulator file and node logs (default: a temporary "
                                       "directory, removed on a clean stop)")
    up.add_argument("--timeout-s-ready", type=float, default=CLUSTER_TIMEOUT_S_READY,
                    help=f"how long nodes may take to become ready (default {CLUSTER_TIMEOUT_S_READY:g})")
    up.add_argument("--set", action="append", metavar="NAME=VALUE",
                    help="a timeout or limit for every node, e.g. timeout_ms_prepare=400 (repeatable)")
    up.set_defaults(handler=_cluster_up)

    txn = commands.add_parser(
        "txn", help="run one one-shot transaction",
        description=f"Run OPs as one transaction. OP is {_OP_SYNTAX}. Exit 0 committed, 1 aborted or "
                    f"unavailable, 2 bad input, {EXIT_CODE_UNKNOWN} unknown (it may have committed: ask its status "
                    "before running it again).",
    )
    txn.add_argument("--url", required=True, help="a node's REST URL, e.g. http://127.0.0.1:8100")
    txn.add_argument("--protocol", choices=protocols, help="this transaction's protocol (default: the node's)")
    txn.add_argument("ops", nargs="+", metavar="OP", help=_OP_SYNTAX)
    _add_client_flags(txn)
    txn.set_defaults(handler=_txn)

    inspect = commands.add_parser(
        "inspect", help="in-flight and in-doubt transactions, or one transaction's status",
        description="Without TXN: list the in-flight and in-doubt transactions of the node (or of every node "
                    "of --all-nodes). With TXN: its status as the cluster knows it. The listing sends "
                    "CORNUS_ADMIN_TOKEN, which a node with an admin_token asks for.",
    )
    inspect.add_argument("--url", help="a node's REST URL")
    inspect.add_argument("--all-nodes", metavar="URL,URL,...", help="every node's REST URL, comma-separated")
    inspect.add_argument("txn", nargs="?", help="a transaction id")
    _add_client_flags(inspect)
    inspect.set_defaults(handler=_inspect)

    resolve = commands.add_parser(
        "resolve", help="run termination for a transaction by hand",
        description="Ask a node to finish TXN from storage (Cornus: LogOnce(ABORT) on every participant's "
                    "log). Exit 0 when it is committed or aborted, 1 when still unknown or unreachable. Sends "
                    "CORNUS_ADMIN_TOKEN, which a node with an admin_token asks for.",
    )
    resolve.add_argument("--url", required=True, help="a node's REST URL")
    resolve.add_argument("--force", action="store_true",
                         help="resolve a transaction its coordinator's node still runs (refused otherwise): aborts it "
                              "where nothing voted yet")
    resolve.add_argument("txn", help="a transaction id")
    _add_client_flags(resolve)
    resolve.set_defaults(handler=_resolve)

    partitions = commands.add_parser(
        "partitions", help="who owns each partition",
        description="Each partition's ownership record as storage holds it now: owner, epoch (raised by every "
                    "take; it fences the owner's writes), lease, a pending hand-over request (WANTED_BY), and the "
                    "owner the asked node's configuration prefers. Sends CORNUS_ADMIN_TOKEN, which a node with an "
                    "admin_token asks for.",
    )
    partitions.add_argument("--url", required=True, help="a node's REST URL")
    _add_client_flags(partitions)
    partitions.set_defaults(handler=_partitions)

    rebalance = commands.add_parser(
        "rebalance", help="wait until every partition is held by its preferred node",
        description="After the node set or partition_owners changed (and the nodes restarted with it), each "
                    "preferred node asks for its partitions and their holders hand them over: drain, release, "
                    "take, recover. This waits for that to finish and reports what still moves. Exit 0 once "
                    "every partition is placed, 1 at the timeout. With --url it trusts that node's peer list; "
                    "with --expect-peers and --member-urls it asks every node of the given set and waits until "
                    "each runs with exactly that set and every partition is served by its preferred node among "
                    "them (what a deployment should run after a change of the node set). partition_owners is "
                    "not given here: the nodes must agree on it, and a change of it alone is checked only once "
                    "every node runs with it (restart them first). Sends CORNUS_ADMIN_TOKEN, which a node with an "
                    "admin_token asks for.",
    )
    rebalance.add_argument("--url", help="a node's REST URL: placement as that node's configuration sees it")
    rebalance.add_argument("--expect-peers", metavar="NODE=HOST:PORT,...",
                           help="the node set that should be running, as in CORNUS_PEERS")
    rebalance.add_argument("--member-urls", metavar="NODE=URL,...",
                           help="each node's REST URL, for the nodes of --expect-peers")
    rebalance.add_argument("--timeout-s", type=float, default=120.0, help="give up after this long (default 120)")
    _add_client_flags(rebalance)
    rebalance.set_defaults(handler=_rebalance)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "backend", None) is None and args.command == "storage-bench":
        args.backend = [StoreConfig.from_env().backend]
    try:
        return args.handler(args)
    except ValidationError as error:
        parser.exit(2, f"cornus: error: {error}\n")
    except InvalidRequest as error:
        parser.exit(2, f"cornus: error: {error.detail}\n")
    except StorageError as error:
        parser.exit(1, f"cornus: storage error: {error}\n")
    except CornusError as error:
        parser.exit(1, f"cornus: {error}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
