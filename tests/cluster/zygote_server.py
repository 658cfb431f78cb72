"""The zygote of tests/cluster/zygote.py: imports the node's code, then answers request lines on
stdin, one line on stdout each: {"op": "fork", "args", "env", "log", "cwd"} forks a node and
answers its pid; {"op": "poll", "pid"} answers its exit status, or "-" while it runs."""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import traceback

import services.serve  # noqa: F401  (imported here so that every node forked inherits it)
from services.cli import main

# A fork copies only the forking thread: a lock held by another would stay locked in every node.
assert threading.active_count() == 1, threading.enumerate()


def _run_node(request: dict[str, object]) -> None:
    """In the forked node: become what `python -m services.cli` started fresh would be. Never
    returns."""
    code = 1
    try:
        os.setsid()  # its own process group, killed as one (os.killpg), as start_new_session did
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
        random.seed()  # the zygote's state is every node's otherwise
        args = [str(arg) for arg in request["args"]]  # type: ignore[attr-defined]
        sys.argv = ["cornus", *args]
        code = main(args) or 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        if not isinstance(exit_.code, int | None):
            print(exit_.code, file=sys.stderr)
    except BaseException:  # the node's crash goes to its log, as Python would show it
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve() -> None:
    exits: dict[int, int] = {}  # nodes that exited, by pid: their status, until asked for it
    for line in sys.stdin.buffer:
        request = json.loads(line)
        while True:  # collect every node that exited since, so none stays a zombie for long
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            exits[pid] = os.waitstatus_to_exitcode(status)
        if request["op"] == "poll":
            code = exits.pop(request["pid"], None)
            answer = "-" if code is None else str(code)
        else:
            assert request["op"] == "fork", request
            child = os.fork()
            if child == 0:
                _run_node(request)
            answer = str(child)
        sys.stdout.buffer.write(answer.encode() + b"\n")
        sys.stdout.buffer.flush()


if __name__ == "__main__":
    serve()
