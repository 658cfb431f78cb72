"""A request must reach the node whole within its deadline (services/api/http_receive.py), checked
on a real uvicorn server over real sockets (found by review): uvicorn bounds the idle time
between requests, not a request's own arrival, so a client that sent its head or body a byte at a
time (or opened a connection and sent nothing) held that connection, and its memory, for as long
as it liked."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn

from services.api.http_receive import ReceiveDeadlineProtocol
from tests.worker import free_port

DEADLINE_MS = 500
DRIP_S = 0.1
SERVER_START_TIMEOUT_S = 10
# How long past the deadline the test waits before it calls the connection held open for good.
HELD_S = 10.0


class _Short(ReceiveDeadlineProtocol):
    request_receive_ms_max = DEADLINE_MS


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    # /early answers without reading the body, as FastAPI answers a 404, 405 or 413.
    if scope["path"] != "/early":
        while (await receive()).get("more_body"):
            pass
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture
async def port() -> AsyncIterator[int]:
    bound = free_port()
    served = uvicorn.Server(uvicorn.Config(_app, host="127.0.0.1", port=bound, log_level="warning",
                                           lifespan="off", http=_Short, timeout_keep_alive=1))
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
