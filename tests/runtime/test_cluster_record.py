"""The cluster record's claim (cornus/runtime/cluster_record.py) over a real emulator file: the
first claim writes it, the same configuration reads it back, any other refuses the storage naming
each difference, and a record no version wrote is an invariant broken, not a match. The node-level
refusal, on real processes over the emulator and Redis, is tests/cluster/test_cluster_record.py."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cornus.protocol.cluster_record import ClusterMismatch, ClusterRecord
from cornus.runtime.cluster_record import claim_once
from cornus.runtime.config import load_node_config
from storage_adapters.contract import CLUSTER_RECORD_TXN, LogId, Ownership, RecordBody, TxnState
from storage_adapters.emulator import EmulatorStore
from storage_adapters.errors import InvariantViolation, ValidationError

MINE = ClusterRecord("team-a.cornus", 12)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[EmulatorStore]:
    opened = await EmulatorStore.open(tmp_path / "cornus.db", timeout_ms_call=2_000)
    yield opened
    await opened.close()


async def test_the_first_claim_writes_the_record_and_the_same_configuration_reads_it_back(
    store: EmulatorStore,
) -> None:
    assert await claim_once(store, MINE, "n0") is True
    assert await claim_once(store, MINE, "n1") is False
    stored = await store.read(LogId.cluster(), CLUSTER_RECORD_TXN)
    assert stored is not None and ClusterRecord.decode(stored.body.redo) == (MINE, "n0")


@pytest.mark.parametrize(("other", "named", "why"), [
    (ClusterRecord("team-a.cornus", 24), "partition_count 12 (this node: 24)", "committed values as absent"),
    (ClusterRecord("team-b.cornus", 12), "cluster_id 'team-a.cornus' (this node: 'team-b.cornus')",
     "node identities"),
    (ClusterRecord("team-a.cornus", 12, "another-hash"), "key_placement 'crc32-modulo'", "committed values"),
])
async def test_another_configuration_refuses_the_storage_naming_each_difference(
    store: EmulatorStore, other: ClusterRecord, named: str, why: str,
) -> None:
    await claim_once(store, MINE, "n0")
    with pytest.raises(ClusterMismatch) as refused:
        await claim_once(store, other, "n5")
    assert named in str(refused.value) and why in str(refused.value) and "by node n0" in str(refused.value)
    # The record is as the first node wrote it.
    stored = await store.read(LogId.cluster(), CLUSTER_RECORD_TXN)
    assert stored is not None and ClusterRecord.decode(stored.body.redo) == (MINE, "n0")


async def _take(store: EmulatorStore, partitions: int) -> None:
    """What a cluster of an earlier version leaves: an ownership record per partition it took."""
    for index in range(partitions):
        await store.write_owner(None, Ownership(f"p{index}", "n0", 1, 1, 4_000))


@pytest.mark.parametrize(("taken", "count", "named"), [
    (4, 8, "include p0..p3 (this node: 8"),
    (4, 2, "include p0..p2 (this node: 2"),  # it looks no further than one past its own
])
async def test_storage_of_an_earlier_version_is_refused_where_its_partitions_say_another_count(
    store: EmulatorStore, taken: int, count: int, named: str,
) -> None:
    """Storage written before the record existed has none (found by review: the first node of an
    upgrade recorded whatever it was given, a wrong partitionCount included). Its ownership
    records name the partitions its nodes took, p0 to its count less one: a node whose count
    differs refuses it, and nothing is recorded."""
    await _take(store, taken)
    with pytest.raises(ClusterMismatch, match=re.escape(named)):
        await claim_once(store, ClusterRecord("cornus", count), "n1")
    assert await store.read(LogId.cluster(), CLUSTER_RECORD_TXN) is None


async def test_storage_of_an_earlier_version_with_the_same_count_is_recorded(store: EmulatorStore) -> None:
    await _take(store, 4)
    assert await claim_once(store, ClusterRecord("cornus", 4), "n1") is True
    assert await claim_once(store, ClusterRecord("cornus", 4), "n0") is False


async def test_storage_of_an_earlier_version_that_stopped_before_taking_every_partition_is_recorded(
    store: EmulatorStore,
) -> None:
    """A deployment of 2 nodes and 6 partitions whose n1 never started: n0 took its preferred
    p0, p2 and p4 (round-robin). That is some of this count's partitions and no others, so the
    count stands (found by review: the first version of the check refused it for good)."""
    for index in (0, 2, 4):
        await store.write_owner(None, Ownership(f"p{index}", "n0", 1, 1, 4_000))
    assert await claim_once(store, ClusterRecord("cornus", 6), "n1") is True


# p0 alone would be a smaller count's partitions (a refusal), p1 alone some of this count's (a
# deployment of an earlier version that stopped early): either is the racing node's first take.
@pytest.mark.parametrize("taken_first", ["p0", "p1"])
async def test_a_node_that_raced_another_to_the_first_record_reads_it_not_the_partitions_taken_since(
    store: EmulatorStore, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, taken_first: str,
) -> None:
    """Found by review of the check above: two nodes over empty storage both read no record; one
    writes it and takes its first partitions before the other reads the ownership records, which
    then name some partitions and not others. That is this version's cluster, whose record is
    there by then: the node reads it again and goes by it, rather than refuse the storage, and
    says nothing of an earlier version (found by the Azure chaos runs, 2026-11-28: every first
    start warned "storage of an earlier version")."""
    assert await claim_once(store, MINE, "n0") is True
    await store.write_owner(None, Ownership(taken_first, "n0", 1, 1, 4_000))
    read = store.read
    missed: list[LogId] = []

    async def first_read_missed(log: LogId, txn: str) -> object:
        if log == LogId.cluster() and not missed:
            missed.append(log)
            return None  # as it was before the other node wrote it
        return await read(log, txn)

    monkeypatch.setattr(store, "read", first_read_missed)
    with caplog.at_level("WARNING", logger="cornus.node"):
        assert await claim_once(store, MINE, "n1") is False
    assert missed
    assert "earlier version" not in caplog.text, caplog.text
    with pytest.raises(ClusterMismatch, match="partition_count 12"):
        missed.clear()
        await claim_once(store, ClusterRecord("team-a.cornus", 13), "n2")


@pytest.mark.parametrize("redo", [b"", b"not json", b'{"v": 2}', b'{"v": 1, "cluster_id": "c"}'])
async def test_a_record_no_version_wrote_is_an_invariant_broken(store: EmulatorStore, redo: bytes) -> None:
    await store.log_once(LogId.cluster(), CLUSTER_RECORD_TXN, TxnState.COMMIT, RecordBody(redo=redo))
    with pytest.raises(InvariantViolation, match="cluster record"):
        await claim_once(store, MINE, "n0")


def test_the_cluster_id_comes_from_file_environment_or_flag_and_is_checked(tmp_path: Path) -> None:
    base = {"CORNUS_NODE_ID": "n0", "CORNUS_PEERS": "n0=127.0.0.1:7100", "CORNUS_PARTITION_COUNT": "2"}
    assert load_node_config(environ=base).cluster_id == "cornus"
    assert load_node_config(environ={**base, "CORNUS_CLUSTER_ID": "team-a.cornus"}).cluster_id == "team-a.cornus"
    config_file = tmp_path / "node.toml"
    config_file.write_text('cluster_id = "from-file"\n')
    assert load_node_config(config_file, environ=base).cluster_id == "from-file"
    assert load_node_config(config_file, environ=base, overrides={"cluster_id": "flag"}).cluster_id == "flag"
    for bad in ("team a", "", "c" * 129):
        with pytest.raises(ValidationError, match="cluster_id"):
            load_node_config(environ={**base, "CORNUS_CLUSTER_ID": bad})
