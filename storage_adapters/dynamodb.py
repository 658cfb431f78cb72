"""The Amazon DynamoDB backend of the LogStore contract.

One table, keyed by pk (S) and sk (S):

    pk = "txn#" + log.key,      sk = txn     a record: state, participants, coordinator, redo,
                                             applied, created_at_ms; a tombstone: state, applied,
                                             created_at_ms, expires_at (no body)
    pk = "data#" + partition,   sk = key     a committed value: v (B)
    pk = "own#" + partition,    sk = "owner" a partition's ownership record: owner, epoch, version,
                                             lease_ms, wanted_by (a node's identity record too,
                                             its partition its `identity_name`)
    pk = "reg#identities",      sk = node    the identity registry: one item, keys only, per node
                                             that ever took an identity; never expires

`log_once` is one conditional PutItem (`attribute_not_exists(pk)`) with
`ReturnValuesOnConditionCheckFailure=ALL_OLD`, so the loser learns the stored state from the failure
itself: one round trip for winner and loser alike. `log` is one conditional UpdateItem whose
condition is the transition rule, so a refused flip writes nothing and still tells us what is
stored. A log's records share a partition key, so `scan_unfinished` is a Query with a filter, in sk
(txn id) order, resuming after a txn id through ExclusiveStartKey. `scan_finished` is one too
(`sk > :after`, a filter for finished records without an expiry, a projection without the redo),
under the same walk bounds: no index to keep, so no write pays for it, and every item walked costs
its read units.

`apply_redo` is a TransactWriteItems that writes the data and, conditioned on `state IN (VOTE_YES,
COMMIT) AND applied = false`, sets the record to COMMIT and applied, atomically when the redo fits
one transaction (at most 100 items, a few MB); a larger redo goes in data chunks first and the
marker last, so a crash in between leaves the record as it was (VOTE_YES, or COMMIT unapplied) and
recovery resolves it and repeats the (idempotent) whole.

Ownership. `write_owner` is one PutItem conditioned on the stored (epoch, version)
(`attribute_not_exists(pk)` for the first record), with ALL_OLD on failure so the loser learns the
winner's record from the failure. Each partition's record has a partition key of its own: every
fenced write checks it, and one key shared by all partitions would take the whole cluster's checks.
A fenced write is a TransactWriteItems whose FIRST item is a ConditionCheck on the ownership item
(owner and epoch) and whose other items are the unfenced call's write(s), with the same conditions;
DynamoDB writes all or nothing, so the fence is checked in the same round trip as the write. The
cancellation reasons come back per item in request order: a failed first item means Fenced (put
before the write's own condition, as the contract asks), a failed later one is the write's own
condition (a record that exists, a refused flip). Unfenced calls keep their single-item requests;
a transactional write costs twice the capacity units of a plain one. A redo too big for one
transaction carries the check in every chunk (see `apply_redo`). A transaction that meets another
on the ownership item (a renewal's PutItem; another fenced write's check, as AWS documents: moto,
serving one request at a time, cannot show it) is cancelled with TransactionConflict, nothing
written: it is sent again after a short jittered pause (CONFLICT_RETRY_COUNT_MAX times at most,
within the call's deadline; a renewal refused so too, and a large redo's read of its record and
ownership item, a TransactGetItems), then reported as StorageUnavailable.

Tombstones. `delete` with a keep is one conditional UpdateItem that turns the record into its
tombstone where it stands (an update, not a put, so that a record keeps its created_at_ms): it sets
the decision (applied for a COMMIT), REMOVEs the body and sets `expires_at`, and its condition is
`check_tombstone`'s rule (absent, or a vote or ABORT under an ABORT tombstone, or a COMMIT under a
COMMIT one: applied, in a partition's log; applied or not, in a coordinator's, whose COMMIT never is),
so a refusal writes nothing and its ALL_OLD tells which refusal it was;
ReturnValues=ALL_OLD on success tells whether a record was there. A tombstone is a finished record
to every other call (the unfinished scan's filter passes only VOTE_YES and unapplied COMMITs), and
a plain delete removes it like any item. DynamoDB's own Time To Live drops it: `expires_at` is a
Number of epoch SECONDS (TTL's unit; the keep's end rounded up, so never early), the table's TTL is
enabled on that attribute (by the Terraform module; by `open` on a table it may manage, see
`_check_ttl`, which warns where it may not), and only tombstones carry it, so no record, value or
ownership item ever expires. TTL deletes an expired
item in the background, typically within a few days, and until then the item still reads as its
tombstone: keep_ms is a minimum, so reads do not hide it (`drops_tombstones_at_expiry` is False).
Fenced, the write is a transaction, which cannot return the old item on success: its record
condition asks for an existing record first (the common case: GC keeps what it logged), and only if
there is none is a second transaction sent, conditioned on the absence, so a keep where no record
was costs two round trips.

The identity registry. The identity records are items of partition keys of their own, which no
request but a Scan of the whole table (every record and value) could list, so each node that
takes an identity also gets an item under one partition key, `reg#identities`, with its node id as
the sort key: `list_identities` is a Query on that key, resuming above a node id through its key
condition (`sk > :after`), a page in one request (1000 ids of at most 64 bytes are far below a
Query page's 1 MB). A take of an identity (a first record, or a new epoch) first puts its node's
item, unconditionally (idempotent), in a request of its own: then the take's conditional PutItem,
so a node is listed before its take can succeed. Renewals and releases (the same epoch) put
nothing. The item carries no `expires_at`, so the table's TTL never drops it, and nothing deletes
it: nor are identity records deleted. Nodes are few and take rarely (once per process start), so
the one partition key takes no load worth spreading.

Durability: DynamoDB acknowledges a write after it is durable in several AZs, and every read here
is strongly consistent, so a loser can never read past an acknowledged vote. That holds in one
region: a global table's replicas in others check each conditional write on their own copy, so
`open` refuses a table with replicas kept eventually consistent, of either version (the current
one's in DescribeTable's Replicas, a legacy one's in DescribeGlobalTable's ReplicationGroup),
whether or not it may create the table.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, NoReturn, TypeVar
from urllib.parse import urlsplit

import aiohttp
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    CredentialRetrievalError,
    HTTPClientError,
    NoCredentialsError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError
from botocore.parsers import ResponseParserError

from storage_adapters.contract import (
    IDENTITY_PREFIX,
    LOG_NAME_LENGTH_MAX,
    Fence,
    LogId,
    LogOnceResult,
    Ownership,
    OwnerWriteResult,
    Record,
    RecordBody,
    ScanPage,
    Tombstone,
    TxnState,
    check_log_transition,
    check_tombstone,
    commit_tombstone_needs_applied,
    is_identity,
    is_unfinished,
)
from storage_adapters.errors import Fenced, InvariantViolation, StorageError, StorageUnavailable, ValidationError
from storage_adapters.store import LogStore, call_deadline, raise_if_call_deadline_passed

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
# BatchGetItem requests one call keeps in flight: read_owners may ask for 4096 records (41
# batches), and firing all at once on one partition-key range invites throttling for no gain.
BATCH_GET_CONCURRENCY_MAX = 16
# Query requests one `list_identities` page may take. A page's ids (at most IDENTITY_PAGE_COUNT_MAX
# of 64 bytes) fit one Query response (1 MB) many times over, so one request answers it; DynamoDB
# may still end a response early (with LastEvaluatedKey), and the walk goes on from there, but
# never past this many, which would mean the service keeps cutting pages short.
IDENTITY_QUERY_COUNT_MAX = 8
# Records one scan page may walk, and the Query pages it may take to walk them. A Query evaluates
# every record of the log past its start, tombstones included (the filter drops them after they
# are read), at most 1 MB a page: a log of many tombstones (outcome_keep_ms is 15 minutes here) is
# walked over several calls, each well inside its deadline, rather than in one that outlived it
# on every retry, so that recovery never finished (found by review).
SCAN_WALK_ITEM_COUNT_MAX = 20_000
SCAN_QUERY_PAGE_COUNT_MAX = 8
# And no new Query page once this share of the call's time is gone (slow pages).
SCAN_WALK_TIME_SHARE = 0.5
# botocore's retries stay off (one attempt): a retried conditional PutItem whose first attempt
# landed but whose response was lost would fail its condition and make the winner believe it lost.
# Retrying is the caller's job, under its deadline, and every LogStore call is idempotent.
SDK_ATTEMPT_COUNT_MAX = 1
# Connections kept per store: a node's concurrent votes and decisions each hold one.
CONNECTION_POOL_COUNT_MAX = 64
# How long open() waits for a table it created (or found being created) to become ACTIVE.
TABLE_ACTIVE_WAIT_MS_MAX = 60_000
TABLE_ACTIVE_POLL_MS = 100
# Transactions one fenced keep may send: the record's condition, then the absence's, and again
# only while a record is created and deleted between them (a late LogOnce, a plain delete), which
# garbage collection of a long-finished txn makes all but impossible; past this it is reported as
# unavailable (nothing written), for the caller to retry.
TOMBSTONE_ROUND_COUNT_MAX = 4
# Attempts of each call `open` makes to prepare the table (DescribeTable, CreateTable and the
# TTL's DescribeTimeToLive and UpdateTimeToLive), each under the call deadline, while the service
# answers it as unavailable (a throttled control plane, a dropped connection), with a pause that
# doubles from OPEN_CALL_BACKOFF_MS between them. Then open fails as unavailable (for the node to
# open again later), except for the TTL's calls: the table serves without TTL, so open warns.
OPEN_CALL_ATTEMPT_COUNT_MAX = 3
OPEN_CALL_BACKOFF_MS = 200
# What a DynamoDB-compatible service answers for an operation it does not have.
_UNKNOWN_OPERATION_CODE = "UnknownOperationException"
# The TTL states in which DynamoDB drops the items whose expiry has passed (or soon will).
_TTL_ON = frozenset({"ENABLED", "ENABLING"})

logger = logging.getLogger("cornus.storage.dynamodb")
T = TypeVar("T")

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
        # Conditions that pass without anyone's action (found by review: each was a plain
        # StorageError, on which the node exits): credentials expiring between refreshes, a
        # request signed by a clock just stepped (botocore's own retries, which would correct
        # it, are off), a global table's concurrent write in another region, a request timing
        # out at the service.
        "ExpiredTokenException",
        "InvalidSignatureException",
        "ReplicatedWriteConflictException",
        "RequestTimeout",
        "RequestTimeoutException",
    }
)

# Why a TransactWriteItems may be cancelled other than by our own condition: all retryable.
_RETRYABLE_CANCELLATION_CODES = frozenset(
    {"ProvisionedThroughputExceeded", "RequestLimitExceeded", "ThrottlingError", "TransactionConflict"}
)

# A call DynamoDB cancelled (a TransactWriteItems) or refused (a PutItem) only because another
# transaction held one of its items wrote nothing; it is sent again after a pause of up to
# CONFLICT_PAUSE_MS_MAX (jittered, so that the writes that met do not meet again), this many times
# at most and within the call's deadline, rather than reported unavailable. Every fenced write
# checks its partition's ownership item, so concurrent fenced writes of one partition meet there,
# and a lease renewal's PutItem meets them too (found by audit: most fenced writes of a busy
# partition, and its renewals, would fail so; moto, serving one request at a time, never shows it).
CONFLICT_RETRY_COUNT_MAX = 8
CONFLICT_PAUSE_MS_MAX = 20

_TXN_PK_PREFIX = "txn#"
_DATA_PK_PREFIX = "data#"
_OWNER_PK_PREFIX = "own#"
# Key attributes may not be empty, so the ownership item's sort key is a constant.
_OWNER_SK = "owner"
# The identity registry's partition key (see the module docstring): it starts with none of the
# prefixes above, so no record, value or ownership item can have it.
_IDENTITY_REGISTRY_PK = "reg#identities"
assert not _IDENTITY_REGISTRY_PK.startswith((_TXN_PK_PREFIX, _DATA_PK_PREFIX, _OWNER_PK_PREFIX))
# The attribute the table's Time To Live reads (the Terraform module names it too): epoch seconds.
# Only tombstones carry it, so nothing else in the table ever expires.
_EXPIRES_AT = "expires_at"
# A record's body attributes: a tombstone has none of them.
_BODY_ATTRIBUTES = ("participants", "coordinator", "redo")

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


def _expires_at_s(keep_ms: int) -> int:
    """When a tombstone kept `keep_ms` from now may go, in epoch seconds (TTL's unit), rounded up
    so that it never goes early: from the clock's own reading, not one cut to the millisecond,
    which could end it up to a millisecond early (found by a test that flaked, 1 run in ~1,000)."""
    return math.ceil(time.time() + keep_ms / 1000)


def _record_key(log: LogId, txn: str) -> dict[str, Any]:
    return {"pk": {"S": _TXN_PK_PREFIX + log.key}, "sk": {"S": txn}}


def _txn_of_key(log: LogId, key: dict[str, Any]) -> str:
    """The txn id of a key of `log`'s records (a Query's LastEvaluatedKey)."""
    assert key["pk"]["S"] == _TXN_PK_PREFIX + log.key, key
    return str(key["sk"]["S"])


def _data_key(partition: str, key: str) -> dict[str, Any]:
    return {"pk": {"S": _DATA_PK_PREFIX + partition}, "sk": {"S": key}}


def _owner_key(partition: str) -> dict[str, Any]:
    return {"pk": {"S": _OWNER_PK_PREFIX + partition}, "sk": {"S": _OWNER_SK}}


def _identity_registry_key(node: str) -> dict[str, Any]:
    return {"pk": {"S": _IDENTITY_REGISTRY_PK}, "sk": {"S": node}}


def _owner_item(ownership: Ownership) -> dict[str, Any]:
    return {
        **_owner_key(ownership.partition),
        "owner": {"S": ownership.owner},
        "epoch": {"N": str(ownership.epoch)},
        "version": {"N": str(ownership.version)},
        "lease_ms": {"N": str(ownership.lease_ms)},
        "wanted_by": {"S": ownership.wanted_by},
    }


def _decode_owner(item: Mapping[str, Any]) -> Ownership:
    try:
        pk = item["pk"]["S"]
        assert pk.startswith(_OWNER_PK_PREFIX) and item["sk"]["S"] == _OWNER_SK, f"not an ownership item: {pk}"
        return Ownership(
            partition=pk[len(_OWNER_PK_PREFIX) :],
            owner=item["owner"]["S"],
            epoch=int(item["epoch"]["N"]),
            version=int(item["version"]["N"]),
            lease_ms=int(item["lease_ms"]["N"]),
            wanted_by=item["wanted_by"]["S"],
        )
    except (KeyError, TypeError, ValueError) as error:
        # ValidationError is a ValueError: a stored record that no longer validates is corruption.
        raise InvariantViolation(f"ownership item {item.get('pk')} is unreadable: {error!r}") from error


def _body_attributes(body: RecordBody) -> dict[str, Any]:
    return {
        "participants": {"L": [{"S": p} for p in body.participants]},
        "coordinator": {"S": body.coordinator},
        "redo": {"B": body.redo},
    }


def _decode_record(log: LogId, txn: str, item: Mapping[str, Any], *, redo_projected_out: bool = False) -> Record:
    """The record stored as `item`; with `redo_projected_out`, one a Query read without its redo
    (the finished scan's projection), which gets the empty redo."""
    try:
        assert item["pk"]["S"] == _TXN_PK_PREFIX + log.key and item["sk"]["S"] == txn
        tombstone = _EXPIRES_AT in item
        if tombstone and not any(name in item for name in _BODY_ATTRIBUTES):
            body = RecordBody()
        else:
            # A record, or a tombstone that a `log` of its own decision gave a body again (it stays
            # a tombstone: its expires_at is left, as its garbage collection is already done).
            body = RecordBody(
                participants=tuple(p["S"] for p in item["participants"]["L"]),
                coordinator=item["coordinator"]["S"],
                redo=b"" if redo_projected_out else bytes(item["redo"]["B"]),
            )
        record = Record(
            log=log,
            txn=txn,
            state=TxnState(item["state"]["S"]),
            body=body,
            applied=bool(item["applied"]["BOOL"]),
            created_at_ms=int(item["created_at_ms"]["N"]),
        )
        if tombstone:
            int(item[_EXPIRES_AT]["N"])  # TTL ignores an expiry that is not a Number: it would never go
    except (KeyError, TypeError, ValueError) as error:
        # ValidationError is a ValueError: a stored body that no longer validates is corruption.
        raise InvariantViolation(f"record {log.key}/{txn} is unreadable: {error!r}") from error
    # Only a COMMIT's redo is ever applied.
    assert not record.applied or record.state is TxnState.COMMIT
    # A tombstone holds a decision, and a COMMIT one reads applied (in a coordinator's log too,
    # where the COMMIT it replaced never was): so no scan finds it, and a `log` over it, which
    # keeps the applied mark, leaves it finished.
    assert not tombstone or record.state is TxnState.ABORT or record.applied, f"{log.key}/{txn}: {record}"
    return record


def _error_code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


def _http_status(error: ClientError) -> int:
    return int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)


