"""Bad input to the REST API of a real cluster, one case at a time: each gets its 4xx, a message that
names the problem, and changes nothing (the keys read back unchanged; an interactive transaction
the bad call named is still active and still commits)."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass

import httpx
import pytest

from storage_adapters.contract import DATA_KEY_BYTES_MAX, DATA_VALUE_BYTES_MAX, REDO_BYTES_MAX
from tests.api.conftest import API_PARTITION_COUNT
from tests.cluster.harness import Cluster, keys_on, unknown_txn_id

UNKNOWN_TXN = unknown_txn_id("n0")
OP_COUNT_MAX = 1_000  # RuntimeLimits.op_count_max default: the cluster runs with it
# Full-size values over more keys than 2 per partition: by pigeonhole one partition gets 3, which
# cannot fit its redo record (2 values already exceed REDO_BYTES_MAX with their keys).
FULL_VALUE_COUNT = 2 * API_PARTITION_COUNT
BODY_BYTES_OVER = 9 * 1024 * 1024  # over services.api.rest.REQUEST_BYTES_MAX (8 MiB)
_fresh = itertools.count()


@dataclass(frozen=True)
class Bad:
    """A request and what it must get: `status`, and each of `words` in the error detail."""

    name: str
    method: str
    path: str  # {key} and {txn} are filled in per test
    body: object = None
    raw: bytes | None = None  # sent as is (with a JSON content type) instead of `body`
    status: int = 422
    words: tuple[str, ...] = ()


def _seed(cluster: Cluster) -> dict[str, str]:
    """Two fresh keys on two partitions, committed with known values."""
    index = next(_fresh)
    keys = [keys_on(f"p{p}", API_PARTITION_COUNT, 1, prefix=f"bad{index}-{p}-")[0] for p in (0, 1)]
    values = {key: f"seed-{key}" for key in keys}
    response = cluster.execute("n0", [{"op": "put", "key": k, "value": v} for k, v in values.items()])
    assert response.status_code == 200, response.text
    return values


def _send(cluster: Cluster, case: Bad, key: str, txn: str = "") -> httpx.Response:
    url = cluster.nodes["n0"].url + case.path.format(key=key, txn=txn)
    if case.raw is not None:
        return cluster.client.request(case.method, url, content=case.raw, headers={"content-type": "application/json"})
    return cluster.client.request(case.method, url, json=case.body)


def _assert_rejected(response: httpx.Response, case: Bad) -> None:
    assert response.status_code == case.status, (case.name, response.status_code, response.text)
    body = response.json()
    assert set(body) == {"error", "detail"}, body
    for word in case.words:
        assert word in body["detail"], (case.name, word, body["detail"])


def _put(key: str, value: object) -> dict[str, object]:
    return {"op": "put", "key": key, "value": value}


# One-shot calls: {key} is a seeded key; whatever the request says about it must not land.
ONE_SHOT = [
    Bad("malformed JSON", "POST", "/v1/execute", raw=b'{"ops": [', words=("JSON decode error",)),
    Bad("body not UTF-8", "POST", "/v1/execute", raw=b'{"ops": "\xff\xfe"}', words=("UTF-8",)),
    Bad("no body", "POST", "/v1/execute", words=("body", "Field required")),
    Bad("ops not a list", "POST", "/v1/execute", {"ops": "put"}, words=("ops", "list")),
    Bad("no ops", "POST", "/v1/execute", {"ops": []}, words=("ops", "at least 1")),
    Bad("unknown field", "POST", "/v1/execute", {"ops": [_put("{key}", "x")], "retries": 3}, words=("retries",)),
    Bad("unknown op", "POST", "/v1/execute", {"ops": [{"op": "increment", "key": "{key}"}]}, words=("increment",)),
    Bad("value not a string", "POST", "/v1/execute", {"ops": [_put("{key}", 5)]}, words=("value", "string")),
    Bad("key not a string", "POST", "/v1/execute", {"ops": [_put(7, "x")]}, words=("key", "string")),
    Bad("get with a value", "POST", "/v1/execute", {"ops": [{"op": "get", "key": "{key}", "value": "x"}]},
        words=("get.value", "Extra inputs")),
    Bad("put without a value", "POST", "/v1/execute", {"ops": [{"op": "put", "key": "{key}"}]},
        words=("put.value", "Field required")),
    Bad("empty key", "POST", "/v1/execute", {"ops": [_put("{key}", "x"), _put("", "x")]},
        words=("key", "at least 1 character")),
    Bad("key too long", "POST", "/v1/execute", {"ops": [_put("{key}", "x"), _put("k" * (DATA_KEY_BYTES_MAX + 1), "x")]},
        words=("key", f"at most {DATA_KEY_BYTES_MAX}")),
    Bad("key too many UTF-8 bytes", "POST", "/v1/execute", {"ops": [_put("{key}", "x"), _put("€" * 200, "x")]},
        words=("key is 600 bytes", f"limit is {DATA_KEY_BYTES_MAX}")),
    Bad("key a lone surrogate", "POST", "/v1/execute", raw=b'{"ops": [{"op": "put", "key": "\\ud800", "value": "x"}]}',
        words=("key",)),
    Bad("value too long", "POST", "/v1/execute", {"ops": [_put("{key}", "v" * (DATA_VALUE_BYTES_MAX + 1))]},
        words=("value", f"at most {DATA_VALUE_BYTES_MAX}")),
    Bad("too many ops", "POST", "/v1/execute", {"ops": [_put("{key}", "x")] * (OP_COUNT_MAX + 1)}, status=400,
        words=(f"{OP_COUNT_MAX + 1} operations", f"limit is {OP_COUNT_MAX}")),
    Bad("unknown protocol", "POST", "/v1/execute", {"ops": [_put("{key}", "x")], "protocol": "3pc"},
        words=("protocol",)),
    Bad("writes over one redo record", "POST", "/v1/execute",
        {"ops": [_put("{key}", "v" * DATA_VALUE_BYTES_MAX)]
         + [_put(f"{{key}}-{i}", "v" * DATA_VALUE_BYTES_MAX) for i in range(FULL_VALUE_COUNT)]},
        status=400, words=("per partition", str(REDO_BYTES_MAX))),
    Bad("body too large", "POST", "/v1/execute", raw=b" " * BODY_BYTES_OVER, status=413, words=("limit",)),
    Bad("put: value not a string", "PUT", "/v1/kv/{key}", {"value": 1}, words=("value", "string")),
    Bad("put: no body", "PUT", "/v1/kv/{key}", words=("body", "Field required")),
    Bad("put: key too long", "PUT", "/v1/kv/{key}" + "k" * DATA_KEY_BYTES_MAX, {"value": "x"},
        words=("key", f"at most {DATA_KEY_BYTES_MAX}")),
    Bad("put: wrong method", "PATCH", "/v1/kv/{key}", {"value": "x"}, status=405, words=("PATCH", "GET, HEAD, PUT")),
    Bad("begin: unknown protocol", "POST", "/v1/txn", {"protocol": "3pc"}, words=("protocol", "cornus")),
    # A name twice in one object (JSON allows it, and the parser keeps one value): which the client
    # meant is unknown, so nothing runs (found by review: only the write call refused it; here the
    # second "ops" ran alone, the last "key" or "value" was written).
    Bad("ops twice", "POST", "/v1/execute",
        raw=b'{"ops": [{"op": "put", "key": "{key}", "value": "1"}], "ops": [{"op": "get", "key": "{key}"}]}',
        words=("ops", "twice")),
    Bad("a key twice in an op", "POST", "/v1/execute",
        raw=b'{"ops": [{"op": "put", "key": "elsewhere", "value": "1", "key": "{key}"}]}', words=("key", "twice")),
    Bad("a value twice in an op", "POST", "/v1/execute",
        raw=b'{"ops": [{"op": "put", "key": "{key}", "value": "1", "value": "2"}]}', words=("value", "twice")),
    # Found by audit (2026-11-27): the fast path counted names as `"name":`, so one written with
    # whitespace before its colon went uncounted and the last value was written.
    Bad("a value twice, space before a colon", "POST", "/v1/execute",
        raw=b'{"ops": [{"op": "put", "key": "{key}", "value": "1", "value" : "2"}]}', words=("value", "twice")),
    Bad("a key twice, a tab before a colon", "POST", "/v1/execute",
        raw=b'{"ops": [{"op": "put", "key": "elsewhere", "value": "1", "key"\t: "{key}"}]}', words=("key", "twice")),
    Bad("a value twice, one name escaped", "POST", "/v1/execute",
        raw=b'{"ops": [{"op": "put", "key": "{key}", "value": "1", "v\\u0061lue": "2"}]}', words=("value", "twice")),
    Bad("put: value twice", "PUT", "/v1/kv/{key}", raw=b'{"value": "1", "value": "2"}', words=("value", "twice")),
    Bad("begin: protocol twice", "POST", "/v1/txn", raw=b'{"protocol": "cornus", "protocol": "2pc"}',
        words=("protocol", "twice")),
]


def _fill(body: object, key: str) -> object:
    if isinstance(body, str):
        return body.replace("{key}", key)
    if isinstance(body, list):
        return [_fill(item, key) for item in body]
    if isinstance(body, dict):
        return {_fill(k, key): _fill(v, key) for k, v in body.items()}
    return body


@pytest.mark.parametrize("case", ONE_SHOT, ids=[case.name for case in ONE_SHOT])
def test_one_shot_bad_input_is_refused_and_changes_nothing(api_cluster: Cluster, case: Bad) -> None:
    values = _seed(api_cluster)
    key = next(iter(values))
    raw = None if case.raw is None else case.raw.replace(b"{key}", key.encode())
    filled = Bad(case.name, case.method, case.path, _fill(case.body, key), raw, case.status, case.words)
    _assert_rejected(_send(api_cluster, filled, key), case)
    assert api_cluster.read("n1", list(values)) == values
    if case.status == 405:
        assert _send(api_cluster, filled, key).headers["allow"] == "GET, HEAD, PUT"


# Calls naming an active transaction that wrote {key} := "in-txn": the transaction must survive.
IN_TXN = [
    Bad("write: value not a string", "POST", "/v1/txn/{txn}/write", {"writes": {"{key}": 5}}, words=("string",)),
    Bad("write: nothing", "POST", "/v1/txn/{txn}/write", {"writes": {}}, words=("writes", "at least 1")),
    Bad("write: empty key", "POST", "/v1/txn/{txn}/write", {"writes": {"": "x"}}, words=("at least 1 character",)),
    Bad("write: value too long", "POST", "/v1/txn/{txn}/write",
        {"writes": {"{key}": "v" * (DATA_VALUE_BYTES_MAX + 1)}}, words=(f"at most {DATA_VALUE_BYTES_MAX}",)),
    Bad("write: too many", "POST", "/v1/txn/{txn}/write", {"writes": {f"w{i}": "x" for i in range(OP_COUNT_MAX + 1)}},
        status=400, words=(f"{OP_COUNT_MAX + 1} operations",)),
    Bad("write: malformed JSON", "POST", "/v1/txn/{txn}/write", raw=b'{"writes": {"a": "b",}}',
        words=("JSON decode error",)),
    # JSON allows a name twice in an object, and a parser keeps one of them: which value the
    # client meant is unknown (gRPC refuses the same write too).
    Bad("write: a key twice", "POST", "/v1/txn/{txn}/write", raw=b'{"writes": {"dup": "1", "dup": "2"}}',
        words=("dup", "twice")),
    Bad("read: no keys", "POST", "/v1/txn/{txn}/read", {"keys": []}, words=("keys", "at least 1")),
    Bad("read: keys not a list", "POST", "/v1/txn/{txn}/read", {"keys": "{key}"}, words=("keys", "list")),
    Bad("read: too many", "POST", "/v1/txn/{txn}/read", {"keys": ["{key}"] * (OP_COUNT_MAX + 1)}, status=400,
        words=(f"{OP_COUNT_MAX + 1} operations",)),
    # Found by audit (2026-11-27): read took the last "keys" and read (and locked) those alone.
    Bad("read: keys twice", "POST", "/v1/txn/{txn}/read", raw=b'{"keys": ["elsewhere"], "keys": ["{key}"]}',
        words=("keys", "twice")),
    Bad("bad txn id format", "POST", "/v1/txn/bad id!/commit", words=("txn", "pattern")),
    Bad("txn id too long", "POST", "/v1/txn/" + "t" * 129 + "/commit", words=("txn", "at most 128")),
    Bad("unknown txn id: commit", "POST", "/v1/txn/42.n0.ffffff.1/commit", status=404,
        words=("no transaction 42.n0.ffffff.1",)),
    Bad("unknown txn id: write", "POST", "/v1/txn/42.n0.ffffff.1/write", {"writes": {"{key}": "x"}}, status=404,
        words=("no transaction 42.n0.ffffff.1",)),
    Bad("unknown txn id: status", "GET", f"/v1/txn/{UNKNOWN_TXN}", status=404,
        words=(f"no transaction {UNKNOWN_TXN}",)),
]


@pytest.mark.parametrize("case", IN_TXN, ids=[case.name for case in IN_TXN])
def test_bad_call_leaves_the_transaction_active(api_cluster: Cluster, case: Bad) -> None:
    values = _seed(api_cluster)
    key, other = values
    txn = api_cluster.post("n0", "/v1/txn").json()["txn"]
    assert api_cluster.post("n0", f"/v1/txn/{txn}/write", {"writes": {key: "in-txn"}}).status_code == 200
    filled = Bad(case.name, case.method, case.path, _fill(case.body, key), case.raw, case.status, case.words)
    _assert_rejected(_send(api_cluster, filled, key, txn), case)
    assert api_cluster.get("n0", f"/v1/txn/{txn}").json()["outcome"] == "active"
    committed = api_cluster.post("n0", f"/v1/txn/{txn}/commit")
    assert committed.status_code == 200, committed.text
    assert api_cluster.read("n1", [key, other]) == {key: "in-txn", other: values[other]}


def test_calls_in_the_wrong_state_are_refused_and_change_nothing(api_cluster: Cluster) -> None:
    values = _seed(api_cluster)
    key, other = values
    committed = api_cluster.post("n0", "/v1/txn").json()["txn"]
    assert api_cluster.post("n0", f"/v1/txn/{committed}/write", {"writes": {key: "done"}}).status_code == 200
    assert api_cluster.post("n0", f"/v1/txn/{committed}/commit").status_code == 200
    aborted = api_cluster.post("n0", "/v1/txn").json()["txn"]
    assert api_cluster.post("n0", f"/v1/txn/{aborted}/write", {"writes": {other: "never"}}).status_code == 200
    assert api_cluster.post("n0", f"/v1/txn/{aborted}/abort").status_code == 409

    wrong = [
        (committed, "write", {"writes": {key: "after-commit"}}, "committed"),
        (committed, "read", {"keys": [key]}, "committed"),
        (committed, "commit", None, "committed"),
        (committed, "abort", None, "committed"),
        (aborted, "commit", None, "aborted"),
        (aborted, "write", {"writes": {other: "after-abort"}}, "aborted"),
    ]
    for txn, call, body, outcome in wrong:
        response = api_cluster.post("n0", f"/v1/txn/{txn}/{call}", body)
        assert response.status_code == 409, (call, response.text)
        assert response.json()["error"] == "wrong_state", response.text
        assert txn in response.json()["detail"] and f"already ended: {outcome}" in response.json()["detail"]
        assert api_cluster.get("n1", f"/v1/txn/{txn}").json()["outcome"] == outcome
    assert api_cluster.read("n1", [key, other]) == {key: "done", other: values[other]}


def test_unknown_paths_answer_in_the_error_shape(api_cluster: Cluster) -> None:
    response = api_cluster.get("n0", "/v1/kv/a%2Fb")
    assert response.status_code == 404 and response.json()["error"] == "not_found", response.text
    assert "/v1/kv/a/b" in response.json()["detail"]


def test_execute_takes_json_bodies_only_by_content_type_as_fastapi_does(api_cluster: Cluster) -> None:
    """POST /v1/execute skips FastAPI's stack when its body validates (rest._ExecuteFastPath); the
    content types it accepts must be FastAPI's: JSON or application/*+json, and (strict, FastAPI's
    default) not none at all."""
    key = keys_on("p0", API_PARTITION_COUNT, 1, prefix=f"ctype{next(_fresh)}-")[0]
    body = json.dumps({"ops": [_put(key, "v")]}).encode()
    url = api_cluster.nodes["n0"].url + "/v1/execute"
    for headers in ({"content-type": "text/plain"}, {}):
        refused = api_cluster.client.post(url, content=body, headers=headers)
        assert refused.status_code == 422 and refused.json()["error"] == "malformed_request", refused.text
    assert api_cluster.execute("n0", [{"op": "get", "key": key}]).json()["reads"] == {key: None}
    for content_type in ("application/json; charset=utf-8", "application/vnd.cornus+json"):
        answer = api_cluster.client.post(url, content=body, headers={"content-type": content_type})
        assert answer.status_code == 200 and answer.json()["outcome"] == "committed", (content_type, answer.text)


def test_a_body_of_countless_bad_items_is_refused_in_one_short_answer(api_cluster: Cluster) -> None:
    """Found by audit (2026-11-27): a list field had no bound in the schema, so 8 MiB of `{}` as
    operations (or of numbers as keys) made an error per item, millions, joined into one detail on
    the node's event loop. The schema stops at the largest op_count_max, and a 422 names ten of
    its problems at most."""
    for path, body in (("/v1/execute", {"ops": [{}] * 1_000_000}),
                       (f"/v1/txn/{UNKNOWN_TXN}/read", {"keys": [0] * 1_000_000})):
        refused = api_cluster.post("n0", path, body)
        assert refused.status_code == 422 and refused.json()["error"] == "malformed_request", refused.text[:300]
        assert len(refused.text) < 2_000, len(refused.text)
    many = api_cluster.post("n0", "/v1/execute", {"ops": [{"op": "put"}] * 50})
    assert many.status_code == 422 and "more" in many.json()["detail"], many.text[:300]
    assert len(many.text) < 2_000, len(many.text)


def test_a_key_whose_percent_escapes_are_not_utf8_is_refused(api_cluster: Cluster) -> None:
    """Found by audit (2026-11-27): the server decoded `%FF` and `%C0` in /v1/kv/{key} each as
    U+FFFD, so two different bad keys wrote one and the same key; a key that is not UTF-8 is 422."""
    base = api_cluster.nodes["n0"].url + "/v1/kv/"
    prefix = f"esc{next(_fresh)}-"
    for raw in ("%FF", "%C0", "a%E2%82"):
        put = api_cluster.client.put(base + prefix + raw, json={"value": "1"})
        assert put.status_code == 422 and "not UTF-8" in put.json()["detail"], (raw, put.text)
        got = api_cluster.client.get(base + prefix + raw)
        assert got.status_code == 422, (raw, got.text)
    replaced = prefix + "\ufffd"
    assert api_cluster.execute("n0", [{"op": "get", "key": replaced}]).json()["reads"] == {replaced: None}
    # Escapes that are UTF-8 name their key, U+FFFD itself included.
    for raw, key in (("caf%C3%A9", "café"), ("%EF%BF%BD", "\ufffd"), ("plain", "plain")):
        assert api_cluster.client.put(base + prefix + raw, json={"value": "2"}).status_code == 200, raw
        reads = api_cluster.execute("n0", [{"op": "get", "key": prefix + key}]).json()["reads"]
        assert reads == {prefix + key: "2"}, raw


def test_an_interactive_read_past_what_a_reply_carries_is_refused_and_the_transaction_goes_on(
    api_cluster: Cluster,
) -> None:
    """Found by audit (2026-11-27): each partition's share of a read is bounded, the whole was
    not, and REST built the JSON of whatever came back in memory (the public gRPC API refuses the
    same read past its reply's 16 MiB). Refused as bad input; the transaction goes on."""
    from services.api.rest import READ_REPLY_VALUE_BYTES_MAX

    value = "v" * DATA_VALUE_BYTES_MAX
    count = READ_REPLY_VALUE_BYTES_MAX // DATA_VALUE_BYTES_MAX + 2
    keys = [f"big{next(_fresh)}-{i}" for i in range(count)]
    for key in keys:
        # One at a time: two such values whose keys fall in one partition pass its redo's limit
        # (it failed so now and then, as the counter's keys fell).
        done = api_cluster.execute("n0", [_put(key, value)])
        assert done.status_code == 200, done.text[:300]
    txn = api_cluster.post("n0", "/v1/txn", {}).json()["txn"]
    refused = api_cluster.post("n0", f"/v1/txn/{txn}/read", {"keys": keys})
    assert refused.status_code == 400 and "read fewer keys" in refused.json()["detail"], refused.text[:300]
    assert "holds what it locked" in refused.json()["detail"]  # not "nothing changed", as a 400 says
    assert api_cluster.post("n0", f"/v1/txn/{txn}/read", {"keys": keys[:2]}).status_code == 200
    assert api_cluster.post("n0", f"/v1/txn/{txn}/commit").json()["outcome"] == "committed"
