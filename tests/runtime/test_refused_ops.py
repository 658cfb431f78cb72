"""An operation the owner refuses as invalid changes nothing (found by review): the partition was
named as touched all the same, so the transaction's next request there went as a continued one,
which the owner (holding no execution of it) refused as if it had restarted, and the transaction
aborted."""

from __future__ import annotations

import pytest

from cornus.runtime.outcome import OutcomeStatus
from cornus.runtime.wire import Op, OpKind
from storage_adapters.errors import ValidationError
from tests.runtime.faults import keys_in, local_cluster, wait_until

pytestmark = pytest.mark.timeout(60)


async def test_an_operation_refused_as_invalid_leaves_the_transaction_usable(tmp_path):
    async with local_cluster(tmp_path, node_count=1, partition_count=2) as cluster:
        node = cluster.node()
        key = keys_in(2, ["p0"])["p0"]
        txn = node.begin()
        with pytest.raises(ValidationError):
            await node.run_ops(txn, [Op(OpKind.GET, key, b"a get carries no value")])
        await node.run_ops(txn, [Op(OpKind.PUT, key, b"1")])
        assert (await node.commit(txn)).status is OutcomeStatus.COMMITTED

        async def applied() -> bool:
            return await cluster.value(key) == b"1"

        await wait_until(applied, 10, "the commit was never applied")
