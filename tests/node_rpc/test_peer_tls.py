"""Mutual TLS on the peer port (cornus.runtime.peer_tls): real sockets over loopback, real
certificates, and the connections it must refuse.

Found by audit (2026-11-27): the peer port took any connection that sent a hello, so anything
that could reach it (any pod of a flat cluster network) could send a participant a Decision it
applies. These tests failed on the code before TLS: the transport took no TLS at all.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cornus.protocol.messages import Decision, Vote
from cornus.runtime.peer_tls import PeerTlsConfig, PeerTlsContexts
from loadtests.bench.tls_certs import ThrowawayCa, TlsFiles
from services.node_rpc._generated import node_pb2 as pb
from services.node_rpc.codec import encode
from services.node_rpc.transport import LinkState, PeerTransport, TransportLimits
from storage_adapters.contract import TxnState
from storage_adapters.errors import ValidationError
from tests.node_rpc.test_transport import (
    CONNECT_WAIT_MS,
    REQUEST_TIMEOUT_MS,
    Recorder,
    _execute,
    wait_until,
)
from tests.worker import free_port

# Short, so that a refused connection is seen to end within a test's patience.
LIMITS = TransportLimits(connect_timeout_ms=1_000, reconnect_backoff_ms_max=200)
REFUSED_WAIT_S = 5.0


def contexts(files: TlsFiles, verify_hostname: bool = True) -> PeerTlsContexts:
    return PeerTlsConfig(files.cert_file, files.key_file, files.ca_file, verify_hostname).contexts()


@pytest.fixture
def ca(tmp_path: Path) -> ThrowawayCa:
    return ThrowawayCa(tmp_path / "ca")


async def _pair(tls_a: PeerTlsContexts | None, tls_b: PeerTlsContexts | None,
                ) -> tuple[PeerTransport, PeerTransport, Recorder]:
    address_a, address_b = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    a = PeerTransport("a", address_a, {"b": address_b}, LIMITS, tls=tls_a)
    b = PeerTransport("b", address_b, {"a": address_a}, LIMITS, tls=tls_b)
    recorder_b = Recorder("b")
    await a.start(Recorder("a"))
    await b.start(recorder_b)
    return a, b, recorder_b


@pytest.fixture
async def tls_pair(ca: ThrowawayCa) -> AsyncIterator[tuple[PeerTransport, PeerTransport, Recorder]]:
    a, b, recorder_b = await _pair(contexts(ca.issue("a")), contexts(ca.issue("b")))
    yield a, b, recorder_b
    await a.close()
    await b.close()


async def test_peers_of_one_ca_exchange_messages_and_requests(
    tls_pair: tuple[PeerTransport, PeerTransport, Recorder],
) -> None:
    a, b, recorder_b = tls_pair
    assert await a.wait_connected("b", CONNECT_WAIT_MS)
    assert await b.wait_connected("a", CONNECT_WAIT_MS)
    a.send("b", Vote(txn="t1", partition="p", yes=True))
    assert await recorder_b.next_message() == ("a", Vote(txn="t1", partition="p", yes=True))
    response = await a.request("b", _execute("ok", b"x"), REQUEST_TIMEOUT_MS)
    assert response.detail == "b from a"


async def test_a_plain_connection_is_refused_before_its_decision_is_read(
    tls_pair: tuple[PeerTransport, PeerTransport, Recorder],
) -> None:
    """A hello and a Decision sent without TLS are never delivered; the connection ends within
    the connect timeout, and the slot it held is freed."""
    a, b, recorder_b = tls_pair
    assert await a.wait_connected("b", CONNECT_WAIT_MS)
    await wait_until(lambda: len(b._inbound) == 1, "a's own connection to b")
    host, _, port = b.listen_address.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    frame = pb.PeerFrame(sender="a")  # claims to be a member
    encode(frame.items.add(kind=pb.ENVELOPE_KIND_MESSAGE), Decision(txn="forged", decision=TxnState.COMMIT))
    data = frame.SerializeToString()
    writer.write(len(data).to_bytes(4, "big") + data)
    async with asyncio.timeout(REFUSED_WAIT_S):
        while await reader.read(1024):  # a TLS alert at most, then the end
            pass
    writer.close()
    await wait_until(lambda: len(b._inbound) == 1, "the plain connection's slot freed")
    assert recorder_b.messages.empty(), "a message of a connection without a certificate was delivered"
    assert b.inbound.malformed_count >= 1


async def test_a_peer_whose_certificate_another_ca_signed_is_refused_both_ways(
    ca: ThrowawayCa, tmp_path: Path,
) -> None:
    stranger = ThrowawayCa(tmp_path / "other", name="other-ca").issue("a")
    a, b, recorder_b = await _pair(contexts(stranger), contexts(ca.issue("b")))
    try:
        await wait_until(lambda: a.peer_counters("b").connect_failure_count >= 2, "a's attempts refused")
        await wait_until(lambda: b.peer_counters("a").connect_failure_count >= 2, "b's attempts refused")
        assert a.link_state("b") is not LinkState.UP and b.link_state("a") is not LinkState.UP
        assert "CERTIFICATE_VERIFY_FAILED" in b.link_down_reason("a") or "certificate" in b.link_down_reason("a")
        assert recorder_b.messages.empty()
        await a.close()  # no more attempts: what b held for them is freed within its connect timeout
        await wait_until(lambda: not b._inbound, "b holds no slot for a's refused connections")
    finally:
        await a.close()
        await b.close()


async def test_a_node_without_tls_and_one_with_it_do_not_connect(ca: ThrowawayCa) -> None:
    a, b, recorder_b = await _pair(None, contexts(ca.issue("b")))
    try:
        await wait_until(lambda: a.peer_counters("b").connect_failure_count >= 2, "a's plain attempts refused")
        await wait_until(lambda: b.peer_counters("a").connect_failure_count >= 2, "b's TLS attempts refused")
        a.send("b", Vote(txn="t1", partition="p", yes=True))
        await asyncio.sleep(0.1)
        assert recorder_b.messages.empty()
    finally:
        await a.close()
        await b.close()


async def test_a_certificate_that_does_not_name_the_host_dialed_is_refused_unless_told_not_to_check(
    ca: ThrowawayCa,
) -> None:
    """b's certificate names only b.cornus.test, not the 127.0.0.1 a dials: a refuses it; with
    verify_hostname false any certificate of the CA is taken."""
    b_files = ca.issue("b", hosts=("b.cornus.test",))
    a, b, _ = await _pair(contexts(ca.issue("a")), contexts(b_files))
    try:
        await wait_until(lambda: a.peer_counters("b").connect_failure_count >= 2, "a's attempts refused")
        assert a.link_state("b") is not LinkState.UP
        assert "hostname" in a.link_down_reason("b") or "IP address mismatch" in a.link_down_reason("b")
        assert await b.wait_connected("a", CONNECT_WAIT_MS)  # a's certificate names 127.0.0.1
    finally:
        await a.close()
        await b.close()
    a, b, recorder_b = await _pair(contexts(ca.issue("a2"), verify_hostname=False), contexts(b_files))
    try:
        assert await a.wait_connected("b", CONNECT_WAIT_MS)
        a.send("b", Vote(txn="t2", partition="p", yes=True))
        assert (await recorder_b.next_message())[1] == Vote(txn="t2", partition="p", yes=True)
    finally:
        await a.close()
        await b.close()


def test_files_that_cannot_be_used_are_refused_by_name(ca: ThrowawayCa, tmp_path: Path) -> None:
    files = ca.issue("a")
    other = ca.issue("b")
    with pytest.raises(ValidationError, match="ca_file"):
        PeerTlsConfig(files.cert_file, files.key_file, str(tmp_path / "missing.crt")).contexts()
    with pytest.raises(ValidationError, match="cert_file"):
        PeerTlsConfig(files.cert_file, other.key_file, files.ca_file).contexts()  # a key of another certificate
    with pytest.raises(ValidationError, match="cert_file"):
        PeerTlsConfig(files.ca_file + ".nope", files.key_file, files.ca_file).contexts()
    with pytest.raises(ValidationError, match="key_file"):
        PeerTlsConfig(files.cert_file, "", files.ca_file)
    with pytest.raises(ValidationError, match="verify_hostname"):
        PeerTlsConfig(files.cert_file, files.key_file, files.ca_file, "yes")  # type: ignore[arg-type]


def test_contexts_speak_tls_1_3_and_require_a_certificate_both_ways(ca: ThrowawayCa) -> None:
    built = contexts(ca.issue("a"))
    for context in (built.server, built.client):
        assert context.minimum_version is ssl.TLSVersion.TLSv1_3
        assert context.verify_mode is ssl.CERT_REQUIRED
    assert built.client.check_hostname
