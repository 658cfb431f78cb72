"""Storage audit: every transaction record in every partition log and coordinator log, read through
the storage adapter (`storage_adapters.factory.open_store`, `LogStore.read`), watched during the
run and read once more at the end.

The LogStore contract can list only unfinished records (`scan_unfinished`), and garbage collection
deletes decided records `gc_grace_ms` after every participant acknowledged them. So the auditor
enumerates record keys straight from the backend (Redis: SCAN over `cxtxn:{<log>}:<txn>` hashes;
emulator: the `txn_log` table of the SQLite file, read-only; Azure Blob: a listing of the
container's `txn/<log>/<txn>` blobs; DynamoDB: a Scan of the table's items whose partition key is
`txn#<log>`), reads each record it has not seen decided through the adapter, and snapshots every
`interval_s`, well under the GC grace (at least 2 * storage deadline + clock slack), so a record is
seen before it is collected. (On Azure Blob and DynamoDB collection leaves a decision tombstone in
the record's place for the backend's 15-minute late-write window, so no record vanishes within a
run there at all.) A record that disappears and comes back (a late call recreating a collected
record, which the GC grace exists to prevent) is recorded as such: a history of GONE followed by
its new state.

Reading the backend's key layout ties this module to storage_adapters/redis_store.py, emulator.py,
azure_blob.py and dynamodb.py (their own name and key helpers are used where they have them): if
those change their layout, enumeration finds nothing and the summary's record count says so (a run
that committed transactions but audited none is reported, not passed); on Azure Blob and DynamoDB a
name under the records' prefix that does not map back to the very blob name or item key the adapter
would give that record is an auditor error, which fails check (c).
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import redis

from storage_adapters.contract import LogId, LogKind, TxnState
from storage_adapters.errors import StorageError
from storage_adapters.factory import StoreConfig, open_store
from storage_adapters.redis_store import TXN_PREFIX
from storage_adapters.store import LogStore

GONE = "GONE"
REDIS_SCAN_COUNT = 1_000
REDIS_TIMEOUT_S = 10.0
SQLITE_TIMEOUT_S = 10.0
# Records read through the adapter at once: enough to hide round trips, few enough not to queue
# the emulator's worker (QUEUE_COUNT_MAX) or crowd the nodes' own calls. DynamoDB's double (moto,
# scripts/moto_serial.py) serves one request at a time: a burst of 64 reads there would queue every
# node's storage call behind it, past their 2 s deadline when moto is slow.
READ_CONCURRENCY = 64
READ_CONCURRENCY_BY_BACKEND = {"dynamodb": 8}
# Per request of the Azure listing and the DynamoDB Scan (sync SDK clients in a worker thread):
# a page is one request, answered in well under a second by a healthy service.
CLOUD_TIMEOUT_S = 10.0
# Attempts per listing or Scan page: one retry rides out a dropped connection; more would only
# delay the snapshot, and the next snapshot tries again anyway.
CLOUD_ATTEMPT_COUNT_MAX = 2
# Bounds on one enumeration: names one Azure listing may walk (a 10-minute run writes some 10^5
# records), and Scan pages (1 MB each) one DynamoDB enumeration may take.
AZURE_LIST_NAME_COUNT_MAX = 5_000_000
AZURE_LIST_PAGE_SIZE = 5_000
DYNAMODB_SCAN_PAGE_COUNT_MAX = 10_000
# Distinct unparsable names reported as auditor errors (each fails check (c)); more are counted.
STRAY_REPORT_COUNT_MAX = 20
READ_ATTEMPT_COUNT_MAX = 5
# Snapshots of one run: a bound on the loop (a 10-minute run at 1 s takes about 700).
SNAPSHOT_COUNT_MAX = 100_000
# `cxtxn:{p.p3}:<txn>` (the braces are Redis Cluster hash tags); index keys hold a '~', which no
# txn id can.
_REDIS_KEY = re.compile(r"^" + re.escape(TXN_PREFIX) + r":\{([pc])\.([^}]+)\}:([^~]+)$")

RecordKey = tuple[str, str]  # (log key such as "p.p3" or "c.n0", txn id)


def _log_id(log_key: str) -> LogId:
    kind, _, name = log_key.partition(".")
    return LogId(LogKind(kind), name)


def enumerate_redis(url: str) -> set[RecordKey]:
    client = redis.Redis.from_url(url, socket_timeout=REDIS_TIMEOUT_S, socket_connect_timeout=REDIS_TIMEOUT_S)
    found: set[RecordKey] = set()
    try:
        for raw in client.scan_iter(match=f"{TXN_PREFIX}:*", count=REDIS_SCAN_COUNT):
            match = _REDIS_KEY.match(raw.decode("utf-8", "replace"))
            if match:
                found.add((f"{match.group(1)}.{match.group(2)}", match.group(3)))
    finally:
        client.close()
    return found


def enumerate_emulator(path: str) -> set[RecordKey]:
    # Read-only: the auditor never takes the file's write lock, which the nodes need.
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=SQLITE_TIMEOUT_S)
    try:
        return {(str(log), str(txn)) for log, txn in connection.execute("SELECT log, txn FROM txn_log")}
    finally:
        connection.close()


class EnumerationError(Exception):
    """A listing of the backend's records failed (its SDK's error, said in one line)."""


# A listing: the records found, and the names under the records' prefix that are no record's.
Listing = tuple[set[RecordKey], list[str]]


def _unsegment(segment: str) -> str:
    """azure_blob's `_segment` inverted: it appends '~' to an id ending in '.' (an id never holds '~')."""
    return segment[:-1] if segment.endswith(".~") else segment


