"""Micro-benchmark of PeerTransport: `python -m loadtests.bench.transport [--seconds S] [--tls]`.

Starts an echo node in a child process and, from this process, measures request/response round
trips of 100-byte payloads over the node connection: latency at 1 in flight and throughput at 16
and 256 in flight; with `--tls`, over mutual TLS with a throwaway CA's certificates, to show what
peer TLS costs. Prints figures; it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import select
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from cornus.protocol.messages import Message
from cornus.runtime.peer_tls import PeerTlsConfig, PeerTlsContexts
from cornus.runtime.wire import (
    ExecuteRequest,
    ExecuteResponse,
    ExecuteStatus,
    Op,
    OpKind,
    PeerRequest,
    PeerResponse,
    StatusRequest,
    StatusResponse,
)
from loadtests.bench.tls_certs import ThrowawayCa
from services.node_rpc.transport import PeerTransport

PAYLOAD_BYTES = 100
LATENCY_WARMUP_COUNT = 1_000
LATENCY_SAMPLE_COUNT = 10_000
INFLIGHT_COUNTS = (16, 256)
REQUEST_TIMEOUT_MS = 10_000
CONNECT_TIMEOUT_MS = 20_000
CHILD_START_TIMEOUT_S = 30.0
REPO_DIR = Path(__file__).resolve().parent.parent.parent


class EchoHandler:
    def on_message(self, sender: str, message: Message) -> None:
        pass

    async def on_request(self, sender: str, request: PeerRequest) -> PeerResponse:
        if isinstance(request, StatusRequest):
            return StatusResponse(node="server", ready=True, partitions=())
        return ExecuteResponse(status=ExecuteStatus.OK, values=tuple(op.value for op in request.ops))


def _run(main: Callable[[], Coroutine[Any, Any, None]]) -> str:
    try:
        import uvloop
    except ImportError:
        asyncio.run(main())
        return "asyncio"
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())
    return "uvloop"


def _tls(directory: str | None, name: str) -> PeerTlsContexts | None:
    if directory is None:
        return None
    files = ThrowawayCa.load(Path(directory)).issue(name)
    return PeerTlsConfig(files.cert_file, files.key_file, files.ca_file).contexts()


async def _serve(port: int, client_port: int, tls_dir: str | None) -> None:
    transport = PeerTransport("server", f"127.0.0.1:{port}", {"client": f"127.0.0.1:{client_port}"},
                              tls=_tls(tls_dir, "server"))
    await transport.start(EchoHandler())
    print("READY", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await transport.close()


def _percentile(sorted_values: list[float], fraction: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * fraction))]


async def _measure(port: int, client_port: int, seconds: float, tls_dir: str | None) -> None:
    transport = PeerTransport("client", f"127.0.0.1:{client_port}", {"server": f"127.0.0.1:{port}"},
                              tls=_tls(tls_dir, "client"))
    await transport.start(EchoHandler())
    try:
        assert await transport.wait_connected("server", CONNECT_TIMEOUT_MS), "server did not come up"
        request = ExecuteRequest(
            txn="bench", partition="p", coordinator="client", ops=(Op(OpKind.GET, "k", b"v" * PAYLOAD_BYTES),)
        )
        for _ in range(LATENCY_WARMUP_COUNT):
            await transport.request("server", request, REQUEST_TIMEOUT_MS)
        samples_ms: list[float] = []
        for _ in range(LATENCY_SAMPLE_COUNT):
            started = time.perf_counter()
            await transport.request("server", request, REQUEST_TIMEOUT_MS)
            samples_ms.append((time.perf_counter() - started) * 1000)
        samples_ms.sort()
        print(
            f"stream, 1 in flight: round trip p50 {_percentile(samples_ms, 0.5):.3f} ms, "
            f"p99 {_percentile(samples_ms, 0.99):.3f} ms (one-way ~ half: {_percentile(samples_ms, 0.5) / 2:.3f} ms); "
            f"mean {statistics.fmean(samples_ms):.3f} ms over {len(samples_ms)} requests"
        )

        for inflight in INFLIGHT_COUNTS:
            done_count = 0
            deadline = time.perf_counter() + seconds

            async def worker(deadline: float = deadline) -> None:
                nonlocal done_count
                while time.perf_counter() < deadline:
                    await transport.request("server", request, REQUEST_TIMEOUT_MS)
                    done_count += 1

            started = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(inflight)))
            elapsed = time.perf_counter() - started
            counters = transport.peer_counters("server")
            print(
                f"stream, {inflight:>3} in flight: {done_count / elapsed:,.0f} requests/s "
                f"({2 * done_count / elapsed:,.0f} msgs/s counting each response), "
                f"{counters.item_sent_count / max(1, counters.frame_sent_count):.1f} items/frame so far"
            )

        assert transport.drop_count == 0
    finally:
        await transport.close()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="per throughput run")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--client-port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--tls", action="store_true", help="over mutual TLS, with a throwaway CA's certificates")
    parser.add_argument("--tls-dir", help=argparse.SUPPRESS)  # the CA the parent wrote, for the child
    args = parser.parse_args()
    if args.serve:
        _run(lambda: _serve(args.port, args.client_port, args.tls_dir))
        return

    with tempfile.TemporaryDirectory(prefix="cornus-transport-bench-") as directory:
        tls_dir = None
        if args.tls:
            ThrowawayCa(Path(directory)).save_key()
            tls_dir = directory
        _bench(args.seconds, tls_dir)


def _bench(seconds: float, tls_dir: str | None) -> None:
    port, client_port = _free_port(), _free_port()
    server_args = ["--serve", "--port", str(port), "--client-port", str(client_port)]
    if tls_dir is not None:
        server_args += ["--tls-dir", tls_dir]
    child = subprocess.Popen(
        [sys.executable, "-m", "loadtests.bench.transport", *server_args],
        cwd=REPO_DIR,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_DIR)},
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        # A child that hangs before it serves must not hang this process too.
        readable, _, _ = select.select([child.stdout], [], [], CHILD_START_TIMEOUT_S)
        if not readable:
            child.kill()
            raise RuntimeError(f"echo server (child process {child.pid}) did not say READY within "
                               f"{CHILD_START_TIMEOUT_S:g} s")
        line = child.stdout.readline()
        assert line.startswith("READY"), f"echo server did not start: {line!r}"
        print(f"{os.cpu_count()} CPUs, {PAYLOAD_BYTES}-byte payloads, server in child process {child.pid}, "
              f"{'mutual TLS' if tls_dir is not None else 'plain TCP'}")
        loop_name = _run(lambda: _measure(port, client_port, seconds, tls_dir))
        print(f"event loop: {loop_name}")
    finally:
        if child.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                child.stdin.close()
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()


if __name__ == "__main__":
    main()
