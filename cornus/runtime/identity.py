"""A node's identity in storage: the ownership record `identity_name(node)` that every process
starting as the node takes in a new epoch before anything else (cornus.protocol.node_core), whose
fence its coordinator-log writes carry, which it reads or renews to learn whether a later process
of the node has taken it since (a pod replaced while its process lived on), and which a process
so deposed watches until it is vacant (cornus.protocol.identity_watch). The rules are the core's;
this is their storage I/O."""

from __future__ import annotations

import asyncio
import collections
import enum
import logging
import time

from cornus.protocol import txn_ids
from cornus.protocol.config import ProtocolConfig, identity_window_admits
from cornus.protocol.effects import TAKE_IDENTITY_ROUND_COUNT_MAX, CheckIdentity, TakeIdentity
from cornus.protocol.events import IdentityChecked, IdentityTaken, StorageUnreachable
from cornus.protocol.identity_watch import Observed, VacancyWatch
from cornus.runtime.clocks import now_ms
from storage_adapters.contract import OWNER_LEASE_MS_MAX, Fence, Ownership, identity_name
from storage_adapters.errors import StorageUnavailable
from storage_adapters.store import CallDeadline, LogStore

log = logging.getLogger("cornus.node")

# The record's shape asks for a lease, but an identity is not leased: a starting process takes it
# at once, and a parked one judges it vacant by its own configuration (identity_vacant_ms), not by
# this field. The longest allowed says so to a reader of the record.
IDENTITY_LEASE_MS = OWNER_LEASE_MS_MAX


class Refused(enum.Enum):
    """Why a write for the node itself may not leave (IdentityHolder.write_deadline)."""

    DEPOSED = "a later process of the node took its identity"
    UNREACHABLE = "storage did not answer the read of the identity record"
    STALE = "the process stalled past the window since the read left"


class IdentityHolder:
    """This process's take of its node's identity: the fence its coordinator-log writes carry,
    and the record its renewals swap from. Carries out the core's TakeIdentity and CheckIdentity
    and answers each with its event; storage refusing what the contract allows (InvariantViolation)
    goes up to the caller."""

    def __init__(self, store: LogStore, node_id: str, write_window_ms: int) -> None:
        self._store = store
        self._node_id = node_id
        self.name = identity_name(node_id)
        self.fence: Fence | None = None  # None until taken
        self._record: Ownership | None = None
        # When (_boot_s seconds) the latest take, check or renewal that found the record still
        # this process's left: what admits the node's own unfenced writes for write_window_ms
        # (ProtocolConfig.identity_write_window_ms).
        self._confirmed_at_s: float | None = None
        self._write_window_ms = write_window_ms
        self._confirming: asyncio.Future[bool] | None = None  # a read for `confirm`, shared
        self.taken_unix_ms: int | None = None  # when (wall clock) the take returned

    async def take(self, effect: TakeIdentity) -> IdentityTaken:
        assert effect.node == self._node_id and self.fence is None, effect
        left_s = _boot_s()
        try:
            taken = await take(self._store, self._node_id)
        except StorageUnavailable as error:
            log.warning("node %s could not take its identity (%s); retrying", self._node_id, error)
            return IdentityTaken(StorageUnreachable(str(error)))
        self._record, self.fence = taken, taken.fence()
        self._confirmed(left_s)
        self.taken_unix_ms = int(time.time() * 1000)
        log.info("node %s took its identity epoch=%d", self._node_id, taken.epoch)
        return IdentityTaken(taken.epoch)

    async def check(self, effect: CheckIdentity) -> IdentityChecked:
        fence, record = self.fence, self._record
        assert fence is not None and record is not None and fence.epoch == effect.epoch, (fence, effect)
        left_s = _boot_s()
        try:
            if not effect.renew:
                still = await held(self._store, fence)
                if still:
                    self._confirmed(left_s)
                return IdentityChecked(self._node_id, still)
            renewed = await renew(self._store, record)
        except StorageUnavailable as error:
            return IdentityChecked(self._node_id, StorageUnreachable(str(error)))
        # The core checks once at a time, so no other renewal moved the record meanwhile.
        if renewed is not None:
            self._record = renewed
            self._confirmed(left_s)
        return IdentityChecked(self._node_id, renewed is not None)

    async def write_deadline(
        self, deadline: CallDeadline, timeout_s: float, counters: collections.Counter[str],
    ) -> CallDeadline | Refused:
        """The deadline a write that storage cannot fence, made for the node itself and given
        `deadline` as it left, may keep: it, while a recent read of the record found it this
        process's (`admits_unfenced_write`); past that, a fresh one after one more read. Refused
        if a later process took the identity, the read went unanswered, or the process stalled
        past the window since the read left."""
        # Checked on the clock that counts a suspend (the loop's does not): a process resumed after
        # the later one collected must not find its window still open (found by review, as the
        # leases' clock was); the deadline counts a suspend too (CallDeadline).
        if self.admits_unfenced_write(_boot_s()):
            return deadline
        counters["identity_reads_for_writes"] += 1
        try:
            still = await self.confirm()
        except StorageUnavailable:
            return Refused.UNREACHABLE
        if not still:
            return Refused.DEPOSED
        if not self.admits_unfenced_write(_boot_s()):
            counters["writes_refused_identity_stale"] += 1
            return Refused.STALE
        return CallDeadline.after(timeout_s)

    def admits_unfenced_write(self, now_s: float) -> bool:
        """Whether a write storage cannot fence, made for the node itself and leaving at `now_s`
        (on the suspend-counting clock, `_boot_s`, as the confirmations are), lands before a later
        process of the node could have collected what it writes to
        (ProtocolConfig.identity_write_window_ms)."""
        confirmed_ms = None if self._confirmed_at_s is None else self._confirmed_at_s * 1000
        return identity_window_admits(confirmed_ms, now_s * 1000, self._write_window_ms)

    def fresh_for_client_ids(self, config: ProtocolConfig) -> bool:
        """txn_ids.identity_fresh_for_client_ids, now, on the clock the confirmations are on."""
        confirmed_ms = None if self._confirmed_at_s is None else self._confirmed_at_s * 1000
        return txn_ids.identity_fresh_for_client_ids(confirmed_ms, _boot_s() * 1000, config)

    async def confirm(self) -> bool:
        """Read the identity record now: True if it is still this process's (which admits the
        node's unfenced writes again for the window), False if a later process took it. Callers
        asking while a read is out share it (a burst of writes after an outage makes one read).
        StorageUnavailable when storage does not answer within its deadline."""
        if self._confirming is None:
            fence = self.fence
            assert fence is not None, "a write for the node before it took its identity"
            left_s = _boot_s()

            async def read() -> bool:
                try:
                    still = await held(self._store, fence)
                finally:
                    self._confirming = None
                if still:
                    self._confirmed(left_s)
                return still

            self._confirming = asyncio.ensure_future(read())
            # Its error is every waiter's; retrieved here too, for when all of them were cancelled.
            self._confirming.add_done_callback(lambda done: done.cancelled() or done.exception())
        return await asyncio.shield(self._confirming)

    def _confirmed(self, left_s: float) -> None:
        if self._confirmed_at_s is None or left_s > self._confirmed_at_s:
            self._confirmed_at_s = left_s


