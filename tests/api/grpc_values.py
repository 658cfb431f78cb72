"""Values written through a node's public gRPC API, the only API that takes any bytes: what the
REST and SDK tests of values that are not UTF-8 read back (tests/api/test_binary_values.py,
tests/client/test_binary_values.py)."""

from __future__ import annotations

import time
from collections.abc import Mapping

import grpc

import services.public_api  # noqa: F401 - builds the generated code before it is imported below
from services.public_api._generated import public_pb2 as pb
from services.public_api._generated import public_pb2_grpc
from tests.api_grpc.conftest import TIMEOUT_S_CALL, TIMEOUT_S_READ_BACK, put, read_back

# Not UTF-8, each in its own way: REST answered each with U+FFFD in place of the bad bytes.
BINARY_VALUES = {
    "high": b"\xff\xfe",
    "mixed": b"ab\x80cd\x00",
    "surrogate": b"\xed\xa0\x80",  # an encoded UTF-16 surrogate: no UTF-8 decoder takes it
    "overlong": b"\xc0\x80",  # NUL spelt in two bytes
    "truncated": "é".encode()[:1],
}
# UTF-8 text, whose JSON form must stay what it always was: U+FFFD itself and NUL included.
TEXT_VALUES = {
    "ascii": "100",
    "accents": "héllo",
    "replacement": "\ufffd",
    "nul": "a\x00b",
    "emoji": "😀",
    "empty": "",
}


def write_through_grpc(target: str, values: Mapping[str, bytes]) -> None:
    """Commit `values` in one one-shot through the public gRPC API at `target`, again while the
    outcome is a retryable abort (a lock another test's transaction still holds)."""
    deadline = time.monotonic() + TIMEOUT_S_READ_BACK
    request = pb.ExecuteRequest(ops=[put(key, value) for key, value in values.items()])
    with grpc.insecure_channel(target) as channel:
        stub = public_pb2_grpc.CornusStub(channel)
        while True:
            outcome = stub.Execute(request, timeout=TIMEOUT_S_CALL)
            if outcome.outcome == pb.OUTCOME_COMMITTED:
                return
            assert outcome.retryable and time.monotonic() < deadline, outcome
            time.sleep(0.05)


def read_through_grpc(target: str, keys: list[str]) -> dict[str, bytes | None]:
    """The committed values of `keys`, as the public gRPC API reads them (exact bytes)."""
    with grpc.insecure_channel(target) as channel:
        return read_back(public_pb2_grpc.CornusStub(channel), keys)
