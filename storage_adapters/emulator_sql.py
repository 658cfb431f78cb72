"""The emulator's SQL: the schema, opening a file, and each call of the storage contract as a
function of a SQLite connection. Shared by the two places that run them: the node process's
reader thread (storage_adapters/emulator.py) and the file's single writer process
(storage_adapters/emulator_writer.py), which runs every write by name (`WRITES`), so a write
travels between processes as a name and its arguments.

The writes take and return their wire form: plain strings, bytes, ints, bools, tuples, a dict
and None, never the contract's dataclasses and enums, since every write and its answer is pickled
twice (to the writer and back) and a pickle of plain values costs a tenth of one of those (about
0.7 us a frame, against 10 us each way for a log_once). The forms (`LogKey`, `BodyWire`,
`FenceWire`, `TombstoneWire`, `OwnershipWire`, a TxnState as its value) are made by the functions
below from arguments the store has validated, and the writer does not rebuild or re-validate
them: its callers are processes of its own user that run its own code (emulator_writer.py
`hello_problem`). A malformed value fails its own call (SQLite cannot bind it, or it does not
unpack). What SQLite would store and leave behind is refused: a state that is no TxnState's
value (every read of the record would trip over it), and a tombstone's keep that is no decision
and keep_ms in range (a text expiry compares above every integer in SQLite: the purge would never
drop it). Only a refusal builds contract objects: Fenced, DecisionFlipRefused and
InvariantViolation carry them to the caller, pickled as before (errors.py `__reduce__`).

A tombstone (LogStore.delete with keep) is a txn_log row like any record, the decision alone, its
`expires_at_ms` the wall-clock time from which the writer's purge (`purge_expired`) may delete
it; that column is NULL on every other row. A file made before the column existed gets it when
its writer opens it (`connect`). That is one way: a writer of a version from before (2026-11-26)
inserts rows without naming their columns, and fails every write on an upgraded file. To go back
to such a version, first run `DROP INDEX txn_log_expiry; ALTER TABLE txn_log DROP COLUMN
expires_at_ms` on the file with no node running (tombstones then stay until collected by hand).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from storage_adapters.contract import (
    IDENTITY_PREFIX,
    TOMBSTONE_KEEP_MS_MAX,
    Fence,
    LogId,
    LogKind,
    Ownership,
    PageBytes,
    Record,
    RecordBody,
    Tombstone,
    TxnState,
    check_log_transition,
    check_tombstone,
)
from storage_adapters.errors import Fenced, InvariantViolation, StorageError, StorageUnavailable, ValidationError

# Opening retries lock contention between processes that set up a fresh file at once.
OPEN_RETRY_COUNT_MAX = 64
OPEN_BACKOFF_MS_MIN = 5
OPEN_BACKOFF_MS_MAX = 200
# A write whose deadline is closer than this when its turn comes in a batch is refused unwritten.
# The batch's COMMIT must start before the deadline of every write in it (else the whole batch is
# rolled back, see `run_batch`), so a write admitted with less time left than the rest of its
# batch takes would cost every other write of the batch its answer.
TURN_TIME_LEFT_MS_MIN = 5

_SCHEMA = """
CREATE TABLE IF NOT EXISTS txn_log (
    log TEXT NOT NULL,
    txn TEXT NOT NULL,
    state TEXT NOT NULL,
    participants TEXT NOT NULL,
    coordinator TEXT NOT NULL,
    redo BLOB NOT NULL,
    applied INTEGER NOT NULL,
    created_at_ms INTEGER NOT NULL,
    expires_at_ms INTEGER,
    PRIMARY KEY (log, txn)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS txn_log_unfinished ON txn_log (log)
    WHERE state = 'VOTE_YES' OR (state = 'COMMIT' AND applied = 0);
CREATE TABLE IF NOT EXISTS ownership (
    partition TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    version INTEGER NOT NULL,
    lease_ms INTEGER NOT NULL,
    wanted_by TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS data (
    partition TEXT NOT NULL,
    key TEXT NOT NULL,
    value BLOB NOT NULL,
    PRIMARY KEY (partition, key)
) WITHOUT ROWID;
"""

# A tombstone's expiry (see the module docstring), added after the first files were made: the
# writer adds the column to such a file (`_create_schema`), and then the purge's index over it,
# which holds only tombstones (a purge round reads only rows it deletes). The index is made in
# the transaction that adds the column, so a file that has the index has the column.
_ADD_EXPIRY_COLUMN = "ALTER TABLE txn_log ADD COLUMN expires_at_ms INTEGER"
_EXPIRY_INDEX = (
    "CREATE INDEX IF NOT EXISTS txn_log_expiry ON txn_log (expires_at_ms) WHERE expires_at_ms IS NOT NULL"
)

# What a reader needs (every version's file has it: its reads name no column added since), and
# what the writer needs.
_SCHEMA_NAMES_READ = frozenset({"txn_log", "txn_log_unfinished", "ownership", "data"})
_SCHEMA_NAMES = _SCHEMA_NAMES_READ | {"txn_log_expiry"}

_RECORD_COLUMNS = "log, txn, state, participants, coordinator, redo, applied, created_at_ms"
_OWNERSHIP_COLUMNS = "partition, owner, epoch, version, lease_ms, wanted_by"

# The wire forms of the contract's objects (see the module docstring).
LogKey = str  # LogId.key: "<kind>.<name>", the txn_log table's `log` column
BodyWire = tuple[tuple[str, ...], str, bytes]  # RecordBody: (participants, coordinator, redo)
FenceWire = tuple[str, str, int]  # Fence: (partition, owner, epoch)
OwnershipWire = tuple[str, str, int, int, int, str]  # Ownership: its fields in order, as _OWNERSHIP_COLUMNS
TombstoneWire = tuple[str, int]  # Tombstone: (decision value, keep_ms)
DeleteWire = tuple[LogKey, str, FenceWire | None, TombstoneWire | None]  # one delete of delete_many, as `delete`'s

_STATE_VALUES = frozenset(state.value for state in TxnState)
_VOTE_YES = TxnState.VOTE_YES.value
_COMMIT = TxnState.COMMIT.value
_DECISION_VALUES = frozenset(state.value for state in TxnState if state.is_decision)
_PARTITION_LOG_PREFIX = f"{LogKind.PARTITION.value}."  # a partition's LogKey less its name


def is_lock_contention(error: sqlite3.OperationalError) -> bool:
    message = str(error).lower()
    return "locked" in message or "busy" in message


def connect(path: Path, timeout_ms: int, *, upgrade: bool = True) -> sqlite3.Connection:
    """A connection to `path` in WAL mode with `synchronous=FULL` and the schema in place.
    Processes that open a fresh file together race to switch it to WAL and create the schema.
    Some of those lock upgrades fail with "database is locked" at once, without waiting on
    busy_timeout (SQLite refuses to wait where waiting could deadlock), so the whole setup is
    retried with backoff until `timeout_ms` has passed.

    A file made by an earlier version (no tombstone expiry) is brought up to date unless
    `upgrade` is False: a node's reader passes False, since its reads name no column added since,
    and leaves the upgrade to the file's writer, which opens the file holding the writer lock. So
    a file is never changed under an earlier version's writer that still serves it (its inserts
    name no columns, and fail on a table with one more). Processes that upgrade together are
    safe as ones that create the schema together: each looks again under the write lock."""
    deadline = time.monotonic() + timeout_ms / 1000
    backoff_ms = OPEN_BACKOFF_MS_MIN
    for _attempt in range(OPEN_RETRY_COUNT_MAX):
        # isolation_level=None: we issue BEGIN/COMMIT ourselves, so batching is explicit.
        conn = sqlite3.connect(path, timeout=timeout_ms / 1000, isolation_level=None)
        try:
            _set_up(conn, timeout_ms, upgrade)
            return conn
        except sqlite3.OperationalError as error:
            conn.close()
            if not is_lock_contention(error) or time.monotonic() + backoff_ms / 1000 > deadline:
                raise
        time.sleep(backoff_ms / 1000)
        backoff_ms = min(backoff_ms * 2, OPEN_BACKOFF_MS_MAX)
    raise sqlite3.OperationalError(f"database is locked after {OPEN_RETRY_COUNT_MAX} attempts")


def _set_up(conn: sqlite3.Connection, timeout_ms: int, upgrade: bool) -> None:
    conn.execute(f"PRAGMA busy_timeout = {int(timeout_ms)}")
    # Switching to WAL takes an exclusive lock, so only the first opener of a file does it;
    # WAL is persistent in the file, and later openers only read the mode.
    if conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        assert mode.lower() == "wal", f"SQLite refused WAL mode: {mode}"
    # FULL: in WAL mode NORMAL may lose the last commits on power loss, and an acknowledged
    # VOTE_YES must never be lost (a terminator could then log ABORT after a COMMIT reply).
    conn.execute("PRAGMA synchronous = FULL")
    # A file that has the schema needs no write lock to open: a store (or the writer process)
    # opens it while another program holds SQLite's write lock, and waits only when it writes.
    present = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    if present >= (_SCHEMA_NAMES if upgrade else _SCHEMA_NAMES_READ):
        return
    # Here also a reader, only on a file with none of the schema: every version made all of it
    # in one transaction.
    with _write_transaction(conn):
        _create_schema(conn)


@contextlib.contextmanager
def _write_transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """One transaction under the write lock (BEGIN IMMEDIATE), committed if the block returns and
    rolled back if it raises anything, a cancellation too."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        raise


def _create_schema(conn: sqlite3.Connection) -> None:
    """The schema, and on a file made by an earlier version what it lacks, inside the caller's
    write transaction: what is there is looked at under the write lock, so processes that race
    to set up (or upgrade) one file each find the others' work done, or do it alone."""
    for statement in _SCHEMA.split(";"):
        if statement.strip():
            conn.execute(statement)  # IF NOT EXISTS: racing processes may all run it
    columns = {row[1] for row in conn.execute("PRAGMA table_info(txn_log)")}
    if "expires_at_ms" not in columns:
        conn.execute(_ADD_EXPIRY_COLUMN)  # a NULL expiry on every record there: none is a tombstone
    conn.execute(_EXPIRY_INDEX)


# SQLite errors that a call's own arguments cause (a value SQLite cannot bind, a constraint): the
# statement did not run, so the call alone fails. Any other (locked, I/O, full disk) leaves the
# transaction in doubt, and the batch with it.
_CALLS_OWN_SQLITE_ERRORS = (sqlite3.InterfaceError, sqlite3.ProgrammingError, sqlite3.DataError, sqlite3.IntegrityError)


def run_batch(
    conn: sqlite3.Connection,
    calls: Sequence[Callable[[sqlite3.Connection], Any]],
    *,
    writes: bool,
    deadlines: Sequence[float] | None = None,
) -> list[tuple[bool, Any]]:
    """Run `calls` in ONE SQLite transaction (group commit: one fsync makes the batch durable),
    each under its own savepoint, so each gets exactly the answer it would get alone and a
    refused call writes nothing. Returns (ok, result or error) per call, in order.

    With `deadlines` (one per call, `time.monotonic()` seconds), a call whose deadline has passed
    (or is closer than TURN_TIME_LEFT_MS_MIN) when its turn comes is refused unwritten, and the
    COMMIT starts only before the deadline of every call that wrote, else the whole batch is
    rolled back and every call refused. So a write lands no later than its deadline plus the
    COMMIT of its batch (its WAL append and fsync: about a millisecond, and for the largest legal
    call, a 64 MiB redo, a few hundred ms), inside the clock slack that
    cornus/protocol/config.py `gc_grace_ms_min` allows a late storage call (1000 ms by default),
    unless the disk stalls or the writer is starved of CPU past it: nothing bounds the COMMIT's
    fsync. Then too SQLite's write lock orders it before any later write (a delete, a
    termination's LogOnce, an ownership take), and any read after an answered write sees it; only
    a read made while it stalls (the status call's) may miss it (found by audit: said "well
    inside" with no bound).

    A call that raises StorageError (refused) or AssertionError (a bug: it crashes its caller
    loudly) answers with it; any other exception is a bug too (a bad argument, one SQLite could
    not bind among them), answered as a StorageError that names it, since its caller may live in
    another process that cannot rebuild it. Any other SQLite error leaves the transaction in
    doubt: every call of the batch is then StorageUnavailable."""
    assert deadlines is None or len(deadlines) == len(calls)
    turn_left_s = TURN_TIME_LEFT_MS_MIN / 1000
    results: list[tuple[bool, Any]] = []
    try:
        conn.execute("BEGIN IMMEDIATE" if writes else "BEGIN")
        for index, call in enumerate(calls):
            if deadlines is not None and time.monotonic() > deadlines[index] - turn_left_s:
                results.append((False, StorageUnavailable("the write waited past its deadline for its turn")))
                continue
            conn.execute("SAVEPOINT call")
            try:
                results.append((True, call(conn)))
                conn.execute("RELEASE call")
            except Exception as error:
                if isinstance(error, sqlite3.Error) and not isinstance(error, _CALLS_OWN_SQLITE_ERRORS):
                    raise  # the transaction is in doubt: the whole batch fails below
                # A refused call writes nothing and is its caller's error alone.
                conn.execute("ROLLBACK TO call")
                conn.execute("RELEASE call")
                if not isinstance(error, StorageError | AssertionError):
                    error = StorageError(f"emulator: the call raised {type(error).__name__}: {error}")
                results.append((False, error))
        if deadlines is not None:
            wrote = [deadline for deadline, (ok, _) in zip(deadlines, results, strict=True) if ok]
            if wrote and time.monotonic() > min(wrote):
                conn.execute("ROLLBACK")
                late = "the emulator's batch ran past a write's deadline: nothing of it was written"
                return [(False, StorageUnavailable(late)) for _ in calls]
        conn.execute("COMMIT")
    except sqlite3.Error as error:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        # One exception per call: an exception raised in several callers would collect all their
        # tracebacks.
        return [(False, StorageUnavailable(f"SQLite: {error}")) for _ in calls]
    assert len(results) == len(calls)
    return results


def body_wire(body: RecordBody) -> BodyWire:
    return body.participants, body.coordinator, body.redo


def fence_wire(fence: Fence | None) -> FenceWire | None:
    return None if fence is None else (fence.partition, fence.owner, fence.epoch)


def tombstone_wire(keep: Tombstone | None) -> TombstoneWire | None:
    return None if keep is None else (keep.decision.value, keep.keep_ms)


def ownership_wire(record: Ownership | None) -> OwnershipWire | None:
    if record is None:
        return None
    return record.partition, record.owner, record.epoch, record.version, record.lease_ms, record.wanted_by


def partition_log_key(partition: str) -> LogKey:
    """LogId.partition(partition).key, without building the LogId."""
    return _PARTITION_LOG_PREFIX + partition


# What `log` creates a record with when it is given no body; and as columns (participants,
# coordinator, redo), all a tombstone holds of one.
_BODY_DEFAULT = body_wire(RecordBody())
_TOMBSTONE_BODY_COLUMNS = (json.dumps(_BODY_DEFAULT[0]), *_BODY_DEFAULT[1:])


# The interned LogId of a name, by its kind's value (the part of a LogKey before the dot).
_LOG_IDS_BY_KIND: dict[str, Callable[[str], LogId]] = {
    LogKind.PARTITION.value: LogId.partition,
    LogKind.COORDINATOR.value: LogId.coordinator,
    LogKind.CLUSTER.value: lambda name: LogId(LogKind.CLUSTER, name),
}


def _log_id(log: LogKey) -> LogId:
    """The LogId whose key is `log`: the reader's records name it, and so does a refused `log`."""
    kind, _, name = log.partition(".")
    return _LOG_IDS_BY_KIND[kind](name)


def _now_ms() -> int:
    return int(time.time() * 1000)


# The purge's clock: the wall clock, but advancing no faster than the monotonic clock since this
# process began (found by review: a step forward, NTP's or a resumed VM's, purged tombstones at
# once, and a late LogOnce(ABORT) then met an empty slot). A step forward only keeps tombstones
# longer; one taken before this process started is beyond it (the expiries are wall-clock times).
_WALL_MS_AT_START = time.time() * 1000
_MONOTONIC_S_AT_START = time.monotonic()


def _purge_now_ms() -> int:
    elapsed_ms = (time.monotonic() - _MONOTONIC_S_AT_START) * 1000
    return int(min(time.time() * 1000, _WALL_MS_AT_START + elapsed_ms))


def _record_from_row(row: tuple[Any, ...]) -> Record:
    log_key, txn, state, participants, coordinator, redo, applied, created_at_ms = row
    return Record(
        log=_log_id(log_key),
        txn=txn,
        state=TxnState(state),
        body=RecordBody(tuple(json.loads(participants)), coordinator, bytes(redo)),
        applied=bool(applied),
        created_at_ms=created_at_ms,
    )


def _insert_record(conn: sqlite3.Connection, log: LogKey, txn: str, state: str, body: BodyWire) -> bool:
    participants, coordinator, redo = body
    # The columns named: a file upgraded by ALTER TABLE and a fresh one agree only on those.
    cursor = conn.execute(
        f"INSERT INTO txn_log ({_RECORD_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, 0, ?) ON CONFLICT (log, txn) DO NOTHING",
        (log, txn, state, json.dumps(participants), coordinator, redo, _now_ms()),
    )
    return cursor.rowcount == 1


def _select_owner(conn: sqlite3.Connection, partition: str) -> Ownership | None:
    row = conn.execute(f"SELECT {_OWNERSHIP_COLUMNS} FROM ownership WHERE partition = ?", (partition,)).fetchone()
    return None if row is None else Ownership(*row)


def _check_state(state: str) -> None:
    # SQLite would store any string, and every later read of the record would fail on it.
    if state not in _STATE_VALUES:
        raise ValidationError(f"state must be one of {sorted(_STATE_VALUES)}, got {state!r:.50}")


def _check_fence(conn: sqlite3.Connection, fence: FenceWire | None) -> None:
    """Raise Fenced unless the fence holds: the ownership record names its owner at its epoch
    (Fence.admits, compared on the columns: no Ownership is built for a write that passes).
    Every write runs under the write lock taken by BEGIN IMMEDIATE, so no take of the partition
    can slip between this read and the write."""
    if fence is None:
        return
    partition, owner, epoch = fence
    row = conn.execute("SELECT owner, epoch FROM ownership WHERE partition = ?", (partition,)).fetchone()
    if row is None or row[0] != owner or row[1] != epoch:
        raise _fenced(conn, fence)


def _fenced(conn: sqlite3.Connection, fence: FenceWire) -> Fenced:
    """The refusal of a write under `fence`, with the contract's objects its caller reads."""
    refused = Fence(*fence)
    stored = _select_owner(conn, refused.partition)
    assert not refused.admits(stored), f"_check_fence refused a fence that Fence.admits: {refused}, {stored}"
    return Fenced(refused, stored)


# --- reads (the node's reader thread) ----------------------------------------------------------


def read(conn: sqlite3.Connection, log: LogId, txn: str) -> Record | None:
    row = conn.execute(
        f"SELECT {_RECORD_COLUMNS} FROM txn_log WHERE log = ? AND txn = ?", (log.key, txn)
    ).fetchone()
    return None if row is None else _record_from_row(row)


def scan_unfinished(conn: sqlite3.Connection, log: LogId, limit: int, after: str) -> tuple[list[Record], bool]:
    """The page's records, and whether it ended at SCAN_PAGE_BYTES_MAX: rows are stepped one at a
    time, so a page of large records stops reading once full."""
    # One statement, so the page is one snapshot; txn is TEXT with the BINARY collation, so
    # `>` and ORDER BY compare the ASCII ids bytewise, the contract's order.
    rows = conn.execute(
        f"SELECT {_RECORD_COLUMNS} FROM txn_log WHERE log = ? AND txn > ? "
        "AND (state = 'VOTE_YES' OR (state = 'COMMIT' AND applied = 0)) ORDER BY txn LIMIT ?",
        (log.key, after, limit),
    )
    records: list[Record] = []
    page_bytes = PageBytes()
    try:
        for row in rows:
            records.append(_record_from_row(row))
            if page_bytes.add(records[-1]):
                return records, True
    finally:
        rows.close()
    return records, False


# Rows one scan_finished page steps through at most: a log's records past the cursor include
# tombstones and unfinished ones the page skips, and one call must end within its deadline however
# many there are (as azure_blob's and dynamodb's walks do).
FINISHED_WALK_ROW_COUNT_MAX = 10_000


def scan_finished(conn: sqlite3.Connection, log: LogId, limit: int, after: str) -> tuple[list[Record], str | None]:
    """LogStore.scan_finished_page's records (no redo: the empty blob is selected in its place)
    and where the next page starts. One statement, so the page is one snapshot; the rows it steps
    through stop at FINISHED_WALK_ROW_COUNT_MAX, where the next page resumes."""
    rows = conn.execute(
        "SELECT log, txn, state, participants, coordinator, x'', applied, created_at_ms, "
        "expires_at_ms IS NULL FROM txn_log WHERE log = ? AND txn > ? ORDER BY txn LIMIT ?",
        (log.key, after, FINISHED_WALK_ROW_COUNT_MAX),
    )
    records: list[Record] = []
    walked, last = 0, after
    try:
        for row in rows:
            walked, last = walked + 1, row[1]
            state, applied, not_tombstone = row[2], row[6], row[8]
            if not_tombstone and (state == "ABORT" or (state == "COMMIT" and applied)):
                records.append(_record_from_row(row[:8]))
                if len(records) == limit:
                    return records, last
    finally:
        rows.close()
    return records, last if walked == FINISHED_WALK_ROW_COUNT_MAX else None


def read_data(conn: sqlite3.Connection, partition: str, keys: tuple[str, ...]) -> dict[str, bytes | None]:
    found: dict[str, bytes | None] = dict.fromkeys(keys)
    for key in keys:
        row = conn.execute("SELECT value FROM data WHERE partition = ? AND key = ?", (partition, key)).fetchone()
        found[key] = None if row is None else bytes(row[0])
    return found


def read_owners(conn: sqlite3.Connection, partitions: tuple[str, ...]) -> dict[str, Ownership]:
    found = (_select_owner(conn, partition) for partition in partitions)
    return {record.partition: record for record in found if record is not None}


# Identity records are the ownership rows whose name lies in [IDENTITY_PREFIX, _IDENTITY_END):
# every name with the prefix sorts at or above it and below the prefix with its last character
# raised by one (';' after ':'), so `partition > ? AND partition < ?` is one range of the
# ownership table's primary key, which SQLite searches rather than scans (`LIST_IDENTITIES`'s plan
# is checked by tests/storage/test_identities.py). A LIKE or substr() test would scan the table.
_IDENTITY_END = IDENTITY_PREFIX[:-1] + chr(ord(IDENTITY_PREFIX[-1]) + 1)
LIST_IDENTITIES = (
    "SELECT partition FROM ownership WHERE partition > ? AND partition < ? ORDER BY partition LIMIT ?"
)


def list_identities(conn: sqlite3.Connection, after: str, limit: int) -> list[str]:
    """LogStore.list_identities: the ownership table holds the identity records themselves, so
    the listing is one range read of its key. `partition` is TEXT with the BINARY collation, so
    `>` and ORDER BY compare bytes, the contract's order for ASCII ids; the prefix is the same on
    every name, so the names' order is their node ids'."""
    rows = conn.execute(LIST_IDENTITIES, (IDENTITY_PREFIX + after, _IDENTITY_END, limit)).fetchall()
    nodes = [row[0][len(IDENTITY_PREFIX) :] for row in rows]
    assert len(nodes) <= limit and all(node > after for node in nodes), (after, limit, nodes)
    return nodes


# --- writes (the file's writer process, by name) -----------------------------------------------


def log_once(  # noqa: PLR0917 - the contract call's own arguments, in its order: they travel as one tuple
    conn: sqlite3.Connection, log: LogKey, txn: str, state: str, body: BodyWire, fence: FenceWire | None
) -> tuple[str, bool]:
    """LogStore.log_once; answers (the stored state's value, whether this call created it)."""
    _check_state(state)
    _check_fence(conn, fence)
    if _insert_record(conn, log, txn, state, body):
        return state, True
    row = conn.execute("SELECT state FROM txn_log WHERE log = ? AND txn = ?", (log, txn)).fetchone()
    assert row is not None, "insert conflicted, so the record exists"
    return row[0], False


def log(  # noqa: PLR0917 - as log_once
    conn: sqlite3.Connection, log: LogKey, txn: str, state: str, body: BodyWire | None, fence: FenceWire | None
) -> str:
    """LogStore.log; answers the state's value written."""
    _check_state(state)
    _check_fence(conn, fence)
    row = conn.execute("SELECT state FROM txn_log WHERE log = ? AND txn = ?", (log, txn)).fetchone()
    stored = None if row is None else row[0]
    if stored is not None and stored != state:
        # Creating a record and rewriting its state need no check; the rule for the rest stays
        # in the contract, which raises DecisionFlipRefused with the contract's objects.
        check_log_transition(_log_id(log), txn, TxnState(stored), TxnState(state))
    if stored is None:
        created = _insert_record(conn, log, txn, state, _BODY_DEFAULT if body is None else body)
        assert created, "the write lock is held, so nobody created it since the read"
    elif body is None:
        conn.execute("UPDATE txn_log SET state = ? WHERE log = ? AND txn = ?", (state, log, txn))
    else:
        participants, coordinator, redo = body
        conn.execute(
            "UPDATE txn_log SET state = ?, participants = ?, coordinator = ?, redo = ? WHERE log = ? AND txn = ?",
            (state, json.dumps(participants), coordinator, redo, log, txn),
        )
    return state


def apply_redo(
    conn: sqlite3.Connection, partition: str, txn: str, writes: dict[str, bytes | None], fence: FenceWire | None
) -> bool:
    """LogStore.apply_redo; `writes` travels as the store validated it, a dict of str and bytes."""
    log = partition_log_key(partition)
    _check_fence(conn, fence)
    row = conn.execute("SELECT state, applied FROM txn_log WHERE log = ? AND txn = ?", (log, txn)).fetchone()
    if row is None or row[0] not in (_VOTE_YES, _COMMIT):
        stored = "absent" if row is None else row[0]
        raise InvariantViolation(
            f"apply_redo of txn {txn!r} on {partition!r}: record is {stored}, not VOTE_YES or COMMIT"
        )
    if row[1]:
        return False  # applied before: see the contract on why it must not be re-written
    for key, value in writes.items():
        if value is None:
            conn.execute("DELETE FROM data WHERE partition = ? AND key = ?", (partition, key))
        else:
            conn.execute(
                "INSERT INTO data VALUES (?, ?, ?) ON CONFLICT (partition, key) DO UPDATE SET value = ?",
                (partition, key, value, value),
            )
    # A VOTE_YES becomes COMMIT here, in the transaction that writes the data (the participant's
    # own commit, see LogStore.apply_redo).
    conn.execute("UPDATE txn_log SET state = ?, applied = 1 WHERE log = ? AND txn = ?", (_COMMIT, log, txn))
    return True


def delete(
    conn: sqlite3.Connection, log: LogKey, txn: str, fence: FenceWire | None, keep: TombstoneWire | None
) -> bool:
    """LogStore.delete: whether the record existed. Every refusal (Fenced, then the tombstone's:
    ValidationError, DecisionFlipRefused, InvariantViolation) is raised before its one write
    statement, so a refused delete has written nothing; the write lock keeps the checks and the
    write atomic."""
    _check_fence(conn, fence)
    if keep is None:
        return conn.execute("DELETE FROM txn_log WHERE log = ? AND txn = ?", (log, txn)).rowcount == 1
    decision, keep_ms = keep
    _check_keep(decision, keep_ms)
    row = conn.execute("SELECT state, applied FROM txn_log WHERE log = ? AND txn = ?", (log, txn)).fetchone()
    # None there, or the same decision, applied where it is COMMIT (garbage collection's every
    # call in a partition's log), needs no check; the rule for the rest stays in the contract,
    # which raises with the contract's objects, and tells the kinds of log apart (a coordinator's
    # COMMIT, never applied, is kept too). This shortcut is a subset of what `check_tombstone`
    # allows (it saves building contract objects on the writer's every keep), never more: keep it so.
    if row is not None and not (row[0] == decision and (row[1] or decision != _COMMIT)):
        check_tombstone(_log_id(log), txn, TxnState(row[0]), bool(row[1]), Tombstone(TxnState(decision), keep_ms))
    # The writer's wall clock, not its time.monotonic(): the expiry outlives the writer, and the
    # purge of a writer started after a reboot compares it. keep_ms counts from the call's turn in
    # its batch, that batch's COMMIT (about a millisecond) before it lands, as a write's deadline
    # does (run_batch). One read for both, so a new tombstone expires keep_ms after its creation.
    now_ms = _now_ms()
    # created_at_ms is kept where there was a record (a tombstone of it is still its record).
    conn.execute(
        f"INSERT INTO txn_log ({_RECORD_COLUMNS}, expires_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (log, txn) DO UPDATE SET state = excluded.state, participants = excluded.participants, "
        "coordinator = excluded.coordinator, redo = excluded.redo, applied = excluded.applied, "
        "expires_at_ms = excluded.expires_at_ms",
        (log, txn, decision, *_TOMBSTONE_BODY_COLUMNS, decision == _COMMIT, now_ms, now_ms + keep_ms),
    )
    return row is not None


def _check_keep(decision: str, keep_ms: int) -> None:
    # What the store sent is a Tombstone's wire form, validated; anything else stored here would
    # be a bodiless vote, or an expiry the purge never reaches (see the module docstring).
    if decision not in _DECISION_VALUES:
        raise ValidationError(f"a tombstone holds one of {sorted(_DECISION_VALUES)}, got {decision!r:.50}")
    if type(keep_ms) is not int or not 1 <= keep_ms <= TOMBSTONE_KEEP_MS_MAX:
        raise ValidationError(f"a tombstone's keep_ms must be an int in 1..{TOMBSTONE_KEEP_MS_MAX}: {keep_ms!r:.50}")


def delete_many(conn: sqlite3.Connection, requests: Sequence[DeleteWire]) -> list[bool | StorageError]:
    """Each delete's own outcome, in order: whether its record existed, or its own refusal."""
    outcomes: list[bool | StorageError] = []
    for log_key, txn, fence, keep in requests:
        # A refused delete has written nothing (see `delete`), so it needs no savepoint of its own.
        try:
            outcomes.append(delete(conn, log_key, txn, fence, keep))
        except StorageError as refused:
            outcomes.append(refused)
    return outcomes


# txn_log has no rowid: the rows are picked by their key, which the expiry index holds beside
# the expiry (the subquery reads only that index).
PURGE_EXPIRED = (
    "DELETE FROM txn_log WHERE (log, txn) IN (SELECT log, txn FROM txn_log "
    "WHERE expires_at_ms IS NOT NULL AND expires_at_ms <= ? LIMIT ?)"
)


def purge_expired(conn: sqlite3.Connection, count_max: int) -> int:
    """Delete, in one transaction of its own, at most `count_max` tombstones whose expiry has
    come by the wall clock (`delete` set it by the same clock), stepped forward no faster than
    time passes (`_purge_now_ms`); how many went. Rows whose expiry
    is NULL (every record that is not a tombstone) never match. One bounded statement that reads
    only the expiry index: the writer runs it between its client batches."""
    assert count_max > 0, count_max
    with _write_transaction(conn):
        purged = conn.execute(PURGE_EXPIRED, (_purge_now_ms(), count_max)).rowcount
    assert 0 <= purged <= count_max, (purged, count_max)
    return purged


def write_owner(
    conn: sqlite3.Connection, expected: OwnershipWire | None, new: OwnershipWire
) -> tuple[OwnershipWire | None, bool]:
    """LogStore.write_owner; answers (the record stored after the call, or None, whether it is `new`)."""
    partition = new[0]
    row = conn.execute(f"SELECT {_OWNERSHIP_COLUMNS} FROM ownership WHERE partition = ?", (partition,)).fetchone()
    if not _is_expected(row, expected):
        return row, False
    conn.execute(
        f"INSERT INTO ownership ({_OWNERSHIP_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (partition) DO UPDATE SET "
        "owner = excluded.owner, epoch = excluded.epoch, version = excluded.version, "
        "lease_ms = excluded.lease_ms, wanted_by = excluded.wanted_by",
        new,
    )
    return new, True


def _is_expected(stored: OwnershipWire | None, expected: OwnershipWire | None) -> bool:
    """Whether the stored record is the one a write_owner expects: none, or the same epoch and version."""
    if expected is None or stored is None:
        return stored is expected
    return _epoch_version(stored) == _epoch_version(expected)


def _epoch_version(record: OwnershipWire) -> tuple[int, int]:
    _partition, _owner, epoch, version, _lease_ms, _wanted_by = record
    return epoch, version


# The writes the writer process runs, by the name a request carries.
WRITES: dict[str, Callable[..., Any]] = {
    "log_once": log_once,
    "log": log,
    "apply_redo": apply_redo,
    "delete": delete,
    "delete_many": delete_many,
    "write_owner": write_owner,
}
# How many arguments each write takes after the connection: the writer refuses a request of any
# other shape before it runs it (emulator_writer.py `_Writer._request`).
WRITE_ARG_COUNTS: dict[str, int] = {
    name: len(inspect.signature(write).parameters) - 1 for name, write in WRITES.items()
}
