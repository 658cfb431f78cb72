"""The cluster record (storage_adapters.contract, "The cluster record"): which deployment a storage
holds and how its keys are placed on partitions. A node claims it before it takes anything (its
identity, a partition): over empty storage it writes the record with `log_once`, and otherwise
reads the one stored and refuses the storage unless it says what the node's configuration says.

Why: data is stored by partition, and which partition holds a key is the key's hash modulo the
partition count (cornus.runtime.keys). A deployment reinstalled with another count over the same
storage read about half its committed keys as absent and split new writes of a key in two; a
second release with the same name over the same storage took the first one's node identities and
fenced its writes (both found by review). Neither can be undone from inside a running node, so
the mismatch ends the process with EXIT_CODE_CLUSTER_MISMATCH and a message naming both sides.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from cornus.runtime.keys import partition_names
from cornus.runtime.patience import patiently
from storage_adapters.contract import CLUSTER_RECORD_TXN, OWNER_READ_COUNT_MAX, LogId, RecordBody, TxnState
from storage_adapters.errors import InvariantViolation
from storage_adapters.store import LogStore

log = logging.getLogger("cornus.node")

# The cluster id a node has when its configuration names none.
DEFAULT_CLUSTER_ID = "cornus"
# Room for the chart's default, "<namespace>.<fullname>" (63 and 52 characters at most).
CLUSTER_ID_LENGTH_MAX = 128
# sysexits' EX_CONFIG: the configuration disagrees with the storage, so a restart cannot help and
# a supervisor's crash loop shows the message in the log.
EXIT_CODE_CLUSTER_MISMATCH = 78
# How keys are placed on partitions (cornus.runtime.keys.partition_of), recorded so that a change
# of it is refused as a change of the count is.
KEY_PLACEMENT = "crc32-modulo"
RECORD_FORMAT_VERSION = 1


class ClusterMismatch(Exception):
    """The storage's cluster record names another deployment or another key placement."""


@dataclass(frozen=True, slots=True)
class ClusterRecord:
    cluster_id: str
    partition_count: int
    key_placement: str = KEY_PLACEMENT

    def encode(self, recorded_by: str) -> bytes:
        return json.dumps({"v": RECORD_FORMAT_VERSION, "cluster_id": self.cluster_id,
                           "partition_count": self.partition_count, "key_placement": self.key_placement,
                           "recorded_by": recorded_by}, sort_keys=True).encode()

    @staticmethod
    def decode(redo: bytes) -> tuple[ClusterRecord, str]:
        """The record and the node that wrote it; InvariantViolation if it is not one this
        version wrote (nothing else writes the cluster log)."""
        try:
            content = json.loads(redo)
            if content["v"] != RECORD_FORMAT_VERSION:
                raise InvariantViolation(f"the cluster record has format version {content['v']!r}")
            record = ClusterRecord(str(content["cluster_id"]), int(content["partition_count"]),
                                   str(content["key_placement"]))
            return record, str(content["recorded_by"])
        except (ValueError, TypeError, KeyError) as error:
            raise InvariantViolation(f"the cluster record is unreadable: {error!r}") from error

    def differences(self, stored: ClusterRecord) -> list[str]:
        """Each setting on which this node's configuration differs from the stored record."""
        return [f"{name} {getattr(stored, name)!r} (this node: {getattr(self, name)!r})"
                for name in ("cluster_id", "partition_count", "key_placement")
                if getattr(self, name) != getattr(stored, name)]


