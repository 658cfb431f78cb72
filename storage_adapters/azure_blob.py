"""The Azure Blob Storage backend of the LogStore contract.

Each (log, txn) record is ONE blob holding everything (state, body, applied, created_at_ms), so
`log_once` is a single conditional Put Blob with `If-None-Match: *`: the winner pays one request,
and a loser learns of its loss from the 409 and pays a second request to read what the winner
stored. (The paper's artifact wrote two blobs, the second conditional; one blob is what lets a
true LogOnce cost one write.) Every later change of a record (`log`'s decisions, `apply_redo`'s
applied marker) is an `If-Match` on the ETag read just before, retried a bounded number of times.

Layout, with transaction state and data under distinct prefixes so access policies can split them:

    txn/<log.key>/<txn>             JSON record; metadata {state, applied} for scans
    data/<partition>/<b64url(key)>  raw value bytes

Ids are used verbatim as path segments except that a trailing '.' gets a '~' appended, because
Azure treats a path segment ending in '.' specially (and '.'/'..' would be path-normalized);
'~' is outside the id alphabet, so the mapping stays injective. It is not order-preserving, which
`scan_unfinished` must mend: '~' sorts above every id character, so `a.~` lists after `a.b` though
the id `a.` sorts before `a.b`. Data keys are arbitrary UTF-8, so they are urlsafe base64 (at most
684 characters for 512 bytes, well under the 1024-character name limit).

Durability: Azure acknowledges a Put Blob only after it is durably stored (LRS: 3 replicas), which
is what a vote needs. Azurite keeps blobs on disk too, but is a test double, not a deployment.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

import aiohttp
from azure.core import MatchConditions
from azure.core.exceptions import (
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceResponseError,
)
from azure.storage.blob.aio import BlobServiceClient, ContainerClient

from storage_adapters.contract import (
    SCAN_PAGE_COUNT_MAX,
    SCAN_ROUND_COUNT_MAX,
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

# How often a read-modify-write may lose an ETag race before we give up and report contention as
# unavailability (retryable). Writers of one record are few (a coordinator and the terminators of
# one txn), so losing this many times in a row means something is wrong, not merely busy.
ETAG_RETRY_COUNT_MAX = 16
# Concurrent requests in flight for one call's data blobs (apply_redo, read_data, scan reads):
# enough to hide per-request latency, few enough not to exhaust the connection pool or the
# account's per-partition request rate.
DATA_CONCURRENCY_MAX = 32
# The SDK's own retries stay off: a retried conditional Put whose first attempt landed but whose
# response was lost would come back as a 409 and make the winner believe it lost. Retrying is the
# caller's job, under its deadline, and every LogStore call is idempotent.
SDK_RETRY_COUNT_MAX = 0
# Only an unexpected layout change could make a stored record fail to parse; the format carries a
# version so such a change is detected rather than misread.
RECORD_FORMAT_VERSION = 1

_STATE_METADATA = "state"
_APPLIED_METADATA = "applied"

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class _Stored:
    """A record as read, with the ETag that a conditional overwrite must match."""

    record: Record
    etag: str


def _segment(value: str) -> str:
    # See the module docstring: Azure mishandles path segments that end with '.'.
    return value + "~" if value.endswith(".") else value


def _record_name(log: LogId, txn: str) -> str:
    return f"txn/{_segment(log.key)}/{_segment(txn)}"


def _record_prefix(log: LogId) -> str:
    return f"txn/{_segment(log.key)}/"


def _txn_of(prefix: str, name: str) -> str:
    """The txn id of a record blob listed under `prefix`: `_record_name` inverted."""
    segment = name[len(prefix) :]
    return segment[:-1] if segment.endswith(".~") else segment


def _dotted_prefixes(txn: str) -> list[str]:
    """The proper prefixes of `txn` that end in '.': the only ids below `txn` whose blob names
    list after its own (see the module docstring)."""
    return [txn[: i + 1] for i, char in enumerate(txn[:-1]) if char == "."]


def _data_name(partition: str, key: str) -> str:
    encoded = base64.urlsafe_b64encode(key.encode("utf-8")).decode("ascii")
    return f"data/{_segment(partition)}/{encoded}"


def _now_ms() -> int:
    return int(time.time() * 1000)


def _encode_record(record: Record) -> tuple[bytes, dict[str, str]]:
    content = {
        "v": RECORD_FORMAT_VERSION,
        "log": record.log.key,
        "txn": record.txn,
        "state": record.state.value,
        "participants": list(record.body.participants),
        "coordinator": record.body.coordinator,
        "redo": base64.b64encode(record.body.redo).decode("ascii"),
        "applied": record.applied,
        "created_at_ms": record.created_at_ms,
    }
    metadata = {
        _STATE_METADATA: record.state.value,
        _APPLIED_METADATA: "true" if record.applied else "false",
    }
    return json.dumps(content, separators=(",", ":")).encode("utf-8"), metadata


def _decode_record(log: LogId, txn: str, data: bytes) -> Record:
    try:
        content = json.loads(data)
        if content["v"] != RECORD_FORMAT_VERSION:
            raise InvariantViolation(f"record {log.key}/{txn} has format version {content['v']!r}")
        # A blob under this name must describe this name: anything else means the layout was
        # broken by something other than this adapter.
        if content["log"] != log.key or content["txn"] != txn:
            raise InvariantViolation(f"blob for {log.key}/{txn} holds {content['log']}/{content['txn']}")
        record = Record(
            log=log,
            txn=txn,
            state=TxnState(content["state"]),
            body=RecordBody(
                participants=tuple(content["participants"]),
                coordinator=content["coordinator"],
                redo=base64.b64decode(content["redo"], validate=True),
            ),
            applied=bool(content["applied"]),
            created_at_ms=int(content["created_at_ms"]),
        )
    except (KeyError, TypeError, ValueError, binascii.Error) as error:
        # ValidationError is a ValueError: a stored body that no longer validates is corruption.
        raise InvariantViolation(f"record {log.key}/{txn} is unreadable: {error}") from error
    # Only a COMMIT's redo is ever applied.
    assert not record.applied or record.state is TxnState.COMMIT
    return record



async def _gather_bounded(calls: Sequence[Callable[[], Awaitable[T]]]) -> list[T]:
    """Run `calls` with at most DATA_CONCURRENCY_MAX in flight; results in order. The first error
    cancels the rest (TaskGroup), so a failing backend does not leave stray requests running."""
    semaphore = asyncio.Semaphore(DATA_CONCURRENCY_MAX)

    async def run(call: Callable[[], Awaitable[T]]) -> T:
        async with semaphore:
            return await call()

    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(run(call)) for call in calls]
    except BaseExceptionGroup as errors:
        raise _first_leaf(errors) from None
    return [task.result() for task in tasks]


def _first_leaf(errors: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first real error in a TaskGroup's group, so callers (and our error mapping) see one
    plain exception, as they would from a sequential loop."""
    leaf: BaseException = errors
    while isinstance(leaf, BaseExceptionGroup):
        leaf = leaf.exceptions[0]
    return leaf


