"""YCSB as the Cornus paper runs it (section 5.1.3, on the Sundial testbed): one table partitioned
round-robin over the partitions (row r lives on partition r mod P), 16 requests per transaction,
each a read with probability `read_fraction` (0.5 by default) and a write otherwise, keys drawn
Zipfian with skew `theta` (0: uniform) within a partition, and each request sent to a partition
other than the client's home partition with probability `remote_fraction` (0.05, the artifact's
PERC_REMOTE). Duplicate keys within a transaction are dropped, as Sundial does. A transaction runs
as one one-shot request, as the paper's stored procedures do.

`read_only_perc` makes that percentage of transactions read-only outright (all 16 requests reads);
the paper's Figure 6 varies `read_fraction` instead, which makes a transaction read-only with
probability read_fraction^16. Rows are `rows_per_partition` per partition (the paper's are 10 GB of
1 KB tuples; ours are loaded over the API before the run, so fewer and smaller: VALUE_BYTES each).

Every write carries a value of its own, and the end-of-run check is loadtests.workloads.last_writes':
each key written holds what its last committed write wrote.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from loadtests.workloads.base import (
    DataSize,
    Txn,
    Workload,
    WorkloadError,
    Zipf,
    knob_float,
    knob_int,
    refuse_unknown,
)
from loadtests.workloads.last_writes import LastWrites, WriteValues, tracked_one_shot

REQUESTS_PER_TXN = 16
REQUESTS_PER_TXN_MAX = 64
ROWS_PER_PARTITION = 10_000
ROWS_PER_PARTITION_MAX = 1_000_000
VALUE_BYTES = 100
THETA_MAX = 0.99
KNOBS = {"requests_per_txn", "read_fraction", "theta", "remote_fraction", "read_only_perc", "rows_per_partition"}


class YcsbWorkload(Workload):
    name = "ycsb"

    def __init__(self, partition_count: int, knobs: Mapping[str, object] | None = None) -> None:
        super().__init__(partition_count)
        knobs = dict(knobs or {})
        refuse_unknown(knobs, KNOBS, self.name)
        self.requests_per_txn = knob_int(knobs, "requests_per_txn", REQUESTS_PER_TXN, 1, REQUESTS_PER_TXN_MAX)
        self.read_fraction = knob_float(knobs, "read_fraction", 0.5, 0.0, 1.0)
        self.theta = knob_float(knobs, "theta", 0.0, 0.0, THETA_MAX)
        self.remote_fraction = knob_float(knobs, "remote_fraction", 0.05, 0.0, 1.0)
        self.read_only_perc = knob_float(knobs, "read_only_perc", 0.0, 0.0, 100.0)
        self.rows_per_partition = knob_int(knobs, "rows_per_partition", ROWS_PER_PARTITION, 2,
                                           ROWS_PER_PARTITION_MAX)
        if self.remote_fraction > 0 and partition_count < 2:
            raise WorkloadError("remote_fraction > 0 needs at least 2 partitions")
        self.zipf = Zipf(self.rows_per_partition, self.theta)
        self.value = "y" * VALUE_BYTES  # every row's value when loaded
        self.write_values = WriteValues(VALUE_BYTES, "y")
        self.last_writes = LastWrites(self.value)

    def row_key(self, row: int, partition: int) -> str:
        """Row `row` of partition `partition`: global row id row * P + partition (round-robin)."""
        return self.pinner.key(f"y{row * self.partition_count + partition}", partition)

    def initial_data(self) -> dict[str, str]:
        return {self.row_key(row, p): self.value
                for p in range(self.partition_count) for row in range(self.rows_per_partition)}

    def data_size(self) -> DataSize:
        return DataSize(self.rows_per_partition * self.partition_count,
                        f"{self.rows_per_partition:,} rows_per_partition x {self.partition_count} partitions")

    def next_txn(self, rng: random.Random, client: int) -> Txn:
        home = self.home_partition(client)
        read_only = rng.random() * 100 < self.read_only_perc
        ops: list[dict[str, str]] = []
        seen: set[str] = set()
        partitions: set[int] = set()
        value = self.write_values.next()
        for _ in range(self.requests_per_txn):
            partition = home
            if self.partition_count > 1 and rng.random() < self.remote_fraction:
                partition = (home + rng.randrange(1, self.partition_count)) % self.partition_count
            key = self.row_key(self.zipf.next(rng), partition)
            reads = read_only or rng.random() < self.read_fraction
            if key in seen:
                continue
            seen.add(key)
            partitions.add(partition)
            ops.append({"op": "get", "key": key} if reads else {"op": "put", "key": key, "value": value})
        return Txn(kind="ycsb", home=f"p{home}", partitions=frozenset(f"p{p}" for p in partitions),
                   read_only=all(op["op"] == "get" for op in ops), program=tracked_one_shot(ops, self.last_writes))

    def check(self, read: Callable[[Sequence[str]], dict[str, str | None]]) -> list[str]:
        return self.last_writes.check(read)

    def describe(self) -> dict[str, Any]:
        return {"requests_per_txn": self.requests_per_txn, "read_fraction": self.read_fraction,
                "theta": self.theta, "remote_fraction": self.remote_fraction,
                "read_only_perc": self.read_only_perc, "rows_per_partition": self.rows_per_partition}
