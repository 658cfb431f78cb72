"""A request must reach the node whole within its deadline (services/api/http_limits.py), checked
on a real uvicorn server over real sockets (found by review): uvicorn bounds the idle time
between requests, not a request's own arrival, so a client that sent its head or body a byte at a
time (or opened a connection and sent nothing) held that connection, and its memory, for as long
as it liked."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn

from services.api.http_limits import LimitedHttpProtocol
from tests.worker import free_port

DEADLINE_MS = 500
HEAD_BYTES_MAX = 4096
DRIP_S = 0.1
SERVER_START_TIMEOUT_S = 10
# How long past the deadline the test waits before it calls the connection held open for good.
HELD_S = 10.0


class _Short(LimitedHttpProtocol):
    request_receive_ms_max = DEADLINE_MS
    response_drain_ms_max = DEADLINE_MS
    head_bytes_max = HEAD_BYTES_MAX


BIG_ANSWER_BYTES = 16 * 1024 * 1024
# Read at most READ_BYTES per READ_PAUSE_S, through a fixed receive buffer of as much, it takes
# several drain deadlines, and the server's buffer shrinks at every read.
MEDIUM_ANSWER_BYTES = 12 * 1024 * 1024
READ_BYTES = 256 * 1024
READ_PAUSE_S = 0.02


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    # /early answers without reading the body, as FastAPI answers a 404, 405 or 413; /big answers
    # more than any socket buffer holds.
    if scope["path"] != "/early":
        while (await receive()).get("more_body"):
            pass
    if scope["path"] in ("/big", "/medium"):
        size = BIG_ANSWER_BYTES if scope["path"] == "/big" else MEDIUM_ANSWER_BYTES
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", str(size).encode())]})
        await send({"type": "http.response.body", "body": b"x" * size})
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@contextlib.asynccontextmanager
async def _serving(protocol: type[LimitedHttpProtocol]) -> AsyncIterator[int]:
    bound = free_port()
    served = uvicorn.Server(uvicorn.Config(_app, host="127.0.0.1", port=bound, log_level="warning",
                                           lifespan="off", http=protocol, timeout_keep_alive=1))
    task = asyncio.create_task(served.serve())
    async with asyncio.timeout(SERVER_START_TIMEOUT_S):
        while not served.started:  # noqa: ASYNC110 - uvicorn's flag, it has no event to wait on
            await asyncio.sleep(0.01)
    try:
        yield bound
    finally:
        served.should_exit = True
        async with asyncio.timeout(SERVER_START_TIMEOUT_S):
            await task


@pytest.fixture
async def port() -> AsyncIterator[int]:
    async with _serving(_Short) as bound:
        yield bound


async def _closed_within(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, drip: bytes,
                         first: bytes = b"") -> float:
    """Send `first`, then `drip` a byte per DRIP_S (over and over) until the server ends the
    connection; seconds it took."""
    started = time.monotonic()
    writer.write(first)
    index = 0
    while time.monotonic() - started < HELD_S:
        if drip:
            writer.write(drip[index % len(drip):index % len(drip) + 1])
            index += 1
        try:
            async with asyncio.timeout(DRIP_S):
                if await reader.read(1024) == b"":
                    return time.monotonic() - started
        except TimeoutError:
            continue
        except ConnectionError:
            return time.monotonic() - started
    raise AssertionError(f"the connection was still open after {HELD_S} s")


SLOW = {
    "a head that never ends": (b"", b"POST /x HTTP/1.1\r\nhost: t\r\nx-slow: " + b"a" * 100_000),
    "a body that drips": (b"POST /x HTTP/1.1\r\nhost: t\r\ncontent-length: 300\r\n\r\n", b"b"),
    "no request at all": (b"", b""),
    # Found by review of the first version, which let each of these hold a connection for good.
    "a body answered unread": (b"POST /early HTTP/1.1\r\nhost: t\r\ncontent-length: 8000000\r\n\r\n", b"b"),
    "a pipelined request begun before the answer": (
        b"GET /a HTTP/1.1\r\nhost: t\r\n\r\nGET /b HTTP/1.1\r\nhost: t\r\nx-slow: ", b"a"),
    "blank lines after a request": (b"GET /a HTTP/1.1\r\nhost: t\r\n\r\n", b"\r\n"),
}


@pytest.mark.parametrize("case", list(SLOW))
async def test_a_request_that_arrives_a_byte_at_a_time_ends_at_its_deadline(port: int, case: str) -> None:
    first, drip = SLOW[case]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        took_s = await _closed_within(reader, writer, drip, first)
    finally:
        writer.close()
    assert took_s < HELD_S


class _PatientButSmallHeads(LimitedHttpProtocol):
    request_receive_ms_max = 60_000
    head_bytes_max = HEAD_BYTES_MAX


async def test_a_head_over_its_limit_loses_the_connection_however_fast_it_comes() -> None:
    """Found by review: only the arrival deadline bounded a head, and the memory and parsing it
    took grew with it (a 256 MiB header, in 12 s)."""
    async with _serving(_PatientButSmallHeads) as bound:
        reader, writer = await asyncio.open_connection("127.0.0.1", bound)
        try:
            head = b"GET /a HTTP/1.1\r\nhost: t\r\nx-big: " + b"a" * 2 * HEAD_BYTES_MAX
            took_s = await _closed_within(reader, writer, b"a", head)
        finally:
            writer.close()
    assert took_s < HELD_S


async def _small_buffered_connection(
    port: int, receive_bytes: int,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection with a small, fixed receive buffer: Linux would otherwise grow it (up to
    tcp_rmem's 32 MB here) and take an answer off the server whether the client reads or not."""
    client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_bytes)
    client.setblocking(False)
    await asyncio.get_running_loop().sock_connect(client, ("127.0.0.1", port))
    return await asyncio.open_connection(sock=client)


