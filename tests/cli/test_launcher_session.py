"""A node the launcher (services/node_launcher.py) forks leads its own process group, which is
how the harnesses kill and pause it with everything it started (os.killpg): that must hold as
soon as the launcher names the node's pid, not some time after."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from services.node_launcher import NodeLauncher

SPAWN_COUNT = 20


def test_a_node_leads_its_process_group_as_soon_as_its_pid_is_reported(tmp_path: Path) -> None:
    """Found by the chaos tool on DynamoDB (2026-11-28): a node killed right after its restart got
    "no process group" (the forked child had not called setsid yet, and the launcher had already
    answered its pid), so the kill -9 was lost and the run ended as a harness error. Before the
    fix 53 of 60 spawns were not group leaders yet when reported."""
    launcher = NodeLauncher.shared()
    not_leaders = []
    for index in range(SPAWN_COUNT):
        process = launcher.spawn(["--version"], {"PATH": os.environ.get("PATH", "")}, tmp_path / f"{index}.log")
        try:
            group = os.getpgid(process.pid)
        except ProcessLookupError:
            group = process.pid  # gone already: it exited, so it had called setsid first
        if group != process.pid:
            not_leaders.append(process.pid)
            os.kill(process.pid, signal.SIGKILL)
        process.wait(10)
    assert not_leaders == [], f"{len(not_leaders)} of {SPAWN_COUNT} nodes were not group leaders when reported"
