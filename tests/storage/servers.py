"""Private instances of the real storage servers, for tests that stop a backend mid-test.

The shared services (scripts/services.sh) must stay up for other tests, so a test that kills or
freezes a server starts its own on a free loopback port with the same binaries.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tests.conftest import Services
from tests.worker import free_port

READY_TIMEOUT_S = 60.0


class ServerProcess:
    """A server subprocess on 127.0.0.1:port that a test can freeze, thaw and kill."""

    def __init__(self, argv: list[str], port: int) -> None:
        self.port = port
        self._log = tempfile.NamedTemporaryFile(prefix="cornus-server-", suffix=".log", delete=False)  # noqa: SIM115
        self.process = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                return
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    output = Path(self._log.name).read_text()[-2000:]
                    self.kill()
                    raise RuntimeError(f"{argv[0]} did not start: {output}") from None
                time.sleep(0.1)

    def freeze(self) -> None:
        os.killpg(self.process.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.killpg(self.process.pid, signal.SIGCONT)

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
        if not self._log.closed:  # kill() runs twice when a test kills the server itself
            self._log.close()
            os.unlink(self._log.name)


def start_redis(services: Services, directory: Path, port: int | None = None, *options: str) -> ServerProcess:
    port = port or free_port()
    # Durable as the node requires (a later option overrides: a test of a Redis that is not, passes
    # --appendonly no).
    argv = [services.get("CORNUS_REDIS_SERVER_BIN"), "--bind", "127.0.0.1", "--port", str(port), "--save", "",
            "--appendonly", "yes", "--appendfsync", "always", "--dir", str(directory), *options]
    return ServerProcess(argv, port)


def start_azurite(services: Services, directory: Path) -> ServerProcess:
    port = free_port()
    argv = [services.get("CORNUS_AZURITE_BLOB_BIN"), "--blobHost", "127.0.0.1", "--blobPort", str(port),
            "--location", str(directory), "--disableTelemetry", "--skipApiVersionCheck", "--silent"]
    return ServerProcess(argv, port)


def start_moto(services: Services) -> ServerProcess:
    port = free_port()
    argv = [sys.executable, services.get("CORNUS_MOTO_LAUNCHER"), "-H", "127.0.0.1", "-p", str(port)]
    return ServerProcess(argv, port)


def azurite_connection_string(services: Services, port: int) -> str:
    shared = services.get("CORNUS_TEST_AZURE_CONNECTION_STRING")
    parts = [part for part in shared.split(";") if part and not part.startswith("BlobEndpoint=")]
    return ";".join([*parts, f"BlobEndpoint=http://127.0.0.1:{port}/devstoreaccount1"]) + ";"


class HoldingProxy:
    """A loopback TCP proxy in front of a server that, while `holding`, holds each client chunk
    `holds(chunk)` picks for `hold_s` before passing it on: a request still on the network when its
    caller's deadline passes, which lands later. With `holding_replies`, such a request goes on at
    once and its reply is held instead (a read answered late, after what it read had changed).
    While `swallowing`, a new connection is read and never answered (a server that accepted it and
    went silent). While `cutting`, whatever the server sends is dropped (a link whose way back was
    cut: a replica behind the proxy stops receiving its primary's stream, and neither side knows).
    While `resetting`, a request `holds(chunk)` picks goes on at once, and the connection is reset
    once the server's reply to it comes, which the client never gets (a request that landed, its
    answer lost); `forwarded_count` counts the requests picked so, sent to the server. With
    `holding_bodies`, a held request's headers go on at once and only the rest of the chunk (its
    body) is held: a lost TCP segment being sent again, or a proxy on the way that is slow to pass
    it on, after the server has judged the request by its headers."""

    def __init__(self, upstream_port: int, holds: Callable[[bytes], bool], hold_s: float) -> None:
        self.upstream_port = upstream_port
        self.holds = holds
        self.hold_s = hold_s
        self.holding = False
        self.holding_replies = False
        self.holding_bodies = False
        self.swallowing = False
        self.cutting = False
        self.resetting = False
        self.held_count = 0
        self.forwarded_count = 0
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> HoldingProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def close(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.swallowing:
            while await reader.read(1 << 20):
                pass
            writer.close()
            return
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        reply_held = asyncio.Event()  # the connection's next reply is held (holding_replies)
        reply_lost = asyncio.Event()  # the connection is reset at the next reply (resetting)
        await asyncio.gather(self._pump(reader, upstream_writer, True, reply_held, reply_lost),
                             self._pump(upstream_reader, writer, False, reply_held, reply_lost))

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, outbound: bool,
                    reply_held: asyncio.Event, reply_lost: asyncio.Event) -> None:
        try:
            while data := await reader.read(1 << 20):
                if not outbound and self.cutting:
                    continue
                if outbound and self.resetting and self.holds(data):
                    self.forwarded_count += 1
                    reply_lost.set()
                elif not outbound and reply_lost.is_set():
                    writer.transport.abort()  # the reply never reaches the client
                    return
                if outbound and self.holding and self.holds(data):
                    self.held_count += 1
                    headers_end = data.find(b"\r\n\r\n") + len(b"\r\n\r\n")
                    if self.holding_replies:
                        reply_held.set()
                    elif self.holding_bodies and 4 <= headers_end < len(data):
                        writer.write(data[:headers_end])
                        await writer.drain()
                        more = await self._unless_reset(reader)
                        if more is None:
                            # A proxy passes its client's reset on and drops what it held (as a
                            # kernel drops a segment it was sending again when its socket resets).
                            writer.transport.abort()
                            return
                        data = data[headers_end:] + more
                    else:
                        await asyncio.sleep(self.hold_s)
                elif not outbound and reply_held.is_set():
                    reply_held.clear()
                    await asyncio.sleep(self.hold_s)
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()


    async def _unless_reset(self, reader: asyncio.StreamReader) -> bytes | None:
        """Wait out the hold unless the client resets its connection meanwhile (None); what it sent
        meanwhile otherwise (b"": nothing, or a graceful close, after which what is held still
        goes on, as TCP delivers what was sent before a FIN)."""
        loop = asyncio.get_running_loop()
        ends_s = loop.time() + self.hold_s
        try:
            more = await asyncio.wait_for(reader.read(1 << 20), self.hold_s)
        except TimeoutError:
            return b""
        except ConnectionResetError:
            return None
        await asyncio.sleep(max(0.0, ends_s - loop.time()))  # closed gracefully: the hold goes on
        return more


async def azurite_behind(connection_string: str, holds: Callable[[bytes], bool], hold_s: float) -> tuple[
        HoldingProxy, str]:
    """A HoldingProxy in front of the Azurite that `connection_string` names, and the connection
    string that goes through it."""
    port = int(connection_string.split("BlobEndpoint=http://127.0.0.1:", 1)[1].split("/", 1)[0])
    proxy = await HoldingProxy(port, holds, hold_s).start()
    return proxy, connection_string.replace(f"127.0.0.1:{port}", f"127.0.0.1:{proxy.port}")


def resp_time_reply() -> bytes:
    """What a RESP stand-in answers to TIME: this machine's clock, as Redis encodes it."""
    now_us = time.time_ns() // 1000
    seconds, micros = str(now_us // 1_000_000).encode(), str(now_us % 1_000_000).encode()
    return b"*2\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(seconds), seconds, len(micros), micros)
