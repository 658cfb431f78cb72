"""PeerTransport between real OS processes over loopback sockets, and its failure behaviour.

The peer runs `tests.node_rpc.peer_process`, which echoes messages back over its own outbound
stream. Deadlines are asserted only as upper bounds with generous slack; nothing here measures
speed (the bench does).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from cornus.protocol.messages import Decision, Message, Prepare, Vote
from cornus.runtime.transport import PeerUnavailable
from cornus.runtime.wire import (
    ExecuteRequest,
    ExecuteResponse,
    ExecuteStatus,
    Op,
    OpKind,
    PeerRequest,
    PeerResponse,
    Routed,
    StatusRequest,
    StatusResponse,
)
from services.node_rpc import codec
from services.node_rpc._generated import node_pb2 as pb
from services.node_rpc.transport import LinkState, MessageTooLarge, PeerTransport, TransportLimits
from storage_adapters.contract import TxnState
from tests.node_rpc.conftest import PeerProcess
from tests.worker import free_port

CONNECT_WAIT_MS = 20_000
RECEIVE_WAIT_S = 20.0
REQUEST_TIMEOUT_MS = 10_000
# Slack on deadline bounds for a loaded 2-core box.
DEADLINE_SLACK_S = 2.0
POLL_INTERVAL_S = 0.01


class Recorder:
    """The test process's inbound handler: keeps what arrives, answers status requests."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.messages: asyncio.Queue[tuple[str, Routed | Message]] = asyncio.Queue()
        self.requests: list[tuple[str, PeerRequest]] = []
        self.tasks: list[asyncio.Task[Any] | None] = []  # the task each request was served in
        self.cancelled: list[str] = []  # txns whose handler was cancelled

    def on_message(self, sender: str, message: Routed | Message) -> None:
        self.messages.put_nowait((sender, message))

    async def on_request(self, sender: str, request: PeerRequest) -> PeerResponse:
        self.requests.append((sender, request))
        self.tasks.append(asyncio.current_task())
        if isinstance(request, ExecuteRequest):
            if request.txn.startswith("sleep:"):
                try:
                    await asyncio.sleep(int(request.txn.removeprefix("sleep:")) / 1000)
                except asyncio.CancelledError:
                    self.cancelled.append(request.txn)
                    raise
            if request.txn == "raise":
                raise RuntimeError("asked to fail")
            if request.txn == "unencodable":
                # A handler's bug the codec refuses: values must be bytes or None.
                return ExecuteResponse(status=ExecuteStatus.OK, values=("not bytes",))  # type: ignore[arg-type]
            return ExecuteResponse(status=ExecuteStatus.OK, detail=f"{self.node_id} from {sender}")
        return StatusResponse(node=self.node_id, ready=True, partitions=("p-local",))

    async def next_message(self) -> tuple[str, Routed | Message]:
        return await asyncio.wait_for(self.messages.get(), RECEIVE_WAIT_S)


async def wait_inbound_streams(transport: PeerTransport, count: int) -> None:
    """Until `count` peers have opened their stream to `transport`. A peer started before us
    found nobody listening, so its link is DOWN (dropping) until its next reconnect attempt."""
    async with asyncio.timeout(CONNECT_WAIT_MS / 1000):
        # A plain counter, polled: the transport has no event for it, and tests should not add one.
        while transport.inbound.stream_count < count:  # noqa: ASYNC110
            await asyncio.sleep(0.01)


async def wait_until(condition: Callable[[], bool], what: str) -> None:
    """Until `condition()` holds, polled: a plain counter or list, the transport has no event for it."""
    try:
        async with asyncio.timeout(RECEIVE_WAIT_S):
            while not condition():  # noqa: ASYNC110
                await asyncio.sleep(POLL_INTERVAL_S)
    except TimeoutError:
        raise AssertionError(f"not within {RECEIVE_WAIT_S} s: {what}") from None


PeerFactory = Callable[[str, int, dict[str, str]], PeerProcess]


@pytest.fixture
async def pair(peer_factory: PeerFactory) -> AsyncIterator[tuple[PeerTransport, Recorder, PeerProcess]]:
    """Node "a" in this process, node "b" in a child process, each knowing the other."""
    port_a, port_b = free_port(), free_port()
    address_a = f"127.0.0.1:{port_a}"
    peer = peer_factory("b", port_b, {"a": address_a})
    transport = PeerTransport("a", address_a, {"b": peer.address, "a": address_a})
    recorder = Recorder("a")
    await transport.start(recorder)
    assert await transport.wait_connected("b", CONNECT_WAIT_MS)
    await wait_inbound_streams(transport, 1)
    yield transport, recorder, peer
    await transport.close()


