"""How long Azure accepts each request of the Azure Blob backend: the signature every request
carries, and the times after which (or before which) Azure refuses it on arrival.

Why. Azure accepts a Shared Key request for 15 minutes after it was signed, so a request that
missed its deadline may land long after its caller gave up. For most writes the contract's
tombstones make that harmless, but not for a fenced write: Azure has no condition spanning two
blobs, so a fenced write is a read of the partition's ownership blob and then the write, and a
write held on the network landed after its owner's lease ended, after another node had taken the
partition and scanned its log (found by review, 2026-11-26; tests/storage/test_azure_fence_window.py).

So every request carries an account shared access signature (SAS) signed for it alone, whose
expiry (`se`) Azure checks on arrival, with its own clock:
- every request's expiry is its call's deadline (rounded up to a whole second, a SAS's
  resolution): what lands at all lands by then;
- a fenced write's expiry is at most the end of the lease that the ownership blob it checked can
  still grant: that blob's Last-Modified (when its current version landed, by Azure's clock) plus
  the record's lease_ms. A taker takes only after watching that version unchanged for the lease
  plus clock slack (cornus.protocol.ownership), so an accepted fenced write landed before any take,
  and before the new owner's scan. One whose window is already over is not sent
  (StorageUnavailable: the owner's next renewal opens a new one);
- a write that passes a partition on (a release, a take in a new epoch) carries a start (`st`)
  after every fenced write this store signed for that partition expires, and waits until then
  before it is sent: a released partition is taken at once, so what its owner still had on the
  network must be refused by then.
A 403 for a request whose signature had expired by the time the answer came is that request
arriving late (StorageUnavailable), not a credential problem.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime
import functools
import math
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

from azure.core.exceptions import HttpResponseError
from azure.storage.blob import AccountSasPermissions, ResourceTypes, generate_account_sas
from azure.storage.blob._shared.authentication import SharedKeyCredentialPolicy

from storage_adapters.errors import StorageUnavailable
from storage_adapters.store import call_deadline_if_set

P = ParamSpec("P")
T = TypeVar("T")

# What the signatures allow: the blob operations the backend makes (records, data, ownership,
# listings, index tags, Blob Batch) on the account's containers and blobs.
_RESOURCE_TYPES = ResourceTypes(service=True, container=True, object=True)
_PERMISSIONS = AccountSasPermissions(read=True, write=True, delete=True, list=True, create=True, tag=True)
# Signatures differ only by their expiry and start, a few per second: signed once each (HMAC and
# formatting cost about 0.1 ms), the last few kept.
SIGNATURE_CACHE_COUNT_MAX = 64
# Partitions whose last fenced write's expiry is remembered: a node owns at most a few thousand
# (OWNER_READ_COUNT_MAX); entries already expired are dropped past this.
SIGNED_PARTITION_COUNT_MAX = 8192
# Requests that write nothing: a window's bounds are for writes (a fence check's own read of the
# ownership blob must never be refused by the start it is about to compute).
_READS = frozenset({"GET", "HEAD"})


@dataclass(slots=True)
class _Window:
    """What the requests of one storage call may be signed for: each fenced partition's lease end
    (unix seconds, Azure's clock) as the call's ownership reads found it, and the start a write
    passing a partition on must carry."""

    lease_ends_unix_s: dict[str, int] = field(default_factory=dict)
    not_before_unix_s: int | None = None


_window: ContextVar[_Window | None] = ContextVar("cornus_azure_signing_window", default=None)


@contextlib.contextmanager
def signing_window() -> Iterator[None]:
    """Scope one storage call's requests: the lease ends its fence checks find (`admit_until`)
    bound the expiry of the writes it makes after them, and nothing after the call."""
    token = _window.set(_Window())
    try:
        yield
    finally:
        _window.reset(token)


def in_signing_window(method: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
    """`method` (a storage call that writes) run in a `signing_window` of its own."""

    @functools.wraps(method)
    async def in_window(*args: P.args, **kwargs: P.kwargs) -> T:
        with signing_window():
            return await method(*args, **kwargs)

    return in_window


def admit_until(partition: str, last_modified: datetime.datetime | None, lease_ms: int) -> None:
    """A fence check of this call admitted the ownership blob of `partition`, written (its current
    version) at `last_modified` with `lease_ms`: the call's writes from now on must land by then."""
    window = _window.get()
    assert window is not None, "a fence checked outside signing_window()"
    assert last_modified is not None, f"the ownership blob of {partition} has no Last-Modified"
    # Last-Modified has whole seconds, truncated: the version landed at or after it.
    window.lease_ends_unix_s[partition] = math.floor(last_modified.timestamp() + lease_ms / 1000)


def not_before(unix_s: int) -> None:
    """This call's writes carry start `unix_s`: Azure refuses them before it."""
    window = _window.get()
    assert window is not None, "a start set outside signing_window()"
    window.not_before_unix_s = unix_s


class ExpiringSignatures(SharedKeyCredentialPolicy):
    """The client's credential policy: signs each request (Blob Batch subrequests included) with
    an account SAS of its own expiry, instead of a Shared Key header (see the module docstring)."""

    def __init__(self, account_name: str, account_key: str, lifetime_s_max: float) -> None:
        super().__init__(account_name, account_key)
        self._account = (account_name, account_key)
        # Where no call deadline is known (a call bounded by its I/O), the client's own timeouts.
        self._lifetime_s_max = lifetime_s_max
        self._signatures: collections.OrderedDict[tuple[int, int | None], str] = collections.OrderedDict()
        # The latest expiry signed for a fenced write of each partition (unix seconds).
        self.fenced_expiry_unix_s: dict[str, int] = {}

    def on_request(self, request: Any) -> None:
        now_unix_s = time.time()
        lifetime_s = self._lifetime_s_max
        deadline = call_deadline_if_set()
        if deadline is not None:
            lifetime_s = min(lifetime_s, max(0.0, deadline - asyncio.get_running_loop().time()))
        expires_unix_s = math.ceil(now_unix_s + lifetime_s)
        window = _window.get()
        start_unix_s = None
        if window is not None and request.http_request.method not in _READS:
            start_unix_s = window.not_before_unix_s
            if window.lease_ends_unix_s:
                expires_unix_s = min(expires_unix_s, *window.lease_ends_unix_s.values())
                if expires_unix_s <= now_unix_s:
                    raise StorageUnavailable(
                        "azure_blob: the partition's ownership record grants no lease long enough for this "
                        f"write to land (its lease ended {now_unix_s - expires_unix_s:.1f} s ago, by the "
                        "blob's Last-Modified): not sent; the owner's next renewal opens a new window"
                    )
                self._remember(window.lease_ends_unix_s, expires_unix_s, now_unix_s)
        url = request.http_request.url
        request.http_request.url = url + ("&" if "?" in url else "?") + self._signature(expires_unix_s, start_unix_s)

    def _remember(self, partitions: dict[str, int], expires_unix_s: int, now_unix_s: float) -> None:
        for partition in partitions:
            self.fenced_expiry_unix_s[partition] = max(expires_unix_s, self.fenced_expiry_unix_s.get(partition, 0))
        if len(self.fenced_expiry_unix_s) > SIGNED_PARTITION_COUNT_MAX:
            for partition, expiry in list(self.fenced_expiry_unix_s.items()):
                if expiry < now_unix_s:
                    del self.fenced_expiry_unix_s[partition]

    def _signature(self, expires_unix_s: int, start_unix_s: int | None) -> str:
        key = (expires_unix_s, start_unix_s)
        signature = self._signatures.get(key)
        if signature is None:
            signature = generate_account_sas(
                *self._account, _RESOURCE_TYPES, _PERMISSIONS,
                expiry=datetime.datetime.fromtimestamp(expires_unix_s, datetime.UTC),
                start=None if start_unix_s is None else datetime.datetime.fromtimestamp(start_unix_s, datetime.UTC),
            )
            self._signatures[key] = signature
            if len(self._signatures) > SIGNATURE_CACHE_COUNT_MAX:
                self._signatures.popitem(last=False)
        return signature


def arrived_expired(error: HttpResponseError) -> bool:
    """Whether `error` is Azure refusing a request whose signature had expired by now: it arrived
    after its call's deadline or its lease window, or (with a start) before it may land."""
    if error.status_code != 403 or error.response is None:
        return False
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(error.response.request.url).query)
    now = datetime.datetime.now(datetime.UTC)
    try:
        expires = datetime.datetime.fromisoformat(query["se"][0])
        start = datetime.datetime.fromisoformat(query["st"][0]) if "st" in query else None
    except (KeyError, IndexError, ValueError):
        return False
    return now >= expires or (start is not None and now < start)
