"""The LogStore contract: the only thing Cornus asks of a storage service.

Every backend (emulator, redis, azure_blob, dynamodb) implements `LogStore`
(storage_adapters/store.py). The protocol core imports the value types from here (never a backend,
and nothing here does I/O or imports asyncio, so the core stays pure), and the node runtime calls
the async methods.

One record per (log, txn). A log is either a partition's log or a coordinator's log (the latter is
used by 2PC and coordinator-log for decisions and, in coordinator-log, every participant's redo).

Transitions a record may make, and which call may make them:

    absent   --log_once(s)/log(s)-->  s            (s in VOTE_YES, COMMIT, ABORT)
    VOTE_YES --log(COMMIT|ABORT)--->  decision
    VOTE_YES --apply_redo---------->  COMMIT, applied   (the participant's own commit: see apply_redo)
    COMMIT   --apply_redo---------->  COMMIT, applied
    s        --log(s)-------------->  s            (idempotent rewrite of the same state)
    COMMIT  <-/-> ABORT, decision -/-> VOTE_YES    (refused with DecisionFlipRefused, nothing written)
    partition log:    COMMIT applied, VOTE_YES (d ABORT), ABORT, absent
                          --delete(keep=Tombstone(d))--> tombstone of d
    coordinator log:  COMMIT (applied or not), VOTE_YES (d ABORT), ABORT, absent
                          --delete(keep=Tombstone(d))--> tombstone of d
    (refused, nothing written: the other decision, DecisionFlipRefused; a COMMIT tombstone over
     VOTE_YES, or over an unapplied COMMIT in a partition's log, InvariantViolation)
    anything --delete()--> absent

A tombstone is what garbage collection leaves in a record's place: the decision alone, no body (a
COMMIT one applied), kept at least `keep_ms` and then dropped by storage (Redis: key expiry;
emulator: its writer's purge; DynamoDB: the table's TTL on `expires_at`; Azure: the store's own
sweep, and lifecycle rules on blob index tags that carry each tombstone's keep in days, which the
Terraform module sets up). Until then it reads as
a finished record of its decision, so no recovery scan returns it, and a late write meets it rather
than an empty slot: a LogOnce is told the decision, a `log` of the other decision or of VOTE_YES is
refused, and a `log` of its own decision is the idempotent rewrite, which may bring a body back but
leaves the record finished (a COMMIT stays applied) and its expiry as it was.

Both kinds of log keep tombstones. A partition's, so that a late terminator's LogOnce(ABORT) or a
late vote cannot fill the slot. A coordinator's own record (2PC's decision; coordinator-log's redo
record and then its decision), because where storage takes a call long after its deadline
(DynamoDB, Azure Blob) a late `log(COMMIT, body)` would otherwise create the record again,
unfinished with its redo, and a participant's recovery would rebuild a yes vote from it and apply
an old redo over newer data. Nothing is applied from a coordinator's log, so its COMMIT is never
marked applied; its coordinator collects it only after every participant acknowledged applying
the redo, so a COMMIT tombstone may cover it applied or not. In a partition's log the applied mark
is what tells a COMMIT's redo safe, and a COMMIT tombstone over a vote is refused in both: there
the COMMIT was never logged, so the caller is wrong about the outcome.

`log_once` never changes an existing record: it returns what is stored. That single compare-and-swap
is the whole of Cornus's requirement on storage, and every backend does it in ONE round trip.

Recovery reads a log's unfinished records in pages keyed by txn id: each page starts strictly after
where the one before said it stopped (`ScanPage.resume_after`, at or past its last record), so
records that stay unfinished (all of them, until recovery resolves them) cannot hold later ones
back, and a backend that walks finished records to find them walks a bounded number per page. Txn
ids are ASCII, so every backend's native order (SQLite BINARY, Redis lex, DynamoDB bytes) is plain
string order.

Ownership. Each partition has exactly one writer, its owner, named by an ownership record that
`write_owner` changes by compare-and-swap in one round trip (as `log_once` does records):

    absent --write_owner(None, epoch 1)--> owned by n, epoch 1, version 1
    (e, v) --write_owner((e, v), (e, v+1))--> renewed, hand-off asked, or released (owner "")
    (e, v) --write_owner((e, v), (e+1, v+1))--> taken by another node: a new epoch

Every write a partition owner makes for its partition (`log_once`, `log`, `delete` on the
partition's log, `apply_redo` on its data) may carry a `Fence` (owner, epoch). The backend checks
the ownership record in the SAME round trip as the write and refuses with `Fenced`, writing
nothing, unless the record still names that owner and epoch. So a deposed owner's late write
(its lease clock wrong, its process paused, its request slow) cannot land after a new owner has
taken the partition, whatever the clocks say. Writes without a fence (a terminator's
LogOnce(ABORT) on another partition's log, an operator's resolve) are the protocol's and stay
allowed. Azure Blob has no condition that spans two blobs; its adapter says how it fences.

A node's identity is owned the same way: the ownership record named `identity_name(node)` (no
partition is named so: partition names never hold the `node:` prefix the runtime gives them) is
taken, in a new epoch, by each process that starts as that node, and the node's writes to its own
coordinator log carry its fence. So when a second process runs as the same node (a pod deleted
while its process lived on), storage refuses the first one's coordinator-log writes from the
moment the second took the name: it cannot log a COMMIT the second's recovery did not see.

Every node takes its identity before it writes any coordinator-log record, so the nodes that
ever took one (`list_identities`) are all the coordinator logs there can be: recovery scans
those, not only the logs of the nodes its configuration names (a node added by a rollout is
unknown to a node with the old configuration, and its coordinator log may hold the only copy of
some yes votes). A node is listed from its first take on and stays listed (identity records are
never deleted; a listed node whose log is empty costs recovery one empty scan). Each backend
lists them in a bounded number of round trips, without reading the log or data records.

The cluster record. One record, `CLUSTER_RECORD_TXN` in the cluster log (`LogId.cluster()`, a
kind of log of its own, so no partition or node can name it), says which deployment the storage
belongs to and over how many partitions its keys are spread: data is stored by partition, and a
node that spread keys over another count would read committed values as absent and split a key
in two. The runtime writes it with `log_once` (a COMMIT, its content in the body's redo) before a
node takes anything, and reads it back when it was there already (cornus.runtime.cluster_record).
No fence guards it (no node owns it), no scan returns it, and nothing deletes it (`delete`
refuses): storage keeps it as long as the data, which means nothing without it.

What is done once, in `LogStore` (store.py), for every backend. Its public methods are a template: they
validate the arguments (ValidationError before any I/O), bound the call by the store's deadline
(StorageUnavailable past it) and map the backend's errors, then call the backend's protected
method of the same name (`_log_once`, ...), which does the I/O and nothing else. Garbage
collection's deletes of one event-loop tick are joined into batches for the backends that can
carry several in one request (`coalesces_deletes`); each caller still gets its own answer, its
own Fenced and its own deadline.
"""

