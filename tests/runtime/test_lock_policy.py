"""The lock policy is a node setting (`lock_policy` in the config file, CORNUS_LOCK_POLICY, or
`cornus serve --lock-policy`): NO_WAIT, the paper's and the default, aborts a request that meets a
conflicting lock; WAIT_DIE lets a request older than every holder wait for them (bounded by
timeout_ms_lock_wait) and aborts a younger one."""

from __future__ import annotations

import asyncio

import pytest

from cornus.protocol.locks import Policy
from cornus.protocol.txn_ids import begin_ms_of
from cornus.runtime.config import load_node_config
from cornus.runtime.coordination import TxnAborted
from cornus.runtime.outcome import AbortReason, OutcomeStatus
from cornus.runtime.wire import Op, OpKind
from storage_adapters.errors import ValidationError
from tests.runtime.faults import local_cluster, wait_until

pytestmark = pytest.mark.timeout(60)

BASE = {"node_id": "n0", "peers": "n0=127.0.0.1:7100", "partition_count": 1}


def test_the_policy_comes_from_file_environment_or_flag(tmp_path):
    assert load_node_config(environ={}, overrides=BASE).lock_policy is Policy.NO_WAIT
    assert load_node_config(environ={"CORNUS_LOCK_POLICY": "WAIT_DIE"}, overrides=BASE).lock_policy is Policy.WAIT_DIE
    config_file = tmp_path / "node.toml"
    config_file.write_text('lock_policy = "wait_die"\n')
    assert load_node_config(config_file, environ={}, overrides=BASE).lock_policy is Policy.WAIT_DIE
    # A flag overrides the environment, which overrides the file.
    flagged = load_node_config(config_file, environ={"CORNUS_LOCK_POLICY": "wait_die"},
                               overrides={**BASE, "lock_policy": "no_wait"})
    assert flagged.lock_policy is Policy.NO_WAIT


def test_an_unknown_policy_is_refused_by_name():
    with pytest.raises(ValidationError, match="lock_policy 'wound_wait' is not one of no_wait, wait_die"):
        load_node_config(environ={"CORNUS_LOCK_POLICY": "wound_wait"}, overrides=BASE)


async def _older_then_younger(node) -> tuple[str, str]:
    old = node.begin()
    # WAIT_DIE orders by the begin millisecond in the id: the younger one must begin in a later one.
    while True:
        young = node.begin()
        if begin_ms_of(young) > begin_ms_of(old):
            return old, young
        await node.abort(young)
        await asyncio.sleep(0.001)


@pytest.mark.parametrize("policy", list(Policy))
async def test_an_older_reader_waits_for_a_younger_writer_only_under_wait_die(tmp_path, policy):
    async with local_cluster(tmp_path, node_count=1, partition_count=1, lock_policy=policy) as cluster:
        node = cluster.node()
        assert node.lock_policy is policy
        key = cluster.key_in("p0")
        old, young = await _older_then_younger(node)
        await node.run_ops(young, [Op(OpKind.PUT, key, b"young")])
        read = asyncio.ensure_future(node.run_ops(old, [Op(OpKind.GET, key)]))
        if policy is Policy.NO_WAIT:
            with pytest.raises(TxnAborted) as aborted:
                await read
            assert aborted.value.outcome.reason is AbortReason.CONFLICT
            assert (await node.commit(young)).status is OutcomeStatus.COMMITTED
            return
        locks = node.partitions["p0"].locks

        async def waiting() -> bool:
            return old in locks._waiting

        await wait_until(waiting, 10, "the older reader never queued behind the younger writer")
        assert not read.done()
        assert (await node.commit(young)).status is OutcomeStatus.COMMITTED
        assert await read == [b"young"]
        assert (await node.commit(old)).status is OutcomeStatus.COMMITTED


async def test_a_younger_requester_dies_under_wait_die(tmp_path):
    async with local_cluster(tmp_path, node_count=1, partition_count=1, lock_policy=Policy.WAIT_DIE) as cluster:
        node = cluster.node()
        key = cluster.key_in("p0")
        old, young = await _older_then_younger(node)
        await node.run_ops(old, [Op(OpKind.PUT, key, b"old")])
        with pytest.raises(TxnAborted) as aborted:
            await node.run_ops(young, [Op(OpKind.GET, key)])
        assert aborted.value.outcome.reason is AbortReason.CONFLICT
        assert (await node.commit(old)).status is OutcomeStatus.COMMITTED
