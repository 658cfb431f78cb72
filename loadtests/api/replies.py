"""A node's answer as the Reply a workload program receives: the one place that reads the REST
API's statuses and bodies (services/api/rest.py), that normalises an outcome whichever transport
carried it (the gRPC users hand theirs to `outcome_reply` too), and that says what a call without
an answer means (`no_answer`).

What an answer means, from the API's documentation:
- Execute and Commit: 200 committed, 409 aborted (`retryable` says whether to try again), 503
  unavailable (nothing committed, retryable), 202 outcome unknown; their body says the same in
  words. Any other status is an error answer: `failed`, with the API's error code.
- Read and Write: 200 the transaction is still `active`; 409 with an outcome, it aborted; any
  other answer (409 wrong_state, 4xx, 503 storage_unavailable) is `failed` and the transaction is
  still open at the node (loadtests.api.exchange aborts it).
- Begin: 201 with the id; 503 unavailable (retryable: nothing began).
- No answer at all (a lost connection, a deadline): `unknown` for Execute and Commit, which may
  have committed, else `failed`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from loadtests.api.exchange import NODE_OUTCOMES, Abort, Begin, Call, Step
from loadtests.workloads.base import Reply

# The statuses an Execute or a Commit answers with an outcome.
OUTCOME_STATUSES = (200, 202, 409, 503)


def outcome_reply(outcome: object, reason: str | None, detail: str, retryable: bool, *,
                  reads: object = None, timing_ms: object = None) -> Reply:
    """A node's outcome as a Reply. `reason` is the API's code (an abort's: conflict, voted_no,
    ...); only aborts have one, so an outcome without one says why in `detail` (unavailable:
    which owner or store did not answer). Reads and timings of another shape than the API's are
    dropped, not trusted."""
    if outcome not in NODE_OUTCOMES:
        return Reply("failed", f"no outcome {outcome!r}")
    return Reply(str(outcome), str(reason or detail or ""), bool(retryable), _str_map(reads), _float_map(timing_ms))


def no_answer(step: Step, error: str) -> Reply:
    """The Reply of a call whose answer never came (`error` names the transport's failure): an
    Execute or a Commit may have committed all the same."""
    if isinstance(step, Call) and step.final:
        return Reply("unknown", error)
    return Reply("failed", error)


def rest_reply(step: Step, status: int, data: bytes) -> Reply:
    """The Reply of a REST answer (`status`, body `data`) to `step`."""
    body = _json(data)
    if isinstance(step, Begin):
        txn = body.get("txn")
        if status == 201 and isinstance(txn, str) and txn:
            return Reply("active", txn=txn)
        if status == 503:
            return Reply("unavailable", _error_code(body, status), retryable=True)
        return Reply("failed", _error_code(body, status))
    if isinstance(step, Abort):
        return Reply("aborted" if status in (200, 409) else "failed", _error_code(body, status))
    if not step.final and status == 200:
        values = body.get("values")
        return Reply("active", values=_str_map(values))
    statuses = OUTCOME_STATUSES if step.final else (409,)
    if status in statuses and "outcome" in body:
        return outcome_reply(body.get("outcome"), body.get("reason"), str(body.get("detail") or ""),
                             bool(body.get("retryable")), reads=body.get("reads"), timing_ms=body.get("timing_ms"))
    return Reply("failed", _error_code(body, status))


def _error_code(body: Mapping[str, Any], status: int) -> str:
    return str(body.get("error") or status)


def _json(data: bytes) -> dict[str, Any]:
    try:
        parsed = json.loads(data) if data else {}
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _str_map(value: object) -> dict[str, str | None]:
    if not isinstance(value, dict):
        return {}
    return {str(key): item if item is None or isinstance(item, str) else str(item) for key, item in value.items()}


def _float_map(value: object) -> dict[str, float]:
    if not isinstance(value, dict):
        return {}
    return {str(key): float(item) for key, item in value.items()
            if isinstance(item, int | float) and not isinstance(item, bool)}
