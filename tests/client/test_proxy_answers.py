"""A proxy's answer after a call that may have committed (found by review): a 5xx whose body is
not the API's JSON (a gateway's HTML page, uvicorn's plain-text 500 when shutdown cancels a
request) is UNKNOWN, not an error the caller may take for "nothing happened" and retry."""

from __future__ import annotations

import contextlib
import json

import httpx
import pytest

from services.client import AsyncCornusClient, CornusClient, Op, ServerError, Status, Unavailable, WrongState

_GATEWAY_PAGE = b"<html><body>504 Gateway Time-out</body></html>"


def _answer(status: int) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/txn":
            return httpx.Response(201, json={"txn": "t1"})
        return httpx.Response(status, content=_GATEWAY_PAGE, headers={"content-type": "text/html"})

    return httpx.MockTransport(handler)


def test_a_gateway_page_after_an_execute_or_a_commit_is_unknown() -> None:
    for status in (500, 502, 504):
        client = CornusClient("http://node:8100", http=httpx.Client(transport=_answer(status)))
        outcome = client.execute([Op.put("k", "v")])
        assert outcome.status is Status.UNKNOWN, (status, outcome)
        assert client.begin().commit().status is Status.UNKNOWN


async def test_the_async_client_reads_a_gateway_page_alike() -> None:
    client = AsyncCornusClient("http://node:8100", http=httpx.AsyncClient(transport=_answer(502)))
    assert (await client.execute([Op.put("k", "v")])).status is Status.UNKNOWN
    txn = await client.begin()
    assert (await txn.commit()).status is Status.UNKNOWN


def test_a_gateway_page_where_nothing_can_have_committed_is_still_an_error() -> None:
    client = CornusClient("http://node:8100", http=httpx.Client(transport=_answer(502)))
    try:
        client.begin().abort()
    except ServerError as error:
        assert "not JSON" in str(error)
    else:
        raise AssertionError("an abort answered by a gateway page must raise")


def _write_times_out() -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/txn":
            return httpx.Response(201, json={"txn": "t1"})
        if request.url.path.endswith("/write"):
            raise httpx.ReadTimeout("the node took the write and did not answer in time", request=request)
        raise AssertionError(f"{request.url.path} must not be sent after an ambiguous write")

    return httpx.MockTransport(handler)


def test_a_write_that_may_have_landed_leaves_its_transaction_uncommittable() -> None:
    """A write whose answer was lost after it was sent may have been buffered: the caller, told
    Unavailable, could catch it and commit, and commit the write it believed had failed."""
    client = CornusClient("http://node:8100", http=httpx.Client(transport=_write_times_out()))
    txn = client.begin()
    with pytest.raises(Unavailable):
        txn.write({"k": "v"})
    try:
        txn.commit()
    except WrongState as error:
        assert "may or may not" in str(error)
    else:
        raise AssertionError("the commit went out after an ambiguous write")


async def test_the_async_client_refuses_the_commit_alike() -> None:
    client = AsyncCornusClient("http://node:8100", http=httpx.AsyncClient(transport=_write_times_out()))
    txn = await client.begin()
    with pytest.raises(Unavailable):
        await txn.write({"k": "v"})
    try:
        await txn.commit()
    except WrongState as error:
        assert "may or may not" in str(error)
    else:
        raise AssertionError("the commit went out after an ambiguous write")


def test_a_write_answered_by_a_gateway_page_leaves_its_transaction_uncommittable() -> None:
    """A proxy's 502 page for a write: the write may have reached the node, as with a lost answer."""

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/txn":
            return httpx.Response(201, json={"txn": "t1"})
        if request.url.path.endswith("/write"):
            return httpx.Response(502, content=_GATEWAY_PAGE, headers={"content-type": "text/html"})
        raise AssertionError(f"{request.url.path} must not be sent after an ambiguous write")

    client = CornusClient("http://node:8100", http=httpx.Client(transport=httpx.MockTransport(handler)))
    txn = client.begin()
    with pytest.raises(ServerError):
        txn.write({"k": "v"})
    with pytest.raises(WrongState, match="may or may not"):
        txn.commit()


def _resent_by_a_proxy() -> httpx.MockTransport:
    """A node that already ran the id the client chose (a proxy delivered the POST twice and the
    first answer was lost): 409, "already known"."""
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/healthz":
            return httpx.Response(200, json={"status": "ok", "node": "n0", "protocol": "cornus"})
        assert request.url.path == "/v1/execute", request.url.path
        assert b'"txn"' in request.content, "sent again without the client's id"
        return httpx.Response(409, json={"error": "wrong_state", "detail": "already known to n0"})

    return httpx.MockTransport(handler)


