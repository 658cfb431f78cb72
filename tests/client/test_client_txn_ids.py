"""A one-shot that writes runs under an id the SDK chose, so a connection that fails after the
request left yields UNKNOWN with an id the status call answers for (before, the SDK returned
UNKNOWN with txn "", and the caller could neither ask nor safely retry)."""

from __future__ import annotations

import logging
import time

import httpx
import pytest

from services.client import AsyncCornusClient, ClientConfig, CornusClient, Op, Status, _core

FAST = ClientConfig(backoff_ms_min=5, backoff_ms_max=50, retry_count_max=1)


def _chosen_by_client(txn: str) -> bool:
    """<begin>.<node>.c<token>.1.<tag>: the token is longer than a server's 6-character incarnation."""
    token = txn.rsplit(".", 3)[1]
    return token.startswith("c") and len(token) == 1 + 2 * _core.CLIENT_TOKEN_BYTES


class _AnswerLost(httpx.HTTPTransport):
    """The real transport, except that an execute's answer is lost after the node ran it."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if request.url.path == "/v1/execute":
            response.read()
            response.close()
            raise httpx.RemoteProtocolError("the connection broke before the answer came", request=request)
        return response


class _AsyncAnswerLost(httpx.AsyncHTTPTransport):
    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await super().handle_async_request(request)
        if request.url.path == "/v1/execute":
            await response.aread()
            await response.aclose()
            raise httpx.RemoteProtocolError("the connection broke before the answer came", request=request)
        return response


def test_a_lost_answer_is_unknown_with_an_id_the_status_call_knows(urls: list[str], prefix: str) -> None:
    with CornusClient(urls[0], config=FAST, http=httpx.Client(transport=_AnswerLost())) as client:
        outcome = client.execute([Op.put(prefix + "k", "v")])
        assert outcome.status is Status.UNKNOWN and outcome.txn, outcome
        assert _chosen_by_client(outcome.txn), outcome
    with CornusClient(urls, config=FAST) as client:
        assert client.status(outcome.txn).status is Status.COMMITTED
        assert client.get(prefix + "k") == "v"
        # Read-only one-shots keep the server's ids.
        read = client.execute([Op.get(prefix + "k")])
        assert read.committed and not _chosen_by_client(read.txn), read


async def test_the_async_client_alike(urls: list[str], prefix: str) -> None:
    async with AsyncCornusClient(urls[1], config=FAST,
                                 http=httpx.AsyncClient(transport=_AsyncAnswerLost())) as client:
        outcome = await client.execute([Op.put(prefix + "k", "v")])
    assert outcome.status is Status.UNKNOWN and outcome.txn, outcome
    async with AsyncCornusClient(urls, config=FAST) as client:
        assert (await client.status(outcome.txn)).status is Status.COMMITTED


def test_a_refused_clock_falls_back_to_a_server_chosen_id_with_one_warning(
    urls: list[str], prefix: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(_core, "CLIENT_BEGIN_MS_BACKDATE", -5_000)  # as a clock 5 s ahead of the node's
    with caplog.at_level(logging.WARNING, logger="cornus.client"), CornusClient(urls[0], config=FAST) as client:
        first = client.put(prefix + "a", "1")
        second = client.put(prefix + "b", "2")
    assert first.committed and second.committed
    assert not _chosen_by_client(first.txn) and not _chosen_by_client(second.txn), (first.txn, second.txn)
    warnings = [record for record in caplog.records if "txn_begin_refused" in record.getMessage()]
    assert len(warnings) == 1, caplog.records


async def test_each_try_of_a_committed_write_carries_its_own_client_id(urls: list[str], prefix: str) -> None:
    async with AsyncCornusClient(urls, config=FAST) as client:
        first = await client.put(prefix + "a", "1")
        second = await client.put(prefix + "a", "2")
        assert _chosen_by_client(first.txn) and _chosen_by_client(second.txn) and first.txn != second.txn
        assert (await client.status(first.txn)).status is Status.COMMITTED


class _Counting(httpx.HTTPTransport):
    """The real transport, counting the executes sent."""

    def __init__(self) -> None:
        super().__init__()
        self.executes: list[bytes] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/execute":
            self.executes.append(request.content)
        return super().handle_request(request)


def test_an_id_refused_as_too_old_is_in_doubt_and_never_run_again_under_another(
    urls: list[str], prefix: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by audit (2026-11-27): a node refusing the client's id as begun too long ago, or
    before its process started, is how a second delivery of the same POST looks (a proxy that sends
    it again after the node committed it and restarted): the SDK ran the transaction again under
    a server-chosen id, and it committed twice. It is in doubt: the status call tells. (Dated by
    the node's clock now, from /healthz, an id is refused so only when it reached the node late.)"""
    monkeypatch.setattr(_core, "begin_backdate_ms", lambda identity: 5_000)  # as an id that reached the node 5 s late
    counting = _Counting()
    with CornusClient(urls[0], config=FAST, http=httpx.Client(transport=counting)) as client:
        outcome = client.execute([Op.put(prefix + "late", "v")])
    assert outcome.status is Status.UNKNOWN and _chosen_by_client(outcome.txn), outcome
    assert len(counting.executes) == 1, "run again under another id"


