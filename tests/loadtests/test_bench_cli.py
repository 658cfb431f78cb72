"""`cornus bench`, the README's first command, as a user runs it."""

from __future__ import annotations

import subprocess
import sys

TIMEOUT_S_BENCH = 240


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "services.cli", "bench", *args], capture_output=True, text=True,
                          timeout=TIMEOUT_S_BENCH, check=False)


def test_bench_compares_every_protocol_on_the_emulator() -> None:
    done = _bench("--seconds", "1.5", "--clients", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    first, _, per_txn = done.stdout.partition("per committed transaction")
    rows = {line.split()[0]: line.split() for line in first.splitlines()
            if line.split() and line.split()[0] in ("cornus", "2pc", "coordinator-log")}
    assert set(rows) == {"cornus", "2pc", "coordinator-log"}, done.stdout
    costs = {line.split()[0]: line.split() for line in per_txn.splitlines()
             if line.split() and line.split()[0] in ("cornus", "2pc", "coordinator-log")}
    assert set(costs) == set(rows), done.stdout
    for protocol, row in costs.items():
        node_cpu_ms, client_cpu_ms, storage_calls, peer_messages = (float(value) for value in row[1:5])
        assert node_cpu_ms > 0 and client_cpu_ms > 0, (protocol, row)
        # Every participant logs its vote and applies its redo, whatever the protocol.
        assert storage_calls >= 4, (protocol, row)
        assert peer_messages >= 0, (protocol, row)
        assert row[5].endswith("%"), (protocol, row)  # the load phase makes every read a cache hit or miss
    assert "keys loaded first" in done.stdout
    assert "2PC/Cornus: client p50" in done.stdout
    for protocol, row in rows.items():
        commits_per_s, p50_ms = float(row[1]), float(row[3])
        assert commits_per_s > 0 and p50_ms > 0, (protocol, row)
        prepare_ms, commit_ms = float(row[7]), float(row[8])
        assert prepare_ms > 0, (protocol, row)
        if protocol != "cornus":
            # 2PC and coordinator-log write a decision before replying; Cornus does not.
            assert commit_ms > float(rows["cornus"][8]), done.stdout


def test_bench_refuses_bad_input_before_starting_anything() -> None:
    for args, message in ((["--seconds", "0"], "--seconds"), (["--clients", "0"], "--clients"),
                          (["--partitions-per-txn", "9"], "--partitions-per-txn"),
                          (["--latency", "soon"], "latency 'soon'"), (["--set", "no_such=1"], "no_such")):
        done = _bench(*args)
        assert done.returncode == 2 and message in done.stderr, (args, done.stderr)


def _termination_bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "services.cli", "termination-bench", *args], capture_output=True,
                          text=True, timeout=TIMEOUT_S_BENCH, check=False)


def test_termination_bench_times_termination_after_coordinator_kills() -> None:
    rounds = 2
    # A short storage deadline: each restart of the killed coordinator waits it out before recovery.
    done = _termination_bench("--rounds", str(rounds), "--timeout-ms-call", "500")
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {line.split()[0]: line.split() for line in done.stdout.splitlines() if line.split()[:1] in (["n1"], ["n2"])}
    assert set(rows) == {"n1", "n2"}, done.stdout  # every participant ran termination, every round
    for node, row in rows.items():
        count, min_ms, p50_ms, max_ms = int(row[1]), float(row[2]), float(row[3]), float(row[5])
        assert count == rounds, (node, row)
        assert 0 < min_ms <= p50_ms <= max_ms, (node, row)


def test_termination_bench_refuses_bad_input() -> None:
    for args, message in ((["--nodes", "2"], "--nodes"), (["--rounds", "0"], "--rounds")):
        done = _termination_bench(*args)
        assert done.returncode == 2 and message in done.stderr, (args, done.stderr)
