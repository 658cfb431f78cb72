"""The benchmark workloads, one definition each, run by both drivers (the built-in closed-loop
driver of `cornus bench` and the Locust files): `make_workload("ycsb", partition_count, knobs)`.
See base.py for what a workload and a transaction program are."""

from __future__ import annotations

from collections.abc import Mapping

from loadtests.workloads.bank import BankWorkload
from loadtests.workloads.base import Workload, WorkloadError
from loadtests.workloads.tpcc import TpccWorkload
from loadtests.workloads.uniform import UniformWorkload
from loadtests.workloads.ycsb import YcsbWorkload

WORKLOADS: dict[str, type[Workload]] = {
    "ycsb": YcsbWorkload,
    "tpcc": TpccWorkload,
    "bank": BankWorkload,
    "uniform": UniformWorkload,
}


def make_workload(name: str, partition_count: int, knobs: Mapping[str, object] | None = None) -> Workload:
    try:
        cls = WORKLOADS[name]
    except KeyError:
        raise WorkloadError(f"no workload {name!r}; one of {', '.join(WORKLOADS)}") from None
    return cls(partition_count, knobs)  # type: ignore[call-arg]


__all__ = ["WORKLOADS", "Workload", "WorkloadError", "make_workload"]
