"""A node's identity in storage: the ownership record `identity_name(node)` that every process
starting as the node takes in a new epoch before anything else (cornus.protocol.node_core), whose
fence its coordinator-log writes carry, and which it reads again to learn whether a later process
of the node has taken it since (a pod replaced while its process lived on). The rules are the
core's; this is their storage I/O."""

from __future__ import annotations

from cornus.protocol.effects import TAKE_IDENTITY_ROUND_COUNT_MAX
from storage_adapters.contract import OWNER_LEASE_MS_MAX, Fence, Ownership, identity_name
from storage_adapters.errors import StorageUnavailable
from storage_adapters.store import LogStore

# The record's shape asks for a lease, but an identity is not leased: nobody waits it out, the
# newest process takes it at once. The longest allowed says so to a reader of the record.
IDENTITY_LEASE_MS = OWNER_LEASE_MS_MAX


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
