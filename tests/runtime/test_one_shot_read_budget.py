"""A one-shot's reads come back in its reply after it commits: what it may read over all its
partitions is bounded (ONE_SHOT_READ_BYTES_MAX), not only what each partition answers
(READ_BYTES_MAX), and a one-shot past it is refused as bad input with nothing committed.

Found by audit (2026-11-27): each partition's share was bounded, the whole was not, so a one-shot
reading many partitions made the coordinator hold, and the REST reply carry, up to 256 times 8 MiB.
A one-shot that writes carries its prepare, so its values arrive as it commits: each partition's
request carries its share of the budget, and an owner refuses a request past it before it votes.
"""

from __future__ import annotations

import pytest

from cornus.runtime import coordination
from cornus.runtime.outcome import OutcomeStatus
from cornus.runtime.wire import Op, OpKind
from storage_adapters.errors import ValidationError
from tests.runtime.faults import local_cluster

pytestmark = pytest.mark.timeout(60)

VALUE_BYTES = 40 * 1024
KEYS_PER_PARTITION = 2  # 80 KiB read on each: more than one value of the largest size, which always fits
# Two partitions' reads fit (a share of 100 KiB each), three do not (about 67 KiB each).
BUDGET_BYTES = 200 * 1024


async def test_a_one_shot_reading_more_than_its_budget_is_refused_and_commits_nothing(tmp_path, monkeypatch):
    async with local_cluster(tmp_path, node_count=3, partition_count=3) as cluster:
        node = cluster.node("n0")
        keys = {index: [cluster.key_in(f"p{index}", f"big{number}") for number in range(KEYS_PER_PARTITION)]
                for index in range(3)}
        for partition_keys in keys.values():
            written = await node.execute([Op(OpKind.PUT, key, b"x" * VALUE_BYTES) for key in partition_keys])
            assert written.status is OutcomeStatus.COMMITTED, written
        target = cluster.key_in("p1", "target")
        monkeypatch.setattr(coordination, "ONE_SHOT_READ_BYTES_MAX", BUDGET_BYTES)

        def reads(*partitions: int) -> list[Op]:
            return [Op(OpKind.GET, key) for index in partitions for key in keys[index]]

        for ops in (reads(0, 1, 2), [*reads(0, 1, 2), Op(OpKind.PUT, target, b"never")]):  # read-only, then a write
            with pytest.raises(ValidationError, match="read fewer keys"):
                await node.execute(ops)
        check = await node.execute([Op(OpKind.GET, target)])
        assert dict(check.reads) == {target: None}, "a refused one-shot wrote"

        # Within the budget, as before: two partitions' reads, with a write and without.
        for ops in (reads(0, 1), [*reads(0, 1), Op(OpKind.PUT, target, b"yes")]):
            fits = await node.execute(ops)
            assert fits.status is OutcomeStatus.COMMITTED, fits
            assert [len(value or b"") for _, value in fits.reads] == [VALUE_BYTES] * 4