class AzureRecordLister:
    """Lists the record blobs of one container (sync SDK, from the auditor's worker thread): every
    name under the adapter's record prefix, `txn/<log key>/<txn>`, mapped back to (log key, txn) and
    checked against the adapter's own `_record_name` of them."""

    def __init__(self, connection_string: str, container: str) -> None:
        from azure.storage.blob import ContainerClient

        from storage_adapters import azure_blob

        self._layout = azure_blob
        # The adapter names no constant for the records' top prefix, only a per-log one: taken from
        # that, so a changed layout shows as names that do not map back, or as no record at all.
        self.root = azure_blob._record_prefix(LogId.partition("p0")).split("/", 1)[0] + "/"
        self._client = ContainerClient.from_connection_string(
            connection_string, container, connection_timeout=CLOUD_TIMEOUT_S, read_timeout=CLOUD_TIMEOUT_S,
            retry_total=CLOUD_ATTEMPT_COUNT_MAX - 1)

    def record_key(self, name: str) -> RecordKey | None:
        """(log key, txn) of the record blob `name`; None if no record is stored under that name."""
        log_segment, sep, txn_segment = name[len(self.root):].partition("/")
        if not name.startswith(self.root) or not sep:
            return None
        key = (_unsegment(log_segment), _unsegment(txn_segment))
        try:
            log = _log_id(key[0])
            exact = log.kind is not LogKind.CLUSTER and self._layout._record_name(log, key[1]) == name
        except ValueError:  # a log key that is no LogId's (ValidationError is a ValueError)
            return None
        return key if exact else None

    def list_records(self) -> Listing:
        from azure.core.exceptions import AzureError

        found: set[RecordKey] = set()
        strays: list[str] = []
        try:
            names = self._client.list_blobs(name_starts_with=self.root, results_per_page=AZURE_LIST_PAGE_SIZE)
            for count, blob in enumerate(names, 1):
                if count > AZURE_LIST_NAME_COUNT_MAX:
                    raise EnumerationError(f"more than {AZURE_LIST_NAME_COUNT_MAX} blobs under {self.root!r}")
                key = self.record_key(blob.name)
                if key is None:
                    strays.append(blob.name)
                else:
                    found.add(key)
        except AzureError as error:
            # The SDK's message goes on with the whole XML answer: its first line says it.
            first_line = (str(error).splitlines() or [""])[0]
            raise EnumerationError(f"azure list_blobs: {type(error).__name__}: {first_line}") from error
        return found, strays

    def close(self) -> None:
        self._client.close()


