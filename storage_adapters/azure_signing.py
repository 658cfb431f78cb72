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
- every request's expiry is its call's deadline in Azure's time (Azure's time as the Date of the
  answers this store had bounds it from below: `AzureClock`), rounded up to a SAS's resolution (a
  second) but for a write fenced by the node's identity, rounded down: no lease bounds those, and
  the next process of the node waits only a deadline and the clock slack after its take (a second
  of rounding used up most of that slack: found by audit, 2026-11-28). Signed by this node's
  wall clock, as before, a clock running ahead of Azure's kept a request acceptable that much
  longer, and a node's identity grants no lease a taker waits out: a deposed process's
  coordinator-log write held on the network landed after the next process had recovered and
  presumed ABORT (found by audit, 2026-11-27);
- a fenced write's expiry is at most the end of the lease that the ownership blob it checked can
  still grant: that blob's Last-Modified (when its current version landed, by Azure's clock) plus
  the record's lease_ms. A taker takes only after watching that version unchanged for the lease
  plus clock slack (cornus.protocol.ownership), so an accepted fenced write landed before any take,
  and before the new owner's scan. Both ends of that are Azure's clock; this node's is not
  consulted (a request whose window is over is sent, and refused);
- a write that passes a partition on (a release, a take in a new epoch) first stops this store
  from sending fenced writes of the epoch passed on (a fence check still in flight would send one
  after), then waits until each of those it sent and had no answer to has its answer, or has
  expired, and then carries a start (`st`) after that expiry: a released partition is taken at
  once, so what its owner still had on the network must be refused by then. Answered ones have
  landed or been refused already (but a 5xx, after which Azure may still complete the operation),
  so a release usually waits a round trip at most.
A 403 for a request whose signature was out of its time by Azure's clock when it arrived (the later
of the answer's Date header and the error message's own Time) is that request arriving late, or
early (StorageUnavailable: retried), not a credential problem (StorageError). What this leaves: a
request's headers are checked on arrival, so a body held up after them could commit later; the
store's sockets reset their connection when a call's deadline closes it, which drops what was still
to be sent (azure_blob._socket_resetting_on_close), but a proxy on the way that holds the data and
does not pass the reset on escapes it; and Azure's own clocks (the Last-Modified stamp, the
signature check) must agree within a taker's clock slack.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime
import email.utils
import functools
import math
import re
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

from azure.core.exceptions import HttpResponseError
from azure.storage.blob import AccountSasPermissions, ResourceTypes, generate_account_sas
from azure.storage.blob._shared.authentication import SharedKeyCredentialPolicy

from storage_adapters.contract import is_identity
from storage_adapters.errors import StorageUnavailable
from storage_adapters.store import call_deadline_if_set

P = ParamSpec("P")
T = TypeVar("T")

# What the signatures allow: the blob operations the backend makes (records, data, ownership,
# listings, index tags) on the account's containers and blobs.
_RESOURCE_TYPES = ResourceTypes(service=True, container=True, object=True)
_PERMISSIONS = AccountSasPermissions(read=True, write=True, delete=True, list=True, create=True, tag=True)
# Signatures differ only by their expiry and start, a few per second: signed once each (HMAC and
# formatting cost about 0.1 ms), the last few kept.
SIGNATURE_CACHE_COUNT_MAX = 64
# Fenced requests this store has sent and heard no answer to, remembered until their signatures
# expire: a node owns at most a few thousand partitions (OWNER_READ_COUNT_MAX), with a call or
# two in flight on each; past this, entries already expired are dropped, and a fenced write that
# finds no room is not sent (StorageUnavailable).
UNANSWERED_COUNT_MAX = 16_384
# Requests that write nothing: a window's bounds are for writes (a fence check's own read of the
# ownership blob must never be refused by the start it is about to compute).
_READS = frozenset({"GET", "HEAD"})
# How much faster this machine's monotonic clock may run than Azure's: NTP slews a clock by 500
# parts per million at most. A bound on Azure's clock (AzureClock) learned a while ago is lowered
# by this share of the time since, so that it stays a bound with no answer for hours.
CLOCK_RATE_DIFFERENCE_MAX = 0.000_5
# Where a fenced request's token travels from its signing to its answer (the pipeline context).
_TOKEN = "cornus_fenced_request"
# The server's time in an error's message ("...\nRequestId:...\nTime:2026-11-27T06:24:40.0094478Z").
_ERROR_TIME = re.compile(r"\bTime:(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z)")


@dataclass(slots=True)
class _Window:
    """What the requests of one storage call may be signed for: each fenced partition's epoch and
    lease end (unix seconds, Azure's clock) as the call's ownership reads found them, and the start
    a write passing a partition on must carry."""

    fences: dict[str, tuple[int, int]] = field(default_factory=dict)  # partition -> (epoch, lease end)
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


