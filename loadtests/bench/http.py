"""The built-in driver's HTTP side: one keep-alive HTTP/1.1 connection per client and node, over
which it runs a workload program's steps (loadtests.api.exchange), each the REST call
loadtests.api.rest names, its answer read by loadtests.api.replies.

Why not httpx: a request through httpx costs a few hundred microseconds of CPU, so at the rates we
measure the generator would take a core away from the nodes it measures. The exchange here is the
smallest correct HTTP/1.1 client for a server we know (uvicorn: every response has a
Content-Length): tens of microseconds per request. Every request has a deadline.
"""

from __future__ import annotations

import asyncio

from loadtests.api.exchange import Step, run_async
from loadtests.api.replies import no_answer, rest_reply
from loadtests.api.rest import rest_call
from loadtests.workloads.base import Program, Reply

# Deadline of one HTTP exchange; a node that does not answer within it is counted as failing. A
# commit waits up to 10 s for its outcome before the node answers 202, so this is above that.
TIMEOUT_S_REQUEST = 15.0
# Response heads are a few hundred bytes; a larger one is not uvicorn talking to us.
RESPONSE_HEAD_BYTES_MAX = 16 * 1024
# The largest answer is an end-of-run read of CHECK_BATCH_KEY_COUNT_MAX values, well under a
# megabyte; a body this large is not an answer of ours.
RESPONSE_BODY_BYTES_MAX = 16 * 1024 * 1024
TRANSPORT_ERRORS = (OSError, TimeoutError, asyncio.IncompleteReadError)


class BenchHttpError(Exception):
    """The node answered something that is not an HTTP/1.1 response we can read."""


class HttpConnection:
    """One keep-alive connection; one request at a time."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._prefix = f"POST {{path}} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        """(status, body) of one POST, within TIMEOUT_S_REQUEST. A broken connection is reopened
        on the next call."""
        try:
            async with asyncio.timeout(TIMEOUT_S_REQUEST):
                return await self._exchange(path, body)
        except BaseException:
            self.close()
            raise

    async def _exchange(self, path: str, body: bytes) -> tuple[int, bytes]:
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        assert self._reader is not None
        head = self._prefix.format(path=path) + f"Content-Length: {len(body)}\r\n\r\n"
        self._writer.write(head.encode("ascii") + body)
        try:
            response_head = await self._reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError as error:
            raise BenchHttpError("response head too long") from error
        if len(response_head) > RESPONSE_HEAD_BYTES_MAX:
            raise BenchHttpError("response head too long")
        lines = response_head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise BenchHttpError(f"not an HTTP/1.1 status line: {lines[0][:80]!r}")
        length = -1
        close = False
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value.strip())
            elif name == "connection" and value.strip().lower() == "close":
                close = True
        if not 0 <= length <= RESPONSE_BODY_BYTES_MAX:
            raise BenchHttpError(f"response without a usable Content-Length ({length})")
        data = await self._reader.readexactly(length)
        if close:
            self.close()
        return int(parts[1]), data

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None


async def call(connection: HttpConnection, step: Step) -> Reply:
    """One step of loadtests.api.exchange over `connection`."""
    request = rest_call(step)
    try:
        status, data = await connection.post(request.path, request.body)
    except (*TRANSPORT_ERRORS, BenchHttpError) as error:
        return no_answer(step, type(error).__name__)
    return rest_reply(step, status, data)


async def run_program(connection: HttpConnection, program: Program) -> Reply:
    """Run one attempt of a transaction program over `connection` and return its last reply."""
    return await run_async(program, lambda step: call(connection, step))
