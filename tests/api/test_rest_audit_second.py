"""Findings of the second REST API audit (2026-11-28), each against the real cluster of
tests/api/conftest.py: what went wrong, and that the request now gets its documented answer and
changes nothing."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator

import httpx
import pytest

from tests.api.conftest import API_PARTITION_COUNT
from tests.cluster.harness import Cluster, keys_on

_fresh = itertools.count()


def _key(label: str) -> str:
    return keys_on("p0", API_PARTITION_COUNT, 1, prefix=f"audit2-{label}{next(_fresh)}-")[0]


def _seeded(cluster: Cluster, label: str) -> str:
    key = _key(label)
    done = cluster.execute("n0", [{"op": "put", "key": key, "value": "seed"}])
    assert done.status_code == 200, done.text
    return key


def _refused(response: httpx.Response, status: int, error: str) -> dict[str, str]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error", "detail"} and body["error"] == error, body
    return body


def _chunked(body: bytes) -> Iterator[bytes]:
    """A body sent without Content-Length, which the execute fast path leaves to the FastAPI app."""
    yield body


def test_a_key_ending_in_a_slash_is_not_found_not_redirected(api_cluster: Cluster) -> None:
    """Found by audit (2026-11-28, second): Starlette's redirect_slashes answered `PUT /v1/kv/a%2F`
    (key "a/", which no path can name) with a 307 to /v1/kv/a, built from the client's Host header,
    instead of the documented 404; a client that follows redirects for PUT wrote key "a"."""
    key = _key("slash")
    url = api_cluster.nodes["n0"].url
    put = api_cluster.client.put(f"{url}/v1/kv/{key}%2F", json={"value": "1"}, follow_redirects=False)
    _refused(put, 404, "not_found")
    got = api_cluster.client.get(f"{url}/v1/kv/{key}%2F", follow_redirects=False)
    _refused(got, 404, "not_found")
    _refused(api_cluster.client.get(f"{url}/healthz/", follow_redirects=False), 404, "not_found")
    assert api_cluster.read("n1", [key]) == {key: None}


@pytest.mark.parametrize("sent", ["with a length", "chunked"])
def test_a_one_shot_that_gets_a_key_twice_is_refused_and_changes_nothing(api_cluster: Cluster, sent: str) -> None:
    """Found by audit (2026-11-28, second): a one-shot's reads come back as an object keyed by key,
    so `get a, put a, get a` answered one value for a and lost the other (gRPC answers both, in
    order), and the put ran. Refused as invalid (400) before anything runs, on the fast path (a
    body with a length) and in the FastAPI app (chunked) alike."""
    key = _seeded(api_cluster, "gettwice")
    body = json.dumps({"ops": [{"op": "get", "key": key}, {"op": "put", "key": key, "value": "new"},
                               {"op": "get", "key": key}]}).encode()
    content: bytes | Iterator[bytes] = body if sent == "with a length" else _chunked(body)
    response = api_cluster.client.post(api_cluster.nodes["n0"].url + "/v1/execute", content=content,
                                       headers={"content-type": "application/json"})
    detail = _refused(response, 400, "invalid_request")["detail"]
    assert key in detail and "more than once" in detail, detail
    assert api_cluster.read("n1", [key]) == {key: "seed"}


# Bodies in encodings json.loads detects by itself; the API takes UTF-8 alone (RFC 8259).
NOT_UTF8 = [
    ("read", "utf-16-le"),
    ("execute", "utf-16-le"),
    ("execute", "utf-16"),
    ("execute", "utf-32"),
    ("write", "utf-16-le"),
    ("put", "utf-16-le"),
    ("begin", "utf-16-le"),
]


@pytest.mark.parametrize(("route", "encoding"), NOT_UTF8, ids=[f"{r}-{e}" for r, e in NOT_UTF8])
def test_a_body_not_in_utf8_is_malformed_on_every_json_route(api_cluster: Cluster, route: str, encoding: str) -> None:
    """Found by audit (2026-11-28, second): json.loads takes UTF-16 and UTF-32 too, so the read
    call's shortcut, which looks for a second `"keys"` in the raw bytes, missed it in a UTF-16-LE
    body naming "keys" twice, and the read ran on the last list alone; every JSON route ran such
    bodies. A body that is not UTF-8 is 422 malformed_request, and nothing runs."""
    key, other = _seeded(api_cluster, "utf16"), _seeded(api_cluster, "utf16other")
    url = api_cluster.nodes["n0"].url
    txn = api_cluster.post("n0", "/v1/txn").json()["txn"]
    path, body = {
        "read": (f"/v1/txn/{txn}/read", f'{{"keys": ["{other}"], "keys": ["{key}"]}}'),
        "execute": ("/v1/execute", json.dumps({"ops": [{"op": "put", "key": key, "value": "new"}]})),
        "write": (f"/v1/txn/{txn}/write", json.dumps({"writes": {key: "new"}})),
        "put": (f"/v1/kv/{key}", json.dumps({"value": "new"})),
        "begin": ("/v1/txn", json.dumps({"protocol": "2pc"})),
    }[route]
    method = "PUT" if route == "put" else "POST"
    response = api_cluster.client.request(method, url + path, content=body.encode(encoding),
                                          headers={"content-type": "application/json"})
    assert "UTF-8" in _refused(response, 422, "malformed_request")["detail"]
    assert api_cluster.get("n0", f"/v1/txn/{txn}").json()["outcome"] == "active"
    assert api_cluster.post("n0", f"/v1/txn/{txn}/commit").json()["outcome"] == "committed"
    assert api_cluster.read("n1", [key, other]) == {key: "seed", other: "seed"}


# (name, the Content-Type headers sent, in order): FastAPI reads a body as JSON only under the
# first one's application/json or application/*+json, with exactly one "/" in the type.
NOT_JSON_TYPES = [
    ("none", []),
    ("first text, then JSON", [("content-type", "text/plain"), ("content-type", "application/json")]),
    ("two slashes", [("content-type", "application/a/b+json")]),
]


@pytest.mark.parametrize("headers", [h for _, h in NOT_JSON_TYPES], ids=[n for n, _ in NOT_JSON_TYPES])
def test_a_body_without_a_json_content_type_gets_one_answer_from_every_route(
    api_cluster: Cluster, headers: list[tuple[str, str]],
) -> None:
    """Found by audit (2026-11-28, second): the execute fast path took a body with no Content-Type
    as JSON (and ran it), while FastAPI's strict content type, the installed version's default,
    made every other route answer 422; the fast path also read the last of two Content-Types where
    FastAPI reads the first, and took a type with two slashes. All routes now answer alike: 422."""
    key, other = _key("ctype"), _key("ctypeother")
    url = api_cluster.nodes["n0"].url
    txn = api_cluster.post("n0", "/v1/txn").json()["txn"]
    execute = api_cluster.client.post(url + "/v1/execute", headers=headers,
                                      content=json.dumps({"ops": [{"op": "put", "key": key, "value": "v"}]}).encode())
    write = api_cluster.client.post(url + f"/v1/txn/{txn}/write", headers=headers,
                                    content=json.dumps({"writes": {other: "v"}}).encode())
    for refused in (execute, write):
        assert "Content-Type: application/json" in _refused(refused, 422, "malformed_request")["detail"]
    assert api_cluster.post("n0", f"/v1/txn/{txn}/commit").json()["outcome"] == "committed"
    assert api_cluster.read("n1", [key, other]) == {key: None, other: None}


def test_head_is_answered_on_every_get_route(api_cluster: Cluster) -> None:
    """Found by audit (2026-11-28, second): /healthz, /readyz, /metrics and the status call
    answered HEAD with 405 (FastAPI's routes take GET alone), so a probe or proxy that checks
    with HEAD saw a node refuse. HEAD gets GET's status and headers, and no body."""
    key = _key("head")
    committed = api_cluster.execute("n0", [{"op": "put", "key": key, "value": "v"}]).json()["txn"]
    url = api_cluster.nodes["n0"].url
    for path in ("/healthz", "/readyz", "/metrics", f"/v1/txn/{committed}", "/v1/partitions", f"/v1/kv/{key}"):
        head = api_cluster.client.head(url + path)
        assert head.status_code == 200 and head.content == b"", (path, head.status_code, head.text)
        assert head.headers["content-type"] == api_cluster.client.get(url + path).headers["content-type"], path
    refused = api_cluster.client.post(url + "/healthz")
    _refused(refused, 405, "method_not_allowed")
    assert refused.headers["allow"] == "GET, HEAD", refused.headers


def test_the_published_error_codes_name_every_code_the_api_answers(api_cluster: Cluster) -> None:
    """Found by audit (2026-11-28, second): ErrorOut's list of stable codes, in the published
    schema, left out `unauthorized` (the admin calls' 401) and `http_error` (another HTTP-level
    refusal), codes the API answers."""
    from services.api.rest import _ERROR_ANSWERS

    described = api_cluster.get("n0", "/openapi.json").json()["components"]["schemas"]["ErrorOut"]
    text = described["properties"]["error"]["description"]
    answered = {code for _, code, _ in _ERROR_ANSWERS.values()} | {
        "malformed_request", "not_found", "method_not_allowed", "too_large", "http_error", "internal", "busy"}
    assert not {code for code in answered if code not in text}, text
