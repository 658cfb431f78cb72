"""The `cornus` command line. Subcommands:

  serve           run one node (config from --config FILE, CORNUS_* variables and flags)
  storage-bench   p50/p99 `log_once` latency and ops/s per storage backend

Storage settings come from flags, else from `CORNUS_STORAGE_*` environment variables, else from
the config file (serve), else from the defaults (the embedded SQLite emulator in ./cornus.db).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from storage_adapters.errors import StorageError, ValidationError
from storage_adapters.factory import BACKENDS, StoreConfig


def _add_storage_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("storage (flags override CORNUS_STORAGE_* environment variables)")
    group.add_argument("--timeout-ms-call", type=int, help="deadline of every storage call")
    group.add_argument("--emulator-path", help="SQLite file of the emulator backend")
    group.add_argument("--redis-url", help="e.g. redis://127.0.0.1:6379/0")
    group.add_argument("--azure-connection-string", help="Azure Storage connection string")
    group.add_argument("--azure-container", help="blob container for records and data")
    group.add_argument("--dynamodb-table", help="DynamoDB table (created if absent)")
    group.add_argument("--dynamodb-endpoint", help="endpoint URL, e.g. a local moto server")
    group.add_argument("--dynamodb-region", help="AWS region")
    group.add_argument("--latency", help="injected latency per call: fixed:MS, uniform:LO:HI or lognormal:P50:P99")


def _store_config(args: argparse.Namespace, backend: str) -> StoreConfig:
    overrides = {
        name: getattr(args, name, None)
        for name in ("timeout_ms_call", "emulator_path", "redis_url", "azure_connection_string", "azure_container",
                     "dynamodb_table", "dynamodb_endpoint", "dynamodb_region", "latency")
    }
    return StoreConfig.from_env(backend=backend, **overrides)


def _storage_bench(args: argparse.Namespace) -> int:
    from cornus.storage_bench import CONCURRENCY_MAX, OPS_MAX, format_results, run_storage_bench

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


def _serve(args: argparse.Namespace) -> int:
    import logging

    from cornus.runtime.config import load_node_config
    from services.serve import run

    overrides: dict[str, object] = {
        "node_id": args.node_id, "listen": args.listen, "api_listen": args.api_listen, "peers": args.peers,
        "partition_count": args.partition_count, "protocol": args.protocol,
    }
    for name in ("timeout_ms_call", "emulator_path", "redis_url", "azure_connection_string", "azure_container",
                 "dynamodb_table", "dynamodb_endpoint", "dynamodb_region", "latency", "backend"):
        overrides[f"storage_{name}"] = getattr(args, name, None)
    for item in args.set or []:
        name, sep, value = item.partition("=")
        if not sep:
            raise ValidationError(f"--set {item!r}: expected NAME=VALUE, e.g. timeout_ms_prepare=400")
        overrides[name.strip()] = value.strip()
    config = load_node_config(args.config, overrides=overrides)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    run(config)
    return 0


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

    serve = commands.add_parser("serve", help="run one node")
    serve.add_argument("--config", help="TOML config file (see cornus/runtime/config.py)")
    serve.add_argument("--node-id", help="this node's id, e.g. n0")
    serve.add_argument("--listen", help="node-to-node gRPC address host:port (default: this node's peers entry)")
    serve.add_argument("--api-listen", help="REST API address host:port")
    serve.add_argument("--peers", help="every node: n0=host:port,n1=host:port")
    serve.add_argument("--partition-count", type=int, help="number of partitions p0..pN-1")
    serve.add_argument("--protocol", help="cornus, 2pc or coordinator-log")
    serve.add_argument("--backend", choices=BACKENDS, help="storage backend")
    serve.add_argument("--set", action="append", metavar="NAME=VALUE",
                       help="a timeout or limit, e.g. timeout_ms_prepare=400 (repeatable)")
    _add_storage_flags(serve)
    serve.set_defaults(handler=_serve)
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
    except StorageError as error:
        parser.exit(1, f"cornus: storage error: {error}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