from __future__ import annotations

import enum
import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from storage_adapters.errors import DecisionFlipRefused, InvariantViolation, ValidationError

# Limits. They are what every backend can hold in one request (DynamoDB items top out at 400 KB,
# so a record with its redo must stay well below that), and they bound what a bad caller can make
# us allocate.
TXN_ID_LENGTH_MAX = 128
LOG_NAME_LENGTH_MAX = 64
NODE_ID_LENGTH_MAX = 64
PARTICIPANT_COUNT_MAX = 256
REDO_BYTES_MAX = 128 * 1024
DATA_KEY_BYTES_MAX = 512
DATA_VALUE_BYTES_MAX = 64 * 1024
DATA_BATCH_COUNT_MAX = 1024
SCAN_PAGE_COUNT_MAX = 1000
# Bytes of records one scan page holds, one record more at most (PageBytes): it ends after the
# record that passes this (one at least, so a scan always moves), and the next resumes after it. A page of
# SCAN_PAGE_COUNT_MAX large votes held about 128 MiB at once, and a node recovers its partitions
# side by side (found by audit, 2026-11-27).
SCAN_PAGE_BYTES_MAX = 16 * 1024 * 1024
# Rounds one scan page may take where a backend reads its index (or listing) and then the records
# in separate requests: only a record finished or deleted between the two makes another round
# necessary, to refill the page from further on, so running out means the log churns too fast.
SCAN_ROUND_COUNT_MAX = 8
# Calls one `scan_unfinished` (the whole-page form, for tools and tests) may make of
# `scan_unfinished_page`, whose pages can stop short of `limit` where a backend walks finished
# records: enough for a log of about 10^8 tombstones at the backends' walk bounds
# (azure_blob.SCAN_WALK_NAME_COUNT_MAX, dynamodb.SCAN_WALK_ITEM_COUNT_MAX).
SCAN_CALL_COUNT_MAX = 10_000
# Ownership records one `read_owners` call may return: the runtime's partition count limit.
OWNER_READ_COUNT_MAX = 4096
# The ownership record of a node's identity is named with this prefix and the node id.
IDENTITY_PREFIX = "node:"
# Node ids one `list_identities` page may return. Recovery lists every node that ever took an
# identity, page by page, and a page must come back in one call's deadline on every backend
# (Azure: one listing request holds at most 5000 names; DynamoDB: one Query page at most 1 MB,
# and a page's ids, 64 bytes at most each, stay far below). A deployment has a few hundred nodes
# at most, so one page is all of them, and the bound only caps what one call can allocate.
IDENTITY_PAGE_COUNT_MAX = 1000
# A lease longer than this would leave a dead owner's partitions unserved for minutes.
OWNER_LEASE_MS_MAX = 600_000
# A decision tombstone kept longer than a week is a leak, not a retention: storage holds one per
# collected transaction, thousands a second under load.
TOMBSTONE_KEEP_MS_MAX = 7 * 24 * 3600 * 1000