def admit_until(partition: str, epoch: int, last_modified: datetime.datetime | None, lease_ms: int) -> None:
    """A fence check of this call admitted the ownership blob of `partition` at `epoch`, written
    (its current version) at `last_modified` with `lease_ms`: the call's writes from now on must
    land by then."""
    window = _window.get()
    assert window is not None, "a fence checked outside signing_window()"
    assert last_modified is not None, f"the ownership blob of {partition} has no Last-Modified"
    # Last-Modified has whole seconds, truncated: the version landed at or after it.
    window.fences[partition] = (epoch, math.floor(last_modified.timestamp() + lease_ms / 1000))


def not_before(unix_s: int) -> None:
    """This call's writes carry start `unix_s`: Azure refuses them before it."""
    window = _window.get()
    assert window is not None, "a start set outside signing_window()"
    window.not_before_unix_s = unix_s


@dataclass(frozen=True, slots=True)
class _Unanswered:
    partitions: tuple[str, ...]
    expires_unix_s: int


class AzureClock:
    """Azure's time, never later than it is, from the Date of its answers. An answer dated D
    (whole seconds, truncated; a cached Date lags, which only lowers the bound) was served at or
    after D by Azure's clock, and at or before it arrived here, by this machine's monotonic clock
    (which no NTP step moves, and a suspend stops while Azure's runs on: both only lower the
    bound). So Azure's clock minus the monotonic one is at least D minus that arrival, and the
    largest such bound of recent answers is the tightest: within a request's time of the truth
    once a Date's second has begun between two answers, up to a second (and a lagging Date's
    lag) low before that, when a signature expires early (never late) and a short deadline's
    first calls after the start may be refused as unavailable. Before any answer, this node's
    wall clock is all there is."""

    def __init__(self) -> None:
        self._ahead_s: float | None = None  # Azure's clock minus time.monotonic(), at least
        self._since_s = 0.0  # monotonic, when that bound was learned

    def observe(self, date_unix_s: float, arrived_monotonic_s: float) -> None:
        ahead_s = date_unix_s - arrived_monotonic_s
        if self._ahead_s is None or ahead_s > self._aged(arrived_monotonic_s):
            self._ahead_s, self._since_s = ahead_s, arrived_monotonic_s

    def now_unix_s(self) -> float:
        if self._ahead_s is None:
            return time.time()
        now_s = time.monotonic()
        return now_s + self._aged(now_s)

    def _aged(self, at_monotonic_s: float) -> float:
        assert self._ahead_s is not None
        return self._ahead_s - max(0.0, at_monotonic_s - self._since_s) * CLOCK_RATE_DIFFERENCE_MAX