def _execute(txn: str, *values: bytes) -> ExecuteRequest:
    ops = tuple(Op(kind=OpKind.GET, key=f"k{index}", value=value) for index, value in enumerate(values))
    return ExecuteRequest(txn=txn, partition="p-b", coordinator="a", ops=ops)


async def test_messages_flow_both_ways_in_order(pair: tuple[PeerTransport, Recorder, PeerProcess]) -> None:
    transport, recorder, _ = pair
    sent: list[Routed | Message] = [Vote(txn=f"t{index}", partition="p", yes=index % 2 == 0) for index in range(300)]
    sent.append(Prepare(txn="t", participants=("p1", "p2"), coordinator="a"))
    sent.append(Routed(source="p-b", dest="a", message=Decision(txn="t", decision=TxnState.COMMIT)))
    for message in sent:
        transport.send("b", message)
    # "b" echoes each message back over ITS outbound stream to us.
    received = [await recorder.next_message() for _ in sent]
    assert [message for _, message in received] == sent
    assert {sender for sender, _ in received} == {"b"}
    counters = transport.peer_counters("b")
    # Sent within one tick, the messages went out in far fewer frames than messages.
    assert counters.item_sent_count >= len(sent)
    assert counters.frame_sent_count < counters.item_sent_count
    assert transport.drop_count == 0


async def test_requests_get_their_own_responses(pair: tuple[PeerTransport, Recorder, PeerProcess]) -> None:
    transport, _, _ = pair
    requests = [_execute(f"t{index}", f"v{index}".encode(), None) for index in range(200)]
    responses = await asyncio.gather(*(transport.request("b", request, REQUEST_TIMEOUT_MS) for request in requests))
    for index, response in enumerate(responses):
        assert response == ExecuteResponse(
            status=ExecuteStatus.OK, values=(f"v{index}".encode(), None), detail="b from a"
        )
    status = await transport.request("b", StatusRequest(txn="t1"), REQUEST_TIMEOUT_MS)
    assert status == StatusResponse(
        node="b", ready=True, partitions=("p-b",), txn_states=(("p-b", TxnState.COMMIT),), in_doubt_count=0
    )


async def test_peer_requests_us_over_its_own_stream(pair: tuple[PeerTransport, Recorder, PeerProcess]) -> None:
    transport, recorder, _ = pair
    # "b" handles this by requesting Status from "a" (us) before it answers. Its link to us is up
    # once our hello answer reaches it, a moment after the fixture saw its stream open (which
    # failed a loaded CI run): until then its request fails at once, so the test asks again.
    async with asyncio.timeout(CONNECT_WAIT_MS / 1000):
        while True:
            try:
                response = await transport.request("b", _execute("ask:a"), REQUEST_TIMEOUT_MS)
                break
            except PeerUnavailable as error:
                if "peer a at" not in str(error):
                    raise
                await asyncio.sleep(POLL_INTERVAL_S)
    assert isinstance(response, ExecuteResponse)
    assert response.detail == "b asked a"
    assert recorder.requests == [("b", StatusRequest())]


async def test_handler_failure_is_peer_unavailable(pair: tuple[PeerTransport, Recorder, PeerProcess]) -> None:
    transport, _, _ = pair
    with pytest.raises(PeerUnavailable, match="handler failed"):
        await transport.request("b", _execute("raise"), REQUEST_TIMEOUT_MS)
    # The stream survives a failed handler.
    assert isinstance(await transport.request("b", _execute("ok"), REQUEST_TIMEOUT_MS), ExecuteResponse)


async def test_request_times_out_within_its_deadline(pair: tuple[PeerTransport, Recorder, PeerProcess]) -> None:
    transport, _, _ = pair
    started = time.monotonic()
    with pytest.raises(PeerUnavailable, match="within 300 ms"):
        await transport.request("b", _execute("sleep:5000"), 300)
    assert time.monotonic() - started < 0.3 + DEADLINE_SLACK_S
    assert isinstance(await transport.request("b", _execute("ok"), REQUEST_TIMEOUT_MS), ExecuteResponse)


