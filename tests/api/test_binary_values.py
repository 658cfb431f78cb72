"""A value that is not UTF-8 (written through the public gRPC API) comes back through REST as its
exact bytes, base64-encoded beside the text values (`reads_base64`, `values_base64`) and left out
of `reads` and `values`, so a client that does not know those fields fails on the missing key
instead of reading other bytes. Found by review: REST decoded it with U+FFFD in place of each bad
byte, and a read-modify-write through REST or the SDK then stored the altered value. UTF-8 values
keep the JSON form they always had."""

from __future__ import annotations

import base64
import uuid
from urllib.parse import quote

import jsonschema
import pytest

from tests.api.grpc_values import BINARY_VALUES, TEXT_VALUES, write_through_grpc
from tests.cluster.harness import Cluster

# What an outcome's body held before binary values had a field of their own: a body with text
# values alone must hold exactly these still.
OUTCOME_FIELDS = {"txn", "outcome", "reason", "retryable", "detail", "reads", "timing_ms"}


@pytest.fixture
def stored(api_cluster: Cluster) -> tuple[dict[str, bytes], dict[str, str]]:
    """Binary and text values under keys of this test, committed through gRPC on n0."""
    prefix = f"b{uuid.uuid4().hex[:10]}-"
    binary = {prefix + name: value for name, value in BINARY_VALUES.items()}
    text = {prefix + "t-" + name: value for name, value in TEXT_VALUES.items()}
    write_through_grpc(api_cluster.nodes["n0"].grpc_target,
                       {**binary, **{key: value.encode() for key, value in text.items()}})
    return binary, text


def _base64(values: dict[str, bytes]) -> dict[str, str]:
    return {key: base64.b64encode(value).decode("ascii") for key, value in values.items()}


def _exact(encoded: dict[str, str]) -> dict[str, bytes]:
    return {key: base64.b64decode(value, validate=True) for key, value in encoded.items()}


def _check_published(api_cluster: Cluster, model: str, body: object) -> None:
    """`body` fits `model` as the node's published OpenAPI declares it: the schema fuzz test
    writes text alone, so it never sees a binary value's answer."""
    components = api_cluster.get("n0", "/openapi.json").json()["components"]
    jsonschema.Draft202012Validator({"$ref": f"#/components/schemas/{model}", "components": components},
                                    format_checker=jsonschema.FormatChecker()).validate(body)


def test_a_one_shot_returns_binary_values_exactly(api_cluster: Cluster,
                                                  stored: tuple[dict[str, bytes], dict[str, str]]) -> None:
    binary, text = stored
    absent = f"absent-{uuid.uuid4().hex}"
    response = api_cluster.execute_retrying("n1", [{"op": "get", "key": key} for key in [*binary, *text, absent]])
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["reads"] == {**text, absent: None}, body
    assert _exact(body["reads_base64"]) == binary, body
    assert body["reads_base64"] == _base64(binary)
    _check_published(api_cluster, "OutcomeOut", body)


def test_the_key_route_returns_a_binary_value_exactly(api_cluster: Cluster,
                                                      stored: tuple[dict[str, bytes], dict[str, str]]) -> None:
    binary, _ = stored
    for key, value in binary.items():
        response = api_cluster.get("n0", f"/v1/kv/{quote(key, safe='')}")
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["reads"] == {} and _exact(body["reads_base64"]) == {key: value}, body


def test_an_interactive_read_returns_binary_values_exactly(
    api_cluster: Cluster, stored: tuple[dict[str, bytes], dict[str, str]]
) -> None:
    binary, text = stored
    begun = api_cluster.post("n1", "/v1/txn")
    assert begun.status_code == 201, begun.text
    txn = begun.json()["txn"]
    read = api_cluster.post("n1", f"/v1/txn/{txn}/read", {"keys": [*binary, *text]})
    assert read.status_code == 200, read.text
    body = read.json()
    assert body["values"] == text and _exact(body["values_base64"]) == binary, body
    _check_published(api_cluster, "ReadOut", body)
    commit = api_cluster.post("n1", f"/v1/txn/{txn}/commit")
    assert commit.status_code == 200, commit.text
    assert "reads_base64" not in commit.json(), commit.text


def test_text_values_keep_their_json_form(api_cluster: Cluster,
                                          stored: tuple[dict[str, bytes], dict[str, str]]) -> None:
    _, text = stored
    one_shot = api_cluster.execute_retrying("n0", [{"op": "get", "key": key} for key in text])
    assert one_shot.status_code == 200, one_shot.text
    assert set(one_shot.json()) == OUTCOME_FIELDS and one_shot.json()["reads"] == text, one_shot.text
    key = next(iter(text))
    by_key = api_cluster.get("n0", f"/v1/kv/{quote(key, safe='')}")
    assert set(by_key.json()) == OUTCOME_FIELDS and by_key.json()["reads"] == {key: text[key]}, by_key.text
    txn = api_cluster.post("n0", "/v1/txn").json()["txn"]
    read = api_cluster.post("n0", f"/v1/txn/{txn}/read", {"keys": list(text)})
    assert read.json() == {"txn": txn, "values": text}, read.text
    aborted = api_cluster.post("n0", f"/v1/txn/{txn}/abort")
    assert aborted.status_code == 409 and set(aborted.json()) == OUTCOME_FIELDS, aborted.text


def test_the_published_schema_declares_the_binary_fields(api_cluster: Cluster) -> None:
    models = api_cluster.get("n0", "/openapi.json").json()["components"]["schemas"]
    for model, field in (("OutcomeOut", "reads_base64"), ("ReadOut", "values_base64")):
        declared = models[model]["properties"][field]
        assert declared["additionalProperties"]["contentEncoding"] == "base64", declared
        assert "not UTF-8" in declared["description"], declared
        assert field not in models[model].get("required", []), models[model]
