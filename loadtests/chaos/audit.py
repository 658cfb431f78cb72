"""Storage audit: every transaction record in every partition log and coordinator log, read through
the storage adapter (`storage_adapters.factory.open_store`, `LogStore.read`), watched during the
run and read once more at the end.

The LogStore contract can list only unfinished records (`scan_unfinished`), and garbage collection
deletes decided records `gc_grace_ms` after every participant acknowledged them. So the auditor
enumerates record keys straight from the backend (Redis: SCAN over `cxtxn:{<log>}:<txn>` hashes;
emulator: the `txn_log` table of the SQLite file, read-only), reads each record it has not seen
decided through the adapter, and snapshots every `interval_s`, well under the GC grace (at least
2 * storage deadline + clock slack), so a record is seen before it is collected. A record that
disappears and comes back (a late call recreating a collected record, which the GC grace exists
to prevent) is recorded as such: a history of GONE followed by its new state.

Reading the backend's key layout ties this module to storage_adapters/redis_store.py and
emulator.py: if those change their layout, enumeration finds nothing and the summary's record
count says so (a run that committed transactions but audited none is reported, not passed).
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

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
# the emulator's worker (QUEUE_COUNT_MAX) or crowd the nodes' own calls.
READ_CONCURRENCY = 64
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
        if self.store_config.backend == "redis":
            return enumerate_redis(self.store_config.redis_url)
        assert self.store_config.backend == "emulator", self.store_config.backend
        return enumerate_emulator(self.store_config.emulator_path)

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

    async def _snapshot(self, store: LogStore, *, full: bool) -> bool:
        """One snapshot; False if it could not list or read every record it meant to."""
        started = time.monotonic()
        try:
            keys = await asyncio.to_thread(self._enumerate)
        except (redis.RedisError, sqlite3.Error, OSError) as error:
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
        semaphore = asyncio.Semaphore(READ_CONCURRENCY)
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
