"""`cornus bench` end to end: the protocols x one swept parameter (or a single point), one fresh
cluster per measurement, a progress bar while it runs, then the files: `results.csv` (one row per
point and protocol, loadtests.bench.report.CSV_FIELDS), `latency.png`, `breakdown.png`,
`throughput.png` (loadtests.bench.plots) and `summary.md` (the table, the 2PC/Cornus and
coordinator-log/Cornus ratios, the invariant checks, the command and the machine).

Sweepable parameters: nodes (one partition per node), clients, lock_policy, latency (a profile or
a spec), and any knob of the workload (theta, read_fraction, read_only_perc, remote_fraction for
YCSB; warehouses for TPC-C; accounts, audit_clients for the bank; ...).
"""

from __future__ import annotations

import csv
import dataclasses
import os
import platform
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from cornus.protocol.config import Protocol
from loadtests.bench.cluster import RunResult, RunSettings, run_protocol
from loadtests.bench.plots import NO_MATPLOTLIB, matplotlib_missing, plot_sweep
from loadtests.bench.profiles import latency_label, resolve_latency
from loadtests.bench.report import CSV_FIELDS, format_ratios, format_rows, markdown_summary, median_trial, summarize
from loadtests.workloads import WORKLOADS, make_workload
from loadtests.workloads.base import WorkloadError
from storage_adapters.errors import ValidationError
from storage_adapters.factory import StoreConfig
from storage_adapters.latency import parse_latency

SWEEP_VALUE_COUNT_MAX = 32
# Trials of each protocol at each point: 9 already makes a 10-point sweep of three protocols 270 runs.
TRIAL_COUNT_MAX = 9
SETTING_PARAMS = ("nodes", "clients", "lock_policy", "latency")

T = TypeVar("T")


@dataclass
class BenchPlan:
    protocols: list[Protocol]
    storage: StoreConfig
    storage_argv: Callable[[StoreConfig], list[str]]  # the flags that hand a storage config to the nodes
    base: RunSettings
    storage_environ: dict[str, str] = field(default_factory=dict)  # and its secrets, by environment
    latency: str = ""  # the spec or profile as given ("" none)
    sweep_param: str = ""
    sweep_values: list[str] = field(default_factory=list)
    out_dir: Path | None = None
    flush_redis: bool = False
    keep_storage: bool = False  # leave the containers or tables the runs created (loadtests.bench.namespaces)
    keep_logs: bool = False  # copy every run's node logs into out_dir/logs/<protocol>-<run>
    plots: bool = True
    command: str = ""
    trials: int = 1  # runs of each protocol at each point; the median one is kept (report.median_trial)


def parse_sweep(text: str, workload: str) -> tuple[str, list[str]]:
    """`PARAM=V1,V2,...` -> (param, values), refusing parameters the run cannot vary."""
    param, sep, raw = text.partition("=")
    param = param.strip().replace("-", "_")
    values = [value.strip() for value in raw.split(",") if value.strip()]
    knobs = knob_names(workload)
    if not sep or not values:
        raise ValidationError(f"--sweep {text!r}: expected PARAM=V1,V2,... e.g. nodes=2,4,8")
    if param not in SETTING_PARAMS and param not in knobs:
        raise ValidationError(f"--sweep {param}: not a parameter of {workload}; one of "
                              f"{', '.join(sorted(set(SETTING_PARAMS) | knobs))}")
    if len(values) > SWEEP_VALUE_COUNT_MAX:
        raise ValidationError(f"--sweep {param}: at most {SWEEP_VALUE_COUNT_MAX} values")
    # Values that differ only in spelling (NO_WAIT and no_wait, 0.1 and 0.10) would run one point twice.
    seen: dict[object, str] = {}
    for value in values:
        key = _point_key(param, value)
        if key in seen:
            raise ValidationError(f"--sweep {param}: {seen[key]!r} and {value!r} are the same point")
        seen[key] = value
    return param, values


def _point_key(param: str, value: str) -> object:
    """What a sweep value means, for telling two spellings of one point apart; a value this cannot
    read stands for itself (validate_plan refuses it with its own message)."""
    if param == "lock_policy":
        return value.lower()
    if param == "latency":
        try:
            spec = resolve_latency(value)
        except ValidationError:
            return value
        return parse_latency(spec) if spec else None
    try:
        return float(value)  # nodes, clients and the knobs are numbers
    except ValueError:
        return value


def knob_names(workload: str) -> set[str]:
    module = sys.modules[WORKLOADS[workload].__module__]
    return set(module.KNOBS)


