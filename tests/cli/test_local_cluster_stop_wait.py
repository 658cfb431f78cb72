"""How long a local cluster (`cornus cluster up`, the benches, the chaos run) waits for its nodes
after SIGTERM before it kills them (services/local_cluster.py stop_nodes), on a virtual clock: the
nodes here are stand-ins that exit when the clock says so."""

from __future__ import annotations

import signal
import types
from pathlib import Path

import pytest

from cornus.runtime.config import RuntimeLimits, load_node_config, timeout_maxima
from services import local_cluster
from services.local_cluster import ClusterNode, StopSignals, stop_nodes
from services.serve import SHUTDOWN_BUDGET_S, SHUTDOWN_BUDGET_S_BUT_COLLECT

# The longest wait for collection a node allows.
STOP_COLLECT_MS_MAX = timeout_maxima()["timeout_ms_stop_collect"]
_MS_PER_S = 1_000
# How far past its own bound a silent node may still live: the wait polls, it does not sleep it out.
KILL_LATENESS_S_MAX = 1.0


class _Clock:
    """A monotonic clock that moves only when the code under test sleeps; and the stand-in nodes
    it drives, by pid."""

    def __init__(self) -> None:
        self.now = 0.0
        self.processes: dict[int, _StoppingNode] = {}

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class _StoppingNode:
    """A node process that exits `stop_s` after its SIGTERM (never, for None) unless killed."""

    def __init__(self, clock: _Clock, stop_s: float | None) -> None:
        self.clock, self.stop_s = clock, stop_s
        # Above Linux's largest pid_max (2**22): were a kill to reach the real os, no process has it.
        self.pid = 2 ** 22 + 1 + len(clock.processes)
        clock.processes[self.pid] = self
        self.returncode: int | None = None
        self.terminated_at: float | None = None
        self.killed_at: float | None = None

    def send_signal(self, signum: int) -> None:
        assert signum == signal.SIGTERM
        self.terminated_at = self.clock.now

    def poll(self) -> int | None:
        if self.returncode is None and self.terminated_at is not None and self.stop_s is not None \
                and self.clock.now >= self.terminated_at + self.stop_s:
            self.returncode = 0
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        assert self.poll() is not None, "waited for a node that neither stopped nor was killed"
        assert self.returncode is not None
        return self.returncode


def _node(tmp_path: Path, clock: _Clock, stop_s: float | None, settings: dict[str, str]) -> ClusterNode:
    config = load_node_config(environ={}, overrides={
        "node_id": "n0", "peers": "n0=127.0.0.1:7100", "api_listen": "127.0.0.1:8100", "partition_count": 1,
        **settings})
    return ClusterNode(config, 8100, 7100, tmp_path / "n0.log", _StoppingNode(clock, stop_s))  # type: ignore[arg-type]


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    """The virtual clock in local_cluster's place, and its kills recorded on the stand-ins."""
    clock = _Clock()
    monkeypatch.setattr(local_cluster, "time", types.SimpleNamespace(monotonic=clock.monotonic, sleep=clock.sleep))

    def killpg(pid: int, signum: int) -> None:
        assert signum == signal.SIGKILL
        process = clock.processes[pid]
        if process.returncode is None:
            process.killed_at, process.returncode = clock.now, -signal.SIGKILL

    monkeypatch.setattr(local_cluster, "os", types.SimpleNamespace(killpg=killpg))
    return clock


def _stop(tmp_path: Path, clock: _Clock, stop_s: float | None, settings: dict[str, str]) -> tuple[bool, _StoppingNode]:
    node = _node(tmp_path, clock, stop_s, settings)
    assert isinstance(node.process, _StoppingNode)
    return stop_nodes([node], StopSignals()), node.process


@pytest.mark.parametrize("stop_collect_ms", [None, 0, STOP_COLLECT_MS_MAX])
def test_a_node_inside_its_own_bounded_stop_is_not_killed(
    tmp_path: Path, clock: _Clock, stop_collect_ms: int | None,
) -> None:
    """Found by audit (2026-11-28, second): the cluster killed every node still stopping 30 s
    after its SIGTERM, while a node's own stop is bounded by 29 s plus its wait for collection
    (services/serve.py: 44 s at the default 15 s wait, 89 s at the longest): a node delivering its
    decisions or waiting for its records to be collected was killed in the middle of it. The wait
    is each node's own bound now, from its configuration, plus a margin; and still bounded."""
    settings = {} if stop_collect_ms is None else {"timeout_ms_stop_collect": str(stop_collect_ms)}
    stop_collect_s = (RuntimeLimits().timeout_ms_stop_collect if stop_collect_ms is None
                      else stop_collect_ms) / _MS_PER_S
    budget_s = SHUTDOWN_BUDGET_S_BUT_COLLECT + stop_collect_s
    if stop_collect_ms is None:
        assert budget_s == SHUTDOWN_BUDGET_S
    clean, process = _stop(tmp_path, clock, budget_s, settings)
    assert clean and process.killed_at is None, f"killed at {process.killed_at} s, inside its {budget_s:g} s stop"
    # One that never stops is killed, past its bound but not long after.
    clean, process = _stop(tmp_path, clock, None, settings)
    assert not clean and process.killed_at is not None and process.terminated_at is not None
    waited_s = process.killed_at - process.terminated_at
    assert budget_s < waited_s <= budget_s + local_cluster.CLUSTER_MARGIN_S_STOP + KILL_LATENESS_S_MAX, waited_s


def test_the_cluster_s_stop_wait_exceeds_serve_s_budget_at_the_defaults() -> None:
    """Found by audit (2026-11-28, second): CLUSTER_TIMEOUT_S_STOP (30 s) was below serve's own
    SHUTDOWN_BUDGET_S (44 s) for the default configuration."""
    config = load_node_config(environ={}, overrides={
        "node_id": "n0", "peers": "n0=127.0.0.1:7100", "api_listen": "127.0.0.1:8100", "partition_count": 1})
    assert local_cluster.node_stop_wait_s(config) > SHUTDOWN_BUDGET_S
