"""A one-shot whose id its client chose (cornus.protocol.txn_ids.client_txn_problem), over REST on
real node processes: it runs under that id, the status call answers for it on any node, the same
id is never run twice, and a bad id is refused with nothing changed."""

from __future__ import annotations

import secrets
import time
import uuid

import pytest

from cornus.protocol.config import Protocol
from cornus.protocol.txn_ids import CLIENT_BEGIN_MS_AGE_MAX, client_txn_id
from tests.cluster.harness import Cluster


def _new_id(node: str = "n0", begin_ms: int | None = None, protocol: Protocol = Protocol.CORNUS) -> str:
    # The nodes run on this machine: its clock is theirs, so a begin of a few ms ago is accepted.
    begin_ms = int(time.time() * 1000) - 5 if begin_ms is None else begin_ms
    return client_txn_id(begin_ms, node, secrets.token_hex(16), protocol)


def _put(key: str, value: str) -> list[dict[str, object]]:
    return [{"op": "put", "key": key, "value": value}]


def test_healthz_names_the_node_its_default_protocol_and_its_clock(api_cluster: Cluster) -> None:
    before_ms = int(time.time() * 1000)
    health = api_cluster.get("n0", "/healthz").json()
    after_ms = int(time.time() * 1000)
    node_ms = health.pop("now_unix_ms")
    assert health == {"status": "ok", "node": "n0", "protocol": "cornus", "client_txn_age_ms_max": 1_000}
    assert before_ms - 1_000 <= node_ms <= after_ms + 1_000  # one machine's clock


def test_a_client_chosen_id_commits_once_and_the_status_call_knows_it(api_cluster: Cluster) -> None:
    key = f"cid-{uuid.uuid4().hex[:10]}"
    txn = _new_id()
    response = api_cluster.post("n0", "/v1/execute", {"ops": _put(key, "first"), "txn": txn})
    assert response.status_code == 200, response.text
    assert response.json()["txn"] == txn and response.json()["outcome"] == "committed"
    for node in ("n0", "n1"):  # its coordinator remembers it; the other asks it
        status = api_cluster.get(node, f"/v1/txn/{txn}")
        assert status.status_code == 200 and status.json()["outcome"] == "committed", (node, status.text)
    # The same id again (a resend, or a mistake) writes nothing, and its answer is the unknown
    # outcome (202), not an error that says "nothing changed" of the first.
    again = api_cluster.post("n0", "/v1/execute", {"ops": _put(key, "second"), "txn": txn})
    assert again.status_code == 202 and again.json()["outcome"] == "unknown", again.text
    assert "already known" in again.json()["detail"]
    assert api_cluster.read("n0", [key]) == {key: "first"}


def test_a_resend_of_a_run_id_past_its_begin_window_is_known_not_refused_as_too_old(api_cluster: Cluster) -> None:
    """Found by audit (2026-11-27): a client-chosen id past its begin's age bound was refused as
    too old (400 txn_begin_refused, "nothing ran") before the node looked whether it had run it;
    a resend of a committed one-shot (a proxy retrying the POST after the answer was lost) told
    the SDK nothing ran, and it sent the transaction again under an id of the node's."""
    key = f"cid-{uuid.uuid4().hex[:10]}"
    txn = _new_id()
    first = api_cluster.post("n0", "/v1/execute", {"ops": _put(key, "first"), "txn": txn})
    assert first.status_code == 200 and first.json()["outcome"] == "committed", first.text
    time.sleep(CLIENT_BEGIN_MS_AGE_MAX / 1000 + 0.2)  # past the begin's age bound
    again = api_cluster.post("n0", "/v1/execute", {"ops": _put(key, "second"), "txn": txn})
    assert again.status_code == 202 and again.json()["outcome"] == "unknown", again.text
    assert "already known" in again.json()["detail"], again.text  # known, not refused as too old
    assert api_cluster.read("n0", [key]) == {key: "first"}


@pytest.mark.parametrize(("make", "words"), [
    # The node the id names may have run it (a load balancer sent the request there first), or
    # this one before the id grew old: unknown (202), and nothing ran here (found by audit, 2026-11-27).
    (lambda: _new_id(node="n1"), "must name the node it is sent to"),
    (lambda: _new_id(begin_ms=int(time.time() * 1000) - 5_000), "behind this node's clock"),
])
def test_a_client_chosen_id_an_earlier_delivery_may_have_run_is_unknown_and_changes_nothing(
    api_cluster: Cluster, make: object, words: str,
) -> None:
    key = f"cid-{uuid.uuid4().hex[:10]}"
    response = api_cluster.post("n0", "/v1/execute", {"ops": _put(key, "v"), "txn": make()})  # type: ignore[operator]
    assert response.status_code == 202 and response.json()["outcome"] == "unknown", response.text
    assert words in response.json()["detail"], response.text
    assert api_cluster.read("n0", [key]) == {key: None}


@pytest.mark.parametrize(("make", "error", "words"), [
    (lambda: _new_id(begin_ms=int(time.time() * 1000) + 5_000), "txn_begin_refused", "ahead of this node's clock"),
    (lambda: _new_id().replace(".c", ".cXYZ", 1), "invalid_txn", "the token must be"),
    (lambda: _new_id().rsplit(".", 1)[0], "invalid_txn", "not a protocol tag"),
    (lambda: _new_id(protocol=Protocol.TWO_PC), "invalid_txn", "names protocol 2pc"),
])
def test_a_bad_client_chosen_id_is_refused_and_changes_nothing(
    api_cluster: Cluster, make: object, error: str, words: str,
) -> None:
    key = f"cid-{uuid.uuid4().hex[:10]}"
    txn = make()  # type: ignore[operator]
    body: dict[str, object] = {"ops": _put(key, "v"), "txn": txn}
    if "2pc" in words:
        body["protocol"] = "cornus"  # and the id says 2pc
    response = api_cluster.post("n0", "/v1/execute", body)
    assert response.status_code == 400, response.text
    assert response.json()["error"] == error and words in response.json()["detail"], response.text
    assert api_cluster.read("n0", [key]) == {key: None}
    assert api_cluster.get("n0", f"/v1/txn/{txn}").json().get("outcome") != "committed"


def test_an_id_the_schema_refuses_or_a_txn_named_twice_is_malformed(api_cluster: Cluster) -> None:
    key = f"cid-{uuid.uuid4().hex[:10]}"
    assert api_cluster.post("n0", "/v1/execute", {"ops": _put(key, "v"), "txn": "../x"}).status_code == 422
    txn = _new_id()
    body = f'{{"ops": [{{"op": "put", "key": "{key}", "value": "v"}}], "txn": "{txn}", "txn": "{_new_id()}"}}'
    response = api_cluster.client.post(f"{api_cluster.nodes['n0'].url}/v1/execute", content=body,
                                       headers={"content-type": "application/json"})
    assert response.status_code == 422 and "named twice" in response.text, response.text
    assert api_cluster.read("n0", [key]) == {key: None}
