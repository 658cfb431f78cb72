"""A response's head and body leave the node in one socket write (services/api/http_writes.py),
checked on a real uvicorn server over a real socket; what the client receives never changes, and
nothing waits for a later tick."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import uvicorn

from services.api.http_writes import GatheringHttpToolsProtocol, GatheringTransport
from tests.worker import free_port

SERVER_START_TIMEOUT_S = 10
READ_TIMEOUT_S = 5

Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]


class _CountingTransport:
    """The real socket transport, counting the writes that reach it."""

    def __init__(self, transport: asyncio.Transport, writes: list[int]) -> None:
        self._transport = transport
        self._writes = writes

    def write(self, data: bytes) -> None:
        self._writes.append(len(data))
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


async def _app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
    """/small: one body; /stream: three 40 KiB chunks; /slow: the body a tick after the headers."""
    assert scope["type"] == "http"
    while (await receive()).get("more_body"):
        pass
    path = scope["path"]
    if path == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        for chunk in (b"a", b"b", b"c"):
            await send({"type": "http.response.body", "body": chunk * 40_960, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return
    body = b'{"ok":true}'
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    if path == "/slow":
        await asyncio.sleep(0.05)
    await send({"type": "http.response.body", "body": body})


@pytest.fixture
async def server() -> AsyncIterator[tuple[int, list[int]]]:
    writes: list[int] = []

    class Counting(GatheringHttpToolsProtocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(_CountingTransport(transport, writes))  # type: ignore[arg-type]

    port = free_port()
    served = uvicorn.Server(uvicorn.Config(_app, host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="off", http=Counting))
    task = asyncio.create_task(served.serve())
    async with asyncio.timeout(SERVER_START_TIMEOUT_S):
        while not served.started:  # noqa: ASYNC110 - uvicorn's flag, it has no event to wait on
            await asyncio.sleep(0.01)
    try:
        yield port, writes
    finally:
        served.should_exit = True
        async with asyncio.timeout(SERVER_START_TIMEOUT_S):
            await task


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str) -> tuple[bytes, bytes]:
    writer.write(f"GET {path} HTTP/1.1\r\nhost: test\r\n\r\n".encode())
    async with asyncio.timeout(READ_TIMEOUT_S):
        head = await reader.readuntil(b"\r\n\r\n")
        if b"transfer-encoding: chunked" in head:
            body = bytearray()
            while True:
                size = int((await reader.readuntil(b"\r\n")).strip(), 16)
                chunk = await reader.readexactly(size + 2)
                if size == 0:
                    return head, bytes(body)
                body += chunk[:-2]
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.startswith(b"content-length")))
        return head, await reader.readexactly(length)


async def test_each_response_is_one_write_and_keep_alive_still_works(server: tuple[int, list[int]]) -> None:
    port, writes = server
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for _ in range(3):
            head, body = await _exchange(reader, writer, "/small")
            assert head.startswith(b"HTTP/1.1 200 OK") and body == b'{"ok":true}'
        # Three responses, three writes: headers and body went together each time.
        assert len(writes) == 3, writes
    finally:
        writer.close()


async def test_a_body_sent_a_tick_later_is_not_held_back(server: tuple[int, list[int]]) -> None:
    port, writes = server
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        head, body = await _exchange(reader, writer, "/slow")
        assert head.startswith(b"HTTP/1.1 200 OK") and body == b'{"ok":true}'
        assert len(writes) == 2, writes  # the headers left at the end of their own tick
    finally:
        writer.close()


async def test_a_streamed_body_leaves_chunk_by_chunk(server: tuple[int, list[int]]) -> None:
    port, writes = server
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        _, body = await _exchange(reader, writer, "/stream")
        assert body == b"a" * 40_960 + b"b" * 40_960 + b"c" * 40_960
        # The head with the first chunk, then each chunk as it is sent, then the last-chunk mark.
        assert len(writes) == 4, writes
    finally:
        writer.close()


class _Recording:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closed = self.aborted = False

    def write(self, data: bytes) -> None:
        assert not self.closed
        self.written.append(data)

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def get_write_buffer_size(self) -> int:
        return 0


async def test_a_held_head_leaves_on_close_and_is_dropped_on_abort() -> None:
    loop = asyncio.get_running_loop()
    inner = _Recording()
    gathering = GatheringTransport(inner, loop)  # type: ignore[arg-type]
    gathering.write(b"not a head")
    assert inner.written == [b"not a head"], "anything but a head leaves at once"
    gathering.write(bytearray(b"HTTP/1.1 200 OK\r\n\r\n"))
    assert inner.written == [b"not a head"] and gathering.get_write_buffer_size() == 19
    gathering.close()
    assert inner.written == [b"not a head", b"HTTP/1.1 200 OK\r\n\r\n"] and inner.closed
    await asyncio.sleep(0)  # the tick-end flush finds nothing held and writes nothing to a closed transport
    assert len(inner.written) == 2

    dropped = _Recording()
    gathering = GatheringTransport(dropped, loop)  # type: ignore[arg-type]
    gathering.write(b"HTTP/1.1 200 OK\r\n\r\n")
    gathering.abort()
    await asyncio.sleep(0)
    assert dropped.written == [] and dropped.aborted
