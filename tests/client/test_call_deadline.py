"""Every SDK call ends by its deadline (`timeout_ms_request`), however the server answers (found
by review): httpx's timeout bounds each read, not the call, so a node or proxy that sent its
answer a byte at a time, each within the read timeout, held the caller for as long as it liked.
Past the deadline a commit is UNKNOWN, as after any answer lost on its way."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import httpx

from services.client import AsyncCornusClient, ClientConfig, CornusClient, Op, Status

DEADLINE_MS = 1_000
# The answer a dripping server promises, one byte per DRIP_S: far longer than the deadline, and
# each byte well within the per-read timeout (the deadline itself).
PROMISED_BYTES = 600
DRIP_S = 0.1
# What the test allows the call beyond its deadline before it calls it hung (it would take
# PROMISED_BYTES * DRIP_S = 60 s without the deadline).
HUNG_S = 10.0


@contextlib.contextmanager
def _dripping_server() -> Iterator[str]:
    """An HTTP server on 127.0.0.1 that answers every request with headers at once and then its
    body a byte at a time."""
    listener = socket.create_server(("127.0.0.1", 0))
    stopping = threading.Event()

    def serve(connection: socket.socket) -> None:
        with connection:
            connection.settimeout(HUNG_S)
            data = b""
            with contextlib.suppress(OSError):
                while b"\r\n\r\n" not in data:
                    data += connection.recv(65536)
                if data.startswith(b"GET /healthz"):
                    # Health answers at once: the client asks a node that does not answer it nothing.
                    health = b'{"status": "ok", "node": "n0", "protocol": "cornus"}'
                    connection.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                                       b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(health), health))
                    return
                connection.sendall(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\n\r\n" % PROMISED_BYTES
                )
                for _ in range(PROMISED_BYTES):
                    if stopping.is_set():
                        return
                    connection.sendall(b" ")
                    time.sleep(DRIP_S)

    def accept() -> None:
        with contextlib.suppress(OSError):
            while not stopping.is_set():
                connection, _ = listener.accept()
                threading.Thread(target=serve, args=(connection,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stopping.set()
        listener.close()


def test_a_commit_answered_a_byte_at_a_time_ends_unknown_at_its_deadline() -> None:
    with _dripping_server() as url, CornusClient(url, config=ClientConfig(timeout_ms_request=DEADLINE_MS)) as client:
        started = time.monotonic()
        outcome = client.execute([Op.put("k", "v")])
        elapsed = time.monotonic() - started
    assert outcome.status is Status.UNKNOWN, outcome
    assert elapsed < HUNG_S, f"the call took {elapsed:.1f} s, its deadline is {DEADLINE_MS} ms"


async def test_the_async_client_ends_at_its_deadline_alike() -> None:
    with _dripping_server() as url:
        client = AsyncCornusClient(url, config=ClientConfig(timeout_ms_request=DEADLINE_MS))
        try:
            started = time.monotonic()
            outcome = await client.execute([Op.put("k", "v")])
            elapsed = time.monotonic() - started
        finally:
            await client.aclose()
    assert outcome.status is Status.UNKNOWN, outcome
    assert elapsed < HUNG_S, f"the call took {elapsed:.1f} s, its deadline is {DEADLINE_MS} ms"


async def test_an_async_call_that_never_left_its_pool_is_unsent_not_unknown() -> None:
    """The deadline passed while the request waited for the shared client's only connection,
    which the application's own request held (found by review: reported UNKNOWN, though it never
    left). It is unavailable and retryable, as httpx's own pool timeout is."""
    with _dripping_server() as url:
        http = httpx.AsyncClient(limits=httpx.Limits(max_connections=1))
        client = AsyncCornusClient(url, config=ClientConfig(timeout_ms_request=DEADLINE_MS), http=http)
        holding = asyncio.ensure_future(http.get(url, timeout=HUNG_S))
        try:
            await asyncio.sleep(0.2)  # the application's request holds the connection
            outcome = await client.execute([Op.put("k", "v")])
        finally:
            holding.cancel()
            with contextlib.suppress(BaseException):
                await holding
            await http.aclose()
    assert outcome.status is Status.UNAVAILABLE and outcome.retryable, outcome


class _LateAnsweringTransport(httpx.AsyncBaseTransport):
    """A transport not built on httpcore (a test double, an in-process app, a wrapper): it gets
    every request, runs it, and answers late. It sends no trace events."""

    def __init__(self) -> None:
        self.delivered: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.delivered.append(request.url.path)
        if request.url.path == "/healthz":  # at once: a node whose health is late gets no one-shot
            return httpx.Response(200, json={"status": "ok", "node": "n0", "protocol": "cornus"})
        await asyncio.sleep(0.5)
        return httpx.Response(200, json={"txn": "t", "outcome": "committed", "retryable": False})


async def test_a_late_answer_through_a_transport_without_traces_is_unknown_not_sent_again() -> None:
    """Found by review: "never sent" was inferred from the absence of httpcore's trace event for
    the request's headers, which a transport not built on httpcore never sends: every late answer
    counted as unsent, and the write went to the next node, six times, then the caller was told
    nothing committed. Only the default transport's silence means the request waited in its pool."""
    transport = _LateAnsweringTransport()
    config = ClientConfig(timeout_ms_request=100, retry_count_max=2)
    async with AsyncCornusClient(["http://127.0.0.1:9", "http://127.0.0.1:10"], config=config,
                                 http=httpx.AsyncClient(transport=transport)) as client:
        outcome = await client.execute([Op.put("k", "v")])
    assert outcome.status is Status.UNKNOWN, outcome
    # Its /healthz, and then the execute itself, once.
    assert transport.delivered.count("/v1/execute") == 1, transport.delivered


def test_a_whole_answer_within_the_deadline_is_read_as_before() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"txn": "t1", "outcome": "committed"})

    client = CornusClient("http://node:8100", config=ClientConfig(timeout_ms_request=DEADLINE_MS),
                          http=httpx.Client(transport=httpx.MockTransport(handler)))
    assert client.execute([Op.put("k", "v")]).status is Status.COMMITTED
