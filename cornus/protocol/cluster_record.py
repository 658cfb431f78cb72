"""The cluster record's rules, with no I/O (the storage calls are cornus.runtime.cluster_record's):
what the record says (which deployment a storage holds and how its keys are placed on partitions),
and when a node must refuse a storage, by its record or, where an earlier version left none, by
the partitions its nodes took.

Why: data is stored by partition, and which partition holds a key is the key's hash modulo the
partition count. A deployment reinstalled with another count over the same storage read about half
its committed keys as absent and split new writes of a key in two; a second release with the same
name over the same storage took the first one's node identities and fenced its writes (both found
by review). Neither can be undone from inside a running node, so a node refuses such storage
before it takes anything.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from storage_adapters.errors import InvariantViolation

# The cluster id a node has when its configuration names none.
DEFAULT_CLUSTER_ID = "cornus"
# Room for the chart's default, "<namespace>.<fullname>" (63 and 52 characters at most).
CLUSTER_ID_LENGTH_MAX = 128
# How keys are placed on partitions (cornus.runtime.keys.partition_of), recorded so that a change
# of it is refused as a change of the count is.
KEY_PLACEMENT = "crc32-modulo"
RECORD_FORMAT_VERSION = 1
# Taken partitions a refusal names one by one before it says "...".
NAMED_PARTITION_COUNT_MAX = 8


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


def refusal_by_record(mine: ClusterRecord, recorded: ClusterRecord, recorded_by: str, recorded_at_ms: int,
                      node_id: str) -> str | None:
    """Why node `node_id`, configured as `mine`, must refuse a storage whose record says
    `recorded`; None if it may use it."""
    differences = mine.differences(recorded)
    if not differences:
        return None
    why = []
    if recorded.cluster_id != mine.cluster_id:
        why.append("it is another deployment's: this node would take that deployment's node identities and "
                   "partitions")
    if (recorded.partition_count, recorded.key_placement) != (mine.partition_count, mine.key_placement):
        why.append("data is stored by partition, and a node that placed keys otherwise would read committed "
                   "values as absent and split new writes of a key in two")
    return (
        f"node {node_id} refuses this storage: its cluster record, written by node {recorded_by} at unix ms "
        f"{recorded_at_ms}, says {'; '.join(differences)}; {', and '.join(why)}. Start the node with the "
        f"recorded settings, or point it at storage of its own (the partition count of existing data cannot "
        f"change)"
    )


@dataclass(frozen=True, slots=True)
class TakenVerdict:
    """What the partitions taken in a storage with no record say: `refusal`, why the node must
    refuse it (None: it may record it); `partial`, only some of its partitions were ever taken."""

    refusal: str | None
    partial: bool = False


def verdict_by_partitions_taken(mine: ClusterRecord, taken: Sequence[int], node_id: str) -> TakenVerdict:
    """Before the first record: storage written by a version before it (found by review: the
    first node of an upgrade recorded whatever it was given, a wrong partition count included)
    holds the ownership records of the partitions its nodes took, p0 to its count less one, and
    never deletes them. `taken`: the indexes of those among p0..p<this node's count>. None is
    empty storage. One past this node's count means a larger count, and p0 to some pK short of it
    a smaller one: refused. Some of this node's partitions and no others is a deployment of this
    count that stopped before its nodes took them all (each takes its preferred ones first, every
    Nth): recorded (found by review of the first version of this check, which refused it)."""
    indexes = sorted(set(taken))
    assert all(0 <= index <= mine.partition_count for index in indexes), (indexes, mine)
    if not indexes or indexes == list(range(mine.partition_count)):
        return TakenVerdict(None)
    beyond = indexes[-1] == mine.partition_count
    prefix = indexes == list(range(len(indexes)))
    if not beyond and not prefix:
        return TakenVerdict(None, partial=True)
    if len(indexes) == 1:
        which = f"p{indexes[0]}"
    elif indexes == list(range(indexes[0], indexes[-1] + 1)):
        which = f"p{indexes[0]}..p{indexes[-1]}"
    else:
        named = indexes[:NAMED_PARTITION_COUNT_MAX]
        which = ", ".join(f"p{index}" for index in named) + (", ..." if len(indexes) > len(named) else "")
    return TakenVerdict(
        f"node {node_id} refuses this storage: it has no cluster record (an earlier version wrote it), and the "
        f"partitions its nodes took include {which} (this node: {mine.partition_count}, "
        f"p0..p{mine.partition_count - 1}); data is stored by partition, and a node that placed keys otherwise "
        f"would read committed values as absent and split new writes of a key in two. Start the node with the "
        f"partition count the storage was written with"
    )
