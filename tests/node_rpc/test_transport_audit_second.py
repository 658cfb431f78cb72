"""PeerTransport: what the second audit of 2026-11-28 found, each over real loopback sockets.

Helpers (raw connections, frame reading, the recording handler) are the transport tests'.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from cornus.runtime.config import load_node_config, parse_peers
from services.node_rpc._generated import node_pb2 as pb
from services.node_rpc.transport import PeerTransport, TransportLimits
from storage_adapters.errors import ValidationError
from tests.node_rpc.test_transport import (
    RECEIVE_WAIT_S,
    Recorder,
    _execute,
    _raw_connection,
    _read_frame,
    _write_frame,
    codec_decode_txn,
    linking_to_a_raw_b,
    wait_until,
)
from tests.worker import free_port

# Long enough for a link with the least backoff (20 ms, doubling to 2 s) to have tried a few times.
LINK_WATCH_S = 0.5
# A pod holding every inbound slot keeps it far longer than this; a real peer gets in well within.
LOCKED_OUT_WAIT_MS = 3_000
# How long the no-hello connections are let live at the node under attack: past LOCKED_OUT_WAIT_MS,
# so only making room for the real peer, not the no-hello deadline, can let it in.
ATTACKER_HELLO_PATIENCE_MS = 30_000
# A request's budget, and how long its link takes to come up after it was queued.
QUEUED_BUDGET_MS = 1_000
QUEUED_WAIT_S = 0.9
QUEUED_LONG_BUDGET_MS = 10_000
# A first frame far past what a hello needs, and far below what a frame may be after it.
FIRST_FRAME_BYTES = 1024 * 1024
# The wire tag of PeerFrame.items (field 2, length-delimited) and an empty envelope's length.
_ITEMS_TAG = bytes([(2 << 3) | 2])
_EMPTY_LENGTH = bytes([0])


async def test_a_peer_address_idna_cannot_encode_keeps_its_link_retrying() -> None:
    """Found by audit (2026-11-28, second): the link's connect loop caught only OSError,
    TimeoutError and a broken hello, and its task had no done callback. A peer address IDNA cannot
    encode ("n..x", or a DNS label over 63 characters, which the config's address pattern let
    through) raised UnicodeError from the connect: the link task ended for good and silently, and
    the link stayed DOWN for the process's life. A failed attempt of any kind is retried."""
    transport = PeerTransport("a", f"127.0.0.1:{free_port()}", {"b": "n..x:7000"})
    await transport.start(Recorder("a"))
    try:
        await asyncio.sleep(LINK_WATCH_S)
        task = transport._links["b"]._task
        assert task is not None and not task.done(), "the link task ended"
        assert transport.peer_counters("b").connect_failure_count >= 2
        assert "UnicodeError" in transport.link_down_reason("b")
    finally:
        await transport.close()


@pytest.mark.parametrize("address", ["a..b:7000", ".a:7000", f"{'x' * 64}.cornus:7000", "a.b..:7000"])
def test_a_peer_address_with_an_empty_or_overlong_dns_label_is_refused(address: str) -> None:
    """Found by audit (2026-11-28, second): the config's address pattern took a host with an empty
    DNS label or one over 63 characters, which no connect can encode: the node started, and its
    link to that peer failed for ever (before the transport retried it, its link task died)."""
    with pytest.raises(ValidationError, match="label"):
        parse_peers(f"n0=127.0.0.1:7000,n1={address}")
    with pytest.raises(ValidationError, match="label"):
        load_node_config(environ={}, overrides={"node_id": "n0", "peers": f"n0={address}", "partition_count": 2})


def test_hosts_a_connect_can_encode_still_load() -> None:
    """The label check refuses only what IDNA refuses: names, a trailing root dot, IPv4, IPv6."""
    long_label = "x" * 63
    peers = parse_peers(f"n0=node-0.cornus:7000,n1={long_label}.cornus.:7001,n2=10.0.0.2:7002,n3=[::1]:7003")
    assert len(peers) == 4


async def test_connections_that_never_say_hello_cannot_lock_a_real_peer_out() -> None:
    """Found by audit (2026-11-28, second): the cap on inbound connections counted those still in
    their TLS handshake or yet to say hello, and past it refused every new one. A pod that opened
    that many connections and said nothing (no certificate needed, even with TLS), reopening each
    as it was closed, kept the real peers out of a restarted node. At the cap the oldest
    connection yet to say hello is closed to make room."""
    address_a, address_b = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    b = PeerTransport("b", address_b, {"a": address_a}, TransportLimits(connect_timeout_ms=ATTACKER_HELLO_PATIENCE_MS))
    await b.start(Recorder("b"))
    a = PeerTransport("a", address_a, {"b": address_b})
    silent: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        for _ in range(b.inbound_connection_count_max):
            silent.append(await _raw_connection(address_b))
        await wait_until(lambda: len(b._inbound) == b.inbound_connection_count_max, "b holds every silent connection")
        await a.start(Recorder("a"))
        assert await a.wait_connected("b", LOCKED_OUT_WAIT_MS), "a is locked out of b"
        assert b.inbound.evicted_connection_count >= 1
        assert len(b._inbound) <= b.inbound_connection_count_max
    finally:
        for _, writer in silent:
            writer.close()
        await a.close()
        await b.close()


