"""The SDK, sync and async, hands a value that is not UTF-8 (written through the public gRPC API) to
its caller as exactly its bytes, and its text helpers refuse it by name rather than return other
bytes. Found by review: REST decoded it with U+FFFD in place of each bad byte, and a
read-modify-write through the SDK then stored the altered value."""

from __future__ import annotations

import httpx
import pytest

from services.client import (
    AsyncCornusClient,
    ClientConfig,
    CornusClient,
    InvalidRequest,
    Op,
    ServerError,
    ValueNotText,
)
from services.client._core import parse_outcome, read_text
from tests.api.grpc_values import BINARY_VALUES, TEXT_VALUES, read_through_grpc, write_through_grpc
from tests.cluster.harness import Cluster

FAST = ClientConfig(backoff_ms_min=5, backoff_ms_max=50, retry_count_max=3)


@pytest.fixture
def stored(cluster: Cluster, prefix: str) -> tuple[dict[str, bytes], dict[str, str]]:
    """Binary and text values under keys of this test, committed through gRPC on n0."""
    binary = {prefix + name: value for name, value in BINARY_VALUES.items()}
    text = {prefix + "t-" + name: value for name, value in TEXT_VALUES.items()}
    write_through_grpc(cluster.nodes["n0"].grpc_target,
                       {**binary, **{key: value.encode() for key, value in text.items()}})
    return binary, text


def test_sync_one_shots_hand_back_exact_bytes(urls: list[str], stored: tuple[dict[str, bytes], dict[str, str]],
                                             prefix: str) -> None:
    binary, text = stored
    absent = prefix + "absent"
    with CornusClient(urls, config=FAST) as client:
        outcome = client.execute([Op.get(key) for key in [*binary, *text, absent]])
        assert outcome.committed, outcome
        assert outcome.binary_reads == binary and outcome.reads == {**text, absent: None}
        assert outcome.to_json()["reads"] == {**text, absent: None}
        for key, value in binary.items():
            assert outcome.read_bytes(key) == value and client.get_bytes(key) == value
            with pytest.raises(ValueNotText, match=f"{key!r}.*binary_reads"):
                outcome.reads.get(key)
            with pytest.raises(ValueNotText, match=f"{key!r}.*binary_reads"):
                outcome.reads[key]
            with pytest.raises(ValueNotText, match=f"{key!r}.*get_bytes") as refused:
                client.get(key)
            assert refused.value.key == key and refused.value.value == value
        for key, value in text.items():
            assert client.get(key) == value and client.get_bytes(key) == value.encode()
            assert outcome.read_bytes(key) == value.encode()
        assert outcome.read_bytes(absent) is None and client.get_bytes(absent) is None


def test_sync_transactions_hand_back_exact_bytes_and_never_write_them_altered(
    cluster: Cluster, urls: list[str], stored: tuple[dict[str, bytes], dict[str, str]]
) -> None:
    binary, text = stored
    with CornusClient(urls, config=FAST) as client:
        with client.transaction() as txn:
            assert txn.read_bytes([*binary, *text]) == {**binary, **{k: v.encode() for k, v in text.items()}}
            assert txn.read(list(text)) == text
        # A read-modify-write that takes the value for text is refused before it writes anything.
        key = next(iter(binary))
        with pytest.raises(ValueNotText, match=f"{key!r}.*read_bytes"), client.transaction() as txn:
            txn.write({key: txn.read([key])[key] + "x"})  # type: ignore[operator]
        assert txn.outcome is not None and not txn.outcome.committed
    assert read_through_grpc(cluster.nodes["n1"].grpc_target, list(binary)) == binary


async def test_async_one_shots_and_transactions_hand_back_exact_bytes(
    cluster: Cluster, urls: list[str], stored: tuple[dict[str, bytes], dict[str, str]]
) -> None:
    binary, text = stored
    async with AsyncCornusClient(urls, config=FAST) as client:
        outcome = await client.execute([Op.get(key) for key in [*binary, *text]])
        assert outcome.committed and outcome.binary_reads == binary and outcome.reads == text, outcome
        for key, value in binary.items():
            assert await client.get_bytes(key) == value
            with pytest.raises(ValueNotText, match=f"{key!r}.*get_bytes"):
                await client.get(key)
        for key, value in text.items():
            assert await client.get(key) == value
        async with client.transaction() as txn:
            assert await txn.read_bytes(list(binary)) == binary
            assert await txn.read(list(text)) == text
        key = next(iter(binary))
        with pytest.raises(ValueNotText, match=f"{key!r}.*read_bytes"):
            async with client.transaction() as txn:
                await txn.write({key: (await txn.read([key]))[key] + "x"})  # type: ignore[operator]
        assert txn.outcome is not None and not txn.outcome.committed
    assert read_through_grpc(cluster.nodes["n2"].grpc_target, list(binary)) == binary


def test_a_binary_value_cannot_be_written_through_the_sdk(urls: list[str], prefix: str) -> None:
    """REST carries text values only: bytes are refused before anything is sent, naming gRPC."""
    with CornusClient(urls, config=FAST) as client, pytest.raises(InvalidRequest, match="gRPC"):
        client.put(prefix + "k", b"\xff")  # type: ignore[arg-type]


@pytest.mark.parametrize("reads_base64", [{"k": "not base64!"}, {"k": 1}, {"t": "//4A"}, ["//4A"]])
def test_an_answer_with_malformed_binary_values_is_a_bad_response(reads_base64: object) -> None:
    """A value the client cannot take exactly (not base64, or a key given both as text and as
    bytes) is never guessed at."""
    body = {"txn": "t", "outcome": "committed", "retryable": False, "reads": {"t": "x"}, "reads_base64": reads_base64}
    with pytest.raises(ServerError, match="not an outcome"):
        parse_outcome("http://node", httpx.Response(200, json=body), "t", may_have_committed=False)
    with pytest.raises(ServerError, match="read returned"):
        read_text("http://node", {"txn": "t", "values": {"t": "x"}, "values_base64": reads_base64}, ["t"])
