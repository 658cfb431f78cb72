"""The built-in driver's HTTP side: one keep-alive HTTP/1.1 connection per client and node, and the
translation of a workload program's requests (loadtests.workloads.base) into the REST API's calls
and of the answers into Replies.

Why not httpx: a request through httpx costs a few hundred microseconds of CPU, so at the rates we
measure the generator would take a core away from the nodes it measures. The exchange here is the
smallest correct HTTP/1.1 client for a server we know (uvicorn: every response has a
Content-Length): tens of microseconds per request. Every request has a deadline.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from loadtests.workloads.base import Commit, Execute, Program, Read, Reply, Request, Write

# Deadline of one HTTP exchange; a node that does not answer within it is counted as failing. A
# commit waits up to 10 s for its outcome before the node answers 202, so this is above that.
TIMEOUT_S_REQUEST = 15.0
# Response heads are a few hundred bytes; a larger one is not uvicorn talking to us.
RESPONSE_HEAD_BYTES_MAX = 16 * 1024
RESPONSE_BODY_BYTES_MAX = 16 * 1024 * 1024
# The answers a one-shot or a commit gets, by HTTP status (anything else is a failure).
_OUTCOME_STATUSES = (200, 202, 409, 503)
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


def _json(data: bytes) -> dict[str, Any]:
    try:
        parsed = json.loads(data)
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def outcome_reply(status: int, data: bytes) -> Reply:
    """The Reply of a one-shot or a commit: the API's outcome, by its documented statuses."""
    body = _json(data)
    outcome = body.get("outcome")
    if status not in _OUTCOME_STATUSES or outcome not in ("committed", "aborted", "unavailable", "unknown"):
        return Reply("failed", str(body.get("error") or status))
    reads = body.get("reads") or {}
    timing = body.get("timing_ms") or {}
    return Reply(outcome, str(body.get("reason") or ""), bool(body.get("retryable", False)),
                 dict(reads) if isinstance(reads, dict) else {}, dict(timing) if isinstance(timing, dict) else {})


def step_reply(status: int, data: bytes) -> Reply:
    """The Reply of a read or write inside a transaction: `active` on 200, else how it ended."""
    if status == 200:
        values = _json(data).get("values") or {}
        return Reply("active", values=dict(values) if isinstance(values, dict) else {})
    if status == 409 and _json(data).get("outcome") == "aborted":
        return outcome_reply(status, data)
    body = _json(data)
    return Reply("failed", str(body.get("error") or status))


async def run_program(connection: HttpConnection, program: Program) -> Reply:
    """Run one attempt of a transaction program over `connection` and return its last reply. A
    transport failure before the commit request is `failed` (nothing can have committed), during
    it `unknown`. An interactive transaction the program leaves early is aborted (best effort)."""
    txn = ""
    reply = Reply("failed", "no request")
    try:
        request: Request = next(program)
        while True:
            final = isinstance(request, Execute | Commit)
            try:
                if isinstance(request, Execute):
                    status, data = await connection.post("/v1/execute", json.dumps({"ops": request.ops}).encode())
                    reply = outcome_reply(status, data)
                else:
                    if not txn:
                        status, data = await connection.post("/v1/txn", b"{}")
                        txn = str(_json(data).get("txn", "")) if status == 201 else ""
                        if not txn:
                            return Reply("unavailable" if status == 503 else "failed", f"begin {status}",
                                         retryable=status == 503)
                    if isinstance(request, Read):
                        status, data = await connection.post(f"/v1/txn/{txn}/read",
                                                             json.dumps({"keys": request.keys}).encode())
                        reply = step_reply(status, data)
                    elif isinstance(request, Write):
                        status, data = await connection.post(f"/v1/txn/{txn}/write",
                                                             json.dumps({"writes": dict(request.writes)}).encode())
                        reply = step_reply(status, data)
                    else:
                        status, data = await connection.post(f"/v1/txn/{txn}/commit", b"")
                        txn = ""  # ended, whatever the answer
                        reply = outcome_reply(status, data)
            except (*TRANSPORT_ERRORS, BenchHttpError) as error:
                if isinstance(request, Commit):
                    txn = ""
                return Reply("unknown" if final else "failed", type(error).__name__)
            if final:
                try:
                    program.send(reply)
                except StopIteration:
                    return reply
                raise RuntimeError("a workload program made a request after its transaction ended")
            if reply.outcome != "active":
                txn = ""  # the node ended it
                return reply
            request = program.send(reply)
    finally:
        program.close()
        if txn:
            await _abort_quietly(connection, txn)


async def _abort_quietly(connection: HttpConnection, txn: str) -> None:
    # Frees the transaction's locks now rather than at the node's idle timeout; if this fails too,
    # that timeout still ends it.
    try:
        await connection.post(f"/v1/txn/{txn}/abort", b"")
    except (*TRANSPORT_ERRORS, BenchHttpError):
        pass