class AzureBlobStore(LogStore):
    backend_name = "azure_blob"

    def __init__(self, service: BlobServiceClient, container: ContainerClient, timeout_ms_call: int) -> None:
        assert timeout_ms_call > 0
        self._service = service
        self._container = container
        self._timeout_s = timeout_ms_call / 1000

    @classmethod
    async def open(
        cls,
        connection_string: str,
        container: str,
        *,
        timeout_ms_call: int = 5000,
        create_container: bool = True,
    ) -> AzureBlobStore:
        if not isinstance(connection_string, str) or not connection_string:
            raise ValidationError("connection_string must be a non-empty string")
        if not isinstance(container, str) or not container:
            raise ValidationError("container must be a non-empty string")
        if not isinstance(timeout_ms_call, int) or isinstance(timeout_ms_call, bool) or timeout_ms_call <= 0:
            raise ValidationError(f"timeout_ms_call must be a positive int, got {timeout_ms_call!r}")
        timeout_s = timeout_ms_call / 1000
        try:
            service = BlobServiceClient.from_connection_string(
                connection_string,
                # The client-level timeouts make a stuck socket fail inside the SDK; the asyncio
                # deadline around every call is the backstop that also covers DNS, TLS and pools.
                connection_timeout=timeout_s,
                read_timeout=timeout_s,
                retry_total=SDK_RETRY_COUNT_MAX,
            )
        except ValueError as error:
            raise ValidationError(f"bad connection string: {error}") from error
        store = cls(service, service.get_container_client(container), timeout_ms_call)
        if create_container:
            try:
                async with store._deadline():
                    with contextlib.suppress(ResourceExistsError):
                        await store._container.create_container()
            except BaseException:
                await service.close()
                raise
        return store

    @contextlib.asynccontextmanager
    async def _deadline(self) -> AsyncIterator[None]:
        """Bound a call by the store's deadline and turn transport failures into the contract's
        typed errors, so callers never see an SDK exception or wait forever."""
        try:
            async with asyncio.timeout(self._timeout_s):
                yield
        except TimeoutError as error:
            # Before OSError: TimeoutError is one.
            raise StorageUnavailable(f"azure_blob: no answer within {self._timeout_s}s") from error
        except (ServiceRequestError, ServiceResponseError, aiohttp.ClientError, OSError) as error:
            raise StorageUnavailable(f"azure_blob: {type(error).__name__}: {error}") from error
        except HttpResponseError as error:
            status = error.status_code or 0
            if status >= 500 or status in (408, 429):
                raise StorageUnavailable(f"azure_blob: HTTP {status} {error.error_code}") from error
            raise StorageError(f"azure_blob: HTTP {status} {error.error_code}: {error.message}") from error

    # Requests. Each is one HTTP round trip.

    async def _get(self, log: LogId, txn: str) -> _Stored | None:
        blob = self._container.get_blob_client(_record_name(log, txn))
        try:
            downloader = await blob.download_blob()
            data = await downloader.readall()
        except ResourceNotFoundError:
            return None
        etag = downloader.properties.etag
        assert etag
        return _Stored(_decode_record(log, txn, data), etag)

    async def _create(self, record: Record) -> bool:
        """Put the record if absent (`If-None-Match: *`); False if a blob already exists."""
        content, metadata = _encode_record(record)
        blob = self._container.get_blob_client(_record_name(record.log, record.txn))
        try:
            # overwrite=False is what sends If-None-Match: *.
            await blob.upload_blob(content, overwrite=False, metadata=metadata)
        except (ResourceExistsError, ResourceModifiedError):
            # 409 BlobAlreadyExists is the documented answer; 412 is accepted too, since both mean
            # the precondition lost to an existing blob.
            return False
        return True

    async def _replace(self, record: Record, etag: str) -> bool:
        """Overwrite the record if its ETag is still `etag`; False if it changed or vanished."""
        content, metadata = _encode_record(record)
        blob = self._container.get_blob_client(_record_name(record.log, record.txn))
        try:
            await blob.upload_blob(
                content,
                overwrite=True,
                metadata=metadata,
                etag=etag,
                match_condition=MatchConditions.IfNotModified,
            )
        except (ResourceModifiedError, ResourceNotFoundError):
            return False
        return True

    # The contract.

    async def log_once(self, log: LogId, txn: str, state: TxnState, body: RecordBody) -> LogOnceResult:
        validate_log(log)
        validate_txn(txn)
        validate_state(state)
        validate_body(body)
        record = Record(log=log, txn=txn, state=state, body=body, applied=False, created_at_ms=_now_ms())
        async with self._deadline():
            if await self._create(record):
                return LogOnceResult(state=state, created=True)
            # Someone else won: learn what they stored. Records are only deleted by garbage
            # collection of long-finished txns, so the blob that beat us must still be there.
            stored = await self._get(log, txn)
            assert stored is not None, f"{log.key}/{txn}: 409 on create, yet no blob on read-back"
            return LogOnceResult(state=stored.record.state, created=False)

    async def log(self, log: LogId, txn: str, state: TxnState, body: RecordBody | None = None) -> TxnState:
        validate_log(log)
        validate_txn(txn)
        validate_state(state)
        if body is not None:
            validate_body(body)
        async with self._deadline():
            for _ in range(ETAG_RETRY_COUNT_MAX):
                stored = await self._get(log, txn)
                if stored is None:
                    record = Record(
                        log=log,
                        txn=txn,
                        state=state,
                        body=body if body is not None else RecordBody(),
                        applied=False,
                        created_at_ms=_now_ms(),
                    )
                    if await self._create(record):
                        return state
                    continue  # Created under us: judge the transition against what won.
                check_log_transition(log, txn, stored.record.state, state)
                wanted = replace(
                    stored.record, state=state, body=body if body is not None else stored.record.body
                )
                if wanted == stored.record:
                    return state  # Already stored exactly: an idempotent rewrite costs no write.
                if await self._replace(wanted, stored.etag):
                    return state
            raise StorageUnavailable(
                f"azure_blob: log {log.key}/{txn} lost {ETAG_RETRY_COUNT_MAX} ETag races in a row"
            )

    async def read(self, log: LogId, txn: str) -> Record | None:
        validate_log(log)
        validate_txn(txn)
        async with self._deadline():
            stored = await self._get(log, txn)
        return stored.record if stored is not None else None

    async def _read_unfinished(self, log: LogId, txns: Sequence[str]) -> dict[str, Record]:
        """Read each of `txns` (one request each); those still unfinished, by txn id."""
        stored = await _gather_bounded([lambda txn=txn: self._get(log, txn) for txn in txns])
        return {
            s.record.txn: s.record
            for s in stored
            if s is not None and is_unfinished(s.record.state, s.record.applied)
        }

    async def scan_unfinished(self, log: LogId, limit: int = SCAN_PAGE_COUNT_MAX, after: str = "") -> list[Record]:
        validate_log(log)
        validate_scan_limit(limit)
        validate_scan_after(after)
        prefix = _record_prefix(log)
        found: dict[str, Record] = {}
        async with self._deadline():
            # The listing is in name order; startFrom (inclusive) skips the names of earlier pages.
            # No name is below its own id, so every id above `after` lists at or past it. The id
            # filter below stays: it drops `after` itself and, were startFrom ignored by a service,
            # everything before it.
            blobs = aiter(
                self._container.list_blobs(
                    name_starts_with=prefix, include=["metadata"], start_from=prefix + after if after else None
                )
            )
            last_name = ""
            exhausted = False
            for _ in range(SCAN_ROUND_COUNT_MAX):
                txns: list[str] = []
                while len(found) + len(txns) < limit:
                    blob = await anext(blobs, None)
                    if blob is None:
                        exhausted = True
                        break
                    assert blob.name > last_name, "a listing is in name order"
                    last_name = blob.name
                    txn = _txn_of(prefix, blob.name)
                    if txn <= after:
                        continue
                    # The metadata lets us skip finished records without reading them. A blob
                    # without it (or with a value we do not know) is read rather than skipped, so
                    # nothing unfinished hides.
                    metadata = blob.metadata or {}
                    state_value = metadata.get(_STATE_METADATA, "")
                    applied = metadata.get(_APPLIED_METADATA) == "true"
                    if state_value in TxnState.__members__ and not is_unfinished(TxnState(state_value), applied):
                        continue
                    txns.append(txn)
                # A record finished or collected since it was listed drops out here; the next
                # round refills the page from where the listing stopped.
                found |= await self._read_unfinished(log, txns)
                if exhausted or len(found) == limit:
                    break
            else:
                raise StorageUnavailable(
                    f"azure_blob: scan of {log.key}: records kept finishing under it for {SCAN_ROUND_COUNT_MAX} rounds"
                )
            if not exhausted:
                # The page stops short of the listing's end, so ids below its last one may still
                # lie ahead in name order: only that id's dotted prefixes can (module docstring).
                assert len(found) == limit
                missed = [
                    txn
                    for txn in _dotted_prefixes(max(found))
                    if txn > after and _record_name(log, txn) > last_name
                ]
                found |= await self._read_unfinished(log, missed)
        return [found[txn] for txn in sorted(found)[:limit]]

    async def read_data(self, partition: str, keys: Sequence[str]) -> dict[str, bytes | None]:
        validate_partition(partition)
        checked = validate_data_keys(keys)
        unique = list(dict.fromkeys(checked))

        async def get(key: str) -> bytes | None:
            blob = self._container.get_blob_client(_data_name(partition, key))
            try:
                downloader = await blob.download_blob()
                return await downloader.readall()
            except ResourceNotFoundError:
                return None

        async with self._deadline():
            values = await _gather_bounded([lambda key=key: get(key) for key in unique])
        return dict(zip(unique, values, strict=True))

    async def apply_redo(self, partition: str, txn: str, writes: Mapping[str, bytes | None]) -> bool:
        validate_partition(partition)
        validate_txn(txn)
        checked = validate_writes(writes)
        log = LogId.partition(partition)

        async def put(key: str, value: bytes | None) -> None:
            blob = self._container.get_blob_client(_data_name(partition, key))
            if value is None:
                with contextlib.suppress(ResourceNotFoundError):
                    await blob.delete_blob()
            else:
                await blob.upload_blob(value, overwrite=True)

        async with self._deadline():
            stored = await self._get(log, txn)
            self._check_committed(log, txn, stored)
            assert stored is not None
            if stored.record.applied:
                # Writing again could undo a later txn's writes to the same keys.
                return False
            await _gather_bounded([lambda k=k, v=v: put(k, v) for k, v in checked.items()])
            # The data is in; now the marker. Losing its ETag race (a concurrent applier, or an
            # idempotent log(COMMIT) rewrite) only means we read again and retry the marker.
            for _ in range(ETAG_RETRY_COUNT_MAX):
                assert stored is not None
                if stored.record.applied:
                    return True  # a concurrent applier of this same redo set it: the data is ours too
                if await self._replace(replace(stored.record, applied=True), stored.etag):
                    return True
                stored = await self._get(log, txn)
                self._check_committed(log, txn, stored)
            raise StorageUnavailable(
                f"azure_blob: apply_redo {log.key}/{txn} lost {ETAG_RETRY_COUNT_MAX} ETag races in a row"
            )

    @staticmethod
    def _check_committed(log: LogId, txn: str, stored: _Stored | None) -> None:
        if stored is None:
            raise InvariantViolation(f"apply_redo of {log.key}/{txn}: no record")
        if stored.record.state is not TxnState.COMMIT:
            raise InvariantViolation(f"apply_redo of {log.key}/{txn}: record is {stored.record.state}")

    async def delete(self, log: LogId, txn: str) -> bool:
        validate_log(log)
        validate_txn(txn)
        blob = self._container.get_blob_client(_record_name(log, txn))
        async with self._deadline():
            try:
                await blob.delete_blob()
            except ResourceNotFoundError:
                return False
        return True

    async def close(self) -> None:
        # Container and blob clients share the service's transport; closing it closes them all.
        await self._service.close()

    # Test and operator helpers, not part of the contract.

    async def delete_container(self) -> None:
        """Drop the whole container (test teardown)."""
        async with self._deadline():
            with contextlib.suppress(ResourceNotFoundError):
                await self._container.delete_container()


__all__ = ["AzureBlobStore"]