def _boot_s() -> float:
    """Seconds on the leases' clock (cornus.runtime.clocks), which counts a machine's suspend."""
    return now_ms() / 1000


async def take(store: LogStore, node_id: str) -> Ownership:
    """Take the identity of `node_id` in the epoch after the stored one (StorageUnavailable if
    storage cannot be reached, or every round lost the race)."""
    name = identity_name(node_id)
    for _ in range(TAKE_IDENTITY_ROUND_COUNT_MAX):
        stored = (await store.read_owners([name])).get(name)
        epoch, version = (1, 1) if stored is None else (stored.epoch + 1, stored.version + 1)
        new = Ownership(name, node_id, epoch, version, IDENTITY_LEASE_MS)
        if (await store.write_owner(stored, new)).written:
            return new
    raise StorageUnavailable(f"the take of {name} lost {TAKE_IDENTITY_ROUND_COUNT_MAX} races in a row")


async def held(store: LogStore, fence: Fence) -> bool:
    """Whether the identity record still names this process's take."""
    return fence.admits((await store.read_owners([fence.partition])).get(fence.partition))


async def renew(store: LogStore, record: Ownership) -> Ownership | None:
    """Write the identity record again, in the same epoch with the next version: the record as it
    is now, or None if another process of the node has taken it since `record`."""
    for _ in range(2):
        new = Ownership(record.partition, record.owner, record.epoch, record.version + 1, record.lease_ms)
        result = await store.write_owner(record, new)
        if result.written:
            return new
        # Refused: another take, or a renewal of this process that timed out and landed all the
        # same, which leaves the record this process's, a version further on: renewed from that
        # one, once (a second refusal with the record still ours would be a renewal in flight
        # of this process that the core does not make; it is this process's record all the same).
        if result.stored is None or not record.fence().admits(result.stored):
            return None
        record = result.stored
    return record


async def watch_until_vacant(store: LogStore, node_id: str, config: ProtocolConfig) -> None:
    """Read the identity record every identity_check_ms, and return once the watch takes it for
    vacant: the process that took it from this one renews it no more."""
    name = identity_name(node_id)
    watch = VacancyWatch(config, _now_ms())
    while True:
        await asyncio.sleep(config.identity_check_ms / 1000)
        sent_ms = _now_ms()
        try:
            stored = (await store.read_owners([name])).get(name)
        except StorageUnavailable as error:
            observed: Observed = StorageUnreachable(str(error))
        else:
            observed = None if stored is None else (stored.epoch, stored.version)
        if watch.observed(sent_ms, _now_ms(), observed):
            return


def _now_ms() -> int:
    return time.monotonic_ns() // 1_000_000