# Ids end up in Redis keys, blob names and DynamoDB keys; a conservative alphabet keeps them
# unambiguous in all three (no '/', no braces that would break Redis hash tags).
_ID_PATTERN = re.compile(r"^[A-Za-z0-9_.:-]+$")


class TxnState(enum.StrEnum):
    VOTE_YES = "VOTE_YES"
    COMMIT = "COMMIT"
    ABORT = "ABORT"

    @property
    def is_decision(self) -> bool:
        return self is not TxnState.VOTE_YES


class LogKind(enum.StrEnum):
    PARTITION = "p"
    COORDINATOR = "c"
    CLUSTER = "k"  # the one log of the cluster record (LogId.cluster)


# The cluster log's name and its one record's txn id: fixed, since every node of a deployment, and
# every deployment pointed at the same storage by mistake, must find the same record.
CLUSTER_LOG_NAME = "cluster"
CLUSTER_RECORD_TXN = "cluster"


def validate_id(value: object, what: str, length_max: int) -> str:
    """Return `value` if it is a usable id, else raise ValidationError naming `what`."""
    if not isinstance(value, str):
        raise ValidationError(f"{what} must be a string, got {type(value).__name__}")
    if not value:
        raise ValidationError(f"{what} must not be empty")
    if len(value) > length_max:
        raise ValidationError(f"{what} is {len(value)} characters, the limit is {length_max}")
    if not _ID_PATTERN.fullmatch(value):  # match's "$" also passes a trailing newline
        raise ValidationError(f"{what} {value!r} may only hold letters, digits and '_.:-'")
    return value


# LogIds kept by `LogId.partition` and `LogId.coordinator`: a node names the same few logs in every
# storage call (some 16 a transaction), and each new one is validated. Names come from config and
# from peers' messages, so the table is bounded all the same, and emptied when full.
_LOG_IDS_INTERNED_COUNT_MAX = 4096


