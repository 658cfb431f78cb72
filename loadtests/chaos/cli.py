"""`python -m loadtests.chaos`: parse the flags, run, print the summary table, write the JSON.

Exit codes: 0 every check has 0 violations, 1 a check found violations, 2 the run itself failed
(could not start, a node never became ready, bad flags) or was interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from loadtests.chaos.faults import FAULT_KINDS
from loadtests.chaos.report import format_summary
from loadtests.chaos.runner import BACKENDS, DEFAULT_SETTINGS, RunOptions, run

REPO = Path(__file__).resolve().parents[2]
# Where scripts/services.sh writes the test services' addresses (tests/conftest.py reads the same
# file; importing it would need pytest, which a chaos run does not).
SERVICES_ENV = Path(os.environ.get("CORNUS_SERVICES_DIR", REPO / ".services")) / "env"
# A database of the test server that the suite never uses (it takes 0 and 1 + worker index).
DEFAULT_REDIS_DB = 60


def _services_value(wanted: str) -> str:
    """A value scripts/services.sh wrote to its env file; "" if it never ran."""
    if not SERVICES_ENV.exists():
        return ""
    for line in SERVICES_ENV.read_text().splitlines():
        name, _, value = line.partition("=")
        if name == wanted:
            return value.strip("'")
    return ""


def _default_redis_url() -> str:
    """scripts/services.sh's server, database DEFAULT_REDIS_DB; "" if it never ran."""
    url = _services_value("CORNUS_TEST_REDIS_URL")
    return url.rsplit("/", 1)[0] + f"/{DEFAULT_REDIS_DB}" if url else ""


def _default_azure_connection_string() -> str:
    """CORNUS_CHAOS_AZURE_CONNECTION_STRING (a key is better not typed on a command line, which
    `ps` shows), else scripts/services.sh's Azurite; "" if neither."""
    return (os.environ.get("CORNUS_CHAOS_AZURE_CONNECTION_STRING")
            or _services_value("CORNUS_TEST_AZURE_CONNECTION_STRING"))


def _settings(items: Sequence[str]) -> dict[str, int]:
    values = dict(DEFAULT_SETTINGS)
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not value.strip().lstrip("-").isdigit():
            raise argparse.ArgumentTypeError(f"--set {item!r}: expected NAME=INTEGER, e.g. timeout_ms_prepare=400")
        values[name.strip()] = int(value)
    return values


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.chaos",
        description="Cornus under network and process faults: Toxiproxy between the nodes (and between "
                    "nodes and Redis, Azure Blob or DynamoDB), kill -9 and SIGSTOP, a bank and a register "
                    "workload, then the checks.")
    parser.add_argument("--backend", choices=tuple(BACKENDS), required=True,
                        help="azure: Azure Blob on an emulator such as Azurite; dynamodb: a DynamoDB endpoint such "
                             "as moto; each run in a container or table of its own")
    parser.add_argument("--duration-s", type=float, required=True, help="length of the fault phase")
    parser.add_argument("--seed", type=int, required=True, help="seeds the fault schedule and the workloads")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--protocol", choices=("cornus", "2pc", "coordinator-log", "mixed"), default="cornus",
                        help="mixed: each transaction picks one at random")
    parser.add_argument("--redis-url", default=None,
                        help=f"the real Redis (default: scripts/services.sh's server, database {DEFAULT_REDIS_DB})")
    parser.add_argument("--flush-redis", action="store_true", help="empty that Redis database first")
    parser.add_argument("--azure-connection-string", default=None,
                        help="with an http BlobEndpoint (default: $CORNUS_CHAOS_AZURE_CONNECTION_STRING, else "
                             "scripts/services.sh's Azurite)")
    parser.add_argument("--dynamodb-endpoint", default=None,
                        help="endpoint URL (default: scripts/services.sh's moto server)")
    parser.add_argument("--dynamodb-region", default="us-east-1")
    parser.add_argument("--storage-name", default="",
                        help="azure/dynamodb: the run's container or table, which must not exist yet (default: "
                             "chaos-s<seed>-<UTC time>-<random>)")
    parser.add_argument("--keep-storage", action="store_true",
                        help="azure/dynamodb: leave the run's container or table (default: deleted at the end)")
    parser.add_argument("--json-out", type=Path, help="write the summary as JSON here")
    parser.add_argument("--workdir", type=Path, help="node logs, toxiproxy log, fault log (default: a new temp dir)")
    parser.add_argument("--toxiproxy-bin", default="", help="toxiproxy server binary (default: scripts/toxiproxy.sh)")
    faults = parser.add_argument_group("fault schedule")
    faults.add_argument("--faults", default=",".join(FAULT_KINDS),
                        help=f"comma-separated kinds to draw from (default: all: {','.join(FAULT_KINDS)})")
    faults.add_argument("--fault-count-max", type=int, default=None,
                        help="faults in the schedule at most (default: duration / mean gap + 1)")
    faults.add_argument("--fault-concurrency-max", type=int, default=3, help="faults active at once")
    faults.add_argument("--process-fault-concurrency-max", type=int, default=1, help="kills/pauses active at once")
    faults.add_argument("--fault-gap-s", type=float, default=0.8, help="mean gap between fault starts")
    faults.add_argument("--fault-s-min", type=float, default=0.5, help="length of a network fault, at least")
    faults.add_argument("--fault-s-max", type=float, default=3.0, help="length of a network fault, at most")
    faults.add_argument("--process-fault-s-min", type=float, default=1.0, help="length of a kill or pause, at least")
    faults.add_argument("--process-fault-s-max", type=float, default=12.0,
                        help="length of a kill or pause, at most (beyond lease + failover delay, ~8 s, another "
                             "node takes the partitions)")
    load = parser.add_argument_group("workloads")
    load.add_argument("--bank-clients", type=int, default=4)
    load.add_argument("--accounts-per-partition", type=int, default=2)
    load.add_argument("--register-writers", type=int, default=2)
    load.add_argument("--register-readers", type=int, default=2)
    load.add_argument("--registers-per-partition", type=int, default=1)
    nodes = parser.add_argument_group("nodes and checks")
    nodes.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                       help=f"a node timeout or limit (repeatable); defaults {DEFAULT_SETTINGS}")
    nodes.add_argument("--timeout-ms-call", type=int, default=2_000, help="storage call deadline of the nodes")
    nodes.add_argument("--in-doubt-deadline-s", type=float, default=None,
                       help="override the quiet phase's deadline (default: 2 x the termination timeout)")
    nodes.add_argument("--settle-timeout-s", type=float, default=60.0)
    nodes.add_argument("--audit-interval-s", type=float, default=1.0)
    nodes.add_argument("--require-ownership", action="store_true",
                       help="fail check (e) when no node logged ownership lines")
    parser.add_argument("--quiet", action="store_true", help="no line per fault on stderr")
    return parser


