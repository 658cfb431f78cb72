"""The public REST API of a node (FastAPI): transactions, one-shot execute, single keys, status and
health. Every node serves it and coordinates the transactions it is asked to run.

Outcomes map to status codes so a plain HTTP client can act on them, and the body always says the
same in words: 200 committed, 409 aborted (`retryable` says whether to try again), 503 storage or
peers unavailable (retryable, nothing committed), 202 outcome unknown (ask `GET /v1/txn/{txn}`).
Bad input gets a 4xx naming the problem and changes nothing.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Literal

from fastapi import Body, FastAPI, Path, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from cornus.protocol.config import Protocol
from cornus.runtime.node import Node, TxnAborted, ops_for_writes
from cornus.runtime.outcome import NodeOverloaded, Outcome, OutcomeStatus, TxnNotFound, TxnWrongState
from cornus.runtime.wire import Op, OpKind
from storage_adapters.contract import DATA_KEY_BYTES_MAX, DATA_VALUE_BYTES_MAX, TXN_ID_LENGTH_MAX
from storage_adapters.errors import StorageUnavailable, ValidationError

_STATUS_CODES = {
    OutcomeStatus.COMMITTED: 200,
    OutcomeStatus.ABORTED: 409,
    OutcomeStatus.UNAVAILABLE: 503,
    OutcomeStatus.UNKNOWN: 202,
    OutcomeStatus.ACTIVE: 200,
}

Key = Annotated[str, Field(min_length=1, max_length=DATA_KEY_BYTES_MAX, examples=["alice"])]
Value = Annotated[str, Field(max_length=DATA_VALUE_BYTES_MAX, examples=["100"])]
PathKey = Annotated[str, Path(min_length=1, max_length=DATA_KEY_BYTES_MAX)]
TxnId = Annotated[str, Path(min_length=1, max_length=TXN_ID_LENGTH_MAX, pattern=r"^[A-Za-z0-9_.:-]+$")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class OpIn(_Strict):
    op: Literal["get", "put", "delete", "check"]
    key: Key
    value: Value | None = Field(
        default=None, description="put: the new value; check: the expected value (null: the key must be absent)"
    )


class ExecuteIn(_Strict):
    ops: list[OpIn] = Field(min_length=1, examples=[[{"op": "put", "key": "k", "value": "v"}]])
    protocol: Protocol | None = None


class BeginIn(_Strict):
    protocol: Protocol | None = None


class ReadIn(_Strict):
    keys: list[Key] = Field(min_length=1, examples=[["alice", "bob"]])


class WriteIn(_Strict):
    writes: dict[Key, Value | None] = Field(
        min_length=1, description="key -> new value (null deletes the key)", examples=[{"alice": "90", "bob": "110"}]
    )


class PutIn(_Strict):
    value: Value


class OutcomeOut(BaseModel):
    txn: str
    outcome: OutcomeStatus
    reason: str | None = None
    retryable: bool
    detail: str = ""
    reads: dict[str, str | None] = Field(default_factory=dict)
    timing_ms: dict[str, float] = Field(default_factory=dict)


class BeginOut(BaseModel):
    txn: str


class ReadOut(BaseModel):
    txn: str
    values: dict[str, str | None]


class ErrorOut(BaseModel):
    error: str
    detail: str


def _outcome_body(outcome: Outcome) -> dict[str, Any]:
    return OutcomeOut(
        txn=outcome.txn,
        outcome=outcome.status,
        reason=None if outcome.reason is None else outcome.reason.value,
        retryable=outcome.retryable,
        detail=outcome.detail,
        reads={key: None if value is None else value.decode("utf-8", "replace") for key, value in outcome.reads},
        timing_ms=outcome.timing_ms,
    ).model_dump()


def _outcome_response(outcome: Outcome) -> JSONResponse:
    headers = {"Retry-After": "1"} if outcome.status is OutcomeStatus.UNAVAILABLE else None
    return JSONResponse(_outcome_body(outcome), status_code=_STATUS_CODES[outcome.status], headers=headers)


def _error(status: int, error: str, detail: str) -> JSONResponse:
    return JSONResponse({"error": error, "detail": detail}, status_code=status)


def _op(op: OpIn) -> Op:
    kind = OpKind(op.op)
    if kind in (OpKind.GET, OpKind.DELETE) and op.value is not None:
        raise ValidationError(f"a {op.op} op takes no value (key {op.key!r})")
    if kind is OpKind.PUT and op.value is None:
        raise ValidationError(f"a put op needs a value (key {op.key!r})")
    return Op(kind, op.key, None if op.value is None else op.value.encode("utf-8"))


_ERRORS = {
    409: {"model": OutcomeOut, "description": "aborted (see reason and retryable)"},
    400: {"model": ErrorOut, "description": "invalid request"},
    404: {"model": ErrorOut, "description": "unknown transaction"},
    422: {"model": ErrorOut, "description": "malformed request"},
    503: {"model": ErrorOut, "description": "storage, peers or this node unavailable: retry"},
}


def build_app(node: Node) -> FastAPI:
    limits = node.config.limits
    app = FastAPI(
        title="Cornus",
        version="1",
        description=__doc__,
        responses=_ERRORS,  # type: ignore[arg-type]
    )

    @app.exception_handler(RequestValidationError)
    async def _malformed(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc'])}: {error['msg']}" for error in exc.errors()
        )
        return _error(422, "malformed_request", problems or "the request body is not valid JSON of the right shape")

    @app.exception_handler(ValidationError)
    async def _invalid(request: Request, exc: ValidationError) -> JSONResponse:
        return _error(400, "invalid_request", str(exc))

    @app.exception_handler(TxnNotFound)
    async def _not_found(request: Request, exc: TxnNotFound) -> JSONResponse:
        return _error(404, "not_found", str(exc))

    @app.exception_handler(TxnWrongState)
    async def _wrong_state(request: Request, exc: TxnWrongState) -> JSONResponse:
        return _error(409, "wrong_state", str(exc))

    @app.exception_handler(NodeOverloaded)
    async def _overloaded(request: Request, exc: NodeOverloaded) -> JSONResponse:
        return JSONResponse({"error": "unavailable", "detail": str(exc)}, status_code=503, headers={"Retry-After": "1"})

    @app.exception_handler(StorageUnavailable)
    async def _storage(request: Request, exc: StorageUnavailable) -> JSONResponse:
        return JSONResponse({"error": "storage_unavailable", "detail": str(exc)}, status_code=503,
                            headers={"Retry-After": "1"})

    def check_op_count(count: int) -> None:
        if count > limits.op_count_max:
            raise ValidationError(f"{count} operations, the limit is {limits.op_count_max}")

    @app.post("/v1/execute", response_model=OutcomeOut, summary="Run a one-shot transaction")
    async def execute(body: ExecuteIn) -> JSONResponse:
        check_op_count(len(body.ops))
        ops = [_op(op) for op in body.ops]
        return _outcome_response(await node.execute(ops, body.protocol))

    @app.post("/v1/txn", response_model=BeginOut, status_code=201, summary="Begin an interactive transaction")
    async def begin(body: Annotated[BeginIn | None, Body()] = None) -> BeginOut:
        return BeginOut(txn=node.begin(body.protocol if body else None))

    @app.post("/v1/txn/{txn}/read", response_model=ReadOut, summary="Read keys inside a transaction")
    async def read(txn: TxnId, body: ReadIn) -> Any:
        check_op_count(len(body.keys))
        try:
            values = await node.run_ops(txn, [Op(OpKind.GET, key) for key in body.keys])
        except TxnAborted as aborted:
            return _outcome_response(aborted.outcome)
        return ReadOut(txn=txn, values={k: None if v is None else v.decode("utf-8", "replace")
                                        for k, v in zip(body.keys, values, strict=True)})

    @app.post("/v1/txn/{txn}/write", response_model=BeginOut, summary="Write keys inside a transaction")
    async def write(txn: TxnId, body: WriteIn) -> Any:
        check_op_count(len(body.writes))
        writes = {k: None if v is None else v.encode("utf-8") for k, v in body.writes.items()}
        try:
            await node.run_ops(txn, ops_for_writes(writes))
        except TxnAborted as aborted:
            return _outcome_response(aborted.outcome)
        return BeginOut(txn=txn)

    @app.post("/v1/txn/{txn}/commit", response_model=OutcomeOut, summary="Commit a transaction")
    async def commit(txn: TxnId) -> JSONResponse:
        return _outcome_response(await node.commit(txn))

    @app.post("/v1/txn/{txn}/abort", response_model=OutcomeOut, summary="Abort a transaction")
    async def abort(txn: TxnId) -> JSONResponse:
        return _outcome_response(await node.abort(txn))

    @app.get("/v1/txn/{txn}", response_model=OutcomeOut, summary="The outcome of a transaction")
    async def status(txn: TxnId) -> JSONResponse:
        outcome = await node.resolve_status(txn)
        if outcome is None:
            raise TxnNotFound(f"no transaction {txn} is known to this cluster")
        return _outcome_response(outcome)

    @app.get("/v1/kv/{key}", response_model=OutcomeOut, summary="Read one key (a one-shot transaction)")
    async def get_key(key: PathKey) -> JSONResponse:
        return _outcome_response(await node.execute([Op(OpKind.GET, key)]))

    @app.put("/v1/kv/{key}", response_model=OutcomeOut, summary="Write one key (a one-shot transaction)")
    async def put_key(key: PathKey, body: PutIn) -> JSONResponse:
        return _outcome_response(await node.execute([Op(OpKind.PUT, key, body.value.encode("utf-8"))]))

    @app.get("/healthz", summary="Liveness")
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "node": node.node_id}

    @app.get("/readyz", summary="Readiness: false until recovery has run")
    async def readyz() -> JSONResponse:
        body = {"ready": node.ready, "node": node.node_id, "in_doubt": node.in_doubt_count()}
        return JSONResponse(body, status_code=200 if node.ready else 503)

    @app.get("/v1/admin/transactions", summary="In-flight and in-doubt transactions on this node")
    async def transactions() -> list[dict[str, Any]]:
        return [dataclasses.asdict(info) for info in node.transactions()]

    @app.post("/v1/admin/resolve/{txn}", response_model=OutcomeOut, summary="Run termination for a transaction by hand")
    async def resolve(txn: TxnId) -> JSONResponse:
        return _outcome_response(await node.resolve(txn))

    @app.get("/v1/admin/timings", summary="Commit-path timing breakdown of recent distributed transactions")
    async def timings() -> dict[str, dict[str, float]]:
        return node.timings.summary()

    return app