def point_settings(plan: BenchPlan, value: str | None) -> tuple[RunSettings, str]:
    """The settings and the latency spec of one sweep point (the base ones without a sweep)."""
    settings = plan.base
    latency = plan.latency
    if value is None:
        return settings, latency
    param = plan.sweep_param
    if param in ("nodes", "clients"):
        try:
            number = int(value)
        except ValueError:
            raise ValidationError(f"--sweep {param}: {value!r} is not an integer") from None
        if param == "nodes":
            settings = dataclasses.replace(settings, nodes=number, partitions=number)
        else:
            settings = dataclasses.replace(settings, clients=number)
    elif param == "lock_policy":
        settings = dataclasses.replace(settings, lock_policy=value.lower())
    elif param == "latency":
        latency = value
    else:
        knobs = dict(settings.knobs)
        knobs[param] = value
        settings = dataclasses.replace(settings, knobs=tuple(sorted(knobs.items())))
    return settings, latency


def validate_plan(plan: BenchPlan) -> None:
    """Every point's settings, knobs and latency checked before any node starts."""
    if not 1 <= plan.trials <= TRIAL_COUNT_MAX:
        raise ValidationError(f"--trials {plan.trials}: between 1 and {TRIAL_COUNT_MAX}")
    for value in plan.sweep_values or [None]:
        settings, latency = point_settings(plan, value)
        settings.validate()
        resolve_latency(latency)
        try:
            make_workload(settings.workload, settings.partitions, dict(settings.knobs))
        except WorkloadError as error:
            raise ValidationError(f"{settings.workload}: {error}") from None


def machine_description() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        memory = f", {kb / 1024 / 1024:.0f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    return f"{os.cpu_count()} cores ({cpu}){memory}, {platform.system()} {platform.release()}, Python " \
           f"{platform.python_version()}"


class Progress:
    """A progress bar over the runs (tqdm, on stderr), or a line per run where tqdm is missing."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.done = 0
        self.bar: Any = None
        # A log file (CI, a test) gets one line per run instead of carriage-return redraws.
        if sys.stderr.isatty():
            try:
                from tqdm import tqdm
            except ImportError:
                return
            # tqdm's monitor is a thread, and the nodes start with a preexec_fn, which is unsafe
            # beside other threads (services/local_cluster.py): no monitor.
            tqdm.monitor_interval = 0
            self.bar = tqdm(total=total, unit="run", desc="cornus bench", file=sys.stderr, dynamic_ncols=True,
                            bar_format="{desc}: {n_fmt}/{total_fmt} runs |{bar}| {elapsed}<{remaining} {postfix}")

    def start(self, label: str) -> None:
        if self.bar is not None:
            self.bar.set_description_str(label)
        else:
            print(f"[{self.done + 1}/{self.total}] {label} ...", file=sys.stderr, flush=True)

    def finish(self, note: str) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.set_postfix_str(note)
            self.bar.update(1)
        else:
            print(f"[{self.done}/{self.total}] {note}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def trial_order(protocols: Sequence[T], point_index: int, trials: int, trial: int) -> list[T]:
    """The order the protocols run in at one trial of one point: rotated by one at every run of the
    sweep (point_index * trials + trial), so that with one trial per point the same protocol does
    not run first, on a machine not yet warm or drifting the same way, at every point."""
    first = (point_index * trials + trial) % len(protocols)
    return [*protocols[first:], *protocols[:first]]


def run_plan(plan: BenchPlan) -> tuple[list[dict[str, Any]], list[RunResult]]:
    """Run every point x protocol, `plan.trials` times each with the protocols alternating, and
    each trial, of every point, beginning with the next protocol (trial_order: so a drift of the
    machine's speed, and the first run's cold start, weigh on every protocol alike), and keep each
    one's median trial; write the CSV after each point (partial results survive a stop)."""
    validate_plan(plan)
    values: list[str | None] = list(plan.sweep_values) or [None]
    progress = Progress(len(values) * len(plan.protocols) * plan.trials)
    rows: list[dict[str, Any]] = []
    results: list[RunResult] = []
    try:
        for point_index, value in enumerate(values):
            settings, latency = point_settings(plan, value)
            storage = dataclasses.replace(plan.storage, latency=resolve_latency(latency))
            label = f"{plan.storage.backend}, latency {latency_label(latency)}"
            point = f"{plan.sweep_param}={value} " if value is not None else ""
            trials: dict[Protocol, list[tuple[dict[str, Any], RunResult]]] = {p: [] for p in plan.protocols}
            for trial in range(plan.trials):
                of = f" (trial {trial + 1}/{plan.trials})" if plan.trials > 1 else ""
                for protocol in trial_order(plan.protocols, point_index, plan.trials, trial):
                    progress.start(f"{point}{protocol.value}{of}")
                    # Each trial has storage of its own on the clouds: a container being deleted
                    # cannot be made again at once.
                    result = run_protocol(protocol, storage, plan.storage_argv(storage), settings,
                                          storage_environ=plan.storage_environ,
                                          run_index=point_index * plan.trials + trial, flush=plan.flush_redis,
                                          keep_storage=plan.keep_storage, storage_label=label,
                                          logs_dir=plan.out_dir / "logs" if plan.keep_logs and plan.out_dir else None)
                    row = summarize(result, plan.sweep_param if value is not None else "", value or "")
                    trials[protocol].append((row, result))
                    progress.finish(f"{point}{protocol.value}{of}: {row['commits_per_s']:.0f} commits/s, dist avg "
                                    f"{row['dist_avg_ms']:.2f} ms")
            for protocol in plan.protocols:
                row, result = median_trial(trials[protocol])
                rows.append(row)
                results.append(result)
            if plan.out_dir is not None:
                write_csv(rows, plan.out_dir / "results.csv")
    finally:
        progress.close()
    return rows, results


