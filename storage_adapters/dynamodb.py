"""The Amazon DynamoDB backend of the LogStore contract.

One table, keyed by pk (S) and sk (S):

    pk = "txn#" + log.key,      sk = txn     a record: state, participants, coordinator, redo,
                                             applied, created_at_ms
    pk = "data#" + partition,   sk = key     a committed value: v (B)

`log_once` is one conditional PutItem (`attribute_not_exists(pk)`) with
`ReturnValuesOnConditionCheckFailure=ALL_OLD`, so the loser learns the stored state from the failure
itself: one round trip for winner and loser alike. `log` is one conditional UpdateItem whose
condition is the transition rule, so a refused flip writes nothing and still tells us what is
stored. A log's records share a partition key, so `scan_unfinished` is a Query with a filter, in sk
(txn id) order, resuming after a txn id through ExclusiveStartKey.

`apply_redo` is a TransactWriteItems that writes the data and sets `applied` on a COMMIT record,
atomically when the redo fits one transaction (at most 100 items, a few MB); a larger redo goes in
data chunks first and the marker last, so a crash in between leaves the record unapplied and
recovery repeats the (idempotent) whole.

Durability: DynamoDB acknowledges a write after it is durable in several AZs, and every read here
is strongly consistent, so a loser can never read past an acknowledged vote.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as BotoConnectionError

from storage_adapters.contract import (
    LOG_NAME_LENGTH_MAX,
    SCAN_PAGE_COUNT_MAX,
    LogId,
    LogOnceResult,
    LogStore,
    Record,
    RecordBody,
    TxnState,
    check_log_transition,
    is_unfinished,
    validate_body,
    validate_data_keys,
    validate_log,
    validate_partition,
    validate_scan_after,
    validate_scan_limit,
    validate_state,
    validate_txn,
    validate_writes,
)
from storage_adapters.errors import InvariantViolation, StorageError, StorageUnavailable, ValidationError

# DynamoDB's own limits on one TransactWriteItems: 100 items and 4 MB. We stay under the bytes
# limit with room for attribute names and the record's update.
TRANSACT_ITEM_COUNT_MAX = 100
TRANSACT_BYTES_MAX = 3 * 1024 * 1024
# DynamoDB's limit on keys in one BatchGetItem.
BATCH_GET_KEY_COUNT_MAX = 100
# BatchGetItem may hand back keys unprocessed under throttling; we ask again this often, then
# report the backend as unavailable rather than spin.
BATCH_GET_RETRY_COUNT_MAX = 8
BATCH_GET_RETRY_BACKOFF_MS = 20
# A Query page holds at most 1 MB; this bounds the pages one scan may walk (1000 pages is 1 GB of
# one log's records, far past anything garbage collection lets accumulate).
QUERY_PAGE_COUNT_MAX = 1000
# botocore's retries stay off (one attempt): a retried conditional PutItem whose first attempt
# landed but whose response was lost would fail its condition and make the winner believe it lost.
# Retrying is the caller's job, under its deadline, and every LogStore call is idempotent.
SDK_ATTEMPT_COUNT_MAX = 1
# Connections kept per store: a node's concurrent votes and decisions each hold one.
CONNECTION_POOL_COUNT_MAX = 64
# How long open() waits for a table it created (or found being created) to become ACTIVE.
TABLE_ACTIVE_WAIT_MS_MAX = 60_000
TABLE_ACTIVE_POLL_MS = 100

_RETRYABLE_ERROR_CODES = frozenset(
    {
        "InternalServerError",
        "LimitExceededException",
        "ProvisionedThroughputExceededException",
        "RequestLimitExceeded",
        "ServiceUnavailable",
        "ThrottlingException",
        "TransactionConflictException",
        "TransactionInProgressException",
    }
)

# Why a TransactWriteItems may be cancelled other than by our own condition: all retryable.
_RETRYABLE_CANCELLATION_CODES = frozenset(
    {"ProvisionedThroughputExceeded", "RequestLimitExceeded", "ThrottlingError", "TransactionConflict"}
)

_TXN_PK_PREFIX = "txn#"
_DATA_PK_PREFIX = "data#"

# Attribute names; `#state` because "state" is not reserved but keeping all names aliased makes
# every expression safe against DynamoDB's long reserved-word list.
_NAMES = {
    "#pk": "pk",
    "#state": "state",
    "#applied": "applied",
    "#participants": "participants",
    "#coordinator": "coordinator",
    "#redo": "redo",
    "#created": "created_at_ms",
}


def _now_ms() -> int:
    return int(time.time() * 1000)


def _record_key(log: LogId, txn: str) -> dict[str, Any]:
    return {"pk": {"S": _TXN_PK_PREFIX + log.key}, "sk": {"S": txn}}


def _data_key(partition: str, key: str) -> dict[str, Any]:
    return {"pk": {"S": _DATA_PK_PREFIX + partition}, "sk": {"S": key}}


def _body_attributes(body: RecordBody) -> dict[str, Any]:
    return {
        "participants": {"L": [{"S": p} for p in body.participants]},
        "coordinator": {"S": body.coordinator},
        "redo": {"B": body.redo},
    }


def _decode_record(log: LogId, txn: str, item: Mapping[str, Any]) -> Record:
    try:
        assert item["pk"]["S"] == _TXN_PK_PREFIX + log.key and item["sk"]["S"] == txn
        record = Record(
            log=log,
            txn=txn,
            state=TxnState(item["state"]["S"]),
            body=RecordBody(
                participants=tuple(p["S"] for p in item["participants"]["L"]),
                coordinator=item["coordinator"]["S"],
                redo=bytes(item["redo"]["B"]),
            ),
            applied=bool(item["applied"]["BOOL"]),
            created_at_ms=int(item["created_at_ms"]["N"]),
        )
    except (KeyError, TypeError, ValueError) as error:
        # ValidationError is a ValueError: a stored body that no longer validates is corruption.
        raise InvariantViolation(f"record {log.key}/{txn} is unreadable: {error!r}") from error
    # Only a COMMIT's redo is ever applied.
    assert not record.applied or record.state is TxnState.COMMIT
    return record


def _error_code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


def _is_local(endpoint_url: str | None) -> bool:
    return endpoint_url is not None and urlsplit(endpoint_url).hostname in ("127.0.0.1", "localhost", "::1")


class DynamoDbStore(LogStore):
    backend_name = "dynamodb"

    def __init__(self, client: Any, exit_stack: contextlib.AsyncExitStack, table: str, timeout_ms_call: int) -> None:
        assert timeout_ms_call > 0
        self._client = client
        self._exit_stack = exit_stack
        self._table = table
        self._timeout_s = timeout_ms_call / 1000

    @classmethod
    async def open(
        cls,
        table: str,
        *,
        endpoint_url: str | None = None,
        region: str = "us-east-1",
        timeout_ms_call: int = 5000,
        create_table: bool = True,
        aws_access_key_id: str | None = None,
        aws_secret_access_key: str | None = None,
    ) -> DynamoDbStore:
        if not isinstance(table, str) or not 3 <= len(table) <= 255:
            raise ValidationError(f"table must be a name of 3..255 characters, got {table!r}")
        if not isinstance(timeout_ms_call, int) or isinstance(timeout_ms_call, bool) or timeout_ms_call <= 0:
            raise ValidationError(f"timeout_ms_call must be a positive int, got {timeout_ms_call!r}")
        if aws_access_key_id is None and aws_secret_access_key is None and _is_local(endpoint_url):
            # Local emulators (moto, DynamoDB Local) accept any credentials but botocore still
            # insists on some; never done for a remote endpoint, where the default chain decides.
            aws_access_key_id, aws_secret_access_key = "testing", "testing"
        timeout_s = timeout_ms_call / 1000
        config = AioConfig(
            # The client-level timeouts make a stuck socket fail inside botocore; the asyncio
            # deadline around every call is the backstop that also covers DNS and the pool.
            connect_timeout=timeout_s,
            read_timeout=timeout_s,
            retries={"total_max_attempts": SDK_ATTEMPT_COUNT_MAX, "mode": "standard"},
            max_pool_connections=CONNECTION_POOL_COUNT_MAX,
        )
        exit_stack = contextlib.AsyncExitStack()
        client = await exit_stack.enter_async_context(
            get_session().create_client(
                "dynamodb",
                endpoint_url=endpoint_url,
                region_name=region,
                aws_access_key_id=aws_access_key_id,
                aws_secret_access_key=aws_secret_access_key,
                config=config,
            )
        )
        store = cls(client, exit_stack, table, timeout_ms_call)
        try:
            if create_table:
                await store._create_table()
        except BaseException:
            await exit_stack.aclose()
            raise
        return store

    async def _create_table(self) -> None:
        async with self._deadline():
            try:
                description = await self._client.describe_table(TableName=self._table)
                status = description["Table"]["TableStatus"]
            except ClientError as error:
                if _error_code(error) != "ResourceNotFoundException":
                    raise
                try:
                    await self._client.create_table(
                        TableName=self._table,
                        KeySchema=[
                            {"AttributeName": "pk", "KeyType": "HASH"},
                            {"AttributeName": "sk", "KeyType": "RANGE"},
                        ],
                        AttributeDefinitions=[
                            {"AttributeName": "pk", "AttributeType": "S"},
                            {"AttributeName": "sk", "AttributeType": "S"},
                        ],
                        BillingMode="PAY_PER_REQUEST",
                    )
                except ClientError as create_error:
                    # Another process created it first: fine, wait for it like for our own.
                    if _error_code(create_error) != "ResourceInUseException":
                        raise
                status = "CREATING"
        # Creation takes seconds on AWS, longer than one call's deadline, so the wait has its own
        # bound and each poll its own deadline.
        for _ in range(TABLE_ACTIVE_WAIT_MS_MAX // TABLE_ACTIVE_POLL_MS):
            if status == "ACTIVE":
                return
            await asyncio.sleep(TABLE_ACTIVE_POLL_MS / 1000)
            async with self._deadline():
                description = await self._client.describe_table(TableName=self._table)
            status = description["Table"]["TableStatus"]
        raise StorageUnavailable(
            f"dynamodb: table {self._table} not ACTIVE after {TABLE_ACTIVE_WAIT_MS_MAX}ms (status {status})"
        )

    @contextlib.asynccontextmanager
    async def _deadline(self) -> AsyncIterator[None]:
        """Bound a call by the store's deadline and turn transport failures into the contract's
        typed errors, so callers never see a botocore exception or wait forever."""
        try:
            async with asyncio.timeout(self._timeout_s):
                yield
        except TimeoutError as error:
            # Before OSError: TimeoutError is one.
            raise StorageUnavailable(f"dynamodb: no answer within {self._timeout_s}s") from error
        except (BotoConnectionError, HTTPClientError, aiohttp.ClientError, OSError) as error:
            raise StorageUnavailable(f"dynamodb: {type(error).__name__}: {error}") from error
        except ClientError as error:
            code = _error_code(error)
            status = int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
            reasons = {r.get("Code") for r in error.response.get("CancellationReasons") or []}
            if code in _RETRYABLE_ERROR_CODES or status >= 500 or reasons & _RETRYABLE_CANCELLATION_CODES:
                raise StorageUnavailable(f"dynamodb: {code}: {error}") from error
            raise StorageError(f"dynamodb: {code}: {error}") from error
        except BotoCoreError as error:
            raise StorageError(f"dynamodb: {type(error).__name__}: {error}") from error

    # The contract.

    async def log_once(self, log: LogId, txn: str, state: TxnState, body: RecordBody) -> LogOnceResult:
        validate_log(log)
        validate_txn(txn)
        validate_state(state)
        validate_body(body)
        item = {
            **_record_key(log, txn),
            "state": {"S": state.value},
            **_body_attributes(body),
            "applied": {"BOOL": False},
            "created_at_ms": {"N": str(_now_ms())},
        }
        async with self._deadline():
            try:
                await self._client.put_item(
                    TableName=self._table,
                    Item=item,
                    ConditionExpression="attribute_not_exists(#pk)",
                    ExpressionAttributeNames={"#pk": "pk"},
                    ReturnValuesOnConditionCheckFailure="ALL_OLD",
                )
            except ClientError as error:
                if _error_code(error) != "ConditionalCheckFailedException":
                    raise
                stored = error.response.get("Item")
                if stored is None:
                    # Only an emulator that ignores ReturnValuesOnConditionCheckFailure gets here;
                    # the read costs a second round trip but keeps the answer right.
                    stored = await self._get_item(_record_key(log, txn))
                # The item that failed our condition exists; garbage collection only removes
                # long-finished txns, so it cannot have vanished in between.
                assert stored is not None, f"{log.key}/{txn}: condition failed, yet no item"
                return LogOnceResult(state=_decode_record(log, txn, stored).state, created=False)
        return LogOnceResult(state=state, created=True)

    async def log(self, log: LogId, txn: str, state: TxnState, body: RecordBody | None = None) -> TxnState:
        validate_log(log)
        validate_txn(txn)
        validate_state(state)
        if body is not None:
            validate_body(body)
        values: dict[str, Any] = {
            ":state": {"S": state.value},
            ":vote": {"S": TxnState.VOTE_YES.value},
            ":false": {"BOOL": False},
            ":now": {"N": str(_now_ms())},
        }
        sets = [
            "#state = :state",
            "#applied = if_not_exists(#applied, :false)",
            "#created = if_not_exists(#created, :now)",
        ]
        if body is None:
            # Keep the stored body; an absent record gets the empty one, so every item is complete.
            empty = _body_attributes(RecordBody())
            values |= {":participants": empty["participants"], ":coordinator": empty["coordinator"]}
            values[":redo"] = empty["redo"]
            sets += [
                "#participants = if_not_exists(#participants, :participants)",
                "#coordinator = if_not_exists(#coordinator, :coordinator)",
                "#redo = if_not_exists(#redo, :redo)",
            ]
        else:
            given = _body_attributes(body)
            values |= {":participants": given["participants"], ":coordinator": given["coordinator"]}
            values[":redo"] = given["redo"]
            sets += ["#participants = :participants", "#coordinator = :coordinator", "#redo = :redo"]
        async with self._deadline():
            try:
                await self._client.update_item(
                    TableName=self._table,
                    Key=_record_key(log, txn),
                    UpdateExpression="SET " + ", ".join(sets),
                    # The transition rule of contract.check_log_transition, enforced by storage
                    # itself so that a racing writer cannot slip between a read and our write.
                    ConditionExpression="attribute_not_exists(#pk) OR #state = :vote OR #state = :state",
                    ExpressionAttributeNames=_NAMES,
                    ExpressionAttributeValues=values,
                    ReturnValuesOnConditionCheckFailure="ALL_OLD",
                )
            except ClientError as error:
                if _error_code(error) != "ConditionalCheckFailedException":
                    raise
                stored = error.response.get("Item")
                if stored is None:
                    stored = await self._get_item(_record_key(log, txn))
                assert stored is not None, f"{log.key}/{txn}: condition failed, yet no item"
                stored_state = _decode_record(log, txn, stored).state
                check_log_transition(log, txn, stored_state, state)
                # The condition failed, so the rule must refuse this pair; it did not, which
                # means storage and contract disagree about the rule.
                raise InvariantViolation(
                    f"dynamodb refused {stored_state} -> {state} for {log.key}/{txn}, the contract allows it"
                ) from error
        return state

    async def _get_item(self, key: dict[str, Any]) -> dict[str, Any] | None:
        response = await self._client.get_item(TableName=self._table, Key=key, ConsistentRead=True)
        return response.get("Item")

    async def read(self, log: LogId, txn: str) -> Record | None:
        validate_log(log)
        validate_txn(txn)
        async with self._deadline():
            item = await self._get_item(_record_key(log, txn))
        return _decode_record(log, txn, item) if item is not None else None

    async def scan_unfinished(self, log: LogId, limit: int = SCAN_PAGE_COUNT_MAX, after: str = "") -> list[Record]:
        validate_log(log)
        validate_scan_limit(limit)
        validate_scan_after(after)
        records: list[Record] = []
        request: dict[str, Any] = {
            "TableName": self._table,
            "KeyConditionExpression": "#pk = :pk",
            "FilterExpression": "#state = :vote OR (#state = :commit AND #applied = :false)",
            "ExpressionAttributeNames": {"#pk": "pk", "#state": "state", "#applied": "applied"},
            "ExpressionAttributeValues": {
                ":pk": {"S": _TXN_PK_PREFIX + log.key},
                ":vote": {"S": TxnState.VOTE_YES.value},
                ":commit": {"S": TxnState.COMMIT.value},
                ":false": {"BOOL": False},
            },
            "ConsistentRead": True,
        }
        if after:
            # The start key need not name a stored item: DynamoDB resumes at the first sk above it,
            # and string sort keys compare by their UTF-8 bytes, the contract's order for ASCII ids.
            request["ExclusiveStartKey"] = _record_key(log, after)
        async with self._deadline():
            for _ in range(QUERY_PAGE_COUNT_MAX):
                response = await self._client.query(**request)
                for item in response.get("Items", []):
                    record = _decode_record(log, item["sk"]["S"], item)
                    assert is_unfinished(record.state, record.applied)
                    assert record.txn > after and (not records or record.txn > records[-1].txn)
                    records.append(record)
                    if len(records) == limit:
                        return records
                last = response.get("LastEvaluatedKey")
                if last is None:
                    return records
                request["ExclusiveStartKey"] = last
        raise StorageUnavailable(f"dynamodb: scan of {log.key} walked {QUERY_PAGE_COUNT_MAX} pages")

    async def read_data(self, partition: str, keys: Sequence[str]) -> dict[str, bytes | None]:
        validate_partition(partition)
        checked = validate_data_keys(keys)
        # BatchGetItem rejects a request that names one key twice.
        unique = list(dict.fromkeys(checked))
        found: dict[str, bytes] = {}

        async def batch(chunk: list[str]) -> None:
            request_items: dict[str, Any] = {
                self._table: {
                    "Keys": [_data_key(partition, key) for key in chunk],
                    "ConsistentRead": True,
                    "ProjectionExpression": "sk, v",
                }
            }
            for attempt in range(BATCH_GET_RETRY_COUNT_MAX + 1):
                response = await self._client.batch_get_item(RequestItems=request_items)
                for item in response.get("Responses", {}).get(self._table, []):
                    found[item["sk"]["S"]] = bytes(item["v"]["B"])
                request_items = response.get("UnprocessedKeys") or {}
                if not request_items:
                    return
                await asyncio.sleep(BATCH_GET_RETRY_BACKOFF_MS * (attempt + 1) / 1000)
            raise StorageUnavailable(
                f"dynamodb: keys still unprocessed after {BATCH_GET_RETRY_COUNT_MAX} retries"
            )

        chunks = [unique[i : i + BATCH_GET_KEY_COUNT_MAX] for i in range(0, len(unique), BATCH_GET_KEY_COUNT_MAX)]
        async with self._deadline():
            try:
                async with asyncio.TaskGroup() as group:
                    for chunk in chunks:
                        group.create_task(batch(chunk))
            except BaseExceptionGroup as errors:
                # One plain exception, as from a sequential loop, so the error mapping sees it.
                leaf: BaseException = errors
                while isinstance(leaf, BaseExceptionGroup):
                    leaf = leaf.exceptions[0]
                raise leaf from None
        assert set(found) <= set(unique)
        return {key: found.get(key) for key in unique}

    async def apply_redo(self, partition: str, txn: str, writes: Mapping[str, bytes | None]) -> bool:
        validate_partition(partition)
        validate_txn(txn)
        checked = validate_writes(writes)
        log = LogId.partition(partition)
        record_key = _record_key(log, txn)

        operations: list[tuple[dict[str, Any], int]] = []
        for key, value in checked.items():
            if value is None:
                operation = {"Delete": {"TableName": self._table, "Key": _data_key(partition, key)}}
                size = len(key.encode("utf-8")) + 128
            else:
                item = {**_data_key(partition, key), "v": {"B": value}}
                operation = {"Put": {"TableName": self._table, "Item": item}}
                size = len(key.encode("utf-8")) + len(value) + 128
            operations.append((operation, size))
        # Every chunk leaves room for the marker, so the last one can always carry it.
        chunks: list[list[dict[str, Any]]] = [[]]
        chunk_bytes = 0
        for operation, size in operations:
            if len(chunks[-1]) + 1 >= TRANSACT_ITEM_COUNT_MAX or chunk_bytes + size > TRANSACT_BYTES_MAX:
                chunks.append([])
                chunk_bytes = 0
            chunks[-1].append(operation)
            chunk_bytes += size
        assert all(len(chunk) < TRANSACT_ITEM_COUNT_MAX for chunk in chunks)

        def marker(*, require_unapplied: bool) -> dict[str, Any]:
            condition = "#state = :commit"
            values: dict[str, Any] = {":commit": {"S": TxnState.COMMIT.value}, ":true": {"BOOL": True}}
            if require_unapplied:
                condition += " AND #applied = :false"
                values[":false"] = {"BOOL": False}
            return {
                "Update": {
                    "TableName": self._table,
                    "Key": record_key,
                    "UpdateExpression": "SET #applied = :true",
                    "ConditionExpression": condition,
                    "ExpressionAttributeNames": {"#state": "state", "#applied": "applied"},
                    "ExpressionAttributeValues": values,
                    "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                }
            }

        async with self._deadline():
            if len(chunks) == 1:
                # The common case, fully atomic in one round trip: the data lands only together
                # with the marker, and only if the record is a COMMIT not yet applied. Writing an
                # applied redo again could undo a later txn's writes to the same keys.
                try:
                    await self._transact([*chunks[0], marker(require_unapplied=True)])
                except ClientError as error:
                    stored = self._marker_failure(error, log, txn)
                    if stored is None:
                        raise
                    if stored.applied:
                        return False
                    raise InvariantViolation(f"apply_redo of {log.key}/{txn}: record is {stored.state}") from error
                return True
            # Too big for one transaction: check first, then data, then the marker, so the record
            # says applied only once all data is in.
            item = await self._get_item(record_key)
            stored = _decode_record(log, txn, item) if item is not None else None
            if stored is None or stored.state is not TxnState.COMMIT:
                state = stored.state if stored is not None else "absent"
                raise InvariantViolation(f"apply_redo of {log.key}/{txn}: record is {state}")
            if stored.applied:
                return False
            for chunk in chunks[:-1]:
                await self._transact(chunk)
            try:
                await self._transact([*chunks[-1], marker(require_unapplied=False)])
            except ClientError as error:
                stored = self._marker_failure(error, log, txn)
                if stored is None:
                    raise
                raise InvariantViolation(f"apply_redo of {log.key}/{txn}: record is {stored.state}") from error
            return True

    async def _transact(self, items: list[dict[str, Any]]) -> None:
        assert 0 < len(items) <= TRANSACT_ITEM_COUNT_MAX
        await self._client.transact_write_items(TransactItems=items)

    @staticmethod
    def _marker_failure(error: ClientError, log: LogId, txn: str) -> Record | None:
        """If `error` is our marker's condition failing, the record as it stood (absent: raise);
        None when the transaction failed for another reason, to be handled as an error."""
        if _error_code(error) != "TransactionCanceledException":
            return None
        reasons = error.response.get("CancellationReasons") or []
        if not reasons or reasons[-1].get("Code") != "ConditionalCheckFailed":
            return None
        item = reasons[-1].get("Item")
        if not item:
            raise InvariantViolation(f"apply_redo of {log.key}/{txn}: no record") from error
        return _decode_record(log, txn, item)

    async def delete(self, log: LogId, txn: str) -> bool:
        validate_log(log)
        validate_txn(txn)
        async with self._deadline():
            response = await self._client.delete_item(
                TableName=self._table, Key=_record_key(log, txn), ReturnValues="ALL_OLD"
            )
        return "Attributes" in response

    async def close(self) -> None:
        await self._exit_stack.aclose()

    # Test and operator helpers, not part of the contract.

    async def delete_table(self) -> None:
        """Drop the whole table (test teardown)."""
        async with self._deadline():
            try:
                await self._client.delete_table(TableName=self._table)
            except ClientError as error:
                if _error_code(error) != "ResourceNotFoundException":
                    raise


# The pk prefixes plus a log key or partition stay far inside DynamoDB's 2048-byte partition key.
assert len(_DATA_PK_PREFIX) + LOG_NAME_LENGTH_MAX + 2 < 2048

__all__ = ["DynamoDbStore"]