def _failed_condition(error: ClientError, index: int) -> dict[str, Any] | None:
    """The cancellation reason of item `index` of a TransactWriteItems if that item's condition
    failed; None if the transaction failed for another reason (to be handled as an error)."""
    reasons = _final_cancellation_reasons(error)
    if not -len(reasons) <= index < len(reasons):
        return None
    reason: dict[str, Any] = reasons[index]
    return reason if reason.get("Code") == "ConditionalCheckFailed" else None


def _final_cancellation_reasons(error: ClientError) -> list[dict[str, Any]]:
    """The reasons a TransactWriteItems was cancelled for, one per item, if they are final: none
    if it was not cancelled, or if an item was cancelled for a reason a retry may not meet (a
    conflict, throttling). Found by audit: a fence's check cancelled as a TransactionConflict,
    which says nothing of the fence, beside a record whose condition failed, was answered from
    the record alone; a write cancelled so is unavailable (_storage_error), nothing written."""
    if _error_code(error) != "TransactionCanceledException":
        return []
    reasons: list[dict[str, Any]] = error.response.get("CancellationReasons") or []
    if any(reason.get("Code") in _RETRYABLE_CANCELLATION_CODES for reason in reasons):
        return []
    return reasons


def _refuse_eventually_consistent_replicas(table: str, description: Mapping[str, Any]) -> None:
    """Refuse a global table whose replicas are only eventually consistent with each other: each
    region checks a condition on its own copy, so two nodes writing in two regions could both
    win one LogOnce, and a deposed owner's fenced write could land (found by audit). A global
    table with multi-region strong consistency, or none, is fine."""
    if description.get("Replicas") and description.get("MultiRegionConsistency") != "STRONG":
        raise StorageError(
            f"dynamodb table {table} has replicas in other regions kept eventually consistent "
            f"(MultiRegionConsistency {description.get('MultiRegionConsistency', 'EVENTUAL')}): a conditional "
            "write is checked in one region only, so LogOnce would not be once; use a table without replicas, "
            "or one created with MultiRegionConsistency STRONG")