def test_a_one_shot_whose_own_id_the_node_already_knows_is_unknown_not_refused() -> None:
    """Found by audit (2026-11-27): the 409 was WrongState, which the SDK documents as "nothing
    changed", so a caller ran the transfer again; an earlier delivery of this very request ran."""
    client = CornusClient("http://node:8100", http=httpx.Client(transport=_resent_by_a_proxy()))
    outcome = client.execute([Op.put("k", "v")])
    assert outcome.status is Status.UNKNOWN and outcome.txn and "already knows" in outcome.detail, outcome


async def test_the_async_client_reads_an_id_already_known_alike() -> None:
    client = AsyncCornusClient("http://node:8100", http=httpx.AsyncClient(transport=_resent_by_a_proxy()))
    outcome = await client.execute([Op.put("k", "v")])
    assert outcome.status is Status.UNKNOWN and outcome.txn and "already knows" in outcome.detail, outcome


def _gateway_404() -> httpx.MockTransport:
    """A gateway in front of the nodes that matched no route: JSON, but not a node's answer."""
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404, json={"message": "no Route matched with those values"})

    return httpx.MockTransport(handler)


def test_a_gateway_s_json_404_to_a_status_call_is_no_answer_not_never_committed() -> None:
    """Found by audit (2026-11-27): any 404 with a JSON body became NotFound, which the SDK says
    means "it never committed": a caller asking after an UNKNOWN through a gateway that matched no
    route (Kong and API Gateway answer so in JSON) would run the transaction again."""
    client = CornusClient("http://node:8100", http=httpx.Client(transport=_gateway_404()))
    with pytest.raises(Unavailable, match="404"):
        client.status("1795797027483.n0.c0123456789abcdef0123456789abcdef.1.cornus")


async def test_the_async_client_reads_a_gateway_s_json_404_alike() -> None:
    client = AsyncCornusClient("http://node:8100", http=httpx.AsyncClient(transport=_gateway_404()))
    with pytest.raises(Unavailable, match="404"):
        await client.status("1795797027483.n0.c0123456789abcdef0123456789abcdef.1.cornus")


def _resolve_overloaded() -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path.startswith("/v1/admin/resolve/"), request.url.path
        return httpx.Response(503, json={"error": "unavailable", "detail": "n0 serves its limit of requests"})

    return httpx.MockTransport(handler)


def test_a_resolve_a_node_refused_with_503_raises_and_returns_no_outcome() -> None:
    """Found by audit (2026-11-27): a node's 503 to a resolve came back as the transaction's
    outcome, UNAVAILABLE, which the SDK documents as "nothing committed and nothing will be", of a
    transaction that may well be in doubt or committed. The call failed; the outcome is unsaid."""
    client = CornusClient("http://node:8100", http=httpx.Client(transport=_resolve_overloaded()))
    with pytest.raises(Unavailable, match="503"):
        client.resolve("1795797027483.n0.000001.1.cornus")


async def test_the_async_client_raises_on_a_refused_resolve_alike() -> None:
    client = AsyncCornusClient("http://node:8100", http=httpx.AsyncClient(transport=_resolve_overloaded()))
    with pytest.raises(Unavailable, match="503"):
        await client.resolve("1795797027483.n0.000001.1.cornus")


def _commit_delivered_again(status: int, error: str) -> httpx.MockTransport:
    """A node whose answer to a commit is a second delivery's (a proxy sent the POST again after
    the first answer was lost): the first is committing, or committed before a restart."""
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/txn":
            return httpx.Response(201, json={"txn": "t1"})
        assert request.url.path.endswith("/commit"), request.url.path
        return httpx.Response(status, json={"error": error, "detail": "transaction t1 is unknown, not active"})

    return httpx.MockTransport(handler)


@pytest.mark.parametrize(("status", "error"), [(409, "wrong_state"), (404, "not_found")])
async def test_a_commit_answered_as_a_second_delivery_is_unknown_not_refused(status: int, error: str) -> None:
    """Found by audit (2026-11-27): a commit's 409 ("not active": the first delivery is
    committing it) or 404 (committed, then the node restarted) raised WrongState or NotFound,
    which the SDK documents as "nothing changed": the caller ran its transaction again."""
    client = CornusClient("http://node:8100", http=httpx.Client(transport=_commit_delivered_again(status, error)))
    outcome = client.begin().commit()
    assert outcome.status is Status.UNKNOWN and outcome.txn == "t1", outcome
    aclient = AsyncCornusClient("http://node:8100",
                                http=httpx.AsyncClient(transport=_commit_delivered_again(status, error)))
    txn = await aclient.begin()
    outcome = await txn.commit()
    assert outcome.status is Status.UNKNOWN and outcome.txn == "t1", outcome


