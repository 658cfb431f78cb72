"""`cornus serve` as a container's first process (PID 1, no init: the image's entry point). The
kernel drops a signal PID 1 has no handler for, and the node installed its SIGTERM handler only
once storage answered: a pod stopped while storage was unreachable at its start ignored the
SIGTERM, took its identity and partitions if storage came back within the grace period, and was
then killed without releasing them (found by review). unshare(1) is util-linux's, in every Debian
install: no skip, a machine without it fails here."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.worker import free_port

# How long a node stopped while it waits for storage may take to exit: far less than its wait
# for storage (STORAGE_OPEN_TIMEOUT_S, a minute), so an ignored SIGTERM cannot pass.
EXIT_S_MAX = 10.0
POLL_S = 0.05


def _child_of(pid: int, timeout_s: float) -> int:
    """The one child of `pid` (unshare's, which is PID 1 in its namespace), once it exists."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        if children:
            return int(children[0])
        time.sleep(POLL_S)
    raise AssertionError(f"unshare {pid} started no child")


def test_a_node_that_is_pid_one_stops_on_sigterm_while_it_waits_for_storage(tmp_path: Path) -> None:
    unreachable = f"redis://127.0.0.1:{free_port()}/0"
    env = {**os.environ, "CORNUS_PEERS": f"n0=127.0.0.1:{free_port()}", "CORNUS_PARTITION_COUNT": "2",
           "CORNUS_STORAGE_BACKEND": "redis", "CORNUS_STORAGE_REDIS_URL": unreachable,
           "CORNUS_STORAGE_TIMEOUT_MS_CALL": "1000"}
    log = tmp_path / "n0.log"
    with log.open("ab") as out:
        unshare = subprocess.Popen(
            ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", sys.executable, "-m", "services.cli",
             "serve", "--node-id", "n0", "--api-listen", f"127.0.0.1:{free_port()}"],
            env=env, stdout=out, stderr=subprocess.STDOUT,
        )
    try:
        node = _child_of(unshare.pid, EXIT_S_MAX)
        deadline = time.monotonic() + 60
        while "storage is unreachable at start" not in log.read_text():
            assert unshare.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(POLL_S)
        os.kill(node, signal.SIGTERM)
        try:
            unshare.wait(EXIT_S_MAX)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the node (PID 1) ignored SIGTERM while it waited for storage:\n{log.read_text()}")
    finally:
        if unshare.poll() is None:
            unshare.kill()
            unshare.wait(10)