@dataclass(frozen=True, slots=True)
class LogId:
    """Which log a record lives in: a partition's log, a coordinator node's log, or the cluster
    log of the one cluster record."""

    kind: LogKind
    name: str
    # A stable string form, usable inside every backend's key space (made once: every call keys on it).
    key: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.kind, LogKind):
            raise ValidationError(f"log kind must be a LogKind, got {self.kind!r}")
        validate_id(self.name, "log name", LOG_NAME_LENGTH_MAX)
        if self.kind is LogKind.PARTITION:
            validate_partition(self.name)
        if self.kind is LogKind.CLUSTER and self.name != CLUSTER_LOG_NAME:
            raise ValidationError(f"the cluster log is named {CLUSTER_LOG_NAME!r}, not {self.name!r}")
        object.__setattr__(self, "key", f"{self.kind.value}.{self.name}")

    @classmethod
    def partition(cls, name: str) -> LogId:
        return _interned(LogKind.PARTITION, name)

    @classmethod
    def coordinator(cls, name: str) -> LogId:
        return _interned(LogKind.COORDINATOR, name)

    @classmethod
    def cluster(cls) -> LogId:
        return _interned(LogKind.CLUSTER, CLUSTER_LOG_NAME)


_log_ids: dict[tuple[LogKind, str], LogId] = {}


def _interned(kind: LogKind, name: str) -> LogId:
    if not isinstance(name, str):
        return LogId(kind, name)  # raises its ValidationError; such a name could not key the table
    log_id = _log_ids.get((kind, name))
    if log_id is None:
        log_id = LogId(kind, name)  # validates: an invalid name raises and is not kept
        if len(_log_ids) >= _LOG_IDS_INTERNED_COUNT_MAX:
            _log_ids.clear()
        _log_ids[(kind, name)] = log_id
    return log_id


@dataclass(frozen=True, slots=True)
class RecordBody:
    """What a vote carries: the full participant list (so any participant can run termination
    against the right logs), the coordinator, and the opaque redo to apply on COMMIT."""

    participants: tuple[str, ...] = ()
    coordinator: str = ""
    redo: bytes = b""

    def __post_init__(self) -> None:
        if not isinstance(self.participants, tuple):
            raise ValidationError("participants must be a tuple of partition names")
        if len(self.participants) > PARTICIPANT_COUNT_MAX:
            raise ValidationError(
                f"{len(self.participants)} participants, the limit is {PARTICIPANT_COUNT_MAX}",
            )
        for participant in self.participants:
            validate_id(participant, "participant", LOG_NAME_LENGTH_MAX)
        if len(set(self.participants)) != len(self.participants):
            raise ValidationError("participants must not repeat")
        if self.coordinator:
            validate_id(self.coordinator, "coordinator", NODE_ID_LENGTH_MAX)
        if not isinstance(self.redo, bytes):
            raise ValidationError(f"redo must be bytes, got {type(self.redo).__name__}")
        if len(self.redo) > REDO_BYTES_MAX:
            raise ValidationError(f"redo is {len(self.redo)} bytes, the limit is {REDO_BYTES_MAX}")


@dataclass(frozen=True, slots=True)
class Record:
    """One stored record. `applied` is set once a COMMIT's redo is in the data (recovery re-applies
    committed records that lack it). `created_at_ms` is the storing side's wall clock."""

    log: LogId
    txn: str
    state: TxnState
    body: RecordBody = field(default_factory=RecordBody)
    applied: bool = False
    created_at_ms: int = 0


# What a record holds besides its redo and participants (its ids, state, flags), at most.
RECORD_FIXED_BYTES = 512


class PageBytes:
    """What a scan page holds so far, against SCAN_PAGE_BYTES_MAX: each record counts its redo,
    its participants' names and RECORD_FIXED_BYTES."""

    def __init__(self) -> None:
        self.total = 0

    def add(self, record: Record) -> bool:
        """Count `record`; whether the page is full with it (it ends with that record)."""
        self.total += len(record.body.redo) + sum(len(name) for name in record.body.participants) + RECORD_FIXED_BYTES
        return self.total >= SCAN_PAGE_BYTES_MAX


