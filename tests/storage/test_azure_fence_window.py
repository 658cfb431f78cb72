"""Azure Blob has no condition spanning two blobs, so a fenced write there is a read of the
partition's ownership blob and then the write: a write that passed the check and was held on the
network landed after its owner's lease ended, after another node took the partition and scanned
its log, and that node never learned of it (a vote nobody runs until a later recovery applies its
old redo over later commits; found by review, 2026-11-26). Every request now carries a shared
access signature that Azure refuses after a time the adapter sets: a fenced write's ends before
the lease the ownership blob it read can still grant, and a release of a partition is not
accepted before the fenced writes this store signed for it have expired. Against Azurite, through
a proxy that holds the write (tests/storage/servers.py HoldingProxy)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import time
import types
import urllib.parse
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

import pytest
from azure.core.exceptions import HttpResponseError
from azure.core.rest import HttpRequest

from cornus.runtime.identity import IDENTITY_LEASE_MS
from cornus.runtime.node import TIMEOUT_MS_RELEASE
from storage_adapters import azure_blob, azure_signing
from storage_adapters.azure_blob import AzureBlobStore
from storage_adapters.azure_signing import ExpiringSignatures, arrived_expired
from storage_adapters.contract import LogId, Ownership, RecordBody, TxnState, identity_name
from storage_adapters.errors import StorageUnavailable
from storage_adapters.factory import StoreConfig, open_store
from storage_adapters.store import CallDeadline, LogStore, boot_clock_s, call_deadline_at
from tests.conftest import Services
from tests.storage.servers import HoldingProxy, azurite_behind

pytestmark = [pytest.mark.services, pytest.mark.timeout(120)]

DEADLINE_MS = 1_000
DEADLINE_MS_CHECKS = 10_000
# The lease the ownership record grants: a held write outlives it.
LEASE_MS = 2_000
# How long the proxy holds a record write: past the lease and the new owner's take and scan.
HOLD_S = LEASE_MS / 1000 + 2.5
# A hold well inside the stop's release budget, and the patient store's deadline well outside it.
HOLD_S_SHORT = 0.3
# Polls (10 ms apart) for the proxy to hold a request sent just before.
HELD_POLL_COUNT_MAX = 500
PARTITION = "fence"
LOG = LogId.partition(PARTITION)
BODY = RecordBody((PARTITION,), "n1", b"old redo")


def _holds_record_puts(chunk: bytes) -> bool:
    request_line = chunk.split(b"\r\n", 1)[0]
    return chunk.startswith(b"PUT ") and b"/txn/" in request_line


@dataclass
class _Stores:
    proxy: HoldingProxy
    old_owner: LogStore  # through the proxy
    new_owner: LogStore  # straight to Azurite
    patient_owner: LogStore  # through the proxy, with a deadline past the hold


@pytest.fixture
async def stores(services: Services) -> AsyncIterator[_Stores]:
    proxy, through_proxy = await azurite_behind(services.azure_connection_string, _holds_record_puts, HOLD_S)
    container = f"fence-{uuid.uuid4().hex[:10]}"
    # The container is made by a store with the long deadline: on a loaded CI machine Azurite took
    # over DEADLINE_MS to create one, which failed the fixture before its test began.
    new_owner = await open_store(StoreConfig(backend="azure_blob", azure_container=container,
                                             azure_connection_string=services.azure_connection_string,
                                             timeout_ms_call=DEADLINE_MS_CHECKS))
    old_owner = await AzureBlobStore.open(through_proxy, container, timeout_ms_call=DEADLINE_MS,
                                          create_container=False)
    patient_owner = await open_store(StoreConfig(backend="azure_blob", azure_connection_string=through_proxy,
                                                 azure_container=container, timeout_ms_call=DEADLINE_MS_CHECKS))
    try:
        yield _Stores(proxy, old_owner, new_owner, patient_owner)
    finally:
        proxy.close()
        await old_owner.close()
        await patient_owner.close()
        await new_owner.delete_container()  # type: ignore[attr-defined]
        await new_owner.close()


async def _held_vote(stores: _Stores, taken: Ownership) -> asyncio.Task[object]:
    """The old owner's fenced vote, its record write held by the proxy past the call's deadline."""
    stores.proxy.holding = True
    vote = asyncio.create_task(stores.old_owner.log_once(LOG, "t1", TxnState.VOTE_YES, BODY, taken.fence()))
    with pytest.raises(StorageUnavailable):
        await vote
    assert stores.proxy.held_count == 1
    stores.proxy.holding = False
    return vote


async def _patient_vote_held(stores: _Stores, taken: Ownership) -> asyncio.Task[object]:
    """The owner's fenced vote through the patient store, once the proxy holds the one request (or
    reply) of it that it picks; nothing after that one is held."""
    stores.proxy.holding = True
    vote = asyncio.create_task(stores.patient_owner.log_once(LOG, "t1", TxnState.VOTE_YES, BODY, taken.fence()))
    for _ in range(HELD_POLL_COUNT_MAX):
        if stores.proxy.held_count:
            break
        await asyncio.sleep(0.01)
    assert stores.proxy.held_count == 1
    stores.proxy.holding = False
    return vote


async def _land_then_read(stores: _Stores, since_s: float) -> object:
    """Wait until the held write has reached Azurite, then what the log holds for it."""
    await asyncio.sleep(max(0.0, since_s + HOLD_S + 0.5 - time.monotonic()))
    return await stores.new_owner.read(LOG, "t1")


async def _take_at(new_owner: LogStore, expected: Ownership, at_s: float) -> list[str]:
    """Take the partition from `expected` at `at_s` (time.monotonic()), then scan its log: what the
    new owner then runs (the txns of its unfinished records)."""
    await asyncio.sleep(max(0.0, at_s - time.monotonic()))
    taken = replace(expected, owner="n2", epoch=expected.epoch + 1, version=expected.version + 1)
    assert (await new_owner.write_owner(expected, taken)).written
    return [record.txn for record in await new_owner.scan_unfinished(LOG)]


async def test_a_fenced_write_held_past_the_lease_never_lands_after_the_next_owners_scan(stores: _Stores) -> None:
    taken = Ownership(PARTITION, "n1", epoch=1, version=1, lease_ms=LEASE_MS)
    assert (await stores.new_owner.write_owner(None, taken)).written
    # The renewal's time, as the taker counts from it: it has seen this version at least this long.
    renewed_s = time.monotonic()
    sent_s = time.monotonic()
    await _held_vote(stores, taken)
    # As a taker does: the same (epoch, version) for the whole lease (the node adds clock slack).
    assert await _take_at(stores.new_owner, taken, renewed_s + LEASE_MS / 1000 + 0.1) == []
    assert await _land_then_read(stores, sent_s) is None, (
        "the deposed owner's vote landed after the new owner took the partition and scanned its log"
    )


async def test_a_fenced_write_whose_body_is_held_past_the_lease_never_counts_after_the_next_owners_scan(
    stores: _Stores,
) -> None:
    """Found by audit (2026-11-28, fourth): Azure judges a request's signature when its headers
    arrive and commits the write when its body has, so a vote whose headers came within its
    fence's window and whose body was held (a lost segment sent again after a partition healed, a
    proxy slow to pass it on) landed after the next owner's take and scan: a vote nobody ran, whose
    old redo a later recovery applied over a newer commit (the audit's end-to-end run). The
    store's sockets now reset their connection when the call's deadline closes it
    (azure_blob._socket_resetting_on_close), and the proxy here, as a kernel or a proxy does,
    drops what it held on that reset. (A Last-Modified rule was tried first and dropped: Azurite
    stamps Last-Modified when the headers arrive, so nothing could see the commit's time.)"""
    taken = Ownership(PARTITION, "n1", epoch=1, version=1, lease_ms=LEASE_MS)
    assert (await stores.new_owner.write_owner(None, taken)).written
    renewed_s = sent_s = time.monotonic()
    stores.proxy.holding_bodies = True
    await _held_vote(stores, taken)
    assert await _take_at(stores.new_owner, taken, renewed_s + LEASE_MS / 1000 + 0.1) == []
    await asyncio.sleep(max(0.0, sent_s + HOLD_S + 0.5 - time.monotonic()))
    assert await stores.new_owner.read(LOG, "t1") is None, "the late vote counts after the new owner's scan"
    assert await stores.new_owner.scan_unfinished(LOG) == []
    # Its slot is empty to every writer: a termination's ABORT takes it.
    won = await stores.new_owner.log_once(LOG, "t1", TxnState.ABORT, BODY)
    assert won.state is TxnState.ABORT, won


async def test_a_release_is_not_accepted_before_the_owners_fenced_writes_expired(stores: _Stores) -> None:
    """The owner's vote is on the network, its caller gone (cancelled: its signature still has
    the call's whole deadline, and the lease is long), when the owner releases the partition
    (a shutdown, a hand-over), which the next owner takes at once: the vote must land before that
    take, where the next owner's scan finds it, or not at all."""
    taken = Ownership(PARTITION, "n1", epoch=1, version=1, lease_ms=60_000)
    assert (await stores.new_owner.write_owner(None, taken)).written
    sent_s = time.monotonic()
    vote = await _patient_vote_held(stores, taken)
    vote.cancel()
    released = replace(taken, owner="", version=taken.version + 1)
    assert (await stores.patient_owner.write_owner(taken, released)).written
    scanned = await _take_at(stores.new_owner, released, time.monotonic())
    landed = await _land_then_read(stores, sent_s)
    assert landed is None or "t1" in scanned, (
        "the released owner's vote landed after the next owner took the partition and scanned its log"
    )


async def test_a_release_waits_for_the_answers_of_the_owners_fenced_writes_not_for_their_expiry(
        stores: _Stores) -> None:
    """A clean stop gives its releases TIMEOUT_MS_RELEASE: a release that waited, whatever their
    answers, for the signatures of the fenced writes unanswered when it began to expire (a call's
    deadline and more) was cancelled by the stop, and the next owner waited out the lease on
    every stop under load (found by review, 2026-11-27). An answered write landed (or was
    refused) and can land no later: the release goes once the answer is in."""
    stores.proxy.hold_s = HOLD_S_SHORT
    taken = Ownership(PARTITION, "n1", epoch=1, version=1, lease_ms=60_000)
    assert (await stores.new_owner.write_owner(None, taken)).written
    vote = await _patient_vote_held(stores, taken)
    released = replace(taken, owner="", version=taken.version + 1)
    async with asyncio.timeout(TIMEOUT_MS_RELEASE / 1000):
        assert (await stores.patient_owner.write_owner(taken, released)).written
    assert vote.done() and vote.exception() is None, "the release went before the vote's answer"
    record = await stores.new_owner.read(LOG, "t1")
    assert record is not None and record.state is TxnState.VOTE_YES


async def test_a_release_after_a_fenced_write_that_stayed_unanswered_starts_after_its_expiry(
        stores: _Stores, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write whose answer never came may still land until its signature expires by Azure's
    clock, which may lag this node's: the release waits out the expiry by this clock and carries
    a start after it, which Azure checks by its own. (The release's wait for answers, above, once
    dropped a write from its count as its expiry passed here, and the release then went without
    that start: found by review of that change.)"""
    starts: list[int] = []
    real_not_before = azure_blob.not_before

    def recorded(unix_s: int) -> None:
        starts.append(unix_s)
        real_not_before(unix_s)

    monkeypatch.setattr(azure_blob, "not_before", recorded)
    taken = Ownership(PARTITION, "n1", epoch=1, version=1, lease_ms=60_000)
    assert (await stores.new_owner.write_owner(None, taken)).written
    await _held_vote(stores, taken)  # its caller gave up at its deadline; no answer will come
    released_s = time.time()
    released = replace(taken, owner="", version=taken.version + 1)
    assert (await stores.old_owner.write_owner(taken, released)).written
    assert len(starts) == 1 and released_s < starts[0] <= released_s + DEADLINE_MS / 1000 + 2, starts


async def test_a_fenced_write_that_arrives_after_its_lease_window_is_refused_as_unavailable(stores: _Stores) -> None:
    """Its caller still waiting (a deadline past the hold), the write reaches Azure after the lease
    its ownership blob granted: Azure refuses its signature (403), which is the write arriving late,
    retryable, not a credential problem (that would be a StorageError the node cannot go on from)."""
    taken = Ownership(PARTITION, "n1", epoch=1, version=1, lease_ms=LEASE_MS)
    assert (await stores.new_owner.write_owner(None, taken)).written
    stores.proxy.holding = True
    with pytest.raises(StorageUnavailable, match="arrived after its signature expired"):
        await stores.patient_owner.log_once(LOG, "t1", TxnState.VOTE_YES, BODY, taken.fence())
    assert stores.proxy.held_count == 1
    assert await stores.new_owner.read(LOG, "t1") is None


async def test_a_fenced_write_whose_check_was_in_flight_when_its_partition_was_released_is_not_sent(
        stores: _Stores) -> None:
    """The fence check read the ownership blob before the release landed, and its answer came after:
    the write it admitted would go out with nothing unanswered for the release to wait for, and
    the partition, released, is taken at once (found by review, 2026-11-27)."""
    stores.proxy.holds = _holds_ownership_reads
    stores.proxy.holding_replies = True
    taken = Ownership(PARTITION, "n1", epoch=1, version=1, lease_ms=60_000)
    assert (await stores.new_owner.write_owner(None, taken)).written
    vote = await _patient_vote_held(stores, taken)
    released = replace(taken, owner="", version=taken.version + 1)
    assert (await stores.patient_owner.write_owner(taken, released)).written
    await _take_at(stores.new_owner, released, time.monotonic())
    with pytest.raises(StorageUnavailable, match="passing on"):
        await vote
    assert await stores.new_owner.read(LOG, "t1") is None


def _holds_ownership_reads(chunk: bytes) -> bool:
    request_line = chunk.split(b"\r\n", 1)[0]
    return chunk.startswith(b"GET ") and b"/own/" in request_line


def _refusal(status: int, url: str, date: str | None, message: str = "refused") -> HttpResponseError:
    """An HTTP error as the SDK raises it, for `url` answered with `status`, a Date header and the
    error's `message`."""
    request = HttpRequest("PUT", url)
    response = types.SimpleNamespace(status_code=status, reason="Forbidden", request=request,
                                     headers={"Date": date} if date else {}, text=lambda encoding=None: "")
    error = HttpResponseError(message=message)
    error.status_code, error.response = status, response  # type: ignore[assignment]
    return error


def test_a_refused_signature_is_judged_late_or_early_by_azures_clock() -> None:
    """By the answer's Date, not this node's clock (found by review: a node clock ahead of Azure's
    took a release refused for its start for a credential problem, and the node exited)."""
    url = "https://a.blob.core.windows.net/c/b?se=2030-01-01T00%3A00%3A10Z&st=2030-01-01T00%3A00%3A05Z&sig=x"
    assert "after its signature expired" in arrived_expired(_refusal(403, url, "Tue, 01 Jan 2030 00:00:10 GMT"))
    assert "before its signature's start" in arrived_expired(_refusal(403, url, "Tue, 01 Jan 2030 00:00:04 GMT"))
    # In its time by Azure's clock: refused for something else (a key), not late.
    assert arrived_expired(_refusal(403, url, "Tue, 01 Jan 2030 00:00:07 GMT")) is None
    assert arrived_expired(_refusal(404, url, "Tue, 01 Jan 2030 00:00:11 GMT")) is None


def test_a_signature_refused_past_its_expiry_is_late_though_the_date_header_lags() -> None:
    """The Date header can lag the clock that refused the request: Azurite's (Node's HTTP server
    caches it, refreshed by a timer that runs late on a loaded machine) said 06:24:39 for a refusal
    at 06:24:40.009, past an expiry of 06:24:40, and a large apply's late put was taken for a
    credential problem, which no caller retries (the fresh-clone suite, 2026-11-27). The error's
    own Time (Azure's and Azurite's messages carry one, to the millisecond or better) counts too."""
    url = "https://a.blob.core.windows.net/c/b?se=2030-01-01T00%3A00%3A10Z&sig=x"
    refused = "Server failed to authenticate the request.\nRequestId:r1\nTime:2030-01-01T00:00:10.0094478Z"
    assert "after its signature expired" in arrived_expired(
        _refusal(403, url, "Tue, 01 Jan 2030 00:00:09 GMT", refused))
    # A credential problem well inside the signature's time stays one.
    refused_early = "Server failed to authenticate the request.\nRequestId:r2\nTime:2030-01-01T00:00:07.5Z"
    assert arrived_expired(_refusal(403, url, "Tue, 01 Jan 2030 00:00:07 GMT", refused_early)) is None


def test_a_fenced_write_answered_with_a_server_error_stays_unanswered() -> None:
    """A release waits only for writes without an answer; a 5xx is no answer it may count on (Azure's
    500 OperationTimedOut may still complete the operation): the write stays counted until it
    expires (found by review)."""
    signatures = ExpiringSignatures("account", "a2V5", 5.0)
    now_unix_s = int(time.time())

    def fenced_write(expires_unix_s: int) -> types.SimpleNamespace:
        request = types.SimpleNamespace(context={})
        signatures._remember(request, (PARTITION,), expires_unix_s, time.time())
        return request

    def answer(request: types.SimpleNamespace, status: int) -> None:
        response = types.SimpleNamespace(status_code=status, headers={})
        signatures.on_response(request, types.SimpleNamespace(http_response=response))

    failed, landed = fenced_write(now_unix_s + 30), fenced_write(now_unix_s + 60)
    answer(failed, 500)
    answer(landed, 201)
    assert signatures.unanswered_until(PARTITION, time.time()) == now_unix_s + 30


def test_a_fenced_write_is_not_sent_when_the_unanswered_ones_fill_their_bound() -> None:
    """Found by audit (2026-11-27): past UNANSWERED_COUNT_MAX unanswered fenced writes (a storage
    brownout under load), the oldest unexpired one was forgotten to make room; a release of its
    partition then waited for nothing, another node took the partition at once, and the forgotten
    write, still valid, could land after the taker's recovery scan. A write that would overflow the
    bound is not sent now."""
    signatures = ExpiringSignatures("account", "a2V5", 5.0)
    expires_unix_s = int(time.time()) + 30
    signatures._remember(types.SimpleNamespace(context={}), ("first",), expires_unix_s, time.time())
    for _ in range(azure_signing.UNANSWERED_COUNT_MAX - 1):
        signatures._remember(types.SimpleNamespace(context={}), ("busy",), expires_unix_s, time.time())
    with pytest.raises(StorageUnavailable, match="unanswered"):
        signatures._remember(types.SimpleNamespace(context={}), ("busy",), expires_unix_s, time.time())
    assert signatures.pass_on("first", 1) == expires_unix_s


# How far ahead of Azure's the node clocks run in the test below: well past any slack.
CLOCK_AHEAD_S = 120
WARM_UP_READ_COUNT = 60
# Tries of the deposed process's write until one leaves (it may be refused unsent at first).
SEND_ATTEMPT_COUNT_MAX = 5


@pytest.fixture
def clock_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's wall clock, as the signatures see it, runs CLOCK_AHEAD_S ahead of Azure's."""
    real_time = time.time
    monkeypatch.setattr(azure_signing, "time", types.SimpleNamespace(
        time=lambda: real_time() + CLOCK_AHEAD_S, monotonic=time.monotonic))


async def test_a_deposed_process_whose_clock_runs_ahead_never_writes_its_log_after_the_next_process_recovered(
    clock_ahead: None, stores: _Stores,
) -> None:
    """Found by a read-only audit (2026-11-27): a node's identity grants no lease a taker waits
    out (a new process takes it at once), so what bounded a fenced coordinator-log write of the
    process it deposed was the write's deadline, signed by that process's clock. A clock running
    ahead of Azure's kept the write acceptable that much longer: held on the network, a deposed
    2PC coordinator's COMMIT landed after the next process had waited its recovery's settle and
    scanned the log, which had presumed ABORT (an orphan COMMIT the next recovery resends). Now a
    signature's expiry is set in Azure's time, from the Date of the answers this store had."""
    deposed, successor, log = stores.old_owner, stores.new_owner, LogId.coordinator("n1")
    held = Ownership(identity_name("n1"), "n1", epoch=1, version=1, lease_ms=IDENTITY_LEASE_MS)
    assert (await successor.write_owner(None, held)).written
    # Answers whose Date the deposed process's store has seen, over a second or more: the bound on
    # Azure's clock they give is then within one request of it (a Date's second starts between two
    # of them). Before that, a signature may expire early (never late), and its request is
    # refused as unavailable: a short deadline's first calls after a start may be.
    for _ in range(WARM_UP_READ_COUNT):
        with contextlib.suppress(StorageUnavailable):
            await deposed.read(log, "warm-up")
        await asyncio.sleep(0.02)
    stores.proxy.holding = True
    # A signature the store's bound on Azure's clock still makes expire too soon is refused before
    # it is sent (early, never late: safe), which a loaded machine's slow warm-up can leave for a
    # first call (the CI run of 2026-11-28 09:04): the write is tried again until one is sent.
    for _ in range(SEND_ATTEMPT_COUNT_MAX):
        sent_s = time.monotonic()
        with pytest.raises(StorageUnavailable):
            await deposed.log(log, "t1", TxnState.COMMIT, BODY, held.fence())
        if stores.proxy.held_count:
            break
        await asyncio.sleep(0.1)
    assert stores.proxy.held_count == 1
    stores.proxy.holding = False
    # The next process takes the identity and recovers: its settle covers a deadline and the slack
    # from its take, then it scans its log and presumes ABORT for what is not there.
    taken = replace(held, epoch=2, version=2)
    assert (await successor.write_owner(held, taken)).written
    await asyncio.sleep(DEADLINE_MS / 1000 + 1.0)
    assert await successor.scan_unfinished(log) == []
    await asyncio.sleep(max(0.0, sent_s + HOLD_S + 0.5 - time.monotonic()))
    assert await successor.read(log, "t1") is None, (
        "the deposed process's COMMIT landed after the next process recovered and presumed ABORT"
    )


def test_azures_time_is_bounded_from_below_by_the_dates_of_its_answers() -> None:
    """AzureClock: an answer dated D arrived after Azure's clock passed D, so Azure's time now is
    at least D plus the monotonic time since; the largest bound wins, a lagging Date lowers none."""
    clock = azure_signing.AzureClock()
    before = time.time()
    assert before <= clock.now_unix_s() <= time.time()  # nothing heard yet: the wall clock
    arrived_s = time.monotonic()
    clock.observe(1_000_000.0, arrived_s)
    assert 1_000_000.0 <= clock.now_unix_s() < 1_000_000.0 + (time.monotonic() - arrived_s) + 0.01
    clock.observe(999_999.0, arrived_s)  # a cached Date, behind: ignored
    clock.observe(1_000_000.6, arrived_s)  # a tighter one
    assert clock.now_unix_s() >= 1_000_000.6
    # An hour later with no answer: lowered by what the clocks' rates may have drifted apart.
    hour_s = 3600.0
    aged_s = clock.now_unix_s() - (time.monotonic() - arrived_s)
    assert clock._aged(arrived_s + hour_s) == pytest.approx(
        1_000_000.6 - arrived_s - hour_s * azure_signing.CLOCK_RATE_DIFFERENCE_MAX)
    assert aged_s <= 1_000_000.6


def _owner_puts(chunk: bytes) -> bool:
    request_line = chunk.split(b"\r\n", 1)[0]
    return chunk.startswith(b"PUT ") and b"/own/" in request_line


async def test_a_conditional_put_whose_answer_was_lost_is_not_sent_again_by_the_http_client(
        services: Services) -> None:
    """Found by audit (2026-11-28): the SDK's retries are off (a conditional Put resent after its
    first attempt landed is refused as a conflict, and its winner would think it lost), but aiohttp
    resent PUT and DELETE once by itself when a connection was reset before the answer: a take of
    a partition that landed was answered "not written", a write that landed could be answered
    Fenced ("nothing written"). A request is sent once; a lost answer is StorageUnavailable."""
    proxy, through_proxy = await azurite_behind(services.azure_connection_string, _owner_puts, HOLD_S)
    container = f"resend-{uuid.uuid4().hex[:10]}"
    direct = await open_store(StoreConfig(backend="azure_blob", azure_container=container,
                                          azure_connection_string=services.azure_connection_string,
                                          timeout_ms_call=DEADLINE_MS_CHECKS))
    store = await AzureBlobStore.open(through_proxy, container, timeout_ms_call=DEADLINE_MS_CHECKS,
                                      create_container=False)
    try:
        taken = Ownership(PARTITION, "n1", epoch=1, version=1, lease_ms=60_000)
        proxy.resetting = True
        with pytest.raises(StorageUnavailable):
            await store.write_owner(None, taken)
        proxy.resetting = False
        assert proxy.forwarded_count == 1, f"the take was sent {proxy.forwarded_count} times"
        assert (await direct.read_owners((PARTITION,)))[PARTITION] == taken  # it landed
    finally:
        proxy.close()
        await store.close()
        await direct.delete_container()  # type: ignore[attr-defined]
        await direct.close()


async def test_a_write_fenced_by_a_nodes_identity_expires_no_later_than_its_calls_deadline() -> None:
    """Found by audit (2026-11-28): a request's expiry was rounded up to the SAS's whole second,
    up to a second past its call's deadline in Azure's time. A node's identity grants no lease, so
    what bounds a deposed process's coordinator-log write is that expiry, and the next process
    waits only a deadline and the clock slack (recovery_settle_ms, plus 200 ms) after its take: the
    rounding used up the slack (all of it under about 800 ms, which the configuration allows), and
    such a write could land after the next process's recovery scan. Rounded down for those: never
    past the deadline. (Other requests keep the round-up: a partition's fenced writes are bounded
    by its lease, the others by tombstones that outlive LATE_WRITE_WINDOW_MS.)"""
    signatures = ExpiringSignatures("account", "a2V5", 30.0)
    loop = asyncio.get_running_loop()
    identity = identity_name("n1")
    lease_end_s = 1_800_000_000 + 3_600
    for left_s in (1.2, 2.5, 4.999, 5.0, 17.3):
        for fraction_s in (0.0, 0.3, 0.5, 0.75, 0.999):
            azure_now_s = 1_800_000_000 + fraction_s
            signatures.clock = types.SimpleNamespace(now_unix_s=lambda now_s=azure_now_s: now_s)
            request = types.SimpleNamespace(context={}, http_request=types.SimpleNamespace(
                url="https://account.blob.core.windows.net/c/b", method="PUT"))
            with azure_signing.signing_window(), call_deadline_at(
                    CallDeadline(loop.time() + left_s, boot_clock_s() + left_s)):
                azure_signing._window.get().fences[identity] = (1, lease_end_s)
                signatures.on_request(request)
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(request.http_request.url).query)
            expires_s = datetime.datetime.fromisoformat(query["se"][0].replace("Z", "+00:00")).timestamp()
            assert expires_s <= azure_now_s + left_s, (left_s, fraction_s, expires_s - azure_now_s)
            assert expires_s > azure_now_s + left_s - 1.001, (left_s, fraction_s, expires_s - azure_now_s)