async def _raw_connection(address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, _, port = address.rpartition(":")
    return await asyncio.open_connection(host, int(port))


def _write_frame(writer: asyncio.StreamWriter, frame: pb.PeerFrame) -> None:
    data = frame.SerializeToString()
    writer.write(len(data).to_bytes(4, "big") + data)


async def _read_frame(reader: asyncio.StreamReader) -> pb.PeerFrame | None:
    """The next non-empty frame, or None at the end of the connection."""
    while True:
        try:
            size = int.from_bytes(await asyncio.wait_for(reader.readexactly(4), RECEIVE_WAIT_S), "big")
            data = await asyncio.wait_for(reader.readexactly(size), RECEIVE_WAIT_S)
        except asyncio.IncompleteReadError:
            return None
        if size:
            return pb.PeerFrame.FromString(data)


async def test_status_probe_from_a_raw_client(pair: tuple[PeerTransport, Recorder, PeerProcess]) -> None:
    """A tool can probe a node with nothing but a socket: hello, then a StatusRequest."""
    _, _, peer = pair
    reader, writer = await _raw_connection(peer.address)
    frame = pb.PeerFrame(sender="probe")
    probe = frame.items.add(kind=pb.ENVELOPE_KIND_REQUEST, correlation_id=1, timeout_ms=REQUEST_TIMEOUT_MS)
    probe.status_request.SetInParent()
    _write_frame(writer, frame)
    hello = await _read_frame(reader)
    assert hello is not None and hello.sender == "b"
    reply = await _read_frame(reader)
    assert reply is not None and reply.items[0].correlation_id == 1
    status = reply.items[0].status_response
    assert status.node == "b"
    assert status.ready
    assert list(status.partitions) == ["p-b"]
    writer.close()


async def test_kill_9_and_restart_on_the_same_port_reconnects(
    pair: tuple[PeerTransport, Recorder, PeerProcess],
) -> None:
    transport, recorder, peer = pair
    written_before = transport.peer_counters("b").item_sent_count
    slow = asyncio.create_task(transport.request("b", _execute("sleep:30000"), 30_000))
    await wait_until(lambda: transport.peer_counters("b").item_sent_count > written_before, "the request is sent")
    started = time.monotonic()
    peer.kill()
    # A request in flight on the dead stream fails at once, not at its 30 s deadline.
    with pytest.raises(PeerUnavailable, match="connection lost"):
        await slow
    assert time.monotonic() - started < DEADLINE_SLACK_S * 2
    assert transport.link_state("b") is LinkState.DOWN

    # While down: requests fail fast and messages are dropped and counted.
    started = time.monotonic()
    with pytest.raises(PeerUnavailable):
        await transport.request("b", _execute("ok"), REQUEST_TIMEOUT_MS)
    assert time.monotonic() - started < DEADLINE_SLACK_S
    drops_before = transport.drop_count
    transport.send("b", Vote(txn="lost", partition="p", yes=True))
    assert transport.drop_count == drops_before + 1

    peer.start()
    assert await transport.wait_connected("b", CONNECT_WAIT_MS)
    await wait_inbound_streams(transport, 2)
    assert transport.reconnect_count >= 1
    assert isinstance(await transport.request("b", _execute("after"), REQUEST_TIMEOUT_MS), ExecuteResponse)
    # And the restarted peer's own outbound stream to us works too (its echo).
    transport.send("b", Vote(txn="again", partition="p", yes=True))
    sender, message = await recorder.next_message()
    assert (sender, message) == ("b", Vote(txn="again", partition="p", yes=True))


async def test_request_to_a_dead_peer_fails_within_its_deadline() -> None:
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    transport = PeerTransport("a", f"127.0.0.1:{free_port()}", {"dead": dead})
    await transport.start(Recorder("a"))
    try:
        for _ in range(3):  # first attempt (CONNECTING), then DOWN while it keeps retrying
            started = time.monotonic()
            with pytest.raises(PeerUnavailable):
                await transport.request("dead", StatusRequest(), 1_000)
            assert time.monotonic() - started < 1.0 + DEADLINE_SLACK_S
        assert not await transport.wait_connected("dead", 200)
        assert transport.peer_counters("dead").connect_failure_count >= 1
    finally:
        await transport.close()


async def test_peer_answering_as_someone_else_is_refused(peer_factory: PeerFactory) -> None:
    port = free_port()
    peer_factory("b", port, {})
    # We think "c" lives at b's address: the hello gives the mistake away.
    transport = PeerTransport("a", f"127.0.0.1:{free_port()}", {"c": f"127.0.0.1:{port}"})
    await transport.start(Recorder("a"))
    try:
        assert not await transport.wait_connected("c", 1_000)
        assert "expected 'c'" in transport.link_down_reason("c")
        with pytest.raises(PeerUnavailable):
            await transport.request("c", StatusRequest(), 1_000)
    finally:
        await transport.close()


# --- In one process (still real sockets): bounds and bad input ---


@pytest.fixture
async def local_pair() -> AsyncIterator[tuple[PeerTransport, PeerTransport, Recorder]]:
    address_a, address_b = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    limits = TransportLimits(send_queue_count_max=64, frame_item_count_max=16, message_bytes_max=64 * 1024)
    a = PeerTransport("a", address_a, {"b": address_b}, limits)
    b = PeerTransport("b", address_b, {"a": address_a}, limits)
    recorder_b = Recorder("b")
    await a.start(Recorder("a"))
    await b.start(recorder_b)
    assert await a.wait_connected("b", CONNECT_WAIT_MS)
    assert await b.wait_connected("a", CONNECT_WAIT_MS)
    yield a, b, recorder_b
    await a.close()
    await b.close()


async def test_full_queue_drops_and_counts(local_pair: tuple[PeerTransport, PeerTransport, Recorder]) -> None:
    a, b, recorder_b = local_pair
    # All in one tick: the writer cannot drain in between, so the queue holds exactly its bound.
    for index in range(100):
        a.send("b", Vote(txn=f"t{index}", partition="p", yes=True))
    assert a.peer_counters("b").drop_count_queue_full == 100 - 64
    assert a.drop_count == 100 - 64
    received = [await recorder_b.next_message() for _ in range(64)]
    assert [message.txn for _, message in received] == [f"t{index}" for index in range(64)]
    # The sender counts a frame once its write returns, which may be after the peer read it.
    async with asyncio.timeout(5):
        while a.peer_counters("b").item_sent_count < 64:  # noqa: ASYNC110 - a counter, no event to wait on
            await asyncio.sleep(0.01)
    counters = a.peer_counters("b")
    # frame_item_count_max bounds every frame.
    assert counters.frame_sent_count >= 64 // 16
    assert b.inbound.item_received_count == 64


async def test_flush_sends_what_is_queued_before_the_tick_ends(
    local_pair: tuple[PeerTransport, PeerTransport, Recorder],
) -> None:
    """A one-shot's coordinator flushes its requests: at the end of the tick they would leave
    behind every callback queued before them."""
    a, _, recorder_b = local_pair
    sent = a.peer_counters("b").item_sent_count
    first = a.start_request("b", _execute("t1"), REQUEST_TIMEOUT_MS)
    second = a.start_request("b", _execute("t2"), REQUEST_TIMEOUT_MS)
    assert a.peer_counters("b").item_sent_count == sent, "queued requests left before the tick ended"
    a.flush()
    assert a.peer_counters("b").item_sent_count == sent + 2
    a.flush()  # nothing queued: nothing written, nothing lost
    responses = await asyncio.gather(first, second)
    assert all(isinstance(response, ExecuteResponse) for response in responses)
    assert [request.txn for _, request in recorder_b.requests] == ["t1", "t2"]


async def test_oversized_message_and_request(local_pair: tuple[PeerTransport, PeerTransport, Recorder]) -> None:
    a, _, recorder_b = local_pair
    # A participant list no vote record could hold, but the transport must refuse it by its size.
    big = Prepare(txn="big", participants=tuple(f"p{i:0>60}" for i in range(2_000)), coordinator="a")
    small = Decision(txn="small", decision=TxnState.ABORT)
    a.send("b", big)
    a.send("b", small)  # shares a frame with the big one until the frame is split
    assert await recorder_b.next_message() == ("a", small)
    assert a.peer_counters("b").drop_count_oversized == 1
    with pytest.raises(MessageTooLarge):
        await a.request("b", _execute("big", b"x" * (100 * 1024)), REQUEST_TIMEOUT_MS)
    assert isinstance(await a.request("b", _execute("ok"), REQUEST_TIMEOUT_MS), ExecuteResponse)


async def test_unknown_peer(local_pair: tuple[PeerTransport, PeerTransport, Recorder]) -> None:
    a, _, _ = local_pair
    a.send("nobody", Vote(txn="t", partition="p", yes=True))
    assert a.drop_count_unknown_peer == 1
    assert a.drop_count == 1
    started = time.monotonic()
    with pytest.raises(PeerUnavailable, match="unknown peer"):
        await a.request("nobody", StatusRequest(), REQUEST_TIMEOUT_MS)
    assert time.monotonic() - started < DEADLINE_SLACK_S


async def test_self_send_and_request_stay_in_process(
    local_pair: tuple[PeerTransport, PeerTransport, Recorder],
) -> None:
    _, b, recorder_b = local_pair
    message = Routed(source="p1", dest="p2", message=Vote(txn="t", partition="p1", yes=True))
    b.send("b", message)
    assert recorder_b.messages.empty()  # delivered on a later tick, never inside send()
    assert await recorder_b.next_message() == ("b", message)
    response = await b.request("b", _execute("self"), REQUEST_TIMEOUT_MS)
    assert response == ExecuteResponse(status=ExecuteStatus.OK, detail="b from b")
    with pytest.raises(PeerUnavailable, match="within 100 ms"):
        await b.request("b", _execute("sleep:5000"), 100)
    assert b.inbound.stream_count == 1  # only a's stream: nothing of ours went through a socket


async def test_a_handler_that_never_waits_gets_no_task_and_one_that_waits_keeps_its_deadline(
    local_pair: tuple[PeerTransport, PeerTransport, Recorder],
) -> None:
    a, b, recorder_b = local_pair
    # Answered within the step that read it (cornus.runtime.eager): no task, from a peer or itself.
    assert isinstance(await a.request("b", _execute("fast"), REQUEST_TIMEOUT_MS), ExecuteResponse)
    assert isinstance(await b.request("b", _execute("fast-self"), REQUEST_TIMEOUT_MS), ExecuteResponse)
    assert recorder_b.tasks == [None, None]
    # One that waits goes on in a task, and is cancelled at its deadline, on both paths.
    with pytest.raises(PeerUnavailable, match="within 200 ms"):
        await a.request("b", _execute("sleep:5000"), 200)
    with pytest.raises(PeerUnavailable, match="within 200 ms"):
        await b.request("b", _execute("sleep:4000"), 200)
    await wait_until(lambda: sorted(recorder_b.cancelled) == ["sleep:4000", "sleep:5000"], "both handlers cancelled")
    assert b.inbound.request_expired_count == 2
    # A waiting handler that finishes in time answers from its task.
    assert isinstance(await a.request("b", _execute("sleep:10"), REQUEST_TIMEOUT_MS), ExecuteResponse)
    assert isinstance(await b.request("b", _execute("sleep:10"), REQUEST_TIMEOUT_MS), ExecuteResponse)


async def test_a_response_the_codec_refuses_fails_that_request_and_the_connection_goes_on(
    local_pair: tuple[PeerTransport, PeerTransport, Recorder],
) -> None:
    a, b, _ = local_pair
    waiting = asyncio.ensure_future(a.request("b", _execute("sleep:200"), REQUEST_TIMEOUT_MS))
    await asyncio.sleep(0.05)  # the waiting one is being served when the bad one comes
    with pytest.raises(PeerUnavailable, match="not encodable"):
        await a.request("b", _execute("unencodable"), REQUEST_TIMEOUT_MS)
    assert isinstance(await waiting, ExecuteResponse)
    assert isinstance(await a.request("b", _execute("after"), REQUEST_TIMEOUT_MS), ExecuteResponse)
    assert b.inbound.handler_error_count == 1


async def test_a_deadline_timer_that_fires_as_its_handler_finishes_counts_no_expiry(
    local_pair: tuple[PeerTransport, PeerTransport, Recorder],
) -> None:
    _, b, _ = local_pair

    async def answered() -> ExecuteResponse:
        return ExecuteResponse(status=ExecuteStatus.OK)

    # Finished, its done-callbacks (which cancel the timer) not run yet: the timer's tick.
    finished = asyncio.ensure_future(answered())
    await asyncio.sleep(0)
    assert finished.done()
    b._expire_served(finished)
    assert b.inbound.request_expired_count == 0 and not finished.cancelled()


async def test_malformed_frames_from_a_raw_client(
    local_pair: tuple[PeerTransport, PeerTransport, Recorder],
) -> None:
    _, b, recorder_b = local_pair
    reader, writer = await _raw_connection(b.listen_address)
    frame = pb.PeerFrame(sender="raw")
    frame.items.add(kind=pb.ENVELOPE_KIND_MESSAGE)  # no body
    frame.items.add(kind=pb.ENVELOPE_KIND_REQUEST, correlation_id=7, timeout_ms=1_000)  # no body
    frame.items.add(kind=pb.ENVELOPE_KIND_REQUEST, correlation_id=8, timeout_ms=0).status_request.txn = "x"
    request = frame.items.add(kind=pb.ENVELOPE_KIND_REQUEST, correlation_id=9, timeout_ms=1_000)
    request.status_request.SetInParent()
    _write_frame(writer, frame)
    hello = await _read_frame(reader)
    assert hello is not None and hello.sender == "b"
    replies: dict[int, pb.PeerEnvelope] = {}
    while len(replies) < 3:
        reply = await _read_frame(reader)
        assert reply is not None
        replies.update({item.correlation_id: item for item in reply.items})
    assert replies[7].WhichOneof("body") == "request_failed"
    assert replies[8].WhichOneof("body") == "request_failed"
    assert replies[9].status_response.node == "b"
    writer.close()
    assert b.inbound.malformed_count == 3
    assert recorder_b.messages.empty()


async def test_oversized_frame_count_ends_the_connection(
    local_pair: tuple[PeerTransport, PeerTransport, Recorder],
) -> None:
    _, b, _ = local_pair
    reader, writer = await _raw_connection(b.listen_address)
    frame = pb.PeerFrame(sender="raw")
    for _ in range(b.limits.frame_item_count_max + 1):
        frame.items.add(kind=pb.ENVELOPE_KIND_MESSAGE).vote.txn = "t"
    _write_frame(writer, frame)
    hello = await _read_frame(reader)
    assert hello is not None and hello.sender == "b"
    assert await _read_frame(reader) is None
    assert b.inbound.malformed_count == 1


async def test_garbage_and_oversized_lengths_end_the_connection(
    local_pair: tuple[PeerTransport, PeerTransport, Recorder],
) -> None:
    """Bytes that are not our wire format cost the sender its connection, and nothing else."""
    a, b, recorder_b = local_pair
    for garbage in (b"GET / HTTP/1.1\r\n\r\n", (b.limits.message_bytes_max + 1).to_bytes(4, "big")):
        reader, writer = await _raw_connection(b.listen_address)
        writer.write(garbage)
        assert await _read_frame(reader) is None  # closed without a hello
        writer.close()
    # The real peer's connection is untouched.
    a.send("b", Vote(txn="after-garbage", partition="p", yes=True))
    assert (await recorder_b.next_message())[1] == Vote(txn="after-garbage", partition="p", yes=True)


async def test_a_silent_peer_is_cut_off_by_heartbeats(caplog: pytest.LogCaptureFixture) -> None:
    """A peer that accepts the connection and answers the hello but then sends nothing (a hung
    VM) is declared dead after about keepalive interval + timeout, with no traffic needed."""
    limits = TransportLimits(keepalive_interval_ms=200, keepalive_timeout_ms=200)
    server_port = free_port()
    accepted: list[asyncio.StreamWriter] = []

    async def hung_peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(4)
        hello = pb.PeerFrame(sender="hung").SerializeToString()
        writer.write(len(hello).to_bytes(4, "big") + hello)
        accepted.append(writer)  # then silence: no heartbeats, no reads

    server = await asyncio.start_server(hung_peer, "127.0.0.1", server_port)
    transport = PeerTransport("a", f"127.0.0.1:{free_port()}", {"hung": f"127.0.0.1:{server_port}"}, limits)
    await transport.start(Recorder("a"))
    try:
        assert await transport.wait_connected("hung", CONNECT_WAIT_MS)
        caplog.set_level(logging.INFO, logger="services.node_rpc.transport")
        await wait_until(lambda: transport.peer_counters("hung").disconnect_count >= 1,
                         "the silent link is declared down")
        assert any("nothing heard from the peer" in record.getMessage() for record in caplog.records)
    finally:
        await transport.close()
        for writer in accepted:
            writer.close()
        server.close()


async def test_close_fails_pending_requests(local_pair: tuple[PeerTransport, PeerTransport, Recorder]) -> None:
    a, _, recorder_b = local_pair
    pending = asyncio.create_task(a.request("b", _execute("sleep:30000"), 30_000))
    await wait_until(lambda: bool(recorder_b.requests), "b is serving the request")
    await a.close()
    with pytest.raises(PeerUnavailable):
        await pending
    with pytest.raises(PeerUnavailable, match="closed"):
        await a.request("b", _execute("x"), 1_000)


@pytest.fixture
async def patient_pair() -> AsyncIterator[tuple[PeerTransport, PeerTransport, Recorder]]:
    """Nodes "a" and "b", both in this process over real loopback sockets, so the test can count
    the frames "b" receives. "a" lets a may_wait message wait up to 50 ms."""
    address_a, address_b = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    peers = {"a": address_a, "b": address_b}
    a = PeerTransport("a", address_a, peers, TransportLimits(may_wait_delay_ms_max=50))
    b = PeerTransport("b", address_b, peers)
    received_b = Recorder("b")
    await b.start(received_b)
    await a.start(Recorder("a"))
    assert await a.wait_connected("b", CONNECT_WAIT_MS)
    await wait_inbound_streams(b, 1)
    yield a, b, received_b
    await a.close()
    await b.close()


async def test_a_may_wait_message_leaves_with_the_next_one(
    patient_pair: tuple[PeerTransport, PeerTransport, Recorder],
) -> None:
    a, b, received_b = patient_pair
    frames_before = b.inbound.frame_received_count
    a.send("b", Vote(txn="acked", partition="p", yes=True), may_wait=True)
    await asyncio.sleep(0)  # a tick ends with nothing urgent queued: the message waits
    await asyncio.sleep(0)
    a.send("b", Decision(txn="urgent", decision=TxnState.COMMIT))
    first, second = await received_b.next_message(), await received_b.next_message()
    assert [message.txn for _, message in (first, second)] == ["acked", "urgent"]  # type: ignore[union-attr]
    assert b.inbound.frame_received_count == frames_before + 1, "both messages in one frame"


async def test_a_may_wait_message_alone_still_leaves(
    patient_pair: tuple[PeerTransport, PeerTransport, Recorder],
) -> None:
    a, _, received_b = patient_pair
    a.send("b", Vote(txn="alone", partition="p", yes=True), may_wait=True)
    sender, message = await received_b.next_message()  # after the 50 ms bound, not never
    assert sender == "a" and message == Vote(txn="alone", partition="p", yes=True)


async def test_a_frame_dripped_slowly_ends_its_connection(
    local_pair: tuple[PeerTransport, PeerTransport, Recorder],
) -> None:
    """A connection that announces a large frame and sends it a byte at a time, never falling
    silent, held that memory for ever (only silence ended a connection): a frame must arrive
    whole within frame_timeout_ms of its first byte."""
    _, b, _ = local_pair
    b.limits = dataclasses.replace(b.limits, frame_timeout_ms=300, keepalive_interval_ms=200)
    reader, writer = await _raw_connection(b.listen_address)
    writer.write((60_000).to_bytes(4, "big") + b"x" * 1000)
    started = time.monotonic()
    ended = False
    while time.monotonic() - started < 5:
        writer.write(b"x")  # never silent
        await asyncio.sleep(0.05)
        if reader.at_eof() or writer.is_closing():
            ended = True
            break
        with contextlib.suppress(TimeoutError):
            if await asyncio.wait_for(reader.read(1), 0.01) == b"":
                ended = True
                break
    writer.close()
    assert ended, "the dripping connection is still open after 5 s"


async def test_inbound_connections_past_the_limit_are_refused(
    local_pair: tuple[PeerTransport, PeerTransport, Recorder],
) -> None:
    _, b, _ = local_pair
    allowed = b.inbound_connection_count_max
    opened = [await _raw_connection(b.listen_address) for _ in range(allowed + 3)]
    await asyncio.sleep(0.2)
    assert len(b._inbound) <= allowed
    for _, writer in opened:
        writer.close()


@contextlib.asynccontextmanager
async def linking_to_a_raw_b() -> AsyncIterator[tuple[PeerTransport, asyncio.StreamReader, asyncio.StreamWriter]]:
    """Transport "a" with its link to a raw server "b" that has read a's hello and sent none of its
    own yet: what a sends now waits in the link's queue until b's hello (written by the caller)."""
    arrived: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = asyncio.Queue()

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await arrived.put((reader, writer))

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    transport = PeerTransport("a", f"127.0.0.1:{free_port()}", {"b": address})
    await transport.start(Recorder("a"))
    writer: asyncio.StreamWriter | None = None
    try:
        reader, writer = await asyncio.wait_for(arrived.get(), RECEIVE_WAIT_S)
        hello = await _read_frame(reader)
        assert hello is not None and hello.sender == "a"
        yield transport, reader, writer
    finally:
        if writer is not None:
            writer.close()
        await transport.close()
        server.close()


async def test_a_request_that_expired_while_its_link_connected_is_never_sent() -> None:
    """Found by audit (2026-11-27): a request queued while its link was still connecting, whose
    caller's deadline passed meanwhile, was sent once the link came up. Its caller had given up
    (and aborted), yet the peer ran it: an interactive request took locks its execution held until
    the idle sweep. Only what is still awaited leaves."""
    async with linking_to_a_raw_b() as (transport, reader, writer):
        with pytest.raises(PeerUnavailable, match="no response within"):
            await transport.request("b", _execute("expired"), 50)  # no hello from b yet: queued
        awaited = asyncio.ensure_future(transport.request("b", _execute("awaited"), REQUEST_TIMEOUT_MS))
        _write_frame(writer, pb.PeerFrame(sender="b"))
        frame = await _read_frame(reader)
        assert frame is not None
        sent = [codec_decode_txn(envelope) for envelope in frame.items]
        assert sent == ["awaited"], sent
        assert transport.peer_counters("b").drop_count_expired == 1
        awaited.cancel()


def codec_decode_txn(envelope: pb.PeerEnvelope) -> str:
    request = codec.decode_request(envelope)
    assert isinstance(request, ExecuteRequest)
    return request.txn


async def test_an_inbound_connection_that_names_no_sender_in_time_is_closed(
    local_pair: tuple[PeerTransport, PeerTransport, Recorder],
) -> None:
    """Found by audit (2026-11-27): a connection that sent nothing, or only heartbeats, held one
    of the few inbound slots for good, and enough of them kept the real peers' reconnects out. One
    that sends no hello within connect_timeout_ms is closed."""
    _, b, _ = local_pair
    reader, writer = await _raw_connection(b.listen_address)
    try:
        async with asyncio.timeout(b.limits.connect_timeout_ms / 1000 + 5):
            while await reader.read(1024):  # heartbeats the transport may send meanwhile
                pass
        assert b.inbound.malformed_count >= 1
    finally:
        writer.close()


async def test_a_peer_that_answers_its_hello_then_hangs_up_is_retried_with_growing_backoff() -> None:
    """Found by audit (2026-11-27): the backoff restarted from its least as soon as a link came
    up, so a peer that answered the hello and closed at once (one crash-looping just after its
    listen, or refusing this node for a reason of its own) was reconnected to every 10-20 ms, for
    ever. A link must stay up for a backoff's longest before it counts as healthy again."""
    accepted: list[float] = []

    async def hang_up_after_hello(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(time.monotonic())
        hello = pb.PeerFrame(sender="b").SerializeToString()
        writer.write(len(hello).to_bytes(4, "big") + hello)
        await writer.drain()
        await asyncio.sleep(0.005)  # long enough for a's link to see the hello and come up
        writer.close()

    server = await asyncio.start_server(hang_up_after_hello, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    limits = TransportLimits(reconnect_backoff_ms_min=20, reconnect_backoff_ms_max=2_000)
    a = PeerTransport("a", f"127.0.0.1:{free_port()}", {"b": f"127.0.0.1:{port}"}, limits)
    await a.start(Recorder("a"))
    try:
        await asyncio.sleep(2.0)
        # Backoff doubling from 20 ms (jittered down to half): at most ~8 attempts in 2 s. Without
        # it, 100 or more.
        assert 2 <= len(accepted) <= 12, f"{len(accepted)} connections in 2 s"
    finally:
        await a.close()
        server.close()


async def test_a_request_that_expired_while_its_connection_was_stalled_is_never_sent(
    local_pair: tuple[PeerTransport, PeerTransport, Recorder],
) -> None:
    """Found by audit (2026-11-27): a connection whose socket buffer is full stops flushing, and
    what queued meanwhile left as soon as it drained, requests whose callers had given up
    included: they ran at the peer for nobody (an interactive one held its locks until the
    owner's idle sweep). They are dropped when the connection resumes, as at a reconnect."""
    a, _, recorder_b = local_pair
    link = a._links["b"]
    connection = link._connection
    assert connection is not None
    connection.pause_writing()  # as the transport does when its buffer passes the high mark
    expired = a.start_request("b", _execute("expired"), 50)
    with pytest.raises(PeerUnavailable):
        await expired
    alive = a.start_request("b", _execute("alive"), REQUEST_TIMEOUT_MS)
    connection.resume_writing()
    assert isinstance(await alive, ExecuteResponse)
    assert [request.txn for _, request in recorder_b.requests] == ["alive"]
    assert a.peer_counters("b").drop_count_expired == 1
