"""The Azure Blob Storage backend of the LogStore contract.

Each (log, txn) record is ONE blob holding everything (state, body, applied, created_at_ms), so
`log_once` is a single conditional Put Blob with `If-None-Match: *`: the winner pays one request,
and a loser learns of its loss from the 409 and pays a second request to read what the winner
stored. (The paper's artifact wrote two blobs, the second conditional; one blob is what lets a
true LogOnce cost one write.) Every later change of a record (`log`'s decisions, `apply_redo`'s
applied marker) is an `If-Match` on the ETag read just before, retried a bounded number of times.

`apply_redo` cannot write data blobs and the record in one atomic step. It reads the record (it
must be VOTE_YES or COMMIT, not applied), writes the data blobs, and only then replaces the record
with COMMIT and applied (`If-Match`). A crash in between leaves the record as it was: a VOTE_YES
(the participant's own commit, see LogStore.apply_redo) that recovery resolves to COMMIT, or an
unapplied COMMIT, and either way recovery applies the same redo again over the blobs that landed,
which is harmless because the redo's keys stay locked until the record says applied.

A data write of an attempt that timed out may still land later, after a retry applied the redo,
the keys were released and a later transaction wrote them: the client's deadline does not stop a
request already on the network. So each data write is conditional on the blob as the attempt read
it just before (`If-Match` its ETag, or `If-None-Match: *` if it had none), and a late one is
refused (a changed blob found by the attempt itself fails it as unavailable, and the retry reads
again). For that condition to exist, a key is never deleted once written: a deleted value is a
tombstone blob (empty, metadata {deleted: 1}), which reads as absent. (A value's tombstone,
not the decision tombstones of garbage collection below.)

Layout, with transaction state, data and ownership under distinct prefixes so access policies can
split them:

    txn/<log.key>/<txn>             JSON record; metadata {state, applied} for scans; a decision
                                    tombstone also has tags cornus-tombstone=1 and
                                    cornus-tombstone-days=<its keep in days>, metadata its expiry
    cluster/cluster                 the cluster record (contract.py), as a record; outside txn/,
                                    whose old blobs a lifecycle rule sweeps
    data/<partition>/<b64url(key)>  raw value bytes; metadata {deleted: 1} for a deleted value
    own/<partition>                 JSON ownership record; metadata {ownership} for listings
    own/node:<node>                 a node's identity record (its `identity_name`), the same;
                                    listed by their prefix, they are the identity registry

Ids are used verbatim as path segments except that a trailing '.' gets a '~' appended, because
Azure treats a path segment ending in '.' specially (and '.'/'..' would be path-normalized);
'~' is outside the id alphabet, so the mapping stays injective. It is not order-preserving, which
`_scan_page` must mend: '~' sorts above every id character, so `a.~` lists after `a.b` though
the id `a.` sorts before `a.b`. Data keys are arbitrary UTF-8, so they are urlsafe base64 (at most
684 characters for 512 bytes, well under the 1024-character name limit).

Ownership. `write_owner` of a first record is a Put Blob with `If-None-Match: *`, one request. A
later one must match the stored (epoch, version), which Azure cannot test in a condition, so it
reads the blob (learning its ETag), compares, and puts with `If-Match` on that ETag: a write lands
only on the very blob that was compared, so the compare-and-swap is exact, at two requests. A
loser of the put pays a third to read what won. `read_owners` reads a few partitions' blobs
directly, all at once; for more it lists the blobs under the names' common prefix, with their
metadata, which holds the same record as the body (one Put Blob writes both): one request per
5000 blobs, where one request per partition would not fit 4096 partitions in a call's deadline.

Identities. The identity records are blobs under `own/node:` and no partition's is (no partition
is named with that prefix), so `list_identities` lists the blobs under that prefix from
`startFrom` the cursor's name: one request, of a page as long as the ids asked for plus the few
names at or below the cursor that the listing can meet (the cursor's own and its '.'-ended
prefixes': names are not in id order, see above), and no other blob is read. Where the page stops
short of the listing's end, ids below its last one whose names list later (only that id's
'.'-ended prefixes) are looked up by name, in one more round of concurrent requests, as
`_scan_page` does. No registry is kept beside the records: a take is the record's own put.

Fencing on Azure rests on Azure's clock as well as on storage, and this is why. A fenced write
must land only while the partition's ownership record names the fence's owner and epoch, but the
ownership record and the record or data written are different blobs, and Azure Blob has no
condition (nor transaction) that spans two blobs. So a fenced call here reads the ownership blob
and refuses with Fenced, writing nothing, unless it admits the fence, and only THEN writes: the
check and the write are two requests (`log` and `apply_redo` read the ownership blob concurrently
with the record they read anyway; `log_once` and `delete` pay one request more than unfenced). A
write that passed the check could once be held on the network and land after another node had
taken the partition and scanned its log; now every request is signed for a time Azure checks on
arrival (storage_adapters/azure_signing.py): a fenced write expires when the lease its ownership
blob can still grant ends (the blob's Last-Modified plus lease_ms), which no taker's wait ends
before, and a write passing a partition on is not accepted before this store's unanswered fenced
writes for it have expired (and stops the ones it has not sent). What remains is in
azure_signing's docstring: Azure's own clocks (the Last-Modified stamp and the signature check)
drifting apart by more than a taker's clock slack, and a request's body arriving long after its
headers through a proxy that holds it (the store's own sockets reset at a call's deadline, which
drops a body still on its way: `_socket_resetting_on_close`).

Garbage collection's deletes of one event-loop tick (the contract's base joins them) go to Azure
all at once, each its own Delete Blob request, after one read per fenced partition's ownership
blob shared by the batch's fenced deletes: the same check-then-write as a lone fenced delete. Not
in a Blob Batch request: a batch's subrequests would need signatures of their own (above), which
Azurite refuses, and the nodes make no plain deletes here anyway (Azure's late-write window makes
every collection a tombstone, which a Blob Batch cannot carry).

Decision tombstones (`delete` with `keep`). A tombstone is a Put Blob over the record's blob, of
the record reduced to its decision (no body; a COMMIT one applied), so reads, `log_once`, `log`
and `apply_redo` meet it exactly as they meet a finished record, and its metadata {state,
applied} says finished, so the unfinished scan's listing skips it unread. The put is conditional
on the blob as read just before: `If-Match` its ETag, or `If-None-Match: *` where there was none
(a read-only voter's partition holds no record), and `check_tombstone` judges what was read first,
so a refusal writes nothing and a record changed or created in between makes the keep read again
and judge that. A fenced keep reads the ownership blob alongside the record, as `log` does. In a
tick's batch each keep is its own read and put, all at once (bounded), beside the plain deletes;
the batch's one read per fenced partition's ownership blob runs alongside the keeps' record reads.

Azure Blob has no expiry per blob (Set Blob Expiry is for hierarchical-namespace accounts only), so
storage drops tombstones through lifecycle management rules, which select blobs by blob index tags
and delete them some whole days after their last modification. Each tombstone carries, set by the
same Put Blob, the tag `cornus-tombstone-days` = its keep in whole days, rounded up (1 to 7), and
the Terraform module (terraform/modules/azure) has one rule per such value that deletes the blobs
tagged with it that many days after their last modification: the rule that drops a tombstone
follows the keep it was written with, whatever any setting says later (found by review: one rule
of a module variable's days dropped every tombstone then, and lowering the variable, which
Terraform applies at once, dropped longer-kept ones early). Each also carries `cornus-tombstone` =
`1`, which earlier versions tagged alone, and whose rule deletes after 8 days, past the longest
keep (TOMBSTONE_KEEP_MS_MAX): a backstop that is never early. The rules filter on tags no record
carries (a Put Blob replaces a blob's tags with those it carries: none, for a record), so they never
delete one. The one write that may land on a tombstone, a `log` of its own decision (an idempotent
rewrite, which may bring the vote's body back), carries the tags and the expiry again, so the blob
stays a tombstone as it does on every other backend (`_replace`). Keeping again re-puts the
tombstone, which restarts the rule's count from the new modification. The tombstone's metadata
also holds its expiry, the writer's wall clock when it sent the put plus keep_ms, for operators and
for checks, and its keep; the rules count from Last-Modified, set when the put lands, so they never
drop one early. Lifecycle rules run about once a day, so a rule alone leaves a tombstone up to a day
or two past its days, and recovery scans would walk all of them: so the store that put a tombstone
also deletes it once its keep has passed, if it is still that blob (If-Match; a `log` rewriting it
hands the sweep its new ETag), within a sweep interval (storage_adapters/azure_tombstone_sweep.py;
`drops_tombstones_at_expiry`). The rules drop those the sweep never got to (a process that
stopped). Azurite has no lifecycle management at all: there, only the sweep (and a plain `delete`)
removes tombstones.

Durability: Azure acknowledges a Put Blob only after it is durably stored (LRS: 3 replicas), which
is what a vote needs. Azurite keeps blobs on disk too, but is a test double, not a deployment.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import collections
import contextlib
import datetime
import json
import socket
import struct
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

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
from azure.core.pipeline.transport import AioHttpTransport
from azure.storage.blob import BlobProperties
from azure.storage.blob._shared.authentication import SharedKeyCredentialPolicy
from azure.storage.blob.aio import BlobServiceClient, ContainerClient

from storage_adapters.azure_signing import (
    ExpiringSignatures,
    admit_until,
    arrived_expired,
    in_signing_window,
    not_before,
    signing_window,
)
from storage_adapters.azure_tombstone_sweep import TombstoneSweep
from storage_adapters.contract import (
    IDENTITY_PAGE_COUNT_MAX,
    IDENTITY_PREFIX,
    NODE_ID_LENGTH_MAX,
    OWNER_READ_COUNT_MAX,
    SCAN_PAGE_BYTES_MAX,
    SCAN_ROUND_COUNT_MAX,
    TOMBSTONE_KEEP_MS_MAX,
    Fence,
    LogId,
    LogKind,
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
    is_unfinished,
    validate_id,
    validate_owner_write,
)
from storage_adapters.errors import Fenced, InvariantViolation, StorageError, StorageUnavailable, ValidationError
from storage_adapters.store import DELETE_BATCH_COUNT_MAX, DeleteRequest, LogStore, call_deadline

# How often a read-modify-write may lose an ETag race before we give up and report contention as
# unavailability (retryable). Writers of one record are few (a coordinator and the terminators of
# one txn), so losing this many times in a row means something is wrong, not merely busy.
ETAG_RETRY_COUNT_MAX = 16
# Concurrent requests in flight for one call's data blobs (apply_redo, read_data, scan reads):
# enough to hide per-request latency, few enough not to exhaust the connection pool or the
# account's per-partition request rate.
DATA_CONCURRENCY_MAX = 32
# Data blobs a fenced apply writes between two checks of its fence (each check starts a lease
# window from the latest renewal, azure_signing): four rounds of concurrent puts, well inside a
# window, and eight checks at most for the largest redo (DATA_BATCH_COUNT_MAX keys).
APPLY_CHUNK_COUNT = 4 * DATA_CONCURRENCY_MAX
# The SDK's own retries stay off: a retried conditional Put whose first attempt landed but whose
# response was lost would come back as a 409 and make the winner believe it lost. Retrying is the
# caller's job, under its deadline, and every LogStore call is idempotent. aiohttp's own resend
# too (_OnceTransport).
SDK_RETRY_COUNT_MAX = 0


def _socket_resetting_on_close(addr_info: Any) -> socket.socket:
    """A socket whose close resets its connection (SO_LINGER 0) and drops what it still had to
    send. Azure judges a request's signature when its headers arrive and commits the write when
    its body has: a body still on its way when the call's deadline closed the connection (a lost
    segment sent again and again through a network partition) landed after its fence's window,
    after the next owner's take and scan, once the partition healed (found by audit, 2026-11-28,
    fourth: a later recovery applied its old redo over a newer commit). A reset stops that, and a
    proxy on the way passes it on and drops what it held (tests/storage/test_azure_fence_window.py);
    one that holds data and does not is outside what this backend can fence (docs/deploy.md)."""
    family, kind, proto, _, _ = addr_info
    sock = socket.socket(family=family, type=kind, proto=proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    return sock


class _OnceTransport(AioHttpTransport):
    """azure-core's aiohttp transport, whose session never sends a request twice: aiohttp resends a
    PUT or DELETE once by itself when its connection is reset before the answer (its
    `_retry_connection`, on by default, with no public switch), and a conditional Put resent after
    its first attempt landed is refused as a conflict: a take that landed was answered "not
    written", a write that landed Fenced, "nothing written" (found by audit, 2026-11-28)."""

    async def open(self) -> None:
        if self.session is None and self._session_owner and not self._has_been_opened:
            # azure-core's own session, but for its sockets (`_socket_resetting_on_close`).
            self.session = aiohttp.ClientSession(
                trust_env=self._use_env_settings, cookie_jar=aiohttp.DummyCookieJar(), auto_decompress=False,
                connector=aiohttp.TCPConnector(socket_factory=_socket_resetting_on_close),
            )
        await super().open()
        assert hasattr(self.session, "_retry_connection"), (
            f"aiohttp {aiohttp.__version__} has no _retry_connection: check how it resends requests"
        )
        self.session._retry_connection = False  # type: ignore[union-attr]