async def test_a_client_that_stops_reading_its_answer_loses_the_connection(port: int) -> None:
    """Found by review: uvicorn waited for the socket to drain for ever, and a close at a
    deadline would wait for the buffered answer too."""
    reader, writer = await _small_buffered_connection(port, 64 * 1024)
    try:
        writer.write(b"GET /big HTTP/1.1\r\nhost: t\r\n\r\n")
        # Not reading meanwhile: what the kernel's buffers took drains, then nothing for a deadline.
        await asyncio.sleep(6 * DEADLINE_MS / 1000)
        received = 0
        with contextlib.suppress(ConnectionError):
            async with asyncio.timeout(HELD_S):
                while chunk := await reader.read(1 << 20):
                    received += len(chunk)
    finally:
        writer.close()
    assert received < BIG_ANSWER_BYTES, "the whole answer waited for the client"


async def _answered(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes) -> None:
    """Send `request`; its answer's head must come, a 200."""
    writer.write(request)
    async with asyncio.timeout(HELD_S):
        head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head


async def test_a_client_reading_a_large_answer_slowly_gets_all_of_it(port: int) -> None:
    """Found by review of the drain deadline's first version, which timed the whole transfer: a
    client still reading is slow, not gone."""
    reader, writer = await _small_buffered_connection(port, READ_BYTES)
    try:
        await _answered(reader, writer, b"GET /medium HTTP/1.1\r\nhost: t\r\n\r\n")
        async with asyncio.timeout(HELD_S):
            received = 0
            while received < MEDIUM_ANSWER_BYTES:
                chunk = await reader.read(READ_BYTES)
                assert chunk, f"the connection ended after {received} bytes"
                received += len(chunk)
                await asyncio.sleep(READ_PAUSE_S)
    finally:
        writer.close()


