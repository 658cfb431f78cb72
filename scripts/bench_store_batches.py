"""CPU per `log_once` and per `delete` through a store (Redis, or the emulator) when callers come
in waves of concurrent calls (as a node's votes and its garbage collection do): what one storage
call costs the node, and what coalescing a tick's deletes into one request saves.

    PYTHONPATH=. python scripts/bench_store_batches.py --redis-url redis://127.0.0.1:16379/250
    PYTHONPATH=. python scripts/bench_store_batches.py --emulator-path /tmp/bench.db

Writes `--calls` fresh records in waves of `--wave` concurrent `log_once` calls, then deletes them
all in waves of `--wave` concurrent `delete` calls (fenced with `--fenced`, spread over `--logs`
partition logs), and prints wall-clock rate and process CPU per call for each phase, and first
what the waves cost with a call that does nothing. For the emulator it prints the CPU per call of
its writer process too (the file's single writer, which runs every node's writes: its CPU bounds
the file's write rate). `--wave 1` makes each call a round trip of its own. Use a scratch database
or file (it leaves only one ownership record per log behind); prints figures only.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable

import uvloop

from storage_adapters.contract import Fence, LogId, Ownership, RecordBody, TxnState
from storage_adapters.emulator import EmulatorStore
from storage_adapters.factory import StoreConfig, open_store
from storage_adapters.store import LogStore

CALL_COUNT_MAX = 1_000_000
WAVE_COUNT_MAX = 4_096
LOG_COUNT_MAX = 64
ROUND_COUNT_MAX = 20
# Generous: a figure from a run whose calls timed out would be meaningless, so none should.
TIMEOUT_MS_CALL = 30_000


def _process_cpu_s(pid: int | None) -> float:
    """CPU seconds process `pid` has used (0 without one): the scheduler's nanosecond count
    (/proc/<pid>/schedstat), since /proc/<pid>/stat counts in 10 ms ticks."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/schedstat") as stats:
            return int(stats.read().split()[0]) / 1e9
    except OSError as error:  # the writer left mid-run: its share of the figures is lost with it
        raise SystemExit(f"bench_store_batches: cannot read the CPU of process {pid} ({error}); run again") from None


def _writer_pid(store: LogStore) -> int | None:
    """The emulator's writer process, whose CPU is the other half of every write (None for Redis)."""
    return store.writer_pid if isinstance(store, EmulatorStore) else None


async def _phase(
    name: str, calls: list[Callable[[], Awaitable[object]]], wave: int, writer_pid: int | None = None,
) -> tuple[str, float, float]:
    """Run the call factories `calls` in waves of `wave` concurrent calls; a line of figures, and
    the CPU per call in microseconds of this process and of the writer process `writer_pid`."""
    writer_started = _process_cpu_s(writer_pid)
    cpu_started, started = time.process_time(), time.perf_counter()
    for start in range(0, len(calls), wave):
        await asyncio.gather(*(call() for call in calls[start : start + wave]))
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    writer_cpu = _process_cpu_s(writer_pid) - writer_started
    cpu_us, writer_us = 1e6 * cpu / len(calls), 1e6 * writer_cpu / len(calls)
    line = f"  {name:<9} {len(calls) / elapsed:>9,.0f} calls/s  {cpu_us:6.1f} us CPU per call"
    if writer_pid is not None:
        line += f", writer {writer_us:6.1f} us"
    return line, cpu_us, writer_us