def test_ids_are_dated_by_the_node_s_clock() -> None:
    """The node's clock from /healthz dates the ids this client chooses for it, so a client clock
    that runs behind or ahead of the node's by seconds has none refused; an offset no clock has
    (a proxy's page) is not taken."""
    asked_s = time.time()
    node_ms = int(asked_s * 1000) + 10_100  # the node's clock 10 s ahead, read 100 ms into the call
    response = httpx.Response(200, json={"status": "ok", "node": "n0", "protocol": "cornus", "now_unix_ms": node_ms})
    keep, identity = _core.identity_from(response, asked_s, asked_s + 0.2)
    assert keep and identity is not None and abs(identity.clock_offset_ms - 10_000) <= 1, identity
    begin_ms = int(_core.client_txn(identity, None).split(".", 1)[0])
    assert abs(begin_ms - (time.time() * 1000 + 10_000 - _core.CLIENT_BEGIN_MS_BACKDATE)) < 1_000, begin_ms
    absurd = httpx.Response(200, json={"status": "ok", "node": "n0", "protocol": "cornus", "now_unix_ms": 1})
    _, identity = _core.identity_from(absurd, asked_s, asked_s + 0.2)
    assert identity is not None and identity.clock_offset_ms == 0


class _AsyncCounting(httpx.AsyncHTTPTransport):
    def __init__(self) -> None:
        super().__init__()
        self.executes: list[bytes] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/execute":
            self.executes.append(request.content)
        return await super().handle_async_request(request)


async def test_the_async_client_keeps_an_id_refused_as_too_old_in_doubt_too(
    urls: list[str], prefix: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_core, "begin_backdate_ms", lambda identity: 5_000)
    counting = _AsyncCounting()
    async with AsyncCornusClient(urls[1], config=FAST, http=httpx.AsyncClient(transport=counting)) as client:
        outcome = await client.execute([Op.put(prefix + "late-async", "v")])
    assert outcome.status is Status.UNKNOWN and _chosen_by_client(outcome.txn), outcome
    assert len(counting.executes) == 1


def test_ids_are_dated_early_by_less_than_the_age_the_node_takes(urls: list[str]) -> None:
    """Found by audit (2026-11-27): ids were dated a fixed 100 ms early, and a node whose peer
    request timeout (which caps the age it takes) was about that short refused nearly every one as
    too old: every write ended UNKNOWN. /healthz says the age the node takes; an id is dated early
    by a quarter of it at most."""
    health = httpx.get(urls[0] + "/healthz", timeout=5).json()
    assert health["client_txn_age_ms_max"] == 1_000, health  # min(1 s, the default 2 s peer request timeout)
    asked_s = time.time()
    answer = {"status": "ok", "node": "n0", "protocol": "cornus", "now_unix_ms": round(asked_s * 1000),
              "client_txn_age_ms_max": 100}  # rounded as the client rounds, so the offset is exactly 0
    keep, identity = _core.identity_from(httpx.Response(200, json=answer), asked_s, asked_s)
    assert keep and identity is not None and identity.age_ms_max == 100, identity
    assert identity.clock_offset_ms == 0, identity  # else the bounds below would move by it
    assert _core.begin_backdate_ms(identity) == 25  # a quarter of it
    before_ms = time.time() * 1000
    begin_ms = int(_core.client_txn(identity, None).split(".", 1)[0])
    assert before_ms - 25 - 1 <= begin_ms <= time.time() * 1000 - 25 + 1, begin_ms