def _sent_on_to_another_node() -> tuple[httpx.MockTransport, list[bytes]]:
    """A load balancer in front of two nodes: /healthz reached n0, so the id names n0, and the
    execute was delivered to n0 (which ran it, its answer lost) and then again to n1."""
    executes: list[bytes] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/healthz":
            return httpx.Response(200, json={"status": "ok", "node": "n0", "protocol": "cornus"})
        assert request.url.path == "/v1/execute", request.url.path
        executes.append(request.content)
        if b'"txn"' not in request.content:  # an id the node chooses
            return httpx.Response(200, json={"txn": "2.n1.x.1.cornus", "outcome": "committed"})
        return httpx.Response(400, json={"error": "invalid_txn", "detail": (
            "txn '1.n0.cab.1.cornus' names node 'n0': a client-chosen id must name the node it is sent to, 'n1'")})

    return httpx.MockTransport(handler), executes


async def test_an_id_refused_by_another_node_behind_a_proxy_is_in_doubt_not_run_again() -> None:
    """Found by audit (2026-11-27): a node refusing the id because it names another node was read
    as "nothing ran, run it again without an id"; behind a load balancer that sent the POST again
    to another node, the node it names may have committed it: it committed twice."""
    transport, executes = _sent_on_to_another_node()
    client = CornusClient("http://balancer:8100", http=httpx.Client(transport=transport))
    outcome = client.execute([Op.put("k", "v")])
    assert outcome.status is Status.UNKNOWN and outcome.txn, outcome
    assert len(executes) == 1, "run again under another id"
    # The URL leads to several nodes: later calls go under ids the nodes choose.
    assert client.execute([Op.put("k", "w")]).committed
    assert len(executes) == 2 and b'"txn"' not in executes[1], executes
    transport, executes = _sent_on_to_another_node()
    aclient = AsyncCornusClient("http://balancer:8100", http=httpx.AsyncClient(transport=transport))
    outcome = await aclient.execute([Op.put("k", "v")])
    assert outcome.status is Status.UNKNOWN and outcome.txn, outcome
    assert len(executes) == 1, "run again under another id"


async def test_a_scope_whose_commit_is_refused_after_an_ambiguous_write_aborts_its_transaction() -> None:
    """Found by audit (2026-11-27): a caller that caught the write's Unavailable inside the scope
    got WrongState from the scope's commit, and the transaction held its locks until the node's
    idle timeout; the scope aborts it."""
    sent: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request.url.path)
        if request.url.path == "/v1/txn":
            return httpx.Response(201, json={"txn": "t1"})
        if request.url.path.endswith("/write"):
            raise httpx.ReadTimeout("the node took the write and did not answer in time", request=request)
        assert request.url.path.endswith("/abort"), request.url.path
        return httpx.Response(200, json={"txn": "t1", "outcome": "aborted", "reason": "client", "retryable": False})

    client = CornusClient("http://node:8100", http=httpx.Client(transport=httpx.MockTransport(handler)))
    with pytest.raises(WrongState), client.transaction() as txn, contextlib.suppress(Unavailable):
        txn.write({"k": "v"})
    assert sent[-1].endswith("/abort"), sent
    sent.clear()
    aclient = AsyncCornusClient("http://node:8100", http=httpx.AsyncClient(transport=httpx.MockTransport(handler)))
    with pytest.raises(WrongState):
        async with aclient.transaction() as atxn:
            with contextlib.suppress(Unavailable):
                await atxn.write({"k": "v"})
    assert sent[-1].endswith("/abort"), sent


async def test_a_node_whose_health_did_not_answer_gets_no_one_shot() -> None:
    """Found by audit (2026-11-27): a /healthz that timed out after it was sent sent the one-shot
    to that node without an id of the client's, and a lost answer then left it UNKNOWN with no id
    to ask the status call about. The next node takes it, under an id of the client's."""
    executes: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/healthz":
            if request.url.host == "slow":
                raise httpx.ReadTimeout("no answer in time", request=request)
            return httpx.Response(200, json={"status": "ok", "node": "n1", "protocol": "cornus"})
        executes.append(request.url.host)
        txn = json.loads(request.content)["txn"]
        return httpx.Response(200, json={"txn": txn, "outcome": "committed"})

    for url_order in (["http://slow:8100", "http://fine:8100"],):
        client = CornusClient(url_order, http=httpx.Client(transport=httpx.MockTransport(handler)))
        client._rotation.order = lambda urls=url_order: list(urls)  # type: ignore[method-assign]
        outcome = client.execute([Op.put("k", "v")])
        assert outcome.committed and ".n1.c" in outcome.txn and executes == ["fine"], (outcome, executes)
        executes.clear()
        aclient = AsyncCornusClient(url_order, http=httpx.AsyncClient(transport=httpx.MockTransport(handler)))
        aclient._rotation.order = lambda urls=url_order: list(urls)  # type: ignore[method-assign]
        outcome = await aclient.execute([Op.put("k", "v")])
        assert outcome.committed and ".n1.c" in outcome.txn and executes == ["fine"], (outcome, executes)


