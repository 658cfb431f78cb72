"""The cluster record's storage I/O (its rules are cornus.protocol.cluster_record's): a node
claims it before it takes anything (its identity, a partition). Over empty storage it writes the
record with `log_once`; otherwise it reads the one stored, and where an earlier version left none,
the ownership records of the partitions taken; and it refuses the storage when the rules say so,
ending the process with EXIT_CODE_CLUSTER_MISMATCH and a message naming both sides.
"""

from __future__ import annotations

import logging

from cornus.protocol.cluster_record import (
    ClusterMismatch,
    ClusterRecord,
    TakenVerdict,
    refusal_by_record,
    verdict_by_partitions_taken,
)
from cornus.runtime.keys import partition_names
from cornus.runtime.patience import patiently
from storage_adapters.contract import CLUSTER_RECORD_TXN, OWNER_READ_COUNT_MAX, LogId, RecordBody, TxnState
from storage_adapters.errors import InvariantViolation
from storage_adapters.store import LogStore

log = logging.getLogger("cornus.node")

# sysexits' EX_CONFIG: the configuration disagrees with the storage, so a restart cannot help and
# a supervisor's crash loop shows the message in the log.
EXIT_CODE_CLUSTER_MISMATCH = 78


async def claim_once(store: LogStore, mine: ClusterRecord, node_id: str) -> bool:
    """Write `mine` as the storage's cluster record, or check the stored one against it; True if
    this call wrote it. ClusterMismatch if the stored one differs; StorageUnavailable as storage's."""
    cluster_log = LogId.cluster()
    # Read first: every start but the storage's first finds the record there, and needs no write.
    stored = await store.read(cluster_log, CLUSTER_RECORD_TXN)
    if stored is None:
        verdict = await _partitions_taken(store, mine, node_id)
        if verdict.refusal is not None or verdict.partial:
            # Or a node of this version wrote the record since, and took some partitions: then the
            # record is there now (it was written before any take), and goes first, with no word
            # of an earlier version (found by the Azure chaos runs: every first start said so).
            stored = await store.read(cluster_log, CLUSTER_RECORD_TXN)
            if stored is None and verdict.refusal is not None:
                raise ClusterMismatch(verdict.refusal)
            if stored is None:
                log.warning("node %s: storage of an earlier version, with some of this node's %d partitions taken "
                            "and no others; recording it with %d", node_id, mine.partition_count,
                            mine.partition_count)
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
    refusal = refusal_by_record(mine, recorded, recorded_by, stored.created_at_ms, node_id)
    if refusal is not None:
        raise ClusterMismatch(refusal)
    return False


async def _partitions_taken(store: LogStore, mine: ClusterRecord, node_id: str) -> TakenVerdict:
    """Storage with no record: what the ownership records of p0..p<this node's count> say
    (cornus.protocol.cluster_record.verdict_by_partitions_taken)."""
    names = (*partition_names(mine.partition_count), f"p{mine.partition_count}")
    taken: list[int] = []
    for start in range(0, len(names), OWNER_READ_COUNT_MAX):
        taken += [int(name[1:]) for name in await store.read_owners(names[start:start + OWNER_READ_COUNT_MAX])]
    return verdict_by_partitions_taken(mine, taken, node_id)


async def claim(store: LogStore, mine: ClusterRecord, node_id: str, deadline_s: float) -> None:
    """`claim_once`, tried again while storage is unavailable, until `deadline_s`
    (time.monotonic(); cornus.runtime.patience)."""
    await patiently(lambda: claim_once(store, mine, node_id), f"node {node_id} could not read the cluster record",
                    deadline_s)