class ExpiringSignatures(SharedKeyCredentialPolicy):
    """The client's credential policy: signs each request with an account SAS of its own expiry,
    instead of a Shared Key header (see the module docstring), and keeps what a release of a
    partition must wait for: its fenced requests still unanswered, and the epochs passed on."""

    def __init__(self, account_name: str, account_key: str, lifetime_s_max: float) -> None:
        super().__init__(account_name, account_key)
        self._account = (account_name, account_key)
        # Where no call deadline is known (a call bounded by its I/O), the client's own timeouts.
        self._lifetime_s_max = lifetime_s_max
        self._signatures: collections.OrderedDict[tuple[int, int | None], str] = collections.OrderedDict()
        self._unanswered: collections.OrderedDict[object, _Unanswered] = collections.OrderedDict()
        # Fenced writes answered so far: a release waiting for answers looks through the unanswered
        # ones again only when it has grown (a stalled storage answers nothing for seconds).
        self.answered_count = 0
        # Per partition, the epoch this store is passing (or passed) on: its fenced writes of that
        # epoch or an earlier one are not sent any more. Passing a partition on waits for what was
        # sent before; this stops what a fence check still in flight would send after.
        self._passed_on: dict[str, int] = {}
        self.clock = AzureClock()

    def pass_on(self, partition: str, epoch: int) -> int | None:
        """Stop signing fenced writes of `partition` at `epoch` or before, and say until when (unix
        seconds, as signed) Azure may still accept one already sent and unanswered (None: none)."""
        self._passed_on[partition] = max(epoch, self._passed_on.get(partition, 0))
        return self.unanswered_until(partition, self.clock.now_unix_s())

    def unanswered_until(self, partition: str, since_unix_s: float) -> int | None:
        """Until when (unix seconds, as signed) Azure may still accept a fenced write of
        `partition` this store sent and has no answer to, of those whose signature had not expired
        at `since_unix_s` (None: none is left)."""
        expiries = [entry.expires_unix_s for entry in self._unanswered.values()
                    if partition in entry.partitions and entry.expires_unix_s >= since_unix_s]
        return max(expiries, default=None)

    def on_request(self, request: Any) -> None:
        now_unix_s = self.clock.now_unix_s()  # Azure's time, or a little earlier
        lifetime_s = self._lifetime_s_max
        deadline = call_deadline_if_set()
        if deadline is not None:
            lifetime_s = min(lifetime_s, max(0.0, deadline - asyncio.get_running_loop().time()))
        # Rounded up to the SAS's whole second: at most a second past the deadline in Azure's time,
        # never before it; a write fenced by a node's identity rounds down (below).
        expires_unix_s = math.ceil(now_unix_s + lifetime_s)
        window = _window.get()
        start_unix_s = None
        if window is not None and request.http_request.method not in _READS:
            start_unix_s = window.not_before_unix_s
            if window.fences:
                if any(is_identity(name) for name in window.fences):
                    # A node's identity grants no lease: what bounds a deposed process's
                    # coordinator-log write is this expiry, and the next process waits a deadline
                    # and the clock slack after its take (recovery_settle_ms). Rounded down, never
                    # past the deadline: rounded up, it spent up to a second of that slack (found by
                    # audit, 2026-11-28).
                    expires_unix_s = math.floor(now_unix_s + lifetime_s)
                for partition, (epoch, _) in window.fences.items():
                    if epoch <= self._passed_on.get(partition, 0):
                        raise StorageUnavailable(
                            f"azure_blob: a write fenced by {partition} epoch {epoch}, which this node is passing "
                            "on: not sent"
                        )
                # Azure judges the expiry by its clock, as it stamped Last-Modified: no check here
                # against this node's clock, which may differ (a request past it is refused there).
                expires_unix_s = min(expires_unix_s, *(end for _, end in window.fences.values()))
                self._remember(request, tuple(window.fences), expires_unix_s, now_unix_s)
        url = request.http_request.url
        request.http_request.url = url + ("&" if "?" in url else "?") + self._signature(expires_unix_s, start_unix_s)

    def on_response(self, request: Any, response: Any) -> None:
        date = response.http_response.headers.get("Date")
        if date:
            with contextlib.suppress(TypeError, ValueError):
                self.clock.observe(email.utils.parsedate_to_datetime(date).timestamp(), time.monotonic())
        # Answered: it landed or was refused, and can land no later. Not a 5xx: Azure's 500
        # OperationTimedOut, say, may still complete the operation.
        token = request.context.get(_TOKEN)
        if token is not None and response.http_response.status_code < 500:
            self._unanswered.pop(token, None)
            self.answered_count += 1

    def _remember(self, request: Any, partitions: tuple[str, ...], expires_unix_s: int, now_unix_s: float) -> None:
        if len(self._unanswered) >= UNANSWERED_COUNT_MAX:
            for key, entry in list(self._unanswered.items()):
                if entry.expires_unix_s < now_unix_s:
                    del self._unanswered[key]
            if len(self._unanswered) >= UNANSWERED_COUNT_MAX:
                # Never a live one forgotten to make room (found by audit: a release then waited
                # too little for it, and it could land after the next owner's recovery scan).
                raise StorageUnavailable(
                    f"azure_blob: {len(self._unanswered)} fenced writes sent and unanswered: not sent"
                )
        token = object()
        request.context[_TOKEN] = token
        self._unanswered[token] = _Unanswered(partitions, expires_unix_s)

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


def arrived_expired(error: HttpResponseError) -> str | None:
    """Why Azure refused a request whose signature was out of its time by Azure's own clock (the
    later of the answer's Date header and the error message's Time; this node's where there is
    neither): it arrived after its call's deadline or lease window, or before the start it
    carried. None for any other error."""
    if error.status_code != 403 or error.response is None:
        return None
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(error.response.request.url).query)
    try:
        expires = datetime.datetime.fromisoformat(query["se"][0])
        start = datetime.datetime.fromisoformat(query["st"][0]) if "st" in query else None
    except (KeyError, IndexError, ValueError):
        return None
    node_now = datetime.datetime.now(datetime.UTC)
    # The later of the answer's Date and the error's own Time: the Date header may lag the clock
    # that judged the request (Node's HTTP server, Azurite's, caches it, refreshed by a timer that
    # runs late on a busy machine).
    seen: list[datetime.datetime] = []
    date = error.response.headers.get("Date")
    if date:
        with contextlib.suppress(TypeError, ValueError):
            seen.append(email.utils.parsedate_to_datetime(date))
    stamped = _ERROR_TIME.search(error.message or "")
    if stamped is not None:
        with contextlib.suppress(ValueError):
            seen.append(datetime.datetime.fromisoformat(stamped.group(1)))
    azure_now = max(seen, default=node_now)
    # The Date header has whole seconds: Azure's refusal past `se` shows as a Date at or past it.
    clocks = f"Azure's clock {azure_now.isoformat()}, this node's {node_now.isoformat(timespec='seconds')}"
    if azure_now >= expires:
        return f"it arrived after its signature expired at {expires.isoformat()} ({clocks})"
    if start is not None and azure_now < start:
        return f"it arrived before its signature's start {start.isoformat()} ({clocks})"
    return None