class DynamoDbRecordLister:
    """Scans one table (sync botocore client, from the auditor's worker thread) for the record items,
    partition key `txn#<log key>` and sort key the txn id, each checked against the adapter's own
    `_record_key` of them. The cluster record (log kind `k`) is no transaction's: left out, as on Redis."""

    def __init__(self, endpoint: str, region: str, table: str) -> None:
        import botocore.session
        from botocore.config import Config

        from storage_adapters import dynamodb

        self._layout = dynamodb
        self.prefix = dynamodb._TXN_PK_PREFIX
        self.table = table
        # The adapter's credentials: moto keys its accounts by them, so other ones would see an
        # empty, different table of the same name.
        key_id, secret = ("testing", "testing") if dynamodb._is_local(endpoint) else (None, None)
        self._client = botocore.session.get_session().create_client(
            "dynamodb", endpoint_url=endpoint, region_name=region, aws_access_key_id=key_id,
            aws_secret_access_key=secret,
            config=Config(connect_timeout=CLOUD_TIMEOUT_S, read_timeout=CLOUD_TIMEOUT_S,
                          retries={"total_max_attempts": CLOUD_ATTEMPT_COUNT_MAX, "mode": "standard"}))

    def record_key(self, item: dict[str, Any]) -> RecordKey | None:
        """(log key, txn) of a scanned item's key; None if it is not a transaction record's."""
        pk, sk = item["pk"]["S"], item["sk"]["S"]
        try:
            log = _log_id(pk[len(self.prefix):])
            exact = self._layout._record_key(log, sk) == {"pk": {"S": pk}, "sk": {"S": sk}}
        except ValueError:
            return None
        if log.kind is LogKind.CLUSTER:
            return None
        return (log.key, sk) if exact else None

    def list_records(self) -> Listing:
        from botocore.exceptions import BotoCoreError, ClientError

        found: set[RecordKey] = set()
        strays: list[str] = []
        request: dict[str, Any] = {
            "TableName": self.table, "ProjectionExpression": "#pk, #sk",
            "FilterExpression": "begins_with(#pk, :prefix)",
            "ExpressionAttributeNames": {"#pk": "pk", "#sk": "sk"},
            "ExpressionAttributeValues": {":prefix": {"S": self.prefix}}, "ConsistentRead": True,
        }
        try:
            for _ in range(DYNAMODB_SCAN_PAGE_COUNT_MAX):
                response = self._client.scan(**request)
                for item in response.get("Items", []):
                    key = self.record_key(item)
                    if key is not None:
                        found.add(key)
                    elif not item["pk"]["S"].startswith(f"{self.prefix}{LogKind.CLUSTER.value}."):
                        strays.append(f"{item['pk']['S']} / {item['sk']['S']}")
                last = response.get("LastEvaluatedKey")
                if not last:
                    return found, strays
                request["ExclusiveStartKey"] = last
        except (BotoCoreError, ClientError) as error:
            raise EnumerationError(f"dynamodb scan: {type(error).__name__}: {error}") from error
        raise EnumerationError(f"dynamodb scan of {self.table} took more than {DYNAMODB_SCAN_PAGE_COUNT_MAX} pages")

    def close(self) -> None:
        self._client.close()


@dataclass(slots=True)
class AuditState:
    # txn -> log key -> states seen, in order, consecutive repeats folded; GONE where it vanished
    # and later came back.
    history: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    # Records present in the latest snapshot, with their latest state.
    present: dict[RecordKey, str] = field(default_factory=dict)
    snapshot_count: int = 0
    read_count: int = 0
    errors: list[str] = field(default_factory=list)
    last_snapshot_s: float = 0.0
    # Present COMMIT records whose redo is not marked applied, as last read (a COMMIT tombstone reads
    # as applied; a coordinator log's COMMIT never is, so only a partition log's one means anything).
    unapplied: set[RecordKey] = field(default_factory=set)
    # Whether the last, full snapshot (`Auditor.final`) completed: the final-state checks read it.
    final_done: bool = False

    def seen(self, key: RecordKey, state: str) -> None:
        states = self.history.setdefault(key[1], {}).setdefault(key[0], [])
        if not states or states[-1] != state:
            states.append(state)

    def decisions(self, txn: str) -> set[str]:
        return {s for states in self.history.get(txn, {}).values() for s in states
                if s in (TxnState.COMMIT.value, TxnState.ABORT.value)}


