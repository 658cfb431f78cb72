"""Starts the `cornus serve` processes of a local cluster by forking them from one launcher
process that imported the node's code once.

A node spends about 0.8 s of CPU importing its modules (FastAPI and pydantic most of it) before it
does anything. `cornus bench` starts three nodes per protocol and trial, the chaos run restarts
nodes all along, and the test suite starts some 300 nodes on two cores: that import was a large
share of their CPU. A launcher (`python -m services.node_launcher`, one per process that starts
nodes, started on first use) imports it once; each node is a child forked from it, in a session of
its own, with its own environment, working directory, arguments and log, running
`services.cli.main` exactly as `python -m services.cli` would. It is a real process: its own pid,
killed with SIGKILL, listening on real sockets. Its parent is the launcher, which collects its exit
status and tells it when asked (`LaunchedProcess.poll`).

Lifetimes: the launcher gets SIGTERM from the kernel when the process that started it dies, and
every node gets SIGTERM when the launcher dies, so nothing outlives a `cornus cluster up` killed
with SIGKILL (as `local_cluster` promised with one process per node). The launcher ends when its
stdin closes (its starter exited or closed it).

CORNUS_NODE_LAUNCHER=0, or a platform other than Linux, starts each node with an interpreter of
its own instead (`enabled`).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

# How long the launcher may take to answer a request. Its first answer waits for its imports,
# which take seconds on a loaded machine (the test suite runs six workers on two cores).
LAUNCHER_TIMEOUT_S_ANSWER = 30.0
# How long the starter waits at its exit for the launcher to collect its nodes and exit.
LAUNCHER_TIMEOUT_S_EXIT = 5.0
# How often `LaunchedProcess.wait` asks about a node that has not exited.
LAUNCHER_POLL_S_WAIT = 0.01
# The longest request line the launcher reads: a node's environment is its largest part.
LAUNCHER_REQUEST_BYTES_MAX = 1 << 20
# How long the launcher waits for a forked node to lead its own process group before it answers
# the node's pid (a forked child is scheduled within milliseconds; seconds on a loaded machine).
LAUNCHER_TIMEOUT_S_SESSION = 10.0

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
# A forked node's command line is the launcher's; its name (what `top` and `ps -o comm` show, and
# `pkill cornus-node` matches) tells it apart.
NODE_PROCESS_NAME = b"cornus-node"


def enabled() -> bool:
    return os.environ.get("CORNUS_NODE_LAUNCHER", "1") != "0" and sys.platform == "linux"


def die_with_parent(parent_pid: int) -> None:
    """Ask the kernel for SIGTERM once the parent dies; and send it now if it already has."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


class LaunchedProcess:
    """What callers use of subprocess.Popen (pid, returncode, poll, wait, send_signal), for a
    node the launcher forked."""

    def __init__(self, launcher: NodeLauncher, pid: int) -> None:
        self.launcher = launcher
        self.pid = pid
        self.returncode: int | None = None
        # The launcher hands a node's exit status out once: two threads polling at once must not
        # let the one that heard "-" (still running) overwrite the status the other heard (found
        # by the chaos tool on Azure: 17 of 40 exits lost to a workload thread polling beside a
        # kill, and the node read as running for ever).
        self._poll_lock = threading.Lock()

    def poll(self) -> int | None:
        with self._poll_lock:
            if self.returncode is None:
                answer = self.launcher.ask({"op": "poll", "pid": self.pid})
                if answer != "-":
                    self.returncode = int(answer)
            return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
            time.sleep(LAUNCHER_POLL_S_WAIT)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)