@dataclass(frozen=True, slots=True)
class Tombstone:
    """What garbage collection leaves in a record's place, so that the transaction's outcome can
    still be told (the status call) and a late write (a terminator's LogOnce(ABORT), a vote, a
    coordinator's own `log` of its decision) still meets the decision rather than an empty slot:
    the decision alone (no body; a COMMIT counts as applied, in either kind of log), kept at least
    `keep_ms` after the call that wrote it, then dropped by storage at its own pace."""

    decision: TxnState
    keep_ms: int

    def __post_init__(self) -> None:
        if not isinstance(self.decision, TxnState) or not self.decision.is_decision:
            raise ValidationError(f"a tombstone holds a decision, not {self.decision!r}")
        if not isinstance(self.keep_ms, int) or isinstance(self.keep_ms, bool):
            raise ValidationError(f"keep_ms must be an int, got {type(self.keep_ms).__name__}")
        if not 1 <= self.keep_ms <= TOMBSTONE_KEEP_MS_MAX:
            raise ValidationError(f"keep_ms is {self.keep_ms}, it must be in 1..{TOMBSTONE_KEEP_MS_MAX}")


@dataclass(frozen=True, slots=True)
class LogOnceResult:
    """What `log_once` found or made: `state` is the record's state after the call, `created` is
    True for exactly the one caller whose write created the record."""

    state: TxnState
    created: bool


@dataclass(frozen=True, slots=True)
class ScanPage:
    """One `scan_unfinished_page` (or `scan_finished_page`) answer: the records asked for in
    ascending txn-id order, and where the next page starts. `resume_after` None: none lies past
    this page. Otherwise the next page is asked for after it, and it is at or past the last
    record's id (a backend that walks other records to find the ones asked for stops its walk at a
    bound, maybe with no record yet, and resumes where the walk stopped)."""

    records: tuple[Record, ...]
    resume_after: str | None

    def __post_init__(self) -> None:
        txns = [record.txn for record in self.records]
        assert all(a < b for a, b in itertools.pairwise(txns)), f"a page out of order: {txns}"
        assert self.resume_after is None or not txns or self.resume_after >= txns[-1], (
            f"a page resumes after {self.resume_after!r}, before its last record {txns[-1]!r}"
        )


@dataclass(frozen=True, slots=True)
class Ownership:
    """A partition's ownership record. `owner` "" means released: free to take. `epoch` rises by
    one with every take and is what fences the owner's writes; `version` rises by one with every
    write of the record (take, renewal, hand-off request, release), so a node that watches the
    same (epoch, version) for longer than `lease_ms` plus clock slack, by its own clock, knows the
    owner has stopped renewing. `wanted_by` names a node that asks the owner to hand over."""

    partition: str
    owner: str
    epoch: int
    version: int
    lease_ms: int
    wanted_by: str = ""

    def __post_init__(self) -> None:
        validate_owned_name(self.partition)
        for what, value in (("owner", self.owner), ("wanted_by", self.wanted_by)):
            if value != "":
                validate_id(value, what, NODE_ID_LENGTH_MAX)
        for what, number in (("epoch", self.epoch), ("version", self.version), ("lease_ms", self.lease_ms)):
            if not isinstance(number, int) or isinstance(number, bool) or number < 1:
                raise ValidationError(f"{what} must be an integer >= 1, got {number!r}")
        if self.lease_ms > OWNER_LEASE_MS_MAX:
            raise ValidationError(f"lease_ms is {self.lease_ms}, the limit is {OWNER_LEASE_MS_MAX}")

    def fence(self) -> Fence:
        assert self.owner, f"{self.partition} is released: no owner to fence writes with"
        return Fence(self.partition, self.owner, self.epoch)


