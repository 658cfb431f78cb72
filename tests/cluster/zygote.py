"""Node processes for the test clusters, forked from a process that imported the node's code once.

A `cornus serve` process spends about 0.6 s of CPU importing its modules (FastAPI and pydantic
most of it) before it does anything; the suite starts some 250 of them on two cores, which was a
quarter of its CPU. A zygote process per pytest worker imports them once; each node is a child
forked from it, in a session of its own, with its own environment, working directory, arguments
and log, running `services.cli.main` exactly as `python -m services.cli` would. It is a real
process: its own pid, killed with SIGKILL, listening on real sockets. Its parent is the zygote,
which collects its exit status and tells it when asked (ForkedProcess.poll).

CORNUS_TEST_ZYGOTE=0 starts nodes with subprocess instead (to rule this out when debugging).
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

# How long the zygote may take to answer (a fork, or whether a node exited), on a loaded machine.
ASK_TIMEOUT_S = 10.0
# How often wait() asks about a node that has not exited.
WAIT_POLL_S = 0.01


def enabled() -> bool:
    return os.environ.get("CORNUS_TEST_ZYGOTE", "1") != "0" and sys.platform == "linux"


class ForkedProcess:
    """What the harness uses of subprocess.Popen, for a node forked by the zygote."""

    def __init__(self, zygote: Zygote, pid: int) -> None:
        self.zygote = zygote
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            answer = self.zygote.ask({"op": "poll", "pid": self.pid})
            self.returncode = None if answer == "-" else int(answer)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
            time.sleep(WAIT_POLL_S)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)


class Zygote:
    """One per pytest worker process, started on first use, ended with the worker (its stdin
    closes)."""

    _instance: Zygote | None = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.cluster.zygote_server"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=Path(__file__).resolve().parents[2],
        )
        self._ask_lock = threading.Lock()

    @classmethod
    def get(cls) -> Zygote:
        with cls._lock:
            if cls._instance is None or cls._instance.process.poll() is not None:
                cls._instance = Zygote()
            return cls._instance

    def spawn(self, args: Sequence[str], env: Mapping[str, str], log_path: Path) -> ForkedProcess:
        """`python -m services.cli *args` with `env`, stdout and stderr appended to `log_path`."""
        request = {"op": "fork", "args": list(args), "env": dict(env), "log": str(log_path), "cwd": os.getcwd()}
        return ForkedProcess(self, int(self.ask(request)))

    def ask(self, request: Mapping[str, object]) -> str:
        assert self.process.stdin is not None and self.process.stdout is not None
        with self._ask_lock:
            self.process.stdin.write(json.dumps(request).encode() + b"\n")
            self.process.stdin.flush()
            ready, _, _ = select.select([self.process.stdout], [], [], ASK_TIMEOUT_S)
            if not ready:
                raise RuntimeError(f"the test zygote did not answer {request['op']} within {ASK_TIMEOUT_S} s")
            line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the test zygote exited ({self.process.poll()}); see the test's stderr")
        return line.decode().strip()
