"""PNG figures in the style of the paper's: Figures 5, 6, 7 and 10 (average and 99th-percentile
latency of distributed transactions against the swept parameter, one line per protocol; the
breakdown of the average as stacked bars per protocol, execution / prepare / commit of the last
attempt, then the time lost to earlier attempts and the client's HTTP side, so that each bar is
as tall as the average latency; throughput and abort rate) and Figure 8 (time to terminate after
a coordinator failure against the node count). matplotlib with the Agg backend: files only, no
display needed."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loadtests.bench.report import BREAKDOWN_SEGMENTS

PROTOCOL_STYLE = {
    "cornus": ("Cornus", "tab:green", "o"),
    "2pc": ("2PC", "tab:red", "s"),
    "coordinator-log": ("Coordinator log", "tab:blue", "^"),
}
DPI = 110
NO_MATPLOTLIB = "plots skipped: matplotlib is not installed (pip install -e '.[bench]')"


def matplotlib_missing(error: ImportError) -> bool:
    """Whether `error` is matplotlib's absence. The plot functions import it only when they draw, so
    callers see it from the call (after the measurements), not from importing this module."""
    return (error.name or "").partition(".")[0] == "matplotlib"


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _style(protocol: str) -> tuple[str, str, str]:
    return PROTOCOL_STYLE.get(protocol, (protocol, "tab:gray", "x"))


def _series(rows: Sequence[dict[str, Any]]) -> tuple[list[str], list[str]]:
    values = list(dict.fromkeys(str(row["value"]) for row in rows))
    protocols = [p for p in PROTOCOL_STYLE if any(row["protocol"] == p for row in rows)]
    return values, protocols


def _at(rows: Sequence[dict[str, Any]], protocol: str, value: str, column: str) -> float:
    for row in rows:
        if row["protocol"] == protocol and str(row["value"]) == value:
            return float(row.get(column) or 0)  # a row from before the column: nothing to stack
    return float("nan")


def plot_sweep(rows: Sequence[dict[str, Any]], out_dir: Path, title: str) -> list[Path]:
    """latency.png, breakdown.png and throughput.png for a sweep (or a single point) in `out_dir`."""
    plt = _pyplot()
    values, protocols = _series(rows)
    param = rows[0]["param"] or "run"
    xs = list(range(len(values)))
    paths = []

    figure, axes = plt.subplots(1, 2, figsize=(10, 4), dpi=DPI)
    for axis, column, name in ((axes[0], "dist_avg_ms", "average"), (axes[1], "dist_p99_ms", "99th percentile")):
        for protocol in protocols:
            label, color, marker = _style(protocol)
            axis.plot(xs, [_at(rows, protocol, v, column) for v in values], label=label, color=color, marker=marker)
        axis.set_xticks(xs, values)
        axis.set_xlabel(param)
        axis.set_ylabel("latency (ms)")
        axis.set_title(f"{name} latency, distributed txns")
        axis.set_ylim(bottom=0)
        axis.grid(alpha=0.3)
    axes[0].legend()
    figure.suptitle(title)
    figure.tight_layout()
    paths.append(out_dir / "latency.png")
    figure.savefig(paths[-1])
    plt.close(figure)

    figure, axis = plt.subplots(figsize=(max(6, 1.6 * len(values) * max(1, len(protocols)) / 2), 4), dpi=DPI)
    width = 0.8 / max(1, len(protocols))
    for index, protocol in enumerate(protocols):
        label, _, _ = _style(protocol)
        offsets = [x - 0.4 + width * (index + 0.5) for x in xs]
        bottom = [0.0] * len(values)
        for column, segment, color in BREAKDOWN_SEGMENTS:
            heights = [_at(rows, protocol, v, column) for v in values]
            heights = [0.0 if math.isnan(h) else h for h in heights]  # no such point: draw nothing
            axis.bar(offsets, heights, width * 0.95, bottom=bottom, color=color, edgecolor="black", linewidth=0.5,
                     label=segment if index == 0 else None)
            bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
        for x, top in zip(offsets, bottom, strict=True):
            axis.text(x, top, {"cornus": "C", "2pc": "2", "coordinator-log": "L"}.get(protocol, "?"),
                      ha="center", va="bottom", fontsize=8)
        del label
    axis.set_xticks(xs, values)
    axis.set_xlabel(param)
    axis.set_ylabel("ms (average, distributed txns)")
    axis.set_title("latency breakdown, adding up to the average (bars: C Cornus, 2 2PC, L coordinator log)",
                   fontsize="medium")
    axis.legend(loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=3, fontsize="small")
    axis.grid(alpha=0.3, axis="y")
    figure.suptitle(title)
    figure.tight_layout()
    paths.append(out_dir / "breakdown.png")
    figure.savefig(paths[-1])
    plt.close(figure)

    figure, axes = plt.subplots(1, 2, figsize=(10, 4), dpi=DPI)
    for protocol in protocols:
        label, color, marker = _style(protocol)
        axes[0].plot(xs, [_at(rows, protocol, v, "commits_per_s") for v in values], label=label, color=color,
                     marker=marker)
        axes[1].plot(xs, [100 * _at(rows, protocol, v, "abort_rate") for v in values], label=label, color=color,
                     marker=marker)
    for axis, name in ((axes[0], "throughput (commits/s)"), (axes[1], "aborted attempts (%)")):
        axis.set_xticks(xs, values)
        axis.set_xlabel(param)
        axis.set_title(name)
        axis.set_ylim(bottom=0)
        axis.grid(alpha=0.3)
    axes[0].legend()
    figure.suptitle(title)
    figure.tight_layout()
    paths.append(out_dir / "throughput.png")
    figure.savefig(paths[-1])
    plt.close(figure)
    return paths


def plot_termination(rows: Sequence[dict[str, Any]], out_path: Path, title: str) -> Path:
    """Figure 8: termination time (median, p99, max over the participants' runs pooled) against
    nodes. A point without a p99 (too few runs: loadtests.bench.termination.P99_RUN_COUNT_MIN)
    has none drawn, and without any the line and its legend entry are left out."""
    plt = _pyplot()
    nodes = [row["nodes"] for row in rows]
    figure, axis = plt.subplots(figsize=(6, 4), dpi=DPI)
    for column, label, style in (("p50_ms", "median", "-o"), ("p99_ms", "99th percentile", "--s"),
                                 ("max_ms", "max", ":^")):
        values = [float(row[column]) for row in rows]
        if all(math.isnan(value) for value in values):
            continue
        axis.plot(nodes, values, style, label=label, color="tab:green")
    axis.set_xticks(nodes)
    axis.set_xlabel("nodes")
    axis.set_ylabel("time to terminate (ms)")
    axis.set_ylim(bottom=0)
    axis.grid(alpha=0.3)
    axis.legend()
    axis.set_title(title)
    figure.tight_layout()
    figure.savefig(out_path)
    plt.close(figure)
    return out_path