@dataclass(frozen=True, slots=True)
class Fence:
    """What a partition owner's write is conditioned on: storage refuses it (`Fenced`) unless the
    partition's ownership record names `owner` at `epoch`."""

    partition: str
    owner: str
    epoch: int

    def __post_init__(self) -> None:
        validate_owned_name(self.partition)
        validate_id(self.owner, "fence owner", NODE_ID_LENGTH_MAX)
        if not isinstance(self.epoch, int) or isinstance(self.epoch, bool) or self.epoch < 1:
            raise ValidationError(f"fence epoch must be an integer >= 1, got {self.epoch!r}")

    def admits(self, stored: Ownership | None) -> bool:
        return stored is not None and stored.owner == self.owner and stored.epoch == self.epoch


@dataclass(frozen=True, slots=True)
class OwnerWriteResult:
    """What `write_owner` found or made: `stored` is the record after the call (None: absent),
    `written` is True if this call's record is the one stored."""

    stored: Ownership | None
    written: bool


def validate_owner_write(expected: object, new: object) -> tuple[Ownership | None, Ownership]:
    """The transitions `write_owner` allows: the first record is epoch 1 version 1; every later
    one raises the version by one and keeps the epoch or raises it by one."""
    if expected is not None and not isinstance(expected, Ownership):
        raise ValidationError(f"expected must be an Ownership or None, got {type(expected).__name__}")
    if not isinstance(new, Ownership):
        raise ValidationError(f"new must be an Ownership, got {type(new).__name__}")
    if expected is None:
        if (new.epoch, new.version) != (1, 1):
            raise ValidationError(f"a first ownership record is epoch 1 version 1, got {new.epoch}/{new.version}")
        return expected, new
    if new.partition != expected.partition:
        raise ValidationError(f"ownership of {new.partition} cannot replace that of {expected.partition}")
    if new.version != expected.version + 1:
        raise ValidationError(f"version must rise by one: {expected.version} -> {new.version}")
    if new.epoch not in (expected.epoch, expected.epoch + 1):
        raise ValidationError(f"epoch may stay or rise by one: {expected.epoch} -> {new.epoch}")
    if new.epoch == expected.epoch and new.owner not in ("", expected.owner):
        raise ValidationError(f"{new.owner} may take {new.partition} from {expected.owner!r} only in a new epoch")
    return expected, new


def validate_fence(fence: object, partition: str) -> Fence | None:
    """A write's fence must be for the partition written (None: an unfenced write)."""
    if fence is None:
        return None
    if not isinstance(fence, Fence):
        raise ValidationError(f"fence must be a Fence, got {type(fence).__name__}")
    if fence.partition != partition:
        raise ValidationError(f"a fence for {fence.partition} cannot guard a write to {partition}")
    return fence


def validate_log_fence(fence: object, log: LogId) -> Fence | None:
    """A partition's log is fenced by the partition's owner, a coordinator's log by the identity of
    the node it belongs to; the cluster log by nothing (written once, before any owner exists)."""
    if log.kind is LogKind.CLUSTER:
        if fence is not None:
            raise ValidationError("a write to the cluster log carries no fence: no node owns it")
        return None
    if log.kind is LogKind.COORDINATOR:
        return validate_fence(fence, identity_name(log.name))
    return validate_fence(fence, log.name)


def validate_owner_partitions(partitions: object) -> tuple[str, ...]:
    if isinstance(partitions, str | bytes) or not isinstance(partitions, Sequence):
        raise ValidationError("partitions must be a sequence of partition names")
    if len(partitions) > OWNER_READ_COUNT_MAX:
        raise ValidationError(f"{len(partitions)} partitions in one call, the limit is {OWNER_READ_COUNT_MAX}")
    return tuple(dict.fromkeys(validate_owned_name(p) for p in partitions))


def identity_name(node: str) -> str:
    """The name of the ownership record that says which process is node `node` now."""
    return IDENTITY_PREFIX + validate_id(node, "node id", NODE_ID_LENGTH_MAX)


def is_identity(name: str) -> bool:
    return name.startswith(IDENTITY_PREFIX)


