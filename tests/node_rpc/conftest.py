"""Fixtures for the transport tests: peer nodes in their own OS processes (on ports from
`tests.worker.free_port`: a peer killed and restarted on its port needs one outside the kernel's
ephemeral range, and one no other xdist worker hands out)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent
# A child must print READY within this long; generous for a loaded 2-core CI box.
PEER_START_TIMEOUT_S = 30.0


class PeerProcess:
    """A `tests.node_rpc.peer_process` node in a child process, restartable on the same port."""

    def __init__(self, node_id: str, port: int, peers: dict[str, str]) -> None:
        self.node_id = node_id
        self.port = port
        self.address = f"127.0.0.1:{port}"
        self.peers = peers
        self.process: subprocess.Popen[str] | None = None

    def start(self) -> None:
        assert self.process is None or self.process.poll() is not None
        command = [sys.executable, "-m", "tests.node_rpc.peer_process", "--node-id", self.node_id]
        command += ["--listen", self.address]
        for peer_id, address in self.peers.items():
            command += ["--peer", f"{peer_id}={address}"]
        self.process = subprocess.Popen(
            command,
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(self.process.stdout.readline()), daemon=True)
        reader.start()
        reader.join(PEER_START_TIMEOUT_S)
        if not line or not line[0].startswith("READY"):
            self.kill()
            raise RuntimeError(f"peer {self.node_id} did not start: {line!r}")

    def kill(self) -> None:
        """SIGKILL: no goodbye on the stream, as when a pod is evicted."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()


@pytest.fixture
def peer_factory() -> Iterator[Callable[[str, int, dict[str, str]], PeerProcess]]:
    started: list[PeerProcess] = []

    def make(node_id: str, port: int, peers: dict[str, str]) -> PeerProcess:
        peer = PeerProcess(node_id, port, peers)
        peer.start()
        started.append(peer)
        return peer

    yield make
    for peer in started:
        peer.stop()
        peer.kill()