async def run(config: StoreConfig, *, calls: int, wave: int, logs: int, fenced: bool, rounds: int) -> None:
    store = await open_store(config)
    run_id = time.time_ns()
    body = RecordBody((), "bench", b"r" * 100)
    try:
        fences: list[Fence | None] = []
        partitions = [f"bench-gc-{run_id}-{index}" for index in range(logs)]
        for partition in partitions:
            owner = Ownership(partition, "bench", 1, 1, 60_000)
            assert (await store.write_owner(None, owner)).written
            fences.append(owner.fence() if fenced else None)
        await store.read(LogId.partition(partitions[0]), "warm-up")  # connect both paths first
        loop = asyncio.get_running_loop()

        async def nothing() -> None:
            answer: asyncio.Future[None] = loop.create_future()
            loop.call_soon(answer.set_result, None)
            await answer

        # What the waves cost by themselves (a task per call, a wake-up per answer), to subtract.
        line, _, _ = await _phase("harness", [nothing] * calls, wave)
        print(line)
        writer_pid = _writer_pid(store)
        totals: dict[str, list[float]] = {"log_once": [], "delete": []}
        writer_totals: dict[str, list[float]] = {"log_once": [], "delete": []}
        for round_index in range(rounds):
            # Calls of one wave spread over the logs, as one GC pass spreads over partitions.
            targets = [(index % logs, f"t{round_index}.{index}") for index in range(calls)]

            def log_once(log_index: int, txn: str) -> Callable[[], Awaitable[object]]:
                log = LogId.partition(partitions[log_index])
                return lambda: store.log_once(log, txn, TxnState.VOTE_YES, body, fences[log_index])

            def delete(log_index: int, txn: str) -> Callable[[], Awaitable[object]]:
                log = LogId.partition(partitions[log_index])
                return lambda: store.delete(log, txn, fences[log_index])

            line, cpu_us, writer_us = await _phase(
                "log_once", [log_once(*target) for target in targets], wave, writer_pid
            )
            print(f"round {round_index + 1}:\n{line}")
            totals["log_once"].append(cpu_us)
            writer_totals["log_once"].append(writer_us)
            line, cpu_us, writer_us = await _phase("delete", [delete(*target) for target in targets], wave, writer_pid)
            print(line)
            totals["delete"].append(cpu_us)
            writer_totals["delete"].append(writer_us)
        for name, figures in totals.items():
            print(f"{name}: {_summary(figures)} CPU per call")
            if writer_pid is not None:
                print(f"{name}: writer {_summary(writer_totals[name])} CPU per call")
    finally:
        await store.close()


def _summary(figures: list[float]) -> str:
    median = sorted(figures)[len(figures) // 2]
    return f"best {min(figures):.1f} us, median {median:.1f} us"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--redis-url")
    where.add_argument("--emulator-path")
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--wave", type=int, default=50)
    parser.add_argument("--logs", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fenced", action="store_true")
    parser.add_argument("--asyncio", action="store_true", help="the standard event loop instead of uvloop")
    args = parser.parse_args()
    if not (1 <= args.calls <= CALL_COUNT_MAX and 1 <= args.wave <= WAVE_COUNT_MAX and 1 <= args.logs <= LOG_COUNT_MAX
            and 1 <= args.rounds <= ROUND_COUNT_MAX):
        parser.error(f"--calls in 1..{CALL_COUNT_MAX}, --wave in 1..{WAVE_COUNT_MAX}, --logs in 1..{LOG_COUNT_MAX}, "
                     f"--rounds in 1..{ROUND_COUNT_MAX}")
    config = (StoreConfig(backend="redis", redis_url=args.redis_url, timeout_ms_call=TIMEOUT_MS_CALL)
              if args.redis_url else
              StoreConfig(backend="emulator", emulator_path=args.emulator_path, timeout_ms_call=TIMEOUT_MS_CALL))
    print(f"{config.backend}: {args.calls} calls in waves of {args.wave}, over {args.logs} log(s), "
          f"{'fenced' if args.fenced else 'unfenced'}, {'asyncio' if args.asyncio else 'uvloop'}")
    main_coro = run(config, calls=args.calls, wave=args.wave, logs=args.logs, fenced=args.fenced,
                    rounds=args.rounds)
    asyncio.run(main_coro) if args.asyncio else uvloop.run(main_coro)


if __name__ == "__main__":
    main()