def validate_owned_name(name: object) -> str:
    """What an ownership record may be named: a partition, or a node's identity (whose node id
    may be longer than a partition name may)."""
    if isinstance(name, str) and is_identity(name):
        identity_name(name[len(IDENTITY_PREFIX):])
        return name
    return validate_partition(name)


def validate_txn(txn: object) -> str:
    return validate_id(txn, "txn id", TXN_ID_LENGTH_MAX)


def validate_state(state: object) -> TxnState:
    if not isinstance(state, TxnState):
        raise ValidationError(f"state must be a TxnState, got {state!r}")
    return state


def validate_log(log: object) -> LogId:
    if not isinstance(log, LogId):
        raise ValidationError(f"log must be a LogId, got {type(log).__name__}")
    return log


def validate_not_cluster_log(log: LogId, call: str) -> LogId:
    """The cluster record is only written once and read: a scan would take it for an unapplied
    COMMIT, and a delete would leave the data without the count its keys are spread by."""
    if log.kind is LogKind.CLUSTER:
        raise ValidationError(f"{call} of the cluster log: its one record is only written once (log_once) and read")
    return log


def validate_body(body: object) -> RecordBody:
    if not isinstance(body, RecordBody):
        raise ValidationError(f"body must be a RecordBody, got {type(body).__name__}")
    return body


def validate_partition(partition: object) -> str:
    validate_id(partition, "partition", LOG_NAME_LENGTH_MAX)
    assert isinstance(partition, str)
    if is_identity(partition):
        # Its ownership record would be a node's identity record.
        raise ValidationError(f"partition {partition!r} may not start with {IDENTITY_PREFIX!r}")
    return partition


def validate_scan_after(after: object) -> str:
    """A scan cursor: "" (from the start) or a txn id."""
    if isinstance(after, str) and not after:
        return after
    return validate_txn(after)


def is_unfinished(state: TxnState, applied: bool) -> bool:
    """Whether a record still needs recovery's work: undecided, or committed with its redo not in
    the data yet."""
    return state is TxnState.VOTE_YES or (state is TxnState.COMMIT and not applied)


def validate_scan_limit(limit: object) -> int:
    if not isinstance(limit, int) or isinstance(limit, bool):
        raise ValidationError(f"limit must be an int, got {type(limit).__name__}")
    if not 1 <= limit <= SCAN_PAGE_COUNT_MAX:
        raise ValidationError(f"limit is {limit}, it must be in 1..{SCAN_PAGE_COUNT_MAX}")
    return limit


def validate_identity_after(after: object) -> str:
    """A `list_identities` cursor: "" (from the start) or a node id."""
    if isinstance(after, str) and not after:
        return after
    return validate_id(after, "identity cursor", NODE_ID_LENGTH_MAX)


def validate_identity_limit(limit: object) -> int:
    if not isinstance(limit, int) or isinstance(limit, bool):
        raise ValidationError(f"limit must be an int, got {type(limit).__name__}")
    if not 1 <= limit <= IDENTITY_PAGE_COUNT_MAX:
        raise ValidationError(f"limit is {limit}, it must be in 1..{IDENTITY_PAGE_COUNT_MAX}")
    return limit


def validate_data_key(key: object) -> str:
    if not isinstance(key, str):
        raise ValidationError(f"data key must be a string, got {type(key).__name__}")
    if not key:
        raise ValidationError("data key must not be empty")
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate: no backend can store it
        raise ValidationError(f"data key {key[:80]!r} is not valid Unicode (a lone surrogate)") from None
    if size > DATA_KEY_BYTES_MAX:
        raise ValidationError(f"data key is {size} bytes, the limit is {DATA_KEY_BYTES_MAX}")
    return key


def validate_data_keys(keys: object) -> tuple[str, ...]:
    if isinstance(keys, str | bytes) or not isinstance(keys, Sequence):
        raise ValidationError("keys must be a sequence of strings")
    if len(keys) > DATA_BATCH_COUNT_MAX:
        raise ValidationError(f"{len(keys)} keys in one call, the limit is {DATA_BATCH_COUNT_MAX}")
    return tuple(validate_data_key(key) for key in keys)


