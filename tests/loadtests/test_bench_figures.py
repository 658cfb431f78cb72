"""How `cornus bench` and `cornus termination-bench` compute their figures, on made-up records and
snapshots (no cluster): the latency breakdown adds up to what the client saw, the 2PC/Cornus limit,
the termination statistics, the measured window of every per-transaction figure, the order the
protocols run in, and the title. Each test was written against a finding of the audit of
2026-11-28 and failed before its fix."""

from __future__ import annotations

import asyncio
import collections
import json
import math
import time
from pathlib import Path

import pytest

from cornus.protocol.config import Protocol
from loadtests.bench import cluster, driver, plots, report, sweep, termination
from loadtests.bench.cluster import RunResult, RunSettings
from loadtests.workloads import make_workload
from loadtests.workloads.base import Reply
from storage_adapters.factory import StoreConfig


def _record(latency_ms: float, attempts: int, retry_ms: float, started_s: float = 5.0) -> driver.TxnRecord:
    return driver.TxnRecord("ycsb", True, False, "committed", "", attempts, started_s, latency_ms,
                            {"execution": 2.0, "prepare": 10.0, "commit": 0.1, "total": 12.1}, retry_ms=retry_ms)


# === 1: the breakdown counts aborted attempts and the client's HTTP ==============================

def test_the_breakdown_segments_add_up_to_the_client_latency():
    """The node's phases are the last attempt's; a transaction that aborted twice spent the rest of
    its latency on the earlier attempts and their pauses, and some on the client's HTTP call."""
    result = driver.DriverResult(warmup_s=1.0)
    result.records.append(_record(30.0, attempts=3, retry_ms=15.0))
    row = report.summarize(RunResult("cornus", RunSettings(), "redis", result, warmup_s=1.0))
    segments = [row[column] for column, _, _ in report.BREAKDOWN_SEGMENTS]
    assert segments == [2.0, 10.0, 0.1, 15.0, 2.9], row
    assert sum(segments) == pytest.approx(row["dist_avg_ms"]) == 30.0
    assert [label for _, label, _ in report.BREAKDOWN_SEGMENTS][-2:] == ["retries (aborted attempts)", "client/HTTP"]


def test_the_breakdown_plot_stacks_every_segment_up_to_the_average(tmp_path: Path, monkeypatch):
    result = driver.DriverResult(warmup_s=1.0)
    result.records.append(_record(30.0, attempts=3, retry_ms=15.0))
    row = {**report.summarize(RunResult("cornus", RunSettings(), "redis", result, warmup_s=1.0)), "value": "x"}
    figures = _recorded_figures(monkeypatch)
    plots.plot_sweep([row], tmp_path, "t")
    breakdown = next(figure for figure in figures if "breakdown" in figure.axes[0].get_title())
    axis = breakdown.axes[0]
    assert sum(patch.get_height() for patch in axis.patches) == pytest.approx(30.0), axis.patches
    labels = axis.get_legend_handles_labels()[1]
    assert labels == ["execution", "prepare", "commit", "retries (aborted attempts)", "client/HTTP"], labels


def _recorded_figures(monkeypatch) -> list:
    """The figures plots.py closes, kept open for the test to look into."""
    real = plots._pyplot()
    figures: list = []

    class Recording:
        def __getattr__(self, name: str) -> object:
            return getattr(real, name)

        def close(self, figure: object) -> None:
            figures.append(figure)

    monkeypatch.setattr(plots, "_pyplot", Recording)
    return figures


async def test_the_driver_times_the_attempts_before_the_last(monkeypatch):
    """retry_ms runs from the first attempt's start to the last one's: two aborted attempts of
    20 ms each and their pauses, none of the committed attempt (100 ms). Lower bounds only: on a
    loaded machine every sleep runs long (a CI run's 20 ms took 39), and the two mistakes this
    catches (the last attempt counted, or the aborted ones left out) each break one of them."""
    calls = 0

    async def attempt(connection: object, program: object) -> Reply:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.02 if calls <= 2 else 0.1)
        return Reply("aborted", "conflict", retryable=True) if calls <= 2 else Reply("committed")

    monkeypatch.setattr(driver, "run_program", attempt)
    monkeypatch.setattr(driver, "HttpConnection", _NoConnection)
    result = await driver.run_clients([("127.0.0.1", 9)], make_workload("uniform", 2, {}), seconds=0.2, clients=1)
    first = result.records[0]
    assert first.attempts == 3, first
    assert first.retry_ms >= 40, first
    assert first.latency_ms - first.retry_ms >= 100, first
    assert all(record.retry_ms == 0 for record in result.records[1:]), result.records


class _NoConnection:
    def __init__(self, *address: object) -> None:
        pass

    def close(self) -> None:
        pass


# === 2: the 2PC/Cornus limit ======================================================================

