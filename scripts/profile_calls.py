"""Python calls per committed transaction, counted by cProfile, to compare two revisions.

    python scripts/profile_calls.py record OUT [TXN_COUNT]   # in a checkout (PYTHONPATH at it)
    python scripts/profile_calls.py diff BASE.prof HEAD.prof [TXN_COUNT]

`record` runs TXN_COUNT one-shot transactions, each writing two partitions, on an in-process
cluster of the test suite (tests/runtime/faults.local_cluster: three nodes, the emulator, the
plain asyncio loop) after a warm-up, under cProfile, and writes the stats to OUT; it prints the
process CPU and the Python calls per transaction. `diff` prints the functions whose calls per
transaction changed most between two such files. Counts are exact where a sampling profile
(scripts/profile_nodes.sh) is not; times under cProfile are inflated and only compare with each
other. To profile another revision: `git worktree add /tmp/base REV`, then `cd /tmp/base &&
PYTHONPATH=/tmp/base python /path/to/this/script record /tmp/base.prof`.
"""

from __future__ import annotations

import asyncio
import collections
import cProfile
import pstats
import sys
import tempfile
import time
from pathlib import Path

TXN_COUNT_DEFAULT = 1_500
WARM_UP_TXN_COUNT = 200
KEY_COUNT = 50  # keys per partition the transactions cycle over
SHOWN_COUNT = 30


async def _record(out: str, txn_count: int) -> None:
    from cornus.runtime.wire import Op, OpKind
    from tests.runtime.faults import local_cluster

    def ops(index: int) -> list[Op]:
        return [Op(OpKind.PUT, f"k{index % KEY_COUNT}a", b"v"), Op(OpKind.PUT, f"k{index % KEY_COUNT}b", b"w")]

    with tempfile.TemporaryDirectory() as directory:
        async with local_cluster(Path(directory), partition_count=2) as cluster:
            node = cluster.node()
            for index in range(WARM_UP_TXN_COUNT):
                await node.execute(ops(index))
            profile = cProfile.Profile()
            started_s = time.process_time()
            profile.enable()
            for index in range(txn_count):
                await node.execute(ops(index))
            profile.disable()
            cpu_s = time.process_time() - started_s
    profile.dump_stats(out)
    calls = pstats.Stats(profile).total_calls  # type: ignore[attr-defined]
    print(f"{txn_count} transactions: CPU {1000 * cpu_s / txn_count:.3f} ms each (under cProfile), "
          f"{calls / txn_count:.0f} Python calls each; stats in {out}")


def _calls_by_function(path: str) -> collections.Counter[str]:
    counts: collections.Counter[str] = collections.Counter()
    for (file, _, name), (_, calls, _, _, _) in pstats.Stats(path).stats.items():  # type: ignore[attr-defined]
        counts[f"{Path(file).name}:{name}"] += calls
    return counts


def _diff(base: str, head: str, txn_count: int) -> None:
    before, after = _calls_by_function(base), _calls_by_function(head)
    changes = sorted(((after[name] - before[name]) / txn_count, name) for name in before.keys() | after.keys())
    print(f"calls per transaction: {sum(before.values()) / txn_count:.0f} -> {sum(after.values()) / txn_count:.0f}")
    for change, name in [*changes[::-1][:SHOWN_COUNT], *changes[:SHOWN_COUNT // 3]]:
        if change:
            print(f"{change:+9.2f}  {before[name] / txn_count:8.2f} -> {after[name] / txn_count:8.2f}  {name}")


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "record":
        asyncio.run(_record(argv[1], int(argv[2]) if len(argv) > 2 else TXN_COUNT_DEFAULT))
        return 0
    if len(argv) >= 3 and argv[0] == "diff":
        _diff(argv[1], argv[2], int(argv[3]) if len(argv) > 3 else TXN_COUNT_DEFAULT)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