def validate_writes(writes: object) -> dict[str, bytes | None]:
    """A redo's writes: key -> new value, or None to delete the key."""
    if not isinstance(writes, Mapping):
        raise ValidationError("writes must be a mapping of key -> bytes or None")
    if len(writes) > DATA_BATCH_COUNT_MAX:
        raise ValidationError(f"{len(writes)} writes in one redo, the limit is {DATA_BATCH_COUNT_MAX}")
    checked: dict[str, bytes | None] = {}
    for key, value in writes.items():
        validate_data_key(key)
        if value is not None:
            if not isinstance(value, bytes):
                raise ValidationError(f"value of {key!r} must be bytes or None")
            if len(value) > DATA_VALUE_BYTES_MAX:
                raise ValidationError(
                    f"value of {key!r} is {len(value)} bytes, the limit is {DATA_VALUE_BYTES_MAX}",
                )
        checked[key] = value
    return checked


def validate_tombstone(keep: object, log: LogId) -> Tombstone | None:
    """A tombstone may be kept in either kind of log (see the module docstring): in a partition's,
    where the status call looks for outcomes and a late terminator or vote must meet the decision;
    in a coordinator's, where its own `log(COMMIT, body)` may land after collection (DynamoDB,
    Azure) and must not make the record, redo and all, unfinished again. What it may cover is
    `check_tombstone`'s, which tells the two kinds apart."""
    if keep is None:
        return None
    if not isinstance(keep, Tombstone):
        raise ValidationError(f"keep must be a Tombstone or None, got {type(keep).__name__} (log {log.key})")
    return keep


def commit_tombstone_needs_applied(log: LogId) -> bool:
    """Whether a COMMIT tombstone in `log` may cover only a COMMIT whose redo is applied. In a
    partition's log, yes: the applied mark is what says the redo is in the data. In a coordinator's,
    no: nothing is applied from it, so its COMMIT never carries the mark, and its coordinator
    collects it only after every participant acknowledged its apply. For the backends that state
    `check_tombstone`'s rule in their own terms (a Lua script, a condition expression)."""
    return log.kind is LogKind.PARTITION


def check_tombstone(log: LogId, txn: str, stored: TxnState | None, applied: bool, keep: Tombstone) -> None:
    """Raise unless `stored` may become `keep`'s tombstone: never over the other decision
    (DecisionFlipRefused); never a COMMIT over a vote (the COMMIT was never logged there, so the
    caller is wrong about the outcome; in a partition's log the vote's redo would be lost too);
    and in a partition's log never a COMMIT over a COMMIT whose redo is not applied
    (`commit_tombstone_needs_applied`; garbage collection runs only after every participant
    applied). Both are a caller's bug: InvariantViolation. Absent may be kept: a read-only voter's
    partition, or a coordinator-log participant's, holds no record, nor does the log of a
    coordinator whose own decision never landed."""
    if stored is None:
        return
    if stored.is_decision and stored is not keep.decision:
        raise DecisionFlipRefused(log, txn, stored, keep.decision)
    if keep.decision is not TxnState.COMMIT:
        return
    if stored is TxnState.VOTE_YES:
        raise InvariantViolation(
            f"refused a COMMIT tombstone over {stored} for txn {txn!r} in log {log.key}: no COMMIT was logged "
            "there, and a vote's redo would be lost"
        )
    assert stored is TxnState.COMMIT, stored
    if not applied and commit_tombstone_needs_applied(log):
        raise InvariantViolation(
            f"refused a COMMIT tombstone over {stored} (not applied) for txn {txn!r} in log {log.key}: "
            "its redo would be lost"
        )


def check_log_transition(log: LogId, txn: str, stored: TxnState | None, wanted: TxnState) -> None:
    """Raise DecisionFlipRefused unless `log(wanted)` may overwrite `stored`."""
    if stored is None or stored is TxnState.VOTE_YES or stored is wanted:
        return
    raise DecisionFlipRefused(log, txn, stored, wanted)