def _ratio_rows(cornus_path_ms: float, w_ms: float) -> list[dict[str, object]]:
    base = {**report.summarize(RunResult("cornus", RunSettings(), "redis", driver.DriverResult())),
            "dist_commits": 10, "dist_avg_ms": 10.0, "dist_p99_ms": 20.0, "node_total_ms": 9.0,
            "rw_dist_avg_ms": 10.0}
    return [{**base, "protocol": "cornus", "rw_commit_path_ms": cornus_path_ms, "w_log_once_ms": w_ms},
            {**base, "protocol": "2pc", "rw_commit_path_ms": cornus_path_ms + w_ms, "w_log_ms": 2.5}]


def test_the_limit_is_one_plus_w_over_cornus_path_even_when_that_path_is_shorter_than_w():
    """(r + 2W) / (r + W) with r = P - W is 1 + W / P; clamping r at 0 made it 2 whenever P < W."""
    [entry] = report.ratio_rows(_ratio_rows(cornus_path_ms=1.0, w_ms=2.0))
    assert entry["limit"] == 3.0, entry
    assert entry["rest_ms"] == -1.0 and entry["of_limit_pct"] == 100.0, entry
    [entry] = report.ratio_rows(_ratio_rows(cornus_path_ms=12.0, w_ms=10.0))
    assert entry["limit"] == pytest.approx(22 / 12, abs=0.001), entry


def test_the_limit_line_names_what_it_subtracts_and_shows_2pcs_own_write():
    text = report.format_ratios(_ratio_rows(cornus_path_ms=12.0, w_ms=10.0))
    assert "RTT" not in text, text
    assert "r (the rest of Cornus's commit path) 2.00 ms" in text, text
    assert "2PC's mean log write 2.50 ms" in text, text
    summary = report.markdown_summary(_ratio_rows(12.0, 10.0), title="t", command="c", machine="m",
                                      violations=[], files=[])
    assert "RTT" not in summary, summary


# === 3: termination statistics ====================================================================

