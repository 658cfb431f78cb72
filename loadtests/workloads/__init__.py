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


# Keys a workload may load. Its load phase builds every key and value in the driver's memory
# (about 500 MB per million keys, in each Locust process too) and writes each over the API before
# the clock starts (a minute or more per million): beyond this a typo, not a benchmark.
WORKLOAD_KEY_COUNT_MAX = 1_000_000


def make_workload(name: str, partition_count: int, knobs: Mapping[str, object] | None = None) -> Workload:
    """The named workload over `partition_count` partitions with `knobs`; WorkloadError (naming
    the knob or the bound) before anything is built when they cannot run."""
    try:
        cls = WORKLOADS[name]
    except KeyError:
        raise WorkloadError(f"no workload {name!r}; one of {', '.join(WORKLOADS)}") from None
    workload = cls(partition_count, knobs)  # type: ignore[call-arg]
    size = workload.data_size()
    if size.keys > WORKLOAD_KEY_COUNT_MAX:
        raise WorkloadError(f"{name} would load {size.keys:,} keys ({size.formula}); at most "
                            f"{WORKLOAD_KEY_COUNT_MAX:,} (WORKLOAD_KEY_COUNT_MAX: the load phase holds every key in "
                            "the driver's memory and writes each before the run starts)")
    return workload


__all__ = ["WORKLOADS", "WORKLOAD_KEY_COUNT_MAX", "Workload", "WorkloadError", "make_workload"]