async def claim_once(store: LogStore, mine: ClusterRecord, node_id: str) -> bool:
    """Write `mine` as the storage's cluster record, or check the stored one against it; True if
    this call wrote it. ClusterMismatch if the stored one differs; StorageUnavailable as storage's."""
    cluster_log = LogId.cluster()
    # Read first: every start but the storage's first finds the record there, and needs no write.
    stored = await store.read(cluster_log, CLUSTER_RECORD_TXN)
    if stored is None:
        refusal = await _partitions_taken_refusal(store, mine, node_id)
        if refusal is not None:
            # Or a node of this version wrote the record since, and took some partitions: then the
            # record is there now (it was written before any take), and goes first.
            stored = await store.read(cluster_log, CLUSTER_RECORD_TXN)
            if stored is None:
                raise ClusterMismatch(refusal)
    if stored is None:
        body = RecordBody(redo=mine.encode(node_id))
        result = await store.log_once(cluster_log, CLUSTER_RECORD_TXN, TxnState.COMMIT, body)
        if result.created:
            log.info("node %s recorded the storage as cluster %s with %d partitions", node_id, mine.cluster_id,
                     mine.partition_count)
            return True
        stored = await store.read(cluster_log, CLUSTER_RECORD_TXN)  # another node's, written since
    if stored is None or stored.state is not TxnState.COMMIT:
        # Only log_once writes it (a COMMIT), and nothing deletes it (LogStore.delete refuses).
        raise InvariantViolation(f"the cluster record went or changed after it was written: {stored}")
    recorded, recorded_by = ClusterRecord.decode(stored.body.redo)
    differences = mine.differences(recorded)
    if differences:
        why = []
        if recorded.cluster_id != mine.cluster_id:
            why.append("it is another deployment's: this node would take that deployment's node identities "
                       "and partitions")
        if (recorded.partition_count, recorded.key_placement) != (mine.partition_count, mine.key_placement):
            why.append("data is stored by partition, and a node that placed keys otherwise would read committed "
                       "values as absent and split new writes of a key in two")
        raise ClusterMismatch(
            f"node {node_id} refuses this storage: its cluster record, written by node {recorded_by} at unix ms "
            f"{stored.created_at_ms}, says {'; '.join(differences)}; {', and '.join(why)}. Start the node with "
            f"the recorded settings, or point it at storage of its own (the partition count of existing data "
            f"cannot change)"
        )
    return False


async def _partitions_taken_refusal(store: LogStore, mine: ClusterRecord, node_id: str) -> str | None:
    """Before the first record: storage written by a version before it (found by review: the
    first node of an upgrade recorded whatever it was given, a wrong partition count included)
    holds the ownership records of the partitions its nodes took, p0 to its count less one, and
    never deletes them. None is empty storage. One past this node's count taken means a larger
    count, and p0 to some pK short of it taken means a smaller one: the refusal's reason then,
    else None."""
    names = (*partition_names(mine.partition_count), f"p{mine.partition_count}")
    taken: set[str] = set()
    for start in range(0, len(names), OWNER_READ_COUNT_MAX):
        taken.update((await store.read_owners(names[start:start + OWNER_READ_COUNT_MAX])).keys())
    if not taken or taken == set(names[:-1]):
        return None
    indexes = sorted(int(name[1:]) for name in taken)
    beyond = mine.partition_count in indexes  # a partition past this node's: more of them
    prefix = indexes == list(range(len(indexes)))  # all of a smaller count's: fewer of them
    if not beyond and not prefix:
        # Some of this node's partitions and no others: a deployment of this count that stopped
        # before its nodes took them all (each takes its preferred ones first, every Nth), found
        # by review of the first version of this check, which refused it for good.
        log.warning("node %s: storage of an earlier version, with %d of this node's %d partitions taken and "
                    "no others; recording it with %d", node_id, len(indexes), mine.partition_count,
                    mine.partition_count)
        return None
    if len(indexes) == 1:
        which = f"p{indexes[0]}"
    elif indexes == list(range(indexes[0], indexes[-1] + 1)):
        which = f"p{indexes[0]}..p{indexes[-1]}"
    else:
        which = ", ".join(f"p{index}" for index in indexes[:8]) + (", ..." if len(indexes) > 8 else "")
    return (
        f"node {node_id} refuses this storage: it has no cluster record (an earlier version wrote it), and the "
        f"partitions its nodes took include {which} (this node: {mine.partition_count}, "
        f"p0..p{mine.partition_count - 1}); data is stored by partition, and a node that placed keys otherwise "
        f"would read committed values as absent and split new writes of a key in two. Start the node with the "
        f"partition count the storage was written with"
    )


async def claim(store: LogStore, mine: ClusterRecord, node_id: str, deadline_s: float) -> None:
    """`claim_once`, tried again while storage is unavailable, until `deadline_s`
    (time.monotonic(); cornus.runtime.patience)."""
    await patiently(lambda: claim_once(store, mine, node_id), f"node {node_id} could not read the cluster record",
                    deadline_s)