async def test_connections_that_said_hello_are_never_closed_to_make_room() -> None:
    """At the cap, with every counted connection past its hello, a new connection is refused, and
    none of those that said hello is closed for it."""
    address_b = f"127.0.0.1:{free_port()}"
    b = PeerTransport("b", address_b, {})
    await b.start(Recorder("b"))
    greeted: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        for index in range(b.inbound_connection_count_max):
            reader, writer = await _raw_connection(address_b)
            _write_frame(writer, pb.PeerFrame(sender=f"probe-{index}"))
            hello = await _read_frame(reader)
            assert hello is not None and hello.sender == "b"
            greeted.append((reader, writer))
        reader, writer = await _raw_connection(address_b)
        assert await asyncio.wait_for(reader.read(1), RECEIVE_WAIT_S) == b""  # refused: closed at once
        writer.close()
        assert b.inbound.refused_connection_count == 1
        assert b.inbound.evicted_connection_count == 0
        assert len(b._inbound) == b.inbound_connection_count_max
        for greeted_reader, _ in greeted:
            assert not greeted_reader.at_eof()
    finally:
        for _, writer in greeted:
            writer.close()
        await b.close()


async def test_a_request_queued_while_its_link_connected_carries_only_the_time_left() -> None:
    """Found by audit (2026-11-28, second): a request queued while its link connected went out
    with its whole original timeout_ms, and the peer timed it from arrival: it could run (and
    take locks) well after its caller had given up. It carries the time its caller has left."""
    requests: list[asyncio.Future[object]] = []
    try:
        async with linking_to_a_raw_b() as (transport, reader, writer):
            budgets_ms = {"short": QUEUED_BUDGET_MS, "long": QUEUED_LONG_BUDGET_MS}
            queued_s = time.monotonic()
            requests += [transport.start_request("b", _execute(txn), budget) for txn, budget in budgets_ms.items()]
            await asyncio.sleep(QUEUED_WAIT_S)
            waited_ms = (time.monotonic() - queued_s) * 1000
            _write_frame(writer, pb.PeerFrame(sender="b"))
            frame = await _read_frame(reader)
            assert frame is not None
            sent = {codec_decode_txn(envelope): envelope.timeout_ms for envelope in frame.items}
            # "short" may have expired on a slow box (and then is never sent); "long" cannot have.
            assert "long" in sent, sent
            for txn, timeout_ms in sent.items():
                assert 1 <= timeout_ms <= budgets_ms[txn] - waited_ms + 1, (txn, timeout_ms, waited_ms)
            if "short" in sent:
                assert sent["short"] <= 150
    finally:
        for request in requests:
            request.cancel()


def _first_frame_of_empty_items(bytes_min: int) -> bytes:
    """A length-prefixed PeerFrame of at least `bytes_min` bytes: a sender and empty envelopes,
    the cheapest bytes to send and among the dearest to parse."""
    head = pb.PeerFrame(sender="raw").SerializeToString()
    item = _ITEMS_TAG + _EMPTY_LENGTH
    body = head + item * ((bytes_min - len(head)) // len(item) + 1)
    return len(body).to_bytes(4, "big") + body


async def test_a_first_frame_larger_than_a_hello_is_refused_unparsed() -> None:
    """Found by audit (2026-11-28, second): a frame was parsed whole before its limits were
    checked, the hello included, so any connection, before saying who it was, could make a node
    parse up to message_bytes_max (16 MiB: 8 million empty envelopes, about 0.4 s of CPU and
    500 MB). A frame before the hello may be no larger than a hello needs; a larger one ends the
    connection as soon as its length is read, unparsed."""
    address_b = f"127.0.0.1:{free_port()}"
    b = PeerTransport("b", address_b, {})
    await b.start(Recorder("b"))
    try:
        reader, writer = await _raw_connection(address_b)
        writer.write(_first_frame_of_empty_items(FIRST_FRAME_BYTES))
        # Closed with our bytes unread, b's end resets the connection rather than ending it.
        with contextlib.suppress(ConnectionResetError):
            assert await _read_frame(reader) is None, "b answered the hello: it parsed the frame"
        writer.close()
        assert b.inbound.stream_count == 0, "b took the frame for a hello: it parsed it"
    finally:
        await b.close()


async def test_a_probe_hello_with_its_status_request_still_fits() -> None:
    """The bound on a first frame leaves room for what a tool's probe sends with its hello."""
    address_b = f"127.0.0.1:{free_port()}"
    b = PeerTransport("b", address_b, {})
    await b.start(Recorder("b"))
    try:
        reader, writer = await _raw_connection(address_b)
        frame = pb.PeerFrame(sender="probe-" + "x" * 200)
        probe = frame.items.add(kind=pb.ENVELOPE_KIND_REQUEST, correlation_id=1, timeout_ms=1_000)
        probe.status_request.SetInParent()
        _write_frame(writer, frame)
        hello = await _read_frame(reader)
        assert hello is not None and hello.sender == "b"
        reply = await _read_frame(reader)
        assert reply is not None and reply.items[0].status_response.node == "b"
        writer.close()
    finally:
        await b.close()