def _conflict_only(error: ClientError) -> bool:
    """Whether `error` cancelled or refused the call only because another transaction held one of
    its items: nothing was written, and a second try may pass."""
    code = _error_code(error)
    if code == "TransactionConflictException":
        return True
    if code != "TransactionCanceledException":
        return False
    codes = {reason.get("Code") for reason in error.response.get("CancellationReasons") or []}
    return "TransactionConflict" in codes and codes <= {"TransactionConflict", "None", None}


async def _retrying_conflicts(send: Callable[[], Awaitable[T]]) -> T:
    """`send()`, sent again after a conflict (CONFLICT_RETRY_COUNT_MAX times at most); the call's
    deadline, which the store's template keeps, ends the pauses too, and no attempt is sent once
    it has passed by the boot clock (a suspend stops the template's timer). A call's single
    requests outside this (a plain delete or update) are its first, which the template checks."""
    for attempt in range(CONFLICT_RETRY_COUNT_MAX + 1):
        # Each attempt, the first too: a call may send several transactions in turn (apply_redo's
        # chunks, a keep's rounds), and a suspend between any two is seen only here.
        raise_if_call_deadline_passed("dynamodb transaction")
        try:
            return await send()
        except ClientError as error:
            if attempt == CONFLICT_RETRY_COUNT_MAX or not _conflict_only(error):
                raise
        await asyncio.sleep(random.uniform(0, CONFLICT_PAUSE_MS_MAX) / 1000)
    raise AssertionError("the last attempt returns or raises")


def _refuse_tombstone(log: LogId, txn: str, keep: Tombstone, item: Mapping[str, Any], error: Exception) -> NoReturn:
    """Raise check_tombstone's refusal of `keep` over `item`, on which the tombstone's condition
    failed."""
    stored = _decode_record(log, txn, item)
    check_tombstone(log, txn, stored.state, stored.applied, keep)
    # The condition failed, so the rule must refuse this; it did not: storage and contract disagree.
    raise InvariantViolation(
        f"dynamodb refused a {keep.decision} tombstone over {stored.state} (applied {stored.applied}) "
        f"for {log.key}/{txn}, the contract allows it"
    ) from error


def _ttl_drops_tombstones(ttl: Mapping[str, Any]) -> bool:
    """Whether a TimeToLiveDescription says the table drops items by `expires_at` (or soon will)."""
    return ttl.get("TimeToLiveStatus") in _TTL_ON and ttl.get("AttributeName") == _EXPIRES_AT


def _is_local(endpoint_url: str | None) -> bool:
    return endpoint_url is not None and urlsplit(endpoint_url).hostname in ("127.0.0.1", "localhost", "::1")


