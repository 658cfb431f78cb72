"""uvicorn's HTTP/1.1 protocol, with each response's head and body sent in one socket write.

uvicorn writes a response's status line and headers, then its body, as two `transport.write`
calls, and uvloop sends each at once: two system calls and two TCP segments per response, and a
client that wakes for the headers and again for the body. Every one-shot transaction is one such
response. The transport here holds a header block (a write ending in the blank line that ends an
HTTP head) and sends it with the next write, which for uvicorn comes in the same step of the same
task; if none comes by the end of the event-loop tick, the head leaves alone. Every other write
leaves at once, so nothing waits for a later tick.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

_HEAD_END = b"\r\n\r\n"


class GatheringTransport:
    """A transport that sends a held HTTP head together with the write after it; everything else
    is the wrapped transport's. Closing sends the held head first, aborting drops it, as a socket
    would."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held = b""

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if self._held:
            data = self._held + bytes(data)
            self._held = b""
        elif bytes(data[-len(_HEAD_END):]) == _HEAD_END:
            # Copied: a caller may reuse a bytearray or a memoryview's buffer after write returns.
            self._held = bytes(data)
            self._loop.call_soon(self.flush)
            return
        if not self._transport.is_closing():
            self._transport.write(data)

    def writelines(self, parts: list[bytes]) -> None:
        for part in parts:
            self.write(part)

    def flush(self) -> None:
        """Send a held head now (the tick ended, or the connection is closing)."""
        if self._held:
            held, self._held = self._held, b""
            if not self._transport.is_closing():
                self._transport.write(held)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + len(self._held)

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._held = b""
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:
        # Reading side, flow control, extra info: the wrapped transport's own.
        return getattr(self._transport, name)


class GatheringHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol over a GatheringTransport; pass as `uvicorn.Config(http=...)`."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(GatheringTransport(transport, self.loop))  # type: ignore[arg-type]