class NodeLauncher:
    """The starter's end of one launcher process."""

    _shared: NodeLauncher | None = None
    _shared_lock = threading.Lock()

    def __init__(self) -> None:
        parent_pid = os.getpid()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "services.node_launcher"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            # Its own session: a Ctrl-C in the terminal reaches the starter only, which then stops
            # the nodes in order instead of the launcher dying and all of them racing to exit.
            start_new_session=True,
            # preexec_fn is unsafe only beside other threads; the launcher starts before a node does,
            # and the starters start nodes before any thread.
            preexec_fn=lambda: die_with_parent(parent_pid),  # noqa: PLW1509
        )
        self._ask_lock = threading.Lock()

    @classmethod
    def shared(cls) -> NodeLauncher:
        """This process's launcher, started on first use (again if it died)."""
        with cls._shared_lock:
            if cls._shared is None:
                atexit.register(cls._close_shared)
            if cls._shared is None or cls._shared.process.poll() is not None:
                cls._shared = NodeLauncher()
            return cls._shared

    @classmethod
    def _close_shared(cls) -> None:
        with cls._shared_lock:
            if cls._shared is not None:
                cls._shared.close()

    def spawn(self, args: Sequence[str], env: Mapping[str, str], log_path: Path) -> LaunchedProcess:
        """`python -m services.cli *args` with `env` (its whole environment) in this process's
        working directory, stdout and stderr appended to `log_path`."""
        request = {"op": "fork", "args": list(args), "env": dict(env), "log": str(log_path), "cwd": os.getcwd()}
        return LaunchedProcess(self, int(self.ask(request)))

    def ask(self, request: Mapping[str, object]) -> str:
        assert self.process.stdin is not None and self.process.stdout is not None
        line = json.dumps(request).encode() + b"\n"
        assert len(line) <= LAUNCHER_REQUEST_BYTES_MAX, f"a launcher request of {len(line)} bytes"
        with self._ask_lock:
            try:
                self.process.stdin.write(line)
                self.process.stdin.flush()
            except BrokenPipeError:
                raise RuntimeError(f"the node launcher exited ({self.process.poll()}); see stderr") from None
            ready, _, _ = select.select([self.process.stdout], [], [], LAUNCHER_TIMEOUT_S_ANSWER)
            if not ready:
                raise RuntimeError(f"the node launcher did not answer {request['op']} "
                                   f"within {LAUNCHER_TIMEOUT_S_ANSWER:g} s")
            answer = self.process.stdout.readline()
        if not answer:
            raise RuntimeError(f"the node launcher exited ({self.process.poll()}); see stderr")
        return answer.decode().strip()

    def close(self) -> None:
        """End the launcher (its nodes that still run get SIGTERM) and collect it, bounded."""
        assert self.process.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            self.process.stdin.close()
        try:
            self.process.wait(LAUNCHER_TIMEOUT_S_EXIT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(LAUNCHER_TIMEOUT_S_EXIT)


def _run_node(request: Mapping[str, object], launcher_pid: int, session_led: int) -> None:
    """In the forked node: become what `python -m services.cli` started fresh would be, and say
    so on `session_led` (by closing it) once it leads its own process group. Never returns."""
    import random

    from services.cli import main

    code = 1
    try:
        os.setsid()  # its own process group, killed as one (os.killpg), as start_new_session did
        os.close(session_led)
        die_with_parent(launcher_pid)
        ctypes.CDLL(None).prctl(PR_SET_NAME, NODE_PROCESS_NAME)
        log = os.open(str(request["log"]), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(devnull)
        os.environ.clear()
        os.environ.update(request["env"])  # type: ignore[arg-type]
        os.chdir(str(request["cwd"]))
        random.seed()  # the launcher's state is every node's otherwise
        args = [str(arg) for arg in request["args"]]  # type: ignore[attr-defined]
        sys.argv = ["cornus", *args]
        code = main(args) or 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        if not isinstance(exit_.code, int | None):
            print(exit_.code, file=sys.stderr)
    except BaseException:  # the node's crash goes to its log, as Python would show it
        import traceback

        traceback.print_exc()
    finally:
        try:
            # os._exit skips atexit, where logging.shutdown writes the lines still queued for the
            # log's writer thread (services.api.logs, bounded): a node's last line, the one that
            # says why it exits (a refused cluster record), was lost now and then.
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _collect(exits: dict[int, int], started_by: dict[int, str]) -> None:
    """Collect every node that exited since, so none stays a zombie for long; with
    CORNUS_TEST_TIMELINE set (the test suite's timing, tests/conftest.py), append each node's CPU
    seconds, and the test that started it, to that file's `.nodes` companion: the test's own
    numbers cannot hold them (the nodes are the launcher's children, not the test's)."""
    timeline = os.environ.get("CORNUS_TEST_TIMELINE", "")
    while True:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        exits[pid] = os.waitstatus_to_exitcode(status)
        started = started_by.pop(pid, "")
        if timeline:
            with open(f"{timeline}.nodes", "a") as nodes:
                nodes.write(f"{started}\t{usage.ru_utime:.2f}\t{usage.ru_stime:.2f}\n")


def _fork_node(request: Mapping[str, object], launcher_pid: int) -> int:
    """Fork a node and return its pid once it leads its own process group: answered earlier, a
    kill or pause of the group right after the start met "no such process group" and was lost
    (found by the chaos tool, 2026-11-28: 53 of 60 nodes were not group leaders yet when their pid
    was answered). The child closes its end of a pipe after setsid (or dies, which closes it too)."""
    session_wait, session_led = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(session_wait)
        _run_node(request, launcher_pid, session_led)
    os.close(session_led)
    try:
        ready, _, _ = select.select([session_wait], [], [], LAUNCHER_TIMEOUT_S_SESSION)
        if not ready:
            print(f"node launcher: node {child} did not lead its process group within "
                  f"{LAUNCHER_TIMEOUT_S_SESSION:g} s", file=sys.stderr, flush=True)
        else:
            assert os.read(session_wait, 1) == b"", "the node only closes its end"
    finally:
        os.close(session_wait)
    return child


def serve() -> None:
    """The launcher: import the node's code, then answer request lines on stdin, one line on
    stdout each: {"op": "fork", "args", "env", "log", "cwd"} forks a node and answers its pid;
    {"op": "poll", "pid"} answers its exit status, or "-" while it runs."""
    # Imported here, so that every node forked inherits them: what every node imports, and what
    # the default configurations' nodes import as they start (the public gRPC API, the embedded
    # default's store, what FastAPI imports lazily), which took a quarter of a forked node's CPU
    # up to ready. Importing gRPC starts none of its threads (a channel or server does), so the
    # fork below stays safe.
    import pydantic.v1  # noqa: F401 (FastAPI imports it as it builds the REST API's routes)

    import services.cli
    import services.public_api.server
    import services.serve  # noqa: F401
    import storage_adapters.emulator  # noqa: F401
    from services.api import rest

    rest.prebuild()  # the REST API's routes, which each node forked from here takes (rest.build_app)

    # A fork copies only the forking thread: a lock held by another would stay locked in every node.
    assert threading.active_count() == 1, threading.enumerate()
    launcher_pid = os.getpid()
    exits: dict[int, int] = {}  # nodes that exited, by pid: their status, until asked for it
    started_by: dict[int, str] = {}  # running nodes, by pid: the test that started them, if any
    while line := sys.stdin.buffer.readline(LAUNCHER_REQUEST_BYTES_MAX + 1):
        assert line.endswith(b"\n"), f"a launcher request over {LAUNCHER_REQUEST_BYTES_MAX} bytes"
        request = json.loads(line)
        _collect(exits, started_by)
        if request["op"] == "poll":
            code = exits.pop(request["pid"], None)
            answer = "-" if code is None else str(code)
        else:
            assert request["op"] == "fork", request
            child = _fork_node(request, launcher_pid)
            started_by[child] = str(request["env"].get("PYTEST_CURRENT_TEST", "")).rsplit(" (", 1)[0]
            answer = str(child)
        sys.stdout.buffer.write(answer.encode() + b"\n")
        sys.stdout.buffer.flush()
    # Nodes already stopped are collected, so their CPU time counts in the starter's children's.
    _collect(exits, started_by)


if __name__ == "__main__":
    serve()
