"""The REST API's listen address as `cornus serve` binds it (services/serve.py)."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from services.serve import EXIT_CODE_ADDRESS_UNBOUND, api_host_port
from tests.worker import free_port

# A node that cannot bind exits at once; a Python start and the imports take a few seconds here.
TIMEOUT_S_SERVE = 60


@pytest.mark.parametrize(("address", "expected"), [
    ("127.0.0.1:8100", ("127.0.0.1", 8100)),
    ("localhost:8100", ("localhost", 8100)),
    # Found by audit (2026-11-27): uvicorn was given "[::1]", which does not resolve, and the node
    # failed to serve after it had taken its identity and partitions.
    ("[::1]:8100", ("::1", 8100)),
])
def test_the_api_binds_the_host_and_port_of_its_address(address: str, expected: tuple[str, int]) -> None:
    assert api_host_port(address) == expected


@pytest.mark.parametrize("api", ["rest", "grpc", "peer"])
def test_a_node_whose_api_port_is_taken_exits_before_it_takes_anything(tmp_path: Path, api: str) -> None:
    """Found by audit (2026-11-27): the APIs were bound only after the node had started: one whose
    port was taken (a second `cornus serve` of the same node, by mistake) first took the node's
    identity, deposing the process that served, and then exited. They are bound first. The peer
    listener's taken port ended the process with a traceback and exit code 1 (found by the suite,
    2026-11-27: a local cluster whose port was taken meanwhile could not tell it from a crash); it
    exits with the same code, which a local cluster answers by picking other ports."""
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    taken = f"127.0.0.1:{busy.getsockname()[1]}"
    database = tmp_path / "cornus.db"
    addresses = {
        "rest": ["--api-listen", taken, "--grpc-api-listen", f"127.0.0.1:{free_port()}"],
        "grpc": ["--api-listen", f"127.0.0.1:{free_port()}", "--grpc-api-listen", taken],
        "peer": ["--api-listen", f"127.0.0.1:{free_port()}", "--grpc-api-listen", f"127.0.0.1:{free_port()}"],
    }[api]
    peer = taken if api == "peer" else f"127.0.0.1:{free_port()}"
    try:
        done = subprocess.run(
            [sys.executable, "-m", "services.cli", "serve", "--node-id", "n0", "--partition-count", "1",
             "--peers", f"n0={peer}", *addresses,
             "--backend", "emulator", "--emulator-path", str(database)],
            # At INFO, so that a take of the identity would show in the log checked below.
            capture_output=True, text=True, timeout=TIMEOUT_S_SERVE, check=False,
            env={**os.environ, "CORNUS_LOG_LEVEL": "INFO"})
    finally:
        busy.close()
    assert done.returncode == EXIT_CODE_ADDRESS_UNBOUND, (done.returncode, done.stderr[-2000:])
    assert "cannot listen" in done.stderr, done.stderr[-2000:]
    assert "took its identity" not in done.stderr, done.stderr[-2000:]


def test_a_grpc_port_another_grpc_server_holds_is_taken_not_shared(tmp_path: Path) -> None:
    """Found by review (2026-11-27): grpc sets SO_REUSEPORT on its listeners by default, so a
    second `cornus serve` of one node bound the first's gRPC port beside it (the kernel shares a
    port between sockets that both set it), took the identity and split the clients' connections
    with it. The node's gRPC listener does not share its port."""
    import grpc

    async def hold_and_serve() -> subprocess.CompletedProcess[str]:
        holder = grpc.aio.server()  # grpc's defaults, SO_REUSEPORT among them
        port = holder.add_insecure_port("127.0.0.1:0")
        await holder.start()
        try:
            return await asyncio.to_thread(subprocess.run, [
                sys.executable, "-m", "services.cli", "serve", "--node-id", "n0", "--partition-count", "1",
                "--peers", f"n0=127.0.0.1:{free_port()}", "--api-listen", f"127.0.0.1:{free_port()}",
                "--grpc-api-listen", f"127.0.0.1:{port}",
                "--backend", "emulator", "--emulator-path", str(tmp_path / "cornus.db")],
                capture_output=True, text=True, timeout=TIMEOUT_S_SERVE, check=False)
        finally:
            await holder.stop(None)

    done = asyncio.run(hold_and_serve())
    assert done.returncode == EXIT_CODE_ADDRESS_UNBOUND, (done.returncode, done.stderr[-2000:])