def write_csv(rows: Sequence[dict[str, Any]], path: Path, fields: Sequence[str] = CSV_FIELDS) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".csv.tmp")
    with temporary.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(fields))
        writer.writeheader()
        writer.writerows(rows)
    temporary.replace(path)


def title_of(plan: BenchPlan, rows: Sequence[dict[str, Any]]) -> str:
    """The plots' and the summary's title: the settings every point shares, "per point" for the swept one."""
    first = plan.base
    latency = "per point" if plan.sweep_param == "latency" else latency_label(plan.latency)
    return (f"{first.workload.upper()} on {plan.storage.backend}, injected latency {latency}, "
            f"{'per-point' if plan.sweep_param == 'nodes' else first.nodes} nodes, "
            f"{'per-point' if plan.sweep_param == 'clients' else first.clients} clients")


def write_outputs(plan: BenchPlan, rows: list[dict[str, Any]], results: Sequence[RunResult]) -> list[Path]:
    """results.csv, the PNG plots (when matplotlib is installed) and summary.md in plan.out_dir."""
    assert plan.out_dir is not None
    out = plan.out_dir
    out.mkdir(parents=True, exist_ok=True)
    files = [out / "results.csv"]
    write_csv(rows, files[0])
    title = title_of(plan, rows)
    if plan.plots and rows:
        try:
            files += plot_sweep(rows, out, title)
        except ImportError as error:
            if not matplotlib_missing(error):
                raise
            print(f"cornus bench: {NO_MATPLOTLIB}", file=sys.stderr)
    violations = [f"{result.protocol} {violation}" for result in results for violation in result.violations]
    violations += [f"{result.protocol} program error: {error}" for result in results for error in result.driver.errors]
    summary = markdown_summary(rows, title=title, command=plan.command, machine=machine_description(),
                               violations=violations, files=[path.name for path in files])
    (out / "summary.md").write_text(summary)
    files.append(out / "summary.md")
    return files


def print_results(rows: Sequence[dict[str, Any]], results: Sequence[RunResult]) -> None:
    print(format_rows(rows))
    ratios = format_ratios(rows)
    if ratios:
        print(ratios)
    for result in results:
        calls = ", ".join(f"{call} {count:.2f}" for call, count in result.storage_calls.items())
        row = summarize(result)
        print(f"  {result.protocol} ({dict(result.settings.knobs) or 'defaults'}): storage calls per commit: "
              f"{calls or 'none'}; {result.keys_loaded} keys loaded first in {result.load_s:.1f} s; "
              f"kinds (commits/attempts, measured window) {row['kinds']}; p50 ms of distributed transactions: client "
              f"{row['dist_p50_ms']:.2f}, node total {row['node_total_p50_ms']:.2f}, "
              f"prepare {row['prepare_p50_ms']:.2f}")
        if result.recovered_at_start:
            print(f"  note: the {result.protocol} nodes recovered {result.recovered_at_start} unfinished transactions "
                  "that an earlier run left in this storage (start from empty storage for clean figures)")
        for violation in result.violations:
            print(f"  INVARIANT VIOLATED ({result.protocol}): {violation}")
        for error in result.driver.errors:
            print(f"  WORKLOAD ERROR ({result.protocol}): {error}")


def default_out_dir() -> Path:
    return Path("bench-results") / time.strftime("%Y%m%d-%H%M%S")


def command_line() -> str:
    return "cornus " + " ".join(shlex.quote(arg) for arg in sys.argv[1:])