# How often a release (or a take in a new epoch) looks again whether the fenced writes it waits
# for have their answers: they usually do within a round trip, long before their signatures
# expire, and a clean stop's release must land within its budget (cornus.runtime.node).
UNANSWERED_POLL_MS = 10
# Only an unexpected layout change could make a stored record fail to parse; the format carries a
# version so such a change is detected rather than misread.
RECORD_FORMAT_VERSION = 1
OWNER_FORMAT_VERSION = 1
# read_owners reads at most this many ownership blobs one by one, in one round of concurrent
# requests; more are listed instead.
OWNER_GET_COUNT_MAX = DATA_CONCURRENCY_MAX
# Ownership blobs one read_owners listing may walk. Records are never deleted, so the prefix holds
# every partition ever owned; a deployment has at most OWNER_READ_COUNT_MAX at once, and this
# leaves room for many renamings before the listing would outgrow a call's deadline.
OWNER_LIST_BLOB_COUNT_MAX = 16 * OWNER_READ_COUNT_MAX
# Names one list_identities page may walk. Where the service honours startFrom (Azure, Azurite) a
# page walks at most its ids plus the cursor's own name and its '.'-ended prefixes' (below
# NODE_ID_LENGTH_MAX), in one request; this bound is for a service that ignores startFrom and
# lists from the prefix's start: then a page costs a request per 5000 names before its cursor,
# and a deployment with more identities than this fails its listing rather than run past its
# deadline.
IDENTITY_LIST_BLOB_COUNT_MAX = 16 * IDENTITY_PAGE_COUNT_MAX
# The service's limit on names in one listing response.
LIST_RESULTS_PER_PAGE_MAX = 5000
# Names one scan page may list: two listing responses. Tombstones stay in the listing until the
# lifecycle rule drops them, a day or more, so a busy log holds millions: one call walking them
# all outlived its deadline on every retry, and recovery never finished (found by review). The page
# then ends where the walk stopped, and the next resumes there. It also stops once this share of
# its call's time is gone (a slow listing), keeping the rest for reading what it found.
SCAN_WALK_NAME_COUNT_MAX = 2 * LIST_RESULTS_PER_PAGE_MAX
SCAN_WALK_TIME_SHARE = 0.5

