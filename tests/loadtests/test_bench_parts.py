"""Parts of the benchmark tools without a cluster: the driver's memory bound, the progress bar's
threads, the transport micro-benchmark's start-up bound, and where the emulator's writer CPU is
found and shown."""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
import threading
import time

import pytest

from loadtests.bench import driver, transport
from loadtests.bench.cluster import RunResult, RunSettings, emulator_writer_pids
from loadtests.bench.report import format_rows, summarize
from loadtests.bench.sweep import Progress
from loadtests.workloads import make_workload
from loadtests.workloads.base import Reply
from storage_adapters.emulator import EmulatorStore


async def test_the_driver_keeps_a_bounded_sample_of_transactions_and_exact_counts(monkeypatch):
    """An hour at thousands of commits a second must not keep a record per transaction; the
    counts the report prints stay exact, the latencies come from the sample."""
    monkeypatch.setattr(driver, "TXN_RECORD_COUNT_MAX", 50)
    calls = 0

    async def commit(connection: object, program: object) -> Reply:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0)
        return Reply("committed", timing_ms={"prepare": 1.0, "commit": 0.5})

    monkeypatch.setattr(driver, "run_program", commit)
    workload = make_workload("uniform", 2, {})  # every transaction writes to both partitions
    result = await driver.run_clients([("127.0.0.1", 9)], workload, seconds=0.3, clients=2)
    assert calls > 50 and len(result.records) == 50, (calls, len(result.records))
    row = summarize(RunResult("cornus", RunSettings(workload="uniform", nodes=2, partitions=2), "emulator", result))
    assert row["commits"] == row["dist_commits"] == row["rw_dist_commits"] == calls, (row, calls)
    assert row["kinds"] == f"uniform:{calls}/{calls}", row
    assert row["dist_avg_ms"] > 0 and row["prepare_ms"] == 1.0, row


def test_the_progress_bar_starts_no_monitor_thread(monkeypatch):
    """The nodes start with a preexec_fn, which is unsafe beside other threads: tqdm's monitor
    thread must not run."""

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stderr", Terminal())
    progress = Progress(2)
    try:
        assert progress.bar is not None
        assert not [thread for thread in threading.enumerate() if type(thread).__name__ == "TMonitor"]
    finally:
        progress.close()


def test_the_transport_bench_gives_up_on_a_child_that_never_says_ready(monkeypatch):
    popen = subprocess.Popen

    def silent(argv: list[str], **kwargs: object) -> subprocess.Popen[str]:
        return popen([sys.executable, "-c", "import time; time.sleep(10)"], **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(transport, "CHILD_START_TIMEOUT_S", 0.5)
    monkeypatch.setattr(transport.subprocess, "Popen", silent)
    monkeypatch.setattr(sys, "argv", ["transport"])
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"did not say READY within 0\.5 s"):
        transport.main()
    assert time.monotonic() - started < 5


async def test_the_emulator_writer_a_node_started_is_found_and_its_cpu_shown_apart(tmp_path):
    """`cornus bench` charges the emulator's writer process (a child of the node that started it)
    to a storage CPU column of its own, blank on other backends."""
    store = await EmulatorStore.open(tmp_path / "cornus.db")
    try:
        assert emulator_writer_pids([os.getpid()]) == [store.writer_pid]
        assert emulator_writer_pids([os.getppid()]) == []
    finally:
        await store.close()
    result = RunResult("cornus", RunSettings(), "emulator", driver.DriverResult(), storage_cpu_ms=0.42)
    row = summarize(result)
    assert row["storage_cpu_ms"] == 0.42
    assert "storage CPU" in format_rows([row]) and " 0.42 " in format_rows([row]).splitlines()[1]
    assert summarize(RunResult("cornus", RunSettings(), "redis", driver.DriverResult()))["storage_cpu_ms"] == ""


class _NoConnection:
    def __init__(self, *address: object) -> None:
        pass

    def close(self) -> None:
        pass


async def test_the_end_of_run_read_outlasts_a_partition_taken_again(monkeypatch):
    """On slow storage a lease may lapse as the run ends; the partition is served again only once
    taken again, seconds later. The read keeps trying past that (it gave up after 50 quick tries,
    well under a second, and failed the run), within a deadline of its own."""
    answers = iter([Reply("aborted", "peer_unavailable", retryable=True)] * 80
                   + [Reply("committed", values={"k": "v"})])

    async def one_shot(connection: object, ops: object) -> Reply:
        return next(answers)

    monkeypatch.setattr(driver, "HttpConnection", _NoConnection)
    monkeypatch.setattr(driver, "_one_shot", one_shot)
    monkeypatch.setattr(driver, "READ_PAUSE_MS_MAX", 1.0)
    assert await driver.read_keys(("127.0.0.1", 9), ["k"]) == {"k": "v"}


async def test_the_end_of_run_read_gives_up_at_its_deadline(monkeypatch):
    tries = 0

    async def one_shot(connection: object, ops: object) -> Reply:
        nonlocal tries
        tries += 1
        return Reply("aborted", "peer_unavailable", retryable=True)

    monkeypatch.setattr(driver, "HttpConnection", _NoConnection)
    monkeypatch.setattr(driver, "_one_shot", one_shot)
    monkeypatch.setattr(driver, "READ_DEADLINE_S", 0.3)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"did not commit within 0\.3 s"):
        await driver.read_keys(("127.0.0.1", 9), ["k"])
    assert time.monotonic() - started < 1.0 and 1 < tries <= driver.READ_ATTEMPT_COUNT_MAX