def _raise_interrupt(signum: int, frame: object) -> None:
    # SIGTERM ends the run like Ctrl-C: through the cleanup, which stops every process.
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        redis_url = args.redis_url if args.redis_url is not None else _default_redis_url()
        azure = (args.azure_connection_string if args.azure_connection_string is not None
                 else _default_azure_connection_string())
        dynamodb = (args.dynamodb_endpoint if args.dynamodb_endpoint is not None
                    else _services_value("CORNUS_TEST_DYNAMODB_ENDPOINT"))
        options = RunOptions(
            backend=args.backend, duration_s=args.duration_s, seed=args.seed, nodes=args.nodes,
            partitions=args.partitions, protocol=args.protocol,
            redis_url=redis_url if args.backend == "redis" else "", flush_redis=args.flush_redis,
            azure_connection_string=azure if args.backend == "azure" else "",
            dynamodb_endpoint=dynamodb if args.backend == "dynamodb" else "", dynamodb_region=args.dynamodb_region,
            storage_name=args.storage_name, keep_storage=args.keep_storage,
            workdir=args.workdir, toxiproxy_bin=args.toxiproxy_bin,
            kinds=tuple(kind.strip() for kind in args.faults.split(",") if kind.strip()),
            fault_count_max=args.fault_count_max, concurrency_max=args.fault_concurrency_max,
            process_concurrency_max=args.process_fault_concurrency_max, gap_s_mean=args.fault_gap_s,
            fault_s_min=args.fault_s_min, fault_s_max=args.fault_s_max,
            process_fault_s_min=args.process_fault_s_min, process_fault_s_max=args.process_fault_s_max,
            bank_clients=args.bank_clients,
            accounts_per_partition=args.accounts_per_partition, register_writers=args.register_writers,
            register_readers=args.register_readers, registers_per_partition=args.registers_per_partition,
            settings=_settings(args.set), storage_timeout_ms_call=args.timeout_ms_call,
            in_doubt_deadline_s=args.in_doubt_deadline_s, settle_timeout_s=args.settle_timeout_s,
            audit_interval_s=args.audit_interval_s, require_ownership=args.require_ownership,
            verbose=not args.quiet,
        )
    except (ValueError, argparse.ArgumentTypeError) as error:
        parser.error(str(error))
    signal.signal(signal.SIGTERM, _raise_interrupt)
    summary = run(options)
    print(format_summary(summary), flush=True)
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(summary, indent=2, sort_keys=True, default=str) + "\n")
    if summary["error"]:
        return 2
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