_STATE_METADATA = "state"
_APPLIED_METADATA = "applied"
# A decision tombstone's blob index tags, on which the Terraform module's lifecycle rules filter
# (terraform/modules/azure/main.tf spells the same names and values): only a blob that carries one
# is ever deleted by those rules, so no record a node still needs can be. The days tag says after
# how many whole days its rule may delete the tombstone: its keep, rounded up.
TOMBSTONE_TAG = "cornus-tombstone"
TOMBSTONE_TAG_VALUE = "1"
TOMBSTONE_DAYS_TAG = "cornus-tombstone-days"
DAY_MS = 86_400_000  # lifecycle rules count whole days
TOMBSTONE_DAYS_MAX = -(-TOMBSTONE_KEEP_MS_MAX // DAY_MS)


def tombstone_tags(keep_ms: int | None) -> dict[str, str]:
    """The tags of a tombstone kept `keep_ms` (None: one an earlier version wrote without its
    keep, which only the backstop rule of the legacy tag drops, 8 days after its last write)."""
    if keep_ms is None:
        return {TOMBSTONE_TAG: TOMBSTONE_TAG_VALUE}
    days = -(-keep_ms // DAY_MS)
    assert 1 <= days <= TOMBSTONE_DAYS_MAX, f"a keep of {keep_ms} ms has no lifecycle rule"
    return {TOMBSTONE_TAG: TOMBSTONE_TAG_VALUE, TOMBSTONE_DAYS_TAG: str(days)}


# A decision tombstone's expiry (wall clock, ms since the epoch), for operators and checks: the
# lifecycle rule counts days from Last-Modified instead (see the module docstring).
TOMBSTONE_EXPIRY_METADATA = "tombstone_expires_at_ms"
# And its keep (ms): a store that rewrites the tombstone (a late `log`) has its sweep delete it that
# long after the rewrite, counted by its own clock (not from the expiry above, another node's).
TOMBSTONE_KEEP_METADATA = "tombstone_keep_ms"
# The ownership record, urlsafe base64 of the body, so a listing carries it.
_OWNER_METADATA = "ownership"
_OWNER_PREFIX = "own/"
# Where the identity records' blobs are: the ownership blobs of names with the identity prefix.
_IDENTITY_BLOB_PREFIX = _OWNER_PREFIX + IDENTITY_PREFIX

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class _Stored:
    """A record as read, with the ETag that a conditional overwrite must match and, for a decision
    tombstone, its expiry and keep metadata (None for any other record), which an overwrite carries
    again."""

    record: Record
    etag: str
    tombstone_expiry: str | None = None
    tombstone_keep_ms: str | None = None


@dataclass(frozen=True, slots=True)
class _Wanted:
    """Which records a scan returns: `listed`, from a blob's listed metadata, whether it may be one
    (True where the metadata cannot tell); `stored`, from the record as read, whether it is."""

    listed: Callable[[Mapping[str, str]], bool]
    stored: Callable[[_Stored], bool]


def _listed_state(metadata: Mapping[str, str]) -> tuple[TxnState, bool] | None:
    """The state and applied flag a blob's listed metadata gives; None where it gives none."""
    state_value = metadata.get(_STATE_METADATA, "")
    if state_value not in TxnState.__members__:
        return None
    return TxnState(state_value), metadata.get(_APPLIED_METADATA) == "true"


def _listed_unfinished(metadata: Mapping[str, str]) -> bool:
    listed = _listed_state(metadata)
    return listed is None or is_unfinished(*listed)


def _listed_finished(metadata: Mapping[str, str]) -> bool:
    listed = _listed_state(metadata)
    return listed is None or (not is_unfinished(*listed) and TOMBSTONE_EXPIRY_METADATA not in metadata)


def _finished(record: Record) -> bool:
    """Finished, as scan_finished_page returns them: an ABORT, or a COMMIT applied (a
    coordinator's COMMIT never is)."""
    return record.state is TxnState.ABORT or (record.state is TxnState.COMMIT and record.applied)


_UNFINISHED = _Wanted(_listed_unfinished, lambda s: is_unfinished(s.record.state, s.record.applied))
_FINISHED = _Wanted(_listed_finished, lambda s: _finished(s.record) and s.tombstone_expiry is None)


def _keep_ms_of(stored: _Stored) -> int | None:
    """The keep a tombstone was written with, from its metadata; None where an earlier version
    recorded none."""
    keep = stored.tombstone_keep_ms
    return int(keep) if keep is not None and keep.isdigit() else None


@dataclass(frozen=True, slots=True)
class _StoredOwner:
    """An ownership record as read, with the ETag that a conditional overwrite must match and
    when its version landed (Azure's clock), which a fenced write's lease window counts from."""

    ownership: Ownership
    etag: str
    last_modified: datetime.datetime | None


def _segment(value: str) -> str:
    # See the module docstring: Azure mishandles path segments that end with '.'.
    return value + "~" if value.endswith(".") else value


def _record_name(log: LogId, txn: str) -> str:
    return f"{_record_prefix(log)}{_segment(txn)}"


def _record_prefix(log: LogId) -> str:
    if log.kind is LogKind.CLUSTER:
        # Outside txn/, which the Terraform module's rule of old records sweeps: the cluster
        # record is never rewritten, and must last as long as the data it describes.
        return "cluster/"
    return f"txn/{_segment(log.key)}/"


def _txn_of(prefix: str, name: str) -> str:
    """The txn id of a record blob listed under `prefix`: `_record_name` inverted."""
    segment = name[len(prefix) :]
    return segment[:-1] if segment.endswith(".~") else segment


def _dotted_prefixes(txn: str) -> list[str]:
    """The proper prefixes of `txn` that end in '.': the only ids below `txn` whose blob names
    list after its own (see the module docstring)."""
    return [txn[: i + 1] for i, char in enumerate(txn[:-1]) if char == "."]


# Data blob ETags remembered per store: about 200 bytes each for short keys, about 870 with the
# contract's longest (512 bytes), so 87 MB at most (measured by audit, 2026-11-28).
DATA_ETAG_COUNT_MAX = 100_000
# A deleted value's blob stays, as a tombstone, so that a later write can be conditional on it.
_DELETED = "deleted"
_DELETED_VALUE = {_DELETED: "1"}


def _data_name(partition: str, key: str) -> str:
    encoded = base64.urlsafe_b64encode(key.encode("utf-8")).decode("ascii")
    return f"data/{_segment(partition)}/{encoded}"


def _owner_name(partition: str) -> str:
    return _OWNER_PREFIX + _segment(partition)


def _partition_of_owner_name(name: str) -> str:
    """`_owner_name` inverted."""
    assert name.startswith(_OWNER_PREFIX), name
    segment = name[len(_OWNER_PREFIX) :]
    return segment[:-1] if segment.endswith(".~") else segment


def _identity_blob_name(node: str) -> str:
    """The blob of `node`'s identity record: `_owner_name(identity_name(node))`."""
    return _IDENTITY_BLOB_PREFIX + _segment(node)


def _node_of_identity_blob(name: str) -> str:
    """`_identity_blob_name` inverted; InvariantViolation for a blob under the prefix that no
    identity take could have written."""
    assert name.startswith(_IDENTITY_BLOB_PREFIX), name
    segment = name[len(_IDENTITY_BLOB_PREFIX) :]
    node = segment[:-1] if segment.endswith(".~") else segment
    try:
        return validate_id(node, "node id", NODE_ID_LENGTH_MAX)
    except ValidationError as error:
        raise InvariantViolation(f"blob {name!r} lies among the identity records but names no node: {error}") from error


def _encode_owner(ownership: Ownership) -> bytes:
    content = {
        "v": OWNER_FORMAT_VERSION,
        "partition": ownership.partition,
        "owner": ownership.owner,
        "epoch": ownership.epoch,
        "version": ownership.version,
        "lease_ms": ownership.lease_ms,
        "wanted_by": ownership.wanted_by,
    }
    return json.dumps(content, separators=(",", ":")).encode("utf-8")


def _decode_owner(partition: str, data: bytes) -> Ownership:
    try:
        content = json.loads(data)
        if content["v"] != OWNER_FORMAT_VERSION:
            raise InvariantViolation(f"ownership of {partition} has format version {content['v']!r}")
        if content["partition"] != partition:
            raise InvariantViolation(f"blob for the ownership of {partition} holds {content['partition']}'s")
        return Ownership(
            partition=partition,
            owner=content["owner"],
            epoch=content["epoch"],
            version=content["version"],
            lease_ms=content["lease_ms"],
            wanted_by=content["wanted_by"],
        )
    except (KeyError, TypeError, ValueError) as error:
        # ValidationError is a ValueError: a stored record that no longer validates is corruption.
        raise InvariantViolation(f"ownership of {partition} is unreadable: {error}") from error


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


def _encode_tombstone(log: LogId, txn: str, keep: Tombstone) -> tuple[bytes, dict[str, str]]:
    """The blob of `keep`'s tombstone: the record reduced to the decision (no body; a COMMIT counts
    as applied, since garbage collection runs only once every participant applied), with its
    expiry in the metadata beside the {state, applied} that tell a scan it is finished."""
    now_ms = _now_ms()
    record = Record(
        log=log,
        txn=txn,
        state=keep.decision,
        applied=keep.decision is TxnState.COMMIT,
        created_at_ms=now_ms,
    )
    # A scan must skip it unread: nothing is left for recovery to do.
    assert not is_unfinished(record.state, record.applied), record
    content, metadata = _encode_record(record)
    metadata[TOMBSTONE_EXPIRY_METADATA] = str(now_ms + keep.keep_ms)
    metadata[TOMBSTONE_KEEP_METADATA] = str(keep.keep_ms)
    return content, metadata


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



# What a conditional put that lost its precondition is answered: 409 BlobAlreadyExists to
# If-None-Match: *, 412 ConditionNotMet to If-Match, 404 BlobNotFound where the blob went meanwhile.
# Any other code (index tags on a hierarchical-namespace account, an immutability policy, a missing
# container) is an error of its own, which a retry would only repeat (found by review: every 409
# was taken for a lost race, read and put again 16 times, then reported as unavailable).
_LOST_RACE_CODES = frozenset({"BlobAlreadyExists", "ConditionNotMet", "BlobNotFound"})
_PRECONDITION_ERRORS = (ResourceExistsError, ResourceModifiedError, ResourceNotFoundError)


def _lost_race(error: HttpResponseError) -> bool:
    """Whether `error` says a conditional put lost its precondition (see _LOST_RACE_CODES). A
    service that names no code is taken at its status, as the SDK's exception type says."""
    code = getattr(error, "error_code", None)  # the SDK's StorageErrorCode where it knows the code
    return code is None or str(getattr(code, "value", code)) in _LOST_RACE_CODES


def _status_error(status: int, code: str, message: str | None, what: str) -> StorageError:
    """The contract's error for an HTTP error status: the retryable ones are StorageUnavailable."""
    if status >= 500 or status in (408, 429):
        return StorageUnavailable(f"azure_blob {what}: HTTP {status} {code}")
    if status == 403:
        # Not a late arrival (arrived_expired): the key, or, before any answer told this store
        # Azure's time (azure_signing.AzureClock), this node's clock.
        return StorageError(
            f"azure_blob {what}: HTTP 403 {code}: {message} (check the account key; on the first requests "
            "after a start, also that this node's clock is not far from Azure's: signatures expire by it "
            "until Azure's own time is known)"
        )
    return StorageError(f"azure_blob {what}: HTTP {status} {code}: {message}")


def _unless_blob_absent(error: ResourceNotFoundError, what: str) -> None:
    """Return if `error` says the blob is not there; raise the contract's error for any other 404
    (found by audit: ContainerNotFound, the container deleted or misnamed, read as every blob
    absent: records, owners, data keys, and fence checks as partitions nobody holds). A service
    that names no code is taken at its status, as the SDK's exception type says."""
    code = getattr(error, "error_code", None)
    name = None if code is None else str(getattr(code, "value", code))
    if name is not None and name != "BlobNotFound":
        raise _status_error(404, name, getattr(error, "message", None), what) from error


def _owner_metadata(content: bytes) -> dict[str, str]:
    return {_OWNER_METADATA: base64.urlsafe_b64encode(content).decode("ascii")}


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
    # A tick's deletes and keeps share their ownership reads (see _delete_many).
    coalesces_deletes = True
    # The store's own sweep deletes its tombstones once their keep has passed (azure_tombstone_sweep).
    drops_tombstones_at_expiry = True

    def __init__(self, service: BlobServiceClient, container: ContainerClient, timeout_ms_call: int) -> None:
        super().__init__(timeout_ms_call)
        self._service = service
        self._container = container
        assert isinstance(service.credential, ExpiringSignatures), "open() signs every request (azure_signing)"
        self._signatures = service.credential
        # Deletes the tombstones this store puts once their keep has passed (azure_tombstone_sweep).
        self._tombstone_sweep = TombstoneSweep(self._delete_tombstone)
        # The start a passing-on write of each partition carries (write_owner), until it is sent.
        self._not_before_unix_s: dict[str, int] = {}
        # The ETag of each data blob as this store last wrote or read it: a data write is
        # conditional on it (see put in _apply_redo), and an owner, the only writer of its keys,
        # mostly knows it, so the write costs one request, not a read first. A stale entry (the
        # partition was written elsewhere meanwhile) only fails that write, which drops it.
        self._data_etags: collections.OrderedDict[tuple[str, str], str] = collections.OrderedDict()

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
            parsed = BlobServiceClient.from_connection_string(connection_string)
        except ValueError as error:
            raise ValidationError(f"bad connection string: {error}") from error
        key = parsed.credential
        await parsed.close()
        if not isinstance(key, SharedKeyCredentialPolicy):
            raise ValidationError("the connection string needs the account key (AccountKey=): each request is "
                                  "signed with it, for a time Azure checks (storage_adapters/azure_signing.py)")
        service = BlobServiceClient(
            parsed.url,
            credential=ExpiringSignatures(key.account_name, key.account_key, timeout_s),
            # The transport's timeouts make a stuck socket fail inside the SDK; the asyncio
            # deadline around every call is the backstop that also covers DNS, TLS and pools.
            transport=_OnceTransport(connection_timeout=timeout_s, read_timeout=timeout_s),
            retry_total=SDK_RETRY_COUNT_MAX,
        )
        store = cls(service, service.get_container_client(container), timeout_ms_call)
        if create_container:
            try:
                await store._bounded(store._create_container(), "create_container")
            except BaseException:
                await service.close()
                raise
        return store

    def _storage_error(self, error: Exception, what: str) -> StorageError | None:
        """Transport failures and the service's errors as the contract's typed errors, so callers
        never see an SDK exception (the template bounds the call and maps TimeoutError)."""
        if isinstance(error, ServiceRequestError | ServiceResponseError | aiohttp.ClientError | OSError):
            return StorageUnavailable(f"azure_blob {what}: {type(error).__name__}: {error}")
        if isinstance(error, HttpResponseError):
            late = arrived_expired(error)
            if late is not None:
                # Its signature was out of its time when it arrived (azure_signing): a late (or,
                # with a start, early) request, not a credential Azure refuses.
                return StorageUnavailable(f"azure_blob {what}: {late}")
            if error.status_code is None:
                # No response to judge: a body cut short (azure-core's IncompleteReadError) or a
                # download whose body reads failed. Only errors the storage SDK processed carry
                # error_code (found by review: its absence raised AttributeError here).
                return StorageUnavailable(f"azure_blob {what}: {type(error).__name__}: {error}")
            return _status_error(error.status_code, str(getattr(error, "error_code", None)), error.message, what)
        return None

    async def _create_container(self) -> None:
        with contextlib.suppress(ResourceExistsError):
            await self._container.create_container()

    # Requests. Each is one HTTP round trip.

    async def _get(self, log: LogId, txn: str) -> _Stored | None:
        blob = self._container.get_blob_client(_record_name(log, txn))
        try:
            downloader = await blob.download_blob()
            data = await downloader.readall()
        except ResourceNotFoundError as error:
            _unless_blob_absent(error, "read")
            return None
        etag = downloader.properties.etag
        assert etag
        metadata = downloader.properties.metadata or {}
        return _Stored(_decode_record(log, txn, data), etag, metadata.get(TOMBSTONE_EXPIRY_METADATA),
                       metadata.get(TOMBSTONE_KEEP_METADATA))

    async def _put_if(
        self, name: str, content: bytes, metadata: dict[str, str], etag: str | None,
        tags: dict[str, str] | None = None,
    ) -> str | None:
        """Put the blob `name` if its ETag is still `etag` (`If-Match`), or, with `etag` None, if
        there is no such blob (`If-None-Match: *`): the blob's new ETag, or None if that
        precondition lost (another writer's blob stands, or the blob changed or went). Any other
        refusal is raised as the error it is (`_lost_race`). The one conditional put of every
        record, tombstone and ownership write."""
        blob = self._container.get_blob_client(name)
        try:
            if etag is None:
                # overwrite=False is what sends If-None-Match: *.
                written = await blob.upload_blob(content, overwrite=False, metadata=metadata, tags=tags)
            else:
                written = await blob.upload_blob(content, overwrite=True, metadata=metadata, tags=tags, etag=etag,
                                                 match_condition=MatchConditions.IfNotModified)
        except _PRECONDITION_ERRORS as error:
            if not _lost_race(error):
                raise
            return None
        new_etag = written["etag"]
        assert new_etag, f"{name}: a put answered without an ETag"
        return str(new_etag)

    async def _create(self, record: Record) -> bool:
        """Put the record if absent; False if a blob already exists."""
        content, metadata = _encode_record(record)
        return await self._put_if(_record_name(record.log, record.txn), content, metadata, None) is not None

    async def _replace(self, stored: _Stored, record: Record) -> bool:
        """Overwrite `stored` with `record` if its ETag is still the one read; False if it changed or
        vanished. A tombstone stays one, as on every other backend (its key expiry, row expiry or
        expires_at outlive a rewrite): a Put Blob replaces the blob's tags with those it carries,
        so the put carries the tombstone's tag and expiry again, or the lifecycle rule would never
        drop the blob (found by review: a `log` over a tombstone left it untagged for good). Only a
        decision's own `log` gets here over a tombstone (`check_log_transition`; `apply_redo`
        finds a COMMIT one applied), so what stays tagged is still a finished record."""
        content, metadata = _encode_record(record)
        tags = None
        keep_ms = _keep_ms_of(stored)
        if stored.tombstone_expiry is not None:
            assert not is_unfinished(record.state, record.applied), record
            metadata[TOMBSTONE_EXPIRY_METADATA] = stored.tombstone_expiry
            if stored.tombstone_keep_ms is not None:
                metadata[TOMBSTONE_KEEP_METADATA] = stored.tombstone_keep_ms
            tags = tombstone_tags(keep_ms)
        name = _record_name(record.log, record.txn)
        written = await self._put_if(name, content, metadata, stored.etag, tags)
        if written is not None and keep_ms is not None:
            # Still the tombstone, with a new ETag: the sweep deletes it a whole keep from now (later
            # than it had to, never earlier: the expiry it had is another node's clock, found by
            # review). One written before its keep was recorded is left to the lifecycle rule.
            self._tombstone_sweep.remember(name, written, keep_ms)
        return written is not None

    async def _put_tombstone(self, log: LogId, txn: str, keep: Tombstone, etag: str | None) -> bool:
        """Put `keep`'s tombstone, tagged for the lifecycle rule, over the record's blob if its ETag
        is still `etag` (None: if there is no blob); False if that precondition failed."""
        content, metadata = _encode_tombstone(log, txn, keep)
        name = _record_name(log, txn)
        written = await self._put_if(name, content, metadata, etag, tombstone_tags(keep.keep_ms))
        if written is None:
            return False
        self._tombstone_sweep.remember(name, written, keep.keep_ms)
        return True

    async def _delete_tombstone(self, name: str, etag: str) -> bool:
        """Delete the tombstone blob `name` if it is still the one put with `etag` (the sweep, once
        its keep has passed); whether it did. One rewritten since (its newer ETag is queued too),
        or gone, is left as it is; a missing container is an error."""

        async def delete() -> bool:
            blob = self._container.get_blob_client(name)
            try:
                await blob.delete_blob(etag=etag, match_condition=MatchConditions.IfNotModified)
            except ResourceModifiedError:
                return False
            except ResourceNotFoundError as error:
                _unless_blob_absent(error, "delete")
                return False
            return True

        return await self._bounded(delete(), "delete")

    async def _get_owner(self, partition: str) -> _StoredOwner | None:
        blob = self._container.get_blob_client(_owner_name(partition))
        try:
            downloader = await blob.download_blob()
            data = await downloader.readall()
        except ResourceNotFoundError as error:
            _unless_blob_absent(error, "read_owners")
            return None
        etag = downloader.properties.etag
        assert etag
        return _StoredOwner(_decode_owner(partition, data), etag, downloader.properties.last_modified)

    async def _put_owner(self, ownership: Ownership, etag: str | None) -> bool:
        """Put the ownership record if the blob's ETag is still `etag` (None: if there is no blob);
        False if that precondition failed."""
        content = _encode_owner(ownership)
        content_metadata = _owner_metadata(content)
        return await self._put_if(_owner_name(ownership.partition), content, content_metadata, etag) is not None

    async def _check_fence(self, fence: Fence) -> None:
        """Raise Fenced unless the ownership record admits `fence`. A request of its own, BEFORE the
        write it guards, whose lease window then bounds when the write may land (azure_signing)."""
        stored = await self._get_owner(fence.partition)
        owner = stored.ownership if stored is not None else None
        if not fence.admits(owner):
            raise Fenced(fence, owner)
        assert stored is not None
        admit_until(fence.partition, fence.epoch, stored.last_modified, stored.ownership.lease_ms)

    async def _get_fenced(self, log: LogId, txn: str, fence: Fence | None) -> _Stored | None:
        """The record, as `_get`; with a fence, the fence checked too, in a request run alongside
        (so a fenced read-modify-write costs no more round trips than an unfenced one)."""
        if fence is None:
            return await self._get(log, txn)
        try:
            async with asyncio.TaskGroup() as group:
                checked = group.create_task(self._check_fence(fence))
                read = group.create_task(self._get(log, txn))
        except BaseExceptionGroup as errors:
            raise _first_leaf(errors) from None
        assert checked.done() and checked.exception() is None
        return read.result()

    # The contract.

    @in_signing_window
    async def _log_once(
        self, log: LogId, txn: str, state: TxnState, body: RecordBody, fence: Fence | None
    ) -> LogOnceResult:
        record = Record(log=log, txn=txn, state=state, body=body, applied=False, created_at_ms=_now_ms())
        if fence is not None:
            # Before the create, and not alongside it, so a refused fence writes nothing and
            # wins over an existing record, as the contract orders.
            await self._check_fence(fence)
        if await self._create(record):
            return LogOnceResult(state=state, created=True)
        # Someone else won: learn what they stored. Gone already, it was a tombstone whose keep
        # had passed, deleted by the sweep since (found by audit): nothing was written, and the
        # caller may try again.
        stored = await self._get(log, txn)
        if stored is None:
            raise StorageUnavailable(f"azure_blob log_once {log.key}/{txn}: lost its create, and found no blob on "
                                     "the read back (an expired tombstone swept meanwhile)")
        return LogOnceResult(state=stored.record.state, created=False)

    @in_signing_window
    async def _log(
        self, log: LogId, txn: str, state: TxnState, body: RecordBody | None, fence: Fence | None
    ) -> TxnState:
        for _ in range(ETAG_RETRY_COUNT_MAX):
            # The fence is checked again on every attempt, so the gap between check and write
            # stays one round trip however many ETag races came before.
            stored = await self._get_fenced(log, txn, fence)
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
            if await self._replace(stored, wanted):
                return state
        raise StorageUnavailable(
            f"azure_blob: log {log.key}/{txn} lost {ETAG_RETRY_COUNT_MAX} ETag races in a row"
        )

    async def _read(self, log: LogId, txn: str) -> Record | None:
        stored = await self._get(log, txn)
        return stored.record if stored is not None else None

    async def _read_matching(self, log: LogId, txns: Sequence[str], wanted: _Wanted) -> dict[str, Record]:
        """Read each of `txns` (one request each); those `wanted` still, by txn id."""
        stored = await _gather_bounded([lambda txn=txn: self._get(log, txn) for txn in txns])
        return {s.record.txn: s.record for s in stored if s is not None and wanted.stored(s)}

    async def _scan_page(self, log: LogId, limit: int, after: str) -> ScanPage:
        return await self._walk_page(log, limit, after, _UNFINISHED)

    async def _scan_finished_page(self, log: LogId, limit: int, after: str) -> ScanPage:
        page = await self._walk_page(log, limit, after, _FINISHED)
        records = tuple(replace(r, body=RecordBody(r.body.participants, r.body.coordinator)) for r in page.records)
        return ScanPage(records, page.resume_after)

    async def _walk_page(self, log: LogId, limit: int, after: str, wanted: _Wanted) -> ScanPage:
        """A page of the records `wanted` picks: the listing walked in name order from `after`,
        each name whose metadata may be one read (`wanted.listed`), and kept if it still is as
        read (`wanted.stored`), within the walk's bounds (module docstring)."""
        prefix = _record_prefix(log)
        found: dict[str, Record] = {}
        # The listing is in name order; startFrom (inclusive) skips the names of earlier pages.
        # No name is below its own id, so every id above `after` lists at or past it. The id
        # filter below stays: it drops `after` itself and, were startFrom ignored by a service,
        # everything before it.
        listing = self._container.list_blobs(
            name_starts_with=prefix, include=["metadata"], start_from=prefix + after if after else None,
            results_per_page=min(LIST_RESULTS_PER_PAGE_MAX, SCAN_WALK_NAME_COUNT_MAX),
        ).by_page()
        listed: collections.deque[BlobProperties] = collections.deque()  # the current response's rest
        loop = asyncio.get_running_loop()
        walk_until = loop.time() + (call_deadline() - loop.time()) * SCAN_WALK_TIME_SHARE
        last_name = ""
        last_walked = ""  # the greatest id past `after` listed so far
        listed_count = 0
        exhausted = False

        async def next_blob() -> BlobProperties | None:
            """The next name listed; None at the listing's end (`exhausted`) or, between two
            listing responses (time passes only in them), once this page walked enough: its bound
            of names, or its share of the call's time. Only once an id past `after` was walked:
            the page must move its cursor (the cursor's own name and its dotted prefixes' list
            first)."""
            nonlocal exhausted, listed_count
            if not listed:
                if last_walked and (listed_count >= SCAN_WALK_NAME_COUNT_MAX or loop.time() >= walk_until):
                    return None
                # A response may hold no name and still go on (a continuation marker); each one
                # moves the marker, and the call's deadline bounds them.
                while not listed:
                    response = await anext(listing, None)
                    if response is None:
                        exhausted = True
                        return None
                    listed.extend([blob async for blob in response])
            listed_count += 1
            return listed.popleft()

        stopped = False  # at the listing's end, or the walk's bound, or the page's bytes
        read_bytes = 0
        for _ in range(SCAN_ROUND_COUNT_MAX):
            txns: list[str] = []
            while len(found) + len(txns) < limit and read_bytes < SCAN_PAGE_BYTES_MAX:
                blob = await next_blob()
                if blob is None:
                    stopped = True
                    break
                assert blob.name > last_name, "a listing is in name order"
                last_name = blob.name
                txn = _txn_of(prefix, blob.name)
                if txn <= after:
                    continue
                last_walked = max(last_walked, txn)
                # The metadata lets us skip records of the other kind without reading them. A blob
                # without it (or with a value we do not know) is read rather than skipped, so
                # nothing hides.
                if not wanted.listed(blob.metadata or {}):
                    continue
                txns.append(txn)
                # The contract's SCAN_PAGE_BYTES_MAX, as the listing sizes the blobs (a record's
                # JSON holds its redo in base64): the page ends after the one that passes it, and
                # the next resumes there, as after the walk's bound (found by audit: a page of
                # 1,000 large votes read about 175 MB at once).
                read_bytes += blob.size or 0
            stopped = stopped or read_bytes >= SCAN_PAGE_BYTES_MAX
            # A record finished or collected since it was listed drops out here; the next
            # round refills the page from where the listing stopped.
            found |= await self._read_matching(log, txns, wanted)
            if stopped or len(found) == limit:
                break
        else:
            raise StorageUnavailable(
                f"azure_blob: scan of {log.key}: records kept finishing under it for {SCAN_ROUND_COUNT_MAX} rounds"
            )
        if exhausted:
            return ScanPage(tuple(found[txn] for txn in sorted(found)), None)
        # The page stops short of the listing's end (full, or at the walk's bound), so ids below
        # where it stops may still lie ahead in name order: only that id's dotted prefixes can
        # (module docstring).
        stop = max(found) if len(found) == limit else last_walked
        assert stop > after
        missed = [txn for txn in _dotted_prefixes(stop) if txn > after and _record_name(log, txn) > last_name]
        found |= await self._read_matching(log, missed, wanted)
        records = tuple(found[txn] for txn in sorted(found)[:limit])
        return ScanPage(records, records[-1].txn if len(records) == limit else stop)

    async def _read_data(self, partition: str, keys: tuple[str, ...]) -> dict[str, bytes | None]:
        unique = list(dict.fromkeys(keys))

        async def get(key: str) -> bytes | None:
            blob = self._container.get_blob_client(_data_name(partition, key))
            try:
                downloader = await blob.download_blob()
                value = await downloader.readall()
            except ResourceNotFoundError as error:
                _unless_blob_absent(error, "read_data")
                return None
            self._remember_etag((partition, key), downloader.properties.etag)
            return None if (downloader.properties.metadata or {}).get(_DELETED) else value

        values = await _gather_bounded([lambda key=key: get(key) for key in unique])
        return dict(zip(unique, values, strict=True))

    @in_signing_window
    async def _apply_redo(
        self, partition: str, txn: str, writes: dict[str, bytes | None], fence: Fence | None
    ) -> bool:
        log = LogId.partition(partition)

        async def put(key: str, value: bytes | None) -> None:
            # Over the blob as this store knows it only (see the module docstring): a late write
            # of an earlier attempt is refused, not left to undo a later transaction's. A blob it
            # knows nothing of is first written as a new one (If-None-Match: *); one that exists
            # is read for its ETag then.
            blob = self._container.get_blob_client(_data_name(partition, key))
            known = (partition, key)
            etag = self._data_etags.pop(known, None)  # put back below once written
            content, metadata = (b"", _DELETED_VALUE) if value is None else (value, None)
            try:
                if etag is None:
                    try:
                        written = await blob.upload_blob(content, overwrite=False, metadata=metadata)
                    except ResourceExistsError as error:
                        if not _lost_race(error):
                            raise
                        etag = (await blob.get_blob_properties()).etag
                if etag is not None:
                    written = await blob.upload_blob(content, overwrite=True, metadata=metadata, etag=etag,
                                                     match_condition=MatchConditions.IfNotModified)
            except _PRECONDITION_ERRORS as error:
                # A refusal for good (an immutability policy, a missing container) is the error it
                # is, as on the record path, not a race retried for ever (found by audit, 2026-11-28).
                if not _lost_race(error):
                    raise
                # Changed (or gone) since this store last saw it: nobody else writes a locked key,
                # so a write of an earlier attempt of this apply landed (or another owner's, before
                # this one took the partition). The participant applies again, over what it reads.
                raise StorageUnavailable(
                    f"azure_blob: apply_redo {log.key}/{txn}: data blob of {key!r} changed under the apply"
                ) from error
            self._remember_etag(known, written["etag"])

        # The fence is checked before any data is written (a redo refused here writes nothing),
        # and again before each later chunk and the marker, for a lease window from the latest
        # renewal (azure_signing): a redo deposed mid-way is a crash mid-apply to the next owner.
        stored = await self._get_fenced(log, txn, fence)
        self._check_appliable(log, txn, stored)
        assert stored is not None
        if stored.record.applied:
            # Writing again could undo a later txn's writes to the same keys.
            return False
        items = list(writes.items())
        for start in range(0, len(items), APPLY_CHUNK_COUNT):
            if start and fence is not None:
                # The lease window the first check found may end before many keys are in: each
                # chunk after the first checks the fence again, for a window from the latest
                # renewal (found under CI load: a 40-key apply outlived its window on every retry).
                await self._check_fence(fence)
            chunk = items[start:start + APPLY_CHUNK_COUNT]
            await _gather_bounded([lambda k=k, v=v: put(k, v) for k, v in chunk])
        if len(items) > APPLY_CHUNK_COUNT and fence is not None:
            await self._check_fence(fence)  # and the marker, after the last chunk
        # The data is in; now the record, COMMIT (if it was still our VOTE_YES) and applied.
        # Losing its ETag race (a concurrent applier, or an idempotent log(COMMIT) rewrite)
        # only means we read again and retry the marker. Nothing can have turned the record
        # into ABORT meanwhile (only its participant decides over its own vote); if something
        # did, the data is already written and the InvariantViolation says so.
        for _ in range(ETAG_RETRY_COUNT_MAX):
            assert stored is not None
            if stored.record.applied:
                return True  # a concurrent applier of this same redo set it: the data is ours too
            if await self._replace(stored, replace(stored.record, state=TxnState.COMMIT, applied=True)):
                return True
            stored = await self._get(log, txn)
            self._check_appliable(log, txn, stored)
        raise StorageUnavailable(
            f"azure_blob: apply_redo {log.key}/{txn} lost {ETAG_RETRY_COUNT_MAX} ETag races in a row"
        )

    def _remember_etag(self, known: tuple[str, str], etag: str | None) -> None:
        if etag is None:
            return
        self._data_etags[known] = etag
        self._data_etags.move_to_end(known)
        while len(self._data_etags) > DATA_ETAG_COUNT_MAX:
            self._data_etags.popitem(last=False)

    @staticmethod
    def _check_appliable(log: LogId, txn: str, stored: _Stored | None) -> None:
        if stored is None:
            raise InvariantViolation(f"apply_redo of {log.key}/{txn}: no record")
        if stored.record.state is TxnState.ABORT:
            raise InvariantViolation(f"apply_redo of {log.key}/{txn}: record is {stored.record.state}")

    @in_signing_window
    async def _delete(self, log: LogId, txn: str, fence: Fence | None, keep: Tombstone | None) -> bool:
        if keep is not None:
            return await self._keep(log, txn, fence, keep, await self._get_fenced(log, txn, fence))
        if fence is not None:
            await self._check_fence(fence)
        return await self._delete_blob(DeleteRequest(log, txn, fence))

    async def _keep(
        self, log: LogId, txn: str, fence: Fence | None, keep: Tombstone, stored: _Stored | None
    ) -> bool:
        """Put `keep`'s tombstone over `stored`, the record as read with its fence (if any) admitted
        alongside; True if there was a record. What was read is judged first (`check_tombstone`:
        a refusal writes nothing), and a put that loses its ETag race reads again, fence and all,
        and judges what it finds then (as `_log` does)."""
        for attempt in range(ETAG_RETRY_COUNT_MAX):
            if attempt:
                stored = await self._get_fenced(log, txn, fence)
            if stored is None:
                check_tombstone(log, txn, None, False, keep)
            else:
                check_tombstone(log, txn, stored.record.state, stored.record.applied, keep)
            if await self._put_tombstone(log, txn, keep, stored.etag if stored is not None else None):
                return stored is not None
        raise StorageUnavailable(
            f"azure_blob: delete (keep) {log.key}/{txn} lost {ETAG_RETRY_COUNT_MAX} ETag races in a row"
        )

    async def _delete_blob(self, request: DeleteRequest) -> bool:
        """Delete the record's blob (its fence already checked); True if it existed."""
        try:
            await self._container.get_blob_client(_record_name(request.log, request.txn)).delete_blob()
        except ResourceNotFoundError as error:
            _unless_blob_absent(error, "delete")
            return False
        return True

    async def _answer(self, call: Awaitable[T]) -> T | StorageError:
        """`call`'s result, or the contract's error it failed with, returned rather than raised: in a
        batch, one request's failure is its own caller's answer, not every caller's. An error the
        mapping does not know (a bug) is raised."""
        try:
            return await call
        except StorageError as error:
            return error
        except Exception as error:
            mapped = self._storage_error(error, "delete")
            if mapped is None:
                raise
            mapped.__cause__ = error
            return mapped

    async def _delete_many(self, requests: Sequence[DeleteRequest]) -> list[bool | StorageError]:
        """The plain deletes each as one request (`_delete_blob`), the keeps each as its own read and
        conditional put, all at once (bounded), after one read of each
        fenced partition's ownership blob: the check-then-write of a fenced delete, as in
        `_delete`, with the reads shared. The keeps' record reads go alongside those ownership
        reads, so a keep's put follows its fence check by one round trip, as a lone one's does.
        Each request gets its own answer or error (one request's failure is its own); only a
        failed ownership read fails them all."""
        assert 0 < len(requests) <= DELETE_BATCH_COUNT_MAX
        fenced = list(dict.fromkeys(request.fence.partition for request in requests if request.fence is not None))
        keeping = [index for index, request in enumerate(requests) if request.keep is not None]
        try:
            async with asyncio.TaskGroup() as group:
                owners_read = group.create_task(
                    _gather_bounded([lambda p=p: self._get_owner(p) for p in fenced])
                )
                records_read = group.create_task(_gather_bounded([
                    lambda i=i: self._answer(self._get(requests[i].log, requests[i].txn)) for i in keeping
                ]))
        except BaseExceptionGroup as errors:
            raise _first_leaf(errors) from None
        owners = owners_read.result()
        read = dict(zip(keeping, records_read.result(), strict=True))
        stored_owners = dict(zip(fenced, owners, strict=True))
        held = {p: stored.ownership if stored is not None else None for p, stored in stored_owners.items()}
        outcomes: list[bool | StorageError] = [False] * len(requests)
        deleting: list[int] = []
        kept: list[int] = []
        for index, request in enumerate(requests):
            fence = request.fence
            if fence is not None and not fence.admits(held[fence.partition]):
                outcomes[index] = Fenced(fence, held[fence.partition])
                continue
            if request.keep is None:
                deleting.append(index)
            elif isinstance(read[index], StorageError):
                outcomes[index] = read[index]  # its record could not be read: nothing written
            else:
                kept.append(index)

        async def delete(index: int) -> bool:
            return await self._delete_blob(requests[index])

        async def keep(index: int) -> bool:
            request, stored = requests[index], read[index]
            assert request.keep is not None and not isinstance(stored, StorageError)
            return await self._keep(request.log, request.txn, request.fence, request.keep, stored)

        async def in_own_window(index: int, call: Callable[[int], Awaitable[bool]]) -> bool:
            """`call(index)` in a signing window of its own, which the request's fence's lease
            window alone bounds: one partition's ending lease (or release) neither caps nor stops
            the other partitions' writes of the tick (found by review)."""
            with signing_window():
                fence = requests[index].fence
                if fence is not None:
                    stored_owner = stored_owners[fence.partition]
                    assert stored_owner is not None
                    admit_until(fence.partition, fence.epoch, stored_owner.last_modified,
                                stored_owner.ownership.lease_ms)
                return await call(index)

        answers = await _gather_bounded(
            [lambda i=i: self._answer(in_own_window(i, delete)) for i in deleting]
            + [lambda i=i: self._answer(in_own_window(i, keep)) for i in kept]
        )
        for index, answer in zip(deleting + kept, answers, strict=True):
            outcomes[index] = answer
        return outcomes

    async def _read_owners(self, partitions: tuple[str, ...]) -> dict[str, Ownership]:
        if len(partitions) <= OWNER_GET_COUNT_MAX:
            stored = await _gather_bounded([lambda p=p: self._get_owner(p) for p in partitions])
            return {s.ownership.partition: s.ownership for s in stored if s is not None}
        found = await self._list_owners(partitions)
        return {partition: found[partition] for partition in partitions if partition in found}

    async def _list_owners(self, partitions: Sequence[str]) -> dict[str, Ownership]:
        """The ownership records of `partitions` that exist, from a listing of the blobs under the
        partitions' common prefix (every `_owner_name(p)` starts with `own/` + p)."""
        wanted = set(partitions)
        # The common prefix of all names is that of the lowest and the highest.
        low, high = min(partitions), max(partitions)
        common_count = 0
        while common_count < min(len(low), len(high)) and low[common_count] == high[common_count]:
            common_count += 1
        prefix = _OWNER_PREFIX + low[:common_count]
        found: dict[str, Ownership] = {}
        unlisted: list[str] = []
        walked_count = 0
        async for blob in self._container.list_blobs(name_starts_with=prefix, include=["metadata"]):
            walked_count += 1
            if walked_count > OWNER_LIST_BLOB_COUNT_MAX:
                raise StorageError(
                    f"azure_blob: more than {OWNER_LIST_BLOB_COUNT_MAX} ownership blobs under {prefix!r}"
                )
            partition = _partition_of_owner_name(blob.name)
            if partition not in wanted:
                continue
            encoded = (blob.metadata or {}).get(_OWNER_METADATA)
            if encoded is None:
                # Not written by this adapter's put: read it rather than take it for absent.
                unlisted.append(partition)
                continue
            try:
                content = base64.urlsafe_b64decode(encoded.encode("ascii"))
            except (ValueError, binascii.Error) as error:
                raise InvariantViolation(f"ownership metadata of {partition} is unreadable: {error}") from error
            found[partition] = _decode_owner(partition, content)
        for stored in await _gather_bounded([lambda p=p: self._get_owner(p) for p in unlisted]):
            if stored is not None:
                found[stored.ownership.partition] = stored.ownership
        return found

    async def _list_identities(self, after: str, limit: int) -> list[str]:
        # Names at or above the cursor's whose ids are not above it: its own, and its '.'-ended
        # prefixes' (`x.~` lists after `x.y`). The page asks for those beside the ids it wants,
        # so that one request answers it.
        skippable_count = 1 + len(_dotted_prefixes(after)) if after else 0
        blobs = aiter(
            self._container.list_blobs(
                name_starts_with=_IDENTITY_BLOB_PREFIX,
                # startFrom is inclusive, and no name is below its own id, so every id above
                # `after` lists at or past it; the id filter below drops the rest (and everything
                # before `after`, were startFrom ignored by a service).
                start_from=_IDENTITY_BLOB_PREFIX + after if after else None,
                results_per_page=min(limit + skippable_count, LIST_RESULTS_PER_PAGE_MAX),
            )
        )
        found: set[str] = set()
        last_name = ""
        exhausted = False
        for _ in range(IDENTITY_LIST_BLOB_COUNT_MAX):
            blob = await anext(blobs, None)
            if blob is None:
                exhausted = True
                break
            assert blob.name > last_name, "a listing is in name order"
            last_name = blob.name
            node = _node_of_identity_blob(blob.name)
            if node > after:
                found.add(node)
                if len(found) == limit:
                    break
        else:
            raise StorageError(
                f"azure_blob: list_identities walked {IDENTITY_LIST_BLOB_COUNT_MAX} blobs for {limit} ids "
                "(does the service ignore startFrom?)"
            )
        if not exhausted and found:
            # The page stops short of the listing's end, so ids below its last one may still lie
            # ahead in name order: only that id's '.'-ended prefixes can (module docstring).
            maybe = [
                node
                for node in _dotted_prefixes(max(found))
                if node > after and _identity_blob_name(node) > last_name
            ]
            exists = await _gather_bounded([
                lambda n=n: self._container.get_blob_client(_identity_blob_name(n)).exists() for n in maybe
            ])
            found.update(node for node, there in zip(maybe, exists, strict=True) if there)
        return sorted(found)[:limit]

    async def write_owner(self, expected: Ownership | None, new: Ownership) -> OwnerWriteResult:
        """As the contract's, and a write that passes the partition on (a release, a take in a new
        epoch) first stops this store's fenced writes of the epoch passed on, then waits, outside
        the call's deadline, until each of those it sent has its answer (usually within a round
        trip) or has expired (at most a call's deadline and two seconds, its rounding and the
        start's): an answered write landed or was refused, and can land no later; after an expiry
        the write carries a start past it, which Azure checks by its clock (azure_signing)."""
        validate_owner_write(expected, new)  # a bad call changes nothing, here either
        if expected is not None and expected.owner and (new.owner, new.epoch) != (expected.owner, expected.epoch):
            passed_unix_s = self._signatures.clock.now_unix_s()  # in the signatures' time: Azure's
            answered = self._signatures.answered_count
            until_unix_s = self._signatures.pass_on(new.partition, expected.epoch)
            # Bounded: no fenced write of the partition is signed after pass_on, so `until` only
            # falls (as answers come), and the loop ends by its expiry at the latest. A write still
            # unanswered then stays counted, past its expiry by this clock too: the release
            # carries a start after it, for Azure's clock.
            while until_unix_s is not None:
                left_s = until_unix_s + 1 - self._signatures.clock.now_unix_s()
                if left_s <= 0:
                    self._not_before_unix_s[new.partition] = until_unix_s + 1
                    break
                await asyncio.sleep(min(left_s, UNANSWERED_POLL_MS / 1000))
                if self._signatures.answered_count != answered:  # else nothing changed
                    answered = self._signatures.answered_count
                    until_unix_s = self._signatures.unanswered_until(new.partition, passed_unix_s)
        return await super().write_owner(expected, new)

    @in_signing_window
    async def _write_owner(self, expected: Ownership | None, new: Ownership) -> OwnerWriteResult:
        start_unix_s = self._not_before_unix_s.pop(new.partition, None)
        if start_unix_s is not None:
            not_before(start_unix_s)
        if expected is None:
            if await self._put_owner(new, None):
                return OwnerWriteResult(stored=new, written=True)
        else:
            current = await self._get_owner(new.partition)
            if current is None or (current.ownership.epoch, current.ownership.version) != (
                expected.epoch,
                expected.version,
            ):
                return OwnerWriteResult(stored=current.ownership if current is not None else None, written=False)
            # If-Match on the ETag of the blob just compared: the put lands only if nothing
            # was written in between, which makes read-compare-put one compare-and-swap.
            if await self._put_owner(new, current.etag):
                return OwnerWriteResult(stored=new, written=True)
        # Lost a race: learn what won. Ownership blobs are never deleted and their version
        # only rises, so the winner's record is there and is not the one we expected.
        won = await self._get_owner(new.partition)
        assert won is not None, f"ownership of {new.partition}: precondition failed, yet no blob"
        assert expected is None or (won.ownership.epoch, won.ownership.version) != (
            expected.epoch,
            expected.version,
        ), f"ownership of {new.partition}: precondition failed on the expected record"
        return OwnerWriteResult(stored=won.ownership, written=False)

    def housekeeping_counts(self) -> Mapping[str, int]:
        # A rising left-to-the-rule count means the sweep falls behind (or Azure refuses its
        # deletes): recovery scans then list those tombstones until the lifecycle rule runs.
        return {"tombstones_swept": self._tombstone_sweep.deleted_count,
                "tombstones_left_to_lifecycle_rule": self._tombstone_sweep.dropped_count}

    async def close(self) -> None:
        await self._tombstone_sweep.close()
        # Container and blob clients share the service's transport; closing it closes them all.
        await self._service.close()

    # Test and operator helpers, not part of the contract.

    async def delete_container(self) -> None:
        """Drop the whole container (test teardown)."""

        async def drop() -> None:
            with contextlib.suppress(ResourceNotFoundError):
                await self._container.delete_container()

        await self._bounded(drop(), "delete_container")


__all__ = ["AzureBlobStore"]
