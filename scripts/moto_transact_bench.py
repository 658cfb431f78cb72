"""What one TransactWriteItems costs moto's server as its table grows, with moto's own whole-table
backup and with scripts/moto_serial.py's backup of the items it names: time per call and the
server's resident memory after each round. A figure to read, not a test.

    python3 scripts/moto_transact_bench.py [--items 5000] [--calls 300] [--rounds 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import boto3
from local_server import free_port, running

LAUNCHER = Path(__file__).with_name("moto_serial.py")
TABLE = "bench"


def _rss_mb(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) // 1024


def _run(whole_table: bool, items: int, calls: int, rounds: int) -> None:
    port = free_port()
    argv = [sys.executable, str(LAUNCHER), "-H", "127.0.0.1", "-p", str(port),
            *(["--whole-table-backups"] if whole_table else [])]
    with running(argv, port) as pid:
        client = boto3.client("dynamodb", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1",
                              aws_access_key_id="bench", aws_secret_access_key="bench")
        client.create_table(TableName=TABLE, BillingMode="PAY_PER_REQUEST",
                            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
                            AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}])
        for index in range(items):
            client.put_item(TableName=TABLE, Item={"pk": {"S": f"item{index}"}, "value": {"S": "x" * 200}})
        label = "moto's whole-table backup" if whole_table else "item backups (moto_serial.py)"
        for round_index in range(rounds):
            started = time.monotonic()
            for index in range(calls):
                client.transact_write_items(TransactItems=[
                    {"Put": {"TableName": TABLE, "Item": {"pk": {"S": f"a{round_index}.{index}"}}}},
                    {"Put": {"TableName": TABLE, "Item": {"pk": {"S": f"b{round_index}.{index}"}}}},
                ])
            per_call_ms = 1000 * (time.monotonic() - started) / calls
            print(f"{label}: {items} items, round {round_index + 1}: {per_call_ms:.2f} ms a call, "
                  f"server {_rss_mb(pid)} MB", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=5_000)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if min(args.items, args.calls, args.rounds) < 1:
        parser.error("--items, --calls and --rounds must be at least 1")
    for whole_table in (False, True):
        _run(whole_table, args.items, args.calls, args.rounds)


if __name__ == "__main__":
    main()