def _node(name: str, durations: list[float]) -> termination.NodeTermination:
    ordered = sorted(durations)
    return termination.NodeTermination(name, len(ordered), ordered[0], ordered[len(ordered) // 2], ordered[-1],
                                       ordered[-1], durations_ms=tuple(durations))


def test_the_termination_median_pools_every_run():
    """Count-weighted per-node medians gave 15 here; the median of the ten runs is 20."""
    row = termination.sweep_row(3, [_node("n1", [10, 10, 10, 10, 30]), _node("n2", [20] * 5)])
    assert row["p50_ms"] == 20.0 and row["terminations"] == 10 and row["max_ms"] == 30.0, row


def test_the_termination_tail_is_a_p99_only_from_100_runs():
    """Of ten runs the nearest-rank p99 is the maximum: say max, not p99."""
    few = termination.sweep_row(3, [_node("n1", [10, 10, 10, 10, 30]), _node("n2", [20] * 5)])
    assert math.isnan(few["p99_ms"]) and few["max_ms"] == 30.0, few
    many = termination.sweep_row(3, [_node("n1", [float(ms) for ms in range(1, 151)]), _node("n2", [0.5] * 50)])
    assert many["p99_ms"] == 149.0 and many["max_ms"] == 150.0, many
    lines = termination.format_terminations([_node("n1", [10, 10, 10, 10, 30])]).splitlines()
    assert lines[1].split() == ["n1", "5", "10.00", "10.00", "-", "30.00"], lines


def test_the_termination_plot_draws_no_p99_from_few_runs(tmp_path: Path, monkeypatch):
    rows = [termination.sweep_row(3, [_node("n1", [10, 10, 10, 10, 30]), _node("n2", [20] * 5)])]
    figures = _recorded_figures(monkeypatch)
    plots.plot_termination(rows, tmp_path / "termination.png", "t")
    assert figures[0].axes[0].get_legend_handles_labels()[1] == ["median", "max"]


def test_without_every_run_the_termination_median_is_not_made_up():
    """A node whose log lines are missing (a log level above INFO): no pooled median is known."""
    partial = termination.NodeTermination("n2", 5, 20.0, 20.0, 20.0, 20.0, durations_ms=(20.0, 20.0))
    row = termination.sweep_row(3, [_node("n1", [10, 10, 10, 10, 30]), partial])
    assert math.isnan(row["p50_ms"]) and row["max_ms"] == 30.0 and row["min_ms"] == 10.0, row


def test_termination_durations_are_read_from_the_node_log(tmp_path: Path):
    lines = [{"level": "INFO", "msg": "termination of t1 on p1 decided ABORT in 10.81 ms", "node": "n1"},
             {"level": "INFO", "msg": "serving", "node": "n1"},
             {"level": "INFO", "msg": "termination of t2 on p1 decided Decision.ABORT in 12.5 ms", "node": "n1"}]
    text = "\n".join(json.dumps(line) for line in lines) + "\nnot json\n"
    assert termination.termination_durations_ms(text) == [10.81, 12.5]


# === 4: one measured window for every figure =====================================================

async def test_the_driver_marks_the_warmup_boundary_and_counts_attempts_by_window(monkeypatch):
    calls: list[float] = []
    started = time.monotonic()

    async def commit(connection: object, program: object) -> Reply:
        await asyncio.sleep(0.005)
        return Reply("aborted", "conflict") if time.monotonic() - started < 0.1 else Reply("committed")

    async def at_warmup() -> None:
        calls.append(time.monotonic() - started)

    monkeypatch.setattr(driver, "run_program", commit)
    monkeypatch.setattr(driver, "HttpConnection", _NoConnection)
    result = await driver.run_clients([("127.0.0.1", 9)], make_workload("uniform", 2, {}), seconds=0.3, clients=2,
                                      warmup_s=0.15, on_warmup=at_warmup)
    assert len(calls) == 1 and 0.14 <= calls[0] < 0.25, calls
    assert result.attempted(measured=False) > 0 and result.aborted(measured=True) == 0, result
    assert result.attempted() == result.attempted(measured=True) + result.attempted(measured=False)
    assert 0 < result.measured_cpu_s <= result.cpu_s
    row = report.summarize(RunResult("cornus", RunSettings(workload="uniform", nodes=2, partitions=2), "redis",
                                     result, warmup_s=0.15))
    # Abort rate and kinds cover the measured window, like throughput; run_commits the whole run.
    assert row["abort_rate"] == 0 and row["aborted_attempts"] == 0, row
    measured = result.committed(measured=True)
    assert row["kinds"] == f"uniform:{measured}/{result.attempted(measured=True)}", row
    assert row["run_commits"] == result.committed(), row


def test_the_nodes_work_is_charged_from_the_warmup_boundary_to_the_measured_commits():
    result = RunResult("cornus", RunSettings(), "redis", driver.DriverResult(warmup_s=1.0, measured_cpu_s=0.5),
                       warmup_s=1.0)
    for measured in (False, True):
        result.driver.commits["ycsb", True, False, measured] = 100 if measured else 900  # 900 in the warm-up
    start = cluster.WindowSnapshot(at_s=1.0, node_cpu_s=[1.0, 2.0], storage_cpu_s={7: 0.5},
                                   counts=collections.Counter({"storage:log_once": 10, "storage_ms:log_once": 100.0,
                                                               "transport:messages_sent": 40}))
    end = cluster.WindowSnapshot(at_s=5.0, node_cpu_s=[2.0, 3.0], storage_cpu_s={7: 0.9},
                                 counts=collections.Counter({"storage:log_once": 210, "storage_ms:log_once": 2300.0,
                                                             "transport:messages_sent": 440,
                                                             "node:cache_hits": 3, "node:cache_misses": 1}))
    cluster.charge_window(result, start, end)
    assert result.node_cpu_ms == 20.0 and result.node_cores == 0.5, result  # 2 s over 100 commits, in 4 s
    assert result.storage_cpu_ms == pytest.approx(4.0) and result.client_cpu_ms == 5.0, result
    assert result.storage_calls == {"log_once": 2.0} and result.peer_messages == 4.0, result
    assert result.storage_mean_ms == {"log_once": 11.0} and result.cache_hit_ratio == 0.75, result


# === 5: the order of the protocols ================================================================

def test_the_first_protocol_rotates_over_points_even_with_one_trial():
    protocols = [Protocol.CORNUS, Protocol.TWO_PC, Protocol.COORDINATOR_LOG]
    firsts = [sweep.trial_order(protocols, point, 1, 0)[0] for point in range(3)]
    assert firsts == protocols, firsts
    # With two trials, each trial of each point begins with the next protocol.
    orders = [sweep.trial_order(protocols[:2], point, 2, trial) for point in range(2) for trial in range(2)]
    assert [order[0] for order in orders] == [Protocol.CORNUS, Protocol.TWO_PC] * 2, orders
    assert all(sorted(order) == sorted(protocols[:2]) for order in orders)


# === 6: CPU per commit against fixed background work ==============================================

def test_the_rows_show_cores_used_and_say_the_cpu_per_commit_holds_background_work():
    result = RunResult("cornus", RunSettings(), "redis", driver.DriverResult(), node_cpu_ms=3.6, node_cores=0.13,
                       node_idle_cores=0.1)
    row = report.summarize(result)
    assert (row["node_cores"], row["node_idle_cores"]) == (0.13, 0.1), row
    table = report.format_rows([row])
    assert "cores" in table.splitlines()[0] and "background" in table, table
    summary = report.markdown_summary([row], title="t", command="c", machine="m", violations=[], files=[])
    assert "node cores" in summary and "comparable across protocols only at similar throughput" in summary, summary


# === 8: the title of a sweep ======================================================================

def test_the_title_of_a_clients_sweep_does_not_name_the_base_client_count():
    plan = sweep.BenchPlan(protocols=[Protocol.CORNUS], storage=StoreConfig(), storage_argv=lambda storage: [],
                           base=RunSettings(clients=8), sweep_param="clients", sweep_values=["2", "16"])
    title = sweep.title_of(plan, [])
    assert "per-point clients" in title and "8 clients" not in title, title