class DynamoDbStore(LogStore):
    backend_name = "dynamodb"
    # The table's TTL deletes an expired tombstone in the background, within days, not at expiry.
    drops_tombstones_at_expiry = False

    def __init__(
        self, client: Any, exit_stack: contextlib.AsyncExitStack, table: str, timeout_ms_call: int,
        *, emulated: bool = False,
    ) -> None:
        super().__init__(timeout_ms_call)
        self._client = client
        self._exit_stack = exit_stack
        self._table = table
        # Served by a local emulator (moto, DynamoDB Local): one region, no global tables.
        self._emulated = emulated

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
        store = cls(client, exit_stack, table, timeout_ms_call, emulated=_is_local(endpoint_url))
        try:
            created = await store._prepare_table(create=create_table)
            await store._check_ttl(manage=create_table, created=created)
        except BaseException:
            await exit_stack.aclose()
            raise
        return store

    async def _open_call(self, call: Callable[[], Awaitable[T]], what: str) -> T:
        """`call()` under the call deadline, attempted again while it fails as unavailable, at most
        OPEN_CALL_ATTEMPT_COUNT_MAX times in all (see there). Only for the table's preparation
        at open, whose calls are all idempotent (a CreateTable that landed unanswered is found
        by the next attempt's DescribeTable)."""
        backoff_ms = OPEN_CALL_BACKOFF_MS
        for _ in range(OPEN_CALL_ATTEMPT_COUNT_MAX - 1):
            try:
                return await self._bounded(call(), what)
            except StorageUnavailable:
                await asyncio.sleep(backoff_ms / 1000)
                backoff_ms *= 2
        return await self._bounded(call(), what)

    async def _prepare_table(self, *, create: bool = True) -> bool:
        """Describe the table (one DescribeTable), create it if it is missing and `create` allows,
        wait until it is ACTIVE, and refuse it if it has replicas kept eventually consistent, of
        either version of global tables; whether this call made it. The replicas are checked
        whatever `create` says (found by audit, 2026-11-28, second: with create_table=False no
        DescribeTable was made, and any global table was accepted)."""
        status, created = await self._open_call(
            lambda: self._describe_or_create_table(create=create), "create_table" if create else "describe_table"
        )
        # Creation takes seconds on AWS, longer than one call's deadline, so the wait has its own
        # bound, in time (found by review: counted in polls, each of which may retry its call, it
        # could last many times as long), and each poll its own deadline.
        give_up_s = time.monotonic() + TABLE_ACTIVE_WAIT_MS_MAX / 1000
        while status != "ACTIVE":
            if time.monotonic() >= give_up_s:
                raise StorageUnavailable(
                    f"dynamodb: table {self._table} not ACTIVE after {TABLE_ACTIVE_WAIT_MS_MAX}ms (status {status})"
                )
            await asyncio.sleep(TABLE_ACTIVE_POLL_MS / 1000)
            description = await self._open_call(
                lambda: self._client.describe_table(TableName=self._table), "describe_table"
            )
            status = description["Table"]["TableStatus"]
            _refuse_eventually_consistent_replicas(self._table, description["Table"])
        if not created:
            # A table this open created is in no global table yet: one call fewer.
            await self._open_call(self._refuse_legacy_global_table, "describe_global_table")
        return created

    async def _refuse_legacy_global_table(self) -> None:
        """Refuse a table that is a replica of a legacy (2017.11.29) global table of several
        regions: DescribeTable lists only the current version's replicas, so only
        DescribeGlobalTable (of the table's own name, which a legacy global table's replicas all
        have) names them. Such replicas are eventually consistent, always."""
        try:
            response = await self._client.describe_global_table(GlobalTableName=self._table)
        except ClientError as error:
            code = _error_code(error)
            if code == "GlobalTableNotFoundException":
                return
            if self._emulated and code in (_UNKNOWN_OPERATION_CODE, str(_http_status(error))):
                # An emulator that lacks the call: moto answers a bare HTTP 500 page (no error code
                # of DynamoDB's), DynamoDB Local an unknown operation. A real endpoint's 500 is the
                # service failing, retried as unavailable, and never taken for "no global table".
                return
            if code == "AccessDeniedException":
                raise StorageError(
                    f"dynamodb table {self._table}: DescribeGlobalTable refused ({error}); open checks "
                    "that the table is in no legacy global table: grant dynamodb:DescribeGlobalTable on "
                    f"the global-table/{self._table} resource (the Terraform module does)"
                ) from error
            raise
        group = response["GlobalTableDescription"].get("ReplicationGroup") or []
        regions = sorted({replica["RegionName"] for replica in group})
        if len(regions) > 1:
            raise StorageError(
                f"dynamodb table {self._table} is a replica of a legacy (2017.11.29) global table in regions "
                f"{', '.join(regions)}, kept eventually consistent: a conditional write is checked in one region "
                "only, so LogOnce would not be once; use a table without replicas, or one created with "
                "MultiRegionConsistency STRONG")

    async def _check_ttl(self, *, manage: bool, created: bool) -> None:
        """Make sure the table's TTL drops tombstones (on `expires_at`), or say that it will not.

        Where the store may manage the table (`manage`: it may create it, the `create_table` of
        `open`), a TTL found off is enabled (on a table this open created, without asking first).
        Found off where it may not, on another attribute (a table has one TTL attribute, whose
        items its owner means to expire: not ours to move), or unreadable or unsettable (IAM,
        a throttled control plane past OPEN_CALL_ATTEMPT_COUNT_MAX attempts, a TTL change in
        progress), it is one warning: the table serves without TTL, but no tombstone will ever
        expire. So an enable that failed once (found by review: that was never tried again, and
        open failed) is made by the next open. A table Terraform made has TTL on (one
        DescribeTimeToLive at open, which its IAM policy grants)."""
        table = self._table
        ttl: Mapping[str, Any] = {}
        if not created:
            try:
                description = await self._open_call(
                    lambda: self._client.describe_time_to_live(TableName=table), "describe_time_to_live"
                )
            except StorageError as error:
                self._warn_ttl(f"its TTL could not be read ({error})")
                return
            ttl = description.get("TimeToLiveDescription", {})
            if _ttl_drops_tombstones(ttl):
                return
            status, attribute = ttl.get("TimeToLiveStatus", "DISABLED"), ttl.get("AttributeName")
            if not manage:
                self._warn_ttl(f"its TTL is {status}{f' on {attribute}' if attribute else ''}, and this store "
                               "may not manage the table (create_table=False)")
                return
            if status != "DISABLED":
                self._warn_ttl(f"its TTL is {status} on {attribute}: a table has one TTL attribute, left as its "
                               "owner set it")
                return
        specification = {"Enabled": True, "AttributeName": _EXPIRES_AT}
        try:
            await self._open_call(
                lambda: self._client.update_time_to_live(TableName=table, TimeToLiveSpecification=specification),
                "update_time_to_live",
            )
        except StorageError as error:
            # Another node opening the same table may have enabled it first (DynamoDB then
            # refuses a second enable): only a TTL still off is worth the warning.
            with contextlib.suppress(StorageError):
                description = await self._bounded(
                    self._client.describe_time_to_live(TableName=table), "describe_time_to_live"
                )
                if _ttl_drops_tombstones(description.get("TimeToLiveDescription", {})):
                    return
            self._warn_ttl(f"enabling its TTL failed ({error})")

    def _warn_ttl(self, why: str) -> None:
        logger.warning(
            "dynamodb table %s: %s. Its TTL is not enabled on %s, so decision tombstones will never expire: "
            "the table grows by one item per collected transaction. Enable TTL on %s (the Terraform module "
            "does), or let the node manage the table (create_table)",
            self._table, why, _EXPIRES_AT, _EXPIRES_AT,
        )

    async def _describe_or_create_table(self, *, create: bool = True) -> tuple[str, bool]:
        """The table's status, once it is created if it was not there (and `create`), and whether
        this call created it."""
        try:
            description = await self._client.describe_table(TableName=self._table)
            status = description["Table"]["TableStatus"]
            _refuse_eventually_consistent_replicas(self._table, description["Table"])
        except ClientError as error:
            if _error_code(error) != "ResourceNotFoundException":
                raise
            if not create:
                raise StorageError(
                    f"dynamodb table {self._table} does not exist, and this store may not create it "
                    "(create_table=False)"
                ) from error
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
                return "CREATING", False
            return "CREATING", True
        return status, False

    def _storage_error(self, error: Exception, what: str) -> StorageError | None:
        """Transport failures and the service's errors as the contract's typed errors, so callers
        never see a botocore exception (the template bounds the call and maps TimeoutError)."""
        if isinstance(error, BotoConnectionError | HTTPClientError | aiohttp.ClientError | OSError):
            return StorageUnavailable(f"dynamodb {what}: {type(error).__name__}: {error}")
        if isinstance(error, ClientError):
            code = _error_code(error)
            status = _http_status(error)
            listed = [str(r.get("Code")) for r in error.response.get("CancellationReasons") or []]
            # A cancelled transaction's reasons, one per item, say which item failed and why.
            said = f"{code} ({', '.join(listed)})" if listed else code
            if code in _RETRYABLE_ERROR_CODES or status >= 500 or set(listed) & _RETRYABLE_CANCELLATION_CODES:
                return StorageUnavailable(f"dynamodb {what}: {said}: {error}")
            return StorageError(f"dynamodb {what}: {said}: {error}")
        if isinstance(error, NoCredentialsError | CredentialRetrievalError | ResponseParserError):
            # Credentials not found during a refresh (the provider answers again later), or an
            # answer that did not parse: whether the call took effect is unknown either way.
            return StorageUnavailable(f"dynamodb {what}: {type(error).__name__}: {error}")
        if isinstance(error, BotoCoreError):
            return StorageError(f"dynamodb {what}: {type(error).__name__}: {error}")
        return None

    # The contract.

    async def _log_once(
        self, log: LogId, txn: str, state: TxnState, body: RecordBody, fence: Fence | None
    ) -> LogOnceResult:
        item = {
            **_record_key(log, txn),
            "state": {"S": state.value},
            **_body_attributes(body),
            "applied": {"BOOL": False},
            "created_at_ms": {"N": str(_now_ms())},
        }
        put: dict[str, Any] = {
            "TableName": self._table,
            "Item": item,
            "ConditionExpression": "attribute_not_exists(#pk)",
            "ExpressionAttributeNames": {"#pk": "pk"},
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
        stored = await self._conditional_write("Put", put, fence, log, txn)
        if stored is not None:
            return LogOnceResult(state=_decode_record(log, txn, stored).state, created=False)
        return LogOnceResult(state=state, created=True)

    async def _log(
        self, log: LogId, txn: str, state: TxnState, body: RecordBody | None, fence: Fence | None
    ) -> TxnState:
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
        update: dict[str, Any] = {
            "TableName": self._table,
            "Key": _record_key(log, txn),
            "UpdateExpression": "SET " + ", ".join(sets),
            # The transition rule of contract.check_log_transition, enforced by storage itself so
            # that a racing writer cannot slip between a read and our write.
            "ConditionExpression": "attribute_not_exists(#pk) OR #state = :vote OR #state = :state",
            "ExpressionAttributeNames": _NAMES,
            "ExpressionAttributeValues": values,
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
        stored = await self._conditional_write("Update", update, fence, log, txn)
        if stored is not None:
            stored_state = _decode_record(log, txn, stored).state
            check_log_transition(log, txn, stored_state, state)
            # The condition failed, so the rule must refuse this pair; it did not, which
            # means storage and contract disagree about the rule.
            raise InvariantViolation(
                f"dynamodb refused {stored_state} -> {state} for {log.key}/{txn}, the contract allows it"
            )
        return state

    async def _conditional_write(
        self, kind: str, request: dict[str, Any], fence: Fence | None, log: LogId, txn: str
    ) -> dict[str, Any] | None:
        """One conditional Put or Update of a record (`kind`), in a transaction behind the fence's
        ConditionCheck when there is one. None when written; else the item its condition failed
        on (Fenced is raised first, when the fence failed)."""
        try:
            if fence is None:
                write = self._client.put_item if kind == "Put" else self._client.update_item
                await write(**request)
            else:
                await self._transact([self._fence_check(fence), {kind: request}])
            return None
        except ClientError as error:
            if fence is None:
                if _error_code(error) != "ConditionalCheckFailedException":
                    raise
                stored = error.response.get("Item")
            else:
                await self._raise_if_fenced(error, fence)
                reason = _failed_condition(error, 1)
                if reason is None:
                    raise
                stored = reason.get("Item")
        if stored is None:
            # Only an emulator that ignores ReturnValuesOnConditionCheckFailure gets here; the
            # read costs a second round trip but keeps the answer right.
            stored = await self._get_item(_record_key(log, txn))
        # The item that failed our condition exists; garbage collection only removes long-finished
        # txns, so it cannot have vanished in between.
        assert stored is not None, f"{log.key}/{txn}: condition failed, yet no item"
        return stored

    async def _get_item(self, key: dict[str, Any]) -> dict[str, Any] | None:
        response = await self._client.get_item(TableName=self._table, Key=key, ConsistentRead=True)
        return response.get("Item")

    async def _read(self, log: LogId, txn: str) -> Record | None:
        item = await self._get_item(_record_key(log, txn))
        return _decode_record(log, txn, item) if item is not None else None

    async def _scan_page(self, log: LogId, limit: int, after: str) -> ScanPage:
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
        return await self._walk_log(log, request, limit, after, finished=False)

    async def _scan_finished_page(self, log: LogId, limit: int, after: str) -> ScanPage:
        names = {
            name: _NAMES[name] for name in ("#pk", "#state", "#applied", "#created", "#participants", "#coordinator")
        }
        request: dict[str, Any] = {
            "TableName": self._table,
            # In the key condition, not as ExclusiveStartKey, as list_identities does: `after` need
            # not name a record, and string sort keys compare by their UTF-8 bytes, the
            # contract's order for ASCII ids.
            "KeyConditionExpression": "#pk = :pk AND #sk > :after" if after else "#pk = :pk",
            # Finished (an ABORT, or a COMMIT applied: a coordinator's COMMIT never is) and not a
            # tombstone (only tombstones carry the TTL's attribute). The filter reads the whole
            # item, the projection only shapes what comes back: every item walked still costs
            # its read units, redo and all.
            "FilterExpression": (
                "attribute_not_exists(#expires) AND (#state = :abort OR (#state = :commit AND #applied = :true))"
            ),
            # Everything but the redo, which the contract leaves out (most of a record's bytes).
            "ProjectionExpression": "#pk, #sk, #state, #applied, #created, #participants, #coordinator",
            "ExpressionAttributeNames": {**names, "#sk": "sk", "#expires": _EXPIRES_AT},
            "ExpressionAttributeValues": {
                ":pk": {"S": _TXN_PK_PREFIX + log.key},
                ":abort": {"S": TxnState.ABORT.value},
                ":commit": {"S": TxnState.COMMIT.value},
                ":true": {"BOOL": True},
            },
            "ConsistentRead": True,
        }
        if after:
            request["ExpressionAttributeValues"][":after"] = {"S": after}
        return await self._walk_log(log, request, limit, after, finished=True)

    async def _walk_log(
        self, log: LogId, request: dict[str, Any], limit: int, after: str, *, finished: bool
    ) -> ScanPage:
        """A scan page from `request`, a filtered Query of `log`'s records past `after`: its pages
        followed until `limit` records passed the filter, the log ends, or the walk's bound
        (SCAN_WALK_ITEM_COUNT_MAX records evaluated, SCAN_QUERY_PAGE_COUNT_MAX Query pages,
        SCAN_WALK_TIME_SHARE of the call's time), where the page ends short and resumes past the
        last record evaluated. `finished`: the finished scan's (no redo read), else the
        unfinished one's; each record returned is checked against its filter."""
        records: list[Record] = []
        walk_left = SCAN_WALK_ITEM_COUNT_MAX
        loop = asyncio.get_running_loop()
        walk_until = loop.time() + (call_deadline() - loop.time()) * SCAN_WALK_TIME_SHARE
        for page_index in range(SCAN_QUERY_PAGE_COUNT_MAX):
            if page_index and (walk_left <= 0 or loop.time() >= walk_until):
                break
            request["Limit"] = walk_left  # records evaluated, not returned: the filter comes after
            response = await self._client.query(**request)
            walk_left -= response["ScannedCount"]
            for item in response.get("Items", []):
                record = _decode_record(log, item["sk"]["S"], item, redo_projected_out=finished)
                assert is_unfinished(record.state, record.applied) is not finished, record
                assert record.txn > after and (not records or record.txn > records[-1].txn)
                records.append(record)
                if len(records) == limit:
                    return ScanPage(tuple(records), record.txn)
            last = response.get("LastEvaluatedKey")
            if last is None:
                return ScanPage(tuple(records), None)
            request["ExclusiveStartKey"] = last
        # The walk's bound: the next page resumes past the last record this one evaluated.
        return ScanPage(tuple(records), _txn_of_key(log, request["ExclusiveStartKey"]))

    async def _read_data(self, partition: str, keys: tuple[str, ...]) -> dict[str, bytes | None]:
        # BatchGetItem rejects a request that names one key twice.
        unique = list(dict.fromkeys(keys))
        items = await self._batch_get([_data_key(partition, key) for key in unique], "sk, v")
        found = {item["sk"]["S"]: bytes(item["v"]["B"]) for item in items}
        assert set(found) <= set(unique)
        return {key: found.get(key) for key in unique}

    async def _batch_get(self, keys: list[dict[str, Any]], projection: str | None) -> list[dict[str, Any]]:
        """The items stored under `keys` (distinct), absent ones left out, in no particular order:
        BatchGetItems of at most BATCH_GET_KEY_COUNT_MAX keys each, BATCH_GET_CONCURRENCY_MAX at once."""
        found: list[dict[str, Any]] = []
        semaphore = asyncio.Semaphore(BATCH_GET_CONCURRENCY_MAX)

        async def batch(chunk: list[dict[str, Any]]) -> None:
            request: dict[str, Any] = {"Keys": chunk, "ConsistentRead": True}
            if projection is not None:
                request["ProjectionExpression"] = projection
            request_items: dict[str, Any] = {self._table: request}
            async with semaphore:
                for attempt in range(BATCH_GET_RETRY_COUNT_MAX + 1):
                    response = await self._client.batch_get_item(RequestItems=request_items)
                    found.extend(response.get("Responses", {}).get(self._table, []))
                    request_items = response.get("UnprocessedKeys") or {}
                    if not request_items:
                        return
                    await asyncio.sleep(BATCH_GET_RETRY_BACKOFF_MS * (attempt + 1) / 1000)
            raise StorageUnavailable(
                f"dynamodb: keys still unprocessed after {BATCH_GET_RETRY_COUNT_MAX} retries"
            )

        chunks = [keys[i : i + BATCH_GET_KEY_COUNT_MAX] for i in range(0, len(keys), BATCH_GET_KEY_COUNT_MAX)]
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
        assert len(found) <= len(keys)
        return found

    async def _apply_redo(
        self, partition: str, txn: str, writes: dict[str, bytes | None], fence: Fence | None
    ) -> bool:
        log = LogId.partition(partition)
        record_key = _record_key(log, txn)
        # The fence's ConditionCheck leads every transaction (where _raise_if_fenced looks for it).
        head = [self._fence_check(fence)] if fence is not None else []

        operations: list[tuple[dict[str, Any], int]] = []
        for key, value in writes.items():
            if value is None:
                operation = {"Delete": {"TableName": self._table, "Key": _data_key(partition, key)}}
                size = len(key.encode("utf-8")) + 128
            else:
                item = {**_data_key(partition, key), "v": {"B": value}}
                operation = {"Put": {"TableName": self._table, "Item": item}}
                size = len(key.encode("utf-8")) + len(value) + 128
            operations.append((operation, size))
        # Every chunk leaves room for the head and the marker, so any chunk can carry both. The
        # head's few hundred bytes fit in what TRANSACT_BYTES_MAX leaves below DynamoDB's 4 MB.
        reserved_count = len(head) + 1
        chunks: list[list[dict[str, Any]]] = [[]]
        chunk_bytes = 0
        for operation, size in operations:
            if len(chunks[-1]) + reserved_count >= TRANSACT_ITEM_COUNT_MAX or chunk_bytes + size > TRANSACT_BYTES_MAX:
                chunks.append([])
                chunk_bytes = 0
            chunks[-1].append(operation)
            chunk_bytes += size
        assert all(len(chunk) + reserved_count <= TRANSACT_ITEM_COUNT_MAX for chunk in chunks)

        def marker(*, require_unapplied: bool) -> dict[str, Any]:
            # A VOTE_YES is the participant's own record, which it applies only once it knows the
            # decision is COMMIT (see LogStore.apply_redo): the marker records that COMMIT too.
            condition = "#state IN (:vote, :commit)"
            values: dict[str, Any] = {
                ":vote": {"S": TxnState.VOTE_YES.value},
                ":commit": {"S": TxnState.COMMIT.value},
                ":true": {"BOOL": True},
            }
            if require_unapplied:
                condition += " AND #applied = :false"
                values[":false"] = {"BOOL": False}
            return {
                "Update": {
                    "TableName": self._table,
                    "Key": record_key,
                    "UpdateExpression": "SET #state = :commit, #applied = :true",
                    "ConditionExpression": condition,
                    "ExpressionAttributeNames": {"#state": "state", "#applied": "applied"},
                    "ExpressionAttributeValues": values,
                    "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                }
            }

        if len(chunks) == 1:
            # The common case, fully atomic in one round trip: the data lands only together
            # with the marker, and only if the record is a vote or COMMIT not yet applied (and
            # the fence holds). Writing an applied redo again could undo a later txn's writes
            # to the same keys.
            try:
                await self._transact([*head, *chunks[0], marker(require_unapplied=True)])
            except ClientError as error:
                if fence is not None:
                    await self._raise_if_fenced(error, fence)
                stored = self._marker_failure(error, log, txn)
                if stored is None:
                    raise
                if stored.applied:
                    return False
                raise InvariantViolation(f"apply_redo of {log.key}/{txn}: record is {stored.state}") from error
            return True
        # Too big for one transaction: check first, then data, then the marker, so the record
        # says COMMIT and applied only once all data is in; a crash before the marker leaves a
        # VOTE_YES, which recovery resolves and then applies again.
        if fence is None:
            item = await self._get_item(record_key)
        else:
            # The fence too, in the same read, so that a deposed owner is refused before it
            # writes any chunk, as a one-transaction redo would be.
            item, owner_item = await self._get_items_together(record_key, _owner_key(partition))
            owner = _decode_owner(owner_item) if owner_item is not None else None
            if not fence.admits(owner):
                raise Fenced(fence, owner)
        stored = _decode_record(log, txn, item) if item is not None else None
        if stored is None or stored.state is TxnState.ABORT:
            state = stored.state if stored is not None else "absent"
            raise InvariantViolation(f"apply_redo of {log.key}/{txn}: record is {state}")
        if stored.applied:
            return False
        # Every chunk carries the fence's check, not only the one with the marker: a chunk
        # lands only while the fence holds, so all data of a deposed owner lands before the
        # take that deposed it (transactions serialize with write_owner's PutItem). If the
        # partition is taken between chunks, the next chunk is refused with Fenced and the
        # record stays unapplied, so the new owner's recovery re-applies the whole redo over
        # the chunks that landed before it lets any later txn at those keys. Unlike a
        # one-transaction redo, then, a Fenced here may follow chunks that did land (as a
        # crash between chunks leaves them); what the fence guarantees is that none lands late.
        # And every chunk carries the record's own condition, not yet applied: a chunk of an
        # attempt that timed out may land late, after a retry applied the redo and a later
        # transaction wrote the same keys, and must then be refused, not put old values back.
        # (A late chunk before the retry's marker writes what the retry writes: harmless.)
        # The marker's condition without its SET, nor the value only the SET uses: DynamoDB
        # refuses a request that declares an attribute value none of its expressions names
        # (found by review: every redo too big for one transaction failed on real DynamoDB, and
        # the node exited on the error; moto lets it through).
        update = marker(require_unapplied=True)["Update"]
        unapplied = {"ConditionCheck": {
            **{key: value for key, value in update.items() if key != "UpdateExpression"},
            "ExpressionAttributeValues": {
                name: value for name, value in update["ExpressionAttributeValues"].items() if name != ":true"
            },
        }}
        try:
            for chunk in chunks[:-1]:
                await self._transact([*head, *chunk, unapplied])
            await self._transact([*head, *chunks[-1], marker(require_unapplied=True)])
        except ClientError as error:
            if fence is not None:
                await self._raise_if_fenced(error, fence)
            stored = self._marker_failure(error, log, txn)
            if stored is None:
                raise
            if stored.applied:
                return False  # an earlier attempt of this apply finished it
            raise InvariantViolation(f"apply_redo of {log.key}/{txn}: record is {stored.state}") from error
        return True

    async def _get_items_together(
        self, first: dict[str, Any], second: dict[str, Any]
    ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """Two items as they stood at one instant (TransactGetItems), in one round trip, sent again
        after a conflict as writes are: a large redo reads its partition's ownership item so, which
        every fenced write of the partition holds in its check and every renewal writes, and
        DynamoDB cancels a read that meets them (found by audit, 2026-11-28, second: on a busy
        partition an apply of more than ~98 keys failed as unavailable, again and again)."""
        items = [{"Get": {"TableName": self._table, "Key": key}} for key in (first, second)]
        response = await _retrying_conflicts(lambda: self._client.transact_get_items(TransactItems=items))
        responses = response.get("Responses") or []
        assert len(responses) == 2, f"TransactGetItems of 2 keys answered {len(responses)}"
        return responses[0].get("Item"), responses[1].get("Item")

    def _fence_check(self, fence: Fence) -> dict[str, Any]:
        """The ConditionCheck that makes a transaction's writes land only while `fence` holds."""
        return {
            "ConditionCheck": {
                "TableName": self._table,
                "Key": _owner_key(fence.partition),
                # False on an absent item too: no record means no owner.
                "ConditionExpression": "#owner = :fence_owner AND #epoch = :fence_epoch",
                "ExpressionAttributeNames": {"#owner": "owner", "#epoch": "epoch"},
                "ExpressionAttributeValues": {
                    ":fence_owner": {"S": fence.owner},
                    ":fence_epoch": {"N": str(fence.epoch)},
                },
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            }
        }

    async def _raise_if_fenced(self, error: ClientError, fence: Fence) -> None:
        """Raise Fenced if `error` is a fenced transaction's ConditionCheck (its first item)
        failing; return if the transaction failed for another reason."""
        reason = _failed_condition(error, 0)
        if reason is None:
            return
        item = reason.get("Item")
        if item is None:
            # DynamoDB sends no item when there is none, and neither does an emulator that ignores
            # ReturnValuesOnConditionCheckFailure: a read tells the two apart, on a refusal only.
            item = await self._get_item(_owner_key(fence.partition))
        raise Fenced(fence, _decode_owner(item) if item is not None else None) from error

    async def _transact(self, items: list[dict[str, Any]]) -> None:
        assert 0 < len(items) <= TRANSACT_ITEM_COUNT_MAX
        await _retrying_conflicts(lambda: self._client.transact_write_items(TransactItems=items))

    @staticmethod
    def _marker_failure(error: ClientError, log: LogId, txn: str) -> Record | None:
        """If `error` is our marker's condition failing, the record as it stood (absent: raise);
        None when the transaction failed for another reason, to be handled as an error."""
        reasons = _final_cancellation_reasons(error)
        if not reasons or reasons[-1].get("Code") != "ConditionalCheckFailed":
            return None
        item = reasons[-1].get("Item")
        if not item:
            raise InvariantViolation(f"apply_redo of {log.key}/{txn}: no record") from error
        return _decode_record(log, txn, item)

    # Deletes are not coalesced here: BatchWriteItem carries no condition (so no fence, no
    # tombstone's rule) and returns no old items (so no "did it exist"), and a TransactWriteItems of
    # several deletes is all or nothing (one fenced, refused or absent record would cancel the rest)
    # at twice the capacity cost. Each delete stays one DeleteItem or UpdateItem (or one fenced
    # transaction) of its own.
    async def _delete(self, log: LogId, txn: str, fence: Fence | None, keep: Tombstone | None) -> bool:
        if keep is not None:
            return await self._keep(log, txn, fence, keep)
        if fence is None:
            response = await self._client.delete_item(
                TableName=self._table, Key=_record_key(log, txn), ReturnValues="ALL_OLD"
            )
            return "Attributes" in response
        # A transaction's Delete cannot return the old item; its condition says whether there
        # was one instead, in the same round trip.
        delete = {
            "TableName": self._table,
            "Key": _record_key(log, txn),
            "ConditionExpression": "attribute_exists(#pk)",
            "ExpressionAttributeNames": {"#pk": "pk"},
        }
        try:
            await self._transact([self._fence_check(fence), {"Delete": delete}])
        except ClientError as error:
            await self._raise_if_fenced(error, fence)
            if _failed_condition(error, 1) is None:
                raise
            return False
        return True

    async def _keep(self, log: LogId, txn: str, fence: Fence | None, keep: Tombstone) -> bool:
        """Turn the record into `keep`'s tombstone (see the module docstring); whether one was there."""
        if fence is None:
            try:
                response = await self._client.update_item(
                    **self._tombstone_update(log, txn, keep, existing=None), ReturnValues="ALL_OLD"
                )
            except ClientError as error:
                if _error_code(error) != "ConditionalCheckFailedException":
                    raise
                item = error.response.get("Item")
                if item is None:
                    # Only an emulator that ignores ReturnValuesOnConditionCheckFailure gets here.
                    item = await self._get_item(_record_key(log, txn))
                # The condition passes on an absent record, so one was there; garbage collection
                # only removes long-finished txns, so it cannot have vanished in between.
                assert item is not None, f"{log.key}/{txn}: tombstone refused, yet no item"
                _refuse_tombstone(log, txn, keep, item, error)
            # An existing item holds at least its key; DynamoDB sends no Attributes for a new one.
            return bool(response.get("Attributes"))
        # A transaction returns no old item on success, so whether a record was there is learned
        # from the condition instead: first that there is one (garbage collection keeps what it
        # logged), then, when there was none, that there is still none.
        existing = True
        for _ in range(TOMBSTONE_ROUND_COUNT_MAX):
            update = self._tombstone_update(log, txn, keep, existing=existing)
            try:
                await self._transact([self._fence_check(fence), {"Update": update}])
            except ClientError as error:
                await self._raise_if_fenced(error, fence)
                reason = _failed_condition(error, 1)
                if reason is None:
                    raise
                item = reason.get("Item")
                if existing:
                    if item is None:
                        # DynamoDB sends no item when there is none (an emulator that ignores
                        # ReturnValuesOnConditionCheckFailure neither: the next round reads it).
                        existing = False
                        continue
                    _refuse_tombstone(log, txn, keep, item, error)
                if item is None:
                    # The absence failed, so there is an item, unless an emulator did not send it.
                    item = await self._get_item(_record_key(log, txn))
                if item is not None:
                    stored = _decode_record(log, txn, item)
                    check_tombstone(log, txn, stored.state, stored.applied, keep)
                    existing = True
                continue
            return existing
        raise StorageUnavailable(
            f"dynamodb delete of {log.key}/{txn}: the record came and went through {TOMBSTONE_ROUND_COUNT_MAX} keeps"
        )

    def _tombstone_update(self, log: LogId, txn: str, keep: Tombstone, *, existing: bool | None) -> dict[str, Any]:
        """The UpdateItem that makes the record `keep`'s tombstone: conditioned on check_tombstone's
        rule over an existing record (`existing` True), on there being no record (False), or on
        either (None)."""
        commit = keep.decision is TxnState.COMMIT
        values: dict[str, Any] = {
            ":decision": {"S": keep.decision.value},
            ":applied": {"BOOL": commit},
            ":expires": {"N": str(_expires_at_s(keep.keep_ms))},
            ":now": {"N": str(_now_ms())},
        }
        # check_tombstone's rule as a condition: a COMMIT only over a COMMIT (never over a vote),
        # and in a partition's log only once its redo is in the data (applied); in a coordinator's,
        # whose COMMIT is never applied, over any (commit_tombstone_needs_applied). An ABORT over
        # a vote or an ABORT.
        if not commit:
            allowed = "#state IN (:vote, :decision)"
        elif commit_tombstone_needs_applied(log):
            allowed = "#state = :decision AND #applied = :applied"
        else:
            allowed = "#state = :decision"
        if existing is None:
            condition = f"attribute_not_exists(#pk) OR ({allowed})"
        elif existing:
            condition = f"attribute_exists(#pk) AND ({allowed})"
        else:
            condition = "attribute_not_exists(#pk)"
        if not commit and existing is not False:
            # Declared only where the condition names it: DynamoDB refuses a request that declares
            # an expression value none of its expressions uses (moto lets it through).
            values[":vote"] = {"S": TxnState.VOTE_YES.value}
        return {
            "TableName": self._table,
            "Key": _record_key(log, txn),
            # No body, nor anything the unfinished scan's filter would pass: the decision alone,
            # a COMMIT applied. The creation time stays a record's own.
            "UpdateExpression": (
                "SET #state = :decision, #applied = :applied, #expires = :expires, "
                "#created = if_not_exists(#created, :now) REMOVE #participants, #coordinator, #redo"
            ),
            "ConditionExpression": condition,
            "ExpressionAttributeNames": {**_NAMES, "#expires": _EXPIRES_AT},
            "ExpressionAttributeValues": values,
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }

    async def _read_owners(self, partitions: tuple[str, ...]) -> dict[str, Ownership]:
        items = await self._batch_get([_owner_key(partition) for partition in partitions], None)
        found = {owner.partition: owner for owner in map(_decode_owner, items)}
        assert set(found) <= set(partitions), f"BatchGetItem answered keys not asked: {set(found) - set(partitions)}"
        return {partition: found[partition] for partition in partitions if partition in found}

    async def _write_owner(self, expected: Ownership | None, new: Ownership) -> OwnerWriteResult:
        if is_identity(new.partition) and (expected is None or expected.epoch != new.epoch):
            # A take of a node's identity: its node joins the registry first, so that no take
            # succeeds unlisted (see the module docstring). Unconditional, so idempotent: a
            # repeated take, or one that then loses its race, leaves the one item there.
            await self._client.put_item(
                TableName=self._table, Item=_identity_registry_key(new.partition[len(IDENTITY_PREFIX) :])
            )
        put: dict[str, Any] = {
            "TableName": self._table,
            "Item": _owner_item(new),
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
        if expected is None:
            put["ConditionExpression"] = "attribute_not_exists(#pk)"
            put["ExpressionAttributeNames"] = {"#pk": "pk"}
        else:
            put["ConditionExpression"] = "#epoch = :epoch AND #version = :version"
            put["ExpressionAttributeNames"] = {"#epoch": "epoch", "#version": "version"}
            put["ExpressionAttributeValues"] = {
                ":epoch": {"N": str(expected.epoch)},
                ":version": {"N": str(expected.version)},
            }
        try:
            await _retrying_conflicts(lambda: self._client.put_item(**put))
        except ClientError as error:
            if _error_code(error) != "ConditionalCheckFailedException":
                raise
            item = error.response.get("Item")
            if item is None:
                # No record (DynamoDB sends no item then), or an emulator that ignores
                # ReturnValuesOnConditionCheckFailure: the loser pays a read.
                item = await self._get_item(_owner_key(new.partition))
            stored = _decode_owner(item) if item is not None else None
            # Ownership records are never deleted and their version only rises, so what beat
            # us can neither be absent (when we expected none) nor be the one we expected.
            assert stored is not None or expected is not None, f"{new.partition}: condition failed, yet no record"
            assert stored is None or expected is None or (stored.epoch, stored.version) != (
                expected.epoch,
                expected.version,
            ), f"{new.partition}: condition failed on the expected record"
            return OwnerWriteResult(stored=stored, written=False)
        return OwnerWriteResult(stored=new, written=True)

    async def _list_identities(self, after: str, limit: int) -> list[str]:
        request: dict[str, Any] = {
            "TableName": self._table,
            "KeyConditionExpression": "#pk = :pk",
            "ExpressionAttributeNames": {"#pk": "pk"},
            "ExpressionAttributeValues": {":pk": {"S": _IDENTITY_REGISTRY_PK}},
            "ProjectionExpression": "sk",
            # Strongly consistent: a take's registry item, put before the take, is seen by any
            # listing that follows the take.
            "ConsistentRead": True,
        }
        if after:
            # In the key condition, not as ExclusiveStartKey: that would name an item, and `after`
            # need not be one. String sort keys compare by their UTF-8 bytes, the contract's order.
            request["KeyConditionExpression"] = "#pk = :pk AND #sk > :after"
            request["ExpressionAttributeNames"]["#sk"] = "sk"
            request["ExpressionAttributeValues"][":after"] = {"S": after}
        nodes: list[str] = []
        for _ in range(IDENTITY_QUERY_COUNT_MAX):
            request["Limit"] = limit - len(nodes)
            response = await self._client.query(**request)
            for item in response.get("Items", []):
                node = item["sk"]["S"]
                assert node > after and (not nodes or node > nodes[-1]), (after, nodes, node)
                nodes.append(node)
            last = response.get("LastEvaluatedKey")
            if last is None or len(nodes) == limit:
                assert len(nodes) <= limit
                return nodes
            request["ExclusiveStartKey"] = last
        raise StorageUnavailable(
            f"dynamodb: list_identities took {IDENTITY_QUERY_COUNT_MAX} queries for {limit} ids"
        )

    async def close(self) -> None:
        await self._exit_stack.aclose()

    # Test and operator helpers, not part of the contract.

    async def delete_table(self) -> None:
        """Drop the whole table (test teardown)."""

        async def drop() -> None:
            try:
                await self._client.delete_table(TableName=self._table)
            except ClientError as error:
                if _error_code(error) != "ResourceNotFoundException":
                    raise

        await self._bounded(drop(), "delete_table")


# The pk prefixes plus a log key or partition stay far inside DynamoDB's 2048-byte partition key.
assert len(_DATA_PK_PREFIX) + LOG_NAME_LENGTH_MAX + 2 < 2048

__all__ = ["DynamoDbStore"]
