"""`cornus bench` and `cornus termination-bench` stopped with SIGTERM (what a CI job's timeout, a
supervisor or `kill` sends) while their cluster runs: they must leave as Ctrl-C makes them, through
their clean-up (nodes stopped, the run's directory and storage namespace gone)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

# Until every node of the run serves: each waits out one storage deadline (the bench's 2 s) after
# it starts, longer on a loaded machine.
TIMEOUT_S_RUNNING = 120.0
# The clean-up stops nodes that stop at once (the bench's nodes wait for no collection); far less
# than a node's bounded stop is expected, this is only the test's limit.
TIMEOUT_S_EXIT = 90.0
# The node launcher exits once its starter is gone; its nodes with it.
TIMEOUT_S_GONE = 30.0
POLL_S = 0.1
# The shell's convention for a command ended by a signal: 128 plus the signal's number.
EXIT_CODE_SIGTERM = 128 + signal.SIGTERM
# In the run's environment, so every process it starts (the node launcher, the nodes) carries it.
MARKER_NAME = "BENCH_SIGTERM_TEST_RUN"
# What a serving node logs once its APIs are up (services/serve.py).
SERVING_LINE = "REST on http://"

COMMANDS = {
    "bench": (["bench", "--workload", "bank", "--protocol", "cornus", "--nodes", "2", "--clients", "1",
               "--seconds", "600", "--no-plots"], "cornus-bench-", 2),
    "termination-bench": (["termination-bench", "--nodes", "3", "--rounds", "1000"], "cornus-termination-", 3),
}


def _pids_with(marker: bytes) -> list[int]:
    """Processes whose environment holds `marker` (the run's and every process it started)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def _wait_running(process: subprocess.Popen[str], temp: Path, prefix: str, node_count: int) -> Path:
    """The run's directory, once every one of its nodes serves."""
    deadline = time.monotonic() + TIMEOUT_S_RUNNING
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()
        runs = sorted(temp.glob(f"{prefix}*"))
        if runs:
            logs = [runs[0] / f"n{i}.log" for i in range(node_count)]
            if all(log.exists() and SERVING_LINE in log.read_text(errors="replace") for log in logs):
                return runs[0]
        time.sleep(POLL_S)
    process.kill()
    pytest.fail(f"the run's nodes did not serve within {TIMEOUT_S_RUNNING:g} s: {process.communicate()}")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_sigterm_stops_the_bench_through_its_clean_up(tmp_path: Path, command: str) -> None:
    """Found by audit (2026-11-28, second): only `cluster up` handled SIGTERM; the two benches
    died of it at once, so their clean-up never ran: the run's directory (and on the clouds its
    container or table, which a later run then found and kept as the user's) stayed behind. SIGTERM
    now takes Ctrl-C's way out: nodes stopped, the run's storage and directory gone, exit 143."""
    argv, prefix, node_count = COMMANDS[command]
    temp = tmp_path / "tmp"
    temp.mkdir()
    token = uuid.uuid4().hex
    marker = f"{MARKER_NAME}={token}".encode()
    environ = {name: value for name, value in os.environ.items() if not name.startswith("CORNUS_")}
    environ.update({"TMPDIR": str(temp), MARKER_NAME: token})
    process = subprocess.Popen([sys.executable, "-m", "services.cli", *argv, "--out", str(tmp_path / "out")],
                               cwd=tmp_path, env=environ, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        run = _wait_running(process, temp, prefix, node_count)
        process.send_signal(signal.SIGTERM)
        try:
            stdout, stderr = process.communicate(timeout=TIMEOUT_S_EXIT)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{command} did not exit within {TIMEOUT_S_EXIT:g} s of SIGTERM")
        assert process.returncode == EXIT_CODE_SIGTERM, (process.returncode, stdout, stderr[-3000:])
        assert "SIGTERM" in stderr, stderr[-3000:]
        assert not run.exists(), f"the run's directory was left behind: {sorted(run.iterdir())}"
        deadline = time.monotonic() + TIMEOUT_S_GONE
        while _pids_with(marker) and time.monotonic() < deadline:
            time.sleep(POLL_S)
        assert not _pids_with(marker), "processes of the run outlived it"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for pid in _pids_with(marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