async def test_a_body_answered_unread_then_sent_whole_leaves_no_connection_unbounded(port: int) -> None:
    """Found by review: answered before its body was read, the body's last bytes cancelled
    keep-alive's timer and the arrival deadline was cleared, leaving the idle connection with no
    timer at all."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        await _answered(reader, writer, b"POST /early HTTP/1.1\r\nhost: t\r\ncontent-length: 300\r\n\r\nb")
        async with asyncio.timeout(HELD_S):
            assert await reader.readexactly(2) == b"ok"
        writer.write(b"b" * 299)  # the rest of the body; then nothing more
        took_s = await _closed_within(reader, writer, b"")
    finally:
        writer.close()
    assert took_s < HELD_S


async def test_requests_that_arrive_in_time_are_served_on_one_connection(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for _ in range(3):
            writer.write(b"POST /x HTTP/1.1\r\nhost: t\r\ncontent-length: 2\r\n\r\nhi")
            async with asyncio.timeout(5):
                head = await reader.readuntil(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 200"), head
                assert await reader.readexactly(2) == b"ok"
            await asyncio.sleep(DEADLINE_MS / 1000 / 2)  # idle between requests is keep-alive's, not this deadline's
    finally:
        writer.close()


class _HeldTransport:
    """A socket's transport as the protocol sees it, with bytes of an answer the client is or is
    not taking."""

    def __init__(self) -> None:
        self.buffered = 0
        self.aborted = False

    def get_extra_info(self, name: str, default: object = None) -> object:
        return {"sockname": ("127.0.0.1", 8100), "peername": ("127.0.0.1", 40000)}.get(name, default)

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def is_closing(self) -> bool:
        return self.aborted

    def abort(self) -> None:
        self.aborted = True

    def close(self) -> None:
        self.aborted = True


async def test_an_answer_too_small_to_pause_writing_still_must_be_taken() -> None:
    """Found by review: waiting for the next request, the deadline waited for any answer still in
    the socket's buffer, and for ever when its client took none of it (an answer under the high
    water mark never pauses writing, so no drain deadline runs)."""
    config = uvicorn.Config(_app, http=_Short, lifespan="off")
    config.load()
    protocol = _Short(config=config, server_state=uvicorn.server.ServerState(), app_state={},
                      _loop=asyncio.get_running_loop())
    taking, stuck = _HeldTransport(), _HeldTransport()
    protocol.connection_made(taking)  # type: ignore[arg-type]
    taking.buffered = 40_000
    protocol._arm()  # as after an answer: idle, the answer's tail still leaving
    for _ in range(3):  # the client takes a little every so often: slow, not gone
        await asyncio.sleep(DEADLINE_MS / 1000 * 0.8)
        taking.buffered -= 10_000
    assert not taking.aborted
    protocol.connection_lost(None)
    protocol = _Short(config=config, server_state=uvicorn.server.ServerState(), app_state={},
                      _loop=asyncio.get_running_loop())
    protocol.connection_made(stuck)  # type: ignore[arg-type]
    stuck.buffered = 40_000
    protocol._arm()
    await asyncio.sleep(DEADLINE_MS / 1000 * 2.5)  # the client takes nothing
    assert stuck.aborted


CONNECTION_COUNT_MAX = 4
REQUEST_COUNT_MAX = 2


class _FewConnections(LimitedHttpProtocol):
    connection_count_max = CONNECTION_COUNT_MAX
    request_count_max = REQUEST_COUNT_MAX


async def _request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str) -> tuple[int, bytes, bytes]:
    """(status, head, body) of one GET."""
    writer.write(f"GET {path} HTTP/1.1\r\nhost: t\r\n\r\n".encode())
    async with asyncio.timeout(HELD_S):
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.lower().split(b"\r\n")
        length = next(int(line.split(b":")[1]) for line in lines if line.startswith(b"content-length"))
        body = await reader.readexactly(length)
    return int(head.split(b" ")[1]), head, body


async def test_connections_and_requests_past_their_bounds_get_a_json_503() -> None:
    """Found by review: nothing bounded how many connections a node keeps, or how many requests
    it runs at once (uvicorn's limit_concurrency answers in plain text, which no client of this
    API parses). Past either bound a request gets the API's JSON 503, retryable, and a connection
    past the count is closed after it."""
    release = asyncio.Event()

    async def slow_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["path"] == "/wait":
            await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    bound = free_port()
    served = uvicorn.Server(uvicorn.Config(slow_app, host="127.0.0.1", port=bound, log_level="warning",
                                           lifespan="off", http=_FewConnections, timeout_keep_alive=5))
    task = asyncio.create_task(served.serve())
    connections: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        async with asyncio.timeout(SERVER_START_TIMEOUT_S):
            while not served.started:  # noqa: ASYNC110 - uvicorn's flag, it has no event to wait on
                await asyncio.sleep(0.01)
        for _ in range(CONNECTION_COUNT_MAX + 1):
            connections.append(await asyncio.open_connection("127.0.0.1", bound))
        # Within the count, requests run; the one past it is refused in JSON, and its connection goes.
        assert (await _request(*connections[0], "/a"))[0] == 200
        status, head, body = await _request(*connections[-1], "/a")
        assert status == 503 and b"application/json" in head.lower() and b"retry-after" in head.lower(), head
        assert json.loads(body)["error"] == "busy" and "connections" in json.loads(body)["detail"]
        async with asyncio.timeout(HELD_S):
            assert await connections[-1][0].read() == b""
        # Requests in flight: past their bound, one is refused at once while the others wait.
        waiting = [asyncio.create_task(_request(*connections[i], "/wait")) for i in range(REQUEST_COUNT_MAX)]
        await asyncio.sleep(0.2)
        status, _, body = await _request(*connections[REQUEST_COUNT_MAX], "/a")
        assert status == 503 and "requests" in json.loads(body)["detail"], body
        release.set()
        assert [(await answer)[0] for answer in waiting] == [200] * REQUEST_COUNT_MAX
        assert (await _request(*connections[REQUEST_COUNT_MAX], "/a"))[0] == 200
    finally:
        for _, writer in connections:
            writer.close()
        served.should_exit = True
        async with asyncio.timeout(SERVER_START_TIMEOUT_S):
            await task


async def test_connections_far_past_the_count_are_closed_at_once() -> None:
    """Found by review: a connection past the count was kept until its request came (up to the
    receive deadline), so descriptors were bounded by the connection rate times 30 s, not by the
    count. Past twice the count one is closed before it sends anything."""
    async with _serving(_FewConnections) as bound:
        held = [await asyncio.open_connection("127.0.0.1", bound) for _ in range(2 * CONNECTION_COUNT_MAX)]
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", bound)
            held.append((reader, writer))
            async with asyncio.timeout(DEADLINE_MS / 1000):  # well before any receive deadline
                assert await reader.read() == b""
        finally:
            for _, opened in held:
                opened.close()


async def test_pipelined_requests_past_their_bound_lose_the_connection(port: int) -> None:
    """Found by audit (2026-11-27): uvicorn queues a pipelined request while one runs, and reads on
    after every answer, so a client streaming tiny requests without reading its answers queued
    thousands per read (each a request cycle in memory). Past PIPELINE_COUNT_MAX queued, the
    connection ends; a few pipelined requests are served as before."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /a HTTP/1.1\r\nhost: t\r\n\r\n" * 3)
        async with asyncio.timeout(5):
            for _ in range(3):
                head = await reader.readuntil(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 200"), head
                assert await reader.readexactly(2) == b"ok"
    finally:
        writer.close()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /a HTTP/1.1\r\nhost: t\r\n\r\n" * 5_000)
        answered = 0
        async with asyncio.timeout(HELD_S):
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    break
                assert head.startswith(b"HTTP/1.1 200"), head
                await reader.readexactly(2)
                answered += 1
        assert answered <= LimitedHttpProtocol.pipeline_count_max + 1, answered
    finally:
        writer.close()
