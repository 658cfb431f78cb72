"""The workload `cornus bench` ran before the paper's workloads came (docs/performance.md's figures
were taken with it): every transaction is distributed over exactly `partitions_per_txn` partitions
chosen at random and writes to each of them, its `ops_per_txn` operations spread round-robin over
them, each partition's first operation a put, then gets and puts alternating; keys uniform over
KEYS_PER_PARTITION per partition, so conflicts exist but are rare. One one-shot request each.
Every put carries a value of its own; the end-of-run check is loadtests.workloads.last_writes'.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from loadtests.workloads.base import DataSize, Txn, Workload, WorkloadError, knob_int, refuse_unknown
from loadtests.workloads.last_writes import LastWrites, WriteValues, tracked_one_shot

KEYS_PER_PARTITION = 2_000
VALUE_BYTES = 100
OPS_PER_TXN_MAX = 64
KNOBS = {"partitions_per_txn", "ops_per_txn"}


class UniformWorkload(Workload):
    name = "uniform"

    def __init__(self, partition_count: int, knobs: Mapping[str, object] | None = None) -> None:
        super().__init__(partition_count)
        knobs = dict(knobs or {})
        refuse_unknown(knobs, KNOBS, self.name)
        if partition_count < 1:
            raise WorkloadError("uniform needs at least one partition")
        self.partitions_per_txn = knob_int(knobs, "partitions_per_txn", min(2, partition_count), 1, partition_count)
        self.ops_per_txn = knob_int(knobs, "ops_per_txn", 8, 1, OPS_PER_TXN_MAX)
        self.value = "x" * VALUE_BYTES  # every key's value when loaded
        self.write_values = WriteValues(VALUE_BYTES, "x")
        self.last_writes = LastWrites(self.value)

    def key(self, index: int, partition: int) -> str:
        return self.pinner.key(f"u{index}.{partition}", partition)

    def initial_data(self) -> dict[str, str]:
        return {self.key(i, p): self.value for p in range(self.partition_count) for i in range(KEYS_PER_PARTITION)}

    def data_size(self) -> DataSize:
        return DataSize(KEYS_PER_PARTITION * self.partition_count,
                        f"{KEYS_PER_PARTITION:,} keys per partition x {self.partition_count} partitions")

    def next_txn(self, rng: random.Random, client: int) -> Txn:
        partitions = rng.sample(range(self.partition_count), self.partitions_per_txn)
        ops: list[dict[str, str]] = []
        value = self.write_values.next()
        for index in range(max(self.ops_per_txn, self.partitions_per_txn)):
            key = self.key(rng.randrange(KEYS_PER_PARTITION), partitions[index % self.partitions_per_txn])
            if (index // self.partitions_per_txn) % 2 == 0:
                ops.append({"op": "put", "key": key, "value": value})
            else:
                ops.append({"op": "get", "key": key})
        return Txn(kind="uniform", home=f"p{partitions[0]}", partitions=frozenset(f"p{p}" for p in partitions),
                   read_only=False, program=tracked_one_shot(ops, self.last_writes))

    def check(self, read: Callable[[Sequence[str]], dict[str, str | None]]) -> list[str]:
        return self.last_writes.check(read)

    def describe(self) -> dict[str, Any]:
        return {"partitions_per_txn": self.partitions_per_txn, "ops_per_txn": self.ops_per_txn}
