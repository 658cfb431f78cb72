"""A node forked by the launcher (services/node_launcher.py) is polled from several threads at once
(the chaos tool's workload threads beside its kills, a cluster's stop beside its readiness polls):
its exit status, which the launcher hands out once, must never be lost to a concurrent poll."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Mapping

from services.node_launcher import LaunchedProcess


class _OnceLauncher:
    """The launcher's answers to polls: the exit status once, then "-" (as `serve` pops it), the
    "-" answered a little later, as a poll that reached the launcher second does. Two polls that
    both found no status yet meet here first (a bounded wait: polls kept apart never meet)."""

    def __init__(self, code: int) -> None:
        self._code: int | None = code
        self._lock = threading.Lock()
        self._both_asking = threading.Barrier(2)

    def ask(self, request: Mapping[str, object]) -> str:
        assert request["op"] == "poll"
        with contextlib.suppress(threading.BrokenBarrierError):
            self._both_asking.wait(timeout=0.2)
        with self._lock:
            code, self._code = self._code, None
        if code is None:
            time.sleep(0.05)
            return "-"
        return str(code)


def test_a_status_heard_by_one_poll_is_kept_whatever_a_concurrent_poll_heard() -> None:
    """Found by the chaos tool on Azure (2026-11-28): the poll that heard "-" overwrote the status
    the other had just set, and the killed node read as running for ever."""
    for _ in range(5):
        process = LaunchedProcess(_OnceLauncher(-9), pid=12345)  # type: ignore[arg-type]
        threads = [threading.Thread(target=process.poll) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=5)
        assert process.poll() == -9 and process.returncode == -9
