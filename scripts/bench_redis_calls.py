"""CPU per `log_once` through the Redis store, at a given number of concurrent callers: what one
storage call costs the node, apart from everything else a transaction does.

    python scripts/bench_redis_calls.py --redis-url redis://127.0.0.1:16379/9 --callers 1
    python scripts/bench_redis_calls.py --redis-url redis://127.0.0.1:16379/9 --callers 8 --redis-py

`--redis-py` sends the scripts through redis-py instead of the store's pipelined connection, to
compare. Writes fresh records into the given database (use a scratch one); prints figures only.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import uvloop

from storage_adapters.contract import LogId, RecordBody, TxnState
from storage_adapters.redis_store import RedisStore

CALLERS_MAX = 1024


async def run(url: str, callers: int, seconds: float, redis_py: bool) -> str:
    store = await RedisStore.open(url, timeout_ms_call=5_000)
    if redis_py:
        store._pipe = None  # the store then calls its scripts through redis-py
    log = LogId.partition("bench-calls")
    body = RecordBody(("bench-calls",), "bench", b"r" * 100)
    count = 0
    stop_at = time.monotonic() + seconds
    run_id = time.time_ns()

    async def caller(index: int) -> None:
        nonlocal count
        sequence = 0
        while time.monotonic() < stop_at:
            await store.log_once(log, f"b{run_id}.{index}.{sequence}", TxnState.VOTE_YES, body)
            sequence += 1
            count += 1

    cpu_started, started = time.process_time(), time.monotonic()
    try:
        await asyncio.gather(*(caller(index) for index in range(callers)))
    finally:
        await store.close()
    elapsed, cpu = time.monotonic() - started, time.process_time() - cpu_started
    path = "redis-py" if redis_py else "pipelined connection"
    return f"{path}, {callers} callers: {count / elapsed:,.0f} calls/s, {1e6 * cpu / max(count, 1):.0f} us CPU per call"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--callers", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--redis-py", action="store_true")
    args = parser.parse_args()
    if not 1 <= args.callers <= CALLERS_MAX or not 0 < args.seconds <= 600:
        parser.error(f"--callers must be in 1..{CALLERS_MAX} and --seconds in (0, 600]")
    print(uvloop.run(run(args.redis_url, args.callers, args.seconds, args.redis_py)))


if __name__ == "__main__":
    main()