async def test_an_unknown_answer_for_an_id_naming_another_node_stops_the_ids_for_that_url() -> None:
    """Found by review (2026-11-27): a node of this version answers 202 unknown, not 400, for an id
    that names another node; the SDK learned only from the 400, so a URL in front of several nodes
    kept getting ids naming one of them, and every write routed elsewhere ended UNKNOWN."""
    executes: list[bytes] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/healthz":
            return httpx.Response(200, json={"status": "ok", "node": "n0", "protocol": "cornus"})
        executes.append(request.content)
        body = json.loads(request.content)
        if "txn" not in body:
            return httpx.Response(200, json={"txn": "2.n1.x.1.cornus", "outcome": "committed"})
        return httpx.Response(202, json={"txn": body["txn"], "outcome": "unknown", "detail": (
            f"txn {body['txn']!r} names node 'n0': a client-chosen id must name the node it is sent to, 'n1'; "
            "an earlier delivery of this request may have run it: ask its status")})

    client = CornusClient("http://balancer:8100", http=httpx.Client(transport=httpx.MockTransport(handler)))
    assert client.execute([Op.put("k", "v")]).status is Status.UNKNOWN
    assert client.execute([Op.put("k", "w")]).committed
    assert len(executes) == 2 and b'"txn"' not in executes[1], executes
    executes.clear()
    aclient = AsyncCornusClient("http://balancer:8100", http=httpx.AsyncClient(transport=httpx.MockTransport(handler)))
    assert (await aclient.execute([Op.put("k", "v")])).status is Status.UNKNOWN
    assert (await aclient.execute([Op.put("k", "w")])).committed
    assert len(executes) == 2 and b'"txn"' not in executes[1], executes


_BUSY = {"error": "busy", "detail": "this node runs 10000 requests, its limit is 10000; retry later"}


def _busy_then_committed(busy_count: int, bodies: list[dict]) -> httpx.MockTransport:
    """A node whose front door answers the first `busy_count` executes "busy" (services/api/
    http_limits.py: refused before the request was read), then commits; the bodies are kept."""
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/healthz":
            return httpx.Response(200, json={"status": "ok", "node": "n0", "protocol": "cornus"})
        assert request.url.path == "/v1/execute", request.url.path
        body = json.loads(request.content)
        bodies.append(body)
        if len(bodies) <= busy_count:
            return httpx.Response(503, json=_BUSY)
        return httpx.Response(200, json={"txn": body["txn"], "outcome": "committed"})

    return httpx.MockTransport(handler)


def test_an_execute_its_node_was_too_busy_to_read_is_sent_again_under_its_own_id() -> None:
    """Found by audit (2026-11-28, second): the front door's 503, given before the request is read,
    was the body of a node's "nothing ran", and the SDK ran the one-shot again under a new id;
    a proxy that had delivered it before, the answer lost, made that a second commit. "busy" now:
    sent again under the same id (the node's id checks tell a second delivery), and UNKNOWN once
    the resends run out, never a new id."""
    bodies: list[dict] = []
    client = CornusClient("http://node:8100", http=httpx.Client(transport=_busy_then_committed(2, bodies)))
    outcome = client.execute([Op.put("k", "v")])
    assert outcome.status is Status.COMMITTED, outcome
    assert len(bodies) == 3 and len({body["txn"] for body in bodies}) == 1, bodies
    bodies.clear()
    client = CornusClient("http://node:8100", http=httpx.Client(transport=_busy_then_committed(100, bodies)))
    outcome = client.execute([Op.put("k", "v")])
    assert outcome.status is Status.UNKNOWN and "busy" in outcome.detail, outcome
    assert len({body["txn"] for body in bodies}) == 1, bodies


async def test_the_async_client_sends_an_execute_again_under_its_own_id_alike() -> None:
    bodies: list[dict] = []
    client = AsyncCornusClient("http://node:8100", http=httpx.AsyncClient(transport=_busy_then_committed(2, bodies)))
    assert (await client.execute([Op.put("k", "v")])).status is Status.COMMITTED
    assert len(bodies) == 3 and len({body["txn"] for body in bodies}) == 1, bodies


def test_a_commit_its_node_was_too_busy_to_read_is_unknown() -> None:
    """The same 503 to a commit: a proxy may have delivered the commit before, so UNKNOWN (its
    status tells), not "nothing committed", which run_transaction answers by running it again."""
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/txn":
            return httpx.Response(201, json={"txn": "t1"})
        return httpx.Response(503, json=_BUSY)

    client = CornusClient("http://node:8100", http=httpx.Client(transport=httpx.MockTransport(handler)))
    assert client.begin().commit().status is Status.UNKNOWN
