"""The REST call of each step of loadtests.api.exchange: its path, its JSON body, the name Locust
reports it under (one per endpoint, not per transaction id), and the statuses the API promises for
it (anything else is a failure of the call in Locust's statistics; an abort is not one)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from loadtests.api.exchange import Abort, Begin, Call, Step
from loadtests.api.replies import OUTCOME_STATUSES
from loadtests.workloads.base import Execute, Read, Write

JSON_HEADERS = {"Content-Type": "application/json"}


@dataclass(frozen=True, slots=True)
class RestCall:
    path: str
    name: str
    body: bytes
    promised: tuple[int, ...]


def rest_call(step: Step) -> RestCall:
    """The POST that performs `step`."""
    if isinstance(step, Begin):
        return RestCall("/v1/txn", "/v1/txn (begin)", b"{}", (201, 503))
    if isinstance(step, Abort):
        # 404: the node forgot it already; 409: it had ended. Either way nothing is left to free.
        return RestCall(f"/v1/txn/{step.txn}/abort", "/v1/txn/[id]/abort", b"", (200, 404, 409))
    assert isinstance(step, Call)
    request = step.request
    if isinstance(request, Execute):
        return RestCall("/v1/execute", "/v1/execute", _dumps({"ops": list(request.ops)}), OUTCOME_STATUSES)
    if isinstance(request, Read):
        return RestCall(f"/v1/txn/{step.txn}/read", "/v1/txn/[id]/read", _dumps({"keys": list(request.keys)}),
                        (200, 409))
    if isinstance(request, Write):
        return RestCall(f"/v1/txn/{step.txn}/write", "/v1/txn/[id]/write", _dumps({"writes": dict(request.writes)}),
                        (200, 409))
    return RestCall(f"/v1/txn/{step.txn}/commit", "/v1/txn/[id]/commit", b"", OUTCOME_STATUSES)


def _dumps(body: object) -> bytes:
    return json.dumps(body).encode()