class Auditor:
    """Snapshots storage from its own thread (and event loop) until stopped; `final()` takes a last
    full snapshot in which every present record is read again."""

    def __init__(self, store_config: StoreConfig, interval_s: float) -> None:
        self.store_config = store_config
        self.interval_s = interval_s
        self.state = AuditState()
        self._stop = threading.Event()
        self._final = threading.Event()
        self._final_done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="auditor", daemon=True)
        self._lock = threading.Lock()
        # The Azure or DynamoDB lister, made at the first enumeration and kept (a botocore client
        # costs a noticeable share of a second of CPU to make: not once a snapshot).
        self._lister: AzureRecordLister | DynamoDbRecordLister | None = None
        self._strays_seen: set[str] = set()

    def start(self) -> None:
        self._thread.start()

    def final(self, timeout_s: float) -> bool:
        """A last, full snapshot, then the auditor ends. False if it did not finish in time."""
        self._final.set()
        self._stop.set()
        done = self._final_done.wait(timeout_s)
        self._thread.join(max(0.0, timeout_s))
        return done

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _enumerate(self) -> set[RecordKey]:
        config = self.store_config
        if config.backend == "redis":
            return enumerate_redis(config.redis_url)
        if config.backend == "emulator":
            return enumerate_emulator(config.emulator_path)
        if self._lister is None:
            if config.backend == "azure_blob":
                self._lister = AzureRecordLister(config.azure_connection_string, config.azure_container)
            else:
                assert config.backend == "dynamodb", config.backend
                assert config.dynamodb_endpoint, "the auditor reaches DynamoDB by its endpoint"
                self._lister = DynamoDbRecordLister(config.dynamodb_endpoint, config.dynamodb_region,
                                                    config.dynamodb_table)
        keys, strays = self._lister.list_records()
        for stray in strays:
            # Under the records' prefix, yet no record's name as the adapter writes it: the layout
            # changed, or something else writes there. Either way the audit may be blind to records.
            if stray not in self._strays_seen:
                self._strays_seen.add(stray)
                if len(self._strays_seen) <= STRAY_REPORT_COUNT_MAX:
                    self.state.errors.append(f"enumeration: {stray!r} is under the records' prefix but maps to "
                                             f"no record name of the adapter (layout changed?)")
        return keys

    def _close_lister(self) -> None:
        if self._lister is not None:
            self._lister.close()
            self._lister = None

    def _run(self) -> None:
        try:
            asyncio.run(self._loop())
        except BaseException as error:  # any death (CancelledError too) must show in the checks
            self.state.errors.append(f"auditor stopped: {type(error).__name__}: {error}")
        finally:
            self._final_done.set()

    async def _loop(self) -> None:
        store = await open_store(self.store_config)
        try:
            for _ in range(SNAPSHOT_COUNT_MAX):
                started = time.monotonic()
                final = self._final.is_set()
                completed = await self._snapshot(store, full=final)
                if final:
                    self.state.final_done = completed
                    return
                if self._stop.is_set() and not self._final.is_set():
                    return
                await asyncio.get_running_loop().run_in_executor(
                    None, self._stop.wait, max(0.0, self.interval_s - (time.monotonic() - started)))
        finally:
            await store.close()
            await asyncio.to_thread(self._close_lister)

    async def _snapshot(self, store: LogStore, *, full: bool) -> bool:
        """One snapshot; False if it could not list or read every record it meant to."""
        started = time.monotonic()
        try:
            keys = await asyncio.to_thread(self._enumerate)
        except (redis.RedisError, sqlite3.Error, OSError, EnumerationError) as error:
            self.state.errors.append(f"enumeration failed: {type(error).__name__}: {error}")
            return False
        state = self.state
        # A record seen decided is final for this record (every backend refuses a decision flip in
        # place); it is read again only if it vanished and came back, or in the final snapshot.
        # A COMMIT not applied yet is read again too, so that `unapplied` follows its apply.
        wanted = [key for key in keys
                  if full or key not in state.present or state.present[key] == TxnState.VOTE_YES.value
                  or key in state.unapplied]
        results = await self._read_all(store, wanted)
        for key in set(state.present) - keys:
            del state.present[key]
            state.unapplied.discard(key)
        for key, read in results.items():
            if read is None:
                # Deleted between enumeration and read: the next snapshot will not list it.
                state.present.pop(key, None)
                state.unapplied.discard(key)
                continue
            value, applied = read
            if key not in state.present and state.history.get(key[1], {}).get(key[0]):
                state.seen(key, GONE)  # it was collected once, and is back
            state.seen(key, value)
            state.present[key] = value
            if value == TxnState.COMMIT.value and not applied:
                state.unapplied.add(key)
            else:
                state.unapplied.discard(key)
        state.snapshot_count += 1
        state.read_count += len(wanted)
        state.last_snapshot_s = time.monotonic() - started
        return len(results) == len(wanted)

    async def _read_all(self, store: LogStore,
                        keys: Iterable[RecordKey]) -> dict[RecordKey, tuple[str, bool] | None]:
        """Per key read: (state, applied), None if absent; a key whose reads all failed is left out
        (and said in `errors`)."""
        semaphore = asyncio.Semaphore(READ_CONCURRENCY_BY_BACKEND.get(self.store_config.backend, READ_CONCURRENCY))
        results: dict[RecordKey, tuple[str, bool] | None] = {}

        async def read_one(key: RecordKey) -> None:
            async with semaphore:
                for attempt in range(READ_ATTEMPT_COUNT_MAX):
                    try:
                        record = await store.read(_log_id(key[0]), key[1])
                    except StorageError as error:
                        if attempt + 1 == READ_ATTEMPT_COUNT_MAX:
                            self.state.errors.append(f"read {key}: {type(error).__name__}: {error}")
                        continue
                    results[key] = None if record is None else (record.state.value, record.applied)
                    return

        await asyncio.gather(*(read_one(key) for key in keys))
        return results
